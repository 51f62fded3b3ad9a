"""The Tiered storage view of a workspace attached to a Pulsar cluster (docs/pulsar.md, "The Tiered storage
view"): per namespace what Pulsar's brokers offloaded, what still sits in BookKeeper, the orphans of the
latest reconciliation, the damaged messages of the latest scrub, the monthly cost estimate and the offload
lag by Pulsar's own policies. Read-only: the topic records and policies in ZooKeeper, the run reports.

Columns come from Pulsar's records, never from a hot tier of the project's (an attached workspace has
none):

- BookKeeper ledgers / bytes: ledgers whose BookKeeper copy the brokers have not deleted
  (``offloadContext.bookkeeperDeleted`` unset), sizes from ``ManagedLedgerInfo``; the open ledger counts
  with size 0 (Pulsar records a ledger's size when it closes).
- offloaded ledgers / bytes: complete offloads (``offloadContext.complete``), their ledger sizes from
  ``ManagedLedgerInfo`` (not the objects' sizes); objects: a data and an index object per complete offload
  (BlobStoreManagedLedgerOffloader); offloads in progress: a uuid recorded, not complete.
- offload lag: ManagedLedgerImpl.maybeOffload's rule over the namespace's thresholds as Pulsar resolves
  them (OffloadPoliciesImpl.oldPoliciesCompatible: ``offload_policies`` first, the older top-level fields
  otherwise): newest to oldest, the open ledger (timestamp 0) skipped, sizes summed over every visited
  ledger; a ledger without a complete offload is due when the sum exceeds the byte threshold or it closed
  at least the time threshold ago. The lag is the age of the oldest due ledger: brokers offload when a
  ledger rolls over, so one due and still not offloaded means the offloader is stuck or failing.
  Thresholds not set in ZooKeeper are broker.conf's, which ZooKeeper does not hold: no lag is computed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from tieredcore.errors import FormatError, NotFoundError, UnreadableRecordError
from tieredcore.lifecycle.export import export_overview
from tieredcore.lifecycle.overview import (
    RECONCILE_JOB,
    SCRUB_JOB,
    Overview,
    Prices,
    RunInfo,
    build_overview,
    deletion_records,
    namespace_requests,
    run_infos,
    scrub_messages,
    store_requests,
    tier_history,
)
from tieredcore.lifecycle.replica import lag
from tieredcore.offload.context import context_uuid
from tieredcore.workspace import Workspace

HOT_TIER = "BookKeeper"
REPAIR_IMPOSSIBLE = "repair impossible without BookKeeper"
NOT_RECONCILED = "not reconciled yet"
NOT_SCRUBBED = "no scrub checked its messages yet"
# the plot's series of an attached cluster (the run reports' tier snapshots: hot / both / cold)
TIER_LABELS = {"hot": "BookKeeper only", "both": "BookKeeper + bucket", "cold": "bucket only"}


def pulsar_offload_due(ledgers: list, threshold_bytes: int | None, threshold_seconds: int | None,
                       now_ms: int) -> list[int]:
    """The ledgers Pulsar's automatic offload picks at ``now_ms``, oldest first (ManagedLedgerImpl.maybeOffload;
    None or a negative threshold: not set). Ledgers closed after ``now_ms`` did not exist yet then."""
    tb = -1 if threshold_bytes is None else threshold_bytes
    ts = -1 if threshold_seconds is None else threshold_seconds
    if tb < 0 and ts < 0:
        return []
    due: list[int] = []
    summed = 0
    for li in reversed(ledgers):
        if li.timestamp == 0 or li.timestamp > now_ms:  # the open ledger (or one not closed yet then)
            continue
        summed += li.size
        if li.HasField("offloadContext") and li.offloadContext.complete:
            continue
        if (tb >= 0 and summed > tb) or (ts >= 0 and now_ms - li.timestamp >= ts * 1000):
            due.append(li.ledgerId)
    due.reverse()
    return due


@dataclass
class AttachedNamespace:
    namespace: str
    bookkeeper: dict[str, int]  # {"ledgers", "bytes"}: ledgers whose BookKeeper copy is not deleted
    offloaded: dict[str, int]  # {"ledgers", "bytes", "objects"}: complete offloads
    offloads_in_progress: int
    # thresholds as Pulsar resolves them from ZooKeeper (None: not set there, broker.conf's apply)
    thresholds: dict[str, int | None]
    offload_lag_ms: int | None  # None: nothing due (or no threshold in ZooKeeper)
    offload_lag_ledger: str | None  # "topic ledger N": the oldest due ledger not offloaded
    # the latest reconciliation: {"objects", "bytes", "run_id", "as_of_ms"}; None: not reconciled yet
    orphans: dict[str, Any] | None
    # the latest scrub that checked the messages: {"count", "positions", "repair", "run_id", "as_of_ms"}
    damaged: dict[str, Any] | None
    deletion_in_flight: int  # the project's deletion log (reconciliation --apply's records), not Pulsar's
    deletion_dead_letter: int
    requests_per_month: float
    storage_cost_month: float
    request_cost_month: float
    unreadable_topics: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # e.g. policies that cannot be read

    @property
    def cost_month(self) -> float:
        return self.storage_cost_month + self.request_cost_month


@dataclass
class AttachedOverview:
    now_ms: int
    cluster: str
    namespaces: list[AttachedNamespace]
    totals: dict[str, Any]
    last_runs: list[RunInfo]
    history: list[dict[str, Any]]  # per run: BookKeeper only / BookKeeper + bucket / bucket only bytes
    prices: Prices
    hot_tier: str = HOT_TIER
    exports: list[Any] = field(default_factory=list)  # the Iceberg export's tables (lifecycle.export.ExportedTable)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["attached"] = {"cluster": self.cluster, "hot_tier": self.hot_tier}
        for n, ns in zip(d["namespaces"], self.namespaces, strict=True):
            n["cost_month"] = ns.cost_month
        d["history"] = [{**{k: h[k] for k in ("job", "run_id", "as_of_ms")},
                         **{TIER_LABELS[t]: h[t] for t in TIER_LABELS}} for h in self.history]
        return d


@dataclass
class _Acc:
    bk_ledgers: int = 0
    bk_bytes: int = 0
    off_ledgers: int = 0
    off_bytes: int = 0
    in_progress: int = 0
    lag_ms: int | None = None
    lag_ledger: str | None = None
    unreadable: list[str] = field(default_factory=list)


def _scan_topic(acc: _Acc, topic: str, ledgers: list, thresholds: dict[str, int | None], now_ms: int) -> None:
    for li in ledgers:
        if li.timestamp > now_ms:
            continue  # closed after the view's clock
        ctx = li.offloadContext if li.HasField("offloadContext") else None
        if ctx is not None and ctx.complete:
            acc.off_ledgers += 1
            acc.off_bytes += li.size
        elif context_uuid(li) is not None:  # recorded before the upload; complete once it is done
            acc.in_progress += 1
        if ctx is None or not ctx.bookkeeperDeleted:
            acc.bk_ledgers += 1
            acc.bk_bytes += li.size
    due = pulsar_offload_due(ledgers, thresholds["bytes"], thresholds["seconds"], now_ms)
    if due:
        oldest = next(li for li in ledgers if li.ledgerId == due[0])
        lag = now_ms - oldest.timestamp
        if acc.lag_ms is None or lag > acc.lag_ms:
            acc.lag_ms, acc.lag_ledger = lag, f"{topic} ledger {oldest.ledgerId}"


def _thresholds(ws: Workspace, ns: str, notes: list[str]) -> dict[str, int | None]:
    try:
        p = ws.policies.pulsar(ns)
    except FormatError as e:
        notes.append(f"its policies cannot be read ({e}): no offload lag")
        return {"bytes": None, "seconds": None}
    return {"bytes": p.threshold_bytes, "seconds": p.threshold_seconds}


def _latest(runs: list[RunInfo], job: str) -> RunInfo | None:
    return next((r for r in reversed(runs) if r.job == job), None)


def _damaged(name: str, scrubs: list[RunInfo]) -> dict[str, Any] | None:
    m = scrub_messages(name, scrubs)
    if m is None:
        return None
    run = next(r for r in scrubs if r.run_id == m["run_id"] and r.as_of_ms == m["as_of_ms"])
    count = m["messages_damaged"]
    positions = run.damaged.get(name, [])  # also copies damaged in their structure, no message named
    return {"count": count, "positions": positions, "repair": REPAIR_IMPOSSIBLE if count or positions else None,
            "run_id": m["run_id"], "as_of_ms": m["as_of_ms"]}


def _orphans(name: str, last: RunInfo | None) -> dict[str, Any] | None:
    if last is None:
        return None
    return {"objects": last.orphan_objects.get(name, 0), "bytes": last.orphan_bytes.get(name, 0),
            "run_id": last.run_id, "as_of_ms": last.as_of_ms}


def _scan(ws: Workspace, now_ms: int) -> dict[str, tuple[_Acc, dict[str, int | None], list[str]]]:
    out = {}
    for ns in sorted(set(ws.ml.list_namespaces()) | set(ws.ml.list_policy_namespaces())):
        notes: list[str] = []
        thresholds = _thresholds(ws, ns, notes)
        if thresholds["bytes"] is None and thresholds["seconds"] is None and not notes:
            notes.append("no offload threshold in ZooKeeper (broker.conf's applies): no offload lag")
        acc = _Acc()
        for t in ws.ml.list_topics(ns):
            try:
                info, _ = ws.ml.get_topic(t)
            except NotFoundError:
                continue
            except UnreadableRecordError as e:
                acc.unreadable.append(f"{t.full}: {e.path}: {e.reason}")
                continue
            _scan_topic(acc, t.full, list(info.ledgerInfo), thresholds, now_ms)
        out[ns] = (acc, thresholds, notes)
    return out


def build_attached_overview(ws: Workspace, reports_dir: str, now_ms: int, prices: Prices) -> AttachedOverview:
    """The view of the attached cluster at ``now_ms`` (a clock given, so a page and a test agree)."""
    runs = run_infos(reports_dir)
    by_job: dict[str, list[RunInfo]] = {}
    for r in runs:
        by_job.setdefault(r.job, []).append(r)
    last_reconcile = _latest(runs, RECONCILE_JOB)
    in_flight, dead = deletion_records(ws)
    rows = []
    for ns, (acc, thresholds, notes) in _scan(ws, now_ms).items():
        _, per_month = namespace_requests(ns, by_job)
        orphans = _orphans(ns, last_reconcile)
        rows.append(AttachedNamespace(
            namespace=ns, bookkeeper={"ledgers": acc.bk_ledgers, "bytes": acc.bk_bytes},
            offloaded={"ledgers": acc.off_ledgers, "bytes": acc.off_bytes, "objects": 2 * acc.off_ledgers},
            offloads_in_progress=acc.in_progress, thresholds=thresholds, offload_lag_ms=acc.lag_ms,
            offload_lag_ledger=acc.lag_ledger, orphans=orphans, damaged=_damaged(ns, by_job.get(SCRUB_JOB, [])),
            deletion_in_flight=in_flight.get(ns, 0), deletion_dead_letter=dead.get(ns, 0),
            requests_per_month=round(sum(per_month.values()), 1),
            storage_cost_month=prices.storage_cost(acc.off_bytes + (orphans["bytes"] if orphans else 0)),
            request_cost_month=prices.requests_cost(per_month), unreadable_topics=acc.unreadable, notes=notes))
    return AttachedOverview(now_ms, ws.config.cluster, rows, _totals(rows, by_job, last_reconcile, prices),
                            [job_runs[-1] for _, job_runs in sorted(by_job.items())], tier_history(runs, 20), prices)


def _totals(rows: list[AttachedNamespace], by_job: dict[str, list[RunInfo]], last_reconcile: RunInfo | None,
            prices: Prices) -> dict[str, Any]:
    _, month_all = store_requests(by_job)
    orphans = None if last_reconcile is None else {"objects": last_reconcile.orphan_objects.get("", 0),
                                                   "bytes": last_reconcile.orphan_bytes.get("", 0)}
    offloaded = {k: sum(n.offloaded[k] for n in rows) for k in ("ledgers", "bytes", "objects")}
    scrubbed = [n.damaged for n in rows if n.damaged is not None]
    t: dict[str, Any] = {
        "bookkeeper": {k: sum(n.bookkeeper[k] for n in rows) for k in ("ledgers", "bytes")},
        "offloaded": offloaded, "offloads_in_progress": sum(n.offloads_in_progress for n in rows),
        "orphans": orphans, "damaged": sum(d["count"] for d in scrubbed) if scrubbed else None,
        "offload_lag_ms": max((n.offload_lag_ms for n in rows if n.offload_lag_ms is not None), default=None),
        "deletion_in_flight": sum(n.deletion_in_flight for n in rows),
        "deletion_dead_letter": sum(n.deletion_dead_letter for n in rows),
        "requests_per_month": round(sum(month_all.values()), 1),
        "storage_cost_month": prices.storage_cost(offloaded["bytes"] + (orphans["bytes"] if orphans else 0)),
        "request_cost_month": prices.requests_cost(month_all),
        "unreadable_topics": sum(len(n.unreadable_topics) for n in rows),
    }
    t["cost_month"] = t["storage_cost_month"] + t["request_cost_month"]
    return t


def overview_of(ws: Workspace, reports_dir: str, now_ms: int, prices: Prices) -> Overview | AttachedOverview:
    """The view a workspace gets: the attached cluster's, or the project's own tiers; with the tables the
    Iceberg export wrote, when it ever ran."""
    ov = (build_attached_overview if ws.attached else build_overview)(ws, reports_dir, now_ms, prices)
    ov.exports = export_overview(ws, now_ms)
    if ws.replica and isinstance(ov, Overview):  # how far behind the source's manifests its records are
        rl = lag(ws, clock_ms=lambda: now_ms)
        ov.replica = {**rl.as_dict(), "line": rl.line()}
    return ov
