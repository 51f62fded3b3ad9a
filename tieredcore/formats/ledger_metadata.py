"""BookKeeper ``LedgerMetadataFormat`` (docs/metadata.md) as stored inside a V1 index object (docs/formats.md).

The bytes are not canonical (Pulsar's custom-metadata order varies); compare decoded fields.
"""

from __future__ import annotations

from google.protobuf.message import DecodeError

from tieredcore.errors import FormatError, ValidationError
from tieredcore.formats.constants import OFFLOADED_ENSEMBLE_MEMBER
from tieredcore.formats.proto import DataFormats_pb2
from tieredcore.model import STATE_CLOSED, STATE_IN_RECOVERY, STATE_OPEN, LedgerMetadata

_LMF = DataFormats_pb2.LedgerMetadataFormat
_STATES = (STATE_OPEN, STATE_IN_RECOVERY, STATE_CLOSED)


def encode_ledger_metadata(md: LedgerMetadata) -> bytes:
    """Serialize ``md`` the way Pulsar's offloader does: quorum/ensemble/ack quorum 1, one segment
    ``{["127.0.0.1:3181"], firstEntryId 0}``, digest CRC32C, custom metadata sorted by key.

    The ledger id is not part of the format (it lives in the object key).
    """
    if md.state not in _STATES:
        raise ValidationError(f"ledger {md.ledger_id}: invalid state {md.state} (expected 1, 2 or 3)")
    if md.last_entry_id < -1:
        raise ValidationError(f"ledger {md.ledger_id}: invalid lastEntryId {md.last_entry_id}")
    if md.length < 0:
        raise ValidationError(f"ledger {md.ledger_id}: negative length {md.length}")
    m = _LMF()
    m.quorumSize = 1
    m.ensembleSize = 1
    m.ackQuorumSize = 1
    m.length = md.length
    m.lastEntryId = md.last_entry_id
    m.state = md.state
    seg = m.segment.add()
    seg.ensembleMember.append(OFFLOADED_ENSEMBLE_MEMBER)
    seg.firstEntryId = 0
    m.digestType = _LMF.CRC32C
    m.ctime = md.ctime
    for key in sorted(md.custom_metadata):
        kv = m.customMetadata.add()
        kv.key = key
        kv.value = bytes(md.custom_metadata[key])
    return m.SerializeToString()


def decode_ledger_metadata(data: bytes | bytearray | memoryview, ledger_id: int) -> LedgerMetadata:
    """Parse ``LedgerMetadataFormat`` bytes; corrupt bytes or missing required fields -> FormatError.

    An absent ``lastEntryId`` reads as -1 (BookKeeper's INVALID_ENTRY_ID), an absent ``ctime`` as 0.
    """
    m = _LMF()
    try:
        m.ParseFromString(bytes(data))
    except DecodeError as e:
        raise FormatError(f"ledger {ledger_id}: corrupt ledger metadata (LedgerMetadataFormat): {e}") from e
    if not m.IsInitialized():
        missing = ", ".join(m.FindInitializationErrors())
        raise FormatError(f"ledger {ledger_id}: ledger metadata misses required fields: {missing}")
    custom = {kv.key: kv.value for kv in m.customMetadata}
    # proto2 does not check UTF-8: upb hands a string field holding other bytes back as bytes
    bad = [k for k in custom if not isinstance(k, str)]
    if bad:
        raise FormatError(f"ledger {ledger_id}: ledger metadata custom key {bad[0]!r} is not UTF-8")
    return LedgerMetadata(
        ledger_id=ledger_id,
        state=int(m.state),
        last_entry_id=m.lastEntryId if m.HasField("lastEntryId") else -1,
        length=m.length,
        ctime=m.ctime if m.HasField("ctime") else 0,
        custom_metadata=custom,
    )
