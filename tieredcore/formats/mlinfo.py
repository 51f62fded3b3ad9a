"""Bytes of a managed-ledger record (``ManagedLedgerInfo``, docs/metadata.md).

Pulsar stores the record either as plain protobuf or, when compression is configured, as::

    [0x4778 : int16 BE][metaLen : int32 BE][ManagedLedgerInfoMetadata : metaLen bytes][compressed]

``ManagedLedgerInfoMetadata{compressionType, uncompressedSize}``. Readers test for the magic first;
a plain record can never start with 0x47 0x78 (0x47 is field 8 with the invalid wire type 7).
ZLIB is the zlib format of Java's ``Deflater`` (with header), ZSTD a zstd frame. LZ4 and SNAPPY
records are recognised and refused with a FormatError.
"""

from __future__ import annotations

import struct
import zlib

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError, EncodeError

from tieredcore.errors import FormatError, ValidationError
from tieredcore.formats.proto import MLDataFormats_pb2 as pb

ManagedLedgerInfo = pb.ManagedLedgerInfo
LedgerInfo = pb.ManagedLedgerInfo.LedgerInfo

MAGIC_MANAGED_INFO_METADATA = 0x4778
_HEADER = struct.Struct(">hi")
_MAGIC_BYTES = struct.pack(">h", MAGIC_MANAGED_INFO_METADATA)

_SUPPORTED = ("NONE", "ZLIB", "ZSTD", "LZ4", "SNAPPY")
#: the most a byte of LZ4 block / raw Snappy input can expand to: a declared size beyond it is forged
_LZ4_MAX_RATIO = 255
_SNAPPY_MAX_RATIO = 64
#: compressed records are inflated this much at a time, so memory follows the bytes really produced and
#: never a size a forged header declares
_INFLATE_STEP = 1 << 20
_KNOWN = frozenset(pb.CompressionType.keys())


def _compression_name(value: int) -> str:
    try:
        return pb.CompressionType.Name(value)
    except ValueError:
        return f"#{value}"


def _decompress(kind: str, payload: bytes, size: int) -> bytes:
    if kind == "NONE":
        return payload
    if kind == "ZLIB":
        d = zlib.decompressobj()
        try:
            out = d.decompress(payload, size + 1)  # bounded: never inflate past the declared size
        except zlib.error as e:
            raise FormatError(f"managed-ledger info: corrupt ZLIB payload: {e}") from None
        if not d.eof and len(out) <= size:
            raise FormatError("managed-ledger info: ZLIB payload is truncated")
        return out
    if kind == "ZSTD":
        import zstandard

        try:
            declared = zstandard.frame_content_size(payload)  # -1: the frame does not say
            if declared >= 0 and declared != size:
                raise FormatError(
                    f"managed-ledger info: corrupt ZSTD payload: its frame declares {declared} bytes, "
                    f"metadata says {size}"
                )
            # Bounded reads, never ZstdDecompressor.decompress(): it allocates its whole output up front,
            # the content size the frame declares (max_output_size is then ignored) or else max_output_size.
            reader = zstandard.ZstdDecompressor().stream_reader(payload)
            parts: list[bytes] = []
            got = 0
            while got <= size:
                piece = reader.read(min(size + 1 - got, _INFLATE_STEP))
                if not piece:
                    break
                parts.append(piece)
                got += len(piece)
            return b"".join(parts)
        except zstandard.ZstdError as e:
            raise FormatError(f"managed-ledger info: corrupt ZSTD payload: {e}") from None
    if kind in ("LZ4", "SNAPPY"):
        # Pulsar's codecs: LZ4 is a raw block (lz4-java's fast compressor, no frame), Snappy the raw
        # format (snappy-java's Snappy.compress); cramjam implements both.
        import cramjam

        limit = (_LZ4_MAX_RATIO if kind == "LZ4" else _SNAPPY_MAX_RATIO) * len(payload) + 16
        if size > limit:
            raise FormatError(
                f"managed-ledger info: corrupt {kind} payload: {size} bytes declared from {len(payload)} compressed"
            )
        try:
            if kind == "LZ4":
                out = bytes(cramjam.lz4.decompress_block(payload, output_len=size))
            else:
                declared = cramjam.snappy.decompress_raw_len(payload)
                if declared != size:
                    raise FormatError(
                        f"managed-ledger info: corrupt SNAPPY payload: it declares {declared} bytes, metadata says {size}"
                    )
                out = bytes(cramjam.snappy.decompress_raw(payload))
        except cramjam.DecompressionError as e:
            raise FormatError(f"managed-ledger info: corrupt {kind} payload: {e}") from None
        return out
    raise FormatError(
        f"managed-ledger info: compression {kind} not supported (supported: {', '.join(_SUPPORTED)})"
    )


def _utf8_checking_class() -> type:
    """ManagedLedgerInfo in a private pool with UTF-8 validation of string fields switched on.

    proto2 never validates UTF-8, and upb hands a string field that holds other bytes back as ``bytes``,
    which breaks every caller expecting ``str`` (e.g. ``kv.key.startswith(prefix)``). The same schema as
    edition 2023 with proto2's semantics (required fields, closed enums) but ``utf8_validation = VERIFY``
    makes the parser itself refuse such bytes, at C speed.
    """
    fs = descriptor_pb2.FeatureSet
    label = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto()
    pb.DESCRIPTOR.CopyToProto(fdp)
    fdp.syntax = "editions"
    fdp.edition = descriptor_pb2.EDITION_2023
    fdp.options.features.enum_type = fs.CLOSED
    fdp.options.features.repeated_field_encoding = fs.EXPANDED
    fdp.options.features.utf8_validation = fs.VERIFY
    messages = list(fdp.message_type)
    while messages:
        m = messages.pop()
        messages.extend(m.nested_type)
        for f in m.field:
            if f.label == label.LABEL_REQUIRED:
                f.label = label.LABEL_OPTIONAL
                f.options.features.field_presence = fs.LEGACY_REQUIRED
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(pb.ManagedLedgerInfo.DESCRIPTOR.full_name))


_UTF8_CHECKING_INFO = _utf8_checking_class()


def _parse(data: bytes, what: str) -> pb.ManagedLedgerInfo:
    info = pb.ManagedLedgerInfo()
    try:
        info.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise FormatError(f"{what}: not a valid ManagedLedgerInfo protobuf: {e}") from None
    try:
        _UTF8_CHECKING_INFO.FromString(data)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise FormatError(f"{what}: a string field of the ManagedLedgerInfo is not UTF-8: {e}") from None
    if not info.IsInitialized():
        missing = ", ".join(info.FindInitializationErrors())
        raise FormatError(f"{what}: ManagedLedgerInfo is missing required fields: {missing}")
    return info


def is_compressed(data: bytes) -> bool:
    """True when ``data`` starts with the compressed-record magic."""
    return bytes(data[:2]) == _MAGIC_BYTES


def decode_managed_ledger_info(data: bytes | bytearray | memoryview) -> pb.ManagedLedgerInfo:
    """Parse a stored record, plain or compressed; FormatError for anything else."""
    data = bytes(data)
    if not is_compressed(data):
        return _parse(data, "managed-ledger info")
    if len(data) < _HEADER.size:
        raise FormatError(f"managed-ledger info: compressed header truncated ({len(data)} bytes)")
    _, meta_len = _HEADER.unpack_from(data, 0)
    if meta_len < 0 or _HEADER.size + meta_len > len(data):
        raise FormatError(
            f"managed-ledger info: metadata length {meta_len} does not fit in {len(data)} bytes"
        )
    meta = pb.ManagedLedgerInfoMetadata()
    try:
        meta.ParseFromString(data[_HEADER.size : _HEADER.size + meta_len])
    except (DecodeError, RuntimeError, ValueError) as e:
        raise FormatError(f"managed-ledger info: bad ManagedLedgerInfoMetadata: {e}") from None
    if not meta.IsInitialized():
        raise FormatError("managed-ledger info: ManagedLedgerInfoMetadata is missing required fields")
    kind = _compression_name(meta.compressionType)
    size = meta.uncompressedSize
    if size < 0:
        raise FormatError(f"managed-ledger info: negative uncompressed size {size}")
    raw = _decompress(kind, data[_HEADER.size + meta_len :], size)
    if len(raw) != size:
        raise FormatError(
            f"managed-ledger info: {kind} payload inflates to {len(raw)} bytes, metadata says {size}"
        )
    return _parse(raw, f"managed-ledger info ({kind})")


def encode_managed_ledger_info(info: pb.ManagedLedgerInfo, compression: str | None = None) -> bytes:
    """Serialise ``info``: plain protobuf when ``compression`` is None or "NONE"; "ZLIB", "ZSTD",
    "LZ4" and "SNAPPY" produce Pulsar's compressed framing. ValidationError for other values or an incomplete info."""
    try:
        raw = info.SerializeToString()
    except EncodeError as e:
        raise ValidationError(f"ManagedLedgerInfo cannot be encoded: {e}") from None
    kind = "NONE" if compression is None else str(compression).upper()
    if kind == "NONE":
        return raw
    if kind == "ZLIB":
        payload = zlib.compress(raw)
    elif kind == "ZSTD":
        import zstandard

        payload = zstandard.ZstdCompressor().compress(raw)
    elif kind == "LZ4":
        import cramjam

        payload = bytes(cramjam.lz4.compress_block(raw, store_size=False))
    elif kind == "SNAPPY":
        import cramjam

        payload = bytes(cramjam.snappy.compress_raw(raw))
    elif kind in _KNOWN:
        raise ValidationError(f"compression {kind} not supported (supported: {', '.join(_SUPPORTED)})")
    else:
        raise ValidationError(f"unknown compression {compression!r} (supported: {', '.join(_SUPPORTED)})")
    meta = pb.ManagedLedgerInfoMetadata(
        compressionType=pb.CompressionType.Value(kind), uncompressedSize=len(raw)
    ).SerializeToString()
    return _HEADER.pack(MAGIC_MANAGED_INFO_METADATA, len(meta)) + meta + payload
