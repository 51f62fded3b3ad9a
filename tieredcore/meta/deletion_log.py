"""The deletion log of two-phase deletion (PIP-186, docs/deletion.md), kept in the metadata store.

Phase 1 (whoever wants storage gone) appends one record per storage object group **before** changing
the topic record; phase 2 (the drain) deletes storage and acknowledges. Records live under

    /tiered/deletion-log/pending/<id>       pending and retrying records (JSON)
    /tiered/deletion-log/dead-letter/<id>   records that reached the attempt limit or are malformed
    /tiered/deletion-log/stats              PIP-186 counters (JSON)

Every state change is a compare-and-set on the record's version, so several drains can run at once:
each may process a record (deletes are idempotent) but only one acknowledgement, retry or dead-letter
move lands; the others see a version conflict and move on. Counters only count the move that landed.
Works on any MetadataStore (SQLite now, ZooKeeper later): only get / create / put / delete / children /
transaction are used.
"""

from __future__ import annotations

import contextlib
import json
import uuid as uuidlib
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from tieredcore.errors import NodeExistsError, NodeNotFoundError, ValidationError, VersionConflictError
from tieredcore.meta.store import CreateOp, DeleteOp, MetadataStore
from tieredcore.model import INT64_MAX

ROOT = "/tiered/deletion-log"
PENDING = f"{ROOT}/pending"
DEAD = f"{ROOT}/dead-letter"
STATS = f"{ROOT}/stats"

TYPE_LEDGER = "ledger"  # hot-tier copy
TYPE_OFFLOADED = "offloaded"  # object-store copy of one offload attempt (uuid)
TYPE_SEGMENT = "segment"  # streaming segment object (PIP-76)
# a superseded topic manifest (docs/recovery.md): ledger_id holds the manifest's sequence number, the driver
# the store it lies in; no uuid
TYPE_MANIFEST = "manifest"
TYPES = (TYPE_LEDGER, TYPE_OFFLOADED, TYPE_SEGMENT, TYPE_MANIFEST)
COMPONENTS = ("managed-ledger", "cursor", "schema")

STATE_PENDING = "pending"
STATE_RETRYING = "retrying"
STATE_DEAD = "dead-letter"

DEFAULT_RETRY_DELAY_MS = 600_000
DEFAULT_MAX_ATTEMPTS = 10
MAX_BACKOFF_MS = 24 * 3600 * 1000
#: deepest JSON nesting a stored record may have (a driver's properties sit at depth 3): anything deeper
#: is malformed, and refused before it reaches code that recurses over it (asdict, json.dumps)
MAX_JSON_DEPTH = 16

COUNTERS = (
    "appended_hot", "appended_offloaded", "consumed", "deleted_hot", "deleted_offloaded",
    "delete_failures_hot", "delete_failures_offloaded", "acknowledged", "dead_lettered",
    "refused_mismatch", "refused_foreign", "still_in_use", "malformed",
)


@dataclass
class DeletionRecord:
    topic: str  # managed-ledger name: tenant/namespace/persistent/topic
    ledger_id: int
    type: str
    reason: str  # retention | deletion-lag | offload-cleanup | offload-conflict | orphan | topic-deletion ...
    created_ms: int
    component: str = "managed-ledger"
    uuid: str = ""  # offloaded / segment: the attempt's uuid
    driver: dict[str, Any] = field(default_factory=dict)  # {"name": ..., "properties": {...}}
    cursor: str = ""  # component cursor: its name (custom metadata pulsar/cursor)
    schema_id: str = ""  # component schema: pulsar/schemaId
    id: str = field(default_factory=lambda: uuidlib.uuid4().hex)
    state: str = STATE_PENDING
    attempts: int = 0
    next_attempt_ms: int = 0
    last_error: str = ""
    dead_reason: str = ""

    def validate(self) -> None:
        """Malformed records (missing essentials) are refused at append and dead-lettered at drain."""
        problems = []
        if not isinstance(self.topic, str) or self.topic.count("/") != 3:
            problems.append(f"topic {self.topic!r} is not tenant/namespace/persistent/topic")
        if not isinstance(self.ledger_id, int) or isinstance(self.ledger_id, bool) or self.ledger_id < 0:
            problems.append(f"ledger id {self.ledger_id!r}")
        if self.type not in TYPES:
            problems.append(f"type {self.type!r} not one of {', '.join(TYPES)}")
        if self.component not in COMPONENTS:
            problems.append(f"component {self.component!r} not one of {', '.join(COMPONENTS)}")
        if self.type in (TYPE_OFFLOADED, TYPE_SEGMENT):
            try:
                uuidlib.UUID(self.uuid)
            except (ValueError, TypeError, AttributeError):
                problems.append(f"uuid {self.uuid!r}")
            if not isinstance(self.driver, dict) or not self.driver.get("name"):
                problems.append("driver metadata missing")
        if self.type == TYPE_MANIFEST and (not isinstance(self.driver, dict) or not self.driver.get("name")):
            problems.append("driver metadata missing")
        if not self.reason or not isinstance(self.reason, str):
            problems.append("reason missing")
        # due() sorts and filters on these: one non-integer would break every drain, not just this record
        for name in ("created_ms", "attempts", "next_attempt_ms"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                problems.append(f"{name} {v!r}")
        # ids and times are Java longs; a stored record may hold any JSON number
        for name in ("ledger_id", "created_ms", "attempts", "next_attempt_ms"):
            v = getattr(self, name)
            if isinstance(v, int) and v > INT64_MAX:
                problems.append(f"{name} {v} above 2**63 - 1")
        for name in ("id", "uuid", "cursor", "schema_id", "state", "last_error", "dead_reason"):
            if not isinstance(getattr(self, name), str):
                problems.append(f"{name} {getattr(self, name)!r} is not a string")
        if not isinstance(self.driver, dict):
            problems.append(f"driver {self.driver!r} is not an object")
        if problems:
            raise ValidationError(f"deletion record {self.id}: " + "; ".join(problems))

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes) -> DeletionRecord:
        """A record from its stored bytes (not yet validated); ValidationError for bytes that are not
        a JSON object with the required fields."""
        try:
            raw = json.loads(data)
        except RecursionError:
            raise ValidationError("deletion record: JSON nested too deeply") from None
        except ValueError as e:  # not JSON, not UTF-8/16/32, an integer of more than 4300 digits
            raise ValidationError(f"deletion record is not JSON: {e}") from None
        if not isinstance(raw, dict):
            raise ValidationError("deletion record is not a JSON object")
        if _json_depth(raw) > MAX_JSON_DEPTH:
            raise ValidationError(f"deletion record: JSON nested deeper than {MAX_JSON_DEPTH} levels")
        known = {f.name for f in fields(cls)}
        try:
            return cls(**{k: v for k, v in raw.items() if k in known})
        except TypeError as e:  # a required field missing
            raise ValidationError(f"deletion record: {e}") from None

    @property
    def is_hot(self) -> bool:
        return self.type == TYPE_LEDGER


def _json_depth(value: Any) -> int:
    """Nesting depth of a parsed JSON value (a scalar is 0), counted without recursion; stops counting
    once past MAX_JSON_DEPTH."""
    deepest = 0
    stack = [(value, 0)]
    while stack and deepest <= MAX_JSON_DEPTH:
        v, depth = stack.pop()
        if isinstance(v, dict | list):
            deepest = max(deepest, depth + 1)
            stack.extend((child, depth + 1) for child in (v.values() if isinstance(v, dict) else v))
    return deepest


@dataclass(frozen=True)
class Entry:
    """A record as read from the log, with the version its next state change must expect.
    `record` is None for malformed bytes (then `error` says why)."""

    id: str
    version: int
    record: DeletionRecord | None
    error: str = ""
    raw: bytes = b""


def _safe_id(rid: str) -> str:
    if not rid or not all(c.isalnum() or c in "-_" for c in rid):
        raise ValidationError(f"deletion record id {rid!r} is not a plain identifier")
    return rid


class DeletionLog:
    def __init__(self, store: MetadataStore) -> None:
        self.store = store

    # -- phase 1 ------------------------------------------------------------------------------

    def append(self, records: Sequence[DeletionRecord]) -> None:
        """Durably append records, all or none (one transaction). Call before the metadata change."""
        if not records:
            return
        for r in records:
            r.validate()
            _safe_id(r.id)
        self.store.transaction([CreateOp(f"{PENDING}/{r.id}", r.to_json()) for r in records])
        self.count(appended_hot=sum(r.is_hot for r in records),
                   appended_offloaded=sum(not r.is_hot for r in records))

    # -- reading ------------------------------------------------------------------------------

    def _read(self, base: str, rid: str) -> Entry | None:
        got = self.store.get(f"{base}/{rid}")
        if got is None:
            return None
        try:
            rec = DeletionRecord.from_json(got.value)
            rec.validate()
        except (ValueError, TypeError, ValidationError) as e:
            return Entry(rid, got.version, None, f"malformed record: {e}", got.value)
        return Entry(rid, got.version, rec, raw=got.value)

    def pending(self) -> list[Entry]:
        out = []
        for rid in self.store.children(PENDING):
            e = self._read(PENDING, rid)
            if e is not None:
                out.append(e)
        return out

    def due(self, as_of_ms: int, limit: int | None = None) -> list[Entry]:
        """Records to process now: pending, or retrying whose next attempt time has come; malformed
        ones too (the drain dead-letters them). Oldest first."""
        out = [e for e in self.pending() if e.record is None or e.record.next_attempt_ms <= as_of_ms]
        out.sort(key=lambda e: (e.record.created_ms if e.record else 0, e.id))
        return out[:limit] if limit is not None else out

    def dead_letters(self) -> list[Entry]:
        out = []
        for rid in self.store.children(DEAD):
            e = self._read(DEAD, rid)
            if e is not None:
                out.append(e)
        return out

    # -- phase 2 state changes (each a CAS on the entry's version) ------------------------------

    def ack(self, entry: Entry, **counters: int) -> bool:
        """Done: remove the record. False if another consumer changed or removed it first."""
        try:
            self.store.delete(f"{PENDING}/{entry.id}", entry.version)
        except (VersionConflictError, NodeNotFoundError):
            return False
        self.count(acknowledged=1, consumed=1, **counters)
        return True

    def retry(self, entry: Entry, error: str, as_of_ms: int, *, delay_ms: int = DEFAULT_RETRY_DELAY_MS,
              max_attempts: int = DEFAULT_MAX_ATTEMPTS, **counters: int) -> str:
        """A failed delete: back off exponentially, or dead-letter at the attempt limit. Returns the
        new state, or '' if another consumer got there first."""
        rec = entry.record
        assert rec is not None
        attempts = rec.attempts + 1
        if attempts >= max_attempts:
            moved = self.dead_letter(entry, f"gave up after {attempts} attempts: {error}", attempts=attempts,
                                     **counters)
            return STATE_DEAD if moved else ""
        backoff = min(delay_ms * (2 ** (attempts - 1)), MAX_BACKOFF_MS)
        new = DeletionRecord(**{**asdict(rec), "state": STATE_RETRYING, "attempts": attempts,
                                "next_attempt_ms": as_of_ms + backoff, "last_error": error[:2000]})
        try:
            self.store.put(f"{PENDING}/{entry.id}", new.to_json(), entry.version)
        except (VersionConflictError, NodeNotFoundError):
            return ""
        self.count(consumed=1, **counters)
        return STATE_RETRYING

    def dead_letter(self, entry: Entry, reason: str, attempts: int | None = None, **counters: int) -> bool:
        """Move to the dead-letter list (atomically with the removal from pending)."""
        if entry.record is not None:
            rec = DeletionRecord(**{**asdict(entry.record), "state": STATE_DEAD, "dead_reason": reason[:2000]})
            if attempts is not None:
                rec.attempts = attempts
            body = rec.to_json()
        else:  # malformed: keep the original bytes for the operator
            body = json.dumps({"id": entry.id, "state": STATE_DEAD, "dead_reason": reason[:2000],
                               "raw": entry.raw.decode("utf-8", "replace")}).encode()
        try:
            self.store.transaction([DeleteOp(f"{PENDING}/{entry.id}", entry.version),
                                    CreateOp(f"{DEAD}/{entry.id}", body)])
        except (VersionConflictError, NodeNotFoundError, NodeExistsError):
            return False
        self.count(consumed=1, dead_lettered=1, **counters)
        return True

    # -- operator surface ---------------------------------------------------------------------

    def requeue(self, ids: Iterable[str], as_of_ms: int = 0) -> list[str]:
        """Dead letters back to pending with a fresh attempt count. Returns the ids moved."""
        moved = []
        for rid in ids:
            e = self._read(DEAD, _safe_id(rid))
            if e is None or e.record is None:
                continue  # unknown, or malformed (only `drop` applies)
            rec = DeletionRecord(**{**asdict(e.record), "state": STATE_PENDING, "attempts": 0,
                                    "next_attempt_ms": as_of_ms, "dead_reason": "", "last_error": ""})
            try:
                self.store.transaction([DeleteOp(f"{DEAD}/{rid}", e.version), CreateOp(f"{PENDING}/{rid}", rec.to_json())])
            except (VersionConflictError, NodeNotFoundError, NodeExistsError):
                continue
            moved.append(rid)
        return moved

    def drop(self, ids: Iterable[str]) -> list[str]:
        """Forget dead letters (the operator dealt with the storage by hand)."""
        dropped = []
        for rid in ids:
            try:
                self.store.delete(f"{DEAD}/{_safe_id(rid)}")
            except NodeNotFoundError:
                continue
            dropped.append(rid)
        return dropped

    # -- counters -----------------------------------------------------------------------------

    def counters(self) -> dict[str, int]:
        got = self.store.get(STATS)
        base = dict.fromkeys(COUNTERS, 0)
        if got is not None:
            # a damaged counters record restarts from zero rather than blocking deletions
            # (OverflowError: an infinite number; RecursionError: nesting deeper than the parser goes)
            with contextlib.suppress(ValueError, TypeError, AttributeError, OverflowError, RecursionError):
                base.update({k: int(v) for k, v in json.loads(got.value).items() if k in base})
        return base

    def count(self, **deltas: int) -> None:
        deltas = {k: v for k, v in deltas.items() if v}
        unknown = set(deltas) - set(COUNTERS)
        if unknown:
            raise ValidationError(f"unknown deletion counters {sorted(unknown)}")
        if not deltas:
            return
        for _ in range(50):
            got = self.store.get(STATS)
            cur = self.counters()
            for k, v in deltas.items():
                cur[k] += v
            body = json.dumps(cur, sort_keys=True).encode()
            try:
                if got is None:
                    self.store.create(STATS, body)
                else:
                    self.store.put(STATS, body, got.version)
                return
            except (VersionConflictError, NodeExistsError):
                continue
        raise VersionConflictError("deletion-log counters: gave up after 50 concurrent updates")

    def stats(self) -> dict[str, Any]:
        """PIP-186's counters and the in-flight estimate (pending + retrying)."""
        entries = self.pending()
        retrying = sum(1 for e in entries if e.record is not None and e.record.state == STATE_RETRYING)
        return {
            "in_flight": len(entries),
            "pending": len(entries) - retrying,
            "retrying": retrying,
            "dead_letter": len(self.store.children(DEAD)),
            "counters": self.counters(),
        }
