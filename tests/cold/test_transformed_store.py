"""Chunked, transformed objects behind the BlobStore interface: the BlobStore contract for chunked
objects (tests/support/blob_contract.py: transforms zstd and zstd+aes over the filesystem store and S3),
then byte-identical logical reads of every range for every transform, one ranged GET per read, the
manifest as the commit point, tamper and key errors, and data-key re-wrapping that rewrites only
manifests."""

from __future__ import annotations

import os
import random
import uuid as uuidlib

import pytest

from tests.support.blob_contract import ChunkedBlobStoreContract
from tieredcore.cold.backends.fs import FilesystemBlobStore
from tieredcore.cold.blob import iter_objects
from tieredcore.cold.keyring import KeyRing, KeyRingError
from tieredcore.cold.transformed import TransformedBlobStore, manifest_key
from tieredcore.errors import (
    BadRangeError,
    CorruptObjectError,
    NoSuchObjectError,
    UnsupportedVersionError,
    ValidationError,
)
from tieredcore.formats import constants as C
from tieredcore.formats.manifest import TRANSFORMED_FORMAT_VERSION, Manifest
from tieredcore.formats.transform import MIN_CHUNK_SIZE, TransformSpec
from tieredcore.model import FileSlice
from tieredcore.offload.offloader import LedgerOffloader, check_format_version

CHUNK = 4096
MOTO_PART_MIN_SIZE = 1024  # S3_UPLOAD_PART_MIN_SIZE set by conftest's moto_endpoint
TRANSFORMS = ["none", "zstd", "aes", "zstd+aes"]


@pytest.fixture(scope="module")
def ring_path(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys") / "ring"
    KeyRing.add_key(d, "k1", bits=2048)
    return d


class TestTransformedStoreContract(ChunkedBlobStoreContract):
    """Every contract case on a TransformedBlobStore of the smallest chunks (so objects span several),
    physical parts of at least moto's minimum part size."""

    def test_create_if_absent(self, store):
        """A chunked object is two physical objects, so a conditional create cannot be atomic: it is refused
        with a clear error and writes nothing (owner markers go to the wrapped store, workspace.py)."""
        with pytest.raises(ValidationError, match="conditional create"):
            store.put("marker", b"first", {"who": "a"}, if_absent=True)
        assert [o.key for o in iter_objects(store)] == []
        store.put("marker", b"first")
        with pytest.raises(ValidationError, match="conditional create"):
            store.put("marker", b"second", if_absent=True)
        assert store.get("marker") == b"first"

    @pytest.fixture(params=[("fs", "zstd"), ("fs", "zstd+aes"), ("s3", "zstd"), ("s3", "zstd+aes")],
                    ids=lambda p: f"{p[1]}-over-{p[0]}")
    def store(self, request, ring_path):
        inner_name, transform = request.param
        inner = request.getfixturevalue(f"{inner_name}_store")
        ring = KeyRing.load(ring_path) if TransformSpec(transform).encryption else None
        return TransformedBlobStore(inner, TransformSpec(transform, chunk_size=MIN_CHUNK_SIZE), ring,
                                    min_part_size=MOTO_PART_MIN_SIZE)


class CountingStore:
    """Counts the inner store's ranged GETs (what a read costs)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.ranges: list[tuple[int, int]] = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def get_range(self, key, start, end):
        self.ranges.append((start, end))
        return self.inner.get_range(key, start, end)


def _payload(n: int, compressible: bool = True) -> bytes:
    if not compressible:
        return os.urandom(n)
    rnd = random.Random(n)
    return b"".join(b"%08d %s\n" % (i, b"abcdefgh"[rnd.randrange(8):] * 3) for i in range(n // 20 + 1))[:n]


def _store(tmp_path, transform, ring_path, chunk=CHUNK, inner=None):
    inner = CountingStore(inner or FilesystemBlobStore(tmp_path / "s"))
    ring = KeyRing.load(ring_path) if "aes" in transform else None
    return TransformedBlobStore(inner, TransformSpec(transform, chunk_size=chunk), ring, prefix="p/", min_part_size=3000)


@pytest.mark.parametrize("transform", TRANSFORMS)
@pytest.mark.parametrize("size", [0, 1, CHUNK - 1, CHUNK, 3 * CHUNK + 17])
def test_put_and_every_range(tmp_path, ring_path, transform, size):
    s = _store(tmp_path, transform, ring_path)
    data = _payload(size)
    s.put("p/obj", data, {"Role": "data"})
    assert s.get("p/obj") == data
    info = s.head("p/obj")
    assert (info.size, info.metadata) == (size, {"role": "data"})
    for a in sorted({0, 1, CHUNK - 1, CHUNK, size // 2, size - 1}):
        for b in sorted({a, a + 1, CHUNK - 1, CHUNK, CHUNK + 1, size - 1, size + 100}):
            if 0 <= a < size and b >= a:
                s.inner.ranges.clear()
                assert s.get_range("p/obj", a, b) == data[a: b + 1], (a, b)
                assert len(s.inner.ranges) == 1  # adjacent chunks: one ranged GET
    if size:
        with pytest.raises(BadRangeError):
            s.get_range("p/obj", size, size + 5)
        with pytest.raises(BadRangeError, match="ends before it starts"):
            s.get_range("p/obj", size - 1, size - 2)  # a caller's bad range, not a format error


@pytest.mark.parametrize("transform", TRANSFORMS)
def test_multipart_with_pieces(tmp_path, ring_path, transform):
    s = _store(tmp_path, transform, ring_path, chunk=5000)
    data = _payload(23_456)
    f = tmp_path / "slice.bin"
    f.write_bytes(data)
    uid = s.initiate_multipart("p/big", {"a": "1"})
    parts = [s.upload_part("p/big", uid, 1, data[:7000]),
             s.upload_part("p/big", uid, 2, [data[7000:9000], FileSlice(str(f), 9000, 10_000)]),
             s.upload_part("p/big", uid, 3, data[19_000:])]
    with pytest.raises(NoSuchObjectError):  # not committed yet
        s.head("p/big")
    s.complete_multipart("p/big", uid, parts)
    assert s.get("p/big") == data
    phys = s.inner.inner.head("p/big")
    m = Manifest.from_json(s.inner.inner.get(manifest_key("p/big")), "m")
    assert phys.size == m.index.transformed_size
    assert (m.index.chunk_size, m.size, m.index.count) == (5000, len(data), 5)
    assert m.compression == ("zstd" if "zstd" in transform else "none")
    assert m.encrypted == ("aes" in transform)
    if transform == "zstd":
        assert phys.size < len(data) // 2


@pytest.mark.parametrize("transform", TRANSFORMS)
@pytest.mark.parametrize("compressible", [True, False])
@pytest.mark.parametrize("min_part", [1, 1 << 30])
def test_parts_from_a_reused_buffer(tmp_path, ring_path, transform, compressible, min_part):
    """The offloader fills one buffer block after block: a part's bytes must be taken before
    upload_part returns (whole chunks are transformed straight from the caller's buffer). Physical
    parts of one chunk each (their buffers reused for later chunks) or all held until the end."""
    s = _store(tmp_path, transform, ring_path, chunk=CHUNK)
    s.min_part_size = min_part
    data = _payload(5 * CHUNK + 123, compressible)
    buf = bytearray(2 * CHUNK + 50)
    uid = s.initiate_multipart("p/reuse")
    parts, pos, n = [], 0, 1
    while pos < len(data):
        piece = data[pos: pos + len(buf)]
        buf[: len(piece)] = piece
        view = memoryview(buf)[: len(piece)]
        parts.append(s.upload_part("p/reuse", uid, n, view))
        view.release()
        buf[:] = b"\xff" * len(buf)  # the caller reuses its buffer
        pos, n = pos + len(piece), n + 1
    s.complete_multipart("p/reuse", uid, parts)
    assert s.get("p/reuse") == data


def test_incompressible_objects_are_stored_uncompressed(tmp_path, ring_path):
    s = _store(tmp_path, "zstd", ring_path)
    data = os.urandom(3 * CHUNK)
    s.put("p/rnd", data)
    m = Manifest.from_json(s.inner.inner.get(manifest_key("p/rnd")), "m")
    assert m.compression == "none" and m.index.kind == "fixed"
    assert s.get("p/rnd") == data


def test_physical_objects_refuse_pulsar_readers(tmp_path, ring_path):
    s = _store(tmp_path, "zstd", ring_path)
    s.put("p/obj", _payload(10_000), {C.METADATA_FORMAT_VERSION_KEY: "1"})
    assert s.head("p/obj").metadata[C.METADATA_FORMAT_VERSION_KEY] == "1"  # the logical object
    for k in ("p/obj", "p/obj.manifest"):
        md = s.inner.inner.head(k).metadata
        assert md[C.METADATA_FORMAT_VERSION_KEY] == TRANSFORMED_FORMAT_VERSION
        with pytest.raises(UnsupportedVersionError):
            check_format_version(md, k)


def test_uncommitted_and_deleted(tmp_path, ring_path):
    s = _store(tmp_path, "zstd+aes", ring_path)
    uid = s.initiate_multipart("p/x")
    s.upload_part("p/x", uid, 1, _payload(9000))
    with pytest.raises(ValidationError, match="parts in order"):
        s.upload_part("p/x", uid, 3, b"zz")
    s.abort_multipart("p/x", uid)
    assert not s.list_multipart_uploads("p/")
    s.put("p/y", _payload(9000))
    assert {o.key for o in iter_objects(s, "p/")} == {"p/y", "p/y.manifest"}
    s.delete(["p/y"])
    assert list(iter_objects(s, "p/")) == []
    with pytest.raises(NoSuchObjectError, match="never committed, or deleted"):
        s.get("p/y")


def test_complete_refuses_parts_it_did_not_return(tmp_path, ring_path):
    """Completing names the parts upload_part returned; another etag or size is refused (nothing is
    committed) and the upload stays usable."""
    from tieredcore.cold.blob import CompletedPart

    s = _store(tmp_path, "zstd", ring_path)
    uid = s.initiate_multipart("p/c")
    p1 = s.upload_part("p/c", uid, 1, _payload(5000))
    p2 = s.upload_part("p/c", uid, 2, _payload(3000))
    for bad in (CompletedPart(2, "someone-else", p2.size), CompletedPart(2, p2.etag, p2.size + 1)):
        with pytest.raises(ValidationError, match="is not the part uploaded"):
            s.complete_multipart("p/c", uid, [p1, bad])
        with pytest.raises(NoSuchObjectError):
            s.head("p/c")
    s.complete_multipart("p/c", uid, [p1, p2])
    assert s.get("p/c") == _payload(5000) + _payload(3000)


def test_tampered_and_swapped_chunks_fail(tmp_path, ring_path):
    s = _store(tmp_path, "aes", ring_path)
    data = _payload(4 * CHUNK)
    s.put("p/obj", data)
    raw = bytearray(s.inner.inner.get("p/obj"))
    t = CHUNK + 28
    swapped = raw[t: 2 * t] + raw[:t] + raw[2 * t:]
    s.inner.inner.put("p/obj", bytes(swapped))
    s.forget("p/obj")
    with pytest.raises(CorruptObjectError, match="chunk 0 failed authentication"):
        s.get_range("p/obj", 0, 10)
    raw[3 * t + 40] ^= 0x01
    s.inner.inner.put("p/obj", bytes(raw))
    assert s.get_range("p/obj", 0, 10) == data[:11]
    with pytest.raises(CorruptObjectError, match="chunk 3 failed authentication"):
        s.get_range("p/obj", 3 * CHUNK, 3 * CHUNK + 5)


def test_missing_and_wrong_keys(tmp_path, ring_path):
    s = _store(tmp_path, "aes", ring_path)
    s.put("p/obj", _payload(5000))
    reader = TransformedBlobStore(s.inner.inner, TransformSpec("none"), None, prefix="p/")
    with pytest.raises(ValidationError, match="configure the key ring holding key k1"):
        reader.get("p/obj")
    other = KeyRing.add_key(tmp_path / "other", "k2", bits=2048)
    with pytest.raises(KeyRingError, match="key k1, which is not on key ring"):
        TransformedBlobStore(s.inner.inner, TransformSpec("aes"), other, prefix="p/").get("p/obj")
    with pytest.raises(ValidationError, match="key ring is required"):
        TransformedBlobStore(s.inner.inner, TransformSpec("aes"), None)


def test_rewrap_rewrites_only_manifests(tmp_path):
    ring_dir = tmp_path / "ring"
    ring = KeyRing.add_key(ring_dir, "old", bits=2048)
    inner = FilesystemBlobStore(tmp_path / "s")
    s = TransformedBlobStore(inner, TransformSpec("zstd+aes", chunk_size=CHUNK), ring, prefix="p/")
    data = _payload(20_000)
    s.put("p/obj", data)
    before = inner.get("p/obj")
    ring = KeyRing.add_key(ring_dir, "new", bits=2048)
    s2 = TransformedBlobStore(inner, TransformSpec("zstd+aes", chunk_size=CHUNK), ring, prefix="p/")
    assert s2.rewrap("p/obj") is True
    assert s2.rewrap("p/obj") is False  # idempotent
    assert inner.get("p/obj") == before  # data never rewritten
    assert Manifest.from_json(inner.get("p/obj.manifest"), "m").kek_id == "new"
    ring.retire("old")
    s3 = TransformedBlobStore(inner, TransformSpec("zstd+aes", chunk_size=CHUNK), KeyRing.load(ring_dir), prefix="p/")
    assert s3.get("p/obj") == data


@pytest.mark.parametrize("transform", ["zstd", "zstd+aes"])
def test_v1_offload_through_a_transformed_store(make_ws, ring_path, transform):
    ws = make_ws(["t/a"], ledgers=2, entries=300, entry_size="10-2000")
    info, _ = ws.ml.get_topic("t/a/topic-0000")
    lid = info.ledgerInfo[0].ledgerId
    ring = KeyRing.load(ring_path) if "aes" in transform else None
    store = TransformedBlobStore(ws.store, TransformSpec(transform, chunk_size=8192), ring, prefix="x/")
    off = LedgerOffloader(store, "x/", max_block_size=64 * 1024, checksum_chunk=4096, checkpoint_interval=2048)
    u = uuidlib.uuid4()
    with ws.hot.open_ledger(lid) as h:
        expected = [bytes(e.data) for e in h.read(0, h.last_add_confirmed)]
        off.offload(h, u)
    r = off.read_offloaded(lid, u)
    assert [bytes(e.data) for e in r.read(0, len(expected) - 1)] == expected
    for first, last in ((0, 0), (17, 17), (150, 160), (len(expected) - 1, len(expected) - 1)):
        assert [bytes(e.data) for e in r.read(first, last)] == expected[first: last + 1]
