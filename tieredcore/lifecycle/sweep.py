"""Offload sweeps and deletion-lag cleanup: planning (driver side) and per-topic execution (executor
side). Everything runs on the run's logical clock `as_of_ms`, never the wall clock, so a retry or a
backfill of the same logical date plans the same work and an older date never does more.

Deletion-lag cleanup is phase 1 of two-phase deletion (docs/deletion.md): after proving the offloaded copy
reads back correctly it appends a ``ledger`` record (reason ``deletion-lag``) to the deletion log, then
sets ``bookkeeperDeleted`` with a CAS (outcome ``marked``). The hot copy is deleted by the drain
(:func:`tieredcore.lifecycle.drain.drain`); until then readers already read the offloaded copy.

The proof is a checksum, not a count: the whole offloaded copy is read back (ranged GETs, bounded
memory) and every frame compared with the CRC32C the hot tier recorded for that entry
(:func:`tieredcore.offload.verify.verify_offloaded`). A copy that fails keeps its hot copy (outcome
``verify-failed``) and is replaced by a verified re-offload under a new uuid; the damaged attempt goes to
the deletion log.

A sealed ledger whose every entry lies in completed PIP-76 segments is due once the lag has passed since
the last of them completed; its proof reads the ledger back from its segments (its blocks in each, every
frame against the hot CRCs). A segment that fails keeps the hot copy (``verify-failed``); segments are
shared by several ledgers, so it is not re-offloaded here.

Runners hold a per-topic lease (a second runner skips the topic: outcome ``busy``), and a run stops
trying after ``store_failure_limit`` consecutive object-store failures (the rest: ``aborted``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from tieredcore.errors import (
    BlobStoreError,
    FormatError,
    HotLedgerNotFoundError,
    NotFoundError,
    TieredError,
)
from tieredcore.lifecycle.planner import (
    ManualOffload,
    deletion_lag_due,
    ledgers_as_of,
    select_by_threshold,
)
from tieredcore.lifecycle.policies import OffloadPolicy
from tieredcore.lifecycle.work import (
    KIND_LAG_CLEANUP,
    KIND_OFFLOAD,
    LedgerResult,
    TopicWork,
    held_topic_rows,
    policy_store,
    resolve_namespaces,
)
from tieredcore.names import TopicName
from tieredcore.offload.context import is_complete, is_offloaded
from tieredcore.offload.copies import copy_key, copy_uuids, open_offloaded
from tieredcore.offload.managed import OUTCOME_FAILED, OUTCOME_REPLACED, LedgerOffloadResult
from tieredcore.offload.verify import verify_offloaded
from tieredcore.stores.deletion_log import TYPE_LEDGER, DeletionRecord
from tieredcore.stores.failures import StoreFailureBudget
from tieredcore.stores.managed_ledgers import find_ledger
from tieredcore.workspace import Workspace

log = logging.getLogger(__name__)

REASON_DELETION_LAG = "deletion-lag"
REASON_VERIFY_FAILED = "verify-failed"  # a damaged offloaded copy, replaced by a verified one
OUTCOME_MARKED = "marked"  # lag cleanup: bookkeeperDeleted set, the hot copy's deletion pending in the log
OUTCOME_VERIFY_FAILED = "verify-failed"  # the offloaded copy does not read back as the hot copy: hot kept


def plan_offload(
    ws: Workspace, namespaces: Iterable[str] | None, as_of_ms: int, max_topics: int | None = None,
    dry_run: bool = False,
) -> list[TopicWork]:
    """Topics with ledgers due for offload under their effective policy at `as_of_ms`."""
    ps = policy_store(ws)
    out: list[TopicWork] = []
    for ns in resolve_namespaces(ws, namespaces, KIND_OFFLOAD):
        for t in ws.ml.list_topics(ns):
            pol = ps.for_topic(t)
            if not pol.offload_enabled:
                continue
            try:
                info, _ = ws.ml.get_topic(t)
            except NotFoundError:
                continue  # deleted since listing
            ids = select_by_threshold(
                ledgers_as_of(info.ledgerInfo, as_of_ms),
                pol.offload_threshold_bytes, pol.offload_threshold_seconds, as_of_ms,
            )
            if ids:
                out.append(TopicWork(t.full, KIND_OFFLOAD, ids, as_of_ms, dry_run))
            if max_topics is not None and len(out) >= max_topics:
                return out
    return out


def plan_manual_offload(
    ws: Workspace, topic: str, as_of_ms: int, manual: ManualOffload, dry_run: bool = False,
) -> list[TopicWork]:
    """`tiered_offload_topic`: a prefix up to a position, or keep at most N bytes hot."""
    t = TopicName.parse(topic)
    info, _ = ws.ml.get_topic(t)
    ids = manual.select(ledgers_as_of(info.ledgerInfo, as_of_ms))
    return [TopicWork(t.full, KIND_OFFLOAD, ids, as_of_ms, dry_run)] if ids else []


def plan_lag_cleanup(
    ws: Workspace, namespaces: Iterable[str] | None, as_of_ms: int, dry_run: bool = False
) -> list[TopicWork]:
    """Topics with hot copies whose offload completed more than the deletion lag before `as_of_ms`."""
    ps = policy_store(ws)
    out = []
    for ns in resolve_namespaces(ws, namespaces, KIND_LAG_CLEANUP):
        for t in ws.ml.list_topics(ns):
            lag = ps.for_topic(t).deletion_lag
            if lag is None:
                continue
            try:
                info, _ = ws.ml.get_topic(t)
            except NotFoundError:
                continue
            ids = [li.ledgerId for li in info.ledgerInfo if deletion_lag_due(li, lag, as_of_ms)]
            if ids:
                out.append(TopicWork(t.full, KIND_LAG_CLEANUP, ids, as_of_ms, dry_run))
    return out


def _row(t: TopicName, kind: str, r: LedgerOffloadResult) -> LedgerResult:
    return LedgerResult(t.full, t.namespace_name, r.ledger_id, kind, r.outcome, r.bytes, r.blocks, r.entries,
                        r.seconds, r.uuid or "", r.error or "")


def offload_topic(ws: Workspace, pol: OffloadPolicy, t: TopicName, w: TopicWork,
                   budget: StoreFailureBudget | None = None) -> list[LedgerResult]:
    if w.dry_run:
        return [LedgerResult(t.full, t.namespace_name, lid, w.kind, "planned") for lid in w.ledgers]
    tof = ws.topic_offloader(clock_ms=lambda: w.as_of_ms, offloader=ws.offloader_for_policy(pol))
    return [_row(t, w.kind, r) for r in tof.offload_ledgers(t, w.ledgers, budget)]


def lag_cleanup_topic(ws: Workspace, pol: OffloadPolicy, t: TopicName, w: TopicWork,
                       budget: StoreFailureBudget | None = None) -> list[LedgerResult]:
    return held_topic_rows(ws, t, w, "lag-cleanup", budget, lambda lid, row: _cleanup_one(ws, pol, t, lid, w, row))


def _cleanup_one(ws: Workspace, pol: OffloadPolicy, t: TopicName, lid: int, w: TopicWork, row: LedgerResult) -> str:
    info, _ = ws.ml.get_topic(t)
    li = find_ledger(info, lid)
    if li is None or not deletion_lag_due(li, pol.deletion_lag, w.as_of_ms):
        row.outcome = "skipped"  # trimmed, already done, or not due (re-checked on current metadata)
        return ""
    v1 = is_complete(li)  # else every entry lies in completed PIP-76 segments
    uuids = copy_uuids(li)
    copy = copy_key(li)
    assert uuids  # complete
    uuid = uuids[0]
    row.uuid, row.bytes, row.entries = ",".join(uuids), li.size, li.entries
    what = f"offloaded copy {uuid}" if v1 else f"segment copy ({', '.join(uuids)})"
    off = ws.offloader_for_driver(li.offloadContext.driverMetadata)
    try:
        hot = ws.hot.open_ledger(lid)
    except HotLedgerNotFoundError:
        hot = None  # already gone from the hot tier: the offloaded copy is still checked before marking
    except TieredError as e:
        row.outcome = OUTCOME_FAILED
        row.error = f"the hot copy cannot be read ({type(e).__name__}: {e}): both copies kept"
        return type(e).__name__
    # the proof: every frame of the offloaded copy hashes to the CRC32C the hot tier recorded for it
    try:
        try:
            h = open_offloaded(li, ws.offloader, t.managed_ledger_name, ws.offloader_for_driver)
            try:
                verify_offloaded(h, hot.entry_crcs() if hot is not None else None)
            finally:
                h.close()
        except BlobStoreError as e:  # the store failed, the copy may be fine: try again next run
            row.outcome, row.error = OUTCOME_FAILED, f"reading the offloaded copy: {e}"
            return type(e).__name__
        except (FormatError, NotFoundError) as e:
            row.outcome = OUTCOME_VERIFY_FAILED
            row.error = f"{what} does not read back correctly ({type(e).__name__}: {e})"
            if hot is None:
                row.error += "; there is no hot copy either: data at risk (see `tiered scrub`)"
                return ""
            row.error += "; hot copy kept"
            if w.dry_run:
                return ""
            if not v1:  # segments are shared by several ledgers: no re-offload here
                row.error += " (damaged segments are not repaired yet: see `tiered scrub`)"
                return ""
            hot.close()
            hot = None
            r = ws.topic_offloader(clock_ms=lambda: w.as_of_ms, offloader=off).replace_offload(
                t, lid, uuid, REASON_VERIFY_FAILED)
            row.error += (f"; re-offloaded and verified as {r.uuid}" if r.outcome == OUTCOME_REPLACED
                          else f"; re-offload {r.outcome}: {r.error}")
            return r.error_type
    finally:
        if hot is not None:
            hot.close()
    if w.dry_run:
        row.outcome = "planned"
        return ""
    # phase 1 of two-phase deletion (docs/deletion.md): the hot copy's deletion is durable in the log before
    # bookkeeperDeleted is set; the drain deletes it. A crash between the two leaves a record whose
    # ledger is still in use (the drain acknowledges it); a rerun appends a fresh one.
    ws.deletion_log.append([DeletionRecord(topic=t.managed_ledger_name, ledger_id=lid, type=TYPE_LEDGER,
                                           reason=REASON_DELETION_LAG, created_ms=w.as_of_ms)])

    def mark(info) -> bool:
        # only if the copy proven is still the ledger's complete copy (same uuid, or the same segments)
        cur = find_ledger(info, lid)
        if cur is None or not is_offloaded(cur) or is_complete(cur) != v1 or copy_key(cur) != copy \
                or cur.offloadContext.bookkeeperDeleted:
            return False
        cur.offloadContext.bookkeeperDeleted = True
        return True

    _, changed = _update(ws, t, mark)
    if changed:
        row.outcome = OUTCOME_MARKED
    else:  # trimmed, re-offloaded or marked by someone else meanwhile: the record is left to the drain
        row.outcome = "skipped"
        row.error = "changed during the cleanup (its record is left to the drain)"
    return ""


def _update(ws: Workspace, t: TopicName, mutate) -> tuple[object, bool]:
    """update_topic, and whether `mutate` changed the record on the attempt that landed."""
    seen: dict[str, bool] = {}

    def wrapped(info) -> bool:
        seen["changed"] = bool(mutate(info))
        return seen["changed"]

    info = ws.ml.update_topic(t, wrapped)
    return info, seen.get("changed", False)
