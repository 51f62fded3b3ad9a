"""The compaction executor (docs/compaction.md): a planned batch of small offloaded objects of one topic
repacked into large PIP-76 segments, through the topic-record protocol (:mod:`tieredcore.offload.transaction`).
Data and read results never change; only the layout does. Which batches are worth it is decided by
:mod:`tieredcore.lifecycle.compaction` (the planner handed to :class:`Compactor`).

Per batch, under the topic's lease (:class:`Compactor`):

1. **assign** — CAS an incomplete ``offloadSegment`` entry naming the new uuid on the batch's first
   ledger, only if every ledger of the batch is still held by the objects planned from. From here a
   crash leaves a reference the next run (or a streaming offload) cleans up: record, then drop.
2. **write** — stream the old objects' entries (sequential ranged GETs, a few MiB per read) through a
   block former into the new segment (multipart, bounded memory, index last); the entries read are
   checked against the topic record (count and bytes per ledger) and digested (CRC32C over each
   entry's id, length and payload, per ledger).
3. **verify** — read the new segment back and compare, per ledger: entry count, payload bytes and the
   digest; the index sections must hold what the topic record says.
4. **record** — the old objects go to the deletion log with ``next attempt = now + delete delay`` so
   readers that opened them before the switch can finish (phase 1 of two-phase deletion comes before
   the metadata change; if the switch then fails the drain finds them still in use and keeps them).
5. **switch** — one CAS on the topic record: each ledger of the batch loses its old references (a V1
   offload context uuid; segment entries) and gains completed ``offloadSegment`` entries for the new
   segment(s), keeping its original offload time; only if nothing changed meanwhile (an offload, a
   retention trim, another compaction, a repair). A conflict or failure takes our assignment back
   and sends our new objects to the deletion log; an unknown outcome (metadata-store error) deletes
   and records nothing.
"""

from __future__ import annotations

import logging
import time
import uuid as uuidlib
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import crc32c

from tieredcore.clock import now_ms
from tieredcore.cold.failures import StoreFailureBudget
from tieredcore.cold.transformed import TransformedBlobStore
from tieredcore.errors import (
    CorruptObjectError,
    LeaseHeldError,
    TieredError,
)
from tieredcore.formats.constants import (
    ENTRY_HEADER_SIZE,
)
from tieredcore.formats.keys import INDEX_SUFFIX
from tieredcore.formats.proto import MLDataFormats_pb2 as pb
from tieredcore.formats.segment import BlockFormer, FormedBlock
from tieredcore.formats.uuids import uuid_to_msb_lsb
from tieredcore.meta.deletion_log import TYPE_SEGMENT, DeletionLog
from tieredcore.meta.leases import TopicLeases
from tieredcore.meta.managed_ledgers import ManagedLedgerStore
from tieredcore.meta.reasons import Reason
from tieredcore.names import TopicName
from tieredcore.offload.batches import (
    Batch,
    compacted_bytes,
    piece_bytes,
    repackable,
)
from tieredcore.offload.context import (
    LedgerInfo,
    add_segment,
    context_uuid,
    covering_offloaded_ms,
    driver_dict,
    incomplete_segment_uuids,
    is_complete,
    referenced_uuids,
    uuid_from_halves,
)
from tieredcore.offload.copies import CopyHandle, copy_uuids
from tieredcore.offload.segments import OffloadedSegment, SegmentOffloader, SegmentSink
from tieredcore.offload.transaction import (
    ObjectGroup,
    Refusal,
    Refused,
    TopicTransaction,
    Uncovered,
    drop_incomplete_segments,
    settle,
    stale_segments,
)
from tieredcore.outcomes import Outcome
from tieredcore.policy import (
    DEFAULT_COMPACTION_DELETE_DELAY_MS,
    DEFAULT_COMPACTION_MIN_OBJECT_SIZE,
    DEFAULT_COMPACTION_TARGET_SIZE,
)

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_DELETE_DELAY_MS",
    "DEFAULT_MIN_OBJECT_SIZE",
    "DEFAULT_TARGET_SIZE",
    "OK_OUTCOMES",
    "OUTCOMES",
    "READ_BYTES",
    "CompactionResult",
    "Compactor",
    "Planner",
]

DEFAULT_MIN_OBJECT_SIZE = DEFAULT_COMPACTION_MIN_OBJECT_SIZE
DEFAULT_TARGET_SIZE = DEFAULT_COMPACTION_TARGET_SIZE
DEFAULT_DELETE_DELAY_MS = DEFAULT_COMPACTION_DELETE_DELAY_MS
READ_BYTES = 4 * 1024 * 1024  # entries read from an old object per request batch (memory bound)


OUTCOMES = (Outcome.COMPACTED, Outcome.WOULD_COMPACT, Outcome.CONFLICT, Outcome.FAILED, Outcome.UNKNOWN,
            Outcome.BUSY, Outcome.ABORTED)
OK_OUTCOMES = (Outcome.COMPACTED, Outcome.WOULD_COMPACT, Outcome.BUSY)

# the batches worth compacting in a topic record, for new segments of blocks of this size
Planner = Callable[[pb.ManagedLedgerInfo, int], "list[Batch]"]

@dataclass
class CompactionResult:
    """One batch of one topic (a row of the run report)."""

    topic: str
    namespace: str
    outcome: str
    ledgers: list[int] = field(default_factory=list)
    units: int = 0  # old object pairs
    objects_before: int = 0
    bytes_before: int = 0  # exact once read, estimated in a dry run
    segments: list[str] = field(default_factory=list)  # new segment uuids
    objects_after: int = 0
    bytes_after: int = 0
    entries: int = 0
    payload_bytes: int = 0
    bytes_read: int = 0  # old objects' bytes fetched, then the new segments' read back
    requests: int = 0  # ranged GETs issued reading
    estimated: bool = False  # bytes from the topic record (dry run)
    transform: str = "none"  # of the new segment(s)
    retransformed: bool = False  # some old object had another transform (rewritten whatever its size)
    seconds: float = 0.0
    error: str | None = None
    error_type: str = ""

    @property
    def ok(self) -> bool:
        return self.outcome in OK_OUTCOMES

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _signature(li: LedgerInfo) -> tuple:
    """What the batch was planned from, per ledger: the switch lands only if it is unchanged."""
    return (li.entries, li.size, is_complete(li), context_uuid(li), tuple(copy_uuids(li)),
            tuple(sorted(referenced_uuids(li))))


@dataclass
class _Piece:
    ledger: int
    first: int
    last: int
    crc: int = 0
    payload: int = 0


@dataclass
class _Written:
    segment: OffloadedSegment
    pieces: list[_Piece]


class Compactor:
    """Compacts the topics of one namespace into the store (and with the settings) its policy names.

    ``segments``: where new segments go; ``open_copy(li, topic)``: a read handle on a ledger's current
    copy (:func:`~tieredcore.offload.copies.open_offloaded` over the workspace's stores); ``planner``: the
    batches worth compacting in a topic record (:func:`tieredcore.lifecycle.compaction.plan_topic` with
    the policy's thresholds)."""

    def __init__(self, ml: ManagedLedgerStore, segments: SegmentOffloader,
                 open_copy: Callable[[LedgerInfo, str], CopyHandle], *, planner: Planner,
                 deletion_log: DeletionLog, leases: TopicLeases | None = None, clock_ms: Callable[[], int] = now_ms,
                 uuid_factory: Callable[[], uuidlib.UUID] = uuidlib.uuid4,
                 min_object_size: int = DEFAULT_MIN_OBJECT_SIZE, target_size: int = DEFAULT_TARGET_SIZE,
                 delete_delay_ms: int = DEFAULT_DELETE_DELAY_MS, transform: str = "none",
                 on_step: Callable[[str, str], None] | None = None,
                 progress: Callable[[str, int, int], None] | None = None,
                 reason: Reason = Reason.COMPACTION) -> None:
        self.ml = ml
        self.reason = reason  # why the old objects go (a repair: the damaged segments)
        self.segments = segments
        self.open_copy = open_copy
        self.planner = planner
        self.deletion_log = deletion_log
        self.leases = leases
        self.clock_ms = clock_ms
        self.uuid_factory = uuid_factory
        self.min_object_size = min_object_size
        self.target_size = target_size
        self.delete_delay_ms = delete_delay_ms
        self.transform = transform
        # (step, uuid) after each step: assigned, written, verified, recorded, switched (crash tests)
        self.on_step = on_step
        self.progress = progress  # (topic, bytes written, bytes planned)

    def _driver(self) -> pb.OffloadDriverMetadata:
        return self.segments.off.location.driver_metadata()

    def _stored(self, seg: OffloadedSegment) -> int:
        """Bytes a new segment takes in the store (transformed: chunks and manifests)."""
        store = self.segments.store
        return (_stored_bytes(store, seg.data_key, seg.data_length)
                + _stored_bytes(store, seg.index_key, seg.index_length))

    def plan(self, topic: str | TopicName) -> list[Batch]:
        """The batches the planner finds in the topic's record now."""
        info, _ = self.ml.get_topic(TopicName.parse(topic))
        return self.planner(info, self.segments.block_size)

    def compact_topic(self, topic: str | TopicName, *, dry_run: bool = False,
                      budget: StoreFailureBudget | None = None) -> list[CompactionResult]:
        """Plan and compact the topic's batches, oldest first, under its lease (a dry run plans only).
        Stops at the first batch that does not land; the rest is retried next run."""
        t = TopicName.parse(topic)
        if dry_run:
            return [self._row(t, b, Outcome.WOULD_COMPACT, estimated=True) for b in self.plan(t)]
        if self.leases is None:
            return self._compact(t, budget, None)
        try:
            with self.leases.hold(t, "compaction") as held:
                return self._compact(t, budget, held.renew)
        except LeaseHeldError as e:
            return [CompactionResult(t.managed_ledger_name, t.namespace_name, Outcome.BUSY, error=str(e))]

    def _row(self, t: TopicName, b: Batch, outcome: str, estimated: bool = False) -> CompactionResult:
        return CompactionResult(
            t.managed_ledger_name, t.namespace_name, outcome, ledgers=list(b.ledgers), units=len(b.units),
            objects_before=b.objects_before, bytes_before=b.bytes_before,
            objects_after=2 * b.objects_after if estimated else 0, bytes_after=b.bytes_after if estimated else 0,
            entries=b.entries, payload_bytes=b.payload_bytes, estimated=estimated, transform=b.transform,
            retransformed=b.retransform)

    def _compact(self, t: TopicName, budget: StoreFailureBudget | None,
                 renew: Callable[[], None] | None) -> list[CompactionResult]:
        name = t.managed_ledger_name
        try:
            self._clear_stale(TopicTransaction(self.ml, self.deletion_log, t, clock_ms=self.clock_ms))
            batches = self.plan(t)
        except TieredError as e:
            return [CompactionResult(name, t.namespace_name, Outcome.FAILED, error=f"planning: {type(e).__name__}: {e}",
                                     error_type=type(e).__name__)]
        out: list[CompactionResult] = []
        for i, b in enumerate(batches):
            if budget is not None and budget.exhausted:
                row = self._row(t, b, Outcome.ABORTED)
                row.error = budget.reason
                out.append(row)
                continue
            row = self.compact_batch(t, b)
            if budget is not None:
                budget.record(row.error_type if not row.ok else "", row.error or "")
            out.append(row)
            if not row.ok:
                break
            if renew is not None and i + 1 < len(batches):
                try:
                    renew()
                except LeaseHeldError as e:  # expired and taken over: keep what landed, leave the rest
                    for rest in batches[i + 1:]:
                        busy = self._row(t, rest, Outcome.BUSY)
                        busy.error = str(e)
                        out.append(busy)
                    break
        return out

    # -- one batch ----------------------------------------------------------------------------

    def compact_batch(self, topic: str | TopicName, batch: Batch) -> CompactionResult:
        t = TopicName.parse(topic)
        started = time.monotonic()
        row = self._row(t, batch, Outcome.FAILED)
        txn = TopicTransaction(self.ml, self.deletion_log, t, clock_ms=self.clock_ms)
        planned = self._planned(t, batch)
        if isinstance(planned, Refused):
            settle(row, planned)
            return self._finish(row, started)
        lis, expected = planned
        assigned: list[str] = []
        sinks: list[SegmentSink] = []
        try:
            written = self._write(txn, lis, expected, assigned, sinks, row)
            for w in written:
                self._verify(txn.name, w, row)
                self._step("verified", w.segment.uuid)
        except Refusal as e:
            row.outcome, row.error = Outcome.CONFLICT, e.reason
            self._give_back(txn, batch, assigned, sinks)
            return self._finish(row, started)
        except Exception as e:
            row.outcome, row.error, row.error_type = Outcome.FAILED, f"{type(e).__name__}: {e}", type(e).__name__
            self._give_back(txn, batch, assigned, sinks)
            return self._finish(row, started)
        row.segments = [w.segment.uuid for w in written]
        row.objects_after = 2 * len(written)
        row.bytes_after = sum(self._stored(w.segment) for w in written)

        # phase 1 of two-phase deletion, before the switch: the old objects, due after the delay
        now = self.clock_ms()
        try:
            txn.record([u.group().record(txn.name, self.reason, now, now + self.delete_delay_ms)
                        for u in batch.units])
        except TieredError as e:
            row.outcome, row.error, row.error_type = Outcome.FAILED, f"recording the old objects: {e}", type(e).__name__
            self._give_back(txn, batch, assigned, [])
            return self._finish(row, started)
        self._step("recorded", assigned[0])

        step = txn.commit(self._switch(batch, written, expected, assigned), "switching to the new segment",
                          lambda: self._give_back(txn, batch, assigned, []))
        if settle(row, step, Outcome.COMPACTED):
            for u in assigned:
                self._step("switched", u)
        return self._finish(row, started)

    def _planned(self, t: TopicName, batch: Batch) -> tuple[list[LedgerInfo], dict[int, tuple]] | Refused:
        """The batch's ledgers (detached copies) and what each was planned from, if every one is still
        repackable."""
        info, _ = self.ml.get_topic(t)
        by_id = _by_id(info)
        expected: dict[int, tuple] = {}
        lis: list[LedgerInfo] = []
        for lid in batch.ledgers:
            li = by_id.get(lid)
            if li is None or not repackable(li):
                return Refused(f"ledger {lid} changed since planned")
            expected[lid] = _signature(li)
            c = LedgerInfo()
            c.CopyFrom(li)
            lis.append(c)
        return lis, expected

    def _switch(self, batch: Batch, written: list[_Written], expected: dict[int, tuple],
                assigned: list[str]) -> Callable[[pb.ManagedLedgerInfo], bool]:
        """Step 5's mutation: the batch's ledgers trade their old references for the new segments, only
        if nothing changed since planned and our assignment is still there."""
        driver = self._driver()
        new_msb_lsb = {u: uuid_to_msb_lsb(uuidlib.UUID(u)) for u in assigned}
        plan: dict[int, list[tuple[str, int]]] = {}
        for w in written:
            for p in w.pieces:
                plan.setdefault(p.ledger, []).append((w.segment.uuid, p.last))

        def switch(info) -> bool:
            now = self.clock_ms()
            by_id = _by_id(info)
            for lid in batch.ledgers:
                li = by_id.get(lid)
                if li is None:
                    raise Refusal(f"ledger {lid} is no longer in the topic (trimmed?)")
                if _signature_without(li, set(assigned)) != expected[lid]:
                    raise Refusal(f"ledger {lid} changed meanwhile (offloaded, repaired or compacted again)")
                if lid == batch.ledgers[0] and set(incomplete_segment_uuids(li)) & set(assigned) != set(assigned):
                    raise Refusal("our segment assignment is gone (cleaned up by another runner)")
            for lid in batch.ledgers:
                li = by_id[lid]
                offloaded_ms = (li.offloadContext.timestamp if is_complete(li) else covering_offloaded_ms(li)) or now
                ctx = li.offloadContext
                if is_complete(li):
                    for f in ("uidMsb", "uidLsb", "driverMetadata"):
                        ctx.ClearField(f)
                    ctx.complete = False
                del ctx.offloadSegment[:]
                for u, last in plan[lid]:
                    add_segment(li, new_msb_lsb[u], last, driver, now, offloaded_ms)
            return True

        return switch

    def _assign(self, txn: TopicTransaction, first_ledger: int, expected: dict[int, tuple],
                assigned: list[str]) -> str:
        """Step 1 for one new segment: its uuid on the batch's first ledger, if nothing changed. Raises
        Refusal when something did."""
        new = str(self.uuid_factory())
        msb, lsb = uuid_to_msb_lsb(uuidlib.UUID(new))
        driver = self._driver()

        def assign(info) -> bool:
            by_id = _by_id(info)
            for lid, sig in expected.items():
                li = by_id.get(lid)
                if li is None or _signature_without(li, set(assigned)) != sig:
                    raise Refusal(f"ledger {lid} changed since planned")
            li = by_id[first_ledger]
            add_segment(li, (msb, lsb), li.entries - 1, driver, self.clock_ms())
            return True

        step = txn.cas(assign)
        if isinstance(step, Refused):
            raise Refusal(step.reason)
        assigned.append(new)
        self._step("assigned", new)
        return new

    def _write(self, txn: TopicTransaction, lis: list[LedgerInfo], expected: dict[int, tuple],
               assigned: list[str], sinks: list[SegmentSink], row: CompactionResult) -> list[_Written]:
        """Steps 1-2: stream the ledgers' entries from their old objects into new segment(s), cut at the
        target size (normally one)."""
        out = _SegmentCutter(self, txn, lis, expected, assigned, sinks)
        measured: dict[str, int] = {}
        for li in lis:
            h = self.open_copy(li, txn.name)
            try:
                n, payload = out.add_ledger(li, h)
                row.bytes_read += h.bytes_fetched + h.index_bytes
                row.requests += h.requests
                for x in h.object_handles():
                    measured[x.key] = (_stored_bytes(x.store, x.key, x.index.data_object_length)
                                       + _stored_bytes(x.store, x.key + INDEX_SUFFIX, x.index_bytes))
            finally:
                h.close()
            if n != li.entries or (li.HasField("size") and payload != li.size):
                raise CorruptObjectError(f"ledger {li.ledgerId}: its offloaded copy holds {n} entries, {payload} "
                                         f"bytes; the topic's metadata says {li.entries}, {li.size}")
        row.bytes_before = sum(measured.values()) or row.bytes_before
        return out.finish()

    def _verify(self, name: str, w: _Written, row: CompactionResult) -> None:
        """Step 3: read the new segment back; every ledger's entries must equal what was read."""
        handles = self.segments.open_pieces(w.segment.uuid, [(p.ledger, p.first, p.last) for p in w.pieces], name)
        row.bytes_read += handles[0].index_bytes if handles else 0  # the index, read once
        for p, h in zip(w.pieces, handles, strict=True):
            try:
                crc, payload, n = 0, 0, 0
                step = max(1, READ_BYTES // max(1, (p.payload // (p.last - p.first + 1)) + ENTRY_HEADER_SIZE))
                for first in range(p.first, p.last + 1, step):
                    b = h.read_batch(first, min(first + step - 1, p.last))
                    with b.frames() as frames:  # the batch's frames back to back: one CRC call
                        crc = crc32c.crc32c(frames, crc)
                    payload += b.payload_bytes
                    n += len(b)
                row.bytes_read += h.bytes_fetched
                row.requests += h.requests
            finally:
                h.close()
            if (n, payload, crc) != (p.last - p.first + 1, p.payload, p.crc):
                raise CorruptObjectError(
                    f"segment {w.segment.uuid}, ledger {p.ledger}: read back {n} entries, {payload} bytes, "
                    f"crc32c {crc:08x}; written {p.last - p.first + 1} entries, {p.payload} bytes, crc32c {p.crc:08x}")

    # -- cleanup ------------------------------------------------------------------------------

    def _clear_stale(self, txn: TopicTransaction) -> None:
        """Incomplete segment entries found under the lease are crashed attempts (ours or a streaming
        offload's): each to the deletion log, then off the topic record."""
        driver = driver_dict(self._driver())

        def clear(info) -> bool:
            stale = stale_segments(info, driver)
            missing = [g for g in stale if g.key not in txn.covered]
            if missing:
                raise Uncovered([g.record(txn.name, Reason.OFFLOAD_CLEANUP, self.clock_ms()) for g in missing])
            return drop_incomplete_segments(info, {g.uuid for g in stale})

        txn.cover_and_cas(clear, "clearing crashed segment attempts")

    def _give_back(self, txn: TopicTransaction, batch: Batch, assigned: list[str],
                   sinks: Iterable[SegmentSink]) -> None:
        """After a conflict or failure: abort unfinished uploads, take our assignments off the topic,
        then send our segments to the deletion log."""
        for s in sinks:
            s.abort()
        driver = driver_dict(self._driver())
        txn.give_back([ObjectGroup(batch.ledgers[0], TYPE_SEGMENT, u, driver) for u in assigned],
                      Reason.COMPACTION_CONFLICT, unassign=True)

    def _step(self, step: str, uuid: str) -> None:
        if self.on_step is not None:
            self.on_step(step, uuid)

    @staticmethod
    def _finish(row: CompactionResult, started: float) -> CompactionResult:
        row.seconds = round(time.monotonic() - started, 6)
        (log.info if row.ok else log.warning)("compaction %s ledgers %s: %s%s", row.topic,
                                              f"{row.ledgers[0]}..{row.ledgers[-1]}" if row.ledgers else "-",
                                              row.outcome, f" ({row.error})" if row.error else "")
        return row


def _signature_without(li: LedgerInfo, ours: set[str]) -> tuple:
    """:func:`_signature` of a ledger as it was before our own (incomplete) assignments were added."""
    if not ours or not any(u in ours for u in incomplete_segment_uuids(li)):
        return _signature(li)
    c = LedgerInfo()
    c.CopyFrom(li)
    segs = c.offloadContext.offloadSegment
    keep = [s for s in segs if s.complete or uuid_from_halves(s.uidMsb, s.uidLsb) not in ours]
    del segs[:]
    segs.extend(keep)
    return _signature(c)


def _by_id(info: pb.ManagedLedgerInfo) -> dict[int, LedgerInfo]:
    """The topic record's LedgerInfos by id (live references, the first of an id as find_ledger): one
    pass, where looking each ledger of a batch of thousands of small ledgers up in the list would be
    quadratic."""
    out: dict[int, LedgerInfo] = {}
    for li in info.ledgerInfo:
        out.setdefault(li.ledgerId, li)
    return out


def _stored_bytes(store: Any, key: str, logical: int) -> int:
    """Bytes an object takes in its store (transformed: chunks + manifest; else its length)."""
    if isinstance(store, TransformedBlobStore):
        return store.stored_bytes(key)
    return logical


class _SegmentCutter:
    """Step 2's writer for one batch: blocks formed from the ledgers' entries go into new segments, a new
    one (assigned first, step 1) whenever the current one would pass the target size — but not before
    planning would take it for one of at least the min object size: its estimate leaves out padding and
    block headers, and a batch cut into segments planning still finds small would be rewritten by every
    run. Each ledger's entries are digested per segment piece (CRC32C of the frames) for step 3."""

    def __init__(self, c: Compactor, txn: TopicTransaction, lis: list[LedgerInfo], expected: dict[int, tuple],
                 assigned: list[str], sinks: list[SegmentSink]) -> None:
        self.c, self.txn, self.expected, self.assigned, self.sinks = c, txn, expected, assigned, sinks
        self.first_ledger = lis[0].ledgerId
        self.by_id = {li.ledgerId: li for li in lis}
        self.former = BlockFormer(c.segments.block_size, pad_last=False)
        self.out: list[_Written] = []
        self.sink: SegmentSink | None = None
        self.pieces: list[_Piece] = []
        self.estimated = 0  # planning's estimate of the current segment's pieces but the last
        self.size_through: dict[int, int] = {}
        self.total = sum(compacted_bytes(li.entries, li.size, c.segments.block_size) for li in lis)
        self.done = 0

    def add_ledger(self, li: LedgerInfo, h: CopyHandle) -> tuple[int, int]:
        """Every entry of ``li`` read from its old copy ``h`` in batches of about READ_BYTES; returns the
        entries and payload bytes read."""
        n, payload = 0, 0
        step = max(1, READ_BYTES // max(1, li.size // max(1, li.entries) + ENTRY_HEADER_SIZE))
        for first in range(0, li.entries, step):
            b = h.read_batch(first, min(first + step - 1, li.entries - 1))
            for closed in self.former.add_batch(b):
                self._put(closed)
            n += len(b)
            payload += b.payload_bytes
        tail = self.former.flush()
        if tail is not None:
            self._put(tail)
        return n, payload

    def finish(self) -> list[_Written]:
        if self.sink is not None:
            self._close()
        return self.out

    def _estimate(self, p: _Piece) -> int:
        return piece_bytes(self.by_id[p.ledger], p.last - p.first + 1)

    def _close(self) -> None:
        assert self.sink is not None
        last = {p.ledger: p.last for p in self.pieces}
        seg = self.sink.finish(
            sizes={lid: self.size_through[lid] for lid in last},
            timestamps={lid: self.by_id[lid].timestamp for lid in last if last[lid] == self.by_id[lid].entries - 1})
        self.out.append(_Written(seg, self.pieces))
        self.c._step("written", seg.uuid)
        self.sink, self.pieces, self.estimated = None, [], 0

    def _put(self, blk: FormedBlock) -> None:
        c = self.c
        if self.sink is not None and not self.sink.empty and self.sink.length + blk.block_size > c.target_size \
                and self.estimated + self._estimate(self.pieces[-1]) >= c.min_object_size:
            self._close()
        if self.sink is None:
            u = c._assign(self.txn, self.first_ledger, self.expected, self.assigned)
            self.sink = c.segments.sink(u, {"managedledgername": self.txn.name})
            self.sinks.append(self.sink)
        if not self.pieces or self.pieces[-1].ledger != blk.ledger_id:
            if self.pieces:
                self.estimated += self._estimate(self.pieces[-1])
            self.pieces.append(_Piece(blk.ledger_id, blk.first_entry, blk.last_entry))
        p = self.pieces[-1]
        p.last = blk.last_entry
        p.crc = crc32c.crc32c(blk.frames, p.crc)
        p.payload += sum(blk.sizes)
        self.size_through[blk.ledger_id] = self.size_through.get(blk.ledger_id, 0) + sum(blk.sizes)
        self.sink.add(blk)
        self.done += blk.block_size
        if c.progress is not None:
            c.progress(self.txn.name, self.done, self.total)
