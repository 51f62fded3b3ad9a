"""The crash-safe offload protocol of docs/metadata.md under injected failures and races.

Every failure case checks four things: the result's outcome, what is left in the object store
(objects *and* unfinished multipart uploads), the topic record (ledger still listed, OffloadContext
not complete) and the deletion log: a replaced attempt (``offload-cleanup``) and a conflicted one
(``offload-conflict``) become ``offloaded`` pending-deletion records, appended before the metadata
change, never direct deletes; after a drain (phase 2, docs/deletion.md) their objects are gone.
"""

from __future__ import annotations

import threading
import uuid as uuidlib

import pytest

from tests.support import offload_harness as H
from tieredcore.errors import BlobStoreError, MetadataStoreError, OffloadedLedgerNotFoundError
from tieredcore.formats.keys import data_key, index_key
from tieredcore.formats.uuids import uuid_to_msb_lsb
from tieredcore.meta.managed_ledgers import find_ledger
from tieredcore.meta.reasons import Reason
from tieredcore.offload.managed import ABANDONED_PREFIX, context_uuid
from tieredcore.offload.offloader import LedgerOffloader
from tieredcore.outcomes import Outcome

TOPIC = H.TOPIC


@pytest.fixture
def env(tmp_path):
    e = H.build_env(tmp_path)
    yield e
    e.hot.close()
    e.meta.inner.close()


# --- assertions ------------------------------------------------------------------------------


def assert_nothing_left(env) -> None:
    assert H.leftovers(env.raw_store) == ([], [])


def assert_only(env, *offloads: tuple[int, str]) -> None:
    """The store holds exactly the data + index objects of these (ledger, uuid) and no upload."""
    want = sorted(k for lid, u in offloads for k in H.offloaded_keys(u, lid))
    assert H.leftovers(env.raw_store) == (want, [])


def assert_incomplete_attempt(env, ledger_id: int, uuid: str | None) -> None:
    li = env.ledger(ledger_id)
    assert li is not None, f"ledger {ledger_id} must still be listed"
    assert context_uuid(li) == uuid
    assert not li.offloadContext.complete
    assert not li.offloadContext.HasField("timestamp")


def assert_complete(env, ledger_id: int, uuid: str) -> None:
    li = env.ledger(ledger_id)
    assert li is not None
    assert context_uuid(li) == uuid
    assert li.offloadContext.complete
    assert li.offloadContext.timestamp == env.clock()
    assert li.offloadContext.driverMetadata.name == "tiered-local"


def cleanup(ledger_id: int, *uuids: str) -> list[tuple[str, int, str]]:
    return [(Reason.OFFLOAD_CLEANUP, ledger_id, u) for u in uuids]


def conflict(ledger_id: int, uuid: str) -> tuple[str, int, str]:
    return (Reason.OFFLOAD_CONFLICT, ledger_id, uuid)


def drain_all(env, as_of_ms: int | None = None) -> dict:
    """Drain every due record; the log must then be empty (nothing retrying, nothing dead-lettered)."""
    rep = H.drain(env, as_of_ms)
    assert rep.retrying == rep.dead_lettered == rep.malformed == rep.lost_race == 0, rep.rows
    assert H.records(env) == [] and H.deletion_log(env).dead_letters() == []
    return rep.counts()


def assert_readable(env, ledger_id: int, uuid: str) -> None:
    assert H.read_all(env.offloader, ledger_id, uuid) == env.payloads[ledger_id]


def assert_others_untouched(env, ledger_id: int) -> None:
    """Every other ledger still listed, sealed as written, with no offload context."""
    info = env.info()
    assert [li.ledgerId for li in info.ledgerInfo][:-1] == env.ledgers
    for lid in env.ledgers:
        li = find_ledger(info, lid)
        assert li.entries == 20 and li.size == 2000 and li.timestamp > 0
        if lid != ledger_id:
            assert not li.HasField("offloadContext")
            assert list(li.properties) == []


def set_context(uuid: str, ledger_id: int, complete: bool = False):
    msb, lsb = uuid_to_msb_lsb(uuidlib.UUID(uuid))

    def mutate(info):
        li = find_ledger(info, ledger_id)
        li.offloadContext.uidMsb, li.offloadContext.uidLsb = msb, lsb
        li.offloadContext.complete = complete

    return mutate


def remove_ledger(ledger_id: int):
    def mutate(info):
        keep = [li for li in info.ledgerInfo if li.ledgerId != ledger_id]
        del info.ledgerInfo[:]
        info.ledgerInfo.extend(keep)

    return mutate


def watch_abandoned(env, ledger_id: int, seen: dict):
    """A progress callback that records, at the first uploaded part, the ledger's abandoned attempts
    (legacy properties), the pending-deletion records, its context uuid and what is left in the store
    at that moment."""

    def progress(topic, lid, done, total):
        assert topic == H.TOPIC.replace("default/", "default/persistent/")
        assert lid == ledger_id and 0 < done <= total
        if "abandoned" not in seen:
            li = env.ledger(ledger_id)
            seen["abandoned"] = H.abandoned(li)
            seen["records"] = H.records(env)
            seen["context"] = context_uuid(li)
            seen["uuids_in_store"] = H.uuids_in_store(env.raw_store)

    return progress


# --- 1. failures while writing the objects ------------------------------------------------------

WRITE_FAILURES = [
    ("initiate_multipart", 1),
    ("upload_part", 1),
    ("upload_part", 2),
    ("upload_part", 5),  # the last part
    ("complete_multipart", 1),
    ("put_index", 1),
]


@pytest.mark.parametrize("op, nth", WRITE_FAILURES)
def test_write_failure_leaves_nothing_and_a_retry_succeeds(env, op, nth):
    lid = env.ledgers[0]
    env.store.faults.on(op, nth, H.raiser(BlobStoreError(f"injected failure at {op} #{nth}")))

    res = env.topic_offloader(tag=1).offload_ledger(TOPIC, lid)

    assert (op, nth) in env.store.faults.fired
    assert res.outcome == Outcome.FAILED and not res.ok
    assert f"injected failure at {op}" in res.error
    assert res.uuid is not None
    assert_nothing_left(env)
    # the attempt was recorded before anything was written (step 1) and never completed
    assert_incomplete_attempt(env, lid, res.uuid)
    assert H.abandoned(env.ledger(lid)) == []
    assert_others_untouched(env, lid)
    if op == "upload_part":
        assert env.store.faults.calls["upload_part"] == nth  # stopped at the failing part
        assert env.store.faults.calls["abort_multipart"] == 1

    assert H.records(env) == []

    # the retry appends a record for the failed attempt (before replacing it) and completes
    seen: dict = {}
    retry = env.topic_offloader(tag=2, progress=watch_abandoned(env, lid, seen)).offload_ledger(TOPIC, lid)

    assert retry.outcome == Outcome.OFFLOADED, retry.error
    assert retry.uuid != res.uuid
    assert seen["records"] == cleanup(lid, res.uuid)  # durable before anything was written
    assert seen["abandoned"] == []  # no property any more: the record replaces it
    assert seen["context"] == retry.uuid
    assert_complete(env, lid, retry.uuid)
    li = env.ledger(lid)
    assert not any(k.startswith(ABANDONED_PREFIX) for k in H.properties(li))
    assert_only(env, (lid, retry.uuid))
    assert_readable(env, lid, retry.uuid)
    assert (retry.blocks, retry.entries) == (5, 20)

    # the failed attempt left nothing: the drain finds nothing to delete and acknowledges
    assert drain_all(env)["already_deleted"] == 1
    assert_only(env, (lid, retry.uuid))
    assert_readable(env, lid, retry.uuid)


def test_failed_cleanup_of_a_failed_write_is_finished_by_the_drain(env):
    """The offloader's own abort fails too: an unfinished upload of the failed attempt is left. The
    next attempt finds it through the recorded uuid and appends a record; the drain aborts it."""
    lid = env.ledgers[1]
    env.store.faults.on("upload_part", 3, H.raiser(BlobStoreError("injected part failure")))
    env.store.faults.on("abort_multipart", 1, H.raiser(BlobStoreError("injected abort failure")))

    res = env.topic_offloader(tag=1).offload_ledger(TOPIC, lid)

    assert res.outcome == Outcome.FAILED
    assert "injected part failure" in res.error  # the original error, not the cleanup's
    assert H.leftovers(env.raw_store) == ([], [data_key("", res.uuid, lid)])
    assert_incomplete_attempt(env, lid, res.uuid)

    seen: dict = {}
    retry = env.topic_offloader(tag=2, progress=watch_abandoned(env, lid, seen)).offload_ledger(TOPIC, lid)

    assert retry.outcome == Outcome.OFFLOADED
    assert seen["records"] == cleanup(lid, res.uuid)
    assert seen["uuids_in_store"] == {res.uuid, retry.uuid}  # no direct delete any more
    assert H.abandoned(env.ledger(lid)) == []
    assert H.leftovers(env.raw_store) == (H.offloaded_keys(retry.uuid, lid), [data_key("", res.uuid, lid)])

    assert drain_all(env)["deleted"] == 1  # the upload is aborted
    assert_only(env, (lid, retry.uuid))
    assert_readable(env, lid, retry.uuid)


def test_index_failure_with_failed_data_delete_is_finished_by_the_retry(env):
    lid = env.ledgers[0]
    env.store.faults.on("put_index", 1, H.raiser(BlobStoreError("injected index failure")))
    env.store.faults.on("delete", 1, H.raiser(BlobStoreError("injected delete failure")))

    res = env.topic_offloader(tag=1).offload_ledger(TOPIC, lid)

    assert res.outcome == Outcome.FAILED and "injected index failure" in res.error
    assert H.leftovers(env.raw_store) == ([data_key("", res.uuid, lid)], [])  # data without index
    with pytest.raises(OffloadedLedgerNotFoundError):  # never readable: the index is the commit point
        env.offloader.read_offloaded(lid, res.uuid)

    retry = env.topic_offloader(tag=2).offload_ledger(TOPIC, lid)

    assert retry.outcome == Outcome.OFFLOADED
    assert H.abandoned(env.ledger(lid)) == []
    assert H.records(env) == cleanup(lid, res.uuid)
    assert H.uuids_in_store(env.raw_store) == {res.uuid, retry.uuid}
    assert drain_all(env)["deleted"] == 1
    assert_only(env, (lid, retry.uuid))


def test_abandoned_attempt_stays_recorded_while_its_objects_cannot_be_removed(env):
    """If the drain cannot remove an abandoned attempt's objects, the record stays (retrying, with a
    delay) - it is the only record of where the leftovers are - and a later drain finishes it."""
    lid = env.ledgers[0]
    env.store.faults.on("complete_multipart", 1, H.raiser(BlobStoreError("injected complete failure")))
    env.store.faults.on("abort_multipart", 1, H.raiser(BlobStoreError("injected abort failure")))
    first = env.topic_offloader(tag=1).offload_ledger(TOPIC, lid)
    assert first.outcome == Outcome.FAILED
    assert H.upload_keys(env.raw_store) == [data_key("", first.uuid, lid)]

    env.store.faults.on("abort_multipart", 2, H.raiser(BlobStoreError("store still unavailable")))
    retry = env.topic_offloader(tag=2).offload_ledger(TOPIC, lid)

    assert retry.outcome == Outcome.OFFLOADED
    assert_complete(env, lid, retry.uuid)
    assert H.abandoned(env.ledger(lid)) == []
    assert H.records(env) == cleanup(lid, first.uuid)

    rep = H.drain(env)  # abort #2 fails: the record is retried later
    assert rep.retrying == 1 and rep.deleted == 0
    (entry,) = H.deletion_log(env).pending()
    assert entry.record.attempts == 1 and "store still unavailable" in entry.record.last_error
    assert H.uuids_in_store(env.raw_store) == {first.uuid, retry.uuid}
    assert_readable(env, lid, retry.uuid)
    assert H.drain(env).counts()["retrying"] == 0 and H.records(env) == cleanup(lid, first.uuid)  # not due

    assert drain_all(env, entry.record.next_attempt_ms)["deleted"] == 1
    assert_only(env, (lid, retry.uuid))
    assert_readable(env, lid, retry.uuid)


def test_abandoned_attempts_of_earlier_failures_are_all_cleaned_by_the_next_success(env):
    """Three attempts: the first leaves an upload behind, the second fails too; each replaced attempt
    gets its own record, and one drain removes both."""
    lid = env.ledgers[0]
    env.store.faults.on("upload_part", 2, H.raiser(BlobStoreError("injected part failure")))
    env.store.faults.on("abort_multipart", 1, H.raiser(BlobStoreError("injected abort failure")))
    a1 = env.topic_offloader(tag=1).offload_ledger(TOPIC, lid)
    assert a1.outcome == Outcome.FAILED
    assert H.upload_keys(env.raw_store) == [data_key("", a1.uuid, lid)]

    # second attempt: a1 gets a record (nothing deleted yet) and its own write fails at initiate
    env.store.faults.on("initiate_multipart", 2, H.raiser(BlobStoreError("injected initiate failure")))
    a2 = env.topic_offloader(tag=2).offload_ledger(TOPIC, lid)
    assert a2.outcome == Outcome.FAILED
    assert_incomplete_attempt(env, lid, a2.uuid)
    assert H.abandoned(env.ledger(lid)) == []
    assert H.records(env) == cleanup(lid, a1.uuid)
    assert H.upload_keys(env.raw_store) == [data_key("", a1.uuid, lid)]

    a3 = env.topic_offloader(tag=3).offload_ledger(TOPIC, lid)

    assert a3.outcome == Outcome.OFFLOADED
    assert_complete(env, lid, a3.uuid)
    assert H.abandoned(env.ledger(lid)) == []
    assert H.records(env) == sorted(cleanup(lid, a1.uuid, a2.uuid))
    counts = drain_all(env)
    assert (counts["deleted"], counts["already_deleted"]) == (1, 1)  # a2 wrote nothing
    assert_only(env, (lid, a3.uuid))


def test_legacy_abandoned_properties_become_records_and_are_dropped(env):
    """Abandoned attempts remembered in the ledger's properties (earlier versions) are covered by
    records in the same step as the replaced uuid, and the properties are dropped by its CAS."""
    lid = env.ledgers[0]
    env.store.faults.on("initiate_multipart", 1, H.raiser(BlobStoreError("injected initiate failure")))
    a1 = env.topic_offloader(tag=1).offload_ledger(TOPIC, lid)
    assert a1.outcome == Outcome.FAILED
    legacy = "0000beef-0000-4000-8000-000000000001"
    # what an earlier version wrote: the cluster name (every writer's) and the topic
    md = {"managedledgername": "public/default/persistent/offload-protocol", "pulsarclustername": "standalone"}
    env.raw_store.put(index_key("", legacy, lid), b"legacy index", md)
    env.raw_store.put(data_key("", legacy, lid), b"legacy data", md)

    def remember(info):
        find_ledger(info, lid).properties.add(key=ABANDONED_PREFIX + legacy, value="1")

    env.mutate(remember)

    a2 = env.topic_offloader(tag=2).offload_ledger(TOPIC, lid)

    assert a2.outcome == Outcome.OFFLOADED
    assert H.properties(env.ledger(lid)) == {}
    assert H.records(env) == sorted(cleanup(lid, a1.uuid, legacy))
    assert drain_all(env)["deleted"] == 1
    assert_only(env, (lid, a2.uuid))


def test_failure_while_recording_the_attempt_writes_nothing(env):
    lid = env.ledgers[0]
    env.meta.faults.on("put", 1, H.raiser(MetadataStoreError("injected metadata failure")))

    res = env.topic_offloader(tag=1).offload_ledger(TOPIC, lid)

    assert res.outcome == Outcome.FAILED and "injected metadata failure" in res.error
    assert env.store.faults.log == []  # not a single object-store call
    assert_nothing_left(env)
    assert not env.ledger(lid).HasField("offloadContext")
    assert H.records(env) == []


def test_records_are_durable_before_the_cas_that_replaces_the_attempt(env):
    """The step-1 CAS of the retry sees the replaced attempt's record already in the log; when that
    CAS fails, the record stays and is harmless: the drain finds the uuid still current."""
    lid = env.ledgers[0]
    env.store.faults.on("initiate_multipart", 1, H.raiser(BlobStoreError("injected initiate failure")))
    first = env.topic_offloader(tag=1).offload_ledger(TOPIC, lid)
    assert first.outcome == Outcome.FAILED
    seen = {}

    def at_cas(*_):
        seen["records"] = H.records(env)
        raise MetadataStoreError("injected: step-1 CAS fails")

    env.meta.faults.on("put", 2, at_cas)  # put #1 was the first attempt's step 1
    retry = env.topic_offloader(tag=2).offload_ledger(TOPIC, lid)

    assert retry.outcome == Outcome.FAILED and "step-1 CAS" in retry.error
    assert seen["records"] == cleanup(lid, first.uuid)
    assert_incomplete_attempt(env, lid, first.uuid)  # not replaced
    counts = drain_all(env)
    assert counts["still_in_use"] == 1 and counts["deleted"] == counts["already_deleted"] == 0
    assert_incomplete_attempt(env, lid, first.uuid)


def test_recording_error_that_landed_is_an_abandoned_attempt_for_the_next_one(env):
    lid = env.ledgers[0]
    env.meta.fail_after_put(1)

    res = env.topic_offloader(tag=1).offload_ledger(TOPIC, lid)

    assert res.outcome == Outcome.FAILED
    assert env.store.faults.log == []
    assert_nothing_left(env)
    recorded = context_uuid(env.ledger(lid))
    assert recorded is not None and not env.ledger(lid).offloadContext.complete

    retry = env.topic_offloader(tag=2).offload_ledger(TOPIC, lid)
    assert retry.outcome == Outcome.OFFLOADED
    assert H.abandoned(env.ledger(lid)) == []
    assert H.records(env) == cleanup(lid, recorded)
    drain_all(env)
    assert_only(env, (lid, retry.uuid))


# --- 2. another attempt took the ledger over before completion ---------------------------------


def test_conflict_at_completion_records_only_our_objects(env):
    lid = env.ledgers[0]
    other = "0000abcd-0000-4000-8000-000000000099"
    # the other attempt's objects (it is still writing them): must not be touched
    env.raw_store.put(index_key("", other, lid), b"other index")
    env.raw_store.put(data_key("", other, lid), b"other data")
    # meta put #1 records our uuid (step 1); #2 is the completion CAS (step 3): just before it,
    # another attempt replaces the uuid
    env.meta.faults.on("put", 2, lambda *_: env.mutate(set_context(other, lid)))

    res = env.topic_offloader(tag=1).offload_ledger(TOPIC, lid)

    assert ("put", 2) in env.meta.faults.fired
    assert res.outcome == Outcome.CONFLICT
    assert other in res.error
    assert_incomplete_attempt(env, lid, other)  # the other attempt's record untouched
    assert env.store.faults.calls["delete"] == 0  # no direct delete: a record instead
    assert H.records(env) == [conflict(lid, res.uuid)]
    assert H.uuids_in_store(env.raw_store) == {other, res.uuid}

    assert drain_all(env)["deleted"] == 1
    assert_incomplete_attempt(env, lid, other)
    assert sorted(H.object_keys(env.raw_store)) == sorted(
        [index_key("", other, lid), data_key("", other, lid)]
    )
    assert H.upload_keys(env.raw_store) == []
    assert env.raw_store.get(data_key("", other, lid)) == b"other data"


def test_conflict_whose_cleanup_fails_keeps_our_uuid_recorded(env):
    """Deleting our own objects after a conflict fails (in the drain): they stay discoverable through
    the retrying record, while the other attempt's record is left as it is."""
    lid = env.ledgers[0]
    other = "0000abcd-0000-4000-8000-000000000077"
    env.meta.faults.on("put", 2, lambda *_: env.mutate(set_context(other, lid)))
    env.store.faults.on("delete", 1, H.raiser(BlobStoreError("injected delete failure")))

    res = env.topic_offloader(tag=1).offload_ledger(TOPIC, lid)

    assert res.outcome == Outcome.CONFLICT
    li = env.ledger(lid)
    assert context_uuid(li) == other and not li.offloadContext.complete
    assert H.abandoned(li) == []
    assert H.records(env) == [conflict(lid, res.uuid)]
    rep = H.drain(env)
    assert rep.retrying == 1 and rep.delete_failures_offloaded == 1
    assert H.records(env) == [conflict(lid, res.uuid)]
    assert_only(env, (lid, res.uuid))  # what could not be deleted, findable through the record

    # the next attempt replaces `other` (a record for it too); a later drain removes both
    retry = env.topic_offloader(tag=2).offload_ledger(TOPIC, lid)
    assert retry.outcome == Outcome.OFFLOADED
    assert H.abandoned(env.ledger(lid)) == []
    assert H.records(env) == sorted([conflict(lid, res.uuid), *cleanup(lid, other)])
    drain_all(env, env.clock() + 3_600_000)
    assert_only(env, (lid, retry.uuid))


def test_conflict_at_completion_when_the_other_attempt_already_completed(env):
    lid = env.ledgers[2]
    other = "0000abcd-0000-4000-8000-000000000042"
    env.meta.faults.on("put", 2, lambda *_: env.mutate(set_context(other, lid, complete=True)))

    res = env.topic_offloader(tag=1).offload_ledger(TOPIC, lid)

    assert res.outcome == Outcome.CONFLICT
    li = env.ledger(lid)
    assert context_uuid(li) == other and li.offloadContext.complete
    assert H.records(env) == [conflict(lid, res.uuid)]
    assert_only(env, (lid, res.uuid))
    drain_all(env)
    assert_nothing_left(env)


def test_unrelated_concurrent_change_is_retried_not_a_conflict(env):
    lid = env.ledgers[0]

    def unrelated(info):
        info.properties.add(key="someone-else", value="was-here")
        find_ledger(info, env.ledgers[1]).properties.add(key="x", value="y")

    env.meta.faults.on("put", 2, lambda *_: env.mutate(unrelated))

    res = env.topic_offloader(tag=1).offload_ledger(TOPIC, lid)

    assert res.outcome == Outcome.OFFLOADED
    assert_complete(env, lid, res.uuid)
    info = env.info()
    assert {kv.key: kv.value for kv in info.properties} == {"someone-else": "was-here"}
    assert H.properties(find_ledger(info, env.ledgers[1])) == {"x": "y"}
    assert_only(env, (lid, res.uuid))


# --- 3. metadata-store error at completion: outcome unknown, delete nothing ----------------------


def test_metadata_error_at_completion_is_unknown_and_keeps_the_objects(env):
    lid = env.ledgers[0]
    env.meta.faults.on("put", 2, H.raiser(MetadataStoreError("injected: connection lost")))

    res = env.topic_offloader(tag=1).offload_ledger(TOPIC, lid)

    assert res.outcome == Outcome.UNKNOWN and not res.ok
    assert "connection lost" in res.error
    assert_only(env, (lid, res.uuid))  # NOT deleted: the update may have landed
    assert_readable(env, lid, res.uuid)
    assert_incomplete_attempt(env, lid, res.uuid)  # (it did not land this time)
    assert env.store.faults.calls["delete"] == 0
    assert H.records(env) == []  # nor a record

    # it did not land: the next attempt records ours as replaced; the drain removes its objects
    retry = env.topic_offloader(tag=2).offload_ledger(TOPIC, lid)
    assert retry.outcome == Outcome.OFFLOADED
    assert H.abandoned(env.ledger(lid)) == []
    assert H.records(env) == cleanup(lid, res.uuid)
    drain_all(env)
    assert_only(env, (lid, retry.uuid))


def test_metadata_error_after_the_completion_landed_keeps_a_complete_offload(env):
    lid = env.ledgers[0]
    env.meta.fail_after_put(2)

    res = env.topic_offloader(tag=1).offload_ledger(TOPIC, lid)

    assert res.outcome == Outcome.UNKNOWN
    assert_complete(env, lid, res.uuid)
    assert_only(env, (lid, res.uuid))
    assert_readable(env, lid, res.uuid)
    assert H.records(env) == []
    again = env.topic_offloader(tag=2).offload_ledger(TOPIC, lid)
    assert again.outcome == Outcome.SKIPPED and again.uuid == res.uuid
    assert_only(env, (lid, res.uuid))


# --- 4. the ledger is trimmed during the offload ----------------------------------------------


def test_ledger_trimmed_during_offload_is_a_conflict_and_leaves_nothing(env):
    lid = env.ledgers[0]
    env.store.faults.on("complete_multipart", 1, lambda *_: env.mutate(remove_ledger(lid)))

    res = env.topic_offloader(tag=1).offload_ledger(TOPIC, lid)

    assert ("complete_multipart", 1) in env.store.faults.fired
    assert res.outcome == Outcome.CONFLICT
    assert "left topic" in res.error
    assert H.records(env) == [conflict(lid, res.uuid)]
    assert_only(env, (lid, res.uuid))
    drain_all(env)  # the ledger is no longer listed: nothing uses the uuid
    assert_nothing_left(env)
    info = env.info()
    assert find_ledger(info, lid) is None
    assert [li.ledgerId for li in info.ledgerInfo][:-1] == env.ledgers[1:]
    assert all(not li.HasField("offloadContext") for li in info.ledgerInfo)


def test_ledger_trimmed_before_the_attempt_is_recorded(env):
    lid = env.ledgers[0]
    env.mutate(remove_ledger(lid))

    res = env.topic_offloader(tag=1).offload_ledger(TOPIC, lid)

    assert res.outcome == Outcome.CONFLICT and res.uuid is None
    assert env.store.faults.log == []
    assert_nothing_left(env)
    assert H.records(env) == []


# --- 5. preconditions ------------------------------------------------------------------------


def test_already_complete_is_skipped_without_writing(env):
    lid = env.ledgers[0]
    first = env.topic_offloader(tag=1).offload_ledger(TOPIC, lid)
    assert first.outcome == Outcome.OFFLOADED
    calls, puts = len(env.store.faults.log), env.meta.faults.calls["put"]
    before = env.info().SerializeToString()

    again = env.topic_offloader(tag=2).offload_ledger(TOPIC, lid)

    assert again.outcome == Outcome.SKIPPED and again.ok
    assert again.uuid == first.uuid
    assert len(env.store.faults.log) == calls
    assert env.meta.faults.calls["put"] == puts
    assert env.info().SerializeToString() == before
    assert_only(env, (lid, first.uuid))


def test_open_newest_ledger_is_a_conflict_and_nothing_is_written(env):
    newest = env.info().ledgerInfo[-1].ledgerId
    before = env.info().SerializeToString()

    res = env.topic_offloader(tag=1).offload_ledger(TOPIC, newest)

    assert res.outcome == Outcome.CONFLICT and "open ledger" in res.error
    assert env.store.faults.log == []
    assert env.info().SerializeToString() == before
    assert_nothing_left(env)


def test_sealed_newest_ledger_is_never_offloaded(env):
    env.mutate(lambda info: info.ledgerInfo.pop())  # drop the open ledger: newest is now sealed
    newest = env.ledgers[-1]
    assert env.info().ledgerInfo[-1].ledgerId == newest and env.info().ledgerInfo[-1].timestamp > 0

    res = env.topic_offloader(tag=1).offload_ledger(TOPIC, newest)

    assert res.outcome == Outcome.CONFLICT
    assert not env.ledger(newest).HasField("offloadContext")
    assert_nothing_left(env)


def test_ledger_without_close_timestamp_is_treated_as_open(env):
    lid = env.ledgers[1]

    def unseal(info):
        find_ledger(info, lid).timestamp = 0

    env.mutate(unseal)

    res = env.topic_offloader(tag=1).offload_ledger(TOPIC, lid)

    assert res.outcome == Outcome.CONFLICT
    assert not env.ledger(lid).HasField("offloadContext")
    assert_nothing_left(env)


def test_unknown_ledger_is_a_conflict(env):
    res = env.topic_offloader(tag=1).offload_ledger(TOPIC, 10_000)
    assert res.outcome == Outcome.CONFLICT
    assert_nothing_left(env)


def test_hot_tier_ledger_missing_is_a_conflict(env):
    lid = env.ledgers[0]
    env.hot.delete_ledger(lid)

    res = env.topic_offloader(tag=1).offload_ledger(TOPIC, lid)

    assert res.outcome == Outcome.CONFLICT and "hot-tier" in res.error
    assert env.store.faults.log == []
    assert_nothing_left(env)
    assert_incomplete_attempt(env, lid, res.uuid)


# --- 6. several ledgers ----------------------------------------------------------------------


@pytest.mark.parametrize("failing", [0, 1, 2])
def test_one_failing_ledger_does_not_stop_the_others(env, failing):
    env.store.faults.on("initiate_multipart", failing + 1, H.raiser(BlobStoreError("injected")))
    to = env.topic_offloader(tag=1)

    results = to.offload_ledgers(TOPIC, list(reversed(env.ledgers)))

    assert [r.ledger_id for r in results] == env.ledgers  # oldest first
    initiated = [k for op, k in env.store.faults.log if op == "initiate_multipart"]
    assert initiated == [data_key("", r.uuid, r.ledger_id) for r in results]
    expected = [Outcome.OFFLOADED] * 3
    expected[failing] = Outcome.FAILED
    assert [r.outcome for r in results] == expected
    ok = [r for r in results if r.ok]
    assert_only(env, *((r.ledger_id, r.uuid) for r in ok))
    for r in ok:
        assert_complete(env, r.ledger_id, r.uuid)
        assert_readable(env, r.ledger_id, r.uuid)
    bad = results[failing]
    assert_incomplete_attempt(env, bad.ledger_id, bad.uuid)


# --- 7. two offloaders racing on the same ledger -----------------------------------------------


def _separate_offloader(env) -> LedgerOffloader:
    """The second offloader writes through the real store: its calls do not count as the first's."""
    return LedgerOffloader(env.raw_store, max_block_size=env.max_block_size)


def assert_single_winner(env, lid, results):
    li = env.ledger(lid)
    assert li.offloadContext.complete
    winner = context_uuid(li)
    assert [r.outcome for r in results].count(Outcome.OFFLOADED) == 1
    assert {r.uuid for r in results if r.outcome == Outcome.OFFLOADED} == {winner}
    assert H.abandoned(li) == []
    return winner


def test_race_both_upload_concurrently(env):
    """Both attempts are recorded before either writes (a barrier at initiate), then both upload at
    once: the later-recorded one wins; the other conflicts and records its objects for deletion."""
    lid = env.ledgers[0]
    barrier = threading.Barrier(2, timeout=60)  # a deadlock guard, not a timing assumption
    env.store.faults.on("initiate_multipart", 1, lambda *_: barrier.wait())
    env.store.faults.on("initiate_multipart", 2, lambda *_: barrier.wait())
    results = [None, None]

    def run(i):
        results[i] = env.topic_offloader(tag=i + 1).offload_ledger(TOPIC, lid)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert sorted(r.outcome for r in results) == [Outcome.CONFLICT, Outcome.OFFLOADED]
    winner = assert_single_winner(env, lid, results)
    loser = next(r.uuid for r in results if r.outcome == Outcome.CONFLICT)
    # the winner replaced the loser's uuid (a record) and the loser conflicted (a second one)
    assert H.records(env) == sorted([*cleanup(lid, loser), conflict(lid, loser)])
    drain_all(env)
    assert_only(env, (lid, winner))
    assert_readable(env, lid, winner)


def test_race_other_attempt_runs_after_our_objects_are_written(env):
    """B runs entirely between A's data upload and A's index write: B records A's uuid as replaced,
    A's completion then conflicts and A records what it wrote; the drain removes A's objects."""
    lid = env.ledgers[0]
    a = env.topic_offloader(tag=1)
    b = env.topic_offloader(tag=2, offloader=_separate_offloader(env))
    got = {}
    env.store.faults.on("put_index", 1, lambda *_: got.setdefault("b", b.offload_ledger(TOPIC, lid)))

    ra = a.offload_ledger(TOPIC, lid)

    rb = got["b"]
    assert rb.outcome == Outcome.OFFLOADED
    assert ra.outcome == Outcome.CONFLICT
    assert_single_winner(env, lid, [ra, rb])
    assert_complete(env, lid, rb.uuid)
    assert H.records(env) == sorted([*cleanup(lid, ra.uuid), conflict(lid, ra.uuid)])
    assert H.uuids_in_store(env.raw_store) == {ra.uuid, rb.uuid}
    drain_all(env)
    assert_only(env, (lid, rb.uuid))
    assert_readable(env, lid, rb.uuid)


def test_race_loser_whose_objects_cannot_be_deleted_stays_in_the_log(env):
    """As above, but the drain cannot delete A's objects at first: the records stay (retrying) and a
    later drain removes them; B's complete offload is untouched throughout."""
    lid = env.ledgers[0]
    a = env.topic_offloader(tag=1)
    b = env.topic_offloader(tag=2, offloader=_separate_offloader(env))
    got = {}
    env.store.faults.on("put_index", 1, lambda *_: got.setdefault("b", b.offload_ledger(TOPIC, lid)))
    env.store.faults.on("delete", 1, H.raiser(BlobStoreError("injected delete failure")))

    ra = a.offload_ledger(TOPIC, lid)

    rb = got["b"]
    assert (ra.outcome, rb.outcome) == (Outcome.CONFLICT, Outcome.OFFLOADED)
    assert_complete(env, lid, rb.uuid)
    assert H.abandoned(env.ledger(lid)) == []
    assert env.store.faults.calls["delete"] == 0  # nothing deleted directly
    assert H.records(env) == sorted([*cleanup(lid, ra.uuid), conflict(lid, ra.uuid)])
    assert H.leftovers(env.raw_store) == (sorted(H.offloaded_keys(rb.uuid, lid) + H.offloaded_keys(ra.uuid, lid)),
                                          [])

    rep = H.drain(env)  # one batch delete for both records: it fails, both retry
    assert rep.retrying == 2
    assert H.uuids_in_store(env.raw_store) == {ra.uuid, rb.uuid}
    assert_readable(env, lid, rb.uuid)
    drain_all(env, env.clock() + 3_600_000)
    assert_only(env, (lid, rb.uuid))
    assert_readable(env, lid, rb.uuid)


def test_race_other_attempt_runs_while_our_upload_is_in_progress(env):
    """B runs entirely while A is between parts: B records A's uuid as replaced; A finishes writing,
    conflicts at completion and records its own uuid; B's offload is the recorded one, and the drain
    leaves only its objects."""
    lid = env.ledgers[1]
    a = env.topic_offloader(tag=1)
    b = env.topic_offloader(tag=2, offloader=_separate_offloader(env))
    got = {}
    env.store.faults.on("upload_part", 3, lambda *_: got.setdefault("b", b.offload_ledger(TOPIC, lid)))

    ra = a.offload_ledger(TOPIC, lid)

    rb = got["b"]
    assert rb.outcome == Outcome.OFFLOADED
    assert ra.outcome == Outcome.CONFLICT and not ra.ok
    assert_single_winner(env, lid, [ra, rb])
    assert H.records(env) == sorted([*cleanup(lid, ra.uuid), conflict(lid, ra.uuid)])
    drain_all(env)
    assert_only(env, (lid, rb.uuid))
    assert_readable(env, lid, rb.uuid)


@pytest.mark.parametrize("round_", range(4))
def test_free_race_of_two_offloaders_over_every_ledger(env, round_):
    """No forced interleaving: whatever the order, each ledger ends with exactly one complete
    offload and the store holds only the recorded uuids' objects."""
    start = threading.Barrier(2, timeout=60)
    results: list = [None, None]
    offloaders = [env.topic_offloader(tag=1), env.topic_offloader(tag=2, offloader=_separate_offloader(env))]

    def run(i):
        start.wait()
        results[i] = offloaders[i].offload_ledgers(TOPIC, env.ledgers)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    recorded = []
    for k, lid in enumerate(env.ledgers):
        pair = [results[0][k], results[1][k]]
        assert all(r.ledger_id == lid for r in pair)
        li = env.ledger(lid)
        assert li.offloadContext.complete, pair
        winner = context_uuid(li)
        assert H.abandoned(li) == []
        # exactly one attempt wrote the recorded offload; the other skipped it or lost
        assert [r.outcome for r in pair].count(Outcome.OFFLOADED) == 1, pair
        loser = next(r for r in pair if r.outcome != Outcome.OFFLOADED)
        assert loser.outcome in (Outcome.SKIPPED, Outcome.CONFLICT, Outcome.FAILED), pair
        if loser.outcome == Outcome.SKIPPED:
            assert loser.uuid == winner
        recorded.append((lid, winner))
        assert_readable(env, lid, winner)
    # a record may name a winner (appended by an attempt whose CAS then found it complete): the drain
    # finds it still in use and deletes nothing of it
    drain_all(env)
    assert_only(env, *recorded)
    for lid, winner in recorded:
        assert_readable(env, lid, winner)
