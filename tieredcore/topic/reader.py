"""Cross-tier topic reader (read priority: docs/metadata.md), falling back to the other copy when one cannot be read.

`tiered-storage-first` (default): a ledger with a complete object-store copy is read from the object
store, others from the hot tier. `bookkeeper-first`: the hot copy while it exists. A complete copy is a
complete V1 offload or, for a sealed ledger, completed PIP-76 segments holding every entry of it
(:func:`tieredcore.offload.copies.open_offloaded`). A ledger only partly held by segments (the open
ledger streamed up to some entry) is read from the hot tier, its covered entries falling back to the
segments. The topic record is read
afresh for every ledger so a hot copy removed by the deletion lag is never read through a stale handle:
if a hot read fails because the ledger is gone, the reader re-reads the record and switches tier.

Every copy is checked before it is trusted: an offloaded copy's index must describe this ledger of this
topic (entries, size, ledger id, topic name) and its chunks must pass their checksums; a hot copy must
hold the entries the topic lists, each passing its CRC32C. When the preferred copy cannot be read
(missing objects, a damaged index or chunk, a store error, a corrupt hot ledger) and the other copy
exists, the reader continues from the same entry on the other copy, logs which, and counts it
(``fallbacks``; the CLI and run reports show it). Only when no copy can be read does the read fail.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from tieredcore.errors import (
    BlobStoreError,
    CorruptEntryError,
    FormatError,
    HotLedgerNotFoundError,
    InBookKeeperError,
    LedgerStateError,
    NotFoundError,
    TieredError,
    ValidationError,
)
from tieredcore.formats import constants as C
from tieredcore.formats.compacted import parse_compacted_ledger_entry
from tieredcore.formats.mlinfo import LedgerInfo
from tieredcore.hot.tier import HotTier
from tieredcore.meta.managed_ledgers import ManagedLedgerStore, find_ledger
from tieredcore.model import Entry, EntryBatch, Position, ReadHandle
from tieredcore.names import TopicName
from tieredcore.offload.compacted_state import compaction_state
from tieredcore.offload.context import driver_metadata_from_dict, is_offloaded
from tieredcore.offload.copies import copy_key, has_offloaded_copy, open_offloaded
from tieredcore.offload.offloader import LedgerOffloader
from tieredcore.offload.segments import SegmentLedgerHandle
from tieredcore.policy import READ_PRIORITIES, TIERED_FIRST

log = logging.getLogger(__name__)

TIER_HOT = "hot"
TIER_OFFLOADED = "offloaded"
TIER_SEGMENTS = "segments"  # how TopicReader.read_tiered_batches names an offloaded copy held by segments

# failures of one copy that another copy may not share (a bad range or bad input is the caller's)
COPY_FAILURES = (NotFoundError, FormatError, BlobStoreError, CorruptEntryError, LedgerStateError)
MAX_FALLBACK_NOTES = 100


class TopicReader:
    def __init__(
        self,
        ml: ManagedLedgerStore,
        hot: HotTier,
        offloader: LedgerOffloader,
        read_priority: str = TIERED_FIRST,
        batch_entries: int = 1000,
        offloader_for_driver: Callable[[Any], LedgerOffloader] | None = None,
        skip_in_bookkeeper: bool = False,
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
        self._offloaded: dict[tuple[int, Any], ReadHandle] = {}  # (ledger id, copy_key): its current copy
        self.tier_reads = {TIER_HOT: 0, TIER_OFFLOADED: 0}  # ledgers read per tier (observability)
        self.fallbacks = 0  # times a read went on from the other copy because one could not be read
        self.fallback_notes: list[str] = []  # what happened, for reports (the first MAX_FALLBACK_NOTES)
        # an attached Pulsar cluster's ledgers that only its BookKeeper holds: skipped by read() and
        # read_batches() (listed here, oldest first) instead of raising InBookKeeperError
        self.skip_in_bookkeeper = skip_in_bookkeeper
        self.in_bookkeeper: list[int] = []

    def close(self) -> None:
        for h in self._offloaded.values():
            h.close()
        self._offloaded.clear()

    # -- one copy -----------------------------------------------------------------------------

    def _tiers(self, li: LedgerInfo) -> list[str]:
        """The copies to try, in order. A hot copy marked deleted is still tried last: until the drain
        removes it, it can rescue a read of a damaged offloaded copy."""
        if not is_offloaded(li):
            # no complete copy: the hot one, then the segments for the entries they hold (if any)
            return [TIER_HOT, TIER_OFFLOADED] if has_offloaded_copy(li) else [TIER_HOT]
        if self.read_priority == TIERED_FIRST or li.offloadContext.bookkeeperDeleted:
            return [TIER_OFFLOADED, TIER_HOT]
        return [TIER_HOT, TIER_OFFLOADED]

    def _open_tier(self, t: TopicName, li: LedgerInfo, tier: str) -> ReadHandle:
        if tier == TIER_OFFLOADED:
            return self._offloaded_handle(t, li)
        h = self.hot.open_ledger(li.ledgerId)
        try:
            _check_hot(h, t, li)
        except BaseException:
            h.close()
            raise
        return h

    def _offloaded_handle(self, t: TopicName, li: LedgerInfo) -> ReadHandle:
        k = (li.ledgerId, copy_key(li))
        h = self._offloaded.get(k)
        if h is None:
            h = open_offloaded(li, self.offloader, t.managed_ledger_name, self.offloader_for_driver,
                               cached_index=True)
            # a copy replaced since (a repair, one more segment of a streamed ledger) is not read again
            for old in [x for x in self._offloaded if x[0] == li.ledgerId]:
                self._offloaded.pop(old).close()
            self._offloaded[k] = h
        return h

    def _note(self, text: str) -> None:
        self.fallbacks += 1
        log.warning("%s", text)
        if len(self.fallback_notes) < MAX_FALLBACK_NOTES:
            self.fallback_notes.append(text)

    # -- public -------------------------------------------------------------------------------

    def open_ledger(self, topic: TopicName, ledger_id: int) -> tuple[str, ReadHandle]:
        """(tier, handle) for one ledger of the topic, following the read priority and falling back to
        the other copy when the preferred one cannot be opened."""
        s = _LedgerSession(self, topic, self._ledger_info(topic, ledger_id))
        s.open()
        assert s.tier is not None and s.handle is not None
        return s.tier, s.handle

    def read_ledger(self, topic: str | TopicName, ledger_id: int, first: int, last: int) -> list[Entry]:
        t = topic if isinstance(topic, TopicName) else TopicName.parse(topic)
        s = _LedgerSession(self, t, self._ledger_info(t, ledger_id))
        try:
            s.open()
            return s.read(first, last)
        finally:
            s.close()

    def read(
        self, topic: str | TopicName, start: Position | None = None, end: Position | None = None
    ) -> Iterator[tuple[Position, bytes]]:
        """Every entry from start to end (inclusive; None = topic start / last confirmed entry)."""
        for lid, s, first, last in self._ranges(topic, start, end):
            for entry in s.read(first, last):
                yield Position(lid, entry.entry_id), entry.data

    def read_compacted(
        self, topic: str | TopicName, start: Position | None = None
    ) -> Iterator[tuple[Position, bytes]]:
        """The compacted view (Pulsar's ``readCompacted``): the compacted ledger's entries at their original
        positions up to the compaction horizon, then the topic's entries after it; from ``start`` on (None:
        the beginning). A topic never compacted reads as :meth:`read`."""
        t = topic if isinstance(topic, TopicName) else TopicName.parse(topic)
        info, _ = self.ml.get_topic(t)
        state = compaction_state(info)
        if state is None:
            yield from self.read(t, start)
            return
        if not state.empty and (start is None or start <= state.horizon):
            off = self.offloader
            if state.driver and self.offloader_for_driver is not None:
                off = self.offloader_for_driver(driver_metadata_from_dict(state.driver))
            h = off.read_offloaded(state.ledger_id, state.uuid)
            try:
                e = 0 if start is None else _first_at_or_after(h, start)
                while e <= h.last_add_confirmed:
                    hi = min(e + self.batch_entries - 1, h.last_add_confirmed)
                    for entry in h.read(e, hi):
                        lid, eid, _partition, data = parse_compacted_ledger_entry(entry.data)
                        if start is None or Position(lid, eid) >= start:
                            yield Position(lid, eid), bytes(data)
                    e = hi + 1
            finally:
                h.close()
        after = Position(state.horizon.ledger_id, state.horizon.entry_id + 1)
        yield from self.read(t, after if start is None or start < after else start)

    def read_batches(
        self, topic: str | TopicName, start: Position | None = None, end: Position | None = None
    ) -> Iterator[EntryBatch]:
        """The same entries as EntryBatches of up to ``batch_entries`` entries of one ledger each (catch-up
        readers: no object per entry)."""
        for _lid, s, first, last in self._ranges(topic, start, end):
            yield s.read_batch(first, last)

    def read_tiered_batches(
        self, topic: str | TopicName, start: Position | None = None, end: Position | None = None
    ) -> Iterator[tuple[str, EntryBatch]]:
        """As :meth:`read_batches`, each batch with the copy it was read from: ``hot``, ``offloaded`` (a V1
        object) or ``segments`` (PIP-76 segments), after any fallback."""
        for _lid, s, first, last in self._ranges(topic, start, end):
            batch = s.read_batch(first, last)
            tier = s.tier
            if tier == TIER_OFFLOADED and isinstance(s.handle, SegmentLedgerHandle):
                tier = TIER_SEGMENTS
            yield tier or TIER_HOT, batch

    def _ranges(
        self, topic: str | TopicName, start: Position | None, end: Position | None
    ) -> Iterator[tuple[int, _LedgerSession, int, int]]:
        """(ledger id, its open session, first, last) of each read of up to ``batch_entries`` entries from
        start to end; each ledger's session is closed when its reads are done (or the caller stops)."""
        t = topic if isinstance(topic, TopicName) else TopicName.parse(topic)
        info, _ = self.ml.get_topic(t)
        for li in list(info.ledgerInfo):
            lid = li.ledgerId
            if start is not None and lid < start.ledger_id:
                continue
            if end is not None and lid > end.ledger_id:
                break
            s = _LedgerSession(self, t, li)
            try:
                try:
                    h = s.open()
                except InBookKeeperError:
                    if not self.skip_in_bookkeeper:
                        raise
                    self.in_bookkeeper.append(lid)
                    continue
                lac = h.last_add_confirmed
                first = start.entry_id if start is not None and lid == start.ledger_id else 0
                last = min(lac, end.entry_id) if end is not None and lid == end.ledger_id else lac
                e = first
                while e <= last:
                    hi = min(e + self.batch_entries - 1, last)
                    yield lid, s, e, hi
                    e = hi + 1
            finally:
                s.close()

    def _ledger_info(self, t: TopicName, ledger_id: int) -> LedgerInfo:
        info, _ = self.ml.get_topic(t)
        li = find_ledger(info, ledger_id)
        if li is None:
            raise HotLedgerNotFoundError(f"ledger {ledger_id} is not part of topic {t.managed_ledger_name}")
        return li


def _check_hot(h: ReadHandle, t: TopicName, li: LedgerInfo) -> None:
    """A hot copy must be the topic's ledger with the entries the topic lists (sealed ledgers)."""
    owner = h.metadata.custom_metadata.get(C.CUSTOM_MANAGED_LEDGER_KEY)
    if owner is not None and owner.decode("utf-8", "replace") != t.managed_ledger_name:
        raise CorruptEntryError(f"hot ledger {li.ledgerId} belongs to {owner.decode('utf-8', 'replace')!r}, "
                                f"not {t.managed_ledger_name!r}")
    if li.timestamp > 0 and li.HasField("entries") and h.last_add_confirmed + 1 != li.entries:
        raise CorruptEntryError(f"hot ledger {li.ledgerId} holds {h.last_add_confirmed + 1} entries, the topic "
                                f"{t.managed_ledger_name} lists {li.entries}")


class _LedgerSession:
    """Reads of one ledger on one copy at a time; on a copy failure, the next copy from the same entry."""

    def __init__(self, reader: TopicReader, t: TopicName, li: LedgerInfo) -> None:
        self.r = reader
        self.t = t
        self.li = li
        self.tiers = reader._tiers(li)
        self.tried: list[tuple[str, TieredError]] = []
        self.refreshed = False
        self.tier: str | None = None
        self.handle: ReadHandle | None = None

    def open(self) -> ReadHandle:
        while True:
            todo = [x for x in self.tiers if x not in {tier for tier, _ in self.tried}]
            if not todo:
                if not self.refreshed and self._refresh():
                    continue
                self._raise()
            tier = todo[0]
            try:
                h = self.r._open_tier(self.t, self.li, tier)
            except COPY_FAILURES as e:
                self.tried.append((tier, e))
                continue
            if self.tried and not isinstance(self.tried[-1][1], InBookKeeperError):  # BookKeeper's: not damage
                failed, err = self.tried[-1]
                self.r._note(f"{self.t.managed_ledger_name} ledger {self.li.ledgerId}: the {failed} copy cannot "
                             f"be read ({type(err).__name__}: {err}); reading the {tier} copy")
            self.tier, self.handle = tier, h
            self.r.tier_reads[tier] += 1
            return h

    def read(self, first: int, last: int) -> list[Entry]:
        return self.read_batch(first, last).entries()

    def read_batch(self, first: int, last: int) -> EntryBatch:
        while True:
            assert self.handle is not None and self.tier is not None
            try:
                if isinstance(self.handle, SegmentLedgerHandle) and not self.handle.is_closed \
                        and last > self.handle.last_add_confirmed:
                    # segments holding a prefix of the ledger, reached after its hot copy failed
                    raise LedgerStateError(
                        f"ledger {self.li.ledgerId}: the offloaded segments hold entries 0.."
                        f"{self.handle.last_add_confirmed} only, not {first}..{last}")
                return self.handle.read_batch(first, last)
            except COPY_FAILURES as e:
                self.tried.append((self.tier, e))
                self._close_handle()
                self.open()

    def _refresh(self) -> bool:
        """The record may have moved on (an offload completed, the hot copy was removed by the lag):
        re-read it once and try the copies it now names."""
        self.refreshed = True
        try:
            info, _ = self.r.ml.get_topic(self.t)
        except NotFoundError:
            return False
        li = find_ledger(info, self.li.ledgerId)
        if li is None:
            return False
        self.li = li
        new = [x for x in self.r._tiers(li) if x not in {tier for tier, _ in self.tried}]
        if not new:
            return False
        self.tiers = new
        return True

    def _raise(self):
        tried = self.tried
        in_bk = [e for _, e in tried if isinstance(e, InBookKeeperError)]
        if in_bk:
            if not is_offloaded(self.li):
                raise in_bk[0]  # only Pulsar's BookKeeper holds it (a partial copy failing changes nothing)
            # an offloaded copy that cannot be read is the failure; BookKeeper is named after it
            tried = sorted(tried, key=lambda x: isinstance(x[1], InBookKeeperError))
        tier, first = tried[0]
        if len(tried) == 1:
            raise first
        others = "; ".join(f"the {t} copy: {type(e).__name__}: {e}" for t, e in tried[1:])
        raise type(first)(f"{first}; {others}") from first

    def _close_handle(self) -> None:
        if self.tier == TIER_HOT and self.handle is not None:
            self.handle.close()
        self.handle = None

    def close(self) -> None:
        self._close_handle()


def _first_at_or_after(h, start: Position) -> int:
    """The first entry of a compacted ledger (entries in position order) whose original position is at or
    after ``start``, by binary search, reading one entry per step (as Pulsar's CompactedTopicImpl
    ``findStartPoint`` does); last_add_confirmed + 1 when none is."""
    lo, hi = 0, h.last_add_confirmed + 1
    while lo < hi:
        mid = (lo + hi) // 2
        lid, eid, _partition, _data = parse_compacted_ledger_entry(h.read(mid, mid)[0].data)
        if Position(lid, eid) < start:
            lo = mid + 1
        else:
            hi = mid
    return lo
