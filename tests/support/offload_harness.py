"""Harness for the offload-protocol failure tests (test_failures.py, test_kill.py).

- :func:`build_env`: a topic with a few sealed ledgers written by TopicWriter (SQLite metadata on
  tmp_path, LocalLedgerStore, FilesystemBlobStore), a LedgerOffloader and a TopicOffloader factory with
  an injected clock and deterministic uuids.
- :class:`FaultyBlobStore` / :class:`FaultyMetadataStore`: delegating wrappers that run a hook (raise,
  or perform a concurrent change) at the Nth call of a chosen operation.
- helpers listing everything left in the object store and reading a ledger's topic record.
- :func:`records` / :func:`drain`: the deletion log the protocol appends to (replaced and conflicted
  attempts are ``offloaded`` records, never direct deletes) and a phase-2 drain over the same stores
  (through the faulty object store, so a test can make the drain's deletes fail).
"""

from __future__ import annotations

import itertools
import threading
import types
import uuid as uuidlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tieredcore.cold.backends.fs import FilesystemBlobStore
from tieredcore.cold.blob import iter_objects
from tieredcore.cold.failures import StoreFailureBudget
from tieredcore.errors import BlobStoreError, MetadataStoreError, ValidationError
from tieredcore.formats.keys import data_key, index_key, parse_ledger_key
from tieredcore.hot.local import LocalLedgerStore
from tieredcore.lifecycle.drain import DrainReport
from tieredcore.lifecycle.drain import drain as drain_log
from tieredcore.meta.deletion_log import DeletionLog
from tieredcore.meta.managed_ledgers import ManagedLedgerStore, find_ledger
from tieredcore.meta.sqlite import SqliteMetadataStore
from tieredcore.offload.managed import ABANDONED_PREFIX, TopicOffloader, abandoned_uuids, context_uuid
from tieredcore.offload.offloader import LedgerOffloader
from tieredcore.topic.writer import TopicWriter

TOPIC = "public/default/offload-protocol"
START_MS = 1_700_000_000_000

# one Hook = what runs at the chosen call: it may raise (the call is then not delegated) or do
# something else first (a concurrent change) and return normally (the call then goes through)
Hook = Callable[..., None]


class FakeClock:
    def __init__(self, now_ms: int = START_MS) -> None:
        self.now = now_ms
        self._lock = threading.Lock()

    def __call__(self) -> int:
        with self._lock:
            return self.now

    def advance(self, ms: int) -> None:
        with self._lock:
            self.now += ms


def uuid_seq(tag: int) -> Callable[[], uuidlib.UUID]:
    """Deterministic, distinguishable uuids: tag in the first group, a counter in the last."""
    counter = itertools.count(1)
    return lambda: uuidlib.UUID(f"{tag:08x}-0000-4000-8000-{next(counter):012x}")


class _Faults:
    """Counts calls per operation and fires hooks registered for (operation, nth call)."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self._hooks: dict[tuple[str, int], Hook] = {}
        self._lock = threading.Lock()
        self.fired: list[tuple[str, int]] = []
        self.log: list[tuple[str, object]] = []  # (operation, first argument) of every call

    def on(self, op: str, nth: int, hook: Hook) -> None:
        with self._lock:
            self._hooks[(op, nth)] = hook

    def clear(self) -> None:
        with self._lock:
            self._hooks.clear()

    def hit(self, op: str, *args) -> None:
        with self._lock:
            self.calls[op] += 1
            self.log.append((op, args[0] if args else None))
            n = self.calls[op]
            hook = self._hooks.pop((op, n), None)
            if hook is not None:
                self.fired.append((op, n))
        if hook is not None:
            hook(*args)


def raiser(exc: BaseException) -> Hook:
    def hook(*_args) -> None:
        raise exc

    return hook


class FaultyBlobStore:
    """Delegates to a real BlobStore; hooks fire before the delegated call.

    Operation names: the BlobStore method names, except that put() counts as "put_index" for keys
    ending in "-index" and "put" otherwise.
    """

    def __init__(self, inner) -> None:
        self.inner = inner
        self.driver = inner.driver
        self.faults = _Faults()

    def __getattr__(self, name):  # anything not intercepted (driver_properties, get, list, ...)
        return getattr(self.inner, name)

    def initiate_multipart(self, key, metadata=None):
        self.faults.hit("initiate_multipart", key)
        return self.inner.initiate_multipart(key, metadata)

    def upload_part(self, key, upload_id, part_number, data):
        self.faults.hit("upload_part", key, upload_id, part_number)
        return self.inner.upload_part(key, upload_id, part_number, data)

    def complete_multipart(self, key, upload_id, parts):
        self.faults.hit("complete_multipart", key, upload_id)
        return self.inner.complete_multipart(key, upload_id, parts)

    def abort_multipart(self, key, upload_id):
        self.faults.hit("abort_multipart", key, upload_id)
        return self.inner.abort_multipart(key, upload_id)

    def put(self, key, data, metadata=None):
        self.faults.hit("put_index" if key.endswith("-index") else "put", key)
        return self.inner.put(key, data, metadata)

    def delete(self, keys):
        self.faults.hit("delete", list(keys))
        return self.inner.delete(keys)


class FaultyMetadataStore:
    """Delegates to a real MetadataStore; hooks fire at the Nth put() of a topic record.

    A hook may raise (the put is then not applied), or change the record through ``inner`` first (a
    concurrent writer: the put then loses its compare-and-set). :meth:`fail_after_put` applies the
    put and raises anyway (the "landed but the client saw an error" case).
    """

    def __init__(self, inner) -> None:
        self.inner = inner
        self.faults = _Faults()
        self._landed_then_fail: set[int] = set()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def fail_after_put(self, nth: int) -> None:
        self._landed_then_fail.add(nth)

    def put(self, path, value, expected_version):
        if path.startswith("/managed-ledgers/"):
            self.faults.hit("put", path)
            n = self.faults.calls["put"]
            if n in self._landed_then_fail:
                self._landed_then_fail.discard(n)
                self.inner.put(path, value, expected_version)
                raise MetadataStoreError(f"injected: put {path} landed but the client saw an error")
        return self.inner.put(path, value, expected_version)


@dataclass
class Env:
    root: Path
    meta: FaultyMetadataStore
    ml: ManagedLedgerStore  # through the faulty metadata store
    raw_ml: ManagedLedgerStore  # straight to SQLite: for the test's own (concurrent) changes
    hot: LocalLedgerStore
    raw_store: FilesystemBlobStore
    store: FaultyBlobStore
    offloader: LedgerOffloader
    clock: FakeClock
    ledgers: list[int]  # sealed ledgers, oldest first (the newest listed ledger is open)
    payloads: dict[int, list[bytes]] = field(default_factory=dict)
    max_block_size: int = 0

    def topic_offloader(self, tag: int = 1, offloader: LedgerOffloader | None = None, **kw) -> TopicOffloader:
        return TopicOffloader(
            self.ml,
            self.hot,
            offloader or self.offloader,
            clock_ms=self.clock,
            uuid_factory=uuid_seq(tag),
            **kw,
        )

    def info(self):
        return self.raw_ml.get_topic(TOPIC)[0]

    def ledger(self, ledger_id: int):
        return find_ledger(self.info(), ledger_id)

    def mutate(self, fn: Callable) -> None:
        """A concurrent change of the topic record (bypasses the faulty wrapper)."""
        self.raw_ml.update_topic(TOPIC, fn)


def payload(ledger_index: int, entry: int, size: int) -> bytes:
    head = f"L{ledger_index}E{entry}:".encode()
    return (head * (size // len(head) + 1))[:size]


def build_env(
    tmp_path: Path,
    *,
    n_ledgers: int = 3,
    entries: int = 20,
    entry_size: int = 100,
    max_block_size: int = 600,
) -> Env:
    """`n_ledgers` sealed ledgers of `entries` entries each, plus an open (empty) newest ledger.

    With the defaults a ledger is 2000 payload bytes and its data object has 5 blocks (4 entries of
    112 frame bytes per 600-byte block), so failures can be injected at any part.
    """
    clock = FakeClock()
    sqlite = SqliteMetadataStore(tmp_path / "meta.db")
    meta = FaultyMetadataStore(sqlite)
    raw_ml = ManagedLedgerStore(sqlite)
    hot = LocalLedgerStore(tmp_path / "hot")
    writer = TopicWriter(raw_ml, hot, TOPIC, max_entries=entries, clock_ms=clock)
    payloads: dict[int, list[bytes]] = {}
    for i in range(n_ledgers):
        lid = writer.current_ledger_id
        payloads[lid] = [payload(i, e, entry_size) for e in range(entries)]
        writer.append_many(payloads[lid])
        clock.advance(1000)
        writer.rollover()
    writer.close(seal=False)  # the newest ledger stays open, as under a live broker
    raw_store = FilesystemBlobStore(tmp_path / "cold")
    store = FaultyBlobStore(raw_store)
    offloader = LedgerOffloader(store, max_block_size=max_block_size)
    ledgers = list(payloads)
    info = raw_ml.get_topic(TOPIC)[0]
    assert [li.ledgerId for li in info.ledgerInfo][:-1] == ledgers
    assert info.ledgerInfo[-1].timestamp == 0
    return Env(
        root=tmp_path,
        meta=meta,
        ml=ManagedLedgerStore(meta),
        raw_ml=raw_ml,
        hot=hot,
        raw_store=raw_store,
        store=store,
        offloader=offloader,
        clock=clock,
        ledgers=ledgers,
        payloads=payloads,
        max_block_size=max_block_size,
    )


# --- the deletion log ----------------------------------------------------------------------------


def deletion_log(env: Env) -> DeletionLog:
    return DeletionLog(env.meta.inner)


def records(env: Env) -> list[tuple[str, int, str]]:
    """(reason, ledger id, uuid) of every pending ``offloaded`` record, sorted; each is checked to name
    the topic and the filesystem store the protocol writes to."""
    out = []
    for e in deletion_log(env).pending():
        r = e.record
        assert r is not None and r.type == "offloaded", e
        assert r.topic == TOPIC.replace("default/", "default/persistent/")
        assert r.driver["name"] == "tiered-local" and r.driver["properties"]["root"] == str(env.raw_store.root)
        out.append((r.reason, r.ledger_id, r.uuid))
    return sorted(out)


class _DrainWorkspace:
    """What drain() uses of a Workspace, over the env's stores (objects through the faulty store)."""

    def __init__(self, env: Env) -> None:
        self.metadata = env.meta.inner
        self.ml = env.raw_ml
        self.hot = env.hot
        self._offloader = LedgerOffloader(env.store, max_block_size=env.max_block_size)
        self.config = types.SimpleNamespace(cluster=self._offloader.cluster)  # the offloaders' cluster
        self.attached = False  # a workspace of its own (not attached to a Pulsar cluster)

    def identity_if_any(self) -> str | None:
        return None  # the env's offloaders write no owner identity

    def failure_budget(self) -> StoreFailureBudget:
        return StoreFailureBudget()  # a workspace's default

    def offloader_for_driver(self, dm) -> LedgerOffloader:
        if dm.name != "tiered-local":
            raise ValidationError(f"unexpected driver {dm.name!r}")
        return self._offloader


def drain(env: Env, as_of_ms: int | None = None, **kw) -> DrainReport:
    """Phase 2 over the env's stores, as of the env's clock unless told."""
    return drain_log(_DrainWorkspace(env), env.clock() if as_of_ms is None else as_of_ms, **kw)


# --- what is left ----------------------------------------------------------------------------


def object_keys(store) -> list[str]:
    """Every object key but the owner marker a workspace writes when it claims the store and its topic
    manifests (docs/recovery.md)."""
    return [o.key for o in iter_objects(store) if not o.key.startswith(("tiered-owner.", "tiered-topic-manifests/"))]


def upload_keys(store) -> list[str]:
    return [u.key for u in store.list_multipart_uploads("")]


def leftovers(store) -> tuple[list[str], list[str]]:
    """(every object key, every unfinished multipart upload's key)."""
    return object_keys(store), upload_keys(store)


def uuids_in_store(store) -> set[str]:
    out = set()
    for k in object_keys(store) + upload_keys(store):
        p = parse_ledger_key(k)
        assert p is not None, f"unexpected key {k!r} in the store"
        out.add(p.uuid)
    return out


def offloaded_keys(uuid: str, ledger_id: int, prefix: str = "") -> list[str]:
    return sorted([data_key(prefix, uuid, ledger_id), index_key(prefix, uuid, ledger_id)])


def properties(li) -> dict[str, str]:
    return {kv.key: kv.value for kv in li.properties}


def abandoned(li) -> list[str]:
    return abandoned_uuids(li)


def read_all(offloader: LedgerOffloader, ledger_id: int, uuid: str) -> list[bytes]:
    h = offloader.read_offloaded(ledger_id, uuid)
    try:
        assert h.is_closed
        return [e.data for e in h.read(0, h.last_add_confirmed)]
    finally:
        h.close()


__all__ = [
    "ABANDONED_PREFIX",
    "BlobStoreError",
    "MetadataStoreError",
    "TOPIC",
    "Env",
    "FakeClock",
    "FaultyBlobStore",
    "FaultyMetadataStore",
    "abandoned",
    "build_env",
    "context_uuid",
    "deletion_log",
    "drain",
    "leftovers",
    "object_keys",
    "offloaded_keys",
    "payload",
    "properties",
    "raiser",
    "read_all",
    "records",
    "upload_keys",
    "uuid_seq",
    "uuids_in_store",
]
