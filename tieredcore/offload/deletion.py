"""What goes, as topic-record transactions: phase 1 of two-phase deletion (PIP-186, docs/deletion.md) for a
retention trim, a topic deletion and a hot copy past its deletion lag. What is due is decided in
:mod:`tieredcore.lifecycle` (retention, sweep).

Trim and topic deletion follow the same order: durably append one pending-deletion record per storage object group of each
ledger that goes (a ``ledger`` record for a hot copy not yet deleted, an ``offloaded`` record for every
offload uuid ever recorded for it, complete or not, a ``segment`` record per segment), and only then
change the topic record with a compare-and-set (remove the ledgers / delete the record). Storage is
deleted later by the drain (phase 2). A crash between the two steps leaves records whose ledgers are
still listed: the drain sees them still in use and acknowledges them without deleting anything.

A ledger is only removed from the topic record if every object group the record names at CAS time is
covered by an appended record: an offload attempt that recorded a new uuid meanwhile makes the trim
append its record first (next round), so nothing recorded is ever forgotten.

A hot copy past its deletion lag (:func:`release_hot_copy`), once its offloaded copy is proven: its
``ledger`` record first, then ``bookkeeperDeleted`` set by a CAS, only if the copy proven is still the
ledger's complete copy. A crash between the two leaves a record whose ledger is still in use (the drain
acknowledges it); a rerun appends a fresh one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tieredcore.errors import TopicNotFoundError, VersionConflictError
from tieredcore.formats.mlinfo import LedgerInfo, ManagedLedgerInfo
from tieredcore.meta.deletion_log import TYPE_LEDGER, TYPE_OFFLOADED, TYPE_SEGMENT, DeletionRecord
from tieredcore.meta.managed_ledgers import find_ledger
from tieredcore.meta.reasons import Reason
from tieredcore.offload.compacted_state import compaction_state
from tieredcore.offload.context import (
    abandoned_uuids,
    context_uuid,
    driver_dict,
    is_offloaded,
    replacement_uuids,
    uuid_from_halves,
)
from tieredcore.offload.copies import copy_key
from tieredcore.offload.manifests import tombstone
from tieredcore.offload.transaction import MAX_ROUNDS, Applied, ObjectGroup, TopicTransaction, Uncovered

log = logging.getLogger(__name__)

__all__ = ["Deletion", "Trim", "delete_record", "object_groups", "release_hot_copy", "trim"]

# the driver metadata of the store a topic's policy offloads to, asked for only when a uuid was recorded
# without any (Pulsar always records it; a damaged or foreign record may not)
Fallback = Callable[[], dict]


def object_groups(li: LedgerInfo, fallback: Fallback | None = None) -> list[ObjectGroup]:
    """Every storage object group a LedgerInfo references, with the driver metadata each lives in: the
    hot copy unless bookkeeperDeleted, the current offload uuid (complete or not), abandoned attempts
    remembered in its properties, a replacement being written by a repair, and streaming segments
    (PIP-76). A uuid recorded without driver metadata gets ``fallback()``'s."""
    has_ctx = li.HasField("offloadContext")
    ctx = li.offloadContext
    ctx_driver = driver_dict(ctx.driverMetadata) if has_ctx and ctx.HasField("driverMetadata") else {}
    found: dict[tuple[str, str], dict] = {}
    if not (has_ctx and ctx.bookkeeperDeleted):
        found[(TYPE_LEDGER, "")] = {}
    cur = context_uuid(li)
    if cur is not None:
        found[(TYPE_OFFLOADED, cur)] = ctx_driver
    for u in abandoned_uuids(li) + replacement_uuids(li):
        # the attempt's own driver metadata is not recorded: the current one is the best knowledge
        # (attempts of one ledger go to the namespace's store)
        found.setdefault((TYPE_OFFLOADED, u), ctx_driver)
    if has_ctx:
        for seg in ctx.offloadSegment:
            if seg.HasField("uidMsb") or seg.HasField("uidLsb"):
                seg_driver = driver_dict(seg.driverMetadata) if seg.HasField("driverMetadata") else ctx_driver
                found.setdefault((TYPE_SEGMENT, uuid_from_halves(seg.uidMsb, seg.uidLsb)), seg_driver)
    out = []
    for (typ, u), driver in found.items():
        if typ != TYPE_LEDGER and not driver.get("name") and fallback is not None:
            driver = fallback()
        out.append(ObjectGroup(li.ledgerId, typ, u, driver))
    return out


def _uncovered(txn: TopicTransaction, lis: Sequence[LedgerInfo], reason: Reason, as_of_ms: int,
               fallback: Fallback | None) -> list[DeletionRecord]:
    """Records for what ``lis`` reference now and no record of this transaction covers yet."""
    return [g.record(txn.name, reason, as_of_ms) for li in lis for g in object_groups(li, fallback)
            if g.key not in txn.covered]


def _compacted_uncovered(txn: TopicTransaction, info: ManagedLedgerInfo, reason: Reason,
                         as_of_ms: int) -> list[DeletionRecord]:
    """The record for the topic's compacted ledger's objects (topic compaction), if it has one and no
    record of this transaction covers it yet: with the topic gone nothing names them."""
    state = compaction_state(info)
    if state is None or state.empty:
        return []
    g = ObjectGroup(state.ledger_id, TYPE_OFFLOADED, state.uuid, state.driver)
    return [] if g.key in txn.covered else [g.record(txn.name, reason, as_of_ms)]


@dataclass
class Trim:
    removed: list[LedgerInfo] = field(default_factory=list)  # detached copies, in topic order
    recorded: set[int] = field(default_factory=set)  # ledgers records were appended for (removed or not)
    topic_gone: bool = False  # deleted meanwhile (its deletion appended records of its own)


def trim(txn: TopicTransaction, select: Callable[[ManagedLedgerInfo], list[LedgerInfo]], reason: Reason,
         as_of_ms: int, fallback: Fallback | None = None) -> Trim:
    """Remove the ledgers ``select(info)`` picks (re-selected on every read) from the topic record, each
    once every object group it references is covered by an appended record. Raises what the deletion
    log or the metadata store raise (records already appended stay; the drain finds their ledgers still
    in use)."""
    out = Trim()

    def remove(info: ManagedLedgerInfo) -> bool:
        gone = select(info)
        missing = _uncovered(txn, gone, reason, as_of_ms, fallback)
        if missing:
            raise Uncovered(missing)
        ids = {li.ledgerId for li in gone}
        out.removed = [_detached(li) for li in info.ledgerInfo if li.ledgerId in ids]
        if not ids:
            return False
        keep = [li for li in info.ledgerInfo if li.ledgerId not in ids]
        del info.ledgerInfo[:]
        info.ledgerInfo.extend(keep)
        return True

    try:
        txn.cover_and_cas(remove, "retention")
    except TopicNotFoundError:
        out.removed, out.topic_gone = [], True
        log.info("retention %s: topic deleted during the trim", txn.topic.full)
    out.recorded = {lid for lid, _type, _uuid in txn.covered}
    return out


@dataclass
class Deletion:
    ledgers: int = 0  # in the record as last read
    records: list[DeletionRecord] = field(default_factory=list)  # appended (or, in a dry run, due)
    deleted: bool = False  # the topic record is gone (deleted here)


def delete_record(txn: TopicTransaction, reason: Reason, as_of_ms: int, fallback: Fallback | None = None,
                  dry_run: bool = False) -> Deletion:
    """Append records for every ledger of the topic in both tiers (the open one too), then delete the
    topic record with a CAS on the version the records were built from (a change meanwhile: records for
    whatever is new, then again). TopicNotFoundError if there is no such topic; gone later (someone
    else deleted it meanwhile) it returns with ``deleted`` False: our records are harmless duplicates."""
    out = Deletion()
    for round_ in range(MAX_ROUNDS):
        try:
            info, version = txn.ml.get_topic(txn.topic)
        except TopicNotFoundError:
            if round_ == 0:
                raise
            return out
        new = _uncovered(txn, info.ledgerInfo, reason, as_of_ms, fallback) + \
            _compacted_uncovered(txn, info, reason, as_of_ms)
        out.ledgers = len(info.ledgerInfo)
        out.records += new
        if dry_run:
            return out
        txn.record(new)
        try:
            txn.ml.delete_topic(txn.topic, version)
        except VersionConflictError:
            continue  # changed since read: cover what is new, then try again
        except TopicNotFoundError:
            return out
        out.deleted = True
        hook = txn.ml.after_offloaded_change
        if hook is not None:
            # a tombstone manifest, after the record is gone: recovery must not bring the topic back
            hook(txn.topic, tombstone(info), version + 1)
        return out
    raise VersionConflictError(f"delete {txn.topic.full}: the topic kept changing over {MAX_ROUNDS} rounds")


def _detached(li: LedgerInfo) -> LedgerInfo:
    """A copy of a LedgerInfo (the CAS loop's working message is reused across retries)."""
    c = LedgerInfo()
    c.CopyFrom(li)
    return c


def release_hot_copy(txn: TopicTransaction, ledger_id: int, proven: str | tuple[str, ...], as_of_ms: int) -> bool:
    """Hand the ledger's hot copy to the drain: its ``ledger`` record (reason ``deletion-lag``), then
    ``bookkeeperDeleted``, only if ``proven`` (:func:`~tieredcore.offload.copies.copy_key` of the copy
    whose every entry was checked) is still the ledger's complete offloaded copy. False when it changed
    meanwhile (trimmed, re-offloaded or marked by someone else): the record is left to the drain, which
    finds the hot copy still in use."""
    txn.record([ObjectGroup(ledger_id, TYPE_LEDGER).record(txn.name, Reason.DELETION_LAG, as_of_ms)])

    def mark(info: ManagedLedgerInfo) -> bool:
        cur = find_ledger(info, ledger_id)
        if cur is None or not is_offloaded(cur) or copy_key(cur) != proven or cur.offloadContext.bookkeeperDeleted:
            return False
        cur.offloadContext.bookkeeperDeleted = True
        return True

    step = txn.cas(mark)
    return isinstance(step, Applied) and step.changed
