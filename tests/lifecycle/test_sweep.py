"""Offload sweeps and deletion-lag cleanup without Spark: plan_* on the driver side, run_work as a
Spark task would run it, on real workspaces built with `tiered init` / `tiered generate`."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from tests.support.workspaces import END_MS, INTERVAL_MS, sealed
from tieredcore.cli import main as cli
from tieredcore.cold.backends.fs import FilesystemBlobStore
from tieredcore.cold.blob import iter_objects
from tieredcore.errors import CorruptEntryError, TopicNotFoundError, ValidationError
from tieredcore.formats.constants import METADATA_FORMAT_VERSION_KEY
from tieredcore.formats.keys import data_key, index_key, parse_ledger_key
from tieredcore.lifecycle.drain import drain
from tieredcore.lifecycle.planner import ManualOffload
from tieredcore.lifecycle.runner import run_work
from tieredcore.lifecycle.sweep import plan_lag_cleanup, plan_manual_offload, plan_offload
from tieredcore.lifecycle.work import (
    KIND_LAG_CLEANUP,
    KIND_OFFLOAD,
    LedgerResult,
    RunSummary,
    TopicWork,
)
from tieredcore.meta.deletion_log import DeletionLog, DeletionRecord
from tieredcore.meta.managed_ledgers import find_ledger
from tieredcore.model import Position
from tieredcore.offload.context import replacement_uuids
from tieredcore.offload.managed import context_uuid
from tieredcore.policy import HOT_FIRST, TIERED_FIRST

HOUR = 3600 * 1000
T = "persistent://t/a/topic-0000"
ML = "t/a/persistent/topic-0000"


# -- helpers --------------------------------------------------------------------------------------


def set_ns(ws, ns, **fields):
    return ws.policies.set_namespace(ns, fields)


def ledger_infos(ws, topic=T):
    info, _ = ws.ml.get_topic(topic)
    return list(info.ledgerInfo)


def run(ws, plan):
    return [LedgerResult(**r) for r in run_work(ws.config, [w.as_dict() for w in plan])]


def planned(plan):
    return {w.topic: w.ledgers for w in plan}


def store_listing(store):
    """Every object key (but the workspace's owner markers, tiered-owner.<cluster>: one per claimed
    location, and its topic manifests: docs/recovery.md) plus every unfinished multipart upload of a store."""
    return (sorted(o.key for o in iter_objects(store) if "tiered-owner." not in o.key
                   and "tiered-topic-manifests/" not in o.key),
            store.list_multipart_uploads())


def read_all(ws, topic=T, priority=TIERED_FIRST):
    r = ws.reader(priority)
    try:
        return [(str(p), d) for p, d in r.read(topic)]
    finally:
        r.close()


def offload_all_at(ws, as_of, ns=None):
    res = run(ws, plan_offload(ws, ns, as_of))
    assert res and all(r.outcome == "offloaded" for r in res), res
    return res


def records_of(ws, typ: str) -> list[DeletionRecord]:
    return sorted((e.record for e in DeletionLog(ws.metadata).pending() if e.record.type == typ),
                  key=lambda r: (r.ledger_id, r.uuid))


def lag_records_of(ws, typ: str) -> list[tuple[str, int]]:
    return sorted((r.topic, r.ledger_id) for r in records_of(ws, typ))


def lag_records(ws) -> list[tuple[str, int]]:
    """(topic, ledger) of the pending records, each checked to be a deletion-lag hot-copy record."""
    out = []
    for e in DeletionLog(ws.metadata).pending():
        r = e.record
        assert (r.type, r.reason, r.component, r.uuid, r.driver) == ("ledger", "deletion-lag", "managed-ledger", "", {})
        out.append((r.topic, r.ledger_id))
    return sorted(out)


def drain_ok(ws, as_of) -> dict:
    """Phase 2: every due record processed, none left, nothing failed or refused."""
    rep = drain(ws, as_of)
    assert rep.retrying == rep.dead_lettered == rep.refused_mismatch == rep.malformed == 0, rep.rows
    assert DeletionLog(ws.metadata).pending() == []
    return rep.counts()


def verify_cli(ws) -> int:
    return cli.main(["--config", _config_path(ws), "verify"])


def _config_path(ws):
    from pathlib import Path
    from urllib.parse import unquote, urlparse

    return str(Path(unquote(urlparse(ws.config.hot_url).path)).parent / "tiered.toml")


# -- plan_offload: Pulsar's auto-offload semantics ------------------------------------------------


@pytest.mark.parametrize(
    "threshold_bytes,threshold_seconds,expected",
    [
        (None, 0, 2),
        (100, None, 1),
        (-1, None, 0),
        (None, None, 0),
        (1, 1, 2),
        (100, 2**63 - 1, 1),
    ],
)
def test_pulsar_auto_offload_matrix(make_ws, threshold_bytes, threshold_seconds, expected):
    """docs/metadata.md: 3 ledgers of 10 entries x 10 bytes, the newest still open."""
    ws = make_ws(ledgers=2, entries=10, entry_size="10")
    fields = {}
    if threshold_bytes is not None:
        fields["offload_threshold_bytes"] = threshold_bytes
    if threshold_seconds is not None:
        fields["offload_threshold_seconds"] = threshold_seconds
    if fields:
        set_ns(ws, "t/a", **fields)
    plan = plan_offload(ws, ["t/a"], END_MS + 60_000)
    ids = sealed(ws, T)
    assert planned(plan) == ({T: ids[:expected]} if expected else {})
    # and it really happens: that many ledgers offloaded, never the open one
    run(ws, plan)
    lis = ledger_infos(ws)
    assert [li.offloadContext.complete for li in lis] == [True] * expected + [False] * (3 - expected)


@pytest.mark.parametrize(
    "threshold_bytes,threshold_seconds,as_of,expected_count",
    [
        (0, -1, END_MS, 4),  # 0: every sealed ledger
        (2500, -1, END_MS, 2),  # running sum newest first: 1000, 2000, 3000 (>), 4000 (>)
        (3999, -1, END_MS, 1),
        (4000, -1, END_MS, 0),
        (-1, 1200, END_MS, 2),  # ages 1800 s, 1200 s (>=), 600 s, 0 s
        (-1, 600, END_MS, 3),
        (-1, 600, END_MS + 599_999, 3),
        (-1, 600, END_MS + 600_000, 4),  # the newest is exactly 600 s old
        (-1, 0, END_MS, 4),
        (3500, 1800, END_MS, 1),  # either rule chooses the oldest only
        (1500, 1800, END_MS, 3),
    ],
)
def test_thresholds_against_generated_close_times(make_ws, threshold_bytes, threshold_seconds, as_of,
                                                   expected_count):
    ws = make_ws(ledgers=4, entries=10, entry_size="100")  # 4 sealed x 1000 bytes, 10 min apart
    lis = ledger_infos(ws)
    assert [li.timestamp for li in lis[:-1]] == [END_MS - k * INTERVAL_MS for k in (3, 2, 1, 0)]
    assert [li.size for li in lis[:-1]] == [1000] * 4 and lis[-1].timestamp == 0
    set_ns(ws, "t/a", offload_threshold_bytes=threshold_bytes, offload_threshold_seconds=threshold_seconds)
    plan = plan_offload(ws, None, as_of)
    ids = sealed(ws, T)
    assert planned(plan) == ({T: ids[:expected_count]} if expected_count else {})
    assert all(w.kind == KIND_OFFLOAD and w.as_of_ms == as_of for w in plan)


def test_disabled_namespace_and_topic_override(make_ws):
    ws = make_ws(["t/on", "t/off"], topics=2)
    set_ns(ws, "t/on", offload_threshold_bytes=0)
    set_ns(ws, "t/off", offload_threshold_bytes=-1)
    ws.policies.set_topic("t/on/topic-0001", {"offload_threshold_bytes": -1})
    ws.policies.set_topic("t/off/topic-0001", {"offload_threshold_seconds": 0})
    plan = planned(plan_offload(ws, None, END_MS))
    assert sorted(plan) == ["persistent://t/off/topic-0001", "persistent://t/on/topic-0000"]
    # explicit namespaces: the disabled one still plans only its enabled topic
    assert sorted(planned(plan_offload(ws, ["t/off"], END_MS))) == ["persistent://t/off/topic-0001"]


# -- backfills and retries --------------------------------------------------------------------------


def test_backfill_for_an_older_logical_date_offloads_nothing_sealed_after_it(make_ws):
    ws = make_ws(["t/a"], topics=2, ledgers=4)
    set_ns(ws, "t/a", offload_threshold_bytes=0)
    # at END - 10 min - 1 ms, ledgers 0 and 1 were sealed; ledger 2 was the open one
    older = END_MS - INTERVAL_MS - 1
    plan = plan_offload(ws, None, older)
    for w in plan:
        ids = sealed(ws, w.topic)
        assert w.ledgers == ids[:2]
        for li in ledger_infos(ws, w.topic):
            if li.ledgerId in w.ledgers:
                assert 0 < li.timestamp <= older
    res = run(ws, plan)
    assert [r.outcome for r in res] == ["offloaded"] * 4
    # the same old date again, and an even older one: nothing
    assert plan_offload(ws, None, older) == []
    assert plan_offload(ws, None, END_MS - 3 * INTERVAL_MS) == []
    # a threshold in seconds cannot reach into the future of the older date either
    set_ns(ws, "t/a", offload_threshold_bytes=-1, offload_threshold_seconds=0)
    assert plan_offload(ws, None, older) == []
    # the current date does the rest
    plan = plan_offload(ws, None, END_MS)
    assert {w.topic: w.ledgers for w in plan} == {t: sealed(ws, t)[2:] for t in planned(plan)}
    assert len(plan) == 2


def test_running_the_same_plan_twice_offloads_nothing_the_second_time(make_ws):
    ws = make_ws(["t/a"], topics=2)
    set_ns(ws, "t/a", offload_threshold_bytes=0)
    plan = plan_offload(ws, None, END_MS)
    first = run(ws, plan)
    assert [r.outcome for r in first] == ["offloaded"] * 8
    keys, uploads = store_listing(ws.store)
    assert len(keys) == 16 and uploads == []
    records = {t: ws.ml.get_topic(t) for t in planned(plan)}

    again = run(ws, plan)  # an Airflow retry of the same task
    assert [r.outcome for r in again] == ["skipped"] * 8
    assert [r.uuid for r in again] == [r.uuid for r in first]
    assert not any(r.failed for r in again)
    assert store_listing(ws.store) == (keys, [])
    assert {t: ws.ml.get_topic(t) for t in planned(plan)} == records  # not even a version bump
    assert plan_offload(ws, None, END_MS) == []


def test_max_topics_leaves_the_rest_for_the_next_run(make_ws):
    """At most max_topics per namespace (a sweep's namespaces share a Spark application: one busy
    namespace never starves the others)."""
    ws = make_ws(["t/a", "t/b"], topics=3)
    set_ns(ws, "t/a", offload_threshold_bytes=0)
    set_ns(ws, "t/b", offload_threshold_bytes=0)
    seen = set()
    for sizes in ((2, 2), (1, 1)):
        plan = plan_offload(ws, None, END_MS, max_topics=2)
        assert [sum(1 for w in plan if w.topic.startswith(f"persistent://t/{ns}/")) for ns in "ab"] == list(sizes)
        assert not seen & set(planned(plan))
        seen |= set(planned(plan))
        run(ws, plan)
    assert len(seen) == 6
    assert plan_offload(ws, None, END_MS, max_topics=2) == []


def test_dry_run_changes_nothing(make_ws):
    ws = make_ws()
    set_ns(ws, "t/a", offload_threshold_bytes=0)
    before = ws.ml.get_topic(T)
    plan = plan_offload(ws, None, END_MS, dry_run=True)
    res = run(ws, plan)
    assert [r.outcome for r in res] == ["planned"] * 4 and not any(r.failed for r in res)
    assert ws.ml.get_topic(T) == before
    assert store_listing(ws.store) == ([], [])
    assert [o.key for o in iter_objects(ws.store)] == ["tiered-owner.standalone"]  # claimed at init


def test_plan_manual_offload(make_ws):
    ws = make_ws()
    ids = sealed(ws, T)
    with pytest.raises(ValidationError, match="exactly one"):
        ManualOffload()
    with pytest.raises(ValidationError, match="exactly one"):
        ManualOffload(Position(ids[2], 0), 100)
    with pytest.raises(ValidationError, match="exactly one of --up-to LEDGER:ENTRY or --keep-bytes SIZE"):
        ManualOffload.parse(" ", "")
    with pytest.raises(ValidationError, match="exactly one of up_to LEDGER:ENTRY or keep_bytes SIZE"):
        ManualOffload.parse("1:0", 5, names=("up_to", "keep_bytes"))
    assert ManualOffload.parse("", "64M") == ManualOffload(keep_bytes=64 << 20)
    assert ManualOffload.parse("3:4", None).job_args() == ["--up-to", "3:4"]
    assert ManualOffload.parse(None, 0).job_args() == ["--keep-bytes", "0"]
    with pytest.raises(ValidationError, match="keep-bytes"):
        plan_manual_offload(ws.ml, T, END_MS, ManualOffload(keep_bytes=-1))
    with pytest.raises(ValidationError):
        plan_manual_offload(ws.ml, "not a topic name!", END_MS, ManualOffload(keep_bytes=0))
    with pytest.raises(TopicNotFoundError):
        plan_manual_offload(ws.ml, "t/a/missing", END_MS, ManualOffload(keep_bytes=0))

    assert planned(plan_manual_offload(ws.ml, T, END_MS, ManualOffload(up_to=Position(ids[2], 5)))) == {T: ids[:2]}
    # keep 1500 bytes hot: newest first 0 (open), 1000, 2000 > 1500 at ids[2] -> up to (excluding) the
    # ledger visited before it, ids[3]: the kept suffix (ids[3] and the open one) is at most 1500 bytes
    assert planned(plan_manual_offload(ws.ml, T, END_MS, ManualOffload(keep_bytes=1500))) == {T: ids[:3]}
    # keep 0: the empty open ledger alone is within 0 bytes, so every sealed ledger goes (docs/metadata.md)
    assert planned(plan_manual_offload(ws.ml, T, END_MS, ManualOffload(keep_bytes=0))) == {T: ids}
    assert plan_manual_offload(ws.ml, T, END_MS, ManualOffload(keep_bytes=10**9)) == []
    # never the open ledger, even "up to" past it
    assert planned(plan_manual_offload(ws.ml, T, END_MS, ManualOffload(up_to=Position(10**6, 0)))) == {T: ids}
    # an older logical date sees only what was sealed then (ids[2], open at that time, stays)
    assert planned(plan_manual_offload(ws.ml, T, END_MS - INTERVAL_MS - 1, ManualOffload(keep_bytes=0))) == {T: ids[:2]}
    # manual offload without any policy (offload disabled) works, and is idempotent
    plan = plan_manual_offload(ws.ml, T, END_MS, ManualOffload(keep_bytes=1500))
    assert [r.outcome for r in run(ws, plan)] == ["offloaded"] * 3
    assert plan_manual_offload(ws.ml, T, END_MS, ManualOffload(keep_bytes=1500)) == []


def test_manual_offload_parses_positions():
    assert ManualOffload.parse("12:3", None).up_to == Position(12, 3)
    for bad in ("x", "1:y", "12"):  # a bare ledger id is ambiguous for an offload bound
        with pytest.raises(ValidationError, match="LEDGER:ENTRY"):
            ManualOffload.parse(bad, None)
    for bad in (f"{2**63}:0", f"1:{2**63}"):
        with pytest.raises(ValidationError, match="--up-to .*64-bit"):
            ManualOffload.parse(bad, None)


def test_cluster_defaults_come_from_the_configuration(make_ws):
    """The workspace configuration's max_block_size / read_buffer are the cluster defaults under the
    namespace policies (docs/metadata.md: topic > namespace > cluster default)."""
    ws = make_ws(entries=10, entry_size="1000", config_overrides={"max_block_size": 4096, "read_buffer": 2048})
    set_ns(ws, "t/a", offload_threshold_bytes=0)
    pol = ws.policies.for_topic(T)
    assert pol.max_block_size == 4096 and pol.read_buffer_size == 2048
    res = run(ws, plan_offload(ws, None, END_MS))
    assert all(r.outcome == "offloaded" and r.blocks >= 3 for r in res), res
    # a namespace override still wins
    set_ns(ws, "t/a", max_block_size=1 << 20)
    assert ws.policies.for_topic(T).max_block_size == 1 << 20


def test_a_failing_topic_does_not_stop_the_others(make_ws, tmp_path):
    ws = make_ws(["t/a", "t/bad"])
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("x")
    set_ns(ws, "t/a", offload_threshold_bytes=0)
    set_ns(ws, "t/bad", offload_threshold_bytes=0,
           store={"driver": "filesystem", "root": str(blocker / "cold")})
    plan = plan_offload(ws, None, END_MS)
    assert len(plan) == 2
    res = run(ws, plan)
    by_ns = {}
    for r in res:
        by_ns.setdefault(r.namespace, []).append(r)
    assert [r.outcome for r in by_ns["t/a"]] == ["offloaded"] * 4
    assert [r.outcome for r in by_ns["t/bad"]] == ["failed"] * 4
    assert all(r.failed and "cannot create store directories" in r.error for r in by_ns["t/bad"])
    summary = RunSummary.of("offload_sweep", "r", END_MS, False, [asdict(r) for r in res], 0.1)
    assert summary.failures == 4 and summary.namespaces["t/bad"]["failures"] == 4
    assert summary.namespaces["t/a"] == {"ledgers": 4, "bytes": sum(r.bytes for r in by_ns["t/a"]), "failures": 0,
                                         "outcomes": {"offloaded": 4}}
    # fixing the cause: the rerun does only what is left
    blocker.unlink()
    plan = plan_offload(ws, None, END_MS)
    assert [w.topic for w in plan] == ["persistent://t/bad/topic-0000"]
    assert [r.outcome for r in run(ws, plan)] == ["offloaded"] * 4


# -- deletion-lag cleanup ---------------------------------------------------------------------------


@pytest.fixture
def offloaded_ws(make_ws):
    """Ledgers 0, 1 offloaded by a run at END; ledgers 2, 3 by a run 30 min later; lag 1 h."""
    ws = make_ws()
    set_ns(ws, "t/a", offload_threshold_bytes=0, deletion_lag_ms=HOUR)
    ids = sealed(ws, T)
    assert [r.outcome for r in run(ws, [TopicWork(T, KIND_OFFLOAD, ids[:2], END_MS)])] == ["offloaded"] * 2
    assert [r.outcome for r in run(ws, [TopicWork(T, KIND_OFFLOAD, ids[2:], END_MS + HOUR // 2)])] == [
        "offloaded"] * 2
    lis = ledger_infos(ws)
    assert [li.offloadContext.timestamp for li in lis[:-1]] == [END_MS] * 2 + [END_MS + HOUR // 2] * 2
    return ws


def test_deletion_lag_is_strictly_after_the_lag(offloaded_ws):
    ws = offloaded_ws
    ids = sealed(ws, T)
    assert plan_lag_cleanup(ws, None, END_MS) == []
    assert plan_lag_cleanup(ws, None, END_MS + HOUR) == []  # exactly the lag: not yet
    plan = plan_lag_cleanup(ws, None, END_MS + HOUR + 1)
    assert planned(plan) == {T: ids[:2]} and plan[0].kind == KIND_LAG_CLEANUP
    assert planned(plan_lag_cleanup(ws, ["t/a"], END_MS + HOUR // 2 + HOUR + 1)) == {T: ids}
    # an earlier logical date (a backfill before the offloads completed) deletes nothing early
    assert plan_lag_cleanup(ws, None, END_MS - 1) == []
    # lag -1 keeps hot copies forever; lag 0 deletes right after completion
    set_ns(ws, "t/a", deletion_lag_ms=-1)
    assert plan_lag_cleanup(ws, None, END_MS + 100 * HOUR) == []
    set_ns(ws, "t/a", deletion_lag_ms=0)
    assert planned(plan_lag_cleanup(ws, None, END_MS + 1)) == {T: ids[:2]}


def test_incomplete_offload_is_never_cleaned_up(make_ws):
    ws = make_ws()
    set_ns(ws, "t/a", offload_threshold_bytes=0, deletion_lag_ms=0)
    lid = sealed(ws, T)[0]

    def begin_only(info):
        li = find_ledger(info, lid)
        li.offloadContext.uidMsb, li.offloadContext.uidLsb = 1, 2
        li.offloadContext.complete = False

    ws.ml.update_topic(T, begin_only)
    assert plan_lag_cleanup(ws, None, END_MS + 100 * HOUR) == []
    # and even if asked to, the executor re-checks on the current metadata
    res = run(ws, [TopicWork(T, KIND_LAG_CLEANUP, [lid], END_MS + 100 * HOUR)])
    assert [r.outcome for r in res] == ["skipped"] and ws.hot.exists(lid)


def test_cleanup_marks_hot_copies_past_the_lag_and_the_drain_deletes_them(offloaded_ws):
    ws = offloaded_ws
    ids = sealed(ws, T)
    before = read_all(ws, priority=HOT_FIRST)
    assert len(before) == 40
    as_of = END_MS + HOUR + 1
    plan = plan_lag_cleanup(ws, None, as_of)
    dry = run(ws, [TopicWork(w.topic, w.kind, w.ledgers, as_of, dry_run=True) for w in plan])
    assert [r.outcome for r in dry] == ["planned"] * 2 and all(ws.hot.exists(i) for i in ids)

    assert lag_records(ws) == []

    # phase 1: one durable `ledger` record per hot copy, then bookkeeperDeleted; nothing deleted yet
    res = run(ws, plan)
    assert [(r.ledger, r.outcome) for r in res] == [(ids[0], "marked"), (ids[1], "marked")]
    assert all(r.bytes == 1000 and r.entries == 10 and r.uuid for r in res)
    assert lag_records(ws) == [(ML, ids[0]), (ML, ids[1])]
    assert all(e.record.created_ms == as_of for e in DeletionLog(ws.metadata).pending())
    lis = ledger_infos(ws)
    assert [ws.hot.exists(i) for i in ids] == [True] * 4
    assert [li.offloadContext.bookkeeperDeleted for li in lis[:-1]] == [True, True, False, False]
    assert [context_uuid(li) for li in lis[:2]] == [r.uuid for r in res]
    summary = RunSummary.of("deletion_lag_cleanup", "r", as_of, False, [asdict(r) for r in res], 0.1)
    assert summary.outcomes == {"marked": 2} and summary.bytes == 2000 and summary.failures == 0
    # between the CAS and the drain readers already use the offloaded copies
    for priority in (TIERED_FIRST, HOT_FIRST):
        assert read_all(ws, priority=priority) == before

    # phase 2: the drain deletes the hot copies
    counts = drain_ok(ws, as_of)
    assert counts["deleted"] == 2 and counts["still_in_use"] == 0
    assert [ws.hot.exists(i) for i in ids] == [False, False, True, True]
    for priority in (TIERED_FIRST, HOT_FIRST):
        assert read_all(ws, priority=priority) == before
    assert verify_cli(ws) == 0
    # rerun of the same logical date: nothing planned, and executing the old plan skips
    assert plan_lag_cleanup(ws, None, as_of) == []
    assert [r.outcome for r in run(ws, plan)] == ["skipped", "skipped"]
    assert lag_records(ws) == []


def test_cleanup_completes_after_a_crash_between_append_and_cas(offloaded_ws):
    """A crash after the record was appended, before bookkeeperDeleted: the drain finds the hot copy
    still in use and keeps it; the next run appends afresh, marks, and the drain deletes."""
    ws = offloaded_ws
    ids = sealed(ws, T)
    before = read_all(ws)
    as_of = END_MS + HOUR + 1
    DeletionLog(ws.metadata).append([DeletionRecord(topic=ML, ledger_id=ids[0], type="ledger",
                                                    reason="deletion-lag", created_ms=as_of)])
    counts = drain_ok(ws, as_of)
    assert counts["still_in_use"] == 1 and counts["deleted"] == 0 and ws.hot.exists(ids[0])
    assert read_all(ws, priority=HOT_FIRST) == before
    # a crash of an earlier version (hot copy deleted first, then the CAS): readers cope as well
    ws.hot.delete_ledger(ids[1])
    assert read_all(ws, priority=HOT_FIRST) == before

    plan = plan_lag_cleanup(ws, None, as_of)
    assert planned(plan) == {T: ids[:2]}
    res = run(ws, plan)
    assert [r.outcome for r in res] == ["marked", "marked"]
    assert all(li.offloadContext.bookkeeperDeleted for li in ledger_infos(ws)[:2])
    assert lag_records(ws) == [(ML, ids[0]), (ML, ids[1])]
    counts = drain_ok(ws, as_of)
    assert (counts["deleted"], counts["already_deleted"]) == (1, 1)
    assert not ws.hot.exists(ids[0]) and not ws.hot.exists(ids[1])
    assert read_all(ws, priority=HOT_FIRST) == before


def test_cleanup_record_whose_cas_finds_the_ledger_changed_is_left_to_the_drain(offloaded_ws, monkeypatch):
    """The topic changes between the append and the CAS (here: marked by someone else): the row is
    skipped; the appended record is harmless (the drain treats it like any other)."""
    ws = offloaded_ws
    ids = sealed(ws, T)
    as_of = END_MS + HOUR + 1
    real_append = DeletionLog.append

    def append_then_race(self, records):
        real_append(self, records)

        def mark(info):
            find_ledger(info, records[0].ledger_id).offloadContext.bookkeeperDeleted = True

        ws.ml.update_topic(T, mark)

    monkeypatch.setattr(DeletionLog, "append", append_then_race)
    res = run(ws, [TopicWork(T, KIND_LAG_CLEANUP, [ids[0]], as_of)])
    monkeypatch.undo()
    assert [r.outcome for r in res] == ["skipped"] and "drain" in res[0].error
    assert lag_records(ws) == [(ML, ids[0])]
    assert drain_ok(ws, as_of)["deleted"] == 1 and not ws.hot.exists(ids[0])


def _corrupt_index(ws, li, how):
    uuid = context_uuid(li)
    ikey = index_key("", uuid, li.ledgerId)
    if how == "index-deleted":
        ws.store.delete([ikey])
    elif how == "data-deleted":
        ws.store.delete([data_key("", uuid, li.ledgerId)])
    elif how in ("index-garbage", "index-truncated", "index-empty"):
        md = ws.store.head(ikey).metadata
        raw = ws.store.get(ikey)
        body = {"index-garbage": b"\xff" * len(raw), "index-truncated": raw[: len(raw) // 2],
                "index-empty": b""}[how]
        ws.store.put(ikey, body, md)
    elif how == "index-version":
        md = {**ws.store.head(ikey).metadata, METADATA_FORMAT_VERSION_KEY: "99"}
        ws.store.put(ikey, ws.store.get(ikey), md)
    elif how in ("entries-mismatch", "size-mismatch"):
        def bump(info):
            cur = find_ledger(info, li.ledgerId)
            if how == "entries-mismatch":
                cur.entries += 1
            else:
                cur.size -= 1

        ws.ml.update_topic(T, bump)
    elif how == "data-truncated":
        dkey = data_key("", uuid, li.ledgerId)
        md = ws.store.head(dkey).metadata
        ws.store.put(dkey, ws.store.get(dkey)[:-1], md)
    else:
        raise AssertionError(how)


def _flip_data(ws, li, how):
    """Damage that leaves the index, the entry count and the size as they were."""
    dkey = data_key("", context_uuid(li), li.ledgerId)
    md, data = ws.store.head(dkey).metadata, bytearray(ws.store.get(dkey))
    if how == "payload-byte":
        data[128 + 12 + 50] ^= 0x01  # inside entry 0's payload
    elif how == "frame-length":
        data[128 + 3] ^= 0x01  # entry 0's length field: 100 -> 101
    else:
        raise AssertionError(how)
    ws.store.put(dkey, bytes(data), md)


REPAIRABLE = ["index-deleted", "data-deleted", "index-garbage", "index-truncated", "index-empty", "index-version",
              "data-truncated", "payload-byte", "frame-length"]


@pytest.mark.parametrize("how", [*REPAIRABLE, "entries-mismatch", "size-mismatch"])
def test_cleanup_never_deletes_a_hot_copy_whose_offloaded_copy_fails_verification(offloaded_ws, how):
    """The proof before a hot copy is marked is a checksum of every frame, not a count: a damaged
    offloaded copy keeps its hot copy (verify-failed) and is replaced by a verified re-offload; the
    damaged attempt goes to the deletion log."""
    ws = offloaded_ws
    ids = sealed(ws, T)
    victim = ledger_infos(ws)[0]
    damaged = context_uuid(victim)
    if how in ("payload-byte", "frame-length"):
        _flip_data(ws, victim, how)
    else:
        _corrupt_index(ws, victim, how)
    as_of = END_MS + HOUR + 1
    res = run(ws, plan_lag_cleanup(ws, None, as_of))
    by_ledger = {r.ledger: r for r in res}
    bad = by_ledger[ids[0]]
    assert bad.outcome == "verify-failed" and bad.failed and "hot copy kept" in bad.error, bad
    assert ws.hot.exists(ids[0])
    li = ledger_infos(ws)[0]
    assert not li.offloadContext.bookkeeperDeleted
    # the other ledger of the same topic is still cleaned up; no hot-copy record for the victim
    assert by_ledger[ids[1]].outcome == "marked"
    assert lag_records_of(ws, "ledger") == [(ML, ids[1])]
    if how in REPAIRABLE:
        # replaced by a new, complete, verified copy; the damaged one goes to the log
        assert "re-offloaded and verified as" in bad.error
        assert li.offloadContext.complete and context_uuid(li) != damaged
        assert li.offloadContext.timestamp == as_of  # its own deletion lag starts now
        assert [(r.ledger_id, r.uuid, r.reason) for r in records_of(ws, "offloaded")] == [
            (ids[0], damaged, "verify-failed")]
        assert not replacement_uuids(li)  # no replacement left recorded
    else:
        # the topic's own record disagrees with both copies: the replacement does not verify either and
        # goes to the log itself; the current copy stays as it was
        assert "re-offload failed" in bad.error and context_uuid(li) == damaged
        (rec,) = records_of(ws, "offloaded")
        assert (rec.ledger_id, rec.reason) == (ids[0], "offload-conflict") and rec.uuid != damaged
        assert not replacement_uuids(li)
    counts = drain_ok(ws, as_of)
    assert counts["deleted"] == 2
    assert ws.hot.exists(ids[0]) and not ws.hot.exists(ids[1])
    # and the data is still all there, through the hot copy and (repaired) the new offloaded copy
    if how == "entries-mismatch":  # the record lists an entry neither copy has: refused, never short
        with pytest.raises(CorruptEntryError, match="holds 10 entries.*lists 11.*the offloaded copy"):
            read_all(ws, priority=HOT_FIRST)
        return
    assert len(read_all(ws, priority=HOT_FIRST)) == 40
    if how in REPAIRABLE:
        r = ws.reader(TIERED_FIRST)
        try:
            assert len(list(r.read(T))) == 40 and r.fallbacks == 0
        finally:
            r.close()
        keys = {k for k in store_listing(ws.store)[0]}
        assert not any(damaged in k for k in keys)  # the damaged objects are gone
        assert {data_key("", context_uuid(li), ids[0]), index_key("", context_uuid(li), ids[0])} <= keys


def test_per_namespace_store_from_policy(make_ws, tmp_path):
    ws = make_ws(["t/a", "t/b"])
    other_root = tmp_path / "other-cold"
    set_ns(ws, "t/a", offload_threshold_bytes=0, deletion_lag_ms=0,
           store={"driver": "filesystem", "root": str(other_root), "prefix": "ns-a/objs"})
    set_ns(ws, "t/b", offload_threshold_bytes=0, deletion_lag_ms=0)
    tb = "persistent://t/b/topic-0000"
    before = {t: read_all(ws, t) for t in (T, tb)}
    res = run(ws, plan_offload(ws, None, END_MS))
    assert [r.outcome for r in res] == ["offloaded"] * 8

    other = FilesystemBlobStore(other_root)
    other_keys, uploads = store_listing(other)
    assert other.head("ns-a/objs/tiered-owner.standalone").size > 0  # claimed by the first offload there
    assert uploads == [] and len(other_keys) == 8
    assert all(k.startswith("ns-a/objs/") for k in other_keys)
    a_uuids = {(li.ledgerId, context_uuid(li)) for li in ledger_infos(ws, T)[:-1]}
    assert {(p.ledger_id, p.uuid) for p in map(lambda k: parse_ledger_key(k, "ns-a/objs/"), other_keys)} == a_uuids
    # the workspace store holds only t/b's objects
    ws_keys, _ = store_listing(ws.store)
    b_uuids = {(li.ledgerId, context_uuid(li)) for li in ledger_infos(ws, tb)[:-1]}
    assert {(p.ledger_id, p.uuid) for p in map(parse_ledger_key, ws_keys)} == b_uuids
    # driver metadata records where each ledger went
    dm = ledger_infos(ws, T)[0].offloadContext.driverMetadata
    assert dm.name == "tiered-local"  # this project's local store (Pulsar's "filesystem" is a Hadoop offloader)
    assert {kv.key: kv.value for kv in dm.properties} == {"root": str(other_root), "prefix": "ns-a/objs/"}

    # the lag cleanup verifies against that store, then reads follow the driver metadata
    clean = run(ws, plan_lag_cleanup(ws, None, END_MS + 1))
    assert [r.outcome for r in clean] == ["marked"] * 8
    assert drain_ok(ws, END_MS + 1)["deleted"] == 8
    assert not any(ws.hot.exists(li.ledgerId) for t in (T, tb) for li in ledger_infos(ws, t)[:-1])
    # even after the policy moves the namespace elsewhere
    set_ns(ws, "t/a", store={"driver": "filesystem", "root": str(tmp_path / "moved")})
    for t in (T, tb):
        assert read_all(ws, t) == before[t]
    assert verify_cli(ws) == 0
