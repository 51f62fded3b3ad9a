"""What every lifecycle job's distributed work shares: the unit of work (one topic's ledgers), the row each
ledger (or, in a streaming offload sweep, each segment) produces, the run summary and report, the policy
lookup, and running a topic's ledgers under its lease with a budget of store failures. The jobs themselves: sweep (offload, deletion-lag cleanup),
retention, scrub; :func:`tieredcore.lifecycle.runner.run_work` runs their units on Spark executors."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from tieredcore.cold.failures import StoreFailureBudget
from tieredcore.errors import LeaseHeldError, TieredError, UnreadableRecordError
from tieredcore.meta.leases import TopicLeases
from tieredcore.meta.managed_ledgers import ManagedLedgerStore
from tieredcore.names import NamespaceName, TopicName
from tieredcore.outcomes import Outcome
from tieredcore.policy import PolicyStore
from tieredcore.reports import Totals, damage_text, totals

KIND_OFFLOAD = "offload"
KIND_LAG_CLEANUP = "lag-cleanup"
KIND_RETENTION = "retention"  # tieredcore.lifecycle.retention
KIND_SCRUB = "scrub"  # tieredcore.lifecycle.scrub
KIND_COMPACTION = "compaction"  # tieredcore.lifecycle.compaction_run (not a TopicWork kind)
KIND_MANUAL_OFFLOAD = "manual-offload"  # a manual offload's planning (tiered_offload_topic)

# outcomes that fail a run (a busy topic is not a failure: its lease holder is doing the work)
FAILED_OUTCOMES = frozenset({"failed", "unknown", "verify-failed", Outcome.ABORTED,
                             "damaged", "unrecoverable", Outcome.UNREPAIRABLE})
# outcomes whose bytes a run report counts (offloaded; hot copies handed to the drain; bytes a scrub read)
BYTES_OUTCOMES = ("offloaded", "marked", "ok", "damaged", "repaired", "unrecoverable", Outcome.UNREPAIRABLE)
# what a row is about: one ledger (every job), or one streaming segment (PIP-76 offload sweep)
UNIT_LEDGER = "ledger"
UNIT_SEGMENT = "segment"
# a segment that did not land stops its topic's streaming offload for this run: these fail the run too
# (a held tail waits for its rollover time, a busy topic is offloaded by its lease holder: neither fails)
SEGMENT_FAILED_OUTCOMES = FAILED_OUTCOMES | {"conflict"}
# TopicWork.options: the topic's record could not be read when the unit was planned ("path: reason"); the
# unit carries no ledgers and runs nothing: it is one failed row for the topic (ledger RECORD_ROW)
OPTION_UNREADABLE = "unreadable"
RECORD_ROW = -1  # LedgerResult.ledger of a row about the topic's record rather than one of its ledgers


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


# LedgerResult's fields as the Parquet detail schema of run reports (Spark DDL)
DETAIL_SCHEMA = (
    "topic string, namespace string, ledger long, kind string, outcome string, bytes long, blocks long, "
    "entries long, seconds double, uuid string, error string, unit string, covers string, "
    "messages_checked long, messages_unchecked long, messages_damaged long, not_messages long, damaged_at string, "
    "repair string, damage_reasons string"
)
# LedgerResult's message counts (a deep scrub's message check, tieredcore.offload.message_audit): counters
# of a namespace in a run's summary when any of its rows checked messages
MESSAGE_COUNTERS = ("messages_checked", "messages_unchecked", "messages_damaged", "not_messages")
MAX_DAMAGED_LISTED = 100  # damaged message positions a run summary names (the counters count them all)
# LedgerResult.repair of a damaged copy (a scrub's): whether and how it can be repaired
REPAIR_FROM_HOT = "possible from the hot copy"  # outcome damaged (or repaired, with repair on)
REPAIR_NO_COPY = "impossible: no intact copy left"  # outcome unrecoverable (data loss)
REPAIR_WITHOUT_BOOKKEEPER = "impossible without BookKeeper"  # outcome unrepairable (attached to Pulsar)
# the outcomes of a damaged copy that stays damaged: a run summary lists them per namespace under "damage"
DAMAGE_OUTCOMES = ("damaged", "unrecoverable", Outcome.UNREPAIRABLE)


@dataclass
class LedgerResult:
    """One row of a run report (also the Parquet detail schema, DETAIL_SCHEMA). A segment row
    (``unit == "segment"``): ``ledger`` is the first ledger it covers, ``covers`` every ledger's entry
    range in it (``"LEDGER:FIRST-LAST,..."``, topic order), ``bytes`` its data object's size. The
    ``messages_*`` / ``not_messages`` counts: what a deep scrub's message check found, in entries (one
    CRC32C covers a whole batch); all 0 when no message was checked; ``damaged_at`` the damaged ones'
    positions, ``"LEDGER:ENTRY,..."`` (the first 20), ``damage_reasons`` their reasons, one line each in
    the same order. ``repair``: for a damaged copy, whether it can be repaired (REPAIR_* below); '' else."""

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
    unit: str = UNIT_LEDGER
    covers: str = ""
    messages_checked: int = 0
    messages_unchecked: int = 0
    messages_damaged: int = 0
    not_messages: int = 0
    damaged_at: str = ""
    repair: str = ""
    damage_reasons: str = ""

    @property
    def is_segment(self) -> bool:
        return self.unit == UNIT_SEGMENT

    @property
    def failed(self) -> bool:
        return self.outcome in (SEGMENT_FAILED_OUTCOMES if self.is_segment else FAILED_OUTCOMES)

    @property
    def what(self) -> str:
        """How a message names the row's unit."""
        if self.is_segment:
            return f"segment {self.uuid or '(not started)'} [{self.covers}]"
        if self.ledger == RECORD_ROW:
            return "topic record"
        return f"ledger {self.ledger}"


def format_covers(ranges) -> str:
    """``[(ledger, first, last), ...]`` -> ``"LEDGER:FIRST-LAST,..."`` (LedgerResult.covers)."""
    return ",".join(f"{lid}:{first}-{last}" for lid, first, last in ranges)


def parse_covers(text: str) -> list[tuple[int, int, int]]:
    out = []
    for part in filter(None, text.split(",")):
        lid, _, rng = part.partition(":")
        first, _, last = rng.partition("-")
        out.append((int(lid), int(first), int(last)))
    return out




def unreadable_unit(e: UnreadableRecordError, kind: str, as_of_ms: int, dry_run: bool = False) -> TopicWork:
    """The unit a planner emits for a topic whose record it cannot read: no ledgers, the reason in
    OPTION_UNREADABLE; it runs nothing and reports one failed row (:func:`unreadable_rows`), so the run
    counts a failure for that topic while every other topic is planned and run as usual."""
    return TopicWork(e.topic, kind, [], as_of_ms, dry_run, {OPTION_UNREADABLE: f"{e.path}: {e.reason}"})


def unreadable_rows(w: TopicWork) -> list[LedgerResult]:
    """The failed row of a unit planned for an unreadable record (empty for any other unit)."""
    why = w.options.get(OPTION_UNREADABLE)
    if not why:
        return []
    t = TopicName.parse(w.topic)
    return [LedgerResult(t.full, t.namespace_name, RECORD_ROW, w.kind, Outcome.FAILED,
                         error=f"UnreadableRecordError: the topic's record cannot be read: {why}")]


log = logging.getLogger(__name__)

# the jobs an attached Pulsar cluster's brokers do themselves: (the job, what it would do)
BROKERS_JOBS = {
    KIND_OFFLOAD: ("offload sweep", "offloading"),
    KIND_MANUAL_OFFLOAD: ("manual offload", "offloading"),
    KIND_LAG_CLEANUP: ("deletion-lag cleanup", "deleting BookKeeper copies after the offload deletion lag"),
    KIND_RETENTION: ("retention", "retention"),
    KIND_COMPACTION: ("compaction", "writing its offloaded objects"),
}


def brokers_job(brokers: str | None, kind: str, what: Iterable[str] | None = None) -> str | None:
    """On a workspace attached to Pulsar cluster ``brokers`` (``PolicyStore.brokers``): the one line saying
    that the job of ``kind`` skips ``what`` (namespaces or topics; None: every namespace) because it is the
    brokers' job, logged as a warning (the CLI's stderr, a Spark driver's log, an Airflow task's log) and
    returned for reports. None (nothing skipped) on a workspace that is not attached."""
    if brokers is None:
        return None
    job, duty = BROKERS_JOBS[kind]
    names = sorted(set(what or ()))
    which = ", ".join(names) if names else "every namespace"
    cluster = f"Pulsar cluster {brokers!r}" if brokers else "a Pulsar cluster"
    line = f"{job}: skipped {which}: attached to {cluster}, whose brokers do {duty} (this workspace never does)"
    log.warning("%s", line)
    return line


def resolve_namespaces(ml: ManagedLedgerStore, policies: PolicyStore, namespaces: Iterable[str] | None,
                       kind: str) -> list[str]:
    """The namespaces named (validated), else every namespace: with offload enabled for an offload sweep.
    None on a workspace attached to a Pulsar cluster for the brokers' jobs (offload, deletion-lag cleanup,
    retention), with one line saying so (:func:`brokers_job`)."""
    ps = policies
    if kind in BROKERS_JOBS and brokers_job(ps.brokers, kind, namespaces) is not None:
        return []
    if namespaces:
        return [NamespaceName.parse(n).name for n in namespaces]
    if kind == KIND_OFFLOAD:
        return ps.namespaces_with_offload()
    return sorted(set(ml.list_namespaces()))


def held_topic_rows(
    leases: TopicLeases, t: TopicName, w: TopicWork, purpose: str, budget: StoreFailureBudget | None,
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
            row = LedgerResult(t.full, t.namespace_name, lid, w.kind, Outcome.FAILED)
            if budget is not None and budget.exhausted:
                row.outcome, row.error = Outcome.ABORTED, budget.reason
                out.append(row)
                continue
            try:
                error_type = one(lid, row)
            except TieredError as e:
                row.outcome, row.error, error_type = Outcome.FAILED, f"{type(e).__name__}: {e}", type(e).__name__
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
        with leases.hold(t, purpose) as held:
            run_all(held.renew)
    except LeaseHeldError as e:
        out += [LedgerResult(t.full, t.namespace_name, lid, w.kind, Outcome.BUSY, error=str(e))
                for lid in ids[len(out):]]
    return out


@dataclass
class RunSummary:
    job: str
    run_id: str
    as_of_ms: int
    dry_run: bool
    topics: int = 0
    ledgers: int = 0  # ledger rows (segment rows are counted under segments*)
    bytes: int = 0
    failures: int = 0
    # streaming offload (PIP-76): segments written, their data-object bytes, tails held for their rollover
    segments: int = 0
    segment_bytes: int = 0
    segments_held: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    namespaces: dict[str, dict[str, int]] = field(default_factory=dict)
    seconds: float = 0.0
    drain: dict[str, Any] | None = None  # deletion_lag_cleanup --drain: the drain pass's counters
    # ledgers whose data no copy holds any more (scrub: damaged offloaded copy, no hot copy)
    data_loss: list[str] = field(default_factory=list)
    # the chunk cache counters of the run's partitions, added up (hits, misses, loads = GETs, evictions...;
    # empty when no transformed object was read): tieredcore.cold.chunk_cache.CacheStats
    cache: dict[str, int] = field(default_factory=dict)
    # a deep scrub's message check (MESSAGE_COUNTERS) over the rows that checked messages; empty when none
    # did. Per namespace under its "counters", and in the totals' counters
    messages: dict[str, int] = field(default_factory=dict)
    # "topic ledger:entry" of damaged messages (the first MAX_DAMAGED_LISTED; the reasons are in the rows)
    damaged_messages: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, job: str, run_id: str, as_of_ms: int, dry_run: bool, rows: list[dict], seconds: float) -> RunSummary:
        s = cls(job, run_id, as_of_ms, dry_run, seconds=round(seconds, 3))
        s.topics = len({r["topic"] for r in rows})
        for r in rows:
            row = LedgerResult(**r)
            s.outcomes[r["outcome"]] = s.outcomes.get(r["outcome"], 0) + 1
            ns = s.namespaces.setdefault(r["namespace"], {"ledgers": 0, "bytes": 0, "failures": 0, "outcomes": {}})
            ns["outcomes"][r["outcome"]] = ns["outcomes"].get(r["outcome"], 0) + 1
            if row.is_segment:
                for k, v in (("segments", r["outcome"] == "offloaded"),
                             ("segment_bytes", r["bytes"] if r["outcome"] == "offloaded" else 0),
                             ("segments_held", r["outcome"] == Outcome.HELD)):
                    setattr(s, k, getattr(s, k) + v)
                    ns[k] = ns.get(k, 0) + v
            else:
                s.ledgers += 1
                ns["ledgers"] += 1
            if r["outcome"] == "unrecoverable":
                s.data_loss.append(f"{r['topic']} ledger {r['ledger']}")
            failed = row.failed
            if r["outcome"] in BYTES_OUTCOMES:
                s.bytes += r["bytes"]
                ns["bytes"] += r["bytes"]
            s.failures += failed
            ns["failures"] += failed
            if any(getattr(row, k) for k in MESSAGE_COUNTERS):
                for into in (s.messages, ns.setdefault("counters", {})):
                    for k in MESSAGE_COUNTERS:
                        into[k] = into.get(k, 0) + getattr(row, k)
                room = MAX_DAMAGED_LISTED - len(s.damaged_messages)
                s.damaged_messages += [f"{row.topic} {p}" for p in filter(None, row.damaged_at.split(","))][:room]
            if r["outcome"] in DAMAGE_OUTCOMES and len(ns.setdefault("damage", [])) < MAX_DAMAGED_LISTED:
                ns["damage"].append(damage_entry(row))
        return s

    def as_dict(self) -> dict:
        return asdict(self)

    def totals(self) -> Totals:
        counters = {k: int(v) for k, v in (self.drain or {}).items() if isinstance(v, int) and k != "as_of_ms"}
        counters.update(self.messages)
        return totals(topics=self.topics, ledgers=self.ledgers, bytes=self.bytes, failures=self.failures,
                      outcomes=dict(self.outcomes), namespaces=self.namespaces, counters=counters,
                      data_loss=list(self.data_loss), segments=self.segments, segment_bytes=self.segment_bytes,
                      segments_held=self.segments_held)


def damaged_messages(row: LedgerResult) -> list[dict[str, str]]:
    """The damaged messages a row names: ``[{"position": "L:E", "reason": ...}]`` (reason '' if unknown)."""
    positions = [p for p in row.damaged_at.split(",") if p]
    reasons = row.damage_reasons.split("\n") if row.damage_reasons else []
    return [{"position": p, "reason": reasons[i] if i < len(reasons) else ""} for i, p in enumerate(positions)]


def damage_entry(row: LedgerResult) -> dict[str, Any]:
    """A damaged copy as a run summary lists it under its namespace's ``damage`` (docs/pulsar.md, Scrub)."""
    return {"topic": row.topic, "ledger": row.ledger, "uuid": row.uuid, "outcome": str(row.outcome),
            "repair": row.repair, "damaged_messages": damaged_messages(row), "problem": row.error}


@dataclass
class LedgerRunReport:
    """The report of a run over ledgers (offload sweep, lag cleanup, retention, scrub): its summary and
    one row per ledger, or per segment in a streaming offload sweep (tieredcore.reports.JobReport)."""

    summary_: RunSummary
    rows: list[dict]

    def totals(self) -> Totals:
        return self.summary_.totals()

    def summary(self) -> dict[str, Any]:
        return self.summary_.as_dict()

    def detail(self) -> tuple[list[tuple], str]:
        return [tuple(LedgerResult(**r).__dict__.values()) for r in self.rows], DETAIL_SCHEMA

    def messages(self) -> list[str]:
        out = []
        for r in self.rows:
            row = LedgerResult(**r)
            if r["outcome"] == Outcome.UNREPAIRABLE:
                out += damage_text(row.namespace, damage_entry(row))
            elif row.failed:
                out.append(f"FAILED {r['topic']} {row.what}: {r['outcome']}: {r['error']}")
            elif r["outcome"] == Outcome.BUSY:
                out.append(f"BUSY {r['topic']} {row.what}: {r['error']}")
        aborted = [r for r in self.rows if r["outcome"] == Outcome.ABORTED]
        if aborted:
            units = "segment(s)" if all(LedgerResult(**r).is_segment for r in aborted) else "ledger(s)"
            out.append(f"STOPPED early: {len(aborted)} {units} {aborted[0]['error']}")
        out += [f"DATA LOSS: {what}: no copy of it can be read (see the report)" for what in self.summary_.data_loss]
        return out
