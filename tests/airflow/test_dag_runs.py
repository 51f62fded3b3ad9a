"""dag.test() runs of the DAGs: real spark-submit (local[2]) through the project's operator, against the
filesystem store and moto's S3 server; parameter validation and preflight failures without Spark."""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import time
from pathlib import Path
from urllib.parse import quote

import pytest

from tieredcore.formats.keys import is_topic_manifest_key

from .conftest import (
    SWEEP_AT,
    all_xcom_text,
    asset_events,
    make_workspace,
    run_dag,
    set_policy,
    topic_ledgers,
    verify,
    xcom,
)

HOUR_MS = 3600 * 1000


def _store_keys(config_path: Path) -> set[str]:
    from tieredcore.config import Config

    store, prefix = Config.load(config_path, env={}).open_store()
    keys, token = set(), None
    while True:
        page = store.list(prefix, token)
        keys |= {o.key for o in page.objects}
        token = page.next_token
        if token is None:
            return keys


def _assert_offloaded(config_path: Path, offloaded_ns: set[str]) -> int:
    """Every sealed ledger of the namespaces in `offloaded_ns` is complete with both objects in the store,
    the newest (open) ledger is not; other namespaces are untouched. Returns the offloaded count."""
    from tieredcore.config import Config
    from tieredcore.formats.keys import data_key, index_key
    from tieredcore.offload.managed import context_uuid

    prefix = Config.load(config_path, env={}).open_store()[1]
    keys = _store_keys(config_path)
    n = 0
    for topic, ledgers in topic_ledgers(config_path).items():
        ns = "/".join(topic.removeprefix("persistent://").split("/")[:2])
        *sealed, newest = ledgers
        assert not newest.offloadContext.complete, topic
        for li in sealed:
            if ns in offloaded_ns:
                assert li.offloadContext.complete, (topic, li.ledgerId)
                uuid = context_uuid(li)
                assert data_key(prefix, uuid, li.ledgerId) in keys
                assert index_key(prefix, uuid, li.ledgerId) in keys
                n += 1
            else:
                assert not li.offloadContext.complete, (topic, li.ledgerId)
    return n


@pytest.mark.slow
def test_sweep_then_deletion_lag_cleanup_on_s3(tmp_path: Path, spark_env, moto_endpoint: str, monkeypatch,
                                              capfd) -> None:
    """The offload and deletion-lag families end to end on an S3 server (moto): the endpoint in the store
    URL and in the aws_default connection; the connection's credentials reach spark-submit's environment
    and never the logs (moto accepts any credentials)."""
    import boto3
    from airflow.sdk import DagRunState, TaskInstanceState
    from tiered_airflow import tiered_run_id

    bucket = "tiered-airflow-e2e"
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    s3.create_bucket(Bucket=bucket)
    secret = "moto-e2e-secret-9f3c1d"
    conn = {"conn_type": "aws", "login": "AKIAMOTOE2E", "password": secret,
            "extra": {"endpoint_url": moto_endpoint, "region_name": "us-east-1"}}
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps(conn))
    store_url = f"s3://{bucket}/offloaded/?endpoint={moto_endpoint}&region=us-east-1"
    cfg = make_workspace(tmp_path / "ws", ["public/default", "acme/orders", "acme/archive", "acme/idle"],
                         store_url=store_url)
    set_policy(cfg, "public/default", offload_threshold_bytes=0, deletion_lag_ms=HOUR_MS)
    set_policy(cfg, "acme/orders", offload_threshold_bytes=0, deletion_lag_ms=-1)  # keep hot copies
    # acme/archive: no policy -> offload disabled -> not swept
    # acme/idle: offload on, but nothing is due (1 TiB may stay hot) -> planned, no Spark job
    set_policy(cfg, "acme/idle", offload_threshold_bytes=2**40)

    started = time.monotonic()
    dr, states = run_dag("tiered_offload_sweep", SWEEP_AT, {"config": str(cfg)})
    sweep_s = time.monotonic() - started
    assert dr.state == DagRunState.SUCCESS, states
    assert states["offload[0]"] == states["offload[1]"] == TaskInstanceState.SUCCESS
    assert "offload[2]" not in states
    assert states["summary"] == states["verdict"] == TaskInstanceState.SUCCESS

    planned = xcom(dr, "plan")
    assert sorted(a[1] for a in planned) == ["acme/orders", "public/default"]
    # two namespaces with work on two shards (the default spark_shards), the idle one with its reason
    order = [s["namespaces"] for s in xcom(dr, "plan", key="shards")]  # the larger namespace first
    assert sorted(order) == [["acme/orders"], ["public/default"]] and [a[1] for a in planned] == [o[0] for o in order]
    (idle,) = xcom(dr, "plan", key="nothing_due")
    assert idle["namespace"] == "acme/idle" and f"threshold {2**40} bytes hot" in idle["reason"]
    assert all(a[a.index("--as-of") + 1] == SWEEP_AT.isoformat() for a in planned)
    n = _assert_offloaded(cfg, {"public/default", "acme/orders"})
    assert n == 2 * 2 * 4

    totals = xcom(dr, "summary")
    assert totals["ledgers"] == n and totals["failures"] == 0 and not totals["failed_jobs"]
    assert totals["topics"] == 4 and totals["bytes"] > 0
    assert totals["outcomes"] == {"offloaded": n}
    assert set(totals["namespaces"]) == {"public/default", "acme/orders"}
    assert [(e["namespace"], e["reason"]) for e in totals["nothing_due"]] == [(idle["namespace"], idle["reason"])]
    # one tiered_offloaded asset event per namespace the run changed: not for acme/idle (nothing due)
    # nor acme/archive (offload off); they trigger the deletion-lag cleanup
    events = asset_events(dr)
    assert sorted(e["namespace"] for _, e in events) == ["acme/orders", "public/default"], events
    assert {name for name, _ in events} == {"tiered_offloaded"}
    assert all(e["ledgers"] == 8 and e["bytes"] > 0 and e["as_of"] == SWEEP_AT.isoformat() for _, e in events)
    assert states["announce"] == TaskInstanceState.SUCCESS and xcom(dr, "announce") == ["acme/orders", "public/default"]
    rid = tiered_run_id(dr.run_id)  # the DAG run's reports: one directory, one part per mapped task
    run = tmp_path / "ws" / "reports" / "tiered_offload_sweep" / rid
    for i, names in enumerate(order):  # one part per shard
        part = run / f"offload.{i}"
        summary = json.loads((part / "summary.json").read_text())
        assert summary["failures"] == 0 and summary["ledgers"] == 8 and summary["attempt"] == 1
        assert (summary["dag_run_id"], summary["task_id"], summary["map_index"], summary["planned_namespaces"]) == (
            dr.run_id, "offload", i, names)
        assert (part / "detail.parquet").is_dir()
        # the task's try number reached the job: its attempt's report, and the link to its page
        assert json.loads((part / "attempt-1" / "summary.json").read_text()) == summary
        link = xcom(dr, "offload", key="_link_TieredReportLink", map_index=i)
        assert link == f"/tiered/reports/tiered_offload_sweep/{quote(rid, safe='')}/offload.{i}/attempt-1/"
    record = json.loads((run / "run.json").read_text())  # the summary task's: one report for the run
    assert [(p["part"], p["namespaces"], p["outcome"]) for p in record["parts"]] == [
        (f"offload.{i}", names, "ok") for i, names in enumerate(order)]
    assert record["missing_parts"] == [] and [e["namespace"] for e in record["nothing_due"]] == ["acme/idle"]
    rendered = {ti.map_index: ti.rendered_map_index for ti in dr.get_task_instances() if ti.task_id == "offload"}
    assert rendered == {0: order[0][0], 1: order[1][0]}
    keys = {o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="offloaded/")
            for o in page.get("Contents", []) if not is_topic_manifest_key(o["Key"], "offloaded/")}
    assert len(keys) == 2 * n + 1 and "offloaded/tiered-owner.standalone" in keys  # + the owner marker
    verify(cfg)

    # deletion-lag cleanup 2 h later: public/default (lag 1 h) loses its hot copies, acme/orders keeps them
    from tieredcore.config import Config
    from tieredcore.workspace import Workspace

    started = time.monotonic()
    dr2, states2 = run_dag("tiered_deletion_lag_cleanup", SWEEP_AT + dt.timedelta(hours=2), {"config": str(cfg)})
    lag_s = time.monotonic() - started
    assert dr2.state == DagRunState.SUCCESS, states2
    with Workspace(Config.load(cfg, env={})) as ws:
        hot = set(ws.hot.list_ledgers())
    deleted = 0
    for topic, ledgers in topic_ledgers(cfg).items():
        for li in ledgers[:-1]:
            gone = topic.startswith("persistent://public/default/")
            assert li.offloadContext.bookkeeperDeleted == gone, (topic, li.ledgerId)
            assert (li.ledgerId in hot) != gone, (topic, li.ledgerId)
            deleted += gone
        assert ledgers[-1].ledgerId in hot
    assert deleted == 8
    # phase 1 marked them (a `ledger` record each, then bookkeeperDeleted); the job's --drain pass
    # (default on) deleted them and left nothing in the deletion log
    totals2 = xcom(dr2, "summary")
    assert totals2["outcomes"] == {"marked": 8} and totals2["failures"] == 0
    report2 = (tmp_path / "ws" / "reports" / "tiered_deletion_lag_cleanup" / tiered_run_id(dr2.run_id) / "cleanup" /
               "summary.json")
    summary2 = json.loads(report2.read_text())
    assert summary2["outcomes"] == {"marked": 8}
    assert summary2["drain"]["deleted_hot"] == summary2["drain"]["acknowledged"] == 8
    with Workspace(Config.load(cfg, env={})) as ws:
        assert ws.deletion_log.pending() == [] and ws.deletion_log.counters()["appended_hot"] == 8
    assert xcom(dr2, "cleanup", key="_link_TieredReportLink") == (
        f"/tiered/reports/tiered_deletion_lag_cleanup/{quote(tiered_run_id(dr2.run_id), safe='')}/cleanup/attempt-1/")
    res = verify(cfg)
    assert res["verified"] == 8 and res["failed"] == 0
    out, err = capfd.readouterr()
    assert "--master local[2]" in out + err  # the task log (spark-submit command line) was captured
    # the jobs' own lines carry their level, the last one is the outcome; Spark's INFO lines are off
    assert out.count("INFO offload_sweep: outcome ok: 2 topic(s), 8 unit(s)") == 2
    assert "INFO deletion_lag_cleanup: outcome ok:" in out
    assert "INFO SparkContext:" not in out + err and "Running Spark version" not in out + err
    assert secret not in out + err
    logs = Path(os.environ["AIRFLOW_HOME"]) / "logs"
    for f in [*(logs.rglob("*") if logs.exists() else []), *(tmp_path / "ws" / "reports").rglob("*")]:
        if f.is_file():  # task logs, and every report (summaries, details) of both runs
            assert secret.encode() not in f.read_bytes(), f
    for run in (dr, dr2):
        xcoms = all_xcom_text(run)
        assert xcoms and secret not in xcoms and "AKIAMOTOE2E" not in xcoms
    from fastapi.testclient import TestClient
    from tiered_web import create_app

    view = TestClient(create_app(lambda: Config.load(cfg), secured=False))  # the view: its page and data
    for page in ("/overview", "/overview.json", "/reports/tiered_offload_sweep/"):
        r = view.get(page)
        assert r.status_code == 200 and secret not in r.text, page
    print(f"timings: sweep DAG {sweep_s:.1f}s (2 Spark jobs), lag cleanup DAG {lag_s:.1f}s")


def test_offload_topic_rejects_bad_params_before_spark(tmp_path: Path) -> None:
    """The validate task refuses bad params (the rules are tieredcore's ManualOffload.parse and topic
    names, tested there; here: that a refusal fails the run before any Spark job)."""
    from airflow.sdk import DagRunState, TaskInstanceState

    from tieredcore.errors import ValidationError
    from tieredcore.lifecycle.planner import ManualOffload

    names = ("up_to", "keep_bytes")
    for up_to, keep in [("1:0", 0), ("", None), ("abc", None), ("2", None), (f"{2**63}:0", None),
                        ("", f"{2**63 // 1024}K")]:
        with pytest.raises(ValidationError):
            ManualOffload.parse(up_to, keep, names=names)

    cfg = make_workspace(tmp_path / "ws", ["public/default"], topics=1, ledgers=2, entries=20)
    bad = [
        {"topic": "public/default/topic-0000", "mode": "keep_bytes", "value": "1:0"},  # a position, not a size
        {"topic": "public/default/topic-0000", "mode": "up_to", "value": "64M"},  # a size, not a position
        {"topic": "public/default/nope", "mode": "keep_bytes", "value": "0"},  # unknown
    ]
    for i, params in enumerate(bad):
        dr, states = run_dag("tiered_offload_topic", SWEEP_AT + dt.timedelta(minutes=i),
                             {"config": str(cfg), **params})
        assert dr.state == DagRunState.FAILED, (params, states)
        assert states["validate"] == TaskInstanceState.FAILED, (params, states)
        assert states["offload"] == TaskInstanceState.UPSTREAM_FAILED, (params, states)
        # nothing ran: the summary is skipped, never green in a failed run
        assert states["summary"] == TaskInstanceState.SKIPPED, (params, states)
        assert states["verdict"] == TaskInstanceState.UPSTREAM_FAILED, (params, states)
    # what the params' schemas can check is refused before a run exists, in words (no regex)
    from airflow.sdk.exceptions import ParamValidationError

    for params, words in (({"topic": "public/default/../etc", "value": "0"}, "is not a 'topic name"),
                          ({"topic": "public/default/topic-0000", "value": "64Q"}, "is not a 'position"),
                          ({"topic": "public/default/topic-0000", "mode": "both", "value": "0"}, "is not one of")):
        with pytest.raises(ParamValidationError, match=words):
            run_dag("tiered_offload_topic", SWEEP_AT + dt.timedelta(minutes=9), {"config": str(cfg), **params})
    assert not list((tmp_path / "ws" / "reports").glob("*/*/*/summary.json"))  # no Spark job wrote a report
    assert all(not li.offloadContext.complete for ls in topic_ledgers(cfg).values() for li in ls)


@pytest.mark.slow
def test_offload_topic_keep_bytes_zero_offloads_only_that_topic(tmp_path: Path, spark_env) -> None:
    from airflow.sdk import DagRunState

    cfg = make_workspace(tmp_path / "ws", ["public/default"], topics=2, ledgers=3, entries=50)
    topic = "persistent://public/default/topic-0001"
    dr, states = run_dag("tiered_offload_topic", SWEEP_AT + dt.timedelta(days=2),
                         {"config": str(cfg), "topic": "public/default/topic-0001", "mode": "keep_bytes",
                          "value": "0K"})
    assert dr.state == DagRunState.SUCCESS, states
    args = xcom(dr, "validate")
    assert args[args.index("--as-of") + 1] == (SWEEP_AT + dt.timedelta(days=2)).isoformat()
    assert args[args.index("--keep-bytes") + 1] == "0"  # the size text is parsed before Spark starts
    # Pulsar's `offload -s 0`: the empty open ledger alone is within 0 bytes, so every sealed ledger goes
    for t, ledgers in topic_ledgers(cfg).items():
        *sealed, _open = ledgers
        for li in sealed:
            assert li.offloadContext.complete == (t == topic), (t, li.ledgerId)
    assert xcom(dr, "summary")["ledgers"] == 3
    verify(cfg)


def test_preflight_fails_fast_on_unreachable_s3(tmp_path: Path, monkeypatch) -> None:
    from airflow.sdk import DagRunState, TaskInstanceState

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps(
        {"conn_type": "aws", "login": "k", "password": "s", "extra": {"endpoint_url": endpoint}}))
    # `tiered init` claims its store, so it would refuse an unreachable one: the workspace is created on the
    # embedded store and then pointed at the S3 endpoint, as when a store becomes unreachable later
    cfg = make_workspace(tmp_path / "ws", ["public/default"], topics=1, ledgers=1, entries=5)
    from dataclasses import replace

    from tieredcore.config import Config

    cfg.write_text(replace(Config.load(cfg, env={}), store_url=f"s3://bucket-x/p?endpoint={endpoint}").to_toml())
    set_policy(cfg, "public/default", offload_threshold_bytes=0)

    dr, states = run_dag("tiered_offload_sweep", SWEEP_AT + dt.timedelta(days=3), {"config": str(cfg)})
    assert dr.state == DagRunState.FAILED
    assert states["preflight"] == TaskInstanceState.FAILED
    assert states["plan"] == TaskInstanceState.UPSTREAM_FAILED
    assert states["offload"] == TaskInstanceState.UPSTREAM_FAILED  # no Spark job started
    assert states["verdict"] == TaskInstanceState.UPSTREAM_FAILED
    assert not list((tmp_path / "ws" / "reports").glob("*/*/*/summary.json"))  # no Spark job wrote a report


def test_preflight_fails_fast_on_unreachable_zookeeper(tmp_path: Path) -> None:
    from dataclasses import replace

    from airflow.sdk import DagRunState, TaskInstanceState

    from tieredcore.config import Config

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = make_workspace(tmp_path / "ws", ["public/default"], topics=1, ledgers=1, entries=5)
    set_policy(cfg, "public/default", offload_threshold_bytes=0)
    cfg.write_text(replace(Config.load(cfg, env={}), metadata_url=f"zk://127.0.0.1:{port}/tiered?timeout=1s").to_toml())

    dr, states = run_dag("tiered_offload_sweep", SWEEP_AT + dt.timedelta(days=3), {"config": str(cfg)})
    assert dr.state == DagRunState.FAILED
    assert states["preflight"] == TaskInstanceState.FAILED
    assert states["offload"] == TaskInstanceState.UPSTREAM_FAILED  # no Spark job started
    assert not list((tmp_path / "ws" / "reports").glob("*/*/*/summary.json"))  # no Spark job wrote a report
