"""Hot tier: a local ledger store with Apache BookKeeper's semantics.

One directory holds every ledger as three files, ``<id>.log`` (entry frames), ``<id>.idx`` (one
16-byte record per entry: frame offset, CRC32C, length) and ``<id>.meta`` (BookKeeper metadata); their
byte layout, and the recovery scan that cuts a torn tail, are in :mod:`tieredcore.hot.format`.
This module is the store itself: creating, opening, recovering, sealing, listing, sweeping and
deleting ledgers. The single writer of an OPEN ledger (and the durability of its appends) is
:mod:`tieredcore.hot.writer`; read handles (the ``.idx`` loaded in bulk at open for O(1) random access)
are :mod:`tieredcore.hot.handle`.
``.meta`` is replaced atomically (temp file + fsync + rename + directory fsync). Its existence *is* the
ledger: it is written last at creation and unlinked first at deletion; ``.log``/``.idx`` without
``.meta`` are leftovers that :meth:`LocalLedgerStore.sweep` removes.

``LEDGER_ID`` holds the last allocated id; allocation, file creation and sweeping run under an
``fcntl.flock`` of that file, so ids are unique and strictly increasing across processes.

A writer holds an exclusive ``flock`` on its ``.idx`` for its whole life. Recovery of an OPEN ledger
(cutting a torn tail left by a writer that died) only runs when that lock can be taken, i.e. never
under a live writer; a reader of a ledger that is still being written sees the entries whose index
record exists (BookKeeper's "open without recovery"). Sealed (CLOSED) ledgers are never modified.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import secrets
import threading
import time
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path

from tieredcore.errors import (
    FormatError,
    HotLedgerNotFoundError,
    LedgerStateError,
    ValidationError,
)
from tieredcore.fileio import write_all
from tieredcore.hot.files import close_quietly, fsync_dir, try_lock
from tieredcore.hot.format import (
    COUNTER_FILE,
    COUNTER_WIDTH,
    IDX,
    KINDS,
    LOG,
    META,
    RNG,
    cut_torn_tail,
    decode_metadata,
    encode_metadata,
    ledger_file,
    metadata_with_index,
    read_index,
)
from tieredcore.hot.handle import LocalLedgerHandle
from tieredcore.hot.writer import WritableLedger
from tieredcore.model import STATE_CLOSED, STATE_OPEN, LedgerMetadata

__all__ = ["LocalLedgerStore"]

# Temp files of an interrupted metadata write older than this are removed by sweep().
TMP_GRACE_SECONDS = 600.0


def _check_ledger_id(ledger_id: object) -> int:
    if isinstance(ledger_id, bool) or not isinstance(ledger_id, int) or ledger_id < 0:
        raise ValidationError(f"ledger id must be a non-negative int, got {ledger_id!r}")
    return int(ledger_id)


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
        self._replace_file(self._path(meta.ledger_id, META), encode_metadata(meta))

    def _replace_file(self, final: str, data: bytes) -> None:
        """Write ``final`` whole or not at all (temp file, fsync, rename, directory fsync)."""
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
        fsync_dir(self._root)

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
                        close_quietly(fd)
                for kind in KINDS:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(self._path(ledger_id, kind))
                raise
        writer = WritableLedger(
            meta,
            log_fd,
            idx_fd,
            meta_path=self._path(ledger_id, META),
            log_path=self._path(ledger_id, LOG),
            fsync=self.fsync,
            write_meta=self._write_meta,
            write_ranges=functools.partial(self._replace_file, self._path(ledger_id, RNG)),
        )
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
        handle = LocalLedgerHandle(
            meta,
            log_fd,
            offsets,
            crcs,
            lens,
            meta_path=self._path(ledger_id, META),
            log_path=self._path(ledger_id, LOG),
            ranges_path=self._path(ledger_id, RNG),
        )
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
                if not try_lock(idx_fd):
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
                    elif kind in (LOG, IDX, RNG):
                        data.add(int(stem))
                    elif (kind.startswith(META + ".") or kind.startswith(RNG + ".")) and kind.endswith(".tmp"):
                        temps.append(name)
            orphans = sorted(data - metas)
            if remove_orphans:
                for ledger_id in orphans:
                    for kind in (LOG, IDX, RNG):
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(self._path(ledger_id, kind))
                now = time.time()
                for name in temps:
                    path = os.path.join(self._root, name)
                    with contextlib.suppress(FileNotFoundError):
                        if now - os.stat(path).st_mtime > TMP_GRACE_SECONDS:
                            os.unlink(path)
                if orphans and self.fsync:
                    fsync_dir(self._root)
        return sorted(metas), orphans

    def delete_ledger(self, ledger_id: int) -> None:
        """Delete (idempotent): .meta first (the delete point), then .log, .idx and .rng."""
        self._check_open()
        ledger_id = _check_ledger_id(ledger_id)
        # .meta is unlinked once more at the end so that a concurrent seal (which re-creates .meta by
        # rename) cannot resurrect the ledger without its data; see WritableLedger.close.
        for kind in (META, LOG, IDX, RNG, META):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path(ledger_id, kind))
        if self.fsync:
            fsync_dir(self._root)

    # -- lifecycle

    def close(self) -> None:
        """Close the store: read handles are closed, writers released without sealing (their
        ledgers stay OPEN and are recovered on the next open)."""
        if self._closed:
            return
        self._closed = True
        for writer in list(self._writers):
            writer.release()
        for handle in list(self._handles):
            handle.close()

    def __enter__(self) -> LocalLedgerStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
