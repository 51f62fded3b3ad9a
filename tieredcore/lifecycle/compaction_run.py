"""Compaction runs over a workspace (docs/compaction.md): which topics, with which thresholds, and the
run report the CLI, the Spark job and the DAG share. Planning is :mod:`tieredcore.lifecycle.compaction`,
the executor :mod:`tieredcore.offload.compaction`."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tieredcore.cold.requests import request_label
from tieredcore.config import Config
from tieredcore.errors import TieredError, ValidationError
from tieredcore.lifecycle.compaction import CostModel, compactor_for
from tieredcore.lifecycle.shards import NamespaceDue
from tieredcore.lifecycle.work import KIND_COMPACTION, brokers_job
from tieredcore.names import NamespaceName, TopicName
from tieredcore.offload.compaction import OK_OUTCOMES, CompactionResult
from tieredcore.offload.context import is_offloaded
from tieredcore.outcomes import Outcome
from tieredcore.policy import OffloadPolicy
from tieredcore.reports import Totals, totals
from tieredcore.workspace import Workspace

__all__ = [
    "DETAIL_SCHEMA",
    "CompactionReport",
    "Thresholds",
    "plan_topics",
    "run_topics",
]

# detail.parquet: one row per batch (Spark DDL)
DETAIL_SCHEMA = ("topic string, namespace string, outcome string, first_ledger long, last_ledger long, "
                 "ledgers int, units int, objects_before int, bytes_before long, segments string, "
                 "objects_after int, bytes_after long, entries long, bytes_read long, requests long, "
                 "estimated boolean, seconds double, error string")


@dataclass(frozen=True)
class Thresholds:
    """Overrides of the namespace policy's compaction thresholds for one run (None: the policy's)."""

    min_object_size: int | None = None
    target_size: int | None = None
    delete_delay_ms: int | None = None

    def apply(self, policy: OffloadPolicy, where: str) -> OffloadPolicy:
        p = replace(policy, **{k: v for k, v in (("compaction_min_object_size", self.min_object_size),
                                                 ("compaction_target_size", self.target_size),
                                                 ("compaction_delete_delay_ms", self.delete_delay_ms))
                               if v is not None})
        p.validate_compaction(where)
        return p

    def as_dict(self) -> dict[str, int | None]:
        return {"min_object_size": self.min_object_size, "target_size": self.target_size,
                "delete_delay_ms": self.delete_delay_ms}


def plan_topics(ws: Workspace, namespaces: Sequence[str] | None = None, topics: Sequence[str] | None = None, *,
                require_enabled: bool = True) -> tuple[list[str], list[str]]:
    """(topics to compact, notes on what was left out). ``topics``: these (each must exist); else the
    topics of ``namespaces`` (default: every namespace with compaction enabled). With
    ``require_enabled`` (every run that changes anything) topics whose policy has compaction off are
    left out with a note; a dry run may look at any topic (what would enabling it save?)."""
    ps = ws.policies
    notes: list[str] = []
    skipped = brokers_job(ps.brokers, KIND_COMPACTION, [TopicName.parse(t).full for t in topics or ()]
                          or [NamespaceName.parse(n).name for n in namespaces or ()])
    if skipped is not None:  # an attached Pulsar cluster's objects are its brokers'
        return [], [skipped]
    if topics:
        chosen = [TopicName.parse(t) for t in topics]
        for t in chosen:
            ws.ml.get_topic(t)  # TopicNotFoundError: bad input
    else:
        nss = [NamespaceName.parse(n).name for n in namespaces] if namespaces else ps.namespaces_with_compaction()
        chosen = [t for ns in nss for t in ws.ml.list_topics(ns)]
        if namespaces:
            for ns in nss:
                if not ws.ml.list_topics(ns):
                    notes.append(f"namespace {ns}: no topics")
    out = []
    for t in chosen:
        if require_enabled and not ps.for_topic(t).compaction_enabled:
            notes.append(f"{t.full}: compaction is off in its policy (tiered policies set "
                         f"{t.namespace_name} --compaction on)")
            continue
        out.append(t.managed_ledger_name)
    return out, notes


def plan_compaction_due(ws: Workspace, namespaces: Sequence[str] | None, *,
                        require_enabled: bool = True) -> list[NamespaceDue]:
    """Per namespace (the named ones, else every one with compaction enabled): its topics with
    compaction on (every topic without ``require_enabled``: a dry run may plan them, as
    :func:`plan_topics`) and their offloaded bytes (what the job may rewrite), or why there is nothing
    to compact (one line) — the plan task's input to :func:`tieredcore.lifecycle.shards.assign_shards`.
    Batches are planned by the job; this only weighs the namespaces."""
    ps = ws.policies
    if brokers_job(ps.brokers, KIND_COMPACTION, [NamespaceName.parse(n).name for n in namespaces or ()]) is not None:
        return []  # an attached Pulsar cluster's objects are its brokers' (the one line is logged)
    nss = [NamespaceName.parse(n).name for n in namespaces] if namespaces else ps.namespaces_with_compaction()
    out: list[NamespaceDue] = []
    for ns in nss:
        topics = ws.ml.list_topics(ns)
        on = [t for t in topics if not require_enabled or ps.for_topic(t).compaction_enabled]
        if not on:
            out.append(NamespaceDue.idle(ns, f"compaction is off in the policy of its {len(topics)} topic(s)"
                                         if topics else "no topics"))
            continue
        size = 0
        for t in on:
            try:
                info, _ = ws.ml.get_topic(t)
            except TieredError:
                continue  # the job reports it when it plans the topic
            size += sum(li.size for li in info.ledgerInfo if is_offloaded(li))
        out.append(NamespaceDue(ns, len(on), size))
    return out


def run_topics(config: Config, topics: Iterable[str], *, as_of_ms: int, dry_run: bool,
               thresholds: Thresholds | Mapping[str, Any] | None = None,
               progress: Callable[[str, int, int], None] | None = None) -> Iterator[dict[str, Any]]:
    """Compact each topic (one workspace for all; a Spark partition's work). Rows as dicts."""
    th = thresholds if isinstance(thresholds, Thresholds) else Thresholds(**(thresholds or {}))
    with Workspace(config) as ws:
        ps = ws.policies
        budget = ws.failure_budget()
        for topic in topics:
            t = TopicName.parse(topic)
            try:
                with request_label(t.namespace_name):  # the run report's requests per namespace
                    policy = th.apply(ps.for_topic(t), f"topic {t.full}")
                    c = compactor_for(ws, policy, clock_ms=lambda: as_of_ms, progress=progress)
                    rows = c.compact_topic(t, dry_run=dry_run, budget=budget)
            except TieredError as e:
                rows = [CompactionResult(t.managed_ledger_name, t.namespace_name, "failed",
                                         error=f"{type(e).__name__}: {e}", error_type=type(e).__name__)]
            for r in rows:
                yield r.as_dict()


# -- report ---------------------------------------------------------------------------------------


# the totals' counters, per namespace too (the DAG summary shows objects and bytes before → after)
_COUNTERS = ("objects_before", "objects_after", "bytes_before", "bytes_after")


def _ns_block() -> dict[str, Any]:
    return {"topics": 0, "batches": 0, "ledgers": 0, "objects_before": 0, "objects_after": 0, "bytes_before": 0,
            "bytes_after": 0, "bytes_read": 0, "failures": 0, "outcomes": {}}


@dataclass
class CompactionReport:
    """The run report of a compaction (CLI, Spark job, DAG summary): per namespace, objects and bytes
    before → after (of the batches compacted, or planned in a dry run) and the cost change."""

    as_of_ms: int
    dry_run: bool
    rows: list[dict[str, Any]]
    topics: list[str] = field(default_factory=list)  # topics examined
    notes: list[str] = field(default_factory=list)
    cost: CostModel = field(default_factory=CostModel)
    thresholds: dict[str, Any] = field(default_factory=dict)

    def _counted(self, r: dict[str, Any]) -> bool:
        return r["outcome"] in (Outcome.COMPACTED, Outcome.WOULD_COMPACT)

    def namespaces(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for t in self.topics:
            out.setdefault(TopicName.parse(t).namespace_name, _ns_block())["topics"] += 1
        for r in self.rows:
            ns = out.setdefault(r["namespace"], _ns_block())
            ns["outcomes"][r["outcome"]] = ns["outcomes"].get(r["outcome"], 0) + 1
            ns["bytes_read"] += r.get("bytes_read", 0)
            if r["outcome"] not in OK_OUTCOMES:
                ns["failures"] += 1
            if self._counted(r):
                ns["batches"] += 1
                ns["ledgers"] += len(r["ledgers"])
                for k in ("objects_before", "objects_after", "bytes_before", "bytes_after"):
                    ns[k] += r[k]
        for ns in out.values():
            ns["cost"] = self.cost.estimate(ns["objects_before"], ns["objects_after"], ns["bytes_before"],
                                            ns["bytes_after"])
        return dict(sorted(out.items()))

    def totals(self) -> Totals:
        nss = self.namespaces()
        done = [r for r in self.rows if r["outcome"] == Outcome.COMPACTED]
        outcomes: dict[str, int] = {}
        for r in self.rows:
            outcomes[r["outcome"]] = outcomes.get(r["outcome"], 0) + 1
        return totals(
            topics=len(set(self.topics) | {r["topic"] for r in self.rows}),
            ledgers=sum(len(r["ledgers"]) for r in self.rows if self._counted(r)),
            bytes=sum(r["bytes_after"] for r in done),
            failures=sum(1 for r in self.rows if r["outcome"] not in OK_OUTCOMES),
            outcomes=outcomes,
            namespaces={ns: {"ledgers": v["ledgers"], "bytes": v["bytes_after"] if not self.dry_run else 0,
                             "failures": v["failures"], "outcomes": v["outcomes"],
                             "counters": {k: v[k] for k in _COUNTERS}} for ns, v in nss.items()},
            counters={k: sum(v[k] for v in nss.values()) for k in _COUNTERS},
            segments=sum(len(r["segments"]) for r in done),
            segment_bytes=sum(r["bytes_after"] for r in done),
        )

    def summary(self) -> dict[str, Any]:
        nss = self.namespaces()
        before = sum(v["objects_before"] for v in nss.values())
        after = sum(v["objects_after"] for v in nss.values())
        b_before = sum(v["bytes_before"] for v in nss.values())
        b_after = sum(v["bytes_after"] for v in nss.values())
        return {"as_of_ms": self.as_of_ms, "dry_run": self.dry_run, "namespaces": nss,
                "objects_before": before, "objects_after": after, "bytes_before": b_before, "bytes_after": b_after,
                "bytes_saved": b_before - b_after,
                "retransformed_batches": sum(1 for r in self.rows if r.get("retransformed") and self._counted(r)),
                "cost": self.cost.estimate(before, after, b_before, b_after),
                "prices": {"gb_month": self.cost.gb_month, "put_per_1000": self.cost.put_per_1000,
                           "get_per_1000": self.cost.get_per_1000, "listings_per_month": self.cost.listings_per_month},
                "thresholds": self.thresholds, "notes": self.notes,
                "failed": [f"{r['topic']} {r['outcome']}: {r['error']}" for r in self.rows
                           if r["outcome"] not in OK_OUTCOMES]}

    def detail(self) -> tuple[list[tuple], str]:
        rows = [(r["topic"], r["namespace"], r["outcome"], r["ledgers"][0] if r["ledgers"] else -1,
                 r["ledgers"][-1] if r["ledgers"] else -1, len(r["ledgers"]), r["units"], r["objects_before"],
                 r["bytes_before"], ",".join(r["segments"]), r["objects_after"], r["bytes_after"], r["entries"],
                 r["bytes_read"], r["requests"], r["estimated"], float(r["seconds"]), r["error"] or "")
                for r in self.rows]
        return rows, DETAIL_SCHEMA

    def messages(self) -> list[str]:
        out = list(self.notes)
        for ns, v in self.namespaces().items():
            c = v["cost"]
            out.append(f"{ns}: {v['topics']} topic(s), {v['batches']} batch(es) {'planned' if self.dry_run else 'compacted'}: "
                       f"objects {v['objects_before']} → {v['objects_after']}, {_size(v['bytes_before'])} → "
                       f"{_size(v['bytes_after'])}{' (estimated)' if self.dry_run else ''}"
                       f"{_saved(v['bytes_before'], v['bytes_after'], self.dry_run)}; monthly cost change "
                       f"{_usd(c['total_month'])} (storage {_usd(c['storage_month'])}, listings "
                       f"{_usd(c['listing_month'])}), one-time {_usd(c['one_time'])}")
        for r in self.rows:
            if r["outcome"] not in OK_OUTCOMES:
                # first word: the outcome (tieredcore.reports.message_level: FAILED an error, others warnings)
                out.append(f"{str(r['outcome']).upper()} {r['topic']} ledgers {_span(r['ledgers'])}: {r['error']}")
        return out


def _saved(before: int, after: int, dry_run: bool) -> str:
    return f" (saved {_size(before - after)})" if after < before and not dry_run else ""


def _span(ledgers: Sequence[int]) -> str:
    return f"{ledgers[0]}..{ledgers[-1]}" if ledgers else "-"


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


def _usd(v: float) -> str:
    sign = "-" if v < 0 else "+"
    return f"{sign}${abs(v):.4f}" if abs(v) < 1 else f"{sign}${abs(v):,.2f}"


def check_prices(values: Mapping[str, Any]) -> CostModel:
    try:
        return CostModel(**dict(values)).validate()
    except TypeError as e:
        raise ValidationError(f"prices: {e}") from None

