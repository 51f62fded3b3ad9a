"""The single writer of one OPEN ledger of the local ledger store (:mod:`tieredcore.hot.local`).

Each entry becomes a frame appended to ``<id>.log`` and then a 16-byte record appended to ``<id>.idx``
(layouts in :mod:`tieredcore.hot.format`); the entry exists once its index record is written. The
writer holds an exclusive ``flock`` on the ``.idx`` for its whole life: that lock is what tells the
store "a live writer exists", so recovery never cuts a tail under it.

Durability: ``append``/``append_many`` return only after the frame bytes and then the index records
were handed to the kernel with ``write`` (they survive a kill of the process); with ``fsync=True`` both
files are also ``fdatasync``-ed before returning. ``close()`` (seal) always syncs.
"""

from __future__ import annotations

import array
import contextlib
import itertools
import operator
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import replace

import crc32c

from tieredcore.errors import LedgerStateError, StaleHandleError, ValidationError
from tieredcore.fileio import write_all
from tieredcore.formats.frame_ranges import RangeAccumulator, encode_frame_ranges
from tieredcore.hot.files import close_quietly
from tieredcore.hot.format import (
    FRAME_HEADER,
    FRAME_HEADER_LEN,
    IDX_RECORD,
    IDX_RECORD_LEN,
    MAX_ENTRY_SIZE,
    encode_index,
)
from tieredcore.model import STATE_CLOSED, Buffer, LedgerMetadata

__all__ = ["APPEND_BATCH_BYTES", "WritableLedger"]

# append_many writes its frames in batches of about this many bytes (one write() for the frames and
# one for the index records of each batch), so memory stays bounded for generators of any length.
APPEND_BATCH_BYTES = 16 * 1024 * 1024

_crc = crc32c.crc32c


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


def _write_frame(fd: int, header: bytes, payload: Buffer) -> None:
    total = len(header) + len(payload)
    done = os.writev(fd, (header, payload))
    if done < total:  # short write (rare): finish the rest
        rest = (bytes(header) + bytes(payload))[done:]
        write_all(fd, rest)


class WritableLedger:
    """The single writer of one OPEN ledger (returned by :meth:`LocalLedgerStore.create_ledger`)."""

    def __init__(
        self,
        metadata: LedgerMetadata,
        log_fd: int,
        idx_fd: int,
        *,
        meta_path: str,
        log_path: str,
        fsync: bool,
        write_meta: Callable[[LedgerMetadata], None],
        write_ranges: Callable[[bytes], None] | None = None,
    ) -> None:
        self._meta = metadata
        self._id = metadata.ledger_id
        self._meta_path = meta_path
        self._log_path = log_path
        self._log_fd = log_fd
        self._idx_fd = idx_fd  # holds the exclusive flock: "a live writer exists"
        self._fsync = fsync
        self._write_meta = write_meta  # the store's atomic metadata replace (seal writes through it)
        self._lock = threading.Lock()
        self._next = 0  # next entry id
        self._log_end = 0  # bytes of whole acknowledged frames
        self._length = 0  # payload bytes
        self._sealed: LedgerMetadata | None = None
        self._broken: str | None = None  # a write failed part-way: no more appends
        self._abandoned = False
        # CRC32C per ~1 MiB of frames, written at seal (hot.format: <id>.rng): the offloader and the lag
        # cleanup's proof check those instead of every frame's. Dropped when a write fails part-way.
        self._write_ranges = write_ranges
        self._ranges: RangeAccumulator | None = RangeAccumulator() if write_ranges is not None else None

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
                self._ranges = None
                raise
            self._add_range(entry_id, [self._log_end], header + bytes(payload))
            self._next = entry_id + 1
            self._log_end += FRAME_HEADER_LEN + size
            self._length += size
            return entry_id

    def append_many(self, payloads: Iterable[Buffer]) -> int:
        """Append entries in bulk; returns the last entry id (the unchanged LAC if there were none).

        Payloads are taken in chunks of ~16 MiB. Per chunk, headers, CRCs and index records are built
        with C-level map/array operations (no per-entry bytecode), the frames go out joined in one
        write() (the join is also what the frame and range CRCs are computed over), then all index
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
        """Frames then index records of entries self._next.. (one per payload); returns frame bytes.
        The frames are joined once: one write, one CRC32C call per frame over the joined bytes, and the
        range CRCs over the same bytes in a few calls."""
        n = len(chunk)
        first = self._next
        ids = range(first, first + n)
        headers = list(map(FRAME_HEADER.pack, lens, ids))
        frame_sizes = list(map(operator.add, lens, itertools.repeat(FRAME_HEADER_LEN)))
        rel = list(itertools.accumulate(frame_sizes, initial=0))
        iov: list = [None] * (2 * n)
        iov[0::2] = headers
        iov[1::2] = chunk
        data = b"".join(iov)
        mv = memoryview(data)
        crcs = array.array("I", map(_crc, map(mv.__getitem__, map(slice, rel, itertools.islice(rel, 1, None)))))
        offsets = list(map(operator.add, rel, itertools.repeat(self._log_end)))
        log_end = offsets.pop()
        words = encode_index(offsets, crcs, lens, log_end)
        total = log_end - self._log_end
        try:
            write_all(self._log_fd, data)
            write_all(self._idx_fd, words)
        except BaseException as exc:
            self._broken = f"append of entries {first}..{first + n - 1} failed: {exc!r}"
            self._ranges = None
            raise
        self._add_range(first, offsets, mv)
        self._next = first + n
        self._log_end = log_end
        self._length += total - FRAME_HEADER_LEN * n
        return total

    def _add_range(self, first: int, starts: list[int], frames: Buffer) -> None:
        """Feed acknowledged frames to the range CRCs; should they not line up (they always do), the ledger
        is sealed without ranges (its frames are then checked one by one) rather than failing an append."""
        if self._ranges is None:
            return
        try:
            self._ranges.add(first, starts, frames)
        except ValidationError:
            self._ranges = None

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
            # (no ranges when a write failed part-way: the accumulator was dropped then)
            ranges = self._ranges.result() if self._ranges is not None else None
            if ranges is not None and self._write_ranges is not None:
                self._write_ranges(encode_frame_ranges(ranges))  # before the seal: a sealed ledger's are final
            if not os.path.exists(self._meta_path):
                self._release()
                raise StaleHandleError(f"ledger {self._id} was deleted; cannot close it")
            sealed = replace(
                self._meta, state=STATE_CLOSED, last_entry_id=self._next - 1, length=self._length
            )
            self._write_meta(sealed)
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
        close_quietly(self._log_fd)
        close_quietly(self._idx_fd)  # drops the writer flock
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
