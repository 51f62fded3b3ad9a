"""`tiered policies`: set/get/list/delete, validation errors change nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tieredcore.cli.main import main
from tieredcore.errors import ValidationError
from tieredcore.units import duration_ms, size_bytes


@pytest.fixture
def ws(tmp_path: Path, monkeypatch, capsys) -> Path:
    monkeypatch.setenv("TIERED_NO_PROGRESS", "1")
    root = tmp_path / "ws"
    assert main(["init", str(root)]) == 0
    capsys.readouterr()
    return root


def call(ws: Path, capsys, *argv: str) -> tuple[int, dict | None, str]:
    capsys.readouterr()
    code = main(["--workspace", str(ws), "--json", *argv])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip() else None), err


def test_set_merges_and_get_shows_effective(ws, capsys):
    code, res, _ = call(ws, capsys, "policies", "set", "t/ns", "--offload-threshold-bytes", "64M")
    assert code == 0 and res["overrides"] == {"offload_threshold_bytes": 64 * 2**20}
    code, res, _ = call(ws, capsys, "policies", "set", "t/ns", "--deletion-lag", "2h")
    assert code == 0
    assert res["overrides"] == {"offload_threshold_bytes": 64 * 2**20, "deletion_lag_ms": 7_200_000}
    code, res, _ = call(ws, capsys, "policies", "get", "t/ns")
    assert res["effective"]["offload_threshold_bytes"] == 64 * 2**20
    assert res["effective"]["read_priority"] == "tiered-storage-first"  # default filled in
    code, res, _ = call(ws, capsys, "policies", "list")
    assert [(r["namespace"], r["offload_enabled"]) for r in res["namespaces"]] == [("t/ns", True)]


def test_topic_override_over_namespace(ws, capsys):
    assert call(ws, capsys, "policies", "set", "t/ns", "--offload-threshold-seconds", "600")[0] == 0
    code, res, _ = call(ws, capsys, "policies", "set", "t/ns/a", "--topic", "--offload-threshold-seconds", "60")
    assert code == 0 and res["effective"]["offload_threshold_seconds"] == 60
    code, res, _ = call(ws, capsys, "policies", "get", "t/ns/b", "--topic")
    assert res["effective"]["offload_threshold_seconds"] == 600
    assert call(ws, capsys, "policies", "delete", "t/ns/a", "--topic")[1]["deleted"] is True
    assert call(ws, capsys, "policies", "get", "t/ns/a", "--topic")[1]["effective"]["offload_threshold_seconds"] == 600


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--offload-threshold-bytes", "1G", "--retention-size-mb", "512"], "must be below the retention size"),
        (["--offload-threshold-seconds", "3600", "--retention-time-minutes", "60"], "below the retention time"),
        (["--store-driver", "aws-s3", "--store-bucket", "Bad_Bucket"], "bad bucket name"),
        (["--store-driver", "aws-s3", "--store-bucket", "good-bucket", "--max-block-size", "1M"], "5 MiB"),
        (["--store-driver", "filesystem", "--store-root", "relative/dir"], "absolute root"),
        (["--read-buffer-size", "0"], "read buffer size must be positive"),
        ([], "no field given"),
    ],
)
def test_bad_policies_are_refused_and_change_nothing(ws, capsys, argv, message):
    assert call(ws, capsys, "policies", "set", "t/ns", "--offload-threshold-bytes", "0")[0] == 0
    before = call(ws, capsys, "policies", "get", "t/ns")[1]
    code, _, err = call(ws, capsys, "policies", "set", "t/ns", *argv)
    assert code == 2 and message in err
    assert call(ws, capsys, "policies", "get", "t/ns")[1] == before


def test_path_like_namespace_is_refused(ws, capsys):
    code, _, err = call(ws, capsys, "policies", "set", "../etc", "--offload-threshold-bytes", "0")
    assert code == 2 and "tiered policies" in err


@pytest.mark.parametrize("text, ms", [("4h", 14_400_000), ("90m", 5_400_000), ("3600s", 3_600_000),
                                      ("500ms", 500), ("1000", 1000), ("-1", -1), ("2d", 172_800_000)])
def test_duration(text, ms):
    assert duration_ms(text) == ms


@pytest.mark.parametrize("text, n", [("1024", 1024), ("512K", 524288), ("64M", 67108864), ("1g", 2**30), ("-1", -1)])
def test_size(text, n):
    assert size_bytes(text) == n


@pytest.mark.parametrize("text", ["4 hours", "h", "-2", "1.5h"])
def test_bad_duration(text):
    with pytest.raises(ValidationError):
        duration_ms(text)


def test_topic_compaction_threshold_is_a_size_off_by_default(ws, capsys):
    """`--compaction-threshold` (Pulsar's compaction-threshold) sets topic_compaction_threshold_bytes; -1
    (the default) is off; a topic overrides its namespace; list shows it; the repacking flag is another field."""
    from tieredcore.config import Config
    from tieredcore.workspace import Workspace

    code, res, _ = call(ws, capsys, "policies", "get", "t/ns")
    assert code == 0 and res["effective"]["topic_compaction_threshold_bytes"] == -1
    code, res, _ = call(ws, capsys, "policies", "set", "t/ns", "--compaction-threshold", "100M")
    assert code == 0 and res["overrides"] == {"topic_compaction_threshold_bytes": 100 * 2**20}
    assert res["effective"]["compaction_enabled"] is False  # segment repacking untouched
    code, res, _ = call(ws, capsys, "policies", "set", "t/ns/a", "--topic", "--compaction-threshold", "-1")
    assert code == 0 and res["effective"]["topic_compaction_threshold_bytes"] == -1
    code, res, _ = call(ws, capsys, "policies", "list")
    assert [(r["namespace"], r["topic_compaction_threshold_bytes"]) for r in res["namespaces"]] == \
        [("t/ns", 100 * 2**20)]
    capsys.readouterr()
    assert main(["--workspace", str(ws), "policies", "list"]) == 0
    assert "topic compaction 100M" in capsys.readouterr().out
    with Workspace(Config.load(ws / "tiered.toml", env={})) as w:
        assert w.policies.namespaces_with_topic_compaction() == ["t/ns"]
        assert w.policies.for_topic("t/ns/a").topic_compaction_enabled is False
        assert w.policies.for_topic("t/ns/b").topic_compaction_enabled is True
        with pytest.raises(ValidationError, match="topic_compaction_threshold_bytes must be an integer >= -1"):
            w.policies.set_namespace("t/ns", {"topic_compaction_threshold_bytes": -5})
        with pytest.raises(ValidationError, match="topic_compaction_threshold_bytes"):
            w.policies.set_namespace("t/ns", {"topic_compaction_threshold_bytes": "1G"})
    for bad in ("-2", "1.5M", "big"):
        code, _, err = call(ws, capsys, "policies", "set", "t/ns", "--compaction-threshold", bad)
        assert code == 2 and err.startswith("tiered policies: --compaction-threshold: "), err
    assert call(ws, capsys, "policies", "get", "t/ns")[1]["overrides"] == {"topic_compaction_threshold_bytes": 100 * 2**20}
