"""The one compare-and-set step on a topic record, and what every writer of offloaded state shares around it
(docs/metadata.md, docs/deletion.md, docs/architecture.md).

Every change of a topic's offloaded state — a ledger offload, a streaming segment, a repair, a compaction,
a retention trim, a deletion-lag hand-off — has the same skeleton:

1. **assign** (:meth:`TopicTransaction.begin`): one CAS records what the change is about to write (a new
   uuid) before anything is written. Whatever that CAS replaces or removes (an earlier attempt, a crashed
   segment, a trimmed ledger's storage) must first be covered by a durable pending-deletion record
   (phase 1 of two-phase deletion): a mutation that finds something not yet covered raises
   :class:`Uncovered` with the records; they are appended and the CAS is tried again.
2. **write** (and verify) the objects: the caller's own business.
3. **commit** (:meth:`TopicTransaction.commit`): one CAS makes our objects current, only if the record
   still names them. A metadata-store error leaves the outcome *unknown*: nothing is deleted or recorded,
   since the update may have landed and our objects may be the only offloaded copy. A refusal is a
   *conflict* and any other error *failed*: our own objects go back (:meth:`TopicTransaction.give_back`)
   as pending deletions, never deleted directly (the drain checks they are not in use first).

A mutation runs inside :meth:`ManagedLedgerStore.update_topic` (again after each lost race) and decides
from the record it is given: it returns True to write its change, False to leave the record as it is,
raises :class:`Refusal` when the record is not as the step needs it, :class:`Uncovered` when a record
must be made durable first. It never changes anything outside the record.

:func:`delete_pair` is the one place that deletes a data/index object pair (and aborts its upload).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from tieredcore.cold.blob import BlobStore
from tieredcore.errors import MetadataStoreError, TieredError, VersionConflictError
from tieredcore.formats.keys import group_keys, with_manifests
from tieredcore.formats.mlinfo import ManagedLedgerInfo
from tieredcore.meta.deletion_log import TYPE_LEDGER, TYPE_SEGMENT, DeletionLog, DeletionRecord
from tieredcore.meta.managed_ledgers import ManagedLedgerStore
from tieredcore.meta.reasons import Reason
from tieredcore.names import TopicName
from tieredcore.offload.context import (
    driver_dict,
    incomplete_segment_uuids,
    segment_drivers,
    uuid_from_halves,
)
from tieredcore.outcomes import Outcome

log = logging.getLogger(__name__)

__all__ = [
    "MAX_ROUNDS",
    "Applied",
    "Failed",
    "ObjectGroup",
    "Refusal",
    "Refused",
    "Step",
    "TopicTransaction",
    "Uncovered",
    "Unknown",
    "delete_pair",
    "drop_incomplete_segments",
    "settle",
    "stale_segments",
]

MAX_ROUNDS = 10  # append / CAS rounds of a step before giving up on a topic that keeps changing

Mutation = Callable[[ManagedLedgerInfo], bool]


class Refusal(Exception):
    """Raised by a mutation: the record is not as the step needs it (nothing is written)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Uncovered(Exception):
    """Raised by a mutation: ``records`` must be durable in the deletion log before its change may land."""

    def __init__(self, records: Sequence[DeletionRecord]) -> None:
        super().__init__(f"{len(records)} record(s) to append first")
        self.records = list(records)


@dataclass(frozen=True)
class ObjectGroup:
    """One storage object group of a ledger: its hot copy (``ledger``, no uuid), one offload attempt's
    object pair (``offloaded``) or one streaming or compacted segment (``segment``), with the driver
    metadata of the store it lies in (a deletion record's ``driver``)."""

    ledger_id: int
    type: str
    uuid: str = ""
    driver: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def key(self) -> tuple[int, str, str]:
        return self.ledger_id, self.type, self.uuid

    def record(self, topic: str, reason: Reason, created_ms: int, next_attempt_ms: int = 0) -> DeletionRecord:
        """The pending-deletion record of this group (phase 1 of two-phase deletion)."""
        return DeletionRecord(topic=topic, ledger_id=self.ledger_id, type=self.type, reason=reason,
                              created_ms=created_ms, uuid=self.uuid,
                              driver={} if self.type == TYPE_LEDGER else dict(self.driver),
                              next_attempt_ms=next_attempt_ms)


# -- what one step came to ------------------------------------------------------------------------


@dataclass(frozen=True)
class Applied:
    """The CAS landed (``changed``) or the mutation found nothing to change; ``info`` is the record as
    stored (or as read)."""

    info: ManagedLedgerInfo
    version: int
    changed: bool


@dataclass(frozen=True)
class Refused:
    """The record was not as the step needs it: a conflict (retried by a later run)."""

    reason: str
    outcome: Outcome = Outcome.CONFLICT
    error_type: str = ""

    @property
    def error(self) -> str:
        return self.reason


@dataclass(frozen=True)
class Unknown:
    """A metadata-store error at the committing step: the change may have landed."""

    error: str
    outcome: Outcome = Outcome.UNKNOWN
    error_type: str = ""


@dataclass(frozen=True)
class Failed:
    error: str
    error_type: str = ""
    outcome: Outcome = Outcome.FAILED


Step = Applied | Refused | Unknown | Failed


class Settled(Protocol):
    """A result row of one unit of work (offload, segment, compaction batch)."""

    outcome: str
    error: str | None
    error_type: str


def settle(row: Settled, step: Step, done: Outcome | None = None) -> bool:
    """The row's outcome from a step: ``done`` when it applied (None: leave the row as it is), else
    what went wrong. True when it applied."""
    if isinstance(step, Applied):
        if done is not None:
            row.outcome = done
        return True
    row.outcome, row.error, row.error_type = step.outcome, step.error, step.error_type
    return False


# -- the step -------------------------------------------------------------------------------------


class TopicTransaction:
    """The protocol's steps on one topic record: CAS with the deletion log beside it."""

    def __init__(self, ml: ManagedLedgerStore, deletion_log: DeletionLog, topic: str | TopicName, *,
                 clock_ms: Callable[[], int]) -> None:
        self.ml = ml
        self.deletion_log = deletion_log
        self.topic = topic if isinstance(topic, TopicName) else TopicName.parse(topic)
        self.clock_ms = clock_ms
        # object groups this transaction has recorded for deletion: a later round need not record them again
        self.covered: set[tuple[int, str, str]] = set()

    @property
    def name(self) -> str:
        """The managed-ledger name (deletion records, object metadata)."""
        return self.topic.managed_ledger_name

    def cas(self, mutate: Mutation) -> Applied | Refused:
        """One read / mutate / compare-and-set (retried on lost races). Raises what the metadata store
        raises (TopicNotFoundError, VersionConflictError, MetadataStoreError) and :class:`Uncovered`."""
        self.ml.require_writable(self.topic)  # an attached cluster's record: refused before anything
        changed = False
        state = self.ml.offloaded_state
        state_changed = False

        def run(info: ManagedLedgerInfo) -> bool:
            nonlocal changed, state_changed
            before = state(info) if state is not None else b""
            changed = bool(mutate(info))
            state_changed = changed and state is not None and state(info) != before
            return changed

        try:
            info, version = self.ml.update_topic(self.topic, run)
        except Refusal as r:
            return Refused(r.reason)
        hook = self.ml.after_offloaded_change
        if state_changed and hook is not None:
            # after the commit, never before: the topic manifest describes what the record now holds
            hook(self.topic, info, version)
        return Applied(info, version, changed)

    def record(self, records: Iterable[DeletionRecord]) -> None:
        """Append pending-deletion records durably (all or none) and remember them as covered."""
        records = list(records)
        if records:
            # a change of an attached cluster's topic is refused before its deletion records exist
            self.ml.require_writable(self.topic)
            self.deletion_log.append(records)
        self.covered.update((r.ledger_id, r.type, r.uuid) for r in records)

    def cover_and_cas(self, mutate: Mutation, what: str, rounds: int = MAX_ROUNDS) -> Applied | Refused:
        """:meth:`cas`, appending what the mutation finds :class:`Uncovered` and trying again."""
        for _round in range(rounds):
            try:
                return self.cas(mutate)
            except Uncovered as u:
                self.record(u.records)
        raise VersionConflictError(f"{self.name}: {what}: the topic kept changing over {rounds} rounds")

    def begin(self, mutate: Mutation, what: str) -> Applied | Refused | Failed:
        """Step 1: nothing of ours is written yet, so any error is a plain failure (a landed CAS whose
        answer was lost leaves an assignment the next attempt covers and replaces)."""
        try:
            return self.cover_and_cas(mutate, what)
        except TieredError as e:
            return Failed(f"{what}: {e}", type(e).__name__)

    def commit(self, mutate: Mutation, what: str, give_back: Callable[[], None]) -> Step:
        """Step 3: the CAS that makes our objects current. Unknown on a metadata-store error (nothing
        given back); on a refusal or any other error ``give_back()`` runs first."""
        try:
            step = self.cas(mutate)
        except MetadataStoreError as e:
            return Unknown(f"{what}, outcome unknown: {e}")
        except TieredError as e:
            give_back()
            return Failed(f"{what}: {e}", type(e).__name__)
        if isinstance(step, Refused):
            give_back()
        return step

    def give_back(self, groups: Sequence[ObjectGroup], reason: Reason, *, unassign: bool = False,
                  next_attempt_ms: int = 0) -> None:
        """Our attempt did not land: its objects become pending deletions (never a direct delete).
        ``unassign``: first take our incomplete segment entries off the record, so the drain does not
        find them still in use (if that fails, the next run's assign step or stale-segment cleanup
        covers them; the record is harmless meanwhile: the drain sees them in use and deletes
        nothing). If the record cannot be appended, nothing references the objects any more and
        orphan reconciliation finds them later."""
        if not groups:
            return
        if unassign:
            ours = {g.uuid for g in groups}
            try:
                self.cas(lambda info: drop_incomplete_segments(info, ours))
            except TieredError as e:
                log.warning("%s: could not take back segment assignment(s) %s: %s", self.name, sorted(ours), e)
        try:
            now = self.clock_ms()
            self.record([g.record(self.name, reason, now, next_attempt_ms) for g in groups])
        except TieredError as e:
            log.warning("%s: could not record %s for deletion: %s", self.name,
                        ", ".join(f"{g.type} {g.uuid}" for g in groups), e)


def stale_segments(info: ManagedLedgerInfo, driver: dict[str, Any]) -> list[ObjectGroup]:
    """The record's incomplete segments (crashed or in-flight attempts; under the topic's lease, crashed
    ones), one group per uuid on the first ledger naming it, in the store its entry records (else
    ``driver``: attempts of one topic go to its namespace's store)."""
    out: dict[str, ObjectGroup] = {}
    for li in info.ledgerInfo:
        drivers = segment_drivers(li)
        for u in incomplete_segment_uuids(li):
            if u not in out:
                out[u] = ObjectGroup(li.ledgerId, TYPE_SEGMENT, u, driver_dict(drivers[u]) if u in drivers else driver)
    return list(out.values())


def drop_incomplete_segments(info: ManagedLedgerInfo, uuids: set[str]) -> bool:
    """Remove the incomplete ``offloadSegment`` entries naming ``uuids`` from every ledger (a mutation)."""
    changed = False
    for li in info.ledgerInfo:
        segs = li.offloadContext.offloadSegment
        keep = [s for s in segs if s.complete or uuid_from_halves(s.uidMsb, s.uidLsb) not in uuids]
        if len(keep) != len(segs):
            del segs[:]
            segs.extend(keep)
            changed = True
    return changed


def delete_pair(store: BlobStore, data_key: str, index_key: str) -> None:
    """Delete a data/index object pair, with the rest of its group (a ledger pair's entry-offsets
    sidecar), and abort unfinished uploads of its data object. Idempotent. The sidecar and the index go
    first, so the pair stops being readable before its data disappears (a transformed pair's manifests
    before their chunks), and a crash in between never leaves a sidecar without its pair."""
    for up in store.list_multipart_uploads(data_key):
        if up.key == data_key:
            store.abort_multipart(data_key, up.upload_id)
    keys = group_keys(data_key, index_key)
    data = with_manifests([data_key])
    store.delete([k for k in keys if k not in data])
    store.delete(data)
