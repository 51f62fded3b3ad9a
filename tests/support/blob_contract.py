"""The BlobStore contract as a base class: every object store's test module extends it.

A backend's test class (``class TestXContract(BlobStoreContract)``) overrides the ``store`` fixture to
give the store under test and sets the capability flags below where it legitimately differs from a
plain object store. Today: the filesystem store (tests/cold/test_fs_store.py), S3 on moto
(test_s3_store.py), Azure Blob on Azurite and GCS on gcp-storage-emulator (test_cloud_stores.py), and
the chunked TransformedBlobStore over the filesystem store and S3 (test_transformed_store.py, through
:class:`ChunkedBlobStoreContract`).

The class name does not start with ``Test``: pytest collects only the subclasses.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import ClassVar

import pytest

from tieredcore.cold.blob import BlobStore, CompletedPart, ListPage, iter_objects
from tieredcore.errors import (
    BadRangeError,
    NoSuchObjectError,
    NoSuchUploadError,
    ObjectExistsError,
    TieredError,
    ValidationError,
)
from tieredcore.formats.manifest import MANIFEST_SUFFIX
from tieredcore.formats.transform import MIN_CHUNK_SIZE
from tieredcore.model import FileSlice

PART = 1500  # >= moto's lowered minimum part size (conftest.MOTO_PART_MIN_SIZE)
SPAN = MIN_CHUNK_SIZE  # an object of several of these spans several chunks of a chunked store


def payload(n: int, seed: int = 0) -> bytes:
    return bytes((i * 31 + seed) % 251 for i in range(n))


class BlobStoreContract:
    """What every BlobStore must do (tieredcore/cold/blob.py), written once."""

    # --- capability flags: where a store legitimately differs from a plain object store ----------

    # each object K is kept as K plus its manifest K.manifest, and listings pass the physical objects
    # through (reconciliation sees both; docs/formats.md "Chunked objects")
    keeps_manifests: ClassVar[bool] = False
    # list_multipart_uploads shows the id initiate_multipart returned (a chunked store lists the
    # uploads of the store it wraps, under that store's ids; abort_multipart accepts either)
    lists_returned_upload_ids: ClassVar[bool] = True
    # upload_part accepts parts in any order (a chunked store cuts the logical bytes into chunks in
    # order, so it refuses a part out of turn and declares no concurrent parts)
    takes_parts_in_any_order: ClassVar[bool] = True

    @pytest.fixture
    def store(self) -> BlobStore:
        """The store under test, empty: each backend's contract class overrides this fixture."""
        raise NotImplementedError(f"{type(self).__name__} must override the `store` fixture")

    # --- hooks the flags call for --------------------------------------------------------------

    def listed(self, keys: Iterable[str]) -> list[str]:
        """The keys a listing shows for these objects, in key order."""
        shown = set(keys)
        if self.keeps_manifests:
            shown |= {k + MANIFEST_SUFFIX for k in shown}
        return sorted(shown)

    def listed_size(self, store: BlobStore, key: str, data: bytes) -> int:
        """The size a listing gives for object ``key`` holding ``data``: its length, for a plain store."""
        return len(data)

    def listing(self, store: BlobStore, prefix: str = "") -> list[str]:
        page: ListPage = store.list(prefix)
        return [o.key for o in page.objects]

    # --- the contract ----------------------------------------------------------------------------

    def test_is_a_blob_store(self, store):
        assert isinstance(store, BlobStore)
        assert store.driver in ("tiered-local", "aws-s3", "azureblob", "google-cloud-storage")
        assert isinstance(store.driver_properties(), dict)

    def test_declares_its_fast_paths(self, store):
        for flag in ("copies_file_slices", "concurrent_parts", "reads_ahead"):
            assert isinstance(getattr(store, flag), bool), flag
        if self.keeps_manifests:  # its physical bytes are transformed ones: no kernel copy of the caller's
            assert store.copies_file_slices is False
        if not self.takes_parts_in_any_order:
            assert store.concurrent_parts is False

    def test_put_get_head_round_trip_with_metadata(self, store):
        data = payload(5000)
        before = time.time()
        store.put("dir/sub/obj-1", data, {"Format-Version": "1", "x-MiXed": "Value With Case"})
        assert store.get("dir/sub/obj-1") == data
        info = store.head("dir/sub/obj-1")
        assert info.key == "dir/sub/obj-1"
        assert info.size == 5000
        assert info.metadata == {"format-version": "1", "x-mixed": "Value With Case"}
        assert before - 5 <= info.last_modified <= time.time() + 5

    @pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
    def test_put_accepts_buffers(self, store, kind):
        store.put("buf", kind(b"hello world"))
        assert store.get("buf") == b"hello world"

    def test_empty_object(self, store):
        store.put("empty", b"")
        assert store.get("empty") == b""
        assert store.head("empty").size == 0
        with pytest.raises(BadRangeError):
            store.get_range("empty", 0, 0)

    def test_overwrite_replaces_data_and_metadata(self, store):
        store.put("k", b"first version", {"a": "1"})
        store.put("k", b"second", {"b": "2"})
        assert store.get("k") == b"second"
        info = store.head("k")
        assert info.size == 6
        assert info.metadata == {"b": "2"}
        store.put("k", b"third")
        assert store.head("k").metadata == {}

    def test_create_if_absent(self, store):
        """The conditional write the owner markers use: the first creator wins, the rest change nothing."""
        store.put("marker", b"first", {"who": "a"}, if_absent=True)
        with pytest.raises(ObjectExistsError):
            store.put("marker", b"second", {"who": "b"}, if_absent=True)
        assert store.get("marker") == b"first" and store.head("marker").metadata == {"who": "a"}
        store.put("marker", b"replaced")  # an unconditional put still replaces
        assert store.get("marker") == b"replaced"

    def test_missing_object(self, store):
        with pytest.raises(NoSuchObjectError):
            store.get("missing/key")
        with pytest.raises(NoSuchObjectError):
            store.head("missing/key")
        with pytest.raises(NoSuchObjectError):
            store.get_range("missing/key", 0, 10)

    def test_get_range(self, store):
        data = payload(1000, seed=7)
        store.put("r", data)
        assert store.get_range("r", 10, 19) == data[10:20]  # inner, inclusive end
        assert store.get_range("r", 990, 5000) == data[990:]  # clipped at the end
        assert store.get_range("r", 0, 0) == data[:1]  # single byte
        assert store.get_range("r", 999, 999) == data[999:]  # last byte
        assert store.get_range("r", 0, 999) == data  # whole object
        with pytest.raises(BadRangeError):
            store.get_range("r", 1000, 1100)  # starts at the end
        with pytest.raises(BadRangeError):
            store.get_range("r", 5000, 6000)  # starts beyond the end
        with pytest.raises(BadRangeError):
            store.get_range("r", -1, 10)
        with pytest.raises(BadRangeError):
            store.get_range("r", 10, 5)

    def test_get_range_across_spans(self, store):
        """Ranges are over the object's bytes wherever they fall (a chunked store: its logical bytes,
        across chunk boundaries, through a multipart upload as through a put)."""
        data = payload(3 * SPAN + 17, seed=3)
        store.put("spans/put", data)
        up = store.initiate_multipart("spans/mp")
        parts = [store.upload_part("spans/mp", up, 1, data[:2 * SPAN - 5]),
                 store.upload_part("spans/mp", up, 2, data[2 * SPAN - 5:])]
        store.complete_multipart("spans/mp", up, parts)
        for key in ("spans/put", "spans/mp"):
            assert store.head(key).size == len(data) and store.get(key) == data
            for a, b in ((SPAN - 1, SPAN), (SPAN - 3, 2 * SPAN + 2), (2 * SPAN, 3 * SPAN - 1),
                         (3 * SPAN, 3 * SPAN + 16), (5, 10 * SPAN)):
                assert store.get_range(key, a, b) == data[a: b + 1], (key, a, b)
            with pytest.raises(BadRangeError):
                store.get_range(key, len(data), len(data) + 1)

    def test_list_prefix_and_order(self, store):
        keys = ["b/2", "a/1", "a/3", "a/2", "ab", "a-z", "c", "b/1/x"]
        for k in keys:
            store.put(k, k.encode())
        assert self.listing(store) == self.listed(keys)
        page = store.list("a/")
        assert [o.key for o in page.objects] == self.listed(["a/1", "a/2", "a/3"])
        assert page.next_token is None
        sizes = {o.key: o.size for o in page.objects}
        assert [sizes[k] for k in ("a/1", "a/2", "a/3")] == [self.listed_size(store, k, k.encode())
                                                             for k in ("a/1", "a/2", "a/3")]
        assert all(o.last_modified > 0 and o.metadata == {} for o in page.objects)
        assert self.listing(store, "a") == self.listed(["a-z", "a/1", "a/2", "a/3", "ab"])
        assert self.listing(store, "b/1") == self.listed(["b/1/x"])
        assert self.listing(store, "b/1/") == self.listed(["b/1/x"])
        assert store.list("nothing-here").objects == []
        assert store.list("a/4").objects == []
        assert store.list("nothing-here").next_token is None

    def test_list_empty_store(self, store):
        page = store.list()
        assert page.objects == [] and page.next_token is None

    def test_list_pagination(self, store):
        keys = [f"p/k{i}" for i in range(7)] + ["q/other"]
        for k in keys:
            store.put(k, b"x")
        seen: list[str] = []
        tokens: list[str] = []
        token = None
        while True:
            page = store.list("p/", token, page_size=2)
            assert len(page.objects) <= 2
            seen += [o.key for o in page.objects]
            if page.next_token is None:
                break
            assert isinstance(page.next_token, str)
            tokens.append(page.next_token)
            token = page.next_token
        assert seen == self.listed(keys[:7])  # every key exactly once, in order
        assert len(tokens) >= 3
        assert [o.key for o in iter_objects(store, "p/", page_size=3)] == self.listed(keys[:7])

    def test_list_start_after(self, store):
        keys = [f"p/k{i}" for i in range(7)] + ["p/j", "p/z", "q/other"]
        for k in keys:
            store.put(k, b"x")
        under = self.listed(k for k in keys if k.startswith("p/"))
        for after in ("p/k2", "p/k25", "p/", "p/a", "p/zz", "o"):
            expected = [k for k in under if k > after]
            assert [o.key for o in iter_objects(store, "p/", page_size=2, start_after=after)] == expected, after
        after_k0 = [k for k in under if k > "p/k0"]
        page = store.list("p/", page_size=3, start_after="p/k0")
        assert [o.key for o in page.objects] == after_k0[:3] and page.next_token is not None
        # a continuation token takes over from start_after
        nxt = store.list("p/", page.next_token, page_size=3, start_after="p/k0")
        assert [o.key for o in nxt.objects] == after_k0[3:6]

    def test_delete(self, store):
        for k in ("d/1", "d/2", "d/3", "keep"):
            store.put(k, b"x")
        store.delete(["d/1", "d/3", "d/never-existed", "nope/at/all"])
        assert self.listing(store) == self.listed(["d/2", "keep"])
        with pytest.raises(NoSuchObjectError):
            store.get("d/1")
        store.delete([])
        store.delete(["d/2", "d/2"])
        assert self.listing(store) == self.listed(["keep"])

    def test_multipart_three_parts(self, store):
        parts_data = [payload(PART, 1), payload(PART, 2), payload(700, 3)]
        uid = store.initiate_multipart("mp/obj", {"Format-Version": "2"})
        parts = [store.upload_part("mp/obj", uid, i + 1, d) for i, d in enumerate(parts_data)]
        assert [p.part_number for p in parts] == [1, 2, 3]
        assert [p.size for p in parts] == [PART, PART, 700]
        store.complete_multipart("mp/obj", uid, parts)
        assert store.get("mp/obj") == b"".join(parts_data)
        info = store.head("mp/obj")
        assert info.size == 2 * PART + 700
        assert info.metadata == {"format-version": "2"}
        assert store.list_multipart_uploads("mp/") == []

    def test_multipart_memoryview_parts(self, store):
        buf = bytearray(payload(2 * PART, 9))
        mv = memoryview(buf)
        uid = store.initiate_multipart("mv")
        parts = [store.upload_part("mv", uid, 1, mv[:PART]), store.upload_part("mv", uid, 2, mv[PART:])]
        store.complete_multipart("mv", uid, parts)
        assert store.get("mv") == bytes(buf)

    def test_parts_out_of_order(self, store):
        """Parts uploaded out of turn: the object is still the parts in part-number order; a store that
        cuts the bytes in order refuses the part instead (and the upload stays usable)."""
        one, two = payload(PART, 4), payload(PART, 5)
        uid = store.initiate_multipart("ooo")
        if self.takes_parts_in_any_order:
            p2 = store.upload_part("ooo", uid, 2, two)
            p1 = store.upload_part("ooo", uid, 1, one)
        else:
            with pytest.raises(ValidationError):
                store.upload_part("ooo", uid, 2, two)
            p1 = store.upload_part("ooo", uid, 1, one)
            p2 = store.upload_part("ooo", uid, 2, two)
        store.complete_multipart("ooo", uid, [p1, p2])
        assert store.get("ooo") == one + two

    def test_in_progress_upload_is_listed_then_aborted(self, store):
        uid = store.initiate_multipart("up/obj")
        store.upload_part("up/obj", uid, 1, payload(PART))
        uploads = store.list_multipart_uploads("up/")
        assert [u.key for u in uploads] == ["up/obj"]
        if self.lists_returned_upload_ids:
            assert [u.upload_id for u in uploads] == [uid]
        assert uploads[0].initiated > 0
        assert store.list_multipart_uploads("other/") == []
        assert [u.key for u in store.list_multipart_uploads()] == ["up/obj"]
        if self.lists_returned_upload_ids:
            assert [u.upload_id for u in store.list_multipart_uploads()] == [uid]
        assert store.list("up/").objects == []  # not an object until completed
        with pytest.raises(NoSuchObjectError):
            store.get("up/obj")
        store.abort_multipart("up/obj", uid)
        assert store.list_multipart_uploads() == []
        assert store.list().objects == []  # abort leaves no object
        store.abort_multipart("up/obj", uid)  # idempotent
        with pytest.raises(NoSuchUploadError):
            store.complete_multipart("up/obj", uid, [CompletedPart(1, "x", PART)])

    def test_listed_upload_is_aborted_by_its_listed_id(self, store):
        """What reconciliation does with a stale upload of another process: list it, abort it by the
        id the listing gives."""
        uid = store.initiate_multipart("stale/obj")
        store.upload_part("stale/obj", uid, 1, payload(PART))
        [listed] = store.list_multipart_uploads("stale/")
        store.abort_multipart(listed.key, listed.upload_id)
        assert store.list_multipart_uploads() == []
        assert store.list().objects == []
        with pytest.raises(NoSuchObjectError):
            store.get("stale/obj")

    def test_unknown_upload_id(self, store):
        bogus = CompletedPart(1, '"0123456789abcdef0123456789abcdef"', PART)
        with pytest.raises(NoSuchUploadError):
            store.complete_multipart("some/key", "no-such-upload-id", [bogus])
        with pytest.raises(NoSuchUploadError):
            store.upload_part("some/key", "no-such-upload-id", 1, b"x" * PART)
        store.abort_multipart("some/key", "no-such-upload-id")  # not an error

    def test_complete_rejects_bad_part_lists(self, store):
        uid = store.initiate_multipart("bad")
        p1 = store.upload_part("bad", uid, 1, payload(PART))
        p2 = store.upload_part("bad", uid, 2, payload(PART))
        with pytest.raises(ValidationError):
            store.complete_multipart("bad", uid, [])
        with pytest.raises(ValidationError):
            store.complete_multipart("bad", uid, [p2, p1])  # not ascending
        with pytest.raises(ValidationError):
            store.complete_multipart("bad", uid, [p1, CompletedPart(2, '"ffffffffffffffffffffffffffffffff"', PART)])
        with pytest.raises(ValueError):  # ValidationError is a ValueError
            store.upload_part("bad", uid, 0, b"x")
        # the upload is still usable after rejected attempts
        store.complete_multipart("bad", uid, [p1, p2])
        assert store.get("bad") == payload(PART) * 2

    def test_multipart_parts_given_as_pieces_with_file_slices(self, store, tmp_path: Path):
        """A part may be pieces written back to back: buffers and FileSlices of local files (the
        filesystem store copies those in the kernel, S3 reads them)."""
        src = tmp_path / "src.bin"
        body = bytes(range(256)) * 40  # 10240 bytes
        src.write_bytes(body)
        up = store.initiate_multipart("pieces/obj", {"role": "data"})
        p1 = store.upload_part("pieces/obj", up, 1, [b"HEAD", FileSlice(str(src), 100, 2000), bytearray(b"T" * 3)])
        p2 = store.upload_part("pieces/obj", up, 2, [memoryview(body)[:1500], FileSlice(str(src), 0, 10)])
        assert (p1.size, p2.size) == (2007, 1510)
        store.complete_multipart("pieces/obj", up, [p1, p2])
        assert store.get("pieces/obj") == b"HEAD" + body[100:2100] + b"TTT" + body[:1500] + body[:10]

    def test_multipart_piece_from_missing_file_fails_and_abort_cleans(self, store, tmp_path: Path):
        up = store.initiate_multipart("pieces/missing", {})
        with pytest.raises((TieredError, OSError)):
            store.upload_part("pieces/missing", up, 1, [b"x" * 2048, FileSlice(str(tmp_path / "nope"), 0, 10)])
        store.abort_multipart("pieces/missing", up)
        assert [u for u in store.list_multipart_uploads("pieces/") if u.key == "pieces/missing"] == []
        with pytest.raises(NoSuchObjectError):
            store.get("pieces/missing")


class ChunkedBlobStoreContract(BlobStoreContract):
    """The contract of a store of chunked objects (TransformedBlobStore; docs/formats.md "Chunked
    objects", spec/04): the same logical objects, ranges over logical bytes, and these differences."""

    keeps_manifests = True
    lists_returned_upload_ids = False
    takes_parts_in_any_order = False

    def listed_size(self, store: BlobStore, key: str, data: bytes) -> int:
        """A listing shows the physical object: the transformed chunks' total, which the manifest
        records (never the logical size, unless the transform left the bytes as they were)."""
        return store.open(key).manifest.index.transformed_size  # type: ignore[attr-defined]

    def test_listing_shows_manifests_with_their_sizes(self, store):
        data = payload(3 * SPAN + 5, seed=11)
        store.put("m/obj", data, {"role": "data"})
        objects = {o.key: o.size for o in store.list("m/").objects}
        manifest = store.inner.get("m/obj" + MANIFEST_SUFFIX)  # type: ignore[attr-defined]
        assert objects == {"m/obj": self.listed_size(store, "m/obj", data), "m/obj" + MANIFEST_SUFFIX: len(manifest)}
        assert store.head("m/obj").size == len(data)  # head serves the logical object
        store.delete(["m/obj"])  # the object and its manifest go together
        assert store.list("m/").objects == []
