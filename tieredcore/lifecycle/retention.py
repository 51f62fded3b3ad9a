"""Retention trim and topic deletion: phase 1 of two-phase deletion (PIP-186, docs/deletion.md).

Both producers follow the same order: durably append one pending-deletion record per storage object
group of each ledger that goes (a ``ledger`` record for a hot copy not yet deleted, an ``offloaded``
record for every offload uuid ever recorded for it, complete or not), and only then change the topic
record with a compare-and-set (remove the ledgers / delete the record). Storage is deleted later by the
drain (phase 2). A crash between the two steps leaves records whose ledgers are still listed: the drain
sees them still in use and acknowledges them without deleting anything.

A ledger is only removed from the topic record if every object group the record names at CAS time is
covered by an appended record: an offload attempt that recorded a new uuid meanwhile makes the trim
append its record first (next round), so nothing recorded is ever forgotten.

Everything runs on the run's logical clock ``as_of_ms``, never the wall clock.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

from tieredcore.errors import TopicNotFoundError, VersionConflictError
from tieredcore.lifecycle.planner import ledgers_as_of, select_retention
from tieredcore.lifecycle.work import (
    KIND_RETENTION,
    LedgerResult,
    TopicWork,
    resolve_namespaces,
)
from tieredcore.meta.deletion_log import (
    TYPE_LEDGER,
    TYPE_OFFLOADED,
    TYPE_SEGMENT,
    DeletionLog,
    DeletionRecord,
)
from tieredcore.meta.reasons import Reason
from tieredcore.names import TopicName
from tieredcore.offload.context import (
    abandoned_uuids,
    context_uuid,
    driver_dict,
    replacement_uuids,
    uuid_from_halves,
)
from tieredcore.outcomes import Outcome
from tieredcore.policy import OffloadPolicy
from tieredcore.workspace import Workspace

log = logging.getLogger(__name__)



MAX_ROUNDS = 10  # append / CAS rounds before giving up on a topic that keeps changing

# an object group of a ledger: (type, uuid); the hot copy is (ledger, "")
Key = tuple[str, str]


# -- records --------------------------------------------------------------------------------------


def _policy_driver(ws: Workspace, policy: OffloadPolicy) -> dict:
    """Driver metadata of the store the topic's policy offloads to: the fallback for a uuid recorded
    without any (Pulsar always records it; a damaged or foreign record may not)."""
    return ws.offloader_for_policy(policy).location.driver_dict()


def object_groups(li) -> dict[Key, dict]:
    """Every storage object group a LedgerInfo references, with the driver metadata each lives in: the
    hot copy unless bookkeeperDeleted, the current offload uuid (complete or not), abandoned attempts
    remembered in its properties, a replacement being written by a repair, and streaming segments
    (PIP-76)."""
    has_ctx = li.HasField("offloadContext")
    ctx = li.offloadContext
    ctx_driver = driver_dict(ctx.driverMetadata) if has_ctx and ctx.HasField("driverMetadata") else {}
    out: dict[Key, dict] = {}
    if not (has_ctx and ctx.bookkeeperDeleted):
        out[(TYPE_LEDGER, "")] = {}
    cur = context_uuid(li)
    if cur is not None:
        out[(TYPE_OFFLOADED, cur)] = ctx_driver
    for u in abandoned_uuids(li) + replacement_uuids(li):
        # the attempt's own driver metadata is not recorded: the current one is the best knowledge
        # (attempts of one ledger go to the namespace's store)
        out.setdefault((TYPE_OFFLOADED, u), ctx_driver)
    if has_ctx:
        for seg in ctx.offloadSegment:
            if seg.HasField("uidMsb") or seg.HasField("uidLsb"):
                seg_driver = driver_dict(seg.driverMetadata) if seg.HasField("driverMetadata") else ctx_driver
                out.setdefault((TYPE_SEGMENT, uuid_from_halves(seg.uidMsb, seg.uidLsb)), seg_driver)
    return out


def _records(ws: Workspace, t: TopicName, li, keys: Iterable[Key], groups: dict[Key, dict], reason: str,
             as_of_ms: int, policy: OffloadPolicy) -> list[DeletionRecord]:
    out = []
    for typ, u in keys:
        driver = groups[(typ, u)]
        if typ != TYPE_LEDGER and not driver.get("name"):
            driver = _policy_driver(ws, policy)
        out.append(DeletionRecord(topic=t.managed_ledger_name, ledger_id=li.ledgerId, type=typ, reason=reason,
                                  created_ms=as_of_ms, uuid=u, driver=driver if typ != TYPE_LEDGER else {}))
    return out


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


def select_for_trim(ledgers: Sequence, policy: OffloadPolicy, as_of_ms: int) -> list[int]:
    """The ledgers retention removes from the topic as it stood at ``as_of_ms``."""
    rt, rs = retention_limits(policy)
    return select_retention(ledgers_as_of(ledgers, as_of_ms), rt, rs, as_of_ms)


def plan_retention(
    ws: Workspace, namespaces: Iterable[str] | None, as_of_ms: int, dry_run: bool = False
) -> list[TopicWork]:
    """Topics with ledgers past retention (time or size, both tiers) under their effective policy."""
    ps = ws.policies
    out: list[TopicWork] = []
    for ns in resolve_namespaces(ws, namespaces, KIND_RETENTION):
        for t in ws.ml.list_topics(ns):
            pol = ps.for_topic(t)
            if not retention_enabled(pol):
                continue
            try:
                info, _ = ws.ml.get_topic(t)
            except TopicNotFoundError:
                continue  # deleted since listing
            ids = select_for_trim(info.ledgerInfo, pol, as_of_ms)
            if ids:
                out.append(TopicWork(t.full, KIND_RETENTION, ids, as_of_ms, dry_run))
    return out


def trim_topic(
    ws: Workspace, topic: str | TopicName, as_of_ms: int, policy: OffloadPolicy | None = None,
    dry_run: bool = False, ledgers: Iterable[int] | None = None,
) -> list[LedgerResult]:
    """Phase 1 of retention for one topic: append the records of the ledgers past retention, then
    remove those ledgers from the topic record (CAS). Selection is re-done on current metadata at each
    step (as of ``as_of_ms``); ``ledgers`` (a plan's list) caps it. Never the newest ledger.

    One row per selected ledger: trimmed, planned (dry run) or skipped. Raises what the deletion log
    or the metadata store raise (records already appended stay; the drain finds their ledgers still
    in use)."""
    started = time.monotonic()
    t = TopicName.parse(topic)
    pol = policy if policy is not None else ws.policies.for_topic(t)
    cap = None if ledgers is None else set(ledgers)

    def select(info) -> list[int]:
        ids = select_for_trim(info.ledgerInfo, pol, as_of_ms)
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

    dlog = DeletionLog(ws.metadata)
    covered: dict[int, set[Key]] = {}
    results: dict[int, LedgerResult] = {}
    state: dict = {}

    def mutate(info) -> bool:
        # the CAS step: the oldest selected ledgers (re-selected on this read) whose every object group
        # is covered by an appended record; stop at the first one that recorded something new meanwhile
        state.clear()
        gone: set[int] = set()
        state["blocked"] = None
        for li in _ledgers(info, select(info)):
            if not set(object_groups(li)) <= covered.get(li.ledgerId, set()):
                state["blocked"] = li.ledgerId  # its record is appended in the next round
                break
            gone.add(li.ledgerId)
        state["removed"] = [_copy(li) for li in info.ledgerInfo if li.ledgerId in gone]
        if not gone:
            return False
        keep = [li for li in info.ledgerInfo if li.ledgerId not in gone]
        del info.ledgerInfo[:]
        info.ledgerInfo.extend(keep)
        return True

    for _round in range(MAX_ROUNDS):
        # 1. records for what the selected ledgers reference now and no appended record covers yet
        new: list[DeletionRecord] = []
        for li in _ledgers(info, select(info)):
            groups = object_groups(li)
            missing = [k for k in groups if k not in covered.get(li.ledgerId, set())]
            new.extend(_records(ws, t, li, missing, groups, Reason.RETENTION, as_of_ms, pol))
        dlog.append(new)  # durable before the metadata change, all or none
        for r in new:
            covered.setdefault(r.ledger_id, set()).add((r.type, r.uuid))

        # 2. remove the oldest selected ledgers whose every object group is covered
        try:
            info, _ = ws.ml.update_topic(t, mutate)
        except TopicNotFoundError:
            # deleted meanwhile: its deletion appended records of its own; ours are harmless duplicates
            log.info("retention %s: topic deleted during the trim", t.full)
            break
        for li in state["removed"]:
            results[li.ledgerId] = row(li, Outcome.TRIMMED)
        if state["blocked"] is None:
            break
    else:
        raise VersionConflictError(f"retention {t.full}: the topic kept changing over {MAX_ROUNDS} rounds")
    out = sorted(results.values(), key=lambda r: r.ledger)
    for lid in sorted(set(covered) - set(results)):
        out.append(LedgerResult(t.full, t.namespace_name, lid, KIND_RETENTION, Outcome.SKIPPED,
                                error="no longer selected on current metadata (records left for the drain)"))
    return _timed(out, started)


def _copy(li):
    """A detached copy of a LedgerInfo (the CAS loop's working message is reused across retries)."""
    c = type(li)()
    c.CopyFrom(li)
    return c


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
    res = TopicDeletion(t.full, dry_run=dry_run)
    dlog = DeletionLog(ws.metadata)
    covered: dict[int, set[Key]] = {}
    for _round in range(MAX_ROUNDS):
        try:
            info, version = ws.ml.get_topic(t)
        except TopicNotFoundError:
            if _round == 0:
                raise
            break  # someone else deleted it meanwhile: our records are harmless duplicates
        new: list[DeletionRecord] = []
        for li in info.ledgerInfo:
            groups = object_groups(li)
            missing = [k for k in groups if k not in covered.get(li.ledgerId, set())]
            new.extend(_records(ws, t, li, missing, groups, Reason.TOPIC_DELETION, as_of_ms, pol))
        res.ledgers = len(info.ledgerInfo)
        if dry_run:
            for k, v in _count(new).items():
                res.records[k] += v
            return res
        dlog.append(new)
        for k, v in _count(new).items():
            res.records[k] += v
        for r in new:
            covered.setdefault(r.ledger_id, set()).add((r.type, r.uuid))
        try:
            ws.ml.delete_topic(t, version)
        except VersionConflictError:
            continue  # changed since read: cover what is new, then try again
        except TopicNotFoundError:
            break
        res.deleted = True
        break
    else:
        raise VersionConflictError(f"delete {t.full}: the topic kept changing over {MAX_ROUNDS} rounds")
    res.policies_deleted = ws.ml.delete_topic_policies(t)
    return res

