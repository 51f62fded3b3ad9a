"""The scale-out topology on loopback (scripts/stack.sh), end to end: Airflow schedules (PostgreSQL
database, Redis broker), its Celery worker runs the tasks, spark-submit runs the offload sweep and the
lag cleanup against the standalone master (two workers, the --py-files zip: the executors have no
checkout on their path), metadata in ZooKeeper, objects in moto's S3 server. Then `stack.sh down` must
leave no process behind.

A part that cannot start fails the test with stack.sh's reason (never a skip).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.support.workspaces import build_workspace
from tieredcore.config import Config
from tieredcore.workspace import Workspace

pytestmark = [pytest.mark.stack, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
STACK = REPO / "scripts" / "stack.sh"
VENV = Path(sys.prefix)  # the venv running the tests: the stack's .venv
NAMESPACE = "stack/demo"
TOPICS, LEDGERS, ENTRIES = 2, 2, 10
END = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)  # the generated workload's newest sealed ledger closes here
SWEEP_AT = END + dt.timedelta(minutes=15)
CLEANUP_AT = SWEEP_AT + dt.timedelta(hours=1)  # past the namespace's 30 min deletion lag
RUN_DEADLINE_S = 240


def stack(cmd: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(STACK), cmd], env=env, capture_output=True, text=True, timeout=timeout)


def recorded(stack_dir: Path) -> dict[str, int]:
    return {p.stem: int(p.read_text().split()[0]) for p in (stack_dir / "pids").glob("*.pid")}


def process_tree(roots: set[int]) -> set[int]:
    """The roots, their process groups' members and every descendant (what `down` must stop)."""
    rows = [tuple(map(int, ln.split())) for ln in subprocess.run(
        ["ps", "-e", "-o", "pid=,ppid=,pgid="], capture_output=True, text=True, check=True).stdout.splitlines()]
    keep = set(roots) | {pid for pid, _, pgid in rows if pgid in roots}
    grown = True
    while grown:
        more = {pid for pid, ppid, _ in rows if ppid in keep and pid not in keep}
        keep |= more
        grown = bool(more)
    return keep


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


class Api:
    """Airflow's REST API (v2) with a token from the simple auth manager."""

    def __init__(self, url: str, password: str) -> None:
        self.url = url
        self.token = self.call("POST", "/auth/token", {"username": "admin", "password": password},
                               auth=False)["access_token"]

    def call(self, method: str, path: str, body: Any = None, auth: bool = True) -> Any:
        req = urllib.request.Request(self.url + path, method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        if auth:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            raise AssertionError(f"{method} {path}: HTTP {e.code}: {e.read()[:500]!r}") from None

    def wait_for_dag(self, dag_id: str, deadline: float) -> None:
        while True:
            try:
                self.call("GET", f"/api/v2/dags/{dag_id}")
                return
            except AssertionError as e:
                if time.monotonic() > deadline:
                    raise AssertionError(f"{dag_id} never parsed by the dag-processor: {e}") from None
            time.sleep(0.5)

    def trigger(self, dag_id: str, logical_date: dt.datetime, conf: dict[str, Any]) -> str:
        """Unpause and trigger; the run's API path."""
        self.call("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})
        run = self.call("POST", f"/api/v2/dags/{dag_id}/dagRuns",
                        {"logical_date": logical_date.isoformat(), "conf": conf})
        return f"/api/v2/dags/{dag_id}/dagRuns/{run['dag_run_id']}"

    def task_done(self, run: str, task_id: str, deadline: float) -> None:
        """Until the run's ``task_id`` (every map index) succeeded; fails when it or the run failed."""
        while True:
            tis = [t for t in self.call("GET", run + "/taskInstances")["task_instances"] if t["task_id"] == task_id]
            if tis and all(t["state"] == "success" for t in tis):
                return
            if any(t["state"] in ("failed", "upstream_failed") for t in tis) or \
                    self.call("GET", run)["state"] == "failed":
                return  # wait() reports it, with the logs
            assert time.monotonic() < deadline, f"{run}: {task_id} not done at the deadline: {tis}"
            time.sleep(0.5)

    def wait(self, run: str, deadline: float, logs: Path) -> list[dict[str, Any]]:
        """Until the run ends; its task instances (a failed run: the tails of its task logs)."""
        dag_id = run.split("/")[4]
        while (state := self.call("GET", run)["state"]) not in ("success", "failed"):
            assert time.monotonic() < deadline, f"{dag_id}: still {state} at the deadline; logs under {logs}"
            time.sleep(0.5)
        tis = self.call("GET", run + "/taskInstances")["task_instances"]
        if state != "success":
            tails = []
            for f in sorted(logs.rglob("*.log")):
                if f"dag_id={dag_id}" in str(f):
                    tails.append(f"--- {f}\n" + f.read_text(errors="replace")[-2500:])
            raise AssertionError(f"{dag_id}: {state}: {[(t['task_id'], t['state']) for t in tis]}\n"
                                 + "\n".join(tails[-4:]))
        return tis


@pytest.fixture
def stack_up(tmp_path: Path):
    """scripts/stack.sh up in a temporary state directory on free ports; down afterwards, always."""
    stack_dir = tmp_path / "stack"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "TIERED_", "SPARK_", "PYSPARK"))}
    env.update(TIERED_STACK_DIR=str(stack_dir), TIERED_VENV=str(VENV), STACK_PORTS="auto",
               TIERED_SWEEP_SCHEDULE="none", TIERED_LAG_CLEANUP_SCHEDULE="none")
    t0 = time.monotonic()
    up = stack("up", env)
    if up.returncode != 0:
        pytest.fail(f"scripts/stack.sh up failed (exit {up.returncode}):\n{up.stdout[-3000:]}\n{up.stderr[-5000:]}")
    try:
        printed = stack("env", env, timeout=60)
        assert printed.returncode == 0, printed.stderr
        stack_env = {}
        for line in printed.stdout.splitlines():
            _, assignment = line.split(" ", 1)
            key, value = shlex.split(assignment)[0].split("=", 1)
            stack_env[key] = value
        yield stack_dir, env, stack_env, round(time.monotonic() - t0, 1)
    finally:
        down = stack("down", env, timeout=120)
        assert down.returncode == 0, down.stderr


def test_offload_sweep_and_lag_cleanup_on_the_stack(stack_up, tmp_path, monkeypatch, capsys):
    stack_dir, env, stack_env, up_seconds = stack_up
    started = time.monotonic()
    phases: dict[str, float] = {}

    def phase(name: str) -> None:  # seconds since the last phase (printed: where the test's time goes)
        phases[name] = round(time.monotonic() - started - sum(phases.values()), 1)

    deadline = started + RUN_DEADLINE_S
    pids = recorded(stack_dir)
    expected = {"postgres", "redis", "zookeeper", "s3", "spark-master", "spark-worker-1", "spark-worker-2",
                "airflow-api-server", "airflow-scheduler", "airflow-dag-processor", "airflow-celery-worker"}
    assert set(pids) == expected
    status = stack("status", env, timeout=60)
    assert status.returncode == 0 and status.stdout.count(" running ") == len(expected), status.stdout

    # the executors' interpreter cannot import the project: only the --py-files zip provides it
    spark_python = stack_env["PYSPARK_PYTHON"]
    iso = subprocess.run([spark_python, "-c", "import tieredcore"], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin"}, cwd=tmp_path, timeout=60)
    assert iso.returncode != 0 and "No module named 'tieredcore'" in iso.stderr, iso
    assert subprocess.run([spark_python, "-c", "import pyspark, boto3, kazoo"], env={"PATH": "/usr/bin:/bin"},
                          cwd=tmp_path, timeout=60).returncode == 0

    # the workspace: the stack's own configuration (ZooKeeper metadata, S3 on moto, its hot tier)
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
        monkeypatch.setenv(k, stack_env[k])
    overrides = {"metadata_url": stack_env["TIERED_METADATA_URL"], "store_url": stack_env["TIERED_STORE_URL"],
                 "hot_url": stack_env["TIERED_HOT_URL"], "reports_dir": stack_env["TIERED_REPORTS_DIR"],
                 "spark_master": stack_env["TIERED_SPARK_MASTER"]}
    assert overrides["metadata_url"].startswith("zk://127.0.0.1:") and overrides["store_url"].startswith("s3://")
    cfg_path = build_workspace(tmp_path / "ws", [NAMESPACE], topics=TOPICS, ledgers=LEDGERS, entries=ENTRIES,
                               end=END.isoformat(), config_overrides=overrides, messages=True)
    config = Config.load(cfg_path, env={})
    with Workspace(config) as ws:
        ws.policies.set_namespace(NAMESPACE, {"offload_threshold_bytes": 0, "deletion_lag_ms": 30 * 60_000})
        topics = [t.full for t in ws.ml.list_topics(NAMESPACE)]
    assert len(topics) == TOPICS

    # Airflow: the scheduler schedules, the Celery worker runs, spark-submit goes to spark://
    password = json.loads((stack_dir / "airflow" / "passwords.json").read_text())["admin"]
    api = Api(stack_env["AIRFLOW_API_URL"], password)
    logs = stack_dir / "airflow" / "logs"
    # no `config` in the runs' conf: the stack's workers use the deployment's configuration (its TIERED_*
    # environment, the same stores as cfg_path's overrides); a run cannot name another file
    conf: dict = {}
    phase("workspace")
    for dag_id in ("tiered_offload_sweep", "tiered_deletion_lag_cleanup"):
        api.wait_for_dag(dag_id, deadline)
    phase("dags parsed")
    sweep = api.trigger("tiered_offload_sweep", SWEEP_AT, conf)
    api.task_done(sweep, "offload", deadline)
    phase("sweep's offload")
    # the cleanup may start once the offload is done (the sweep's summary and verdict run meanwhile)
    cleanup = api.trigger("tiered_deletion_lag_cleanup", CLEANUP_AT, conf)
    tis = api.wait(sweep, deadline, logs) + api.wait(cleanup, deadline, logs)
    phase("lag cleanup")
    ran = {(t["task_id"], t["state"]) for t in tis}
    assert ("offload", "success") in ran and ("cleanup", "success") in ran, ran
    celery_log = (stack_dir / "logs" / "airflow-celery-worker.log").read_text(errors="replace")
    assert "tiered_offload_sweep" in celery_log and "tiered_deletion_lag_cleanup" in celery_log

    # each job's report: the cluster's master, an application the master registered, executors on workers
    reports = Path(overrides["reports_dir"])
    # the DAG run's reports: <dag id>/<run key>/<task>[.<map index>]/summary.json (tieredcore.reports)
    summaries = {job: json.loads(next((reports / dag_id).glob("*/*/summary.json")).read_text())
                 for dag_id, job in (("tiered_offload_sweep", "offload_sweep"),
                                     ("tiered_deletion_lag_cleanup", "deletion_lag_cleanup"))}
    master_log = (stack_dir / "logs" / "spark-master.log").read_text(errors="replace")
    for job, s in summaries.items():
        assert s["spark"]["master"] == stack_env["TIERED_SPARK_MASTER"], (job, s["spark"])
        app = s["spark"]["app_id"]
        assert f"Registering app tiered-{job}" in master_log and f"Registered app tiered-{job}" in master_log
        assert app in master_log, (job, app)
        executor_logs = list(stack_dir.glob(f"spark/worker-*/{app}/*/stderr"))
        assert executor_logs, f"{job}: no executor of {app} on the workers"
        assert any("Running task" in f.read_text(errors="replace") for f in executor_logs), job
        # the stack's spark-defaults.conf (docker/spark-conf) reached the executors' JVMs
        assert all("-XX:TieredStopAtLevel=1" in f.read_text(errors="replace") for f in executor_logs), job
        assert s["totals"]["failures"] == 0, s
    assert summaries["offload_sweep"]["outcomes"] == {"offloaded": TOPICS * LEDGERS}
    assert summaries["deletion_lag_cleanup"]["outcomes"] == {"marked": TOPICS * LEDGERS}

    # the tiers afterwards: every sealed ledger offloaded to S3, its hot copy gone; every entry reads back
    with Workspace(config) as ws:
        for t in topics:
            info, _ = ws.ml.get_topic(t)
            for li in info.ledgerInfo[:-1]:
                assert li.offloadContext.complete and li.offloadContext.bookkeeperDeleted, (t, li.ledgerId)
                assert not ws.hot.exists(li.ledgerId)
        reader = ws.reader()
        try:
            assert sum(1 for t in topics for _ in reader.read(t)) == TOPICS * LEDGERS * ENTRIES
        finally:
            reader.close()
        # under Pulsar's own keys ({uuid}-ledger-{id}, no prefix: the stack's default), where the brokers of
        # a Pulsar cluster sharing the bucket look for them
        from tieredcore.cold.blob import iter_objects
        from tieredcore.formats.keys import is_topic_manifest_key
        from tieredcore.names import TopicName
        from tieredcore.offload.context import context_uuid

        keys = {o.key for o in iter_objects(ws.store)
                if not o.key.startswith("tiered-owner.") and not is_topic_manifest_key(o.key, "")}
        # and each topic's manifest (docs/recovery.md), beside Pulsar's keys
        manifests = [o.key for o in iter_objects(ws.store) if is_topic_manifest_key(o.key, "")]
        assert all(any(f"/{TopicName.parse(t).managed_ledger_name}/" in k for k in manifests) for t in topics)
        assert keys == {f"{context_uuid(li)}-ledger-{li.ledgerId}{suffix}" for t in topics
                        for li in ws.ml.get_topic(t)[0].ledgerInfo[:-1] for suffix in ("", "-index")}

    # the Iceberg export on the stack: its catalog in PostgreSQL, its executors on the workers (the
    # project from the --py-files zip: messages decoded by the Python reader), every message once
    export = api.trigger("tiered_table_export", CLEANUP_AT, conf)
    tis = api.wait(export, deadline, logs)
    assert ("export", "success") in {(t["task_id"], t["state"]) for t in tis}, tis
    phase("Iceberg export")
    from tieredcore.lifecycle.export import open_catalog, table_ident
    from tieredcore.names import TopicName
    from tieredcore.query.scan import plan_scan, read_part

    exporting = replace(config, export_catalog_url=stack_env["TIERED_EXPORT_CATALOG_URL"],
                        export_warehouse=stack_env["TIERED_EXPORT_WAREHOUSE"])
    catalog = open_catalog(exporting)
    with Workspace(config) as ws:
        for t in topics:
            messages = sum(b.num_rows for p in plan_scan(ws, [TopicName.parse(t)]).parts for b in read_part(ws, p))
            snap = catalog.load_table(table_ident(TopicName.parse(t), "topic")).current_snapshot()
            assert int(snap.summary["total-records"]) == messages > 0, t

    # down stops exactly what up started: nothing of it is left
    tree = process_tree(set(pids.values()))
    down = stack("down", env, timeout=120)
    assert down.returncode == 0, down.stderr
    left = sorted(p for p in tree if running(p))
    assert not left, f"processes left after down: {left}"
    assert not list((stack_dir / "pids").glob("*.pid"))
    assert stack("status", env, timeout=60).returncode != 0
    phase("checks and down")
    with capsys.disabled():
        print(f"\nstack test: up {up_seconds} s, then {phases}")
        for t in tis:  # each task's wait in the queue and its run
            start, end, queued = (dt.datetime.fromisoformat(t[k]) if t.get(k) else None
                                  for k in ("start_date", "end_date", "queued_when"))
            if start and end:
                print(f"  {t['dag_id']}.{t['task_id']}: queued {(start - queued).total_seconds() if queued else 0:.1f} s,"
                      f" ran {(end - start).total_seconds():.1f} s")
