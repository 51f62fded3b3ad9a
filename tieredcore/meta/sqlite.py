"""Embedded metadata store: one SQLite file, safe across processes and threads.

One table ``nodes(path PRIMARY KEY, parent, value BLOB, version, mtime)`` with an index on
``parent``. WAL journal, ``synchronous=FULL`` (metadata must survive power loss), busy timeout
of at least 30 s, and ``BEGIN IMMEDIATE`` for every write so that a compare-and-set reads and
writes under the database's single write lock.

Each thread gets its own connection (created on first use); a process that inherits the store
through ``fork`` (Spark / multiprocessing workers) opens fresh connections and never touches the
parent's. The store pickles as its file path, so it can be shipped to Spark executors.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from tieredcore.errors import (
    MetadataStoreError,
    NodeExistsError,
    NodeNotFoundError,
    ValidationError,
    VersionConflictError,
)
from tieredcore.meta.store import (
    Buffer,
    CheckOp,
    CreateOp,
    DeleteOp,
    Op,
    PutOp,
    Versioned,
    as_bytes,
    check_version,
    parent_path,
    validate_path,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

SCHEMA_VERSION = 1
_SQLITE_BUSY = 5
_SQLITE_LOCKED = 6

# Connections inherited through fork() are never closed nor garbage-collected in the child:
# closing their file descriptors would drop the child's own POSIX locks on the database file.
_FORK_ORPHANS: list[sqlite3.Connection] = []


def _is_busy(e: sqlite3.Error) -> bool:
    code = getattr(e, "sqlite_errorcode", None)
    if code is not None:
        return (code & 0xFF) in (_SQLITE_BUSY, _SQLITE_LOCKED)
    msg = str(e).lower()
    return "locked" in msg or "busy" in msg


class SqliteMetadataStore:
    """:class:`~tieredcore.meta.store.MetadataStore` on a SQLite file."""

    def __init__(self, path: str | os.PathLike[str], busy_timeout_s: float = 60.0) -> None:
        db = os.fspath(path)
        if not isinstance(db, str) or db in ("", ":memory:") or db.startswith("file:"):
            raise ValidationError(
                f"SqliteMetadataStore needs a database file path, got {db!r} "
                "(an in-memory database is not shared between connections; use a temporary file)"
            )
        if busy_timeout_s < 30:
            raise ValidationError(f"busy_timeout_s must be at least 30 s, got {busy_timeout_s}")
        self._db = db
        self._busy_timeout_s = float(busy_timeout_s)
        self._init_runtime()
        self._conn()  # open now: a bad path fails at construction with a clear message

    # --- plumbing ------------------------------------------------------------------------------

    def _init_runtime(self) -> None:
        self._local = threading.local()
        self._lock = threading.Lock()
        self._conns: list[tuple[int, sqlite3.Connection]] = []
        self._pid = os.getpid()
        self._closed = False

    def __getstate__(self) -> dict[str, Any]:
        return {"db": self._db, "busy_timeout_s": self._busy_timeout_s}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._db = state["db"]
        self._busy_timeout_s = state["busy_timeout_s"]
        self._init_runtime()

    def __repr__(self) -> str:
        return f"SqliteMetadataStore({self._db!r})"

    def __enter__(self) -> SqliteMetadataStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def db_path(self) -> str:
        return self._db

    def _fail(self, what: str, e: BaseException) -> MetadataStoreError:
        return MetadataStoreError(f"metadata store {self._db}: {what} failed: {e} (outcome unknown)")

    def _after_fork(self) -> None:
        # The parent's lock may have been held by another thread at fork time: replace it.
        self._lock = threading.Lock()
        _FORK_ORPHANS.extend(c for _, c in self._conns)
        self._conns = []
        self._local = threading.local()
        self._pid = os.getpid()

    def _conn(self) -> sqlite3.Connection:
        if self._closed:
            raise MetadataStoreError(f"metadata store {self._db} is closed")
        if self._pid != os.getpid():
            self._after_fork()
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            return conn
        conn = self._open()
        self._local.conn = conn
        with self._lock:
            self._conns.append((os.getpid(), conn))
        return conn

    def _open(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(
                self._db, timeout=self._busy_timeout_s, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as e:
            raise MetadataStoreError(self._open_error(e)) from e
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout_s * 1000)}")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                log.warning("metadata store %s: WAL not available (journal_mode=%s)", self._db, mode)
            conn.execute("PRAGMA synchronous = FULL")
            self._ensure_schema(conn)
        except sqlite3.Error as e:
            conn.close()
            raise MetadataStoreError(self._open_error(e)) from e
        except BaseException:
            conn.close()
            raise
        return conn

    def _open_error(self, e: sqlite3.Error) -> str:
        """SQLite says only "unable to open database file" or "readonly database": add which path and why."""
        path = os.path.abspath(self._db)
        d = os.path.dirname(path)
        why = ""
        if not os.path.isdir(d):
            why = f"directory {d} does not exist" if not os.path.exists(d) else f"{d} is not a directory"
        elif os.path.isdir(path):
            why = f"{path} is a directory"
        elif not os.path.exists(path):
            if not os.access(d, os.W_OK | os.X_OK):
                why = f"directory {d} is not writable, so the database file cannot be created"
        elif not os.access(path, os.R_OK):
            why = f"file {path} is not readable"
        elif not os.access(path, os.W_OK):
            why = f"file {path} is not writable"
        elif not os.access(d, os.W_OK | os.X_OK):
            name = os.path.basename(path)
            why = f"directory {d} is not writable (WAL mode needs {name}-wal and {name}-shm beside the file)"
        return f"cannot open metadata store {self._db}: {e}" + (f" ({why})" if why else "")

    def _ensure_schema(self, conn: sqlite3.Connection) -> None:
        have = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'nodes'").fetchone()
        if not have:
            self._begin_immediate(conn)
            try:
                conn.execute(
                    "CREATE TABLE IF NOT EXISTS nodes ("
                    " path TEXT PRIMARY KEY NOT NULL,"
                    " parent TEXT NOT NULL,"
                    " value BLOB NOT NULL,"
                    " version INTEGER NOT NULL,"
                    " mtime INTEGER NOT NULL)"
                )
                conn.execute("CREATE INDEX IF NOT EXISTS nodes_parent ON nodes(parent)")
                if conn.execute("PRAGMA user_version").fetchone()[0] == 0:
                    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        uv = conn.execute("PRAGMA user_version").fetchone()[0]
        if uv != SCHEMA_VERSION:
            raise MetadataStoreError(
                f"metadata store {self._db}: schema version {uv} not supported (expected {SCHEMA_VERSION})"
            )

    def _begin_immediate(self, conn: sqlite3.Connection) -> None:
        """BEGIN IMMEDIATE, waiting for the write lock. SQLite's busy handler already waits up to
        the busy timeout; a few busy results bypass it (WAL recovery), so retry until the same
        deadline. Nothing has been written yet, so retrying is always safe."""
        deadline = time.monotonic() + self._busy_timeout_s
        delay = 0.001
        while True:
            try:
                conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as e:
                if not _is_busy(e) or time.monotonic() >= deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 0.1)

    @staticmethod
    def _rollback(conn: sqlite3.Connection) -> None:
        try:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass  # SQLite may already have rolled back (disk full, I/O error)

    def _write(self, what: str, fn: Callable[[sqlite3.Connection, int], T]) -> T:
        conn = self._conn()
        try:
            self._begin_immediate(conn)
        except sqlite3.Error as e:
            raise self._fail(what, e) from e
        try:
            result = fn(conn, int(time.time() * 1000))
        except sqlite3.Error as e:
            self._rollback(conn)
            raise self._fail(what, e) from e
        except BaseException:
            self._rollback(conn)
            raise
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as e:
            self._rollback(conn)
            raise self._fail(what, e) from e
        return result

    # --- single-row helpers (run inside a write transaction) ----------------------------------

    @staticmethod
    def _version(conn: sqlite3.Connection, path: str) -> int | None:
        row = conn.execute("SELECT version FROM nodes WHERE path = ?", (path,)).fetchone()
        return None if row is None else int(row[0])

    def _do_create(self, conn: sqlite3.Connection, now: int, path: str, value: bytes) -> int:
        if self._version(conn, path) is not None:
            raise NodeExistsError(f"metadata path {path} already exists")
        conn.execute(
            "INSERT INTO nodes (path, parent, value, version, mtime) VALUES (?, ?, ?, 0, ?)",
            (path, parent_path(path), value, now),
        )
        return 0

    def _do_put(self, conn: sqlite3.Connection, now: int, path: str, value: bytes, expected: int) -> int:
        current = self._version(conn, path)
        if current is None:
            raise VersionConflictError(
                f"metadata path {path} does not exist (expected version {expected}, found none)"
            )
        if current != expected:
            raise VersionConflictError(
                f"metadata path {path} changed: expected version {expected}, found {current}"
            )
        conn.execute(
            "UPDATE nodes SET value = ?, version = ?, mtime = ? WHERE path = ?",
            (value, current + 1, now, path),
        )
        return current + 1

    def _do_delete(self, conn: sqlite3.Connection, path: str, expected: int | None) -> None:
        current = self._version(conn, path)
        if current is None:
            raise NodeNotFoundError(f"metadata path {path} does not exist")
        if expected is not None and current != expected:
            raise VersionConflictError(
                f"metadata path {path} changed: expected version {expected}, found {current}"
            )
        conn.execute("DELETE FROM nodes WHERE path = ?", (path,))

    def _do_check(self, conn: sqlite3.Connection, path: str, expected: int) -> None:
        current = self._version(conn, path)
        if current != expected:
            found = "none" if current is None else str(current)
            raise VersionConflictError(
                f"metadata path {path} check failed: expected version {expected}, found {found}"
            )

    # --- MetadataStore -------------------------------------------------------------------------

    def get(self, path: str) -> Versioned | None:
        validate_path(path, allow_root=True)
        conn = self._conn()
        try:
            row = conn.execute("SELECT value, version FROM nodes WHERE path = ?", (path,)).fetchone()
        except sqlite3.Error as e:
            raise self._fail(f"get {path}", e) from e
        return None if row is None else Versioned(bytes(row[0]), int(row[1]))

    def create(self, path: str, value: Buffer) -> int:
        validate_path(path)
        data = as_bytes(value, path)
        return self._write(f"create {path}", lambda c, now: self._do_create(c, now, path, data))

    def put(self, path: str, value: Buffer, expected_version: int) -> int:
        validate_path(path)
        data = as_bytes(value, path)
        expected = check_version(expected_version)
        return self._write(f"put {path}", lambda c, now: self._do_put(c, now, path, data, expected))

    def set(self, path: str, value: Buffer) -> int:
        validate_path(path)
        data = as_bytes(value, path)

        def run(conn: sqlite3.Connection, now: int) -> int:
            current = self._version(conn, path)
            if current is None:
                return self._do_create(conn, now, path, data)
            return self._do_put(conn, now, path, data, current)

        return self._write(f"set {path}", run)

    def delete(self, path: str, expected_version: int | None = None) -> None:
        validate_path(path)
        expected = None if expected_version is None else check_version(expected_version)
        self._write(f"delete {path}", lambda c, now: self._do_delete(c, path, expected))

    def children(self, path: str) -> list[str]:
        validate_path(path, allow_root=True)
        lo = "/" if path == "/" else path + "/"
        hi = lo[:-1] + "0"  # '0' follows '/': every descendant sorts in [lo, hi)
        names: set[str] = set()
        conn = self._conn()
        # Skip-scan over the primary key: one index seek per stored child node and one per
        # subtree, never a walk over all descendants.
        gt = "SELECT path FROM nodes WHERE path > ? AND path < ? ORDER BY path LIMIT 1"
        ge = "SELECT path FROM nodes WHERE path >= ? AND path < ? ORDER BY path LIMIT 1"
        try:
            conn.execute("BEGIN")  # one snapshot for the whole scan
            try:
                sql, cursor = gt, lo
                while True:
                    row = conn.execute(sql, (cursor, hi)).fetchone()
                    if row is None:
                        break
                    name, sep, _ = row[0][len(lo) :].partition("/")
                    names.add(name)
                    if sep:  # a deeper descendant: skip the whole subtree lo+name+"/..."
                        sql, cursor = ge, lo + name + "0"
                    else:  # the child node itself; its subtree (if any) comes later
                        sql, cursor = gt, row[0]
            finally:
                self._rollback(conn)
        except sqlite3.Error as e:
            raise self._fail(f"children {path}", e) from e
        return sorted(names)

    def transaction(self, ops: Sequence[Op]) -> list[int | None]:
        checked: list[tuple[Op, bytes | None, int | None]] = []
        for op in ops:
            if isinstance(op, CreateOp):
                checked.append((op, as_bytes(op.value, validate_path(op.path)), None))
            elif isinstance(op, PutOp):
                data = as_bytes(op.value, validate_path(op.path))
                checked.append((op, data, check_version(op.expected_version)))
            elif isinstance(op, DeleteOp):
                validate_path(op.path)
                v = op.expected_version
                checked.append((op, None, None if v is None else check_version(v)))
            elif isinstance(op, CheckOp):
                validate_path(op.path)
                checked.append((op, None, check_version(op.expected_version)))
            else:
                raise ValidationError(f"unknown transaction op {op!r}")
        if not checked:
            return []

        def run(conn: sqlite3.Connection, now: int) -> list[int | None]:
            results: list[int | None] = []
            for i, (op, data, expected) in enumerate(checked):
                try:
                    if isinstance(op, CreateOp):
                        assert data is not None
                        results.append(self._do_create(conn, now, op.path, data))
                    elif isinstance(op, PutOp):
                        assert data is not None and expected is not None
                        results.append(self._do_put(conn, now, op.path, data, expected))
                    elif isinstance(op, DeleteOp):
                        self._do_delete(conn, op.path, expected)
                        results.append(None)
                    else:
                        assert expected is not None
                        self._do_check(conn, op.path, expected)
                        results.append(None)
                except (VersionConflictError, NodeNotFoundError) as e:
                    # same class, message prefixed with the op's position; nothing is applied
                    raise type(e)(
                        f"transaction op {i + 1} of {len(checked)} ({type(op).__name__}): {e}; no op applied"
                    ) from None
            return results

        return self._write(f"transaction of {len(checked)} ops", run)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pid = os.getpid()
            conns, self._conns = self._conns, []
        for owner, conn in conns:
            if owner == pid:
                with contextlib.suppress(sqlite3.Error):
                    conn.close()
            else:
                _FORK_ORPHANS.append(conn)
        self._local = threading.local()
