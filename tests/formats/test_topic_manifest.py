"""Topic manifests (tieredcore/formats/topic_manifest.py, docs/recovery.md): the exact layout, a round trip
over arbitrary values, damage detected, and the offloaded view naming complete copies only."""

from __future__ import annotations

import struct

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tieredcore.errors import FormatError
from tieredcore.formats.keys import (
    is_topic_manifest_key,
    parse_key,
    parse_topic_manifest_key,
    topic_manifest_key,
)
from tieredcore.formats.proto import MLDataFormats_pb2 as pb
from tieredcore.formats.topic_manifest import (
    TopicManifest,
    decode_topic_manifest,
    encode_topic_manifest,
    offloaded_view,
)


def _record() -> bytes:
    info = pb.ManagedLedgerInfo()
    li = info.ledgerInfo.add(ledgerId=3, entries=10, size=1000, timestamp=1767225600000)
    ctx = li.offloadContext
    ctx.uidMsb, ctx.uidLsb, ctx.complete, ctx.timestamp = 1, 2, True, 5
    ctx.driverMetadata.name = "filesystem"
    return info.SerializeToString()


VECTOR = TopicManifest("t/a/persistent/x", 7, 1767225600001, _record(), {"offload_threshold_bytes": 0}, None)
VECTOR_HEX = (
    "54544d46" "0001" "0000" "0000000000000007" "0000019b76daa801" "0010" "742f612f70657273697374656e742f78"
    "00000038" "7b226e616d657370616365223a7b226f66666c6f61645f7468726573686f6c645f6279746573223a307d2c22746f706963"
    "223a6e756c6c7d"
    "00000028" "0a260803100a18e8072080d0eab6b7332a160801100218012805320c0a0a66696c6573797374656d"
    "d0794452"
)


def test_vector_layout() -> None:
    data = encode_topic_manifest(VECTOR)
    assert data.hex() == VECTOR_HEX
    # the documented offsets, field by field
    assert data[:4] == b"TTMF" and struct.unpack_from(">HHqqH", data, 4) == (1, 0, 7, 1767225600001, 16)
    assert data[26:42] == b"t/a/persistent/x"
    (plen,) = struct.unpack_from(">I", data, 42)
    assert data[46:46 + plen] == b'{"namespace":{"offload_threshold_bytes":0},"topic":null}'
    (rlen,) = struct.unpack_from(">I", data, 46 + plen)
    assert data[50 + plen:50 + plen + rlen] == VECTOR.record
    assert struct.unpack(">I", data[-4:])[0] == crc32c.crc32c(data[:-4])
    assert decode_topic_manifest(data) == VECTOR
    assert decode_topic_manifest(data).info().ledgerInfo[0].ledgerId == 3


@pytest.mark.parametrize("cut", [0, 10, 30, len(VECTOR_HEX) // 2 - 1])
def test_truncated_or_flipped_is_refused(cut: int) -> None:
    data = encode_topic_manifest(VECTOR)
    with pytest.raises(FormatError):
        decode_topic_manifest(data[:cut])
    flipped = bytearray(data)
    flipped[cut] ^= 0x40
    with pytest.raises(FormatError, match="checksum"):
        decode_topic_manifest(bytes(flipped))


def test_other_versions_and_trailing_bytes_are_refused() -> None:
    data = bytearray(encode_topic_manifest(VECTOR))
    data[5] = 2  # version 2, checksum recomputed: a format this reader does not know
    body = bytes(data[:-4])
    with pytest.raises(FormatError, match="version"):
        decode_topic_manifest(body + struct.pack(">I", crc32c.crc32c(body)))
    body = encode_topic_manifest(VECTOR)[:-4] + b"x"
    with pytest.raises(FormatError, match="unexpected"):
        decode_topic_manifest(body + struct.pack(">I", crc32c.crc32c(body)))


names = st.tuples(*[st.text(st.characters(codec="utf-8", exclude_characters="/"), min_size=1, max_size=12)] * 2,
                  st.sampled_from(["persistent", "non-persistent"]),
                  st.text(st.characters(codec="utf-8", exclude_characters="/"), min_size=1, max_size=40)).map("/".join)
json_values = st.recursive(st.none() | st.booleans() | st.integers(-2**62, 2**62) | st.text(max_size=20),
                           lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                           max_leaves=10)
policies = st.none() | st.dictionaries(st.text(max_size=12), json_values, max_size=5)


@st.composite
def records(draw) -> bytes:
    info = pb.ManagedLedgerInfo()
    for lid in sorted(draw(st.sets(st.integers(0, 2**40), max_size=5))):
        li = info.ledgerInfo.add(ledgerId=lid, entries=draw(st.integers(0, 2**31)), size=draw(st.integers(0, 2**40)))
        if draw(st.booleans()):
            li.offloadContext.uidMsb, li.offloadContext.uidLsb = draw(st.integers(-2**63, 2**63 - 1)), lid
            li.offloadContext.complete = True
    return info.SerializeToString()


@settings(max_examples=80, deadline=None)
@given(names, st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1), records(), policies, policies)
def test_round_trip(topic: str, seq: int, written: int, record: bytes, ns: dict | None, tp: dict | None) -> None:
    m = TopicManifest(topic, seq, written, record, ns, tp)
    assert decode_topic_manifest(encode_topic_manifest(m)) == m


def test_offloaded_view_names_complete_copies_only() -> None:
    info = pb.ManagedLedgerInfo()
    done = info.ledgerInfo.add(ledgerId=1, entries=5, size=50, timestamp=9)
    done.offloadContext.uidMsb, done.offloadContext.uidLsb, done.offloadContext.complete = 1, 1, True
    done.offloadContext.bookkeeperDeleted = True
    inflight = info.ledgerInfo.add(ledgerId=2, entries=5, size=50, timestamp=10)
    inflight.offloadContext.uidMsb, inflight.offloadContext.uidLsb = 2, 2
    inflight.offloadContext.driverMetadata.name = "filesystem"
    inflight.offloadContext.offloadSegment.add(uidMsb=3, uidLsb=3, complete=True, endEntryId=4)
    inflight.offloadContext.offloadSegment.add(uidMsb=4, uidLsb=4, complete=False)
    inflight.properties.add(key="tiered.replacementOffload.x", value="")
    inflight.properties.add(key="other", value="kept")
    view = offloaded_view(info)
    assert view.ledgerInfo[0] == done
    v2 = view.ledgerInfo[1].offloadContext
    assert not v2.HasField("uidMsb") and not v2.HasField("driverMetadata")
    assert [(s.uidMsb, s.complete) for s in v2.offloadSegment] == [(3, True)]
    assert [kv.key for kv in view.ledgerInfo[1].properties] == ["other"]
    assert info.ledgerInfo[1].offloadContext.uidMsb == 2  # the input is left alone


def test_keys() -> None:
    k = topic_manifest_key("pre/", "c1", "t/a/persistent/x-ledger-5", 42)
    assert k == "pre/tiered-topic-manifests/c1/t/a/persistent/x-ledger-5/00000000000000000042.topic-manifest"
    assert parse_topic_manifest_key(k, "pre/", "c1") == ("t/a/persistent/x-ledger-5", 42)
    assert parse_topic_manifest_key(k, "pre/", "c2") is None  # another cluster's
    assert is_topic_manifest_key(k, "pre/") and parse_key(k, "pre/") is None  # never an offload key
    assert parse_topic_manifest_key("pre/tiered-topic-manifests/c1/x/1.topic-manifest", "pre/", "c1") is None
