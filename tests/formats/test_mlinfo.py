"""ManagedLedgerInfo record bytes: plain protobuf and Pulsar's compressed framing."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable

import cramjam
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from tieredcore.errors import FormatError, ValidationError
from tieredcore.formats import compression
from tieredcore.formats.mlinfo import (
    MAGIC_MANAGED_INFO_METADATA,
    ManagedLedgerInfo,
    decode_managed_ledger_info,
    encode_managed_ledger_info,
    is_compressed,
)
from tieredcore.formats.proto import MLDataFormats_pb2 as pb

# ManagedLedgerInfo{ledgerInfo{ledgerId=1 entries=2 size=3} terminatedPosition{7,10} properties{foo=bar}}
RAW = bytes.fromhex("0a0608011002180312040807100a1a0a0a03666f6f1203626172")


def _expected() -> ManagedLedgerInfo:
    info = ManagedLedgerInfo()
    info.ledgerInfo.add(ledgerId=1, entries=2, size=3)
    info.terminatedPosition.ledgerId = 7
    info.terminatedPosition.entryId = 10
    info.properties.add(key="foo", value="bar")
    return info


def _big_info(n: int = 200) -> ManagedLedgerInfo:
    info = ManagedLedgerInfo()
    for i in range(n):
        li = info.ledgerInfo.add(ledgerId=i, entries=1000, size=1 << 20, timestamp=1_700_000_000_000 + i)
        if i % 2:
            ctx = li.offloadContext
            ctx.uidMsb, ctx.uidLsb = -(i + 1) * 0x1111111111, i * 0x2222222222
            ctx.complete = True
            ctx.timestamp = 1_700_000_100_000 + i
            ctx.driverMetadata.name = "aws-s3"
            ctx.driverMetadata.properties.add(key="bucket", value="tiered")
            ctx.offloadSegment.add(uidMsb=1, uidLsb=2, complete=True, endEntryId=999)
    info.properties.add(key="k", value="v")
    return info


def test_plain_vector():
    assert decode_managed_ledger_info(RAW) == _expected()
    assert encode_managed_ledger_info(_expected()) == RAW
    assert encode_managed_ledger_info(_expected(), "NONE") == RAW
    assert not is_compressed(RAW)


def test_hand_built_zlib_vector():
    # [0x4778][metaLen=4][compressionType=ZLIB(2), uncompressedSize=26][zlib stream of RAW]
    data = bytes.fromhex(
        "4778"
        + "00000004"
        + "0802101a"
        + "789ce362e360146092601662e16017e092e2e2624ecbcf17624e4a2c020017b90345"
    )
    assert is_compressed(data)
    assert decode_managed_ledger_info(data) == _expected()


def test_hand_built_zstd_vector():
    data = bytes.fromhex(
        "4778"
        + "00000004"
        + "0803101a"
        + "28b52ffd201ad100000a0608011002180312040807100a1a0a0a03666f6f1203626172"
    )
    assert decode_managed_ledger_info(data) == _expected()


def test_hand_built_none_framing():
    data = struct.pack(">hi", 0x4778, 4) + bytes.fromhex("0800101a") + RAW
    assert decode_managed_ledger_info(data) == _expected()


def test_zstd_frame_without_content_size():
    payload = zstandard.ZstdCompressor(write_content_size=False).compress(RAW)
    meta = pb.ManagedLedgerInfoMetadata(
        compressionType=pb.ZSTD, uncompressedSize=len(RAW)
    ).SerializeToString()
    data = struct.pack(">hi", MAGIC_MANAGED_INFO_METADATA, len(meta)) + meta + payload
    assert decode_managed_ledger_info(data) == _expected()


@pytest.mark.parametrize("compression", [None, "NONE", "ZLIB", "ZSTD", "zstd", "zlib", "LZ4", "SNAPPY", "snappy"])
def test_roundtrip(compression):
    info = _big_info()
    data = encode_managed_ledger_info(info, compression)
    assert is_compressed(data) == (compression is not None and compression.upper() != "NONE")
    back = decode_managed_ledger_info(data)
    assert back == info
    assert back.SerializeToString() == info.SerializeToString()
    if compression and compression.upper() != "NONE":
        assert len(data) < len(info.SerializeToString())
        meta_len = struct.unpack_from(">i", data, 2)[0]
        meta = pb.ManagedLedgerInfoMetadata.FromString(data[6 : 6 + meta_len])
        assert pb.CompressionType.Name(meta.compressionType) == compression.upper()
        assert meta.uncompressedSize == len(info.SerializeToString())


def test_empty_info_roundtrip():
    assert encode_managed_ledger_info(ManagedLedgerInfo()) == b""
    assert decode_managed_ledger_info(b"") == ManagedLedgerInfo()
    for c in ("ZLIB", "ZSTD"):
        assert (
            decode_managed_ledger_info(encode_managed_ledger_info(ManagedLedgerInfo(), c))
            == ManagedLedgerInfo()
        )


def test_unknown_fields_survive():
    data = RAW + bytes.fromhex("a00601")  # field 100, varint 1: a field from a newer Pulsar
    info = decode_managed_ledger_info(data)
    assert info == _expected() or info.SerializeToString() == data
    assert encode_managed_ledger_info(info) == data


def _framed(kind: int, size: int, payload: bytes) -> bytes:
    meta = pb.ManagedLedgerInfoMetadata(compressionType=kind, uncompressedSize=size).SerializeToString()
    return struct.pack(">hi", MAGIC_MANAGED_INFO_METADATA, len(meta)) + meta + payload


# Hand-made payloads from the formats' own definitions, not from a compressor: an LZ4 block holding one
# literal-only sequence (token 0xF0: 15+ literals, then 26 - 15 = 0x0B more), and raw Snappy (varint
# length 26 = 0x1A, then a literal tag (26 - 1) << 2 = 0x64). Pulsar writes LZ4 as such a raw block
# (lz4-java's fast compressor) and Snappy in the raw format (snappy-java's Snappy.compress).
LZ4_RAW = bytes([0xF0, 0x0B]) + RAW
SNAPPY_RAW = bytes([0x1A, 0x64]) + RAW


@pytest.mark.parametrize("kind, payload", [("LZ4", LZ4_RAW), ("SNAPPY", SNAPPY_RAW)])
def test_lz4_and_snappy_vectors(kind, payload):
    data = _framed(pb.CompressionType.Value(kind), len(RAW), payload)
    assert decode_managed_ledger_info(data) == _expected()
    # and what we write reads back through the same path, with Pulsar's framing
    ours = encode_managed_ledger_info(_big_info(), kind)
    assert ours[:2] == b"\x47\x78" and decode_managed_ledger_info(ours) == _big_info()


@pytest.mark.parametrize(
    "data, message",
    [
        (_framed(1, 26, b"\xf0\x0b" + RAW[:20]), "corrupt LZ4"),
        (_framed(1, 10**9, LZ4_RAW), "corrupt LZ4 payload: 1000000000 bytes declared"),
        (_framed(4, 26, bytes([0x1B, 0x64]) + RAW), "it declares 27 bytes, metadata says 26"),
        (_framed(4, 26, bytes([0x1A, 0x68]) + RAW), "corrupt SNAPPY"),
    ],
)
def test_lz4_and_snappy_garbage(data, message):
    with pytest.raises(FormatError) as ei:
        decode_managed_ledger_info(data)
    assert message in str(ei.value), str(ei.value)


@pytest.mark.parametrize("kind", ["gzip", "", "brotli"])
def test_unsupported_compression_encode(kind):
    with pytest.raises(ValidationError, match="not supported|unknown compression"):
        encode_managed_ledger_info(_expected(), kind)


@pytest.mark.parametrize(
    "data, message",
    [
        (b"\xff\xff\xff", "not a valid ManagedLedgerInfo"),
        (b"hello world", "not a valid ManagedLedgerInfo"),
        (bytes.fromhex("0a021002"), "missing required fields"),  # LedgerInfo without ledgerId
        (b"\x47\x78", "header truncated"),
        (b"\x47\x78\x00\x00", "header truncated"),
        (struct.pack(">hi", 0x4778, 100) + b"\x08\x02", "does not fit"),
        (struct.pack(">hi", 0x4778, -1), "does not fit"),
        (struct.pack(">hi", 0x4778, 2) + b"\xff\xff", "bad ManagedLedgerInfoMetadata"),
        (struct.pack(">hi", 0x4778, 2) + b"\x08\x02", "missing required fields"),
        (_framed(2, 26, b"not zlib at all"), "corrupt ZLIB"),
        (_framed(2, 26, zlib.compress(RAW)[:-8]), "ZLIB"),
        (_framed(2, 25, zlib.compress(RAW)), "metadata says 25"),
        (_framed(2, 27, zlib.compress(RAW)), "metadata says 27"),
        (_framed(3, 26, b"\x28\xb5\x2f\xfd garbage"), "corrupt ZSTD"),
        (_framed(3, 10, zstandard.ZstdCompressor().compress(RAW)), "ZSTD"),
        # compressionType 9 is unknown to the closed proto2 enum: the field reads as absent
        (struct.pack(">hi", 0x4778, 4) + bytes.fromhex("0809101a") + RAW, "missing required fields"),
        (_framed(0, 26, RAW + b"x"), "metadata says 26"),
        (_framed(2, 26, zlib.compress(b"\xff\xff\xff" + RAW[3:])), "not a valid ManagedLedgerInfo"),
    ],
)
def test_garbage_is_format_error(data, message):
    with pytest.raises(FormatError) as ei:
        decode_managed_ledger_info(data)
    assert message in str(ei.value), str(ei.value)


def test_encode_incomplete_info_is_validation_error():
    info = ManagedLedgerInfo()
    info.ledgerInfo.add()  # ledgerId is required
    with pytest.raises(ValidationError, match="ledgerId"):
        encode_managed_ledger_info(info)


def test_decode_accepts_bytearray_and_memoryview():
    data = encode_managed_ledger_info(_expected(), "ZLIB")
    assert decode_managed_ledger_info(bytearray(data)) == _expected()
    assert decode_managed_ledger_info(memoryview(data)) == _expected()


# -- records as brokers write them ----------------------------------------------------------------------
#
# managed-ledger/src/main/java/org/apache/bookkeeper/mledger/impl/MetaStoreImpl.java, compressLedgerInfo:
# with compression type NONE (the default) the record is ``info.toByteArray()``; otherwise, only when the
# plain size is larger than the MetadataCompressionConfig threshold (``managedLedgerInfoCompressionThresholdInBytes``,
# 16 KiB in broker.conf, 0 = always), ``compressManagedInfo`` writes writeShort(0x4778), writeInt(metadata
# size), ManagedLedgerInfoMetadata{compressionType, uncompressedSize}, then the codec's encode() of the plain
# bytes. parseManagedLedgerInfo tests the magic first and decodes exactly uncompressedSize bytes.


def _pulsar_codec(kind: str) -> Callable[[bytes], bytes]:
    """Each CompressionCodec*.encode of pulsar-common (see tests/formats/test_compression.py)."""
    def zlib_sync(b: bytes) -> bytes:  # CompressionCodecZLib: Deflater(), SYNC_FLUSH, never finish()
        d = zlib.compressobj()
        return d.compress(b) + d.flush(zlib.Z_SYNC_FLUSH)

    return {
        "LZ4": lambda b: bytes(cramjam.lz4.compress_block(b, store_size=False)),  # Lz4RawCompressor
        "ZLIB": zlib_sync,
        "ZSTD": lambda b: zstandard.ZstdCompressor(level=3).compress(b),  # airlift ZstdCompressor, level 3
        "SNAPPY": lambda b: bytes(cramjam.snappy.compress_raw(b)),  # SnappyRawCompressor
    }[kind]


def metastore_impl_record(info: ManagedLedgerInfo, kind: str = "NONE", threshold: int = 0) -> bytes:
    """The bytes MetaStoreImpl.compressLedgerInfo stores for ``info``."""
    raw = info.SerializeToString()
    if kind == "NONE" or len(raw) <= threshold:
        return raw
    meta = pb.ManagedLedgerInfoMetadata(compressionType=pb.CompressionType.Value(kind),
                                        uncompressedSize=len(raw)).SerializeToString()
    return struct.pack(">hi", 0x4778, len(meta)) + meta + _pulsar_codec(kind)(raw)


@pytest.mark.parametrize("kind", ["NONE", "LZ4", "ZLIB", "ZSTD", "SNAPPY"])
def test_every_record_metastore_impl_writes_reads(kind):
    info = _big_info()
    record = metastore_impl_record(info, kind)
    assert is_compressed(record) == (kind != "NONE")
    assert decode_managed_ledger_info(record) == info
    ours = encode_managed_ledger_info(info, kind)
    header = len(ours) - len(compression.compress(compression.codec(kind), info.SerializeToString()))
    assert ours[:header] == record[:header]  # the same magic, metadata length and metadata
    if kind in ("NONE", "ZLIB", "ZSTD"):  # the same library at the same settings: byte for byte
        assert ours == record


def test_other_writers_forms_read_too():
    """Finished zlib streams (Adler-32 and all: what other writers produced) and zstd frames without a
    content size read like Pulsar's own."""
    info = _big_info()
    raw = info.SerializeToString()
    for kind, payload in (("ZLIB", zlib.compress(raw)), ("ZLIB", zlib.compress(raw, 9)),
                          ("ZSTD", zstandard.ZstdCompressor(write_content_size=False).compress(raw))):
        assert decode_managed_ledger_info(_framed(pb.CompressionType.Value(kind), len(raw), payload)) == info


def test_store_compresses_only_above_its_threshold(tmp_path):
    """ManagedLedgerStore writes what MetaStoreImpl writes at the same compression and threshold."""
    from tieredcore.meta.managed_ledgers import ManagedLedgerStore, topic_path
    from tieredcore.meta.sqlite import SqliteMetadataStore

    small, big = _expected(), _big_info()
    store = SqliteMetadataStore(tmp_path / "m.db")
    try:
        threshold = small.ByteSize()  # not larger than the threshold: plain
        ml = ManagedLedgerStore(store, compression="ZLIB", compression_threshold=threshold)
        for i, info in enumerate((small, big)):
            topic = f"t/a/persistent/x{i}"
            ml.create_topic(topic, info)
            assert bytes(store.get(topic_path(topic)).value) == metastore_impl_record(info, "ZLIB", threshold)
            assert ml.get_topic(topic)[0] == info
        assert not is_compressed(store.get(topic_path("t/a/persistent/x0")).value)
        assert is_compressed(store.get(topic_path("t/a/persistent/x1")).value)
        # threshold 0 (the library's default): every non-empty record is compressed
        ml0 = ManagedLedgerStore(store, compression="ZLIB")
        ml0.create_topic("t/a/persistent/x2", small)
        assert is_compressed(store.get(topic_path("t/a/persistent/x2")).value)
        for bad in (-1, "16k", True, 1.5):
            with pytest.raises(ValidationError, match="compression_threshold"):
                ManagedLedgerStore(store, compression="ZLIB", compression_threshold=bad)
    finally:
        store.close()


_kv = st.builds(lambda k, v: pb.KeyValue(key=k, value=v), st.text(max_size=8), st.text(max_size=8))


@st.composite
def _infos(draw) -> ManagedLedgerInfo:
    info = ManagedLedgerInfo()
    for lid in draw(st.lists(st.integers(0, 2**63 - 1), max_size=6, unique=True)):
        li = info.ledgerInfo.add(ledgerId=lid, entries=draw(st.integers(0, 10**6)),
                                 size=draw(st.integers(0, 2**40)), timestamp=draw(st.integers(0, 2**45)))
        if draw(st.booleans()):
            ctx = li.offloadContext
            ctx.uidMsb, ctx.uidLsb = draw(st.integers(-(2**63), 2**63 - 1)), draw(st.integers(-(2**63), 2**63 - 1))
            ctx.complete = draw(st.booleans())
            ctx.driverMetadata.name = draw(st.sampled_from(["aws-s3", "S3", "google-cloud-storage", "azureblob"]))
            ctx.driverMetadata.properties.extend(draw(st.lists(_kv, max_size=3)))
        li.properties.extend(draw(st.lists(_kv, max_size=2)))
    info.properties.extend(draw(st.lists(_kv, max_size=3)))
    return info


@settings(max_examples=80, deadline=None)
@given(_infos(), st.sampled_from(["NONE", "LZ4", "ZLIB", "ZSTD", "SNAPPY"]))
def test_round_trip_every_codec(info, kind):
    assert decode_managed_ledger_info(encode_managed_ledger_info(info, kind)) == info
    assert decode_managed_ledger_info(metastore_impl_record(info, kind)) == info
