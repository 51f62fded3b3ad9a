"""Object-store (cold tier) protocol shared by the filesystem and S3 implementations.

Keys are S3-style strings ('/' separated). User-metadata keys are lower-cased by every
implementation, as S3 does, so callers see the same metadata whatever the backend.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from tieredcore.errors import BlobStoreError, ValidationError
from tieredcore.model import Buffer, FileSlice

Pieces = Sequence[Buffer | FileSlice]


def piece_length(p: Buffer | FileSlice) -> int:
    return p.length if isinstance(p, FileSlice) else memoryview(p).nbytes


def read_piece(p: Buffer | FileSlice) -> Buffer:
    """The bytes of a piece (for stores that cannot copy file ranges themselves)."""
    if not isinstance(p, FileSlice):
        return p
    from tieredcore.fileio import pread_exact

    fd = os.open(p.path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = pread_exact(fd, p.length, p.offset)
    finally:
        os.close(fd)
    if len(data) != p.length:
        raise BlobStoreError(f"{p.path}: {len(data)} bytes at {p.offset}, expected {p.length}")
    return data


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    last_modified: float  # seconds since the epoch
    metadata: dict[str, str] = field(default_factory=dict)  # filled by head(), empty in listings


@dataclass(frozen=True)
class ListPage:
    objects: list[ObjectInfo]
    next_token: str | None  # None: last page


@dataclass(frozen=True)
class CompletedPart:
    part_number: int
    etag: str
    size: int
    checksum_crc32: str | None = None  # S3: the part's CRC32 as the store computed it (base64), for completion


@dataclass(frozen=True)
class MultipartUploadInfo:
    key: str
    upload_id: str
    initiated: float  # seconds since the epoch


@runtime_checkable
class BlobStore(Protocol):
    """What the offloader, readers, deletion drain and reconciliation need from an object store."""

    driver: str  # OffloadDriverMetadata.name (tieredcore.cold.drivers): 'tiered-local', 'aws-s3'...
    # the offloader's fast path: upload_part copies FileSlice pieces itself (in the kernel) rather than
    # being handed block buffers
    copies_file_slices: bool
    # the offloader may send several parts of one upload at once (a remote store: requests in flight hide
    # its latency); False for a store that writes parts itself, one after another
    concurrent_parts: bool
    # get_range already reads ahead (a chunk cache with prefetch; a local file's page cache): readers
    # then fetch read_buffer windows as asked instead of large read-ahead windows of their own
    reads_ahead: bool

    def driver_properties(self) -> dict[str, str]:
        """Properties recorded in OffloadDriverMetadata (bucket, region, endpoint, root...)."""
        ...

    def put(self, key: str, data: Buffer, metadata: Mapping[str, str] | None = None, *,
            if_absent: bool = False) -> None:
        """Store the object (replacing any). ``if_absent``: create only, ObjectExistsError (nothing
        written) when the key exists — S3's conditional write, the filesystem store's lock."""
        ...

    def get(self, key: str) -> bytes:
        """Whole object; NoSuchObjectError when missing."""
        ...

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes start..end inclusive, clipped at the object's end; NoSuchObjectError when missing,
        BadRangeError when start is negative or not below the object size."""
        ...

    def head(self, key: str) -> ObjectInfo:
        """Size, mtime and user metadata; NoSuchObjectError when missing."""
        ...

    def list(self, prefix: str = "", token: str | None = None, page_size: int = 1000, *,
             start_after: str | None = None) -> ListPage:
        """One page of objects whose key starts with prefix, in key order. ``token`` (the previous
        page's next_token) continues a listing; ``start_after`` starts one after that key (S3's
        StartAfter; ignored with a token)."""
        ...

    def delete(self, keys: Sequence[str]) -> None:
        """Batch delete; keys that do not exist are fine. BlobStoreError names keys that failed."""
        ...

    def initiate_multipart(self, key: str, metadata: Mapping[str, str] | None = None) -> str: ...

    def upload_part(self, key: str, upload_id: str, part_number: int, data: Buffer | Pieces) -> CompletedPart:
        """One part: a buffer, or pieces (buffers / FileSlices) written back to back."""
        ...

    def complete_multipart(self, key: str, upload_id: str, parts: Sequence[CompletedPart]) -> None: ...

    def abort_multipart(self, key: str, upload_id: str) -> None:
        """Idempotent: an unknown or already finished upload is not an error."""
        ...

    def list_multipart_uploads(self, prefix: str = "") -> list[MultipartUploadInfo]: ...


def iter_objects(
    store: BlobStore, prefix: str = "", page_size: int = 1000, token: str | None = None, *,
    start_after: str | None = None,
) -> Iterator[ObjectInfo]:
    """Every object under prefix (after `start_after` when given), following pagination."""
    page = store.list(prefix, token, page_size, start_after=start_after)
    while True:
        yield from page.objects
        if page.next_token is None:
            return
        page = store.list(prefix, page.next_token, page_size)


MIN_PART_NUMBER = 1
MAX_PART_NUMBER = 10_000  # S3's limits on multipart part numbers


def normalize_metadata(metadata: Mapping[str, str] | None) -> dict[str, str]:
    """User metadata as every implementation stores it: str keys lower-cased (as S3 does), str values.

    ValidationError for non-str or empty keys, non-str values, or two keys equal after lower-casing.
    """
    out: dict[str, str] = {}
    for k, v in (metadata or {}).items():
        if not isinstance(k, str) or not k:
            raise ValidationError(f"user-metadata key {k!r}: must be a non-empty str")
        if not isinstance(v, str):
            raise ValidationError(f"user-metadata {k!r}: value must be a str, got {type(v).__name__}")
        lk = k.lower()
        if lk in out:
            raise ValidationError(f"user-metadata key {k!r} duplicates another key once lower-cased")
        out[lk] = v
    return out


# --- argument checks shared by the stores ---------------------------------------------------


def check_part_number(part_number: object, where: str) -> int:
    if (isinstance(part_number, bool) or not isinstance(part_number, int)
            or not MIN_PART_NUMBER <= part_number <= MAX_PART_NUMBER):
        raise ValidationError(f"part number {part_number!r} for {where}: must be {MIN_PART_NUMBER}..{MAX_PART_NUMBER}")
    return part_number


def check_parts(parts: Sequence[CompletedPart], where: str) -> None:
    if not parts:
        raise ValidationError(f"complete_multipart of {where}: no parts given")
    prev = 0
    for p in parts:
        if p.part_number <= prev:
            raise ValidationError(
                f"complete_multipart of {where}: part numbers must be strictly ascending ({p.part_number} after {prev})"
            )
        prev = p.part_number
