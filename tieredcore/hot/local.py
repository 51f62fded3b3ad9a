"""Hot tier: a local ledger store with Apache BookKeeper's semantics.

One directory holds every ledger as three files, ``<id>.log`` (entry frames), ``<id>.idx`` (one
16-byte record per entry: frame offset, CRC32C, length) and ``<id>.meta`` (BookKeeper metadata); their
byte layout, and the recovery scan that cuts a torn tail, are in :mod:`tieredcore.hot.format`.
The offloader copies a contiguous byte range of the ``.log`` straight into an offload data block
(:meth:`LocalLedgerHandle.read_frames`); the ``.idx`` is loaded in bulk at open for O(1) random access.
``.meta`` is replaced atomically (temp file + fsync + rename + directory fsync). Its existence *is* the
ledger: it is written last at creation and unlinked first at deletion; ``.log``/``.idx`` without
``.meta`` are leftovers that :meth:`LocalLedgerStore.sweep` removes.

``LEDGER_ID`` holds the last allocated id; allocation, file creation and sweeping run under an
``fcntl.flock`` of that file, so ids are unique and strictly increasing across processes.

A writer holds an exclusive ``flock`` on its ``.idx`` for its whole life. Recovery of an OPEN ledger
(cutting a torn tail left by a writer that died) only runs when that lock can be taken, i.e. never
under a live writer; a reader of a ledger that is still being written sees the entries whose index
record exists (BookKeeper's "open without recovery"). Sealed (CLOSED) ledgers are never modified.

Durability: ``append``/``append_many`` return only after the frame bytes and then the index records
were handed to the kernel with ``write`` (they survive a kill of the process); with ``fsync=True`` both
files are also ``fdatasync``-ed before returning. ``close()`` (seal) always syncs.
"""

from __future__ import annotations

import array
import contextlib
import errno
import fcntl
import itertools
import operator
import os
import secrets
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import crc32c

from tieredcore.errors import (
    BadRangeError,
    CorruptEntryError,
    FormatError,
    HotLedgerNotFoundError,
    LedgerStateError,
    StaleHandleError,
    ValidationError,
)
from tieredcore.fileio import pread_exact, preadv_exact, write_all
from tieredcore.hot.format import (
    COUNTER_FILE,
    COUNTER_WIDTH,
    FRAME_HEADER,
    FRAME_HEADER_LEN,
    IDX,
    IDX_RECORD,
    IDX_RECORD_LEN,
    KINDS,
    LOG,
    MAX_ENTRY_SIZE,
    META,
    cut_torn_tail,
    decode_metadata,
    encode_index,
    encode_metadata,
    ledger_file,
    metadata_with_index,
    read_index,
)
from tieredcore.model import STATE_CLOSED, STATE_OPEN, Entry, EntryBatch, FileSlice, LedgerMetadata

__all__ = [
    "FRAME_HEADER_LEN",
    "IDX_RECORD_LEN",
    "LocalLedgerHandle",
    "LocalLedgerStore",
    "WritableLedger",
]

# append_many writes its frames in batches of about this many bytes (one write() for the frames and
# one for the index records of each batch), so memory stays bounded for generators of any length.
APPEND_BATCH_BYTES = 16 * 1024 * 1024
# Temp files of an interrupted metadata write older than this are removed by sweep().
TMP_GRACE_SECONDS = 600.0

_IOV_MAX = min(1024, os.sysconf("SC_IOV_MAX")) if hasattr(os, "sysconf") else 1024

_crc = crc32c.crc32c

Buffer = bytes | bytearray | memoryview


# --- helpers ---------------------------------------------------------------------------------


def _check_ledger_id(ledger_id: object) -> int:
    if isinstance(ledger_id, bool) or not isinstance(ledger_id, int) or ledger_id < 0:
        raise ValidationError(f"ledger id must be a non-negative int, got {ledger_id!r}")
    return int(ledger_id)


def _check_entry_id(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(f"{name} must be an int, got {value!r}")
    return int(value)


def _as_payload(data: object) -> bytes | bytearray | memoryview:
    """Accept any bytes-like object (never str); returns something crc32c and bytes.join take."""
    t = type(data)
    if t is bytes or t is bytearray:
        return data  # type: ignore[return-value]
    if isinstance(data, str):
        raise ValidationError("entry payload must be bytes-like, not str")
    try:
        mv = memoryview(data)  # type: ignore[arg-type]
    except TypeError:
        raise ValidationError(f"entry payload must be bytes-like, got {t.__name__}") from None
    if not mv.c_contiguous:
        return mv.tobytes()
    return mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv


def _normalize_custom_metadata(custom_metadata: Mapping[str, bytes | str] | None) -> dict[str, bytes]:
    if custom_metadata is None:
        return {}
    if not isinstance(custom_metadata, Mapping):
        raise ValidationError(f"custom metadata must be a mapping, got {type(custom_metadata).__name__}")
    out: dict[str, bytes] = {}
    for key, value in custom_metadata.items():
        if not isinstance(key, str) or not key:
            raise ValidationError(f"custom metadata keys must be non-empty strings, got {key!r}")
        if isinstance(value, str):
            out[key] = value.encode("utf-8")
        elif isinstance(value, bytes | bytearray | memoryview):
            out[key] = bytes(value)
        else:
            raise ValidationError(
                f"custom metadata value of {key!r} must be bytes or str, got {type(value).__name__}"
            )
    return out


def _write_frame(fd: int, header: bytes, payload: Buffer) -> None:
    total = len(header) + len(payload)
    done = os.writev(fd, (header, payload))
    if done < total:  # short write (rare): finish the rest
        rest = (bytes(header) + bytes(payload))[done:]
        write_all(fd, rest)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def _close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


# --- writer ----------------------------------------------------------------------------------


class WritableLedger:
    """The single writer of one OPEN ledger (returned by :meth:`LocalLedgerStore.create_ledger`)."""

    def __init__(self, store: LocalLedgerStore, metadata: LedgerMetadata, log_fd: int, idx_fd: int) -> None:
        self._store = store
        self._meta = metadata
        self._id = metadata.ledger_id
        self._meta_path = store._path(self._id, META)
        self._log_path = store._path(self._id, LOG)
        self._log_fd = log_fd
        self._idx_fd = idx_fd  # holds the exclusive flock: "a live writer exists"
        self._fsync = store.fsync
        self._lock = threading.Lock()
        self._next = 0  # next entry id
        self._log_end = 0  # bytes of whole acknowledged frames
        self._length = 0  # payload bytes
        self._sealed: LedgerMetadata | None = None
        self._broken: str | None = None  # a write failed part-way: no more appends
        self._abandoned = False

    # -- properties

    @property
    def ledger_id(self) -> int:
        return self._id

    @property
    def last_add_confirmed(self) -> int:
        return self._next - 1

    @property
    def length(self) -> int:
        return self._length

    @property
    def is_closed(self) -> bool:
        return self._sealed is not None or self._abandoned

    @property
    def metadata(self) -> LedgerMetadata:
        if self._sealed is not None:
            return self._sealed
        return replace(self._meta, last_entry_id=self._next - 1, length=self._length)

    def __repr__(self) -> str:
        state = "closed" if self.is_closed else "open"
        return f"WritableLedger(ledger_id={self._id}, lac={self._next - 1}, {state})"

    # -- appends

    def _check_writable(self) -> None:
        if self._sealed is not None:
            raise LedgerStateError(f"ledger {self._id} is closed (sealed); cannot append")
        if self._abandoned:
            raise LedgerStateError(f"writer of ledger {self._id} was released (store closed)")
        if self._broken is not None:
            raise LedgerStateError(f"writer of ledger {self._id} failed earlier: {self._broken}")
        try:
            os.stat(self._meta_path)
        except FileNotFoundError:
            raise StaleHandleError(f"ledger {self._id} was deleted; cannot append") from None

    def append(self, data: Buffer) -> int:
        """Append one entry; returns its entry id once frame and index record are written."""
        payload = _as_payload(data)
        size = len(payload)
        if size > MAX_ENTRY_SIZE:
            raise ValidationError(f"ledger {self._id}: entry of {size} bytes is too large")
        with self._lock:
            self._check_writable()
            entry_id = self._next
            header = FRAME_HEADER.pack(size, entry_id)
            record = IDX_RECORD.pack(self._log_end, _crc(payload, _crc(header)), size)
            try:
                _write_frame(self._log_fd, header, payload)
                write_all(self._idx_fd, record)
                if self._fsync:
                    os.fdatasync(self._log_fd)
                    os.fdatasync(self._idx_fd)
            except BaseException as exc:
                self._broken = f"append of entry {entry_id} failed: {exc!r}"
                raise
            self._next = entry_id + 1
            self._log_end += FRAME_HEADER_LEN + size
            self._length += size
            return entry_id

    def append_many(self, payloads: Iterable[Buffer]) -> int:
        """Append entries in bulk; returns the last entry id (the unchanged LAC if there were none).

        Payloads are taken in chunks of ~16 MiB. Per chunk, headers, CRCs and index records are built
        with C-level map/array operations (no per-entry bytecode), the frames go out with writev()
        straight from the payload buffers (IOV_MAX iovecs a call, no join copy), then all index
        records of the chunk with one write(). If a payload is invalid or the iterable raises, the
        entries before it are appended (and acknowledged) and the error is raised.
        """
        with self._lock:
            self._check_writable()
            it = iter(payloads)
            count = 64  # entries of the first chunk; adapted to ~APPEND_BATCH_BYTES afterwards
            while True:
                chunk: list = []
                error: BaseException | None = None
                wanted = count
                try:
                    chunk.extend(itertools.islice(it, wanted))
                except BaseException as exc:  # keep what the iterable produced before failing
                    error = exc
                if chunk:
                    if set(map(type, chunk)) != {bytes}:
                        chunk, bad = self._normalize_chunk(chunk)
                        error = error if bad is None else bad
                    lens = array.array("q", map(len, chunk))
                    if lens and max(lens) > MAX_ENTRY_SIZE:
                        cut = next(i for i, n in enumerate(lens) if n > MAX_ENTRY_SIZE)
                        error = ValidationError(
                            f"ledger {self._id}: entry {self._next + cut} of {lens[cut]} bytes is too large"
                        )
                        del chunk[cut:], lens[cut:]
                    if chunk:
                        nbytes = self._write_chunk(chunk, lens)
                        count = max(1, min(65536, APPEND_BATCH_BYTES * len(chunk) // max(1, nbytes)))
                if error is not None:
                    raise error
                if len(chunk) < wanted:
                    break
            if self._fsync:
                try:
                    os.fdatasync(self._log_fd)
                    os.fdatasync(self._idx_fd)
                except BaseException as exc:
                    self._broken = f"fsync failed: {exc!r}"
                    raise
            return self._next - 1

    def _normalize_chunk(self, chunk: list) -> tuple[list, ValidationError | None]:
        out = []
        for i, item in enumerate(chunk):
            try:
                out.append(_as_payload(item))
            except ValidationError as exc:
                return out, ValidationError(f"ledger {self._id}: entry {self._next + i}: {exc}")
        return out, None

    def _write_chunk(self, chunk: list, lens: array.array) -> int:
        """Frames then index records of entries self._next.. (one per payload); returns frame bytes."""
        n = len(chunk)
        first = self._next
        ids = range(first, first + n)
        headers = list(map(FRAME_HEADER.pack, lens, ids))
        crcs = array.array("I", map(_crc, chunk, map(_crc, headers)))
        frame_sizes = list(map(operator.add, lens, itertools.repeat(FRAME_HEADER_LEN)))
        offsets = list(itertools.accumulate(frame_sizes, initial=self._log_end))
        log_end = offsets.pop()
        words = encode_index(offsets, crcs, lens, log_end)
        iov: list = [None] * (2 * n)
        iov[0::2] = headers
        iov[1::2] = chunk
        total = log_end - self._log_end
        try:
            self._writev_all(iov, offsets, log_end)
            write_all(self._idx_fd, words)
        except BaseException as exc:
            self._broken = f"append of entries {first}..{first + n - 1} failed: {exc!r}"
            raise
        self._next = first + n
        self._log_end = log_end
        self._length += total - FRAME_HEADER_LEN * n
        return total

    def _writev_all(self, iov: list, offsets: list[int], log_end: int) -> None:
        """Write the frames (iov = header, payload, ...; offsets = absolute frame starts)."""
        fd = self._log_fd
        n = len(offsets)
        per_call = _IOV_MAX // 2
        for k in range(0, n, per_call):
            group = iov[2 * k : 2 * (k + per_call)]
            want = (offsets[k + per_call] if k + per_call < n else log_end) - offsets[k]
            done = os.writev(fd, group)
            if done < want:  # short write (rare): finish this group byte-wise
                write_all(fd, b"".join(map(bytes, group))[done:])

    # -- seal

    def close(self) -> LedgerMetadata:
        """Seal: sync data and index, write metadata CLOSED (lastEntryId, length). Idempotent."""
        with self._lock:
            if self._sealed is not None:
                return self._sealed
            if self._abandoned:
                raise LedgerStateError(f"writer of ledger {self._id} was released (store closed)")
            if self._broken is not None:  # cut a partially written frame/record
                os.ftruncate(self._log_fd, self._log_end)
                os.ftruncate(self._idx_fd, self._next * IDX_RECORD_LEN)
            os.fdatasync(self._log_fd)
            os.fdatasync(self._idx_fd)
            if not os.path.exists(self._meta_path):
                self._release()
                raise StaleHandleError(f"ledger {self._id} was deleted; cannot close it")
            sealed = replace(
                self._meta, state=STATE_CLOSED, last_entry_id=self._next - 1, length=self._length
            )
            self._store._write_meta(sealed)
            # A delete that ran entirely between the existence check and the rename would leave our
            # metadata without data: detect it (delete unlinks .log before its second .meta unlink).
            try:
                still_ours = os.stat(self._log_path).st_ino == os.fstat(self._log_fd).st_ino
            except FileNotFoundError:
                still_ours = False
            if not still_ours:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._meta_path)
                self._release()
                raise StaleHandleError(f"ledger {self._id} was deleted while being closed")
            self._release()
            self._sealed = sealed
            return sealed

    def _release(self) -> None:
        _close_quietly(self._log_fd)
        _close_quietly(self._idx_fd)  # drops the writer flock
        self._log_fd = self._idx_fd = -1

    def release(self) -> None:
        """Stop writing without sealing: the ledger stays OPEN (a later writer seals it with
        LocalLedgerStore.seal_ledger, as BookKeeper's recovery-open does)."""
        self._abandon()

    def _abandon(self) -> None:
        """Release the files without sealing (the ledger stays OPEN and recoverable)."""
        with self._lock:
            if self._sealed is None and not self._abandoned:
                self._abandoned = True
                self._release()

    def __enter__(self) -> WritableLedger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if not self.is_closed:
            self.close()


# --- reader ----------------------------------------------------------------------------------


class LocalLedgerHandle:
    """Read handle of one ledger (tieredcore.model.ReadHandle), a snapshot of its index at open."""

    def __init__(
        self,
        store: LocalLedgerStore,
        metadata: LedgerMetadata,
        log_fd: int,
        offsets: array.array,
        crcs: array.array,
        lens: array.array,
    ) -> None:
        self._store = store
        self._meta = metadata
        self._id = metadata.ledger_id
        self._meta_path = store._path(self._id, META)
        self._fd = log_fd
        self._offsets = offsets
        self._crcs = crcs
        self._lens = lens
        self._lac = metadata.last_entry_id
        self._end = (offsets[-1] + FRAME_HEADER_LEN + lens[-1]) if len(offsets) else 0
        # taken after the index was read: every frame the snapshot's records acknowledge lies below it, so a
        # damaged record cannot make a read allocate (or return) more than the file holds
        self._log_size = os.fstat(log_fd).st_size
        self._mu = threading.Lock()
        self._active = 0
        self._closing = False

    # -- ReadHandle

    @property
    def ledger_id(self) -> int:
        return self._id

    @property
    def metadata(self) -> LedgerMetadata:
        """Stored metadata; for an OPEN ledger last_entry_id/length are this handle's LAC/length."""
        return self._meta

    @property
    def last_add_confirmed(self) -> int:
        return self._lac

    @property
    def length(self) -> int:
        return self._meta.length

    @property
    def is_closed(self) -> bool:
        return self._meta.state == STATE_CLOSED

    @property
    def data_length(self) -> int:
        """Bytes of frames 0..LAC in the .log (= frame_offset(LAC + 1))."""
        return self._end

    def __repr__(self) -> str:
        return f"LocalLedgerHandle(ledger_id={self._id}, lac={self._lac}, closed={self.is_closed})"

    def read(self, first: int, last: int) -> list[Entry]:
        """Entries first..last (inclusive), each CRC-verified; one pread for the whole span."""
        first, last = self._check_range(first, last)
        buf, rel = self._read_verified(first, last)
        starts = map(operator.add, rel, itertools.repeat(FRAME_HEADER_LEN))
        payloads = map(buf.__getitem__, map(slice, starts, itertools.islice(rel, 1, None)))
        return list(map(Entry, range(first, last + 1), payloads))

    def read_batch(self, first: int, last: int) -> EntryBatch:
        """Entries first..last as one batch: the verified frames as read, payload offsets from the index."""
        first, last = self._check_range(first, last)
        buf, rel = self._read_verified(first, last)
        starts = array.array("q", map(operator.add, itertools.islice(rel, len(rel) - 1), itertools.repeat(FRAME_HEADER_LEN)))
        return EntryBatch(self._id, first, buf, starts, self._lens[first : last + 1], 0, rel[-1])

    def read_frames(self, first: int, last: int) -> bytes:
        """Raw contiguous ``[len][entryId][payload]`` frames of entries first..last, CRC-verified."""
        first, last = self._check_range(first, last)
        return self._read_verified(first, last)[0]

    def read_frames_into(self, first: int, last: int, out: memoryview) -> int:
        """Like read_frames, but straight into `out` (no intermediate copy); returns the byte count.
        `out` must be exactly the frames' length. The offloader reads blocks this way."""
        first, last = self._check_range(first, last)
        buf, rel = self._read_verified(first, last, out)
        return rel[-1]

    def frames_slice(self, first: int, last: int) -> FileSlice:
        """Where entries first..last's frames lie in the .log file, for stores that copy file ranges in
        the kernel. Sealed ledgers only (immutable bytes); does NOT verify CRCs: callers verify with
        read_frames_into first (the offloader does, into a reused buffer)."""
        first, last = self._check_range(first, last)
        if not self._meta.is_closed:
            raise LedgerStateError(f"ledger {self._id} is open: its bytes may still change")
        self._check_not_deleted()
        start = self._offsets[first]
        end = self._offsets[last] + FRAME_HEADER_LEN + self._lens[last]
        return FileSlice(self._store._path(self._id, LOG), start, end - start)

    def entry_sizes(self) -> Sequence[int]:
        """Payload sizes of entries 0..LAC (a copy, array('i'))."""
        return array.array("i", self._lens)

    def entry_crcs(self) -> Sequence[int]:
        """CRC32C of every frame (12-byte header + payload) of entries 0..LAC, as recorded at append
        (a copy, array('I')): what an offloaded copy's frames must hash to."""
        return array.array("I", self._crcs)

    def frame_offset(self, entry_id: int) -> int:
        """Offset of entry_id's frame in the .log; entry_id = LAC + 1 gives the end of the frames."""
        entry_id = _check_entry_id("entry_id", entry_id)
        if entry_id < 0 or entry_id > self._lac + 1:
            raise BadRangeError(f"ledger {self._id}: entry {entry_id} outside 0..{self._lac + 1}")
        return self._end if entry_id == self._lac + 1 else self._offsets[entry_id]

    def close(self) -> None:
        with self._mu:
            if self._closing:
                return
            self._closing = True
            if self._active == 0 and self._fd >= 0:
                _close_quietly(self._fd)
                self._fd = -1

    def __enter__(self) -> LocalLedgerHandle:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- internals

    def _check_range(self, first: int, last: int) -> tuple[int, int]:
        first = _check_entry_id("first", first)
        last = _check_entry_id("last", last)
        if first < 0 or first > last or last > self._lac:
            raise BadRangeError(
                f"ledger {self._id}: bad read range {first}..{last} (last add confirmed {self._lac})"
            )
        return first, last

    def _acquire(self) -> int:
        with self._mu:
            if self._closing:
                raise LedgerStateError(f"handle of ledger {self._id} is closed")
            self._active += 1
            return self._fd

    def _release(self) -> None:
        with self._mu:
            self._active -= 1
            if self._closing and self._active == 0 and self._fd >= 0:
                _close_quietly(self._fd)
                self._fd = -1

    def _check_not_deleted(self) -> None:
        try:
            os.stat(self._meta_path)
        except FileNotFoundError:
            raise StaleHandleError(f"ledger {self._id} was deleted; this handle is stale") from None

    def _read_verified(self, first: int, last: int, into: memoryview | None = None) -> tuple[Buffer, list[int]]:
        """(span bytes, relative frame starts + end) of entries first..last, all CRC-verified.

        Frame boundaries come from the index sizes (the CRC of each frame covers its header, so a
        wrong size or offset fails the check); C-level map/accumulate, no per-entry bytecode.
        """
        lens = self._lens[first : last + 1]
        base = self._offsets[first]
        rel = list(
            itertools.accumulate(map(operator.add, lens, itertools.repeat(FRAME_HEADER_LEN)), initial=0)
        )
        span = rel[-1]
        if base < 0 or min(lens) < 0 or self._offsets[last] + FRAME_HEADER_LEN + lens[-1] - base != span:
            raise CorruptEntryError(
                f"ledger {self._id}: index records of entries {first}..{last} are inconsistent"
            )
        if base + span > self._log_size:
            raise CorruptEntryError(
                f"ledger {self._id}: index records of entries {first}..{last} point past the data file end "
                f"(bytes {base}..{base + span}, file holds {self._log_size})"
            )
        if into is not None and len(into) != span:
            raise ValueError(f"read_frames_into: buffer of {len(into)} bytes for {span} bytes of frames")
        fd = self._acquire()
        try:
            self._check_not_deleted()
            buf = pread_exact(fd, span, base) if into is None else into[: preadv_exact(fd, into, base)]
        finally:
            self._release()
        if len(buf) != span:
            self._check_not_deleted()
            raise CorruptEntryError(
                f"ledger {self._id}: data file ends before entry {last} "
                f"(wanted bytes {base}..{base + span}, got {len(buf)})"
            )
        mv = memoryview(buf)
        frames = map(mv.__getitem__, map(slice, rel, itertools.islice(rel, 1, None)))
        computed = array.array("I", map(_crc, frames))
        mv.release()
        crcs = self._crcs[first : last + 1]
        if computed != crcs:
            for i, (got, want) in enumerate(zip(computed, crcs, strict=True)):
                if got != want:
                    raise CorruptEntryError(
                        f"ledger {self._id} entry {first + i}: CRC32C mismatch "
                        f"(stored {want:#010x}, computed {got:#010x})"
                    )
        # A record copied from another entry (offset, crc and length) passes the CRC check: the frame
        # headers name their entry. With the first and last right, the CRC-checked frames between them,
        # cut at the recorded lengths, are the ones in between.
        for eid, at in ((first, 0), (last, rel[-2])):
            got_id = FRAME_HEADER.unpack_from(buf, at)[1]
            if got_id != eid:
                raise CorruptEntryError(
                    f"ledger {self._id}: the index record of entry {eid} points at the frame of entry {got_id}"
                )
        return buf, rel


# --- store -----------------------------------------------------------------------------------


class LocalLedgerStore:
    """A directory of ledgers with BookKeeper's semantics (append, seal, read ranges, delete)."""

    def __init__(self, root: str | Path, fsync: bool = False, *, recover_on_open: bool = True) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._root = str(self.root)
        self.fsync = bool(fsync)
        self._counter_path = os.path.join(self._root, COUNTER_FILE)
        self._alloc_lock = threading.Lock()  # flock does not exclude threads sharing one fd
        self._closed = False
        self._writers: weakref.WeakSet[WritableLedger] = weakref.WeakSet()
        self._handles: weakref.WeakSet[LocalLedgerHandle] = weakref.WeakSet()
        if recover_on_open:
            self.recover_open_ledgers()

    def __repr__(self) -> str:
        return f"LocalLedgerStore({self._root!r}, fsync={self.fsync})"

    # -- paths / small helpers

    def _path(self, ledger_id: int, kind: str) -> str:
        return ledger_file(self._root, ledger_id, kind)

    def _check_open(self) -> None:
        if self._closed:
            raise LedgerStateError(f"ledger store {self._root} is closed")

    @contextlib.contextmanager
    def _store_lock(self) -> Iterator[None]:
        """Process- and thread-exclusive section (id allocation, file creation, sweeping)."""
        with self._alloc_lock:
            fd = os.open(self._counter_path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)  # releases the flock

    def _write_meta(self, meta: LedgerMetadata) -> None:
        data = encode_metadata(meta)
        final = self._path(meta.ledger_id, META)
        tmp = f"{final}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            try:
                write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, final)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        _fsync_dir(self._root)

    def _read_meta(self, ledger_id: int) -> LedgerMetadata:
        try:
            with open(self._path(ledger_id, META), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            raise HotLedgerNotFoundError(f"ledger {ledger_id} does not exist in {self._root}") from None
        return decode_metadata(ledger_id, data)

    def _allocate_id(self) -> int:
        """Next ledger id; caller holds _store_lock."""
        with open(self._counter_path, "r+b") as f:
            text = f.read().strip()
            try:
                last = int(text) if text else -1
            except ValueError:
                last = -1
            if last < 0:  # fresh or damaged counter: never go below an existing ledger
                last = max(self._ids_on_disk(), default=-1)
            new = last + 1
            while any(os.path.lexists(self._path(new, k)) for k in KINDS):
                new += 1
            f.seek(0)
            f.write(b"%0*d\n" % (COUNTER_WIDTH, new))
            f.truncate()
            f.flush()
            os.fsync(f.fileno())
        return new

    def _ids_on_disk(self) -> set[int]:
        ids = set()
        with os.scandir(self._root) as it:
            for de in it:
                stem, dot, kind = de.name.partition(".")
                if dot and stem.isdigit() and kind in KINDS:
                    ids.add(int(stem))
        return ids

    # -- create

    def create_ledger(
        self, custom_metadata: Mapping[str, bytes | str] | None = None, *, ctime_ms: int | None = None
    ) -> WritableLedger:
        """Create an OPEN ledger and return its writer.

        Under the store lock: allocate the id, create empty .log/.idx, lock .idx (the writer lock),
        then write the metadata (state OPEN) — the ledger exists from that point on.
        """
        self._check_open()
        custom = _normalize_custom_metadata(custom_metadata)
        if ctime_ms is None:
            ctime_ms = time.time_ns() // 1_000_000
        elif isinstance(ctime_ms, bool) or not isinstance(ctime_ms, int) or ctime_ms < 0:
            raise ValidationError(f"ctime_ms must be a non-negative int, got {ctime_ms!r}")
        with self._store_lock():
            ledger_id = self._allocate_id()
            meta = LedgerMetadata(
                ledger_id=ledger_id,
                state=STATE_OPEN,
                last_entry_id=-1,
                length=0,
                ctime=int(ctime_ms),
                custom_metadata=custom,
            )
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
            log_fd = idx_fd = -1
            try:
                log_fd = os.open(self._path(ledger_id, LOG), flags, 0o644)
                idx_fd = os.open(self._path(ledger_id, IDX), flags, 0o644)
                fcntl.flock(idx_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self._write_meta(meta)
            except BaseException:
                for fd in (log_fd, idx_fd):
                    if fd >= 0:
                        _close_quietly(fd)
                for kind in KINDS:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(self._path(ledger_id, kind))
                raise
        writer = WritableLedger(self, meta, log_fd, idx_fd)
        self._writers.add(writer)
        return writer

    # -- read

    def open_ledger(self, ledger_id: int) -> LocalLedgerHandle:
        """Open for reading. An OPEN ledger without a live writer is recovered first (torn tail cut);
        one with a live writer is read as is (entries whose index record exists)."""
        self._check_open()
        ledger_id = _check_ledger_id(ledger_id)
        meta = self._read_meta(ledger_id)
        if meta.state != STATE_CLOSED:
            self._recover(ledger_id, must=False)
            meta = self._read_meta(ledger_id)  # the writer may have sealed it meanwhile
        try:
            log_fd = os.open(self._path(ledger_id, LOG), os.O_RDONLY)
        except FileNotFoundError:
            self._read_meta(ledger_id)  # HotLedgerNotFoundError if deleted meanwhile
            raise HotLedgerNotFoundError(f"ledger {ledger_id}: data file missing in {self._root}") from None
        try:
            try:
                idx_fd = os.open(self._path(ledger_id, IDX), os.O_RDONLY)
            except FileNotFoundError:
                self._read_meta(ledger_id)
                raise HotLedgerNotFoundError(f"ledger {ledger_id}: index file missing in {self._root}") from None
            try:
                offsets, crcs, lens = read_index(idx_fd, meta)
            finally:
                os.close(idx_fd)
            meta = metadata_with_index(meta, offsets, lens)
        except BaseException:
            os.close(log_fd)
            raise
        handle = LocalLedgerHandle(self, meta, log_fd, offsets, crcs, lens)
        self._handles.add(handle)
        return handle

    # -- recovery

    def recover_ledger(self, ledger_id: int) -> LedgerMetadata:
        """Cut a torn tail of an OPEN ledger whose writer is gone; returns its metadata with the
        recovered last entry id and length (state still OPEN). Sealed ledgers are not touched (their
        stored metadata is returned). LedgerStateError if a live writer holds the ledger."""
        self._check_open()
        ledger_id = _check_ledger_id(ledger_id)
        meta = self._read_meta(ledger_id)
        if meta.state == STATE_CLOSED:
            return meta
        result = self._recover(ledger_id, must=True)
        assert result is not None
        return result

    def seal_ledger(self, ledger_id: int) -> LedgerMetadata:
        """Recover an OPEN ledger whose writer is gone and seal it at its recovered last entry
        (BookKeeper's fencing recovery + close). Sealed ledgers are returned unchanged;
        LedgerStateError if a live writer holds it."""
        self._check_open()
        ledger_id = _check_ledger_id(ledger_id)
        result = self._recover(ledger_id, must=True, seal=True)
        assert result is not None
        return result

    def recover_open_ledgers(self) -> list[int]:
        """Sweep leftovers, then recover every OPEN ledger without a live writer; returns their ids."""
        recovered = []
        for ledger_id in self.list_ledgers():
            try:
                meta = self._read_meta(ledger_id)
                if meta.state != STATE_CLOSED and self._recover(ledger_id, must=False) is not None:
                    recovered.append(ledger_id)
            except (HotLedgerNotFoundError, FormatError):
                continue  # deleted meanwhile / unreadable: open_ledger will report it
        return recovered

    def _recover(self, ledger_id: int, must: bool, seal: bool = False) -> LedgerMetadata | None:
        try:
            log_fd = os.open(self._path(ledger_id, LOG), os.O_RDWR)
        except FileNotFoundError:
            self._read_meta(ledger_id)
            raise HotLedgerNotFoundError(f"ledger {ledger_id}: data file missing in {self._root}") from None
        try:
            try:
                idx_fd = os.open(self._path(ledger_id, IDX), os.O_RDWR)
            except FileNotFoundError:
                self._read_meta(ledger_id)
                raise HotLedgerNotFoundError(f"ledger {ledger_id}: index file missing in {self._root}") from None
            try:
                if not _try_lock(idx_fd):
                    if must:
                        raise LedgerStateError(f"ledger {ledger_id} has a live writer; not recovering")
                    return None
                meta = self._read_meta(ledger_id)  # under the lock: state is final unless OPEN
                if meta.state == STATE_CLOSED:
                    return meta
                entries, end, length = cut_torn_tail(log_fd, idx_fd)
                recovered = replace(meta, last_entry_id=entries - 1, length=length)
                if seal:
                    os.fdatasync(log_fd)
                    os.fdatasync(idx_fd)
                    recovered = replace(recovered, state=STATE_CLOSED)
                    self._write_meta(recovered)
                return recovered
            finally:
                os.close(idx_fd)
        finally:
            os.close(log_fd)

    # -- listing / deletion

    def ledger_metadata(self, ledger_id: int) -> LedgerMetadata:
        """Stored metadata. For an OPEN ledger last_entry_id is -1 and length 0 (as in BookKeeper);
        open a handle for its current LAC."""
        self._check_open()
        return self._read_meta(_check_ledger_id(ledger_id))

    def exists(self, ledger_id: int) -> bool:
        return os.path.exists(self._path(_check_ledger_id(ledger_id), META))

    def list_ledgers(self) -> list[int]:
        """Sorted ids of the ledgers (those with a .meta); leftovers are swept first."""
        self._check_open()
        return self._scan(remove_orphans=True)[0]

    def sweep(self) -> list[int]:
        """Remove .log/.idx left without .meta (a crash mid-delete or mid-create) and stale metadata
        temp files; returns the ids whose leftovers were removed."""
        self._check_open()
        return self._scan(remove_orphans=True)[1]

    def _scan(self, remove_orphans: bool) -> tuple[list[int], list[int]]:
        with self._store_lock():
            metas: set[int] = set()
            data: set[int] = set()
            temps: list[str] = []
            with os.scandir(self._root) as it:
                for de in it:
                    name = de.name
                    stem, dot, kind = name.partition(".")
                    if not dot or not stem.isdigit():
                        continue
                    if kind == META:
                        metas.add(int(stem))
                    elif kind in (LOG, IDX):
                        data.add(int(stem))
                    elif kind.startswith(META + ".") and kind.endswith(".tmp"):
                        temps.append(name)
            orphans = sorted(data - metas)
            if remove_orphans:
                for ledger_id in orphans:
                    for kind in (LOG, IDX):
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(self._path(ledger_id, kind))
                now = time.time()
                for name in temps:
                    path = os.path.join(self._root, name)
                    with contextlib.suppress(FileNotFoundError):
                        if now - os.stat(path).st_mtime > TMP_GRACE_SECONDS:
                            os.unlink(path)
                if orphans and self.fsync:
                    _fsync_dir(self._root)
        return sorted(metas), orphans

    def delete_ledger(self, ledger_id: int) -> None:
        """Delete (idempotent): .meta first (the delete point), then .log and .idx."""
        self._check_open()
        ledger_id = _check_ledger_id(ledger_id)
        # .meta is unlinked once more at the end so that a concurrent seal (which re-creates .meta by
        # rename) cannot resurrect the ledger without its data; see WritableLedger.close.
        for kind in (META, LOG, IDX, META):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path(ledger_id, kind))
        if self.fsync:
            _fsync_dir(self._root)

    # -- lifecycle

    def close(self) -> None:
        """Close the store: read handles are closed, writers released without sealing (their
        ledgers stay OPEN and are recovered on the next open)."""
        if self._closed:
            return
        self._closed = True
        for writer in list(self._writers):
            writer._abandon()
        for handle in list(self._handles):
            handle.close()

    def __enter__(self) -> LocalLedgerStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
