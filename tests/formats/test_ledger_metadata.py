"""BookKeeper LedgerMetadataFormat (docs/metadata.md) and Java UUID halves."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tieredcore.errors import FormatError, ValidationError
from tieredcore.formats import (
    decode_ledger_metadata,
    encode_ledger_metadata,
    msb_lsb_to_uuid,
    uuid_to_msb_lsb,
)
from tieredcore.formats.proto import DataFormats_pb2
from tieredcore.model import STATE_CLOSED, STATE_IN_RECOVERY, STATE_OPEN, LedgerMetadata

LMF = DataFormats_pb2.LedgerMetadataFormat


def sample() -> LedgerMetadata:
    return LedgerMetadata(
        ledger_id=17,
        state=STATE_CLOSED,
        last_entry_id=99,
        length=10000,
        ctime=1700000000123,
        custom_metadata={
            "pulsar/managed-ledger": b"public/default/persistent/t",
            "application": b"pulsar",
            "component": b"managed-ledger",
        },
    )


def test_fields_written_like_pulsar():
    m = LMF.FromString(encode_ledger_metadata(sample()))
    assert (m.quorumSize, m.ensembleSize, m.ackQuorumSize) == (1, 1, 1)
    assert (m.length, m.lastEntryId, m.state, m.ctime) == (10000, 99, LMF.CLOSED, 1700000000123)
    assert m.digestType == LMF.CRC32C
    assert len(m.segment) == 1
    assert list(m.segment[0].ensembleMember) == ["127.0.0.1:3181"]
    assert m.segment[0].firstEntryId == 0
    assert [kv.key for kv in m.customMetadata] == ["application", "component", "pulsar/managed-ledger"]
    assert m.customMetadata[2].value == b"public/default/persistent/t"
    assert not m.HasField("password") and not m.HasField("cToken")


def test_round_trip_and_deterministic():
    md = sample()
    data = encode_ledger_metadata(md)
    assert decode_ledger_metadata(data, 17) == md
    reordered = LedgerMetadata(
        **{**md.__dict__, "custom_metadata": dict(reversed(md.custom_metadata.items()))}
    )
    assert encode_ledger_metadata(reordered) == data
    assert decode_ledger_metadata(data, 5).ledger_id == 5


def test_decode_pulsar_style_unsorted_and_optional_fields_absent():
    m = LMF(quorumSize=2, ensembleSize=3, length=7, state=LMF.OPEN)
    kv = m.customMetadata.add()
    kv.key, kv.value = "z", b"1"
    kv = m.customMetadata.add()
    kv.key, kv.value = "a", b"2"
    md = decode_ledger_metadata(m.SerializeToString(), 1)
    assert (md.state, md.last_entry_id, md.length, md.ctime) == (STATE_OPEN, -1, 7, 0)
    assert md.custom_metadata == {"z": b"1", "a": b"2"}
    assert not md.is_closed


@pytest.mark.parametrize("state", [STATE_OPEN, STATE_IN_RECOVERY, STATE_CLOSED])
def test_states(state):
    md = LedgerMetadata(ledger_id=1, state=state, last_entry_id=-1, length=0)
    assert decode_ledger_metadata(encode_ledger_metadata(md), 1) == md


def test_decode_errors():
    with pytest.raises(FormatError, match="ledger 4"):
        decode_ledger_metadata(b"\xff\xff\xff", 4)
    missing = LMF(quorumSize=1).SerializePartialToString()
    with pytest.raises(FormatError, match="required"):
        decode_ledger_metadata(missing, 4)


def test_encode_rejects_invalid():
    with pytest.raises(ValidationError):
        encode_ledger_metadata(LedgerMetadata(ledger_id=1, state=9, last_entry_id=0, length=0))
    with pytest.raises(ValidationError):
        encode_ledger_metadata(LedgerMetadata(ledger_id=1, state=3, last_entry_id=-2, length=0))
    with pytest.raises(ValidationError):
        encode_ledger_metadata(LedgerMetadata(ledger_id=1, state=3, last_entry_id=0, length=-1))


@given(
    st.sampled_from([STATE_OPEN, STATE_IN_RECOVERY, STATE_CLOSED]),
    st.integers(-1, 2**63 - 1),
    st.integers(0, 2**63 - 1),
    st.integers(0, 2**63 - 1),
    st.dictionaries(st.text(max_size=20), st.binary(max_size=30), max_size=5),
)
def test_round_trip_hypothesis(state, last, length, ctime, custom):
    md = LedgerMetadata(
        ledger_id=3, state=state, last_entry_id=last, length=length, ctime=ctime, custom_metadata=custom
    )
    assert decode_ledger_metadata(encode_ledger_metadata(md), 3) == md


# --- uuids ---------------------------------------------------------------------------------------


def test_uuid_known_values():
    u = uuid.UUID("00000000-0000-0001-ffff-ffffffffffff")
    assert uuid_to_msb_lsb(u) == (1, -1)
    assert msb_lsb_to_uuid(1, -1) == u
    v = uuid.UUID("ffffffff-ffff-fffe-0000-000000000002")
    assert uuid_to_msb_lsb(v) == (-2, 2)
    # Java: new UUID(Long.MIN_VALUE, Long.MAX_VALUE)
    assert str(msb_lsb_to_uuid(-(2**63), 2**63 - 1)) == "80000000-0000-0000-7fff-ffffffffffff"
    assert msb_lsb_to_uuid(2**64 - 1, 0) == msb_lsb_to_uuid(-1, 0)
    with pytest.raises(ValidationError):
        msb_lsb_to_uuid(2**64, 0)


@given(st.uuids())
def test_uuid_round_trip(u):
    msb, lsb = uuid_to_msb_lsb(u)
    assert -(2**63) <= msb < 2**63 and -(2**63) <= lsb < 2**63
    assert msb_lsb_to_uuid(msb, lsb) == u


@given(st.integers(-(2**63), 2**63 - 1), st.integers(-(2**63), 2**63 - 1))
def test_msb_lsb_round_trip(msb, lsb):
    assert uuid_to_msb_lsb(msb_lsb_to_uuid(msb, lsb)) == (msb, lsb)
