"""The Pulsar messages inside an offloaded copy, checked in verify.py's single read of it
(tieredcore.offload.message_audit): every entry's CRC32C in objects without chunk checksums, damaged
messages named by position once the whole copy passed every other check, opaque entries never damage.

Pulsar-written pairs come from tests/support/pulsar_objects.py, built the way Pulsar's
BlobStoreManagedLedgerOffloader / BlockAwareSegmentInputStreamImpl / OffloadIndexBlockImpl write them; the
entries inside are framed as Pulsar's Commands.serializeMetadataAndPayload (and its batch container) frame
them (tieredcore.formats.messages, whose vectors are in tests/formats/test_messages.py)."""

from __future__ import annotations

import random
import struct
import uuid as uuidlib
from pathlib import Path

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support import pulsar_objects
from tieredcore.cold.backends.fs import FilesystemBlobStore
from tieredcore.errors import CorruptObjectError
from tieredcore.formats.messages import (
    BrokerEntryMetadata,
    MessageMetadata,
    OutMessage,
    check_entries,
    encode_message,
    frame_entry,
)
from tieredcore.hot.local import LocalLedgerStore
from tieredcore.model import EntryBatch
from tieredcore.offload.cache import OffsetCache
from tieredcore.offload.message_audit import MAX_LISTED, DamagedMessagesError, LedgerMessages
from tieredcore.offload.offloader import LedgerOffloader
from tieredcore.offload.verify import verify_offloaded

LID = 9
ENTRIES = pulsar_objects.message_entries(120)


@pytest.fixture
def store(tmp_path: Path) -> FilesystemBlobStore:
    return FilesystemBlobStore(tmp_path / "cold")


def pulsar_pair(store, entries, *, damage=(), max_block: int = 8 * 1024, ledger_id: int = LID):
    """A Pulsar-written pair of ``entries`` (several blocks), entries ``damage`` with a flipped payload
    byte; returns its read handle."""
    pair = pulsar_objects.build(entries, max_block, ledger_id=ledger_id)
    data = bytearray(pair.data)
    for e in damage:
        pulsar_objects.flip_payload_byte(data, e)
    pulsar_objects.write(store, pulsar_objects.PulsarPair(**{**pair.__dict__, "data": bytes(data)}))
    return LedgerOffloader(store, offset_cache=OffsetCache()).read_offloaded(ledger_id, pair.uuid)


def frame_crcs(h) -> list[int]:
    """CRC32C of every frame as read back: what a hot copy holding the same bytes recorded."""
    b = h.read_batch(0, h.last_add_confirmed)
    mv = memoryview(b.buf)
    return [crc32c.crc32c(mv[s - 12 : s + n]) for s, n in zip(b.starts, b.lengths, strict=True)]


def test_an_intact_pulsar_written_copy_has_every_message_checked(store) -> None:
    h = pulsar_pair(store, ENTRIES)
    assert h.checksums is None  # Pulsar's objects carry none: the messages are checked by default
    rep = verify_offloaded(h)
    assert rep.blocks > 3 and rep.entries == 120
    m = rep.messages
    assert (m.checked, m.unchecked, m.damaged, m.not_messages) == (120, 0, 0, 0)
    assert verify_offloaded(h, messages=False).messages is None


def test_a_damaged_message_is_named_at_its_position_after_the_whole_copy_passed(store) -> None:
    """A flipped payload byte: the structure holds (structure-only verification passes), the message's
    CRC32C does not; every damaged message is named, the rest counted."""
    h = pulsar_pair(store, ENTRIES, damage=(7, 59, 119))
    assert verify_offloaded(h, messages=False).entries == 120
    with pytest.raises(DamagedMessagesError) as ei:
        verify_offloaded(h)
    e = ei.value
    assert isinstance(e, CorruptObjectError) and not e.same_as_hot
    t = e.tally
    assert (t.checked, t.damaged, t.not_messages) == (117, 3, 0)
    assert [str(b.position) for b in t.damaged_at] == [f"{LID}:7", f"{LID}:59", f"{LID}:119"]
    assert all(b.checksum and "CRC32C mismatch" in b.reason for b in t.damaged_at)
    assert f"3 damaged message(s) of 120 entries: {LID}:7 (CRC32C mismatch (stored" in str(e)
    assert e.report.entries == 120 and e.report.bytes_read > 0  # the whole copy was read, once


def test_damage_the_hot_copy_shares_is_said_so(store) -> None:
    """Every frame matches the hot copy's CRCs, the message does not: the hot copy holds the same bytes."""
    h = pulsar_pair(store, ENTRIES, damage=(3,))
    crcs = frame_crcs(h)
    with pytest.raises(DamagedMessagesError, match="the hot copy holds the same bytes") as ei:
        verify_offloaded(h, crcs, expected_sizes=[len(x) for x in ENTRIES])
    assert ei.value.same_as_hot and ei.value.tally.damaged == 1
    with pytest.raises(DamagedMessagesError):  # frames walked (no sizes) rather than cut by the hot copy
        verify_offloaded(h, crcs)


def test_a_hot_copy_that_differs_is_reported_first(store) -> None:
    h = pulsar_pair(store, ENTRIES, damage=(3,))
    good = pulsar_pair(store, ENTRIES, ledger_id=LID + 1)
    with pytest.raises(CorruptObjectError, match="entry 3 at bytes .* differs from the hot copy") as ei:
        verify_offloaded(h, frame_crcs(good))
    assert not isinstance(ei.value, DamagedMessagesError)


def opaque(n: int, seed: int = 1) -> list[bytes]:
    """Opaque entries (`generate --raw`), some starting like a Pulsar entry: the checksum magic, or the
    broker entry metadata magic."""
    rng = random.Random(seed)
    out = [rng.randbytes(rng.randrange(0, 300)) for _ in range(n)]
    for i in range(0, n, 5):
        out[i] = b"\x0e\x01" + out[i][2:] if len(out[i]) > 12 else b"\x0e\x01" + rng.randbytes(40)
    out[3] = b"\x0e\x02" + rng.randbytes(30)
    return out


def test_opaque_entries_are_not_messages_never_damage(store) -> None:
    entries = opaque(100)
    h = pulsar_pair(store, entries)
    m = verify_offloaded(h).messages
    assert (m.damaged, m.damaged_at) == (0, [])
    assert m.not_messages >= 95 and m.checked + m.unchecked + m.not_messages == 100


def test_the_ledger_decides_one_damaged_message_among_many_and_alone(store) -> None:
    """A ledger of a single damaged message is still a message ledger (its metadata parses); a flipped
    byte in a message's metadata size (framing no longer parses) counts as damage among messages."""
    one = pulsar_pair(store, ENTRIES[:1], damage=(0,), ledger_id=20)
    with pytest.raises(DamagedMessagesError) as ei:
        verify_offloaded(one)
    assert (ei.value.tally.damaged, ei.value.tally.checked) == (1, 0)
    pair = pulsar_objects.build(ENTRIES[:40], ledger_id=21)
    data = bytearray(pair.data)
    start, _ = pulsar_objects.entry_span(data, 5)
    data[start + 6] ^= 0x40  # the metadata size's high byte: the metadata now overruns the entry
    pulsar_objects.write(store, pulsar_objects.PulsarPair(**{**pair.__dict__, "data": bytes(data)}))
    with pytest.raises(DamagedMessagesError) as ei:
        verify_offloaded(LedgerOffloader(store).read_offloaded(21, pair.uuid))
    assert [str(b.position) for b in ei.value.tally.damaged_at] == ["21:5"]


def test_damaged_positions_listed_are_bounded_the_count_is_not(store) -> None:
    h = pulsar_pair(store, ENTRIES, damage=range(0, 120, 3))
    with pytest.raises(DamagedMessagesError) as ei:
        verify_offloaded(h)
    t = ei.value.tally
    assert t.damaged == 40 and len(t.damaged_at) == MAX_LISTED and "and 35 more" in str(ei.value)


def test_a_copy_with_chunk_checksums_is_checked_by_them_and_its_messages_on_request(tmp_path, store) -> None:
    """The project's own objects: the chunk checksums catch a flipped byte as before; the messages are
    checked only when asked (a second witness)."""
    hot = LocalLedgerStore(tmp_path / "hot")
    w = hot.create_ledger({"application": b"pulsar"})
    w.append_many(ENTRIES)
    w.close()
    off = LedgerOffloader(store, max_block_size=8 * 1024, offset_cache=OffsetCache())
    u = str(uuidlib.uuid4())
    off.offload(hot.open_ledger(w.ledger_id), u)
    h = off.read_offloaded(w.ledger_id, u)
    assert h.checksums is not None and verify_offloaded(h).messages is None
    assert verify_offloaded(h, messages=True).messages.checked == 120
    key = f"{u}-ledger-{w.ledger_id}"
    data = bytearray(store.get(key))
    pulsar_objects.flip_payload_byte(data, 50)
    store.put(key, bytes(data), store.head(key).metadata)
    with pytest.raises(CorruptObjectError, match="checksum") as ei:
        verify_offloaded(off.read_offloaded(w.ledger_id, u), messages=True)
    assert not isinstance(ei.value, DamagedMessagesError)


def _entries_strategy():
    """Entries of every kind: messages (with and without broker entry metadata, old clients' without a
    checksum), damaged messages, opaque bytes, bytes that start with either magic, a right checksum over
    metadata that overruns the entry by a byte."""
    base = encode_message(OutMessage(b"payload", key="k"), producer="p", sequence_id=1, publish_time=2)
    meta = MessageMetadata(producer_name="p", sequence_id=1, publish_time=2)
    kinds = st.sampled_from(["ok", "broker", "old", "damaged", "opaque", "magic", "short", "overrun"])

    def make(kind: str, noise: bytes) -> bytes:
        if kind == "ok":
            return base
        if kind == "broker":
            return frame_entry(meta, noise, broker=BrokerEntryMetadata(broker_timestamp=5, index=7))
        if kind == "old":
            return frame_entry(meta, noise, checksum=False)
        if kind == "damaged":
            return base[:-1] + bytes([base[-1] ^ 1])
        if kind == "magic":
            return b"\x0e\x01" + noise
        if kind == "short":
            return noise[:9]
        if kind == "overrun":
            body = struct.pack(">i", len(noise) + 1) + noise
            return b"\x0e\x01" + crc32c.crc32c(body).to_bytes(4, "big") + body
        return noise

    return st.lists(st.builds(make, kinds, st.binary(max_size=64)), min_size=1, max_size=40)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(_entries_strategy(), st.integers(0, 1000))
def test_the_fast_path_counts_what_check_entries_counts(entries: list[bytes], first: int) -> None:
    """LedgerMessages.feed's tight loop for plain messages gives exactly check_entries' counts and bad
    positions, whatever mix of entries a window holds."""
    buf = b"".join(struct.pack(">iq", len(e), first + i) + e for i, e in enumerate(entries))
    starts, at = [], 0
    for e in entries:
        starts.append(at + 12)
        at += 12 + len(e)
    lengths = [len(e) for e in entries]
    want = check_entries(EntryBatch(LID, first, buf, starts, lengths, 0, len(buf)))
    got = LedgerMessages(LID)
    got.feed(memoryview(buf), first, starts, lengths)
    assert (got.checked, got.unchecked, got.bad) == (want.checked, want.unchecked, len(want.bad))
    assert [b.position for b in got.listed] == [b.position for b in want.bad][:MAX_LISTED]
