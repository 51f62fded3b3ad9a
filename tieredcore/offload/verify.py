"""Proof that an offloaded copy reads back correctly, before anything relies on it alone.

:func:`verify_offloaded` streams a whole data object with ranged GETs (bounded memory: one window plus
one frame), checking every block's structure (magic, header length, block length, first entry id, zero
bytes, consecutive entry ids, the padding cycle), every chunk checksum the index carries (the handle
verifies each fetch), and, given the hot tier's per-entry CRC32C (which covers exactly the bytes of a
frame: 12-byte header + payload), every frame against the hot copy. Counts are not proof: a flipped
payload byte, a cut tail or a changed frame length all fail here with CorruptObjectError naming the
object and byte range.

A ledger held by streaming segments (PIP-76) is proven the same way over its blocks in each segment
(:func:`verify_segments`).

The same pass checks the Pulsar messages inside the entries (each entry's CRC32C,
tieredcore.offload.message_audit) in objects that carry no chunk checksums (Pulsar wrote them), or in
every object when asked: the frames are in the stream's buffer already, so no byte is read twice. Damaged
messages fail the proof once the whole copy was walked (DamagedMessagesError, naming their positions);
entries of ledgers that do not hold messages are counted, never damage.

Used before a hot copy is marked for deletion (deletion-lag cleanup), after a repair writes a
replacement copy, and by the deep scrub. A pass over a pair without checkpoints (Pulsar wrote it)
records its entry-offsets sidecar once every check passed (tieredcore.offload.sidecar).
"""

from __future__ import annotations

import itertools
import operator
import struct
from array import array
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

import crc32c

from tieredcore.errors import CorruptObjectError, FormatError
from tieredcore.formats import constants as C
from tieredcore.formats.block import frame_ends, padding
from tieredcore.formats.frame_ranges import FrameRanges, RangeCheck, RangeMismatch
from tieredcore.formats.index import LedgerSection, SegmentIndex
from tieredcore.hot.tier import FrameSource, HotLedger
from tieredcore.offload.message_audit import DamagedMessagesError, LedgerMessages, MessageTally
from tieredcore.offload.reader import OffloadedLedgerHandle
from tieredcore.offload.segments import SegmentLedgerHandle

DEFAULT_WINDOW = 8 * 1024 * 1024

_FRAME = struct.Struct(">iq")
_HEADER = struct.Struct(">Iqqq")  # magic, header length, block length, first entry id
_ZEROS = bytes(C.BLOCK_HEADER_ZEROS)
_SEG_HEADER = struct.Struct(">Iqqqq")  # streaming block: ... and the ledger id
_SEG_ZEROS_LEN = C.BLOCK_HEADER_LENGTH - _SEG_HEADER.size
_SEG_ZEROS = bytes(_SEG_ZEROS_LEN)
_crc = crc32c.crc32c


@dataclass
class VerifyReport:
    entries: int = 0
    blocks: int = 0
    bytes_read: int = 0
    requests: int = 0
    against_hot: bool = False
    messages: MessageTally | None = None  # None: the messages were not checked


class _Stream:
    """Sequential views of ``[start, stop)`` of a data object (default: all of it), fetched window by
    window (each fetch chunk-verified by the handle). Views never go backwards; every byte of the range
    is fetched (a frame straddling two windows twice)."""

    def __init__(self, h: OffloadedLedgerHandle, window: int, start: int = 0, stop: int | None = None) -> None:
        self.h = h
        self.window = window
        self.length = h.index.data_object_length if stop is None else stop
        self.buf = memoryview(b"")
        self.start = start  # object offset of buf[0]

    @property
    def end(self) -> int:
        return self.start + len(self.buf)

    def view(self, pos: int, n: int) -> memoryview:
        if pos < self.start:
            raise AssertionError(f"stream went backwards: {pos} < {self.start}")
        if pos + n > self.length:
            raise CorruptObjectError(f"{self.h.key}: structure runs past the object end {self.length} "
                                     f"(bytes {pos}-{pos + n - 1})")
        if pos + n > self.end:
            # fetch from the unread tail of the buffer (less than one frame) on, so no byte is skipped
            # (each is verified) and the window is used as fetched: joining the tail to it would copy
            # every window again (~1/3 of the proof's time at 1 KiB entries, where a frame straddles
            # nearly every window's end)
            keep_from = min(pos, self.end)
            stop = min(max(pos + n, self.end + self.window), self.length)
            self.buf = self.h.read_range(keep_from, stop)
            self.start = keep_from
        return self.buf[pos - self.start : pos - self.start + n]


@dataclass
class _Walk:
    """Where a walk over one ledger's blocks stands."""

    next_id: int  # the entry the next frame must hold
    last_id: int  # the last entry the object may hold
    payload: int = 0  # payload bytes seen
    blocks: int = 0
    sizes: array | None = None  # payload sizes of the frames walked, when a sidecar records them
    msgs: LedgerMessages | None = None  # the message check, when this object's messages are checked


@dataclass
class _Hot:
    """The hot copy's record of a ledger's frames: CRC32C per frame and, when known, the cumulative frame
    ends from its payload sizes (frames can then be cut where the hot copy says, without a walk), and its
    CRC32C per ~1 MiB of frames (then one C call per range, not one per frame, proves the bytes)."""

    crcs: array
    cum: Sequence[int] | None
    ranges: RangeCheck | None = None

    @classmethod
    def of(cls, key: str, crcs: Sequence[int] | None, sizes: Sequence[int] | None,
           ranges: FrameRanges | None = None) -> _Hot | None:
        if crcs is None:
            return None
        if sizes is not None and len(sizes) != len(crcs):
            raise CorruptObjectError(f"{key}: the hot copy lists {len(crcs)} CRCs and {len(sizes)} sizes")
        arr = crcs if isinstance(crcs, array) and crcs.typecode == "I" else array("I", crcs)
        cum = frame_ends(sizes) if sizes is not None else None
        check = None
        if ranges is not None and cum is not None:
            try:
                check = RangeCheck(ranges, cum, arr, keep=True)
            except FormatError:  # ranges that do not describe these sizes: every frame is compared instead
                check = None
        return cls(arr, cum, check)

    def finish(self, key: str) -> None:
        if self.ranges is not None:
            try:
                self.ranges.finish()
            except FormatError as e:
                raise CorruptObjectError(f"{key}: {e}") from None


def hot_frame_ranges(hot: HotLedger | None) -> FrameRanges | None:
    """The hot copy's frame ranges, when it keeps them (a local hot tier's ledger sealed by its writer)."""
    return hot.frame_ranges() if isinstance(hot, FrameSource) else None


def _differs(key: str, entry: int, a: int, b: int, got: int, want: int) -> CorruptObjectError:
    """Entry ``entry`` (object bytes ``a .. b - 1``) is not the hot copy's."""
    return CorruptObjectError(f"{key}: entry {entry} at bytes {a}-{b - 1} differs from the hot copy "
                              f"(CRC32C {got:08x}, hot {want:08x})")


def _range_error(key: str, e: RangeMismatch) -> CorruptObjectError:
    if e.entry is not None:
        return _differs(key, e.entry, *e.entry_bytes, *e.entry_crcs)
    return CorruptObjectError(f"{key}: entries {e.first}..{e.stop - 1} differ from the hot copy (CRC32C of their "
                              f"frames {e.got:08x}, hot {e.want:08x}; each frame matches its own CRC)")


def _frames_and_padding(s: _Stream, key: str, where: str, i: int, pos: int, end: int, w: _Walk,
                        hot: _Hot | None, stop_id: int) -> None:
    """The frames of block ``i`` from ``pos`` to ``end`` (its entries end before ``stop_id``, says the
    index), then its padding (shared by V1 and streaming blocks, whose bodies are the same)."""
    first = w.next_id
    if hot is not None and hot.cum is not None:
        pos = _frames_cut_by_hot(s, key, where, i, pos, end, w, hot, stop_id)
    else:
        pos = _frames_walked(s, key, i, pos, end, w, hot)
    if w.next_id == first:
        raise CorruptObjectError(f"{where}: holds no entries")
    pad_start = pos
    while pos < end:  # padding (the FE DC DE AD cycle from its first byte), a window at a time
        n = min(end - pos, s.window)
        phase = (pos - pad_start) % 4
        if s.view(pos, n) != padding(n + phase)[phase:]:
            raise CorruptObjectError(f"{key}: bytes {pos}-{pos + n - 1} of block {i} are not padding")
        pos += n
    w.blocks += 1


def _frames_cut_by_hot(s: _Stream, key: str, where: str, i: int, pos: int, end: int, w: _Walk, hot: _Hot,
                       stop_id: int) -> int:
    """Entries w.next_id..stop_id-1 where the hot copy's sizes put them, each frame's CRC32C (which
    covers its length and entry id) compared with the hot copy's, a stream window at a time in C: no
    per-entry Python unless an entry differs. Returns the offset after the last frame."""
    k0, cum = w.next_id, hot.cum
    assert cum is not None
    if stop_id <= k0 or stop_id > len(cum) - 1:
        raise CorruptObjectError(f"{where}: the index puts entries {k0}..{stop_id - 1} here, the hot copy holds "
                                 f"entries 0..{len(cum) - 2}")
    shift = pos - cum[k0]  # object offset of frame k = cum[k] + shift
    frames_end = cum[stop_id] + shift
    if frames_end > end:
        raise CorruptObjectError(f"{where}: entries {k0}..{stop_id - 1} of the hot copy take "
                                 f"{frames_end - pos} bytes, more than the block holds")
    k = k0
    while k < stop_id:
        at = cum[k] + shift
        if at + C.ENTRY_HEADER_SIZE > s.end:
            s.view(at, C.ENTRY_HEADER_SIZE)  # the next window
        base = s.start
        # frames k..j-1 lie in this window
        j = bisect_right(cum, s.end - shift, k + 1, stop_id + 1) - 1
        if j == k:  # frame k runs into the next window: fetched (the window's tail kept) and checked alone
            s.view(at, cum[k + 1] - cum[k])
            base, j = s.start, k + 1
        if hot.ranges is not None:  # one CRC32C call per ~1 MiB range (per-frame work only to name a bad one)
            a, b = cum[k] + shift - base, cum[j] + shift - base
            try:
                hot.ranges.feed(k, s.buf[a:b], base + a)
            except RangeMismatch as e:
                raise _range_error(key, e) from None
            bounds = None
        else:
            bounds = list(map(operator.add, cum[k : j + 1], itertools.repeat(shift - base)))
            got = array("I", map(_crc, map(s.buf.__getitem__, map(slice, bounds, itertools.islice(bounds, 1, None)))))
            want = hot.crcs[k:j]
            if got != want:
                x = next(x for x, (g, h) in enumerate(zip(got, want, strict=True)) if g != h)
                raise _differs(key, k + x, base + bounds[x], base + bounds[x + 1], got[x], want[x])
        if w.msgs is not None:
            if bounds is None:
                bounds = list(map(operator.add, cum[k : j + 1], itertools.repeat(shift - base)))
            w.msgs.feed_frames(s.buf, k, bounds)
        k = j
    w.payload += cum[stop_id] - cum[k0] - C.ENTRY_HEADER_SIZE * (stop_id - k0)
    w.next_id = stop_id
    return frames_end


def _frames_walked(s: _Stream, key: str, i: int, pos: int, end: int, w: _Walk, hot_record: _Hot | None) -> int:
    """The frames of block ``i`` walked in place in the stream's buffer (ids and lengths checked), until
    padding or the block end; given the hot CRCs (or a message check), the frames are collected per
    buffer and checked in bulk (one C-level pass, per-entry work only to name a differing entry).
    Returns the offset after the last frame."""
    sink = _FrameSink(key, hot_record.crcs if hot_record is not None else None, w.msgs) \
        if hot_record is not None or w.msgs is not None else None
    unpack = _FRAME.unpack_from
    hl = C.ENTRY_HEADER_SIZE
    buf, base = s.buf, s.start
    bend = base + len(buf)
    pending = None  # the buffer whose frames sink holds (collected with bound appends: no call per frame)
    add_start = add_stop = None
    add_size = w.sizes.append if w.sizes is not None else None
    while pos + hl <= end:
        if pos + hl > bend:
            s.view(pos, hl)  # fetches the next window (or names the object end)
            buf, base = s.buf, s.start
            bend = base + len(buf)
        flen, eid = unpack(buf, pos - base)
        if flen < 0:
            break
        stop = pos + hl + flen
        if stop > end:
            raise CorruptObjectError(f"{key}: frame at bytes {pos}-{stop - 1} (entry {eid}, length {flen}) "
                                     f"overruns block {i} ending at {end}")
        if eid != w.next_id:
            raise CorruptObjectError(f"{key}: frame at byte {pos} holds entry {eid}, expected {w.next_id}")
        if eid > w.last_id:  # a frame after the last entry (room left in the last block)
            raise CorruptObjectError(f"{key}: frame at byte {pos} holds entry {eid}, the index ends at "
                                     f"entry {w.last_id}")
        if stop > bend:
            s.view(pos, stop - pos)  # the frame runs into the next window
            buf, base = s.buf, s.start
            bend = base + len(buf)
        if sink is not None:
            if buf is not pending:
                sink.check()
                add_start, add_stop = sink.start(buf, base, eid)
                pending = buf
            add_start(pos - base)  # type: ignore[misc]
            add_stop(stop - base)  # type: ignore[misc]
        if add_size is not None:
            add_size(flen)
        w.payload += flen
        w.next_id += 1
        pos = stop
    if sink is not None:
        sink.check()
    return pos


class _FrameSink:
    """Frames collected per stream buffer, then checked in bulk: CRC'd and compared with the hot copy's
    CRCs (``expected``), and their messages checked (``msgs``), in that order."""

    def __init__(self, key: str, expected: array | None, msgs: LedgerMessages | None) -> None:
        self.key = key
        self.expected = expected
        self.msgs = msgs
        self.buf: memoryview | None = None
        self.base = 0
        self.first = 0
        self.starts: list[int] = []
        self.stops: list[int] = []

    def start(self, buf: memoryview, base: int, eid: int):  # noqa: ANN201
        """Collect the frames of ``buf`` (object offset ``base``) from entry ``eid`` on: returns the
        appenders of their start and stop offsets in ``buf``."""
        self.buf, self.base, self.first = buf, base, eid
        return self.starts.append, self.stops.append

    def check(self) -> None:
        if self.buf is None or not self.starts:
            return
        buf, starts, stops = self.buf, self.starts, self.stops
        if self.expected is not None:
            got = array("I", map(_crc, map(buf.__getitem__, map(slice, starts, stops))))
            want = self.expected[self.first : self.first + len(got)]
            if got != want:
                k = next(k for k, (g, x) in enumerate(zip(got, want, strict=True)) if g != x)
                raise _differs(self.key, self.first + k, self.base + starts[k], self.base + stops[k], got[k], want[k])
        if self.msgs is not None:
            payload_starts = list(map(operator.add, starts, itertools.repeat(C.ENTRY_HEADER_SIZE)))
            self.msgs.feed(buf, self.first, payload_starts, list(map(operator.sub, stops, payload_starts)))
        self.buf, self.starts, self.stops = None, [], []


def _messages_result(w: _Walk, rep: VerifyReport, what: str, against_hot: bool) -> None:
    """The message check's tally into ``rep``; DamagedMessagesError when it found damage (raised once the
    whole copy passed every other check)."""
    if w.msgs is None:
        return
    rep.messages = w.msgs.finish()
    if rep.messages.damaged:
        raise DamagedMessagesError(what, rep.messages, same_as_hot=against_hot, report=rep)


def verify_offloaded(
    h: OffloadedLedgerHandle | SegmentLedgerHandle, expected_crcs: Sequence[int] | None = None, *,
    window: int = DEFAULT_WINDOW, expected_sizes: Sequence[int] | None = None, messages: bool | None = None,
    expected_ranges: FrameRanges | None = None,
) -> VerifyReport:
    """Read the whole data object of ``h`` back and check it (see the module docstring).
    ``expected_crcs``: the hot copy's CRC32C per entry (frame header + payload), index = entry id;
    ``expected_sizes``, its payload sizes: frames are then cut where the hot copy says and checked in
    bulk (the CRCs cover each frame's length and entry id), not walked one by one.
    ``messages``: check the Pulsar messages inside the entries (their CRC32C): None (default) in an
    object without chunk checksums, True in any object, False never; their tally is ``messages`` of the
    report, and damaged ones raise DamagedMessagesError after every other check passed.
    ``expected_ranges`` (with the sizes): the hot copy's CRC32C per ~1 MiB of frames
    (:func:`hot_frame_ranges`), checked instead of every frame's; a range that differs is searched for
    the entry that does.
    A ledger held by streaming segments (:class:`SegmentLedgerHandle`) is checked the same way, over
    its blocks in each segment (:func:`verify_segments`)."""
    if isinstance(h, SegmentLedgerHandle):
        return verify_segments(h, expected_crcs, window=window, expected_sizes=expected_sizes, messages=messages,
                               expected_ranges=expected_ranges)
    idx = h.index
    key = h.key
    rep = VerifyReport(against_hot=expected_crcs is not None)
    req0, bytes0 = h.requests, h.bytes_fetched
    n_entries = idx.last_entry_id + 1
    if expected_crcs is not None and len(expected_crcs) != n_entries:
        raise CorruptObjectError(f"{key}: holds {n_entries} entries, the hot copy {len(expected_crcs)}")
    hot = _Hot.of(key, expected_crcs, expected_sizes, expected_ranges)
    s = _Stream(h, window)
    blocks = idx.entries
    length = idx.data_object_length
    # a Pulsar-written object's sidecar is recorded from this pass (the walked sizes or the hot copy's)
    side = h.sidecar if h.sidecar is not None and h.sidecar.recording else None
    w = _Walk(0, n_entries - 1, sizes=array("i") if side is not None and (hot is None or hot.cum is None) else None,
              msgs=LedgerMessages(h.ledger_id) if _checks_messages(h, messages) else None)
    for i, e in enumerate(blocks):
        end = blocks[i + 1].offset if i + 1 < len(blocks) else length
        magic, hl, size, first = _HEADER.unpack(s.view(e.offset, _HEADER.size))
        where = f"{key}: block {i} at bytes {e.offset}-{end - 1}"
        if magic != C.DATA_BLOCK_MAGIC:
            raise CorruptObjectError(f"{where}: magic 0x{magic:08x}, expected 0x{C.DATA_BLOCK_MAGIC:08x}")
        if hl != C.BLOCK_HEADER_LENGTH or size != end - e.offset or first != e.first_entry_id or first != w.next_id:
            raise CorruptObjectError(f"{where}: header says length {size}, header {hl}, first entry {first} "
                                     f"(index: length {end - e.offset}, first entry {e.first_entry_id}; "
                                     f"expected entry {w.next_id})")
        if s.view(e.offset + C.BLOCK_HEADER_USED, C.BLOCK_HEADER_ZEROS) != _ZEROS:
            raise CorruptObjectError(f"{where}: header bytes 28..127 are not zero")
        stop_id = blocks[i + 1].first_entry_id if i + 1 < len(blocks) else n_entries
        _frames_and_padding(s, key, where, i, e.offset + C.BLOCK_HEADER_LENGTH, end, w, hot, stop_id)
        if side is not None:
            side.feed(e.first_entry_id, w.sizes if w.sizes is not None else expected_sizes[e.first_entry_id:stop_id])
            w.sizes = array("i") if w.sizes is not None else None
    if s.end != length:
        raise CorruptObjectError(f"{key}: data object has {length - s.end} bytes after its last block")
    if w.next_id != n_entries or w.payload != idx.length:
        raise CorruptObjectError(f"{key}: holds {w.next_id} entries / {w.payload} bytes, its index says "
                                 f"{n_entries} / {idx.length}")
    if hot is not None:
        hot.finish(key)
    rep.blocks = w.blocks
    rep.entries = w.next_id
    rep.requests = h.requests - req0
    rep.bytes_read = h.bytes_fetched - bytes0
    _messages_result(w, rep, key, hot is not None)
    if side is not None:
        side.finish(background=False)  # every check passed: the offsets are those of the object read
    return rep


def verify_segments(h: SegmentLedgerHandle, expected_crcs: Sequence[int] | None = None, *,
                    window: int = DEFAULT_WINDOW, expected_sizes: Sequence[int] | None = None,
                    messages: bool | None = None, expected_ranges: FrameRanges | None = None) -> VerifyReport:
    """Read back every block of the ledger in each of its segments and check it as
    :func:`verify_offloaded` checks a V1 object: the streaming block header (magic, header length, block
    length up to where the index says the next block starts, first entry, **ledger id**, zero bytes),
    consecutive entry ids from the segment's first entry to its last, the padding, every chunk checksum
    of the bytes read, and, given the hot tier's CRCs, every frame against the hot copy. Each segment's
    section must hold the ledger's payload bytes through its last entry (its ``size``), the last one
    the LedgerInfo's size for a sealed ledger. Only this ledger's blocks are read (other ledgers'
    blocks of a shared segment are theirs to check). ``messages`` as for :func:`verify_offloaded`, per
    segment (the ledger's entries in the segments checked are classified together)."""
    rep = VerifyReport(against_hot=expected_crcs is not None)
    n_entries = h.last_add_confirmed + 1
    if expected_crcs is not None and (len(expected_crcs) != n_entries if h.is_closed
                                      else len(expected_crcs) < n_entries):
        raise CorruptObjectError(f"ledger {h.ledger_id}: its segments hold {n_entries} entries, the hot copy "
                                 f"{len(expected_crcs)}")
    # the ranges cover the whole sealed ledger: used when the segments hold all of it
    ranges = expected_ranges if h.is_closed and expected_ranges is not None and \
        expected_ranges.entries == n_entries else None
    hot = _Hot.of(f"ledger {h.ledger_id}", expected_crcs, expected_sizes, ranges)
    w = _Walk(0, -1)
    audit = LedgerMessages(h.ledger_id)
    audited = False
    for p in h.pieces:
        ph = h.piece_handle(p)
        req0, bytes0 = ph.requests, ph.bytes_fetched
        w.msgs = audit if _checks_messages(ph, messages) else None
        audited |= w.msgs is not None
        view = ph.index
        seg_index: SegmentIndex = view.segment_index  # type: ignore[attr-defined]
        section: LedgerSection = view.section  # type: ignore[attr-defined]
        key = ph.key
        length = seg_index.data_object_length
        offsets = sorted(e.offset for sec in seg_index.sections.values() for e in sec.index_entries)
        ends = dict(zip(offsets, [*offsets[1:], length], strict=True))
        w.last_id = p.last
        blocks = section.index_entries
        # the ledger's blocks are consecutive in a segment; should another ledger's lie in between,
        # each run of consecutive blocks is streamed on its own (never reading the others' bytes)
        run_end: dict[int, int] = {}
        for e in reversed(blocks):
            run_end[e.offset] = run_end.get(ends[e.offset], ends[e.offset])
        s: _Stream | None = None
        for i, e in enumerate(blocks):
            end = ends[e.offset]
            if s is None or e.offset >= s.length:  # the first block of a run
                s = _Stream(ph, window, e.offset, run_end[e.offset])
            magic, hl, size, first, lid = _SEG_HEADER.unpack(s.view(e.offset, _SEG_HEADER.size))
            where = f"{key}: block {i} of ledger {h.ledger_id} at bytes {e.offset}-{end - 1}"
            if magic != C.STREAMING_BLOCK_MAGIC:
                raise CorruptObjectError(f"{where}: magic 0x{magic:08x}, expected 0x{C.STREAMING_BLOCK_MAGIC:08x}")
            if hl != C.BLOCK_HEADER_LENGTH or size != end - e.offset or first != e.first_entry_id \
                    or first != w.next_id or lid != h.ledger_id:
                raise CorruptObjectError(f"{where}: header says length {size}, header {hl}, first entry {first}, "
                                         f"ledger {lid} (index: length {end - e.offset}, first entry "
                                         f"{e.first_entry_id}; expected entry {w.next_id})")
            if s.view(e.offset + _SEG_HEADER.size, _SEG_ZEROS_LEN) != _SEG_ZEROS:
                raise CorruptObjectError(f"{where}: header bytes {_SEG_HEADER.size}..127 are not zero")
            stop_id = blocks[i + 1].first_entry_id if i + 1 < len(blocks) else p.last + 1
            _frames_and_padding(s, key, where, i, e.offset + C.BLOCK_HEADER_LENGTH, end, w, hot, stop_id)
        if w.next_id != p.last + 1 or w.payload != section.size:
            raise CorruptObjectError(f"{key}: holds entries through {w.next_id - 1} / {w.payload} bytes of ledger "
                                     f"{h.ledger_id}, its index says {p.last} / {section.size}")
        rep.requests += ph.requests - req0
        rep.bytes_read += ph.bytes_fetched - bytes0
    if h.is_closed and w.payload != h.length:
        raise CorruptObjectError(f"ledger {h.ledger_id}: its segments hold {w.payload} bytes, the topic's metadata "
                                 f"says {h.length}")
    if hot is not None:
        hot.finish(f"ledger {h.ledger_id}")
    rep.blocks = w.blocks
    rep.entries = w.next_id
    w.msgs = audit if audited else None
    _messages_result(w, rep, f"ledger {h.ledger_id}", hot is not None)
    return rep


def _checks_messages(h: OffloadedLedgerHandle, messages: bool | None) -> bool:
    """Whether a pass over ``h`` checks its messages: as asked, else when it carries no chunk checksums."""
    return h.checksums is None if messages is None else messages
