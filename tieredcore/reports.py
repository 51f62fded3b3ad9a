"""Run reports: one report name per run, one shape of totals for every job, one exit-code rule.

Every job writes ``<reports_dir>/<job>/<report name>/attempt-<n>/summary.json`` (its
:meth:`JobReport.summary`, which carries its :meth:`JobReport.totals` under ``"totals"``) and
``detail.parquet`` (:meth:`JobReport.detail`), ``n`` being the attempt (the Airflow task's try number), so
a retry, a cleared task or a reprocessing backfill never overwrites what an earlier attempt did; the run's
own ``summary.json`` and ``detail.parquet`` are copies of its latest attempt's (``"attempt"`` says which).
The DAGs add up ``totals`` without knowing which job wrote a report.

:class:`RunReports` is the one owner of that layout: the jobs write through it, the DAGs add up totals
through it (:class:`RunTotals`, :class:`CombinedTotals`), the Airflow plugin's pages, the CLI and the
overview read through it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypedDict

from tieredcore.errors import FormatError, NotFoundError, ValidationError

_UNSAFE = re.compile(r"[^A-Za-z0-9_.=+-]")

EXIT_OK = 0
EXIT_FAILED = 1  # some unit failed: a retry may succeed
EXIT_USAGE = 2  # bad input: nothing started
EXIT_DATA_LOSS = 3  # a ledger no copy of which can be read: a retry cannot help
# every failure is a damaged copy that cannot be repaired without BookKeeper (a scrub on a workspace attached
# to a Pulsar cluster, outcome "unrepairable"): the damage stays until an operator acts; a retry cannot help
EXIT_UNREPAIRABLE = 4
UNREPAIRABLE = "unrepairable"  # tieredcore.outcomes.Outcome.UNREPAIRABLE (reports sit below outcomes)


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
ERROR_WORDS = ("ERROR", "FAILED", "DEAD-LETTERED", "DATA", "STOPPED", "DAMAGED")  # DATA: "DATA LOSS: ..."
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
    verdict = {EXIT_OK: "ok", EXIT_FAILED: "FAILED", EXIT_DATA_LOSS: "DATA LOSS",
               EXIT_UNREPAIRABLE: "DAMAGED (repair impossible without BookKeeper)"}.get(code, f"exit {code}")
    done = f"{t['topics']} topic(s), {t['ledgers']} unit(s), {t['bytes']:,} bytes"
    if t.get("segments") or t.get("segments_held"):
        done += f", {t['segments']} segment(s)"
        if t.get("segments_held"):
            done += f", {t['segments_held']} tail(s) held for their rollover"
    outcomes = ", ".join(f"{k}={v}" for k, v in sorted(t["outcomes"].items())) or "nothing to do"
    return f"outcome {verdict}: {done}; {t['failures']} failure(s); {outcomes}; exit {code}"


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
    """Data loss first; then, when every failure is an unrepairable damaged copy, EXIT_UNREPAIRABLE (any
    other failure may go away on a retry: EXIT_FAILED)."""
    if t["data_loss"]:
        return EXIT_DATA_LOSS
    if not t["failures"]:
        return EXIT_OK
    return EXIT_UNREPAIRABLE if t["outcomes"].get(UNREPAIRABLE, 0) == t["failures"] else EXIT_FAILED


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


# -- the layout: one owner of every report path ----------------------------------------------------


def _component(name: str, what: str) -> str:
    """``name`` as one path component (job and report names are never paths)."""
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise ValidationError(f"{what} {name!r}: not a report {what} (one path component)")
    return name


def _replace_file(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


class RunReports:
    """The reports location (``reports_dir``) and its layout:
    ``<reports_dir>/<job>/<report name>/attempt-<n>/{summary.json,detail.parquet}``, plus the run's own
    ``<report name>/{summary.json,detail.parquet}``: copies of its latest attempt's.

    An empty ``reports_dir`` (none configured) holds no reports: listings are empty, paths are refused."""

    def __init__(self, reports_dir: str | Path) -> None:
        self.root: Path | None = Path(reports_dir) if isinstance(reports_dir, Path) or reports_dir else None

    def __repr__(self) -> str:
        return f"RunReports({str(self.root) if self.root is not None else ''!r})"

    # paths

    def job_dir(self, job: str) -> Path:
        if self.root is None:
            raise ValidationError("no reports location: set reports_dir in the configuration")
        return self.root / _component(job, "job")

    def run_dir(self, job: str, run_id: str) -> Path:
        return self.job_dir(job) / _component(run_id, "run")

    def attempt_dir(self, job: str, run_id: str, attempt: int) -> Path:
        return self.run_dir(job, run_id) / attempt_dir_name(attempt)

    def _dir(self, job: str, run_id: str, attempt: int | None) -> Path:
        return self.run_dir(job, run_id) if attempt is None else self.attempt_dir(job, run_id, attempt)

    def summary_path(self, job: str, run_id: str, attempt: int | None = None) -> Path:
        """An attempt's ``summary.json``, or (``attempt`` None) the run's: its latest attempt's copy."""
        return self._dir(job, run_id, attempt) / SUMMARY_FILE

    def detail_path(self, job: str, run_id: str, attempt: int | None = None) -> Path:
        return self._dir(job, run_id, attempt) / DETAIL_DIR

    def check_writable(self, job: str) -> Path:
        """Make the job's reports directory and prove a file can be written there, before any work: a
        run that deletes what is due and only then finds it cannot report would be retried with no
        trace of what it did. ValidationError (bad input) naming the location otherwise."""
        d = self.job_dir(job)
        probe = d / f".write-check-{os.getpid()}"
        try:
            d.mkdir(parents=True, exist_ok=True)
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            raise ValidationError(f"reports location {self.root} is not writable ({d}: "
                                  f"{e.strerror or type(e).__name__}): nothing was started") from None
        return d

    # listings

    def jobs(self) -> list[str]:
        """Jobs with a directory of reports, by name."""
        return _subdirs(self.root) if self.root is not None else []

    def runs(self, job: str) -> list[str]:
        """The job's report names, by name. NotFoundError when the job has no reports directory."""
        d = self.job_dir(job)
        if not d.is_dir():
            raise NotFoundError(f"no reports of job {job}")
        return _subdirs(d)

    def has_run(self, job: str, run_id: str) -> bool:
        return self.run_dir(job, run_id).is_dir()

    def attempts(self, job: str, run_id: str) -> list[int]:
        """The run's attempts that wrote a report, ascending."""
        return attempts_in(self.run_dir(job, run_id))

    def written(self, job: str, run_id: str) -> float | None:
        """When the run's own summary was last written (file time, seconds); None without one."""
        p = self.summary_path(job, run_id)
        try:
            return p.stat().st_mtime if p.is_file() else None
        except OSError:
            return None

    def newest_runs(self, job: str) -> list[str]:
        """The job's runs that have a summary, the most recently written first."""
        written = [(w, r) for r in self.runs(job) if (w := self.written(job, r)) is not None]
        return [r for _, r in sorted(written, key=lambda x: x[0], reverse=True)]

    # reading

    def read_summary(self, job: str, run_id: str, attempt: int | None = None) -> dict[str, Any]:
        """A ``summary.json`` (the run's, or one attempt's): NotFoundError when it was never written,
        FormatError when it cannot be read or is not a JSON object."""
        path = self.summary_path(job, run_id, attempt)
        try:
            doc = json.loads(path.read_text())
        except FileNotFoundError:
            raise NotFoundError(f"no report {path}") from None
        except (OSError, ValueError) as e:
            raise FormatError(f"unreadable report {path}: {e}") from None
        if not isinstance(doc, dict):
            raise FormatError(f"unreadable report {path}: not a JSON object")
        return doc

    def totals(self, job: str, run_ids: Sequence[str]) -> RunTotals:
        """The ``totals`` of the job's runs ``run_ids`` added up; a run without a readable report (its
        job failed before writing one) counts in ``failed_jobs``."""
        out = RunTotals(job, jobs=len(run_ids))
        for rid in run_ids:
            try:
                t = self.read_summary(job, rid)["totals"]
                if not isinstance(t, Mapping):
                    raise FormatError(f"report {job}/{rid}: totals are not a JSON object")
            except (KeyError, ValidationError, NotFoundError, FormatError):
                out.failed_jobs.append(rid)
                continue
            out.add(t, str(self.summary_path(job, rid)))
        return out

    # writing (the jobs: spark_jobs/_jobkit.py)

    def attempt_number(self, job: str, run_id: str, env: Mapping[str, str]) -> int:
        """This attempt's number (:func:`attempt_number`); ValidationError for a bad ``$TIERED_ATTEMPT``."""
        return attempt_number(env, self.run_dir(job, run_id))

    def publish(self, job: str, run_id: str, attempt: int, summary_text: str) -> None:
        """The attempt's ``summary.json`` (its ``detail.parquet`` already written), then the same two as
        the run's own: the attempt becomes the run's latest. The summary goes last, so a reader of the
        run's summary finds the detail beside it."""
        run_dir, out = self.run_dir(job, run_id), self.attempt_dir(job, run_id, attempt)
        _replace_file(out / SUMMARY_FILE, summary_text)
        tmp_detail = run_dir / f".{DETAIL_DIR}.tmp"
        shutil.rmtree(tmp_detail, ignore_errors=True)
        shutil.copytree(out / DETAIL_DIR, tmp_detail)
        shutil.rmtree(run_dir / DETAIL_DIR, ignore_errors=True)
        tmp_detail.rename(run_dir / DETAIL_DIR)
        _replace_file(run_dir / SUMMARY_FILE, summary_text)


def _subdirs(d: Path) -> list[str]:
    """Names of the directories in ``d`` (not hidden ones: temporary copies), sorted."""
    if not d.is_dir():
        return []
    return sorted(c.name for c in d.iterdir() if c.is_dir() and not c.name.startswith("."))


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

    def as_dict(self) -> dict[str, Any]:
        ps = self.parts
        return {
            "job": self.job, "jobs": sum(p.jobs for p in ps), "topics": sum(p.topics for p in ps),
            "ledgers": sum(p.ledgers for p in ps), "bytes": sum(p.bytes for p in ps), "failures": self.failures,
            "failed_jobs": [f"{p.job}/{rid}" for p in ps for rid in p.failed_jobs],
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
