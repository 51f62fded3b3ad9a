"""The read path's bulk walk (tieredcore/offload/reader.py): frames of one payload length checked a piece
at a time by one struct unpack, the tight loop for the rest, payloads of one length unpacked in pieces.
Every check the per-frame walk makes must still hold: a wrong id or length inside a piece is found and
named, an odd-sized entry anywhere reads back, and reads stay byte-exact across windows and blocks."""

from __future__ import annotations

import struct
import threading
from array import array
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.offload.test_reader import MIB, UUID, RecordingStore, _check_batch, offload, payload, rewrite
from tieredcore.errors import FormatError
from tieredcore.formats import constants as C
from tieredcore.offload import reader as R

_FRAME = struct.Struct(">iq")


def frames(first: int, payloads: list[bytes]) -> bytes:
    return b"".join(_FRAME.pack(len(p), first + i) + p for i, p in enumerate(payloads))


# --- the inner loops on synthetic windows -----------------------------------------------------------


@pytest.fixture(params=["python", *(["c"] if R._frames_c is not None else [])])
def walker(request, monkeypatch) -> str:
    """Each walk test twice: the C walk (tieredcore/formats/cbatch.c frames) and the Python loops."""
    if request.param == "python":
        monkeypatch.setattr(R, "_frames_c", None)
    return request.param


@pytest.mark.parametrize("length", [0, 1, 100, 1024])
@pytest.mark.parametrize("bad", [0, 1, 15, 16, 17, 255, 511, 512, 513, 900, 1199])
def test_frames_in_stops_at_a_wrong_id_inside_a_piece(length: int, bad: int, walker: str) -> None:
    """A frame whose id is not the next one stops the walk exactly there, wherever it lies in a piece
    (the frames before it are taken, their lengths recorded; the caller's loop reports it)."""
    n, first = 1200, 7000
    buf = bytearray(frames(first, [payload(i, length) for i in range(n)]) + b"\xfe" * 64)
    stride = length + 12
    buf[bad * stride + 4 : bad * stride + 12] = (first + bad + 5).to_bytes(8, "big")
    lengths = array("i")
    assert R._frames_in(bytes(buf), 0, first, first + n - 1, lengths) == (bad * stride, first + bad)
    assert list(lengths) == [length] * bad


@pytest.mark.parametrize("odd", [0, 3, 16, 200, 511, 512, 700, 1199])
def test_frames_in_walks_past_an_entry_of_another_length(odd: int, walker: str) -> None:
    """An entry of another length inside a run of equal ones: the piece holding it is left to the plain
    loop, which walks it and every frame after it; all lengths come out in order."""
    n, first = 1200, 3
    payloads = [payload(i, 50) for i in range(n)]
    payloads[odd] = payload(odd, 51)
    buf = frames(first, payloads) + b"\xfe" * 64
    lengths = array("i")
    pos, eid = R._frames_in(buf, 0, first, first + n - 1, lengths)
    assert (pos, eid) == (len(buf) - 64, first + n)
    assert list(lengths) == list(map(len, payloads))


def test_frames_in_stops_at_padding_a_frame_crossing_the_window_and_a_negative_length(walker: str) -> None:
    first = 10
    body = frames(first, [payload(i, 64) for i in range(40)])
    stride = 76
    # padding after the frames: stops before it
    lengths = array("i")
    assert R._frames_in(body + C.BLOCK_PADDING * 8, 0, first, first + 99, lengths) == (len(body), first + 40)
    # the window ends inside the last frame: that frame is left to the caller, and so is the one before
    # it when its successor's header does not fit either
    lengths = array("i")
    assert R._frames_in(body[: 39 * stride + 30], 0, first, first + 39, lengths) == (39 * stride, first + 39)
    assert len(lengths) == 39
    lengths = array("i")
    assert R._frames_in(body[: 39 * stride + 5], 0, first, first + 39, lengths) == (38 * stride, first + 38)
    assert len(lengths) == 38
    # a negative length in the middle
    bad = bytearray(body + b"\0" * 24)
    bad[20 * stride : 20 * stride + 4] = (-5).to_bytes(4, "big", signed=True)
    lengths = array("i")
    assert R._frames_in(bytes(bad), 0, first, first + 39, lengths) == (20 * stride, first + 20)


def test_frames_in_never_takes_a_streaming_block_header_as_a_frame(walker: str) -> None:
    """After a full streaming block the next block's [magic][header length 128] sits where a frame header
    would: read as (length, id) it is (STREAMING_BLOCK_MAGIC, 128); with entry 128 next it must not be
    taken as a frame (the caller's loop recognises the block header)."""
    first = 100
    body = frames(first, [payload(i, 20) for i in range(28)])  # entries 100..127
    block = struct.pack(">Iq", C.STREAMING_BLOCK_MAGIC, C.BLOCK_HEADER_LENGTH) + b"\0" * 200
    lengths = array("i")
    assert R._frames_in(body + block, 0, first, first + 40, lengths) == (len(body), 128)


@settings(max_examples=300, deadline=None)
@given(lengths=st.lists(st.integers(0, 40), max_size=30), damage=st.lists(st.tuples(st.integers(0, 2000),
       st.integers(0, 255)), max_size=3), start=st.integers(0, 8), room=st.integers(0, 80))
def test_the_c_walk_equals_the_python_walk(lengths: list[int], damage: list, start: int, room: int) -> None:
    """Random windows of frames (damaged bytes, short tails, padding): the same stop, id and lengths."""
    if R._frames_c is None:
        return
    buf = bytearray(b"\x00" * start + frames(50, [bytes([i % 251]) * n for i, n in enumerate(lengths)]) + b"\x00" * room)
    for at, v in damage:
        if buf:
            buf[at % len(buf)] = v
    buf += b"\x00" * max(0, start + 12 - len(buf))
    got = {}
    for who in ("c", "python"):
        saved = R._frames_c
        if who == "python":
            R._frames_c = None
        try:
            out = array("i")
            got[who] = (R._frames_in(bytes(buf), start, 50, 50 + len(lengths) + 2, out), out.tolist())
        finally:
            R._frames_c = saved
    assert got["c"] == got["python"]


@pytest.mark.parametrize("n", [1, 15, 16, 17, 511, 512, 513, 1000, 1537, 9000])
@pytest.mark.parametrize("mixed", [False, True])
def test_payloads_and_starts_of_a_run(n: int, mixed: bool) -> None:
    at = 333
    payloads = [payload(i, 37 + (i % 3 if mixed else 0)) for i in range(n)]
    buf = b"x" * at + frames(0, payloads) + b"tail"
    lengths = array("i", map(len, payloads))
    assert list(R._payloads(buf, at, lengths)) == payloads
    st = R._starts(at, lengths)
    assert [buf[s : s + k] for s, k in zip(st, lengths, strict=True)] == payloads
    assert list(R._starts(0, array("i"))) == []


# --- whole objects --------------------------------------------------------------------------------


@pytest.mark.parametrize("read_buffer", [5000, 64 * 1024, MIB])
@pytest.mark.parametrize("odd", [None, 0, 17, 600, 2999])
def test_fixed_size_entries_read_back_across_windows_and_blocks(fs_store, tmp_path: Path, read_buffer: int,
                                                                 odd: int | None) -> None:
    payloads = [payload(i, 300) for i in range(3000)]
    if odd is not None:
        payloads[odd] = payload(odd, 7)
    off, obj = offload(fs_store, tmp_path, payloads, max_block_size=256 * 1024, read_buffer=read_buffer)
    assert obj.blocks > 2
    h = off.read_offloaded(obj.ledger_id, UUID)
    assert [e.data for e in h.read(0, 2999)] == payloads
    assert [e.entry_id for e in h.read(1000, 1999)] == list(range(1000, 2000))
    for first, last in ((0, 2999), (1, 1), (13, 1013), (590, 610), (2500, 2999)):
        _check_batch(off.read_offloaded(obj.ledger_id, UUID).read_batch(first, last), first,
                     payloads[first : last + 1])
    h = off.read_offloaded(obj.ledger_id, UUID)  # a stream of batches
    for first in range(0, 3000, 700):
        _check_batch(h.read_batch(first, min(first + 699, 2999)), first, payloads[first : first + 700])


@pytest.mark.parametrize("field", ["id", "length"])
@pytest.mark.parametrize("entry", [37, 600, 1023])
def test_damaged_frame_inside_fixed_size_entries_is_a_format_error(fs_store, tmp_path: Path, field: str,
                                                                   entry: int) -> None:
    """Without checksums (Pulsar's objects) a damaged frame header among frames of one length fails the
    read naming the entry expected, and the entries before it still read."""
    payloads = [payload(i, 100) for i in range(1024)]
    off, obj = offload(fs_store, tmp_path, payloads, pulsar_index=True)
    data = bytearray(fs_store.get(obj.data_key))
    pos = C.BLOCK_HEADER_LENGTH + entry * 112
    if field == "id":
        data[pos + 4 : pos + 12] = (entry + 1000).to_bytes(8, "big")
    else:  # a longer payload: the next frame's header is read from inside this payload
        data[pos : pos + 4] = (150).to_bytes(4, "big")
    rewrite(fs_store, obj.data_key, data=bytes(data))
    h = off.read_offloaded(obj.ledger_id, UUID)
    assert [e.data for e in h.read(0, entry - 1)] == payloads[:entry]
    if field == "id":
        says = f"expected entry {entry} at offset {pos}, found entry {entry + 1000}"
    elif entry < 1023:  # the next frame's header is read from inside this payload
        says = f"expected entry {entry + 1} at offset {pos + 162}"
    else:
        says = f"entry {entry} of 150 bytes runs past the object end"
    for read in (lambda h: h.read(0, 1023), lambda h: h.read_batch(0, 1023)):
        with pytest.raises(FormatError, match=says):
            read(off.read_offloaded(obj.ledger_id, UUID))


# --- catch-up streams: the next window is on its way before the first is awaited ---------------------


class FirstWaitsForSecond(RecordingStore):
    """A store that does not read ahead itself (as S3), whose GET of the object's first bytes waits until
    the GET of the next window has started (or 5 s): it tells whether the two were in flight together."""

    reads_ahead = False

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.second_started = threading.Event()
        self.overlapped: bool | None = None

    def get_range(self, key, start, end):
        if start == C.DEFAULT_STREAM_WINDOW:
            self.second_started.set()
        elif start == 0 and self.overlapped is None:
            self.overlapped = self.second_started.wait(5)
        return super().get_range(key, start, end)


def test_catch_up_read_asks_for_the_next_window_before_awaiting_the_first(fs_store, tmp_path: Path) -> None:
    entries = [payload(i, 4096) for i in range(5000)]  # ~20 MiB: two stream windows
    store = FirstWaitsForSecond(fs_store)
    off, obj = offload(store, tmp_path, entries)
    h = off.read_offloaded(obj.ledger_id, UUID)
    store.ranges.clear()
    assert [e.data for e in h.read(0, 999)] == entries[:1000]
    assert store.overlapped is True
    assert [e.data for e in h.read(1000, 4999)] == entries[1000:]
    assert sorted(store.ranges) == [(0, C.DEFAULT_STREAM_WINDOW - 1), (C.DEFAULT_STREAM_WINDOW, obj.data_length - 1)]
    h.close()


class NoReadAhead(RecordingStore):
    """A store that does not read ahead itself (as S3): the handle streams windows and reads ahead."""

    reads_ahead = False


@pytest.mark.parametrize("cut", [1, 6, 11, 12, 13, 500])
def test_frame_straddling_two_stream_windows_is_bridged_without_another_get(fs_store, tmp_path: Path,
                                                                           cut: int) -> None:
    """A frame (header included) cut by the border of two stream windows, the second read ahead: the
    reader joins just that frame's bytes from both; no GET beyond one per window, each byte once."""
    w = C.DEFAULT_STREAM_WINDOW
    frames_before = (w - C.BLOCK_HEADER_LENGTH) // 4108 - 1
    at = C.BLOCK_HEADER_LENGTH + frames_before * 4108  # where the stretching entry's frame starts
    stretch = (w - cut) - at - 12  # its payload: the next frame starts `cut` bytes before the border
    entries = [payload(i, 4096) for i in range(5000)]
    entries[frames_before] = payload(frames_before, stretch)
    store = NoReadAhead(fs_store)
    off, obj = offload(store, tmp_path, entries)
    assert obj.blocks == 1
    h = off.read_offloaded(obj.ledger_id, UUID)
    store.ranges.clear()
    got = []
    for first in range(0, 5000, 500):  # 2 MiB a call: a stream from the first
        got += h.read_batch(first, first + 499).payloads()
    assert got == entries
    assert sorted(store.ranges) == [(0, w - 1), (w, obj.data_length - 1)]
    assert h.bytes_fetched == obj.data_length
    h.close()
