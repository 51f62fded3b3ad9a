"""The deletion log (docs/deletion.md) on a real SQLite metadata store."""

from __future__ import annotations

import json
import pickle
import threading
import uuid as uuidlib

import pytest

from tieredcore.errors import ValidationError
from tieredcore.meta.deletion_log import (
    DEAD,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_RETRY_DELAY_MS,
    MAX_BACKOFF_MS,
    PENDING,
    STATE_DEAD,
    STATE_PENDING,
    STATE_RETRYING,
    DeletionLog,
    DeletionRecord,
)

TOPIC = "t/a/persistent/topic-0"
DRIVER = {"name": "filesystem", "properties": {"root": "/nowhere"}}


@pytest.fixture
def meta(any_meta):
    return any_meta  # every test below runs on SQLite and on ZooKeeper


@pytest.fixture
def dlog(meta):
    return DeletionLog(meta)


def hot(ledger_id=1, created_ms=1000, **kw) -> DeletionRecord:
    return DeletionRecord(topic=TOPIC, ledger_id=ledger_id, type="ledger", reason="retention",
                          created_ms=created_ms, **kw)


def off(ledger_id=1, created_ms=1000, **kw) -> DeletionRecord:
    kw.setdefault("uuid", str(uuidlib.uuid4()))
    kw.setdefault("driver", DRIVER)
    return DeletionRecord(topic=TOPIC, ledger_id=ledger_id, type="offloaded", reason="offload-cleanup",
                          created_ms=created_ms, **kw)


def test_defaults():
    assert DEFAULT_RETRY_DELAY_MS == 600_000
    assert DEFAULT_MAX_ATTEMPTS == 10


@pytest.mark.parametrize(
    "bad",
    [
        {"topic": "t/a/topic-0"},  # not a managed-ledger name
        {"ledger_id": -1},
        {"ledger_id": True},
        {"type": "bookie"},
        {"component": "index"},
        {"reason": ""},
        {"created_ms": "yesterday"},
        {"next_attempt_ms": None},
    ],
)
def test_append_refuses_malformed_records_and_writes_nothing(dlog, meta, bad):
    good = hot(ledger_id=7)
    with pytest.raises(ValidationError):
        dlog.append([good, DeletionRecord(**{**hot().__dict__, **bad})])
    assert meta.children(PENDING) == []  # all or none
    assert dlog.counters()["appended_hot"] == 0


@pytest.mark.parametrize("bad", [{"uuid": "not-a-uuid"}, {"uuid": ""}, {"driver": {}},
                                 {"driver": {"name": ""}}])
def test_append_refuses_offloaded_records_without_attempt_or_driver(dlog, bad):
    with pytest.raises(ValidationError):
        dlog.append([off(**bad)])


def test_append_and_read_back(dlog):
    r1, r2 = hot(ledger_id=3), off(ledger_id=3)
    dlog.append([r1, r2])
    got = {e.id: e.record for e in dlog.pending()}
    assert got == {r1.id: r1, r2.id: r2}
    c = dlog.counters()
    assert (c["appended_hot"], c["appended_offloaded"]) == (1, 1)
    assert dlog.stats()["in_flight"] == 2 and dlog.stats()["pending"] == 2


def test_due_is_oldest_first_and_skips_records_not_yet_due(dlog):
    a, b, c = hot(ledger_id=1, created_ms=300), hot(ledger_id=2, created_ms=100), hot(ledger_id=3, created_ms=200)
    dlog.append([a, b, c])
    assert [e.id for e in dlog.due(10_000)] == [b.id, c.id, a.id]
    assert [e.id for e in dlog.due(10_000, limit=2)] == [b.id, c.id]
    # c fails once: it is not due again before its next attempt time
    entry_c = next(e for e in dlog.due(10_000) if e.id == c.id)
    assert dlog.retry(entry_c, "boom", 10_000, delay_ms=1_000) == STATE_RETRYING
    assert [e.id for e in dlog.due(10_999)] == [b.id, a.id]
    assert [e.id for e in dlog.due(11_000)] == [b.id, c.id, a.id]


def test_retry_backs_off_exponentially_then_dead_letters(dlog):
    r = hot()
    dlog.append([r])
    now = 0
    waits = []
    for attempt in range(1, 5):
        (e,) = dlog.due(now)
        assert dlog.retry(e, f"failure {attempt}", now, delay_ms=1_000, max_attempts=5,
                          delete_failures_hot=1) == STATE_RETRYING
        (e,) = dlog.pending()
        assert (e.record.state, e.record.attempts, e.record.last_error) == (STATE_RETRYING, attempt,
                                                                            f"failure {attempt}")
        waits.append(e.record.next_attempt_ms - now)
        assert dlog.due(e.record.next_attempt_ms - 1) == []
        now = e.record.next_attempt_ms
    assert waits == [1_000, 2_000, 4_000, 8_000]
    (e,) = dlog.due(now)
    assert dlog.retry(e, "failure 5", now, delay_ms=1_000, max_attempts=5, delete_failures_hot=1) == STATE_DEAD
    assert dlog.pending() == []
    (d,) = dlog.dead_letters()
    assert d.record.state == STATE_DEAD and d.record.attempts == 5
    assert d.record.dead_reason == "gave up after 5 attempts: failure 5"
    c = dlog.counters()
    assert (c["delete_failures_hot"], c["dead_lettered"], c["consumed"], c["acknowledged"]) == (5, 1, 5, 0)


def test_backoff_is_capped(dlog):
    r = hot(attempts=30)
    dlog.append([r])
    (e,) = dlog.due(0)
    dlog.retry(e, "x", 0, delay_ms=600_000, max_attempts=100)
    assert dlog.pending()[0].record.next_attempt_ms == MAX_BACKOFF_MS


def test_requeue_and_drop(dlog):
    a, b = hot(ledger_id=1), off(ledger_id=2)
    dlog.append([a, b])
    for e in dlog.due(0):
        assert dlog.dead_letter(e, "operator test")
    assert dlog.pending() == [] and {e.id for e in dlog.dead_letters()} == {a.id, b.id}
    assert dlog.stats()["dead_letter"] == 2

    assert dlog.requeue([a.id, "unknown"], as_of_ms=5_000) == [a.id]
    (p,) = dlog.pending()
    assert p.id == a.id
    assert (p.record.state, p.record.attempts, p.record.next_attempt_ms, p.record.dead_reason) == (
        STATE_PENDING, 0, 5_000, "")
    assert dlog.due(4_999) == [] and [e.id for e in dlog.due(5_000)] == [a.id]

    assert dlog.drop([b.id, "unknown"]) == [b.id]
    assert dlog.dead_letters() == []
    with pytest.raises(ValidationError):
        dlog.drop(["../stats"])


def test_ack_is_single_and_counts(dlog):
    r = hot()
    dlog.append([r])
    (e,) = dlog.due(0)
    assert dlog.ack(e, deleted_hot=1) is True
    assert dlog.ack(e, deleted_hot=1) is False  # already gone
    c = dlog.counters()
    assert (c["acknowledged"], c["consumed"], c["deleted_hot"]) == (1, 1, 1)
    with pytest.raises(ValidationError):
        dlog.count(no_such_counter=1)


def test_stale_version_loses(dlog):
    r = hot()
    dlog.append([r])
    (e,) = dlog.due(0)
    assert dlog.retry(e, "first", 0) == STATE_RETRYING
    # e still carries the old version: every state change based on it is refused
    assert dlog.ack(e) is False
    assert dlog.retry(e, "second", 0) == ""
    assert dlog.dead_letter(e, "x") is False
    assert dlog.pending()[0].record.attempts == 1


def test_two_threads_acking_the_same_entry(tmp_path, meta):
    DeletionLog(meta).append([hot(ledger_id=i) for i in range(20)])
    entries = DeletionLog(meta).due(0)
    stores = [pickle.loads(pickle.dumps(meta)) for _ in range(2)]  # two consumers, own connections
    results: list[list[bool]] = [[], []]
    barrier = threading.Barrier(2)

    def consume(i: int) -> None:
        lg = DeletionLog(stores[i])
        barrier.wait()
        for e in entries:
            results[i].append(lg.ack(e, deleted_hot=1))

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in stores:
        s.close()
    for k in range(len(entries)):
        assert results[0][k] != results[1][k]  # exactly one True per entry
    c = DeletionLog(meta).counters()
    assert c["acknowledged"] == c["deleted_hot"] == c["consumed"] == 20
    assert DeletionLog(meta).pending() == []


@pytest.mark.parametrize("raw", [b"not json", b"[1, 2]", b'{"topic": "t/a/persistent/x"}',
                                 json.dumps({**json.loads(hot().to_json()), "created_ms": "soon"}).encode()])
def test_malformed_raw_record_is_due_with_record_none(dlog, meta, raw):
    good = hot(created_ms=50)
    dlog.append([good])
    meta.create(f"{PENDING}/forged1", raw)
    due = dlog.due(0)
    assert [e.id for e in due] == ["forged1", good.id]  # malformed first (created 0), then the rest
    bad = due[0]
    assert bad.record is None and bad.error.startswith("malformed record") and bad.raw == raw
    assert dlog.dead_letter(bad, bad.error, malformed=1)
    (d,) = dlog.dead_letters()
    assert d.id == "forged1" and d.record is None
    assert json.loads(meta.get(f"{DEAD}/forged1").value)["raw"] == raw.decode()
    assert dlog.requeue(["forged1"]) == []  # only drop applies to malformed dead letters
    assert dlog.counters()["malformed"] == 1


def test_damaged_counters_restart_from_zero(dlog, meta):
    dlog.count(acknowledged=2)
    got = meta.get("/tiered/deletion-log/stats")
    meta.put("/tiered/deletion-log/stats", b"garbage", got.version)
    assert dlog.counters()["acknowledged"] == 0
    dlog.count(acknowledged=1)
    assert dlog.counters()["acknowledged"] == 1
