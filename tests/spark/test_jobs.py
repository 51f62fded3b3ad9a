"""The Spark jobs: argument handling in-process; real spark-submit runs (slow) end to end.

spark-submit invocations in this module: 7 (sweep with a failing namespace + its rerun, lag cleanup,
two concurrent sweeps against moto's S3 server, a streaming sweep with a failing namespace, a deep scrub
that finds a damaged Pulsar message)."""

from __future__ import annotations

import argparse
import json
import uuid as uuidlib
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from spark_jobs import _jobkit, deletion_lag_cleanup, offload_sweep
from spark_jobs._jobkit import SUMMARY_PREFIX, log_view, parse_as_of, run_id_for
from tests.support.workspaces import END_ISO, END_MS, build_workspace
from tieredcore.cli import main as cli
from tieredcore.cold.blob import iter_objects
from tieredcore.config import Config
from tieredcore.errors import ValidationError
from tieredcore.formats.keys import data_key, index_key, is_topic_manifest_key
from tieredcore.lifecycle.drain import drain
from tieredcore.lifecycle.runner import run_work
from tieredcore.lifecycle.work import DETAIL_SCHEMA, KIND_OFFLOAD, TopicWork
from tieredcore.offload.managed import abandoned_uuids, context_uuid
from tieredcore.workspace import Workspace

from .conftest import finish, spark_popen, spark_submit

HOUR = 3600 * 1000


def offloaded_objects(store) -> list:
    """The store's objects but its owner marker (tiered-owner.<cluster>) and the topic manifests."""
    return [o for o in iter_objects(store)
            if not o.key.startswith("tiered-owner.") and not is_topic_manifest_key(o.key, "")]
DETAIL_COLUMNS = [c.strip().split()[0] for c in DETAIL_SCHEMA.split(",")]


# -- in-process: no Spark ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,expected",
    [
        ("2026-01-01T00:00:00Z", END_MS),
        ("2026-01-01T00:00:00+00:00", END_MS),
        ("2026-01-01T01:00:00+01:00", END_MS),
        ("2025-12-31T19:00:00-05:00", END_MS),
        ("2026-01-01T00:00:00", END_MS),  # naive: UTC
        ("2026-01-01T00:00:00.250Z", END_MS + 250),
        (str(END_MS), END_MS),  # epoch milliseconds
    ],
)
def test_parse_as_of(text, expected):
    assert parse_as_of(text) == expected


@pytest.mark.parametrize("text", ["garbage", "", "yesterday", "2026-13-01T00:00:00Z", "12345", "-1", None])
def test_parse_as_of_rejects_garbage(text):
    with pytest.raises(ValidationError, match="--as-of"):
        parse_as_of(text)


@pytest.mark.parametrize("run_id,expected", [(None, "20260101T000000Z"), ("manual run/1", "manual run/1"),
                                             ("scheduled__2026-01-01T00:00:00+00:00",
                                              "scheduled__2026-01-01T00:00:00+00:00")])
def test_run_id_for_is_the_unaltered_id_or_the_logical_time(run_id, expected):
    """Outside Airflow a run's id is --run-id as given (its report's key is made from it), else --as-of."""
    assert run_id_for(argparse.Namespace(run_id=run_id), END_MS) == expected


AIRFLOW_ENV = {"TIERED_DAG_ID": "tiered_scrub", "TIERED_DAG_RUN_ID": "manual__2026-01-01T00:00:00+00:00",
               "TIERED_TASK_ID": "scrub", "TIERED_MAP_INDEX": "1", "TIERED_ATTEMPT": "2"}


def _write_scrub_report(config: str, env: dict[str, str], run_id: str = "cli-run") -> tuple[Path, dict]:
    """A scrub's report written in-process as run_job writes it (place from ``env``; no Spark needed)."""
    import time

    from tieredcore.lifecycle.work import LedgerRunReport, RunSummary

    cfg = Config.load(config, env={})
    args = argparse.Namespace(dry_run=True, run_id=run_id, namespace=["t/a"])
    place = _jobkit.place_for("scrub", args, END_MS, env)
    run = _jobkit.Run("scrub", args, cfg, END_MS, place.run_id, cfg.reports_dir, time.monotonic(), place)
    return _jobkit.write_report(None, run, LedgerRunReport(RunSummary.of("scrub", run.run_id, END_MS, True, [], 0.0),
                                                           []), env=env)


def test_inside_airflow_a_job_writes_its_dag_runs_part(small_config):
    """$TIERED_DAG_ID and the rest (the DAG's operator sets them): group = DAG id, run key of the unaltered
    DAG run id, part = task.map_index, attempt = try number; summary.json says where it is."""
    from tieredcore.reports import RunReports, report_name

    out, summary = _write_scrub_report(small_config, AIRFLOW_ENV)
    key = report_name(AIRFLOW_ENV["TIERED_DAG_RUN_ID"])
    reports = RunReports(Config.load(small_config, env={}).reports_dir)
    assert out == reports.attempt_dir("tiered_scrub", key, "scrub.1", 2)
    assert reports.read_summary("tiered_scrub", key, "scrub.1") == summary
    assert {k: summary[k] for k in ("group", "part", "dag_id", "dag_run_id", "task_id", "map_index", "try_number",
                                    "attempt", "run_id", "planned_namespaces", "job")} == {
        "group": "tiered_scrub", "part": "scrub.1", "dag_id": "tiered_scrub",
        "dag_run_id": "manual__2026-01-01T00:00:00+00:00", "task_id": "scrub", "map_index": 1, "try_number": 2,
        "attempt": 2, "run_id": "manual__2026-01-01T00:00:00+00:00", "planned_namespaces": ["t/a"], "job": "scrub"}
    assert isinstance(summary["namespaces"], dict)  # the report's own per-namespace totals stay as they are
    assert reports.run_id("tiered_scrub", key) == AIRFLOW_ENV["TIERED_DAG_RUN_ID"]


def test_outside_airflow_a_job_writes_a_run_of_its_own(small_config):
    from tieredcore.reports import RunReports

    out, summary = _write_scrub_report(small_config, {}, run_id="nightly:1")
    reports = RunReports(Config.load(small_config, env={}).reports_dir)
    assert reports.groups() == ["scrub"] and reports.runs("scrub") == ["nightly=3A1"]
    assert reports.parts("scrub", "nightly=3A1") == ["scrub"] and out.name == "attempt-1"
    assert (summary["group"], summary["part"], summary["dag_id"], summary["dag_run_id"], summary["run_id"]) == (
        "scrub", "scrub", None, None, "nightly:1")
    _, again = _write_scrub_report(small_config, {}, run_id="nightly:1")  # the next attempt, outside Airflow
    assert again["attempt"] == 2 and reports.attempts("scrub", "nightly=3A1", "scrub") == [1, 2]


@pytest.mark.parametrize("change,message", [
    ({"TIERED_MAP_INDEX": "x"}, "TIERED_MAP_INDEX='x': the map index must be an integer"),
    ({"TIERED_TASK_ID": ""}, "TIERED_TASK_ID is not set"),
    ({"TIERED_DAG_RUN_ID": ""}, "TIERED_DAG_RUN_ID is not set"),
])
def test_a_bad_dag_environment_exits_2_without_spark(no_spark, small_config, capsys, monkeypatch, change, message):
    for k, v in {**AIRFLOW_ENV, **change}.items():
        monkeypatch.setenv(k, v)
    assert offload_sweep.main(["--config", small_config, "--as-of", END_ISO]) == 2
    err = capsys.readouterr().err
    assert message in err and "bad input, nothing started" in err
    assert not (Path(Config.load(small_config, env={}).reports_dir) / "tiered_scrub").exists()


@pytest.fixture
def no_spark(monkeypatch):
    """main() must refuse bad input before any Spark session exists."""

    def boom(*a, **k):
        raise AssertionError("a Spark session was requested for bad input")

    monkeypatch.setattr(_jobkit, "session", boom)
    monkeypatch.setattr(_jobkit, "exit_with_parent", lambda: None)  # not for the pytest process


@pytest.fixture
def small_config(tmp_path) -> str:
    return str(build_workspace(tmp_path / "ws", ["t/a"], ledgers=2))


@pytest.mark.parametrize(
    "args,message",
    [
        (["--as-of", "garbage"], "--as-of 'garbage'"),
        (["--as-of", END_ISO, "--topic", "t/a/topic-0000"], "give exactly one of --up-to LEDGER:ENTRY or --keep"),
        (["--as-of", END_ISO, "--keep-bytes", "10"], "--up-to / --keep-bytes go with --topic"),
        (["--as-of", END_ISO, "--topic", "t/a/topic-0000", "--keep-bytes", "1", "--up-to", "1:0"],
         "give exactly one of --up-to LEDGER:ENTRY or --keep-bytes SIZE"),
        (["--as-of", END_ISO, "--topic", "t/a/topic-0000", "--up-to", "x:y"], "LEDGER:ENTRY"),
        (["--as-of", END_ISO, "--topic", "t/a/topic-0000", "--keep-bytes", "-5"], "keep-bytes"),
        (["--as-of", END_ISO, "--topic", "t/a/topic-0000", "--keep-bytes", "8589934592G"], "--keep-bytes"),
        (["--as-of", END_ISO, "--topic", "t/a/topic-0000", "--up-to", "2"], "--up-to '2': expected LEDGER:ENTRY"),
        (["--as-of", END_ISO, "--topic", "t/a/topic-0000", "--up-to", f"{2**63}:0"], "64-bit"),
        (["--as-of", str(2**63)], "64-bit"),
        (["--as-of", END_ISO, "--max-topics", "0"], "--max-topics must be positive"),
        (["--as-of", END_ISO, "--namespace", "no-slash"], "no-slash"),
    ],
)
def test_offload_sweep_bad_input_exits_2_without_spark(no_spark, small_config, capsys, args, message):
    assert offload_sweep.main(["--config", small_config, *args]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("attempt", ["0", "two", "-1", "1e3"])
def test_bad_attempt_exits_2_without_spark(no_spark, small_config, capsys, monkeypatch, attempt):
    """$TIERED_ATTEMPT (the task's try number, from the DAG) names the report's attempt directory."""
    monkeypatch.setenv("TIERED_ATTEMPT", attempt)
    assert offload_sweep.main(["--config", small_config, "--as-of", END_ISO]) == 2
    assert f"TIERED_ATTEMPT={attempt!r}: the attempt (try number) must be a positive integer" in capsys.readouterr().err


def test_bad_input_of_both_jobs_exits_2_without_spark(no_spark, small_config, tmp_path, capsys):
    assert deletion_lag_cleanup.main(["--config", small_config, "--as-of", "soon"]) == 2
    assert "--as-of 'soon'" in capsys.readouterr().err
    missing = str(tmp_path / "nope.toml")
    assert offload_sweep.main(["--config", missing, "--as-of", END_ISO]) == 2
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # argparse: --as-of is required
        deletion_lag_cleanup.main(["--config", small_config])
    assert e.value.code == 2


def test_lag_cleanup_drain_flag_selects_the_driver_drain(no_spark, small_config, monkeypatch):
    seen = []
    monkeypatch.setattr(deletion_lag_cleanup, "run_ledger_job",
                        lambda job, args, plan, after=None: seen.append(after) or 0)
    for flags in ([], ["--drain"], ["--no-drain"], ["--dry-run"]):
        assert deletion_lag_cleanup.main(["--config", small_config, "--as-of", END_ISO, *flags]) == 0
    assert seen == [deletion_lag_cleanup.drain_after] * 2 + [None, None]


def test_lag_cleanup_driver_drain_deletes_the_marked_hot_copies(small_config):
    """What --drain runs after the distributed phase (in-process: no Spark)."""
    cfg = Config.load(small_config, env={})
    with Workspace(cfg) as ws:
        ws.policies.set_namespace("t/a", {"offload_threshold_bytes": 0, "deletion_lag_ms": 0})
        t = ws.ml.list_topics("t/a")[0].full
        ids = [li.ledgerId for li in ledgers(ws, t)[:-1]]
        assert {r["outcome"] for r in run_work(cfg, [TopicWork(t, KIND_OFFLOAD, ids, END_MS).as_dict()])} == {
            "offloaded"}
        rows = list(run_work(cfg, [TopicWork(t, "lag-cleanup", ids, END_MS + 1).as_dict()]))
        assert {r["outcome"] for r in rows} == {"marked"} and all(ws.hot.exists(i) for i in ids)
    report, failures = deletion_lag_cleanup.drain_after(cfg, END_MS + 1, rows)
    assert failures == 0 and "rows" not in report
    assert (report["entries"], report["deleted"], report["deleted_hot"], report["acknowledged"]) == (2, 2, 2, 2)
    with Workspace(cfg) as ws:
        assert not any(ws.hot.exists(i) for i in ids) and ws.deletion_log.pending() == []
        reader = ws.reader("bookkeeper-first")
        try:
            assert sum(1 for _ in reader.read(t)) == len(ids) * 10
        finally:
            reader.close()


def test_manual_offload_keep_bytes_takes_sizes(no_spark, small_config, monkeypatch):
    """--keep-bytes 64M plans like its byte count (the Spark part is not needed to see the plan)."""
    plans = {}

    def capture(job, args, plan, after=None):
        plans[args.keep_bytes] = plan(_jobkit.Run(job, args, Config.load(small_config, env={}), END_MS, "r", "", 0.0))
        return 0

    monkeypatch.setattr(offload_sweep, "run_ledger_job", capture)
    for keep in ("64M", str(64 * 2**20), "0"):
        assert offload_sweep.main(["--config", small_config, "--as-of", END_ISO, "--topic", "t/a/topic-0000",
                                   "--keep-bytes", keep]) == 0
    assert plans["64M"] == plans[str(64 * 2**20)] == []  # a few KiB per topic: all of it stays hot
    (work,) = plans["0"]
    assert len(work.ledgers) == 2  # every sealed ledger


def test_missing_topic_for_manual_offload_is_bad_input(no_spark, small_config, capsys):
    """A topic that does not exist is the caller's mistake (as in the CLI): 2, so no retry is wasted."""
    assert offload_sweep.main(["--config", small_config, "--as-of", END_ISO, "--topic", "t/a/nope",
                               "--keep-bytes", "0"]) == 2
    assert "t/a/nope" in capsys.readouterr().err


# -- helpers for the spark-submit runs ---------------------------------------------------------


def load_report(report_dir: Path, job: str, run_id: str) -> tuple[dict, list[dict]]:
    """The report of a run outside Airflow: group and part are the job's name."""
    from tieredcore.reports import report_name

    out = report_dir / job / report_name(run_id) / job
    summary = json.loads((out / "summary.json").read_text())
    table = pq.read_table(out / "detail.parquet")
    assert table.column_names == DETAIL_COLUMNS
    return summary, table.to_pylist()


def summary_line(log: str) -> dict:
    lines = [ln for ln in log.splitlines() if ln.startswith(SUMMARY_PREFIX)]
    assert len(lines) == 1, log[-3000:]
    return json.loads(lines[0][len(SUMMARY_PREFIX):])


def assert_spark_section(summary: dict, master: str) -> None:
    """The report's ``spark`` section: where the run went and what each phase cost (cluster sizing)."""
    spark = summary["spark"]
    assert spark["master"] == master
    assert spark["app_id"].startswith("local-" if master.startswith("local") else "app-")
    assert spark["default_parallelism"] >= 1 and spark["executors"] is not None
    phases = spark["phases"]
    assert set(phases) == {"planning", "session_startup", "distributed_work", "report"}
    assert all(v >= 0 for v in phases.values())
    assert sum(phases.values()) <= summary["seconds"] + 0.01  # the phases are parts of the run


def ledgers(ws: Workspace, topic: str) -> list:
    info, _ = ws.ml.get_topic(topic)
    return list(info.ledgerInfo)


def verify_all(config_path: Path) -> None:
    assert cli.main(["--config", str(config_path), "verify"]) == 0


# -- (a)+(b): sweep over namespaces with different policies, one failing; then the retry -----------


@pytest.mark.slow
def test_offload_sweep_policies_failure_isolation_and_retry(tmp_path, capsys):
    cfg_path = build_workspace(tmp_path / "ws", ["t/on", "t/off", "t/bad"], topics=2, ledgers=3)
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where t/bad's store root should be")
    with Workspace(Config.load(cfg_path, env={})) as ws:
        ps = ws.policies
        ps.set_namespace("t/on", {"offload_threshold_bytes": 0})
        ps.set_namespace("t/off", {"offload_threshold_bytes": -1})
        ps.set_namespace("t/bad", {"offload_threshold_seconds": 0,
                                   "store": {"driver": "filesystem", "root": str(blocker / "cold")}})
        off_before = {t.full: ws.ml.get_topic(t) for t in ws.ml.list_topics("t/off")}
    report_dir = tmp_path / "ws" / "reports"

    # run 1: t/bad cannot write; the others still run; exit 1 at the end
    rc, log = spark_submit("offload_sweep", "--config", str(cfg_path), "--as-of", END_ISO, "--run-id", "r1",
                           log=tmp_path / "run1.log")
    assert rc == 1, log[-3000:]
    for t in ("persistent://t/bad/topic-0000", "persistent://t/bad/topic-0001"):
        assert f"ERROR offload_sweep: FAILED {t} ledger" in log  # a failed ledger is logged as an error
    # the log ends with the outcome in words; Spark's INFO lines are off
    assert log.rstrip().splitlines()[-1].startswith("ERROR offload_sweep: outcome FAILED: "), log[-2000:]
    assert " INFO " not in log and "Running Spark version" not in log
    summary, rows = load_report(report_dir, "offload_sweep", "r1")
    # tiers: in the file only; instants as ISO 8601 UTC, per-ledger lists as counts in the log
    assert summary_line(log) == log_view({k: v for k, v in summary.items() if k != "tiers"})
    with Workspace(Config.load(cfg_path, env={})) as ws:
        on_topics = [t.full for t in ws.ml.list_topics("t/on")]
        on_uuids = {}
        for t in on_topics:
            lis = ledgers(ws, t)
            assert all(li.offloadContext.complete for li in lis[:-1]) and not lis[-1].HasField("offloadContext")
            on_uuids[t] = [context_uuid(li) for li in lis[:-1]]
        on_sealed_bytes = sum(li.size for t in on_topics for li in ledgers(ws, t)[:-1])
        for t in ws.ml.list_topics("t/bad"):
            assert not any(li.offloadContext.complete for li in ledgers(ws, t))
        assert {t.full: ws.ml.get_topic(t) for t in ws.ml.list_topics("t/off")} == off_before  # untouched
        data_sizes = {o.key: o.size for o in offloaded_objects(ws.store) if not o.key.endswith("-index")}
        assert len(offloaded_objects(ws.store)) == 12 and ws.store.list_multipart_uploads() == []

    assert len(rows) == 12 and {r["namespace"] for r in rows} == {"t/on", "t/bad"}
    by_ns = {ns: [r for r in rows if r["namespace"] == ns] for ns in ("t/on", "t/bad")}
    assert all(r["outcome"] == "offloaded" and r["kind"] == "offload" and not r["error"] for r in by_ns["t/on"])
    assert {(r["topic"], r["uuid"]) for r in by_ns["t/on"]} == {(t, u) for t, us in on_uuids.items() for u in us}
    assert all(r["outcome"] == "failed" and "cannot create store directories" in r["error"] for r in by_ns["t/bad"])
    assert all(r["entries"] == 10 and r["blocks"] == 1 and r["seconds"] > 0 for r in by_ns["t/on"])
    assert sum(r["bytes"] for r in by_ns["t/on"]) == sum(data_sizes.values())
    assert summary["topics"] == 4 and summary["ledgers"] == 12 and summary["failures"] == 6
    assert summary["outcomes"] == {"offloaded": 6, "failed": 6}
    assert summary["bytes"] == sum(data_sizes.values())
    assert summary["namespaces"] == {
        "t/on": {"ledgers": 6, "bytes": sum(data_sizes.values()), "failures": 0, "outcomes": {"offloaded": 6}},
        "t/bad": {"ledgers": 6, "bytes": 0, "failures": 6, "outcomes": {"failed": 6}},
    }
    assert summary["as_of_ms"] == END_MS and summary["job"] == "offload_sweep" and summary["run_id"] == "r1"
    assert summary["dry_run"] is False and summary["attempt"] == 1
    assert_spark_section(summary, "local[2]")
    # object-store requests, per namespace: t/on's 6 ledgers each a multipart data object (initiate, one
    # part, complete) and an index; t/off made none; t/bad's store refused before any request
    req = summary["requests"]
    assert req["namespaces"]["t/on"]["PUT"] >= 6 * 4 and "t/off" not in req["namespaces"]
    assert all(req["total"][k] >= sum(n[k] for n in req["namespaces"].values()) for k in req["total"])
    # the tiers as the run left them (the Tiered storage view's history)
    assert summary["tiers"]["t/on"]["both"] == {"ledgers": 6, "bytes": on_sealed_bytes}
    assert summary["tiers"]["t/on"]["hot"]["ledgers"] == 2 and summary["tiers"]["t/on"]["objects"] == 12
    assert summary["tiers"]["t/bad"]["both"]["ledgers"] == 0

    # run 2 (the retry, same logical date) after fixing the cause: only what is left
    blocker.unlink()
    rc, log = spark_submit("offload_sweep", "--config", str(cfg_path), "--as-of", END_ISO, "--run-id", "r1",
                           log=tmp_path / "run2.log")
    assert rc == 0, log[-3000:]
    first = summary
    summary, rows = load_report(report_dir, "offload_sweep", "r1")  # the run level: the latest attempt
    assert summary["outcomes"] == {"offloaded": 6} and summary["failures"] == 0 and summary["attempt"] == 2
    assert {r["namespace"] for r in rows} == {"t/bad"} and len(rows) == 6
    # every attempt kept: the first one's report is where it was written
    part = report_dir / "offload_sweep" / "r1" / "offload_sweep"  # outside Airflow: group = part = the job
    assert json.loads((part / "attempt-1" / "summary.json").read_text()) == first
    assert json.loads((part / "attempt-2" / "summary.json").read_text()) == summary
    assert len(pq.read_table(part / "attempt-1" / "detail.parquet")) == 12
    with Workspace(Config.load(cfg_path, env={})) as ws:
        for t in on_topics:
            assert [context_uuid(li) for li in ledgers(ws, t)[:-1]] == on_uuids[t]
        for t in ws.ml.list_topics("t/bad"):
            lis = ledgers(ws, t)
            assert all(li.offloadContext.complete for li in lis[:-1])
            assert {kv.key: kv.value for kv in lis[0].offloadContext.driverMetadata.properties}["root"] == str(
                blocker / "cold")
        assert {t.full: ws.ml.get_topic(t) for t in ws.ml.list_topics("t/off")} == off_before
        assert len(offloaded_objects(ws.store)) == 12  # nothing more in the workspace store
    capsys.readouterr()
    verify_all(cfg_path)


# -- (c): deletion-lag cleanup ---------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("metadata", ["sqlite", "zk"])
def test_deletion_lag_cleanup_job(tmp_path, metadata, request):
    """Also on ZooKeeper metadata: the executors open their own sessions from the pickled store."""
    overrides = {"metadata_url": request.getfixturevalue("zk_url")} if metadata == "zk" else None
    cfg_path = build_workspace(tmp_path / "ws", ["t/a"], topics=3, ledgers=4, config_overrides=overrides)
    with Workspace(Config.load(cfg_path, env={})) as ws:
        ws.policies.set_namespace("t/a", {"offload_threshold_bytes": 0, "deletion_lag_ms": HOUR})
        topics = [t.full for t in ws.ml.list_topics("t/a")]
        ids = {t: [li.ledgerId for li in ledgers(ws, t)[:-1]] for t in topics}
        # ledgers 0-1 of each topic offloaded at END, ledgers 2-3 half an hour later
        for as_of, part in ((END_MS, slice(0, 2)), (END_MS + HOUR // 2, slice(2, 4))):
            units = [TopicWork(t, KIND_OFFLOAD, ids[t][part], as_of).as_dict() for t in topics]
            assert {r["outcome"] for r in run_work(ws.config, units)} == {"offloaded"}
        # topic 3's first offloaded copy is broken: its hot copy must survive
        broken = ledgers(ws, topics[2])[0]
        ws.store.delete([index_key("", context_uuid(broken), broken.ledgerId)])

    as_of = END_MS + HOUR + 1  # past the lag for the first two ledgers only; epoch-ms form
    rc, log = spark_submit("deletion_lag_cleanup", "--config", str(cfg_path), "--as-of", str(as_of),
                           log=tmp_path / "cleanup.log")
    assert rc == 1, log[-3000:]
    assert f"FAILED {topics[2]} ledger {broken.ledgerId}: verify-failed" in log
    summary, rows = load_report(tmp_path / "ws" / "reports", "deletion_lag_cleanup", "20260101T010000Z")
    # phase 1 marks (a `ledger` record, then bookkeeperDeleted); the --drain pass (default on) deletes
    assert summary["outcomes"] == {"marked": 5, "verify-failed": 1} and summary["failures"] == 1
    assert summary["as_of_ms"] == as_of and summary["bytes"] == 5 * 1000
    # ... and the broken copy, replaced by a verified re-offload, goes too (its record: reason verify-failed)
    assert "re-offloaded and verified as" in log
    assert summary["drain"]["deleted_hot"] == 5 and summary["drain"]["deleted_offloaded"] == 1
    assert summary["drain"]["acknowledged"] == summary["drain"]["entries"] == 6
    assert summary["drain"]["retrying"] == summary["drain"]["dead_lettered"] == summary["drain"]["still_in_use"] == 0
    assert summary_line(log)["drain"] == summary["drain"]
    assert sorted((r["topic"], r["ledger"], r["outcome"]) for r in rows) == sorted(
        [(t, lid, "marked") for t in topics for lid in ids[t][:2] if lid != broken.ledgerId]
        + [(topics[2], broken.ledgerId, "verify-failed")]
    )
    with Workspace(Config.load(cfg_path, env={})) as ws:
        assert ws.deletion_log.pending() == []
        assert ws.deletion_log.counters()["appended_hot"] == 5
        for t in topics:
            lis = ledgers(ws, t)
            for li in lis[:-1]:
                due = li.ledgerId in ids[t][:2] and li.ledgerId != broken.ledgerId
                assert ws.hot.exists(li.ledgerId) is not due, (t, li.ledgerId)
                assert li.offloadContext.bookkeeperDeleted is due
                assert li.offloadContext.complete
                if li.ledgerId == broken.ledgerId:
                    assert context_uuid(li) != context_uuid(broken)  # the verified replacement
        # everything still reads back identical (the broken ledger from its hot copy)
        reader = ws.reader("bookkeeper-first")
        try:
            assert sum(1 for t in topics for _ in reader.read(t)) == 3 * 4 * 10
        finally:
            reader.close()
    for t in topics[:2]:
        assert cli.main(["--config", str(cfg_path), "verify", t]) == 0


# -- (d)+(e): two concurrent sweeps on one namespace, against moto's S3 server ----------------------


@pytest.mark.slow
def test_concurrent_sweeps_on_s3_offload_every_ledger_exactly_once(tmp_path, moto_endpoint):
    import boto3

    bucket = f"sweep-{uuidlib.uuid4().hex[:16]}"
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    s3.create_bucket(Bucket=bucket)
    store_url = f"s3://{bucket}/pfx?endpoint={moto_endpoint}&region=us-east-1"
    cfg_path = build_workspace(tmp_path / "ws", ["t/a"], topics=4, ledgers=5, entries=100, entry_size="100-8000",
                               config_overrides={"store_url": store_url, "max_block_size": 5 * 1024 * 1024})
    with Workspace(Config.load(cfg_path, env={})) as ws:
        ws.policies.set_namespace("t/a", {"offload_threshold_bytes": 0})
        topics = [t.full for t in ws.ml.list_topics("t/a")]
        sealed = {(t, li.ledgerId) for t in topics for li in ledgers(ws, t)[:-1]}

    procs = [
        (spark_popen("offload_sweep", "--config", str(cfg_path), "--as-of", END_ISO, "--namespace", "t/a",
                     "--run-id", f"c{i}", log=tmp_path / f"c{i}.log"), tmp_path / f"c{i}.log")
        for i in (1, 2)
    ]
    results = [finish(p, log) for p, log in procs]
    reports = [load_report(tmp_path / "ws" / "reports", "offload_sweep", f"c{i}") for i in (1, 2)]

    with Workspace(Config.load(cfg_path, env={})) as ws:
        recorded = {}
        for t in topics:
            for li in ledgers(ws, t)[:-1]:
                assert li.offloadContext.complete and abandoned_uuids(li) == []
                assert dict((kv.key, kv.value) for kv in li.offloadContext.driverMetadata.properties)["bucket"] == bucket
                recorded[(t, li.ledgerId)] = context_uuid(li)
    assert set(recorded) == sealed

    # every ledger was offloaded by exactly one of the two runs, with the uuid that is recorded
    offloaded = [(r["topic"], r["ledger"], r["uuid"]) for _, rows in reports for r in rows
                 if r["outcome"] == "offloaded"]
    assert sorted(offloaded) == sorted((t, lid, u) for (t, lid), u in recorded.items())
    for (rc, log), (summary, rows) in zip(results, reports, strict=True):
        assert rc in (0, 1), log[-3000:]
        # the loser of a race may find the topic leased (busy), report skipped / conflict, or failed if its
        # upload was taken over
        assert {r["outcome"] for r in rows} <= {"offloaded", "busy", "skipped", "conflict", "failed"}
        assert (rc == 1) == any(r["outcome"] == "failed" for r in rows)
        assert sum(summary["outcomes"].values()) == len(rows) == summary["ledgers"]
        print(f"concurrent run: exit {rc}, outcomes {summary['outcomes']}")  # which interleaving happened
        assert {(r["topic"], r["ledger"]) for r in rows} == sealed  # both planned everything

    # the losers' objects are in the deletion log (never deleted directly): one drain removes them
    with Workspace(Config.load(cfg_path, env={})) as ws:
        rep = drain(ws, END_MS)
        assert rep.retrying == rep.dead_lettered == rep.refused_mismatch == 0, rep.rows
        assert ws.deletion_log.pending() == []

    # the bucket holds exactly the recorded objects: no orphans, no unfinished multipart uploads
    keys = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        keys += [o["Key"] for o in page.get("Contents", [])]
    keys = [k for k in keys if not is_topic_manifest_key(k, "pfx/")]  # docs/recovery.md
    expected = {k for (_, lid), u in recorded.items() for k in (data_key("pfx/", u, lid), index_key("pfx/", u, lid))}
    assert sorted(keys) == sorted(expected | {"pfx/tiered-owner.standalone"})  # + the owner marker
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    verify_all(cfg_path)


# -- (f): streaming mode (PIP-76): one row per segment, a failing namespace fails the run at the end ------


@pytest.mark.slow
def test_streaming_sweep_job_reports_segments_and_fails_after_finishing_the_rest(tmp_path):
    from tieredcore.offload.context import covered_through, is_offloaded

    cfg_path = build_workspace(tmp_path / "ws", ["t/s", "t/bad"], topics=2, ledgers=2, entries=40,
                               entry_size="100", open_entries=25)
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where t/bad's store root should be")
    streaming = {"offload_mode": "streaming", "max_segment_size": 4096, "streaming_block_size": 1024,
                 "max_segment_rollover_ms": 10 * 60 * 1000}
    with Workspace(Config.load(cfg_path, env={})) as ws:
        ps = ws.policies
        ps.set_namespace("t/s", streaming)
        ps.set_namespace("t/bad", {**streaming, "store": {"driver": "filesystem", "root": str(blocker / "cold")}})

    # at END the open ledgers' entries (written at END) are younger than the rollover: their tails are held
    rc, log = spark_submit("offload_sweep", "--config", str(cfg_path), "--as-of", END_ISO, "--run-id", "s1",
                           log=tmp_path / "s1.log")
    assert rc == 1, log[-3000:]
    assert "4 topic(s) (4 streaming)" in log
    for t in ("persistent://t/bad/topic-0000", "persistent://t/bad/topic-0001"):
        assert f"FAILED {t} segment" in log
    summary, rows = load_report(tmp_path / "ws" / "reports", "offload_sweep", "s1")
    # tiers: in the file only; instants as ISO 8601 UTC, per-ledger lists as counts in the log
    assert summary_line(log) == log_view({k: v for k, v in summary.items() if k != "tiers"})
    good = [r for r in rows if r["namespace"] == "t/s"]
    assert {r["unit"] for r in rows} == {"segment"}
    assert {r["outcome"] for r in good} == {"offloaded", "held"}
    done = [r for r in good if r["outcome"] == "offloaded"]
    assert all(r["bytes"] <= 4096 and r["covers"] and len(r["uuid"]) == 36 for r in done)
    assert summary["segments"] == len(done) and summary["segments_held"] == 2
    assert summary["segment_bytes"] == sum(r["bytes"] for r in done) == summary["totals"]["segment_bytes"]
    assert summary["failures"] == 2 and summary["ledgers"] == 0
    assert summary["namespaces"]["t/bad"]["failures"] == 2
    with Workspace(Config.load(cfg_path, env={})) as ws:
        for t in ws.ml.list_topics("t/s"):
            *sealed, newest = ledgers(ws, t)
            assert all(is_offloaded(li) for li in sealed)
            held = [r for r in good if r["topic"] == t.full and r["outcome"] == "held"]
            assert covered_through(newest) < 24 and len(held) == 1
    verify_all(cfg_path)



# -- (g): the scrub job's message check: a damaged Pulsar message without a hot copy ----------------------


@pytest.mark.slow
def test_scrub_job_names_a_damaged_message_and_counts_messages_per_namespace(tmp_path):
    """Objects as Pulsar's offloader writes them (no chunk checksums, no checkpoints) holding Pulsar
    messages; one message's payload byte flipped in a ledger whose hot copy is gone: the deep scrub job
    reports data loss (exit 3) naming ledger:entry and the reason, the other namespace's messages all
    check out, and each namespace's counts are in summary.json and detail.parquet."""
    from tests.support import pulsar_objects
    from tieredcore.lifecycle.sweep import plan_offload
    from tieredcore.meta.managed_ledgers import find_ledger

    cfg_path = build_workspace(tmp_path / "ws", ["t/a", "t/b"], ledgers=2, entries=25, entry_size="100-400",
                               messages=True, config_overrides={"checksum_chunk": 0, "checkpoint_interval": 0})
    cfg = Config.load(cfg_path, env={})
    t = "persistent://t/a/topic-0000"
    with Workspace(cfg) as ws:
        for ns in ("t/a", "t/b"):
            ws.policies.set_namespace(ns, {"offload_threshold_bytes": 0})
        rows = list(run_work(cfg, [w.as_dict() for w in plan_offload(ws, None, END_MS)]))
        assert {r["outcome"] for r in rows} == {"offloaded"} and len(rows) == 4
        victim = ledgers(ws, t)[0]
        lid = victim.ledgerId
        key = data_key("", context_uuid(victim), lid)
        md, data = ws.store.head(key).metadata, bytearray(ws.store.get(key))
        pulsar_objects.flip_payload_byte(data, 13)
        ws.store.put(key, bytes(data), md)
        ws.hot.delete_ledger(lid)

        def mark(info):
            find_ledger(info, lid).offloadContext.bookkeeperDeleted = True

        ws.ml.update_topic(t, mark)

    rc, log = spark_submit("scrub", "--config", str(cfg_path), "--as-of", END_ISO, "--deep", "always", "--repair",
                           "--run-id", "m1", log=tmp_path / "scrub.log")
    assert rc == 3, log[-3000:]
    assert f"ERROR scrub: FAILED {t} ledger {lid}: unrecoverable: DATA LOSS" in log
    assert f"{lid}:13 (CRC32C mismatch (stored 0x" in log
    summary, detail = load_report(tmp_path / "ws" / "reports", "scrub", "m1")
    ns = summary["totals"]["namespaces"]
    assert ns["t/a"]["counters"] == {"messages_checked": 49, "messages_unchecked": 0, "messages_damaged": 1,
                                     "not_messages": 0}
    assert ns["t/b"]["counters"] == {"messages_checked": 50, "messages_unchecked": 0, "messages_damaged": 0,
                                     "not_messages": 0}
    assert summary["totals"]["counters"]["messages_damaged"] == 1 and summary["damaged_messages"] == [f"{t} {lid}:13"]
    assert summary["totals"]["data_loss"] == [f"{t} ledger {lid}"]
    (bad,) = [r for r in detail if r["outcome"] != "ok"]
    assert (bad["ledger"], bad["outcome"], bad["damaged_at"], bad["messages_damaged"]) == (
        lid, "unrecoverable", f"{lid}:13", 1)
    assert f"{lid}:13 (CRC32C mismatch" in bad["error"]
    with Workspace(cfg) as ws:
        assert ws.store.head(key).size == len(data)  # nothing deleted
