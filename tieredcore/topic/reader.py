"""Cross-tier topic reader (spec/02 read priority).

`tiered-storage-first` (default): a ledger whose offload is complete is read from the object store,
others from the hot tier. `bookkeeper-first`: the hot copy while it exists. The topic record is read
afresh for every ledger so a hot copy removed by the deletion lag is never read through a stale handle:
if a hot read fails because the ledger is gone, the reader re-reads the record and switches tier.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from tieredcore.errors import LedgerNotFoundError, StaleHandleError, ValidationError
from tieredcore.model import Entry, Position, ReadHandle
from tieredcore.offload.context import context_uuid
from tieredcore.offload.offloader import LedgerOffloader
from tieredcore.stores.hot import LocalLedgerStore
from tieredcore.stores.managed_ledgers import ManagedLedgerStore, find_ledger
from tieredcore.topics import TopicName

TIERED_FIRST = "tiered-storage-first"
HOT_FIRST = "bookkeeper-first"
READ_PRIORITIES = (TIERED_FIRST, HOT_FIRST)


class TopicReader:
    def __init__(
        self,
        ml: ManagedLedgerStore,
        hot: LocalLedgerStore,
        offloader: LedgerOffloader,
        read_priority: str = TIERED_FIRST,
        batch_entries: int = 1000,
        offloader_for_driver: Callable[[Any], LedgerOffloader] | None = None,
    ) -> None:
        if read_priority not in READ_PRIORITIES:
            raise ValidationError(f"read priority must be one of {', '.join(READ_PRIORITIES)}, got {read_priority!r}")
        self.ml = ml
        self.hot = hot
        self.offloader = offloader
        # where each ledger was offloaded is recorded in its driver metadata; follow it
        self.offloader_for_driver = offloader_for_driver
        self.read_priority = read_priority
        self.batch_entries = batch_entries
        self._offloaded: dict[tuple[int, str], ReadHandle] = {}
        self.tier_reads = {"hot": 0, "offloaded": 0}  # ledgers read per tier (observability)

    def close(self) -> None:
        for h in self._offloaded.values():
            h.close()
        self._offloaded.clear()

    def _offloaded_handle(self, li) -> ReadHandle:
        uuid = context_uuid(li)
        k = (li.ledgerId, uuid)
        h = self._offloaded.get(k)
        if h is None:
            off = self.offloader
            if self.offloader_for_driver is not None and li.offloadContext.HasField("driverMetadata"):
                off = self.offloader_for_driver(li.offloadContext.driverMetadata)
            h = self._offloaded[k] = off.read_offloaded(li.ledgerId, uuid)
        return h

    def open_ledger(self, topic: TopicName, ledger_id: int) -> tuple[str, ReadHandle]:
        """(tier, handle) for one ledger of the topic, following the read priority."""
        info, _ = self.ml.get_topic(topic)
        li = find_ledger(info, ledger_id)
        if li is None:
            raise LedgerNotFoundError(f"ledger {ledger_id} is not part of topic {topic.managed_ledger_name}")
        ctx = li.offloadContext if li.HasField("offloadContext") else None
        offloaded = ctx is not None and ctx.complete
        hot_exists = not (ctx is not None and ctx.bookkeeperDeleted)
        if offloaded and (self.read_priority == TIERED_FIRST or not hot_exists):
            return "offloaded", self._offloaded_handle(li)
        try:
            return "hot", self.hot.open_ledger(ledger_id)
        except LedgerNotFoundError:
            # hot copy deleted, bookkeeperDeleted not recorded yet (a lag cleanup between its two steps)
            if not offloaded:
                raise
            return "offloaded", self._offloaded_handle(li)

    def read_ledger(self, topic: str | TopicName, ledger_id: int, first: int, last: int) -> list[Entry]:
        t = topic if isinstance(topic, TopicName) else TopicName.parse(topic)
        for attempt in range(2):
            tier, h = self.open_ledger(t, ledger_id)
            try:
                return h.read(first, last)
            except (StaleHandleError, LedgerNotFoundError):
                if tier != "hot" or attempt == 1:
                    raise  # the hot copy went away: the record now says where the data is
            finally:
                if tier == "hot":
                    h.close()
        raise AssertionError("unreachable")

    def read(
        self, topic: str | TopicName, start: Position | None = None, end: Position | None = None
    ) -> Iterator[tuple[Position, bytes]]:
        """Every entry from start to end (inclusive; None = topic start / last confirmed entry)."""
        t = topic if isinstance(topic, TopicName) else TopicName.parse(topic)
        info, _ = self.ml.get_topic(t)
        for li in list(info.ledgerInfo):
            lid = li.ledgerId
            if start is not None and lid < start.ledger_id:
                continue
            if end is not None and lid > end.ledger_id:
                break
            tier, h = self._open_with_fallback(t, lid)
            try:
                lac = h.last_add_confirmed
                first = start.entry_id if start is not None and lid == start.ledger_id else 0
                last = min(lac, end.entry_id) if end is not None and lid == end.ledger_id else lac
                self.tier_reads[tier] += 1
                e = first
                while e <= last:
                    hi = min(e + self.batch_entries - 1, last)
                    for entry in self._read_batch(t, lid, tier, h, e, hi):
                        yield Position(lid, entry.entry_id), entry.data
                    e = hi + 1
            finally:
                if tier == "hot":
                    h.close()

    def _open_with_fallback(self, t: TopicName, lid: int) -> tuple[str, ReadHandle]:
        try:
            return self.open_ledger(t, lid)
        except LedgerNotFoundError:
            # hot copy deleted between reading the record and opening it: the record has moved on
            return self.open_ledger(t, lid)

    def _read_batch(self, t: TopicName, lid: int, tier: str, h: ReadHandle, first: int, last: int) -> list[Entry]:
        try:
            return h.read(first, last)
        except (StaleHandleError, LedgerNotFoundError):
            if tier != "hot":
                raise
            return self.read_ledger(t, lid, first, last)
