"""Reading a sealed hot ledger's frames for offload with every byte proven against what was written.

A ledger sealed by its writer carries CRC32C per ~1 MiB of frames (tieredcore.formats.frame_ranges): its
frames are read without checking each one's CRC and fed, in entry order, to one :class:`RangeCheck` for
the whole offload. At 1 KiB entries that replaces ~1,000 C calls per MiB (holding the GIL while the store
copies in another thread) with one that releases it. A ledger without ranges (sealed by recovery, or
written before they existed) is checked frame by frame, as before. Either way a bad frame is named: on a
range mismatch its frames are read again frame by frame.
"""

from __future__ import annotations

import logging
from bisect import bisect_right
from collections.abc import Iterator, Sequence

from tieredcore.errors import CorruptEntryError, FormatError
from tieredcore.formats import constants as C
from tieredcore.formats.block import BlockPlan, block_header, padding
from tieredcore.formats.frame_ranges import RangeCheck, RangeMismatch
from tieredcore.hot.tier import FrameSource
from tieredcore.model import Buffer

log = logging.getLogger(__name__)


def range_check_for(frames: FrameSource | None, ends: Sequence[int]) -> RangeCheck | None:
    """The range check of a whole-ledger offload of ``frames`` (cumulative frame ends ``ends``), or None:
    every frame is checked on its own."""
    ranges = frames.frame_ranges(ends) if frames is not None else None
    if ranges is None:
        return None
    try:
        return RangeCheck(ranges, ends)
    except FormatError as e:
        log.warning("ledger %d: %s; every frame's CRC is checked instead", frames.ledger_id, e)  # type: ignore[union-attr]
        return None


def read_checked(frames: FrameSource, first: int, last: int, out: memoryview, rc: RangeCheck | None) -> None:
    """The frames of entries first..last into ``out`` (exactly their length), proven: by their ranges'
    CRCs when ``rc`` is given (fed in entry order), else by each frame's own CRC."""
    if rc is None:
        frames.read_frames_into(first, last, out)
        return
    frames.read_frames_into(first, last, out, verify=False)
    try:
        rc.feed(first, out)
    except RangeMismatch as e:
        raise _named(frames, e) from None


def _named(frames: FrameSource, e: RangeMismatch) -> CorruptEntryError:
    """The error of a range that does not match: the frame that fails its own CRC (read again, one by
    one), else the range itself."""
    buf = memoryview(bytearray(e.end - e.start))
    try:
        frames.read_frames_into(e.first, e.stop - 1, buf)
    except CorruptEntryError as named:
        return named
    return CorruptEntryError(
        f"ledger {frames.ledger_id}: the frames of entries {e.first}..{e.stop - 1} (bytes {e.start}-{e.end - 1}) "
        f"hash to CRC32C {e.got:08x}, not the {e.want:08x} recorded for them at seal")


def check_block(frames: FrameSource, plan: BlockPlan, ends: Sequence[int], buf: Buffer, window: int,
                rc: RangeCheck | None, crcs=None) -> None:  # noqa: ANN001 - crcs: ChunkCrcWriter | None
    """Check a block's frames in the hot tier (and feed the block's bytes to the chunk checksums) without
    building the block: the store copies the same frames from the hot-tier file itself."""
    with memoryview(buf) as mv:
        for piece in checked_block(frames, plan, ends, mv, window, rc):
            if crcs is not None:
                crcs.update(piece)


def frame_runs(plan: BlockPlan, ends: Sequence[int], window: int) -> Iterator[tuple[int, int, int]]:
    """A block's entries as runs of whole entries of at most ``window`` frame bytes (an entry larger than
    the window: a run of its own): ``(first, last, bytes)`` each."""
    first, stop = plan.first_entry, plan.last_entry + 1
    while first < stop:
        nxt = max(first + 1, bisect_right(ends, ends[first] + window, first + 1, stop + 1) - 1)
        yield first, nxt - 1, ends[nxt] - ends[first]
        first = nxt


def checked_block(frames: FrameSource, plan: BlockPlan, ends: Sequence[int], mv: memoryview, window: int,
                  rc: RangeCheck | None) -> Iterator[Buffer]:
    """A block of hot-tier frames as pieces: its header, its frames read in runs (frame_runs) into ``mv``
    (proven by read_checked; an entry larger than the window gets a buffer of its own; a run is only valid
    until the next piece is asked for), its padding."""
    yield block_header(plan.first_entry, plan.block_size)
    for first, last, n in frame_runs(plan, ends, window):
        with (mv[:n] if n <= len(mv) else memoryview(bytearray(n))) as run:
            read_checked(frames, first, last, run, rc)
            yield run
    yield padding(plan.block_size - C.BLOCK_HEADER_LENGTH - plan.frames_length)
