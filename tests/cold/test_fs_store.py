"""FilesystemBlobStore: the BlobStore contract (tests/support/blob_contract.py), then what is specific
to it: key safety, multipart paths, listing at scale, concurrency."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import pytest

from tests.support.blob_contract import BlobStoreContract
from tieredcore.cold.backends.fs import INTERNAL_DIR, FilesystemBlobStore
from tieredcore.cold.blob import CompletedPart, iter_objects
from tieredcore.errors import BlobStoreError, NoSuchObjectError, NoSuchUploadError, ValidationError


class TestFilesystemStoreContract(BlobStoreContract):
    @pytest.fixture
    def store(self, fs_store):
        return fs_store


def _tree(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*")}


def _internal_leftovers(store: FilesystemBlobStore) -> dict[str, list[str]]:
    internal = store.root / INTERNAL_DIR
    return {d: sorted(os.listdir(internal / d)) for d in ("tmp", "uploads", "trash")}


NASTY_KEYS = [
    "",
    "/",
    "/etc/passwd",
    "//double",
    "..",
    ".",
    "../escape",
    "../../escape",
    "a/../../escape",
    "a/..",
    "a/../b",
    "./a",
    "a/./b",
    "a//b",
    "a/",
    "a\\b",
    "..\\escape",
    "a\\..\\..\\escape",
    "a\x00b",
    "\x00",
    INTERNAL_DIR,
    f"{INTERNAL_DIR}/lock",
    f"{INTERNAL_DIR}/meta/x",
    f"{INTERNAL_DIR}/uploads/x",
    "x" * 256,
    "a/" + "é" * 128,  # 256 bytes in UTF-8
    "bad\udcffsurrogate",
]


@pytest.mark.parametrize("key", NASTY_KEYS, ids=range(len(NASTY_KEYS)))
def test_path_escape_rejected(tmp_path, key):
    store = FilesystemBlobStore(tmp_path / "store")
    store.put("ok", b"fine")
    before = _tree(tmp_path)
    with pytest.raises(ValidationError):
        store.put(key, b"evil", {"m": "v"})
    with pytest.raises(ValidationError):
        store.get(key)
    with pytest.raises(ValidationError):
        store.get_range(key, 0, 1)
    with pytest.raises(ValidationError):
        store.head(key)
    with pytest.raises(ValidationError):
        store.delete([key])
    with pytest.raises(ValidationError):
        store.delete(["ok", key])  # nothing deleted when any key is invalid
    with pytest.raises(ValidationError):
        store.initiate_multipart(key)
    assert _tree(tmp_path) == before
    assert store.get("ok") == b"fine"
    assert [o.key for o in store.list().objects] == ["ok"]


def test_list_with_nasty_prefixes_stays_inside(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"s")
    store = FilesystemBlobStore(tmp_path / "store")
    store.put("a/b", b"x")
    for prefix in (
        "../",
        "../outside/",
        "/",
        "/etc/",
        f"{INTERNAL_DIR}/",
        f"{INTERNAL_DIR}",
        "a/../",
        "a//",
        "./a",
    ):
        keys = [o.key for o in store.list(prefix).objects]
        assert all(k.startswith(prefix) for k in keys), prefix
        assert all("secret" not in k and INTERNAL_DIR not in k for k in keys), prefix
    assert [o.key for o in store.list(".").objects] == []


@pytest.mark.parametrize(
    "key",
    [
        "..a",
        "a..",
        "...",
        ".hidden",
        f"{INTERNAL_DIR}2/x",
        f"x/{INTERNAL_DIR}/y",
        "sp ace/ü/日本",
        "%2e%2e/x",
    ],
)
def test_unusual_but_valid_keys_stay_inside(tmp_path, key):
    store = FilesystemBlobStore(tmp_path / "store")
    store.put(key, b"v", {"k": "v"})
    assert store.get(key) == b"v"
    assert store.head(key).metadata == {"k": "v"}
    assert [o.key for o in store.list().objects] == [key]
    path = (store.root / key).resolve()
    assert path.is_file() and store.root.resolve() in path.parents
    store.delete([key])
    assert store.list().objects == []
    assert os.listdir(store.root) == [INTERNAL_DIR]  # emptied parents pruned


def test_component_of_255_bytes_is_fine(fs_store):
    key = "d/" + "k" * 255
    fs_store.put(key, b"x")
    assert fs_store.get(key) == b"x"


def test_driver_properties(tmp_path):
    store = FilesystemBlobStore(tmp_path / "s")
    assert store.driver == "tiered-local"
    assert store.driver_properties() == {"root": str(tmp_path / "s")}


def test_metadata_sidecar_and_no_temp_leftovers(fs_store):
    fs_store.put("a/b", b"data", {"Key": "V"})
    sidecar = fs_store.root / INTERNAL_DIR / "meta" / "a" / "b"
    assert json.loads(sidecar.read_text()) == {"metadata": {"key": "V"}}
    assert _internal_leftovers(fs_store) == {"tmp": [], "uploads": [], "trash": []}
    fs_store.delete(["a/b"])
    assert not sidecar.exists()
    assert not (fs_store.root / "a").exists()  # empty parent pruned
    assert not (fs_store.root / INTERNAL_DIR / "meta" / "a").exists()
    assert fs_store.root.is_dir()


def test_delete_prunes_only_empty_parents(fs_store):
    fs_store.put("x/y/z1", b"1")
    fs_store.put("x/y/z2", b"2")
    fs_store.delete(["x/y/z1"])
    assert (fs_store.root / "x" / "y").is_dir()
    fs_store.delete(["x/y/z2"])
    assert not (fs_store.root / "x").exists()


def test_key_prefix_conflicts(fs_store):
    fs_store.put("a", b"file")
    with pytest.raises(BlobStoreError):
        fs_store.put("a/b", b"below a file")
    fs_store.put("d/e", b"x")
    with pytest.raises(BlobStoreError):
        fs_store.put("d", b"over a directory")
    assert fs_store.get("a") == b"file"
    assert fs_store.get("d/e") == b"x"
    with pytest.raises(NoSuchObjectError):
        fs_store.get("d")  # a directory is not an object
    with pytest.raises(NoSuchObjectError):
        fs_store.head("a/b")
    fs_store.delete(["d", "a/b"])  # neither is an object: fine, nothing removed
    assert fs_store.get("d/e") == b"x"
    assert _internal_leftovers(fs_store)["tmp"] == []


def test_symlink_is_not_an_object(fs_store, tmp_path):
    target = tmp_path / "outside"
    target.write_bytes(b"secret")
    os.symlink(target, fs_store.root / "link")
    with pytest.raises(NoSuchObjectError):
        fs_store.get("link")
    assert fs_store.list().objects == []


# --- multipart ---------------------------------------------------------------------------------


def test_out_of_order_parts(fs_store):
    data = {n: bytes([n]) * (100 + n) for n in (1, 2, 3, 4)}
    uid = fs_store.initiate_multipart("o")
    parts = {n: fs_store.upload_part("o", uid, n, data[n]) for n in (3, 1, 4, 2)}
    fs_store.complete_multipart("o", uid, [parts[n] for n in (1, 2, 3, 4)])
    assert fs_store.get("o") == b"".join(data[n] for n in (1, 2, 3, 4))
    assert _internal_leftovers(fs_store) == {"tmp": [], "uploads": [], "trash": []}


def test_reuploaded_part(fs_store):
    uid = fs_store.initiate_multipart("r", {"m": "1"})
    p1 = fs_store.upload_part("r", uid, 1, b"a" * 10)
    p2_old = fs_store.upload_part("r", uid, 2, b"b" * 10)
    p3 = fs_store.upload_part("r", uid, 3, b"c" * 10)
    p2 = fs_store.upload_part("r", uid, 2, b"B" * 7)
    assert p2.etag != p2_old.etag
    with pytest.raises(ValidationError):
        fs_store.complete_multipart("r", uid, [p1, p2_old, p3])  # stale etag
    p2_again = fs_store.upload_part("r", uid, 2, b"Z" * 5)  # re-upload of a re-upload
    fs_store.complete_multipart("r", uid, [p1, p2_again, p3])
    assert fs_store.get("r") == b"a" * 10 + b"Z" * 5 + b"c" * 10
    assert fs_store.head("r").metadata == {"m": "1"}
    assert _internal_leftovers(fs_store) == {"tmp": [], "uploads": [], "trash": []}


def test_fast_path_is_a_rename_of_the_data_file(fs_store):
    uid = fs_store.initiate_multipart("fast")
    parts = [fs_store.upload_part("fast", uid, n, bytes([n]) * 1000) for n in (1, 2, 3)]
    data_file = fs_store.root / INTERNAL_DIR / "uploads" / uid / "data"
    ino = data_file.stat().st_ino
    assert sorted(os.listdir(data_file.parent)) == ["data", "manifest.json", "parts.log"]  # no part files
    fs_store.complete_multipart("fast", uid, parts)
    assert (fs_store.root / "fast").stat().st_ino == ino  # renamed, not copied
    assert fs_store.get("fast") == b"\x01" * 1000 + b"\x02" * 1000 + b"\x03" * 1000


@pytest.mark.parametrize(
    "chosen",
    [(1, 2), (1,), (1, 3), (2, 3), (3,), (1, 2, 4), (1, 4), (2, 4)],
)
def test_complete_with_a_subset_of_parts(fs_store, chosen):
    uid = fs_store.initiate_multipart("s")
    data = {n: bytes([64 + n]) * (50 * n) for n in (1, 2, 3, 4)}
    parts = {n: fs_store.upload_part("s", uid, n, data[n]) for n in (1, 2, 4, 3)}  # 4 goes to a part file
    fs_store.complete_multipart("s", uid, [parts[n] for n in chosen])
    assert fs_store.get("s") == b"".join(data[n] for n in chosen)
    assert _internal_leftovers(fs_store) == {"tmp": [], "uploads": [], "trash": []}


def test_complete_rejects_unknown_part_and_stays_usable(fs_store):
    uid = fs_store.initiate_multipart("u")
    p1 = fs_store.upload_part("u", uid, 1, b"1")
    with pytest.raises(ValidationError):
        fs_store.complete_multipart("u", uid, [p1, CompletedPart(2, p1.etag, 1)])
    with pytest.raises(ValidationError):
        fs_store.complete_multipart("u", uid, [p1, p1])
    with pytest.raises(ValidationError):
        fs_store.upload_part("u", uid, 10_001, b"x")
    fs_store.complete_multipart("u", uid, [p1])
    assert fs_store.get("u") == b"1"


def test_upload_id_is_checked(fs_store):
    uid = fs_store.initiate_multipart("k")
    p1 = fs_store.upload_part("k", uid, 1, b"x")
    for bad in ("../../x", "", "..", uid.upper(), uid + "0", "../" + uid):
        with pytest.raises(NoSuchUploadError):
            fs_store.upload_part("k", bad, 1, b"y")
        with pytest.raises(NoSuchUploadError):
            fs_store.complete_multipart("k", bad, [p1])
        fs_store.abort_multipart("k", bad)
    with pytest.raises(NoSuchUploadError):  # upload belongs to another key
        fs_store.complete_multipart("other", uid, [p1])
    fs_store.abort_multipart("other", uid)  # no effect on k's upload
    fs_store.complete_multipart("k", uid, [p1])
    assert fs_store.get("k") == b"x"


def test_atomic_visibility_and_leftovers(fs_store):
    uid = fs_store.initiate_multipart("vis/obj", {"a": "b"})
    parts = [fs_store.upload_part("vis/obj", uid, n, b"z" * 100) for n in (1, 2)]
    assert fs_store.list().objects == []
    with pytest.raises(NoSuchObjectError):
        fs_store.head("vis/obj")
    assert not (fs_store.root / "vis").exists()
    fs_store.complete_multipart("vis/obj", uid, parts)
    assert [o.key for o in fs_store.list().objects] == ["vis/obj"]
    assert _internal_leftovers(fs_store) == {"tmp": [], "uploads": [], "trash": []}
    with pytest.raises(NoSuchUploadError):
        fs_store.complete_multipart("vis/obj", uid, parts)

    uid2 = fs_store.initiate_multipart("vis/two")
    fs_store.upload_part("vis/two", uid2, 2, b"q")
    fs_store.abort_multipart("vis/two", uid2)
    fs_store.abort_multipart("vis/two", uid2)
    assert _internal_leftovers(fs_store) == {"tmp": [], "uploads": [], "trash": []}
    assert [o.key for o in fs_store.list().objects] == ["vis/obj"]


def test_uploads_survive_a_new_store_instance(tmp_path):
    a = FilesystemBlobStore(tmp_path / "s")
    uid = a.initiate_multipart("k", {"x": "1"})
    p1 = a.upload_part("k", uid, 1, b"one")
    b = FilesystemBlobStore(tmp_path / "s")  # e.g. another process
    p2 = b.upload_part("k", uid, 2, b"two")
    p3 = a.upload_part("k", uid, 3, b"three")  # a's cached journal state must catch up
    assert [u.upload_id for u in b.list_multipart_uploads()] == [uid]
    b.complete_multipart("k", uid, [p1, p2, p3])
    assert a.get("k") == b"onetwothree"
    assert a.head("k").metadata == {"x": "1"}


def test_list_multipart_uploads_sorted(fs_store):
    u2 = fs_store.initiate_multipart("b")
    u1 = fs_store.initiate_multipart("a")
    u3 = fs_store.initiate_multipart("b")
    assert [(u.key, u.upload_id) for u in fs_store.list_multipart_uploads()] == [
        ("a", u1),
        ("b", u2),
        ("b", u3),
    ]
    assert [u.upload_id for u in fs_store.list_multipart_uploads("b")] == [u2, u3]


# --- listing -----------------------------------------------------------------------------------


def test_listing_is_byte_ordered_across_directories(fs_store):
    keys = ["a-b", "a/b", "a.b", "a0", "a/b0", "a/c/d", "a/c.d", "ab", "é", "z", "a/c-", "A", "a/c/d0"]
    for k in keys:
        fs_store.put(k, b"x")
    expected = sorted(keys, key=lambda k: k.encode())
    assert [o.key for o in iter_objects(fs_store)] == expected
    assert [o.key for o in iter_objects(fs_store, page_size=1)] == expected
    for prefix in ("a", "a/", "a/c", "a/c/", "a/c/d", "é", "b"):
        assert [o.key for o in iter_objects(fs_store, prefix, page_size=2)] == [
            k for k in expected if k.startswith(prefix)
        ]


def test_listing_resumes_from_any_token(fs_store):
    keys = ["a/1", "a/2/x", "a/2/y", "a/3", "b", "c/d/e"]
    for k in keys:
        fs_store.put(k, b"x")
    for i, tok in enumerate(keys):
        assert [o.key for o in fs_store.list("", tok, 100).objects] == keys[i + 1 :]
    # tokens that are not keys still mean "after this"
    assert [o.key for o in fs_store.list("", "a/2", 100).objects] == keys[1:]
    assert [o.key for o in fs_store.list("", "a/2/z", 100).objects] == keys[3:]
    assert [o.key for o in fs_store.list("a/", "b", 100).objects] == []


def test_two_thousand_objects_paginated(tmp_path):
    store = FilesystemBlobStore(tmp_path / "s", fsync=False)
    keys = [f"many/obj-{i:05d}" for i in range(2000)] + ["many/sub/x", "other"]
    for k in keys:
        store.put(k, b"v")
    pages = 0
    seen: list[str] = []
    token = None
    while True:
        page = store.list("many/", token, page_size=128)
        pages += 1
        seen += [o.key for o in page.objects]
        if page.next_token is None:
            break
        token = page.next_token
    assert seen == sorted(k for k in keys if k.startswith("many/"))
    assert pages == 16
    assert [o.key for o in store.list("many/obj-0199", None, 5).objects] == [
        "many/obj-01990",
        "many/obj-01991",
        "many/obj-01992",
        "many/obj-01993",
        "many/obj-01994",
    ]


def test_directory_listing_cache_sees_new_and_deleted_files(tmp_path):
    store = FilesystemBlobStore(tmp_path / "s", fsync=False)
    for i in range(300):
        store.put(f"c/{i:03d}", b"v")
    old = 1_000_000_000
    os.utime(store.root / "c", (old, old))  # settled directory: its listing gets cached
    assert len(list(iter_objects(store, "c/", page_size=50))) == 300
    store.put("c/new", b"v")
    store.delete(["c/000"])
    keys = [o.key for o in iter_objects(store, "c/", page_size=50)]
    assert len(keys) == 300 and "c/new" in keys and "c/000" not in keys


# --- concurrency -------------------------------------------------------------------------------


def _writer(root: str, worker: int, n: int) -> None:
    store = FilesystemBlobStore(root)
    for i in range(n):
        store.put(f"w{worker}/k{i}", f"{worker}-{i}".encode(), {"worker": str(worker)})
        payload = f"{worker}".encode() * (1000 + worker)
        store.put("shared/same", payload, {"worker": str(worker), "size": str(len(payload))})
        if i % 10 == 0:
            store.delete([f"w{worker}/k{i}"])


def test_concurrent_processes(tmp_path):
    root = str(tmp_path / "s")
    FilesystemBlobStore(root)
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(root, w, 60)) for w in range(3)]
    for p in procs:
        p.start()
    store = FilesystemBlobStore(root)
    for _ in range(200):  # readers see whole objects whose metadata matches their bytes
        try:
            info = store.head("shared/same")
        except NoSuchObjectError:
            continue
        assert int(info.metadata["size"]) == info.size
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    data = store.get("shared/same")
    info = store.head("shared/same")
    assert data == info.metadata["worker"].encode() * len(data)
    assert int(info.metadata["size"]) == len(data) == info.size
    keys = [o.key for o in iter_objects(store)]
    assert len(keys) == 3 * 54 + 1
    assert _internal_leftovers(store) == {"tmp": [], "uploads": [], "trash": []}


# --- copying file ranges into parts (fs_multipart.copy_range) ------------------------------------


def _copy_with(tmp_path: Path, src_bytes: bytes, src_off: int, dst_off: int, n: int) -> bytes:
    from tieredcore.cold.backends.fs_multipart import copy_range

    src, dst = tmp_path / "src", tmp_path / "dst"
    src.write_bytes(src_bytes)
    sfd = os.open(src, os.O_RDONLY)
    dfd = os.open(dst, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.pwrite(dfd, b"\xaa" * dst_off, 0)
        copy_range(sfd, src_off, dfd, dst_off, n)
        return os.pread(dfd, dst_off + n + 1, 0)
    finally:
        os.close(sfd)
        os.close(dfd)


@pytest.mark.parametrize(
    ("src_off", "dst_off", "n"),
    [
        (0, 128, (1 << 20) + 7),  # a block's frames: 128 bytes into the object, page-misaligned
        (17, 0, 300_000),
        (4096 * 5 + 3, 128, (17 << 20) + 11),  # more than one mapping window, an unaligned mapping start
        (65536 + 1, 65536 * 3 + 1, 1 << 20),  # congruent modulo the page: copy_file_range
        (5, 9, 1000),  # small: copy_file_range
    ],
)
def test_copy_range_copies_exact_bytes_at_any_alignment(tmp_path, src_off, dst_off, n):
    data = os.urandom(src_off + n + 4096)
    got = _copy_with(tmp_path, data, src_off, dst_off, n)
    assert got == b"\xaa" * dst_off + data[src_off : src_off + n]


def test_copy_range_refuses_a_source_shorter_than_the_range(tmp_path):
    # a hot-tier file cut short under a recorded slice: a clear error, not a short object
    with pytest.raises(BlobStoreError, match="shorter than recorded"):
        _copy_with(tmp_path, os.urandom(1 << 20), 100, 128, 1 << 20)
    with pytest.raises(BlobStoreError, match="shorter than recorded"):  # the copy_file_range path
        _copy_with(tmp_path, os.urandom(1 << 20), 128, 128, 1 << 20)


def test_copy_range_reports_a_source_truncated_while_copying(tmp_path, monkeypatch):
    """A source cut short between two windows of a misaligned copy: the same error."""
    from tieredcore.cold.backends import fs_multipart

    src, dst = tmp_path / "src", tmp_path / "dst"
    src.write_bytes(os.urandom(12 << 20))
    real = fs_multipart.preadv_exact
    reads = []

    def truncating_read(fd, out, offset):
        if reads:
            os.truncate(src, 4096)  # another process cuts the file after the first window
        reads.append(offset)
        return real(fd, out, offset)

    monkeypatch.setattr(fs_multipart, "preadv_exact", truncating_read)
    sfd = os.open(src, os.O_RDONLY)
    dfd = os.open(dst, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        with pytest.raises(BlobStoreError, match="shorter than recorded"):
            fs_multipart.copy_range(sfd, 3, dfd, 128, (12 << 20) - 3)
        assert len(reads) >= 2, "a misaligned range is copied through the buffer, a window at a time"
    finally:
        os.close(sfd)
        os.close(dfd)


@pytest.mark.parametrize("fsync", [True, False])
def test_parts_start_their_writeback_as_they_are_written(tmp_path, monkeypatch, fsync):
    """With fsync on, every byte of a part (buffers, kernel-copied and buffered file slices) is handed to
    the disk as soon as it is written (sync_file_range WRITE), so the fsync at completion only waits;
    without fsync nothing is asked of the disk."""
    from tieredcore.cold.backends import fs_multipart
    from tieredcore.model import FileSlice

    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(fs_multipart, "_SYNC_FILE_RANGE", lambda fd, off, n, flags: calls.append((off, n)) or 0)
    src = tmp_path / "src"
    src.write_bytes(os.urandom(3 << 20))
    store = FilesystemBlobStore(tmp_path / "store", fsync=fsync)
    up = store.initiate_multipart("k")
    p1 = store.upload_part("k", up, 1, [b"h" * 128, FileSlice(str(src), 5, 2 << 20), b"p" * 10])  # misaligned
    # at data-file offset 128 + 2 MiB + 10 = 138 (mod 4096): a source offset congruent to it is copied by
    # copy_file_range
    p2 = store.upload_part("k", up, 2, [FileSlice(str(src), 4096 + 138, 1 << 20)])
    store.complete_multipart("k", up, [p1, p2])
    size = 128 + (2 << 20) + 10 + (1 << 20)
    assert store.head("k").size == size
    if not fsync:
        assert calls == []
        return
    # whole pages only, each handed over once it is complete (the object's last partial page is the
    # fsync's): together every full page of the object, in order
    page = fs_multipart._PAGE
    assert all(a % page == 0 and n % page == 0 for a, n in calls), calls
    covered = sorted({p for a, n in calls for p in range(a // page, (a + n) // page)})
    assert covered == list(range(size // page))
