"""The Azure Blob (``wasb_default``) and Google Cloud (``google_cloud_default``) connections handed to the
Spark jobs as the environment tieredcore's azure:// and gs:// stores read (plugins/tiered_hooks.py), with
neither the Microsoft Azure nor the Google provider installed; and the DAGs' preflight check of such
stores on Azurite and the GCS emulator."""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib.util
import json
import uuid

import pytest

SECRET = "dGllcmVkLXNlY3JldC1rZXk="  # an account key (base64, as Azure's are)


def _set_conn(monkeypatch: pytest.MonkeyPatch, conn_id: str, conn: dict) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(conn))


@pytest.fixture(autouse=True)
def _no_cloud_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("AIRFLOW_CONN_WASB_DEFAULT", "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", "AIRFLOW_CONN_AWS_DEFAULT"):
        monkeypatch.delenv(var, raising=False)


def test_the_providers_are_not_needed() -> None:
    for module in ("airflow.providers.microsoft", "airflow.providers.google"):
        with contextlib.suppress(ModuleNotFoundError):  # the parent package is absent too
            assert importlib.util.find_spec(module) is None


def test_wasb_connection_becomes_the_azure_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from tiered_hooks import azure_environment

    assert azure_environment("wasb_default") == {}  # no connection: the worker's own environment
    assert azure_environment(None) == {}
    _set_conn(monkeypatch, "wasb_default", {"conn_type": "wasb", "login": "acct1", "password": SECRET,
                                            "host": "http://127.0.0.1:10000/acct1/"})
    assert azure_environment("wasb_default") == {
        "AZURE_STORAGE_ACCOUNT": "acct1", "AZURE_STORAGE_KEY": SECRET,
        "AZURE_STORAGE_BLOB_ENDPOINT": "http://127.0.0.1:10000/acct1"}
    # a host that is not a URL is not an endpoint; the key may be the shared_access_key extra (older prefix)
    _set_conn(monkeypatch, "wasb_default", {"conn_type": "wasb", "login": "acct1", "host": "acct1",
                                            "extra": {"extra__wasb__shared_access_key": SECRET}})
    assert azure_environment("wasb_default") == {"AZURE_STORAGE_ACCOUNT": "acct1", "AZURE_STORAGE_KEY": SECRET}
    _set_conn(monkeypatch, "wasb_default", {"conn_type": "wasb", "login": "acct1",
                                            "extra": {"sas_token": "sv=2025-01-05&sig=abc"}})
    assert azure_environment("wasb_default") == {"AZURE_STORAGE_ACCOUNT": "acct1",
                                                 "AZURE_STORAGE_SAS_TOKEN": "sv=2025-01-05&sig=abc"}
    # a connection string wins over everything else
    conn_string = f"DefaultEndpointsProtocol=https;AccountName=acct2;AccountKey={SECRET}"
    _set_conn(monkeypatch, "wasb_default", {"conn_type": "wasb", "login": "acct1", "password": "other",
                                            "extra": {"connection_string": conn_string}})
    assert azure_environment("wasb_default") == {"AZURE_STORAGE_CONNECTION_STRING": conn_string}


def test_google_connection_becomes_the_gcs_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from tiered_hooks import gcs_environment

    assert gcs_environment("google_cloud_default") == {}
    _set_conn(monkeypatch, "google_cloud_default", {
        "conn_type": "google_cloud_platform",
        "extra": {"key_path": "/etc/tiered/gcs-key.json", "project": "tiered-prod"}})
    assert gcs_environment("google_cloud_default") == {
        "GOOGLE_APPLICATION_CREDENTIALS": "/etc/tiered/gcs-key.json", "GOOGLE_CLOUD_PROJECT": "tiered-prod"}
    key = {"type": "service_account", "project_id": "p1", "private_key": "-----BEGIN PRIVATE KEY-----x"}
    _set_conn(monkeypatch, "google_cloud_default", {
        "conn_type": "google_cloud_platform",
        "extra": {"extra__google_cloud_platform__keyfile_dict": json.dumps(key),
                  "extra__google_cloud_platform__project": "p1"}})
    env = gcs_environment("google_cloud_default")
    assert json.loads(env.pop("TIERED_GCS_KEYFILE_JSON")) == key
    assert env == {"GOOGLE_CLOUD_PROJECT": "p1"}


def test_spark_jobs_get_them_in_the_environment_not_the_command_line(
        monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    from airflow.sdk import DAG
    from tiered_spark import spark_task

    from tests.airflow.test_dagbag import _submit_with_fake_spark

    _set_conn(monkeypatch, "wasb_default", {"conn_type": "wasb", "login": "acct1", "password": SECRET})
    _set_conn(monkeypatch, "google_cloud_default", {"conn_type": "google_cloud_platform",
                                                    "extra": {"key_path": "/k.json", "project": "p1"}})
    with DAG("t", schedule=None, start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC)):
        op = spark_task("cleanup", "deletion_lag_cleanup", ["--as-of", "2026-01-01T00:00:00+00:00"])
    assert (op.wasb_conn_id, op.gcp_conn_id) == ("wasb_default", "google_cloud_default")
    declared = dict(op.env_vars)
    submit = _submit_with_fake_spark(monkeypatch)
    capfd.readouterr()
    cmd, env = submit(op)
    assert (env["AZURE_STORAGE_ACCOUNT"], env["AZURE_STORAGE_KEY"]) == ("acct1", SECRET)
    assert (env["GOOGLE_APPLICATION_CREDENTIALS"], env["GOOGLE_CLOUD_PROJECT"]) == ("/k.json", "p1")
    assert op.env_vars == declared
    assert SECRET not in " ".join(cmd)
    logged = "".join(capfd.readouterr())
    assert SECRET not in logged and "AZURE_STORAGE_KEY" in logged  # the names are logged, never the values


# -- preflight on the emulators ------------------------------------------------------------------------


def test_preflight_reaches_an_azure_container_through_the_wasb_connection(
        azurite, azure_store, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk.exceptions import AirflowFailException
    from tiered_airflow import TieredObjectStoreHook

    for var in ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT", "AZURE_STORAGE_KEY"):
        monkeypatch.delenv(var, raising=False)
    _set_conn(monkeypatch, "wasb_default", {"conn_type": "wasb",
                                            "extra": {"connection_string": azurite.connection_string}})
    result = TieredObjectStoreHook(f"azure://{azure_store.container}/p").check()
    assert result == f"container {azure_store.container!r} (connection wasb_default) is reachable"
    missing = f"missing-{uuid.uuid4().hex[:12]}"
    with pytest.raises(AirflowFailException, match=rf"container '{missing}' \(connection wasb_default\): .*"
                                                   "ContainerNotFound"):
        TieredObjectStoreHook(f"azure://{missing}/p").check()
    monkeypatch.delenv("AIRFLOW_CONN_WASB_DEFAULT")
    with pytest.raises(AirflowFailException, match="no credentials: set AZURE_STORAGE_CONNECTION_STRING"):
        TieredObjectStoreHook(f"azure://{azure_store.container}/p").check()


def test_preflight_reaches_a_gcs_bucket(gcs_emulator, gcs_store, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk.exceptions import AirflowFailException
    from tiered_airflow import TieredObjectStoreHook

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator.endpoint)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    _set_conn(monkeypatch, "google_cloud_default", {"conn_type": "google_cloud_platform",
                                                    "extra": {"project": "tiered-test"}})
    result = TieredObjectStoreHook(f"gs://{gcs_store.bucket_name}/p").check()
    assert result == f"bucket {gcs_store.bucket_name!r} (connection google_cloud_default) is reachable"
    missing = f"missing-{uuid.uuid4().hex[:12]}"
    with pytest.raises(AirflowFailException, match=rf"bucket '{missing}' \(connection google_cloud_default\)"):
        TieredObjectStoreHook(f"gs://{missing}/p").check()
