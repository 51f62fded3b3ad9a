"""The credentials of an Azure connection reach a real spark-submit: an offload sweep (dag.test(), local[2])
writes to an Azurite container whose account key exists only in the ``wasb_default`` connection (the
worker's environment has none), and the key never appears in the task logs. (The command line alone is
checked in test_cloud_connections.py.)"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.support.object_stores import AZURITE_ACCOUNT, AZURITE_KEY

from .conftest import SWEEP_AT, make_workspace, run_dag, set_policy, xcom

AZURE_VARS = ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT", "AZURE_STORAGE_KEY",
              "AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_BLOB_ENDPOINT")


@pytest.mark.slow
def test_an_offload_sweep_reaches_azure_with_the_connections_credentials_only(
        tmp_path: Path, spark_env, azurite, azure_store, monkeypatch, capfd) -> None:
    from airflow.sdk import DagRunState, TaskInstanceState

    store_url = f"azure://{azure_store.container}/offloaded?endpoint={azurite.endpoint}"
    for k, v in azurite.env().items():  # building the workspace: this process's own credentials
        monkeypatch.setenv(k, v)
    cfg = make_workspace(tmp_path / "ws", ["public/default"], store_url=store_url, topics=1, ledgers=3, entries=50)
    set_policy(cfg, "public/default", offload_threshold_bytes=0)
    for var in AZURE_VARS:  # ... then none: only the connection can let the Spark job in
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AIRFLOW_CONN_WASB_DEFAULT", json.dumps(
        {"conn_type": "wasb", "login": AZURITE_ACCOUNT, "password": AZURITE_KEY, "host": azurite.endpoint}))

    dr, states = run_dag("tiered_offload_sweep", SWEEP_AT, {"config": str(cfg)})
    assert dr.state == DagRunState.SUCCESS, states
    assert states["offload[0]"] == TaskInstanceState.SUCCESS
    totals = xcom(dr, "summary")
    assert totals["outcomes"] == {"offloaded": 3} and totals["failures"] == 0
    names = {b.name for b in azure_store.client.list_blobs(name_starts_with="offloaded/")}
    assert len([n for n in names if n.endswith("-index")]) == 3, names
    out, err = capfd.readouterr()
    assert "INFO offload_sweep: outcome ok: 1 topic(s), 3 unit(s)" in out
    assert AZURITE_KEY not in out + err
    logs = Path(os.environ["AIRFLOW_HOME"]) / "logs"
    for f in logs.rglob("*") if logs.exists() else []:
        if f.is_file():
            assert AZURITE_KEY not in f.read_text(errors="replace"), f
