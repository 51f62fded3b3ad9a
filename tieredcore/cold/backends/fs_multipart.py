"""S3-like multipart uploads of the filesystem store (tieredcore.cold.backends.fs), emulated on disk.

Layout under the store's internal area (``<root>/.tiered``)::

    uploads/<upload_id>/            one multipart upload:
        manifest.json                   key, metadata, initiated time (its absence = upload gone)
        parts.log                       journal: one JSON line per uploaded part
        data                            in-order parts appended back to back (the fast path)
        part-<n>-<random>               out-of-order or re-uploaded parts
    trash/                          upload directories being removed

An upload directory is flock'ed while a part is written or the upload is completed or aborted, and its
journal is read incrementally (parsed states are cached per upload id). Completing an upload whose
parts start with the data file's chain cuts that file and appends the rest to it; otherwise the parts
are copied into a new temp file of the store. Copies go through copy_file_range where the kernel can
and source and destination offsets agree modulo the page size, else through a small buffer.

The store validates arguments, maps OSError to BlobStoreError and publishes the assembled file as the
object: this module never touches objects. Multipart state survives restarts of the process but not a
machine crash before complete (parts are fsynced only as part of the completed object).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import mmap
import os
import re
import secrets
import shutil
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tieredcore.cold.backends.fs_util import fsync_dir, short_repr, unlink_quiet
from tieredcore.cold.blob import MIN_PART_NUMBER, CompletedPart, MultipartUploadInfo
from tieredcore.errors import BlobStoreError, NoSuchUploadError, ValidationError
from tieredcore.fileio import pread_exact, preadv_exact, write_all
from tieredcore.model import Buffer, FileSlice

_UPLOAD_ID_RE = re.compile(r"[0-9a-f]{32}")
_MANIFEST = "manifest.json"
_JOURNAL = "parts.log"
_DATA = "data"
_COPY_CHUNK = 4 << 20  # a misaligned copy's buffer (per thread): 1-4 MiB measured fastest, 16 MiB slower
_BUFFERED_COPY_MIN = 64 << 10  # below this a misaligned copy_file_range costs less than the buffer's setup
_PAGE = mmap.PAGESIZE
_UPLOAD_CACHE_MAX = 64


def copy_range(src_fd: int, src_off: int, dst_fd: int, dst_off: int, n: int, writeback: bool = False) -> None:
    """Kernel-side copy (copy_file_range: reflink or in-kernel) with a pread/pwrite fallback.

    copy_file_range splices whole source pages: when source and destination offsets differ modulo the
    page size (a block's frames start 128 bytes into the object, anywhere in the hot-tier file), every
    page is written as two partial ones, and the copy and the fsync that follows it measured ~1.5x
    slower than an aligned copy. Such ranges go through a small reused buffer instead (pread + pwrite:
    measured as fast as an aligned copy_file_range, and faster than pwrite from a mapping).
    ``writeback``: start writing each copied range to disk right away (see start_writeback)."""
    use_cfr = hasattr(os, "copy_file_range") and not (n >= _BUFFERED_COPY_MIN and (src_off - dst_off) % _PAGE)
    while n > 0:
        if use_cfr:
            try:
                c = os.copy_file_range(src_fd, dst_fd, n, src_off, dst_off)
            except OSError as e:
                if e.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EPERM):
                    raise
                use_cfr = False
                continue
        else:
            buf = _copy_buffer()
            with memoryview(buf)[: min(n, len(buf))] as window:
                got = preadv_exact(src_fd, window, src_off)
                c = write_all(dst_fd, window[:got], dst_off) if got else 0
        if c == 0:
            raise BlobStoreError("filesystem store: multipart part file is shorter than recorded")
        if writeback:
            start_writeback(dst_fd, dst_off, c)
        src_off += c
        dst_off += c
        n -= c


_copy_buffers = threading.local()


def _copy_buffer() -> mmap.mmap:
    """This thread's copy buffer (small enough to stay in the CPU's cache between read and write)."""
    buf = getattr(_copy_buffers, "buf", None)
    if buf is None:
        buf = _copy_buffers.buf = mmap.mmap(-1, _COPY_CHUNK)
    return buf


def write_pieces(fd: int, pieces: Sequence[Buffer | FileSlice], offset: int, writeback: bool = False) -> None:
    """Write the pieces back to back at `offset` of fd; FileSlices are copied with copy_range.
    ``writeback``: start writing them to disk as they are written (see start_writeback)."""
    for p in pieces:
        if isinstance(p, FileSlice):
            src = os.open(p.path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                copy_range(src, p.offset, fd, offset, p.length, writeback)
            finally:
                os.close(src)
            offset += p.length
        else:
            n = write_all(fd, p, offset)
            if writeback:
                start_writeback(fd, offset, n)
            offset += n


def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_SYNC_FILE_RANGE = _sync_file_range() if sys.platform.startswith("linux") else None
_SYNC_FILE_RANGE_WRITE = 2


def start_writeback(fd: int, offset: int, n: int) -> None:
    """Ask the kernel to start writing the whole pages of fd just written (``[offset, offset + n)``) to
    disk now, without waiting (Linux sync_file_range WRITE; elsewhere nothing). Bytes of a part that
    will be fsynced at completion then go to disk while later parts are still being copied: the fsync
    only waits for what is in flight (measured on 128 MiB: copy + fsync 64-80 ms instead of 87-107).
    The last, partly written page is left out: the next write completes it, and writing into a page
    under writeback waits for the disk. Not a durability step: the fsync at completion still is."""
    start, end = offset - offset % _PAGE, (offset + n) - (offset + n) % _PAGE
    if _SYNC_FILE_RANGE is not None and end > start:
        _SYNC_FILE_RANGE(fd, start, end - start, _SYNC_FILE_RANGE_WRITE)  # an error only forgoes the head start


@dataclass
class _PartRec:
    number: int
    file: str  # _DATA or a part file name in the upload directory
    offset: int
    size: int
    etag: str


@dataclass
class _UploadState:
    ino: int
    pos: int = 0  # journal bytes consumed
    parts: dict[int, _PartRec] = field(default_factory=dict)
    chain: list[_PartRec] = field(default_factory=list)  # parts appended to the data file, in order

    @property
    def data_end(self) -> int:
        return self.chain[-1].offset + self.chain[-1].size if self.chain else 0

    def apply(self, rec: dict) -> None:
        if "truncate" in rec:  # the data file was cut back to its first `truncate` chain parts
            k = rec["truncate"]
            for r in self.chain[k:]:
                if self.parts.get(r.number) is r:
                    del self.parts[r.number]
            del self.chain[k:]
            return
        p = _PartRec(rec["n"], rec["f"], rec["off"], rec["size"], rec["etag"])
        self.parts[p.number] = p
        if p.file == _DATA:
            self.chain.append(p)


@dataclass
class Upload:
    """One open (locked) upload: valid inside MultipartUploads.open_upload() only."""

    upload_id: str
    path: bytes
    fd: int  # the upload directory, flock'ed
    manifest: dict
    state: _UploadState

    @property
    def data_path(self) -> bytes:
        return self.path + b"/" + _DATA.encode()


class MultipartUploads:
    """The multipart uploads of one filesystem store: directories under `uploads`, removed via `trash`."""

    def __init__(self, root: Path, uploads: bytes, trash: bytes) -> None:
        self._where = str(root)  # for error messages
        self._uploads = uploads
        self._trash = trash
        self._cache_lock = threading.Lock()
        self._cache: OrderedDict[str, _UploadState] = OrderedDict()

    def sweep_trash(self) -> None:
        """Remove upload directories a crashed process left in the trash."""
        for entry in os.scandir(self._trash):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                unlink_quiet(entry.path)

    def initiate(self, key: str, meta: dict[str, str], fsync: bool) -> str:
        upload_id = f"{time.time_ns():016x}{secrets.token_hex(8)}"
        path = self._uploads + b"/" + upload_id.encode()
        os.mkdir(path)
        manifest = json.dumps({"key": key, "metadata": meta, "initiated": time.time()}).encode()
        tmp = path + b"/" + _MANIFEST.encode() + b".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        try:
            write_all(fd, manifest)
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path + b"/" + _MANIFEST.encode())
        if fsync:
            fsync_dir(path)
            fsync_dir(self._uploads)
        return upload_id

    @contextmanager
    def open_upload(self, key: str, upload_id: str) -> Iterator[Upload]:
        """The upload, locked against other threads and processes, with its journal read up to date."""
        missing = NoSuchUploadError(
            f"no multipart upload {short_repr(upload_id)} for {short_repr(key)} in {self._where!r}"
        )
        if not isinstance(upload_id, str) or not _UPLOAD_ID_RE.fullmatch(upload_id):
            raise missing
        path = self._uploads + b"/" + upload_id.encode()
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            raise missing from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                mfd = os.open(_MANIFEST, os.O_RDONLY | os.O_CLOEXEC, dir_fd=fd)
            except FileNotFoundError:
                raise missing from None  # aborted or completed while we waited for the lock
            with os.fdopen(mfd, "rb") as f:
                manifest = json.loads(f.read())
            if manifest.get("key") != key:
                raise missing
            state = self._load_state(upload_id, fd)
            yield Upload(upload_id, path, fd, manifest, state)
        finally:
            os.close(fd)  # also releases the flock

    def _load_state(self, upload_id: str, dir_fd: int) -> _UploadState:
        ino = os.fstat(dir_fd).st_ino
        with self._cache_lock:
            state = self._cache.pop(upload_id, None)
        if state is None or state.ino != ino:
            state = _UploadState(ino)
        try:
            jfd = os.open(_JOURNAL, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fd)
        except FileNotFoundError:
            jfd = None
        if jfd is not None:
            try:
                size = os.fstat(jfd).st_size
                if size > state.pos:
                    tail = pread_exact(jfd, size - state.pos, state.pos)
                    complete_len = tail.rfind(b"\n") + 1  # a torn last line (crashed writer) is ignored
                    for line in tail[:complete_len].splitlines():
                        if line.strip():
                            state.apply(json.loads(line))
                    state.pos += complete_len
            finally:
                os.close(jfd)
        with self._cache_lock:
            self._cache[upload_id] = state
            while len(self._cache) > _UPLOAD_CACHE_MAX:
                self._cache.popitem(last=False)
        return state

    def _journal(self, up: Upload, rec: dict) -> None:
        line = (json.dumps(rec, separators=(",", ":")) + "\n").encode()
        jfd = os.open(_JOURNAL, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666, dir_fd=up.fd)
        try:
            # a torn line left by a crashed writer must not swallow this one
            if os.fstat(jfd).st_size != up.state.pos:
                os.ftruncate(jfd, up.state.pos)
            write_all(jfd, line)
        finally:
            os.close(jfd)
        up.state.pos += len(line)
        up.state.apply(rec)

    def write_part(
        self, up: Upload, part_number: int, pieces: Sequence[Buffer | FileSlice], size: int, etag: str,
        writeback: bool = False,
    ) -> None:
        """Store part `part_number` (`size` bytes): appended to the data file when it is the next in
        sequence, else in a part file of its own (replacing an earlier upload of that number)."""
        state = up.state
        next_in_sequence = state.chain[-1].number + 1 if state.chain else MIN_PART_NUMBER
        if part_number == next_in_sequence and part_number not in state.parts:
            offset = state.data_end
            dfd = os.open(_DATA, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o666, dir_fd=up.fd)
            try:
                write_pieces(dfd, pieces, offset, writeback)
            except BaseException:
                os.ftruncate(dfd, offset)
                raise
            finally:
                os.close(dfd)
            self._journal(up, {"n": part_number, "f": _DATA, "off": offset, "size": size, "etag": etag})
        else:
            name = f"part-{part_number}-{secrets.token_hex(4)}"
            pfd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666, dir_fd=up.fd)
            try:
                write_pieces(pfd, pieces, 0, writeback)
            except BaseException:
                os.close(pfd)
                unlink_quiet(name.encode(), dir_fd=up.fd)
                raise
            os.close(pfd)
            old = state.parts.get(part_number)
            self._journal(up, {"n": part_number, "f": name, "off": 0, "size": size, "etag": etag})
            if old is not None and old.file != _DATA:
                unlink_quiet(old.file.encode(), dir_fd=up.fd)

    def assemble(
        self, up: Upload, key: str, parts: Sequence[CompletedPart], new_tmp: Callable[[], bytes], fsync: bool
    ) -> bytes:
        """A file holding the given parts in order, to be published as the object: the upload's data
        file itself (up.data_path) when the parts start with its chain, else a new file at new_tmp()
        (the caller removes it). ValidationError when the parts do not match the uploaded ones."""
        state = up.state
        recs: list[_PartRec] = []
        prev = 0
        for p in parts:
            if p.part_number <= prev:
                raise ValidationError(
                    f"complete_multipart of {short_repr(key)}: part numbers must be strictly ascending "
                    f"({p.part_number} after {prev})"
                )
            rec = state.parts.get(p.part_number)
            if rec is None:
                raise ValidationError(
                    f"complete_multipart of {short_repr(key)}: part {p.part_number} was not uploaded"
                )
            if rec.etag != p.etag.strip('"'):
                raise ValidationError(
                    f"complete_multipart of {short_repr(key)}: etag of part {p.part_number} does not match "
                    "(the part was re-uploaded or belongs to another upload)"
                )
            recs.append(rec)
            prev = p.part_number
        # k = how many requested parts are exactly the data file's leading chain
        k = 0
        while k < len(recs) and k < len(state.chain) and recs[k] is state.chain[k]:
            k += 1
        rest = recs[k:]
        data_path = up.data_path
        if k > 0 and all(r.file != _DATA for r in rest):
            # fast path: cut the data file after the prefix, append the rest; it becomes the object
            prefix_end = state.chain[k - 1].offset + state.chain[k - 1].size
            dfd = os.open(data_path, os.O_RDWR | os.O_CLOEXEC)
            try:
                if os.fstat(dfd).st_size != prefix_end:
                    if k < len(state.chain):
                        self._journal(up, {"truncate": k})  # keep the journal true if we fail below
                    os.ftruncate(dfd, prefix_end)
                off = prefix_end
                for r in rest:
                    with self._part_fd(up, r) as sfd:
                        copy_range(sfd, r.offset, dfd, off, r.size)
                    off += r.size
                if fsync:
                    os.fsync(dfd)
            finally:
                os.close(dfd)
            return data_path
        src = new_tmp()
        dfd = os.open(src, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        try:
            off = 0
            for r in recs:
                with self._part_fd(up, r) as sfd:
                    copy_range(sfd, r.offset, dfd, off, r.size)
                off += r.size
            if fsync:
                os.fsync(dfd)
        except BaseException:
            os.close(dfd)
            unlink_quiet(src)
            raise
        os.close(dfd)
        return src

    @contextmanager
    def _part_fd(self, up: Upload, rec: _PartRec) -> Iterator[int]:
        fd = os.open(rec.file, os.O_RDONLY | os.O_CLOEXEC, dir_fd=up.fd)
        try:
            yield fd
        finally:
            os.close(fd)

    def remove(self, up: Upload) -> None:
        """Delete the upload (completed or aborted)."""
        unlink_quiet(_MANIFEST.encode(), dir_fd=up.fd)  # from here on the upload does not exist
        with self._cache_lock:
            self._cache.pop(up.upload_id, None)
        trash = self._trash + b"/%s-%s" % (up.upload_id.encode(), secrets.token_hex(4).encode())
        try:
            os.rename(up.path, trash)
        except OSError:
            trash = up.path
        shutil.rmtree(trash, ignore_errors=True)

    def list_uploads(self, prefix: str) -> list[MultipartUploadInfo]:
        """Uploads whose key starts with prefix, in key (UTF-8 byte) order, then by initiation."""
        out: list[MultipartUploadInfo] = []
        with os.scandir(self._uploads) as it:
            for e in it:
                upload_id = e.name.decode("ascii", "replace")
                if not _UPLOAD_ID_RE.fullmatch(upload_id) or not e.is_dir(follow_symlinks=False):
                    continue
                try:
                    with open(e.path + b"/" + _MANIFEST.encode(), "rb") as f:
                        manifest = json.loads(f.read())
                except (FileNotFoundError, NotADirectoryError, ValueError):
                    continue  # being created, or being removed
                key = manifest.get("key")
                if isinstance(key, str) and key.startswith(prefix):
                    out.append(
                        MultipartUploadInfo(
                            key=key, upload_id=upload_id, initiated=float(manifest["initiated"])
                        )
                    )
        out.sort(key=lambda u: (u.key.encode("utf-8"), u.initiated, u.upload_id))
        return out
