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

When the hot copy is already gone there are no hot CRCs to compare with: a copy with chunk checksums is
proven by them, one without (Pulsar wrote it) by the CRC32C of every Pulsar message inside its entries
(tieredcore.offload.message_audit, checked in the same read): a damaged message fails the proof
(``verify-failed``, naming its position). With a hot copy its CRCs are the proof, byte for byte.

Runners hold a per-topic lease (a second runner skips the topic: outcome ``busy``), and a run stops
trying after ``store_failure_limit`` consecutive object-store failures (the rest: ``aborted``).

Streaming mode (PIP-76, a policy with ``offload_mode = "streaming"``): the sweep plans every topic with
entries not yet in the object store (the open ledger's up to its last confirmed entry included) and runs
:meth:`tieredcore.offload.streaming.StreamingOffloader.offload_topic` for it with the policy's segment
size, rollover and block size, on the run's clock: full segments are written, the last, smaller one only
once its rollover time has passed at ``as_of_ms`` (else it is reported ``held``, not a failure). One row
per segment (``unit = "segment"``). A backfill (``as_of_ms`` before the topic's newest ledger was
created) offloads nothing past the ledger that was open at that time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from tieredcore.cold.failures import StoreFailureBudget
from tieredcore.errors import (
    BlobStoreError,
    FormatError,
    HotLedgerNotFoundError,
    NotFoundError,
    TieredError,
    UnreadableRecordError,
)
from tieredcore.hot.tier import HotTier
from tieredcore.lifecycle.planner import (
    ManualOffload,
    deletion_lag_due,
    ledgers_as_of,
    select_by_threshold,
)
from tieredcore.lifecycle.shards import NamespaceDue
from tieredcore.lifecycle.work import (
    KIND_LAG_CLEANUP,
    KIND_MANUAL_OFFLOAD,
    KIND_OFFLOAD,
    UNIT_SEGMENT,
    LedgerResult,
    TopicWork,
    brokers_job,
    format_covers,
    held_topic_rows,
    resolve_namespaces,
    unreadable_unit,
)
from tieredcore.meta.managed_ledgers import ManagedLedgerStore, find_ledger
from tieredcore.meta.reasons import Reason
from tieredcore.model import INT64_MAX, Position
from tieredcore.names import TopicName
from tieredcore.offload.context import covered_through, is_complete, is_offloaded, is_sealed
from tieredcore.offload.copies import copy_key, copy_uuids, open_offloaded
from tieredcore.offload.deletion import release_hot_copy
from tieredcore.offload.managed import LedgerOffloadResult
from tieredcore.offload.streaming import SegmentOffloadResult
from tieredcore.offload.transaction import TopicTransaction
from tieredcore.offload.verify import hot_frame_ranges, verify_offloaded
from tieredcore.outcomes import Outcome
from tieredcore.policy import OffloadPolicy
from tieredcore.workspace import Workspace

log = logging.getLogger(__name__)

OPTION_STREAMING = "streaming"  # TopicWork.options: a PIP-76 streaming offload of the topic
OPTION_UPTO = "upto"  # TopicWork.options (streaming): [ledger, entry], offload nothing after it (backfills)
OPTION_FORCE_TAIL = "force_tail"  # TopicWork.options (streaming): close the tail whatever its age


def plan_offload(
    ws: Workspace, namespaces: Iterable[str] | None, as_of_ms: int, max_topics: int | None = None,
    dry_run: bool = False,
) -> list[TopicWork]:
    """Topics with ledgers due for offload under their effective policy at `as_of_ms` (at most
    ``max_topics`` per namespace: the rest next run)."""
    out: list[TopicWork] = []
    for ns in resolve_namespaces(ws.ml, ws.policies, namespaces, KIND_OFFLOAD):
        out += _plan_namespace(ws, ns, as_of_ms, max_topics, dry_run, _Scan())
    return out


def plan_offload_due(ws: Workspace, namespaces: Iterable[str] | None, as_of_ms: int,
                     max_topics: int | None = None) -> list[NamespaceDue]:
    """Per namespace (the named ones, else every one with offload enabled): the units :func:`plan_offload`
    would plan and their bytes, or why nothing is due (one line) — the plan tasks' input to
    :func:`tieredcore.lifecycle.shards.assign_shards`. One pass over the topic records, as the sweep's."""
    out: list[NamespaceDue] = []
    for ns in resolve_namespaces(ws.ml, ws.policies, namespaces, KIND_OFFLOAD):
        scan = _Scan()
        units = _plan_namespace(ws, ns, as_of_ms, max_topics, False, scan)
        out.append(NamespaceDue(ns, len(units), scan.due_bytes) if units else NamespaceDue.idle(ns, scan.reason()))
    return out


@dataclass
class _Scan:
    """What planning one namespace saw: enough to say why nothing is due, and the due units' bytes."""

    topics: int = 0
    enabled: int = 0
    due_bytes: int = 0
    waiting_bytes: int = 0  # sealed, not yet offloaded, not due (ledger mode)
    thresholds: set[str] = field(default_factory=set)

    def reason(self) -> str:
        if not self.topics:
            return "no topics"
        if not self.enabled:
            return f"offload is off in the policy of its {self.topics} topic(s)"
        rule = ", ".join(sorted(self.thresholds)) or "streaming: every entry already offloaded"
        return (f"no sealed ledger due by the policy in {self.enabled} topic(s) with offload on ({rule}; "
                f"{self.waiting_bytes} bytes of sealed ledgers hot, not yet offloaded)")


def _policy_rule(pol: OffloadPolicy) -> str:
    parts = []
    if pol.offload_threshold_bytes >= 0:
        parts.append(f"threshold {pol.offload_threshold_bytes} bytes hot")
    if pol.offload_threshold_seconds >= 0:
        parts.append(f"sealed {pol.offload_threshold_seconds} s ago")
    return " or ".join(parts)


def _plan_namespace(ws: Workspace, ns: str, as_of_ms: int, max_topics: int | None, dry_run: bool,
                    scan: _Scan) -> list[TopicWork]:
    ps = ws.policies
    out: list[TopicWork] = []
    for t in ws.ml.list_topics(ns):
        scan.topics += 1
        pol = ps.for_topic(t)
        if not pol.offload_enabled:
            continue
        scan.enabled += 1
        try:
            info, _ = ws.ml.get_topic(t)
        except NotFoundError:
            continue  # deleted since listing
        except UnreadableRecordError as e:  # fails this topic only (one failed row when run)
            out.append(unreadable_unit(e, KIND_OFFLOAD, as_of_ms, dry_run))
        else:
            if pol.streaming:
                w = plan_streaming(ws.hot, t, info, as_of_ms, dry_run)
                if w is not None:
                    sizes = {li.ledgerId: li.size for li in info.ledgerInfo}
                    scan.due_bytes += sum(sizes.get(i, 0) for i in w.ledgers)
                    out.append(w)
            else:
                view = ledgers_as_of(info.ledgerInfo, as_of_ms)
                ids = select_by_threshold(view, pol.offload_threshold_bytes, pol.offload_threshold_seconds, as_of_ms)
                # a ledger whose entries all lie in streaming segments already (the namespace was in
                # streaming mode) has its object-store copy
                done = {li.ledgerId for li in view if is_offloaded(li)}
                chosen = set(ids) - done
                if chosen:
                    scan.due_bytes += sum(li.size for li in view if li.ledgerId in chosen)
                    out.append(TopicWork(t.full, KIND_OFFLOAD, [i for i in ids if i in chosen], as_of_ms, dry_run))
                else:
                    scan.thresholds.add(_policy_rule(pol))
                    scan.waiting_bytes += sum(li.size for li in view[:-1] if li.timestamp > 0 and li.ledgerId not in done)
        if max_topics is not None and len(out) >= max_topics:
            return out
    return out


def plan_streaming(hot: HotTier, t: TopicName, info, as_of_ms: int, dry_run: bool = False,
                   force_tail: bool = False) -> TopicWork | None:
    """The streaming offload unit of a topic, or None when every entry it held at `as_of_ms` is in the
    object store. Its ledgers: those with entries not yet offloaded (the open ledger's last confirmed
    entry read from the hot tier). A backfill (a ledger was created after `as_of_ms`) is bounded to
    the ledgers of its time, as in ledger mode."""
    view = ledgers_as_of(info.ledgerInfo, as_of_ms)
    pending: list[int] = []
    for i, li in enumerate(view):
        if is_complete(li) or is_offloaded(li):
            continue
        open_ledger = i == len(info.ledgerInfo) - 1 and not is_sealed(li)
        if open_ledger or not li.HasField("entries"):
            try:
                h = hot.open_ledger(li.ledgerId)
            except HotLedgerNotFoundError:
                continue  # gone: the executor reports it if it still matters
            try:
                last = h.last_add_confirmed
            finally:
                h.close()
        else:
            last = li.entries - 1
        if last > covered_through(li):
            pending.append(li.ledgerId)
    if not pending:
        return None
    options: dict = {OPTION_STREAMING: True}
    if force_tail:
        options[OPTION_FORCE_TAIL] = True
    if len(view) < len(info.ledgerInfo):
        options[OPTION_UPTO] = [view[-1].ledgerId, INT64_MAX]
    return TopicWork(t.full, KIND_OFFLOAD, pending, as_of_ms, dry_run, options)


def plan_manual_offload(
    ml: ManagedLedgerStore, topic: str, as_of_ms: int, manual: ManualOffload, dry_run: bool = False,
) -> list[TopicWork]:
    """`tiered_offload_topic`: a prefix up to a position, or keep at most N bytes hot. Nothing (one line
    saying why) for a topic of an attached Pulsar cluster: its brokers offload."""
    t = TopicName.parse(topic)
    if ml.read_only:
        brokers_job("", KIND_MANUAL_OFFLOAD, [t.full])
        return []
    info, _ = ml.get_topic(t)
    ids = manual.select(ledgers_as_of(info.ledgerInfo, as_of_ms))
    return [TopicWork(t.full, KIND_OFFLOAD, ids, as_of_ms, dry_run)] if ids else []


def plan_lag_cleanup(
    ws: Workspace, namespaces: Iterable[str] | None, as_of_ms: int, dry_run: bool = False
) -> list[TopicWork]:
    """Topics with hot copies whose offload completed more than the deletion lag before `as_of_ms`."""
    ps = ws.policies
    out = []
    for ns in resolve_namespaces(ws.ml, ps, namespaces, KIND_LAG_CLEANUP):
        for t in ws.ml.list_topics(ns):
            lag = ps.for_topic(t).deletion_lag
            if lag is None:
                continue
            try:
                info, _ = ws.ml.get_topic(t)
            except NotFoundError:
                continue
            except UnreadableRecordError as e:
                out.append(unreadable_unit(e, KIND_LAG_CLEANUP, as_of_ms, dry_run))
                continue
            ids = [li.ledgerId for li in info.ledgerInfo if deletion_lag_due(li, lag, as_of_ms)]
            if ids:
                out.append(TopicWork(t.full, KIND_LAG_CLEANUP, ids, as_of_ms, dry_run))
    return out


def _row(t: TopicName, kind: str, r: LedgerOffloadResult) -> LedgerResult:
    return LedgerResult(t.full, t.namespace_name, r.ledger_id, kind, r.outcome, r.bytes, r.blocks, r.entries,
                        r.seconds, r.uuid or "", r.error or "")


def _segment_row(t: TopicName, kind: str, r: SegmentOffloadResult) -> LedgerResult:
    return LedgerResult(t.full, t.namespace_name, r.ledger_id, kind, r.outcome, r.bytes, r.blocks, r.entries,
                        r.seconds, r.uuid or "", r.error or "", UNIT_SEGMENT, format_covers(r.ledgers))


def stream_topic(ws: Workspace, pol: OffloadPolicy, t: TopicName, w: TopicWork,
                 budget: StoreFailureBudget | None = None,
                 progress: Callable[[str, int, int, int], None] | None = None) -> list[LedgerResult]:
    """A streaming offload unit: the topic's segments (PIP-76) under its lease, on the run's clock; one
    row per segment written (or not), the tail held for its rollover time included."""
    try:
        so = ws.streaming_offloader(pol, clock_ms=lambda: w.as_of_ms, progress=progress)
    except TieredError as e:  # the policy's store cannot be opened: one failed row for the topic
        row = LedgerResult(t.full, t.namespace_name, w.ledgers[0] if w.ledgers else -1, w.kind, Outcome.FAILED,
                           error=f"{type(e).__name__}: {e}", unit=UNIT_SEGMENT)
        if budget is not None:
            budget.record(type(e).__name__, row.error)
        return [row]
    upto = Position(*w.options[OPTION_UPTO]) if w.options.get(OPTION_UPTO) else None
    kw = {"max_segment_size": pol.max_segment_size, "rollover_ms": pol.max_segment_rollover_ms,
          "as_of_ms": w.as_of_ms, "force_tail": bool(w.options.get(OPTION_FORCE_TAIL)), "upto": upto}
    if w.dry_run:
        plan = so.plan(t, **kw)
        rows = [LedgerResult(t.full, t.namespace_name, seg.ranges[0][0], w.kind, "planned", seg.length,
                             unit=UNIT_SEGMENT, covers=format_covers(seg.ranges)) for seg in plan.segments]
        if plan.held is not None:
            rows.append(LedgerResult(t.full, t.namespace_name, plan.held.ranges[0][0], w.kind, Outcome.HELD,
                                     plan.held.length, unit=UNIT_SEGMENT, covers=format_covers(plan.held.ranges)))
        return rows
    return [_segment_row(t, w.kind, r) for r in so.offload_topic(t, budget=budget, **kw)]


def offload_topic(ws: Workspace, pol: OffloadPolicy, t: TopicName, w: TopicWork,
                   budget: StoreFailureBudget | None = None) -> list[LedgerResult]:
    if w.options.get(OPTION_STREAMING):
        return stream_topic(ws, pol, t, w, budget)
    if w.dry_run:
        return [LedgerResult(t.full, t.namespace_name, lid, w.kind, "planned") for lid in w.ledgers]
    tof = ws.topic_offloader(clock_ms=lambda: w.as_of_ms, offloader=ws.offloader_for_policy(pol))
    return [_row(t, w.kind, r) for r in tof.offload_ledgers(t, w.ledgers, budget)]


def lag_cleanup_topic(ws: Workspace, pol: OffloadPolicy, t: TopicName, w: TopicWork,
                       budget: StoreFailureBudget | None = None) -> list[LedgerResult]:
    return held_topic_rows(ws.leases, t, w, "lag-cleanup", budget, lambda lid, row: _cleanup_one(ws, pol, t, lid, w, row))


def _cleanup_one(ws: Workspace, pol: OffloadPolicy, t: TopicName, lid: int, w: TopicWork, row: LedgerResult) -> str:
    info, _ = ws.ml.get_topic(t)
    li = find_ledger(info, lid)
    if li is None or not deletion_lag_due(li, pol.deletion_lag, w.as_of_ms):
        row.outcome = Outcome.SKIPPED  # trimmed, already done, or not due (re-checked on current metadata)
        return ""
    uuids = copy_uuids(li)
    assert uuids  # complete
    row.uuid, row.bytes, row.entries = ",".join(uuids), li.size, li.entries
    proven = copy_key(li)
    failed = _prove(ws, t, li, w, row)
    if failed is not None:
        return failed
    if w.dry_run:
        row.outcome = Outcome.PLANNED
        return ""
    # phase 1 of two-phase deletion (docs/deletion.md): the hot copy's record, then bookkeeperDeleted
    txn = TopicTransaction(ws.ml, ws.deletion_log, t, clock_ms=lambda: w.as_of_ms)
    if release_hot_copy(txn, lid, proven, w.as_of_ms):
        row.outcome = Outcome.MARKED
    else:  # trimmed, re-offloaded or marked by someone else meanwhile: the record is left to the drain
        row.outcome = Outcome.SKIPPED
        row.error = "changed during the cleanup (its record is left to the drain)"
    return ""


def _prove(ws: Workspace, t: TopicName, li, w: TopicWork, row: LedgerResult) -> str | None:
    """The proof: every frame of the ledger's offloaded copy hashes to the CRC32C the hot tier recorded
    for it (without a hot copy: the chunk checksums, or the messages' CRCs). None when it holds; else the row says why and the error type (for the failure budget) is
    returned: the store failed (the copy may be fine: next run), or the copy is damaged (hot copy kept,
    a V1 copy replaced by a verified re-offload)."""
    lid = li.ledgerId
    v1 = is_complete(li)  # else every entry lies in completed PIP-76 segments
    uuid = copy_uuids(li)[0]
    what = f"offloaded copy {uuid}" if v1 else f"segment copy ({', '.join(copy_uuids(li))})"
    try:
        hot = ws.hot.open_ledger(lid)
    except HotLedgerNotFoundError:
        hot = None  # already gone from the hot tier: the offloaded copy is still checked before marking
    except TieredError as e:
        row.outcome = Outcome.FAILED
        row.error = f"the hot copy cannot be read ({type(e).__name__}: {e}): both copies kept"
        return type(e).__name__
    try:
        h = open_offloaded(li, ws.offloader, t.managed_ledger_name, ws.offloader_for_driver)
        try:
            # without a hot copy, an object without chunk checksums has only its messages' CRCs to prove it
            verify_offloaded(h, hot.entry_crcs() if hot is not None else None,
                             expected_sizes=hot.entry_sizes() if hot is not None else None,
                             messages=None if hot is None else False, expected_ranges=hot_frame_ranges(hot))
        finally:
            h.close()
    except BlobStoreError as e:  # the store failed, the copy may be fine: try again next run
        row.outcome, row.error = Outcome.FAILED, f"reading the offloaded copy: {e}"
        return type(e).__name__
    except (FormatError, NotFoundError) as e:
        row.outcome = Outcome.VERIFY_FAILED
        row.error = f"{what} does not read back correctly ({type(e).__name__}: {e})"
        if hot is None:
            row.error += "; there is no hot copy either: data at risk (see `tiered scrub`)"
            return ""
        row.error += "; hot copy kept"
        if w.dry_run:
            return ""
        if not v1:  # segments are shared by several ledgers: no re-offload here
            row.error += " (segments are shared: `tiered scrub --deep --repair` rewrites them from the hot copies)"
            return ""
        hot.close()
        hot = None
        off = ws.offloader_for_driver(li.offloadContext.driverMetadata)
        r = ws.topic_offloader(clock_ms=lambda: w.as_of_ms, offloader=off).replace_offload(
            t, lid, uuid, Reason.VERIFY_FAILED)
        row.error += (f"; re-offloaded and verified as {r.uuid}" if r.outcome == Outcome.REPLACED
                      else f"; re-offload {r.outcome}: {r.error}")
        return r.error_type
    finally:
        if hot is not None:
            hot.close()
    return None


