"""What every Spark job shares: arguments, the session, distribution, the run report."""

from __future__ import annotations

import argparse
import ctypes
import datetime as dt
import json
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tieredcore.clock import parse_time_ms
from tieredcore.config import Config
from tieredcore.errors import NotFoundError, TieredError, ValidationError
from tieredcore.lifecycle.runner import run_work
from tieredcore.lifecycle.work import LedgerResult, RunSummary, TopicWork

# Parquet detail schema (one row per ledger); Spark DDL
DETAIL_SCHEMA = (
    "topic string, namespace string, ledger long, kind string, outcome string, bytes long, blocks long, "
    "entries long, seconds double, uuid string, error string"
)
SUMMARY_PREFIX = "TIERED_RUN_SUMMARY "  # one log line the Airflow summary task can find
# Exit codes of every job: 0 every unit succeeded; 1 some failed (a retry may succeed); 2 bad input,
# nothing started; 3 data loss was found (a retry cannot help: the DAGs do not retry 2 and 3)
EXIT_DATA_LOSS = 3


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


def parse_as_of(text: str | None) -> int:
    """The run's logical time in ms: ISO 8601 (as Airflow renders dates) or epoch milliseconds."""
    if text is None:
        raise ValidationError("--as-of is required: the run's logical time (ISO 8601 or epoch ms)")
    return parse_time_ms(text, "--as-of")


def base_parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--config", help="tiered.toml (default: $TIERED_CONFIG / ./tiered.toml; env overrides)")
    p.add_argument("--namespace", action="append", help="tenant/namespace (repeatable; default: all eligible)")
    p.add_argument("--as-of", required=True, help="the run's logical time, its only clock")
    p.add_argument("--dry-run", action="store_true", help="plan and report, change nothing")
    p.add_argument("--run-id", help="report name (default: derived from --as-of)")
    p.add_argument("--report-dir", help="reports location (default: the configuration's reports_dir)")
    return p


def run_id_for(args: argparse.Namespace, as_of_ms: int) -> str:
    rid = args.run_id or dt.datetime.fromtimestamp(as_of_ms / 1000, dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    rid = re.sub(r"[^A-Za-z0-9_.=+-]", "_", rid)
    # a single path component under <reports>/<job>/: never '', '.' or '..'
    return rid.replace(".", "_") if rid.strip(".") == "" else rid


def session(app_name: str, config: Config):
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    from pyspark import SparkConf

    if not SparkConf().contains("spark.master"):  # run outside spark-submit (tests, notebooks)
        builder = builder.master(config.spark_master).config("spark.ui.enabled", "false")
    return builder.getOrCreate()


def distribute(spark, config: Config, work: Sequence[TopicWork]) -> list[dict]:
    """One element per topic; each Spark task runs its topics' ledgers in order (spec/02)."""
    if not work:
        return []
    sc = spark.sparkContext
    slices = max(1, min(len(work), sc.defaultParallelism * 2))
    units = [w.as_dict() for w in work]
    return sc.parallelize(units, slices).mapPartitions(lambda it: run_work(config, it)).collect()


def write_report(spark, report_dir: str, job: str, run_id: str, summary: RunSummary, rows: list[dict]) -> Path:
    """`<reports>/<job>/<run_id>/summary.json` + `detail.parquet`; a rerun of the same run overwrites."""
    out = Path(report_dir) / job / run_id
    out.mkdir(parents=True, exist_ok=True)
    df = spark.createDataFrame([tuple(LedgerResult(**r).__dict__.values()) for r in rows], DETAIL_SCHEMA)
    df.coalesce(1).write.mode("overwrite").parquet(str(out / "detail.parquet"))
    tmp = out / "summary.json.tmp"
    tmp.write_text(json.dumps(summary.as_dict(), indent=2, sort_keys=True))
    tmp.replace(out / "summary.json")
    return out


def run_job(
    job: str,
    args: argparse.Namespace,
    plan: Callable[[Config, int], list[TopicWork]],
    after: Callable[[Config, int, list[dict]], tuple[dict[str, Any], int]] | None = None,
) -> int:
    """Plan on the driver, distribute, report; 0 when every unit succeeded, 1 otherwise, 2 bad input.

    ``after(config, as_of, rows)``, when given, runs on the driver once the distributed phase is done
    (e.g. the lag cleanup's drain of the records it appended); it returns ``(report, failures)``: the
    report goes into the run summary under ``drain``, the failures add to the run's."""
    exit_with_parent()
    started = time.monotonic()
    try:
        config = Config.load(args.config)
        as_of = parse_as_of(args.as_of)
        work = plan(config, as_of)
    except TieredError as e:
        print(f"{job}: {e}", file=sys.stderr, flush=True)
        return 2 if isinstance(e, ValidationError | NotFoundError) else 1
    run_id = run_id_for(args, as_of)
    print(f"{job}: run {run_id} as of {as_of} ms: {len(work)} topic(s), "
          f"{sum(len(w.ledgers) for w in work)} ledger(s) planned{' (dry run)' if args.dry_run else ''}",
          flush=True)
    spark = session(f"tiered-{job}", config)
    try:
        rows = distribute(spark, config, work)
        extra: tuple[dict[str, Any], int] | None = after(config, as_of, rows) if after is not None else None
        summary = RunSummary.of(job, run_id, as_of, args.dry_run, rows, time.monotonic() - started)
        if extra is not None:
            summary.drain, more_failures = extra
            summary.failures += more_failures
        report_dir = args.report_dir or config.reports_dir
        if not report_dir:
            raise ValidationError("no reports location: set reports_dir in the configuration or --report-dir")
        out = write_report(spark, report_dir, job, run_id, summary, rows)
    finally:
        spark.stop()
    for r in rows:
        if LedgerResult(**r).failed:
            print(f"{job}: FAILED {r['topic']} ledger {r['ledger']}: {r['outcome']}: {r['error']}", flush=True)
        elif r["outcome"] == "busy":
            print(f"{job}: BUSY {r['topic']} ledger {r['ledger']}: {r['error']}", flush=True)
    aborted = [r for r in rows if r["outcome"] == "aborted"]
    if aborted:
        print(f"{job}: STOPPED early: {len(aborted)} ledger(s) {aborted[0]['error']}", flush=True)
    for what in summary.data_loss:
        print(f"{job}: DATA LOSS: {what}: no copy of it can be read (see the report)", flush=True)
    print(f"{job}: report {out}", flush=True)
    print(SUMMARY_PREFIX + json.dumps(asdict(summary), sort_keys=True), flush=True)
    if summary.data_loss:
        return EXIT_DATA_LOSS
    return 1 if summary.failures else 0


# -- jobs that are not TopicWork-shaped (deletion drain, orphan reconciliation) ---------------------


def bad_input(job: str, e: TieredError) -> int:
    """Report an error found before Spark starts: 2 for bad input, 1 otherwise."""
    print(f"{job}: {e}", file=sys.stderr, flush=True)
    return 2 if isinstance(e, ValidationError | NotFoundError) else 1


def report_dir_for(args: argparse.Namespace, config: Config) -> str:
    report_dir = args.report_dir or config.reports_dir
    if not report_dir:
        raise ValidationError("no reports location: set reports_dir in the configuration or --report-dir")
    return report_dir


def write_job_report(spark, report_dir: str, job: str, run_id: str, summary: dict, rows: Sequence[tuple],
                     schema: str, detail: str = "detail.parquet") -> Path:
    """Like write_report, with the job's own summary dict and detail schema (Spark DDL)."""
    out = Path(report_dir) / job / run_id
    out.mkdir(parents=True, exist_ok=True)
    spark.createDataFrame(list(rows), schema).coalesce(1).write.mode("overwrite").parquet(str(out / detail))
    tmp = out / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2, sort_keys=True, default=str))
    tmp.replace(out / "summary.json")
    return out
