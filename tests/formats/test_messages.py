"""Pulsar messages inside entries (tieredcore/formats/messages.py), against Pulsar's own bytes.

Sources:
- Golden vectors: apache/pulsar-client-go ``pulsar/consumer_partition_test.go`` (``rawCompatSingleMessage``,
  ``rawBatchMessage1``, ``rawBatchMessage10``): entries as a Pulsar standalone broker delivered them,
  captured byte for byte (a batch of 10 is spelled out there in full; it repeats one pattern, built
  here the same way and proven by its own CRC32C).
- pulsar-common ``org/apache/pulsar/common/protocol/Commands.java``: ``serializeMetadataAndPayload``
  (magic 0x0e01, CRC32C over metadata size + metadata + payload), ``addBrokerEntryMetadata`` (magic
  0x0e02, int32 size, BrokerEntryMetadata, before everything), ``skipBrokerEntryMetadataIfExist``,
  ``hasChecksum`` / ``readChecksum`` (a missing magic means no checksum: old clients),
  ``serializeSingleMessageInBatchWithPayload`` (``[int32 size][SingleMessageMetadata][payload]``; the
  key's base64 flag written whenever a key is), ``initBatchMessageMetadata``.
- pulsar-client ``ConsumerImpl.messageReceived``: an entry with encryption keys a consumer cannot decrypt
  is delivered whole (``isMessageUndecryptable``), neither inflated nor split; a single message is one
  without ``num_messages_in_batch``.
The framing below is written independently of the module (struct + google-crc32c, not the crc32c
package the module uses).
"""

from __future__ import annotations

import contextlib
import struct
import zlib
from pathlib import Path

import google_crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tieredcore.errors import MessageChecksumError, MessageFormatError
from tieredcore.formats import compression
from tieredcore.formats import messages as m
from tieredcore.hot.local import LocalLedgerStore
from tieredcore.model import Position

# --- apache/pulsar-client-go pulsar/consumer_partition_test.go -------------------------------------------

# "Raw single message in old format": properties a=1, b=2, payload "hello"
RAW_COMPAT_SINGLE_MESSAGE = bytes.fromhex(
    "0e010836b466000000310a0f7374616e64616c6f6e652d37342d301000"
    "18acefe8a0e22d22060a01611201312206 0a0162120132480560058201 0068656c6c6f".replace(" ", ""))
# "Message with batch of 1": the single message metadata has properties a=1, b=2; payload "hello"
RAW_BATCH_MESSAGE_1 = bytes.fromhex(
    "0e011f800968000000 1f0a0f7374616e64616c6f6e652d37342d31100018db80f4a0e22d5801820100"
    "000000160a060a01611201310a060a0162120132180528054000 68656c6c6f".replace(" ", ""))
# rawBatchMessage10: the same single message ten times, sequence ids 0..9
_BATCH10_HEAD = bytes.fromhex("0e017b288c08000000 1f0a0f7374616e64616c6f6e652d37342d32100018d0c2faa0e22d580a820100"
                              .replace(" ", ""))
RAW_BATCH_MESSAGE_10 = _BATCH10_HEAD + b"".join(
    bytes.fromhex("000000160a060a01611201310a060a01621201321805280540") + bytes([i]) + b"hello" for i in range(10))


def crc32c(data: bytes) -> int:
    return google_crc32c.value(data)


def pulsar_entry(meta: m.MessageMetadata, payload: bytes, broker: m.BrokerEntryMetadata | None = None,
                 checksum: bool = True) -> bytes:
    """Commands.serializeMetadataAndPayload (+ addBrokerEntryMetadata), written out by hand."""
    md = meta.SerializeToString()
    body = struct.pack(">i", len(md)) + md + payload
    out = b"\x0e\x01" + struct.pack(">I", crc32c(body)) + body if checksum else body
    if broker is not None:
        b = broker.SerializeToString()
        out = b"\x0e\x02" + struct.pack(">i", len(b)) + b + out
    return out


def pulsar_batch(items: list[tuple[m.SingleMessageMetadata, bytes]]) -> bytes:
    """serializeSingleMessageInBatchWithPayload, message after message."""
    return b"".join(struct.pack(">i", len(s := smm.SerializeToString())) + s + p for smm, p in items)


def entry_batch(tmp_path: Path, entries: list[bytes]):
    """The entries as a real read handle returns them: written to a local ledger, read back as one batch."""
    hot = LocalLedgerStore(tmp_path / "hot")
    w = hot.create_ledger()
    w.append_many(entries)
    w.close()
    h = hot.open_ledger(w.ledger_id)
    try:
        return h.read_batch(0, len(entries) - 1)
    finally:
        h.close()


# --- golden vectors --------------------------------------------------------------------------------------


def test_go_client_single_message_in_old_format() -> None:
    [msg] = m.decode_entry(RAW_COMPAT_SINGLE_MESSAGE, 7, 3)
    assert str(msg.id) == "7:3" and msg.batch_index == -1
    assert bytes(msg.payload) == b"hello"
    assert msg.properties == {"a": "1", "b": "2"}
    assert msg.producer_name == "standalone-74-0" and msg.sequence_id == 0
    assert msg.publish_time == 1572563728300 and msg.event_time == 5
    assert msg.key is None and msg.batch_size == 1
    # written again from its metadata, byte for byte (the CRC32C included)
    assert m.frame_entry(msg.metadata, b"hello") == RAW_COMPAT_SINGLE_MESSAGE


def test_go_client_batch_of_one() -> None:
    [msg] = m.decode_entry(RAW_BATCH_MESSAGE_1, 7, 4)
    assert str(msg.id) == "7:4:0"
    assert bytes(msg.payload) == b"hello" and msg.properties == {"a": "1", "b": "2"}
    assert msg.producer_name == "standalone-74-1" and msg.publish_time == 1572563910747
    assert msg.event_time == 5 and msg.sequence_id == 0 and msg.batch_size == 1
    assert msg.metadata.HasField("num_messages_in_batch")
    rebuilt = m.frame_entry(msg.metadata, m.batch_payload([(msg.single, b"hello")]))
    assert rebuilt == RAW_BATCH_MESSAGE_1


def test_go_client_batch_of_ten() -> None:
    msgs = m.decode_entry(RAW_BATCH_MESSAGE_10, 7, 5)
    assert [str(x.id) for x in msgs] == [f"7:5:{i}" for i in range(10)]
    assert [x.sequence_id for x in msgs] == list(range(10))
    assert all(bytes(x.payload) == b"hello" and x.properties == {"a": "1", "b": "2"} for x in msgs)
    assert struct.unpack(">I", RAW_BATCH_MESSAGE_10[2:6])[0] == crc32c(RAW_BATCH_MESSAGE_10[6:])


def test_golden_vectors_in_one_entry_batch(tmp_path: Path) -> None:
    batch = entry_batch(tmp_path, [RAW_COMPAT_SINGLE_MESSAGE, RAW_BATCH_MESSAGE_1, RAW_BATCH_MESSAGE_10])
    msgs = m.decode_entries(batch)
    assert [str(x.id) for x in msgs] == [f"{batch.ledger_id}:0", f"{batch.ledger_id}:1:0"] + [
        f"{batch.ledger_id}:2:{i}" for i in range(10)]
    # no copy: every payload views the batch's own buffer
    assert all(x.payload.obj is batch.buf for x in msgs)
    res = m.check_entries(batch, deep=True)
    assert (res.entries, res.checked, res.unchecked, res.bad) == (3, 3, 0, [])


# --- framing as Commands.java writes it --------------------------------------------------------------------


def meta(**kw) -> m.MessageMetadata:
    return m.MessageMetadata(producer_name="p-1", sequence_id=kw.pop("sequence_id", 42),
                             publish_time=kw.pop("publish_time", 1_700_000_000_000), **kw)


def test_checksum_covers_size_metadata_and_payload() -> None:
    md = meta(partition_key="k", uncompressed_size=3)
    entry = pulsar_entry(md, b"abc")
    assert m.frame_entry(md, b"abc") == entry
    assert entry[:2] == b"\x0e\x01"
    [msg] = m.decode_entry(entry)
    assert msg.key == "k" and bytes(msg.payload) == b"abc"
    frame = m.parse_entry(entry)
    assert frame.checked and frame.metadata == md and bytes(frame.payload) == b"abc" and frame.broker is None
    assert not m.parse_entry(pulsar_entry(md, b"abc", checksum=False)).checked


def test_entries_without_the_magic_are_old_clients_messages(tmp_path: Path) -> None:
    md = meta(uncompressed_size=3)
    entry = pulsar_entry(md, b"abc", checksum=False)
    assert m.frame_entry(md, b"abc", checksum=False) == entry
    assert bytes(m.decode_entry(entry)[0].payload) == b"abc"
    res = m.check_entries(entry_batch(tmp_path, [entry, pulsar_entry(md, b"abc")]))
    assert (res.checked, res.unchecked, res.bad) == (1, 1, [])


@pytest.mark.parametrize("checksum", [True, False])
def test_broker_entry_metadata_is_read_and_skipped(checksum: bool) -> None:
    broker = m.BrokerEntryMetadata(broker_timestamp=1_700_000_000_123, index=99)
    entry = pulsar_entry(meta(), b"xyz", broker, checksum)
    assert entry[:2] == b"\x0e\x02"
    assert m.frame_entry(meta(), b"xyz", checksum, broker) == entry
    [msg] = m.decode_entry(entry, 1, 2)
    assert (msg.broker_timestamp, msg.broker_index) == (1_700_000_000_123, 99)
    assert bytes(msg.payload) == b"xyz"
    [plain] = m.decode_entry(pulsar_entry(meta(), b"xyz"))
    assert plain.broker is None and plain.broker_timestamp is None


def test_a_wrong_checksum_names_the_entry_and_never_returns_data(tmp_path: Path) -> None:
    good = pulsar_entry(meta(), b"payload")
    bad = good[:-1] + bytes([good[-1] ^ 1])
    with pytest.raises(MessageChecksumError) as e:
        m.decode_entry(bad, 12, 7)
    assert e.value.position == Position(12, 7) and "12:7" in str(e.value)
    assert e.value.stored == crc32c(good[6:]) and e.value.computed == crc32c(bad[6:])
    batch = entry_batch(tmp_path, [good, bad, good])
    with pytest.raises(MessageChecksumError, match=f"entry {batch.ledger_id}:1: CRC32C mismatch"):
        m.decode_entries(batch)
    found: list[m.BadEntry] = []
    msgs = m.decode_entries(batch, found)
    assert [x.entry_id for x in msgs] == [0, 2]
    assert found == [m.BadEntry(Position(batch.ledger_id, 1), found[0].reason, True)]
    res = m.check_entries(batch)
    assert (res.checked, [b.position for b in res.bad], res.bad[0].checksum) == (2, [Position(batch.ledger_id, 1)],
                                                                               True)


# --- batches, every codec as Pulsar's codecs write it -----------------------------------------------------


def pulsar_codec(kind: int, data: bytes) -> bytes:
    if kind == compression.ZLIB:  # CompressionCodecZLib: Deflater(), SYNC_FLUSH, never finished
        d = zlib.compressobj()
        return d.compress(data) + d.flush(zlib.Z_SYNC_FLUSH)
    return compression.compress(kind, data)


@pytest.mark.parametrize("kind", sorted(compression.NAMES))
def test_batches_of_every_codec(kind: int) -> None:
    smms = [m.SingleMessageMetadata(payload_size=len(p), sequence_id=10 + i, partition_key=f"k{i}",
                                    partition_key_b64_encoded=False) for i, p in enumerate([b"a" * 300, b"", b"zz"])]
    raw = pulsar_batch(list(zip(smms, [b"a" * 300, b"", b"zz"], strict=True)))
    md = meta(num_messages_in_batch=3, uncompressed_size=len(raw), highest_sequence_id=12)
    if kind:
        md.compression = kind
    entry = pulsar_entry(md, pulsar_codec(kind, raw))
    msgs = m.decode_entry(entry, 3, 4)
    assert [(str(x.id), bytes(x.payload), x.key, x.sequence_id) for x in msgs] == [
        ("3:4:0", b"a" * 300, "k0", 10), ("3:4:1", b"", "k1", 11), ("3:4:2", b"zz", "k2", 12)]
    # the encoder writes what Pulsar's batch container would (the codec's own output)
    out = [m.OutMessage(b"a" * 300, key="k0"), m.OutMessage(b"", key="k1"), m.OutMessage(b"zz", key="k2")]
    ours = m.encode_batch(out, producer="p-1", sequence_id=10, publish_time=1_700_000_000_000, codec=kind)
    assert ours == m.frame_entry(m.decode_entry(ours)[0].metadata, compression.compress(kind, raw))
    [first] = m.decode_entry(ours)[:1]
    assert first.metadata.highest_sequence_id == 12 and first.metadata.partition_key == "k0"
    assert first.metadata.HasField("compression") == (kind != compression.NONE)


def test_single_message_compressed_as_a_whole() -> None:
    body = b"log line " * 100
    md = meta(compression=compression.ZLIB, uncompressed_size=len(body))
    [msg] = m.decode_entry(pulsar_entry(md, pulsar_codec(compression.ZLIB, body)))
    assert bytes(msg.payload) == body and msg.batch_index == -1 and msg.compression == compression.NONE
    assert m.encode_message(m.OutMessage(body), producer="p-1", sequence_id=42, publish_time=1_700_000_000_000,
                            codec=compression.ZLIB) == pulsar_entry(md, pulsar_codec(compression.ZLIB, body))


def test_none_batches_ignore_the_uncompressed_size() -> None:
    """The go client's batch above has no uncompressed_size; Pulsar's NONE codec returns the payload as is."""
    smm = m.SingleMessageMetadata(payload_size=2)
    [msg] = m.decode_entry(pulsar_entry(meta(num_messages_in_batch=1, uncompressed_size=999),
                                        pulsar_batch([(smm, b"ok")])))
    assert bytes(msg.payload) == b"ok"


def test_every_single_message_field() -> None:
    smm = m.SingleMessageMetadata(payload_size=0, partition_key="a2V5", partition_key_b64_encoded=True,
                                  ordering_key=b"\x01\x02", event_time=123, sequence_id=77, null_value=True,
                                  compacted_out=True)
    smm.properties.add(key="x", value="y")
    keyless = m.SingleMessageMetadata(payload_size=1, null_partition_key=True, partition_key="")
    msgs = m.decode_entry(pulsar_entry(meta(num_messages_in_batch=2, partition_key="entry-key", event_time=9),
                                       pulsar_batch([(smm, b""), (keyless, b"v")])))
    a, b = msgs
    assert (a.key, a.key_is_b64, a.key_bytes, a.ordering_key) == ("a2V5", True, b"key", b"\x01\x02")
    assert (a.event_time, a.sequence_id, a.null_value, a.compacted_out, a.properties) == (123, 77, True, True,
                                                                                         {"x": "y"})
    # the entry's key is the first message's (initBatchMessageMetadata): a batched message has only its own;
    # event time and sequence id fall back to the entry's (RawMessageImpl: sequence id + batch index)
    assert (b.key, b.null_key, b.key_bytes, b.event_time, b.sequence_id) == (None, True, None, 9, 43)
    assert not b.null_value and not b.compacted_out and b.properties == {}
    # the encoder writes the same single message metadata
    out = m.OutMessage(b"", key="a2V5", key_is_b64=True, ordering_key=b"\x01\x02", event_time=123,
                       properties={"x": "y"}, null_value=True, compacted_out=True)
    assert m.single_metadata(out, 77) == smm


def test_single_message_fields_come_from_the_entry() -> None:
    md = meta(partition_key="k", ordering_key=b"o", event_time=5, null_value=True, null_partition_key=False)
    md.properties.add(key="a", value="b")
    [msg] = m.decode_entry(pulsar_entry(md, b""))
    assert (msg.key, msg.ordering_key, msg.event_time, msg.null_value, msg.properties) == ("k", b"o", 5, True,
                                                                                         {"a": "b"})


def test_encrypted_entries_are_one_message_as_stored() -> None:
    """Pulsar encrypts the compressed batch: without the key it can be neither inflated nor split."""
    sealed = b"\x99" * 40  # not a valid LZ4 block, nor a batch
    md = meta(num_messages_in_batch=5, compression=compression.LZ4, uncompressed_size=4000,
              encryption_algo="RSA", encryption_param=b"iv")
    md.encryption_keys.add(key="app-key", value=b"wrapped")
    [msg] = m.decode_entry(pulsar_entry(md, sealed), 2, 9)
    assert str(msg.id) == "2:9" and msg.encrypted and bytes(msg.payload) == sealed
    assert msg.compression == compression.LZ4 and msg.metadata.num_messages_in_batch == 5


def test_chunks_are_one_message_as_stored() -> None:
    md = meta(uuid="p-1-42", chunk_id=1, num_chunks_from_msg=3, total_chunk_msg_size=30,
              compression=compression.ZSTD, uncompressed_size=100)
    [msg] = m.decode_entry(pulsar_entry(md, b"part of a zstd frame"))
    assert msg.chunk == (1, 3) and bytes(msg.payload) == b"part of a zstd frame"
    assert msg.compression == compression.ZSTD


# --- malformed entries -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("entry", "fragment"), [
    (b"", "too short"),
    (b"\x0e\x01\x00", "too short"),
    (b"\x0e\x01\x00\x00\x00\x00\x00", "truncated after the checksum magic"),
    (b"\x00\x00\x00\x09abc", "overruns the entry"),
    (b"\x0e\x02\x00\x00\x00\x50\x08\x01", "broker entry metadata overruns"),
    (struct.pack(">i", 0) + b"payload", "lacks producer_name, sequence_id, publish_time"),
    (struct.pack(">i", 2) + b"\xff\xff", "does not parse"),
])
def test_malformed_entries(entry: bytes, fragment: str) -> None:
    with pytest.raises(MessageFormatError, match=fragment) as e:
        m.decode_entry(entry, 5, 6)
    assert e.value.position == Position(5, 6) and "entry 5:6" in str(e.value)
    assert not m.is_message(entry)


def test_malformed_batches() -> None:
    ok = m.SingleMessageMetadata(payload_size=2)
    cases = [
        (meta(num_messages_in_batch=0), b"", "a batch of 0 messages"),
        (meta(num_messages_in_batch=2), pulsar_batch([(ok, b"ab")]), "ends before message 1 of 2"),
        (meta(num_messages_in_batch=1), pulsar_batch([(m.SingleMessageMetadata(payload_size=9), b"ab")]),
         "9-byte payload overruns"),
        (meta(num_messages_in_batch=1), struct.pack(">i", 50) + b"x", "metadata overruns the batch"),
        (meta(num_messages_in_batch=1), struct.pack(">i", 0), "lacks payload_size"),
        (meta(num_messages_in_batch=1, compression=compression.ZSTD, uncompressed_size=10), b"not zstd",
         "corrupt ZSTD"),
    ]
    for md, payload, fragment in cases:
        with pytest.raises(MessageFormatError, match=fragment):
            m.decode_entry(pulsar_entry(md, payload), 1, 1)


def test_a_batch_that_breaks_off_yields_none_of_its_messages(tmp_path: Path) -> None:
    """Without a checksum (old clients) nothing proves a batch whole before it is split: a batch whose
    third message overruns it is a bad entry, and its first two messages are not returned either."""
    ok = m.SingleMessageMetadata(payload_size=2)
    broken = pulsar_entry(meta(num_messages_in_batch=3), pulsar_batch([(ok, b"ab"), (ok, b"cd")])
                          + struct.pack(">i", 2) + b"\x18\x09", checksum=False)
    good = pulsar_entry(meta(), b"fine")
    batch = entry_batch(tmp_path, [good, broken, good])
    found: list[m.BadEntry] = []
    msgs = m.decode_entries(batch, found)
    assert [(x.entry_id, bytes(x.payload)) for x in msgs] == [(0, b"fine"), (2, b"fine")]
    assert [b.position.entry_id for b in found] == [1] and "message 2 of the batch" in found[0].reason


def test_unknown_compression_codec_is_refused() -> None:
    md = meta(uncompressed_size=3).SerializeToString() + b"\x40\x07"  # compression = 7: no such codec
    body = struct.pack(">i", len(md)) + md + b"abc"
    with pytest.raises(MessageFormatError, match="unknown compression codec"):
        m.decode_entry(b"\x0e\x01" + struct.pack(">I", crc32c(body)) + body)


def test_deep_check_inflates_entries_without_checksum(tmp_path: Path) -> None:
    md = meta(num_messages_in_batch=1, compression=compression.LZ4, uncompressed_size=100)
    broken = pulsar_entry(md, b"\xff" * 10, checksum=False)
    batch = entry_batch(tmp_path, [broken])
    assert m.check_entries(batch).bad == []  # its metadata parses; nothing proves the payload wrong
    [bad] = m.check_entries(batch, deep=True).bad
    assert bad.position == Position(batch.ledger_id, 0) and not bad.checksum and "LZ4" in bad.reason


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_raise_only_message_format_errors(data: bytes) -> None:
    for entry in (data, b"\x0e\x01" + data, b"\x0e\x02" + data):
        with contextlib.suppress(MessageFormatError):
            m.decode_entry(entry)


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=1, max_size=120), st.integers(min_value=0))
def test_any_single_byte_change_is_caught(payload: bytes, where: int) -> None:
    entry = bytearray(m.encode_message(m.OutMessage(payload, key="k"), producer="p", sequence_id=1, publish_time=2))
    i = 2 + where % (len(entry) - 2)  # anything after the magic
    entry[i] ^= 0x5A
    with pytest.raises(MessageFormatError):
        m.decode_entry(bytes(entry))


# --- round trips -------------------------------------------------------------------------------------------

texts = st.text(max_size=8)
out_messages = st.builds(
    m.OutMessage,
    payload=st.binary(max_size=300),
    key=st.none() | texts,
    ordering_key=st.none() | st.binary(max_size=8),
    properties=st.dictionaries(texts, texts, max_size=3),
    event_time=st.none() | st.integers(min_value=1, max_value=2**63 - 1),
    null_value=st.booleans(),
    null_key=st.booleans(),
)


@settings(max_examples=150, deadline=None)
@given(msgs=st.lists(out_messages, min_size=1, max_size=6), batched=st.booleans(),
       codec=st.sampled_from(sorted(compression.NAMES)), checksum=st.booleans(),
       broker=st.none() | st.builds(m.BrokerEntryMetadata, broker_timestamp=st.integers(0, 2**64 - 1),
                                    index=st.integers(0, 2**64 - 1)),
       seq=st.integers(0, 2**40), published=st.integers(0, 2**63 - 1))
def test_round_trip(msgs, batched, codec, checksum, broker, seq, published) -> None:
    kw = dict(producer="prod", sequence_id=seq, publish_time=published, codec=codec, checksum=checksum, broker=broker)
    entry = m.encode_batch(msgs, **kw) if batched else m.encode_message(msgs[0], **kw)
    got = m.decode_entry(entry, 1, 2)
    sent = msgs if batched else msgs[:1]
    assert len(got) == len(sent)
    for i, (g, s) in enumerate(zip(got, sent, strict=True)):
        assert g.id == m.MessageId(1, 2, i if batched else -1)
        assert bytes(g.payload) == (b"" if s.null_value else s.payload)
        assert (g.key, g.ordering_key, g.properties) == (None if s.null_key else s.key, s.ordering_key,
                                                         dict(s.properties))
        assert (g.event_time, g.null_value, g.null_key) == (s.event_time, s.null_value, s.null_key)
        assert (g.publish_time, g.producer_name, g.sequence_id) == (published, "prod", seq + i)
        assert g.broker == broker
    assert m.is_message(entry)
