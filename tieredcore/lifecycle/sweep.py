"""Offload sweeps and deletion-lag cleanup: planning (driver side) and per-topic execution (executor
side). Everything runs on the run's logical clock `as_of_ms`, never the wall clock, so a retry or a
backfill of the same logical date plans the same work and an older date never does more.

Deletion-lag cleanup is phase 1 of two-phase deletion (spec/05): after proving the offloaded copy
reads back correctly it appends a ``ledger`` record (reason ``deletion-lag``) to the deletion log, then
sets ``bookkeeperDeleted`` with a CAS (outcome ``marked``). The hot copy is deleted by the drain
(:func:`tieredcore.lifecycle.drain.drain`); until then readers already read the offloaded copy.

The proof is a checksum, not a count: the whole offloaded copy is read back (ranged GETs, bounded
memory) and every frame compared with the CRC32C the hot tier recorded for that entry
(:func:`tieredcore.offload.verify.verify_offloaded`). A copy that fails keeps its hot copy (outcome
``verify-failed``) and is replaced by a verified re-offload under a new uuid; the damaged attempt goes to
the deletion log.

Runners hold a per-topic lease (a second runner skips the topic: outcome ``busy``), and a run stops
trying after ``store_failure_limit`` consecutive object-store failures (the rest: ``aborted``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from tieredcore.config import Config
from tieredcore.errors import (
    BlobStoreError,
    FormatError,
    HotLedgerNotFoundError,
    LeaseHeldError,
    NotFoundError,
    TieredError,
    ValidationError,
)
from tieredcore.lifecycle.planner import (
    deletion_lag_due,
    ledgers_as_of,
    select_by_threshold,
    select_keep_bytes,
    select_prefix,
)
from tieredcore.lifecycle.policies import OffloadPolicy, PolicyStore
from tieredcore.model import Position
from tieredcore.names import NamespaceName, TopicName
from tieredcore.offload.context import context_uuid
from tieredcore.offload.managed import (
    OUTCOME_ABORTED,
    OUTCOME_BUSY,
    OUTCOME_FAILED,
    OUTCOME_REPLACED,
    LedgerOffloadResult,
)
from tieredcore.offload.reader import ExpectedLedger
from tieredcore.offload.verify import verify_offloaded
from tieredcore.stores.deletion_log import TYPE_LEDGER, DeletionRecord
from tieredcore.stores.failures import StoreFailureBudget
from tieredcore.stores.managed_ledgers import find_ledger
from tieredcore.workspace import Workspace

log = logging.getLogger(__name__)

KIND_OFFLOAD = "offload"
KIND_LAG_CLEANUP = "lag-cleanup"
KIND_RETENTION = "retention"  # tieredcore.lifecycle.retention
KIND_SCRUB = "scrub"  # tieredcore.lifecycle.scrub

REASON_DELETION_LAG = "deletion-lag"
REASON_VERIFY_FAILED = "verify-failed"  # a damaged offloaded copy, replaced by a verified one
OUTCOME_MARKED = "marked"  # lag cleanup: bookkeeperDeleted set, the hot copy's deletion pending in the log
OUTCOME_VERIFY_FAILED = "verify-failed"  # the offloaded copy does not read back as the hot copy: hot kept
# outcomes that fail a run (a busy topic is not a failure: its lease holder is doing the work)
FAILED_OUTCOMES = frozenset({"failed", "unknown", OUTCOME_VERIFY_FAILED, OUTCOME_ABORTED,
                             "damaged", "unrecoverable"})
# outcomes whose bytes a run report counts (offloaded; hot copies handed to the drain; bytes a scrub read)
BYTES_OUTCOMES = ("offloaded", OUTCOME_MARKED, "ok", "damaged", "repaired", "unrecoverable")


@dataclass
class TopicWork:
    """One unit of distributed work: the ledgers of one topic, processed in order by one task."""

    topic: str  # persistent://tenant/ns/topic
    kind: str
    ledgers: list[int]
    as_of_ms: int
    dry_run: bool = False
    options: dict[str, Any] = field(default_factory=dict)  # per-kind switches (scrub: deep, repair)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class LedgerResult:
    """One row of a run report (also the Parquet detail schema)."""

    topic: str
    namespace: str
    ledger: int
    kind: str
    outcome: str
    bytes: int = 0
    blocks: int = 0
    entries: int = 0
    seconds: float = 0.0
    uuid: str = ""
    error: str = ""

    @property
    def failed(self) -> bool:
        return self.outcome in FAILED_OUTCOMES


# -- planning -----------------------------------------------------------------------------------


def policy_store(ws: Workspace) -> PolicyStore:
    # the workspace configuration is the cluster default under namespace and topic policies
    defaults = OffloadPolicy(max_block_size=ws.config.max_block_size, read_buffer_size=ws.config.read_buffer)
    return PolicyStore(ws.ml, defaults=defaults, default_store_is_s3=ws.config.store_url.startswith("s3://"))


def resolve_namespaces(ws: Workspace, namespaces: Iterable[str] | None, kind: str) -> list[str]:
    ps = policy_store(ws)
    if namespaces:
        return [NamespaceName.parse(n).name for n in namespaces]
    if kind == KIND_OFFLOAD:
        return ps.namespaces_with_offload()
    return sorted(set(ws.ml.list_namespaces()))


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
    ws: Workspace, topic: str, as_of_ms: int, up_to: Position | None = None, keep_bytes: int | None = None,
    dry_run: bool = False,
) -> list[TopicWork]:
    """`tiered_offload_topic`: a prefix up to a position, or keep at most N bytes hot."""
    if (up_to is None) == (keep_bytes is None):
        raise ValidationError("give exactly one of an up-to position or keep-bytes")
    t = TopicName.parse(topic)
    info, _ = ws.ml.get_topic(t)
    ledgers = ledgers_as_of(info.ledgerInfo, as_of_ms)
    ids = select_prefix(ledgers, up_to) if up_to is not None else select_keep_bytes(ledgers, keep_bytes or 0)
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


# -- execution (runs on executors) --------------------------------------------------------------


def run_work(config: Config, units: Iterable[dict]) -> Iterator[dict]:
    """Executes TopicWork dicts (a Spark partition); yields LedgerResult dicts. Never raises for a
    failing ledger or topic: failures are rows, so the other topics still run."""
    with Workspace(config) as ws:
        ps = policy_store(ws)
        budget = ws.failure_budget()  # per Spark task: a failing store stops this task's remaining work
        for u in units:
            w = TopicWork(**u)
            t = TopicName.parse(w.topic)
            try:
                pol = ps.for_topic(t)
                if w.kind == KIND_OFFLOAD:
                    rows = _offload_topic(ws, pol, t, w, budget)
                elif w.kind == KIND_RETENTION:
                    from tieredcore.lifecycle.retention import trim_work  # imports this module

                    rows = trim_work(ws, pol, t, w)
                elif w.kind == KIND_SCRUB:
                    from tieredcore.lifecycle.scrub import scrub_work  # imports this module

                    rows = scrub_work(ws, pol, t, w, budget)
                else:
                    rows = _lag_cleanup_topic(ws, pol, t, w, budget)
            except TieredError as e:  # the topic as a whole could not be processed
                rows = [LedgerResult(t.full, t.namespace_name, lid, w.kind, OUTCOME_FAILED,
                                     error=f"{type(e).__name__}: {e}") for lid in w.ledgers]
            for r in rows:
                yield asdict(r)


def _row(t: TopicName, kind: str, r: LedgerOffloadResult) -> LedgerResult:
    return LedgerResult(t.full, t.namespace_name, r.ledger_id, kind, r.outcome, r.bytes, r.blocks, r.entries,
                        r.seconds, r.uuid or "", r.error or "")


def _offload_topic(ws: Workspace, pol: OffloadPolicy, t: TopicName, w: TopicWork,
                   budget: StoreFailureBudget | None = None) -> list[LedgerResult]:
    if w.dry_run:
        return [LedgerResult(t.full, t.namespace_name, lid, w.kind, "planned") for lid in w.ledgers]
    tof = ws.topic_offloader(clock_ms=lambda: w.as_of_ms, offloader=ws.offloader_for_policy(pol))
    return [_row(t, w.kind, r) for r in tof.offload_ledgers(t, w.ledgers, budget)]


def held_topic_rows(
    ws: Workspace, t: TopicName, w: TopicWork, purpose: str, budget: StoreFailureBudget | None,
    one: Callable[[int, LedgerResult], str],
) -> list[LedgerResult]:
    """Run ``one(ledger id, row)`` for each of the unit's ledgers, oldest first, holding the topic's lease
    (not in a dry run, which changes nothing): a topic leased by another runner is skipped (``busy``), a
    spent failure budget marks the rest ``aborted``. ``one`` fills the row and returns the class name of
    the error behind a failure ('' when none), which the budget counts."""
    ids = sorted(w.ledgers)
    out: list[LedgerResult] = []

    def run_all(renew: Callable[[], None] | None) -> None:
        for lid in ids:
            started = time.monotonic()
            row = LedgerResult(t.full, t.namespace_name, lid, w.kind, OUTCOME_FAILED)
            if budget is not None and budget.exhausted:
                row.outcome, row.error = OUTCOME_ABORTED, budget.reason
                out.append(row)
                continue
            try:
                error_type = one(lid, row)
            except TieredError as e:
                row.outcome, row.error, error_type = OUTCOME_FAILED, f"{type(e).__name__}: {e}", type(e).__name__
            row.seconds = round(time.monotonic() - started, 6)
            out.append(row)
            if budget is not None:
                budget.record(error_type, row.error)
            if renew is not None and len(out) < len(ids):
                renew()

    if w.dry_run:
        run_all(None)
        return out
    try:
        with ws.leases.hold(t, purpose) as held:
            run_all(held.renew)
    except LeaseHeldError as e:
        out += [LedgerResult(t.full, t.namespace_name, lid, w.kind, OUTCOME_BUSY, error=str(e))
                for lid in ids[len(out):]]
    return out


def _lag_cleanup_topic(ws: Workspace, pol: OffloadPolicy, t: TopicName, w: TopicWork,
                       budget: StoreFailureBudget | None = None) -> list[LedgerResult]:
    return held_topic_rows(ws, t, w, "lag-cleanup", budget, lambda lid, row: _cleanup_one(ws, pol, t, lid, w, row))


def _cleanup_one(ws: Workspace, pol: OffloadPolicy, t: TopicName, lid: int, w: TopicWork, row: LedgerResult) -> str:
    info, _ = ws.ml.get_topic(t)
    li = find_ledger(info, lid)
    if li is None or not deletion_lag_due(li, pol.deletion_lag, w.as_of_ms):
        row.outcome = "skipped"  # trimmed, already done, or not due (re-checked on current metadata)
        return ""
    uuid = context_uuid(li)
    assert uuid is not None  # complete
    row.uuid, row.bytes, row.entries = uuid, li.size, li.entries
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
            h = off.read_offloaded(lid, uuid, ExpectedLedger.of(li, t.managed_ledger_name))
            try:
                verify_offloaded(h, hot.entry_crcs() if hot is not None else None)
            finally:
                h.close()
        except BlobStoreError as e:  # the store failed, the copy may be fine: try again next run
            row.outcome, row.error = OUTCOME_FAILED, f"reading the offloaded copy: {e}"
            return type(e).__name__
        except (FormatError, NotFoundError) as e:
            row.outcome = OUTCOME_VERIFY_FAILED
            row.error = f"offloaded copy {uuid} does not read back correctly ({type(e).__name__}: {e})"
            if hot is None:
                row.error += "; there is no hot copy either: data at risk (see `tiered scrub`)"
                return ""
            row.error += "; hot copy kept"
            if w.dry_run:
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
    # phase 1 of two-phase deletion (spec/05): the hot copy's deletion is durable in the log before
    # bookkeeperDeleted is set; the drain deletes it. A crash between the two leaves a record whose
    # ledger is still in use (the drain acknowledges it); a rerun appends a fresh one.
    ws.deletion_log.append([DeletionRecord(topic=t.managed_ledger_name, ledger_id=lid, type=TYPE_LEDGER,
                                           reason=REASON_DELETION_LAG, created_ms=w.as_of_ms)])

    def mark(info) -> bool:
        cur = find_ledger(info, lid)
        if cur is None or context_uuid(cur) != uuid or not cur.offloadContext.complete \
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


# -- reports ------------------------------------------------------------------------------------


@dataclass
class RunSummary:
    job: str
    run_id: str
    as_of_ms: int
    dry_run: bool
    topics: int = 0
    ledgers: int = 0
    bytes: int = 0
    failures: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    namespaces: dict[str, dict[str, int]] = field(default_factory=dict)
    seconds: float = 0.0
    drain: dict[str, Any] | None = None  # deletion_lag_cleanup --drain: the drain pass's counters
    # ledgers whose data no copy holds any more (scrub: damaged offloaded copy, no hot copy)
    data_loss: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, job: str, run_id: str, as_of_ms: int, dry_run: bool, rows: list[dict], seconds: float) -> RunSummary:
        s = cls(job, run_id, as_of_ms, dry_run, seconds=round(seconds, 3))
        s.topics = len({r["topic"] for r in rows})
        s.ledgers = len(rows)
        for r in rows:
            s.outcomes[r["outcome"]] = s.outcomes.get(r["outcome"], 0) + 1
            ns = s.namespaces.setdefault(r["namespace"], {"ledgers": 0, "bytes": 0, "failures": 0, "outcomes": {}})
            ns["ledgers"] += 1
            ns["outcomes"][r["outcome"]] = ns["outcomes"].get(r["outcome"], 0) + 1
            if r["outcome"] == "unrecoverable":
                s.data_loss.append(f"{r['topic']} ledger {r['ledger']}")
            failed = LedgerResult(**r).failed
            if r["outcome"] in BYTES_OUTCOMES:
                s.bytes += r["bytes"]
                ns["bytes"] += r["bytes"]
            s.failures += failed
            ns["failures"] += failed
        return s

    def as_dict(self) -> dict:
        return asdict(self)
