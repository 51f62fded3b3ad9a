"""Pulsar's compression codecs (tieredcore/formats/compression.py), checked against the way Pulsar's own
codecs write, from pulsar-common/src/main/java/org/apache/pulsar/common/compression/:

- CompressionCodecZLib.java: ``new Deflater()`` (default level, zlib header), ``setInput`` of the whole
  source, ``deflate(..., Deflater.SYNC_FLUSH)`` until no more output, never ``finish()``; ``decode``
  inflates exactly ``uncompressedLength`` bytes.
- CompressionCodecLZ4.java: airlift ``Lz4RawCompressor`` (one raw block, no size prefix).
- CompressionCodecZstd.java: airlift ``ZstdCompressor``, level 3.
- CompressionCodecSnappy.java: airlift ``SnappyRawCompressor`` (raw Snappy: varint length, elements).
"""

from __future__ import annotations

import zlib

import cramjam
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from tieredcore.errors import FormatError, ValidationError
from tieredcore.formats import compression as c
from tieredcore.formats.mlinfo import decode_managed_ledger_info, encode_managed_ledger_info
from tieredcore.formats.proto import MLDataFormats_pb2 as pb

TEXT = b"pulsar message payload " * 40


def pulsar_zlib(data: bytes) -> bytes:
    """What CompressionCodecZLib.encode writes: Deflater() at its defaults, SYNC_FLUSH, never finished."""
    d = zlib.compressobj()  # Java's Deflater(): level -1 (6), DEFLATED, zlib wrapper, default strategy
    return d.compress(data) + d.flush(zlib.Z_SYNC_FLUSH)


def test_zlib_is_written_as_pulsar_writes_it():
    out = c.compress(c.ZLIB, TEXT)
    assert out == pulsar_zlib(TEXT)
    assert out[:2] == b"\x78\x9c"  # the zlib header of the default level
    # a sync flush ends in an empty stored block, and no Adler-32 follows: the stream never ends
    assert out.endswith(b"\x00\x00\xff\xff")
    d = zlib.decompressobj()
    assert d.decompress(out) == TEXT and not d.eof


def test_zlib_reads_sync_flushed_and_finished_streams():
    assert c.decompress(c.ZLIB, pulsar_zlib(TEXT), len(TEXT)) == TEXT
    assert c.decompress(c.ZLIB, zlib.compress(TEXT), len(TEXT)) == TEXT


def test_zlib_sync_flushed_managed_ledger_info_reads():
    """A topic record compressed as a broker writes it (MetaStoreImpl with ZLIB): 0x4778 header,
    ManagedLedgerInfoMetadata, then CompressionCodecZLib's sync-flushed stream."""
    info = pb.ManagedLedgerInfo()
    li = info.ledgerInfo.add(ledgerId=7, entries=10, size=100, timestamp=1_700_000_000_000)
    li.offloadContext.driverMetadata.name = "aws-s3"
    raw = info.SerializeToString()
    meta = pb.ManagedLedgerInfoMetadata(compressionType=pb.ZLIB, uncompressedSize=len(raw)).SerializeToString()
    record = b"\x47\x78" + len(meta).to_bytes(4, "big") + meta + pulsar_zlib(raw)
    assert decode_managed_ledger_info(record) == info
    assert encode_managed_ledger_info(info, "ZLIB") == record


@pytest.mark.parametrize("kind, write", [
    (c.LZ4, lambda b: bytes(cramjam.lz4.compress_block(b, store_size=False))),
    (c.ZSTD, lambda b: zstandard.ZstdCompressor(level=3).compress(b)),
    (c.ZSTD, lambda b: zstandard.ZstdCompressor(level=3, write_content_size=False).compress(b)),
    (c.SNAPPY, lambda b: bytes(cramjam.snappy.compress_raw(b))),
    (c.NONE, bytes),
])
def test_each_codec_reads_pulsars_form(kind, write):
    assert c.decompress(kind, write(TEXT), len(TEXT)) == TEXT


def test_raw_forms_have_no_frame():
    lz4 = c.compress(c.LZ4, TEXT)
    assert not lz4.startswith(b"\x04\x22\x4d\x18")  # no LZ4 frame magic: a raw block
    snappy = c.compress(c.SNAPPY, TEXT)
    assert snappy[:2] == bytes([len(TEXT) & 0x7F | 0x80, len(TEXT) >> 7])  # varint of the length first
    assert zstandard.frame_content_size(c.compress(c.ZSTD, TEXT)) == len(TEXT)


@pytest.mark.parametrize("kind", [c.LZ4, c.ZLIB, c.ZSTD, c.SNAPPY])
def test_wrong_sizes_and_garbage_are_format_errors(kind):
    data = c.compress(kind, TEXT)
    for size in (len(TEXT) - 1, len(TEXT) + 1):
        with pytest.raises(FormatError, match="payload"):
            c.decompress(kind, data, size, "payload")
    with pytest.raises(FormatError):
        c.decompress(kind, b"\x00\x01garbage" * 3, len(TEXT))
    with pytest.raises(FormatError, match="negative"):
        c.decompress(kind, data, -1)


def test_truncated_zlib_is_refused():
    with pytest.raises(FormatError, match="truncated"):
        c.decompress(c.ZLIB, pulsar_zlib(TEXT)[:20], len(TEXT))


def test_forged_sizes_are_refused_before_allocating():
    with pytest.raises(FormatError, match="declared"):
        c.decompress(c.LZ4, b"\x10abc", 10**9)


def test_codec_names():
    assert [c.codec(n) for n in ("none", "LZ4", "zlib", "ZSTD", "snappy", 3)] == [0, 1, 2, 3, 4, 3]
    for bad in ("gzip", 7, True, None):
        with pytest.raises(ValidationError, match="unknown compression"):
            c.codec(bad)
    with pytest.raises(FormatError, match="not supported"):
        c.decompress(9, b"", 0)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([c.NONE, c.LZ4, c.ZLIB, c.ZSTD, c.SNAPPY]), st.binary(max_size=5000))
def test_round_trip(kind, data):
    assert c.decompress(kind, c.compress(kind, data), len(data)) == data


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=5000), st.integers(0, 9), st.booleans())
def test_other_writers_forms_read(data, level, content_size):
    """Pulsar's decoders inflate exactly the declared size and never ask for the end of the stream, so
    whatever zlib level or finishing a writer used, and zstd frames with or without a content size, read."""
    finished = zlib.compress(data, level)
    flushed = zlib.compressobj(level)
    assert c.decompress(c.ZLIB, finished, len(data)) == data
    assert c.decompress(c.ZLIB, flushed.compress(data) + flushed.flush(zlib.Z_SYNC_FLUSH), len(data)) == data
    frame = zstandard.ZstdCompressor(level=3, write_content_size=content_size).compress(data)
    assert c.decompress(c.ZSTD, frame, len(data)) == data
