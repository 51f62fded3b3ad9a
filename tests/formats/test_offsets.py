"""The entry-offsets sidecar's bytes (tieredcore.formats.offsets, docs/formats.md "Entry offsets sidecar")
and its key in the one key grammar (tieredcore.formats.keys)."""

from __future__ import annotations

import struct
import uuid as uuidlib

import crc32c
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tieredcore.formats.block import checkpoints_for, frame_ends, plan_blocks
from tieredcore.formats.index import IndexEntry, LedgerIndex
from tieredcore.formats.keys import (
    OBJECT_KEY,
    data_key,
    group_keys,
    index_key,
    offsets_key,
    parse_key,
    segment_data_key,
    segment_index_key,
    sidecar_of,
)
from tieredcore.formats.offsets import (
    PairIdentity,
    SidecarError,
    block_checkpoints,
    decode_offsets,
    encode_offsets,
    stale_reason,
)
from tieredcore.model import STATE_CLOSED, LedgerMetadata

U = "0badcafe-0000-4000-8000-00000000beef"
PAIR = PairIdentity(U, 7, 4096, 99, 0x01020304)
VECTOR = bytes.fromhex(
    "54534f31" "00000001" "0badcafe00004000800000000000beef" "0000000000000007" "0000000000001000"
    "0000000000000063" "01020304" "00000400" "00000002" "000000000000000a" "00000000000003e8"
    "0000000000000014" "00000000000007d0")


def test_exact_vector() -> None:
    """The docs' worked example: header, two checkpoints, then the CRC32C of the 92 bytes before it."""
    got = encode_offsets(PAIR, 1024, [(10, 1000), (20, 2000)])
    assert got == VECTOR + struct.pack(">I", crc32c.crc32c(VECTOR))
    assert got[-4:].hex() == "4f1f1fe7"
    d = decode_offsets(got)
    assert (d.identity, d.interval, d.ids, d.offsets) == (PAIR, 1024, [10, 20], [1000, 2000])


@given(st.uuids(), st.integers(0, 2**62), st.integers(0, 10**6), st.integers(1, 2**31 - 1),
       st.integers(0, 2**32 - 1), st.lists(st.integers(1, 10**6), max_size=200, unique=True))
def test_round_trip(u: uuidlib.UUID, lid: int, last: int, interval: int, icrc: int, raw_ids: list[int]) -> None:
    ids = sorted(i for i in raw_ids if i <= last)
    cps = [(e, 128 + 10 * k + e) for k, e in enumerate(ids)]  # strictly increasing in both
    length = (cps[-1][1] + 1) if cps else 4096
    pair = PairIdentity(str(u), lid, length, last, icrc)
    d = decode_offsets(encode_offsets(pair, interval, cps))
    assert d.identity == pair and d.interval == interval and list(zip(d.ids, d.offsets, strict=True)) == cps


@pytest.mark.parametrize(("damage", "message"), [
    (lambda b: b[:40], "shorter than a sidecar header"),
    (lambda b: b"XXXX" + b[4:], "magic 0x58585858"),
    (lambda b: b[:4] + struct.pack(">I", 2) + b[8:], "version 2, this build reads version 1"),
    (lambda b: b[:-5] + b"\x00" + b[-4:], "fails its CRC32C"),
    (lambda b: b[:-4], "2 checkpoints need 96"),
    (lambda b: b + b"\x00", "2 checkpoints need 96"),
])
def test_bad_input_is_a_specific_error(damage, message) -> None:
    with pytest.raises(SidecarError, match=message):
        decode_offsets(damage(encode_offsets(PAIR, 1024, [(10, 1000), (20, 2000)])), "the sidecar")


@pytest.mark.parametrize("cps", [[(20, 1000), (10, 2000)], [(10, 2000), (20, 1000)], [(0, 1000)],
                                 [(100, 1000)], [(10, 100)], [(10, 4096)]])
def test_checkpoints_out_of_order_or_range_are_refused(cps) -> None:
    """Each well formed and correctly checksummed: decreasing, entry 0, past the last entry, inside the
    first header, past the object end."""
    with pytest.raises(SidecarError, match="not strictly increasing inside the object"):
        decode_offsets(encode_offsets(PAIR, 1024, cps))


@given(st.binary(max_size=200))
def test_garbage_never_decodes_silently(raw: bytes) -> None:
    try:
        decode_offsets(raw)
    except SidecarError:
        return
    raise AssertionError("garbage decoded")  # CRC32C over the rest would have to match


def _index(blocks: list[tuple[int, int]], length: int, last: int) -> LedgerIndex:
    md = LedgerMetadata(7, STATE_CLOSED, last, 1000)
    return LedgerIndex(md, b"", length, 128, tuple(IndexEntry(f, i + 1, o) for i, (f, o) in enumerate(blocks)))


def test_stale_reason_names_the_difference() -> None:
    idx = _index([(0, 0), (50, 2048)], 4096, 99)
    good = decode_offsets(encode_offsets(PAIR, 1024, [(10, 1000), (60, 3000)]))
    assert stale_reason(good, PAIR, idx) is None
    for other in (PairIdentity(str(uuidlib.uuid4()), 7, 4096, 99, 0x01020304),
                  PairIdentity(U, 8, 4096, 99, 0x01020304), PairIdentity(U, 7, 4097, 99, 0x01020304),
                  PairIdentity(U, 7, 4096, 98, 0x01020304), PairIdentity(U, 7, 4096, 99, 5)):
        assert "it describes uuid" in stale_reason(good, other, idx)
    # a checkpoint at a block's first entry, or outside its entry's block
    for cps in ([(50, 2300)], [(10, 2100)], [(60, 2100)], [(10, 128)]):
        assert "outside that entry's block" in stale_reason(decode_offsets(encode_offsets(PAIR, 1024, cps)),
                                                            PAIR, idx)


@given(st.lists(st.integers(0, 3000), min_size=1, max_size=300), st.sampled_from([200, 1024, 8192]),
       st.sampled_from([4096, 16384, 1 << 20]))
def test_block_checkpoints_are_the_index_trailers(sizes: list[int], interval: int, max_block: int) -> None:
    """Per block, exactly the checkpoints the offloader writes into its own index trailer."""
    plans = plan_blocks(sizes, max_block)
    ends = frame_ends(sizes)
    want = checkpoints_for(plans, sizes, interval, ends)
    got, off = [], 0
    for p in plans:
        got += block_checkpoints(off + 128, p.first_entry, sizes[p.first_entry:p.last_entry + 1], interval)
        off += p.block_size
    assert got == want


# -- the key ------------------------------------------------------------------------------------------


def test_sidecar_key_in_the_grammar() -> None:
    k = offsets_key("p/", U, 12)
    assert k == f"p/{U}-ledger-12-offsets" and sidecar_of(data_key("p/", U, 12)) == k
    p = parse_key(k, "p/")
    assert (p.uuid, p.ledger_id, p.is_index, p.is_offsets, p.is_manifest) == (U, 12, False, True, False)
    m = parse_key(k + ".manifest", "p/")
    assert m.is_offsets and m.is_manifest and not m.is_index
    for other in (data_key("", U, 3), index_key("", U, 3), segment_data_key("", U), segment_index_key("", U)):
        assert not parse_key(other).is_offsets
    # only a ledger pair has one: `{uuid}-offsets` is foreign, and so are sidecar-like shapes
    assert sidecar_of(segment_data_key("", U)) is None
    for foreign in (f"{U}-offsets", f"{U}-ledger-1-offsets-index", f"{U}-ledger-1-index-offsets",
                    f"{U}-ledger-1-offsets\n", f"{U}-ledger--offsets"):
        assert parse_key(foreign) is None and OBJECT_KEY.fullmatch(foreign) is None


def test_group_keys_put_the_sidecar_with_its_pair() -> None:
    d, i = data_key("x/", U, 5), index_key("x/", U, 5)
    assert group_keys(d, i) == [f"{d}-offsets.manifest", f"{d}-offsets", f"{i}.manifest", i,
                                f"{d}.manifest", d]
    sd, si = segment_data_key("x/", U), segment_index_key("x/", U)
    assert group_keys(sd, si) == [f"{si}.manifest", si, f"{sd}.manifest", sd]


def _pulsar_parse_ledger_id(name: str) -> int | None:
    """The rule of Pulsar's DataBlockUtils.parseLedgerId (tiered-storage/jcloud, checked by its
    DataBlockUtilsTest): drop a "-index" suffix, then Long.parseLong of what follows "-ledger-"; a
    NumberFormatException gives null and the bucket scanner (OffloaderObjectsScannerUtils via
    scanLedgers) skips the object."""
    if name.endswith("-index"):
        name = name[: -len("-index")]
    pos = name.find("-ledger-")
    if pos < 0:
        return None
    rest = name[pos + 8:]
    body = rest[1:] if rest[:1] in ("-", "+") else rest
    return int(rest) if body.isdigit() and body.isascii() else None


def test_pulsars_scanner_skips_the_sidecar() -> None:
    assert _pulsar_parse_ledger_id(data_key("", U, 123124)) == 123124
    assert _pulsar_parse_ledger_id(index_key("", U, 123124)) == 123124
    assert _pulsar_parse_ledger_id("-ledger-index") is None  # DataBlockUtilsTest's own case
    assert _pulsar_parse_ledger_id(offsets_key("", U, 123124)) is None
