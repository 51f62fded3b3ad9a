"""What a deletion drain reports (tieredcore.lifecycle.drain): a row per record, the run's counts and
totals, its log lines; the same document for the CLI, the Spark job and the DAG."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from tieredcore.names import namespace_of
from tieredcore.outcomes import Outcome
from tieredcore.reports import Totals, totals

__all__ = ["COUNTERS", "DETAIL_SCHEMA", "OUTCOMES", "DrainReport", "DrainRow"]

OUTCOMES = (
    Outcome.DELETED, Outcome.ALREADY_DELETED, Outcome.STILL_IN_USE, Outcome.UNREADABLE_TOPIC,
    Outcome.REFUSED_MISMATCH, Outcome.REFUSED_FOREIGN, Outcome.MALFORMED,
    Outcome.RETRYING, Outcome.DEAD_LETTERED, Outcome.LOST_RACE, Outcome.WOULD_DELETE, Outcome.ABORTED,
)

# the PIP-186 counters a drain adds to the log's statistics
COUNTERS = ("deleted_hot", "deleted_offloaded", "delete_failures_hot", "delete_failures_offloaded", "acknowledged")
# one row per record (the run report's detail.parquet; Spark DDL)
DETAIL_SCHEMA = "id string, topic string, ledger long, type string, reason string, outcome string, error string"


# -- report ---------------------------------------------------------------------------------------


@dataclass
class DrainRow:
    id: str
    topic: str
    ledger: int
    type: str
    reason: str
    outcome: str
    error: str = ""


@dataclass
class DrainReport:
    as_of_ms: int
    dry_run: bool = False
    entries: int = 0  # records looked at
    # per outcome
    deleted: int = 0
    already_deleted: int = 0
    still_in_use: int = 0
    unreadable_topic: int = 0  # the topic's record cannot be read: nothing deleted, the record kept
    refused_mismatch: int = 0
    refused_foreign: int = 0
    malformed: int = 0
    retrying: int = 0
    dead_lettered: int = 0
    lost_race: int = 0
    would_delete: int = 0
    referenced_again: int = 0  # orphan records whose uuid the re-read before deleting found referenced (in still_in_use)
    # not attempted, the record left as it is (no attempt counted): the object store kept failing (the run's
    # failure budget spent) or was declared dead (tieredcore.cold.liveness); the run exits non-zero
    aborted: int = 0
    # PIP-186 counters this run added to the log (only changes that landed)
    deleted_hot: int = 0
    deleted_offloaded: int = 0
    delete_failures_hot: int = 0
    delete_failures_offloaded: int = 0
    acknowledged: int = 0
    rows: list[DrainRow] = field(default_factory=list)
    # a distributed drain (spark_jobs/deletion_drain.py): records due when it started, its units, and
    # the units that did not run (their records stay due: the next run retries them)
    due: int = 0
    tasks: int = 0
    task_errors: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in OUTCOMES}

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def dead(self) -> int:
        """Records that need an operator (dead-lettered or malformed); none in a dry run, which changes
        nothing."""
        return 0 if self.dry_run else self.dead_lettered + self.malformed

    def failed(self) -> int:
        """Records an operator must look at: dead ones, and those kept because their topic's record cannot
        be read (a dry run too: the record is unreadable whatever the run changes)."""
        return self.dead() + self.unreadable_topic + self.aborted

    # -- tieredcore.reports.JobReport ---------------------------------------------------------------

    def totals(self) -> Totals:
        """ledgers = records looked at; failures = records an operator must look at plus units that did
        not run (a record retrying within its attempt limit is the protocol working, not a failure)."""
        namespaces: dict[str, dict[str, Any]] = {}
        for r in self.rows:
            ns = namespaces.setdefault(namespace_of(r.topic), {"ledgers": 0, "bytes": 0, "failures": 0,
                                                                "outcomes": {}})
            ns["ledgers"] += 1
            ns["outcomes"][r.outcome] = ns["outcomes"].get(r.outcome, 0) + 1
            ns["failures"] += int((not self.dry_run and r.outcome in (Outcome.DEAD_LETTERED, Outcome.MALFORMED))
                                  or r.outcome in (Outcome.UNREADABLE_TOPIC, Outcome.ABORTED))
        return totals(
            topics=len({r.topic for r in self.rows if r.topic}), ledgers=self.entries,
            failures=self.failed() + len(self.task_errors),
            outcomes={k: v for k, v in self.counts().items() if v}, namespaces=namespaces,
            counters={k: getattr(self, k) for k in COUNTERS},
        )

    def summary(self) -> dict[str, Any]:
        return {k: v for k, v in self.as_dict().items() if k != "rows"}

    def detail(self) -> tuple[list[tuple], str]:
        return [(r.id, r.topic, r.ledger, r.type, r.reason, r.outcome, r.error) for r in self.rows], DETAIL_SCHEMA

    def messages(self) -> list[str]:
        out = [f"FAILED task {e}" for e in self.task_errors]
        out += [f"DEAD-LETTERED {r.id} ({r.type} ledger {r.ledger} of {r.topic}): {r.error}"
                for r in self.rows if r.outcome in (Outcome.DEAD_LETTERED, Outcome.MALFORMED)]
        out += [f"KEPT {r.id} ({r.type} ledger {r.ledger} of {r.topic}): {r.error}"
                for r in self.rows if r.outcome == Outcome.UNREADABLE_TOPIC]
        aborted = [r for r in self.rows if r.outcome == Outcome.ABORTED]
        if aborted:  # one line: the same reason for every one
            out.append(f"ABORTED {len(aborted)} record(s), kept for the next run: {aborted[-1].error}")
        return out

    def merge(self, other: DrainReport) -> DrainReport:
        """Sum of two reports (e.g. of several Spark tasks); rows concatenated."""
        out = DrainReport(self.as_of_ms, self.dry_run and other.dry_run)
        for f in DrainReport.__dataclass_fields__:
            if f in ("as_of_ms", "dry_run"):
                continue
            setattr(out, f, getattr(self, f) + getattr(other, f))
        return out
