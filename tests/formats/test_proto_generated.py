"""The committed protobuf code is what `make proto` generates, and its field numbers are Pulsar's (docs/metadata.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf.descriptor import FieldDescriptor as FD

from tieredcore.formats.proto import DataFormats_pb2, MLDataFormats_pb2

PROTO_DIR = Path(__file__).resolve().parents[2] / "tieredcore" / "formats" / "proto"
SOURCES = ["MLDataFormats.proto", "DataFormats.proto"]


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
    "int64": FD.TYPE_INT64, "enum": FD.TYPE_ENUM, "message": FD.TYPE_MESSAGE,
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

ML_PACKAGE = "org.apache.bookkeeper.mledger.proto"
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
    [(MLDataFormats_pb2, ML_PACKAGE, r) for r in ML_FIELDS] + [(DataFormats_pb2, BK_PACKAGE, r) for r in BK_FIELDS],
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


@pytest.mark.parametrize(("module", "rows"), [(MLDataFormats_pb2, ML_FIELDS), (DataFormats_pb2, BK_FIELDS)])
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


def test_proto2_syntax_and_packages() -> None:
    assert MLDataFormats_pb2.DESCRIPTOR.package == ML_PACKAGE
    assert DataFormats_pb2.DESCRIPTOR.package == BK_PACKAGE
    for src in SOURCES:
        assert 'syntax = "proto2";' in (PROTO_DIR / src).read_text()
    # proto2 presence: an unset optional is distinguishable from its default
    li = MLDataFormats_pb2.ManagedLedgerInfo.LedgerInfo(ledgerId=1)
    assert not li.HasField("timestamp") and not li.HasField("offloadContext")
