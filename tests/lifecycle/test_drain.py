"""Phase 2 of two-phase deletion (docs/deletion.md) on real stores: SQLite metadata, the local hot tier, the
filesystem object store (and S3 via moto). Workspaces are built with `tiered init` / `tiered generate`."""

from __future__ import annotations

import argparse
import threading
import uuid as uuidlib

import pytest

from tests.support.workspaces import END_MS, offload_one, sealed
from tieredcore.cli.common import Progress
from tieredcore.cli.data import cmd_verify
from tieredcore.cold.blob import iter_objects
from tieredcore.errors import BlobStoreError
from tieredcore.formats.keys import data_key, index_key
from tieredcore.formats.uuids import uuid_to_msb_lsb
from tieredcore.lifecycle.drain import (
    OUTCOMES,
    DrainReport,
    drain,
    driver_dict,
    driver_metadata_from_dict,
    failed_keys,
)
from tieredcore.meta.deletion_log import (
    PENDING,
    STATE_RETRYING,
    DeletionLog,
    DeletionRecord,
)
from tieredcore.meta.managed_ledgers import find_ledger
from tieredcore.offload.managed import TopicOffloader, context_uuid
from tieredcore.offload.offloader import LedgerOffloader
from tieredcore.policy import HOT_FIRST, TIERED_FIRST
from tieredcore.workspace import Workspace

T0 = "persistent://t/a/topic-0000"
T1 = "persistent://t/a/topic-0001"
ML0 = "t/a/persistent/topic-0000"
ML1 = "t/a/persistent/topic-0001"
NOW = END_MS + 3_600_000


# -- helpers --------------------------------------------------------------------------------------


def ledger_info(ws, topic, lid):
    info, _ = ws.ml.get_topic(topic)
    return find_ledger(info, lid)


def set_bookkeeper_deleted(ws, topic, lid) -> None:
    def mutate(info):
        li = find_ledger(info, lid)
        assert li.offloadContext.complete
        li.offloadContext.bookkeeperDeleted = True

    ws.ml.update_topic(topic, mutate)


def current_driver(ws, topic, lid) -> dict:
    return driver_dict(ledger_info(ws, topic, lid).offloadContext.driverMetadata)


def store_driver(ws, offloader: LedgerOffloader | None = None) -> dict:
    return driver_dict(TopicOffloader(ws.ml, ws.hot, offloader or ws.offloader)._driver_metadata())


def abandoned_attempt(ws, topic, lid, offloader: LedgerOffloader | None = None) -> str:
    """Objects of an earlier attempt of the offload protocol that another attempt replaced: a complete
    data + index pair, plus an upload of the same data key that never finished."""
    off = offloader or ws.offloader
    u = str(uuidlib.uuid4())
    with ws.hot.open_ledger(lid) as h:
        off.offload(h, u, {"managedledgername": topic})
    up = off.store.initiate_multipart(data_key(off.prefix, u, lid), {"managedledgername": topic})
    off.store.upload_part(data_key(off.prefix, u, lid), up, 1, b"x" * 2048)
    return u


def hot_rec(topic, lid, **kw) -> DeletionRecord:
    kw.setdefault("reason", "deletion-lag")
    return DeletionRecord(topic=topic, ledger_id=lid, type="ledger", created_ms=NOW - 1000, **kw)


def off_rec(topic, lid, uuid, driver, **kw) -> DeletionRecord:
    kw.setdefault("reason", "offload-cleanup")
    return DeletionRecord(topic=topic, ledger_id=lid, type="offloaded", uuid=uuid, driver=driver,
                          created_ms=NOW - 1000, **kw)


def keys_of(off: LedgerOffloader, uuid, lid) -> set[str]:
    return {data_key(off.prefix, uuid, lid), index_key(off.prefix, uuid, lid)}


def objects(store) -> set[str]:
    return {o.key for o in iter_objects(store)}


def uploads(store) -> set[str]:
    return {u.key for u in store.list_multipart_uploads()}


def verify(ws, topics=2) -> None:
    """Every retained entry reads back identical (the generator's digest), from either tier first."""
    for prio in (TIERED_FIRST, HOT_FIRST):
        res = cmd_verify(argparse.Namespace(namespace=None, topic=[], read_priority=prio), ws, Progress(False))
        assert (res["verified"], res["failed"]) == (topics, 0), res["topics"]


def outcomes(report: DrainReport) -> dict[str, int]:
    return {k: v for k, v in report.counts().items() if v}


def counters(ws, *names) -> tuple[int, ...]:
    c = DeletionLog(ws.metadata).counters()
    return tuple(c[n] for n in names)


@pytest.fixture
def ws(make_ws) -> Workspace:
    return make_ws(["t/a"], topics=2, ledgers=4, entries=10)


class FlakyStore:
    """Delegates to a real store; delete() raises BlobStoreError on its first `failures` calls
    (failures=None: always) without deleting anything. Counts delete calls and their keys."""

    def __init__(self, inner, failures: int | None) -> None:
        self.inner = inner
        self.failures = failures
        self.delete_calls: list[list[str]] = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def delete(self, keys):
        self.delete_calls.append(list(keys))
        if self.failures is None or len(self.delete_calls) <= self.failures:
            raise BlobStoreError(f"injected failure #{len(self.delete_calls)}: service unavailable")
        self.inner.delete(keys)


class PartlyFailingStore:
    """Deletes every key but those containing `poison`, then reports those in the stores' format."""

    def __init__(self, inner, poison: str) -> None:
        self.inner = inner
        self.poison = poison

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def delete(self, keys):
        bad = [k for k in keys if self.poison in k]
        self.inner.delete([k for k in keys if k not in bad])
        if bad:
            raise BlobStoreError(f"injected: could not delete {len(bad)} key(s): "
                                 + ", ".join(f"{k!r} (AccessDenied: no)" for k in bad))


def wrap_store(ws, driver: dict, wrapper):
    """Make the drain see `wrapper(real store)` for the records of `driver` (the workspace caches one
    offloader per store URL; the drain resolves the records' driver metadata through it)."""
    off = ws.offloader_for_driver(driver_metadata_from_dict(driver))
    off.store = wrapper(off.store)
    return off.store


class FailingHot:
    def __init__(self, inner) -> None:
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def delete_ledger(self, ledger_id):
        raise OSError(5, "Input/output error")


# -- driver metadata conversion ---------------------------------------------------------------------


def test_driver_metadata_round_trip():
    d = {"name": "aws-s3", "properties": {"bucket": "b", "region": "r", "prefix": "p/"}}
    dm = driver_metadata_from_dict(d)
    assert dm.name == "aws-s3" and [(kv.key, kv.value) for kv in dm.properties] == [
        ("bucket", "b"), ("prefix", "p/"), ("region", "r")]
    assert driver_dict(dm) == d
    listed = {"name": "filesystem", "properties": [{"key": "root", "value": "/x"}]}
    assert driver_dict(driver_metadata_from_dict(listed)) == {"name": "filesystem", "properties": {"root": "/x"}}


def test_failed_keys_parsing():
    keys = ["p/u-ledger-5", "p/u-ledger-5-index", "p/v-ledger-6"]
    e = BlobStoreError("fs: could not delete 1 key(s): 'p/u-ledger-5' (EACCES)")
    assert failed_keys(e, keys) == {"p/u-ledger-5"}  # not its index, whose name extends it
    assert failed_keys(BlobStoreError("connection reset"), keys) == set(keys)
    truncated = BlobStoreError("could not delete 21 key(s): 'p/u-ledger-5' (x), ... ...")
    assert failed_keys(truncated, keys) == set(keys)
    # an error that carries its failed keys is taken at its word, whatever its message says
    exact = BlobStoreError("could not delete 21 key(s): ... ...", failed_keys=["p/v-ledger-6", "other/key"])
    assert failed_keys(exact, keys) == {"p/v-ledger-6"}
    assert failed_keys(BlobStoreError("x", failed_keys=["other/key"]), keys) == set(keys)  # none of ours: all


# -- (1) deletion-lag: hot copy of an offloaded ledger ----------------------------------------------


def test_hot_copy_deleted_after_lag(ws):
    lid = sealed(ws, T0)[0]
    offload_one(ws, T0, lid)
    rec = hot_rec(ML0, lid)
    DeletionLog(ws.metadata).append([rec])  # phase 1: record first ...
    set_bookkeeper_deleted(ws, T0, lid)  # ... then the metadata change
    r = drain(ws, NOW)
    assert outcomes(r) == {"deleted": 1}
    assert (r.acknowledged, r.deleted_hot, r.entries) == (1, 1, 1)
    assert [(row.id, row.ledger, row.type, row.outcome) for row in r.rows] == [(rec.id, lid, "ledger", "deleted")]
    assert not ws.hot.exists(lid)
    assert DeletionLog(ws.metadata).pending() == []
    assert counters(ws, "appended_hot", "deleted_hot", "acknowledged", "consumed") == (1, 1, 1, 1)
    verify(ws)


# -- (2) record appended, metadata change never happened --------------------------------------------


def test_metadata_change_never_happened_is_still_in_use(ws):
    a, b = sealed(ws, T0)[:2]
    offload_one(ws, T0, a)  # offloaded, but bookkeeperDeleted never set
    open_ledger = ws.ml.get_topic(T0)[0].ledgerInfo[-1].ledgerId
    recs = [hot_rec(ML0, a), hot_rec(ML0, b, reason="retention"), hot_rec(ML0, open_ledger, reason="retention")]
    DeletionLog(ws.metadata).append(recs)
    r = drain(ws, NOW)
    assert outcomes(r) == {"still_in_use": 3} and r.acknowledged == 3
    assert all(ws.hot.exists(x) for x in (a, b, open_ledger))
    assert DeletionLog(ws.metadata).pending() == []
    assert counters(ws, "still_in_use", "acknowledged", "deleted_hot") == (3, 3, 0)
    verify(ws)


# -- (3) forged records -----------------------------------------------------------------------------


def test_forged_records_delete_nothing(ws):
    lid = sealed(ws, T0)[0]
    good_uuid = offload_one(ws, T0, lid)
    set_bookkeeper_deleted(ws, T0, lid)  # the hot copy is deletable -- but only by a record naming T0
    other = sealed(ws, T1)[0]
    driver = current_driver(ws, T0, lid)
    forged = [
        hot_rec(ML1, lid),  # T1 does not list the ledger: passes the in-use check; custom metadata says T0
        hot_rec("t/a/persistent/ghost", lid),  # no such topic
        hot_rec(ML0, lid, component="cursor", cursor="sub"),  # not a cursor ledger
        hot_rec(ML0, lid, component="schema", schema_id="t/a/topic-0000"),  # not a schema ledger
        hot_rec("t/b/persistent/x", other),  # T1's ledger claimed by a topic that does not exist
        # T0's current objects claimed by another topic that does not list the ledger
        off_rec(ML1, lid, good_uuid, driver),
    ]
    before = objects(ws.offloader.store)
    DeletionLog(ws.metadata).append(forged)
    r = drain(ws, NOW)
    # the cursor / schema records name an existing topic whose cursor/schema use cannot be checked here
    assert outcomes(r) == {"refused_mismatch": 4, "dead_lettered": 2}
    assert {row.id for row in r.rows if row.outcome == "dead_lettered"} == {forged[2].id, forged[3].id}
    assert all("custom metadata mismatch" in row.error or "belongs to" in row.error
               for row in r.rows if row.outcome == "refused_mismatch")
    assert ws.hot.exists(lid) and ws.hot.exists(other)
    assert objects(ws.offloader.store) == before
    assert DeletionLog(ws.metadata).pending() == []
    assert counters(ws, "refused_mismatch", "acknowledged", "deleted_hot", "deleted_offloaded") == (4, 4, 0, 0)
    verify(ws)


def test_cursor_record_of_deleted_topic_is_checked_against_custom_metadata(ws):
    # a cursor ledger of a topic that no longer exists: matching custom metadata → deleted
    led = ws.hot.create_ledger({"application": b"pulsar", "component": b"managed-ledger",
                                "pulsar/managed-ledger": b"t/a/persistent/gone", "pulsar/cursor": b"sub"})
    led.append(b"cursor state")
    led.close()
    ok = hot_rec("t/a/persistent/gone", led.ledger_id, component="cursor", cursor="sub", reason="topic-deletion")
    wrong = hot_rec("t/a/persistent/gone", led.ledger_id, component="cursor", cursor="other")
    DeletionLog(ws.metadata).append([wrong])
    assert outcomes(drain(ws, NOW)) == {"refused_mismatch": 1}
    assert ws.hot.exists(led.ledger_id)
    DeletionLog(ws.metadata).append([ok])
    assert outcomes(drain(ws, NOW)) == {"deleted": 1}
    assert not ws.hot.exists(led.ledger_id)


# -- (4) malformed ----------------------------------------------------------------------------------


def test_malformed_records_go_straight_to_dead_letter(ws):
    hot_before = ws.hot.list_ledgers()
    objs_before = objects(ws.offloader.store)
    ws.metadata.create(f"{PENDING}/garbage", b"\x00\x01 not json")
    bad_topic = hot_rec(ML0, sealed(ws, T0)[0])
    bad_topic.topic = "t/a/non-persistent/x"  # four components (passes the format check), not a topic
    ws.metadata.create(f"{PENDING}/{bad_topic.id}", bad_topic.to_json())
    r = drain(ws, NOW)
    assert outcomes(r) == {"malformed": 2}
    dead = {e.id: e for e in DeletionLog(ws.metadata).dead_letters()}
    assert set(dead) == {"garbage", bad_topic.id}
    assert "non-persistent" in dead[bad_topic.id].record.dead_reason
    assert DeletionLog(ws.metadata).pending() == []
    assert counters(ws, "malformed", "dead_lettered", "acknowledged") == (2, 2, 0)
    assert ws.hot.list_ledgers() == hot_before and objects(ws.offloader.store) == objs_before
    verify(ws)


# -- (5) abandoned offload attempt ------------------------------------------------------------------


def test_abandoned_attempt_objects_and_upload_removed_current_untouched(ws):
    a, b = sealed(ws, T0)[:2]
    off = ws.offloader
    old = abandoned_attempt(ws, ML0, a)
    current = offload_one(ws, T0, a)
    in_flight_other = off.store.initiate_multipart(data_key(off.prefix, str(uuidlib.uuid4()), b))
    assert keys_of(off, old, a) <= objects(off.store)
    assert data_key(off.prefix, old, a) in uploads(off.store)
    driver = current_driver(ws, T0, a)
    rec_old, rec_current = off_rec(ML0, a, old, driver), off_rec(ML0, a, current, driver)
    DeletionLog(ws.metadata).append([rec_old, rec_current])

    r = drain(ws, NOW)
    assert outcomes(r) == {"deleted": 1, "still_in_use": 1}
    assert {row.id: row.outcome for row in r.rows} == {rec_old.id: "deleted", rec_current.id: "still_in_use"}
    assert r.deleted_offloaded == 1
    assert not keys_of(off, old, a) & objects(off.store)
    assert data_key(off.prefix, old, a) not in uploads(off.store)
    assert keys_of(off, current, a) <= objects(off.store)
    # another ledger's upload in flight is none of this record's business
    assert in_flight_other in {u.upload_id for u in off.store.list_multipart_uploads()}
    assert context_uuid(ledger_info(ws, T0, a)) == current
    assert counters(ws, "deleted_offloaded", "still_in_use", "acknowledged") == (1, 1, 2)
    verify(ws)


def test_in_flight_attempt_is_still_in_use(ws):
    lid = sealed(ws, T0)[0]
    u = str(uuidlib.uuid4())
    driver = store_driver(ws)

    def begin(info):  # step 1 of the offload protocol; its objects are being written
        li = find_ledger(info, lid)
        li.offloadContext.uidMsb, li.offloadContext.uidLsb = uuid_to_msb_lsb(uuidlib.UUID(u))
        li.offloadContext.complete = False

    ws.ml.update_topic(T0, begin)
    up = ws.offloader.store.initiate_multipart(data_key(ws.offloader.prefix, u, lid))
    DeletionLog(ws.metadata).append([off_rec(ML0, lid, u, driver, reason="orphan")])
    assert outcomes(drain(ws, NOW)) == {"still_in_use": 1}
    assert up in {x.upload_id for x in ws.offloader.store.list_multipart_uploads()}


# -- (6) a store that fails N times, then recovers --------------------------------------------------


def test_store_failing_then_recovering_retries_with_backoff(ws):
    a = sealed(ws, T0)[0]
    old = abandoned_attempt(ws, ML0, a)
    offload_one(ws, T0, a)
    driver = current_driver(ws, T0, a)
    rec = off_rec(ML0, a, old, driver)
    DeletionLog(ws.metadata).append([rec])
    flaky = wrap_store(ws, driver, lambda s: FlakyStore(s, failures=2))
    dlog = DeletionLog(ws.metadata)

    now = NOW
    r = drain(ws, now, delay_ms=1_000, max_attempts=5)
    assert outcomes(r) == {"retrying": 1} and "injected failure #1" in r.rows[0].error
    (e,) = dlog.pending()
    assert (e.record.state, e.record.attempts, e.record.next_attempt_ms) == (STATE_RETRYING, 1, now + 1_000)
    assert outcomes(drain(ws, now + 999, delay_ms=1_000, max_attempts=5)) == {}  # not due yet

    now += 1_000
    assert outcomes(drain(ws, now, delay_ms=1_000, max_attempts=5)) == {"retrying": 1}
    (e,) = dlog.pending()
    assert (e.record.attempts, e.record.next_attempt_ms) == (2, now + 2_000)  # backoff doubled
    assert keys_of(ws.offloader, old, a) <= objects(ws.offloader.store)

    now += 2_000
    r = drain(ws, now, delay_ms=1_000, max_attempts=5)
    assert outcomes(r) == {"deleted": 1} and r.deleted_offloaded == 1
    assert len(flaky.delete_calls) == 3
    assert not keys_of(ws.offloader, old, a) & objects(ws.offloader.store)
    assert dlog.pending() == [] and dlog.dead_letters() == []
    assert counters(ws, "delete_failures_offloaded", "deleted_offloaded", "acknowledged", "consumed") == (2, 1, 1, 3)
    verify(ws)


def test_batch_error_naming_some_keys_fails_only_their_records(ws):
    a, b = sealed(ws, T0)[:2]
    old_a, old_b = abandoned_attempt(ws, ML0, a), abandoned_attempt(ws, ML0, b)
    driver = store_driver(ws)
    rec_a, rec_b = off_rec(ML0, a, old_a, driver), off_rec(ML0, b, old_b, driver)
    DeletionLog(ws.metadata).append([rec_a, rec_b])
    wrap_store(ws, driver, lambda s: PartlyFailingStore(s, poison=old_b))
    r = drain(ws, NOW, delay_ms=1_000)
    assert {row.id: row.outcome for row in r.rows} == {rec_a.id: "deleted", rec_b.id: "retrying"}
    assert not keys_of(ws.offloader, old_a, a) & objects(ws.offloader.store)
    assert keys_of(ws.offloader, old_b, b) <= objects(ws.offloader.store)
    (e,) = DeletionLog(ws.metadata).pending()
    assert e.id == rec_b.id and old_b in e.record.last_error


# -- (7) a store that always fails ------------------------------------------------------------------


def test_always_failing_stores_dead_letter_after_max_attempts(ws):
    a, b = sealed(ws, T0)[:2]
    offload_one(ws, T0, b)
    set_bookkeeper_deleted(ws, T0, b)
    old = abandoned_attempt(ws, ML0, a)
    driver = store_driver(ws)
    rec_off, rec_hot = off_rec(ML0, a, old, driver), hot_rec(ML0, b)
    DeletionLog(ws.metadata).append([rec_off, rec_hot])
    wrap_store(ws, driver, lambda s: FlakyStore(s, failures=None))
    ws.__dict__["hot"] = FailingHot(ws.hot)
    dlog = DeletionLog(ws.metadata)
    now, max_attempts = NOW, 4
    for attempt in range(1, max_attempts):
        r = drain(ws, now, delay_ms=500, max_attempts=max_attempts)
        assert outcomes(r) == {"retrying": 2}, attempt
        assert {e.record.attempts for e in dlog.pending()} == {attempt}
        now = max(e.record.next_attempt_ms for e in dlog.pending())
    r = drain(ws, now, delay_ms=500, max_attempts=max_attempts)
    assert outcomes(r) == {"dead_lettered": 2}
    assert dlog.pending() == []
    dead = {e.id: e.record for e in dlog.dead_letters()}
    assert set(dead) == {rec_off.id, rec_hot.id}
    assert dead[rec_off.id].dead_reason.startswith(f"gave up after {max_attempts} attempts")
    assert "Input/output error" in dead[rec_hot.id].dead_reason
    assert counters(ws, "delete_failures_hot", "delete_failures_offloaded", "dead_lettered", "acknowledged") == (
        max_attempts, max_attempts, 2, 0)
    assert ws.hot.exists(b) and keys_of(ws.offloader, old, a) <= objects(ws.offloader.store)
    # the operator fixes the store and requeues: the next drain deletes
    ws.__dict__["hot"] = ws.hot.inner
    wrap_store(ws, driver, lambda s: s.inner)
    assert sorted(dlog.requeue([rec_off.id, rec_hot.id], as_of_ms=now)) == sorted([rec_off.id, rec_hot.id])
    assert outcomes(drain(ws, now)) == {"deleted": 2}
    assert not ws.hot.exists(b)
    verify(ws)


# -- (8) second processing after a crash before the acknowledgement ---------------------------------


def test_already_deleted_storage_is_success(ws):
    a, b = sealed(ws, T0)[:2]
    offload_one(ws, T0, a)
    set_bookkeeper_deleted(ws, T0, a)
    old = abandoned_attempt(ws, ML0, b)
    driver = store_driver(ws)
    recs = [hot_rec(ML0, a), off_rec(ML0, b, old, driver)]
    DeletionLog(ws.metadata).append(recs)
    # the first drain deleted both, then died before acknowledging
    ws.hot.delete_ledger(a)
    ws.offloader.delete_offloaded(b, old)
    r = drain(ws, NOW)
    assert outcomes(r) == {"already_deleted": 2} and r.acknowledged == 2
    assert (r.deleted_hot, r.deleted_offloaded) == (0, 0)
    assert DeletionLog(ws.metadata).pending() == []
    verify(ws)


def test_processing_the_same_entries_twice_acknowledges_once(ws):
    lid = sealed(ws, T0)[0]
    offload_one(ws, T0, lid)
    set_bookkeeper_deleted(ws, T0, lid)
    DeletionLog(ws.metadata).append([hot_rec(ML0, lid)])
    entries = DeletionLog(ws.metadata).due(NOW)
    first = drain(ws, NOW, entries=entries)
    second = drain(ws, NOW, entries=entries)  # crash-and-redeliver: deletes again (no-op), ack refused
    assert outcomes(first) == {"deleted": 1}
    assert outcomes(second) == {"lost_race": 1}
    assert counters(ws, "acknowledged", "deleted_hot") == (1, 1)


# -- (9) two drains at once -------------------------------------------------------------------------


def test_concurrent_drains_acknowledge_every_record_once(make_ws):
    ws = make_ws(["t/a"], topics=3, ledgers=4, entries=5)
    recs = []
    for t in ws.ml.list_topics("t/a"):
        for lid in sealed(ws, t)[:3]:
            old = abandoned_attempt(ws, t.managed_ledger_name, lid)
            offload_one(ws, t, lid)
            set_bookkeeper_deleted(ws, t, lid)
            recs += [hot_rec(t.managed_ledger_name, lid),
                     off_rec(t.managed_ledger_name, lid, old, current_driver(ws, t, lid))]
    DeletionLog(ws.metadata).append(recs)
    workspaces = [Workspace(ws.config) for _ in range(2)]
    reports: list[DrainReport] = [None, None]  # type: ignore[list-item]
    barrier = threading.Barrier(2)

    def run(i):
        barrier.wait()
        reports[i] = drain(workspaces[i], NOW)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for w in workspaces:
        w.close()
    total = reports[0].merge(reports[1])
    assert total.acknowledged == len(recs) == 18
    assert total.deleted_hot + total.already_deleted + total.deleted_offloaded == len(recs)
    assert set(outcomes(total)) <= {"deleted", "already_deleted", "lost_race"}
    acked_ids = [row.id for rep in reports for row in rep.rows if row.outcome != "lost_race"]
    assert sorted(acked_ids) == sorted(r.id for r in recs)  # each exactly once
    assert counters(ws, "acknowledged", "consumed") == (len(recs), len(recs))
    dlog = DeletionLog(ws.metadata)
    assert dlog.pending() == [] and dlog.dead_letters() == []
    for r in recs:
        if r.type == "ledger":
            assert not ws.hot.exists(r.ledger_id)
        else:
            assert not keys_of(ws.offloader, r.uuid, r.ledger_id) & objects(ws.offloader.store)
    assert not uploads(ws.offloader.store)
    verify(ws, topics=3)


# -- (10) S3: one batch delete for several records --------------------------------------------------


def test_s3_batch_delete_of_several_records(ws, s3_store, moto_endpoint):
    s3_off = LedgerOffloader(s3_store, "cold/", cluster=ws.config.cluster)
    a, b, c = sealed(ws, T0)[:3]
    recs, olds = [], {}
    for lid in (a, b, c):
        olds[lid] = abandoned_attempt(ws, ML0, lid, offloader=s3_off)
        offload_one(ws, T0, lid, offloader=s3_off)
    driver = current_driver(ws, T0, a)
    assert driver["name"] == "aws-s3" and driver["properties"]["serviceEndpoint"] == moto_endpoint
    for lid in (a, b, c):
        recs.append(off_rec(ML0, lid, olds[lid], driver))
    DeletionLog(ws.metadata).append(recs)
    counting = wrap_store(ws, driver, lambda s: FlakyStore(s, failures=0))
    r = drain(ws, NOW)
    assert outcomes(r) == {"deleted": 3} and r.deleted_offloaded == 3
    # one DeleteObjects call: data, index and entry-offsets sidecar of each record, and the manifests a
    # transformed group has
    assert len(counting.delete_calls) == 1 and len(counting.delete_calls[0]) == 3 * 6
    left = objects(s3_store)
    for lid in (a, b, c):
        assert not keys_of(s3_off, olds[lid], lid) & left
        assert keys_of(s3_off, context_uuid(ledger_info(ws, T0, lid)), lid) <= left
    assert not uploads(s3_store)
    verify(ws)


# -- (11) dry run -----------------------------------------------------------------------------------


def test_dry_run_changes_nothing(ws):
    a, b, c = sealed(ws, T0)[:3]
    offload_one(ws, T0, a)
    set_bookkeeper_deleted(ws, T0, a)
    old = abandoned_attempt(ws, ML0, b)
    driver = store_driver(ws)
    recs = [hot_rec(ML0, a), off_rec(ML0, b, old, driver), hot_rec(ML0, c), hot_rec(ML1, a)]
    dlog = DeletionLog(ws.metadata)
    dlog.append(recs)
    ws.metadata.create(f"{PENDING}/garbage", b"{")
    before = ({e.id: e.version for e in dlog.pending()}, dlog.counters(), ws.hot.list_ledgers(),
              objects(ws.offloader.store), uploads(ws.offloader.store))
    r = drain(ws, NOW, dry_run=True)
    assert r.dry_run
    assert outcomes(r) == {"would_delete": 2, "still_in_use": 1, "refused_mismatch": 1, "malformed": 1}
    assert {row.id: row.outcome for row in r.rows} == {
        recs[0].id: "would_delete", recs[1].id: "would_delete", recs[2].id: "still_in_use",
        recs[3].id: "refused_mismatch", "garbage": "malformed"}
    assert r.acknowledged == 0 and r.deleted_hot == 0
    after = ({e.id: e.version for e in dlog.pending()}, dlog.counters(), ws.hot.list_ledgers(),
             objects(ws.offloader.store), uploads(ws.offloader.store))
    assert after == before
    assert dlog.dead_letters() == []
    verify(ws)


def test_limit_and_report_shape(ws):
    a, b = sealed(ws, T0)[:2]
    DeletionLog(ws.metadata).append([hot_rec(ML0, a), hot_rec(ML0, b)])
    r = drain(ws, NOW, limit=1)
    assert r.entries == 1 and len(DeletionLog(ws.metadata).pending()) == 1
    d = r.as_dict()
    assert set(OUTCOMES) <= set(d) and d["rows"][0]["outcome"] == "still_in_use"


def test_segment_record_deleted_only_once_no_ledger_references_it(ws):
    a, b = sealed(ws, T0)[:2]
    store, prefix = ws.offloader.store, ws.offloader.prefix
    seg = str(uuidlib.uuid4())
    for k in (f"{prefix}{seg}", f"{prefix}{seg}-index"):
        store.put(k, b"segment bytes", {"managedledgername": ML0, "pulsarclustername": ws.config.cluster})
    msb, lsb = uuid_to_msb_lsb(uuidlib.UUID(seg))

    def reference(info):  # ledger b is still covered by the segment
        find_ledger(info, b).offloadContext.offloadSegment.add(uidMsb=msb, uidLsb=lsb, complete=True)

    ws.ml.update_topic(T0, reference)
    driver = store_driver(ws)
    rec = DeletionRecord(topic=ML0, ledger_id=a, type="segment", uuid=seg, driver=driver, reason="retention",
                         created_ms=NOW)
    DeletionLog(ws.metadata).append([rec])
    assert outcomes(drain(ws, NOW)) == {"still_in_use": 1}

    def unreference(info):
        del find_ledger(info, b).offloadContext.offloadSegment[:]

    ws.ml.update_topic(T0, unreference)
    DeletionLog(ws.metadata).append([DeletionRecord(**{**rec.__dict__, "id": uuidlib.uuid4().hex})])
    assert outcomes(drain(ws, NOW)) == {"deleted": 1}
    assert not {f"{prefix}{seg}", f"{prefix}{seg}-index"} & objects(store)
    verify(ws)


# -- objects of another cluster or workspace in a shared store -------------------------------------


@pytest.mark.parametrize("writer", ["other-cluster", "other-workspace", "no-cluster"])
def test_records_naming_objects_written_by_others_are_refused(ws, writer):
    """A shared bucket: whatever a record says, the drain deletes nothing another cluster (or another
    workspace with the same cluster name) wrote, counts it, and acknowledges the record."""
    a = sealed(ws, T0)[0]
    cluster = {"other-cluster": "east"}.get(writer, ws.config.cluster)
    owner = {"other-workspace": "f" * 32}.get(writer, "")
    other = LedgerOffloader(ws.offloader.store, ws.offloader.prefix, cluster=cluster, owner=owner)
    u = str(uuidlib.uuid4())
    obj = other.offload(ws.hot.open_ledger(a), u, {"managedledgername": ML0})
    if writer == "no-cluster":
        for k in (obj.data_key, obj.index_key):
            md = {k2: v for k2, v in other.store.head(k).metadata.items() if k2 != "pulsarclustername"}
            other.store.put(k, other.store.get(k), md)
    DeletionLog(ws.metadata).append([off_rec(ML0, a, u, store_driver(ws))])
    before = DeletionLog(ws.metadata).counters()["refused_foreign"]
    r = drain(ws, NOW)
    assert outcomes(r) == {"refused_foreign": 1} and r.refused_foreign == 1 and r.deleted_offloaded == 0
    assert "is not ours" in r.rows[0].error
    assert {obj.data_key, obj.index_key} <= objects(ws.offloader.store)
    assert DeletionLog(ws.metadata).counters()["refused_foreign"] == before + 1
    assert DeletionLog(ws.metadata).pending() == []
