"""`tiered topics delete`: refuses without --yes, unknown and path-like names; with --yes appends the
deletion records for both tiers, then removes the topic (and its topic policies)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tieredcore.cli.main import main
from tieredcore.config import CONFIG_FILE_NAME, Config
from tieredcore.meta.deletion_log import DeletionLog
from tieredcore.workspace import Workspace

T = "persistent://t/ns/topic-0000"


@pytest.fixture
def ws(tmp_path: Path, monkeypatch, capsys) -> Path:
    """Two topics of 3 sealed ledgers (+ the open one); the first two ledgers of topic 0 offloaded."""
    monkeypatch.setenv("TIERED_NO_PROGRESS", "1")
    root = tmp_path / "ws"
    assert main(["init", str(root)]) == 0
    assert main(["--workspace", str(root), "generate", "--namespace", "t/ns", "--topics", "2", "--ledgers", "3",
                 "--entries", "5", "--entry-size", "64", "--end-time", "2026-01-01T00:00:00Z"]) == 0
    code, res, _ = call(root, capsys, "status", T, "--ledgers")
    third = res["topics"][0]["ledger_detail"][2]["ledger"]
    assert call(root, capsys, "offload", T, "--up-to", f"{third}:0")[0] == 0
    capsys.readouterr()
    return root


def call(ws: Path, capsys, *argv: str) -> tuple[int, dict | None, str]:
    capsys.readouterr()
    code = main(["--workspace", str(ws), "--json", *argv])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip() else None), err


def pending(ws: Path) -> list:
    with Workspace(Config.load(ws / CONFIG_FILE_NAME, env={})) as w:
        return [e.record for e in DeletionLog(w.metadata).pending()]


def test_refuses_without_yes(ws, capsys):
    code, res, err = call(ws, capsys, "topics", "delete", T)
    assert code == 2 and res is None
    assert "without --yes" in err and "4 ledger(s)" in err and T in err
    assert call(ws, capsys, "status", T)[0] == 0  # still there
    assert pending(ws) == []


@pytest.mark.parametrize("name, message", [
    ("t/ns/nope", "does not exist"),
    ("persistent://t/ns/nope", "does not exist"),
])
def test_unknown_topic(ws, capsys, name, message):
    for extra in ([], ["--yes"], ["--dry-run"]):
        code, _, err = call(ws, capsys, "topics", "delete", name, *extra)
        assert code == 2 and message in err and err.startswith("tiered topics:")
    assert pending(ws) == []


@pytest.mark.parametrize("name", ["../etc/passwd", "t/../x", "/abs/olute/path", "t/ns/a/b/c", "t/ns/"])
def test_path_like_names_are_refused(ws, capsys, name):
    code, _, err = call(ws, capsys, "topics", "delete", name, "--yes")
    assert code == 2 and err.startswith("tiered topics:")
    assert pending(ws) == []


def test_dry_run_counts_and_changes_nothing(ws, capsys):
    code, res, _ = call(ws, capsys, "topics", "delete", T, "--dry-run")
    assert code == 0 and res["dry_run"] is True and res["deleted"] is False
    # 4 ledgers with hot copies (the open one too) and 2 offloaded copies
    assert res["records"] == {"ledger": 4, "offloaded": 2, "segment": 0} and res["ledgers"] == 4
    assert call(ws, capsys, "status", T)[0] == 0 and pending(ws) == []


def test_delete_with_yes(ws, capsys):
    assert call(ws, capsys, "policies", "set", T, "--topic", "--retention-time-minutes", "60")[0] == 0
    code, res, _ = call(ws, capsys, "topics", "delete", T, "--yes", "--as-of", "2026-01-02T00:00:00Z")
    assert code == 0
    assert res["topic"] == T and res["deleted"] is True and res["policies_deleted"] is True
    assert res["records"] == {"ledger": 4, "offloaded": 2, "segment": 0}
    assert res["as_of_ms"] == 1767312000000
    recs = pending(ws)
    assert len(recs) == 6 and {r.reason for r in recs} == {"topic-deletion"}
    assert {r.created_ms for r in recs} == {1767312000000}
    assert {r.topic for r in recs} == {"t/ns/persistent/topic-0000"}
    # the topic is gone, its overrides too; the other topic is untouched
    code, _, err = call(ws, capsys, "status", T)
    assert code == 2 and "does not exist" in err
    assert call(ws, capsys, "policies", "get", T, "--topic")[1]["overrides"] == {}
    code, res, _ = call(ws, capsys, "status", "--namespace", "t/ns")
    assert [r["topic"] for r in res["topics"]] == ["persistent://t/ns/topic-0001"]
    # a second delete: unknown topic
    code, _, err = call(ws, capsys, "topics", "delete", T, "--yes")
    assert code == 2 and "does not exist" in err and len(pending(ws)) == 6


def test_human_output(ws, capsys):
    capsys.readouterr()
    assert main(["--workspace", str(ws), "topics", "delete", "t/ns/topic-0001", "--yes"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("deleted persistent://t/ns/topic-0001: 4 ledger(s); deletion records appended: 4 ledger")
    assert "deletion drain" in out
