"""spark_jobs/compact_segments.py: bad input in-process (exit 2, nothing started); real spark-submit
runs (slow): a dry run that changes nothing, then a real run that repacks a namespace of small V1
objects into segments and leaves the namespace with compaction off alone.

spark-submit invocations in this module: 2 (the dry run, the real run)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from spark_jobs import compact_segments
from tests.support.workspaces import END_MS, build_workspace, offload, sealed
from tieredcore.cold.blob import iter_objects
from tieredcore.config import Config
from tieredcore.formats.keys import data_key, index_key, is_topic_manifest_key
from tieredcore.lifecycle.compaction import plan_topic
from tieredcore.lifecycle.compaction_run import DETAIL_SCHEMA
from tieredcore.lifecycle.drain import drain
from tieredcore.names import TopicName
from tieredcore.offload.context import context_uuid, referenced_uuids, segment_pieces
from tieredcore.offload.copies import open_offloaded
from tieredcore.workspace import Workspace

from .conftest import spark_submit

SMALL, OFF = "public/small", "public/off"  # compaction on / off
TOPICS, LEDGERS = 2, 12  # per namespace, sealed ledgers per topic (and an open one); the texts below say 2 topics
AS_OF = "2026-01-02T00:00:00Z"
AS_OF_MS = END_MS + 24 * 3600 * 1000
DETAIL_COLUMNS = [c.strip().split()[0] for c in DETAIL_SCHEMA.split(",")]


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    return small_objects(tmp_path / "ws")


@pytest.fixture(scope="module")
def shared_workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """For runs that must change nothing."""
    return small_objects(tmp_path_factory.mktemp("compaction") / "ws")


def small_objects(root: Path) -> Path:
    """Two namespaces of 2 topics x 12 sealed ledgers of 5 entries, every sealed ledger offloaded as its
    own V1 object pair (about 1.4 KiB each); compaction enabled in SMALL only."""
    cfg = build_workspace(root, [SMALL, OFF], topics=TOPICS, ledgers=LEDGERS, entries=5, entry_size="200")
    with Workspace(Config.load(cfg, env={})) as ws:
        for ns in (SMALL, OFF):
            for t in ws.ml.list_topics(ns):
                offload(ws, t.full, sealed(ws, t.full))
        ws.policies.set_namespace(SMALL, {"compaction_enabled": True})
    return cfg


def records(ws: Workspace, ns: str) -> dict[str, bytes]:
    return {t.full: ws.ml.get_topic(t)[0].SerializeToString() for t in ws.ml.list_topics(ns)}


def keys(ws: Workspace) -> set[str]:
    return {o.key for o in iter_objects(ws.store)
            if not o.key.startswith("tiered-owner.") and not is_topic_manifest_key(o.key, "")}


def hot_entries(ws: Workspace, ns: str) -> dict[tuple[str, int], list[bytes]]:
    """Every offloaded ledger's entries, read from the hot tier (the ground truth)."""
    out = {}
    for t in ws.ml.list_topics(ns):
        info, _ = ws.ml.get_topic(t)
        for li in info.ledgerInfo[:-1]:
            out[(t.full, li.ledgerId)] = [e.data for e in ws.hot.open_ledger(li.ledgerId).read(0, li.entries - 1)]
    return out


def summary_of(cfg: Path, run_id: str) -> tuple[dict, list[dict]]:
    out = cfg.parent / "reports" / "compact_segments" / run_id / "compact_segments"  # group = part = job
    detail = pq.read_table(out / "detail.parquet")
    assert detail.column_names == DETAIL_COLUMNS
    return json.loads((out / "summary.json").read_text()), detail.to_pylist()


# -- in-process: no Spark ---------------------------------------------------------------------------


@pytest.mark.parametrize("extra,message", [
    (["--target-size", "garbage"], "--target-size: size 'garbage'"),
    (["--min-object-size", "0"], "--min-object-size '0': must be a positive size"),
    (["--min-object-size", "64M", "--target-size", "8M"], "--min-object-size 64M exceeds --target-size 8M"),
    (["--min-object-size", "512M"], "compaction min object size 536870912 exceeds the target size"),
    (["--delete-delay", "-1"], "--delete-delay '-1': must not be negative"),
    (["--price-gb-month", "-0.5"], "price gb_month must be a non-negative number"),
    (["--price-get-1k", "inf"], "price get_per_1000 must be a finite number"),
    (["--topic", "public/small/nope"], "persistent://public/small/nope not found"),
    (["--topic", "public/small/topic-0000", "--namespace", SMALL], "--namespace and --topic exclude each other"),
    (["--namespace", "nope"], "namespace name 'nope'"),
])
def test_bad_input_exits_2_with_nothing_started(shared_workspace: Path, tmp_path: Path, capsys, extra,
                                                message) -> None:
    """Checked on the driver before Spark starts (run_job: no session): exit 2, a message naming the
    input, no report, nothing changed. A min object size above a namespace policy's target size is
    found against each planned topic's policy."""
    report_dir = tmp_path / "reports-bad"
    with Workspace(Config.load(shared_workspace, env={})) as ws:
        before = records(ws, SMALL), keys(ws)
    rc = compact_segments.main(["--config", str(shared_workspace), "--as-of", AS_OF, "--report-dir", str(report_dir),
                                *extra])
    assert rc == 2
    err = capsys.readouterr().err
    assert err.startswith("ERROR compact_segments: ") and message in err, err  # the line carries its level
    assert not report_dir.exists()
    with Workspace(Config.load(shared_workspace, env={})) as ws:
        assert (records(ws, SMALL), keys(ws)) == before
        assert ws.deletion_log.pending() == []


# -- real spark-submit ------------------------------------------------------------------------------


@pytest.mark.slow
def test_dry_run_then_real_run(workspace: Path, tmp_path: Path) -> None:
    config = Config.load(workspace, env={})
    with Workspace(config) as ws:
        small_before, off_before, keys_before = records(ws, SMALL), records(ws, OFF), keys(ws)
        truth = hot_entries(ws, SMALL)
        old_keys = set()
        for t in ws.ml.list_topics(SMALL):
            for li in ws.ml.get_topic(t)[0].ledgerInfo[:-1]:
                old_keys |= {data_key("", context_uuid(li), li.ledgerId), index_key("", context_uuid(li), li.ledgerId)}
    assert len(truth) == TOPICS * LEDGERS and len(old_keys) == 2 * len(truth) and old_keys <= keys_before
    common = ["--config", str(workspace), "--as-of", AS_OF, "--namespace", SMALL, "--namespace", OFF]

    # 1. dry run: both namespaces planned (the one with compaction off too, with a note); nothing changes
    rc, out = spark_submit("compact_segments", *common, "--dry-run", "--run-id", "dry", log=tmp_path / "dry.log")
    assert rc == 0, out
    s, detail = summary_of(workspace, "dry")
    assert s["dry_run"] is True
    for ns in (SMALL, OFF):  # one segment (data + index) per topic instead of 12 object pairs
        assert s["namespaces"][ns]["objects_before"] == 2 * TOPICS * LEDGERS
        assert s["namespaces"][ns]["objects_after"] == 2 * TOPICS
        assert s["namespaces"][ns]["outcomes"] == {"would_compact": TOPICS}
        assert s["totals"]["namespaces"][ns]["counters"]["objects_after"] == 2 * TOPICS
    assert s["totals"]["counters"]["objects_before"] == 4 * TOPICS * LEDGERS
    assert s["totals"]["failures"] == 0 and s["totals"]["outcomes"] == {"would_compact": 2 * TOPICS}
    assert any(n.startswith(f"persistent://{OFF}/topic-0000: compaction is off") for n in s["notes"])
    assert f"dry run: {TOPICS} topic(s) with compaction off planned anyway (a real run leaves them out)" in s["notes"]
    assert sorted(r["outcome"] for r in detail) == ["would_compact"] * (2 * TOPICS)
    assert f"{SMALL}: {TOPICS} topic(s), {TOPICS} batch(es) planned: objects {4 * LEDGERS} → 4" in out
    with Workspace(config) as ws:
        assert records(ws, SMALL) == small_before and records(ws, OFF) == off_before
        assert keys(ws) == keys_before
        assert ws.deletion_log.pending() == []

    # 2. real run with threshold overrides: objects below 4 KiB into segments of up to 8 KiB, old objects
    # deleted 30 min later
    with Workspace(config) as ws:
        planned = [plan_topic(ws.ml.get_topic(t)[0], min_object_size=4096, target_size=8192)
                   for t in ws.ml.list_topics(SMALL)]
    objects_after = sum(b.objects_after for p in planned for b in p) * 2  # data + index
    assert all(len(p) == 2 for p in planned)  # 12 ledgers of ~1.2 KiB: two batches per topic
    rc, out = spark_submit("compact_segments", *common, "--min-object-size", "4K", "--target-size", "8K",
                           "--delete-delay", "30m", "--run-id", "real", log=tmp_path / "real.log")
    assert rc == 0, out
    s, detail = summary_of(workspace, "real")
    assert s["dry_run"] is False and s["thresholds"] == {"min_object_size": 4096, "target_size": 8192,
                                                         "delete_delay_ms": 30 * 60 * 1000}
    assert set(s["namespaces"]) == {SMALL}  # compaction off: left out, with a note
    ns = s["namespaces"][SMALL]
    assert (ns["objects_before"], ns["objects_after"]) == (2 * TOPICS * LEDGERS, objects_after)
    assert ns["bytes_after"] < ns["bytes_before"]  # fewer indexes
    assert ns["outcomes"] == {"compacted": 2 * TOPICS} and s["totals"]["failures"] == 0
    assert s["totals"]["namespaces"][SMALL]["counters"] == {k: ns[k] for k in (
        "objects_before", "objects_after", "bytes_before", "bytes_after")}
    assert any(n.startswith(f"persistent://{OFF}/topic-0001: compaction is off") for n in s["notes"])
    assert {r["outcome"] for r in detail} == {"compacted"} and sum(r["ledgers"] for r in detail) == len(truth)
    new_uuids = {u for r in detail for u in r["segments"].split(",")}
    assert len(new_uuids) == objects_after // 2

    with Workspace(config) as ws:
        assert records(ws, OFF) == off_before  # compaction off: untouched
        for t in ws.ml.list_topics(SMALL):
            for li in ws.ml.get_topic(t)[0].ledgerInfo[:-1]:
                assert referenced_uuids(li) <= new_uuids and len(segment_pieces(li)) == 1, li
        # the old objects stay for the delete delay (readers that opened them finish), then go
        assert ws.deletion_log.due(AS_OF_MS + 30 * 60 * 1000 - 1) == []
        assert keys(ws) >= keys_before
        rep = drain(ws, AS_OF_MS + 30 * 60 * 1000)
        assert rep.deleted > 0 and rep.still_in_use == rep.dead_lettered == 0 and ws.deletion_log.pending() == []
        after = keys(ws)
        assert after == (keys_before - old_keys) | (after - keys_before)
        assert len(after - keys_before) == objects_after and len(after) < len(keys_before)
        # every entry reads back byte-identical, from the new segments alone (the old objects are gone)
        reader = ws.reader()
        for (topic, lid), entries in truth.items():
            (li,) = [x for x in ws.ml.get_topic(topic)[0].ledgerInfo if x.ledgerId == lid]
            h = open_offloaded(li, ws.offloader, TopicName.parse(topic).managed_ledger_name, ws.offloader_for_driver)
            try:
                assert [e.data for e in h.read(0, li.entries - 1)] == entries, (topic, lid)
            finally:
                h.close()
            assert [e.data for e in reader.read_ledger(topic, lid, 0, li.entries - 1)] == entries
