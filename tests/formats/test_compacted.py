"""Topic compaction's per-message rules (tieredcore/formats/compacted.py, docs/topic-compaction.md).

Fixtures are entries as Pulsar's producer writes them (tieredcore/formats/messages.py's encoders follow
pulsar-client ``ProducerImpl`` / ``BatchMessageContainerImpl`` and pulsar-common ``Commands``); the
expectations come from Pulsar's compactor:
- pulsar-broker ``org/apache/pulsar/compaction/PublishingOrderCompactor.java`` (phase one: compactMessage,
  compactBatchMessage) and ``AbstractTwoPhaseCompactor.java`` (extractKeyAndSize, phaseTwoLoop);
- pulsar-broker ``org/apache/pulsar/client/impl/RawBatchConverter.java`` (isReadableBatch,
  extractMessageCompactionData, rebatchMessage);
- pulsar-common ``Commands.serializeSingleMessageInBatchWithPayload`` (sets ``payload_size`` to the
  payload written), ``Markers.isServerOnlyMarker``;
- pulsar-broker ``org/apache/pulsar/client/impl/RawMessageImpl.java`` (serialize: the compacted ledger's
  entries).
Expected bytes are framed here independently (struct + google-crc32c), not with the module's helpers.
"""

from __future__ import annotations

import struct

import google_crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tieredcore.formats import compression
from tieredcore.formats.compacted import (
    COMPACTED_TOPIC_LEDGER_PROPERTY,
    COMPACTION_SUBSCRIPTION,
    CompactionItem,
    compacted_ledger_entry,
    compaction_items,
    compaction_key,
    is_readable_batch,
    latest_per_key,
    parse_compacted_ledger_entry,
    rebatch,
    rewrite_entry,
)
from tieredcore.formats.messages import (
    BrokerEntryMetadata,
    MessageId,
    MessageMetadata,
    OutMessage,
    SingleMessageMetadata,
    decode_entry,
    encode_batch,
    encode_message,
    parse_entry,
)

L = 7  # the ledger of every fixture
PLACEHOLDER = b"\x18\x00\x20\x01"  # SingleMessageMetadata{payload_size: 0, compacted_out: true}, field order


def single(payload: bytes = b"v", key: str | None = "k", **kw) -> bytes:
    return encode_message(OutMessage(payload=payload, key=key, **kw), producer="p", sequence_id=1,
                          publish_time=1000)


def batch(msgs: list[OutMessage], codec: int = compression.NONE, **kw) -> bytes:
    return encode_batch(msgs, producer="p", sequence_id=10, publish_time=2000, codec=codec, **kw)


def framed(meta: MessageMetadata, payload: bytes, checksum: bool = True) -> bytes:
    """Commands.serializeMetadataAndPayload, written independently."""
    m = meta.SerializeToString()
    head = struct.pack(">i", len(m)) + m
    if not checksum:
        return head + payload
    crc = google_crc32c.value(head + payload)
    return b"\x0e\x01" + struct.pack(">I", crc) + head + payload


def batch_bytes(items: list[tuple[bytes, bytes]]) -> bytes:
    return b"".join(struct.pack(">i", len(m)) + m + p for m, p in items)


# --- the constants Pulsar's Compactor names -------------------------------------------------------------


def test_cursor_and_property_names() -> None:
    assert COMPACTION_SUBSCRIPTION == "__compaction"
    assert COMPACTED_TOPIC_LEDGER_PROPERTY == "CompactedTopicLedger"


# --- the key: partition key, never the ordering key -----------------------------------------------------


def test_key_is_the_partition_key_not_the_ordering_key() -> None:
    both = parse_entry(single(key="pk", ordering_key=b"ok")).metadata
    assert compaction_key(both) == "pk"
    only_ordering = parse_entry(single(key=None, ordering_key=b"ok")).metadata
    assert compaction_key(only_ordering) is None
    [item] = compaction_items(single(key=None, ordering_key=b"ok"), L, 0)
    assert item.key is None
    assert latest_per_key([item]) == {}


def test_key_as_stored_b64_text_and_empty_string() -> None:
    b64 = parse_entry(single(key="AAE=", key_is_b64=True)).metadata
    assert compaction_key(b64) == "AAE="
    # "AAE=" as text and as base64 of b"\x00\x01" are one key: Pulsar compares the stored strings
    items = [*compaction_items(single(b"x", key="AAE="), L, 0),
             *compaction_items(single(b"y", key="AAE=", key_is_b64=True), L, 1)]
    assert latest_per_key(items) == {"AAE=": MessageId(L, 1)}
    assert compaction_key(parse_entry(single(key="")).metadata) == ""  # present, empty: a key


def test_null_key_is_keyless() -> None:
    [item] = compaction_items(single(key=None, null_key=True), L, 0)
    assert item.key is None


def test_key_in_a_batch_is_the_single_messages_own() -> None:
    e = batch([OutMessage(b"1", key="a"), OutMessage(b"2", key="b"), OutMessage(b"3", key=None)])
    assert parse_entry(e).metadata.partition_key == "a"  # the entry's: the first message's
    assert [(i.position, i.key) for i in compaction_items(e, L, 4)] == [
        (MessageId(L, 4, 0), "a"), (MessageId(L, 4, 1), "b"), (MessageId(L, 4, 2), None)]


# --- keyless messages -----------------------------------------------------------------------------------


def test_keyless_entry_not_retained_unless_configured() -> None:
    e = single(key=None)
    [item] = compaction_items(e, L, 0)
    assert item == CompactionItem(MessageId(L, 0), None, 1)
    assert rewrite_entry(e, L, 0, {}) is None
    assert rewrite_entry(e, L, 0, {}, retain_null_key=True) == e


def test_keyless_in_batch_compacted_out_unless_configured() -> None:
    e = batch([OutMessage(b"1", key=None), OutMessage(b"2", key="a")])
    latest = {"a": MessageId(L, 0, 1)}
    out = decode_entry(rewrite_entry(e, L, 0, latest), L, 0)
    assert [m.compacted_out for m in out] == [True, False]
    kept = decode_entry(rewrite_entry(e, L, 0, latest, retain_null_key=True), L, 0)
    assert [m.compacted_out for m in kept] == [False, False]
    assert bytes(kept[0].payload) == b"1"
    # a batch of keyless messages only: nothing retained, the entry dropped
    assert rewrite_entry(batch([OutMessage(b"1", key=None)]), L, 1, {}) is None


# --- tombstones: size 0, whatever null_value says -------------------------------------------------------


def test_null_value_entry_removes_its_key() -> None:
    items = [*compaction_items(single(b"v1", key="a"), L, 0),
             *compaction_items(single(key="a", null_value=True), L, 1)]
    assert items[1].size == 0 and items[1].tombstone
    assert latest_per_key(items) == {}


def test_empty_payload_entry_is_a_tombstone_too() -> None:
    items = [*compaction_items(single(b"v1", key="a"), L, 0), *compaction_items(single(b"", key="a"), L, 1)]
    assert latest_per_key(items) == {}


def test_null_value_flag_alone_is_not_read() -> None:
    # extractKeyAndSize tests uncompressed_size only: a flag with a non-empty value keeps the key
    meta = MessageMetadata(producer_name="p", sequence_id=1, publish_time=1, partition_key="a",
                           uncompressed_size=3, null_value=True)
    [item] = compaction_items(framed(meta, b"abc"), L, 0)
    assert item.size == 3 and not item.tombstone


def test_entry_without_uncompressed_size_sized_by_its_stored_payload() -> None:
    # no uncompressed_size (not a Java producer): the payload after the metadata (Pulsar #25817)
    meta = MessageMetadata(producer_name="p", sequence_id=1, publish_time=1, partition_key="a")
    [empty] = compaction_items(framed(meta, b"", checksum=False), L, 0)
    assert empty.size == 0 and empty.tombstone
    [item] = compaction_items(framed(meta, b"abcd"), L, 1)
    assert item.size == 4


def test_batched_tombstones_null_value_and_empty() -> None:
    e = batch([OutMessage(b"v", key="a"), OutMessage(b"w", key="b"),
               OutMessage(key="a", null_value=True), OutMessage(b"", key="b")])
    items = compaction_items(e, L, 0)
    assert [i.size for i in items] == [1, 1, 0, 0]
    assert latest_per_key(items) == {}
    assert rewrite_entry(e, L, 0, {}) is None


# --- the latest position wins ---------------------------------------------------------------------------


def test_latest_wins_across_entries_and_batches() -> None:
    entries = [single(b"a1", key="a"), batch([OutMessage(b"a2", key="a"), OutMessage(b"b1", key="b")]),
               single(b"a3", key="a"), batch([OutMessage(b"b2", key="b"), OutMessage(b"b3", key="b")])]
    items = [i for eid, e in enumerate(entries) for i in compaction_items(e, L, eid)]
    latest = latest_per_key(items)
    assert latest == {"a": MessageId(L, 2), "b": MessageId(L, 3, 1)}
    assert rewrite_entry(entries[0], L, 0, latest) is None
    assert rewrite_entry(entries[1], L, 1, latest) is None  # both of its messages superseded
    assert rewrite_entry(entries[2], L, 2, latest) == entries[2]  # whole entry, byte for byte
    out = decode_entry(rewrite_entry(entries[3], L, 3, latest), L, 3)
    assert [(m.compacted_out, bytes(m.payload)) for m in out] == [(True, b""), (False, b"b3")]


def test_value_after_tombstone_comes_back() -> None:
    items = [CompactionItem(MessageId(L, 0), "a", 2), CompactionItem(MessageId(L, 1), "a", 0),
             CompactionItem(MessageId(L, 2), "a", 5)]
    assert latest_per_key(items) == {"a": MessageId(L, 2)}
    assert latest_per_key(items[:2]) == {}


# --- a batch rewritten: exact bytes ---------------------------------------------------------------------


def test_rebatch_exact_bytes_uncompressed() -> None:
    msgs = [OutMessage(b"one", key="a", properties={"p": "1"}, event_time=5),
            OutMessage(b"two", key="b", ordering_key=b"o"),
            OutMessage(b"three", key="a", sequence_id=99)]
    e = batch(msgs)
    latest = {"a": MessageId(L, 3, 2), "b": MessageId(L, 9)}  # b's latest elsewhere
    got = rewrite_entry(e, L, 3, latest)

    # expected: message 2 as it was (its SingleMessageMetadata re-serialized), 0 and 1 placeholders
    orig = parse_entry(e).metadata
    smm2 = SingleMessageMetadata(partition_key="a", partition_key_b64_encoded=False, payload_size=5,
                                 sequence_id=99)
    raw = batch_bytes([(PLACEHOLDER, b""), (PLACEHOLDER, b""), (smm2.SerializeToString(), b"three")])
    meta = MessageMetadata()
    meta.CopyFrom(orig)
    meta.uncompressed_size = len(raw)
    assert got == framed(meta, raw)

    # and read back field by field
    out = decode_entry(got, L, 3)
    assert [m.compacted_out for m in out] == [True, True, False]
    assert out[0].single == SingleMessageMetadata(payload_size=0, compacted_out=True)
    assert out[0].key is None and out[0].properties == {} and bytes(out[0].payload) == b""
    assert out[2].key == "a" and out[2].sequence_id == 99 and bytes(out[2].payload) == b"three"
    m = out[0].metadata
    assert (m.num_messages_in_batch, m.partition_key, m.sequence_id, m.highest_sequence_id) == (3, "a", 10, 99)
    assert m.publish_time == 2000 and m.uncompressed_size == len(raw)


@pytest.mark.parametrize("codec", [compression.LZ4, compression.ZLIB, compression.ZSTD, compression.SNAPPY])
def test_rebatch_keeps_the_codec(codec: int) -> None:
    msgs = [OutMessage(b"x" * 50, key="a", properties={"k": "v"}), OutMessage(b"y" * 60, key="b")]
    e = batch(msgs, codec=codec)
    got = rewrite_entry(e, L, 0, {"a": MessageId(L, 0, 0)})
    frame = parse_entry(got)  # CRC32C checked
    assert frame.metadata.compression == codec
    raw = compression.decompress(codec, frame.payload, frame.metadata.uncompressed_size)
    smm0 = parse_entry(e)
    orig_raw = compression.decompress(codec, smm0.payload, smm0.metadata.uncompressed_size)
    first = orig_raw[: 4 + struct.unpack(">i", orig_raw[:4])[0] + 50]  # message 0 as written
    assert raw == first + batch_bytes([(PLACEHOLDER, b"")])
    out = decode_entry(got, L, 0)
    assert out[0].properties == {"k": "v"} and bytes(out[0].payload) == b"x" * 50
    assert out[1].compacted_out


def test_rebatch_adds_a_checksum_and_keeps_broker_entry_metadata() -> None:
    broker = BrokerEntryMetadata(broker_timestamp=123, index=45)
    e = batch([OutMessage(b"1", key="a"), OutMessage(b"2", key="b")], checksum=False, broker=broker)
    got = rewrite_entry(e, L, 0, {"b": MessageId(L, 0, 1)})
    b = broker.SerializeToString()
    prefix = b"\x0e\x02" + struct.pack(">i", len(b)) + b
    assert e.startswith(prefix) and got.startswith(prefix)
    assert got[len(prefix) : len(prefix) + 2] == b"\x0e\x01"  # Commands.ChecksumType.Crc32c
    out = decode_entry(got, L, 0)
    assert out[0].broker_index == 45
    assert [m.compacted_out for m in out] == [True, False]


def test_batch_all_compacted_out_is_dropped() -> None:
    e = batch([OutMessage(b"1", key="a"), OutMessage(b"2", key="b")])
    assert rewrite_entry(e, L, 0, {"a": MessageId(L, 5), "b": MessageId(L, 0, 9)}) is None
    assert rebatch(e, L, 0, lambda key, pos: False) is None


def test_retained_needs_a_payload() -> None:
    e = batch([OutMessage(b"", key="a"), OutMessage(b"z", key="b")])
    got = rebatch(e, L, 0, lambda key, pos: True)  # even when the filter says yes
    assert [m.compacted_out for m in decode_entry(got, L, 0)] == [True, False]


def test_already_compacted_out_stays_and_is_not_counted() -> None:
    # a batch read back from an earlier compacted ledger (incremental compaction reads it first)
    e = batch([OutMessage(b"1", key="a"), OutMessage(b"2", key="b")])
    once = rewrite_entry(e, L, 0, {"b": MessageId(L, 0, 1)})
    items = compaction_items(once, L, 0)
    assert items == [CompactionItem(MessageId(L, 0, 1), "b", 1)]
    assert rebatch(once, L, 0, lambda key, pos: True, retain_null_key=True) == once


def test_rebatch_of_a_batch_whose_codec_fails_is_the_entry_unchanged() -> None:
    meta = MessageMetadata(producer_name="p", sequence_id=1, publish_time=1, num_messages_in_batch=2,
                           compression=compression.ZLIB, uncompressed_size=40)
    e = framed(meta, b"not zlib at all")
    assert compaction_items(e, L, 0) == []
    assert rewrite_entry(e, L, 0, {}) == e


# --- encrypted entries and markers ----------------------------------------------------------------------


def encrypted_batch(key: str | None, uncompressed: int) -> bytes:
    meta = MessageMetadata(producer_name="p", sequence_id=1, publish_time=1, num_messages_in_batch=3,
                           uncompressed_size=uncompressed, compression=compression.LZ4,
                           encryption_algo="RSA", encryption_param=b"iv")
    meta.encryption_keys.add(key="k1", value=b"secret")
    if key is not None:
        meta.partition_key = key
    return framed(meta, b"\x93opaque ciphertext")


def test_encrypted_batch_is_compacted_whole_by_the_entrys_key() -> None:
    e = encrypted_batch("a", 40)
    assert not is_readable_batch(parse_entry(e).metadata)
    assert compaction_items(e, L, 2) == [CompactionItem(MessageId(L, 2), "a", 40)]
    assert rewrite_entry(e, L, 2, {"a": MessageId(L, 2)}) == e
    assert rewrite_entry(e, L, 2, {"a": MessageId(L, 3)}) is None
    # without the entry's key: keyless, dropped by default
    e2 = encrypted_batch(None, 40)
    assert compaction_items(e2, L, 0)[0].key is None
    assert rewrite_entry(e2, L, 0, {}) is None
    # an encrypted entry whose uncompressed size is 0 is a tombstone
    assert compaction_items(encrypted_batch("a", 0), L, 0)[0].tombstone


def test_encrypted_single_message() -> None:
    meta = MessageMetadata(producer_name="p", sequence_id=1, publish_time=1, partition_key="a",
                           uncompressed_size=9, encryption_algo="RSA")
    meta.encryption_keys.add(key="k1", value=b"secret")
    e = framed(meta, b"cipher")
    assert compaction_items(e, L, 0) == [CompactionItem(MessageId(L, 0), "a", 9)]


def test_markers_are_neither_counted_nor_written() -> None:
    meta = MessageMetadata(producer_name="pulsar.marker", sequence_id=0, publish_time=1, marker_type=20,
                           partition_key="a", uncompressed_size=4)
    e = framed(meta, b"\x00\x01\x02\x03")
    assert compaction_items(e, L, 0) == []
    assert rewrite_entry(e, L, 0, {"a": MessageId(L, 0)}) is None


# --- the compacted ledger's entries ---------------------------------------------------------------------


def test_compacted_ledger_entry_bytes() -> None:
    e = single(b"v", key="a")
    got = compacted_ledger_entry(e, 5, 300)
    mid = b"\x08\x05\x10\xac\x02\x18" + b"\xff" * 9 + b"\x01"  # ledgerId 5, entryId 300, partition -1
    assert got == struct.pack(">i", len(mid)) + mid + struct.pack(">i", len(e)) + e
    assert parse_compacted_ledger_entry(got)[:3] == (5, 300, -1)
    assert bytes(parse_compacted_ledger_entry(got)[3]) == e
    lid, eid, part, body = parse_compacted_ledger_entry(compacted_ledger_entry(e, 2**40, 0, partition=3))
    assert (lid, eid, part, bytes(body)) == (2**40, 0, 3, e)


# --- property: the reducer is a dict of the latest value, phase two retains exactly it ------------------

KEYS = st.one_of(st.none(), st.sampled_from(["a", "b", "c", "d"]))
VALUES = st.one_of(st.just(None), st.just(b""), st.binary(min_size=1, max_size=4))  # None: null_value
MSG = st.tuples(KEYS, VALUES)
ENTRY = st.one_of(st.tuples(st.just("single"), st.lists(MSG, min_size=1, max_size=1)),
                  st.tuples(st.just("batch"), st.lists(MSG, min_size=1, max_size=5)))


def out(key: str | None, value: bytes | None) -> OutMessage:
    return OutMessage(payload=value or b"", key=key, null_value=value is None)


@settings(max_examples=150, deadline=None)
@given(st.lists(ENTRY, max_size=12), st.sampled_from([compression.NONE, compression.LZ4]), st.booleans())
def test_reducer_and_phase_two_against_a_dict(entries, codec: int, retain_null_key: bool) -> None:
    encoded, expected = [], {}
    kept_keyless = set()
    for eid, (kind, msgs) in enumerate(entries):
        if kind == "single":
            encoded.append(encode_message(out(*msgs[0]), producer="p", sequence_id=eid, publish_time=1,
                                          codec=codec))
        else:
            encoded.append(encode_batch([out(*m) for m in msgs], producer="p", sequence_id=eid,
                                        publish_time=1, codec=codec))
        for i, (key, value) in enumerate(msgs):
            pos = MessageId(L, eid, -1 if kind == "single" else i)
            if key is None:
                if retain_null_key:  # kept as written, whatever its value (phaseTwoLoop, rebatchMessage)
                    kept_keyless.add(pos)
            elif value:
                expected[key] = (pos, value)
            else:
                expected.pop(key, None)
    items = [i for eid, e in enumerate(encoded) for i in compaction_items(e, L, eid)]
    latest = latest_per_key(items)
    assert latest == {k: pos for k, (pos, _) in expected.items()}
    # any order: per key the greatest position, unless a tombstone
    by_key: dict[str, CompactionItem] = {}
    for it in sorted(items, key=lambda i: (i.position.entry_id, i.position.batch_index), reverse=True):
        if it.key is not None:
            by_key.setdefault(it.key, it)
    assert {k: it.position for k, it in by_key.items() if not it.tombstone} == latest

    # phase two: the messages left readable are exactly the latest values (and keyless ones if retained)
    seen = {}
    for eid, e in enumerate(encoded):
        got = rewrite_entry(e, L, eid, latest, retain_null_key)
        if got is None:
            continue
        for m in decode_entry(got, L, eid):
            if not m.compacted_out:
                seen[m.id] = (m.key, bytes(m.payload))
    want = {pos: (k, v) for k, (pos, v) in expected.items()}
    assert {p: kv for p, kv in seen.items() if kv[0] is not None} == want
    assert {p for p, kv in seen.items() if kv[0] is None} == kept_keyless
