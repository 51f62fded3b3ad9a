"""Retention trim and topic deletion (phase 1 of two-phase deletion, docs/metadata.md + docs/deletion.md), on real
workspaces built with `tiered init` / `tiered generate`; the selection rule exhaustively without I/O."""

from __future__ import annotations

import importlib
import uuid as uuidlib

import pytest

from tests.support.workspaces import END_MS, INTERVAL_MS, offload
from tieredcore.cli.workload import PayloadGenerator
from tieredcore.cold.blob import iter_objects
from tieredcore.errors import HotLedgerNotFoundError, MetadataStoreError
from tieredcore.formats.proto import MLDataFormats_pb2 as pb
from tieredcore.formats.uuids import uuid_to_msb_lsb
from tieredcore.lifecycle.planner import select_retention
from tieredcore.lifecycle.retention import delete_topic, plan_retention, trim_topic
from tieredcore.lifecycle.runner import run_work
from tieredcore.lifecycle.sweep import plan_lag_cleanup, plan_offload
from tieredcore.lifecycle.work import KIND_RETENTION, LedgerResult
from tieredcore.meta.deletion_log import TYPE_LEDGER, TYPE_OFFLOADED, DeletionLog
from tieredcore.meta.managed_ledgers import ManagedLedgerStore, find_ledger
from tieredcore.meta.reasons import Reason
from tieredcore.offload.deletion import object_groups
from tieredcore.offload.managed import ABANDONED_PREFIX, context_uuid
from tieredcore.offload.transaction import ObjectGroup

MIN = 60_000
T = "persistent://t/a/topic-0000"
ML = "t/a/persistent/topic-0000"


# -- helpers --------------------------------------------------------------------------------------


def _drain():
    """tieredcore.lifecycle.drain.drain (phase 2) when it exists in this tree, else None."""
    try:
        mod = importlib.import_module("tieredcore.lifecycle.drain")
    except ImportError:
        return None
    return getattr(mod, "drain", None)


def drain_lag_records(ws, as_of):
    """Phase 2 of the deletion-lag cleanup's records (the lag cleanup only marks bookkeeperDeleted)."""
    drain = _drain()
    if drain is not None:
        rep = drain(ws, as_of)
        assert rep.still_in_use == rep.dead_lettered == rep.retrying == 0
        assert pending(ws) == []


def set_ns(ws, ns="t/a", **fields):
    return ws.policies.set_namespace(ns, fields)


def ledger_infos(ws, topic=T):
    info, _ = ws.ml.get_topic(topic)
    return list(info.ledgerInfo)


def ids(ws, topic=T):
    return [li.ledgerId for li in ledger_infos(ws, topic)]


def run(ws, plan):
    return [LedgerResult(**r) for r in run_work(ws.config, [w.as_dict() for w in plan])]


def pending(ws):
    return [e.record for e in DeletionLog(ws.metadata).pending()]


def groups_of(records):
    return sorted((r.ledger_id, r.type, r.uuid) for r in records)


def read_all(ws, topic=T):
    r = ws.reader()
    try:
        return [(p.ledger_id, p.entry_id, d) for p, d in r.read(topic)]
    finally:
        r.close()


def generated(all_sealed, keep, entries=10, size=100, topic_ml=ML):
    """What `tiered generate` wrote into the ledgers `keep`: ledger k of the topic's original sealed
    ledgers `all_sealed` holds entries k*entries .. k*entries+entries-1 of the generator's sequence."""
    gen = PayloadGenerator(1, topic_ml, size, size)
    return [(lid, e, gen.payload(k * entries + e))
            for k, lid in enumerate(all_sealed) if lid in keep for e in range(entries)]


def objects_of(ws, lid, uuid):
    return [o.key for o in iter_objects(ws.store) if str(uuid) in o.key and f"ledger-{lid}" in o.key]


def hot_exists(ws, lid) -> bool:
    try:
        ws.hot.open_ledger(lid).close()
        return True
    except HotLedgerNotFoundError:
        return False


class HookedStore:
    """A MetadataStore that runs hooks before topic-record writes (inject failures or races)."""

    def __init__(self, inner, before_put=None, before_delete=None):
        self.inner = inner
        self.before_put = before_put
        self.before_delete = before_delete

    def put(self, path, value, expected_version):
        if self.before_put is not None and path.startswith("/managed-ledgers/"):
            self.before_put(path)
        return self.inner.put(path, value, expected_version)

    def delete(self, path, expected_version=None):
        if self.before_delete is not None and path.startswith("/managed-ledgers/"):
            self.before_delete(path)
        return self.inner.delete(path, expected_version)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def hook(ws, **hooks) -> HookedStore:
    real = ws.metadata
    wrapped = HookedStore(real, **hooks)
    ws.__dict__["metadata"] = wrapped
    ws.__dict__["ml"] = ManagedLedgerStore(wrapped)
    return wrapped


def add_abandoned(ml, lid, u, topic=T):
    def mutate(info):
        find_ledger(info, lid).properties.add(key=ABANDONED_PREFIX + u, value="1")

    ml.update_topic(topic, mutate)


def record_incomplete_attempt(ws, lid, topic=T) -> str:
    """An offload attempt that recorded its uuid (complete=false) and died before completing."""
    u = uuidlib.uuid4()
    msb, lsb = uuid_to_msb_lsb(u)
    dm = ws.topic_offloader()._driver_metadata()

    def mutate(info):
        ctx = find_ledger(info, lid).offloadContext
        ctx.uidMsb, ctx.uidLsb, ctx.complete = msb, lsb, False
        ctx.driverMetadata.CopyFrom(dm)

    ws.ml.update_topic(topic, mutate)
    return str(u)


# -- select_retention: Pulsar's rule --------------------------------------------------------------


def L(lid, size=100, ts=1, offloaded=False, bk_deleted=False):
    li = pb.ManagedLedgerInfo.LedgerInfo(ledgerId=lid, size=size, entries=size // 10, timestamp=ts)
    if offloaded:
        li.offloadContext.complete = True
        li.offloadContext.bookkeeperDeleted = bk_deleted
    return li


NOW = 1_000 * MIN


def topic_of(ages_min, sizes=None, **kw):
    """Sealed ledgers 1..n closed ages_min[i] minutes before NOW, plus the open newest ledger."""
    sizes = sizes or [100] * len(ages_min)
    out = [L(i + 1, s, NOW - a * MIN, **kw) for i, (a, s) in enumerate(zip(ages_min, sizes, strict=True))]
    return out + [L(len(ages_min) + 1, 0, 0)]


@pytest.mark.parametrize(
    "time_ms, size_bytes, expected",
    [
        # time only: strictly older than the retention time
        (25 * MIN, None, [1, 2]),
        (30 * MIN, -1, [1]),  # ledger 2 is exactly 30 min old: not strictly older
        (0, None, [1, 2, 3, 4]),
        (10**12, None, []),
        # size only, total 400: delete while total - toDelete >= size
        (None, 250, [1]),
        (-1, 200, [1, 2]),
        (None, 0, [1, 2, 3, 4]),
        (None, 400, []),
        (None, 10**12, []),
        # both: either condition removes, the walk stops at the first ledger that meets neither
        (35 * MIN, 250, [1]),
        (15 * MIN, 350, [1, 2, 3]),
        (25 * MIN, 150, [1, 2]),
        # disabled
        (None, None, []),
        (-1, -1, []),
    ],
)
def test_select_retention_matrix(time_ms, size_bytes, expected):
    ledgers = topic_of([40, 30, 20, 10])
    assert select_retention(ledgers, time_ms, size_bytes, NOW) == expected


def test_time_boundary_is_strict():
    ledgers = topic_of([10, 5])
    assert select_retention(ledgers, 10 * MIN, None, NOW) == []
    assert select_retention(ledgers, 10 * MIN - 1, None, NOW) == [1]


def test_newest_ledger_is_never_removed():
    # even when sealed (a terminated topic) and past every limit
    ledgers = [L(1, 100, NOW - 50 * MIN), L(2, 100, NOW - 40 * MIN)]
    assert select_retention(ledgers, 0, 0, NOW) == [1]
    assert select_retention([L(1, 100, NOW - 50 * MIN)], 0, 0, NOW) == []
    assert select_retention([], 0, 0, NOW) == []


def test_stops_at_first_ledger_that_is_neither():
    # ledger 2 is young (clock skew / out-of-order close times); ledger 3 behind it is old but stays
    ledgers = topic_of([40, 5, 30])
    assert select_retention(ledgers, 20 * MIN, None, NOW) == [1]
    # size: ledger 1 alone brings the topic under quota; ledgers after it are not considered
    ledgers = topic_of([40, 30, 20], sizes=[300, 10, 10])
    assert select_retention(ledgers, None, 20, NOW) == [1]


def test_unsealed_ledger_stops_the_walk():
    ledgers = [L(1, 100, NOW - 50 * MIN), L(2, 100, 0), L(3, 100, NOW - 40 * MIN), L(4, 0, 0)]
    assert select_retention(ledgers, 0, None, NOW) == [1]


def test_offloaded_ledgers_count_toward_total_size():
    # three offloaded-only ledgers (hot copies deleted) and one hot: the total is 400, not 100
    ledgers = [L(i, 100, NOW - (50 - i) * MIN, offloaded=True, bk_deleted=True) for i in (1, 2, 3)]
    ledgers += [L(4, 100, NOW - 10 * MIN), L(5, 0, 0)]
    assert select_retention(ledgers, None, 200, NOW) == [1, 2]
    # and offloaded ledgers are removed by time like any other
    assert select_retention(ledgers, 47 * MIN, None, NOW) == [1, 2]  # ages 49, 48, 47


# -- trim_topic: phase 1 on a real workspace ------------------------------------------------------


@pytest.fixture
def four(make_ws):
    """4 sealed ledgers of 10 x 100 bytes closed at END-30m, -20m, -10m, END; ledger 0 offloaded with
    its hot copy deleted, ledger 1 offloaded with an abandoned earlier attempt recorded, ledger 2 with
    an incomplete attempt; ledger 3 hot only."""
    ws = make_ws(ledgers=4, entries=10, entry_size="100")
    l0, l1, l2, l3, _open = ids(ws)
    uuids = offload(ws, T, [l0], END_MS)
    set_ns(ws, deletion_lag_ms=0)
    assert [r.outcome for r in run(ws, plan_lag_cleanup(ws, ["t/a"], END_MS + 1))] == ["marked"]
    drain_lag_records(ws, END_MS + 1)  # the lag cleanup's hot-copy deletion is phase 2's
    set_ns(ws, deletion_lag_ms=-1)
    uuids.update(offload(ws, T, [l1], END_MS + 1))
    abandoned = str(uuidlib.uuid4())
    add_abandoned(ws.ml, l1, abandoned)
    incomplete = record_incomplete_attempt(ws, l2)
    assert not hot_exists(ws, l0) and all(hot_exists(ws, lid) for lid in (l1, l2, l3))
    assert objects_of(ws, l0, uuids[l0]) and objects_of(ws, l1, uuids[l1])
    ws.fixture = {"ids": (l0, l1, l2, l3), "uuids": uuids, "abandoned": abandoned, "incomplete": incomplete}
    return ws


def test_trim_records_every_uuid_ever_recorded_then_removes_ledgers(four):
    ws = four
    l0, l1, l2, l3 = ws.fixture["ids"]
    u = ws.fixture["uuids"]
    set_ns(ws, retention_time_minutes=10)
    as_of = END_MS + MIN  # ages 31, 21, 11, 1 minutes
    rows = trim_topic(ws, T, as_of)
    assert [(r.ledger, r.kind, r.outcome) for r in rows] == [
        (l0, KIND_RETENTION, "trimmed"), (l1, KIND_RETENTION, "trimmed"), (l2, KIND_RETENTION, "trimmed")]
    assert ids(ws)[:1] == [l3] and len(ids(ws)) == 2  # ledger 3 and the open one
    recs = pending(ws)
    assert groups_of(recs) == sorted([
        (l0, TYPE_OFFLOADED, u[l0]),  # hot copy already deleted: no ledger record
        (l1, TYPE_LEDGER, ""), (l1, TYPE_OFFLOADED, u[l1]), (l1, TYPE_OFFLOADED, ws.fixture["abandoned"]),
        (l2, TYPE_LEDGER, ""), (l2, TYPE_OFFLOADED, ws.fixture["incomplete"]),  # complete or not
    ])
    for r in recs:
        assert r.reason == Reason.RETENTION and r.created_ms == as_of and r.topic == ML
        assert r.component == "managed-ledger"
        if r.type == TYPE_OFFLOADED:
            assert r.driver["name"] == "tiered-local" and r.driver["properties"]["root"]
        else:
            assert r.driver == {}
    assert DeletionLog(ws.metadata).counters()["appended_hot"] == 2 + 1  # + the fixture's lag-cleanup record
    # the retained ledger still reads back what was written
    assert read_all(ws) == generated([l0, l1, l2, l3], [l3])
    # nothing left to do: a rerun plans and appends nothing
    assert plan_retention(ws, ["t/a"], as_of) == []
    assert trim_topic(ws, T, as_of) == []
    assert len(pending(ws)) == len(recs)
    drain = _drain()
    if drain is not None:
        rep = drain(ws, as_of)
        assert (rep.still_in_use, rep.refused_mismatch, rep.retrying, rep.dead_lettered) == (0, 0, 0, 0)
        assert pending(ws) == []
        assert not hot_exists(ws, l1) and not hot_exists(ws, l2) and hot_exists(ws, l3)
        for lid, uid in ((l0, u[l0]), (l1, u[l1])):
            assert objects_of(ws, lid, uid) == []
        assert read_all(ws) == generated([l0, l1, l2, l3], [l3])


def test_records_are_appended_before_the_metadata_change(four):
    """A failure at the CAS (outcome unknown, or a crash) leaves the records and the ledgers listed:
    the drain sees every such ledger still in use."""
    ws = four
    l0, l1, l2, l3 = ws.fixture["ids"]
    set_ns(ws, retention_time_minutes=10)
    before = ids(ws)

    def fail(path):
        raise MetadataStoreError("injected: connection lost during the topic CAS")

    hook(ws, before_put=fail)
    with pytest.raises(MetadataStoreError):
        trim_topic(ws, T, END_MS + MIN)
    assert ids(ws) == before  # the metadata change did not happen
    recs = pending(ws)
    assert {r.ledger_id for r in recs} == {l0, l1, l2} and len(recs) == 6
    drain = _drain()
    if drain is not None:
        ws.metadata.before_put = None
        rep = drain(ws, END_MS + MIN)
        # hot copies of 1 and 2, and the current uuids of 0, 1, 2; only the abandoned attempt goes
        assert rep.still_in_use == 5 and rep.dead_lettered == rep.retrying == 0
        assert pending(ws) == []
        assert read_all(ws) == generated([l0, l1, l2, l3], [l0, l1, l2, l3])  # still in use
        assert hot_exists(ws, l1) and hot_exists(ws, l2)
    # the next trim (metadata store back) completes the job
    ws.metadata.before_put = None
    rows = trim_topic(ws, T, END_MS + MIN)
    assert [r.outcome for r in rows] == ["trimmed"] * 3
    assert ids(ws)[0] == l3
    assert read_all(ws) == generated([l0, l1, l2, l3], [l3])


def test_run_work_dispatches_retention_units(four):
    ws = four
    l0, l1, l2, l3 = ws.fixture["ids"]
    set_ns(ws, retention_time_minutes=10)
    plan = plan_retention(ws, ["t/a"], END_MS + MIN)
    assert [(w.topic, w.kind, w.ledgers) for w in plan] == [(T, KIND_RETENTION, [l0, l1, l2])]
    rows = run(ws, plan)
    assert [(r.ledger, r.outcome, r.namespace, r.bytes) for r in rows] == [
        (lid, "trimmed", "t/a", 1000) for lid in (l0, l1, l2)]


def test_planned_ledgers_cap_the_trim(four):
    """A unit never removes more than its plan named, even if the policy now selects more."""
    ws = four
    l0, l1, l2, l3 = ws.fixture["ids"]
    set_ns(ws, retention_time_minutes=25)
    plan = plan_retention(ws, ["t/a"], END_MS + MIN)
    assert [w.ledgers for w in plan] == [[l0]]
    set_ns(ws, retention_time_minutes=0)
    assert [r.ledger for r in run(ws, plan)] == [l0]
    assert ids(ws)[:3] == [l1, l2, l3]


def test_new_uuid_recorded_between_append_and_cas_gets_its_record_first(four):
    """An offload attempt records a new uuid after the records were appended: the CAS sees an object
    group no record covers, keeps the ledger, and the next round appends its record first."""
    ws = four
    l0, l1, l2, l3 = ws.fixture["ids"]
    set_ns(ws, retention_time_minutes=10)
    raced = str(uuidlib.uuid4())
    real_ml = ManagedLedgerStore(ws.metadata)
    fired = []

    def race(path):
        if not fired:
            fired.append(1)
            add_abandoned(real_ml, l2, raced)

    hook(ws, before_put=race)
    rows = trim_topic(ws, T, END_MS + MIN)
    assert [r.outcome for r in rows] == ["trimmed"] * 3
    assert (l2, TYPE_OFFLOADED, raced) in groups_of(pending(ws))


def test_dry_run_changes_nothing(four):
    ws = four
    set_ns(ws, retention_time_minutes=10)
    before = ledger_infos(ws)
    plan = plan_retention(ws, ["t/a"], END_MS + MIN, dry_run=True)
    rows = run(ws, plan)
    assert [r.outcome for r in rows] == ["planned"] * 3
    assert [r.outcome for r in trim_topic(ws, T, END_MS + MIN, dry_run=True)] == ["planned"] * 3
    assert ledger_infos(ws) == before and pending(ws) == []
    assert DeletionLog(ws.metadata).counters()["appended_offloaded"] == 0


def test_plan_uses_the_logical_clock(four):
    ws = four
    set_ns(ws, retention_time_minutes=10)
    l0, l1, l2, l3 = ws.fixture["ids"]
    # 10 minutes after ledger 0 closed it is not yet strictly older than 10 minutes
    assert plan_retention(ws, ["t/a"], END_MS - 20 * MIN) == []
    assert [w.ledgers for w in plan_retention(ws, ["t/a"], END_MS - 20 * MIN + 1)] == [[l0]]
    # an older logical date sees the topic as it stood then: ledgers closed later are not counted
    set_ns(ws, retention_time_minutes=-1, retention_size_mb=0)
    assert [w.ledgers for w in plan_retention(ws, ["t/a"], END_MS - 15 * MIN)] == [[l0, l1]]
    assert [w.ledgers for w in plan_retention(ws, ["t/a"], END_MS + 1)] == [[l0, l1, l2, l3]]


def test_plan_retention_per_namespace_and_topic_policy(make_ws):
    ws = make_ws(["t/a", "t/b", "t/c"], ledgers=4, entries=10, entry_size="100")
    set_ns(ws, "t/a", retention_time_minutes=15)  # ages 31, 21, 11, 1 at END+1m
    set_ns(ws, "t/b", retention_size_mb=0)  # everything sealed goes
    ws.policies.set_topic("persistent://t/c/topic-0000", {"retention_time_minutes": 25})
    plan = plan_retention(ws, None, END_MS + MIN)
    got = {w.topic: len(w.ledgers) for w in plan}
    assert got == {"persistent://t/a/topic-0000": 2, "persistent://t/b/topic-0000": 4,
                   "persistent://t/c/topic-0000": 1}
    rows = run(ws, plan)
    assert sorted(r.outcome for r in rows) == ["trimmed"] * 7
    assert plan_retention(ws, None, END_MS + MIN) == []
    for topic, left in (("persistent://t/a/topic-0000", 3), ("persistent://t/b/topic-0000", 1),
                        ("persistent://t/c/topic-0000", 4)):
        assert len(ids(ws, topic)) == left


def test_size_retention_counts_both_tiers(make_ws):
    """Offloaded ledgers whose hot copy is gone still count toward the topic size (Pulsar)."""
    ws = make_ws(ledgers=4, entries=10, entry_size="100")  # 4 x 1000 bytes
    l0, l1, l2, l3, _ = ids(ws)
    offload(ws, T, [l0, l1, l2], END_MS)
    set_ns(ws, deletion_lag_ms=0)
    run(ws, plan_lag_cleanup(ws, ["t/a"], END_MS + 1))
    drain_lag_records(ws, END_MS + 1)
    assert all(li.offloadContext.bookkeeperDeleted for li in ledger_infos(ws)[:3])
    # hot tier holds 1000 bytes; the topic 4000. Retention 1 MiB is far above either
    set_ns(ws, deletion_lag_ms=-1, retention_size_mb=1)
    assert plan_retention(ws, ["t/a"], END_MS + 1) == []
    # the rule itself on this topic's record: a 2000-byte limit removes ledgers 0 and 1 (4000-2000 >= 2000)
    assert select_retention(ledger_infos(ws), None, 2000, END_MS + 1) == [l0, l1]


# -- the deletion-lag/retention timeline (docs/metadata.md) -------------------------------------------------------------------------


def test_timeline_lag_5_min_retention_10_min(make_ws):
    """Lag 5 min, retention 10 min: at +2 min the hot copy is still there, at +7 min it is deleted
    from the hot tier but listed as offloaded, at +12 min the ledger is removed from the topic and its
    offloaded objects are deleted."""
    ws = make_ws(ledgers=1, entries=10, entry_size="100")  # ledger closed at END_MS, newest open
    lid, open_id = ids(ws)
    written = generated([lid], [lid])
    assert read_all(ws) == written
    set_ns(ws, offload_threshold_seconds=0, deletion_lag_ms=5 * MIN, retention_time_minutes=10)
    t0 = END_MS
    res = run(ws, plan_offload(ws, ["t/a"], t0))
    assert [(r.ledger, r.outcome) for r in res] == [(lid, "offloaded")]
    uid = context_uuid(ledger_infos(ws)[0])
    assert objects_of(ws, lid, uid)
    drain = _drain()

    def tick(as_of):
        rows = run(ws, plan_lag_cleanup(ws, ["t/a"], as_of)) + run(ws, plan_retention(ws, ["t/a"], as_of))
        if drain is not None:
            rep = drain(ws, as_of)
            assert rep.still_in_use == rep.dead_lettered == rep.retrying == 0
        return rows

    # +2 min: nothing due; the hot copy is there
    assert tick(t0 + 2 * MIN) == []
    li = ledger_infos(ws)[0]
    assert li.offloadContext.complete and not li.offloadContext.bookkeeperDeleted and hot_exists(ws, lid)

    # +7 min: hot copy deleted, ledger still listed, offloaded and readable
    rows = tick(t0 + 7 * MIN)
    assert [(r.kind, r.outcome) for r in rows] == [("lag-cleanup", "marked")]
    li = ledger_infos(ws)[0]
    assert li.ledgerId == lid and li.offloadContext.bookkeeperDeleted and not hot_exists(ws, lid)
    assert read_all(ws) == written

    # +12 min: removed from the topic; its offloaded objects go through the deletion log
    rows = tick(t0 + 12 * MIN)
    assert [(r.kind, r.ledger, r.outcome) for r in rows] == [(KIND_RETENTION, lid, "trimmed")]
    assert ids(ws) == [open_id]  # the newest ledger stays
    if drain is not None:
        assert objects_of(ws, lid, uid) == []
        assert pending(ws) == []
    else:
        recs = pending(ws)
        assert groups_of(recs) == [(lid, TYPE_OFFLOADED, uid)]  # hot copy already gone: one record
        assert recs[0].created_ms == t0 + 12 * MIN


# -- topic deletion -------------------------------------------------------------------------------


def test_delete_topic_records_both_tiers_then_deletes_metadata(four):
    ws = four
    l0, l1, l2, l3 = ws.fixture["ids"]
    u = ws.fixture["uuids"]
    open_id = ids(ws)[-1]
    ws.policies.set_topic(T, {"retention_time_minutes": 60})
    res = delete_topic(ws, T, END_MS + MIN)
    assert res.deleted and res.policies_deleted and res.ledgers == 5
    assert res.records == {"ledger": 4, "offloaded": 4, "segment": 0}
    assert not ws.ml.exists(T) and ws.ml.get_topic_policies(T) is None
    recs = pending(ws)
    assert groups_of(recs) == sorted([
        (l0, TYPE_OFFLOADED, u[l0]),
        (l1, TYPE_LEDGER, ""), (l1, TYPE_OFFLOADED, u[l1]), (l1, TYPE_OFFLOADED, ws.fixture["abandoned"]),
        (l2, TYPE_LEDGER, ""), (l2, TYPE_OFFLOADED, ws.fixture["incomplete"]),
        (l3, TYPE_LEDGER, ""), (open_id, TYPE_LEDGER, ""),
    ])
    assert {r.reason for r in recs} == {Reason.TOPIC_DELETION}
    drain = _drain()
    if drain is not None:
        rep = drain(ws, END_MS + MIN)
        assert (rep.still_in_use, rep.refused_mismatch, rep.retrying, rep.dead_lettered) == (0, 0, 0, 0)
        assert pending(ws) == []
        assert not any(hot_exists(ws, lid) for lid in (l0, l1, l2, l3, open_id))
        assert objects_of(ws, l0, u[l0]) == [] and objects_of(ws, l1, u[l1]) == []


def test_delete_topic_that_changed_meanwhile_covers_the_change(four):
    ws = four
    l0, l1, l2, l3 = ws.fixture["ids"]
    raced = str(uuidlib.uuid4())
    real_ml = ManagedLedgerStore(ws.metadata)
    fired = []

    def race(path):
        if not fired:
            fired.append(1)
            add_abandoned(real_ml, l3, raced)

    hook(ws, before_delete=race)
    res = delete_topic(ws, T, END_MS)
    assert res.deleted and res.records["offloaded"] == 5
    assert (l3, TYPE_OFFLOADED, raced) in groups_of(pending(ws))


def test_delete_topic_failure_after_append_leaves_topic_and_records(four):
    ws = four

    def fail(path):
        raise MetadataStoreError("injected")

    hook(ws, before_delete=fail)
    with pytest.raises(MetadataStoreError):
        delete_topic(ws, T, END_MS)
    assert ws.ml.exists(T) and len(pending(ws)) == 8


def test_delete_topic_dry_run(four):
    ws = four
    res = delete_topic(ws, T, END_MS, dry_run=True)
    assert res.records == {"ledger": 4, "offloaded": 4, "segment": 0} and not res.deleted
    assert ws.ml.exists(T) and pending(ws) == []


def test_object_groups_of_a_fresh_ledger():
    assert object_groups(L(7)) == [ObjectGroup(7, TYPE_LEDGER)]
    assert INTERVAL_MS == 10 * MIN  # the fixture's ledger spacing the tests above rely on


def test_uuid_recorded_without_driver_metadata_falls_back_to_the_workspace_store(make_ws):
    ws = make_ws(ledgers=2, entries=10, entry_size="100")
    l0 = ids(ws)[0]
    u = uuidlib.uuid4()
    msb, lsb = uuid_to_msb_lsb(u)

    def mutate(info):
        ctx = find_ledger(info, l0).offloadContext
        ctx.uidMsb, ctx.uidLsb = msb, lsb  # no driverMetadata (a foreign or damaged record)

    ws.ml.update_topic(T, mutate)
    set_ns(ws, retention_size_mb=0)
    assert [r.outcome for r in trim_topic(ws, T, END_MS + MIN)] == ["trimmed", "trimmed"]
    (rec,) = [r for r in pending(ws) if r.type == TYPE_OFFLOADED]
    assert rec.uuid == str(u) and rec.ledger_id == l0
    assert rec.driver["name"] == ws.offloader.store.driver
    assert rec.driver["properties"]["root"] == ws.offloader.store.driver_properties()["root"]
