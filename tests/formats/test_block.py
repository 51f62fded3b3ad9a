"""V1 data blocks (docs/formats.md): worked examples byte for byte, rejections, hypothesis round trips."""

from __future__ import annotations

import random
import struct

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tieredcore.errors import (
    FormatError,
    InvalidMagicError,
    LedgerStateError,
    TruncatedError,
    ValidationError,
)
from tieredcore.formats import (
    BlockPlan,
    IndexEntry,
    block_header,
    build_block,
    check_data_object,
    check_index_v1,
    decode_block,
    encode_consecutive_frames,
    encode_data_object,
    encode_frames,
    encode_index_v1,
    encode_ledger_metadata,
    frames_offsets,
    index_entries_for,
    iter_data_object,
    padding,
    parse_frames,
    parse_index,
    plan_blocks,
    scan_frames,
)
from tieredcore.formats.constants import (
    BLOCK_HEADER_LENGTH,
    DEFAULT_MAX_BLOCK_SIZE,
    MIN_BLOCK_SIZE,
)
from tieredcore.model import STATE_CLOSED, LedgerMetadata

MiB = 1024 * 1024
PAD4 = bytes.fromhex("FEDCDEAD")


def payloads_of(sizes: list[int], seed: int = 7) -> list[bytes]:
    rnd = random.Random(seed)
    return [rnd.randbytes(s) for s in sizes]


# --- primitives ----------------------------------------------------------------------------------


def test_encode_frames_exact_bytes():
    assert encode_frames([(5, b"ab"), (6, b"")]) == bytes.fromhex(
        "0000000200000000000000056162000000000000000000000006"
    )
    assert encode_frames([]) == b""
    assert encode_frames(iter([(1, memoryview(b"x"))])) == bytes.fromhex("00000001 0000000000000001 78")


def test_encode_consecutive_frames_matches_encode_frames():
    payloads = [b"", b"a", b"bc" * 100, memoryview(b"xyz")]
    assert encode_consecutive_frames(40, payloads) == encode_frames(zip(range(40, 44), payloads, strict=True))
    assert encode_consecutive_frames(0, []) == b""
    with pytest.raises(ValidationError):
        encode_consecutive_frames(2**63 - 1, [b"a", b"b"])


def test_encode_frames_rejects_out_of_range_id():
    with pytest.raises(ValidationError):
        encode_frames([(2**63, b"x")])


def test_padding_cycle():
    assert padding(0) == b""
    assert padding(1) == b"\xfe"
    assert padding(3) == b"\xfe\xdc\xde"
    assert padding(6) == bytes.fromhex("FEDCDEADFEDC")
    assert padding(88) == PAD4 * 22
    with pytest.raises(ValidationError):
        padding(-1)


def test_block_header_exact():
    h = block_header(7, 1000)
    assert len(h) == BLOCK_HEADER_LENGTH
    assert h[:28] == bytes.fromhex("fbdbabcb000000000000008000000000000003e80000000000000007")
    assert h[28:] == bytes(100)


def test_block_plan_properties():
    p = BlockPlan(0, 6, 1000, 784)
    assert p.entry_count == 7
    assert p.payload_length == 700
    assert p.padding_length == 88


# --- worked examples (docs/formats.md) -----------------------------------------------------------------


def test_example1_three_entries_of_10_bytes():
    entries = [bytes([i]) * 10 for i in range(3)]
    data, index = encode_data_object(entries, DEFAULT_MAX_BLOCK_SIZE)
    assert len(data) == 194 == 128 + 3 * 22
    assert index == [IndexEntry(0, 1, 0)]
    assert data[:28].hex() == "fbdbabcb000000000000008000000000000000c20000000000000000"
    assert data[28:128] == bytes(100)
    assert plan_blocks([10, 10, 10], DEFAULT_MAX_BLOCK_SIZE) == [BlockPlan(0, 2, 194, 66)]
    assert decode_block(data) == (0, 194, list(enumerate(entries)))
    check_data_object(data, index, DEFAULT_MAX_BLOCK_SIZE)


def test_example2_hundred_entries_block_1000():
    entries = payloads_of([100] * 100)
    data, index = encode_data_object(entries, 1000)
    assert len(data) == 14352
    assert index == [IndexEntry(7 * i, i + 1, 1000 * i) for i in range(15)]
    assert index[1] == IndexEntry(7, 2, 1000) and index[-1] == IndexEntry(98, 15, 14000)
    assert data[1000:1004] == bytes.fromhex("fbdbabcb")
    for i in range(14):
        assert data[1000 * i + 912 : 1000 * (i + 1)] == PAD4 * 22
        assert decode_block(data[1000 * i : 1000 * (i + 1)]).entries == list(
            zip(range(7 * i, 7 * i + 7), entries[7 * i : 7 * i + 7], strict=True)
        )
    last = decode_block(data[14000:])
    assert last == (98, 352, [(98, entries[98]), (99, entries[99])])
    plans = plan_blocks([100] * 100, 1000)
    assert plans == [BlockPlan(7 * i, 7 * i + 6, 1000, 784) for i in range(14)] + [
        BlockPlan(98, 99, 352, 224)
    ]
    assert plans[-1].padding_length == 0
    check_data_object(data, index, 1000)


@pytest.mark.parametrize("p", [0, 1, 10, 1000, 123457])
def test_example3_one_entry(p):
    data, index = encode_data_object([b"z" * p], DEFAULT_MAX_BLOCK_SIZE)
    assert len(data) == 140 + p
    assert index == [IndexEntry(0, 1, 0)]
    assert decode_block(data) == (0, 140 + p, [(0, b"z" * p)])


def _frames(first: int, count: int, size: int) -> bytes:
    return encode_frames((i, bytes([i % 256]) * size) for i in range(first, first + count))


def test_example4_entry8_lac160_block3153():
    plans = plan_blocks([8] * 161, 3153)
    assert plans[0] == BlockPlan(0, 150, 3153, 151 * 20)
    block = build_block(plans[0], _frames(0, 151, 8))
    assert len(block) == 3153
    end_of_entries = 128 + 151 * 20
    assert len(block) - end_of_entries == 5
    assert struct.unpack_from(">I", block, end_of_entries)[0] == 0xFEDCDEAD
    assert struct.unpack_from(">i", block, end_of_entries)[0] < 0
    assert block[end_of_entries:] == bytes.fromhex("FEDCDEADFE")
    first, size, entries = decode_block(block)
    assert (first, size, len(entries)) == (0, 3153, 151)
    scan = scan_frames(block, 128)
    assert len(scan.entries) == 151 and scan.end_of_block and scan.next_pos == end_of_entries
    # the rest of the ledger: 10 entries, last block exact
    assert plans[1:] == [BlockPlan(151, 160, 128 + 200, 200)]


def test_example4_entry8_lac120_block2148_no_padding():
    plans = plan_blocks([8] * 121, 2148)
    assert plans[0] == BlockPlan(0, 100, 2148, 2020)
    assert plans[0].padding_length == 0
    block = build_block(plans[0], _frames(0, 101, 8))
    assert len(block) == 2148
    assert len(decode_block(block).entries) == 101
    scan = scan_frames(block, 128)
    assert len(scan.entries) == 101 and not scan.end_of_block and scan.next_pos == 2148


def test_example4_entry1000_block2128_one_entry():
    plan = BlockPlan(0, 0, 128 + 2000, 1012)
    block = build_block(plan, _frames(0, 1, 1000))
    assert len(block) == 2128
    assert block[128 + 1012 :] == padding(988)
    assert len(block[128 + 1012 :]) == 988
    assert decode_block(block) == (0, 2128, [(0, bytes([0]) * 1000)])


# --- reading frames ------------------------------------------------------------------------------


def test_read_path_walk_across_blocks():
    entries = payloads_of([100] * 100)
    data, index = encode_data_object(entries, 1000)
    got: list[tuple[int, bytes]] = []
    for ie in index:
        scan = scan_frames(data, ie.offset + 128, first_id=ie.first_entry_id)
        got += scan.entries
        assert scan.end_of_block == (ie.part_id != 15)  # the last block ends at the object end
    assert got == list(enumerate(entries))


def test_scan_frames_stops_before_partial_frame_and_at_last_id():
    frames = _frames(0, 5, 10)  # 22 bytes each
    scan = scan_frames(frames, 0, 22 * 3 + 5)
    assert [e for e, _ in scan.entries] == [0, 1, 2]
    assert scan.next_pos == 66 and not scan.end_of_block
    scan = scan_frames(frames, 0, 66 + 13)  # header of entry 3 fits, payload does not
    assert scan.next_pos == 66 and len(scan.entries) == 3
    scan = scan_frames(frames, 22, last_id=2)
    assert [e for e, _ in scan.entries] == [1, 2] and scan.next_pos == 66
    assert parse_frames(frames, 0, first_id=0) == [(i, bytes([i]) * 10) for i in range(5)]
    with pytest.raises(FormatError, match="expected entry 7"):
        parse_frames(frames, 0, first_id=7)
    # a negative int32 with fewer than 12 bytes left is still an end marker
    assert scan_frames(frames + b"\xfe\xdc\xde\xad", 110).end_of_block
    with pytest.raises(ValidationError):
        scan_frames(frames, 0, len(frames) + 1)


# --- plan_blocks validation ----------------------------------------------------------------------


def test_plan_rejects_empty_ledger():
    with pytest.raises(LedgerStateError, match="no entries"):
        plan_blocks([], 1000)


def test_plan_rejects_entry_too_large_for_block():
    assert plan_blocks([860], 1000) == [BlockPlan(0, 0, 1000, 872)]
    with pytest.raises(ValidationError) as ei:
        plan_blocks([10, 861, 5], 1000)
    assert "861" in str(ei.value) and "1000" in str(ei.value)
    with pytest.raises(ValidationError):
        encode_data_object([b"x" * 2000], 2000)


def test_plan_rejects_tiny_block_size():
    with pytest.raises(ValidationError, match="139"):
        plan_blocks([0], MIN_BLOCK_SIZE - 1)
    assert plan_blocks([0, 0], MIN_BLOCK_SIZE) == [BlockPlan(0, 0, 140, 12), BlockPlan(1, 1, 140, 12)]


def test_plan_rejects_negative_size():
    with pytest.raises(ValidationError):
        plan_blocks([1, -1], 1000)


def test_plan_one_million_entries():
    n = 1_000_000
    sizes = [(i * 37) % 100 for i in range(n)]
    max_block = 64 * 1024
    plans = plan_blocks(sizes, max_block)
    total_frames = sum(sizes) + 12 * n
    assert sum(p.frames_length for p in plans) == total_frames
    assert plans[0].first_entry == 0 and plans[-1].last_entry == n - 1
    assert all(a.last_entry + 1 == b.first_entry for a, b in zip(plans, plans[1:], strict=False))
    assert all(p.block_size == max_block for p in plans[:-1])
    assert plans[-1].padding_length == 0
    # greedy: the next entry would not have fitted in the padding
    assert all(p.padding_length < 12 + sizes[p.last_entry + 1] for p in plans[:-1])
    assert sum(p.block_size for p in plans) == 128 * len(plans) + total_frames + sum(
        p.padding_length for p in plans
    )


# --- build_block / decode_block rejections -------------------------------------------------------


def _example2() -> tuple[bytes, list[IndexEntry]]:
    return encode_data_object(payloads_of([100] * 100), 1000)


def test_build_block_checks_frames_length_and_first_id():
    frames = _frames(0, 3, 10)
    with pytest.raises(ValidationError, match="frame bytes"):
        build_block(BlockPlan(0, 2, 1000, 67), frames)
    with pytest.raises(ValidationError):
        build_block(BlockPlan(0, 2, 150, 66), frames)
    with pytest.raises(FormatError):
        build_block(BlockPlan(1, 3, 1000, 66), frames)


def test_decode_rejects_bad_magic():
    data, _ = _example2()
    block = bytearray(data[:1000])
    block[0] ^= 0xFF
    with pytest.raises(InvalidMagicError, match="Invalid MagicWord"):
        decode_block(block)
    with pytest.raises(InvalidMagicError, match="Invalid MagicWord"):
        decode_block(bytes(1000))


def test_decode_rejects_wrong_header_length():
    block = bytearray(_example2()[0][:1000])
    struct.pack_into(">q", block, 4, 129)
    with pytest.raises(FormatError, match="header length 129"):
        decode_block(block)


def test_decode_rejects_nonzero_header_tail():
    block = bytearray(_example2()[0][:1000])
    block[127] = 1
    with pytest.raises(FormatError, match="zero"):
        decode_block(block)


def test_decode_rejects_truncated_block():
    data, _ = _example2()
    for cut in (0, 5, 127, 128, 500, 999):
        with pytest.raises(TruncatedError) as ei:
            decode_block(data[:cut])
        assert isinstance(ei.value, EOFError)


def test_decode_rejects_bad_padding():
    block = bytearray(_example2()[0][:1000])
    block[999] ^= 1
    with pytest.raises(FormatError, match="padding"):
        decode_block(block)
    block = bytearray(_example2()[0][:1000])
    block[912] = 0x7E  # a positive "length" where padding starts: frame overruns the block
    with pytest.raises(FormatError):
        decode_block(block)


def test_decode_rejects_non_consecutive_ids():
    block = bytearray(_example2()[0][:1000])
    struct.pack_into(">q", block, 128 + 112 + 4, 5)  # second frame claims entry 5
    with pytest.raises(FormatError, match="expected 1"):
        decode_block(block)
    block = bytearray(_example2()[0][:1000])
    struct.pack_into(">q", block, 20, 3)  # header first id disagrees with the frames
    with pytest.raises(FormatError, match="expected 3"):
        decode_block(block)


def test_decode_rejects_overrunning_frame_and_length_mismatch():
    block = bytearray(_example2()[0][:1000])
    struct.pack_into(">i", block, 128, 5000)
    with pytest.raises(FormatError, match="overruns"):
        decode_block(block)
    data, _ = _example2()
    with pytest.raises(FormatError, match="bytes given"):
        decode_block(data[:1500])
    assert decode_block(data[:1500], exact=False).block_size == 1000
    assert decode_block(data, 1000, exact=False).first_entry_id == 7


def test_decode_rejects_block_without_entries():
    with pytest.raises(FormatError, match="no entries"):
        decode_block(block_header(0, 200) + padding(72))


# --- check_data_object ---------------------------------------------------------------------------


def test_check_data_object_violations():
    data, index = _example2()
    check_data_object(data, index, 1000)
    with pytest.raises(FormatError, match="max block size"):
        check_data_object(data, index, 2000)
    bad = list(index)
    bad[3] = IndexEntry(22, 4, 3000)
    with pytest.raises(FormatError, match="index first entry id 22"):
        check_data_object(data, bad)
    bad = list(index)
    bad[3] = IndexEntry(21, 4, 3100)
    with pytest.raises(FormatError):
        check_data_object(data, bad)
    with pytest.raises(FormatError, match="next offset"):
        check_data_object(data + b"\xfe", index)
    with pytest.raises(FormatError, match="offset 10"):
        check_data_object(data, [IndexEntry(0, 1, 10)])
    with pytest.raises(FormatError, match="no blocks"):
        check_data_object(data, [])
    # blocks individually valid but entry ids do not continue across blocks
    b1 = build_block(BlockPlan(0, 0, 150, 22), _frames(0, 1, 10))
    b2 = build_block(BlockPlan(2, 2, 150, 22), _frames(2, 1, 10))
    with pytest.raises(FormatError, match="expected 1"):
        check_data_object(b1 + b2, [IndexEntry(0, 1, 0), IndexEntry(2, 2, 150)])
    corrupt = bytearray(data)
    corrupt[2000] = 0
    with pytest.raises(InvalidMagicError):
        check_data_object(corrupt, index)


def test_check_data_object_against_ledger_index():
    entries = payloads_of([100] * 100)
    data, ies = _example2()
    md = LedgerMetadata(ledger_id=9, state=STATE_CLOSED, last_entry_id=99, length=10000)
    idx = parse_index(encode_index_v1(encode_ledger_metadata(md), len(data), ies), 9)
    check_data_object(data, idx, 1000)
    assert list(iter_data_object(data, idx)) == list(enumerate(entries))
    wrong = LedgerMetadata(ledger_id=9, state=STATE_CLOSED, last_entry_id=100, length=10000)
    idx = parse_index(encode_index_v1(encode_ledger_metadata(wrong), len(data), ies), 9)
    with pytest.raises(FormatError, match="lastEntryId"):
        check_data_object(data, idx)
    wrong = LedgerMetadata(ledger_id=9, state=STATE_CLOSED, last_entry_id=99, length=10001)
    idx = parse_index(encode_index_v1(encode_ledger_metadata(wrong), len(data), ies), 9)
    with pytest.raises(FormatError, match="payload"):
        check_data_object(data, idx)
    idx = parse_index(encode_index_v1(encode_ledger_metadata(md), len(data) + 1, ies), 9)
    with pytest.raises(FormatError, match="index says"):
        check_data_object(data, idx)


# --- hypothesis round trips ----------------------------------------------------------------------


@st.composite
def ledgers(draw):
    """(sizes, seed, max_block_size): a few large entries or many small ones (bounded total)."""
    kind = draw(st.sampled_from(["tiny", "small", "medium", "large"]))
    max_size, max_count = {
        "tiny": (64, 300),
        "small": (4096, 100),
        "medium": (256 * 1024, 12),
        "large": (2 * MiB, 4),
    }[kind]
    sizes = draw(st.lists(st.integers(0, max_size), min_size=1, max_size=max_count))
    minimum = max(sizes) + MIN_BLOCK_SIZE
    total = sum(sizes) + 12 * len(sizes) + 128
    block = draw(
        st.one_of(
            st.integers(minimum, max(minimum, total)),  # several blocks
            st.integers(minimum, DEFAULT_MAX_BLOCK_SIZE),  # anything allowed
            st.just(minimum),
        )
    )
    return sizes, draw(st.integers(0, 2**32)), block


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ledgers())
@example(([2 * MiB, 0, 2 * MiB - 1, 5], 1, 2 * MiB + MIN_BLOCK_SIZE))  # 2 MiB entries, tightest block
@example(([2 * MiB, 2 * MiB, 2 * MiB], 2, DEFAULT_MAX_BLOCK_SIZE))  # one 64 MiB-max block
@example(([0] * 300, 3, MIN_BLOCK_SIZE))  # empty entries, one per block
def test_round_trip_random_ledgers(ledger):
    sizes, seed, max_block = ledger
    entries = payloads_of(sizes, seed)
    n = len(entries)
    data, ies = encode_data_object(entries, max_block)

    # the offloader's path: hot-tier frames sliced per plan give the same bytes
    plans = plan_blocks(sizes, max_block)
    frames = encode_frames(enumerate(entries))
    assert (
        b"".join(
            build_block(p, frames[s : s + p.frames_length])
            for p, s in zip(plans, frames_offsets(plans), strict=True)
        )
        == data
    )
    assert index_entries_for(plans) == ies
    assert all(p.block_size == max_block for p in plans[:-1])
    assert plans[-1].padding_length == 0

    md = LedgerMetadata(ledger_id=42, state=STATE_CLOSED, last_entry_id=n - 1, length=sum(sizes))
    idx = parse_index(encode_index_v1(encode_ledger_metadata(md), len(data), ies), 42)
    check_index_v1(
        idx, len(data), max_block_size=max_block, expected_last_entry_id=n - 1, expected_length=sum(sizes)
    )
    check_data_object(data, idx, max_block)

    seen = []
    for i, ie in enumerate(idx.entries):
        end = idx.entries[i + 1].offset if i + 1 < len(idx.entries) else len(data)
        first, size, block_entries = decode_block(data[ie.offset : end])
        assert (first, size) == (ie.first_entry_id, end - ie.offset)
        for eid, payload in block_entries:
            assert idx.lookup(eid) == ie
            assert payload == entries[eid]
        seen += [eid for eid, _ in block_entries]
    assert seen == list(range(n))


@given(st.lists(st.integers(0, 3000), min_size=1, max_size=300), st.integers(3200, 20000), st.integers(1, 5000))
def test_shared_frame_ends_give_the_same_plan_and_checkpoints(sizes: list[int], block: int, interval: int) -> None:
    from tieredcore.formats.block import checkpoints_for, frame_ends

    ends = frame_ends(sizes)
    assert ends[0] == 0 and ends[-1] == sum(sizes) + 12 * len(sizes) and len(ends) == len(sizes) + 1
    plans = plan_blocks(sizes, block)
    assert plan_blocks(sizes, block, ends) == plans
    assert checkpoints_for(plans, sizes, interval, ends) == checkpoints_for(plans, sizes, interval)


def test_plan_blocks_refuses_frame_ends_of_another_ledger() -> None:
    from tieredcore.formats.block import frame_ends

    with pytest.raises(ValidationError, match="3 cumulative frame ends for 3 entries"):
        plan_blocks([1, 2, 3], 4096, frame_ends([1, 2]))


def _checkpoints_by_the_rule(plans, sizes: list[int], interval: int) -> list[tuple[int, int]]:
    """The checkpoint rule one frame at a time: in each block, the first frame at least ``interval`` bytes
    after the block's first frame or the previous checkpoint."""
    out, off = [], 0
    for p in plans:
        pos, last_cp = off + 128, off + 128
        for eid in range(p.first_entry, p.last_entry + 1):
            if eid > p.first_entry and pos - last_cp >= interval:
                out.append((eid, pos))
                last_cp = pos
            pos += 12 + sizes[eid]
        off += p.block_size
    return out


@given(st.one_of(
    st.lists(st.integers(0, 3000), min_size=1, max_size=300),
    st.tuples(st.integers(0, 2000), st.integers(1, 400)).map(lambda t: [t[0]] * t[1]),  # one size: the fast path
    st.tuples(st.integers(0, 500), st.integers(1, 200), st.integers(0, 500)).map(  # one size, then another
        lambda t: [t[0]] * t[1] + [t[2]] * t[1])),
    st.integers(3200, 20000), st.integers(1, 5000))
def test_checkpoints_follow_the_rule_for_entries_of_one_size_and_of_many(sizes: list[int], block: int,
                                                                        interval: int) -> None:
    from tieredcore.formats.block import checkpoints_for

    plans = plan_blocks(sizes, block)
    assert checkpoints_for(plans, sizes, interval) == _checkpoints_by_the_rule(plans, sizes, interval)
