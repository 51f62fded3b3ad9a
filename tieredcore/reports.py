"""Run reports: where every run's reports are, one shape of totals for every job, one exit-code rule.

The layout (:class:`RunReports` is its one owner: the jobs write through it, the DAGs' summary task, the
Airflow plugin's pages, the CLI and the overview read through it)::

    <reports_dir>/<group>/<run key>/<part>/attempt-<n>/{summary.json, detail.parquet}
    <reports_dir>/<group>/<run key>/<part>/{summary.json, detail.parquet}   (its latest attempt's copy)
    <reports_dir>/<group>/<run key>/run.json                                 (a DAG run's summary task)
    <reports_dir>/<group>/<run key>/run_id                                   (the unaltered run id)

- group: the DAG id inside Airflow; the Spark job's name outside (CLI, spark-submit by hand).
- run key: :func:`report_name` of the run id (one safe path component; distinct run ids get distinct
  keys). The unaltered run id is kept beside (``run_id``) and in every summary.json / run.json: a key
  that already holds another run id's reports is refused (:meth:`RunReports.claim`), never shared.
- part: inside Airflow ``<task_id>`` or ``<task_id>.<map_index>`` (a mapped task's shard); outside, the
  job's name. Where a job writes is :func:`report_place` (from the environment the DAG's operator sets).
- n: the attempt, the Airflow task's try number ($TIERED_ATTEMPT): a retry, a cleared task or a
  reprocessing backfill never overwrites what an earlier attempt did.

Reports of the layout before DAG runs had their own (``<job>/<run>/attempt-<n>``, ``<job>/<run>/summary.json``)
stay readable: such a run is a run of group ``<job>`` with one part named ``<job>`` (what a run outside
Airflow is today). Their run ids are their directory names (the names they had).

Every job's summary.json carries its :meth:`JobReport.totals` under ``"totals"``; the DAGs add them up
(tieredcore.run_totals) without knowing which job wrote a report."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypedDict

from tieredcore.errors import FormatError, NotFoundError, ValidationError

# the totals' own module; re-exported: the jobs, DAGs and CLI know them as tieredcore.reports names
from tieredcore.run_totals import NOT_PLANNED as NOT_PLANNED
from tieredcore.run_totals import SEGMENT_KEYS as SEGMENT_KEYS
from tieredcore.run_totals import CombinedTotals as CombinedTotals
from tieredcore.run_totals import NamespaceTotals as NamespaceTotals
from tieredcore.run_totals import RunTotals, combine_totals
from tieredcore.run_totals import counters_text as counters_text
from tieredcore.run_totals import damage_text as damage_text
from tieredcore.run_totals import segments_text as segments_text
from tieredcore.run_totals import verdict_message as verdict_message

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


def outcome_word(code: int) -> str:
    """A part's outcome in run.json (by its exit code)."""
    return {EXIT_OK: "ok", EXIT_FAILED: "failed", EXIT_DATA_LOSS: "data loss",
            EXIT_UNREPAIRABLE: "damaged"}.get(code, f"exit {code}")


# -- run keys: one safe path component per run id, distinct for distinct ids -------------------------

_KEY_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.+-")
KEY_MAX = 200  # a path component holds 255 bytes; Airflow's run ids hold up to 250 characters
_HASHED = "=~"  # marks a key shortened to KEY_MAX (never produced by the escapes, which are =XX)


def report_name(run_id: str) -> str:
    """The run key of a run id (an Airflow run_id unaltered, or a run's own name outside Airflow): one
    path component of ``[A-Za-z0-9_.+=~-]``, never '', '.', '..' or starting with '.'. Every other character is written as
    ``=XX`` per UTF-8 byte (``=`` itself too), so two distinct run ids never share a key
    (``manual__2026-01-01T00:00:00+00:00`` -> ``manual__2026-01-01T00=3A00=3A00+00=3A00``); a key longer
    than KEY_MAX keeps its start and a SHA-256 of the whole id (and :meth:`RunReports.claim` refuses the
    one-in-2^64 clash). ValidationError for an empty run id."""
    if not isinstance(run_id, str) or not run_id:
        raise ValidationError(f"run id {run_id!r}: a run id is a non-empty string")
    key = "".join(c if c in _KEY_CHARS else "".join(f"={b:02X}" for b in c.encode("utf-8", "surrogatepass"))
                  for c in run_id)
    if key.strip(".") == "":  # '.', '..': not a directory name of its own
        key = key.replace(".", "=2E")
    elif key.startswith("."):  # a hidden name ('.0'): its leading dot escaped ('=' never stands for itself)
        key = "=2E" + key[1:]
    if len(key) > KEY_MAX:
        digest = hashlib.sha256(run_id.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        key = key[:KEY_MAX - len(_HASHED) - 16] + _HASHED + digest
    return key


def default_run_id(as_of_ms: int) -> str:
    """The run id of a run outside Airflow without --run-id: its logical time (``20260101T000000Z``)."""
    return dt.datetime.fromtimestamp(as_of_ms / 1000, dt.UTC).strftime("%Y%m%dT%H%M%SZ")


# -- where a job writes: its place in a DAG run, or a run of its own ----------------------------------

ENV_DAG_ID = "TIERED_DAG_ID"
ENV_DAG_RUN_ID = "TIERED_DAG_RUN_ID"  # unaltered
ENV_TASK_ID = "TIERED_TASK_ID"
ENV_MAP_INDEX = "TIERED_MAP_INDEX"  # -1 (or empty) for a task that is not mapped
ENV_ATTEMPT = "TIERED_ATTEMPT"  # the Airflow task's try_number
PLACE_ENV = (ENV_DAG_ID, ENV_DAG_RUN_ID, ENV_TASK_ID, ENV_MAP_INDEX, ENV_ATTEMPT)
_MAP_INDEX = re.compile(r"^(-1|0|[1-9][0-9]{0,8})$")


def part_name(task_id: str, map_index: int | None) -> str:
    """A DAG run's part: ``<task_id>``, or ``<task_id>.<map_index>`` for one of a mapped task's instances."""
    return task_id if map_index is None or map_index < 0 else f"{task_id}.{map_index}"


@dataclass(frozen=True)
class ReportPlace:
    """Where a run's report goes: ``group`` / run key of ``run_id`` / ``part``, and what summary.json
    records about it. ``dag_id`` None: a run outside Airflow (group = part = the job)."""

    group: str
    run_id: str  # unaltered
    part: str
    dag_id: str | None = None
    task_id: str | None = None
    map_index: int | None = None  # -1: a task that is not mapped (Airflow's own convention)

    def __post_init__(self) -> None:
        _component(self.group, "group")
        _part_component(self.part)
        report_name(self.run_id)

    @property
    def run_key(self) -> str:
        return report_name(self.run_id)

    def fields(self, attempt: int) -> dict[str, Any]:
        """What summary.json says of its place (the contract's names; try_number: the Airflow try)."""
        return {"group": self.group, "run_key": self.run_key, "part": self.part, "dag_id": self.dag_id,
                "dag_run_id": self.run_id if self.dag_id else None, "task_id": self.task_id,
                "map_index": self.map_index, "try_number": attempt if self.dag_id else None}


def report_place(env: Mapping[str, str], job: str, run_id: str) -> ReportPlace:
    """Where ``job`` writes its report: inside Airflow (``$TIERED_DAG_ID`` set) the DAG run's part the
    operator named (TIERED_DAG_RUN_ID unaltered, TIERED_TASK_ID, TIERED_MAP_INDEX); outside, a run of its
    own, ``run_id`` (--run-id, or the logical time), in group and part ``job``. ValidationError (bad
    input: nothing starts) for an incomplete or malformed environment."""
    dag_id = env.get(ENV_DAG_ID, "").strip()
    if not dag_id:
        return ReportPlace(group=job, run_id=run_id, part=job)
    dag_run_id = env.get(ENV_DAG_RUN_ID, "")
    task_id = env.get(ENV_TASK_ID, "").strip()
    raw_index = env.get(ENV_MAP_INDEX, "").strip() or "-1"
    for name, value in ((ENV_DAG_RUN_ID, dag_run_id), (ENV_TASK_ID, task_id)):
        if not value:
            raise ValidationError(f"{ENV_DAG_ID}={dag_id!r} but {name} is not set: the DAG's operator sets "
                                  f"{', '.join(PLACE_ENV)} together")
    if not _MAP_INDEX.match(raw_index):
        raise ValidationError(f"{ENV_MAP_INDEX}={raw_index!r}: the map index must be an integer >= -1")
    try:
        return ReportPlace(group=dag_id, run_id=dag_run_id, part=part_name(task_id, int(raw_index)),
                           dag_id=dag_id, task_id=task_id, map_index=int(raw_index))
    except ValidationError as e:
        raise ValidationError(f"the DAG's report environment: {e}") from None


# -- attempts: every try of a run keeps its own report ----------------------------------------------

ATTEMPT_PREFIX = "attempt-"
SUMMARY_FILE = "summary.json"
DETAIL_DIR = "detail.parquet"
RUN_FILE = "run.json"
RUN_ID_FILE = "run_id"
_ATTEMPT_DIR = re.compile(r"^attempt-([1-9][0-9]{0,8})$")


def attempt_dir_name(attempt: int) -> str:
    return f"{ATTEMPT_PREFIX}{attempt}"


def attempts_in(part_dir: Path) -> list[int]:
    """The attempts of a part that wrote a report (``attempt-<n>/summary.json``), ascending."""
    out = []
    if part_dir.is_dir():
        for p in part_dir.iterdir():
            m = _ATTEMPT_DIR.match(p.name)
            if m and (p / SUMMARY_FILE).is_file():
                out.append(int(m.group(1)))
    return sorted(out)


def attempt_number(env: Mapping[str, str], part_dir: Path) -> int:
    """This attempt's number: ``$TIERED_ATTEMPT`` (the task's try_number) when set, else one after the
    part's last attempt (runs outside Airflow keep every attempt too). ValidationError for a value that
    is not a positive integer."""
    raw = env.get(ENV_ATTEMPT, "").strip()
    if not raw:
        return (attempts_in(part_dir) or [0])[-1] + 1
    if not raw.isdigit() or int(raw) < 1 or len(raw) > 9:
        raise ValidationError(f"{ENV_ATTEMPT}={raw!r}: the attempt (try number) must be a positive integer")
    return int(raw)


# -- the layout: one owner of every report path ----------------------------------------------------


def _component(name: str, what: str) -> str:
    """``name`` as one path component (groups, run keys and parts are never paths)."""
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\0" in name \
            or name.startswith("."):
        raise ValidationError(f"{what} {name!r}: not a report {what} (one path component)")
    return name


def _part_component(name: str) -> str:
    """A part: one path component that is not an attempt's or a file's name in a run directory."""
    if _component(name, "part") in (SUMMARY_FILE, DETAIL_DIR, RUN_FILE, RUN_ID_FILE) or _ATTEMPT_DIR.match(name):
        raise ValidationError(f"part {name!r}: not a report part (the name of a file of the layout)")
    return name


def _replace_file(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _read_object(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise NotFoundError(f"no report {path}") from None
    except (OSError, ValueError) as e:
        raise FormatError(f"unreadable report {path}: {e}") from None
    if not isinstance(doc, dict):
        raise FormatError(f"unreadable report {path}: not a JSON object")
    return doc


def _id_bytes(run_id: str) -> bytes:
    return run_id.encode("utf-8", "surrogatepass")


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


class RunReports:
    """The reports location (``reports_dir``) and its layout (the module's docstring). Names given to
    it are groups, run keys (:func:`report_name`) and parts as they appear on disk; the writers give
    a :class:`ReportPlace` (unaltered run id).

    An empty ``reports_dir`` (none configured) holds no reports: listings are empty, paths are refused."""

    def __init__(self, reports_dir: str | Path) -> None:
        self.root: Path | None = Path(reports_dir) if isinstance(reports_dir, Path) or reports_dir else None

    def __repr__(self) -> str:
        return f"RunReports({str(self.root) if self.root is not None else ''!r})"

    # paths

    def group_dir(self, group: str) -> Path:
        if self.root is None:
            raise ValidationError("no reports location: set reports_dir in the configuration")
        return self.root / _component(group, "group")

    def run_dir(self, group: str, run: str) -> Path:
        return self.group_dir(group) / _component(run, "run")

    def run_json_path(self, group: str, run: str) -> Path:
        return self.run_dir(group, run) / RUN_FILE

    def part_dir(self, group: str, run: str, part: str) -> Path:
        """The part's directory; for a run of the layout before DAG runs (its files in the run's own
        directory) its one part, named as the group, is the run's directory."""
        run_dir = self.run_dir(group, run)
        own = run_dir / _part_component(part)
        return run_dir if part == group and not own.is_dir() and self._legacy(run_dir) else own

    def attempt_dir(self, group: str, run: str, part: str, attempt: int) -> Path:
        return self.part_dir(group, run, part) / attempt_dir_name(attempt)

    def _dir(self, group: str, run: str, part: str, attempt: int | None) -> Path:
        return self.part_dir(group, run, part) if attempt is None else self.attempt_dir(group, run, part, attempt)

    def summary_path(self, group: str, run: str, part: str, attempt: int | None = None) -> Path:
        """An attempt's ``summary.json``, or (``attempt`` None) the part's: its latest attempt's copy."""
        return self._dir(group, run, part, attempt) / SUMMARY_FILE

    def detail_path(self, group: str, run: str, part: str, attempt: int | None = None) -> Path:
        return self._dir(group, run, part, attempt) / DETAIL_DIR

    @staticmethod
    def _legacy(run_dir: Path) -> bool:
        """A run directory of the layout before DAG runs: a summary or attempts of its own, no run id."""
        if (run_dir / RUN_ID_FILE).exists():
            return False
        return (run_dir / SUMMARY_FILE).is_file() or bool(attempts_in(run_dir))

    # listings

    def groups(self) -> list[str]:
        """Groups with a directory of reports (DAG ids, job names), by name."""
        return _subdirs(self.root) if self.root is not None else []

    def runs(self, group: str) -> list[str]:
        """The group's run keys, the most recently written first. NotFoundError without such a group."""
        d = self.group_dir(group)
        if not d.is_dir():
            raise NotFoundError(f"no reports of {group}")
        found = [(self.written(group, r) or _mtime(d / r) or 0.0, r) for r in _subdirs(d)]
        return [r for _, r in sorted(found, reverse=True)]

    def has_run(self, group: str, run: str) -> bool:
        return self.run_dir(group, run).is_dir()

    def parts(self, group: str, run: str) -> list[str]:
        """The run's parts (those with a directory), by name. NotFoundError without such a run."""
        run_dir = self.run_dir(group, run)
        if not run_dir.is_dir():
            raise NotFoundError(f"no run {run} of {group}")
        names = [n for n in _subdirs(run_dir) if not _ATTEMPT_DIR.match(n) and n != DETAIL_DIR]
        if group not in names and self._legacy(run_dir):
            names.append(group)
        return sorted(names)

    def attempts(self, group: str, run: str, part: str) -> list[int]:
        """The part's attempts that wrote a report, ascending."""
        return attempts_in(self.part_dir(group, run, part))

    def written(self, group: str, run: str) -> float | None:
        """When the run's record or a part's summary was last written (file time, seconds); None
        without any."""
        times = [_mtime(self.run_json_path(group, run))]
        run_dir = self.run_dir(group, run)
        if run_dir.is_dir():
            times += [_mtime(self.summary_path(group, run, p)) for p in self.parts(group, run)]
        return max((t for t in times if t is not None), default=None)

    def run_id(self, group: str, run: str) -> str:
        """The run's unaltered id (kept beside its reports); a run of the old layout: its key."""
        try:
            return (self.run_dir(group, run) / RUN_ID_FILE).read_bytes().decode("utf-8", "surrogatepass")
        except FileNotFoundError:
            return run
        except OSError as e:
            raise FormatError(f"unreadable run id of {group}/{run}: {e}") from None

    # reading

    def read_summary(self, group: str, run: str, part: str, attempt: int | None = None) -> dict[str, Any]:
        """A part's ``summary.json`` (its latest, or one attempt's): NotFoundError when it was never
        written, FormatError when it cannot be read or is not a JSON object."""
        return _read_object(self.summary_path(group, run, part, attempt))

    def read_run(self, group: str, run: str) -> dict[str, Any]:
        """The run's record: run.json as the DAG's summary task wrote it, else one made from its parts
        (runs outside Airflow, DAG runs whose summary did not run; ``"synthesized": true``).
        NotFoundError without such a run, FormatError for an unreadable run.json."""
        path = self.run_json_path(group, run)
        if path.is_file():
            return _read_object(path)
        found: dict[str, dict[str, Any]] = {}
        for part in self.parts(group, run):
            try:
                found[part] = self.read_summary(group, run, part)
            except (NotFoundError, FormatError):
                continue
        first = next(iter(found.values()), {})
        doc = run_record(self, group, self.run_id(group, run), {}, dag_id=first.get("dag_id"),
                         as_of_ms=first.get("as_of_ms"), found=found, run_key=run)
        return {**doc, "synthesized": True}

    # writing (the jobs: spark_jobs/_jobkit.py; the DAGs' summary task)

    def claim(self, group: str, run_id: str) -> Path:
        """The run directory of ``run_id`` in ``group``, made and marked with the unaltered id. A key
        that already holds another run id's reports (a clash of shortened keys) is refused: two runs'
        reports are never mixed. ValidationError naming both ids."""
        key = report_name(run_id)
        d = self.run_dir(group, key)
        d.mkdir(parents=True, exist_ok=True)
        marker = d / RUN_ID_FILE
        if not marker.exists():
            tmp = d / f".{RUN_ID_FILE}.{os.getpid()}.tmp"
            tmp.write_bytes(_id_bytes(run_id))  # bytes: a text file would turn '\r' into '\n'
            try:
                os.link(tmp, marker)  # atomic: the first writer's id wins
            except FileExistsError:
                pass
            finally:
                tmp.unlink(missing_ok=True)
        held = marker.read_bytes().decode("utf-8", "surrogatepass")
        if held != run_id:
            raise ValidationError(f"reports of run {run_id!r}: its key {key!r} in {group!r} already holds the "
                                  f"reports of run {held!r}; nothing was written")
        return d

    def check_writable(self, place: ReportPlace) -> Path:
        """Claim the run's directory and prove a file can be written in the part's, before any work: a
        run that deletes what is due and only then finds it cannot report would be retried with no
        trace of what it did. ValidationError (bad input) naming the location otherwise."""
        try:
            self.claim(place.group, place.run_id)
            d = self.part_dir(place.group, place.run_key, place.part)
            probe = d / f".write-check-{os.getpid()}"
            d.mkdir(parents=True, exist_ok=True)
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            raise ValidationError(f"reports location {self.root} is not writable ({e.filename or self.root}: "
                                  f"{e.strerror or type(e).__name__}): nothing was started") from None
        return d

    def attempt_number(self, place: ReportPlace, env: Mapping[str, str]) -> int:
        """This attempt's number (:func:`attempt_number`); ValidationError for a bad ``$TIERED_ATTEMPT``."""
        return attempt_number(env, self.part_dir(place.group, place.run_key, place.part))

    def publish(self, place: ReportPlace, attempt: int, summary_text: str) -> None:
        """The attempt's ``summary.json`` (its ``detail.parquet`` already written), then the same two as
        the part's own: the attempt becomes the part's latest. The summary goes last, so a reader of the
        part's summary finds the detail beside it."""
        self.claim(place.group, place.run_id)
        part_dir = self.part_dir(place.group, place.run_key, place.part)
        out = part_dir / attempt_dir_name(attempt)
        _replace_file(out / SUMMARY_FILE, summary_text)
        tmp_detail = part_dir / f".{DETAIL_DIR}.tmp"
        shutil.rmtree(tmp_detail, ignore_errors=True)
        shutil.copytree(out / DETAIL_DIR, tmp_detail)
        shutil.rmtree(part_dir / DETAIL_DIR, ignore_errors=True)
        tmp_detail.rename(part_dir / DETAIL_DIR)
        _replace_file(part_dir / SUMMARY_FILE, summary_text)

    def write_run(self, group: str, record: Mapping[str, Any]) -> Path:
        """run.json of a DAG run (:func:`run_record`), replacing the one an earlier try wrote."""
        d = self.claim(group, str(record["dag_run_id"]))
        _replace_file(d / RUN_FILE, json.dumps(record, indent=2, sort_keys=True, default=str))
        return d / RUN_FILE


def _subdirs(d: Path) -> list[str]:
    """Names of the directories in ``d`` (not hidden ones: temporary copies), sorted."""
    if not d.is_dir():
        return []
    return sorted(c.name for c in d.iterdir() if c.is_dir() and not c.name.startswith("."))


# -- a DAG run's record: run.json ---------------------------------------------------------------------


@dataclass(frozen=True)
class PlannedPart:
    """A part the plan asked for: one Spark task (instance) and the namespaces it was given."""

    part: str
    task_id: str
    map_index: int  # -1: not mapped
    job: str
    namespaces: tuple[str, ...] = ()


def _namespaces_of(args: Sequence[Any]) -> tuple[str, ...]:
    args = [str(a) for a in args]
    return tuple(args[i + 1] for i, a in enumerate(args[:-1]) if a == "--namespace")


def planned_parts(task_id: str, job: str, planned: Any) -> list[PlannedPart] | None:
    """The parts a plan XCom asks of the Spark task ``task_id``: one per argument list of a mapped task
    (a list of lists: per namespace or per shard), one for a single task's argument list, none for an
    empty plan (nothing due: the task is skipped); None when there is no plan (it failed)."""
    if planned is None:
        return None
    if not planned:
        return []
    if isinstance(planned[0], list | tuple):
        return [PlannedPart(part_name(task_id, i), task_id, i, job, _namespaces_of(a)) for i, a in enumerate(planned)]
    return [PlannedPart(task_id, task_id, -1, job, _namespaces_of(planned))]


def nothing_due_entries(raw: Any) -> list[dict[str, str]]:
    """The plan's "nothing due" XCom as ``[{"namespace", "reason"}]`` (plain strings: reason "nothing due")."""
    out = []
    for item in raw or []:
        if isinstance(item, Mapping):
            out.append({"namespace": str(item.get("namespace", "")), "reason": str(item.get("reason") or "nothing due")})
        else:
            out.append({"namespace": str(item), "reason": "nothing due"})
    return out


def _part_entry(part: str, job: str, s: Mapping[str, Any] | None, planned: PlannedPart | None) -> dict[str, Any]:
    if s is None:
        return {"part": part, "task_id": planned.task_id if planned else None,
                "map_index": planned.map_index if planned else None, "job": job, "attempt": None,
                "namespaces": list(planned.namespaces) if planned else [], "outcome": "missing", "failed": True}
    code = exit_code(totals(**s["totals"]))
    namespaces = s.get("planned_namespaces") or (list(planned.namespaces) if planned
                                                 else sorted(s["totals"].get("namespaces") or {}))
    return {"part": part, "task_id": s.get("task_id", planned.task_id if planned else None),
            "map_index": s.get("map_index", planned.map_index if planned else None), "job": job,
            "attempt": s.get("attempt"), "namespaces": list(namespaces), "outcome": outcome_word(code),
            "failed": code != EXIT_OK}


def run_record(reports: RunReports, group: str, run_id: str, planned: Mapping[str, list[PlannedPart] | None], *,
               dag_id: str | None = None, logical_date: str | None = None, as_of: str | None = None,
               as_of_ms: int | None = None, nothing_due: Any = (), found: Mapping[str, Mapping[str, Any]] | None = None,
               written_ms: int | None = None, run_key: str | None = None) -> dict[str, Any]:
    """run.json of a run: every part on disk read (``found``: already read), added up per job; a part
    ``planned`` (per job; None: the job was never planned, its plan failed) that wrote no readable
    report is missing and fails the run; parts on disk the plan did not name are added too. ``totals``
    are the jobs' combined totals (with ``data_loss``), ``missing_parts`` and ``nothing_due`` (the plan's
    reasons) as the contract names them. ``run_key``: where the run is when it is not the key of
    ``run_id`` (a run of the layout before, named as it was)."""
    key = run_key or report_name(run_id)
    if found is None:
        found = {}
        parts = reports.parts(group, key) if reports.has_run(group, key) else []
        for part in parts:
            try:
                found[part] = reports.read_summary(group, key, part)
            except (NotFoundError, FormatError):
                continue
    found = {p: s for p, s in found.items() if isinstance(s.get("totals"), Mapping)}
    per_job: dict[str, RunTotals] = {}
    entries: list[dict[str, Any]] = []
    missing: list[str] = []
    named: set[str] = set()
    for job, pp in planned.items():
        if pp is None:
            per_job[job] = RunTotals.not_run(job)
            continue
        t = per_job[job] = RunTotals(job, jobs=len(pp))
        for p in pp:
            named.add(p.part)
            s = found.get(p.part)
            entries.append(_part_entry(p.part, job, s, p))
            if s is None:
                t.failed_jobs.append(p.part)
                missing.append(p.part)
            else:
                t.add(s["totals"], str(reports.summary_path(group, key, p.part)))
    for part, s in sorted(found.items()):
        if part not in named:
            job = str(s.get("job") or part)
            t = per_job.setdefault(job, RunTotals(job))
            t.jobs += 1
            t.add(s["totals"], str(reports.summary_path(group, key, part)))
            entries.append(_part_entry(part, job, s, None))
    combined = combine_totals(list(per_job.values())) if per_job else RunTotals(group)
    if as_of is None and as_of_ms is not None:
        as_of = dt.datetime.fromtimestamp(int(as_of_ms) / 1000, dt.UTC).isoformat()
    return {"dag_id": dag_id, "dag_run_id": run_id, "run_key": key, "group": group, "logical_date": logical_date,
            "as_of": as_of, "written_ms": written_ms if written_ms is not None else int(time.time() * 1000),
            "jobs": list(per_job), "totals": combined.as_dict(), "parts": entries,
            "nothing_due": nothing_due_entries(nothing_due), "missing_parts": missing}
