"""The committed protobuf code is what `make proto` generates, and its field numbers are Pulsar's (docs/metadata.md;
PulsarApi.proto's from Pulsar's pulsar-common/src/main/proto/PulsarApi.proto, docs/formats.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf.descriptor import FieldDescriptor as FD

from tieredcore.formats.proto import DataFormats_pb2, MLDataFormats_pb2, PulsarApi_pb2

PROTO_DIR = Path(__file__).resolve().parents[2] / "tieredcore" / "formats" / "proto"
SOURCES = ["MLDataFormats.proto", "DataFormats.proto", "PulsarApi.proto"]


def test_generated_code_is_up_to_date(tmp_path: Path) -> None:
    # the same command as `make proto`, into a temporary directory
    p = subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I", ".", f"--python_out={tmp_path}", *SOURCES],
        cwd=PROTO_DIR, capture_output=True, text=True, timeout=120, check=False,
    )
    assert p.returncode == 0, p.stderr
    for src in SOURCES:
        name = src.replace(".proto", "_pb2.py")
        fresh = (tmp_path / name).read_bytes()
        committed = (PROTO_DIR / name).read_bytes()
        assert fresh == committed, f"{name} is stale: run `make proto` and commit the result"


L_REQ, L_OPT, L_REP = "required", "optional", "repeated"
T = {
    "string": FD.TYPE_STRING, "bytes": FD.TYPE_BYTES, "bool": FD.TYPE_BOOL, "int32": FD.TYPE_INT32,
    "int64": FD.TYPE_INT64, "enum": FD.TYPE_ENUM, "message": FD.TYPE_MESSAGE, "uint32": FD.TYPE_UINT32,
    "uint64": FD.TYPE_UINT64,
}

# Pulsar's MLDataFormats field numbers (docs/metadata.md): (message, field, number, label, type, message/enum type name)
ML_FIELDS = [
    ("KeyValue", "key", 1, L_REQ, "string", None),
    ("KeyValue", "value", 2, L_REQ, "string", None),
    ("OffloadDriverMetadata", "name", 1, L_REQ, "string", None),
    ("OffloadDriverMetadata", "properties", 2, L_REP, "message", "KeyValue"),
    ("OffloadContext", "uidMsb", 1, L_OPT, "int64", None),
    ("OffloadContext", "uidLsb", 2, L_OPT, "int64", None),
    ("OffloadContext", "complete", 3, L_OPT, "bool", None),
    ("OffloadContext", "bookkeeperDeleted", 4, L_OPT, "bool", None),
    ("OffloadContext", "timestamp", 5, L_OPT, "int64", None),
    ("OffloadContext", "driverMetadata", 6, L_OPT, "message", "OffloadDriverMetadata"),
    ("OffloadContext", "offloadSegment", 7, L_REP, "message", "OffloadSegment"),
    ("OffloadSegment", "uidMsb", 1, L_OPT, "int64", None),
    ("OffloadSegment", "uidLsb", 2, L_OPT, "int64", None),
    ("OffloadSegment", "complete", 3, L_OPT, "bool", None),
    ("OffloadSegment", "assignedTimestamp", 4, L_OPT, "int64", None),
    ("OffloadSegment", "offloadedTimestamp", 5, L_OPT, "int64", None),
    ("OffloadSegment", "endEntryId", 6, L_OPT, "int64", None),
    ("OffloadSegment", "driverMetadata", 7, L_OPT, "message", "OffloadDriverMetadata"),
    ("ManagedLedgerInfo.LedgerInfo", "ledgerId", 1, L_REQ, "int64", None),
    ("ManagedLedgerInfo.LedgerInfo", "entries", 2, L_OPT, "int64", None),
    ("ManagedLedgerInfo.LedgerInfo", "size", 3, L_OPT, "int64", None),
    ("ManagedLedgerInfo.LedgerInfo", "timestamp", 4, L_OPT, "int64", None),
    ("ManagedLedgerInfo.LedgerInfo", "offloadContext", 5, L_OPT, "message", "OffloadContext"),
    ("ManagedLedgerInfo.LedgerInfo", "properties", 6, L_REP, "message", "KeyValue"),
    ("ManagedLedgerInfo", "ledgerInfo", 1, L_REP, "message", "ManagedLedgerInfo.LedgerInfo"),
    ("ManagedLedgerInfo", "terminatedPosition", 2, L_OPT, "message", "NestedPositionInfo"),
    ("ManagedLedgerInfo", "properties", 3, L_REP, "message", "KeyValue"),
    ("NestedPositionInfo", "ledgerId", 1, L_REQ, "int64", None),
    ("NestedPositionInfo", "entryId", 2, L_REQ, "int64", None),
    # the compressed-record header described under the table
    ("ManagedLedgerInfoMetadata", "compressionType", 1, L_REQ, "enum", "CompressionType"),
    ("ManagedLedgerInfoMetadata", "uncompressedSize", 2, L_REQ, "int32", None),
]

# BookKeeper's LedgerMetadataFormat field numbers ("not written" fields still exist with their numbers)
LMF = "LedgerMetadataFormat"
BK_FIELDS = [
    (LMF, "quorumSize", 1, L_REQ, "int32", None),
    (LMF, "ensembleSize", 2, L_REQ, "int32", None),
    (LMF, "length", 3, L_REQ, "int64", None),
    (LMF, "lastEntryId", 4, L_OPT, "int64", None),
    (LMF, "state", 5, L_REQ, "enum", "LedgerMetadataFormat.State"),
    (LMF, "segment", 6, L_REP, "message", "LedgerMetadataFormat.Segment"),
    (LMF, "digestType", 7, L_OPT, "enum", "LedgerMetadataFormat.DigestType"),
    (LMF, "password", 8, L_OPT, "bytes", None),
    (LMF, "ackQuorumSize", 9, L_OPT, "int32", None),
    (LMF, "ctime", 10, L_OPT, "int64", None),
    (LMF, "customMetadata", 11, L_REP, "message", "LedgerMetadataFormat.cMetadataMapEntry"),
    (LMF, "cToken", 12, L_OPT, "int64", None),
    (f"{LMF}.Segment", "ensembleMember", 1, L_REP, "string", None),
    (f"{LMF}.Segment", "firstEntryId", 2, L_REQ, "int64", None),
    (f"{LMF}.cMetadataMapEntry", "key", 1, L_OPT, "string", None),
    (f"{LMF}.cMetadataMapEntry", "value", 2, L_OPT, "bytes", None),
]

# Pulsar's PulsarApi.proto: the records inside entries (spec/07), every field with its number, label, type
# and default as Pulsar declares it
MM, SMM = "MessageMetadata", "SingleMessageMetadata"
PULSAR_FIELDS = [
    ("KeyValue", "key", 1, L_REQ, "string", None),
    ("KeyValue", "value", 2, L_REQ, "string", None),
    ("EncryptionKeys", "key", 1, L_REQ, "string", None),
    ("EncryptionKeys", "value", 2, L_REQ, "bytes", None),
    ("EncryptionKeys", "metadata", 3, L_REP, "message", "KeyValue"),
    (MM, "producer_name", 1, L_REQ, "string", None),
    (MM, "sequence_id", 2, L_REQ, "uint64", None),
    (MM, "publish_time", 3, L_REQ, "uint64", None),
    (MM, "properties", 4, L_REP, "message", "KeyValue"),
    (MM, "replicated_from", 5, L_OPT, "string", None),
    (MM, "partition_key", 6, L_OPT, "string", None),
    (MM, "replicate_to", 7, L_REP, "string", None),
    (MM, "compression", 8, L_OPT, "enum", "CompressionType"),
    (MM, "uncompressed_size", 9, L_OPT, "uint32", None),
    (MM, "num_messages_in_batch", 11, L_OPT, "int32", None),
    (MM, "event_time", 12, L_OPT, "uint64", None),
    (MM, "encryption_keys", 13, L_REP, "message", "EncryptionKeys"),
    (MM, "encryption_algo", 14, L_OPT, "string", None),
    (MM, "encryption_param", 15, L_OPT, "bytes", None),
    (MM, "schema_version", 16, L_OPT, "bytes", None),
    (MM, "partition_key_b64_encoded", 17, L_OPT, "bool", None),
    (MM, "ordering_key", 18, L_OPT, "bytes", None),
    (MM, "deliver_at_time", 19, L_OPT, "int64", None),
    (MM, "marker_type", 20, L_OPT, "int32", None),
    (MM, "txnid_least_bits", 22, L_OPT, "uint64", None),
    (MM, "txnid_most_bits", 23, L_OPT, "uint64", None),
    (MM, "highest_sequence_id", 24, L_OPT, "uint64", None),
    (MM, "null_value", 25, L_OPT, "bool", None),
    (MM, "uuid", 26, L_OPT, "string", None),
    (MM, "num_chunks_from_msg", 27, L_OPT, "int32", None),
    (MM, "total_chunk_msg_size", 28, L_OPT, "int32", None),
    (MM, "chunk_id", 29, L_OPT, "int32", None),
    (MM, "null_partition_key", 30, L_OPT, "bool", None),
    (SMM, "properties", 1, L_REP, "message", "KeyValue"),
    (SMM, "partition_key", 2, L_OPT, "string", None),
    (SMM, "payload_size", 3, L_REQ, "int32", None),
    (SMM, "compacted_out", 4, L_OPT, "bool", None),
    (SMM, "event_time", 5, L_OPT, "uint64", None),
    (SMM, "partition_key_b64_encoded", 6, L_OPT, "bool", None),
    (SMM, "ordering_key", 7, L_OPT, "bytes", None),
    (SMM, "sequence_id", 8, L_OPT, "uint64", None),
    (SMM, "null_value", 9, L_OPT, "bool", None),
    (SMM, "null_partition_key", 10, L_OPT, "bool", None),
    ("BrokerEntryMetadata", "broker_timestamp", 1, L_OPT, "uint64", None),
    ("BrokerEntryMetadata", "index", 2, L_OPT, "uint64", None),
]

ML_PACKAGE = "org.apache.bookkeeper.mledger.proto"
PULSAR_PACKAGE = "pulsar.proto"
BK_PACKAGE = "org.apache.bookkeeper.proto"


def _message(module, path: str):
    first, *rest = path.split(".")
    desc = module.DESCRIPTOR.message_types_by_name[first]
    for name in rest:
        desc = desc.nested_types_by_name[name]
    return desc


def _label(field) -> str:
    if field.is_repeated:
        return L_REP
    return L_REQ if field.is_required else L_OPT


@pytest.mark.parametrize(
    ("module", "package", "row"),
    [(MLDataFormats_pb2, ML_PACKAGE, r) for r in ML_FIELDS] + [(DataFormats_pb2, BK_PACKAGE, r) for r in BK_FIELDS]
    + [(PulsarApi_pb2, PULSAR_PACKAGE, r) for r in PULSAR_FIELDS],
    ids=lambda v: f"{v[0]}.{v[1]}" if isinstance(v, tuple) else None,
)
def test_field_matches_spec(module, package: str, row: tuple) -> None:
    message, field, number, label, type_, type_name = row
    desc = _message(module, message)
    assert desc.full_name == f"{package}.{message}"
    f = desc.fields_by_name[field]
    assert f.number == number
    assert _label(f) == label
    assert f.type == T[type_]
    if type_name is not None:
        target = f.message_type if type_ == "message" else f.enum_type
        assert target.full_name == f"{package}.{type_name}"


@pytest.mark.parametrize(("module", "rows"), [(MLDataFormats_pb2, ML_FIELDS), (DataFormats_pb2, BK_FIELDS),
                                             (PulsarApi_pb2, PULSAR_FIELDS)])
def test_no_fields_beyond_spec(module, rows: list[tuple]) -> None:
    spec: dict[str, set[tuple[str, int]]] = {}
    for message, field, number, *_ in rows:
        spec.setdefault(message, set()).add((field, number))
    for message, fields in spec.items():
        desc = _message(module, message)
        assert {(f.name, f.number) for f in desc.fields} == fields, message


def test_spot_checks_named_in_the_brief() -> None:
    ml = MLDataFormats_pb2
    assert ml.OffloadContext.DESCRIPTOR.fields_by_name["bookkeeperDeleted"].number == 4
    assert ml.ManagedLedgerInfo.LedgerInfo.DESCRIPTOR.fields_by_name["offloadContext"].number == 5
    assert ml.OffloadSegment.DESCRIPTOR.fields_by_name["endEntryId"].number == 6
    assert DataFormats_pb2.LedgerMetadataFormat.DESCRIPTOR.fields_by_name["customMetadata"].number == 11


def test_enums_match_spec() -> None:
    ct = MLDataFormats_pb2.DESCRIPTOR.enum_types_by_name["CompressionType"]
    assert {v.name: v.number for v in ct.values} == {"NONE": 0, "LZ4": 1, "ZLIB": 2, "ZSTD": 3, "SNAPPY": 4}
    lmf = DataFormats_pb2.LedgerMetadataFormat.DESCRIPTOR
    assert {v.name: v.number for v in lmf.enum_types_by_name["State"].values} == {
        "OPEN": 1, "IN_RECOVERY": 2, "CLOSED": 3,
    }
    assert {v.name: v.number for v in lmf.enum_types_by_name["DigestType"].values} == {
        "CRC32": 1, "HMAC": 2, "CRC32C": 3, "DUMMY": 4,
    }


def test_pulsar_api_enum_and_defaults() -> None:
    ct = PulsarApi_pb2.DESCRIPTOR.enum_types_by_name["CompressionType"]
    assert {v.name: v.number for v in ct.values} == {"NONE": 0, "LZ4": 1, "ZLIB": 2, "ZSTD": 3, "SNAPPY": 4}
    mm = PulsarApi_pb2.MessageMetadata()
    # the declared defaults: a batch count of 1 when absent (non-batched), NONE, no uncompressed size
    assert (mm.num_messages_in_batch, mm.compression, mm.uncompressed_size) == (1, 0, 0)
    assert not mm.HasField("num_messages_in_batch")  # what tells a batch of one from a single message
    assert {m.name for m in PulsarApi_pb2.DESCRIPTOR.message_types_by_name.values()} == {
        "KeyValue", "EncryptionKeys", MM, SMM, "BrokerEntryMetadata"}


def test_proto2_syntax_and_packages() -> None:
    assert MLDataFormats_pb2.DESCRIPTOR.package == ML_PACKAGE
    assert DataFormats_pb2.DESCRIPTOR.package == BK_PACKAGE
    assert PulsarApi_pb2.DESCRIPTOR.package == PULSAR_PACKAGE
    for src in SOURCES:
        assert 'syntax = "proto2";' in (PROTO_DIR / src).read_text()
    # proto2 presence: an unset optional is distinguishable from its default
    li = MLDataFormats_pb2.ManagedLedgerInfo.LedgerInfo(ledgerId=1)
    assert not li.HasField("timestamp") and not li.HasField("offloadContext")
