"""Totals over a run's reports (the DAGs' summaries and run.json): one job's reports added up
(:class:`RunTotals`, per namespace :class:`NamespaceTotals`), several jobs of one run combined
(:class:`CombinedTotals`), and the text the task logs show for them. Knows nothing of where reports
are (tieredcore.reports.RunReports reads them and hands their ``totals`` here)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# -- totals over runs (the DAGs' summaries) --------------------------------------------------------

# streaming offload (PIP-76) totals of a report: segments written, their bytes, tails held for their rollover
SEGMENT_KEYS = ("segments", "segment_bytes", "segments_held")
NOT_PLANNED = "(not planned: an upstream task failed)"


def _add_counts(into: dict[str, int], counts: Mapping[str, Any] | None) -> None:
    for k, v in (counts or {}).items():
        into[k] = into.get(k, 0) + int(v)


@dataclass
class NamespaceTotals:
    """One namespace's part of a job's runs."""

    ledgers: int = 0
    bytes: int = 0
    failures: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    segments: dict[str, int] = field(default_factory=dict)  # the SEGMENT_KEYS its reports gave (streaming only)
    counters: dict[str, int] = field(default_factory=dict)  # a job's own counters (compaction's before/after)
    # a scrub's damaged copies (tieredcore.lifecycle.work.damage_entry): topic, ledger, uuid, outcome,
    # repair, damaged_messages [{position, reason}], problem
    damage: list[dict[str, Any]] = field(default_factory=list)

    def add(self, d: Mapping[str, Any]) -> None:
        self.ledgers += int(d.get("ledgers", 0))
        self.bytes += int(d.get("bytes", 0))
        self.failures += int(d.get("failures", 0))
        _add_counts(self.segments, {k: d[k] for k in SEGMENT_KEYS if k in d})
        _add_counts(self.counters, d.get("counters"))
        _add_counts(self.outcomes, d.get("outcomes"))
        self.damage += list(d.get("damage") or ())

    def as_dict(self) -> dict[str, Any]:
        """As the summary XCom shows it: segment keys for streaming namespaces only, counters and damage
        when any."""
        out: dict[str, Any] = {"ledgers": self.ledgers, "bytes": self.bytes, "failures": self.failures,
                               "outcomes": dict(self.outcomes), **self.segments}
        if self.counters:
            out["counters"] = dict(self.counters)
        if self.damage:
            out["damage"] = [dict(d) for d in self.damage]
        return out


@dataclass
class RunTotals:
    """A job's runs added up (:meth:`RunReports.totals`): ``jobs`` runs planned, those without a
    report in ``failed_jobs``, ``reports`` the summaries read."""

    job: str
    jobs: int = 0
    topics: int = 0
    ledgers: int = 0
    bytes: int = 0
    failures: int = 0
    segments: int = 0
    segment_bytes: int = 0
    segments_held: int = 0
    failed_jobs: list[str] = field(default_factory=list)
    outcomes: dict[str, int] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)
    namespaces: dict[str, NamespaceTotals] = field(default_factory=dict)
    data_loss: list[str] = field(default_factory=list)
    reports: list[str] = field(default_factory=list)

    @classmethod
    def not_run(cls, job: str, why: str = NOT_PLANNED) -> RunTotals:
        """A job that was never planned (its plan failed): no runs, one failed entry saying why."""
        return cls(job, failed_jobs=[why])

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RunTotals:
        """Totals as :meth:`as_dict` gave them (run.json, the summary XCom), back."""
        t = cls(str(d.get("job", "")), jobs=int(d.get("jobs", 0)), failed_jobs=[str(x) for x in d.get("failed_jobs") or []])
        t.add(d, "")
        t.reports = [str(r) for r in d.get("reports") or []]
        return t

    @property
    def parts(self) -> list[RunTotals]:
        return [self]

    def add(self, t: Mapping[str, Any], report: str) -> None:
        """One report's ``totals`` (:class:`Totals`) added."""
        self.reports.append(report)
        self.topics += int(t.get("topics", 0))
        self.ledgers += int(t.get("ledgers", 0))
        self.bytes += int(t.get("bytes", 0))
        self.failures += int(t.get("failures", 0))
        self.segments += int(t.get("segments", 0))
        self.segment_bytes += int(t.get("segment_bytes", 0))
        self.segments_held += int(t.get("segments_held", 0))
        _add_counts(self.outcomes, t.get("outcomes"))
        _add_counts(self.counters, t.get("counters"))
        self.data_loss += list(t.get("data_loss", []))
        for ns, d in (t.get("namespaces") or {}).items():
            self.namespaces.setdefault(ns, NamespaceTotals()).add(d)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (the summary task's XCom); ``counters`` only when a report had some."""
        out: dict[str, Any] = {
            "job": self.job, "jobs": self.jobs, "topics": self.topics, "ledgers": self.ledgers, "bytes": self.bytes,
            "failures": self.failures, "failed_jobs": list(self.failed_jobs), "outcomes": dict(self.outcomes),
            "namespaces": {ns: d.as_dict() for ns, d in self.namespaces.items()}, "reports": list(self.reports),
            "data_loss": list(self.data_loss), "segments": self.segments, "segment_bytes": self.segment_bytes,
            "segments_held": self.segments_held}
        if self.counters:
            out["counters"] = dict(self.counters)
        return out

    def summary_lines(self) -> list[str]:
        """The summary for a task log: the job's totals, one line per namespace, one per ledger lost."""
        d = self.as_dict()
        lines = [f"{self.job} summary: {self.jobs} job(s), {self.topics} topic(s), {self.ledgers} "
                 f"ledger(s)/record(s), {self.bytes:,} bytes, {self.failures} failure(s), "
                 f"failed jobs: {self.failed_jobs or 'none'}; outcomes {self.outcomes}"
                 + counters_text(self.counters) + segments_text(d)]
        for ns, n in sorted(d["namespaces"].items()):
            lines.append(f"  {ns}: {n['ledgers']} ledger(s), {n['bytes']:,} bytes, {n['failures']} failure(s)"
                         + (f"; {n['outcomes']}" if n.get("outcomes") else "") + counters_text(n.get("counters"))
                         + segments_text(n))
        for ns, n in sorted(self.namespaces.items()):
            lines += [line for d in n.damage for line in damage_text(ns, d)]
        lines += [f"DATA LOSS: {what}: no copy of it can be read" for what in self.data_loss]
        return lines


def damage_text(namespace: str, d: Mapping[str, Any]) -> list[str]:
    """A damaged copy of a summary's ``damage`` as log lines: one per damaged message, or one for the ledger."""
    repair = f"repair {d['repair']}" if d.get("repair") else str(d.get("outcome", "damaged"))
    msgs = d.get("damaged_messages") or []
    if not msgs:
        return [f"DAMAGED {namespace} {d['topic']} ledger {d['ledger']}: {d.get('problem', '')}"]
    return [f"DAMAGED {namespace} {d['topic']} {m['position']} {m.get('reason') or 'damaged'}: {repair}" for m in msgs]


@dataclass
class CombinedTotals:
    """Totals of several jobs of one run (e.g. retention_sweep then deletion_drain): summed, outcomes
    named ``<job>.<outcome>``, each job's own totals under ``by_job``."""

    parts: list[RunTotals]

    @property
    def job(self) -> str:
        return "+".join(p.job for p in self.parts)

    @property
    def failures(self) -> int:
        return sum(p.failures for p in self.parts)

    @property
    def data_loss(self) -> list[str]:
        return [what for p in self.parts for what in p.data_loss]

    def as_dict(self) -> dict[str, Any]:
        ps = self.parts
        return {
            "job": self.job, "jobs": sum(p.jobs for p in ps), "topics": sum(p.topics for p in ps),
            "ledgers": sum(p.ledgers for p in ps), "bytes": sum(p.bytes for p in ps), "failures": self.failures,
            "failed_jobs": [f"{p.job}/{rid}" for p in ps for rid in p.failed_jobs],
            # every job's ledgers lost: the verdict says DATA LOSS whichever job found it
            "data_loss": [what for p in ps for what in p.data_loss],
            "outcomes": {f"{p.job}.{k}": v for p in ps for k, v in p.outcomes.items()},
            "namespaces": {}, "reports": [r for p in ps for r in p.reports],
            "by_job": {p.job: p.as_dict() for p in ps},
            "segments": sum(p.segments for p in ps), "segment_bytes": sum(p.segment_bytes for p in ps),
            "segments_held": sum(p.segments_held for p in ps)}

    def summary_lines(self) -> list[str]:
        return [line for p in self.parts for line in p.summary_lines()]


def combine_totals(parts: Sequence[RunTotals]) -> RunTotals | CombinedTotals:
    """One job's totals as they are; several jobs' combined."""
    return parts[0] if len(parts) == 1 else CombinedTotals(list(parts))


def summary_lines(totals: Mapping[str, Any]) -> list[str]:
    """The task log's lines of a run's totals as :meth:`RunTotals.as_dict` or :meth:`CombinedTotals.as_dict`
    gave them (each job's, for several)."""
    by_job = totals.get("by_job") or {totals.get("job", ""): totals}
    return [line for t in by_job.values() for line in RunTotals.from_dict(t).summary_lines()]


def verdict_message(totals: Mapping[str, Any]) -> str | None:
    """Why a run failed, from its summary (:meth:`RunTotals.as_dict` / :meth:`CombinedTotals.as_dict`, with
    ``missing_parts`` when the summary task adds them); None when it did not. Data loss comes first:
    a retry cannot bring a lost ledger back, an operator must act."""
    lost = list(totals.get("data_loss") or [])
    failed_jobs = list(totals.get("failed_jobs") or [])
    if not (lost or totals.get("failures") or failed_jobs):
        return None
    # counts only: the summary task's log names each ledger (each failure once in a run's logs)
    return ((f"DATA LOSS in {len(lost)} ledger(s) (named in the summary's log); " if lost else "")
            + f"{totals.get('failures', 0)} failure(s), parts without a report: {failed_jobs or 'none'}; "
            f"see the run report {totals.get('run_report') or totals.get('reports') or '(none written)'}")


def segments_text(d: Mapping[str, Any]) -> str:
    """'; N segment(s) (B bytes), H tail(s) held for their rollover' when totals have streaming counts."""
    if not any(d.get(k) for k in SEGMENT_KEYS):
        return ""
    held = d.get("segments_held", 0)  # streaming only: compaction writes segments but holds no tail
    return (f"; {d.get('segments', 0)} segment(s) ({d.get('segment_bytes', 0):,} bytes)"
            + (f", {held} tail(s) held for their rollover" if held else ""))


def counters_text(counters: Mapping[str, int] | None) -> str:
    """'; objects 48 → 4, bytes 34,502 → 29,852, deleted_hot=2': ``X_before`` / ``X_after`` pairs as
    before → after, other counters as name=value; '' without counters."""
    if not counters:
        return ""
    parts = []
    for k, v in counters.items():
        if k.endswith("_before") and k[:-7] + "_after" in counters:
            parts.append(f"{k[:-7]} {v:,} → {counters[k[:-7] + '_after']:,}")
        elif not (k.endswith("_after") and k[:-6] + "_before" in counters):
            parts.append(f"{k}={v}")
    return "; " + ", ".join(parts)
