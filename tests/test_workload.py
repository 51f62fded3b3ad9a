"""tieredcore.cli.workload: deterministic payloads (opaque, and Pulsar messages), size ranges, the order-sensitive
digest."""

from __future__ import annotations

import hashlib
import struct

import pytest
import zstandard

from tieredcore.cli.workload import (
    PROP_CODECS,
    PROP_MAX,
    PROP_MIN,
    PROP_PAYLOAD,
    PROP_SEED,
    Digest,
    MessageShape,
    PayloadGenerator,
    parse_batch_range,
    parse_codecs,
    parse_size_range,
)
from tieredcore.errors import ValidationError
from tieredcore.formats import compression
from tieredcore.formats.messages import decode_entry

TOPIC = "public/default/persistent/t"


def test_same_seed_and_topic_same_payloads() -> None:
    a = list(PayloadGenerator(3, TOPIC, 10, 5000).payloads(0, 300))
    b = list(PayloadGenerator(3, TOPIC, 10, 5000).payloads(0, 300))
    assert a == b
    assert len(set(a)) == len(a)  # every payload is distinct (the header carries seq)


@pytest.mark.parametrize(
    "other",
    [
        PayloadGenerator(3, "public/default/persistent/u", 10, 5000),
        PayloadGenerator(4, TOPIC, 10, 5000),
    ],
)
def test_different_topic_or_seed_different_payloads(other: PayloadGenerator) -> None:
    a = list(PayloadGenerator(3, TOPIC, 10, 5000).payloads(0, 100))
    b = list(other.payloads(0, 100))
    assert all(x != y for x, y in zip(a, b, strict=True))
    assert [len(x) for x in a] != [len(y) for y in b]


@pytest.mark.parametrize(("lo", "hi"), [(0, 0), (1, 1), (15, 17), (16, 16), (0, 40), (100, 4096),
                                        (4 * 1024 * 1024, 4 * 1024 * 1024)])
def test_sizes_within_range(lo: int, hi: int) -> None:
    g = PayloadGenerator(1, TOPIC, lo, hi)
    n = 4 if lo > 1024 * 1024 else 500
    sizes = [len(p) for p in g.payloads(0, n)]
    assert all(lo <= s <= hi for s in sizes)
    assert sizes == [g.size(seq) for seq in range(n)]
    if hi - lo >= 2:
        assert len(set(sizes)) > 1
    if hi - lo < 10:
        assert set(sizes) == set(range(lo, hi + 1))  # every size of a small range turns up


def test_payload_is_the_seq_th_element() -> None:
    g = PayloadGenerator(9, TOPIC, 0, 700)
    all_ = list(g.payloads(0, 200))
    assert [g.payload(seq) for seq in range(200)] == all_
    assert list(g.payloads(57, 30)) == all_[57:87]
    assert list(g.payloads(5, 0)) == []


def test_header_encodes_seq() -> None:
    g = PayloadGenerator(2, TOPIC, 16, 300)
    for seq in (0, 1, 2, 1000, 2**40):
        p = g.payload(seq)
        got_seq, _tag = struct.unpack(">QQ", p[:16])
        assert got_seq == seq
    # shorter than the header: a prefix of it
    short = PayloadGenerator(2, TOPIC, 9, 9).payload(5)
    assert len(short) == 9 and short[:8] == struct.pack(">Q", 5)


def _ratio(payloads: list[bytes]) -> float:
    raw = b"".join(payloads)
    return len(zstandard.ZstdCompressor(level=3).compress(raw)) / len(raw)


def test_text_payloads_compress_and_random_ones_do_not() -> None:
    text = PayloadGenerator(3, TOPIC, 1000, 9000, "text")
    a = list(text.payloads(0, 300))
    assert a == list(PayloadGenerator(3, TOPIC, 1000, 9000, "text").payloads(0, 300))  # deterministic
    rnd = list(PayloadGenerator(3, TOPIC, 1000, 9000).payloads(0, 300))
    assert [len(p) for p in a] == [len(p) for p in rnd]  # same sizes and headers, another pool
    assert [p[:16] for p in a] == [p[:16] for p in rnd] and a != rnd
    assert _ratio(a) < 0.5 and _ratio(rnd) > 0.95
    body = b"".join(p[16:] for p in a)
    assert body.count(b"\n") > 1000 and all(32 <= c < 127 or c == 10 for c in body)  # lines of ASCII words


def test_generator_from_topic_properties() -> None:
    props = {PROP_SEED: "3", PROP_MIN: "10", PROP_MAX: "20"}
    assert PayloadGenerator.from_properties(props, TOPIC) == PayloadGenerator(3, TOPIC, 10, 20)
    assert PayloadGenerator.from_properties({**props, PROP_PAYLOAD: "text"}, TOPIC).kind == "text"
    with pytest.raises(ValidationError, match="payload kind 'gzip'"):
        PayloadGenerator.from_properties({**props, PROP_PAYLOAD: "gzip"}, TOPIC)


def test_generator_is_a_value() -> None:
    g = PayloadGenerator(1, TOPIC, 1, 2)
    assert g == PayloadGenerator(1, TOPIC, 1, 2)
    with pytest.raises(AttributeError):
        g.seed = 2  # type: ignore[misc]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1024", (1024, 1024)),
        ("0", (0, 0)),
        ("100-4096", (100, 4096)),
        ("64K", (65536, 65536)),
        ("1k-2K", (1024, 2048)),
        ("1M", (1 << 20, 1 << 20)),
        ("16-4M", (16, 4 << 20)),
        (" 7 - 9 ", (7, 9)),
        ("5-5", (5, 5)),
    ],
)
def test_parse_size_range_accepts(text: str, expected: tuple[int, int]) -> None:
    assert parse_size_range(text) == expected


@pytest.mark.parametrize(
    "text",
    ["", "abc", "10-", "-10", "10-5", "1.5K", "4M-5M", "5M", "4097K", "1G", "K", "1-2-3", "0x10"],
)
def test_parse_size_range_rejects(text: str) -> None:
    with pytest.raises(ValidationError):
        parse_size_range(text)


def test_digest_counts_and_is_order_sensitive() -> None:
    a, b, c = b"alpha", b"beta", b""
    d1, d2, d3 = Digest(), Digest(), Digest()
    d1.update_many([a, b, c])
    d2.update_many([b, a, c])
    d3.update_many([a])
    d3.update_many(iter([b, c]))  # chunking does not matter, generators are fine
    assert d1.count == d2.count == d3.count == 3
    assert d1.hexdigest() != d2.hexdigest()
    assert d1.hexdigest() == d3.hexdigest()


def test_digest_frames_each_payload() -> None:
    # length prefixes: moving a byte across a payload boundary changes the digest
    d1, d2 = Digest(), Digest()
    d1.update_many([b"ab", b"c"])
    d2.update_many([b"a", b"bc"])
    assert d1.hexdigest() != d2.hexdigest()
    empty = Digest()
    assert empty.count == 0 and empty.hexdigest() == hashlib.sha256().hexdigest()
    one_empty = Digest()
    one_empty.update_many([b""])
    assert one_empty.count == 1 and one_empty.hexdigest() != empty.hexdigest()
    expected = hashlib.sha256(b"\x00\x00\x00\x02ab\x00\x00\x00\x01c").hexdigest()
    assert d1.hexdigest() == expected


# --- Pulsar-message workloads ------------------------------------------------------------------------------

SHAPE = MessageShape(1_700_000_000_000, 250, 0, 6, (compression.NONE, compression.ZSTD, compression.SNAPPY), 9, 3,
                     True)


def test_message_entries_are_deterministic_and_decode() -> None:
    g = PayloadGenerator(5, TOPIC, 200, 3000, "text", SHAPE)
    a = list(g.payloads(0, 200))
    assert a == list(PayloadGenerator(5, TOPIC, 200, 3000, "text", SHAPE).payloads(0, 200))
    assert a[37] == g.payload(37)  # any entry on its own, as verify regenerates it
    assert a != list(PayloadGenerator(6, TOPIC, 200, 3000, "text", SHAPE).payloads(0, 200))
    counts = set()
    for seq, entry in enumerate(a):
        msgs = decode_entry(entry, 1, seq)
        counts.add(len(msgs) if msgs[0].batch_index >= 0 else 0)
        assert 200 <= sum(len(m.payload) for m in msgs) <= 3000  # the entry size, split over its messages
        assert msgs[0].metadata.compression == SHAPE.codecs[seq % 3]  # codecs in turn
        assert msgs[0].publish_time == 1_700_000_000_000 + 250 * seq
        assert [m.sequence_id for m in msgs] == [seq * 6 + k for k in range(len(msgs))]
        assert msgs[0].broker_index == seq * 6 + len(msgs) - 1  # the entry's last message, as the broker counts
        assert all(m.key in {f"key-{i}" for i in range(9)} and len(m.properties) == 3 for m in msgs)
        assert all(m.properties["workload.entry"] == str(seq) for m in msgs)
    assert counts == set(range(7))  # 0: sent without batching, 1..6 in a batch


def test_message_shape_is_recorded_in_the_topic_properties() -> None:
    props = {PROP_SEED: "3", PROP_MIN: "10", PROP_MAX: "20", **SHAPE.to_properties()}
    assert MessageShape.from_properties(props) == SHAPE
    assert PayloadGenerator.from_properties(props, TOPIC) == PayloadGenerator(3, TOPIC, 10, 20, messages=SHAPE)
    assert MessageShape.from_properties({PROP_SEED: "3"}) is None  # raw (topics generated before messages)
    assert SHAPE.to_properties()[PROP_CODECS] == "NONE,ZSTD,SNAPPY"


@pytest.mark.parametrize(("text", "expected"), [("0", (0, 0)), ("10", (10, 10)), ("1-100", (1, 100)),
                                                ("0-1000", (0, 1000))])
def test_batch_ranges(text: str, expected: tuple[int, int]) -> None:
    assert parse_batch_range(text) == expected


@pytest.mark.parametrize("text", ["", "-1", "5-2", "1001", "1-", "a-b", "1.5"])
def test_bad_batch_ranges(text: str) -> None:
    with pytest.raises(ValidationError, match="--batch"):
        parse_batch_range(text)


def test_codec_lists() -> None:
    assert parse_codecs("mix") == (0, 1, 2, 3, 4)
    assert parse_codecs("zstd, LZ4") == (compression.ZSTD, compression.LZ4)
    with pytest.raises(ValidationError, match="unknown compression 'BROTLI'"):
        parse_codecs("NONE,BROTLI")
