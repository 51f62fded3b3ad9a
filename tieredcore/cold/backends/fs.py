"""Filesystem implementation of BlobStore: a directory tree as the cold tier.

Layout under ``root``::

    <key>                               objects, one file per key ('/' in keys are directories)
    .tiered/                            internal area; no user key may start with this component
        lock                            flock'ed around "rename sidecar + rename object" and head()
        tmp/<pid>-<random>.tmp          files being written; renamed into place when complete
        meta/<key>                      user-metadata sidecar (JSON), only for objects that have some
        uploads/<upload_id>/            one multipart upload (layout in fs_multipart.py)
        trash/                          upload directories being removed

Objects appear atomically (temp file, fsync, rename). The metadata sidecar is renamed into place
before the object and removed after it, both under the store lock, so head() never pairs an object
with another writer's metadata. Keys are validated so that none can leave the root or touch the
internal area. Paths are handled as bytes (keys encoded as UTF-8) so listing order is S3's byte order
whatever the locale.

The filesystem cannot hold both ``a`` and ``a/b``; putting the second raises BlobStoreError.
Multipart uploads are emulated on disk by :class:`tieredcore.cold.backends.fs_multipart.MultipartUploads`; the
store checks their arguments and publishes a completed upload like any put.
"""

from __future__ import annotations

import bisect
import errno
import fcntl
import json
import os
import secrets
import stat
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tieredcore.cold.backends.fs_multipart import MultipartUploads
from tieredcore.cold.backends.fs_util import fsync_dir, short_repr, unlink_quiet
from tieredcore.cold.blob import (
    CompletedPart,
    ListPage,
    MultipartUploadInfo,
    ObjectInfo,
    Pieces,
    check_part_number,
    normalize_metadata,
    piece_length,
)
from tieredcore.cold.drivers import DRIVER_LOCAL
from tieredcore.cold.requests import counted
from tieredcore.errors import (
    BadRangeError,
    BlobStoreError,
    NoSuchObjectError,
    NoSuchUploadError,
    ObjectExistsError,
    TieredError,
    ValidationError,
)
from tieredcore.fileio import pread_exact, write_all
from tieredcore.model import Buffer, FileSlice

INTERNAL_DIR = ".tiered"
_INTERNAL_B = INTERNAL_DIR.encode()
_MAX_COMPONENT_BYTES = 255
# A directory listing is cached only when the directory had not changed for this long before it was
# scanned: a later change then necessarily moves its mtime ("racy git" rule).
_DIR_CACHE_SETTLE_NS = 2_000_000_000
_DIR_CACHE_MIN_ENTRIES = 256
_DIR_CACHE_MAX_DIRS = 16
_STALE_TMP_SECONDS = 24 * 3600


def _check_component(c: bytes, key: str) -> None:
    if not c:
        raise ValidationError(f"invalid object key {short_repr(key)}: empty path component")
    if c in (b".", b".."):
        raise ValidationError(
            f"invalid object key {short_repr(key)}: '.' and '..' components are not allowed"
        )
    if len(c) > _MAX_COMPONENT_BYTES:
        raise ValidationError(
            f"invalid object key {short_repr(key)}: a path component is longer than "
            f"{_MAX_COMPONENT_BYTES} bytes"
        )


def validate_key(key: str) -> bytes:
    """The key as UTF-8 bytes, or ValidationError when it cannot be stored safely under the root."""
    if not isinstance(key, str):
        raise ValidationError(f"object key must be a str, got {type(key).__name__}")
    if not key:
        raise ValidationError("invalid object key: empty")
    if "\x00" in key:
        raise ValidationError(f"invalid object key {short_repr(key)}: contains a NUL byte")
    if "\\" in key:
        raise ValidationError(f"invalid object key {short_repr(key)}: contains a backslash")
    if key.startswith("/"):
        raise ValidationError(f"invalid object key {short_repr(key)}: absolute path")
    try:
        kb = key.encode("utf-8")
    except UnicodeEncodeError:
        raise ValidationError(f"invalid object key {short_repr(key)}: not valid UTF-8") from None
    parts = kb.split(b"/")
    for c in parts:
        _check_component(c, key)
    if parts[0] == _INTERNAL_B:
        raise ValidationError(
            f"invalid object key {short_repr(key)}: {INTERNAL_DIR!r} is reserved for the store"
        )
    return kb


def _byte_view(data: Buffer) -> memoryview:
    mv = memoryview(data)
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    return mv


@dataclass
class _DirListing:
    mtime_ns: int
    ino: int
    sortnames: list[bytes]  # name, or name + b"/" for directories: DFS in this order is key order
    entries: list[tuple[bytes, bool]]  # (name, is_dir)


@counted
class FilesystemBlobStore:
    """BlobStore on a local (or shared POSIX) filesystem directory."""

    driver = DRIVER_LOCAL  # not "filesystem": Pulsar's Hadoop offloader has that name

    def __init__(self, root: str | Path, fsync: bool = True) -> None:
        self.root = Path(root).absolute()
        self.fsync = fsync
        self._root = os.fsencode(self.root)
        self._internal = self._root + b"/" + _INTERNAL_B
        self._tmp = self._internal + b"/tmp"
        self._meta = self._internal + b"/meta"
        uploads, trash = self._internal + b"/uploads", self._internal + b"/trash"
        self._lock_path = self._internal + b"/lock"
        try:
            for d in (self._root, self._internal, self._tmp, self._meta, uploads, trash):
                os.makedirs(d, exist_ok=True)
        except OSError as e:
            raise BlobStoreError(
                f"filesystem store: cannot create store directories under {str(self.root)!r}: {e}"
            ) from e
        self._thread_lock = threading.Lock()
        self._lock_fd: int | None = None
        self._lock_pid = 0
        self._lock_closer: weakref.finalize | None = None
        self._cache_lock = threading.Lock()
        self._dir_cache: OrderedDict[bytes, _DirListing] = OrderedDict()
        self._multipart = MultipartUploads(self.root, uploads, trash)
        self._sweep()

    def __repr__(self) -> str:
        return f"FilesystemBlobStore({str(self.root)!r})"

    def driver_properties(self) -> dict[str, str]:
        return {"root": str(self.root)}

    # --- plumbing ------------------------------------------------------------------------------

    def _sweep(self) -> None:
        """Remove leftovers of crashed processes: trash and old temp files."""
        self._multipart.sweep_trash()
        cutoff = time.time() - _STALE_TMP_SECONDS
        for entry in os.scandir(self._tmp):
            try:
                if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                    unlink_quiet(entry.path)
            except OSError:
                pass

    @contextmanager
    def _oserrors(self, what: str, key: object = None) -> Iterator[None]:
        try:
            yield
        except TieredError:
            raise
        except OSError as e:
            on = f" {short_repr(key)}" if key is not None else ""
            raise BlobStoreError(
                f"filesystem store {str(self.root)!r}: {what}{on} failed: {e.strerror or e}"
            ) from e

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with self._thread_lock:
            if self._lock_fd is None or self._lock_pid != os.getpid():
                # after fork the inherited descriptor shares its lock with the parent: reopen (closing
                # the inherited copy releases nothing of the parent's); the descriptor is closed when
                # the store is collected, else every store a long-lived process opens leaks one
                if self._lock_closer is not None:
                    self._lock_closer()
                self._lock_fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
                self._lock_pid = os.getpid()
                self._lock_closer = weakref.finalize(self, os.close, self._lock_fd)
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def _obj_path(self, kb: bytes) -> bytes:
        return self._root + b"/" + kb

    def _meta_path(self, kb: bytes) -> bytes:
        return self._meta + b"/" + kb

    def _new_tmp(self) -> bytes:
        return self._tmp + b"/%d-%s.tmp" % (os.getpid(), secrets.token_hex(8).encode())

    def _write_new_file(self, data: Buffer) -> bytes:
        tmp = self._new_tmp()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        try:
            write_all(fd, data)
            if self.fsync:
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            unlink_quiet(tmp)
            raise
        os.close(fd)
        return tmp

    def _makedirs(self, path: bytes, base: bytes, key: str) -> list[bytes]:
        """mkdir -p of path (below base); returns the directories it created, outermost first."""
        missing: list[bytes] = []
        p = path
        while p != base and not os.path.isdir(p):
            missing.append(p)
            p = os.path.dirname(p)
        created = []
        for d in reversed(missing):
            try:
                os.mkdir(d)
                created.append(d)
            except FileExistsError:
                if not os.path.isdir(d):
                    raise self._conflict(key) from None
            except NotADirectoryError:
                raise self._conflict(key) from None
        return created

    def _conflict(self, key: str) -> BlobStoreError:
        return BlobStoreError(
            f"filesystem store {str(self.root)!r}: cannot store {short_repr(key)}: a prefix of it is an "
            "existing object, or it is a prefix of existing keys "
            "(a filesystem cannot hold both 'a' and 'a/b')"
        )

    def _publish(self, kb: bytes, key: str, src: bytes, meta: dict[str, str], if_absent: bool = False) -> None:
        """Rename src into place as key, with its metadata sidecar (renamed first), atomically.
        ``if_absent``: ObjectExistsError when the key exists (checked under the store lock, which every
        writer of this root takes, so two creators cannot both win)."""
        meta_tmp = self._write_new_file(json.dumps({"metadata": meta}).encode()) if meta else None
        dest, mdest = self._obj_path(kb), self._meta_path(kb)
        synced: set[bytes] = set()
        try:
            with self._locked():
                if if_absent and os.path.isfile(dest):
                    raise ObjectExistsError(f"object {short_repr(key)} already exists in {str(self.root)!r}")
                for _attempt in range(10):  # a concurrent delete may prune a parent directory we made
                    try:
                        created = self._makedirs(os.path.dirname(dest), self._root, key)
                        if meta_tmp is not None:
                            created += self._makedirs(os.path.dirname(mdest), self._meta, key)
                            os.rename(meta_tmp, mdest)
                        else:
                            unlink_quiet(mdest)
                        try:
                            os.rename(src, dest)
                        except BaseException:
                            if meta_tmp is not None:
                                unlink_quiet(mdest)
                            raise
                        break
                    except FileNotFoundError:
                        if not os.path.exists(src):
                            raise
                        continue
                    except (IsADirectoryError, NotADirectoryError):
                        # dest (or its sidecar path) is a directory: fine only if it is empty
                        for d in (dest, mdest):
                            if os.path.isdir(d):
                                try:
                                    os.rmdir(d)
                                except OSError:
                                    raise self._conflict(key) from None
                        continue
                    except OSError as e:
                        if e.errno == errno.ENOTEMPTY:
                            raise self._conflict(key) from None
                        raise
                else:
                    raise BlobStoreError(
                        f"filesystem store: could not place {short_repr(key)} (directories kept vanishing)"
                    )
            if self.fsync:
                for d in [*created, dest]:
                    parent = os.path.dirname(d)
                    if parent not in synced:
                        synced.add(parent)
                        fsync_dir(parent)
                if meta_tmp is not None:
                    fsync_dir(os.path.dirname(mdest))
        finally:
            if meta_tmp is not None:
                unlink_quiet(meta_tmp)

    def _prune_dirs(self, path: bytes, base: bytes) -> None:
        """rmdir path and its parents while empty, stopping at base."""
        while path != base and path.startswith(base + b"/"):
            try:
                os.rmdir(path)
            except OSError:
                return
            path = os.path.dirname(path)

    def _open_object(self, kb: bytes, key: str) -> tuple[int, os.stat_result]:
        try:
            fd = os.open(self._obj_path(kb), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except (FileNotFoundError, NotADirectoryError):
            raise NoSuchObjectError(f"no object {short_repr(key)} in {str(self.root)!r}") from None
        except OSError as e:
            if e.errno == errno.ELOOP:  # a symlink: not an object of this store
                raise NoSuchObjectError(f"no object {short_repr(key)} in {str(self.root)!r}") from None
            raise
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise NoSuchObjectError(f"no object {short_repr(key)} in {str(self.root)!r}")
        return fd, st

    # --- objects -------------------------------------------------------------------------------

    def put(self, key: str, data: Buffer, metadata: Mapping[str, str] | None = None, *,
            if_absent: bool = False) -> None:
        kb = validate_key(key)
        meta = normalize_metadata(metadata)
        with self._oserrors("put", key):
            tmp = self._write_new_file(data)
            try:
                self._publish(kb, key, tmp, meta, if_absent)
            finally:
                unlink_quiet(tmp)

    def get(self, key: str) -> bytes:
        kb = validate_key(key)
        with self._oserrors("get", key):
            fd, st = self._open_object(kb, key)
            try:
                return pread_exact(fd, st.st_size, 0)
            finally:
                os.close(fd)

    def get_range(self, key: str, start: int, end: int) -> bytes:
        kb = validate_key(key)
        if start < 0 or end < start:
            raise BadRangeError(f"bad range {start}-{end} for {short_repr(key)}")
        with self._oserrors("get_range", key):
            fd, st = self._open_object(kb, key)
            try:
                if start >= st.st_size:
                    raise BadRangeError(
                        f"range {start}-{end} of {short_repr(key)} starts past its end ({st.st_size} bytes)"
                    )
                end = min(end, st.st_size - 1)
                return pread_exact(fd, end - start + 1, start)
            finally:
                os.close(fd)

    def head(self, key: str) -> ObjectInfo:
        kb = validate_key(key)
        with self._oserrors("head", key), self._locked():
            try:
                st = os.stat(self._obj_path(kb), follow_symlinks=False)
            except (FileNotFoundError, NotADirectoryError):
                raise NoSuchObjectError(f"no object {short_repr(key)} in {str(self.root)!r}") from None
            if not stat.S_ISREG(st.st_mode):
                raise NoSuchObjectError(f"no object {short_repr(key)} in {str(self.root)!r}")
            try:
                with open(self._meta_path(kb), "rb") as f:
                    meta = json.loads(f.read())["metadata"]
            except (FileNotFoundError, NotADirectoryError):
                meta = {}
            except (ValueError, KeyError, TypeError) as e:
                raise BlobStoreError(
                    f"filesystem store: corrupt metadata sidecar of {short_repr(key)}: {e}"
                ) from e
        return ObjectInfo(key=key, size=st.st_size, last_modified=st.st_mtime, metadata=dict(meta))

    def delete(self, keys: Sequence[str]) -> None:
        if isinstance(keys, str):
            raise ValidationError("delete() takes a sequence of keys, not a single str")
        checked = [(k, validate_key(k)) for k in keys]  # nothing is deleted when any key is invalid
        failed: list[str] = []
        for key, kb in checked:
            path, mpath = self._obj_path(kb), self._meta_path(kb)
            try:
                with self._locked():
                    try:
                        if stat.S_ISREG(os.lstat(path).st_mode):
                            os.unlink(path)
                    except (FileNotFoundError, NotADirectoryError):
                        pass
                    unlink_quiet(mpath)
            except OSError as e:
                failed.append(f"{key!r} ({e.strerror or e})")
                continue
            self._prune_dirs(os.path.dirname(path), self._root)
            self._prune_dirs(os.path.dirname(mpath), self._meta)
        if failed:
            raise BlobStoreError(
                f"filesystem store {str(self.root)!r}: could not delete {len(failed)} key(s): "
                + ", ".join(failed[:20])
                + (" ..." if len(failed) > 20 else "")
            )

    # --- listing -------------------------------------------------------------------------------

    def list(self, prefix: str = "", token: str | None = None, page_size: int = 1000, *,
             start_after: str | None = None) -> ListPage:
        if not isinstance(page_size, int) or page_size < 1:
            raise ValidationError(f"list: page_size must be a positive int, got {page_size!r}")
        if not isinstance(prefix, str):
            raise ValidationError(f"list: prefix must be a str, got {type(prefix).__name__}")
        for name, v in (("token", token), ("start_after", start_after)):
            if v is not None and not isinstance(v, str):
                raise ValidationError(f"list: {name} must be a str or None, got {type(v).__name__}")
        # the continuation token is the last key returned: both mean "keys greater than this"
        token = token or start_after
        try:
            pb = prefix.encode("utf-8")
            tb = token.encode("utf-8") if token else None
        except UnicodeEncodeError:
            raise ValidationError(f"list: prefix or token is not valid UTF-8: {short_repr(prefix)}") from None
        objects: list[ObjectInfo] = []
        more = False
        with self._oserrors("list", prefix):
            for kb, path in self._iter_keys(pb, tb):
                try:
                    st = os.stat(path, follow_symlinks=False)
                except (FileNotFoundError, NotADirectoryError):
                    continue  # deleted since the directory was read
                if not stat.S_ISREG(st.st_mode):
                    continue
                if len(objects) == page_size:
                    more = True
                    break
                objects.append(ObjectInfo(key=kb.decode("utf-8"), size=st.st_size, last_modified=st.st_mtime))
        return ListPage(objects=objects, next_token=objects[-1].key if more else None)

    def _iter_keys(self, pb: bytes, tb: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        """(key, path) of every file whose key starts with pb and is greater than tb, in byte order."""
        slash = pb.rfind(b"/")
        dir_rel, name_prefix = (pb[:slash], pb[slash + 1 :]) if slash >= 0 else (b"", pb)
        if slash >= 0:
            comps = dir_rel.split(b"/")
            for c in comps:
                if not c or c in (b".", b"..") or len(c) > _MAX_COMPONENT_BYTES or b"\\" in c or b"\x00" in c:
                    return  # no valid key has this prefix
            if comps[0] == _INTERNAL_B:
                return
            base = dir_rel + b"/"
            start_dir = self._root + b"/" + dir_rel
        else:
            base = b""
            start_dir = self._root
        if tb is not None and not tb.startswith(base) and tb > base:
            return  # every key under the prefix sorts before the token
        # explicit stack (keys may be hundreds of components deep): [dir path, key base, listing, index]
        stack: list[list] = []

        def push(dir_path: bytes, key_base: bytes, name_pfx: bytes) -> None:
            listing = self._read_dir(dir_path)
            if listing is None:
                return
            names = listing.sortnames
            lo = bisect.bisect_left(names, name_pfx) if name_pfx else 0
            if tb is not None and tb.startswith(key_base):
                rem = tb[len(key_base) :]
                i = bisect.bisect_right(names, rem)
                if i > 0 and listing.entries[i - 1][1] and rem.startswith(names[i - 1]):
                    i -= 1  # the token lies inside this subdirectory: resume within it
                lo = max(lo, i)
            stack.append([dir_path, key_base, listing, lo, name_pfx])

        push(start_dir, base, name_prefix)
        while stack:
            frame = stack[-1]
            dir_path, key_base, listing, idx, name_pfx = frame
            if idx >= len(listing.entries):
                stack.pop()
                continue
            name, is_dir = listing.entries[idx]
            if name_pfx and not name.startswith(name_pfx):
                stack.pop()  # names with the prefix are contiguous in sort order
                continue
            frame[3] = idx + 1
            if not key_base and name == _INTERNAL_B:
                continue
            kb = key_base + name
            if is_dir:
                push(dir_path + b"/" + name, kb + b"/", b"")
            elif tb is None or kb > tb:
                yield kb, dir_path + b"/" + name

    def _read_dir(self, dir_path: bytes) -> _DirListing | None:
        try:
            st = os.stat(dir_path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        if not stat.S_ISDIR(st.st_mode):
            return None
        with self._cache_lock:
            cached = self._dir_cache.get(dir_path)
            if cached is not None and cached.mtime_ns == st.st_mtime_ns and cached.ino == st.st_ino:
                self._dir_cache.move_to_end(dir_path)
                return cached
        scan_started = time.time_ns()
        rows: list[tuple[bytes, bytes, bool]] = []
        try:
            it = os.scandir(dir_path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        with it:
            for e in it:
                name = e.name
                if b"\\" in name:
                    continue  # cannot be addressed by a valid key
                try:
                    name.decode("utf-8")
                except UnicodeDecodeError:
                    continue
                if e.is_dir(follow_symlinks=False):
                    rows.append((name + b"/", name, True))
                elif e.is_file(follow_symlinks=False):
                    rows.append((name, name, False))
        rows.sort()
        listing = _DirListing(st.st_mtime_ns, st.st_ino, [r[0] for r in rows], [(r[1], r[2]) for r in rows])
        if len(rows) >= _DIR_CACHE_MIN_ENTRIES and scan_started - st.st_mtime_ns > _DIR_CACHE_SETTLE_NS:
            with self._cache_lock:
                self._dir_cache[dir_path] = listing
                self._dir_cache.move_to_end(dir_path)
                while len(self._dir_cache) > _DIR_CACHE_MAX_DIRS:
                    self._dir_cache.popitem(last=False)
        return listing

    # --- multipart (the upload directories are fs_multipart's) ---------------------------------

    copies_file_slices = True  # FileSlice pieces are copied with copy_file_range
    concurrent_parts = False  # parts append to one data file under the upload's lock
    # the kernel reads ahead of sequential preads: larger windows and a read-ahead thread of our own
    # measured no faster here (and slower at 1 KiB entries)
    reads_ahead = True

    def initiate_multipart(self, key: str, metadata: Mapping[str, str] | None = None) -> str:
        validate_key(key)
        meta = normalize_metadata(metadata)
        with self._oserrors("initiate_multipart", key):
            return self._multipart.initiate(key, meta, self.fsync)

    def upload_part(self, key: str, upload_id: str, part_number: int, data: Buffer | Pieces) -> CompletedPart:
        check_part_number(part_number, short_repr(key))
        pieces = [_byte_view(data)] if isinstance(data, bytes | bytearray | memoryview) else [
            p if isinstance(p, FileSlice) else _byte_view(p) for p in data
        ]
        size = sum(map(piece_length, pieces))
        etag = secrets.token_hex(16)
        with self._oserrors("upload_part", key), self._multipart.open_upload(key, upload_id) as up:
            self._multipart.write_part(up, part_number, pieces, size, etag, writeback=self.fsync)
        return CompletedPart(part_number=part_number, etag=etag, size=size)

    def complete_multipart(self, key: str, upload_id: str, parts: Sequence[CompletedPart]) -> None:
        kb = validate_key(key)
        if not parts:
            raise ValidationError(f"complete_multipart of {short_repr(key)}: no parts given")
        with self._oserrors("complete_multipart", key), self._multipart.open_upload(key, upload_id) as up:
            src = self._multipart.assemble(up, key, parts, self._new_tmp, self.fsync)
            try:
                self._publish(kb, key, src, up.manifest.get("metadata") or {})
            finally:
                if src != up.data_path:  # a temp copy; the upload's own data file goes with the upload
                    unlink_quiet(src)
            self._multipart.remove(up)

    def abort_multipart(self, key: str, upload_id: str) -> None:
        try:
            with self._oserrors("abort_multipart", key), self._multipart.open_upload(key, upload_id) as up:
                self._multipart.remove(up)
        except NoSuchUploadError:
            pass

    def list_multipart_uploads(self, prefix: str = "") -> list[MultipartUploadInfo]:
        with self._oserrors("list_multipart_uploads", prefix):
            return self._multipart.list_uploads(prefix)
