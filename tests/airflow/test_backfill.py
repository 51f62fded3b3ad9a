"""`airflow backfill create` over three slots of the offload sweep, run by a real scheduler (scheduler,
DAG processor and the execution API server with the LocalExecutor, on a temporary AIRFLOW_HOME and
SQLite, set up by scripts/airflow-init.sh): each run offloads only the ledgers its own logical date
sees, nothing a later slot would.

Unpausing the DAG (a paused DAG's backfill runs never start) also makes the scheduler start a run for
the latest slot of its clock; that run sweeps the DAG's default configuration, an empty workspace here,
while the backfill's runs get the workload's through --dag-run-conf."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import free_port

from .conftest import DAGS, PLUGINS, REPO, set_policy, tiered

VENV_BIN = Path(sys.executable).parent
DAG_ID = "tiered_offload_sweep"
SCHEDULE = "15 3 * * *"  # the sweep's clock for this test: daily at 03:15
# ledgers close every other day at 03:00 (the newest sealed one on DAY3): slot 1 sees two, slot 2 none
# more (its run must leave DAY3's ledger alone: no Spark job at all), slot 3 the last one
DAY3 = dt.datetime(2026, 3, 3, 3, 0, tzinfo=dt.UTC)
SLOTS = [DAY3 + dt.timedelta(days=d, minutes=15) for d in (-2, -1, 0)]
DEADLINE_S = 240


def _env(home: Path, cfg: Path, api_port: int, log_port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "TIERED_"))}
    env.update({
        "PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
        "PYTHONPATH": str(REPO),
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(PLUGINS),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{api_port}/execution/",
        "AIRFLOW__API_AUTH__JWT_SECRET": "tiered-backfill-test-secret",
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(log_port),
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "TIERED_CONFIG": str(cfg),
        "TIERED_SWEEP_SCHEDULE": SCHEDULE,
        "TIERED_SPARK_POOL_SLOTS": "1",
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "TIERED_NO_PROGRESS": "1",
    })
    return env


def _airflow(env: dict[str, str], *args: str, timeout: float = 120) -> str:
    """An airflow CLI command; retried (3 attempts) while SQLite is locked by the scheduler's writes."""
    for _ in range(3):
        p = subprocess.run([str(VENV_BIN / "airflow"), *args], env=env, capture_output=True, text=True,
                           timeout=timeout)
        if p.returncode == 0 or "database is locked" not in p.stdout + p.stderr:
            break
        time.sleep(1)
    if p.returncode != 0:
        pytest.fail(f"airflow {' '.join(args)}: exit {p.returncode}\n{p.stdout[-1500:]}\n{p.stderr[-4000:]}")
    return p.stdout


@pytest.fixture
def airflow_services(tmp_path: Path) -> Iterator[tuple[dict[str, str], Path]]:
    """A workspace, its Airflow (airflow-init.sh), and scheduler + DAG processor + execution API server;
    stopped (by PID, their process groups) afterwards."""
    ws = tmp_path / "ws"
    assert tiered("init", str(ws)) == 0
    assert tiered("--workspace", str(ws), "generate", "--namespace", "public/default", "--topics", "2",
                  "--ledgers", "3", "--entries", "30", "--entry-size", "50-500", "--ledger-interval", "172800",
                  "--end-time", DAY3.isoformat()) == 0
    set_policy(ws / "tiered.toml", "public/default", offload_threshold_bytes=0)  # every sealed ledger it sees
    assert tiered("init", str(tmp_path / "empty")) == 0  # the DAG's default configuration
    home = tmp_path / "airflow"
    home.mkdir()
    dags = tmp_path / "dags"  # only the sweep's files: the DAG processor's first parse is quicker
    dags.mkdir()
    helpers = [p.name for p in DAGS.glob("tiered_*.py") if "with tiered_dag(" not in p.read_text()]
    for name in ("tiered_offload_sweep.py", *helpers):  # the sweep and the helper modules it imports
        (dags / name).symlink_to(DAGS / name)
    env = _env(home, tmp_path / "empty" / "tiered.toml", free_port(), free_port())
    env["AIRFLOW__CORE__DAGS_FOLDER"] = str(dags)
    init = subprocess.run([str(REPO / "scripts" / "airflow-init.sh")], env=env, capture_output=True, text=True,
                          timeout=180)
    assert init.returncode == 0, init.stderr[-3000:]
    procs = []
    logs = []
    api_port = env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"].split(":")[2].split("/")[0]
    for name, args in (("api-server", ["api-server", "--apps", "execution", "-H", "127.0.0.1", "-p", api_port,
                                       "-w", "1"]),
                       ("scheduler", ["scheduler"]), ("dag-processor", ["dag-processor"])):
        log = open(tmp_path / f"{name}.log", "wb")  # noqa: SIM115 - closed below
        logs.append(log)
        procs.append(subprocess.Popen([str(VENV_BIN / "airflow"), *args], env=env, stdout=log,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True))
    try:
        yield env, ws
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for log in logs:
            log.close()


def _query(home: str, sql: str, *args) -> list[tuple]:
    """Rows of the scheduler's SQLite database (read only; [] while a table does not exist yet)."""
    db = sqlite3.connect(f"file:{home}/airflow.db?mode=ro", uri=True, timeout=5)
    try:
        return db.execute(sql, args).fetchall()
    except sqlite3.OperationalError:
        return []
    finally:
        db.close()


def _backfill_runs(home: str) -> list[tuple[str, str]]:
    """(run_id, state) of the sweep's backfill runs, oldest logical date first."""
    return _query(home, "select run_id, state from dag_run where dag_id = ? and run_type = 'backfill' "
                        "order by logical_date", DAG_ID)


def _wait(what: str, check, deadline: float, tmp_path: Path):
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(1)
    logs = {f.name: f.read_text(errors="replace")[-3000:] for f in tmp_path.glob("*.log")}
    pytest.fail(f"timed out waiting for {what}; logs: {json.dumps(logs, indent=1)}")


@pytest.mark.slow
def test_backfill_over_three_slots_does_each_slots_own_work(airflow_services, tmp_path: Path) -> None:
    from tieredcore.config import Config
    from tieredcore.workspace import Workspace

    env, ws = airflow_services
    home = env["AIRFLOW_HOME"]
    deadline = time.monotonic() + DEADLINE_S
    # the README's steps: once the DAG processor has stored the DAG, unpause it, then the backfill
    _wait("the DAG processor to store the DAG", lambda: _query(
        home, "select 1 from serialized_dag where dag_id = ?", DAG_ID), deadline, tmp_path)
    _airflow(env, "dags", "unpause", DAG_ID)
    assert _query(home, "select is_paused from dag where dag_id = ?", DAG_ID) == [(0,)]
    _airflow(env, "backfill", "create", "--dag-id", DAG_ID, "--from-date", SLOTS[0].isoformat(),
             "--to-date", SLOTS[-1].isoformat(), "--max-active-runs", "1",
             "--dag-run-conf", json.dumps({"config": str(ws / "tiered.toml")}))
    runs = _wait("three backfill runs to finish", lambda: (
        r if len(r := _backfill_runs(home)) == 3 and all(s in ("success", "failed") for _, s in r) else None),
        deadline, tmp_path)
    assert [s for _, s in runs] == ["success"] * 3, runs

    # each run's report: exactly the ledgers sealed by its own logical date and not by the slot before
    with Workspace(Config.load(ws / "tiered.toml", env={})) as wsp:
        closed = {}  # ledger id -> close time (ms)
        for t in wsp.ml.list_topics("public/default"):
            info, _ = wsp.ml.get_topic(t)
            for li in info.ledgerInfo[:-1]:
                closed[li.ledgerId] = li.timestamp
                assert li.offloadContext.complete, (t.full, li.ledgerId)
    reports = ws / "reports" / "tiered_offload_sweep"  # the DAG run's reports (tieredcore.reports layout)
    previous = 0
    counts: list[int] = []
    for (run_id, _), slot in zip(runs, SLOTS, strict=True):
        from tiered_airflow import tiered_run_id

        out = reports / tiered_run_id(run_id) / "offload.0"  # the run's one mapped task: public/default
        at = int(slot.timestamp() * 1000)
        own = {lid for lid, ts in closed.items() if previous < ts <= at}
        previous = at
        counts.append(len(own))
        if not own:  # nothing due at this slot: the plan started no Spark job, nothing was written
            assert not out.exists(), run_id
            continue
        summary = json.loads((out / "summary.json").read_text())
        assert summary["as_of_ms"] == at, (run_id, summary["as_of_ms"])
        done = {r["ledger"] for r in pq.read_table(out / "detail.parquet").to_pylist() if r["outcome"] == "offloaded"}
        assert done == own, (run_id, sorted(done), sorted(own))
    assert counts == [4, 0, 2]  # two topics: two ledgers each by slot 1, none new by slot 2, one each by slot 3
