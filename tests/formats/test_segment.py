"""Streaming (PIP-76) segment objects (docs/formats.md "Streaming segments", spec 03): exact byte vectors,
segment planning rules, hypothesis round trips through the V2 index, rejections, and the project's
LedgerInfo properties (checkpoints, checksums).

The byte vectors are written out by hand from the layout; round trips are also checked by the
independent conformance checker (tests/support/v2_checker.py)."""

from __future__ import annotations

import base64
import struct
from itertools import accumulate
from typing import NamedTuple

import crc32c
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.support.v2_checker import check_v2_segment
from tieredcore.errors import FormatError, InvalidMagicError, TruncatedError, ValidationError
from tieredcore.formats import (
    IndexEntry,
    LedgerRun,
    LedgerSection,
    SegmentIndex,
    SegmentPlan,
    StreamingBlock,
    block_pieces,
    build_streaming_block,
    decode_checkpoints_property,
    decode_checksums_property,
    decode_streaming_block,
    encode_checkpoints_property,
    encode_checksums_property,
    encode_index_v2,
    iter_segment,
    parse_block_header,
    parse_index,
    plan_segment,
    segment_checksums,
    segment_sections,
    streaming_block_header,
)
from tieredcore.formats.segment import PROP_CHECKPOINTS, PROP_CHECKSUMS
from tieredcore.formats.trailer import ChunkChecksums

MiB = 1024 * 1024
MD = {"s3managedledgeroffloaderformatversion": "1"}

# --- exact byte vectors (hand-written from the layout) ------------------------------------------------

HEADER_HEX = (
    "26a66d32"  # magic
    "0000000000000080"  # header length 128
    "0000000000500000"  # block length 5 MiB
    "0000000000000007"  # first entry id 7
    "000000000000002a"  # ledger id 42
    + "00" * 92
)

# ledger 9, entries 3 (b"hi!") and 4 (b""), streaming block size 160: 128 + 15 + 12 = 155, 5 padding bytes
BLOCK_HEX = (
    "26a66d32" "0000000000000080" "00000000000000a0" "0000000000000003" "0000000000000009" + "00" * 92
    + "00000003" "0000000000000003" "686921"  # [len 3][entry 3]["hi!"]
    + "00000000" "0000000000000004"  # [len 0][entry 4]
    + "fedcdeadfe"  # padding from the end of the last frame
)  # fmt: skip
BLOCK = bytes.fromhex(BLOCK_HEX)

# ledger 5, one 4-byte entry 0 with a 140-byte block size: the entry does not fit, the block grows to 144
BIG_HEX = (
    "26a66d32" "0000000000000080" "0000000000000090" "0000000000000000" "0000000000000005" + "00" * 92
    + "00000004" "0000000000000000" "01020304"
)  # fmt: skip


def test_streaming_block_header_exact_bytes():
    h = streaming_block_header(42, 7, 5 * MiB)
    assert len(h) == 128
    assert h == bytes.fromhex(HEADER_HEX)
    assert parse_block_header(h) == (42, 7, 5 * MiB)


@pytest.mark.parametrize("args", [(2**63, 0, 200), (1, 2**63, 200), (1, 0, 2**63)])
def test_streaming_block_header_out_of_range(args):
    with pytest.raises(ValidationError, match="out of range"):
        streaming_block_header(*args)


def test_small_block_exact_bytes():
    plan = plan_segment([LedgerRun(9, 3, [3, 0])], 160)
    (b,) = plan.blocks
    assert (b.ledger_id, b.first_entry, b.last_entry, b.block_size, b.frames_length) == (9, 3, 4, 160, 27)
    assert (b.offset, b.part_number, b.padding_length, b.entry_count) == (0, 1, 5, 2)
    assert plan.length == 160 and plan.parts == ((0, 0),)
    frames = BLOCK[128:155]
    assert build_streaming_block(b, frames) == BLOCK
    header, body, pad = block_pieces(b, frames)
    assert (header, bytes(body), pad) == (BLOCK[:128], frames, bytes.fromhex("fedcdeadfe"))
    assert decode_streaming_block(BLOCK) == StreamingBlock(9, 3, 160, [(3, b"hi!"), (4, b"")], 155)
    with pytest.raises(ValidationError, match="26 frame bytes, the plan says 27"):
        block_pieces(b, frames[:-1])


def test_oversized_entry_block_exact_bytes():
    plan = plan_segment([LedgerRun(5, 0, [4])], 140)
    (b,) = plan.blocks
    assert (b.block_size, b.padding_length) == (144, 0)
    assert build_streaming_block(b, bytes.fromhex("00000004 0000000000000000 01020304")) == bytes.fromhex(BIG_HEX)
    assert decode_streaming_block(bytes.fromhex(BIG_HEX)).entries == [(0, b"\x01\x02\x03\x04")]


def test_exactly_full_block_has_no_padding():
    # 128 + (12 + 3) + (12 + 0) + (12 + 5) = 172: the block size itself
    plan = plan_segment([LedgerRun(1, 0, [3, 0, 5, 1])], 172)
    assert [(b.first_entry, b.last_entry, b.block_size, b.padding_length) for b in plan.blocks] == [
        (0, 2, 172, 0),
        (3, 3, 172, 172 - 128 - 13),
    ]


def test_decode_block_at_an_offset():
    buf = b"\x00" * 7 + BLOCK + BLOCK
    assert decode_streaming_block(buf, 7).entries == [(3, b"hi!"), (4, b"")]
    assert decode_streaming_block(buf, 167).data_end == 167 + 155


# --- rejections ---------------------------------------------------------------------------------------


def _patched(at: int, new: bytes, buf: bytes = BLOCK) -> bytes:
    return buf[:at] + new + buf[at + len(new) :]


@pytest.mark.parametrize(
    "buf, error, message",
    [
        (_patched(0, b"\x26\xa6\x6d\x33"), InvalidMagicError, "(?i)magic word"),
        (_patched(0, bytes.fromhex("fbdbabcb")), InvalidMagicError, "(?i)magic word"),  # a V1 block
        (_patched(4, struct.pack(">q", 127)), FormatError, "header length 127"),
        (_patched(4, struct.pack(">q", 0)), FormatError, "header length 0"),
        (_patched(36, b"\x01"), FormatError, "not zero"),
        (_patched(127, b"\x80"), FormatError, "not zero"),
        (_patched(12, struct.pack(">q", 127)), FormatError, "below the header length"),
        (_patched(12, struct.pack(">q", -1)), FormatError, "below the header length"),
        (_patched(159, b"\xff"), FormatError, "padding"),  # last padding byte
        (_patched(155, b"\xfd"), FormatError, "padding"),  # first padding byte
        (BLOCK[:155] + b"\x00" * 5, FormatError, "padding"),  # zeros are not padding
        (_patched(128, struct.pack(">i", 40)), FormatError, "padding"),  # a frame running past the block
        (_patched(143, struct.pack(">q", 5)), FormatError, "expected entry 4"),
        (_patched(132, struct.pack(">q", 4)), FormatError, "expected entry 3"),
        (_patched(12, struct.pack(">q", 140), BLOCK[:128] + bytes.fromhex("fedcdeadfedcdeadfedcdead")),
         FormatError, "no entries"),
        (BLOCK[:159], TruncatedError, "buffer ends at 159"),
        (BLOCK[:127], TruncatedError, "header needs 128"),
        (b"", TruncatedError, "header needs 128"),
        (_patched(12, struct.pack(">q", 161)), TruncatedError, "161 bytes"),
    ],
)
def test_decode_streaming_block_rejects(buf, error, message):
    with pytest.raises(error, match=message):
        decode_streaming_block(buf)


def test_negative_offset_is_refused():
    """Not read counting from the buffer's end (an offset comes from an index)."""
    with pytest.raises(FormatError, match="negative offset -160"):
        parse_block_header(BLOCK, -160)
    for offset in (-160, -128, -1):
        with pytest.raises(FormatError, match=f"negative offset {offset}"):
            decode_streaming_block(BLOCK + BLOCK, offset)


def test_truncation_at_every_length_is_an_error():
    for n in range(len(BLOCK)):
        with pytest.raises(TruncatedError):
            decode_streaming_block(BLOCK[:n])


def test_every_single_byte_flip_is_caught_or_harmless():
    """A flip anywhere is an error, except in payload bytes (covered by checksums, not by the framing) and
    in the ledger id (a block alone cannot tell: iter_segment compares it with the index)."""
    for i in range(len(BLOCK)):
        buf = _patched(i, bytes([BLOCK[i] ^ 0x01]))
        if i in range(140, 143):
            assert decode_streaming_block(buf).entries[0][1] != b"hi!"
        elif i in range(28, 36):
            assert decode_streaming_block(buf).ledger_id != 9
        else:
            with pytest.raises(FormatError):
                decode_streaming_block(buf)


# --- planning rules -------------------------------------------------------------------------------------


RUNS = [LedgerRun(1, 0, [100] * 5), LedgerRun(2, 10, [300, 10])]  # block size 400: room for 272 frame bytes


def _shape(plan: SegmentPlan) -> list[tuple]:
    return [(b.ledger_id, b.first_entry, b.last_entry, b.block_size, b.offset, b.part_number) for b in plan.blocks]


def test_plan_block_sizes_offsets_and_one_ledger_per_block():
    plan = plan_segment(RUNS, 400)
    assert _shape(plan) == [
        (1, 0, 1, 400, 0, 1),  # two 112-byte frames fit, a third does not
        (1, 2, 3, 400, 400, 2),
        (1, 4, 4, 400, 800, 3),  # the ledger's last block is padded to the block size too
        (2, 10, 10, 440, 1200, 4),  # a 312-byte frame is larger than a block: a block of its own
        (2, 11, 11, 400, 1640, 5),  # a new block: never two ledgers in one
    ]
    assert plan.length == 2040
    assert [b.frames_length for b in plan.blocks] == [224, 224, 112, 312, 22]
    assert [b.padding_length for b in plan.blocks] == [48, 48, 160, 0, 250]
    assert [(b.run, b.frames_start) for b in plan.blocks] == [(0, 0), (0, 224), (0, 448), (1, 0), (1, 312)]
    assert plan.frame_cum(1) == (0, 312, 334)


@pytest.mark.parametrize(
    "min_part, parts, numbers",
    [
        (0, ((0, 0), (1, 1), (2, 2), (3, 3), (4, 4)), [1, 2, 3, 4, 5]),  # one block per part
        (400, ((0, 0), (1, 1), (2, 2), (3, 3), (4, 4)), [1, 2, 3, 4, 5]),
        (401, ((0, 1), (2, 3), (4, 4)), [1, 1, 2, 2, 3]),  # parts span ledgers
        (800, ((0, 1), (2, 3), (4, 4)), [1, 1, 2, 2, 3]),
        (1000, ((0, 2), (3, 4)), [1, 1, 1, 2, 2]),  # the last part may be smaller
        (10**9, ((0, 4),), [1, 1, 1, 1, 1]),
    ],
)
def test_plan_parts(min_part, parts, numbers):
    plan = plan_segment(RUNS, 400, min_part)
    assert plan.parts == parts
    assert [b.part_number for b in plan.blocks] == numbers
    assert _shape(plan) == [(*s[:5], n) for s, n in zip(_shape(plan_segment(RUNS, 400)), numbers, strict=True)]


def test_plan_entry_exactly_one_byte_too_large_and_zero_byte_entries():
    plan = plan_segment([LedgerRun(3, 0, [0, 0, 129, 128, 0])], 268)  # room 140: a 128-byte entry fits exactly
    assert [(b.first_entry, b.last_entry, b.block_size) for b in plan.blocks] == [
        (0, 1, 268), (2, 2, 269), (3, 3, 268), (4, 4, 268),
    ]  # fmt: skip


@pytest.mark.parametrize(
    "runs, block_size, message",
    [
        ([LedgerRun(1, 0, [1]), LedgerRun(1, 5, [1])], 200, "appears twice"),
        ([LedgerRun(1, 0, [])], 200, "at least one entry"),
        ([LedgerRun(1, 0, [-1])], 200, "entry size out of"),
        ([LedgerRun(1, 0, [2**31])], 200, "entry size out of"),
        ([LedgerRun(-1, 0, [1])], 200, "must not be negative"),
        ([LedgerRun(1, -1, [1])], 200, "must not be negative"),
        ([LedgerRun(1, 0, [1])], 139, "140-byte minimum"),
    ],
)
def test_plan_rejects(runs, block_size, message):
    with pytest.raises(ValidationError, match=message):
        plan_segment(runs, block_size)


def test_plan_of_nothing_is_empty():
    plan = plan_segment([], 200)
    assert (plan.blocks, plan.parts, plan.length) == ((), (), 0)


# --- building segments (test-side framing, independent of the code under test) ------------------------


def payload(ledger_id: int, entry_id: int, size: int) -> bytes:
    seed = f"{ledger_id}/{entry_id};".encode()
    return (seed * (size // len(seed) + 1))[:size]


def frames_of(run: LedgerRun) -> bytes:
    return b"".join(
        struct.pack(">iq", s, run.first_entry + i) + payload(run.ledger_id, run.first_entry + i, s)
        for i, s in enumerate(run.entry_sizes)
    )


def expected_entries(runs: list[LedgerRun]) -> list[tuple[int, int, bytes]]:
    return [
        (r.ledger_id, r.first_entry + i, payload(r.ledger_id, r.first_entry + i, s))
        for r in runs
        for i, s in enumerate(r.entry_sizes)
    ]


def build(runs: list[LedgerRun], block_size: int, min_part: int = 0) -> tuple[SegmentPlan, bytes]:
    plan = plan_segment(runs, block_size, min_part)
    frames = [frames_of(r) for r in runs]
    blocks = [build_streaming_block(b, frames[b.run][b.frames_start : b.frames_start + b.frames_length])
              for b in plan.blocks]
    assert [len(x) for x in blocks] == [b.block_size for b in plan.blocks]
    return plan, b"".join(blocks)


def check_plan(plan: SegmentPlan, runs: list[LedgerRun], block_size: int, min_part: int) -> None:
    """The planning rules, from the spec, over any plan."""
    room = block_size - 128
    blocks = plan.blocks
    assert [b.run for b in blocks] == sorted(b.run for b in blocks)  # runs in order, blocks in run order
    for r, run in enumerate(runs):
        nxt = run.first_entry
        for b in (b for b in blocks if b.run == r):
            assert b.ledger_id == run.ledger_id and b.first_entry == nxt
            sizes = run.entry_sizes[b.first_entry - run.first_entry : b.last_entry - run.first_entry + 1]
            frames = sum(12 + s for s in sizes)
            assert b.frames_length == frames
            assert b.block_size == max(block_size, 128 + frames)
            if frames > room:  # only an entry larger than a block gets a larger block, alone
                assert len(sizes) == 1
            if b.last_entry < run.last_entry:  # greedy: the next entry did not fit
                assert frames + 12 + run.entry_sizes[b.last_entry + 1 - run.first_entry] > room
            nxt = b.last_entry + 1
        assert nxt == run.last_entry + 1
    assert [b.offset for b in blocks] == list(accumulate((b.block_size for b in blocks[:-1]), initial=0))
    assert plan.length == sum(b.block_size for b in blocks)
    parts = plan.parts
    assert parts[0][0] == 0 and parts[-1][1] == len(blocks) - 1
    assert all(a[1] + 1 == b[0] for a, b in zip(parts, parts[1:], strict=False))
    for number, (a, z) in enumerate(parts, 1):
        assert all(blocks[i].part_number == number for i in range(a, z + 1))
        size = sum(blocks[i].block_size for i in range(a, z + 1))
        if min_part == 0:
            assert a == z
        else:
            assert number == len(parts) or size >= min_part  # every part but the last is large enough
            assert size - blocks[z].block_size < min_part  # and cut as soon as it is


def expected_checkpoints(plan: SegmentPlan, run: int, interval: int) -> list[tuple[int, int]]:
    """The rule of docs/formats.md: in every block, the first frame at least ``interval`` bytes after the
    block's first frame or the previous checkpoint."""
    out = []
    sizes = plan.runs[run].entry_sizes
    first = plan.runs[run].first_entry
    for b in (b for b in plan.blocks if b.run == run):
        pos = last = b.offset + 128
        for e in range(b.first_entry, b.last_entry + 1):
            if e != b.first_entry and pos - last >= interval:
                out.append((e, pos))
                last = pos
            pos += 12 + sizes[e - first]
    return out


# --- hypothesis round trips ------------------------------------------------------------------------------


class Case(NamedTuple):
    block_size: int
    min_part: int
    runs: list[LedgerRun]
    order: list[int]  # section order in the index
    interval: int  # checkpoint interval (0: none)
    chunk: int  # checksum chunk (0: none)


@st.composite
def full_block(draw: st.DrawFn, room: int) -> list[int]:
    """Entry sizes whose frames fill exactly ``room`` bytes (a block with no padding)."""
    k = draw(st.integers(1, min(4, room // 12)))
    spare = room - 12 * k
    cuts = sorted(draw(st.lists(st.integers(0, spare), min_size=k - 1, max_size=k - 1)))
    bounds = [0, *cuts, spare]
    return [b - a for a, b in zip(bounds, bounds[1:], strict=False)]


@st.composite
def cases(draw: st.DrawFn) -> Case:
    block_size = draw(st.integers(140, 600) | st.sampled_from([140, 152]))
    room = block_size - 128
    n = draw(st.integers(1, 4))
    ids = draw(st.lists(st.integers(0, 2**62), min_size=n, max_size=n, unique=True))
    runs = []
    for lid in ids:
        first = draw(st.just(0) | st.integers(1, 2**40))
        if draw(st.booleans()):  # only exactly-full blocks
            chunks = draw(st.lists(full_block(room), min_size=1, max_size=3))
        else:
            chunks = draw(st.lists(st.one_of(
                st.lists(st.integers(0, room), min_size=1, max_size=8),  # fits a block
                full_block(room),
                st.integers(room - 11, 3 * block_size).map(lambda s: [s]),  # larger than a block's room
                st.integers(1, 6).map(lambda k: [0] * k),  # empty entries
            ), min_size=1, max_size=4))  # fmt: skip
        runs.append(LedgerRun(lid, first, [s for c in chunks for s in c]))
    return Case(
        block_size,
        draw(st.sampled_from([0, 1, block_size, block_size + 1, 2 * block_size + 1, 5 * block_size])),
        runs,
        draw(st.permutations(range(n))),
        draw(st.sampled_from([0, 0, 1, 40, 300])),
        draw(st.sampled_from([0, 0, 1, 64, 1000])),
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
@example(Case(140, 0, [LedgerRun(7, 0, [0])], [0], 0, 0))  # one empty entry: an exactly full 140-byte block
@example(Case(152, 0, [LedgerRun(1, 5, [12]), LedgerRun(2, 0, [0, 0])], [1, 0], 1, 4))  # full blocks
@example(Case(200, 1, [LedgerRun(3, 2**40, [500, 0, 72, 60, 1000])], [0], 40, 64))  # oversized, split, full
@example(Case(400, 900, [LedgerRun(i, i, [100] * 7) for i in (9, 4, 6)], [2, 0, 1], 300, 1000))
def test_segment_round_trip(case: Case):
    runs = case.runs
    plan, data = build(runs, case.block_size, case.min_part)
    check_plan(plan, runs, case.block_size, case.min_part)
    assert len(data) == plan.length
    expected = expected_entries(runs)

    checksums = None
    if case.chunk:
        crcs = [crc32c.crc32c(data[i : i + case.chunk]) for i in range(0, len(data), case.chunk)]
        checksums = (case.chunk, crcs)
    sections = segment_sections(plan, checkpoint_interval=case.interval, checksums=checksums)
    assert [s.ledger_id for s in sections] == [r.ledger_id for r in runs]
    for s, r in zip(sections, runs, strict=True):
        assert (s.entries, s.size, s.first_entry_id) == (r.last_entry + 1, r.payload_bytes, r.first_entry)
    shuffled = [sections[i] for i in case.order]
    raw = encode_index_v2(plan.length, shuffled)
    idx = parse_index(raw)
    assert isinstance(idx, SegmentIndex)
    assert (idx.data_object_length, idx.data_header_length, idx.index_length_field) == (len(data), 128, len(raw))
    assert idx.ledger_ids == [s.ledger_id for s in shuffled]
    assert list(idx.sections.values()) == shuffled

    assert list(iter_segment(data, idx)) == expected
    assert check_v2_segment(data, raw, MD, MD, block_size=case.block_size) == {
        r.ledger_id: [(e, p) for lid, e, p in expected if lid == r.ledger_id] for r in runs
    }

    for b in plan.blocks:
        blk = decode_streaming_block(data, b.offset)
        assert (blk.ledger_id, blk.first_entry_id, blk.block_size) == (b.ledger_id, b.first_entry, b.block_size)
        assert [e for e, _ in blk.entries] == list(range(b.first_entry, b.last_entry + 1))
        assert blk.data_end == b.offset + 128 + b.frames_length
    by_offset = {b.offset: b for b in plan.blocks}
    for r in runs:
        for e in {r.first_entry, r.last_entry, (r.first_entry + r.last_entry) // 2}:
            ie, end = idx.lookup_span(r.ledger_id, e)
            b = by_offset[ie.offset]
            assert b.ledger_id == r.ledger_id and b.first_entry <= e <= b.last_entry
            assert (ie.first_entry_id, ie.part_id, end) == (b.first_entry, b.part_number, b.offset + b.block_size)

    for i, r in enumerate(runs):
        want = expected_checkpoints(plan, i, case.interval) if case.interval else []
        prop = idx.section(r.ledger_id).property(PROP_CHECKPOINTS)
        assert (prop is None) == (not want)
        got = decode_checkpoints_property(prop, "t") if prop is not None else ([], [])
        assert list(zip(*got, strict=True)) == want
        for e, off in want:
            assert struct.unpack_from(">iq", data, off)[1] == e  # a frame of that entry starts there
    found = segment_checksums(idx, "t")
    if checksums is None:
        assert found is None
    else:
        assert found == ChunkChecksums(case.chunk, tuple(checksums[1]), len(data))
        assert [s.ledger_id for s in idx.sections.values() if s.property(PROP_CHECKSUMS)] == [runs[0].ledger_id]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**62), st.integers(0, 2**62)), max_size=40, unique_by=(lambda t: t[0],)))
def test_checkpoints_property_round_trip(pairs):
    ids = sorted(p[0] for p in pairs)
    offs = sorted({p[1] for p in pairs})[: len(ids)]
    ids = ids[: len(offs)]
    value = encode_checkpoints_property(list(zip(ids, offs, strict=True)))
    assert base64.b64decode(value) == b"".join(struct.pack(">qq", e, o) for e, o in zip(ids, offs, strict=True))
    assert decode_checkpoints_property(value, "t") == (ids, offs)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 10_000), st.integers(0, 100_000), st.randoms(use_true_random=False))
def test_checksums_property_round_trip(chunk, length, rnd):
    crcs = [rnd.getrandbits(32) for _ in range(-(-length // chunk))]
    value = encode_checksums_property(chunk, crcs)
    assert value.startswith(f"crc32c/{chunk}/")
    assert base64.b64decode(value.split("/", 2)[2]) == b"".join(struct.pack(">I", c) for c in crcs)
    assert decode_checksums_property(value, length, "t") == ChunkChecksums(chunk, tuple(crcs), length)


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


@pytest.mark.parametrize(
    "value, message",
    [
        ("not base64!", "not base64"),
        ("AAA", "not base64"),
        ("é", "not base64"),
        (_b64(b"\x00" * 8), "not whole"),
        (_b64(b"\x00" * 17), "not whole"),
        (_b64(struct.pack(">4q", 5, 100, 5, 200)), "not strictly increasing"),
        (_b64(struct.pack(">4q", 5, 100, 6, 100)), "not strictly increasing"),
        (_b64(struct.pack(">4q", 6, 100, 5, 200)), "not strictly increasing"),
    ],
)
def test_malformed_checkpoints_property(value, message):
    with pytest.raises(FormatError, match=message):
        decode_checkpoints_property(value, "t")


def test_empty_checkpoints_property():
    assert decode_checkpoints_property("", "t") == ([], [])


@pytest.mark.parametrize(
    "value, length, message",
    [
        ("crc32c/4", 4, "malformed"),
        ("crc32c", 4, "malformed"),
        ("crc32c/x/" + _b64(b"\x00" * 4), 4, "malformed"),
        ("crc32c/0/", 0, "malformed"),
        ("crc32c/-4/" + _b64(b"\x00" * 4), 4, "malformed"),
        ("md5/4/" + _b64(b"\x00" * 4), 4, "malformed"),
        ("crc32c/4/" + _b64(b"\x00" * 3), 3, "malformed"),
        ("crc32c/4/!!!!", 4, "malformed"),
        ("crc32c/4/é", 4, "malformed"),
        ("crc32c/4/" + _b64(b"\x00" * 8), 9, "2 chunk checksums for a 9-byte object"),
        ("crc32c/4/" + _b64(b"\x00" * 8), 4, "2 chunk checksums for a 4-byte object"),
    ],
)
def test_malformed_checksums_property(value, length, message):
    with pytest.raises(FormatError, match=message):
        decode_checksums_property(value, length, "t")


def test_malformed_checksums_in_an_index_fail_the_lookup():
    plan, data = build([LedgerRun(1, 0, [10])], 200)
    (s,) = segment_sections(plan, checksums=(64, [0, 0, 0, 0]))  # 200 bytes need 4 chunks of 64
    idx = parse_index(encode_index_v2(len(data), [s]))
    assert segment_checksums(idx, "t") == ChunkChecksums(64, (0, 0, 0, 0), 200)
    bad = LedgerSection(1, s.entries, s.size, s.index_entries, properties=[(PROP_CHECKSUMS, "crc32c/64/")])
    with pytest.raises(FormatError, match="0 chunk checksums for a 200-byte object"):
        segment_checksums(parse_index(encode_index_v2(len(data), [bad])), "t")


# --- iter_segment against a wrong index -----------------------------------------------------------------


def _two_ledgers() -> tuple[bytes, list[LedgerSection]]:
    plan, data = build([LedgerRun(1, 0, [10, 10, 10]), LedgerRun(2, 5, [10, 10])], 170)  # one entry per block
    return data, segment_sections(plan)


def _iter(data: bytes, sections: list[LedgerSection], length: int | None = None) -> list:
    return list(iter_segment(data, parse_index(encode_index_v2(len(data) if length is None else length, sections))))


def _with(s: LedgerSection, entries: tuple[IndexEntry, ...] | None = None, count: int | None = None) -> LedgerSection:
    return LedgerSection(s.ledger_id, s.entries if count is None else count, s.size,
                         s.index_entries if entries is None else entries)


def test_iter_segment_accepts_sections_in_any_order():
    data, (s1, s2) = _two_ledgers()
    assert _iter(data, [s2, s1]) == _iter(data, [s1, s2]) == expected_entries(
        [LedgerRun(1, 0, [10, 10, 10]), LedgerRun(2, 5, [10, 10])])


def test_iter_segment_rejects():
    data, (s1, s2) = _two_ledgers()
    e1, e2 = s1.index_entries, s2.index_entries
    with pytest.raises(FormatError, match="850 bytes, the index says 851"):
        _iter(data, [s1, s2], 851)
    with pytest.raises(FormatError, match="block starts at offset 680 but the index has no entry"):
        _iter(data, [s1, _with(s2, e2[:1])])
    with pytest.raises(FormatError, match="block starts at offset 0 but the index has no entry"):
        _iter(data, [s2])  # a missing section
    with pytest.raises(FormatError, match="ledger 2 ends at entry 6, its section says 7"):
        _iter(data, [s1, _with(s2, count=8)])
    with pytest.raises(FormatError, match="header says ledger 1 entry 0, the index says ledger 2"):
        _iter(data, [LedgerSection(2, 3, 30, e1), LedgerSection(1, 7, 20, e2)])
    with pytest.raises(FormatError, match="no entry there"):  # a shifted offset
        _iter(data, [_with(s1, (e1[0], IndexEntry(1, 2, 174), e1[2])), s2])


def test_index_entries_out_of_order_are_read_in_entry_order():
    """A section listing its blocks out of order reads like Pulsar's sorted map reads it: lookups find
    the right block and the whole object reads back."""
    data, (s1, s2) = _two_ledgers()
    e = s1.index_entries
    swapped = _with(s1, (e[0], e[2], e[1]))
    idx = parse_index(encode_index_v2(len(data), [swapped, s2]))
    assert idx.lookup(1, 1) == e[1]
    assert list(iter_segment(data, idx)) == list(iter_segment(data, parse_index(encode_index_v2(len(data), [s1, s2]))))


def test_iter_segment_rejects_two_index_entries_at_one_offset():
    """A section claiming another ledger's block (an entry beyond its own last entry) was accepted: the
    later index entry at that offset silently replaced the earlier one."""
    data, (s1, s2) = _two_ledgers()
    claims = _with(s1, (*s1.index_entries, IndexEntry(3, 4, 510)))  # 510: ledger 2's first block
    with pytest.raises(FormatError, match="ledgers 1 and 2 both have a block at offset 510"):
        _iter(data, [claims, s2])


def test_a_section_listing_its_blocks_out_of_order_is_read_in_entry_order_like_pulsars_sorted_map():
    from tieredcore.formats.index import IndexEntry, LedgerSection, encode_index_v2, parse_index

    shuffled = LedgerSection(ledger_id=7, entries=30, size=300,
                             index_entries=(IndexEntry(20, 3, 2000), IndexEntry(0, 1, 0), IndexEntry(10, 2, 1000),
                                            IndexEntry(10, 9, 9999)))
    idx = parse_index(encode_index_v2(3000, [shuffled]))
    sec = idx.section(7)
    assert [e.first_entry_id for e in sec.index_entries] == [0, 10, 20]
    assert sec.lookup(15) == IndexEntry(10, 2, 1000)  # the first of two entries for one id wins
    assert sec.lookup(25).offset == 2000 and sec.first_entry_id == 0
