"""`tiered deletions stats|dlq|drain`, `tiered reconcile`, `tiered retention`: in-process through
tieredcore.cli.main on real stores (a workspace built with init / generate / offload / policies set)."""

from __future__ import annotations

import json
import os
import time
import uuid as uuidlib
from pathlib import Path

import pytest

from tests.support.workspaces import END_ISO, build_workspace
from tieredcore.cli.main import main
from tieredcore.cold.blob import iter_objects
from tieredcore.config import CONFIG_FILE_NAME, Config
from tieredcore.meta.deletion_log import PENDING, DeletionLog, DeletionRecord
from tieredcore.workspace import Workspace

T0, T1 = "persistent://t/ns/topic-0000", "persistent://t/ns/topic-0001"
ML0, ML1 = "t/ns/persistent/topic-0000", "t/ns/persistent/topic-0001"


def call(ws: Path, capsys, *argv: str, json_out: bool = True) -> tuple[int, dict | None, str]:
    capsys.readouterr()
    code = main(["--workspace", str(ws), *(["--json"] if json_out else []), *argv])
    out, err = capsys.readouterr()
    if not json_out:
        return code, None, out + err
    return code, (json.loads(out) if out.strip() else None), err


def open_ws(root: Path) -> Workspace:
    return Workspace(Config.load(root / CONFIG_FILE_NAME, env={}))


def ledgers(root: Path, capsys, topic: str) -> list[dict]:
    code, res, _ = call(root, capsys, "status", topic, "--ledgers")
    assert code == 0
    return res["topics"][0]["ledger_detail"]


def read_count(root: Path, capsys, topic: str) -> int:
    code, res, err = call(root, capsys, "read", topic)
    assert code == 0, err
    return len(res["entries"])


@pytest.fixture
def ws(tmp_path: Path, monkeypatch, capsys) -> Path:
    """Two topics of 4 sealed ledgers (10 min apart, the newest closed at END_ISO) + the open one; the
    first two ledgers of topic 0 offloaded."""
    monkeypatch.setenv("TIERED_NO_PROGRESS", "1")
    root = tmp_path / "ws"
    build_workspace(root, ["t/ns"], topics=2, ledgers=4, entries=5, entry_size="64")
    third = ledgers(root, capsys, T0)[2]["ledger"]
    assert call(root, capsys, "offload", T0, "--up-to", f"{third}:0")[0] == 0
    capsys.readouterr()
    return root


def test_stats_on_empty_log(ws, capsys):
    code, res, _ = call(ws, capsys, "deletions", "stats")
    assert code == 0
    assert res["in_flight"] == res["pending"] == res["retrying"] == res["dead_letter"] == 0
    assert set(res["counters"].values()) == {0} and "refused_mismatch" in res["counters"]
    code, _, out = call(ws, capsys, "deletions", "stats", json_out=False)
    assert code == 0 and "in flight 0" in out and "dead letters 0" in out


def test_retention_then_drain_removes_storage(ws, capsys):
    before = ledgers(ws, capsys, T0)
    assert call(ws, capsys, "policies", "set", "t/ns", "--retention-time-minutes", "15")[0] == 0
    # dry run: planned, nothing changes
    code, res, _ = call(ws, capsys, "retention", "--namespace", "t/ns", "--as-of", END_ISO, "--dry-run")
    assert code == 0 and res["dry_run"] and res["ledgers"] > 0
    assert ledgers(ws, capsys, T0) == before
    assert call(ws, capsys, "deletions", "stats")[1]["in_flight"] == 0

    code, res, _ = call(ws, capsys, "retention", "--namespace", "t/ns", "--as-of", END_ISO)
    assert code == 0 and res["next"] == "tiered deletions drain"
    trimmed = {(r["topic"], r["ledger"]) for r in res["rows"] if r["outcome"] == "trimmed"}
    gone0 = [d for d in before if (T0, d["ledger"]) in trimmed]
    assert gone0 and any(d["uuid"] for d in gone0)  # an offloaded ledger among them
    kept0 = ledgers(ws, capsys, T0)
    assert {d["ledger"] for d in kept0}.isdisjoint({d["ledger"] for d in gone0})

    code, st, _ = call(ws, capsys, "deletions", "stats")
    assert st["in_flight"] == len(trimmed) + sum(1 for d in gone0 if d["uuid"])
    assert st["counters"]["appended_hot"] == len(trimmed) and st["counters"]["appended_offloaded"] >= 1
    with open_ws(ws) as w:
        assert all(w.hot.exists(lid) for _, lid in trimmed)
        assert any(o.key for o in iter_objects(w.store))

    code, rep, _ = call(ws, capsys, "deletions", "drain", "--as-of", END_ISO)
    assert code == 0 and rep["dead_lettered"] == 0 and rep["deleted"] == st["in_flight"]
    assert rep["stats"]["in_flight"] == 0
    with open_ws(ws) as w:
        assert not any(w.hot.exists(lid) for _, lid in trimmed)
        gone_uuids = {d["uuid"] for d in gone0 if d["uuid"]}
        assert not any(u in o.key for o in iter_objects(w.store) for u in gone_uuids)
    # the retained entries still read, from whichever tier holds them
    assert read_count(ws, capsys, T0) == 5 * sum(1 for d in kept0 if d["entries"])
    assert read_count(ws, capsys, T1) == 5 * sum(1 for d in ledgers(ws, capsys, T1) if d["entries"])
    assert call(ws, capsys, "deletions", "stats")[1]["counters"]["acknowledged"] == st["in_flight"]


def test_forged_record_is_refused(ws, capsys):
    lid = ledgers(ws, capsys, T0)[3]["ledger"]  # hot only; T1 does not list it
    with open_ws(ws) as w:
        DeletionLog(w.metadata).append([DeletionRecord(topic=ML1, ledger_id=lid, type="ledger",
                                                       reason="retention", created_ms=1)])
        objects = {o.key for o in iter_objects(w.store)}
    code, rep, _ = call(ws, capsys, "deletions", "drain", "--as-of", END_ISO)
    assert code == 0 and rep["refused_mismatch"] == 1 and rep["deleted"] == 0
    code, st, _ = call(ws, capsys, "deletions", "stats")
    assert st["counters"]["refused_mismatch"] == 1 and st["in_flight"] == 0
    with open_ws(ws) as w:
        assert w.hot.exists(lid) and {o.key for o in iter_objects(w.store)} == objects
    assert read_count(ws, capsys, T0) == 20


def test_malformed_dead_letter_list_and_drop(ws, capsys):
    with open_ws(ws) as w:
        w.metadata.create(f"{PENDING}/bad1", b"{not json")
    code, rep, _ = call(ws, capsys, "deletions", "drain", "--as-of", END_ISO)
    assert code == 1 and rep["malformed"] == 1  # dead-lettered in this run
    code, res, _ = call(ws, capsys, "deletions", "dlq", "list")
    assert code == 0 and res["count"] == 1
    row = res["dead_letters"][0]
    assert row["id"] == "bad1" and row["malformed"] and "malformed" in row["dead_reason"]
    assert set(row) >= {"id", "topic", "ledger", "type", "reason", "attempts", "dead_reason"}
    code, _, out = call(ws, capsys, "deletions", "dlq", "list", json_out=False)
    assert "bad1" in out and "1 dead letter(s)" in out

    code, res, err = call(ws, capsys, "deletions", "dlq", "drop", "bad1")
    assert code == 2 and res is None and "--yes" in err
    code, res, err = call(ws, capsys, "deletions", "dlq", "drop", "nope", "--yes")
    assert code == 2 and "nope" in err
    code, res, err = call(ws, capsys, "deletions", "dlq", "requeue", "bad1")
    assert code == 2 and "malformed" in err
    assert call(ws, capsys, "deletions", "stats")[1]["dead_letter"] == 1
    code, res, _ = call(ws, capsys, "deletions", "dlq", "drop", "bad1", "--yes")
    assert code == 0 and res["dropped"] == ["bad1"]
    assert call(ws, capsys, "deletions", "dlq", "list")[1]["count"] == 0


def test_requeue_valid_dead_letter(ws, capsys):
    lid = ledgers(ws, capsys, T0)[3]["ledger"]
    with open_ws(ws) as w:
        dl = DeletionLog(w.metadata)
        rec = DeletionRecord(topic=ML0, ledger_id=lid, type="ledger", reason="retention", created_ms=1)
        dl.append([rec])
        (entry,) = dl.due(10**13)
        assert dl.dead_letter(entry, "gave up after 10 attempts: test", attempts=10)
    code, res, _ = call(ws, capsys, "deletions", "dlq", "list")
    assert res["count"] == 1 and res["dead_letters"][0]["attempts"] == 10
    assert res["dead_letters"][0]["topic"] == ML0 and res["dead_letters"][0]["ledger"] == lid
    code, _, err = call(ws, capsys, "deletions", "dlq", "requeue")
    assert code == 2 and "--all" in err
    code, _, err = call(ws, capsys, "deletions", "dlq", "requeue", rec.id, "--all")
    assert code == 2
    code, res, _ = call(ws, capsys, "deletions", "dlq", "requeue", rec.id, "--as-of", END_ISO)
    assert code == 0 and res["requeued"] == [rec.id]
    code, st, _ = call(ws, capsys, "deletions", "stats")
    assert st["in_flight"] == st["pending"] == 1 and st["dead_letter"] == 0
    with open_ws(ws) as w:
        (e,) = DeletionLog(w.metadata).pending()
        assert e.record.attempts == 0 and e.record.dead_reason == ""
    # the ledger is still listed: the drain acknowledges without deleting
    code, rep, _ = call(ws, capsys, "deletions", "drain", "--as-of", END_ISO)
    assert code == 0 and rep["still_in_use"] == 1
    with open_ws(ws) as w:
        assert w.hot.exists(lid)


def test_reconcile_finds_seeded_orphan(ws, capsys):
    lid = ledgers(ws, capsys, T0)[3]["ledger"]
    u = str(uuidlib.uuid4())
    old_ns = (int(time.time()) - 3 * 3600) * 1_000_000_000
    with open_ws(ws) as w:
        with w.hot.open_ledger(lid) as h:
            w.offloader.offload(h, u, {"managedledgername": ML0})
        root = Path(w.store.root)
        keys = [o.key for o in iter_objects(w.store) if u in o.key]
    assert len(keys) == 2
    for d, _, files in os.walk(root):
        for f in files:
            if u in f:
                os.utime(Path(d) / f, ns=(old_ns, old_ns))

    code, rep, _ = call(ws, capsys, "reconcile", "--dry-run", "--grace", "1h")
    assert code == 0 and rep["dry_run"] and rep["errors"] == []
    assert rep["orphan_groups"] == 1 and rep["orphan_objects"] == 2 and rep["hot_orphans"] == 0
    assert rep["records_appended"] == 0 and rep["by_namespace"]["t/ns"]["offloaded"]["count"] == 1
    assert set(rep["sample_keys"]) == set(keys) and rep["oldest_orphan_age_ms"] >= 2 * 3600 * 1000
    assert call(ws, capsys, "deletions", "stats")[1]["in_flight"] == 0
    code, _, out = call(ws, capsys, "reconcile", "--dry-run", json_out=False)
    assert code == 0 and "would append 1 deletion record(s)" in out and "t/ns" in out

    code, rep, _ = call(ws, capsys, "reconcile", "--grace", "1h")
    assert code == 0 and rep["records_appended"] == 1
    assert call(ws, capsys, "deletions", "stats")[1]["in_flight"] == 1
    code, rep, _ = call(ws, capsys, "deletions", "drain")
    assert code == 0 and rep["deleted"] == 1
    with open_ws(ws) as w:
        assert not any(u in o.key for o in iter_objects(w.store))
    assert read_count(ws, capsys, T0) == 20


@pytest.mark.parametrize("argv, message", [
    (["deletions", "drain", "--as-of", "yesterday"], "--as-of"),
    (["deletions", "drain", "--retry-delay", "soon"], "--retry-delay"),
    (["deletions", "drain", "--retry-delay", "-1"], "negative"),
    (["deletions", "drain", "--max-attempts", "0"], "--max-attempts"),
    (["reconcile", "--grace", "1y"], "--grace"),
    (["retention", "--namespace", "t/nope"], "t/nope"),
    (["retention", "--namespace", "bad"], "bad"),
    (["deletions", "dlq", "drop", "--all"], "--yes"),
])
def test_bad_input_exits_2_and_changes_nothing(ws, capsys, argv, message):
    with open_ws(ws) as w:
        DeletionLog(w.metadata).append([DeletionRecord(topic=ML0, ledger_id=10**6, type="ledger",
                                                       reason="retention", created_ms=1)])
    code, res, err = call(ws, capsys, *argv)
    assert code == 2 and res is None and message in err
    st = call(ws, capsys, "deletions", "stats")[1]
    assert st["in_flight"] == 1 and st["counters"]["consumed"] == 0
