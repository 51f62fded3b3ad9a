"""The template every Spark job follows (run_job): arguments, the configuration and the clock loaded and
the plan made on the driver before Spark starts, one session, one report written, one exit-code rule.

Exit codes (tieredcore.reports): 0 every unit succeeded; 1 some failed (a retry may succeed); 2 bad input,
nothing started; 3 data loss was found (a retry cannot help: the DAGs do not retry 2 and 3)."""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from tieredcore.clock import parse_time_ms
from tieredcore.cold.requests import (
    RequestCounts,
    RequestCountsParam,
    count_requests,
    counting_partition,
    request_document,
)
from tieredcore.config import Config
from tieredcore.errors import NotFoundError, TieredError, ValidationError
from tieredcore.lifecycle.runner import run_work, split_cache_records
from tieredcore.lifecycle.work import LedgerRunReport, RunSummary, TopicWork
from tieredcore.reports import (
    EXIT_FAILED,
    EXIT_USAGE,
    JobReport,
    ReportPlace,
    RunReports,
    default_run_id,
    exit_code,
    message_level,
    outcome_line,
    report_place,
    summary_document,
)
from tieredcore.usage import OneLineParser

SUMMARY_PREFIX = "TIERED_RUN_SUMMARY "  # the run summary as one log line (grep-able in task logs)
LEVELS = ("ERROR", "WARNING", "INFO")
LOG_OMITS = ("records", "tiers")  # bulky parts stay in summary.json, out of the log line
P = TypeVar("P")


def exit_with_parent() -> None:
    """If spark-submit's JVM is killed (e.g. Airflow's execution_timeout), this driver must not live on
    as an orphan: ask Linux for SIGTERM when the parent dies."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        return
    if os.getppid() == 1:  # parent already gone before prctl
        os.kill(os.getpid(), signal.SIGTERM)


def say(job: str, level: str, message: str) -> None:
    """One line of the job's log carrying its level (``ERROR offload_sweep: FAILED ...``): Airflow's
    Spark hook logs every line of spark-submit at INFO, so the level is part of the line, where a reader
    (and a grep for ERROR) finds it. Errors go to stderr (spark-submit's caller merges both)."""
    assert level in LEVELS
    print(f"{level} {job}: {message}", file=sys.stderr if level == "ERROR" else sys.stdout, flush=True)


def parse_as_of(text: str | None) -> int:
    """The run's logical time in ms: ISO 8601 (as Airflow renders dates) or epoch milliseconds."""
    if text is None:
        raise ValidationError("--as-of is required: the run's logical time (ISO 8601 or epoch ms)")
    return parse_time_ms(text, "--as-of")


def base_parser(description: str) -> argparse.ArgumentParser:
    p = OneLineParser(description=description)
    p.add_argument("--config", help="tiered.toml (default: $TIERED_CONFIG / ./tiered.toml; env overrides)")
    p.add_argument("--namespace", action="append", help="tenant/namespace (repeatable; default: all eligible)")
    p.add_argument("--as-of", required=True, help="the run's logical time, its only clock")
    p.add_argument("--dry-run", action="store_true", help="plan and report, change nothing")
    p.add_argument("--run-id", help="the run's id outside Airflow (default: from --as-of); inside Airflow the DAG "
                                    "run's id comes from $TIERED_DAG_RUN_ID")
    p.add_argument("--report-dir", help="reports location (default: the configuration's reports_dir)")
    return p


def run_id_for(args: argparse.Namespace, as_of_ms: int) -> str:
    """The run's id outside Airflow, unaltered: --run-id, else the logical time (its report's key is
    tieredcore.reports.report_name of it)."""
    return args.run_id or default_run_id(as_of_ms)


def place_for(job: str, args: argparse.Namespace, as_of_ms: int, env: Mapping[str, str] | None = None) -> ReportPlace:
    """Where the run's report goes (tieredcore.reports.report_place): inside Airflow the DAG run's part
    the operator's environment names (TIERED_DAG_ID, TIERED_DAG_RUN_ID, TIERED_TASK_ID,
    TIERED_MAP_INDEX); outside, a run of its own (group = part = ``job``, id from --run-id or --as-of).
    ValidationError (exit 2) for a bad environment."""
    return report_place(os.environ if env is None else env, job, run_id_for(args, as_of_ms))


def session(app_name: str, config: Config):
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    # Under spark-submit the JVM starts first and hands this process its gateway port; the submitted
    # --master (the DAG's spark_default connection) then decides where the work runs. SparkConf() cannot
    # tell: before the gateway exists it sees no spark.* properties, so asking it would override a
    # submitted spark://… master with the configuration's local[*].
    if not os.environ.get("PYSPARK_GATEWAY_PORT"):  # plain python (tests, notebooks): our configuration decides
        builder = builder.master(config.spark_master).config("spark.ui.enabled", "false")
    return builder.getOrCreate()


@dataclass(frozen=True)
class Run:
    """What a job's steps get: the loaded configuration, the run's clock and names, its arguments."""

    job: str
    args: argparse.Namespace
    config: Config
    as_of_ms: int
    run_id: str  # unaltered: the DAG run's id inside Airflow, else --run-id or the logical time
    report_dir: str
    started: float  # time.monotonic() at start
    place: ReportPlace | None = None  # where its report goes (None: a run of its own, group = part = job)

    @property
    def report_place(self) -> ReportPlace:
        return self.place if self.place is not None else ReportPlace(self.job, self.run_id, self.job)

    @property
    def dry_run(self) -> bool:
        return bool(self.args.dry_run)

    def seconds(self) -> float:
        return round(time.monotonic() - self.started, 3)


def report_dir_for(args: argparse.Namespace, config: Config) -> str:
    report_dir = args.report_dir or config.reports_dir
    if not report_dir:
        raise ValidationError("no reports location: set reports_dir in the configuration or --report-dir")
    return report_dir


def spark_facts(spark) -> dict[str, Any]:
    """Where the run's work went (asked once the work is done): the master actually used (the submitted one under spark-submit), the
    application id (the master's log and UI name it), the executors that joined and the default
    parallelism — what a user needs to size a cluster from a report."""
    sc = spark.sparkContext
    try:  # block managers known to the driver: the executors' plus the driver's own
        executors = max(0, sc._jsc.sc().getExecutorMemoryStatus().size() - 1)
    except Exception:  # a fact for the report only, never a reason to fail the run
        executors = None
    return {"master": sc.master, "app_id": sc.applicationId, "executors": executors,
            "default_parallelism": sc.defaultParallelism}


def write_report(spark, run: Run, report: JobReport, extra: dict[str, Any] | None = None,
                 env: Mapping[str, str] | None = None,
                 spark_info: dict[str, Any] | None = None,
                 report_started: float | None = None) -> tuple[Path, dict[str, Any]]:
    """The attempt's `summary.json` (the report's summary, its totals, the run's names and place: DAG
    id, unaltered DAG run id, task id, map index, try, part, group, the namespaces it was given
    (``planned_namespaces``);
    ``extra``: request counts, tier snapshot; ``spark``: where it ran and its phases' seconds) and
    `detail.parquet`, published as its part's latest (tieredcore.reports.RunReports: the layout, the
    attempt number from $TIERED_ATTEMPT, the task's try number): a rerun adds an attempt and never
    overwrites an earlier one's report. Returns the attempt's directory and the summary."""
    started = time.monotonic() if report_started is None else report_started
    reports, place = RunReports(run.report_dir), run.report_place
    reports.claim(place.group, place.run_id)  # the run's directory is this run id's (a clash: refused)
    attempt = reports.attempt_number(place, os.environ if env is None else env)
    out = reports.attempt_dir(place.group, place.run_key, place.part, attempt)
    out.mkdir(parents=True, exist_ok=True)
    rows, schema = report.detail()
    write_detail(reports.detail_path(place.group, place.run_key, place.part, attempt), rows, schema)
    report_seconds = round(time.monotonic() - started, 3)
    summary = summary_document(report, run.job, run.run_id, run.seconds())
    summary.update(extra or {})
    # the namespaces this part was given (else those it did): "planned_namespaces", as the reports'
    # own "namespaces" (an object per namespace, where a report has one) stays what it is
    given = sorted(set(getattr(run.args, "namespace", None) or ()))
    summary.update(place.fields(attempt), planned_namespaces=given or sorted(report.totals()["namespaces"]))
    summary.update(attempt=attempt, as_of_ms=run.as_of_ms, written_ms=int(time.time() * 1000))
    if spark_info is not None:
        info = dict(spark_info)
        info["phases"] = {**info.get("phases", {}), "report": report_seconds}
        summary["spark"] = info
    reports.publish(place, attempt, json.dumps(summary, indent=2, sort_keys=True, default=str))
    return out, summary


_ARROW_TYPES = {"string": "string", "long": "int64", "bigint": "int64", "int": "int32", "integer": "int32",
                "double": "float64", "boolean": "bool_"}


def arrow_schema(ddl: str):
    """The pyarrow schema of a report's detail rows from their Spark DDL ("name type, ..."; the types the
    reports use)."""
    import pyarrow as pa

    fields = []
    for col in ddl.split(","):
        name, _, typ = col.strip().partition(" ")
        t = _ARROW_TYPES.get(typ.strip().lower())
        if not name or t is None:
            raise ValueError(f"detail schema: unsupported column {col.strip()!r} in {ddl!r}")
        fields.append(pa.field(name, getattr(pa, t)()))
    return pa.schema(fields)


def write_detail(path: Path, rows: Iterable[tuple], ddl: str) -> None:
    """``detail.parquet`` as Spark lays it out (a directory: one part file and ``_SUCCESS``), written on
    the driver with pyarrow: the rows are already here, and a Spark job to write them cost 4-11 s per
    run on a 2-core machine. Readers (spark.read.parquet, pyarrow) see the same table."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = arrow_schema(ddl)
    table = pa.Table.from_pylist([dict(zip(schema.names, r, strict=True)) for r in rows], schema=schema)
    tmp = path.with_name(f".{path.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    pq.write_table(table, tmp / "part-00000.snappy.parquet", compression="snappy")
    (tmp / "_SUCCESS").touch()
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)


def run_extras(config: Config, requests: RequestCounts) -> dict[str, Any]:
    """What every report records besides the job's own fields: the run's object-store requests (driver
    and tasks) and the tiers as the run left them (the "Tiered storage" view's history). A snapshot that
    cannot be read is reported, never fails the run."""
    from tieredcore.lifecycle.overview import tier_snapshot
    from tieredcore.workspace import Workspace

    try:
        with Workspace(config) as ws:
            tiers: dict[str, Any] = tier_snapshot(ws)
    except TieredError as e:
        tiers = {}
        print(f"tier snapshot not recorded: {e}", file=sys.stderr, flush=True)
    return {"requests": request_document(requests.as_dict()), "tiers": tiers}


# the run's request accumulator (set once the Spark session exists); see counted_partitions
_requests_acc: Any = None


def counted_partitions(fn: Callable[[Iterator], Iterator]) -> Callable[[Iterator], Iterator]:
    """``fn`` (a mapPartitions function) with its object-store requests added to the run's report."""
    return fn if _requests_acc is None else counting_partition(_requests_acc, fn)


def run_job(
    job: str,
    args: argparse.Namespace,
    plan: Callable[[Run], P],
    describe: Callable[[P], str],
    execute: Callable[[Any, Run, P], JobReport],
) -> int:
    """Every job's life: load the configuration, parse the clock, check the reports location and
    ``plan(run)`` on the driver — all before Spark starts, so bad input exits 2 having started nothing;
    then one Spark session for ``execute(spark, run, planned)``, one report written, the report's
    messages and summary logged. Exit code from the report's totals (tieredcore.reports.exit_code)."""
    global _requests_acc
    exit_with_parent()
    started = time.monotonic()
    with count_requests() as requests:  # the driver's own; the tasks' come through the accumulator
        try:
            config = Config.load(args.config)
            as_of = parse_as_of(args.as_of)
            place = place_for(job, args, as_of)  # a bad $TIERED_* environment: exit 2
            run = Run(job, args, config, as_of, place.run_id, report_dir_for(args, config), started, place)
            reports = RunReports(run.report_dir)
            reports.attempt_number(place, os.environ)  # a bad $TIERED_ATTEMPT: exit 2
            planned = plan(run)  # reads only
            reports.check_writable(place)  # before any work (a run key's clash too): exit 2, nothing started
        except TieredError as e:
            code = EXIT_USAGE if isinstance(e, ValidationError | NotFoundError) else EXIT_FAILED
            say(job, "ERROR", f"{e}")
            say(job, "ERROR", f"outcome {'bad input, nothing started' if code == EXIT_USAGE else 'FAILED'}: exit {code}")
            return code
        say(job, "INFO", f"run {run.run_id} as of {as_of} ms: {describe(planned)}{' (dry run)' if run.dry_run else ''}")
        planned_at = time.monotonic()
        spark = session(f"tiered-{job}", config)
        try:
            session_at = time.monotonic()
            _requests_acc = spark.sparkContext.accumulator({}, RequestCountsParam())
            report = execute(spark, run, planned)
            requests.merge(_requests_acc.value)
            info = spark_facts(spark)  # after the work: a cluster's executors register asynchronously
            # seconds per phase: the driver's planning (configuration, clock, plan), the session's start-up
            # (JVM, master, executors), the distributed work, the report (tier snapshot, files)
            work_done = time.monotonic()
            info["phases"] = {"planning": round(planned_at - started, 3),
                              "session_startup": round(session_at - planned_at, 3),
                              "distributed_work": round(work_done - session_at, 3)}
            out, summary = write_report(spark, run, report, run_extras(config, requests), spark_info=info,
                                        report_started=work_done)
        finally:
            _requests_acc = None
            spark.stop()
    for line in report.messages():
        say(job, message_level(line), line)
    say(job, "INFO", f"report {out}")
    logged = {k: v for k, v in summary.items() if k not in LOG_OMITS}
    print(SUMMARY_PREFIX + json.dumps(logged, sort_keys=True, default=str), flush=True)
    # the last line of the task log: the outcome in words
    code = exit_code(report.totals())
    say(job, "INFO" if code == 0 else "ERROR", outcome_line(report.totals(), code) + f" ({run.seconds():.1f} s)")
    return code


# -- jobs over TopicWork units (offload sweep, lag cleanup, retention, scrub) ------------------------


def distribute(spark, config: Config, work: Sequence[TopicWork]) -> tuple[list[dict], dict[str, int]]:
    """One element per topic; each Spark task runs its topics' ledgers in order (docs/metadata.md).
    Returns the rows and the tasks' chunk cache counters added up."""
    if not work:
        return [], {}
    sc = spark.sparkContext
    slices = max(1, min(len(work), sc.defaultParallelism * 2))
    units = [w.as_dict() for w in work]
    return split_cache_records(
        sc.parallelize(units, slices).mapPartitions(counted_partitions(lambda it: run_work(config, it, with_cache=True)))
        .collect())


def run_ledger_job(
    job: str,
    args: argparse.Namespace,
    plan: Callable[[Run], list[TopicWork]],
    after: Callable[[Config, int, list[dict]], tuple[dict[str, Any], int]] | None = None,
) -> int:
    """A job over TopicWork units: plan on the driver, distribute by topic, one row per ledger.

    ``after(config, as_of, rows)``, when given, runs on the driver once the distributed phase is done
    (e.g. the lag cleanup's drain of the records it appended); it returns ``(report, failures)``: the
    report goes into the run summary under ``drain``, the failures add to the run's."""

    def describe(work: list[TopicWork]) -> str:
        streaming = sum(1 for w in work if w.options.get("streaming"))
        return (f"{len(work)} topic(s){f' ({streaming} streaming)' if streaming else ''}, "
                f"{sum(len(w.ledgers) for w in work)} ledger(s) planned")

    def execute(spark, run: Run, work: list[TopicWork]) -> JobReport:
        rows, cache = distribute(spark, run.config, work)
        extra = after(run.config, run.as_of_ms, rows) if after is not None else None
        summary = RunSummary.of(job, run.run_id, run.as_of_ms, run.dry_run, rows, run.seconds())
        summary.cache = cache
        if extra is not None:
            summary.drain, more_failures = extra
            summary.failures += more_failures
        return LedgerRunReport(summary, rows)

    return run_job(job, args, plan, describe, execute)
