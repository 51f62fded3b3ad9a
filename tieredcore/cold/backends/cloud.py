"""What the Azure Blob and GCS stores share: argument checks, the record of an in-progress multipart upload,
and the one reserved key area.

Neither service has S3's "multipart upload" object with an id, so both keep one small marker object per
upload under ``.tiered/uploads/<upload_id>`` (no user key may start with ``.tiered/``; listings hide the
area). The marker's user metadata holds the target key, the object's metadata and the start time, so
an upload can be listed, completed with the right metadata, told apart from an unknown id, and aborted.
"""

from __future__ import annotations

import base64
import binascii
import json
import secrets
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from tieredcore.cold.blob import MultipartUploadInfo, Pieces, read_piece
from tieredcore.errors import BlobStoreError, NoSuchUploadError, ValidationError
from tieredcore.model import Buffer

INTERNAL_PREFIX = ".tiered/"
UPLOADS_PREFIX = INTERNAL_PREFIX + "uploads/"
UPLOAD_META = "tieredupload"  # marker metadata name (a C# identifier, as Azure requires)
_UPLOAD_ID_LEN = 32  # hex digits


def new_upload_id() -> str:
    return secrets.token_hex(_UPLOAD_ID_LEN // 2)


def is_upload_id(upload_id: object) -> bool:
    return (isinstance(upload_id, str) and len(upload_id) == _UPLOAD_ID_LEN
            and all(c in "0123456789abcdef" for c in upload_id))


def marker_key(upload_id: str) -> str:
    return UPLOADS_PREFIX + upload_id


def is_internal(key: str) -> bool:
    return key.startswith(INTERNAL_PREFIX)


def check_key(key: object, where: str) -> str:
    """A user key: non-empty str, not in the reserved area."""
    if not isinstance(key, str) or not key:
        raise ValidationError(f"{where}: object key must be a non-empty str, got {key!r}")
    if is_internal(key):
        raise ValidationError(f"{where}: key {key!r} is in the store's reserved area {INTERNAL_PREFIX!r}")
    return key


def part_body(data: Buffer | Pieces) -> bytes:
    """One request body from a buffer or pieces (FileSlices are read here)."""
    if isinstance(data, bytes):
        return data
    if isinstance(data, bytearray | memoryview):
        return bytes(data)
    return b"".join(bytes(memoryview(read_piece(p))) for p in data)


def check_range(start: int, end: int, where: str) -> None:
    from tieredcore.errors import BadRangeError

    if start < 0 or end < start:
        raise BadRangeError(f"bad range {start}-{end} for {where}")


@dataclass(frozen=True)
class UploadRecord:
    """What a marker object says about one multipart upload."""

    upload_id: str
    key: str
    metadata: dict[str, str]
    initiated: float  # seconds since the epoch

    @classmethod
    def start(cls, key: str, metadata: Mapping[str, str]) -> UploadRecord:
        return cls(new_upload_id(), key, dict(metadata), time.time())

    def marker_metadata(self) -> dict[str, str]:
        """ASCII-only (HTTP header) encoding of the record."""
        doc = json.dumps({"k": self.key, "m": self.metadata, "t": self.initiated}, separators=(",", ":"))
        return {UPLOAD_META: base64.urlsafe_b64encode(doc.encode()).decode()}

    @classmethod
    def from_marker(cls, upload_id: str, metadata: Mapping[str, str] | None, where: str) -> UploadRecord:
        raw = {k.lower(): v for k, v in (metadata or {}).items()}.get(UPLOAD_META)
        try:
            doc = json.loads(base64.urlsafe_b64decode(raw or ""))
            return cls(upload_id, str(doc["k"]), {str(k): str(v) for k, v in doc["m"].items()}, float(doc["t"]))
        except (ValueError, KeyError, TypeError, AttributeError, binascii.Error) as e:
            raise BlobStoreError(f"{where}: upload marker {marker_key(upload_id)!r} is unreadable ({e})") from None


def upload_record(where: str, key: str, upload_id: object, op: str,
                  marker_metadata: Callable[[], Mapping[str, str] | None]) -> UploadRecord:
    """The record of upload ``upload_id`` of ``key`` in the store at ``where``; ``marker_metadata()`` reads
    its marker's metadata (None: no marker). NoSuchUploadError for an unknown id or another key's upload."""
    missing = NoSuchUploadError(f"{where}/{key}: {op}: no multipart upload {upload_id!r}")
    if not is_upload_id(upload_id):
        raise missing
    assert isinstance(upload_id, str)
    metadata = marker_metadata()
    if metadata is None:
        raise missing
    rec = UploadRecord.from_marker(upload_id, metadata, where)
    if rec.key != key:
        raise NoSuchUploadError(f"{where}/{key}: {op}: upload {upload_id!r} is one of key {rec.key!r}")
    return rec


def uploads_listed(markers: Iterable[tuple[str, Mapping[str, str] | None]], prefix: str,
                   where: str) -> list[MultipartUploadInfo]:
    """The uploads of keys under ``prefix`` from a listing of the markers (name, metadata), in S3's order."""
    out: list[MultipartUploadInfo] = []
    for name, metadata in markers:
        upload_id = name[len(UPLOADS_PREFIX):]
        if not is_upload_id(upload_id):
            continue
        rec = UploadRecord.from_marker(upload_id, metadata, where)
        if rec.key.startswith(prefix):
            out.append(MultipartUploadInfo(key=rec.key, upload_id=upload_id, initiated=rec.initiated))
    return sorted(out, key=lambda u: (u.key, u.initiated, u.upload_id))


def encode_token(service_token: str | None, key: str | None) -> str:
    """A listing's continuation token: the service's own token and a key, as opaque text."""
    return base64.urlsafe_b64encode(json.dumps([service_token, key]).encode()).decode()


def decode_token(token: str) -> tuple[str | None, str | None]:
    try:
        pair = json.loads(base64.urlsafe_b64decode(token.encode()))
        if isinstance(pair, list) and len(pair) == 2 and all(x is None or isinstance(x, str) for x in pair):
            return pair[0], pair[1]
    except (ValueError, TypeError, binascii.Error):
        pass
    raise ValidationError(f"list: {token!r} is not a continuation token of this store")
