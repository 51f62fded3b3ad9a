"""Compaction (docs/compaction.md): runs of small offloaded objects of one topic repacked into large
PIP-76 segments. Data and read results never change; only the layout does.

Planning (:func:`plan_topic`, the topic record only, no store request). A topic's sealed, fully
offloaded ledgers are grouped by the objects holding them (a segment spanning ledgers joins them into
one group). A group is *small* when each of its objects (a V1 ``{uuid}-ledger-{id}`` pair or a segment)
is estimated below ``compaction_min_object_size``. Consecutive small groups form a run; a run is cut at
ledger boundaries into batches of about ``compaction_target_size``, each becoming one new segment. A
batch that would not reduce the number of objects is left alone. A ledger with anything in flight
(an incomplete segment, a replacement being written, an abandoned attempt) is never touched.

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
import math
import time
import uuid as uuidlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import crc32c

from tieredcore.clock import now_ms
from tieredcore.cold.failures import StoreFailureBudget
from tieredcore.cold.location import CHUNKED_PROPERTY, TRANSFORM_PROPERTY
from tieredcore.cold.transformed import TransformedBlobStore
from tieredcore.errors import (
    CorruptObjectError,
    LeaseHeldError,
    MetadataStoreError,
    TieredError,
    ValidationError,
)
from tieredcore.formats.constants import (
    BLOCK_HEADER_LENGTH,
    DEFAULT_CHECKPOINT_INTERVAL,
    DEFAULT_CHECKSUM_CHUNK,
    DEFAULT_MAX_BLOCK_SIZE,
    ENTRY_HEADER_SIZE,
)
from tieredcore.formats.keys import INDEX_SUFFIX
from tieredcore.formats.proto import MLDataFormats_pb2 as pb
from tieredcore.formats.segment import BlockFormer, FormedBlock
from tieredcore.formats.uuids import uuid_to_msb_lsb
from tieredcore.meta.deletion_log import TYPE_OFFLOADED, TYPE_SEGMENT, DeletionLog, DeletionRecord
from tieredcore.meta.reasons import Reason
from tieredcore.names import TopicName
from tieredcore.offload.context import (
    LedgerInfo,
    context_uuid,
    covering_offloaded_ms,
    driver_dict,
    incomplete_segment_uuids,
    is_complete,
    is_offloaded,
    is_sealed,
    referenced_uuids,
    segment_drivers,
    segment_pieces,
    uuid_from_halves,
)
from tieredcore.offload.copies import copy_uuids
from tieredcore.offload.segments import S3_MIN_PART_SIZE, OffloadedSegment, SegmentOffloader, SegmentSink
from tieredcore.outcomes import Outcome
from tieredcore.policy import (
    DEFAULT_COMPACTION_DELETE_DELAY_MS,
    DEFAULT_COMPACTION_MIN_OBJECT_SIZE,
    DEFAULT_COMPACTION_TARGET_SIZE,
)

log = logging.getLogger(__name__)

__all__ = [
    "BLOCK_SIZE",
    "DEFAULT_DELETE_DELAY_MS",
    "DEFAULT_MIN_OBJECT_SIZE",
    "DEFAULT_TARGET_SIZE",
    "OUTCOMES",
    "Batch",
    "CompactionResult",
    "Compactor",
    "CostModel",
    "Unit",
    "plan_topic",
]

DEFAULT_MIN_OBJECT_SIZE = DEFAULT_COMPACTION_MIN_OBJECT_SIZE
DEFAULT_TARGET_SIZE = DEFAULT_COMPACTION_TARGET_SIZE
DEFAULT_DELETE_DELAY_MS = DEFAULT_COMPACTION_DELETE_DELAY_MS
# Blocks of compacted segments: entries are packed into blocks of up to this; a ledger's last block is
# not padded (BlockFormer pad_last=False), so a small ledger takes its own bytes, not a whole block
# (Pulsar's 5 MiB streaming blocks would pad every 100 KiB ledger to 5 MiB), and within a ledger the
# padding is less than one entry per block. Parts group blocks to the store's minimum part size.
BLOCK_SIZE = 4 * 1024 * 1024
READ_BYTES = 4 * 1024 * 1024  # entries read from an old object per request batch (memory bound)


OUTCOMES = (Outcome.COMPACTED, Outcome.WOULD_COMPACT, Outcome.CONFLICT, Outcome.FAILED, Outcome.UNKNOWN,
            Outcome.BUSY, Outcome.ABORTED)
OK_OUTCOMES = (Outcome.COMPACTED, Outcome.WOULD_COMPACT, Outcome.BUSY)

KIND_LEDGER = "ledger"  # a V1 object pair holding one ledger
KIND_SEGMENT = "segment"


# ================================================================================================
# planning
# ================================================================================================


@dataclass(frozen=True)
class Unit:
    """One offloaded object pair (data object + index) holding whole ledgers or parts of them."""

    kind: str  # KIND_LEDGER | KIND_SEGMENT
    uuid: str
    ledgers: tuple[int, ...]
    bytes: int  # estimated data-object bytes (from the topic record; exact ones are measured when read)
    driver: dict[str, Any]  # where it lies (a deletion record's driver)
    transform: str = "none"  # what it was written with (driver metadata: tieredTransform)


@dataclass(frozen=True)
class Batch:
    """Ledgers whose objects become one new segment."""

    ledgers: tuple[int, ...]
    units: tuple[Unit, ...]
    entries: int
    payload_bytes: int
    bytes_before: int  # estimated
    bytes_after: int  # estimated
    objects_after: int  # estimated new segments (normally 1)
    transform: str = "none"  # what the new segment is written with (the namespace policy's)

    @property
    def objects_before(self) -> int:
        return 2 * len(self.units)

    @property
    def retransform(self) -> bool:
        """Some old object was written with another transform than the policy's now."""
        return any(u.transform != self.transform for u in self.units)


def _index_bytes(frames: int, blocks: int, base: int) -> int:
    """About an index's size: a fixed part (``base``: V1 ≈ 448 with the ledger's metadata, a V2 section
    ≈ 112), 20 bytes per block, this project's checkpoints and chunk checksums at their defaults."""
    return (base + 20 * blocks + 22 * math.ceil(frames / DEFAULT_CHECKPOINT_INTERVAL)
            + 6 * math.ceil(frames / DEFAULT_CHECKSUM_CHUNK))


def _v1_bytes(li: LedgerInfo) -> int:
    """A V1 pair's size: data blocks of up to the default max block size (the last one unpadded) and
    the index."""
    frames = li.size + ENTRY_HEADER_SIZE * li.entries
    blocks = max(1, math.ceil(frames / (DEFAULT_MAX_BLOCK_SIZE - BLOCK_HEADER_LENGTH)))
    return frames + BLOCK_HEADER_LENGTH * blocks + _index_bytes(frames, blocks, 448)


def compacted_bytes(entries: int, payload: int, block_size: int = BLOCK_SIZE) -> int:
    """About what one ledger's entries take in a compacted segment: its frames, block headers (the
    padding of blocks within the ledger, less than an entry each, is left out) and its index section."""
    frames = payload + ENTRY_HEADER_SIZE * entries
    blocks = max(1, math.ceil(frames / (block_size - BLOCK_HEADER_LENGTH)))
    return frames + BLOCK_HEADER_LENGTH * blocks + _index_bytes(frames, blocks, 112)


def _clean(li: LedgerInfo) -> bool:
    """Sealed, fully offloaded, and nothing else referenced or in flight: safe to repack."""
    if not (is_sealed(li) and li.HasField("entries") and li.entries > 0 and is_offloaded(li)):
        return False
    if incomplete_segment_uuids(li):
        return False
    return referenced_uuids(li) == set(copy_uuids(li))


def _piece_bytes(li: LedgerInfo, n: int) -> int:
    """A segment's bytes for ``n`` entries of ``li`` as planning estimates them from the topic record
    (the ledger's average entry, frame headers, a block header, its index section; no padding): what
    makes a segment small."""
    share = li.size * n // li.entries if li.entries else 0
    frames = share + ENTRY_HEADER_SIZE * n
    return frames + BLOCK_HEADER_LENGTH + _index_bytes(frames, 1, 112)


def _units(lis: Sequence[LedgerInfo]) -> tuple[dict[str, Unit], dict[int, list[str]]]:
    """Every object pair the clean ledgers are read from (uuid -> Unit) and each ledger's uuids."""
    est: dict[str, int] = {}
    members: dict[str, list[int]] = {}
    kinds: dict[str, str] = {}
    drivers: dict[str, dict[str, Any]] = {}
    of_ledger: dict[int, list[str]] = {}
    for li in lis:
        if is_complete(li):
            u = context_uuid(li)
            assert u is not None
            kinds[u], est[u] = KIND_LEDGER, _v1_bytes(li)
            members.setdefault(u, []).append(li.ledgerId)
            dm = li.offloadContext.driverMetadata if li.offloadContext.HasField("driverMetadata") else None
            drivers[u] = driver_dict(dm) if dm is not None else {}
            of_ledger[li.ledgerId] = [u]
            continue
        segs = segment_drivers(li)
        of_ledger[li.ledgerId] = []
        for p in segment_pieces(li):
            kinds[p.uuid] = KIND_SEGMENT
            est[p.uuid] = est.get(p.uuid, 0) + _piece_bytes(li, p.last - p.first + 1)
            members.setdefault(p.uuid, []).append(li.ledgerId)
            if p.uuid in segs:
                drivers[p.uuid] = driver_dict(segs[p.uuid])
            of_ledger[li.ledgerId].append(p.uuid)
    units = {u: Unit(kinds[u], u, tuple(members[u]), est[u], drivers.get(u, {}), _transform_of(drivers.get(u, {})))
             for u in members}
    return units, of_ledger


def _transform_of(driver: dict[str, Any]) -> str:
    props = driver.get("properties") or {}
    if props.get(CHUNKED_PROPERTY) != "true":
        return "none"
    return props.get(TRANSFORM_PROPERTY) or "none"


def plan_topic(info: pb.ManagedLedgerInfo, *, min_object_size: int = DEFAULT_MIN_OBJECT_SIZE,
               target_size: int = DEFAULT_TARGET_SIZE, block_size: int = BLOCK_SIZE,
               transform: str = "none") -> list[Batch]:
    """The batches a compaction of the topic record ``info`` would write (see the module docstring).
    ``transform``: the namespace's transform now; objects written with another one are rewritten
    whatever their size (e.g. compressed once compression is enabled)."""
    lis = list(info.ledgerInfo)
    clean = [li for li in lis if _clean(li)]
    units, of_ledger = _units(clean)
    # every ledger referencing a unit some unclean ledger also references is out (shared with data in flight)
    index = {li.ledgerId: i for i, li in enumerate(lis)}
    clean_ids = {li.ledgerId for li in clean}
    for li in lis:
        if li.ledgerId not in clean_ids:
            for u in referenced_uuids(li):
                if u in units:
                    for lid in units[u].ledgers:
                        clean_ids.discard(lid)
    # groups: ledgers joined by a shared object, as intervals of the ledger list
    # (a ledger that cannot be repacked — not offloaded, in flight, sharing an object with one in flight —
    # ends a run: runs are consecutive in topic order; an empty ledger nothing references does not)
    groups: list[list[int]] = []
    for li in lis:
        lid = li.ledgerId
        if lid not in clean_ids:
            if not (li.HasField("entries") and li.entries == 0 and not referenced_uuids(li)):
                groups.append([])  # a barrier: runs do not cross it
            continue
        first_of = [min(index[m] for m in units[u].ledgers) for u in of_ledger[lid]]
        if groups and groups[-1] and first_of and min(first_of) <= index[groups[-1][-1]]:
            groups[-1].append(lid)
        else:
            groups.append([lid])
    by_id = {li.ledgerId: li for li in clean}
    out: list[Batch] = []
    run: list[list[int]] = []

    def flush_run() -> None:
        cur: list[list[int]] = []
        size = 0
        for g in run:
            g_after = sum(compacted_bytes(by_id[lid].entries, by_id[lid].size, block_size) for lid in g)
            if cur and size + g_after > target_size:
                _emit(cur)
                cur, size = [], 0
            cur.append(g)
            size += g_after
        if cur:
            _emit(cur)

    def _emit(gs: list[list[int]]) -> None:
        lids = tuple(lid for g in gs for lid in g)
        us: dict[str, Unit] = {}
        for lid in lids:
            for u in of_ledger[lid]:
                us.setdefault(u, units[u])
        after = sum(compacted_bytes(by_id[lid].entries, by_id[lid].size, block_size) for lid in lids)
        objects_after = max(1, math.ceil(after / target_size))
        if len(us) <= objects_after and all(u.transform == transform for u in us.values()):
            return  # no fewer objects and nothing to re-transform: nothing to gain
        out.append(Batch(lids, tuple(us.values()), sum(by_id[lid].entries for lid in lids),
                         sum(by_id[lid].size for lid in lids), sum(u.bytes for u in us.values()), after,
                         objects_after, transform))

    for g in groups:
        # small objects, or objects to re-transform (written with another transform than the policy's)
        small = bool(g) and all(units[u].bytes < min_object_size or units[u].transform != transform
                                for lid in g for u in of_ledger[lid])
        if small:
            run.append(g)
            continue
        if run:
            flush_run()
            run = []
    if run:
        flush_run()
    return out


# ================================================================================================
# cost
# ================================================================================================


@dataclass(frozen=True)
class CostModel:
    """Object-store prices (defaults: S3 Standard, us-east-1) and how often the store is listed."""

    gb_month: float = 0.023  # storage, per GB-month
    put_per_1000: float = 0.005  # PUT, COPY, POST, LIST requests
    get_per_1000: float = 0.0004  # GET and other requests
    listings_per_month: int = 30  # full listings (orphan reconciliation runs) a month

    def validate(self) -> CostModel:
        for f in ("gb_month", "put_per_1000", "get_per_1000", "listings_per_month"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int | float) or v < 0 or v != v:
                raise ValidationError(f"price {f} must be a non-negative number, got {v!r}")
        return self

    def estimate(self, objects_before: int, objects_after: int, bytes_before: int, bytes_after: int,
                 reads_per_object_month: float = 0.0) -> dict[str, float]:
        """Monthly cost change (negative: a saving) and the one-time cost of compacting. Storage by GB;
        listings: one LIST request per 1,000 keys per listing; reads: GETs of whole objects (an object's
        index and data) when ``reads_per_object_month`` is given. One-time: the old objects read (index
        + a GET per 8 MiB), the new ones written (a PUT per 5 MiB part, the completion, the index)."""
        gb = 1024 ** 3
        storage = (bytes_after - bytes_before) / gb * self.gb_month
        listing = (math.ceil(objects_after / 1000) - math.ceil(objects_before / 1000)) \
            * self.listings_per_month * self.put_per_1000 / 1000
        reads = (objects_after - objects_before) * reads_per_object_month * self.get_per_1000 / 1000
        gets = objects_before + math.ceil(bytes_before / (8 * 1024 * 1024))
        puts = math.ceil(bytes_after / S3_MIN_PART_SIZE) + objects_after
        once = gets * self.get_per_1000 / 1000 + puts * self.put_per_1000 / 1000
        return {"storage_month": round(storage, 6), "listing_month": round(listing, 6),
                "reads_month": round(reads, 6), "total_month": round(storage + listing + reads, 6),
                "one_time": round(once, 6)}


# ================================================================================================
# execution
# ================================================================================================


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


class _Conflict(Exception):
    pass


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
    copy (:func:`~tieredcore.offload.copies.open_offloaded` over the workspace's stores)."""

    def __init__(self, ml, segments: SegmentOffloader, open_copy: Callable[[LedgerInfo, str], Any], *,
                 deletion_log: DeletionLog, leases=None, clock_ms: Callable[[], int] = now_ms,
                 uuid_factory: Callable[[], uuidlib.UUID] = uuidlib.uuid4,
                 min_object_size: int = DEFAULT_MIN_OBJECT_SIZE, target_size: int = DEFAULT_TARGET_SIZE,
                 delete_delay_ms: int = DEFAULT_DELETE_DELAY_MS, transform: str = "none",
                 on_step: Callable[[str, str], None] | None = None,
                 progress: Callable[[str, int, int], None] | None = None) -> None:
        self.ml = ml
        self.segments = segments
        self.open_copy = open_copy
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
        t = TopicName.parse(topic)
        info, _ = self.ml.get_topic(t)
        return plan_topic(info, min_object_size=self.min_object_size, target_size=self.target_size,
                          transform=self.transform,
                          block_size=self.segments.block_size)

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
            self._clear_stale(t)
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
        name = t.managed_ledger_name
        started = time.monotonic()
        row = self._row(t, batch, Outcome.FAILED)
        info, _ = self.ml.get_topic(t)
        by_id = _by_id(info)
        expected: dict[int, tuple] = {}
        lis: list[LedgerInfo] = []
        for lid in batch.ledgers:
            li = by_id.get(lid)
            if li is None or not _clean(li):
                row.outcome, row.error = Outcome.CONFLICT, f"ledger {lid} changed since planned"
                return self._finish(row, started)
            expected[lid] = _signature(li)
            c = LedgerInfo()
            c.CopyFrom(li)
            lis.append(c)
        assigned: list[str] = []
        sinks: list[SegmentSink] = []
        written: list[_Written] = []
        try:
            written = self._write(t, lis, expected, assigned, sinks, row)
            for w in written:
                self._verify(name, w, row)
                self._step("verified", w.segment.uuid)
        except _Conflict as e:
            row.outcome, row.error = Outcome.CONFLICT, str(e)
            self._give_back(t, assigned, sinks)
            return self._finish(row, started)
        except Exception as e:
            row.outcome, row.error, row.error_type = Outcome.FAILED, f"{type(e).__name__}: {e}", type(e).__name__
            self._give_back(t, assigned, sinks)
            return self._finish(row, started)
        row.segments = [w.segment.uuid for w in written]
        row.objects_after = 2 * len(written)
        row.bytes_after = sum(self._stored(w.segment) for w in written)

        # phase 1 of two-phase deletion, before the switch: the old objects, due after the delay
        now = self.clock_ms()
        try:
            self.deletion_log.append([
                DeletionRecord(topic=name, ledger_id=u.ledgers[0], type=TYPE_OFFLOADED if u.kind == KIND_LEDGER
                               else TYPE_SEGMENT, reason=Reason.COMPACTION, created_ms=now, uuid=u.uuid,
                               driver=u.driver, next_attempt_ms=now + self.delete_delay_ms)
                for u in batch.units])
        except TieredError as e:
            row.outcome, row.error, row.error_type = Outcome.FAILED, f"recording the old objects: {e}", type(e).__name__
            self._give_back(t, assigned, [])
            return self._finish(row, started)
        self._step("recorded", assigned[0])

        # the switch
        driver = self._driver()
        new_msb_lsb = {u: uuid_to_msb_lsb(uuidlib.UUID(u)) for u in assigned}
        plan: dict[int, list[tuple[str, int]]] = {}
        for w in written:
            for p in w.pieces:
                plan.setdefault(p.ledger, []).append((w.segment.uuid, p.last))
        state: dict[str, str] = {}

        def switch(info) -> bool:
            state.clear()
            now = self.clock_ms()
            by_id = _by_id(info)
            for lid in batch.ledgers:
                li = by_id.get(lid)
                if li is None:
                    state["conflict"] = f"ledger {lid} is no longer in the topic (trimmed?)"
                    return False
                mine = set(incomplete_segment_uuids(li)) & set(assigned)
                sig = _signature_without(li, set(assigned))
                if sig != expected[lid]:
                    state["conflict"] = f"ledger {lid} changed meanwhile (offloaded, repaired or compacted again)"
                    return False
                if lid == batch.ledgers[0] and mine != set(assigned):
                    state["conflict"] = "our segment assignment is gone (cleaned up by another runner)"
                    return False
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
                    s = ctx.offloadSegment.add()
                    s.uidMsb, s.uidLsb = new_msb_lsb[u]
                    s.complete = True
                    s.assignedTimestamp = now
                    s.offloadedTimestamp = offloaded_ms
                    s.endEntryId = last
                    s.driverMetadata.CopyFrom(driver)
            return True

        try:
            self.ml.update_topic(t, switch)
        except MetadataStoreError as e:
            row.outcome, row.error = Outcome.UNKNOWN, f"switching to the new segment, outcome unknown: {e}"
            return self._finish(row, started)
        except TieredError as e:
            row.outcome, row.error, row.error_type = Outcome.FAILED, f"switching to the new segment: {e}", type(e).__name__
            self._give_back(t, assigned, [])
            return self._finish(row, started)
        if "conflict" in state:
            row.outcome, row.error = Outcome.CONFLICT, state["conflict"]
            self._give_back(t, assigned, [])
            return self._finish(row, started)
        row.outcome = Outcome.COMPACTED
        for u in assigned:
            self._step("switched", u)
        return self._finish(row, started)

    def _assign(self, t: TopicName, first_ledger: int, expected: dict[int, tuple], assigned: list[str]) -> str:
        """Step 1 for one new segment: its uuid on the batch's first ledger, if nothing changed."""
        new = str(self.uuid_factory())
        msb, lsb = uuid_to_msb_lsb(uuidlib.UUID(new))
        driver = self._driver()
        state: dict[str, str] = {}

        def assign(info) -> bool:
            state.clear()
            by_id = _by_id(info)
            for lid, sig in expected.items():
                li = by_id.get(lid)
                if li is None or _signature_without(li, set(assigned)) != sig:
                    state["conflict"] = f"ledger {lid} changed since planned"
                    return False
            li = by_id[first_ledger]
            s = li.offloadContext.offloadSegment.add()
            s.uidMsb, s.uidLsb = msb, lsb
            s.complete = False
            s.assignedTimestamp = self.clock_ms()
            s.endEntryId = li.entries - 1
            s.driverMetadata.CopyFrom(driver)
            return True

        self.ml.update_topic(t, assign)
        if "conflict" in state:
            raise _Conflict(state["conflict"])
        assigned.append(new)
        self._step("assigned", new)
        return new

    def _write(self, t: TopicName, lis: list[LedgerInfo], expected: dict[int, tuple], assigned: list[str],
               sinks: list[SegmentSink], row: CompactionResult) -> list[_Written]:
        """Steps 1-2: stream the ledgers' entries from their old objects into new segment(s), cut at the
        target size (normally one)."""
        name = t.managed_ledger_name
        former = BlockFormer(self.segments.block_size, pad_last=False)
        out: list[_Written] = []
        cur: dict[str, Any] = {"sink": None, "pieces": [], "estimated": 0}  # estimated: of pieces but the last
        size_through: dict[int, int] = {}
        stamps = {li.ledgerId: li.timestamp for li in lis}
        counts = {li.ledgerId: li.entries for li in lis}
        by_id = {li.ledgerId: li for li in lis}
        total = sum(compacted_bytes(li.entries, li.size, self.segments.block_size) for li in lis)
        done = 0
        measured: dict[str, int] = {}

        def finish_current() -> None:
            sink: SegmentSink = cur["sink"]
            last = {p.ledger: p.last for p in cur["pieces"]}
            seg = sink.finish(sizes={lid: size_through[lid] for lid in last},
                              timestamps={lid: stamps[lid] for lid in last if last[lid] == counts[lid] - 1})
            out.append(_Written(seg, cur["pieces"]))
            self._step("written", seg.uuid)
            cur["sink"], cur["pieces"], cur["estimated"] = None, [], 0

        def estimate(p: _Piece) -> int:
            return _piece_bytes(by_id[p.ledger], p.last - p.first + 1)

        def put(blk: FormedBlock) -> None:
            nonlocal done
            sink: SegmentSink | None = cur["sink"]
            # cut at the target size, but not before planning would take the segment for one at least the
            # min object size: its estimate leaves out padding and block headers, and a batch cut into
            # segments planning still finds small would be rewritten by every run
            if sink is not None and not sink.empty and sink.length + blk.block_size > self.target_size \
                    and cur["estimated"] + estimate(cur["pieces"][-1]) >= self.min_object_size:
                finish_current()
                sink = None
            if sink is None:
                u = self._assign(t, lis[0].ledgerId, expected, assigned)
                sink = self.segments.sink(u, {"managedledgername": name})
                sinks.append(sink)
                cur["sink"] = sink
            pieces: list[_Piece] = cur["pieces"]
            if not pieces or pieces[-1].ledger != blk.ledger_id:
                if pieces:
                    cur["estimated"] += estimate(pieces[-1])
                pieces.append(_Piece(blk.ledger_id, blk.first_entry, blk.last_entry))
            p = pieces[-1]
            p.last = blk.last_entry
            p.crc = crc32c.crc32c(blk.frames, p.crc)
            p.payload += sum(blk.sizes)
            size_through[blk.ledger_id] = size_through.get(blk.ledger_id, 0) + sum(blk.sizes)
            sink.add(blk)
            done += blk.block_size
            if self.progress is not None:
                self.progress(name, done, total)

        for li in lis:
            h = self.open_copy(li, name)
            try:
                n, payload = 0, 0
                batch = max(1, READ_BYTES // max(1, li.size // max(1, li.entries) + ENTRY_HEADER_SIZE))
                for first in range(0, li.entries, batch):
                    b = h.read_batch(first, min(first + batch - 1, li.entries - 1))
                    for closed in former.add_batch(b):
                        put(closed)
                    n += len(b)
                    payload += b.payload_bytes
                tail = former.flush()
                if tail is not None:
                    put(tail)
                row.bytes_read += h.bytes_fetched + getattr(h, "index_bytes", 0)
                row.requests += h.requests
                for u, length in _object_lengths(h):
                    measured[u] = length
            finally:
                h.close()
            if n != li.entries or (li.HasField("size") and payload != li.size):
                raise CorruptObjectError(f"ledger {li.ledgerId}: its offloaded copy holds {n} entries, {payload} "
                                         f"bytes; the topic's metadata says {li.entries}, {li.size}")
        if cur["sink"] is not None:
            finish_current()
        row.bytes_before = sum(measured.values()) or row.bytes_before
        return out

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

    def _clear_stale(self, t: TopicName) -> None:
        """Incomplete segment entries found under the lease are crashed attempts (ours or a streaming
        offload's): each to the deletion log, then off the topic record."""
        info, _ = self.ml.get_topic(t)
        stale: dict[str, tuple[int, dict[str, Any]]] = {}
        for li in info.ledgerInfo:
            drivers = segment_drivers(li)
            for u in incomplete_segment_uuids(li):
                stale.setdefault(u, (li.ledgerId, driver_dict(drivers[u]) if u in drivers else {}))
        if not stale:
            return
        now = self.clock_ms()
        self.deletion_log.append([
            DeletionRecord(topic=t.managed_ledger_name, ledger_id=lid, type=TYPE_SEGMENT, reason=Reason.OFFLOAD_CLEANUP,
                           created_ms=now, uuid=u, driver=driver)
            for u, (lid, driver) in stale.items()])
        self._drop(t, set(stale))

    def _drop(self, t: TopicName, uuids: set[str]) -> None:
        def drop(info) -> bool:
            changed = False
            for li in info.ledgerInfo:
                segs = li.offloadContext.offloadSegment
                keep = [s for s in segs if s.complete or uuid_from_halves(s.uidMsb, s.uidLsb) not in uuids]
                if len(keep) != len(segs):
                    del segs[:]
                    segs.extend(keep)
                    changed = True
            return changed

        self.ml.update_topic(t, drop)

    def _give_back(self, t: TopicName, assigned: list[str], sinks: Iterable[SegmentSink]) -> None:
        """After a conflict or failure: abort unfinished uploads, take our assignments off the topic,
        then send our segments to the deletion log. If taking them off fails the next run cleans up."""
        for s in sinks:
            s.abort()
        if not assigned:
            return
        name = t.managed_ledger_name
        try:
            self._drop(t, set(assigned))
        except TieredError as e:
            log.warning("%s: could not take back compaction segments %s: %s", name, assigned, e)
            return
        try:
            now = self.clock_ms()
            dm = driver_dict(self._driver())
            self.deletion_log.append([
                DeletionRecord(topic=name, ledger_id=0, type=TYPE_SEGMENT, reason=Reason.COMPACTION_CONFLICT,
                               created_ms=now, uuid=u, driver=dm) for u in assigned])
        except TieredError as e:
            log.warning("%s: could not record compaction segments %s for deletion: %s", name, assigned, e)

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


def _object_lengths(h: Any) -> list[tuple[str, int]]:
    """(data key, bytes stored) of the object pairs a copy handle read: data object and index, as
    transformed chunks and manifests where the objects are transformed."""
    from tieredcore.offload.reader import OffloadedLedgerHandle

    handles = [h] if isinstance(h, OffloadedLedgerHandle) else [h.piece_handle(p) for p in getattr(h, "pieces", [])]
    return [(x.key, _stored_bytes(x.store, x.key, x.index.data_object_length)
             + _stored_bytes(x.store, x.key + INDEX_SUFFIX, x.index_bytes)) for x in handles]


def _stored_bytes(store: Any, key: str, logical: int) -> int:
    """Bytes an object takes in its store (transformed: chunks + manifest; else its length)."""
    if isinstance(store, TransformedBlobStore):
        return store.stored_bytes(key)
    return logical
