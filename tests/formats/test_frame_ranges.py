"""Frame ranges (tieredcore.formats.frame_ranges): CRC32C per ~1 MiB of whole frames, the hot tier's
<id>.rng file, built as frames are appended and checked as they are read."""

from __future__ import annotations

import struct
from array import array
from itertools import accumulate

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tieredcore.errors import FormatError, ValidationError
from tieredcore.formats.frame_ranges import (
    FrameRanges,
    RangeAccumulator,
    RangeCheck,
    RangeMismatch,
    decode_frame_ranges,
    encode_frame_ranges,
)


def frames_of(sizes: list[int]) -> bytes:
    """Frames [len][entryId][payload] of entries 0.. with payloads of the given sizes."""
    return b"".join(struct.pack(">iq", n, i) + bytes([i % 251]) * n for i, n in enumerate(sizes))


def ends_of(sizes: list[int]) -> list[int]:
    return list(accumulate((12 + n for n in sizes), initial=0))


def naive_ranges(sizes: list[int], range_bytes: int) -> list[tuple[int, int, int]]:
    """(first entry, offset, crc) per range by the rule, one frame at a time."""
    data, ends = frames_of(sizes), ends_of(sizes)
    out, first = [], 0
    for e in range(1, len(sizes) + 1):
        if e == len(sizes) or ends[e] >= ends[first] + range_bytes:
            out.append((first, ends[first], crc32c.crc32c(data[ends[first] : ends[e]])))
            first = e
    return out


def built(sizes: list[int], range_bytes: int, batches: list[int]) -> FrameRanges:
    """Ranges built by the accumulator fed in batches of the given lengths (the writer's chunks)."""
    acc, data, ends = RangeAccumulator(range_bytes), frames_of(sizes), ends_of(sizes)
    e = 0
    for n in batches:
        n = min(n, len(sizes) - e)
        if n <= 0:
            break
        acc.add(e, ends[e : e + n], memoryview(data)[ends[e] : ends[e + n]])
        e += n
    if e < len(sizes):
        acc.add(e, ends[e : len(sizes)], memoryview(data)[ends[e] :])
    r = acc.result()
    assert r is not None
    return r


def test_file_vector() -> None:
    """Two ranges of a ledger of 3 entries in 60 bytes, byte for byte (docs/formats.md)."""
    r = FrameRanges(32, 3, 60, array("q", [0, 2]), array("q", [0, 40]), array("I", [0xE3069283, 0x01020304]))
    body = bytes.fromhex(
        "54524331" "00000020" "0000000000000003" "000000000000003c" "00000002"
        "0000000000000000" "0000000000000000" "e3069283"
        "0000000000000002" "0000000000000028" "01020304")
    assert encode_frame_ranges(r) == body + struct.pack(">I", crc32c.crc32c(body))
    got = decode_frame_ranges(encode_frame_ranges(r), 3, 60)
    assert got == r


@settings(max_examples=150, deadline=None)
@given(sizes=st.lists(st.integers(0, 300), min_size=1, max_size=120), range_bytes=st.integers(1, 2000),
       batches=st.lists(st.integers(1, 40), max_size=10))
def test_accumulator_matches_the_rule_however_frames_arrive(sizes: list[int], range_bytes: int,
                                                            batches: list[int]) -> None:
    r = built(sizes, range_bytes, batches)
    assert list(zip(r.firsts, r.offsets, r.crcs, strict=True)) == naive_ranges(sizes, range_bytes)
    assert (r.entries, r.end) == (len(sizes), ends_of(sizes)[-1])
    assert decode_frame_ranges(encode_frame_ranges(r), r.entries, r.end) == r  # round trip


@settings(max_examples=100, deadline=None)
@given(sizes=st.lists(st.integers(0, 300), min_size=1, max_size=80), range_bytes=st.integers(1, 1500),
       cuts=st.lists(st.integers(1, 30), max_size=8), data=st.data())
def test_check_passes_intact_frames_fed_in_any_pieces_and_names_a_flipped_byte(
        sizes: list[int], range_bytes: int, cuts: list[int], data: st.DataObject) -> None:
    frames, ends = frames_of(sizes), ends_of(sizes)
    r = built(sizes, range_bytes, [len(sizes)])
    per_frame = array("I", (crc32c.crc32c(frames[ends[i] : ends[i + 1]]) for i in range(len(sizes))))

    def feed_all(buf: bytes) -> None:
        rc, e = RangeCheck(r, ends, per_frame, keep=True), 0
        for n in [*cuts, len(sizes)]:
            n = min(n, len(sizes) - e)
            if n:
                rc.feed(e, memoryview(buf)[ends[e] : ends[e + n]], 1000 + ends[e])
                e += n
        rc.finish()

    feed_all(frames)
    at = data.draw(st.integers(0, len(frames) - 1))
    bad = bytearray(frames)
    bad[at] ^= 0x40
    with pytest.raises(RangeMismatch) as ei:
        feed_all(bytes(bad))
    e = ei.value
    entry = next(i for i in range(len(sizes)) if ends[i] <= at < ends[i + 1])
    assert e.entry == entry and e.entry_bytes == (1000 + ends[entry], 1000 + ends[entry + 1])
    assert e.first <= entry < e.stop


def test_a_range_that_differs_while_every_frame_matches_names_the_range() -> None:
    sizes = [10] * 10
    frames, ends = frames_of(sizes), ends_of(sizes)
    r = built(sizes, 50, [10])
    r.crcs[1] ^= 1  # the recorded range, not the bytes
    per_frame = array("I", (crc32c.crc32c(frames[ends[i] : ends[i + 1]]) for i in range(10)))
    rc = RangeCheck(r, ends, per_frame, keep=True)
    with pytest.raises(RangeMismatch, match=r"entries 3\.\.5 at bytes 66-131") as ei:
        rc.feed(0, memoryview(frames))
    assert ei.value.entry is None


def test_check_refuses_frames_out_of_order_cut_mid_frame_or_missing() -> None:
    sizes = [5, 6, 7, 8]
    frames, ends = frames_of(sizes), ends_of(sizes)
    r = built(sizes, 20, [4])
    rc = RangeCheck(r, ends)
    with pytest.raises(FormatError, match="fed from entry 1, expected entry 0"):
        rc.feed(1, memoryview(frames)[ends[1] :])
    with pytest.raises(FormatError, match="do not end on a frame"):
        rc.feed(0, memoryview(frames)[:20])
    rc.feed(0, memoryview(frames)[: ends[2]])
    with pytest.raises(FormatError, match="checked 1 of 2 ranges"):
        rc.finish()
    with pytest.raises(FormatError, match="do not match the ledger's 5 entries"):
        RangeCheck(r, ends_of([*sizes, 1]))
    with pytest.raises(FormatError, match="do not match"):  # same count and end, a range starts elsewhere
        RangeCheck(r, ends_of([5, 7, 6, 8]))


@pytest.mark.parametrize(("damage", "message"), [
    (lambda b: b[:-1], "records in"),
    (lambda b: b"XXXX" + b[4:], "magic"),
    (lambda b: b[:30] + bytes([b[30] ^ 1]) + b[31:], "CRC32C of the file"),
    (lambda b: b"", "shorter than a header"),
])
def test_a_damaged_file_is_refused(damage, message: str) -> None:
    r = built([100] * 20, 300, [20])
    with pytest.raises(FormatError, match=message):
        decode_frame_ranges(damage(encode_frame_ranges(r)), 20, 2240)


def test_a_file_for_other_entries_is_refused() -> None:
    """A seal redone by recovery with another last entry: the ranges of the first seal do not apply."""
    r = built([100] * 20, 300, [20])
    with pytest.raises(FormatError, match="recorded for 20 entries in 2240 bytes, the ledger holds 19"):
        decode_frame_ranges(encode_frame_ranges(r), 19, 2128)


def test_accumulator_refuses_frames_that_do_not_follow() -> None:
    acc = RangeAccumulator(64)
    acc.add(0, [0, 20], b"x" * 40)
    with pytest.raises(ValidationError, match="expected entry 2 at 40"):
        acc.add(3, [40], b"y" * 20)
    with pytest.raises(ValidationError, match="must be positive"):
        RangeAccumulator(0)
    assert RangeAccumulator().result() is None
