"""Airflow test session: a temporary AIRFLOW_HOME (SQLite) configured BEFORE airflow is imported, the
project's dags/ and plugins/ folders, the Spark connection to local[2], and one DB initialisation per
session. Tests import airflow inside functions (never at module level), after `airflow_session`.

Helpers build embedded workspaces (`tiered init` + `tiered generate`) and run DAGs with `dag.test()`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
DAGS = REPO / "dags"
PLUGINS = REPO / "plugins"
SPARK_CONN = json.dumps({"conn_type": "spark", "host": "local[2]"})

# generated workload: the newest sealed ledger closes at END; the tests' logical dates are after it
END = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
SWEEP_AT = END + dt.timedelta(minutes=15)


@pytest.fixture(scope="session", autouse=True)
def airflow_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """AIRFLOW_HOME in a temp dir, env set before `import airflow`, DB initialised once."""
    if "airflow" in sys.modules:
        pytest.fail("airflow was imported before the tests/airflow session fixture configured it")
    home = tmp_path_factory.mktemp("airflow_home")
    mp = pytest.MonkeyPatch()
    env = {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(PLUGINS),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW_CONN_SPARK_DEFAULT": SPARK_CONN,
    }
    for k, v in env.items():
        mp.setenv(k, v)
    for k in ("TIERED_CONFIG", "TIERED_CONFIG_ALLOWED", "TIERED_SWEEP_SCHEDULE", "TIERED_LAG_CLEANUP_SCHEDULE", "TIERED_RETENTION_SCHEDULE",
              "TIERED_DRAIN_SCHEDULE", "TIERED_RECONCILE_SCHEDULE", "TIERED_SCRUB_SCHEDULE",
              "TIERED_COMPACTION_SCHEDULE", "TIERED_TOPIC_COMPACTION_SCHEDULE", "TIERED_EXPORT_SCHEDULE", "TIERED_REPLICA_SYNC_SCHEDULE", "TIERED_PY_FILES",
              "TIERED_SPARK_JOBS_DIR", "TIERED_REPORTS_URL", "AIRFLOW_CONN_AWS_DEFAULT"):
        mp.delenv(k, raising=False)
    for folder in (str(DAGS), str(PLUGINS)):  # as Airflow does for DAG files and plugins
        if folder not in sys.path:
            sys.path.append(folder)

    from airflow.utils import db

    db.initdb()
    yield home
    mp.undo()


# -- workspaces -------------------------------------------------------------------------------------


def tiered(*argv: str) -> int:
    from tieredcore.cli.main import main

    return main(list(argv))


def make_workspace(root: Path, namespaces: list[str], store_url: str | None = None, topics: int = 2,
                   ledgers: int = 4, entries: int = 200) -> Path:
    """`tiered init` + `tiered generate`: `topics` topics per namespace, `ledgers` sealed ledgers each
    (the newest ledger of each topic stays open), mixed entry sizes; returns tiered.toml."""
    init = ["init", str(root)] + (["--store-url", store_url] if store_url else [])
    assert tiered(*init) == 0
    gen = ["--workspace", str(root), "generate", "--topics", str(topics), "--ledgers", str(ledgers),
           "--entries", str(entries), "--entry-size", "50-3000", "--end-time", END.isoformat()]
    for ns in namespaces:
        gen += ["--namespace", ns]
    assert tiered(*gen) == 0
    return root / "tiered.toml"


def set_policy(config_path: Path, namespace: str, **policy: Any) -> None:
    from tieredcore.config import Config
    from tieredcore.workspace import Workspace

    with Workspace(Config.load(config_path, env={})) as ws:
        ws.policies.set_namespace(namespace, policy)


def topic_ledgers(config_path: Path) -> dict[str, list]:
    """topic -> its LedgerInfo list (oldest first)."""
    from tieredcore.config import Config
    from tieredcore.workspace import Workspace

    with Workspace(Config.load(config_path, env={})) as ws:
        out = {}
        for ns in ws.ml.list_namespaces():
            for t in ws.ml.list_topics(ns):
                info, _ = ws.ml.get_topic(t)
                out[t.full] = list(info.ledgerInfo)
        return out


def verify(config_path: Path) -> dict:
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = tiered("--config", str(config_path), "verify", "--json")
    res = json.loads(buf.getvalue())
    assert code == 0, res
    return res


# -- DAG runs ---------------------------------------------------------------------------------------

CRON_PRESETS = {"@hourly": "0 * * * *", "@daily": "0 0 * * *"}


def cron_of(dag) -> str | None:
    """The cron expression a DAG runs on (a plain schedule, or the clock of an asset-or-time schedule)."""
    s = dag.schedule
    if s is None:
        return None
    if isinstance(s, str):
        return CRON_PRESETS.get(s, s)
    return getattr(s, "timetable", s).expression  # asset-or-time: its clock; else the catch-up clock


def asset_of(dag):
    """The asset condition of an asset-or-time schedule (None for a plain one)."""
    return getattr(dag.schedule, "asset_condition", None)



@contextlib.contextmanager
def allowed_configs(*paths: str) -> Iterator[None]:
    """TIERED_CONFIG_ALLOWED (the admin's allow-list of configuration files) set to ``paths`` meanwhile."""
    saved = os.environ.get("TIERED_CONFIG_ALLOWED")
    if paths:
        os.environ["TIERED_CONFIG_ALLOWED"] = os.pathsep.join(paths)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("TIERED_CONFIG_ALLOWED", None)
        else:
            os.environ["TIERED_CONFIG_ALLOWED"] = saved


def get_dag(dag_id: str):
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS))
    assert not bag.import_errors, bag.import_errors
    return bag.get_dag(dag_id)


def run_dag(dag_id: str, logical_date: dt.datetime, conf: dict[str, Any]):
    """dag.test() of one run; returns (dag_run, {task_id or task_id[map_index]: state}). A ``config`` in
    ``conf`` (the test's workspace) is on the admin's allow-list (TIERED_CONFIG_ALLOWED) while the DAG is
    parsed and run, as a deployment that lets runs choose it would have it."""
    with allowed_configs(*([str(conf["config"])] if conf.get("config") else [])):
        dag = get_dag(dag_id)
        dr = dag.test(logical_date=logical_date, run_conf=conf)
    states = {}
    for ti in dr.get_task_instances():
        key = ti.task_id if ti.map_index < 0 else f"{ti.task_id}[{ti.map_index}]"
        states[key] = ti.state
    return dr, states


def xcom(dr, task_id: str, key: str = "return_value", map_index: int = -1):
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = (
            session.query(XComModel)
            .filter_by(dag_id=dr.dag_id, run_id=dr.run_id, task_id=task_id, key=key, map_index=map_index)
            .one_or_none()
        )
        return None if row is None else XComModel.deserialize_value(row)


def all_xcom_text(dr) -> str:
    """Every XCom value the DAG run stored, serialized: for greps (no secret may be in them)."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.query(XComModel).filter_by(dag_id=dr.dag_id, run_id=dr.run_id).all()
        return "\n".join(repr(r.value) for r in rows)


def asset_events(dr) -> list[tuple[str, dict]]:
    """(asset name, extra) of the asset events a DAG run emitted, oldest first."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.execute(
            select(AssetModel.name, AssetEvent.extra).join(AssetModel, AssetEvent.asset_id == AssetModel.id)
            .where(AssetEvent.source_dag_id == dr.dag_id, AssetEvent.source_run_id == dr.run_id)
            .order_by(AssetEvent.id)
        ).all()
        return [(name, dict(extra or {})) for name, extra in rows]


@pytest.fixture
def spark_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The venv's python for Spark (the tests' interpreter)."""
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.pop("TIERED_CONFIG", None)
