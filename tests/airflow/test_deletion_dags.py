"""The two-phase-deletion DAGs (tiered_retention, tiered_deletion_drain, tiered_orphan_reconciliation):
structure and conventions, parameter validation before Spark, the summary of the jobs' reports, and one
dag.test() run of tiered_retention (real spark-submit, filesystem store) that trims, marks and drains."""

from __future__ import annotations

import datetime as dt
import json
import sys
import time
from pathlib import Path
from urllib.parse import quote

import pytest

from tieredcore.lifecycle.drain import DrainReport, DrainRow
from tieredcore.lifecycle.work import LedgerRunReport, RunSummary
from tieredcore.reports import summary_document

from .conftest import (
    END,
    REPO,
    asset_events,
    asset_of,
    cron_of,
    make_workspace,
    run_dag,
    set_policy,
    topic_ledgers,
    xcom,
)

NEW_DAGS = ("tiered_retention", "tiered_deletion_drain", "tiered_orphan_reconciliation")
MINUTE_MS = 60 * 1000


def _bag():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert not bag.import_errors, bag.import_errors
    return bag


def _edges(dag) -> set[tuple[str, str]]:
    return {(t.task_id, d) for t in dag.tasks for d in t.downstream_task_ids}


# -- structure ------------------------------------------------------------------------------------


def test_deletion_dags_structure_and_conventions() -> None:
    from airflow.sdk import TriggerRule
    from tiered_airflow import TieredSparkSubmitOperator

    bag = _bag()
    expected = {
        "tiered_retention": ("0 * * * *", {"config", "dry_run", "namespaces"},
                             ["preflight", "plan", "retention", "drain", "summary", "verdict"],
                             {"retention": "retention_sweep", "drain": "deletion_drain"}),
        "tiered_deletion_drain": ("*/10 * * * *", {"config", "dry_run", "max_attempts", "retry_delay_ms"},
                                  ["preflight", "plan", "drain", "summary", "verdict"],
                                  {"drain": "deletion_drain"}),
        "tiered_orphan_reconciliation": ("0 0 * * *", {"config", "dry_run", "grace", "apply"},
                                         ["preflight", "plan", "reconcile", "summary", "verdict"],
                                         {"reconcile": "reconcile_orphans"}),
    }
    for dag_id, (schedule, params, order, spark) in expected.items():
        dag = bag.get_dag(dag_id)
        assert cron_of(dag) == schedule, dag_id
        assert dag.max_active_runs == 1 and dag.catchup is False, dag_id
        assert {"tiered-storage", "spark", "deletion"} <= set(dag.tags), dag_id
        assert dag.doc_md and len(dag.doc_md) > 400 and dag.description, dag_id
        assert set(dag.params.keys()) == params, dag_id
        assert dag.params["dry_run"] is False, dag_id
        # retention and reconciliation announce the records they appended (asset events for the drain)
        announces = dag_id != "tiered_deletion_drain"
        assert sorted(t.task_id for t in dag.tasks) == sorted(order + ["announce"] * announces), dag_id
        # a chain in that order (the verdict also waits on the Spark tasks)
        edges = _edges(dag)
        for a, b in zip(order, order[1:], strict=False):
            assert (a, b) in edges, (dag_id, a, b, edges)
        for task_id in spark:
            assert (task_id, "verdict") in edges, (dag_id, task_id)
        if announces:
            assert ("summary", "announce") in edges
            assert [o.name for o in dag.get_task("announce").outlets] == ["tiered_deletion_events"], dag_id
        for t in dag.tasks:
            assert t.owner == "tiered", (dag_id, t.task_id)
            assert t.execution_timeout is not None, (dag_id, t.task_id)
            if isinstance(t, TieredSparkSubmitOperator):
                assert t.task_id in spark, (dag_id, t.task_id)
                assert t.retries >= 1 and t.retry_exponential_backoff, (dag_id, t.task_id)
                assert t.job == spark[t.task_id]
                assert t.application == str(REPO / "spark_jobs" / f"{t.job}.py")
                assert Path(t.application).is_file(), t.application
                assert t.name.startswith(f"tiered-{t.job}-")
                assert t.env_vars["TIERED_CONFIG"] == "{{ params.config }}"
            elif t.task_id in ("preflight", "plan", "summary", "verdict"):
                assert t.retries == 0, (dag_id, t.task_id)  # quick Python tasks fail fast
        assert {t.task_id for t in dag.tasks if isinstance(t, TieredSparkSubmitOperator)} == set(spark), dag_id
        assert dag.get_task("summary").trigger_rule == TriggerRule.ALL_DONE
        assert dag.get_task("verdict").trigger_rule == TriggerRule.NONE_FAILED

    # phase 2 also runs after a failed phase 1 (never without a plan)
    retention = bag.get_dag("tiered_retention")
    assert retention.get_task("drain").trigger_rule == TriggerRule.ALL_DONE_MIN_ONE_SUCCESS
    assert "plan" in retention.get_task("drain").upstream_task_ids
    assert retention.params["namespaces"] == []
    recon = bag.get_dag("tiered_orphan_reconciliation")
    assert recon.params["grace"] == "" and recon.params["apply"] is False  # the job's default grace: 1h, 7d attached
    # the drain DAG's param defaults are the job's defaults
    from tieredcore.meta.deletion_log import DEFAULT_MAX_ATTEMPTS, DEFAULT_RETRY_DELAY_MS

    drain = bag.get_dag("tiered_deletion_drain")
    assert drain.params["max_attempts"] == DEFAULT_MAX_ATTEMPTS
    assert drain.params["retry_delay_ms"] == DEFAULT_RETRY_DELAY_MS
    assert asset_of(bag.get_dag("tiered_deletion_drain")).name == "tiered_deletions_pending"  # or its clock


def test_deletion_dag_schedules_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERED_RETENTION_SCHEDULE", "30 * * * *")
    monkeypatch.setenv("TIERED_DRAIN_SCHEDULE", "*/2 * * * *")
    monkeypatch.setenv("TIERED_RECONCILE_SCHEDULE", "none")
    saved = sys.modules.pop("tiered_common")  # re-read the environment as a fresh parse would
    try:
        bag = _bag()
        assert cron_of(bag.get_dag("tiered_retention")) == "30 * * * *"
        assert cron_of(bag.get_dag("tiered_deletion_drain")) == "*/2 * * * *"
        assert bag.get_dag("tiered_orphan_reconciliation").schedule is None
    finally:
        sys.modules["tiered_common"] = saved


# -- the summary of the jobs' reports ---------------------------------------------------------------


def _write(reports: Path, group: str, run_id: str, part: str, job: str, report) -> None:
    """A part's report of a DAG run where the Spark job puts it (tieredcore.reports layout)."""
    from tieredcore.reports import report_name

    d = reports / group / report_name(run_id) / part
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps(summary_document(report, job, run_id, 1.0)))


def test_summary_adds_up_the_totals_of_every_job(tmp_path: Path) -> None:
    """The summary task reads each part's `totals` (the same shape for every job), sums them per run
    and per namespace, and counts a planned part without a report as failed."""
    from tieredcore.reports import RunReports, planned_parts, run_record

    reports = RunReports(tmp_path)
    drain = DrainReport(0, entries=3, deleted=2, dead_lettered=1, deleted_hot=2, acknowledged=2, rows=[
        DrainRow("1", "persistent://a/b/t", 1, "ledger", "retention", "deleted"),
        DrainRow("2", "persistent://a/b/t", 2, "ledger", "retention", "deleted"),
        DrainRow("3", "persistent://c/d/t", 3, "offloaded", "orphan", "dead_lettered", "boom")])
    _write(tmp_path, "d", "r1", "drain.0", "deletion_drain", drain)
    _write(tmp_path, "d", "r1", "drain.1", "deletion_drain", DrainReport(0, task_errors=["hot: 5 record(s) not processed"]))
    three = planned_parts("drain", "deletion_drain", [["--as-of", "t"]] * 3)
    t = run_record(reports, "d", "r1", {"deletion_drain": three})["totals"]
    assert (t["jobs"], t["ledgers"], t["failures"], t["failed_jobs"]) == (3, 3, 2, ["drain.2"])
    assert t["outcomes"] == {"deleted": 2, "dead_lettered": 1}
    assert t["counters"]["deleted_hot"] == 2 and t["counters"]["acknowledged"] == 2
    assert t["namespaces"]["c/d"] == {"ledgers": 1, "bytes": 0, "failures": 1, "outcomes": {"dead_lettered": 1}}

    rows = [{"topic": "persistent://a/b/t", "namespace": "a/b", "ledger": lid, "kind": "lag-cleanup",
             "outcome": "marked", "bytes": 10, "blocks": 0, "entries": 0, "seconds": 0.0, "uuid": "", "error": ""}
            for lid in (1, 2)]
    sweep = LedgerRunReport(RunSummary.of("retention_sweep", "r2", 0, False, rows, 1.0), rows)
    _write(tmp_path, "tiered_retention", "r2", "retention", "retention_sweep", sweep)
    _write(tmp_path, "tiered_retention", "r2", "drain.0", "deletion_drain", drain)
    both = run_record(reports, "tiered_retention", "r2", {
        "retention_sweep": planned_parts("retention", "retention_sweep", ["--as-of", "t"]),
        "deletion_drain": planned_parts("drain", "deletion_drain", [["--as-of", "t"]] * 2)})["totals"]
    assert both["job"] == "retention_sweep+deletion_drain" and both["jobs"] == 3
    assert both["ledgers"] == 5 and both["failures"] == 1 and both["bytes"] == 20
    assert both["failed_jobs"] == ["deletion_drain/drain.1"]
    assert both["outcomes"]["retention_sweep.marked"] == 2 and both["outcomes"]["deletion_drain.deleted"] == 2
    assert both["by_job"]["deletion_drain"]["counters"]["deleted_hot"] == 2


def test_summary_counts_a_report_without_totals_as_a_failed_part(tmp_path: Path) -> None:
    from tieredcore.reports import RunReports, planned_parts, report_name, run_record

    part = tmp_path / "d" / report_name("old") / "drain"
    part.mkdir(parents=True)
    (part / "summary.json").write_text(json.dumps({"entries": 3}))
    rec = run_record(RunReports(tmp_path), "d", "old", {"deletion_drain": planned_parts("drain", "deletion_drain",
                                                                                      ["--as-of", "t"])})
    assert rec["totals"]["failed_jobs"] == ["drain"] and rec["missing_parts"] == ["drain"]


# -- parameter validation (no Spark) --------------------------------------------------------------


def test_bad_params_fail_before_spark(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk import DagRunState, TaskInstanceState

    cfg = make_workspace(tmp_path / "ws", ["public/default"], topics=1, ledgers=1, entries=5)
    at = END + dt.timedelta(days=10)
    alerts = tmp_path / "alerts.jsonl"  # the failure hook point (TIERED_ON_FAILURE_CALLBACK) is called
    monkeypatch.setenv("TIERED_ON_FAILURE_CALLBACK", "tests.support.alerts:record")
    monkeypatch.setenv("TIERED_TEST_ALERTS", str(alerts))
    dr, states = run_dag("tiered_orphan_reconciliation", at, {"config": str(cfg), "grace": "soon"})
    assert dr.state == DagRunState.FAILED
    assert states["plan"] == TaskInstanceState.FAILED
    assert states["reconcile"] == TaskInstanceState.UPSTREAM_FAILED
    called = [json.loads(line) for line in alerts.read_text().splitlines()]
    assert {"task_id": "plan", "dag_id": "tiered_orphan_reconciliation"}.items() <= called[0].items(), called
    assert "grace" in called[0]["exception"]
    monkeypatch.delenv("TIERED_ON_FAILURE_CALLBACK")

    from airflow.sdk.exceptions import ParamValidationError

    with pytest.raises(ParamValidationError, match="namespaces"):  # the trigger form's own check
        run_dag("tiered_retention", at, {"config": str(cfg), "namespaces": ["not-a-namespace"]})
    dr, states = run_dag("tiered_retention", at, {"config": str(cfg), "namespaces": ["public/.."]})
    assert dr.state == DagRunState.FAILED
    assert states["plan"] == TaskInstanceState.FAILED
    assert states["retention"] == TaskInstanceState.UPSTREAM_FAILED
    assert states["drain"] == TaskInstanceState.UPSTREAM_FAILED  # never without a plan
    assert states["verdict"] == TaskInstanceState.UPSTREAM_FAILED

    dr, states = run_dag("tiered_deletion_drain", at, {"config": str(tmp_path / "missing.toml")})
    assert dr.state == DagRunState.FAILED
    assert states["preflight"] == TaskInstanceState.FAILED
    assert states["plan"] == TaskInstanceState.UPSTREAM_FAILED
    assert states["drain"] == TaskInstanceState.UPSTREAM_FAILED
    assert not any((tmp_path / "ws" / "reports").glob("*/*/*/summary.json"))  # no job ran: no part wrote a report


def test_nothing_due_starts_no_spark_job(tmp_path: Path) -> None:
    """A deletion-lag cleanup, a drain and a retention run with nothing due skip their Spark tasks (no
    spark-submit, no report) and succeed; the summary says what had nothing due."""
    from airflow.sdk import DagRunState, TaskInstanceState

    cfg = make_workspace(tmp_path / "ws", ["public/default"], topics=1, ledgers=2, entries=5)
    set_policy(cfg, "public/default", offload_threshold_bytes=0, deletion_lag_ms=60 * MINUTE_MS)  # nothing offloaded
    at = END + dt.timedelta(days=1)
    for dag_id, spark in (("tiered_deletion_lag_cleanup", ["cleanup"]), ("tiered_deletion_drain", ["drain"]),
                          ("tiered_retention", ["retention", "drain"])):
        dr, states = run_dag(dag_id, at, {"config": str(cfg)})
        assert dr.state == DagRunState.SUCCESS, (dag_id, states)
        assert all(states[t] == TaskInstanceState.SKIPPED for t in spark), (dag_id, states)
        assert states["summary"] == states["verdict"] == TaskInstanceState.SUCCESS, (dag_id, states)
        if dag_id == "tiered_retention":
            assert xcom(dr, "plan", key="retention_sweep") == xcom(dr, "plan", key="deletion_drain") == []
        else:
            assert xcom(dr, "plan") == []
        totals = xcom(dr, "summary")
        assert totals["jobs"] == 0 and totals["nothing_due"] and not totals["failed_jobs"]
        assert asset_events(dr) == []  # nothing changed: nothing announced
    assert not (tmp_path / "ws" / "reports").exists() or not any((tmp_path / "ws" / "reports").rglob("summary.json"))


# -- one end-to-end run ---------------------------------------------------------------------------


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


def _entries(ws, topic: str) -> dict[tuple[int, int], bytes]:
    return {(p.ledger_id, p.entry_id): data for p, data in ws.reader().read(topic)}


@pytest.mark.slow
def test_retention_dag_trims_marks_and_drains_on_filesystem_store(tmp_path: Path, spark_env) -> None:
    """public/default: retention 75 min, hot copies kept (lag -1): at END + 1 h the two oldest of four
    sealed ledgers (closed 90 and 80 min before) go from the topic, the hot tier and the object store.
    acme/orders: no retention, deletion lag 30 min after offloads completed at END + 15 min: every hot
    copy goes, the offloaded copies stay and serve the reads. Afterwards the log is empty and every
    retained entry reads back identical."""
    from airflow.sdk import DagRunState, TaskInstanceState
    from tiered_airflow import tiered_run_id

    from tieredcore.config import Config
    from tieredcore.formats.keys import data_key, index_key
    from tieredcore.meta.deletion_log import DeletionLog
    from tieredcore.offload.managed import context_uuid
    from tieredcore.workspace import Workspace

    cfg = make_workspace(tmp_path / "ws", ["public/default", "acme/orders"], topics=2, ledgers=4, entries=40)
    set_policy(cfg, "public/default", offload_threshold_bytes=0, deletion_lag_ms=-1, retention_time_minutes=75)
    set_policy(cfg, "acme/orders", offload_threshold_bytes=0, deletion_lag_ms=30 * MINUTE_MS)
    offloaded_at = int((END + dt.timedelta(minutes=15)).timestamp() * 1000)
    config = Config.load(cfg, env={})
    before: dict[str, dict] = {}
    with Workspace(config) as ws:
        ps = ws.policies
        for ns in ("public/default", "acme/orders"):
            for t in ws.ml.list_topics(ns):
                info, _ = ws.ml.get_topic(t)
                sealed = [li.ledgerId for li in info.ledgerInfo[:-1]]
                tof = ws.topic_offloader(clock_ms=lambda: offloaded_at,
                                         offloader=ws.offloader_for_policy(ps.for_topic(t)))
                assert all(r.outcome == "offloaded" for r in tof.offload_ledgers(t, sealed))
                before[t.full] = _entries(ws, t.full)
    prefix = config.open_store()[1]
    layout = topic_ledgers(cfg)  # topic -> LedgerInfo list, all sealed ones offloaded
    keys_before = _store_keys(cfg)
    trimmed = {t: [li.ledgerId for li in ls[:2]] for t, ls in layout.items() if "/public/default/" in t}
    lagged = {t: [li.ledgerId for li in ls[:-1]] for t, ls in layout.items() if "/acme/orders/" in t}
    assert len(trimmed) == len(lagged) == 2

    at = END + dt.timedelta(hours=1)
    started = time.monotonic()
    dr, states = run_dag("tiered_retention", at, {"config": str(cfg)})
    run_s = time.monotonic() - started
    assert dr.state == DagRunState.SUCCESS, states
    assert all(s == TaskInstanceState.SUCCESS for s in states.values()), states
    planned = {job: xcom(dr, "plan", key=job) for job in ("retention_sweep", "deletion_drain")}
    as_of = planned["retention_sweep"][planned["retention_sweep"].index("--as-of") + 1]
    assert as_of == at.isoformat() == planned["deletion_drain"][planned["deletion_drain"].index("--as-of") + 1]
    # one tiered_deletions_pending event per namespace with records appended (public/default trimmed,
    # acme/orders marked): the drain DAG runs on them
    events = {e["namespace"]: (name, e) for name, e in asset_events(dr)}
    assert set(events) == {"public/default", "acme/orders"}, events
    assert events["public/default"][0] == events["acme/orders"][0] == "tiered_deletions_pending"
    assert events["public/default"][1]["trimmed"] == 4 and events["acme/orders"][1]["marked"] == 8

    after = topic_ledgers(cfg)
    with Workspace(config) as ws:
        hot = set(ws.hot.list_ledgers())
        assert DeletionLog(ws.metadata).stats()["in_flight"] == 0
        assert DeletionLog(ws.metadata).stats()["dead_letter"] == 0
        keys = _store_keys(cfg)
        for topic, ledgers in layout.items():
            now = {li.ledgerId: li for li in after[topic]}
            for li in ledgers:
                lid, uuid = li.ledgerId, context_uuid(li)
                objects = {data_key(prefix, uuid, lid), index_key(prefix, uuid, lid)} if uuid else set()
                if lid in trimmed.get(topic, ()):  # gone from the topic and from both tiers
                    assert lid not in now and lid not in hot, (topic, lid)
                    assert objects and not objects & keys, (topic, lid)
                elif lid in lagged.get(topic, ()):  # hot copy gone, offloaded copy kept
                    assert now[lid].offloadContext.bookkeeperDeleted and lid not in hot, (topic, lid)
                    assert objects <= keys, (topic, lid)
                else:  # retained as it was
                    assert lid in now and lid in hot, (topic, lid)
                    assert not now[lid].offloadContext.bookkeeperDeleted
                    assert objects <= keys, (topic, lid)
            # every retained entry reads back identical (acme/orders from the object store only)
            kept = {pos: data for pos, data in before[topic].items() if pos[0] not in trimmed.get(topic, ())}
            assert _entries(ws, topic) == kept, topic
            if topic in trimmed:
                assert 0 < len(kept) < len(before[topic]), topic
            else:
                assert len(kept) == len(before[topic]), topic
    n_trimmed = sum(len(v) for v in trimmed.values())
    n_lagged = sum(len(v) for v in lagged.values())
    assert len(keys_before - keys) == 2 * n_trimmed  # data + index of each trimmed ledger, nothing else

    totals = xcom(dr, "summary")
    assert totals["failures"] == 0 and not totals["failed_jobs"], totals
    sweep = totals["by_job"]["retention_sweep"]
    assert sweep["outcomes"] == {"trimmed": n_trimmed, "marked": n_lagged}, sweep
    drain = totals["by_job"]["deletion_drain"]
    # one record per hot copy and per offload uuid of each trimmed ledger, one per lag-expired hot copy
    assert drain["outcomes"] == {"deleted": 2 * n_trimmed + n_lagged}, drain
    assert drain["counters"]["deleted_hot"] == n_trimmed + n_lagged
    assert drain["counters"]["deleted_offloaded"] == n_trimmed
    rid = tiered_run_id(dr.run_id)  # the run key: one directory for the DAG run, one part per Spark task
    run = tmp_path / "ws" / "reports" / "tiered_retention" / rid
    for job, task_id in (("retention_sweep", "retention"), ("deletion_drain", "drain")):
        summary = json.loads((run / task_id / "summary.json").read_text())
        assert (summary["job"], summary["dag_run_id"], summary["part"]) == (job, dr.run_id, task_id)
        assert (run / task_id / "detail.parquet").is_dir() and (run / task_id / "attempt-1" / "summary.json").is_file()
        assert xcom(dr, task_id, key="_link_TieredReportLink") == (
            f"/tiered/reports/tiered_retention/{quote(rid, safe='')}/{task_id}/attempt-1/")
    record = json.loads((run / "run.json").read_text())  # one run.json with each job's totals
    assert [p["part"] for p in record["parts"]] == ["retention", "drain"] and record["totals"] == {
        k: v for k, v in totals.items() if k not in ("nothing_due", "missing_parts", "run_report", "run_key")}

    print(f"timings: tiered_retention DAG {run_s:.1f}s (2 Spark jobs)")


def test_a_run_on_asset_events_covers_the_namespaces_they_name() -> None:
    """triggering_namespaces reads the events' extras (a run on the clock or by hand has none: every
    namespace) -- the lag cleanup's plan passes them as --namespace."""
    import types

    from tiered_assets import DELETIONS_PENDING, OFFLOADED, offloaded_namespaces, triggering_namespaces

    ev = [types.SimpleNamespace(extra={"namespace": ns}) for ns in ("b/y", "a/x", "b/y")]
    ev.append(types.SimpleNamespace(extra={}))
    assert triggering_namespaces({"triggering_asset_events": {OFFLOADED: ev}}, OFFLOADED) == ["a/x", "b/y"]
    assert triggering_namespaces({"triggering_asset_events": {OFFLOADED: ev}}, DELETIONS_PENDING) == []
    assert triggering_namespaces({}, OFFLOADED) == []
    # what the sweep announces: namespaces with something offloaded (or a damaged copy replaced) only
    totals = {"namespaces": {"a/x": {"ledgers": 3, "bytes": 10, "outcomes": {"offloaded": 3}},
                             "b/y": {"ledgers": 2, "bytes": 0, "outcomes": {"busy": 1, "failed": 1}},
                             "c/z": {"ledgers": 1, "bytes": 5, "segments": 1, "outcomes": {"offloaded": 1, "held": 1}}}}
    assert offloaded_namespaces(totals) == {"a/x": {"ledgers": 3, "bytes": 10, "segments": 0},
                                            "c/z": {"ledgers": 1, "bytes": 5, "segments": 1}}
