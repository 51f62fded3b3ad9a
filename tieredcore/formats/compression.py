"""Pulsar's compression codecs, byte for byte (``CompressionType``: NONE 0, LZ4 1, ZLIB 2, ZSTD 3, SNAPPY 4).

What Pulsar's ``CompressionCodec*`` classes (pulsar-common ``org.apache.pulsar.common.compression``) write
and read, for batched message payloads (spec/07) and compressed ``ManagedLedgerInfo`` records (spec/02):

- **LZ4**: one raw LZ4 block (airlift's ``Lz4RawCompressor``), no frame, no size prefix: the reader is
  told the uncompressed size.
- **ZLIB**: ``java.util.zip.Deflater()`` at its default level with the zlib header, fed the whole input and
  flushed with ``SYNC_FLUSH``, **never finished**: no final block, no Adler-32 trailer. Its decoder inflates
  exactly the uncompressed size and does not require the end of the stream, so finished streams (what
  other writers, and earlier versions of this project, produce) read too.
- **ZSTD**: one zstd frame at level 3 (airlift's ``ZstdCompressor``); frames with and without a content
  size are read.
- **SNAPPY**: the raw Snappy format (airlift's ``SnappyRawCompressor``): a varint of the uncompressed
  length, then the compressed elements.

Decoding is bounded by the declared uncompressed size: memory follows the bytes really produced, never a
size a forged header declares, and a payload that inflates to any other size is a FormatError naming
``what``.
"""

from __future__ import annotations

import threading
import zlib

import cramjam
import zstandard

from tieredcore.errors import FormatError, ValidationError

NONE, LZ4, ZLIB, ZSTD, SNAPPY = 0, 1, 2, 3, 4
NAMES = {NONE: "NONE", LZ4: "LZ4", ZLIB: "ZLIB", ZSTD: "ZSTD", SNAPPY: "SNAPPY"}
CODECS = {v: k for k, v in NAMES.items()}
ZSTD_LEVEL = 3  # Pulsar's CompressionCodecZstd.ZSTD_COMPRESSION_LEVEL
#: the most a byte of LZ4 block / raw Snappy input can expand to: a declared size beyond it is forged
_LZ4_MAX_RATIO = 255
_SNAPPY_MAX_RATIO = 64
#: compressed input inflated this much at a time, so memory follows the bytes really produced
_INFLATE_STEP = 1 << 20
#: a ZSTD frame that declares its size (equal to the metadata's) up to this is inflated in one call
_ZSTD_ONE_SHOT = 16 << 20
_local = threading.local()

Buffer = bytes | bytearray | memoryview


def codec(name_or_value: str | int) -> int:
    """The CompressionType value of a codec name (any case) or value; ValidationError otherwise."""
    if isinstance(name_or_value, int) and not isinstance(name_or_value, bool):
        if name_or_value in NAMES:
            return name_or_value
    elif isinstance(name_or_value, str) and name_or_value.upper() in CODECS:
        return CODECS[name_or_value.upper()]
    raise ValidationError(f"unknown compression {name_or_value!r} (known: {', '.join(CODECS)})")


def name(value: int) -> str:
    return NAMES.get(value, f"#{value}")


def compress(kind: int, data: Buffer) -> bytes:
    """``data`` compressed as Pulsar's codec ``kind`` writes it."""
    if kind == NONE:
        return bytes(data)
    if kind == LZ4:
        return bytes(cramjam.lz4.compress_block(data, store_size=False))
    if kind == ZLIB:
        c = zlib.compressobj()
        return c.compress(data) + c.flush(zlib.Z_SYNC_FLUSH)
    if kind == ZSTD:
        return zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True).compress(data)
    if kind == SNAPPY:
        return bytes(cramjam.snappy.compress_raw(data))
    raise ValidationError(f"unknown compression {kind!r} (known: {', '.join(CODECS)})")


def decompress(kind: int, data: Buffer, size: int, what: str = "payload") -> bytes:
    """``data`` (compressed with ``kind``) inflated to exactly ``size`` bytes; FormatError naming ``what``
    for a corrupt, truncated or oversized payload or an unknown codec."""
    out = inflate(kind, data, size, what)
    return out if isinstance(out, bytes) else bytes(out)


def inflate(kind: int, data: Buffer, size: int, what: str = "payload") -> bytes | bytearray | memoryview:
    """What :func:`decompress` returns, as whichever buffer the codec produced (LZ4 and Snappy inflate into
    a bytearray, NONE is ``data`` itself): for readers that only view the bytes, one copy fewer."""
    if size < 0:
        raise FormatError(f"{what}: negative uncompressed size {size}")
    if kind == NONE:
        out: bytes | bytearray | memoryview = data
    elif kind == ZLIB:
        out = _inflate(data, size, what)
    elif kind == ZSTD:
        out = _unzstd(data, size, what)
    elif kind in (LZ4, SNAPPY):
        out = _lz4_or_snappy(kind, data, size, what)
    else:
        raise FormatError(f"{what}: compression {name(kind)} not supported (supported: {', '.join(CODECS)})")
    n = memoryview(out).nbytes if kind == NONE else len(out)
    if n != size:
        raise FormatError(f"{what}: {name(kind)} payload inflates to {n} bytes, its metadata says {size}")
    return out


def _inflate(data: Buffer, size: int, what: str) -> bytes:
    d = zlib.decompressobj()
    try:
        out = d.decompress(data, size + 1)  # bounded: never inflate past the declared size (+1 to see it)
    except zlib.error as e:
        raise FormatError(f"{what}: corrupt ZLIB payload: {e}") from None
    if len(out) < size and not d.eof:
        raise FormatError(f"{what}: ZLIB payload is truncated ({len(out)} of {size} bytes)")
    return out


def _zstd() -> zstandard.ZstdDecompressor:
    """This thread's decompressor: making one costs more than inflating a small payload, and an instance
    must not be shared between threads."""
    d = getattr(_local, "zstd", None)
    if d is None:
        d = _local.zstd = zstandard.ZstdDecompressor()
    return d


def _unzstd(data: Buffer, size: int, what: str) -> bytes:
    try:
        declared = zstandard.frame_content_size(data)  # -1: the frame does not say
        if declared >= 0 and declared != size:
            raise FormatError(f"{what}: corrupt ZSTD payload: its frame declares {declared} bytes, metadata "
                              f"says {size}")
        if declared >= 0 and size <= _ZSTD_ONE_SHOT:
            # the frame and the metadata agree on a modest size: one call that allocates exactly it
            return _zstd().decompress(data)
        # bounded reads, never decompress() of a large or undeclared size: it would allocate what a frame
        # declares up front
        reader = _zstd().stream_reader(data)
        parts: list[bytes] = []
        got = 0
        while got <= size:
            piece = reader.read(min(size + 1 - got, _INFLATE_STEP))
            if not piece:
                break
            parts.append(piece)
            got += len(piece)
        return parts[0] if len(parts) == 1 else b"".join(parts)
    except zstandard.ZstdError as e:
        raise FormatError(f"{what}: corrupt ZSTD payload: {e}") from None


def _lz4_or_snappy(kind: int, data: Buffer, size: int, what: str) -> bytearray:
    n = memoryview(data).nbytes
    limit = (_LZ4_MAX_RATIO if kind == LZ4 else _SNAPPY_MAX_RATIO) * n + 16
    if size > limit:
        raise FormatError(f"{what}: corrupt {name(kind)} payload: {size} bytes declared from {n} compressed")
    try:
        if kind == SNAPPY:
            declared = cramjam.snappy.decompress_raw_len(data)
            if declared != size:
                raise FormatError(f"{what}: corrupt SNAPPY payload: it declares {declared} bytes, metadata says "
                                  f"{size}")
        # exactly the declared size of room: a block that inflates to more fails (the buffer is too
        # small), one that inflates to less shows in the count written
        out = bytearray(size)
        written = (cramjam.lz4.decompress_block_into if kind == LZ4 else cramjam.snappy.decompress_raw_into)(data, out)
        if written != size:
            raise FormatError(f"{what}: {name(kind)} payload inflates to {written} bytes, its metadata says {size}")
        return out
    except (cramjam.DecompressionError, cramjam.CompressionError) as e:
        raise FormatError(f"{what}: corrupt {name(kind)} payload: {e}") from None
