"""A BlobStore of logical objects kept as chunked, transformed physical objects (spec/04).

:class:`TransformedBlobStore` wraps any BlobStore. What callers write (the offloader's V1 data and
index objects, V2 segments) is cut into chunks of ``chunk_size`` logical bytes, each compressed and/or
encrypted on its own (:mod:`tieredcore.formats.transform`), the transformed chunks concatenated into
the physical object ``<key>`` (multipart, at least the minimum part size per part), and the
manifest ``<key>.manifest`` written last (the commit point; :mod:`tieredcore.formats.manifest`).
Reads of logical byte ranges fetch only the chunks overlapping them, adjacent chunks in one ranged GET.

- ``head`` / ``get`` / ``get_range`` serve the logical object (size and user metadata from the manifest);
  a key without a manifest does not exist (an upload that crashed before its commit point).
- ``delete`` removes the manifest first (the logical object is gone at once), then the chunks.
- ``list`` and ``list_multipart_uploads`` pass through: reconciliation sees every physical object,
  manifests included (``<key>.manifest`` parses as part of ``<key>``'s group, formats/keys.py).
- Manifests are cached (bounded, LRU) with the data key unwrapped once per miss.

A write holds one chunk and one physical part in memory (once uploaded, the part's buffers hold the
next chunks). Multipart uploads live in this process (the
writer initiates, uploads and completes in one run, as every writer here does).
"""

from __future__ import annotations

import threading
import uuid as uuidlib
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tieredcore.cold.blob import (
    BlobStore,
    CompletedPart,
    ListPage,
    MultipartUploadInfo,
    ObjectInfo,
    Pieces,
    normalize_metadata,
    read_piece,
)
from tieredcore.cold.chunk_cache import ChunkCache
from tieredcore.cold.keyring import KeyRing
from tieredcore.errors import (
    BadRangeError,
    CorruptObjectError,
    FormatError,
    NoSuchObjectError,
    NoSuchUploadError,
    NotFoundError,
    ValidationError,
)
from tieredcore.formats import constants as C
from tieredcore.formats.chunks import ChunkIndex
from tieredcore.formats.manifest import MANIFEST_SUFFIX, TRANSFORMED_FORMAT_VERSION, Manifest
from tieredcore.formats.transform import ChunkTransformer, TransformSpec, new_data_key, worth_compressing
from tieredcore.model import Buffer

__all__ = ["TransformedBlobStore", "manifest_key"]

S3_MIN_PART = 5 * 1024 * 1024
DEFAULT_MANIFEST_CACHE = 1024


def manifest_key(key: str) -> str:
    return key + MANIFEST_SUFFIX


def _physical_metadata(metadata: Mapping[str, str]) -> dict[str, str]:
    """What the physical objects carry: the logical metadata with the format version replaced, so a
    Pulsar reader refuses them (it would misread transformed bytes)."""
    md = dict(metadata)
    md[C.METADATA_FORMAT_VERSION_KEY] = TRANSFORMED_FORMAT_VERSION
    return md


@dataclass
class _Upload:
    key: str
    inner_id: str
    metadata: dict[str, str]
    next_part: int = 1
    pending: bytearray = field(default_factory=bytearray)  # logical bytes not yet a whole chunk
    out: list = field(default_factory=list)  # transformed chunks not yet uploaded
    spare: list[bytearray] = field(default_factory=list)  # buffers of uploaded chunks, to be reused
    out_bytes: int = 0
    sizes: list[int] = field(default_factory=list)
    parts: list[CompletedPart] = field(default_factory=list)  # the inner store's (physical) parts
    given: list[CompletedPart] = field(default_factory=list)  # the logical parts upload_part returned
    logical: int = 0
    transformer: ChunkTransformer | None = None
    data_key: str | None = None  # wrapped
    dek: bytes | None = None  # unwrapped, this process only


@dataclass(frozen=True)
class _Opened:
    manifest: Manifest
    transformer: ChunkTransformer
    last_modified: float


class TransformedBlobStore:
    copies_file_slices = False  # logical bytes are transformed here: the kernel copy fast path is off
    concurrent_parts = False  # logical parts are chunked in order
    reads_ahead = True  # the chunk cache prefetches the chunks after each access

    def __init__(self, inner: BlobStore, spec: TransformSpec, keyring: KeyRing | None = None, *, prefix: str = "",
                 min_part_size: int = S3_MIN_PART, manifest_cache: int = DEFAULT_MANIFEST_CACHE,
                 chunk_cache: ChunkCache | None = None) -> None:
        if spec.encryption and keyring is None:
            raise ValidationError(f"transform {spec.name} encrypts: a key ring is required")
        self.inner = inner
        self.spec = spec
        self.keyring = keyring
        self.prefix = prefix
        self.driver = inner.driver
        self.min_part_size = min_part_size
        self._uploads: dict[str, _Upload] = {}
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, _Opened] = OrderedDict()
        self._cache_size = manifest_cache
        self.requests = 0  # ranged GETs of chunks (observability and tests)
        self.cache = chunk_cache
        self._scope = f"{inner.driver}:{sorted(inner.driver_properties().items())}:"

    def driver_properties(self) -> dict[str, str]:
        """The inner store's, marked chunked (readers must go through manifests) with the key ring."""
        from tieredcore.cold.location import CHUNKED_PROPERTY, KEY_RING_PROPERTY, TRANSFORM_PROPERTY

        props = {**self.inner.driver_properties(), CHUNKED_PROPERTY: "true"}
        if self.keyring is not None:
            props[KEY_RING_PROPERTY] = str(self.keyring.path)
        if self.spec.active:  # what objects written here are (compaction re-transforms others)
            props[TRANSFORM_PROPERTY] = self.spec.name
        return props

    def stored_bytes(self, key: str) -> int:
        """Bytes the object takes in the store: its transformed chunks and its manifest."""
        m = self.open(key).manifest
        return m.index.transformed_size + len(m.to_json())

    def object_id(self, key: str) -> str:
        return key[len(self.prefix):] if self.prefix and key.startswith(self.prefix) else key

    # -- writing ------------------------------------------------------------------------------

    def _start(self, key: str, metadata: Mapping[str, str] | None, inner_id: str) -> _Upload:
        up = _Upload(key, inner_id, normalize_metadata(metadata))
        if self.spec.encryption:
            assert self.keyring is not None
            up.dek = new_data_key()
            up.data_key = self.keyring.wrap(up.dek)
        return up

    def _feed(self, up: _Upload, data: Buffer, final: bool) -> None:
        """Cut ``data`` into chunks and transform them. Whole chunks are transformed straight from the
        caller's buffer; only a chunk split across calls is gathered in ``pending`` (copying the whole
        input through a bytearray and deleting from its front cost more than AES-GCM itself)."""
        mv = memoryview(data)
        if mv.ndim != 1 or mv.itemsize != 1:
            mv = mv.cast("B")
        up.logical += len(mv)
        cs = self.spec.chunk_size
        pos = 0
        if up.pending:  # first complete the chunk an earlier call began
            pos = min(cs - len(up.pending), len(mv))
            up.pending += mv[:pos]
            if len(up.pending) < cs and not final:
                return
            self._emit(up, up.pending)
            up.pending = bytearray()
        while len(mv) - pos >= cs or (final and pos < len(mv)):
            chunk = mv[pos: pos + cs]
            self._emit(up, chunk)
            pos += len(chunk)
        if pos < len(mv):
            up.pending += mv[pos:]

    def _emit(self, up: _Upload, chunk: memoryview | bytearray) -> None:
        if len(up.sizes) == 0:
            self._decide(up, chunk)
        assert up.transformer is not None
        spare = up.spare.pop() if up.spare else None
        t = up.transformer.apply(len(up.sizes), chunk, into=spare)
        if t is chunk and not isinstance(chunk, bytearray):
            # untransformed: a view of the caller's buffer, which it reuses once we return
            if spare is not None and len(spare) == len(chunk):
                spare[:] = chunk
                t = spare
            else:
                t = bytearray(chunk)  # a spare once uploaded
        up.sizes.append(len(t))
        up.out.append(t)
        up.out_bytes += len(t)
        if up.inner_id and up.out_bytes >= self.min_part_size:  # a multipart upload (put writes at the end)
            self._flush_part(up)

    def _decide(self, up: _Upload, first_chunk: Buffer) -> None:
        """Compress this object or not, measured on its first chunk (never double-compress)."""
        compress = self.spec.compression and worth_compressing(first_chunk, self.spec.level)
        up.transformer = ChunkTransformer(self.object_id(up.key), compress=compress, data_key=up.dek,
                                          level=self.spec.level)

    def _flush_part(self, up: _Upload) -> None:
        if not up.out:
            return
        part = self.inner.upload_part(up.key, up.inner_id, len(up.parts) + 1, up.out)
        up.parts.append(part)
        # the store has taken the bytes: their buffers hold the next chunks (allocating and faulting in
        # fresh chunk-sized buffers costs about twice what AES-GCM takes to fill them)
        up.spare = [b for b in up.out if isinstance(b, bytearray)]
        up.out, up.out_bytes = [], 0

    def _manifest(self, up: _Upload) -> Manifest:
        assert up.transformer is not None or up.logical == 0
        compress = bool(up.transformer is not None and up.transformer.compress)
        index = ChunkIndex.of(self.spec.chunk_size, up.logical, up.sizes)
        return Manifest(self.object_id(up.key), index, "zstd" if compress else "none", up.data_key, up.metadata)

    def put(self, key: str, data: Buffer, metadata: Mapping[str, str] | None = None, *,
            if_absent: bool = False) -> None:
        if if_absent:
            # a chunked object is two physical objects (chunks, then the manifest): a conditional create
            # cannot be made atomic over both without its chunks being overwritten by a losing writer
            raise ValidationError(f"{key}: a conditional create (if_absent) is not supported on a store of "
                                  "chunked objects; write such objects (owner markers) to the wrapped store")
        up = self._start(key, metadata, "")
        self._feed(up, data, final=True)
        if up.transformer is None:  # empty object
            self._decide(up, b"")
        self.inner.put(key, b"".join(up.out), _physical_metadata(up.metadata))
        self._commit(up)

    def _commit(self, up: _Upload) -> None:
        m = self._manifest(up)
        # the manifest carries the object's metadata too (owner, cluster, topic: ownership checks of any
        # key of the group, e.g. by reconciliation, find them)
        self.inner.put(manifest_key(up.key), m.to_json(), _physical_metadata(up.metadata))
        with self._lock:
            self._cache.pop(up.key, None)

    def initiate_multipart(self, key: str, metadata: Mapping[str, str] | None = None) -> str:
        md = normalize_metadata(metadata)
        inner_id = self.inner.initiate_multipart(key, _physical_metadata(md))
        up = self._start(key, md, inner_id)
        uid = f"t-{uuidlib.uuid4().hex}"
        with self._lock:
            self._uploads[uid] = up
        return uid

    def _upload(self, key: str, upload_id: str) -> _Upload:
        with self._lock:
            up = self._uploads.get(upload_id)
        if up is None or up.key != key:
            raise NoSuchUploadError(f"no upload {upload_id} of {key} in this process")
        return up

    def upload_part(self, key: str, upload_id: str, part_number: int, data: Buffer | Pieces) -> CompletedPart:
        up = self._upload(key, upload_id)
        if part_number != up.next_part:
            raise ValidationError(f"{key}: transformed uploads take parts in order: got part {part_number}, "
                                  f"expected {up.next_part}")
        pieces = data if isinstance(data, list | tuple) else [data]
        n = 0
        for p in pieces:
            b = read_piece(p)
            n += len(memoryview(b))
            self._feed(up, b, final=False)
        up.next_part += 1
        part = CompletedPart(part_number, f"logical-{part_number}", n)
        up.given.append(part)
        return part

    def complete_multipart(self, key: str, upload_id: str, parts: Sequence[CompletedPart]) -> None:
        up = self._upload(key, upload_id)
        if [p.part_number for p in parts] != list(range(1, up.next_part)):
            raise ValidationError(f"{key}: completing with parts {[p.part_number for p in parts]}, uploaded "
                                  f"1..{up.next_part - 1}")
        for p, mine in zip(parts, up.given, strict=True):  # as any store: only the parts it was given
            if (p.etag, p.size) != (mine.etag, mine.size):
                raise ValidationError(f"{key}: part {p.part_number} (etag {p.etag}, {p.size} bytes) is not the "
                                      f"part uploaded (etag {mine.etag}, {mine.size} bytes)")
        self._feed(up, b"", final=True)
        if up.transformer is None:
            self._decide(up, b"")
        self._flush_part(up)
        if not up.parts:  # an empty object: S3 needs one part
            up.parts.append(self.inner.upload_part(key, up.inner_id, 1, b""))
        self.inner.complete_multipart(key, up.inner_id, up.parts)
        with self._lock:
            self._uploads.pop(upload_id, None)
        self._commit(up)

    def abort_multipart(self, key: str, upload_id: str) -> None:
        with self._lock:
            up = self._uploads.pop(upload_id, None)
        if up is not None:
            self.inner.abort_multipart(key, up.inner_id)
        else:  # an upload of another process (reconciliation): the inner id
            self.inner.abort_multipart(key, upload_id)

    def list_multipart_uploads(self, prefix: str = "") -> list[MultipartUploadInfo]:
        return self.inner.list_multipart_uploads(prefix)

    # -- reading ------------------------------------------------------------------------------

    def open(self, key: str) -> _Opened:
        """The object's manifest and transformer (cached; the data key unwrapped once per miss)."""
        with self._lock:
            got = self._cache.get(key)
            if got is not None:
                self._cache.move_to_end(key)
                return got
        mkey = manifest_key(key)
        try:
            info = self.inner.head(mkey)
            raw = self.inner.get(mkey)
        except NoSuchObjectError:
            raise NoSuchObjectError(f"{key}: no such object (no {mkey}: never committed, or deleted)") from None
        m = Manifest.from_json(raw, mkey)
        if m.object_id != self.object_id(key):
            raise FormatError(f"{mkey}: manifest of object {m.object_id!r}, not {self.object_id(key)!r}")
        dek = None
        if m.encrypted:
            if self.keyring is None:
                raise ValidationError(f"{key} is encrypted: configure the key ring holding key {m.kek_id}")
            dek = self.keyring.unwrap(m.data_key or "")
        opened = _Opened(m, ChunkTransformer(m.object_id, compress=m.compression == "zstd", data_key=dek),
                         info.last_modified)
        with self._lock:
            self._cache[key] = opened
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return opened

    def forget(self, key: str) -> None:
        with self._lock:
            self._cache.pop(key, None)

    def head(self, key: str) -> ObjectInfo:
        o = self.open(key)
        return ObjectInfo(key, o.manifest.size, o.last_modified, dict(o.manifest.metadata))

    def check_stored(self, key: str) -> None:
        """The object's chunks exist and have the size its manifest gives them (a HEAD of the stored
        object): what a check that does not read the data sees of it. The manifest alone answers
        ``head``, so a chunks object deleted or cut short behind it shows only here or on a read.
        NoSuchObjectError / CorruptObjectError naming the key otherwise."""
        want = self.open(key).manifest.index.transformed_size
        try:
            got = self.inner.head(key).size
        except NotFoundError:
            raise NoSuchObjectError(f"{key}: its chunks are missing (the manifest {manifest_key(key)} remains)") from None
        if got != want:
            raise CorruptObjectError(f"{key}: {got} bytes of chunks stored, its manifest says {want}")

    def get(self, key: str) -> bytes:
        o = self.open(key)
        if o.manifest.size == 0:
            return b""
        return self.get_range(key, 0, o.manifest.size - 1)

    def get_range(self, key: str, start: int, end: int) -> bytes:
        o = self.open(key)
        size = o.manifest.size
        if start < 0 or start >= size:
            raise BadRangeError(f"{key}: range start {start} outside 0..{size - 1}")
        if end < start:  # the caller's mistake, as every store reports it (not the chunk index's FormatError)
            raise BadRangeError(f"{key}: range {start}-{end} ends before it starts")
        end = min(end, size - 1)
        idx = o.manifest.index
        ids = idx.chunk_ids(start, end + 1)

        def load(run: Sequence[int]) -> dict[int, bytes]:
            a, b = idx.physical_range(run[0], run[-1])
            raw = self.inner.get_range(key, a, b - 1)  # adjacent chunks: one ranged GET
            with self._lock:
                self.requests += 1
            if len(raw) != b - a:
                raise FormatError(f"{key}: short read of transformed bytes {a}-{b - 1}: {len(raw)} bytes")
            mv = memoryview(raw)
            out = {}
            for i in run:
                c = idx.chunk(i)
                lo = c.transformed_position - a
                out[i] = bytes(o.transformer.invert(i, mv[lo: lo + c.transformed_size], c.original_size))
            return out

        if self.cache is not None:
            # objects are immutable under their keys; the transformed size tells a re-written one apart
            chunks = self.cache.get_chunks(f"{self._scope}{key}#{idx.transformed_size}", list(ids), load,
                                           last_chunk=idx.count - 1, chunk_size=idx.chunk_size)
        else:
            chunks = load(list(ids))
        first = ids[0] * idx.chunk_size
        joined = b"".join(chunks[i] for i in ids)
        return joined[start - first: end + 1 - first]

    def list(self, prefix: str = "", token: str | None = None, page_size: int = 1000, *,
             start_after: str | None = None) -> ListPage:
        return self.inner.list(prefix, token, page_size, start_after=start_after)

    def delete(self, keys: Sequence[str]) -> None:
        logical = [k for k in keys if not k.endswith(MANIFEST_SUFFIX)]
        self.inner.delete([manifest_key(k) for k in logical] + [k for k in keys if k.endswith(MANIFEST_SUFFIX)])
        self.inner.delete(logical)
        with self._lock:
            for k in logical:
                self._cache.pop(k, None)

    # -- key rotation -------------------------------------------------------------------------

    def rewrap(self, key: str, kek_id: str | None = None) -> bool:
        """Re-wrap the object's data key under ``kek_id`` (default: the ring's active key), rewriting
        only its manifest. False when nothing had to change (idempotent: resumable after a crash)."""
        if self.keyring is None:
            raise ValidationError("re-wrapping data keys needs a key ring")
        target = kek_id or self.keyring.active_id
        self.forget(key)
        o = self.open(key)
        m = o.manifest
        if not m.encrypted or m.kek_id == target:
            return False
        dek = self.keyring.unwrap(m.data_key or "")
        self.inner.put(manifest_key(key), m.with_data_key(self.keyring.wrap(dek, target)).to_json(),
                       _physical_metadata(m.metadata))
        self.forget(key)
        try:  # deleted meanwhile (a drain): do not leave a manifest without its chunks
            self.inner.head(key)
        except NoSuchObjectError:
            self.inner.delete([manifest_key(key)])
        return True

    def stats(self) -> dict[str, Any]:
        with self._lock:
            out: dict[str, Any] = {"manifests_cached": len(self._cache), "chunk_requests": self.requests}
        if self.cache is not None:
            out["chunk_cache"] = self.cache.describe()
        return out
