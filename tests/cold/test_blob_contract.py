"""BlobStore contract: every implementation (filesystem, S3 on moto, Azure Blob on Azurite, GCS on
gcp-storage-emulator) must pass all of these. A case the GCS emulator cannot serve is skipped there only,
with the reason (the store's code path for it is the one real GCS runs)."""

from __future__ import annotations

import time

import pytest

from tieredcore.cold.blob import BlobStore, CompletedPart, iter_objects
from tieredcore.errors import (
    BadRangeError,
    NoSuchObjectError,
    NoSuchUploadError,
    ObjectExistsError,
    ValidationError,
)

# what gcp-storage-emulator does not implement (tests/support/object_stores.py)
GCS_EMULATOR_LIMITS = {
    "generation": "gcp-storage-emulator ignores generation preconditions (ifGenerationMatch=0), so it cannot "
                  "refuse a conditional create (the request is checked in test_cloud_stores.py)",
    "paging": "gcp-storage-emulator ignores list paging (maxResults/pageToken) and startOffset: every listing "
              "is one page (the requests are checked in test_cloud_stores.py)",
}


@pytest.fixture(params=["fs", "s3", "azure", "gcs"])
def blob_store(request: pytest.FixtureRequest):
    """Each BlobStore implementation in turn."""
    return request.getfixturevalue(f"{request.param}_store")


def _emulator_cannot(request: pytest.FixtureRequest, limit: str) -> None:
    if request.node.callspec.params.get("blob_store") == "gcs":
        pytest.skip(GCS_EMULATOR_LIMITS[limit])


PART = 1500  # >= moto's lowered minimum part size (conftest.MOTO_PART_MIN_SIZE)


def _bytes(n: int, seed: int = 0) -> bytes:
    return bytes((i * 31 + seed) % 251 for i in range(n))


def test_is_a_blob_store(blob_store):
    assert isinstance(blob_store, BlobStore)
    assert blob_store.driver in ("filesystem", "aws-s3", "azureblob", "google-cloud-storage")
    assert isinstance(blob_store.driver_properties(), dict)


def test_put_get_head_round_trip_with_metadata(blob_store):
    data = _bytes(5000)
    before = time.time()
    blob_store.put("dir/sub/obj-1", data, {"Format-Version": "1", "x-MiXed": "Value With Case"})
    assert blob_store.get("dir/sub/obj-1") == data
    info = blob_store.head("dir/sub/obj-1")
    assert info.key == "dir/sub/obj-1"
    assert info.size == 5000
    assert info.metadata == {"format-version": "1", "x-mixed": "Value With Case"}
    assert before - 5 <= info.last_modified <= time.time() + 5


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_put_accepts_buffers(blob_store, kind):
    blob_store.put("buf", kind(b"hello world"))
    assert blob_store.get("buf") == b"hello world"


def test_empty_object(blob_store):
    blob_store.put("empty", b"")
    assert blob_store.get("empty") == b""
    assert blob_store.head("empty").size == 0
    with pytest.raises(BadRangeError):
        blob_store.get_range("empty", 0, 0)


def test_overwrite_replaces_data_and_metadata(blob_store):
    blob_store.put("k", b"first version", {"a": "1"})
    blob_store.put("k", b"second", {"b": "2"})
    assert blob_store.get("k") == b"second"
    info = blob_store.head("k")
    assert info.size == 6
    assert info.metadata == {"b": "2"}
    blob_store.put("k", b"third")
    assert blob_store.head("k").metadata == {}


def test_create_if_absent(blob_store, request):
    """The conditional write the owner markers use: the first creator wins, the rest change nothing."""
    _emulator_cannot(request, "generation")
    blob_store.put("marker", b"first", {"who": "a"}, if_absent=True)
    with pytest.raises(ObjectExistsError):
        blob_store.put("marker", b"second", {"who": "b"}, if_absent=True)
    assert blob_store.get("marker") == b"first" and blob_store.head("marker").metadata == {"who": "a"}
    blob_store.put("marker", b"replaced")  # an unconditional put still replaces
    assert blob_store.get("marker") == b"replaced"


def test_missing_object(blob_store):
    with pytest.raises(NoSuchObjectError):
        blob_store.get("missing/key")
    with pytest.raises(NoSuchObjectError):
        blob_store.head("missing/key")
    with pytest.raises(NoSuchObjectError):
        blob_store.get_range("missing/key", 0, 10)


def test_get_range(blob_store):
    data = _bytes(1000, seed=7)
    blob_store.put("r", data)
    assert blob_store.get_range("r", 10, 19) == data[10:20]  # inner, inclusive end
    assert blob_store.get_range("r", 990, 5000) == data[990:]  # clipped at the end
    assert blob_store.get_range("r", 0, 0) == data[:1]  # single byte
    assert blob_store.get_range("r", 999, 999) == data[999:]  # last byte
    assert blob_store.get_range("r", 0, 999) == data  # whole object
    with pytest.raises(BadRangeError):
        blob_store.get_range("r", 1000, 1100)  # starts at the end
    with pytest.raises(BadRangeError):
        blob_store.get_range("r", 5000, 6000)  # starts beyond the end
    with pytest.raises(BadRangeError):
        blob_store.get_range("r", -1, 10)
    with pytest.raises(BadRangeError):
        blob_store.get_range("r", 10, 5)


def test_list_prefix_and_order(blob_store):
    keys = ["b/2", "a/1", "a/3", "a/2", "ab", "a-z", "c", "b/1/x"]
    for k in keys:
        blob_store.put(k, k.encode())
    assert [o.key for o in blob_store.list().objects] == sorted(keys)
    page = blob_store.list("a/")
    assert [o.key for o in page.objects] == ["a/1", "a/2", "a/3"]
    assert page.next_token is None
    assert [o.size for o in page.objects] == [3, 3, 3]
    assert all(o.last_modified > 0 and o.metadata == {} for o in page.objects)
    assert [o.key for o in blob_store.list("a").objects] == ["a-z", "a/1", "a/2", "a/3", "ab"]
    assert [o.key for o in blob_store.list("b/1").objects] == ["b/1/x"]
    assert [o.key for o in blob_store.list("b/1/").objects] == ["b/1/x"]
    assert blob_store.list("nothing-here").objects == []
    assert blob_store.list("a/4").objects == []
    assert blob_store.list("nothing-here").next_token is None


def test_list_empty_store(blob_store):
    page = blob_store.list()
    assert page.objects == [] and page.next_token is None


def test_list_pagination(blob_store, request):
    _emulator_cannot(request, "paging")
    keys = [f"p/k{i}" for i in range(7)] + ["q/other"]
    for k in keys:
        blob_store.put(k, b"x")
    seen: list[str] = []
    tokens: list[str] = []
    token = None
    while True:
        page = blob_store.list("p/", token, page_size=2)
        assert len(page.objects) <= 2
        seen += [o.key for o in page.objects]
        if page.next_token is None:
            break
        assert isinstance(page.next_token, str)
        tokens.append(page.next_token)
        token = page.next_token
    assert seen == sorted(keys[:7])  # every key exactly once, in order
    assert len(tokens) >= 3
    assert [o.key for o in iter_objects(blob_store, "p/", page_size=3)] == sorted(keys[:7])


def test_list_start_after(blob_store, request):
    _emulator_cannot(request, "paging")
    keys = [f"p/k{i}" for i in range(7)] + ["p/j", "p/z", "q/other"]
    for k in keys:
        blob_store.put(k, b"x")
    under = sorted(k for k in keys if k.startswith("p/"))
    for after in ("p/k2", "p/k25", "p/", "p/a", "p/zz", "o"):
        expected = [k for k in under if k > after]
        assert [o.key for o in iter_objects(blob_store, "p/", page_size=2, start_after=after)] == expected, after
    page = blob_store.list("p/", page_size=3, start_after="p/k0")
    assert [o.key for o in page.objects] == ["p/k1", "p/k2", "p/k3"] and page.next_token is not None
    # a continuation token takes over from start_after
    nxt = blob_store.list("p/", page.next_token, page_size=3, start_after="p/k0")
    assert [o.key for o in nxt.objects] == ["p/k4", "p/k5", "p/k6"]


def test_delete(blob_store):
    for k in ("d/1", "d/2", "d/3", "keep"):
        blob_store.put(k, b"x")
    blob_store.delete(["d/1", "d/3", "d/never-existed", "nope/at/all"])
    assert [o.key for o in blob_store.list().objects] == ["d/2", "keep"]
    with pytest.raises(NoSuchObjectError):
        blob_store.get("d/1")
    blob_store.delete([])
    blob_store.delete(["d/2", "d/2"])
    assert [o.key for o in blob_store.list().objects] == ["keep"]


def test_multipart_three_parts(blob_store):
    parts_data = [_bytes(PART, 1), _bytes(PART, 2), _bytes(700, 3)]
    uid = blob_store.initiate_multipart("mp/obj", {"Format-Version": "2"})
    parts = [blob_store.upload_part("mp/obj", uid, i + 1, d) for i, d in enumerate(parts_data)]
    assert [p.part_number for p in parts] == [1, 2, 3]
    assert [p.size for p in parts] == [PART, PART, 700]
    blob_store.complete_multipart("mp/obj", uid, parts)
    assert blob_store.get("mp/obj") == b"".join(parts_data)
    info = blob_store.head("mp/obj")
    assert info.size == 2 * PART + 700
    assert info.metadata == {"format-version": "2"}
    assert blob_store.list_multipart_uploads("mp/") == []


def test_multipart_memoryview_parts(blob_store):
    buf = bytearray(_bytes(2 * PART, 9))
    mv = memoryview(buf)
    uid = blob_store.initiate_multipart("mv")
    parts = [blob_store.upload_part("mv", uid, 1, mv[:PART]), blob_store.upload_part("mv", uid, 2, mv[PART:])]
    blob_store.complete_multipart("mv", uid, parts)
    assert blob_store.get("mv") == bytes(buf)


def test_in_progress_upload_is_listed_then_aborted(blob_store):
    uid = blob_store.initiate_multipart("up/obj")
    blob_store.upload_part("up/obj", uid, 1, _bytes(PART))
    uploads = blob_store.list_multipart_uploads("up/")
    assert [(u.key, u.upload_id) for u in uploads] == [("up/obj", uid)]
    assert uploads[0].initiated > 0
    assert blob_store.list_multipart_uploads("other/") == []
    assert [u.upload_id for u in blob_store.list_multipart_uploads()] == [uid]
    assert blob_store.list("up/").objects == []  # not an object until completed
    with pytest.raises(NoSuchObjectError):
        blob_store.get("up/obj")
    blob_store.abort_multipart("up/obj", uid)
    assert blob_store.list_multipart_uploads() == []
    assert blob_store.list().objects == []  # abort leaves no object
    blob_store.abort_multipart("up/obj", uid)  # idempotent
    with pytest.raises(NoSuchUploadError):
        blob_store.complete_multipart("up/obj", uid, [CompletedPart(1, "x", PART)])


def test_unknown_upload_id(blob_store):
    bogus = CompletedPart(1, '"0123456789abcdef0123456789abcdef"', PART)
    with pytest.raises(NoSuchUploadError):
        blob_store.complete_multipart("some/key", "no-such-upload-id", [bogus])
    with pytest.raises(NoSuchUploadError):
        blob_store.upload_part("some/key", "no-such-upload-id", 1, b"x" * PART)
    blob_store.abort_multipart("some/key", "no-such-upload-id")  # not an error


def test_complete_rejects_bad_part_lists(blob_store):
    uid = blob_store.initiate_multipart("bad")
    p1 = blob_store.upload_part("bad", uid, 1, _bytes(PART))
    p2 = blob_store.upload_part("bad", uid, 2, _bytes(PART))
    with pytest.raises(ValidationError):
        blob_store.complete_multipart("bad", uid, [])
    with pytest.raises(ValidationError):
        blob_store.complete_multipart("bad", uid, [p2, p1])  # not ascending
    with pytest.raises(ValidationError):
        blob_store.complete_multipart(
            "bad", uid, [p1, CompletedPart(2, '"ffffffffffffffffffffffffffffffff"', PART)]
        )
    with pytest.raises(ValueError):  # ValidationError is a ValueError
        blob_store.upload_part("bad", uid, 0, b"x")
    # the upload is still usable after rejected attempts
    blob_store.complete_multipart("bad", uid, [p1, p2])
    assert blob_store.get("bad") == _bytes(PART) * 2


def test_multipart_parts_given_as_pieces_with_file_slices(blob_store, tmp_path):
    """A part may be pieces written back to back: buffers and FileSlices of local files (the
    filesystem store copies those in the kernel, S3 reads them)."""
    from tieredcore.model import FileSlice

    src = tmp_path / "src.bin"
    body = bytes(range(256)) * 40  # 10240 bytes
    src.write_bytes(body)
    up = blob_store.initiate_multipart("pieces/obj", {"role": "data"})
    p1 = blob_store.upload_part("pieces/obj", up, 1, [b"HEAD", FileSlice(str(src), 100, 2000), bytearray(b"T" * 3)])
    p2 = blob_store.upload_part("pieces/obj", up, 2, [memoryview(body)[:1500], FileSlice(str(src), 0, 10)])
    assert (p1.size, p2.size) == (2007, 1510)
    blob_store.complete_multipart("pieces/obj", up, [p1, p2])
    assert blob_store.get("pieces/obj") == b"HEAD" + body[100:2100] + b"TTT" + body[:1500] + body[:10]


def test_multipart_piece_from_missing_file_fails_and_abort_cleans(blob_store, tmp_path):
    from tieredcore.errors import TieredError
    from tieredcore.model import FileSlice

    up = blob_store.initiate_multipart("pieces/missing", {})
    with pytest.raises((TieredError, OSError)):
        blob_store.upload_part("pieces/missing", up, 1, [b"x" * 2048, FileSlice(str(tmp_path / "nope"), 0, 10)])
    blob_store.abort_multipart("pieces/missing", up)
    assert [u for u in blob_store.list_multipart_uploads("pieces/") if u.upload_id == up] == []
    with pytest.raises(NoSuchObjectError):
        blob_store.get("pieces/missing")
