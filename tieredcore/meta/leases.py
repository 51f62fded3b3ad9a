"""Per-topic leases in the metadata store: one runner at a time offloads (or repairs) a topic.

Concurrent sweeps of one topic are safe without it (every step is a compare-and-set), but they waste
uploads: each writes its objects and all but one lose the completion race. A lease is a record

    /tiered/leases/<tenant>/<namespace>/persistent/<topic>   {"holder", "purpose", "acquired_ms", "expires_ms"}

acquired by create (absent) or compare-and-set (expired, or unreadable); a second runner finds it held and
skips the topic, saying by whom and until when. The expiry makes a crashed holder harmless: after the
TTL anyone may take the lease over; a holder on the same host whose process no longer exists (holders are
named ``host:pid:random``) is taken over at once. Holders renew after each ledger and delete the record
when done.

Leases measure real time (the wall clock), unlike the workflows' logical clock: they arbitrate between
processes running now, whatever logical date each run works on.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid as uuidlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass

from tieredcore.clock import iso_ms
from tieredcore.errors import (
    LeaseHeldError,
    NodeExistsError,
    NodeNotFoundError,
    TieredError,
    ValidationError,
    VersionConflictError,
)
from tieredcore.meta.store import MetadataStore
from tieredcore.names import TopicName

ROOT = "/tiered/leases"
DEFAULT_TTL_MS = 15 * 60 * 1000


def _wall_ms() -> int:
    return int(time.time() * 1000)


def default_holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuidlib.uuid4().hex[:8]}"


@dataclass(frozen=True)
class Lease:
    topic: str  # managed-ledger name
    holder: str
    purpose: str
    expires_ms: int
    version: int


class TopicLeases:
    def __init__(self, store: MetadataStore, holder: str | None = None, ttl_ms: int = DEFAULT_TTL_MS,
                 clock_ms: Callable[[], int] = _wall_ms) -> None:
        if ttl_ms <= 0:
            raise ValidationError(f"lease ttl must be positive, got {ttl_ms} ms")
        self.store = store
        self.holder = holder or default_holder()
        self.ttl_ms = ttl_ms
        self.clock_ms = clock_ms

    @staticmethod
    def path(topic: TopicName | str) -> str:
        return f"{ROOT}/{TopicName.parse(topic).managed_ledger_name}"

    def _body(self, purpose: str, now: int) -> bytes:
        return json.dumps({"holder": self.holder, "purpose": purpose, "acquired_ms": now,
                           "expires_ms": now + self.ttl_ms}, sort_keys=True).encode()

    def current(self, topic: TopicName | str) -> dict | None:
        """The lease record as stored (None: no lease, or an unreadable record)."""
        got = self.store.get(self.path(topic))
        return _parse(got.value) if got is not None else None

    def acquire(self, topic: TopicName | str, purpose: str) -> Lease:
        """Take the topic's lease; LeaseHeldError when another holder's lease has not expired."""
        t = TopicName.parse(topic)
        path = self.path(t)
        for _ in range(10):
            now = self.clock_ms()
            got = self.store.get(path)
            try:
                if got is None:
                    version = self.store.create(path, self._body(purpose, now))
                else:
                    rec = _parse(got.value)
                    if rec is not None and rec["holder"] != self.holder and rec["expires_ms"] > now \
                            and not _dead_local_holder(rec["holder"]):
                        raise LeaseHeldError(
                            f"topic {t.full} is being processed by {rec['holder']} ({rec.get('purpose', '?')}, "
                            f"lease until {iso_ms(rec['expires_ms'])}): skipped this time")
                    version = self.store.put(path, self._body(purpose, now), got.version)
            except (NodeExistsError, VersionConflictError):
                continue  # someone else moved first: look again
            return Lease(t.managed_ledger_name, self.holder, purpose, now + self.ttl_ms, version)
        raise LeaseHeldError(f"topic {t.full}: its lease kept changing hands: skipped this time")

    def renew(self, lease: Lease) -> Lease:
        """Extend our lease; LeaseHeldError if it was lost (expired and taken over)."""
        now = self.clock_ms()
        try:
            version = self.store.put(self.path(lease.topic), self._body(lease.purpose, now), lease.version)
        except VersionConflictError:
            raise LeaseHeldError(f"topic {lease.topic}: lease lost (expired and taken over)") from None
        return Lease(lease.topic, lease.holder, lease.purpose, now + self.ttl_ms, version)

    def release(self, lease: Lease) -> None:
        """Delete our lease record (a lease lost meanwhile is left to its new holder)."""
        with suppress(VersionConflictError, NodeNotFoundError):
            self.store.delete(self.path(lease.topic), lease.version)

    @contextmanager
    def hold(self, topic: TopicName | str, purpose: str) -> Iterator[_Held]:
        held = _Held(self, self.acquire(topic, purpose))
        try:
            yield held
        finally:
            with suppress(TieredError):  # the expiry releases it anyway
                self.release(held.lease)


class _Held:
    def __init__(self, leases: TopicLeases, lease: Lease) -> None:
        self._leases = leases
        self.lease = lease

    def renew(self) -> None:
        self.lease = self._leases.renew(self.lease)


def _dead_local_holder(holder: str) -> bool:
    """True when the holder ran on this host and its process is gone (it cannot renew or release)."""
    host, _, rest = holder.partition(":")
    pid_text = rest.partition(":")[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # exists but not ours to signal
        return False
    return False


def _parse(value: bytes) -> dict | None:
    try:
        rec = json.loads(value)
    except (ValueError, RecursionError):
        return None
    if not isinstance(rec, dict) or not isinstance(rec.get("holder"), str) \
            or not isinstance(rec.get("expires_ms"), int) or isinstance(rec.get("expires_ms"), bool):
        return None
    return rec

