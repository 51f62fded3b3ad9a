"""Run reports: one report name per run, one shape of totals for every job, one exit-code rule.

Every job writes ``<reports_dir>/<job>/<report name>/attempt-<n>/summary.json`` (its
:meth:`JobReport.summary`, which carries its :meth:`JobReport.totals` under ``"totals"``) and
``detail.parquet`` (:meth:`JobReport.detail`), ``n`` being the attempt (the Airflow task's try number), so
a retry, a cleared task or a reprocessing backfill never overwrites what an earlier attempt did; the run's
own ``summary.json`` and ``detail.parquet`` are copies of its latest attempt's (``"attempt"`` says which).
The DAGs add up ``totals`` without knowing which job wrote a report.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, TypedDict

from tieredcore.errors import ValidationError

_UNSAFE = re.compile(r"[^A-Za-z0-9_.=+-]")

EXIT_OK = 0
EXIT_FAILED = 1  # some unit failed: a retry may succeed
EXIT_USAGE = 2  # bad input: nothing started
EXIT_DATA_LOSS = 3  # a ledger no copy of which can be read: a retry cannot help


class Totals(TypedDict):
    """What the DAGs add up over a run's reports."""

    topics: int
    ledgers: int  # units of work: ledgers, deletion records, orphan groups
    bytes: int
    failures: int
    outcomes: dict[str, int]
    namespaces: dict[str, dict[str, Any]]  # namespace -> {"ledgers", "bytes", "failures", "outcomes"[, "counters"]}
    counters: dict[str, int]  # job-specific counters (the drain's PIP-186 counters; compaction's before/after)
    data_loss: list[str]  # ledgers no copy of which can be read
    # streaming offload (PIP-76): segments written, their data-object bytes (also in ``bytes``), tails
    # held back until their rollover time (not failures); 0 for every other job
    segments: int
    segment_bytes: int
    segments_held: int


class JobReport(Protocol):
    """What a Spark job hands to the job template (spark_jobs/_jobkit.py) when it is done."""

    def totals(self) -> Totals: ...

    def summary(self) -> dict[str, Any]:
        """summary.json: the job's own fields, with ``totals``."""
        ...

    def detail(self) -> tuple[list[tuple], str]:
        """detail.parquet: rows and their Spark DDL schema."""
        ...

    def messages(self) -> list[str]:
        """Lines for the job's log after the run (what failed, what was lost); a line's first word says
        how bad it is (:func:`message_level`)."""
        ...


# first words of report messages that name a failure / something an operator should look at
ERROR_WORDS = ("ERROR", "FAILED", "DEAD-LETTERED", "DATA", "STOPPED")  # DATA: "DATA LOSS: ..."
WARNING_WORDS = ("BUSY", "CONFLICT")


def message_level(line: str) -> str:
    """ERROR, WARNING or INFO for a report message, by its first word (the reports' convention:
    ``FAILED ...``, ``DEAD-LETTERED ...``, ``DATA LOSS: ...``, ``STOPPED early: ...`` are errors,
    ``BUSY ...``, ``CONFLICT ...`` warnings: retried by the next run)."""
    word = line.split(" ", 1)[0].rstrip(":")
    if word in ERROR_WORDS:
        return "ERROR"
    return "WARNING" if word in WARNING_WORDS else "INFO"


def outcome_line(t: Totals, code: int) -> str:
    """The one-line outcome of a run (the last line of a job's log): its verdict, what it did, failures."""
    verdict = {EXIT_OK: "ok", EXIT_FAILED: "FAILED", EXIT_DATA_LOSS: "DATA LOSS"}.get(code, f"exit {code}")
    done = f"{t['topics']} topic(s), {t['ledgers']} unit(s), {t['bytes']:,} bytes"
    if t.get("segments") or t.get("segments_held"):
        done += f", {t['segments']} segment(s)"
        if t.get("segments_held"):
            done += f", {t['segments_held']} tail(s) held for their rollover"
    outcomes = ", ".join(f"{k}={v}" for k, v in sorted(t["outcomes"].items())) or "nothing to do"
    return f"outcome {verdict}: {done}; {t['failures']} failure(s); {outcomes}; exit {code}"

    def messages(self) -> list[str]:
        """Lines for the job's log after the run (what failed, what was lost)."""
        ...


def totals(**kw: Any) -> Totals:
    """A Totals with every key (defaults: zero, empty)."""
    base: dict[str, Any] = {"topics": 0, "ledgers": 0, "bytes": 0, "failures": 0, "outcomes": {}, "namespaces": {},
                            "counters": {}, "data_loss": [], "segments": 0, "segment_bytes": 0, "segments_held": 0}
    base.update(kw)
    return base  # type: ignore[return-value]


def summary_document(report: JobReport, job: str, run_id: str, seconds: float) -> dict[str, Any]:
    """summary.json of a run: the report's own fields, the run's names, and ``totals``."""
    return {**report.summary(), "job": job, "run_id": run_id, "seconds": round(seconds, 3),
            "totals": report.totals()}


def exit_code(t: Totals) -> int:
    if t["data_loss"]:
        return EXIT_DATA_LOSS
    return EXIT_FAILED if t["failures"] else EXIT_OK


def report_name(run_id: str, namespace: str | None = None) -> str:
    """A report directory name from a run id (an Airflow run_id, or a job's own): one path component of
    ``[A-Za-z0-9_.=+-]`` (``manual__2026-01-01T00:00:00+00:00`` -> ``manual__2026-01-01T00_00_00+00_00``),
    never '', '.' or '..'. Per-namespace jobs of one run get ``.<tenant>+<ns>`` ('+' never occurs in
    namespace names, so two namespaces never share a report). Idempotent."""
    rid = _UNSAFE.sub("_", str(run_id))
    if namespace:
        rid += "." + _UNSAFE.sub("_", namespace.replace("/", "+"))
    return rid.replace(".", "_") if rid.strip(".") == "" and rid else (rid or "_")


# -- attempts: every try of a run keeps its own report ----------------------------------------------

ENV_ATTEMPT = "TIERED_ATTEMPT"  # the Airflow task's try_number, given to the job by the DAG
ATTEMPT_PREFIX = "attempt-"
SUMMARY_FILE = "summary.json"
DETAIL_DIR = "detail.parquet"
_ATTEMPT_DIR = re.compile(r"^attempt-([1-9][0-9]{0,8})$")


def attempt_dir_name(attempt: int) -> str:
    return f"{ATTEMPT_PREFIX}{attempt}"


def attempts_in(run_dir: Path) -> list[int]:
    """The attempts of a run that wrote a report (``attempt-<n>/summary.json``), ascending."""
    out = []
    if run_dir.is_dir():
        for p in run_dir.iterdir():
            m = _ATTEMPT_DIR.match(p.name)
            if m and (p / SUMMARY_FILE).is_file():
                out.append(int(m.group(1)))
    return sorted(out)


def attempt_number(env: Mapping[str, str], run_dir: Path) -> int:
    """This attempt's number: ``$TIERED_ATTEMPT`` (the task's try_number) when set, else one after the
    run's last attempt (runs outside Airflow keep every attempt too). ValidationError for a value that
    is not a positive integer."""
    raw = env.get(ENV_ATTEMPT, "").strip()
    if not raw:
        return (attempts_in(run_dir) or [0])[-1] + 1
    if not raw.isdigit() or int(raw) < 1 or len(raw) > 9:
        raise ValidationError(f"{ENV_ATTEMPT}={raw!r}: the attempt (try number) must be a positive integer")
    return int(raw)
