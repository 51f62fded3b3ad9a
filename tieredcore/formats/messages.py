"""Pulsar messages inside entries (spec/07, docs/formats.md "Messages inside entries"), both ways.

An entry is what a broker hands BookKeeper, as Pulsar's ``Commands`` (pulsar-common
``org.apache.pulsar.common.protocol.Commands``) writes and reads it, big-endian::

    [0x0e02][int32 size][BrokerEntryMetadata]            optional (addBrokerEntryMetadata)
    [0x0e01][uint32 CRC32C][int32 size][MessageMetadata][payload]   (serializeMetadataAndPayload)

The CRC32C covers the metadata size, the metadata and the payload. Entries of very old clients have no
magic and no checksum (``hasChecksum`` is false): ``[int32 size][MessageMetadata][payload]``. A batch
(``num_messages_in_batch`` present) has its payload compressed as a whole (``compression``, to
``uncompressed_size`` bytes) and, once inflated, ``[int32 size][SingleMessageMetadata][payload]`` per
message (``serializeSingleMessageInBatchWithPayload``). An entry with ``encryption_keys`` is one message
whose payload is still encrypted (and compressed): Pulsar's consumer without the key delivers it whole,
never splitting or inflating it; so do these readers. A chunk of a chunked message is one message as
stored (Pulsar inflates only the stitched whole).

Decoding yields :class:`Message` tuples (position ``ledger:entry:batch-index``; the batch index is -1 for
an entry that is not a batch) whose payload is a memoryview of the entry (no copy) or of the one inflated
batch. A checksum that does not match raises :class:`~tieredcore.errors.MessageChecksumError` naming the
entry; any other malformed entry a :class:`~tieredcore.errors.MessageFormatError`. :func:`decode_entries`
and :func:`check_entries` take a whole :class:`~tieredcore.model.EntryBatch` (what every read handle
returns) and can collect bad entries instead of stopping at the first.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import crc32c
from google.protobuf import unknown_fields
from google.protobuf.message import DecodeError

from tieredcore.errors import FormatError, MessageChecksumError, MessageFormatError
from tieredcore.formats import compression, native
from tieredcore.formats.proto import PulsarApi_pb2 as pb
from tieredcore.model import Buffer, EntryBatch, Position

MAGIC_CHECKSUM = 0x0E01  # Commands.magicCrc32c
MAGIC_BROKER_ENTRY_METADATA = 0x0E02  # Commands.magicBrokerEntryMetadata
_MAGIC_CHECKSUM_BYTES = MAGIC_CHECKSUM.to_bytes(2, "big")
_MAGIC_BROKER_BYTES = MAGIC_BROKER_ENTRY_METADATA.to_bytes(2, "big")

MessageMetadata = pb.MessageMetadata
SingleMessageMetadata = pb.SingleMessageMetadata
BrokerEntryMetadata = pb.BrokerEntryMetadata

_U16 = struct.Struct(">H").unpack_from
_U32 = struct.Struct(">I").unpack_from
_HEAD = struct.Struct(">HII").unpack_from  # magic, CRC32C, metadata size
_I32 = struct.Struct(">i")
_tuple_new = tuple.__new__
_MM_parse = MessageMetadata.FromString
_SMM_parse = SingleMessageMetadata.FromString
_crc = crc32c.crc32c
_inflate = compression.inflate
_COMPRESSION_FIELD = MessageMetadata.DESCRIPTOR.fields_by_name["compression"].number


# the C reader of whole entries into Arrow buffers (tieredcore.query.rows.message_batches; formats/native.py),
# None when not there; decode_columns, in Python, is its reference
native_columns = native.cbatch.columns if native.cbatch else None
NATIVE_LIMIT = native.cbatch.LIMIT if native.cbatch else None  # columns(): stopped before 32-bit offsets overflow


class MessageId(NamedTuple):
    """Where a message is: ``ledger:entry`` for an entry that is not a batch, ``ledger:entry:index`` for
    message ``index`` of a batch (Pulsar's MessageId with batch index -1 / ``index``)."""

    ledger_id: int
    entry_id: int
    batch_index: int = -1

    def __str__(self) -> str:
        if self.batch_index < 0:
            return f"{self.ledger_id}:{self.entry_id}"
        return f"{self.ledger_id}:{self.entry_id}:{self.batch_index}"


class Message(NamedTuple):
    """One decoded message: its position, payload and the metadata it came with (the entry's
    ``MessageMetadata``, its ``SingleMessageMetadata`` in a batch, the broker's entry metadata). The
    properties below read them as Pulsar's consumer does: in a batch, key, ordering key, properties and
    flags are the single message's own (the entry's key is the first message's, never inherited: the
    consumer clears it and topic compaction reads the single message's key); event time and sequence id
    fall back to the entry's."""

    ledger_id: int
    entry_id: int
    batch_index: int
    payload: memoryview
    metadata: MessageMetadata
    single: SingleMessageMetadata | None
    broker: BrokerEntryMetadata | None

    @property
    def id(self) -> MessageId:
        return MessageId(self.ledger_id, self.entry_id, self.batch_index)

    @property
    def _own(self) -> MessageMetadata | SingleMessageMetadata:
        return self.metadata if self.single is None else self.single

    @property
    def publish_time(self) -> int:
        return self.metadata.publish_time

    @property
    def event_time(self) -> int | None:
        """The application's event time (ms): a batched message's own, else the entry's (as Pulsar's
        ``MessageImpl`` and ``RawMessageImpl`` read it); None when unset (Pulsar reports 0)."""
        s = self.single
        t = s.event_time if s is not None and s.HasField("event_time") else self.metadata.event_time
        return t or None

    @property
    def key(self) -> str | None:
        """The partition key as stored (base64 text when ``key_is_b64``); None without one."""
        own = self._own
        return own.partition_key if own.HasField("partition_key") and not own.null_partition_key else None

    @property
    def key_is_b64(self) -> bool:
        return self._own.partition_key_b64_encoded

    @property
    def key_bytes(self) -> bytes | None:
        k = self.key
        if k is None:
            return None
        return base64.b64decode(k) if self.key_is_b64 else k.encode()

    @property
    def ordering_key(self) -> bytes | None:
        own = self._own
        return own.ordering_key if own.HasField("ordering_key") else None

    @property
    def properties(self) -> dict[str, str]:
        return {kv.key: kv.value for kv in self._own.properties}

    @property
    def producer_name(self) -> str:
        return self.metadata.producer_name

    @property
    def sequence_id(self) -> int:
        """A batched message's own sequence id when it carries one, else the entry's plus the batch index
        (``RawMessageImpl.getSequenceId``)."""
        s = self.single
        if s is None:
            return self.metadata.sequence_id
        return s.sequence_id if s.HasField("sequence_id") else self.metadata.sequence_id + self.batch_index

    @property
    def null_value(self) -> bool:
        return self._own.null_value

    @property
    def null_key(self) -> bool:
        return self._own.null_partition_key

    @property
    def compacted_out(self) -> bool:
        """Removed by topic compaction (Pulsar's consumer skips it)."""
        return self.single is not None and self.single.compacted_out

    @property
    def encrypted(self) -> bool:
        """Its payload is still encrypted (and compressed with ``compression``): delivered whole."""
        return len(self.metadata.encryption_keys) > 0

    @property
    def chunk(self) -> tuple[int, int] | None:
        """(chunk id, chunks) for a chunk of a chunked message, whose payload is as stored."""
        m = self.metadata
        return (m.chunk_id, m.num_chunks_from_msg) if m.num_chunks_from_msg > 1 else None

    @property
    def compression(self) -> int:
        """The codec the payload is still compressed with: NONE once inflated."""
        if self.encrypted or self.chunk is not None:
            return self.metadata.compression
        return compression.NONE

    @property
    def batch_size(self) -> int:
        """Messages in its entry (1 for an entry that is not a batch)."""
        return self.metadata.num_messages_in_batch if self.batch_index >= 0 else 1

    @property
    def broker_timestamp(self) -> int | None:
        b = self.broker
        return b.broker_timestamp if b is not None and b.HasField("broker_timestamp") else None

    @property
    def broker_index(self) -> int | None:
        b = self.broker
        return b.index if b is not None and b.HasField("index") else None


@dataclass(frozen=True)
class BadEntry:
    """An entry that could not be decoded: ``checksum`` is True for a CRC32C mismatch (damaged bytes),
    False for an entry that is not a well-formed Pulsar message."""

    position: Position
    reason: str
    checksum: bool


@dataclass
class EntryCheck:
    """What :func:`check_entries` found in the entries it saw."""

    entries: int = 0
    checked: int = 0  # CRC32C present and right
    unchecked: int = 0  # no checksum (old clients): metadata parses, nothing else to prove
    bad: list[BadEntry] = field(default_factory=list)

    def add(self, other: EntryCheck) -> None:
        self.entries += other.entries
        self.checked += other.checked
        self.unchecked += other.unchecked
        self.bad.extend(other.bad)


# --- reading ---------------------------------------------------------------------------------------------


def _where(ledger_id: int, entry_id: int) -> str:
    return f"entry {ledger_id}:{entry_id}"


def _frame(mv: memoryview, s: int, e: int, lid: int, eid: int,
           verify: bool = True) -> tuple[BrokerEntryMetadata | None, bool, int, int]:
    """Broker entry metadata, whether a checksum was verified, and where the metadata starts and ends, of
    the entry at ``mv[s:e]`` (``Commands.parseMessageMetadata``: skipBrokerEntryMetadataIfExist, then
    skipChecksumIfPresent); the checksum checked when ``verify``."""
    # explicit bounds: an EntryBatch's buffer goes on past this entry, so reads never fail by themselves
    broker = None
    checked = False
    if e - s < 4:
        raise _bad(lid, eid, f"{e - s} bytes, too short for a message")
    head = _U16(mv, s)[0]
    if head == MAGIC_BROKER_ENTRY_METADATA:
        size = _U32(mv, s + 2)[0] if e - s >= 6 else -1
        if size < 0 or size > e - s - 10:  # 4 more bytes at least: the message's metadata size
            raise _bad(lid, eid, "broker entry metadata overruns the entry")
        try:
            broker = BrokerEntryMetadata.FromString(mv[s + 6 : s + 6 + size])
        except DecodeError as ex:
            raise _bad(lid, eid, f"broker entry metadata does not parse: {ex}") from None
        s += 6 + size
        head = _U16(mv, s)[0]
    if head == MAGIC_CHECKSUM:
        if e - s < 10:
            raise _bad(lid, eid, "truncated after the checksum magic")
        _, stored, msize = _HEAD(mv, s)
        s += 6
        if verify:
            computed = _crc(mv[s:e])
            if stored != computed:
                raise MessageChecksumError(
                    f"{_where(lid, eid)}: CRC32C mismatch (stored {stored:#010x}, computed {computed:#010x})",
                    position=Position(lid, eid), stored=stored, computed=computed)
            checked = True
    else:
        msize = _U32(mv, s)[0]
    if msize > e - s - 4:
        raise _bad(lid, eid, f"metadata of {msize} bytes overruns the entry ({e - s - 4} bytes follow)")
    return broker, checked, s + 4, s + 4 + msize


def _bad(lid: int, eid: int, what: str) -> MessageFormatError:
    return MessageFormatError(f"{_where(lid, eid)}: not a Pulsar message: {what}", position=Position(lid, eid))


def _not_text(lid: int, eid: int, k: int, what: str) -> MessageFormatError:
    where = f"message {k} of the batch: " if k >= 0 else ""
    return _bad(lid, eid, f"{where}{what} is not UTF-8")


def _metadata(mv: memoryview, ms: int, me: int, lid: int, eid: int) -> MessageMetadata:
    try:
        meta = _MM_parse(mv[ms:me])
    except DecodeError as ex:
        raise _bad(lid, eid, f"MessageMetadata does not parse: {ex}") from None
    if not meta.IsInitialized():  # upb parses without checking; Pulsar's reader refuses such metadata
        raise _bad(lid, eid, f"MessageMetadata lacks {', '.join(meta.FindInitializationErrors())}")
    return meta


def _stored(lid: int, eid: int, meta: MessageMetadata, payload: memoryview) -> tuple[memoryview, bool]:
    """An entry's payload ready to split, and whether it is a batch to split: delivered as stored when
    encrypted or a chunk (see module doc), else inflated."""
    if len(meta.encryption_keys) or meta.num_chunks_from_msg > 1:
        return payload, False
    kind = meta.compression
    if kind:
        try:
            payload = memoryview(_inflate(kind, payload, meta.uncompressed_size))
        except FormatError as ex:
            raise _bad(lid, eid, str(ex)) from None
    elif len(unknown_fields.UnknownFieldSet(meta)) and any(
            f.field_number == _COMPRESSION_FIELD for f in unknown_fields.UnknownFieldSet(meta)):
        # a CompressionType value this reader does not know (proto2 keeps it aside and reads NONE):
        # taken as NONE, compressed bytes would come back as the payload
        raise _bad(lid, eid, "unknown compression codec")
    if not meta.HasField("num_messages_in_batch"):
        return payload, False
    if meta.num_messages_in_batch <= 0:
        raise _bad(lid, eid, f"a batch of {meta.num_messages_in_batch} messages")
    return payload, True


def _singles(lid: int, eid: int, count: int, payload: memoryview) -> Iterator[tuple[SingleMessageMetadata, memoryview]]:
    """The (SingleMessageMetadata, payload) of each message of an inflated batch."""
    end = len(payload)
    q = k = 0
    u32, parse = _U32, _SMM_parse
    try:
        for k in range(count):
            size = u32(payload, q)[0]
            q += 4
            if size > end - q:
                raise _bad(lid, eid, f"message {k} of the batch: its metadata overruns the batch")
            single = parse(payload[q : q + size])
            q += size
            n = single.payload_size
            if not n and not single.HasField("payload_size"):  # required (upb does not check)
                raise _bad(lid, eid, f"message {k} of the batch: SingleMessageMetadata lacks payload_size")
            if n < 0 or n > end - q:
                raise _bad(lid, eid, f"message {k} of the batch: its {n}-byte payload overruns the batch")
            yield single, payload[q : q + n]
            q += n
    except struct.error:
        raise _bad(lid, eid, f"the batch ends before message {k} of {count}") from None
    except DecodeError as ex:
        raise _bad(lid, eid, f"message {k} of the batch: SingleMessageMetadata does not parse: {ex}") from None


def _split(out: list, lid: int, eid: int, meta: MessageMetadata, payload: memoryview,
           broker: BrokerEntryMetadata | None) -> None:
    """Append the messages of one entry (its metadata parsed, its payload as stored) to ``out``."""
    payload, batched = _stored(lid, eid, meta, payload)
    if not batched:
        out.append(_tuple_new(Message, (lid, eid, -1, payload, meta, None, broker)))
        return
    new, append = _tuple_new, out.append
    for k, (single, body) in enumerate(_singles(lid, eid, meta.num_messages_in_batch, payload)):
        append(new(Message, (lid, eid, k, body, meta, single, broker)))


class EntryFrame(NamedTuple):
    """One entry's parts before its payload is inflated or split."""

    broker: BrokerEntryMetadata | None
    checked: bool  # a CRC32C was present and matched
    metadata: MessageMetadata
    payload: memoryview  # as stored: compressed, a batch, encrypted


def parse_entry(data: Buffer, ledger_id: int = -1, entry_id: int = -1, verify: bool = True) -> EntryFrame:
    """An entry's broker metadata, metadata and stored payload (``Commands.parseMessageMetadata``), its
    checksum checked unless ``verify`` is False; errors as :func:`decode_entry`."""
    mv = memoryview(data)
    broker, checked, ms, me = _frame(mv, 0, len(mv), ledger_id, entry_id, verify)
    return EntryFrame(broker, checked, _metadata(mv, ms, me, ledger_id, entry_id), mv[me:])


def decode_entry(data: Buffer, ledger_id: int = -1, entry_id: int = -1, verify: bool = True) -> list[Message]:
    """The messages of one entry (its payload views ``data``); MessageChecksumError for a checksum that
    does not match (checked unless ``verify`` is False), MessageFormatError for anything else malformed."""
    frame = parse_entry(data, ledger_id, entry_id, verify)
    out: list[Message] = []
    _split(out, ledger_id, entry_id, frame.metadata, frame.payload, frame.broker)
    return out


def decode_entries(batch: EntryBatch, bad: list[BadEntry] | None = None, verify: bool = True) -> list[Message]:
    """Every message of every entry of ``batch``, in order. A bad entry raises (MessageChecksumError,
    MessageFormatError, naming it), or, when ``bad`` is a list, is appended to it and skipped."""
    mv = memoryview(batch.buf)
    lid, eid = batch.ledger_id, batch.first_entry
    out: list[Message] = []
    for s, n in zip(batch.starts, batch.lengths, strict=True):
        kept = len(out)
        try:
            broker, _, ms, me = _frame(mv, s, s + n, lid, eid, verify)
            _split(out, lid, eid, _metadata(mv, ms, me, lid, eid), mv[me : s + n], broker)
        except MessageFormatError as ex:
            if bad is None:
                raise
            del out[kept:]  # the messages of a batch that broke off later are not good data either
            bad.append(BadEntry(Position(lid, eid), str(ex), isinstance(ex, MessageChecksumError)))
        eid += 1
    return out


def check_entries(batch: EntryBatch, deep: bool = False) -> EntryCheck:
    """Every entry's CRC32C (and framing) checked, bad entries listed rather than raised: what a scrub of a
    Pulsar-written object needs. An entry without a checksum (old clients) counts as ``unchecked`` when its
    metadata parses and as bad otherwise (opaque bytes are not Pulsar messages). ``deep`` also inflates
    and splits every batch, as :func:`decode_entries` does."""
    mv = memoryview(batch.buf)
    lid, eid = batch.ledger_id, batch.first_entry
    res = EntryCheck(entries=len(batch))
    sink: list[Message] = []
    for s, n in zip(batch.starts, batch.lengths, strict=True):
        try:
            broker, checked, ms, me = _frame(mv, s, s + n, lid, eid)
            if deep or not checked:
                meta = _metadata(mv, ms, me, lid, eid)
                if deep:
                    _split(sink, lid, eid, meta, mv[me : s + n], broker)
                    sink.clear()
            if checked:
                res.checked += 1
            else:
                res.unchecked += 1
        except MessageFormatError as ex:
            res.bad.append(BadEntry(Position(lid, eid), str(ex), isinstance(ex, MessageChecksumError)))
        eid += 1
    return res


@dataclass
class MessageColumns:
    """The messages of entries as columns (what a scan turns into Arrow arrays without an object per
    message): field ``x[i]`` belongs to message ``i``; a message's properties are
    ``prop_keys[prop_offsets[i]:prop_offsets[i + 1]]`` (and ``prop_values``; a key given twice once, with
    its last value, as Pulsar's ``MessageImpl.getProperties``). Fields read as :class:`Message`'s
    properties read them."""

    entry_ids: list[int] = field(default_factory=list)
    batch_index: list[int] = field(default_factory=list)
    publish_time: list[int] = field(default_factory=list)
    event_time: list[int | None] = field(default_factory=list)
    key: list[str | None] = field(default_factory=list)
    ordering_key: list[bytes | None] = field(default_factory=list)
    producer_name: list[str] = field(default_factory=list)
    sequence_id: list[int] = field(default_factory=list)
    payload: list[memoryview | bytes] = field(default_factory=list)  # the C reader copies small ones
    prop_offsets: list[int] = field(default_factory=lambda: [0])
    prop_keys: list[str] = field(default_factory=list)
    prop_values: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.entry_ids)

    def truncate(self, n: int) -> None:
        """Back to the first ``n`` messages (an entry that broke off part-way is not good data)."""
        for name in ("entry_ids", "batch_index", "publish_time", "event_time", "key", "ordering_key",
                     "producer_name", "sequence_id", "payload"):
            del getattr(self, name)[n:]
        del self.prop_offsets[n + 1 :]
        del self.prop_keys[self.prop_offsets[n] :]
        del self.prop_values[self.prop_offsets[n] :]


def decode_columns(batch: EntryBatch, bad: list[BadEntry] | None = None, verify: bool = True) -> MessageColumns:
    """What :func:`decode_entries` returns, as :class:`MessageColumns` (the same messages, errors and
    ``bad`` handling; one loop, no tuple per message), except that a string field that is not UTF-8 makes
    its entry damaged (no string column holds it). The reference for the C reader of whole entries
    (``native_columns``), which hands it every entry it does not take."""
    mv = memoryview(batch.buf)
    lid, eid = batch.ledger_id, batch.first_entry
    c = MessageColumns()
    eids, bidx, pubs, evts = c.entry_ids, c.batch_index, c.publish_time, c.event_time
    keys, okeys, prods, seqs, pays = c.key, c.ordering_key, c.producer_name, c.sequence_id, c.payload
    poff, pkeys, pvals = c.prop_offsets, c.prop_keys, c.prop_values

    def own_fields(own: MessageMetadata | SingleMessageMetadata, k: int = -1) -> None:
        has = own.HasField
        key = own.partition_key if has("partition_key") and not own.null_partition_key else None
        if type(key) is bytes:  # upb hands a proto2 string that is not UTF-8 back as bytes
            raise _not_text(lid, eid, k, "partition_key")
        keys.append(key)
        okeys.append(own.ordering_key if has("ordering_key") else None)
        props = own.properties
        if props:
            start = len(pkeys)
            for kv in props:
                if type(kv.key) is bytes or type(kv.value) is bytes:
                    raise _not_text(lid, eid, k, "a property")
                pkeys.append(kv.key)
                pvals.append(kv.value)
            if len(props) > 1 and len(set(pkeys[start:])) < len(props):  # a repeated key: the last wins
                last = dict(zip(pkeys[start:], pvals[start:], strict=True))
                del pkeys[start:], pvals[start:]
                pkeys.extend(last)
                pvals.extend(last.values())
        poff.append(len(pkeys))

    for s, n in zip(batch.starts, batch.lengths, strict=True):
        kept = len(eids)
        try:
            _, _, ms, me = _frame(mv, s, s + n, lid, eid, verify)
            meta = _metadata(mv, ms, me, lid, eid)
            payload, batched = _stored(lid, eid, meta, mv[me : s + n])
            pub, prod, seq, evt = meta.publish_time, meta.producer_name, meta.sequence_id, meta.event_time
            if type(prod) is bytes:
                raise _not_text(lid, eid, -1, "producer_name")
            if not batched:
                eids.append(eid)
                bidx.append(-1)
                pubs.append(pub)
                prods.append(prod)
                seqs.append(seq)
                evts.append(evt or None)
                pays.append(payload)
                own_fields(meta)
            else:
                for k, (single, body) in enumerate(_singles(lid, eid, meta.num_messages_in_batch, payload)):
                    has = single.HasField
                    eids.append(eid)
                    bidx.append(k)
                    pubs.append(pub)
                    prods.append(prod)
                    seqs.append(single.sequence_id if has("sequence_id") else seq + k)
                    evts.append((single.event_time if has("event_time") else evt) or None)
                    pays.append(body)
                    own_fields(single, k)
        except MessageFormatError as ex:
            if bad is None:
                raise
            c.truncate(kept)
            bad.append(BadEntry(Position(lid, eid), str(ex), isinstance(ex, MessageChecksumError)))
        eid += 1
    return c


def is_message(data: Buffer) -> bool:
    """Whether ``data`` decodes as a Pulsar entry (checksum included)."""
    try:
        decode_entry(data)
    except MessageFormatError:
        return False
    return True


# --- writing -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OutMessage:
    """A message as a producer sends it (what the encoders below frame)."""

    payload: bytes = b""
    key: str | None = None
    key_is_b64: bool = False
    ordering_key: bytes | None = None
    properties: Mapping[str, str] | Sequence[tuple[str, str]] = ()
    event_time: int | None = None
    sequence_id: int | None = None  # default: the entry's sequence id + the message's index
    null_value: bool = False
    null_key: bool = False
    compacted_out: bool = False  # only in a batch (written by topic compaction)


def _items(props: Mapping[str, str] | Sequence[tuple[str, str]]) -> Iterable[tuple[str, str]]:
    return props.items() if isinstance(props, Mapping) else props


def frame_entry(metadata: MessageMetadata | bytes, payload: Buffer, checksum: bool = True,
                broker: BrokerEntryMetadata | None = None) -> bytes:
    """One entry: ``Commands.serializeMetadataAndPayload`` (with the CRC32C magic unless ``checksum`` is
    False: the old clients' form), preceded by ``addBrokerEntryMetadata``'s header when ``broker``."""
    meta = metadata if isinstance(metadata, bytes) else metadata.SerializeToString()
    head = _I32.pack(len(meta)) + meta
    parts = []
    if broker is not None:
        b = broker.SerializeToString()
        parts += [_MAGIC_BROKER_BYTES, _I32.pack(len(b)), b]
    if checksum:
        parts += [_MAGIC_CHECKSUM_BYTES, _crc(payload, _crc(head)).to_bytes(4, "big")]
    parts += [head, payload]
    return b"".join(parts)


def single_metadata(msg: OutMessage, sequence_id: int | None = None) -> SingleMessageMetadata:
    """A batched message's metadata as ``Commands.serializeSingleMessageInBatchWithPayload`` builds it
    from the message's own (the key's base64 flag is written whenever there is a key)."""
    smm = SingleMessageMetadata()
    for k, v in _items(msg.properties):
        smm.properties.add(key=k, value=v)
    if msg.key is not None:
        smm.partition_key = msg.key
        smm.partition_key_b64_encoded = msg.key_is_b64
    smm.payload_size = 0 if msg.null_value else len(msg.payload)
    if msg.compacted_out:
        smm.compacted_out = True
    if msg.event_time is not None:
        smm.event_time = msg.event_time
    if msg.ordering_key is not None:
        smm.ordering_key = msg.ordering_key
    seq = msg.sequence_id if msg.sequence_id is not None else sequence_id
    if seq is not None:
        smm.sequence_id = seq
    if msg.null_value:
        smm.null_value = True
    if msg.null_key:
        smm.null_partition_key = True
    return smm


def batch_payload(items: Iterable[tuple[SingleMessageMetadata, Buffer]]) -> bytes:
    """``[int32 size][SingleMessageMetadata][payload]`` per message, before compression."""
    parts = []
    for smm, payload in items:
        s = smm.SerializeToString()
        parts += [_I32.pack(len(s)), s, payload]
    return b"".join(parts)


def _base_metadata(producer: str, sequence_id: int, publish_time: int, first: OutMessage) -> MessageMetadata:
    meta = MessageMetadata(producer_name=producer, sequence_id=sequence_id, publish_time=publish_time)
    if first.key is not None:
        meta.partition_key = first.key
        meta.partition_key_b64_encoded = first.key_is_b64
    if first.ordering_key is not None:
        meta.ordering_key = first.ordering_key
    return meta


def encode_message(msg: OutMessage, *, producer: str, sequence_id: int, publish_time: int,
                   codec: int = compression.NONE, checksum: bool = True,
                   broker: BrokerEntryMetadata | None = None) -> bytes:
    """A message sent without batching, as Pulsar's producer writes it: its own metadata, the payload
    compressed as a whole with ``codec`` (``uncompressed_size`` always set, ``compression`` unless NONE)."""
    meta = _base_metadata(producer, sequence_id, publish_time, msg)
    for k, v in _items(msg.properties):
        meta.properties.add(key=k, value=v)
    payload = b"" if msg.null_value else msg.payload
    if codec != compression.NONE:
        meta.compression = codec
    meta.uncompressed_size = len(payload)
    if msg.event_time is not None:
        meta.event_time = msg.event_time
    if msg.null_value:
        meta.null_value = True
    if msg.null_key:
        meta.null_partition_key = True
    return frame_entry(meta, compression.compress(codec, payload), checksum, broker)


def encode_batch(msgs: Sequence[OutMessage], *, producer: str, sequence_id: int, publish_time: int,
                 codec: int = compression.NONE, checksum: bool = True,
                 broker: BrokerEntryMetadata | None = None) -> bytes:
    """A batch, as Pulsar's batch container writes it: message ``i``'s sequence id is its own or
    ``sequence_id + i``; the entry's metadata takes the lowest and highest, the first message's keys
    (``initBatchMessageMetadata``), the batch's size before compression and its count."""
    if not msgs:
        raise ValueError("a batch holds at least one message")
    smms = [single_metadata(m, sequence_id + i) for i, m in enumerate(msgs)]
    raw = batch_payload(zip(smms, (b"" if m.null_value else m.payload for m in msgs), strict=True))
    meta = _base_metadata(producer, smms[0].sequence_id, publish_time, msgs[0])
    if codec != compression.NONE:
        meta.compression = codec
    meta.uncompressed_size = len(raw)
    meta.num_messages_in_batch = len(msgs)
    meta.highest_sequence_id = smms[-1].sequence_id
    return frame_entry(meta, compression.compress(codec, raw), checksum, broker)
