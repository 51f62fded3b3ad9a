"""The core planners on an attached workspace: the brokers' jobs (offload, manual offload, deletion-lag
cleanup, retention, compaction) plan nothing and say so in one line each, the same for the CLI, the Spark
jobs' drivers and the DAGs; scrub still plans; a reader that does not skip BookKeeper's ledgers says
"in BookKeeper (ledger N)"."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_jobs.retention_sweep import plan_units
from tests.support.pulsar_cluster import BASE_MS, HOUR_MS, LOCAL
from tieredcore.attach import attached_config, check_attach
from tieredcore.errors import InBookKeeperError
from tieredcore.lifecycle.compaction_run import plan_topics
from tieredcore.lifecycle.planner import ManualOffload
from tieredcore.lifecycle.retention import plan_retention
from tieredcore.lifecycle.scrub import plan_scrub
from tieredcore.lifecycle.sweep import plan_lag_cleanup, plan_manual_offload, plan_offload
from tieredcore.workspace import Workspace

LATER = BASE_MS + 30 * 24 * HOUR_MS  # everything is past every threshold, lag and retention by then


@pytest.fixture
def ws(pulsar_cluster, tmp_path: Path):
    cluster = pulsar_cluster(driver=LOCAL)
    cfg, _ = check_attach(attached_config(tmp_path / "ws", cluster.pulsar_zk, cluster.store_url, None),
                          cluster_given=False, brokers_default=True)
    with Workspace(cfg) as w:
        yield w


def lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "tieredcore.lifecycle.work"]


def test_the_brokers_jobs_plan_nothing_and_say_why(ws, caplog):
    tail = "attached to Pulsar cluster 'pulsar-a', whose brokers do"
    cases = [
        (lambda: plan_offload(ws, None, LATER), f"offload sweep: skipped every namespace: {tail} offloading"),
        (lambda: plan_offload(ws, ["acme/orders"], LATER), f"offload sweep: skipped acme/orders: {tail} offloading"),
        (lambda: plan_lag_cleanup(ws, None, LATER),
         f"deletion-lag cleanup: skipped every namespace: {tail} deleting BookKeeper copies after the offload "
         "deletion lag"),
        (lambda: plan_retention(ws, ["acme/orders", "public/default"], LATER),
         f"retention: skipped acme/orders, public/default: {tail} retention"),
        (lambda: plan_manual_offload(ws.ml, "acme/orders/payments", LATER, ManualOffload(keep_bytes=0)),
         "manual offload: skipped persistent://acme/orders/payments: attached to a Pulsar cluster, whose brokers "
         "do offloading"),
    ]
    for plan, line in cases:
        caplog.clear()
        with caplog.at_level("WARNING", logger="tieredcore"):
            assert plan() == []
        assert lines(caplog) == [f"{line} (this workspace never does)"]
    caplog.clear()
    with caplog.at_level("WARNING", logger="tieredcore"):
        assert plan_units(ws, None, LATER) == []  # the retention Spark job's driver: retention, then lag
        topics, notes = plan_topics(ws, ["acme/orders"])
    assert len(lines(caplog)) == 3 and topics == [] and notes == [lines(caplog)[-1]]
    assert notes[0].startswith("compaction: skipped acme/orders: ")


def test_scrub_still_plans_and_policies_read_pulsars(ws):
    work = plan_scrub(ws, None, LATER)
    assert {w.topic for w in work} >= {"persistent://acme/orders/payments", "persistent://acme/orders/audit"}
    pol = ws.policies.for_namespace("acme/orders")
    assert (pol.offload_threshold_bytes, pol.deletion_lag_ms, pol.retention_time_minutes) == (1048576, 3600000, 10080)
    assert ws.policies.for_topic("acme/orders/payments") == pol  # no topic policies in ZooKeeper
    assert ws.policies.namespaces_with_compaction() == []
    assert ws.policies.namespaces_with_offload() == ["acme/metrics", "acme/orders"]


def test_a_reader_that_does_not_skip_names_the_ledger_in_bookkeeper(ws):
    reader = ws.reader()
    with pytest.raises(InBookKeeperError, match=r"in BookKeeper \(ledger 1003\)") as e:
        list(reader.read("acme/orders/payments"))
    assert e.value.ledger_id == 1003 and reader.fallbacks == 0
    skipping = ws.reader(skip_in_bookkeeper=True)
    assert len(list(skipping.read("acme/orders/payments"))) == 24 and skipping.in_bookkeeper == [1003, 1004, 1005]
    assert skipping.fallbacks == 0 and skipping.fallback_notes == []
