"""Retention (what is past it, on the run's logical clock ``as_of_ms``, never the wall clock) and topic
deletion: phase 1 of two-phase deletion (PIP-186, docs/deletion.md). The records-then-CAS steps
themselves are :mod:`tieredcore.offload.deletion`."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field

from tieredcore.errors import FormatError, TopicNotFoundError, UnreadableRecordError
from tieredcore.lifecycle.planner import ledgers_as_of, select_retention
from tieredcore.lifecycle.work import (
    KIND_RETENTION,
    LedgerResult,
    TopicWork,
    resolve_namespaces,
    unreadable_unit,
)
from tieredcore.meta.deletion_log import (
    TYPE_LEDGER,
    TYPE_OFFLOADED,
    TYPE_SEGMENT,
    DeletionRecord,
)
from tieredcore.meta.managed_ledgers import topic_path
from tieredcore.meta.reasons import Reason
from tieredcore.model import Position
from tieredcore.names import TopicName
from tieredcore.offload.compacted_state import compaction_state
from tieredcore.offload.context import (
    context_uuid,
)
from tieredcore.offload.deletion import delete_record, trim
from tieredcore.offload.offloader import LedgerOffloader
from tieredcore.offload.transaction import TopicTransaction
from tieredcore.outcomes import Outcome
from tieredcore.policy import OffloadPolicy
from tieredcore.workspace import Workspace

log = logging.getLogger(__name__)


# -- records --------------------------------------------------------------------------------------


def _fallback(offloader_for_policy: Callable[[OffloadPolicy], LedgerOffloader],
              policy: OffloadPolicy) -> Callable[[], dict]:
    """Driver metadata of the store the topic's policy offloads to: the fallback for a uuid recorded
    without any (Pulsar always records it; a damaged or foreign record may not). Opened only if asked."""
    cache: list[dict] = []

    def driver() -> dict:
        if not cache:
            cache.append(offloader_for_policy(policy).location.driver_dict())
        return cache[0]

    return driver


def _count(records: Sequence[DeletionRecord]) -> dict[str, int]:
    c = {TYPE_LEDGER: 0, TYPE_OFFLOADED: 0, TYPE_SEGMENT: 0}
    for r in records:
        c[r.type] += 1
    return c


# -- retention trim -------------------------------------------------------------------------------


def retention_limits(policy: OffloadPolicy) -> tuple[int, int]:
    """(time ms, size bytes) from a policy's minutes / MB; -1 = unlimited."""
    rt = policy.retention_time_minutes * 60_000 if policy.retention_time_minutes >= 0 else -1
    rs = policy.retention_size_mb * 1024 * 1024 if policy.retention_size_mb >= 0 else -1
    return rt, rs


def retention_enabled(policy: OffloadPolicy) -> bool:
    return policy.retention_time_minutes >= 0 or policy.retention_size_mb >= 0


def select_for_trim(ledgers: Sequence, policy: OffloadPolicy, as_of_ms: int,
                    held_at: Position | None = None) -> list[int]:
    """The ledgers retention removes from the topic as it stood at ``as_of_ms``; ``held_at``: the
    compaction horizon holding retention back (:func:`compaction_hold`)."""
    rt, rs = retention_limits(policy)
    return select_retention(ledgers_as_of(ledgers, as_of_ms), rt, rs, as_of_ms, held_at)


def compaction_hold(info, t: TopicName) -> Position | None:
    """Where the topic's ``__compaction`` subscription holds retention back: its mark-delete position, the
    compaction horizon (None: never compacted). Pulsar's compaction cursor is durable, so ledgers it has
    not consumed are never trimmed (docs/topic-compaction.md, "Retention"). A compaction state that does
    not parse makes the record unreadable for retention: what it holds back is unknown."""
    try:
        st = compaction_state(info)
    except FormatError as e:
        raise UnreadableRecordError(t.full, topic_path(t), str(e)) from None
    return None if st is None else st.horizon


def plan_retention(
    ws: Workspace, namespaces: Iterable[str] | None, as_of_ms: int, dry_run: bool = False
) -> list[TopicWork]:
    """Topics with ledgers past retention (time or size, both tiers) under their effective policy."""
    ps = ws.policies
    out: list[TopicWork] = []
    for ns in resolve_namespaces(ws.ml, ps, namespaces, KIND_RETENTION):
        for t in ws.ml.list_topics(ns):
            pol = ps.for_topic(t)
            if not retention_enabled(pol):
                continue
            try:
                info, _ = ws.ml.get_topic(t)
                held = compaction_hold(info, t)
            except TopicNotFoundError:
                continue  # deleted since listing
            except UnreadableRecordError as e:  # fails this topic only (one failed row when run)
                out.append(unreadable_unit(e, KIND_RETENTION, as_of_ms, dry_run))
                continue
            ids = select_for_trim(info.ledgerInfo, pol, as_of_ms, held)
            if ids:
                out.append(TopicWork(t.full, KIND_RETENTION, ids, as_of_ms, dry_run))
    return out


def trim_topic(
    ws: Workspace, topic: str | TopicName, as_of_ms: int, policy: OffloadPolicy | None = None,
    dry_run: bool = False, ledgers: Iterable[int] | None = None,
) -> list[LedgerResult]:
    """Phase 1 of retention for one topic: append the records of the ledgers past retention, then
    remove those ledgers from the topic record (CAS). Selection is re-done on current metadata at each
    step (as of ``as_of_ms``); ``ledgers`` (a plan's list) caps it. Never the newest ledger, nor, on a
    compacted topic, a ledger holding a position after the compaction horizon (the compacted ledger itself
    is listed nowhere in ``ledgerInfo``: retention never sees it).

    One row per selected ledger: trimmed, planned (dry run) or skipped. Raises what the deletion log
    or the metadata store raise (records already appended stay; the drain finds their ledgers still
    in use)."""
    started = time.monotonic()
    t = TopicName.parse(topic)
    pol = policy if policy is not None else ws.policies.for_topic(t)
    cap = None if ledgers is None else set(ledgers)

    def select(info) -> list[int]:
        ids = select_for_trim(info.ledgerInfo, pol, as_of_ms, compaction_hold(info, t))
        if cap is not None:  # a prefix of a prefix: stop at the first one the plan did not name
            kept = []
            for lid in ids:
                if lid not in cap:
                    break
                kept.append(lid)
            ids = kept
        return ids

    def row(li, outcome: str, error: str = "") -> LedgerResult:
        return LedgerResult(t.full, t.namespace_name, li.ledgerId, KIND_RETENTION, outcome, bytes=li.size,
                            entries=li.entries, uuid=context_uuid(li) or "", error=error)

    try:
        info, _ = ws.ml.get_topic(t)
    except TopicNotFoundError:
        return []
    if dry_run:
        return _timed([row(li, Outcome.PLANNED) for li in _ledgers(info, select(info))], started)

    txn = TopicTransaction(ws.ml, ws.deletion_log, t, clock_ms=lambda: as_of_ms)
    done = trim(txn, lambda info: _ledgers(info, select(info)), Reason.RETENTION, as_of_ms, _fallback(ws.offloader_for_policy, pol))
    out = [row(li, Outcome.TRIMMED) for li in done.removed]
    for lid in sorted(done.recorded - {li.ledgerId for li in done.removed}):
        out.append(LedgerResult(t.full, t.namespace_name, lid, KIND_RETENTION, Outcome.SKIPPED,
                                error="no longer selected on current metadata (records left for the drain)"))
    return _timed(out, started)


def _ledgers(info, ids: Sequence[int]) -> list:
    by_id = {li.ledgerId: li for li in info.ledgerInfo}
    newest = info.ledgerInfo[-1].ledgerId if info.ledgerInfo else None
    return [by_id[lid] for lid in ids if lid in by_id and lid != newest]


def _timed(rows: list[LedgerResult], started: float) -> list[LedgerResult]:
    if rows:
        each = round((time.monotonic() - started) / len(rows), 6)
        for r in rows:
            r.seconds = each
    return rows


def trim_work(ws: Workspace, policy: OffloadPolicy, t: TopicName, w: TopicWork) -> list[LedgerResult]:
    """run_work's branch for KIND_RETENTION units."""
    return trim_topic(ws, t, w.as_of_ms, policy=policy, dry_run=w.dry_run, ledgers=w.ledgers)


# -- topic deletion -------------------------------------------------------------------------------


@dataclass
class TopicDeletion:
    topic: str
    ledgers: int = 0
    records: dict[str, int] = field(default_factory=lambda: {TYPE_LEDGER: 0, TYPE_OFFLOADED: 0, TYPE_SEGMENT: 0})
    deleted: bool = False  # the topic record is gone
    policies_deleted: bool = False
    dry_run: bool = False

    def as_dict(self) -> dict:
        return asdict(self)


def delete_topic(ws: Workspace, topic: str | TopicName, as_of_ms: int, dry_run: bool = False) -> TopicDeletion:
    """Phase 1 of topic deletion: append records for every ledger of the topic in both tiers (the open
    one too), then delete the topic record with a CAS on the version the records were built from (a
    change meanwhile: records for whatever is new, then again), then its topic-level policies.
    TopicNotFoundError if there is no such topic."""
    t = TopicName.parse(topic)
    pol = ws.policies.for_topic(t)
    txn = TopicTransaction(ws.ml, ws.deletion_log, t, clock_ms=lambda: as_of_ms)
    done = delete_record(txn, Reason.TOPIC_DELETION, as_of_ms, _fallback(ws.offloader_for_policy, pol), dry_run=dry_run)
    res = TopicDeletion(t.full, ledgers=done.ledgers, records=_count(done.records), deleted=done.deleted,
                        dry_run=dry_run)
    if dry_run:
        return res
    res.policies_deleted = ws.ml.delete_topic_policies(t)
    return res

