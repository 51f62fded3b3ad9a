"""TopicWriter: rollover by entries / bytes / age, what the topic record and the hot tier hold, recovery
of a ledger a dead writer left open, empty ledgers dropped."""

from __future__ import annotations

from pathlib import Path

import pytest

from tieredcore.errors import HotLedgerNotFoundError, ValidationError
from tieredcore.hot.local import LocalLedgerStore
from tieredcore.meta.managed_ledgers import ManagedLedgerStore
from tieredcore.meta.sqlite import SqliteMetadataStore
from tieredcore.model import STATE_CLOSED, STATE_OPEN, Position
from tieredcore.names import TopicName
from tieredcore.topic.writer import TopicWriter, ledger_custom_metadata

TOPIC = "persistent://public/default/my-topic"
ML_NAME = "public/default/persistent/my-topic"
START = 1_700_000_000_000


class Clock:
    def __init__(self, now: int = START) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def env(tmp_path: Path):
    meta = SqliteMetadataStore(tmp_path / "meta.db")
    ml = ManagedLedgerStore(meta)
    hot = LocalLedgerStore(tmp_path / "hot")
    yield ml, hot, Clock()
    hot.close()
    meta.close()


def ledgers(ml: ManagedLedgerStore):
    info, _ = ml.get_topic(TOPIC)
    return [(li.ledgerId, li.entries, li.size, li.timestamp) for li in info.ledgerInfo]


def hot_contents(hot: LocalLedgerStore, ledger_id: int) -> list[bytes]:
    with hot.open_ledger(ledger_id) as h:
        if h.last_add_confirmed < 0:
            return []
        return [bytes(e.data) for e in h.read(0, h.last_add_confirmed)]


def p(i: int, size: int = 10) -> bytes:
    return f"{i:0{size}d}".encode()[:size]


def test_new_topic_has_one_open_ledger_with_custom_metadata(env) -> None:
    ml, hot, clock = env
    w = TopicWriter(ml, hot, TOPIC, clock_ms=clock)
    [(lid, entries, size, ts)] = ledgers(ml)
    assert lid == w.current_ledger_id and ts == 0
    md = hot.ledger_metadata(lid)
    assert md.state == STATE_OPEN
    assert md.ctime == START
    assert md.custom_metadata == {
        "application": b"pulsar",
        "component": b"managed-ledger",
        "pulsar/managed-ledger": ML_NAME.encode(),
    }
    assert ledger_custom_metadata(TopicName.parse(TOPIC)) == md.custom_metadata
    w.close(seal=False)


@pytest.mark.parametrize("bulk", [False, True])
def test_rollover_by_max_entries(env, bulk: bool) -> None:
    ml, hot, clock = env
    w = TopicWriter(ml, hot, TOPIC, max_entries=3, clock_ms=clock)
    payloads = [p(i) for i in range(10)]
    if bulk:
        positions = w.append_many(payloads)
    else:
        positions = []
        for i, data in enumerate(payloads):
            clock.now = START + i
            positions.append(w.append(data))
    recorded = ledgers(ml)
    assert len(recorded) == 4
    ids = [r[0] for r in recorded]
    assert ids == sorted(ids) and len(set(ids)) == 4
    assert positions == [Position(ids[i // 3], i % 3) for i in range(10)]
    for k, (lid, entries, size, ts) in enumerate(recorded[:3]):
        assert (entries, size) == (3, 30)
        # sealed when the next append found it full; the timestamp comes from the injected clock
        assert ts == (START + 3 * (k + 1) if not bulk else START)
        assert hot.ledger_metadata(lid).state == STATE_CLOSED
        assert hot_contents(hot, lid) == payloads[3 * k : 3 * k + 3]
    assert recorded[3][3] == 0  # newest: open
    assert hot.ledger_metadata(ids[3]).state == STATE_OPEN
    assert hot_contents(hot, ids[3]) == payloads[9:]
    w.close()
    final = ledgers(ml)
    assert final[3][1:3] == (1, 10) and final[3][3] > 0
    assert hot.ledger_metadata(ids[3]).state == STATE_CLOSED


def test_rollover_by_max_bytes_same_for_single_and_bulk_appends(env, tmp_path: Path) -> None:
    ml, hot, clock = env
    payloads = [p(i, 40) for i in range(7)]
    w = TopicWriter(ml, hot, TOPIC, max_bytes=100, clock_ms=clock)
    single = [w.append(x) for x in payloads]
    w.close()
    by_single = [(e, s) for _, e, s, _ in ledgers(ml)]
    # a ledger takes entries until its size reaches max_bytes (it may pass it by one entry)
    assert by_single == [(3, 120), (3, 120), (1, 40)]

    meta2 = SqliteMetadataStore(tmp_path / "meta2.db")
    ml2 = ManagedLedgerStore(meta2)
    hot2 = LocalLedgerStore(tmp_path / "hot2")
    w2 = TopicWriter(ml2, hot2, TOPIC, max_bytes=100, clock_ms=clock)
    bulk = w2.append_many(payloads)
    w2.close()
    assert [(e, s) for _, e, s, _ in ledgers(ml2)] == by_single
    assert [pos.entry_id for pos in bulk] == [pos.entry_id for pos in single]
    hot2.close()
    meta2.close()


def test_one_entry_larger_than_max_bytes_gets_its_own_ledger(env) -> None:
    ml, hot, clock = env
    w = TopicWriter(ml, hot, TOPIC, max_bytes=100, clock_ms=clock)
    w.append_many([b"a", bytes(500), b"b"])
    w.close()
    assert [(e, s) for _, e, s, _ in ledgers(ml)] == [(2, 501), (1, 1)]


def test_rollover_by_age(env) -> None:
    ml, hot, clock = env
    w = TopicWriter(ml, hot, TOPIC, max_age_ms=1000, clock_ms=clock)
    first = w.current_ledger_id
    w.append(b"a")
    clock.now += 999
    assert w.append(b"b") == Position(first, 1)
    clock.now += 1
    pos = w.append(b"c")  # the ledger is 1000 ms old: sealed before this append
    assert pos.ledger_id != first and pos.entry_id == 0
    recorded = ledgers(ml)
    assert recorded[0] == (first, 2, 2, START + 1000)
    assert recorded[1] == (pos.ledger_id, 0, 0, 0)
    assert hot.ledger_metadata(pos.ledger_id).ctime == START + 1000
    clock.now += 5000
    w.rollover()  # explicit rollover of a non-empty ledger
    recorded = ledgers(ml)
    assert recorded[1] == (pos.ledger_id, 1, 1, START + 6000)
    assert recorded[2][3] == 0
    w.close()


def test_explicit_rollover_of_empty_ledger_is_a_no_op(env) -> None:
    ml, hot, clock = env
    w = TopicWriter(ml, hot, TOPIC, clock_ms=clock)
    lid = w.current_ledger_id
    w.rollover()
    assert w.current_ledger_id == lid and len(ledgers(ml)) == 1
    w.close()


def test_closing_an_empty_ledger_drops_it(env) -> None:
    ml, hot, clock = env
    w = TopicWriter(ml, hot, TOPIC, max_entries=2, clock_ms=clock)
    w.append_many([b"1", b"2"])
    w.rollover()
    empty = w.current_ledger_id
    w.close()
    recorded = ledgers(ml)
    assert [r[1] for r in recorded] == [2]
    assert empty not in [r[0] for r in recorded]
    assert not hot.exists(empty)
    with pytest.raises(HotLedgerNotFoundError):
        hot.open_ledger(empty)


def test_writer_without_appends_leaves_an_empty_topic(env) -> None:
    ml, hot, clock = env
    with TopicWriter(ml, hot, TOPIC, clock_ms=clock):
        pass
    assert ledgers(ml) == []
    assert hot.list_ledgers() == []


def test_dead_writer_ledger_is_sealed_by_the_next_writer(env) -> None:
    ml, hot, clock = env
    w = TopicWriter(ml, hot, TOPIC, max_entries=4, clock_ms=clock)
    payloads = [p(i) for i in range(6)]
    w.append_many(payloads)
    dead = w.current_ledger_id
    w.close(seal=False)  # the broker died: the newest ledger stays open
    assert ledgers(ml)[-1] == (dead, 0, 0, 0)
    assert hot.ledger_metadata(dead).state == STATE_OPEN

    clock.now += 60_000
    w2 = TopicWriter(ml, hot, TOPIC, max_entries=4, clock_ms=clock)
    recorded = ledgers(ml)
    assert len(recorded) == 3
    assert recorded[1] == (dead, 2, 20, START + 60_000)
    assert recorded[2][0] == w2.current_ledger_id and recorded[2][3] == 0
    assert w2.current_ledger_id > dead
    md = hot.ledger_metadata(dead)
    assert (md.state, md.last_entry_id, md.length) == (STATE_CLOSED, 1, 20)
    assert hot_contents(hot, dead) == payloads[4:]
    assert w2.append(b"next") == Position(w2.current_ledger_id, 0)
    w2.close()


def test_dead_writer_with_empty_open_ledger(env) -> None:
    ml, hot, clock = env
    w = TopicWriter(ml, hot, TOPIC, max_entries=2, clock_ms=clock)
    w.append_many([b"a", b"b"])
    w.rollover()
    dead = w.current_ledger_id
    w.close(seal=False)
    w2 = TopicWriter(ml, hot, TOPIC, clock_ms=clock)
    recorded = ledgers(ml)
    assert [r[0] for r in recorded] == [recorded[0][0], w2.current_ledger_id]
    assert dead not in [r[0] for r in recorded]
    assert not hot.exists(dead)
    w2.close()


def test_dead_writer_whose_hot_ledger_is_gone(env) -> None:
    ml, hot, clock = env
    w = TopicWriter(ml, hot, TOPIC, clock_ms=clock)
    w.append(b"lost")
    dead = w.current_ledger_id
    w.close(seal=False)
    hot.delete_ledger(dead)
    w2 = TopicWriter(ml, hot, TOPIC, clock_ms=clock)
    assert [r[0] for r in ledgers(ml)] == [w2.current_ledger_id]
    w2.close()


def test_closed_writer_and_bad_limits(env) -> None:
    ml, hot, clock = env
    for kw in ({"max_entries": 0}, {"max_bytes": 0}, {"max_entries": -1}):
        with pytest.raises(ValidationError):
            TopicWriter(ml, hot, TOPIC, clock_ms=clock, **kw)
    w = TopicWriter(ml, hot, TOPIC, clock_ms=clock)
    w.append(b"x")
    w.close()
    w.close()  # idempotent
    with pytest.raises(ValidationError):
        w.append(b"y")
    with pytest.raises(ValidationError):
        w.rollover()
    with pytest.raises(ValidationError):
        _ = w.current_ledger_id
    with pytest.raises(ValidationError):
        TopicWriter(ml, hot, "not a topic", clock_ms=clock)
