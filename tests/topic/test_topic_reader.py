"""TopicReader: one topic read across the hot tier and the object store, read priorities, start/end
positions, the deletion lag (hot copy removed after offload) and stale hot-tier handles."""

from __future__ import annotations

import itertools
import uuid as uuidlib
from pathlib import Path

import pytest

from tieredcore.errors import HotLedgerNotFoundError, StaleHandleError, TopicNotFoundError, ValidationError
from tieredcore.hot.local import LocalLedgerStore
from tieredcore.meta.managed_ledgers import ManagedLedgerStore, find_ledger
from tieredcore.meta.sqlite import SqliteMetadataStore
from tieredcore.model import Position
from tieredcore.names import TopicName
from tieredcore.offload.cache import OffsetCache
from tieredcore.offload.managed import TopicOffloader
from tieredcore.offload.offloader import LedgerOffloader
from tieredcore.outcomes import Outcome
from tieredcore.policy import HOT_FIRST, TIERED_FIRST
from tieredcore.topic.reader import TopicReader
from tieredcore.topic.writer import TopicWriter

TOPIC = "persistent://public/default/reader-topic"
START = 1_700_000_000_000


class Env:
    def __init__(self, tmp_path: Path, store) -> None:
        self.meta = SqliteMetadataStore(tmp_path / "meta.db")
        self.ml = ManagedLedgerStore(self.meta)
        self.hot = LocalLedgerStore(tmp_path / "hot")
        self.store = store
        self.offloader = LedgerOffloader(
            store, "offload", max_block_size=4096, read_buffer=2048, offset_cache=OffsetCache()
        )
        counter = itertools.count(1)
        self.topic_offloader = TopicOffloader(
            self.ml,
            self.hot,
            self.offloader,
            clock_ms=lambda: START,
            uuid_factory=lambda: uuidlib.UUID(f"00000000-0000-4000-8000-{next(counter):012x}"),
        )
        self.writer = TopicWriter(self.ml, self.hot, TOPIC, max_entries=20, clock_ms=lambda: START)
        # 3 sealed ledgers of 20 entries, the newest (open) with 7
        self.written: list[tuple[Position, bytes]] = []
        payloads = [f"msg-{i}-".encode() * (i % 13) for i in range(67)]
        self.written = list(zip(self.writer.append_many(payloads), payloads, strict=True))
        self.ledgers = sorted({pos.ledger_id for pos, _ in self.written})
        assert len(self.ledgers) == 4

    def reader(self, priority: str = TIERED_FIRST, batch_entries: int = 6) -> TopicReader:
        return TopicReader(self.ml, self.hot, self.offloader, priority, batch_entries=batch_entries)

    def offload(self, lid: int) -> None:
        res = self.topic_offloader.offload_ledger(TOPIC, lid)
        assert res.outcome == Outcome.OFFLOADED, res

    def lag_delete(self, lid: int, record: bool = True) -> None:
        """What the deletion lag does: delete the hot copy, then record bookkeeperDeleted."""
        self.hot.delete_ledger(lid)
        if record:

            def mark(info) -> bool:
                find_ledger(info, lid).offloadContext.bookkeeperDeleted = True
                return True

            self.ml.update_topic(TOPIC, mark)

    def close(self) -> None:
        self.writer.close(seal=False)
        self.hot.close()
        self.meta.close()


@pytest.fixture
def env(tmp_path: Path, fs_store):
    e = Env(tmp_path, fs_store)
    yield e
    e.close()


def as_bytes(items) -> list[tuple[Position, bytes]]:
    return [(pos, bytes(data)) for pos, data in items]


@pytest.mark.parametrize("priority", [TIERED_FIRST, HOT_FIRST])
def test_hot_only(env: Env, priority: str) -> None:
    r = env.reader(priority)
    assert as_bytes(r.read(TOPIC)) == env.written
    assert r.tier_reads == {"hot": 4, "offloaded": 0}


def test_tiered_first_reads_complete_offloads_from_the_object_store(env: Env) -> None:
    env.offload(env.ledgers[0])
    env.offload(env.ledgers[2])
    r = env.reader(TIERED_FIRST)
    assert as_bytes(r.read(TOPIC)) == env.written
    assert r.tier_reads == {"hot": 2, "offloaded": 2}
    assert {lid for lid, _ in r._offloaded} == {env.ledgers[0], env.ledgers[2]}
    r.close()


def test_bookkeeper_first_reads_hot_copy_while_it_exists(env: Env) -> None:
    env.offload(env.ledgers[0])
    env.offload(env.ledgers[1])
    r = env.reader(HOT_FIRST)
    assert as_bytes(r.read(TOPIC)) == env.written
    assert r.tier_reads == {"hot": 4, "offloaded": 0}
    env.lag_delete(env.ledgers[0])
    r2 = env.reader(HOT_FIRST)
    assert as_bytes(r2.read(TOPIC)) == env.written
    assert r2.tier_reads == {"hot": 3, "offloaded": 1}


@pytest.mark.parametrize("priority", [TIERED_FIRST, HOT_FIRST])
def test_offloaded_only_after_deletion_lag(env: Env, priority: str) -> None:
    for lid in env.ledgers[:3]:
        env.offload(lid)
        env.lag_delete(lid)
    assert env.hot.list_ledgers() == [env.ledgers[3]]
    r = env.reader(priority)
    assert as_bytes(r.read(TOPIC)) == env.written
    assert r.tier_reads == {"hot": 1, "offloaded": 3}


def test_incomplete_offload_is_read_from_the_hot_tier(env: Env) -> None:
    lid = env.ledgers[0]

    def start_attempt(info) -> bool:
        ctx = find_ledger(info, lid).offloadContext
        ctx.uidMsb, ctx.uidLsb, ctx.complete = 1, 2, False
        return True

    env.ml.update_topic(TOPIC, start_attempt)  # an attempt that never completed: no objects
    r = env.reader(TIERED_FIRST)
    assert as_bytes(r.read(TOPIC)) == env.written
    assert r.tier_reads == {"hot": 4, "offloaded": 0}


def test_hot_copy_deleted_before_bookkeeper_deleted_is_recorded(env: Env) -> None:
    """Deletion lag between its two steps: the hot copy is gone, the record not updated yet."""
    lid = env.ledgers[1]
    env.offload(lid)
    env.lag_delete(lid, record=False)
    r = env.reader(HOT_FIRST)
    assert as_bytes(r.read(TOPIC)) == env.written
    assert r.tier_reads == {"hot": 3, "offloaded": 1}
    assert [bytes(e.data) for e in r.read_ledger(TOPIC, lid, 3, 5)] == [d for _, d in env.written[23:26]]


def test_hot_copy_gone_without_offload_is_an_error(env: Env) -> None:
    env.hot.delete_ledger(env.ledgers[0])
    with pytest.raises(HotLedgerNotFoundError):
        list(env.reader().read(TOPIC))


@pytest.mark.parametrize("priority", [TIERED_FIRST, HOT_FIRST])
def test_start_and_end_positions(env: Env, priority: str) -> None:
    env.offload(env.ledgers[1])
    r = env.reader(priority)
    written = env.written
    positions = [pos for pos, _ in written]

    def expect(start: Position | None, end: Position | None):
        lo = positions.index(start) if start is not None else 0
        hi = positions.index(end) + 1 if end is not None else len(written)
        return written[lo:hi]

    cases = [
        (Position(env.ledgers[0], 5), None),
        (None, Position(env.ledgers[2], 3)),
        (Position(env.ledgers[1], 19), Position(env.ledgers[2], 0)),
        (Position(env.ledgers[1], 7), Position(env.ledgers[1], 7)),
        (Position(env.ledgers[0], 0), Position(env.ledgers[3], 6)),
        (Position(env.ledgers[3], 2), None),
    ]
    for start, end in cases:
        assert as_bytes(r.read(TOPIC, start, end)) == expect(start, end), (start, end)
    # an end entry beyond the ledger's last entry stops at the ledger's end
    got = as_bytes(r.read(TOPIC, Position(env.ledgers[2], 18), Position(env.ledgers[2], 10_000)))
    assert got == written[58:60]


def test_stale_hot_handle_switches_to_the_offloaded_copy(env: Env) -> None:
    lid = env.ledgers[0]
    env.offload(lid)
    r = env.reader(HOT_FIRST, batch_entries=4)
    it = r.read(TOPIC)
    head = as_bytes(itertools.islice(it, 5))  # the hot handle of ledger 0 is open mid-ledger
    assert head == env.written[:5]
    assert r.tier_reads == {"hot": 1, "offloaded": 0}
    assert r._offloaded == {}
    env.lag_delete(lid)  # the deletion lag removes the hot copy under the open handle
    rest = as_bytes(it)
    assert head + rest == env.written
    # the rest of ledger 0 came from the object store
    assert {k[0] for k in r._offloaded} == {lid}
    h = r._offloaded[next(iter(r._offloaded))]
    assert h.requests > 0


def test_stale_hot_handle_read_ledger(env: Env) -> None:
    lid = env.ledgers[2]
    env.offload(lid)
    r = env.reader(HOT_FIRST)
    tier, h = r.open_ledger(TopicName.parse(TOPIC), lid)
    assert tier == "hot"
    env.lag_delete(lid)
    with pytest.raises(StaleHandleError):
        h.read(0, 1)  # the old handle refuses to serve bytes of a deleted ledger
    h.close()
    got = r.read_ledger(TOPIC, lid, 0, 19)
    assert [bytes(e.data) for e in got] == [d for _, d in env.written[40:60]]
    tier, _ = r.open_ledger(TopicName.parse(TOPIC), lid)
    assert tier == "offloaded"


def test_unknown_topic_and_ledger(env: Env) -> None:
    r = env.reader()
    with pytest.raises(TopicNotFoundError):
        list(r.read("persistent://public/default/nope"))
    with pytest.raises(HotLedgerNotFoundError):
        r.read_ledger(TOPIC, 123456, 0, 0)


def test_bad_read_priority(env: Env) -> None:
    for bad in ("", "hot-first", "TIERED-STORAGE-FIRST"):
        with pytest.raises(ValidationError):
            TopicReader(env.ml, env.hot, env.offloader, bad)


def test_reader_on_s3(tmp_path: Path, s3_store) -> None:
    e = Env(tmp_path, s3_store)
    try:
        e.offload(e.ledgers[0])
        e.lag_delete(e.ledgers[0])
        e.offload(e.ledgers[1])
        r = e.reader(TIERED_FIRST)
        assert as_bytes(r.read(TOPIC)) == e.written
        assert r.tier_reads == {"hot": 2, "offloaded": 2}
    finally:
        e.close()
