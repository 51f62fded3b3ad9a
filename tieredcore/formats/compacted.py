"""Topic compaction's per-message rules, as Pulsar's compactor applies them (docs/topic-compaction.md,
"Semantics"); pure bytes, no I/O.

Pulsar compacts in two passes over a topic (pulsar-broker ``org/apache/pulsar/compaction/
AbstractTwoPhaseCompactor.java``, ``PublishingOrderCompactor.java``; before 4.0 ``TwoPhaseCompactor.java``):

1. phase one reads every entry up to the horizon and keeps ``key -> position of its latest value``
   (:func:`compaction_items` is what it sees of one entry, :func:`latest_per_key` the map it builds);
2. phase two reads the same entries again and writes to a new ledger what that map retains
   (:func:`rewrite_entry`: an entry unchanged, a batch rewritten with its other messages marked
   ``compacted_out`` as ``RawBatchConverter.rebatchMessage`` does, or nothing), each wrapped as
   ``RawMessageImpl.serialize`` wraps it (:func:`compacted_ledger_entry`).

The key is the ``partition_key`` as stored (base64 text when ``partition_key_b64_encoded``); the ordering
key and ``null_value`` are never consulted: a tombstone is a value of size 0.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from tieredcore.errors import FormatError, MessageFormatError
from tieredcore.formats import compression, native
from tieredcore.formats.messages import (
    MAGIC_BROKER_ENTRY_METADATA,
    MessageId,
    MessageMetadata,
    SingleMessageMetadata,
    frame_entry,
    parse_entry,
)
from tieredcore.model import Buffer

#: Compactor.COMPACTION_SUBSCRIPTION: the cursor whose mark-delete position is the compaction horizon
COMPACTION_SUBSCRIPTION = "__compaction"
#: Compactor.COMPACTED_TOPIC_LEDGER_PROPERTY: the cursor property holding the compacted ledger's id
COMPACTED_TOPIC_LEDGER_PROPERTY = "CompactedTopicLedger"
#: ServiceConfiguration.topicCompactionRetainNullKey's default: keyless messages are not retained
RETAIN_NULL_KEY_DEFAULT = False

_rebatch_c = native.cbatch.rebatch if native.cbatch else None
_I32 = struct.Struct(">i")
_U16 = struct.Struct(">H").unpack_from
_U32 = struct.Struct(">I").unpack_from


@dataclass(frozen=True, slots=True)
class CompactionItem:
    """What phase one sees of one message: where it is (batch index -1 for an entry taken whole), its key
    (None without one) and the size Pulsar tests (0 or less: a tombstone)."""

    position: MessageId
    key: str | None
    size: int

    @property
    def tombstone(self) -> bool:
        return self.size <= 0


def compaction_key(meta: MessageMetadata | SingleMessageMetadata) -> str | None:
    """The key a message is compacted by: its ``partition_key`` as stored, or None without one
    (``hasPartitionKey``: AbstractTwoPhaseCompactor.extractKeyAndSize, RawBatchConverter). The ordering key
    plays no part, and a producer's null key writes no ``partition_key`` (``null_partition_key`` instead).
    A key that is not UTF-8 (the Python parser then hands back bytes) is read as Java's ``String`` reads it,
    each malformed sequence a U+FFFD."""
    if not meta.HasField("partition_key"):
        return None
    key = meta.partition_key
    return key.decode("utf-8", "replace") if isinstance(key, bytes) else key


def is_marker(meta: MessageMetadata) -> bool:
    """A server-only marker (``Markers.isServerOnlyMarker``: any ``marker_type``): neither counted in
    phase one nor written in phase two."""
    return meta.HasField("marker_type")


def is_readable_batch(meta: MessageMetadata) -> bool:
    """Compacted message by message (``RawBatchConverter.isReadableBatch``): a batch whose payload is not
    encrypted. Anything else, an encrypted batch included, is compacted as one message under the entry's
    own key and size."""
    return meta.HasField("num_messages_in_batch") and len(meta.encryption_keys) == 0


def entry_size(meta: MessageMetadata, stored_len: int) -> int:
    """The size phase one tests for an entry compacted whole (``extractKeyAndSize``): the metadata's
    ``uncompressed_size`` when present (producers always set it: 0 for a null or empty value), else the
    length of the payload as stored, after the metadata (Pulsar #25817; 4.x before it took the whole
    entry's length, which is never 0, so such an entry was never a tombstone)."""
    return meta.uncompressed_size if meta.HasField("uncompressed_size") else stored_len


def _singles(raw: Buffer, count: int, where: str) -> list[tuple[SingleMessageMetadata, memoryview]]:
    """``[int32 size][SingleMessageMetadata][payload]`` x ``count`` (Commands.deSerializeSingleMessageInBatch)."""
    mv = memoryview(raw)
    out = []
    q = 0
    for k in range(count):
        if len(mv) - q < 4:
            raise MessageFormatError(f"{where}: the batch ends before message {k} of {count}")
        size = _U32(mv, q)[0]
        q += 4
        if size > len(mv) - q:
            raise MessageFormatError(f"{where}: message {k} of the batch: its metadata overruns the batch")
        try:
            smm = SingleMessageMetadata.FromString(mv[q : q + size])
        except DecodeError as ex:
            raise MessageFormatError(f"{where}: message {k}: SingleMessageMetadata does not parse: {ex}") from None
        q += size
        n = smm.payload_size
        if n < 0 or n > len(mv) - q:
            raise MessageFormatError(f"{where}: message {k} of the batch: its payload overruns the batch")
        out.append((smm, mv[q : q + n]))
        q += n
    return out


def _inflated(meta: MessageMetadata, stored: memoryview, where: str) -> Buffer | None:
    """A readable batch's payload inflated, or None when its codec fails: Pulsar catches that IOException,
    counts nothing of the batch in phase one and writes it whole in phase two."""
    try:
        return compression.inflate(meta.compression, stored, meta.uncompressed_size, where)
    except FormatError:
        return None


def compaction_items(data: Buffer, ledger_id: int, entry_id: int, verify: bool = True) -> list[CompactionItem]:
    """Phase one's view of one entry (PublishingOrderCompactor.compactMessage / compactBatchMessage,
    RawBatchConverter.extractMessageCompactionData): nothing for a marker or a batch that does not inflate;
    one item per message of a readable batch, its messages already ``compacted_out`` left out, the size
    its ``payload_size``; else one item for the whole entry (batch index -1)."""
    frame = parse_entry(data, ledger_id, entry_id, verify)
    meta = frame.metadata
    if is_marker(meta):
        return []
    if not is_readable_batch(meta):
        return [CompactionItem(MessageId(ledger_id, entry_id), compaction_key(meta),
                               entry_size(meta, frame.payload.nbytes))]
    where = f"entry {ledger_id}:{entry_id}"
    raw = _inflated(meta, frame.payload, where)
    if raw is None:
        return []
    return [CompactionItem(MessageId(ledger_id, entry_id, i), compaction_key(smm), smm.payload_size)
            for i, (smm, _) in enumerate(_singles(raw, meta.num_messages_in_batch, where))
            if not smm.compacted_out]


def compacted_out_indexes(data: Buffer, ledger_id: int, entry_id: int, verify: bool = True) -> list[int]:
    """Batch indexes of a readable batch's messages marked ``compacted_out`` (placeholders phase two left
    in a compacted ledger's batches): Pulsar's consumer never delivers them
    (pulsar-client ``ConsumerImpl.receiveIndividualMessagesFromBatch``: ``isCompactedOut`` skips). Empty for
    any other entry; an entry that does not parse gives [] (the row reader reports the damage)."""
    try:
        frame = parse_entry(data, ledger_id, entry_id, verify)
        meta = frame.metadata
        if not is_readable_batch(meta):
            return []
        where = f"entry {ledger_id}:{entry_id}"
        raw = _inflated(meta, frame.payload, where)
        if raw is None:
            return []
        return [i for i, (smm, _) in enumerate(_singles(raw, meta.num_messages_in_batch, where)) if smm.compacted_out]
    except (FormatError, ValueError):
        return []


def latest_per_key(items: Iterable[CompactionItem]) -> dict[str, MessageId]:
    """The reference reducer: ``key -> position of its latest value`` over ``items`` in position order, as
    phase one builds it: a value puts its position, a tombstone removes its key, a keyless item changes
    nothing (with or without topicCompactionRetainNullKey: keyless messages never enter the map).

    Equivalently, for each key the item at its greatest position, kept unless it is a tombstone: what a
    job that sees the items in any order computes."""
    latest: dict[str, MessageId] = {}
    for item in items:
        if item.key is None:
            continue
        if item.size > 0:
            latest[item.key] = item.position
        else:
            latest.pop(item.key, None)
    return latest


def _broker_prefix(mv: memoryview) -> bytes:
    """The broker entry metadata in front of an entry, verbatim (empty when absent)."""
    if len(mv) >= 6 and _U16(mv, 0)[0] == MAGIC_BROKER_ENTRY_METADATA:
        return bytes(mv[: 6 + _U32(mv, 2)[0]])
    return b""


def rebatch(data: Buffer, ledger_id: int, entry_id: int, keep: Callable[[str, MessageId], bool],
            retain_null_key: bool = RETAIN_NULL_KEY_DEFAULT, verify: bool = True) -> bytes | None:
    """A readable batch rewritten as ``RawBatchConverter.rebatchMessage`` writes it, or None when no
    message is retained (the entry is dropped).

    Message ``i`` is retained, its metadata and payload as they were, when it is not already
    ``compacted_out`` and either has no key and ``retain_null_key``, or has a key, ``keep(key, position)``
    and a non-empty payload. Any other message becomes a placeholder: a SingleMessageMetadata of only
    ``payload_size = 0`` and ``compacted_out = true``, no payload (its key, properties, sequence id are
    gone), so positions and ``num_messages_in_batch`` stay. The entry's metadata is kept but for
    ``uncompressed_size`` (the new batch's), the batch compressed again with the same codec, and the entry
    framed with a CRC32C whether or not it had one; broker entry metadata in front is kept, verbatim (the
    current ``rebatchMessage``'s ``brokerMeta``; earlier versions dropped it). A batch whose codec fails comes back unchanged (phase two's IOException path)."""
    frame = parse_entry(data, ledger_id, entry_id, verify)
    meta = frame.metadata
    if not is_readable_batch(meta):
        raise ValueError(f"entry {ledger_id}:{entry_id} is not a readable batch")
    where = f"entry {ledger_id}:{entry_id}"
    raw = _inflated(meta, frame.payload, where)
    if raw is None:
        return bytes(data)
    placeholder = SingleMessageMetadata(payload_size=0, compacted_out=True).SerializeToString()
    parts: list[bytes] = []
    retained = 0
    for i, (smm, body) in enumerate(_singles(raw, meta.num_messages_in_batch, where)):
        key = compaction_key(smm)
        if smm.compacted_out:
            take = False  # read back from an earlier compacted ledger: stays a placeholder
        elif key is None:
            take = retain_null_key
        else:
            take = keep(key, MessageId(ledger_id, entry_id, i)) and len(body) > 0
        if take:
            retained += 1
            smm.payload_size = len(body)  # serializeSingleMessageInBatchWithPayload sets it
            s = smm.SerializeToString()
            parts += [_I32.pack(len(s)), s, bytes(body)]
        else:
            parts += [_I32.pack(len(placeholder)), placeholder]
    if not retained:
        return None
    return _framed_batch(data, meta, b"".join(parts))


def _framed_batch(data: Buffer, meta: MessageMetadata, batch: bytes) -> bytes:
    """A rewritten batch as rebatchMessage frames it: the entry's metadata with the new batch's
    ``uncompressed_size``, the batch compressed with the entry's codec, a CRC32C, any broker entry metadata
    in front kept verbatim."""
    out = MessageMetadata()
    out.CopyFrom(meta)
    out.uncompressed_size = len(batch)
    return _broker_prefix(memoryview(data)) + frame_entry(out, compression.compress(meta.compression, batch))


def rewrite_entry(data: Buffer, ledger_id: int, entry_id: int, latest: Mapping[str, MessageId],
                  retain_null_key: bool = RETAIN_NULL_KEY_DEFAULT, verify: bool = True) -> bytes | None:
    """What phase two writes to the compacted ledger for one entry, given phase one's ``latest``
    (AbstractTwoPhaseCompactor.phaseTwoLoop): None for a marker or an entry nothing of which is retained;
    a readable batch through :func:`rebatch`; any other entry unchanged when it has a key whose latest
    position it is (its size is then positive), or when it has none and ``retain_null_key``."""
    frame = parse_entry(data, ledger_id, entry_id, verify)
    meta = frame.metadata
    if is_marker(meta):
        return None
    if is_readable_batch(meta):
        return rebatch(data, ledger_id, entry_id, lambda key, pos: latest.get(key) == pos, retain_null_key,
                       verify)
    key = compaction_key(meta)
    if key is None:
        return bytes(data) if retain_null_key else None
    if latest.get(key) != MessageId(ledger_id, entry_id):
        return None
    if entry_size(meta, frame.payload.nbytes) <= 0:
        # Pulsar fails the compaction here ("found empty record from sorted key-map"): a map phase one
        # built never points at a tombstone
        raise ValueError(f"entry {ledger_id}:{entry_id}: latest value of {key!r} is a tombstone")
    return bytes(data)


def rewrite_entry_at(data: Buffer, ledger_id: int, entry_id: int, kept: bytes | None,
                     retain_null_key: bool = RETAIN_NULL_KEY_DEFAULT, verify: bool = True) -> bytes | None:
    """:func:`rewrite_entry` given, instead of phase one's whole map, where this entry's retained values are:
    ``kept`` the sorted batch indexes (native int32s; -1 for an entry taken whole) of the keys whose latest
    value is in this entry, None when there is none. The same bytes as rewrite_entry with a map that agrees
    (a key's latest position holds that key, so "latest[key] == position" is "position is kept"). A batch's
    messages are rewritten in C (cbatch.c ``rebatch``) when it is built and takes them; else by
    :func:`rebatch`, the reference."""
    frame = parse_entry(data, ledger_id, entry_id, verify)
    meta = frame.metadata
    if is_marker(meta):
        return None
    if is_readable_batch(meta):
        if _rebatch_c is not None:
            raw = _inflated(meta, frame.payload, f"entry {ledger_id}:{entry_id}")
            if raw is None:
                return bytes(data)
            code, body, _n = _rebatch_c(raw, max(meta.num_messages_in_batch, 0), kept or b"", retain_null_key)
            if code == 0:
                return None if body is None else _framed_batch(data, meta, body)
        at = set(array("i", kept or b""))
        return rebatch(data, ledger_id, entry_id, lambda _key, pos: pos.batch_index in at, retain_null_key,
                       verify)
    key = compaction_key(meta)
    if key is None:
        return bytes(data) if retain_null_key else None
    if not kept:
        return None
    if entry_size(meta, frame.payload.nbytes) <= 0:
        raise ValueError(f"entry {ledger_id}:{entry_id}: latest value of {key!r} is a tombstone")
    return bytes(data)


# --- the compacted ledger's entries: RawMessageImpl.serialize -------------------------------------------


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # negative int32s as protobuf writes them: ten bytes, two's complement
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _read_varint(mv: memoryview, q: int, end: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        if q >= end or shift > 63:
            raise MessageFormatError("MessageIdData: truncated varint")
        b = mv[q]
        q += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, q


def message_id_data(ledger_id: int, entry_id: int, partition: int = -1) -> bytes:
    """MessageIdData as the broker sends it with each message to the compactor's reader
    (``Commands.newMessageCommand``: ledgerId 1, entryId 2, partition 3, always set; -1 when the topic is
    not partitioned); no batch index, no ack set."""
    return (b"\x08" + _varint(ledger_id) + b"\x10" + _varint(entry_id) + b"\x18" + _varint(partition))


def compacted_ledger_entry(entry: Buffer, ledger_id: int, entry_id: int, partition: int = -1) -> bytes:
    """One entry of a compacted ledger (``RawMessageImpl.serialize``): ``[int32 id size][MessageIdData]
    [int32 entry size][entry]``, the id being the original position the entry is served at."""
    mid = message_id_data(ledger_id, entry_id, partition)
    e = bytes(entry)
    return _I32.pack(len(mid)) + mid + _I32.pack(len(e)) + e


def parse_compacted_ledger_entry(data: Buffer) -> tuple[int, int, int, memoryview]:
    """``(ledger id, entry id, partition, entry)`` of a compacted ledger's entry
    (``RawMessageImpl.deserializeFrom``); MessageFormatError when it is not one."""
    mv = memoryview(data)
    if len(mv) < 4:
        raise MessageFormatError("compacted ledger entry: too short")
    size = _U32(mv, 0)[0]
    end = 4 + size
    if end + 4 > len(mv):
        raise MessageFormatError("compacted ledger entry: MessageIdData overruns the entry")
    fields: dict[int, int] = {}
    q = 4
    while q < end:
        tag, q = _read_varint(mv, q, end)
        if tag & 7 == 0:
            value, q = _read_varint(mv, q, end)
            fields.setdefault(tag >> 3, value)
        elif tag & 7 == 2:  # ack_set packed, first_chunk_message_id: not needed here
            n, q = _read_varint(mv, q, end)
            q += n
        else:
            raise MessageFormatError(f"compacted ledger entry: MessageIdData wire type {tag & 7}")
    if q != end or 1 not in fields or 2 not in fields:
        raise MessageFormatError("compacted ledger entry: MessageIdData lacks ledgerId or entryId")
    partition = fields.get(3, -1)  # an int32 read as 64 bits: -1 comes back as 2**64 - 1
    partition = partition - (1 << 64) if partition >= 1 << 63 else partition
    n = _U32(mv, end)[0]
    if end + 4 + n != len(mv):
        raise MessageFormatError(f"compacted ledger entry: {n} bytes declared, {len(mv) - end - 4} follow")
    return fields[1], fields[2], partition, mv[end + 4 :]
