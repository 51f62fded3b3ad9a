"""ZooKeeper metadata store (kazoo): the :class:`MetadataStore` protocol on ZooKeeper's own versions.

URL: ``zk://host:port[,host:port...]/<root>[?chroot=/path&session_timeout=30s&timeout=60s]``.

Layout. Topic records stay where Pulsar keeps them, ``/managed-ledgers/<tenant>/<namespace>/persistent/
<topic>`` (Pulsar's ``ManagedLedgerInfo``, plain or behind the ``0x4778`` header), so this store shares a
Pulsar cluster's ZooKeeper. Every other path of the protocol (policies, the deletion log, leases, the
store identity) is placed under ``<root>``, a node Pulsar does not use: our ``/admin/policies/t/ns`` is
``<root>/admin/policies/t/ns`` and never Pulsar's namespace policies. ``chroot`` (optional) moves the whole
tree, as Pulsar's own ``zk:host:port/chroot`` metadata URLs do.

Attached to a Pulsar cluster (``?attached=true``, made by ``tiered init --pulsar-zk``): the store reads
Pulsar's own ``/admin/policies``, ``/admin/partitioned-topics`` and ``/admin/clusters`` where Pulsar keeps
them too (:data:`ATTACHED_PASS_THROUGH`), and refuses every write (create, put, set, delete, a transaction
op) whose path lies under any of Pulsar's paths with :class:`PulsarReadOnlyError`, before it reaches
ZooKeeper: whatever code runs on an attached workspace, it writes only under ``<root>``.

Semantics (the protocol's table in :mod:`tieredcore.meta.store`): a record's version is the znode's
``dataVersion``; ``put`` is ``set(path, data, version)``; a transaction is one ZooKeeper ``multi``.
Two differences from the embedded store, both ZooKeeper's: ancestors created on the way to a record are
records themselves (empty value, version 0) and stay after their children go; deleting a record that
has children fails (NotEmpty) instead of leaving the children.

Connection loss. A read that loses its connection is repeated (reads change nothing). A write that
loses it has an **unknown outcome**: it is never repeated blindly. The store waits for the connection
to come back, re-reads every node the write touched (after a ``sync``) and decides: the write's effect
is there → it landed, return its result; the state is still the one the write expected → it did not
land, so it is sent again (a new attempt with a known starting point); anything else → someone else
changed the node meanwhile and the outcome is unknowable → MetadataStoreError (outcome unknown), the
contract every caller already handles by re-reading. Session expiry is handled the same way (our
records are never ephemeral, so a new session loses nothing).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import parse_qs, unquote, urlparse

from tieredcore.errors import (
    MetadataStoreError,
    NodeExistsError,
    NodeNotFoundError,
    PulsarReadOnlyError,
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
#: kazoo reports every dropped connection and reconnect attempt as a warning; what matters (a write's
#: outcome settled by re-reading, a connection not back in time) this module logs itself
_kazoo_log = logging.getLogger("tieredcore.meta.zookeeper.kazoo")
if _kazoo_log.level == logging.NOTSET:
    _kazoo_log.setLevel(logging.ERROR)
T = TypeVar("T")

#: Pulsar's own top-level znodes: our root must be none of them (nor under them)
PULSAR_ROOTS = (
    "/managed-ledgers", "/admin", "/ledgers", "/loadbalance", "/namespace", "/schemas", "/counters",
    "/stream", "/zookeeper", "/bookies", "/pulsar", "/topics",
)
PASS_THROUGH = "/managed-ledgers"  # kept at Pulsar's path
# attached to a Pulsar cluster: also read where Pulsar keeps them (and never written)
ATTACHED_PASS_THROUGH = (PASS_THROUGH, "/admin/policies", "/admin/partitioned-topics", "/admin/clusters")
DEFAULT_ROOT = "/tiered-storage"
#: ZooKeeper refuses packets above jute.maxbuffer (1 MiB by default) by dropping the connection, which
#: would look like an unknown outcome: refuse such records up front, with the reason
MAX_RECORD_BYTES = 1024 * 1024 - 4096
DEFAULT_SESSION_TIMEOUT_S = 30.0
DEFAULT_TIMEOUT_S = 60.0  # how long an operation waits for a lost connection to come back


@dataclass(frozen=True)
class ZkLocation:
    """A parsed ``zk://`` metadata URL."""

    hosts: str  # "h:p,h:p"
    root: str
    chroot: str = ""
    session_timeout_s: float = DEFAULT_SESSION_TIMEOUT_S
    timeout_s: float = DEFAULT_TIMEOUT_S
    attached: bool = False  # a Pulsar cluster's ZooKeeper: its paths are read, never written

    @classmethod
    def parse(cls, url: str) -> ZkLocation:
        from tieredcore.units import duration_ms

        u = urlparse(url)
        if u.scheme != "zk":
            raise ValidationError(f"metadata_url: expected zk://host:port/root, got {url!r}")
        hosts = u.netloc
        if not hosts or "@" in hosts:
            raise ValidationError(f"metadata_url {url!r}: no ZooKeeper host:port (credentials are not taken in URLs)")
        for h in hosts.split(","):
            host, sep, port = h.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValidationError(f"metadata_url {url!r}: {h!r} is not host:port")
        root = unquote(u.path) or DEFAULT_ROOT
        validate_path(root)
        for p in PULSAR_ROOTS:
            if root == p or root.startswith(p + "/"):
                raise ValidationError(
                    f"metadata_url {url!r}: root {root} is Pulsar's own {p}; choose a node Pulsar does not "
                    f"use, e.g. {DEFAULT_ROOT}"
                )
        q = parse_qs(u.query, keep_blank_values=True)
        unknown = sorted(set(q) - {"chroot", "session_timeout", "timeout", "attached"})
        if unknown:
            raise ValidationError(
                f"metadata_url {url!r}: unknown option(s) {', '.join(unknown)} (known: chroot, session_timeout, "
                "timeout, attached)"
            )
        chroot = q.get("chroot", [""])[-1]
        if chroot:
            validate_path(chroot)
        kw: dict[str, Any] = {}
        for name, field in (("session_timeout", "session_timeout_s"), ("timeout", "timeout_s")):
            if name in q:
                ms = duration_ms(q[name][-1])
                if ms <= 0:
                    raise ValidationError(f"metadata_url {url!r}: {name} must be positive")
                kw[field] = ms / 1000
        if "attached" in q:
            flag = q["attached"][-1].lower()
            if flag not in ("true", "false"):
                raise ValidationError(f"metadata_url {url!r}: attached must be true or false, got {flag!r}")
            kw["attached"] = flag == "true"
        return cls(hosts=hosts, root=root, chroot=chroot, **kw)

    @property
    def url(self) -> str:
        q = [f"chroot={self.chroot}"] if self.chroot else []
        if self.attached:
            q.append("attached=true")
        return f"zk://{self.hosts}{self.root}" + (f"?{'&'.join(q)}" if q else "")

    @property
    def pass_through(self) -> tuple[str, ...]:
        """The protocol paths kept where Pulsar keeps them (the rest lives under the root)."""
        return ATTACHED_PASS_THROUGH if self.attached else (PASS_THROUGH,)

    def pulsars(self, path: str) -> bool:
        """Is ``path`` (a protocol path) one of Pulsar's, kept at Pulsar's own place?"""
        return any(path == p or path.startswith(p + "/") for p in self.pass_through)

    def zk_path(self, path: str) -> str:
        """Where a protocol path lives in ZooKeeper: Pulsar's managed-ledgers (attached: also its policies,
        partitioned topics and clusters) as they are, the rest under the root; all of it under the
        chroot, if any."""
        if self.pulsars(path):
            return self.chroot + path
        return self.chroot + (self.root if path == "/" else self.root + path)

    def write_refusal(self, path: str) -> str | None:
        """Why a write of ``path`` is refused (attached: every path of Pulsar's), or None."""
        if not self.attached or not self.pulsars(path):
            return None
        return (f"refused to write {self.chroot}{path}: it is the Pulsar cluster's (an attached workspace never "
                f"creates, changes or deletes a znode under Pulsar's paths; its own records live under "
                f"{self.chroot}{self.root})")


class _Unknown(Exception):
    """A write's outcome could not be established by re-reading."""


class ZkMetadataStore:
    """:class:`~tieredcore.meta.store.MetadataStore` on ZooKeeper (kazoo)."""

    def __init__(self, location: ZkLocation | str, *, connect: bool = True) -> None:
        self.location = location if isinstance(location, ZkLocation) else ZkLocation.parse(location)
        self._init_runtime()
        if connect:
            self._client()  # fail at construction with a clear message when ZooKeeper is unreachable

    def _init_runtime(self) -> None:
        self._lock = threading.Lock()
        self._zk: Any = None
        self._pid = os.getpid()
        self._closed = False

    # pickles as its URL (Spark executors, forked workers open their own session)
    def __getstate__(self) -> dict[str, Any]:
        return {"location": self.location}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.location = state["location"]
        self._init_runtime()

    def __repr__(self) -> str:
        return f"ZkMetadataStore({self.location.url!r})"

    def __enter__(self) -> ZkMetadataStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- plumbing ------------------------------------------------------------------------------

    def _client(self) -> Any:
        from kazoo.client import KazooClient
        from kazoo.handlers.threading import KazooTimeoutError
        from kazoo.retry import KazooRetry

        if self._closed:
            raise MetadataStoreError(f"metadata store {self.location.url} is closed")
        if self._pid != os.getpid():  # inherited through fork: the parent's threads are not ours
            self._lock = threading.Lock()
            self._zk = None
            self._pid = os.getpid()
        zk = self._zk
        if zk is not None:
            return zk
        with self._lock:
            if self._zk is not None:
                return self._zk
            loc = self.location
            zk = KazooClient(
                hosts=loc.hosts,  # the chroot is applied by zk_path, so it need not exist beforehand
                timeout=loc.session_timeout_s,
                # reconnect forever in the background; our operations bound their own waiting
                connection_retry=KazooRetry(max_tries=-1, delay=0.05, backoff=2, max_delay=1.0),
                logger=_kazoo_log,
            )
            try:
                zk.start(timeout=min(loc.timeout_s, 15.0))
            except KazooTimeoutError:
                zk.stop()
                zk.close()
                raise MetadataStoreError(
                    f"cannot connect to ZooKeeper at {loc.hosts} (metadata_url {loc.url}): no answer "
                    f"within {min(loc.timeout_s, 15.0):g} s; is the server running?"
                ) from None
            self._zk = zk
            return zk

    def _fail(self, what: str, e: BaseException) -> MetadataStoreError:
        return MetadataStoreError(f"metadata store {self.location.url}: {what} failed: {e!r} (outcome unknown)")

    def _wait_connected(self, what: str, deadline: float) -> Any:
        """Block until the session is connected again (kazoo reconnects on its own), or fail."""
        from kazoo.protocol.states import KazooState

        zk = self._client()
        while zk.state != KazooState.CONNECTED or not zk.connected:
            if time.monotonic() >= deadline:
                raise MetadataStoreError(
                    f"metadata store {self.location.url}: {what}: ZooKeeper connection not back within "
                    f"{self.location.timeout_s:g} s (outcome unknown)"
                )
            time.sleep(0.05)
        return zk

    def _read(self, what: str, fn: Callable[[Any], T]) -> T:
        """Run a read, repeating it across connection loss until the operation's deadline."""
        from kazoo.exceptions import ConnectionLoss, OperationTimeoutError, SessionExpiredError

        deadline = time.monotonic() + self.location.timeout_s
        while True:
            zk = self._wait_connected(what, deadline)
            try:
                return fn(zk)
            except (ConnectionLoss, SessionExpiredError, OperationTimeoutError) as e:
                log.info("metadata store %s: %s: %r; reading again once reconnected", self.location.url, what, e)
                if time.monotonic() >= deadline:
                    raise self._fail(what, e) from e

    def _write(self, what: str, apply: Callable[[Any], T], settle: Callable[[Any], T | None]) -> T:
        """Run a write. On connection loss, re-read (``settle``) instead of repeating it: ``settle``
        returns the write's result if it landed, None if the state is still the one it expects (then the
        write is sent again), or raises _Unknown."""
        from kazoo.exceptions import ConnectionLoss, OperationTimeoutError, SessionExpiredError

        deadline = time.monotonic() + self.location.timeout_s
        while True:
            zk = self._wait_connected(what, deadline)
            try:
                return apply(zk)
            except (ConnectionLoss, SessionExpiredError, OperationTimeoutError) as e:
                log.warning(
                    "metadata store %s: %s: %r: outcome unknown, re-reading to settle it", self.location.url, what, e
                )
                lost = e
            while True:  # settle: re-read until it answers
                zk = self._wait_connected(what, deadline)
                try:
                    zk.sync("/")  # read what the leader has, not a lagging follower
                    result = settle(zk)
                    break
                except (ConnectionLoss, SessionExpiredError, OperationTimeoutError):
                    if time.monotonic() >= deadline:
                        raise self._fail(what, lost) from lost
                except _Unknown as u:
                    raise MetadataStoreError(
                        f"metadata store {self.location.url}: {what}: connection lost ({lost!r}) and the "
                        f"re-read cannot tell whether it landed: {u} (outcome unknown)"
                    ) from lost
            if result is not None:
                log.info("metadata store %s: %s: the re-read shows it landed", self.location.url, what)
                return result
            log.info("metadata store %s: %s: the re-read shows it did not land; sending it again", self.location.url, what)
            if time.monotonic() >= deadline:
                raise self._fail(what, lost) from lost

    def _path(self, path: str, *, allow_root: bool = False) -> str:
        return self.location.zk_path(validate_path(path, allow_root=allow_root))

    def _write_path(self, path: str) -> str:
        """The ZooKeeper path of a write, refused before anything is sent when it is Pulsar's."""
        zpath = self._path(path)
        why = self.location.write_refusal(path)
        if why is not None:
            raise PulsarReadOnlyError(why)
        return zpath

    def write_refusal(self, path: str) -> str | None:
        """Why this store would refuse to write ``path`` (an attached store: Pulsar's paths), or None."""
        return self.location.write_refusal(validate_path(path))

    @staticmethod
    def _check_size(path: str, data: bytes) -> bytes:
        if len(data) > MAX_RECORD_BYTES:
            hint = (
                " (store the managed-ledger info compressed: Pulsar's managedLedgerInfoCompressionType)"
                if path.startswith(PASS_THROUGH + "/")
                else ""
            )
            raise ValidationError(
                f"metadata record {path} of {len(data):,} bytes exceeds ZooKeeper's znode limit "
                f"({MAX_RECORD_BYTES:,} bytes under the default jute.maxbuffer){hint}"
            )
        return data

    def _stat(self, zk: Any, zpath: str) -> tuple[bytes, int] | None:
        from kazoo.exceptions import NoNodeError

        try:
            data, stat = zk.get(zpath)
        except NoNodeError:
            return None
        return (data or b""), stat.version

    def _ensure_parent(self, zk: Any, zpath: str) -> None:
        parent = parent_path(zpath)
        if parent != "/":
            zk.ensure_path(parent)

    # --- MetadataStore -------------------------------------------------------------------------

    def get(self, path: str) -> Versioned | None:
        zpath = self._path(path, allow_root=True)
        got = self._read(f"get {path}", lambda zk: self._stat(zk, zpath))
        return None if got is None else Versioned(got[0], got[1])

    def create(self, path: str, value: Buffer) -> int:
        from kazoo.exceptions import NodeExistsError as ZkExists

        zpath = self._write_path(path)
        data = self._check_size(path, as_bytes(value, path))

        def apply(zk: Any) -> int:
            try:
                zk.create(zpath, data, makepath=True)
            except ZkExists:
                raise NodeExistsError(f"metadata path {path} already exists") from None
            return 0

        def settle(zk: Any) -> int | None:
            now = self._stat(zk, zpath)
            if now is None:
                return None
            if now == (data, 0):
                return 0
            raise _Unknown(f"{path} exists at version {now[1]} with other bytes")

        return self._write(f"create {path}", apply, settle)

    def put(self, path: str, value: Buffer, expected_version: int) -> int:
        from kazoo.exceptions import BadVersionError, NoNodeError

        zpath = self._write_path(path)
        data = self._check_size(path, as_bytes(value, path))
        expected = check_version(expected_version)

        def apply(zk: Any) -> int:
            try:
                return zk.set(zpath, data, version=expected).version
            except NoNodeError:
                raise VersionConflictError(
                    f"metadata path {path} does not exist (expected version {expected}, found none)"
                ) from None
            except BadVersionError:
                now = self._stat(zk, zpath)
                found = "none" if now is None else str(now[1])
                raise VersionConflictError(
                    f"metadata path {path} changed: expected version {expected}, found {found}"
                ) from None

        def settle(zk: Any) -> int | None:
            now = self._stat(zk, zpath)
            if now is not None and now == (data, expected + 1):
                return expected + 1
            if now is not None and now[1] == expected:
                return None
            raise _Unknown(f"{path} is at version {'none' if now is None else now[1]}, expected {expected} or {expected + 1}")

        return self._write(f"put {path}", apply, settle)

    def set(self, path: str, value: Buffer) -> int:
        from kazoo.exceptions import NodeExistsError as ZkExists
        from kazoo.exceptions import NoNodeError

        zpath = self._write_path(path)
        data = self._check_size(path, as_bytes(value, path))

        def apply(zk: Any) -> int:
            while True:
                try:
                    return zk.set(zpath, data).version
                except NoNodeError:
                    try:
                        zk.create(zpath, data, makepath=True)
                        return 0
                    except ZkExists:
                        continue  # created meanwhile: set it

        def settle(zk: Any) -> int | None:
            now = self._stat(zk, zpath)
            return now[1] if now is not None and now[0] == data else None  # an upsert: safe to send again

        return self._write(f"set {path}", apply, settle)

    def delete(self, path: str, expected_version: int | None = None) -> None:
        from kazoo.exceptions import BadVersionError, NoNodeError, NotEmptyError

        zpath = self._write_path(path)
        expected = None if expected_version is None else check_version(expected_version)
        seen: list[int] = []

        def apply(zk: Any) -> bool:
            if not seen:
                now = self._stat(zk, zpath)
                if now is not None:
                    seen.append(now[1])
            try:
                zk.delete(zpath, version=-1 if expected is None else expected)
            except NoNodeError:
                raise NodeNotFoundError(f"metadata path {path} does not exist") from None
            except BadVersionError:
                now = self._stat(zk, zpath)
                raise VersionConflictError(
                    f"metadata path {path} changed: expected version {expected}, found "
                    f"{'none' if now is None else now[1]}"
                ) from None
            except NotEmptyError:
                raise MetadataStoreError(
                    f"metadata path {path} has children in ZooKeeper and cannot be deleted alone "
                    f"(children: {', '.join(zk.get_children(zpath)[:5])}); nothing was deleted"
                ) from None
            return True

        def settle(zk: Any) -> bool | None:
            now = self._stat(zk, zpath)
            if now is None:
                return True  # gone: ours landed (or an equal delete did; the record is gone either way)
            want = expected if expected is not None else (seen[0] if seen else now[1])
            if now[1] == want:
                return None
            raise _Unknown(f"{path} changed to version {now[1]} meanwhile")

        self._write(f"delete {path}", apply, settle)

    def children(self, path: str) -> list[str]:
        from kazoo.exceptions import NoNodeError

        validate_path(path, allow_root=True)

        def run(zk: Any) -> list[str]:
            if path == "/":  # the protocol's top level: Pulsar's managed-ledgers beside our root's children
                names = set(self._children(zk, self.location.zk_path("/")))
                for p in self.location.pass_through:
                    if zk.exists(self.location.zk_path(p)):
                        names.add(p[1:].split("/")[0])
                return sorted(names)
            try:
                return sorted(zk.get_children(self.location.zk_path(path)))
            except NoNodeError:
                return []

        return self._read(f"children {path}", run)

    @staticmethod
    def _children(zk: Any, zpath: str) -> list[str]:
        from kazoo.exceptions import NoNodeError

        try:
            return zk.get_children(zpath)
        except NoNodeError:
            return []

    def transaction(self, ops: Sequence[Op]) -> list[int | None]:
        checked: list[tuple[Op, str, bytes | None, int | None]] = []
        for op in ops:
            # a check reads only: it may name Pulsar's records (a drain conditional on a topic's version)
            writes = isinstance(op, CreateOp | PutOp | DeleteOp)
            why = self.location.write_refusal(validate_path(op.path)) if writes else None
            if why is not None:
                raise PulsarReadOnlyError(f"transaction op {len(checked) + 1} of {len(ops)}: {why}; no op applied")
            if isinstance(op, CreateOp | PutOp):
                data = self._check_size(op.path, as_bytes(op.value, validate_path(op.path)))
                v = check_version(op.expected_version) if isinstance(op, PutOp) else None
                checked.append((op, self.location.zk_path(op.path), data, v))
            elif isinstance(op, DeleteOp | CheckOp):
                validate_path(op.path)
                v = op.expected_version
                checked.append((op, self.location.zk_path(op.path), None, None if v is None else check_version(v)))
            else:
                raise ValidationError(f"unknown transaction op {op!r}")
        if not checked:
            return []
        pre: dict[str, int | None] = {}  # versions of plain deletes' targets, read before the multi

        def apply(zk: Any) -> list[int | None]:
            for op, zpath, _, _ in checked:
                if isinstance(op, CreateOp):
                    self._ensure_parent(zk, zpath)  # multi cannot makepath; empty ancestors are harmless
                elif isinstance(op, DeleteOp) and op.expected_version is None and zpath not in pre:
                    now = self._stat(zk, zpath)
                    pre[zpath] = None if now is None else now[1]
            t = zk.transaction()
            for op, zpath, data, v in checked:
                if isinstance(op, CreateOp):
                    t.create(zpath, data)
                elif isinstance(op, PutOp):
                    t.set_data(zpath, data, v)
                elif isinstance(op, DeleteOp):
                    t.delete(zpath, -1 if v is None else v)
                else:
                    t.check(zpath, v)
            results = t.commit()
            self._raise_failed(zk, checked, results)
            return [
                0 if isinstance(op, CreateOp) else (res.version if isinstance(op, PutOp) else None)
                for (op, _, _, _), res in zip(checked, results, strict=True)
            ]

        def settle(zk: Any) -> list[int | None] | None:
            landed, untouched = True, True
            for op, zpath, data, v in checked:
                now = self._stat(zk, zpath)
                if isinstance(op, CreateOp):
                    landed &= now == (data, 0)
                    untouched &= now is None
                elif isinstance(op, PutOp):
                    assert v is not None
                    landed &= now == (data, v + 1)
                    untouched &= now is not None and now[1] == v
                elif isinstance(op, DeleteOp):
                    landed &= now is None
                    want = v if v is not None else pre.get(zpath)
                    untouched &= now is not None and (want is None or now[1] == want)
                else:
                    landed &= now is not None and now[1] == v
                    untouched &= now is not None and now[1] == v
            if landed:
                return [
                    0 if isinstance(op, CreateOp) else ((v or 0) + 1 if isinstance(op, PutOp) else None)
                    for op, _, _, v in checked
                ]
            if untouched:
                return None
            raise _Unknown("the nodes are neither all as before nor all as after the transaction")

        return self._write(f"transaction of {len(checked)} ops", apply, settle)

    def _raise_failed(self, zk: Any, checked: list, results: list) -> None:
        from kazoo.exceptions import BadVersionError, NoNodeError, RolledBackError
        from kazoo.exceptions import NodeExistsError as ZkExists

        n = len(checked)
        for i, ((op, zpath, _, v), res) in enumerate(zip(checked, results, strict=True)):
            if not isinstance(res, Exception) or isinstance(res, RolledBackError):
                continue
            where = f"transaction op {i + 1} of {n} ({type(op).__name__})"
            if isinstance(res, ZkExists):
                raise NodeExistsError(f"{where}: metadata path {op.path} already exists; no op applied")
            if isinstance(res, NoNodeError):
                if isinstance(op, DeleteOp):
                    raise NodeNotFoundError(f"{where}: metadata path {op.path} does not exist; no op applied")
                raise VersionConflictError(
                    f"{where}: metadata path {op.path} does not exist (expected version {v}, found none); no op applied"
                )
            if isinstance(res, BadVersionError):
                now = self._stat(zk, zpath)
                found = "none" if now is None else str(now[1])
                if now is not None and now[1] == v:
                    found += " before the transaction (an earlier op of it changes the path)"
                raise VersionConflictError(
                    f"{where}: metadata path {op.path} changed: expected version {v}, found {found}; no op applied"
                )
            raise MetadataStoreError(f"{where}: {op.path}: {res!r}; no op applied")

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            zk, self._zk = self._zk, None
        if zk is not None and self._pid == os.getpid():
            try:
                zk.stop()
                zk.close()
            except Exception as e:  # closing must not mask the caller's own error
                log.debug("closing ZooKeeper client: %r", e)

