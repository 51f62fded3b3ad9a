"""Read handle of one ledger of the local ledger store (:mod:`tieredcore.hot.local`): a snapshot of
the ledger's ``.idx`` taken at open (loaded in bulk, so any entry is one lookup away) over the ``.log``.

Every read checks each frame's CRC32C against its index record, and the entry ids in the first and
last frame headers, with C-level map/accumulate (no per-entry bytecode). The offloader copies a
contiguous byte range of the ``.log`` straight into an offload data block
(:meth:`LocalLedgerHandle.read_frames_into`), or has the kernel copy it (:meth:`frames_slice`). A
handle of a ledger that is still being written sees the entries whose index record existed at open
(BookKeeper's "open without recovery").
"""

from __future__ import annotations

import array
import itertools
import logging
import operator
import os
import threading
from collections.abc import Sequence

import crc32c

from tieredcore.errors import (
    BadRangeError,
    CorruptEntryError,
    FormatError,
    LedgerStateError,
    StaleHandleError,
    ValidationError,
)
from tieredcore.fileio import pread_exact, preadv_exact
from tieredcore.formats.block import frame_ends
from tieredcore.formats.frame_ranges import FrameRanges, decode_frame_ranges
from tieredcore.hot.files import close_quietly
from tieredcore.hot.format import FRAME_HEADER, FRAME_HEADER_LEN
from tieredcore.model import STATE_CLOSED, Buffer, Entry, EntryBatch, FileSlice, LedgerMetadata

__all__ = ["LocalLedgerHandle"]

_crc = crc32c.crc32c
log = logging.getLogger(__name__)


def _check_entry_id(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(f"{name} must be an int, got {value!r}")
    return int(value)


class LocalLedgerHandle:
    """Read handle of one ledger (tieredcore.model.ReadHandle), a snapshot of its index at open."""

    def __init__(
        self,
        metadata: LedgerMetadata,
        log_fd: int,
        offsets: array.array,
        crcs: array.array,
        lens: array.array,
        *,
        meta_path: str,
        log_path: str,
        ranges_path: str | None = None,
    ) -> None:
        self._meta = metadata
        self._id = metadata.ledger_id
        self._meta_path = meta_path
        self._log_path = log_path
        self._fd = log_fd
        self._offsets = offsets
        self._crcs = crcs
        self._lens = lens
        self._lac = metadata.last_entry_id
        self._end = (offsets[-1] + FRAME_HEADER_LEN + lens[-1]) if len(offsets) else 0
        # taken after the index was read: every frame the snapshot's records acknowledge lies below it, so a
        # damaged record cannot make a read allocate (or return) more than the file holds
        self._log_size = os.fstat(log_fd).st_size
        self._mu = threading.Lock()
        self._active = 0
        self._closing = False
        self._ranges_path = ranges_path
        self._ranges: FrameRanges | None | bool = False  # False: not loaded yet

    # -- ReadHandle

    @property
    def ledger_id(self) -> int:
        return self._id

    @property
    def metadata(self) -> LedgerMetadata:
        """Stored metadata; for an OPEN ledger last_entry_id/length are this handle's LAC/length."""
        return self._meta

    @property
    def last_add_confirmed(self) -> int:
        return self._lac

    @property
    def length(self) -> int:
        return self._meta.length

    @property
    def is_closed(self) -> bool:
        return self._meta.state == STATE_CLOSED

    @property
    def data_length(self) -> int:
        """Bytes of frames 0..LAC in the .log (= frame_offset(LAC + 1))."""
        return self._end

    def __repr__(self) -> str:
        return f"LocalLedgerHandle(ledger_id={self._id}, lac={self._lac}, closed={self.is_closed})"

    def read(self, first: int, last: int) -> list[Entry]:
        """Entries first..last (inclusive), each CRC-verified; one pread for the whole span."""
        first, last = self._check_range(first, last)
        buf, rel = self._read_verified(first, last)
        starts = map(operator.add, rel, itertools.repeat(FRAME_HEADER_LEN))
        payloads = map(buf.__getitem__, map(slice, starts, itertools.islice(rel, 1, None)))
        return list(map(Entry, range(first, last + 1), payloads))

    def read_batch(self, first: int, last: int) -> EntryBatch:
        """Entries first..last as one batch: the verified frames as read, payload offsets from the index."""
        first, last = self._check_range(first, last)
        buf, rel = self._read_verified(first, last)
        starts = array.array("q", map(operator.add, itertools.islice(rel, len(rel) - 1), itertools.repeat(FRAME_HEADER_LEN)))
        return EntryBatch(self._id, first, buf, starts, self._lens[first : last + 1], 0, rel[-1])

    def read_frames(self, first: int, last: int) -> bytes:
        """Raw contiguous ``[len][entryId][payload]`` frames of entries first..last, CRC-verified."""
        first, last = self._check_range(first, last)
        return self._read_verified(first, last)[0]

    def read_frames_into(self, first: int, last: int, out: memoryview, verify: bool = True) -> int:
        """Like read_frames, but straight into `out` (no intermediate copy); returns the byte count.
        `out` must be exactly the frames' length. The offloader reads blocks this way. ``verify=False``:
        no frame's CRC is checked (the caller checks the frame ranges' CRCs instead); the index records'
        consistency and the first and last frames' entry ids still are."""
        first, last = self._check_range(first, last)
        buf, rel = self._read_verified(first, last, out, verify)
        return rel[-1]

    def frame_ranges(self, ends: Sequence[int] | None = None) -> FrameRanges | None:
        """The CRC32C per ~1 MiB of frames recorded when the ledger was sealed (``<id>.rng``), or None:
        not sealed by its writer (recovered), written before ranges existed, damaged, or index records
        that do not add up (every frame is then checked on its own, which names the bad one). ``ends``:
        the caller's cumulative frame ends from this ledger's sizes (spares recomputing them)."""
        if self._ranges is False:
            self._ranges = self._load_ranges(ends)
        return self._ranges  # type: ignore[return-value]

    def _load_ranges(self, ends: Sequence[int] | None) -> FrameRanges | None:
        if self._ranges_path is None or not self._meta.is_closed or self._lac < 0:
            return None
        try:
            with open(self._ranges_path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        try:
            ranges = decode_frame_ranges(data, self._lac + 1, self._end)
        except FormatError as e:
            log.warning("ledger %d: frame ranges ignored, every frame's CRC is checked instead: %s", self._id, e)
            return None
        # each record's offset = the previous one's + 12 + its length (ranges skip the per-frame check that
        # would otherwise see a record that does not)
        if not (isinstance(ends, array.array) and ends.typecode == "q" and len(ends) == self._lac + 2):
            ends = frame_ends(self._lens)
        if ends[-1] != self._end or ends[:-1] != self._offsets:  # arrays of one type: compared as bytes
            return None
        return ranges

    def frames_slice(self, first: int, last: int) -> FileSlice:
        """Where entries first..last's frames lie in the .log file, for stores that copy file ranges in
        the kernel. Sealed ledgers only (immutable bytes); does NOT verify CRCs: callers verify with
        read_frames_into first (the offloader does, into a reused buffer)."""
        first, last = self._check_range(first, last)
        if not self._meta.is_closed:
            raise LedgerStateError(f"ledger {self._id} is open: its bytes may still change")
        self._check_not_deleted()
        start = self._offsets[first]
        end = self._offsets[last] + FRAME_HEADER_LEN + self._lens[last]
        return FileSlice(self._log_path, start, end - start)

    def entry_sizes(self) -> Sequence[int]:
        """Payload sizes of entries 0..LAC (a copy, array('i'))."""
        return array.array("i", self._lens)

    def entry_crcs(self) -> Sequence[int]:
        """CRC32C of every frame (12-byte header + payload) of entries 0..LAC, as recorded at append
        (a copy, array('I')): what an offloaded copy's frames must hash to."""
        return array.array("I", self._crcs)

    def frame_offset(self, entry_id: int) -> int:
        """Offset of entry_id's frame in the .log; entry_id = LAC + 1 gives the end of the frames."""
        entry_id = _check_entry_id("entry_id", entry_id)
        if entry_id < 0 or entry_id > self._lac + 1:
            raise BadRangeError(f"ledger {self._id}: entry {entry_id} outside 0..{self._lac + 1}")
        return self._end if entry_id == self._lac + 1 else self._offsets[entry_id]

    def close(self) -> None:
        with self._mu:
            if self._closing:
                return
            self._closing = True
            if self._active == 0 and self._fd >= 0:
                close_quietly(self._fd)
                self._fd = -1

    def __enter__(self) -> LocalLedgerHandle:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- internals

    def _check_range(self, first: int, last: int) -> tuple[int, int]:
        first = _check_entry_id("first", first)
        last = _check_entry_id("last", last)
        if first < 0 or first > last or last > self._lac:
            raise BadRangeError(
                f"ledger {self._id}: bad read range {first}..{last} (last add confirmed {self._lac})"
            )
        return first, last

    def _acquire(self) -> int:
        with self._mu:
            if self._closing:
                raise LedgerStateError(f"handle of ledger {self._id} is closed")
            self._active += 1
            return self._fd

    def _release(self) -> None:
        with self._mu:
            self._active -= 1
            if self._closing and self._active == 0 and self._fd >= 0:
                close_quietly(self._fd)
                self._fd = -1

    def _check_not_deleted(self) -> None:
        try:
            os.stat(self._meta_path)
        except FileNotFoundError:
            raise StaleHandleError(f"ledger {self._id} was deleted; this handle is stale") from None

    def _read_verified(self, first: int, last: int, into: memoryview | None = None,
                       verify: bool = True) -> tuple[Buffer, list[int]]:
        """(span bytes, relative frame starts + end) of entries first..last, all CRC-verified (with
        ``verify=False``: relative starts of the first and last frames + end, not CRC-verified).

        Frame boundaries come from the index sizes (the CRC of each frame covers its header, so a
        wrong size or offset fails the check); C-level map/accumulate, no per-entry bytecode.
        """
        base = self._offsets[first]
        if verify:
            lens = self._lens[first : last + 1]
            rel = list(
                itertools.accumulate(map(operator.add, lens, itertools.repeat(FRAME_HEADER_LEN)), initial=0)
            )
            span, sane = rel[-1], min(lens) >= 0
        else:  # frame ranges: the records were checked to add up when they were loaded (frame_ranges)
            span = self._offsets[last] + FRAME_HEADER_LEN + self._lens[last] - base
            rel, sane = [0, self._offsets[last] - base, span], self._lens[last] >= 0
        if base < 0 or not sane or self._offsets[last] + FRAME_HEADER_LEN + self._lens[last] - base != span:
            raise CorruptEntryError(
                f"ledger {self._id}: index records of entries {first}..{last} are inconsistent"
            )
        if base + span > self._log_size:
            raise CorruptEntryError(
                f"ledger {self._id}: index records of entries {first}..{last} point past the data file end "
                f"(bytes {base}..{base + span}, file holds {self._log_size})"
            )
        if into is not None and len(into) != span:
            raise ValueError(f"read_frames_into: buffer of {len(into)} bytes for {span} bytes of frames")
        fd = self._acquire()
        try:
            self._check_not_deleted()
            buf = pread_exact(fd, span, base) if into is None else into[: preadv_exact(fd, into, base)]
        finally:
            self._release()
        if len(buf) != span:
            self._check_not_deleted()
            raise CorruptEntryError(
                f"ledger {self._id}: data file ends before entry {last} "
                f"(wanted bytes {base}..{base + span}, got {len(buf)})"
            )
        if verify:
            self._check_crcs(buf, rel, first, last)
        # A record copied from another entry (offset, crc and length) passes the CRC check: the frame
        # headers name their entry. With the first and last right, the CRC-checked frames between them,
        # cut at the recorded lengths, are the ones in between.
        for eid, at in ((first, 0), (last, rel[-2])):
            got_id = FRAME_HEADER.unpack_from(buf, at)[1]
            if got_id != eid:
                raise CorruptEntryError(
                    f"ledger {self._id}: the index record of entry {eid} points at the frame of entry {got_id}"
                )
        return buf, rel

    def _check_crcs(self, buf: Buffer, rel: list[int], first: int, last: int) -> None:
        mv = memoryview(buf)
        frames = map(mv.__getitem__, map(slice, rel, itertools.islice(rel, 1, None)))
        computed = array.array("I", map(_crc, frames))
        mv.release()
        crcs = self._crcs[first : last + 1]
        if computed != crcs:
            for i, (got, want) in enumerate(zip(computed, crcs, strict=True)):
                if got != want:
                    raise CorruptEntryError(
                        f"ledger {self._id} entry {first + i}: CRC32C mismatch "
                        f"(stored {want:#010x}, computed {got:#010x})"
                    )
