"""Topic manifests: a topic's offloaded state as one small object in the bucket (docs/recovery.md).

Pure bytes <-> dataclass, no I/O. (``formats/manifest.py`` is the manifest of one chunked object; this is
a different thing: one per topic and change.) Layout, all integers big-endian::

    offset  size  field
    0       4     magic b"TTMF"
    4       2     format version = 1
    6       2     flags = 0 (readers refuse other values)
    8       8     sequence (int64 >= 0, monotonic per topic)
    16      8     written_ms (int64, the writer's clock)
    24      2     T = length of the managed-ledger name
    26      T     managed-ledger name (UTF-8, tenant/namespace/persistent/topic)
    26+T    4     P = length of the policy document
    30+T    P     policy document: canonical JSON (sorted keys, no spaces) {"namespace": {...} | null,
                  "topic": {...} | null}: the namespace and topic policies in force, as stored
    30+T+P  4     R = length of the record
    34+T+P  R     the topic's ManagedLedgerInfo (plain protobuf, Pulsar's field numbers), reduced to its
                  offloaded view (:func:`offloaded_view`)
    34+T+P+R 4    CRC32C of every byte before it

The record carries, per ledger in order: id, entries, size, close time, the offload context (uuid,
driver metadata with bucket / prefix / transform / key ring, complete, bookkeeperDeleted, timestamp),
the streaming segment pieces, and the topic's properties (the compacted-ledger pointer among them).
Nothing else trails the checksum: a manifest of any other length is damaged.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any

import crc32c

from tieredcore.errors import FormatError
from tieredcore.formats.mlinfo import (
    ManagedLedgerInfo,
    decode_managed_ledger_info,
    encode_managed_ledger_info,
)

__all__ = ["MAGIC", "TOMBSTONE_PROPERTY", "VERSION", "TopicManifest", "decode_topic_manifest", "encode_topic_manifest",
           "offloaded_view"]

MAGIC = b"TTMF"
VERSION = 1
_HEAD = struct.Struct(">4sHHqqH")  # magic, version, flags, sequence, written_ms, name length
_U32 = struct.Struct(">I")
MAX_TOPIC_MANIFEST_BYTES = 64 * 1024 * 1024
# a topic record property that makes a manifest a tombstone: the topic was deleted (its record has no ledgers)
TOMBSTONE_PROPERTY = "tiered.topicDeleted"
# properties naming uuids whose objects may not exist (attempts being replaced, legacy abandoned ones)
_TRANSIENT_PROPERTY_PREFIXES = ("tiered.abandonedOffload.", "tiered.replacementOffload.")


@dataclass(frozen=True)
class TopicManifest:
    topic: str  # managed-ledger name
    sequence: int
    written_ms: int
    record: bytes  # plain ManagedLedgerInfo protobuf (the offloaded view)
    namespace_policy: dict[str, Any] | None = None
    topic_policy: dict[str, Any] | None = field(default=None)

    def info(self) -> ManagedLedgerInfo:
        return decode_managed_ledger_info(self.record)

    @property
    def deleted(self) -> bool:
        """A tombstone: written when the topic was deleted (recovery does not bring it back)."""
        return any(kv.key == TOMBSTONE_PROPERTY for kv in self.info().properties)


def offloaded_view(info: ManagedLedgerInfo) -> ManagedLedgerInfo:
    """A copy of ``info`` naming only objects that exist: incomplete offload contexts lose their uuid and
    driver (an attempt in flight may not have written anything yet), incomplete segment entries go, and so
    do the properties naming replacement or abandoned attempts. ``bookkeeperDeleted`` and everything
    else stay."""
    out = ManagedLedgerInfo()
    out.CopyFrom(info)
    for li in out.ledgerInfo:
        if li.HasField("offloadContext"):
            ctx = li.offloadContext
            if not ctx.complete:
                for f in ("uidMsb", "uidLsb", "driverMetadata", "timestamp", "complete"):
                    ctx.ClearField(f)
            keep = [s for s in ctx.offloadSegment if s.complete]
            if len(keep) != len(ctx.offloadSegment):
                del ctx.offloadSegment[:]
                ctx.offloadSegment.extend(keep)
            if not ctx.ListFields():
                li.ClearField("offloadContext")
        props = [kv for kv in li.properties if not kv.key.startswith(_TRANSIENT_PROPERTY_PREFIXES)]
        if len(props) != len(li.properties):
            del li.properties[:]
            li.properties.extend(props)
    return out


def _policy_doc(m: TopicManifest) -> bytes:
    return json.dumps({"namespace": m.namespace_policy, "topic": m.topic_policy}, sort_keys=True,
                      separators=(",", ":")).encode()


def encode_topic_manifest(m: TopicManifest) -> bytes:
    name = m.topic.encode()
    if m.topic.count("/") != 3 or len(name) > 0xFFFF:
        raise FormatError(f"topic manifest: {m.topic!r} is not a managed-ledger name")
    if m.sequence < 0 or m.written_ms < 0:
        raise FormatError(f"topic manifest: negative sequence {m.sequence} or time {m.written_ms}")
    policy = _policy_doc(m)
    body = b"".join([_HEAD.pack(MAGIC, VERSION, 0, m.sequence, m.written_ms, len(name)), name,
                     _U32.pack(len(policy)), policy, _U32.pack(len(m.record)), m.record])
    return body + _U32.pack(crc32c.crc32c(body))


def _take(buf: bytes, pos: int, n: int, what: str) -> tuple[bytes, int]:
    if n < 0 or pos + n > len(buf) - 4:
        raise FormatError(f"topic manifest: {what} runs past the end")
    return buf[pos:pos + n], pos + n


def decode_topic_manifest(data: bytes | bytearray | memoryview, *, check_record: bool = True) -> TopicManifest:
    """The manifest, or FormatError naming what is wrong (damaged, truncated, another format).
    ``check_record=False``: the record is not parsed (bytes decoded with the default before)."""
    buf = bytes(data)
    if len(buf) < _HEAD.size + 12 or len(buf) > MAX_TOPIC_MANIFEST_BYTES:
        raise FormatError(f"topic manifest: {len(buf)} bytes is not a manifest's size")
    (stored,) = _U32.unpack_from(buf, len(buf) - 4)
    if crc32c.crc32c(buf[:-4]) != stored:
        raise FormatError("topic manifest: checksum mismatch (damaged)")
    magic, version, flags, seq, written, tlen = _HEAD.unpack_from(buf, 0)
    if magic != MAGIC:
        raise FormatError(f"topic manifest: magic {magic!r}, expected {MAGIC!r}")
    if version != VERSION or flags != 0:
        raise FormatError(f"topic manifest: version {version} flags {flags} not supported")
    if seq < 0 or written < 0:
        raise FormatError("topic manifest: negative sequence or time")
    name, pos = _take(buf, _HEAD.size, tlen, "topic name")
    (plen,) = _U32.unpack_from(buf, pos) if pos + 4 <= len(buf) - 4 else (-1,)
    policy, pos = _take(buf, pos + 4, plen, "policy document")
    (rlen,) = _U32.unpack_from(buf, pos) if pos + 4 <= len(buf) - 4 else (-1,)
    record, pos = _take(buf, pos + 4, rlen, "record")
    if pos != len(buf) - 4:
        raise FormatError(f"topic manifest: {len(buf) - 4 - pos} unexpected byte(s) before the checksum")
    try:
        topic = name.decode()
        doc = json.loads(policy)
        ns_policy, topic_policy = doc["namespace"], doc["topic"]
    except (UnicodeDecodeError, ValueError, TypeError, KeyError) as e:
        raise FormatError(f"topic manifest: {type(e).__name__}: {e}") from e
    if topic.count("/") != 3 or not all(p is None or isinstance(p, dict) for p in (ns_policy, topic_policy)):
        raise FormatError("topic manifest: bad topic name or policy document")
    if check_record:
        decode_managed_ledger_info(record)  # FormatError when the record does not parse
    return TopicManifest(topic, seq, written, record, ns_policy, topic_policy)


def encode_view(info: ManagedLedgerInfo) -> bytes:
    """The record part of a manifest for ``info`` (plain protobuf of its offloaded view)."""
    return encode_managed_ledger_info(offloaded_view(info))
