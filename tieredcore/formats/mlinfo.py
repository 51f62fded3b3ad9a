"""Bytes of a managed-ledger record (``ManagedLedgerInfo``, docs/metadata.md).

Pulsar stores the record either as plain protobuf or, when compression is configured, as::

    [0x4778 : int16 BE][metaLen : int32 BE][ManagedLedgerInfoMetadata : metaLen bytes][compressed]

``ManagedLedgerInfoMetadata{compressionType, uncompressedSize}``. Readers test for the magic first;
a plain record can never start with 0x47 0x78 (0x47 is field 8 with the invalid wire type 7).
Every codec Pulsar writes reads (:mod:`tieredcore.formats.compression`: LZ4 raw block, ZLIB as Java's
``Deflater`` with ``SYNC_FLUSH`` and never finished — finished streams read too —, ZSTD frames with or
without a content size, raw Snappy); records are written the same way.
"""

from __future__ import annotations

import struct

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError, EncodeError

from tieredcore.errors import FormatError, ValidationError
from tieredcore.formats import compression
from tieredcore.formats.proto import MLDataFormats_pb2 as pb

ManagedLedgerInfo = pb.ManagedLedgerInfo
LedgerInfo = pb.ManagedLedgerInfo.LedgerInfo

MAGIC_MANAGED_INFO_METADATA = 0x4778
_HEADER = struct.Struct(">hi")
_MAGIC_BYTES = struct.pack(">h", MAGIC_MANAGED_INFO_METADATA)



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


def decode_checked_managed_ledger_info(data: bytes | bytearray | memoryview) -> pb.ManagedLedgerInfo:
    """Parse a record :func:`decode_managed_ledger_info` accepted before (e.g. a topic manifest's, checked
    when it was read): plain protobuf is parsed once, without the UTF-8 and required-field checks again."""
    data = bytes(data)
    if is_compressed(data):
        return decode_managed_ledger_info(data)
    return pb.ManagedLedgerInfo.FromString(data)


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
    kind = meta.compressionType
    raw = compression.decompress(kind, data[_HEADER.size + meta_len :], meta.uncompressedSize, "managed-ledger info")
    return _parse(raw, f"managed-ledger info ({compression.name(kind)})")


def encode_managed_ledger_info(info: pb.ManagedLedgerInfo, codec: str | None = None) -> bytes:
    """Serialise ``info``: plain protobuf when ``codec`` is None or "NONE"; "ZLIB", "ZSTD", "LZ4" and
    "SNAPPY" produce Pulsar's compressed framing, each as Pulsar's codec writes it. ValidationError for
    other values or an incomplete info."""
    try:
        raw = info.SerializeToString()
    except EncodeError as e:
        raise ValidationError(f"ManagedLedgerInfo cannot be encoded: {e}") from None
    kind = compression.NONE if codec is None else compression.codec(codec)
    if kind == compression.NONE:
        return raw
    payload = compression.compress(kind, raw)
    meta = pb.ManagedLedgerInfoMetadata(compressionType=kind, uncompressedSize=len(raw)).SerializeToString()
    return _HEADER.pack(MAGIC_MANAGED_INFO_METADATA, len(meta)) + meta + payload
