"""Support of the model-based test of the whole system (tests/model/test_system_model.py): faults and
simulated crashes at a chosen store call, and the checks the model runs against the workspace.

Faults are injected in-process around the real stores (the filesystem object store, the SQLite metadata
store): every store and metadata call is counted while a fault is armed, and the Nth one either raises
(``fault``: a BlobStoreError / MetadataStoreError, as a failing server would answer) or aborts the whole
operation (``crash``: SimulatedCrash, a BaseException no product code catches, as kill -9 would), before
the call is made or after it landed. A crash at a given call is what no server can produce, hence the
in-process wrapper."""

from __future__ import annotations

import re
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from tieredcore.errors import BlobStoreError, MetadataStoreError, NodeNotFoundError
from tieredcore.formats.keys import UUID_PATTERN
from tieredcore.meta.leases import ROOT as LEASE_ROOT
from tieredcore.meta.store import MetadataStore
from tieredcore.offload.context import is_complete
from tieredcore.offload.copies import copy_uuids

KINDS = ("fault", "crash")
WHEN = ("before", "after")
TARGETS = ("store", "metadata")  # whose calls are counted  # the call not made / made (it landed, then the error or the crash)

_STORE_CALLS = ("put", "get", "get_range", "head", "list", "delete", "initiate_multipart", "upload_part",
                "complete_multipart", "abort_multipart", "list_multipart_uploads")
_META_CALLS = ("get", "create", "put", "set", "delete", "children", "transaction")
_UUID = re.compile(UUID_PATTERN)


class SimulatedCrash(BaseException):  # noqa: N818 - not an error the product may catch: the process died
    """The process running the operation died at this call (kill -9): nothing after it runs."""


@dataclass(frozen=True)
class Fault:
    kind: str  # KINDS
    target: str  # TARGETS
    call: int  # the Nth call (counted from 1) of the operation to the target
    when: str  # WHEN

    def __str__(self) -> str:
        return f"{self.kind} at {self.target} call {self.call} ({self.when} it)"


class Injector:
    """Counts calls while armed; fires the armed fault at its call number (once)."""

    def __init__(self) -> None:
        self.fault: Fault | None = None
        self.calls = 0
        self.fired: str | None = None  # what fired, for the schedule's notes

    def arm(self, fault: Fault | None) -> None:
        self.fault, self.calls, self.fired = fault, 0, None

    def disarm(self) -> None:
        self.fault = None

    def call(self, where: str, name: str, fn: Callable[[], Any], error: type[Exception]) -> Any:
        f = self.fault
        if f is None or f.target != where:
            return fn()
        self.calls += 1
        if self.calls != f.call:
            return fn()
        self.fault = None  # once
        self.fired = f"{f}: {where}.{name}"
        if f.when == "after":
            fn()
        if f.kind == "crash":
            raise SimulatedCrash(self.fired)
        raise error(f"injected {self.fired}")


class FaultyBlobStore:
    """An object store whose calls go through the injector; everything else is the real store's."""

    def __init__(self, inner: Any, injector: Injector) -> None:
        self.inner = inner
        self.injector = injector

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name not in _STORE_CALLS:
            return attr
        return lambda *a, **kw: self.injector.call("store", name, lambda: attr(*a, **kw), BlobStoreError)


class FaultyMetadataStore:
    """The metadata store, its calls through the injector (a fault: the outcome is unknown, as the
    product's MetadataStoreError says)."""

    def __init__(self, inner: MetadataStore, injector: Injector) -> None:
        self.inner = inner
        self.injector = injector

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name not in _META_CALLS:
            return attr
        return lambda *a, **kw: self.injector.call("metadata", name, lambda: attr(*a, **kw), MetadataStoreError)


def drop_leases(meta: MetadataStore, path: str = LEASE_ROOT) -> None:
    """Delete every topic lease (the crashed process is gone: a new run takes its leases over, as
    TopicLeases does for a dead local holder)."""
    for c in meta.children(path):
        drop_leases(meta, f"{path}/{c}")
    if path != LEASE_ROOT and meta.get(path) is not None:
        with suppress(NodeNotFoundError):
            meta.delete(path)


def uuid_of(key: str) -> str | None:
    m = _UUID.search(key)
    return m.group(0) if m else None


def double_references(infos: dict[str, Any]) -> list[str]:
    """Objects the topic records reference in a way docs/deletion.md forbids: a V1 copy (one object
    pair per ledger) named by two ledgers, or any copy named by two topics. A segment holds entries of
    several ledgers of one topic: named by each of them."""
    owner: dict[str, tuple[str, int, str]] = {}  # uuid -> (topic, ledger, kind)
    out = []
    for topic, info in infos.items():
        for li in info.ledgerInfo:
            kind = "v1" if is_complete(li) else "segment"
            for u in copy_uuids(li):
                prev = owner.get(u)
                if prev is None:
                    owner[u] = (topic, li.ledgerId, kind)
                elif prev[0] != topic or kind == "v1" or prev[2] == "v1":
                    out.append(f"{u}: {prev} and {(topic, li.ledgerId, kind)}")
    return out
