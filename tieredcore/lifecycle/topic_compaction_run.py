"""Topic compaction runs over a workspace (docs/topic-compaction.md, "Automatic compaction"): which topics
are due (the namespace policy's ``topic_compaction_threshold_bytes``, Pulsar's ``compaction-threshold``,
against each topic's backlog after its compaction horizon), one topic's run as a report row, and the run
report the Spark job and the DAG share. The compaction itself is
:func:`tieredcore.lifecycle.topic_compaction.compact_topic` (or the Spark job's ``compact_on_spark``).
No Airflow or PySpark here."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tieredcore.errors import TieredError, TopicNotFoundError
from tieredcore.lifecycle.shards import NamespaceDue
from tieredcore.lifecycle.topic_compaction import (
    CompactionResult,
    NothingToCompact,
    TopicCompactionError,
    plan_compaction,
)
from tieredcore.model import Position
from tieredcore.names import NamespaceName, TopicName
from tieredcore.offload.compacted_state import compaction_state
from tieredcore.outcomes import Outcome
from tieredcore.reports import Totals, totals
from tieredcore.workspace import Workspace

__all__ = [
    "DETAIL_SCHEMA",
    "NOTHING",
    "TopicCompactionReport",
    "backlog_bytes",
    "compaction_row",
    "nothing_to_compact",
    "plan_topic_compaction",
    "plan_topic_compaction_due",
]

NOTHING = "nothing"  # the outcome of a topic with no message after its compaction horizon (not a failure)
OK_OUTCOMES = frozenset({Outcome.COMPACTED, NOTHING, Outcome.PLANNED})
COUNTERS = ("keys_before", "keys_after", "bytes_before", "bytes_after", "messages")
# detail.parquet: one row per topic (Spark DDL)
DETAIL_SCHEMA = ("topic string, namespace string, outcome string, horizon string, previous_ledger long, "
                 "new_ledger long, uuid string, keys_before long, keys_after long, bytes_before long, "
                 "bytes_after long, messages long, backlog long, seconds double, error string")


# -- planning -----------------------------------------------------------------------------------------


def backlog_bytes(ws: Workspace, topic: str | TopicName) -> int:
    """Bytes of the topic's entries after its compaction horizon (all of them when never compacted), from
    the topic record's ledger sizes: the ledger holding the horizon counts by the fraction of its entries
    after it; the open ledger by its hot copy's length (its record has no size yet)."""
    t = topic if isinstance(topic, TopicName) else TopicName.parse(topic)
    info, _ = ws.ml.get_topic(t)
    state = compaction_state(info)
    horizon = state.horizon if state is not None else None
    total = 0
    for li in info.ledgerInfo:
        if horizon is not None and li.ledgerId < horizon.ledger_id:
            continue
        entries, size = _entries_and_size(ws, li)
        if entries <= 0 or size <= 0:
            continue
        if horizon is not None and li.ledgerId == horizon.ledger_id:
            after = max(0, entries - 1 - horizon.entry_id)
            size = size * after // entries
        total += size
    return total


def _entries_and_size(ws: Workspace, li) -> tuple[int, int]:
    if li.timestamp > 0:  # sealed: the record has both
        return li.entries, li.size
    try:  # open: only its hot copy knows
        h = ws.hot.open_ledger(li.ledgerId)
    except TieredError:
        return 0, 0
    try:
        return h.last_add_confirmed + 1, h.length
    finally:
        h.close()


def nothing_to_compact(ws: Workspace, topic: str | TopicName) -> str | None:
    """Why the topic has nothing to compact (no message, none after its horizon: plan_compaction's
    NothingToCompact), or None: a run would compact. TopicNotFoundError for an unknown topic."""
    t = topic if isinstance(topic, TopicName) else TopicName.parse(topic)
    reader = ws.reader()
    try:
        plan_compaction(ws, reader, t)
    except NothingToCompact as e:
        return str(e)
    finally:
        reader.close()
    return None


def _threshold_of(ws: Workspace, t: TopicName, override: int | None) -> int:
    return override if override is not None else ws.policies.for_topic(t).topic_compaction_threshold_bytes


def plan_topic_compaction(ws: Workspace, namespaces: Sequence[str] | None = None,
                          topics: Sequence[str] | None = None,
                          threshold_override: int | None = None) -> tuple[list[tuple[str, int]], list[str]]:
    """(due topics as ``(full name, backlog bytes)``, notes). ``topics``: each one, always (a manual trigger;
    TopicNotFoundError for an unknown one). Else the topics of ``namespaces`` (default: every namespace whose
    policy, or a topic's, sets a threshold) whose threshold (``threshold_override``, else the effective
    policy's; -1: off) is set and whose backlog is not empty and at least the threshold."""
    notes: list[str] = []
    if topics:
        due = []
        for name in dict.fromkeys(TopicName.parse(x).full for x in topics):
            t = TopicName.parse(name)
            if not ws.ml.exists(t):
                raise TopicNotFoundError(f"topic {t.full} does not exist")
            due.append((t.full, backlog_bytes(ws, t)))
        return due, notes
    due = []
    for d in _namespaces_due(ws, namespaces, threshold_override, notes):
        due += d[1]
    return due, notes


def _namespaces_due(ws: Workspace, namespaces: Sequence[str] | None, override: int | None,
                    notes: list[str]) -> list[tuple[str, list[tuple[str, int]], str]]:
    """Per namespace: (namespace, its due topics with their backlog, why none when none)."""
    named = bool(namespaces)
    nss = ([NamespaceName.parse(n).name for n in dict.fromkeys(namespaces or ())] if named
           else ws.policies.namespaces_with_topic_compaction())
    out = []
    for ns in nss:
        topics = ws.ml.list_topics(ns)
        due: list[tuple[str, int]] = []
        off = below = empty = 0
        for t in topics:
            threshold = _threshold_of(ws, t, override)
            if threshold < 0:
                off += 1
                continue
            backlog = backlog_bytes(ws, t)
            if backlog <= 0:
                empty += 1
            elif backlog < threshold:
                below += 1
            else:
                due.append((t.full, backlog))
        why = []
        if not topics:
            why.append("no topics")
        if off:
            why.append(f"{off} topic(s) with topic compaction off in their policy (tiered policies set {ns} "
                       "--compaction-threshold SIZE)")
        if below:
            why.append(f"{below} topic(s) with a backlog below the threshold")
        if empty:
            why.append(f"{empty} topic(s) with no backlog after the compaction horizon")
        reason = "; ".join(why)
        if reason and (named or due):
            notes.append(f"namespace {ns}: {reason}")
        out.append((ns, due, reason or "nothing due"))
    return out


def plan_topic_compaction_due(ws: Workspace, namespaces: Sequence[str] | None = None,
                              threshold_override: int | None = None) -> list[NamespaceDue]:
    """Per namespace (the named ones, else every one with a threshold set): its due topics and their
    backlog bytes, or why none is due (the DAG's plan: tieredcore.lifecycle.shards.assign_shards)."""
    notes: list[str] = []
    return [NamespaceDue(ns, len(due), sum(b for _t, b in due)) if due else NamespaceDue.idle(ns, reason)
            for ns, due, reason in _namespaces_due(ws, namespaces, threshold_override, notes)]


# -- one topic's run ----------------------------------------------------------------------------------


def _row(topic: str, outcome: str, backlog: int, seconds: float, **kw: Any) -> dict[str, Any]:
    t = TopicName.parse(topic)
    row: dict[str, Any] = {"topic": t.full, "namespace": t.namespace_name, "outcome": str(outcome), "horizon": "",
                           "previous_ledger": -1, "new_ledger": -1, "uuid": "", "keys_before": 0, "keys_after": 0,
                           "bytes_before": 0, "bytes_after": 0, "messages": 0, "backlog": backlog,
                           "seconds": round(seconds, 3), "error": ""}
    row.update(kw)
    return row


def _pos(p: Position) -> str:
    return f"{p.ledger_id}:{p.entry_id}"


def compaction_row(ws: Workspace, topic: str, backlog: int, compact: Callable[[str], CompactionResult], *,
                   dry_run: bool = False) -> dict[str, Any]:
    """One topic compacted by ``compact(topic)`` (compact_topic, or compact_on_spark) as a report row.
    Outcomes: ``compacted``; ``nothing`` (no message after the horizon, checked first: not a failure);
    ``conflict`` (TopicCompactionError once started: the state changed meanwhile, a lost race, retried next
    run); ``failed`` (any other error); ``planned`` in a dry run (nothing written)."""
    started = time.monotonic()
    t = TopicName.parse(topic)
    try:
        why = nothing_to_compact(ws, t)
        if why is not None:
            return _row(t.full, NOTHING, backlog, time.monotonic() - started, error=why)
        if dry_run:
            reader = ws.reader()
            try:
                plan = plan_compaction(ws, reader, t)
            finally:
                reader.close()
            prev = plan.previous
            return _row(t.full, Outcome.PLANNED, backlog, time.monotonic() - started, horizon=_pos(plan.horizon),
                        previous_ledger=prev.ledger_id if prev is not None else -1)
    except TieredError as e:
        return _row(t.full, Outcome.FAILED, backlog, time.monotonic() - started, error=f"{type(e).__name__}: {e}")
    try:
        res = compact(t.full)
    except NothingToCompact as e:  # another run compacted it since the check
        return _row(t.full, NOTHING, backlog, time.monotonic() - started, error=str(e))
    except TopicCompactionError as e:
        return _row(t.full, Outcome.CONFLICT, backlog, time.monotonic() - started, error=str(e))
    except TieredError as e:
        return _row(t.full, Outcome.FAILED, backlog, time.monotonic() - started, error=f"{type(e).__name__}: {e}")
    return _row(t.full, Outcome.COMPACTED, backlog, res.seconds or time.monotonic() - started,
                horizon=_pos(res.horizon), previous_ledger=res.previous.ledger_id if res.previous else -1,
                new_ledger=res.ledger_id, uuid=res.uuid, keys_before=res.keys_seen, keys_after=res.keys,
                bytes_before=res.bytes_read, bytes_after=res.bytes_written, messages=res.messages_read)


# -- report -------------------------------------------------------------------------------------------


def _ns_block() -> dict[str, Any]:
    return {"topics": 0, "compacted": 0, "nothing": 0, "conflicts": 0, "failed": 0, "planned": 0, "backlog": 0,
            **{k: 0 for k in COUNTERS}}


@dataclass
class TopicCompactionReport:
    """The run report of a topic compaction (Spark job, DAG summary): per namespace the topics compacted,
    with nothing to compact, lost to a conflict, failed; keys, bytes and messages before → after."""

    as_of_ms: int
    dry_run: bool
    rows: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)
    threshold_override: int | None = None
    retain_null_key: bool = False

    def namespaces(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for r in self.rows:
            ns = out.setdefault(r["namespace"], _ns_block())
            ns["topics"] += 1
            ns["backlog"] += r["backlog"]
            key = {Outcome.COMPACTED: "compacted", NOTHING: "nothing", Outcome.CONFLICT: "conflicts",
                   Outcome.PLANNED: "planned"}.get(r["outcome"], "failed")
            ns[key] += 1
            for k in COUNTERS:
                ns[k] += r[k]
        return dict(sorted(out.items()))

    def totals(self) -> Totals:
        nss = self.namespaces()
        outcomes: dict[str, int] = {}
        for r in self.rows:
            outcomes[r["outcome"]] = outcomes.get(r["outcome"], 0) + 1
        done = [r for r in self.rows if r["outcome"] == Outcome.COMPACTED]
        return totals(
            topics=len(self.rows), ledgers=len(done), bytes=sum(r["bytes_after"] for r in done),
            failures=sum(1 for r in self.rows if r["outcome"] not in OK_OUTCOMES), outcomes=outcomes,
            namespaces={ns: {"ledgers": v["compacted"], "bytes": v["bytes_after"],
                             "failures": v["conflicts"] + v["failed"],
                             "outcomes": {r: n for r, n in _outcomes(self.rows, ns).items()},
                             "counters": {k: v[k] for k in COUNTERS}} for ns, v in nss.items()},
            counters={k: sum(v[k] for v in nss.values()) for k in COUNTERS})

    def summary(self) -> dict[str, Any]:
        return {"as_of_ms": self.as_of_ms, "dry_run": self.dry_run, "namespaces": self.namespaces(),
                "topics": {r["topic"]: {k: r[k] for k in r if k not in ("topic", "namespace")} for r in self.rows},
                "threshold_override": self.threshold_override, "retain_null_key": self.retain_null_key,
                "notes": self.notes,
                "failed": [f"{r['topic']} {r['outcome']}: {r['error']}" for r in self.rows
                           if r["outcome"] not in OK_OUTCOMES]}

    def detail(self) -> tuple[list[tuple], str]:
        cols = [c.strip().split(" ")[0] for c in DETAIL_SCHEMA.split(",")]
        rows = [tuple(float(r[c]) if c == "seconds" else r[c] for c in cols) for r in self.rows]
        return rows, DETAIL_SCHEMA

    def messages(self) -> list[str]:
        out = list(self.notes)
        for r in self.rows:
            if r["outcome"] == Outcome.COMPACTED:
                out.append(f"{r['topic']}: compacted up to {r['horizon']} in {r['seconds']:.1f} s: "
                           f"{r['messages']} message(s) read, keys {r['keys_before']} → {r['keys_after']}, "
                           f"bytes {r['bytes_before']:,} → {r['bytes_after']:,}; compacted ledger "
                           f"{r['previous_ledger']} → {r['new_ledger']} ({r['uuid'] or 'empty'})")
            elif r["outcome"] == Outcome.PLANNED:
                out.append(f"{r['topic']}: would compact up to {r['horizon']} (backlog {r['backlog']:,} bytes)")
            elif r["outcome"] == NOTHING:
                out.append(f"{r['topic']}: {r['error']}")
            else:  # first word: the outcome (tieredcore.reports.message_level: FAILED an error, CONFLICT a warning)
                out.append(f"{str(r['outcome']).upper()} {r['topic']}: {r['error']}")
        for ns, v in self.namespaces().items():
            out.append(f"{ns}: {v['topics']} topic(s): {v['compacted']} compacted, {v['nothing']} with nothing to "
                       f"compact, {v['conflicts']} conflict(s), {v['failed']} failed"
                       + (f", {v['planned']} planned" if self.dry_run else "")
                       + f"; keys {v['keys_before']} → {v['keys_after']}, bytes {v['bytes_before']:,} → "
                       f"{v['bytes_after']:,}, {v['messages']} message(s)")
        return out


def _outcomes(rows: list[dict[str, Any]], ns: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in rows:
        if r["namespace"] == ns:
            out[r["outcome"]] = out.get(r["outcome"], 0) + 1
    return out
