"""What an operator's overview of tiered storage shows (the Airflow plugin's "Tiered storage" page, run
reports' ``tiers``), computed from the metadata store and the run reports only — never from Airflow.

Per namespace: ledgers and bytes hot / both / cold, object-store objects, offload lag (age of the oldest
ledger due for offload but not offloaded), deletion lag (how long the oldest hot copy has been past its
deletion lag), orphan bytes of the last reconciliation, the deletion log's in-flight and dead-letter
records, object-store requests per run and an estimated monthly cost (storage + requests, at the
configured prices), and the Pulsar messages the latest scrub that checked the namespace's messages
found (entries checked, damaged, not messages). Besides: the last run of each job and bytes per tier over
recent runs.

Pure given a workspace, the reports directory and a clock (``now_ms``): the page and the tests compute
the same numbers.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from tieredcore.cold.requests import REQUEST_KINDS, sum_kinds
from tieredcore.errors import FormatError, NotFoundError, UnreadableRecordError
from tieredcore.lifecycle.planner import deletion_lag_due, ledgers_as_of, select_by_threshold
from tieredcore.lifecycle.work import MESSAGE_COUNTERS
from tieredcore.names import namespace_of
from tieredcore.offload.context import covering_offloaded_ms, is_offloaded
from tieredcore.offload.copies import copy_uuids
from tieredcore.policy import OffloadPolicy
from tieredcore.reports import RunReports
from tieredcore.workspace import Workspace

TIERS = ("hot", "both", "cold")  # hot only / hot + object store / object store only
GIB = 1024**3
MONTH_MS = 30 * 24 * 3600 * 1000
RECONCILE_JOB = "reconcile_orphans"
SCRUB_JOB = "scrub"  # spark_jobs/scrub.py's reports
HOT_ORPHAN_KIND = "ledger"  # tieredcore.lifecycle.reconcile.report.KIND_LEDGER


def tier_of(li) -> str:
    if is_offloaded(li):
        return "cold" if li.offloadContext.bookkeeperDeleted else "both"
    return "hot"


def _empty_tiers() -> dict[str, dict[str, int]]:
    return {t: {"ledgers": 0, "bytes": 0} for t in TIERS}


def tier_snapshot(ws: Workspace) -> dict[str, dict[str, Any]]:
    """Per namespace: ledgers and bytes per tier and object-store objects (data + index per offloaded copy
    or segment), from the topic records alone (what a run report records under ``tiers``); topics whose
    record cannot be read are counted under ``unreadable`` (only when there are some)."""
    out: dict[str, dict[str, Any]] = {}
    for name in ws.ml.list_namespaces():
        acc = out.setdefault(name, {**_empty_tiers(), "objects": 0})
        for t in ws.ml.list_topics(name):
            try:
                info, _ = ws.ml.get_topic(t)
            except NotFoundError:
                continue  # deleted since listing
            except UnreadableRecordError:
                acc["unreadable"] = acc.get("unreadable", 0) + 1
                continue
            for li in info.ledgerInfo:
                tier = acc[tier_of(li)]
                tier["ledgers"] += 1
                tier["bytes"] += li.size
            acc["objects"] += 2 * len({u for li in info.ledgerInfo for u in copy_uuids(li)})
    return out


# -- prices ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Prices:
    """USD: storage per GiB-month, requests per 1,000 by kind (S3 Standard's list prices by default)."""

    storage_gb_month: float
    per_1000: dict[str, float]

    @classmethod
    def of(cls, config) -> Prices:
        return cls(config.price_storage_gb_month,
                   {"GET": config.price_get_per_1000, "PUT": config.price_put_per_1000,
                    "LIST": config.price_list_per_1000, "DELETE": config.price_delete_per_1000})

    def requests_cost(self, requests: dict[str, float]) -> float:
        return sum(requests.get(k, 0) * self.per_1000.get(k, 0.0) / 1000 for k in REQUEST_KINDS)

    def storage_cost(self, nbytes: int) -> float:
        return nbytes / GIB * self.storage_gb_month


# -- reports ---------------------------------------------------------------------------------------


@dataclass
class RunInfo:
    """One run report (its run-level summary: the latest attempt)."""

    job: str
    run_id: str
    attempt: int
    as_of_ms: int
    written_ms: int
    failures: int
    namespaces: list[str]
    requests: dict[str, Any]
    tiers: dict[str, Any]
    orphan_bytes: dict[str, int] = field(default_factory=dict)  # reconciliation: per namespace, "" = total
    counters: dict[str, dict[str, int]] = field(default_factory=dict)  # per namespace: its totals' counters
    orphan_objects: dict[str, int] = field(default_factory=dict)  # reconciliation: per namespace, "" = total
    # scrub: per namespace, the damaged messages the report names ("topic ledger:entry")
    damaged: dict[str, list[str]] = field(default_factory=dict)
    # where the report is (RunReports' names): its group, run key and part; "" when not from a listing
    group: str = ""
    run_key: str = ""
    part: str = ""


def _orphans(doc: dict[str, Any]) -> tuple[dict[str, int], dict[str, int]]:
    """(bytes, objects) of object-store orphans (what costs, not hot-tier ones) per namespace of a
    reconciliation report, "" = the run's total: its ``orphans_by_namespace`` (namespace -> {objects,
    bytes}) when it has one, else ``by_namespace`` (namespace -> kind -> {count, objects, bytes}, the hot
    tier's kind left out). Entries of another shape are skipped, so fields added later do not break it."""
    nbytes: dict[str, int] = {}
    objects: dict[str, int] = {}
    flat = doc.get("orphans_by_namespace")
    if isinstance(flat, dict):
        groups_of = {n: [d] for n, d in flat.items() if isinstance(d, dict)}
    else:
        by_ns = doc.get("by_namespace") if isinstance(doc.get("by_namespace"), dict) else {}
        groups_of = {n: [d for k, d in kinds.items() if k != HOT_ORPHAN_KIND and isinstance(d, dict)]
                     for n, kinds in by_ns.items() if isinstance(kinds, dict)}
    for n, groups in groups_of.items():
        nbytes[n] = sum(int(d.get("bytes", 0) or 0) for d in groups)
        objects[n] = sum(int(d.get("objects", 0) or 0) for d in groups)
    nbytes[""] = int(doc.get("orphan_bytes", 0) or 0)
    objects[""] = int(doc.get("orphan_objects", 0) or 0)
    return nbytes, objects


def _damage_items(entries: list) -> list[str]:
    """A namespace's ``damage`` entries (damaged copies: topic, ledger, damaged_messages [{position,
    reason}], problem) as "topic ledger:entry" per damaged message, "topic ledger N: problem" for a copy
    damaged without a message named (its structure)."""
    out = []
    for d in entries:
        if not isinstance(d, dict):
            continue
        msgs = [m for m in d.get("damaged_messages") or () if isinstance(m, dict) and m.get("position")]
        out += [f"{d.get('topic', '?')} {m['position']}" for m in msgs] or [
            f"{d.get('topic', '?')} ledger {d.get('ledger', '?')}: {d.get('problem') or 'damaged'}"]
    return out


def _damaged(doc: dict[str, Any], namespaces: dict[str, Any]) -> dict[str, list[str]]:
    """What a scrub report names damaged, per namespace: its ``damage`` entries when the namespace's totals
    have them, else the run's ``damaged_messages`` ("topic ledger:entry", capped by the job) sorted by the
    topic's namespace."""
    own = {n: _damage_items(d["damage"]) for n, d in namespaces.items()
           if isinstance(d, dict) and isinstance(d.get("damage"), list)}
    listed: dict[str, list[str]] = {}
    for item in doc.get("damaged_messages") if isinstance(doc.get("damaged_messages"), list) else []:
        listed.setdefault(namespace_of(str(item).split(" ", 1)[0]), []).append(str(item))
    return {**listed, **own}


def run_info(job: str, run: str, doc: dict[str, Any]) -> RunInfo:
    """What the overview uses of a part's summary (``job``: the Spark job that wrote it; ``run``: its
    run key, the run id when the summary names none)."""
    totals = doc.get("totals") if isinstance(doc.get("totals"), dict) else {}
    orphans, orphan_objects = _orphans(doc) if job == RECONCILE_JOB else ({}, {})
    ns_totals = totals.get("namespaces") if isinstance(totals.get("namespaces"), dict) else {}
    counters = {n: {k: int(v) for k, v in d["counters"].items() if isinstance(v, int)}
                for n, d in ns_totals.items()
                if isinstance(d, dict) and isinstance(d.get("counters"), dict)}
    return RunInfo(
        job=job, run_id=str(doc.get("run_id", run)), attempt=int(doc.get("attempt", 1) or 1),
        as_of_ms=int(doc.get("as_of_ms", 0) or 0), written_ms=int(doc.get("written_ms", 0) or 0),
        failures=int(totals.get("failures", 0) or 0), namespaces=sorted(ns_totals.keys()),
        requests=doc.get("requests") if isinstance(doc.get("requests"), dict) else {},
        tiers=doc.get("tiers") if isinstance(doc.get("tiers"), dict) else {}, orphan_bytes=orphans,
        counters=counters, orphan_objects=orphan_objects,
        damaged=_damaged(doc, ns_totals) if job == SCRUB_JOB else {},
    )


def run_infos(reports_dir: str) -> list[RunInfo]:
    """Every run report under the reports directory (unreadable ones skipped), oldest first by logical
    time, then by when they were written."""
    reports = RunReports(reports_dir)
    out: list[RunInfo] = []
    for group in reports.groups():  # a DAG's runs and a job's runs outside Airflow alike
        # the run directories by name, not RunReports.runs (newest first: a stat of every part of every run,
        # most of the page's time with 2,000 reports); the list is sorted by logical time below
        group_dir = reports.group_dir(group)
        for run in sorted(d.name for d in group_dir.iterdir() if d.is_dir() and not d.name.startswith(".")):
            for part in reports.parts(group, run):
                try:
                    doc = reports.read_summary(group, run, part)
                except (NotFoundError, FormatError):
                    continue
                info = run_info(str(doc.get("job") or part), run, doc)
                info.group, info.run_key, info.part = group, run, part
                out.append(info)
    out.sort(key=lambda r: (r.as_of_ms, r.written_ms, r.job, r.run_id))
    return out


def runs_per_month(runs: list[RunInfo]) -> float:
    """How often a job runs, from the spacing of its runs' logical times (median gap); one run a month
    when there are fewer than two distinct times."""
    times = sorted({r.as_of_ms for r in runs if r.as_of_ms > 0})
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    if not gaps:
        return 1.0
    return MONTH_MS / statistics.median(gaps)


# -- the overview ----------------------------------------------------------------------------------


@dataclass
class NamespaceOverview:
    namespace: str
    tiers: dict[str, dict[str, int]]
    objects: int
    offload_lag_ms: int | None  # None: nothing due
    deletion_lag_ms: int | None  # None: no hot copy past its lag
    orphan_bytes: int | None  # None: no reconciliation report names it
    deletion_in_flight: int
    deletion_dead_letter: int
    requests_per_run: dict[str, float]  # mean over the runs that name the namespace, per job summed
    requests_per_month: float
    storage_cost_month: float
    request_cost_month: float
    # topics whose record cannot be read ("topic: path: reason"): in none of the numbers above
    unreadable_topics: list[str] = field(default_factory=list)
    # the latest scrub report that checked the namespace's Pulsar messages (None: none did):
    # MESSAGE_COUNTERS (entries) and that run's run_id and as_of_ms
    messages: dict[str, Any] | None = None

    @property
    def cost_month(self) -> float:
        return self.storage_cost_month + self.request_cost_month


@dataclass
class Overview:
    now_ms: int
    namespaces: list[NamespaceOverview]
    totals: dict[str, Any]
    last_runs: list[RunInfo]  # newest run of each job
    history: list[dict[str, Any]]  # recent runs with a tier snapshot: {job, run_id, as_of_ms, hot, both, cold}
    prices: Prices
    exports: list[Any] = field(default_factory=list)  # the Iceberg export's tables (lifecycle.export.ExportedTable)
    # a read replica's lag behind the bucket it follows (lifecycle.replica.ReplicaLag.as_dict() and its line)
    replica: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for n, ns in zip(d["namespaces"], self.namespaces, strict=True):
            n["cost_month"] = ns.cost_month
        return d


def _ns_of_topic(topic: str) -> str:
    parts = topic.split("/")
    return "/".join(parts[:2]) if len(parts) >= 2 else topic


@dataclass
class _Scanned:
    """A namespace as its topic records show it (the metadata part of its overview row)."""

    tiers: dict[str, dict[str, int]] = field(default_factory=_empty_tiers)
    objects: int = 0
    offload_lag_ms: int | None = None
    deletion_lag_ms: int | None = None
    unreadable: list[str] = field(default_factory=list)


def _scan_topic(acc: _Scanned, ledgers: list, pol: OffloadPolicy, now_ms: int) -> None:
    """One topic's ledgers into its namespace's row: tiers, objects, deletion and offload lag."""
    for li in ledgers:
        tier = acc.tiers[tier_of(li)]
        tier["ledgers"] += 1
        tier["bytes"] += li.size
        # deletion lag: how long past its lag the oldest hot copy is
        if deletion_lag_due(li, pol.deletion_lag, now_ms):
            ctx = li.offloadContext
            done = ctx.timestamp if ctx.complete else covering_offloaded_ms(li)
            acc.deletion_lag_ms = max(acc.deletion_lag_ms or 0, now_ms - done - pol.deletion_lag)
    acc.objects += 2 * len({u for li in ledgers for u in copy_uuids(li)})
    # offload lag: the oldest sealed ledger the policy makes due now, not offloaded yet
    if pol.offload_enabled and not pol.streaming:
        view = ledgers_as_of(ledgers, now_ms)
        due = set(select_by_threshold(view, pol.offload_threshold_bytes, pol.offload_threshold_seconds, now_ms))
        for li in view:
            if li.ledgerId in due and not is_offloaded(li):
                acc.offload_lag_ms = max(acc.offload_lag_ms or 0, now_ms - li.timestamp)
    elif pol.offload_enabled:  # streaming: sealed ledgers not wholly in segments
        for li in ledgers:
            if li.timestamp > 0 and not is_offloaded(li):
                acc.offload_lag_ms = max(acc.offload_lag_ms or 0, now_ms - li.timestamp)


def _scan_namespaces(ws: Workspace, now_ms: int) -> dict[str, _Scanned]:
    ps = ws.policies
    rows: dict[str, _Scanned] = {}
    for name in ws.ml.list_namespaces():
        acc = rows.setdefault(name, _Scanned())
        for t in ws.ml.list_topics(name):
            try:
                info, _ = ws.ml.get_topic(t)
            except NotFoundError:
                continue
            except UnreadableRecordError as e:  # this topic is reported; the namespace's others are counted
                acc.unreadable.append(f"{t.full}: {e.path}: {e.reason}")
                continue
            _scan_topic(acc, list(info.ledgerInfo), ps.for_topic(t), now_ms)
    return rows


def deletion_records(ws: Workspace) -> tuple[dict[str, int], dict[str, int]]:
    """(in flight, dead-lettered) deletion-log records per namespace ("" when a record names no topic)."""
    in_flight: dict[str, int] = {}
    dead: dict[str, int] = {}
    for entries, counts in ((ws.deletion_log.pending(), in_flight), (ws.deletion_log.dead_letters(), dead)):
        for e in entries:
            ns = _ns_of_topic(e.record.topic) if e.record is not None else ""
            counts[ns] = counts.get(ns, 0) + 1
    return in_flight, dead


def namespace_requests(name: str, by_job: dict[str, list[RunInfo]]) -> tuple[dict[str, float], dict[str, float]]:
    """(per run, per month) object-store requests of one namespace: each job's mean over the runs that
    name it, at the job's pace, summed over the jobs."""
    per_run: dict[str, float] = dict.fromkeys(REQUEST_KINDS, 0.0)
    per_month: dict[str, float] = dict.fromkeys(REQUEST_KINDS, 0.0)
    for job_runs in by_job.values():
        named = [r.requests.get("namespaces", {}).get(name) for r in job_runs]
        named = [n for n in named if isinstance(n, dict)]
        if not named:
            continue
        mean = {k: sum(int(n.get(k, 0)) for n in named) / len(named) for k in REQUEST_KINDS}
        rate = runs_per_month(job_runs)
        for k in REQUEST_KINDS:
            per_run[k] += mean[k]
            per_month[k] += mean[k] * rate
    return per_run, per_month


def store_requests(by_job: dict[str, list[RunInfo]]) -> tuple[dict[str, float], dict[str, float]]:
    """(per run, per month) requests of the whole store: every run's (attributed to a namespace or not)
    at each job's pace."""
    per_run_all: dict[str, float] = dict.fromkeys(REQUEST_KINDS, 0.0)
    month_all: dict[str, float] = dict.fromkeys(REQUEST_KINDS, 0.0)
    for job_runs in by_job.values():
        tot = [r.requests.get("total") for r in job_runs if isinstance(r.requests.get("total"), dict)]
        if not tot:
            continue
        summed = sum_kinds(tot)
        rate = runs_per_month(job_runs)
        for k in REQUEST_KINDS:
            per_run_all[k] += summed[k] / len(tot)
            month_all[k] += summed[k] / len(tot) * rate
    return per_run_all, month_all


def scrub_messages(name: str, scrubs: list[RunInfo]) -> dict[str, Any] | None:
    """What the latest scrub report that checked ``name``'s messages counted there (``scrubs``: the
    scrub job's runs, oldest first); None when no report did (shallow scrubs read no messages; deep ones
    check those of objects without chunk checksums unless run with ``messages`` = ``all``)."""
    for r in reversed(scrubs):
        c = r.counters.get(name)
        if c and any(k in c for k in MESSAGE_COUNTERS):
            return {**{k: int(c.get(k, 0)) for k in MESSAGE_COUNTERS}, "run_id": r.run_id, "as_of_ms": r.as_of_ms}
    return None


def _namespace_overview(name: str, acc: _Scanned, in_flight: dict[str, int], dead: dict[str, int],
                        by_job: dict[str, list[RunInfo]], last_reconcile: RunInfo | None,
                        prices: Prices) -> NamespaceOverview:
    per_run, per_month = namespace_requests(name, by_job)
    stored = acc.tiers["both"]["bytes"] + acc.tiers["cold"]["bytes"]
    orphan = last_reconcile.orphan_bytes.get(name) if last_reconcile is not None else None
    if last_reconcile is not None and orphan is None:
        orphan = 0
    return NamespaceOverview(
        namespace=name, tiers=acc.tiers, objects=acc.objects, offload_lag_ms=acc.offload_lag_ms,
        deletion_lag_ms=acc.deletion_lag_ms, orphan_bytes=orphan,
        deletion_in_flight=in_flight.get(name, 0), deletion_dead_letter=dead.get(name, 0),
        requests_per_run={k: round(v, 1) for k, v in per_run.items()},
        requests_per_month=round(sum(per_month.values()), 1),
        storage_cost_month=prices.storage_cost(stored + (orphan or 0)),
        request_cost_month=prices.requests_cost(per_month),
        unreadable_topics=list(acc.unreadable),
        messages=scrub_messages(name, by_job.get(SCRUB_JOB, [])),
    )


def _totals(namespaces: list[NamespaceOverview], in_flight: dict[str, int], dead: dict[str, int],
            by_job: dict[str, list[RunInfo]], last_reconcile: RunInfo | None, prices: Prices) -> dict[str, Any]:
    per_run_all, month_all = store_requests(by_job)
    stored_all = sum(n.tiers["both"]["bytes"] + n.tiers["cold"]["bytes"] for n in namespaces)
    orphan_all = last_reconcile.orphan_bytes.get("", 0) if last_reconcile is not None else None
    totals: dict[str, Any] = {
        "tiers": {t: {k: sum(n.tiers[t][k] for n in namespaces) for k in ("ledgers", "bytes")} for t in TIERS},
        "objects": sum(n.objects for n in namespaces),
        "orphan_bytes": orphan_all,
        "deletion_in_flight": sum(in_flight.values()), "deletion_dead_letter": sum(dead.values()),
        "requests_per_run": {k: round(v, 1) for k, v in per_run_all.items()},
        "requests_per_month": round(sum(month_all.values()), 1),
        "storage_cost_month": prices.storage_cost(stored_all + (orphan_all or 0)),
        "request_cost_month": prices.requests_cost(month_all),
        "unreadable_topics": sum(len(n.unreadable_topics) for n in namespaces),
        # over the namespaces a scrub checked the messages of (None: none)
        "messages": {k: sum(n.messages[k] for n in namespaces if n.messages) for k in MESSAGE_COUNTERS}
        if any(n.messages for n in namespaces) else None,
    }
    totals["cost_month"] = totals["storage_cost_month"] + totals["request_cost_month"]
    return totals


def tier_history(runs: list[RunInfo], history_runs: int) -> list[dict[str, Any]]:
    """Bytes per tier of the recent runs that recorded a tier snapshot."""
    return [{"job": r.job, "run_id": r.run_id, "as_of_ms": r.as_of_ms,
             **{t: sum(int(d.get(t, {}).get("bytes", 0)) for d in r.tiers.values() if isinstance(d, dict))
                for t in TIERS}}
            for r in runs if r.tiers][-history_runs:]


def build_overview(ws: Workspace, reports_dir: str, now_ms: int, prices: Prices, history_runs: int = 20) -> Overview:
    """The overview at ``now_ms`` (a clock given, so a page and a test agree)."""
    rows = _scan_namespaces(ws, now_ms)
    in_flight, dead = deletion_records(ws)
    runs = run_infos(reports_dir)
    last_reconcile = next((r for r in reversed(runs) if r.job == RECONCILE_JOB), None)
    by_job: dict[str, list[RunInfo]] = {}
    for r in runs:
        by_job.setdefault(r.job, []).append(r)
    names = sorted(set(rows) | {n for n in in_flight if n} | {n for n in dead if n})
    namespaces = [_namespace_overview(name, rows.get(name) or _Scanned(), in_flight, dead, by_job, last_reconcile,
                                      prices) for name in names]
    totals = _totals(namespaces, in_flight, dead, by_job, last_reconcile, prices)
    last_runs = [job_runs[-1] for _, job_runs in sorted(by_job.items())]
    return Overview(now_ms, namespaces, totals, last_runs, tier_history(runs, history_runs), prices)


# -- drill-down: a namespace's topics, a topic's ledgers (read-only, one page of records read) --------


@dataclass
class TopicRow:
    """One topic of a namespace as its record shows it (``unreadable``: why it cannot be read)."""

    topic: str
    ledgers: int = 0
    entries: int = 0
    bytes: int = 0
    tiers: dict[str, dict[str, int]] = field(default_factory=_empty_tiers)
    first_ledger: int | None = None
    last_ledger: int | None = None
    unreadable: str | None = None


@dataclass
class LedgerRow:
    """One ledger with what ``offload --up-to <ledger>:<entry>`` needs: its first and last position."""

    ledger_id: int
    entries: int
    bytes: int
    tier: str
    offloaded: bool
    sealed_ms: int  # when the ledger was closed (0: the open ledger)

    @property
    def first_position(self) -> str | None:
        return f"{self.ledger_id}:0" if self.entries > 0 else None

    @property
    def last_position(self) -> str | None:
        return f"{self.ledger_id}:{self.entries - 1}" if self.entries > 0 else None


@dataclass
class Page:
    """One page of a longer list: ``items`` from ``offset``, ``total`` in all."""

    items: list[Any]
    offset: int
    total: int


def _page_bounds(total: int, offset: int, limit: int) -> tuple[int, int]:
    start = max(0, min(offset, max(0, total - 1)))
    return start, min(total, start + max(1, limit))


def namespace_topics(ws: Workspace, namespace: str, offset: int = 0, limit: int = 50) -> Page:
    """A page of the namespace's topics (by name), each from its own record: only that page's records
    are read. NotFoundError for a namespace the metadata does not know."""
    if namespace not in ws.ml.list_namespaces():
        raise NotFoundError(f"no namespace {namespace}")
    topics = ws.ml.list_topics(namespace)
    start, end = _page_bounds(len(topics), offset, limit)
    rows = []
    for t in topics[start:end]:
        row = TopicRow(t.full)
        try:
            info, _ = ws.ml.get_topic(t)
        except NotFoundError:
            row.unreadable = "deleted since it was listed"
        except UnreadableRecordError as e:
            row.unreadable = f"{e.path}: {e.reason}"
        else:
            for li in info.ledgerInfo:
                row.ledgers += 1
                row.entries += li.entries
                row.bytes += li.size
                row.tiers[tier_of(li)]["ledgers"] += 1
                row.tiers[tier_of(li)]["bytes"] += li.size
            ids = [li.ledgerId for li in info.ledgerInfo]
            row.first_ledger, row.last_ledger = (min(ids), max(ids)) if ids else (None, None)
        rows.append(row)
    return Page(rows, start, len(topics))


def topic_ledgers(ws: Workspace, topic: str, offset: int = 0, limit: int = 50) -> Page:
    """A page of the topic's ledgers, oldest first, with their positions, tier and size.
    NotFoundError without such a topic; UnreadableRecordError when its record cannot be read."""
    info, _ = ws.ml.get_topic(topic)
    ledgers = sorted(info.ledgerInfo, key=lambda li: li.ledgerId)
    start, end = _page_bounds(len(ledgers), offset, limit)
    rows = [LedgerRow(li.ledgerId, li.entries, li.size, tier_of(li), is_offloaded(li), li.timestamp)
            for li in ledgers[start:end]]
    return Page(rows, start, len(ledgers))
