"""Streaming segment objects (PIP-76, docs/formats.md "Streaming segments"): writing one, opening a
ledger whose entries lie in one or several segments, deleting one.

The topic-level protocol (which entries go into which segment, the compare-and-set steps) is
:mod:`tieredcore.offload.streaming`; this module only moves bytes.

Writing streams blocks as multipart parts (each at least the S3 minimum part size except the last),
holding one part in memory; the V2 index is written last and is the commit point. Reads reuse the V1
read handle over one ledger's section of a segment: exact offsets from the section's checkpoints,
chunk-verified ranged GETs, the same request economy.
"""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate

from tieredcore.errors import (
    BadRangeError,
    CorruptObjectError,
    FormatError,
    LedgerStateError,
    NoSuchObjectError,
    OffloadedLedgerNotFoundError,
    ValidationError,
)
from tieredcore.formats import constants as C
from tieredcore.formats.block import encode_frames
from tieredcore.formats.constants import BLOCK_HEADER_LENGTH
from tieredcore.formats.index import IndexEntry, LedgerSection, SegmentIndex, encode_index_v2, parse_index
from tieredcore.formats.keys import segment_data_key, segment_index_key
from tieredcore.formats.segment import (
    PROP_CHECKPOINTS,
    FormedBlock,
    LedgerRun,
    SegmentBlock,
    SegmentPlan,
    block_pieces,
    decode_checkpoints_property,
    plan_segment,
    segment_checksums,
    segment_sections,
)
from tieredcore.formats.trailer import ChunkChecksums, ChunkCrcWriter, IndexTrailer
from tieredcore.hot.tier import FrameSource
from tieredcore.model import (
    STATE_CLOSED,
    STATE_OPEN,
    Entry,
    EntryBatch,
    FileSlice,
    LedgerMetadata,
    ReadHandle,
)
from tieredcore.offload.cache import SHARED_SEGMENT_INDEX_CACHE
from tieredcore.offload.context import SegmentPiece
from tieredcore.offload.offloader import LedgerOffloader, check_format_version, entry_sizes, quietly
from tieredcore.offload.reader import OffloadedLedgerHandle
from tieredcore.offload.transaction import delete_pair

S3_MIN_PART_SIZE = 5 * 1024 * 1024

ProgressFn = Callable[[int, int], None]


@dataclass(frozen=True)
class SegmentSource:
    """Entries ``first_entry..last_entry`` of an open hot-tier ledger handle, to go into a segment."""

    handle: ReadHandle
    first_entry: int
    last_entry: int
    size_through: int = -1  # LedgerInfo.size for the section: payload bytes of entries 0..last_entry
    timestamp: int = 0  # the ledger's close time when last_entry is its last entry (sealed)

    @property
    def ledger_id(self) -> int:
        return self.handle.ledger_id


@dataclass(frozen=True)
class OffloadedSegment:
    uuid: str
    data_key: str
    index_key: str
    data_length: int
    blocks: int
    parts: int
    entries: int
    payload_bytes: int
    ledgers: tuple[tuple[int, int, int], ...]  # (ledger id, first entry, last entry)
    index_length: int = 0  # bytes of the index object


class SegmentOffloader:
    """Writes, opens and deletes segments in the store of a :class:`LedgerOffloader` (whose prefix,
    user metadata, checkpoints, checksums and read settings it shares)."""

    def __init__(self, offloader: LedgerOffloader, block_size: int = C.STREAMING_MIN_BLOCK_SIZE,
                 min_part_size: int = S3_MIN_PART_SIZE) -> None:
        if block_size < C.MIN_BLOCK_SIZE:
            raise ValidationError(f"streaming block size {block_size} is below the {C.MIN_BLOCK_SIZE}-byte minimum")
        self.off = offloader
        self.store = offloader.store
        self.prefix = offloader.prefix
        self.block_size = block_size
        self.min_part_size = min_part_size

    def keys(self, uuid: str) -> tuple[str, str]:
        return segment_data_key(self.prefix, uuid), segment_index_key(self.prefix, uuid)

    # -- write --------------------------------------------------------------------------------

    def plan(self, sources: Sequence[SegmentSource]) -> SegmentPlan:
        runs = []
        for s in sources:
            if not 0 <= s.first_entry <= s.last_entry <= s.handle.last_add_confirmed:
                raise LedgerStateError(f"ledger {s.ledger_id}: entries {s.first_entry}..{s.last_entry} are not "
                                       f"within 0..{s.handle.last_add_confirmed}")
            sizes = entry_sizes(s.handle, s.last_entry)
            runs.append(LedgerRun(s.ledger_id, s.first_entry, list(sizes[s.first_entry: s.last_entry + 1])))
        return plan_segment(runs, self.block_size, self.min_part_size)

    def write(self, sources: Sequence[SegmentSource], uuid: uuidlib.UUID | str,
              extra_metadata: Mapping[str, str] | None = None, progress: ProgressFn | None = None,
              plan: SegmentPlan | None = None) -> OffloadedSegment:
        """Write the data object (multipart) then the V2 index. Leaves nothing behind on failure."""
        uuid = str(uuid)
        if not sources:
            raise ValidationError("a segment needs at least one ledger's entries")
        plan = plan if plan is not None else self.plan(sources)
        dkey, ikey = self.keys(uuid)
        off, store = self.off, self.store
        if off.before_write is not None:
            off.before_write()
        crcs = ChunkCrcWriter(off.checksum_chunk) if off.checksum_chunk else None
        zero_copy = store.copies_file_slices
        upload_id = store.initiate_multipart(dkey, off.user_metadata("data", extra_metadata))
        try:
            done, parts = 0, []
            for number, (a, b) in enumerate(plan.parts, 1):
                pieces: list = []
                for blk in plan.blocks[a: b + 1]:
                    src = sources[blk.run]
                    h = src.handle
                    if isinstance(h, FrameSource):
                        frames = memoryview(bytearray(blk.frames_length))
                        h.read_frames_into(blk.first_entry, blk.last_entry, frames)  # CRC-verified
                    else:
                        frames = memoryview(encode_frames(h.read(blk.first_entry, blk.last_entry)))
                    header, body, pad = block_pieces(blk, frames)
                    if crcs is not None:
                        for p in (header, body, pad):
                            crcs.update(p)
                    if zero_copy and isinstance(h, FrameSource) and h.is_closed:
                        # the verified frames are copied from the hot-tier file by the store (in the kernel)
                        slice_: FileSlice = h.frames_slice(blk.first_entry, blk.last_entry)
                        pieces += [header, slice_, pad]
                    else:
                        pieces += [header, body, pad]
                    done += blk.block_size
                parts.append(store.upload_part(dkey, upload_id, number, pieces))
                if progress is not None:
                    progress(done, plan.length)
            store.complete_multipart(dkey, upload_id, parts)
        except BaseException:
            quietly(f"abort upload {upload_id} of {dkey}", store.abort_multipart, dkey, upload_id)
            raise
        return self._commit(uuid, plan, crcs, [s.size_through for s in sources], [s.timestamp for s in sources],
                            extra_metadata)

    def _commit(self, uuid: str, plan: SegmentPlan, crcs: ChunkCrcWriter | None, sizes: Sequence[int],
                timestamps: Sequence[int], extra_metadata: Mapping[str, str] | None) -> OffloadedSegment:
        """Write the V2 index of the data object ``plan`` describes (already complete in the store):
        the commit point. ``sizes``: per run, LedgerInfo.size through its last entry (-1: the run's own
        payload bytes). Deletes the data object when the index cannot be written."""
        off, store = self.off, self.store
        dkey, ikey = self.keys(uuid)
        checksums = None
        index_md = off.user_metadata("index", extra_metadata)
        if crcs is not None:
            chunk_crcs = crcs.finish()
            if crcs.length != plan.length:
                quietly(f"delete {dkey}", store.delete, [dkey])
                raise FormatError(f"segment {uuid}: checksummed {crcs.length} bytes, uploaded {plan.length}")
            checksums = (off.checksum_chunk, chunk_crcs)
            index_md[C.METADATA_CHECKSUMS_KEY] = f"crc32c/{off.checksum_chunk}"
        sections = segment_sections(
            plan,
            sizes=[sz if sz >= 0 else r.payload_bytes for sz, r in zip(sizes, plan.runs, strict=True)],
            timestamps=list(timestamps),
            checkpoint_interval=off.checkpoint_interval,
            checksums=checksums,
        )
        index = encode_index_v2(plan.length, sections)
        try:
            store.put(ikey, index, index_md)
        except BaseException:
            quietly(f"delete {dkey} after failed index write", store.delete, [dkey])
            raise
        return OffloadedSegment(
            uuid, dkey, ikey, plan.length, len(plan.blocks), len(plan.parts),
            sum(len(r.entry_sizes) for r in plan.runs), sum(r.payload_bytes for r in plan.runs),
            tuple((r.ledger_id, r.first_entry, r.last_entry) for r in plan.runs), len(index),
        )

    def sink(self, uuid: uuidlib.UUID | str, extra_metadata: Mapping[str, str] | None = None) -> SegmentSink:
        """A writer of one segment fed block by block (:class:`SegmentSink`)."""
        return SegmentSink(self, str(uuid), extra_metadata)

    # -- read ---------------------------------------------------------------------------------

    def open_index(self, uuid: str) -> tuple[SegmentIndex, ChunkChecksums | None, Mapping[str, str]]:
        """The segment's parsed index, its chunk checksums (None for objects without them) and the
        data object's user metadata. OffloadedLedgerNotFoundError when an object is missing."""
        index, checksums, data_md, _ = self._open_index(uuid)
        return index, checksums, data_md

    def _open_index(self, uuid: str, cached: bool = False) -> tuple[SegmentIndex, ChunkChecksums | None,
                                                                    Mapping[str, str], int]:
        """:meth:`open_index` and the size of the index object read. ``cached``: a copy parsed moments
        ago will do (readers; SHARED_SEGMENT_INDEX_CACHE), else the store is asked now."""
        dkey, ikey = self.keys(uuid)
        cache_key = f"{id(self.store)}:{dkey}"
        if cached:
            got = SHARED_SEGMENT_INDEX_CACHE.get(cache_key)
            if got is not None:
                return got  # type: ignore[return-value]
        out = self._read_index(uuid)
        if cached:  # only readers' opens: a compaction verifying hundreds of segments must not fill it
            SHARED_SEGMENT_INDEX_CACHE.put(cache_key, out)
        return out

    def _read_index(self, uuid: str) -> tuple[SegmentIndex, ChunkChecksums | None, Mapping[str, str], int]:
        dkey, ikey = self.keys(uuid)
        try:
            info = self.store.head(ikey)
            check_format_version(info.metadata, ikey)
            raw = self.store.get(ikey)
            data_info = self.store.head(dkey)
        except NoSuchObjectError as e:
            raise OffloadedLedgerNotFoundError(f"segment {uuid} not found: {e}") from e
        check_format_version(data_info.metadata, dkey)
        index = parse_index(raw)
        if not isinstance(index, SegmentIndex):
            raise FormatError(f"{ikey}: a single-ledger (V1) index where a segment's V2 index was expected")
        if index.data_object_length != data_info.size:
            raise CorruptObjectError(f"{dkey}: size {data_info.size} differs from the index's data object length "
                                     f"{index.data_object_length}")
        checksums = segment_checksums(index, ikey)
        if checksums is None and info.metadata.get(C.METADATA_CHECKSUMS_KEY):
            raise CorruptObjectError(f"{ikey}: its metadata declares checksums but the index records none")
        return index, checksums, data_info.metadata, len(raw)

    def open_piece(self, uuid: str, ledger_id: int, first: int, last: int,
                   topic: str | None = None, *, cached_index: bool = False) -> OffloadedLedgerHandle:
        """A handle on ledger ``ledger_id`` inside segment ``uuid``, which must hold exactly its entries
        ``first..last`` (what the topic's metadata says): FormatError otherwise."""
        return self._piece(self._open_index(uuid, cached_index), uuid, ledger_id, first, last, topic)

    def open_pieces(self, uuid: str, pieces: Sequence[tuple[int, int, int]],
                    topic: str | None = None) -> list[OffloadedLedgerHandle]:
        """Handles on several ledgers ``(ledger, first, last)`` of segment ``uuid``, its index read once
        (fresh)."""
        opened = self._open_index(uuid)
        return [self._piece(opened, uuid, lid, first, last, topic) for lid, first, last in pieces]

    def _piece(self, opened: tuple[SegmentIndex, ChunkChecksums | None, Mapping[str, str], int], uuid: str,
               ledger_id: int, first: int, last: int, topic: str | None) -> OffloadedLedgerHandle:
        index, checksums, data_md, index_bytes = opened
        dkey, ikey = self.keys(uuid)
        section = index.section(ledger_id)
        if section.first_entry_id != first or section.last_entry_id != last:
            raise FormatError(f"{ikey}: holds entries {section.first_entry_id}..{section.last_entry_id} of ledger "
                              f"{ledger_id}, the topic's metadata says {first}..{last}")
        owner = data_md.get(C.METADATA_MANAGED_LEDGER_NAME_KEY)
        if topic is not None and owner is not None and owner != topic:
            raise FormatError(f"{dkey}: a segment of managed ledger {owner!r}, not {topic!r}")
        trailer = IndexTrailer(checksums=checksums)
        cp = section.property(PROP_CHECKPOINTS)
        if cp is not None:
            trailer.checkpoint_ids, trailer.checkpoint_offsets = decode_checkpoints_property(cp, ikey)
        h = OffloadedLedgerHandle(self.store, dkey, ledger_id, _SectionView(index, section),  # type: ignore[arg-type]
                                  self.off.read_buffer, self.off.offset_cache, trailer=trailer,
                                  verify=self.off.verify_reads)
        h.index_bytes = index_bytes
        return h

    def open_ledger(self, ledger_id: int, pieces: Sequence[SegmentPiece], *, closed: bool,
                    size: int | None = None, topic: str | None = None,
                    stores: Mapping[str, SegmentOffloader] | None = None,
                    cached_index: bool = False) -> SegmentLedgerHandle:
        """A read handle on a ledger whose entries ``0..`` lie in ``pieces`` (in entry order, contiguous).
        ``stores``: segments written to another store than this one (a policy changed between them),
        by uuid. ``closed`` with ``size``: the last segment's section must hold exactly ``size`` payload
        bytes of the ledger (its LedgerInfo.size), else FormatError when it is opened."""
        if not pieces:
            raise OffloadedLedgerNotFoundError(f"ledger {ledger_id} has no completed segment")
        expect = 0
        for p in pieces:
            if p.first != expect or p.last < p.first:
                raise FormatError(f"ledger {ledger_id}: its segments do not cover its entries contiguously "
                                  f"(segment {p.uuid} holds {p.first}..{p.last}, expected to start at {expect})")
            expect = p.last + 1
        return SegmentLedgerHandle(self, ledger_id, list(pieces), closed=closed, size=size, topic=topic,
                                   stores=stores, cached_index=cached_index)

    # -- delete -------------------------------------------------------------------------------

    def delete(self, uuid: str) -> None:
        """Delete both objects and abort unfinished uploads of the segment. Idempotent."""
        delete_pair(self.store, *self.keys(uuid))


class SegmentSink:
    """Writes one segment from streaming blocks handed over in order as they are formed
    (:class:`~tieredcore.formats.segment.BlockFormer`), for writers that learn entry sizes only while
    reading the entries (compaction). Same layout, parts and index as :meth:`SegmentOffloader.write`
    for the same entries; holds one part (at least the minimum part size, plus one block) in memory.

    ``add`` blocks, then ``finish`` (complete the upload, write the index: the commit point) or
    ``abort`` (nothing left behind). ``length`` is the data-object bytes so far: the caller cuts
    segments by size before adding a block that would not fit."""

    def __init__(self, segments: SegmentOffloader, uuid: str, extra_metadata: Mapping[str, str] | None) -> None:
        off = segments.off
        self.segments = segments
        self.uuid = uuid
        self.data_key, self.index_key = segments.keys(uuid)
        self._extra = extra_metadata
        self._store = segments.store
        self._min_part = segments.min_part_size
        if off.before_write is not None:
            off.before_write()
        self._crcs = ChunkCrcWriter(off.checksum_chunk) if off.checksum_chunk else None
        self._upload_id = self._store.initiate_multipart(self.data_key, off.user_metadata("data", extra_metadata))
        self.length = 0
        self._runs: list[tuple[int, int, list[int]]] = []  # (ledger, first entry, payload sizes)
        self._ledger_ids: set[int] = set()  # of the runs (a compacted segment holds thousands of ledgers)
        self._run_frames = 0
        self._blocks: list[SegmentBlock] = []
        self._parts: list[tuple[int, int]] = []
        self._etags: list = []
        self._pending: list = []
        self._fill = 0
        self._part_first = 0
        self._done = False

    @property
    def empty(self) -> bool:
        return not self._blocks

    def ledgers(self) -> list[tuple[int, int, int]]:
        """(ledger, first entry, last entry) of each ledger added so far, in order."""
        return [(lid, first, first + len(sizes) - 1) for lid, first, sizes in self._runs]

    def add(self, blk: FormedBlock) -> None:
        if self._done:
            raise ValidationError(f"segment {self.uuid}: already finished")
        if not blk.sizes or blk.block_size < BLOCK_HEADER_LENGTH + len(blk.frames):
            raise ValidationError(f"segment {self.uuid}: an empty or unclosed block of ledger {blk.ledger_id}")
        if self._runs and self._runs[-1][0] == blk.ledger_id:
            lid, first, sizes = self._runs[-1]
            if blk.first_entry != first + len(sizes):
                raise ValidationError(f"segment {self.uuid}: ledger {lid} continues at entry {blk.first_entry}, "
                                      f"expected {first + len(sizes)}")
        else:
            if blk.ledger_id in self._ledger_ids:
                raise ValidationError(f"ledger {blk.ledger_id} appears twice in segment {self.uuid}")
            self._ledger_ids.add(blk.ledger_id)
            self._runs.append((blk.ledger_id, blk.first_entry, []))
            self._run_frames = 0
        if self._fill and self._min_part and self._fill >= self._min_part:
            self._upload_part()
        block = SegmentBlock(blk.ledger_id, blk.first_entry, blk.last_entry, blk.block_size, len(blk.frames),
                             self.length, len(self._parts) + 1, len(self._runs) - 1, self._run_frames)
        pieces = block_pieces(block, blk.frames)
        if self._crcs is not None:
            for p in pieces:
                self._crcs.update(p)
        self._pending += pieces
        self._blocks.append(block)
        self._runs[-1][2].extend(blk.sizes)
        self._run_frames += len(blk.frames)
        self._fill += blk.block_size
        self.length += blk.block_size
        if not self._min_part:
            self._upload_part()

    def _upload_part(self) -> None:
        number = len(self._parts) + 1
        self._etags.append(self._store.upload_part(self.data_key, self._upload_id, number, self._pending))
        self._parts.append((self._part_first, len(self._blocks) - 1))
        self._pending, self._fill, self._part_first = [], 0, len(self._blocks)

    def finish(self, sizes: Mapping[int, int] | None = None,
               timestamps: Mapping[int, int] | None = None) -> OffloadedSegment:
        """Complete the data object and write the index. ``sizes``: per ledger, its LedgerInfo.size
        through its last entry here (default: the payload bytes here); ``timestamps``: per ledger
        whose last entry is here, its close time."""
        if self.empty:
            raise ValidationError(f"segment {self.uuid}: no blocks to write")
        try:
            if self._pending:
                self._upload_part()
            self._store.complete_multipart(self.data_key, self._upload_id, self._etags)
        except BaseException:
            self.abort()
            raise
        self._done = True
        runs = tuple(LedgerRun(lid, first, sizes_) for lid, first, sizes_ in self._runs)
        cums = tuple(tuple(accumulate(map(C.ENTRY_HEADER_SIZE.__add__, r.entry_sizes), initial=0)) for r in runs)
        plan = SegmentPlan(runs, tuple(self._blocks), tuple(self._parts), self.length, cums)
        sizes = sizes or {}
        timestamps = timestamps or {}
        return self.segments._commit(self.uuid, plan, self._crcs, [sizes.get(r.ledger_id, -1) for r in runs],
                                     [timestamps.get(r.ledger_id, 0) for r in runs], self._extra)

    def abort(self) -> None:
        """Abort the upload (idempotent; nothing of the segment is left in the store)."""
        if not self._done:
            self._done = True
            quietly(f"abort upload {self._upload_id} of {self.data_key}", self._store.abort_multipart,
                     self.data_key, self._upload_id)

class _SectionView:
    """One ledger's section of a segment index, shaped like a V1 :class:`LedgerIndex` for the read handle."""

    def __init__(self, index: SegmentIndex, section: LedgerSection) -> None:
        self.data_object_length = index.data_object_length
        self.segment_index = index  # the whole segment's index (where each block ends: verification)
        self._s = section

    @property
    def section(self) -> LedgerSection:
        return self._s

    @property
    def last_entry_id(self) -> int:
        return self._s.last_entry_id

    @property
    def length(self) -> int:
        return self._s.size

    @property
    def is_closed(self) -> bool:
        return True

    @property
    def metadata(self) -> LedgerMetadata:
        return self._s.metadata

    def lookup(self, entry_id: int) -> IndexEntry:
        return self._s.lookup(entry_id)


class SegmentLedgerHandle:
    """A ledger read from its segments: each read is split at segment boundaries."""

    def __init__(self, segments: SegmentOffloader, ledger_id: int, pieces: list[SegmentPiece], *, closed: bool,
                 size: int | None, topic: str | None,
                 stores: Mapping[str, SegmentOffloader] | None = None, cached_index: bool = False) -> None:
        self._segments = segments
        self._cached_index = cached_index
        self._stores = dict(stores or {})
        self._ledger_id = ledger_id
        self.pieces = pieces
        self._closed = closed
        self._size = size
        self._topic = topic
        self._handles: dict[str, OffloadedLedgerHandle] = {}

    def segment_offloader(self, uuid: str) -> SegmentOffloader:
        """The store segment ``uuid`` of this ledger lies in."""
        return self._stores.get(uuid, self._segments)

    def _handle(self, p: SegmentPiece) -> OffloadedLedgerHandle:
        h = self._handles.get(p.uuid)
        if h is None:
            h = self.segment_offloader(p.uuid).open_piece(p.uuid, self._ledger_id, p.first, p.last, self._topic,
                                                          cached_index=self._cached_index)
            if self._closed and self._size is not None and p is self.pieces[-1] and h.length != self._size:
                h.close()
                raise FormatError(f"{h.key}-index: ledger {self._ledger_id} holds {h.length} bytes through entry "
                                  f"{p.last}, the topic's metadata says {self._size}")
            self._handles[p.uuid] = h
        return h

    def piece_handle(self, p: SegmentPiece) -> OffloadedLedgerHandle:
        """The handle on this ledger's section of segment ``p`` (opened on first use, then kept)."""
        return self._handle(p)

    def object_handles(self) -> list[OffloadedLedgerHandle]:
        """The handle on each segment holding part of this ledger, opened (CopyHandle)."""
        return [self._handle(p) for p in self.pieces]

    def open_all(self) -> None:
        """Open every segment's index now (what a shallow check wants): each must exist, parse, pass
        its checks and hold the entries the topic's metadata says."""
        for p in self.pieces:
            self._handle(p)

    @property
    def index_bytes(self) -> int:
        """Bytes of the index objects read so far."""
        return sum(h.index_bytes for h in self._handles.values())

    @property
    def ledger_id(self) -> int:
        return self._ledger_id

    @property
    def last_add_confirmed(self) -> int:
        return self.pieces[-1].last

    @property
    def length(self) -> int:
        if self._size is not None:
            return self._size
        return self._handle(self.pieces[-1]).length

    @property
    def is_closed(self) -> bool:
        return self._closed

    @property
    def metadata(self) -> LedgerMetadata:
        return LedgerMetadata(self._ledger_id, STATE_CLOSED if self._closed else STATE_OPEN,
                              self.last_add_confirmed, self.length)

    @property
    def requests(self) -> int:
        return sum(h.requests for h in self._handles.values())

    @property
    def bytes_fetched(self) -> int:
        return sum(h.bytes_fetched for h in self._handles.values())

    def read(self, first: int, last: int) -> list[Entry]:
        out: list[Entry] = []
        for h, a, b in self._spans(first, last):
            out += h.read(a, b)
        return out

    def read_batch(self, first: int, last: int) -> EntryBatch:
        return EntryBatch.concat([h.read_batch(a, b) for h, a, b in self._spans(first, last)])

    def _spans(self, first: int, last: int) -> list[tuple[OffloadedLedgerHandle, int, int]]:
        """(piece handle, first, last) of each segment holding part of first..last, in order."""
        lac = self.last_add_confirmed
        if first < 0 or first > last or last > lac:
            raise BadRangeError(f"ledger {self._ledger_id}: bad read range {first}..{last} (last add confirmed {lac})")
        return [(self._handle(p), max(first, p.first), min(last, p.last))
                for p in self.pieces if not (p.last < first or p.first > last)]

    def close(self) -> None:
        for h in self._handles.values():
            h.close()
        self._handles.clear()
