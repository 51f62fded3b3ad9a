"""What the tests of an attached workspace's view share (tests/attach/test_attached_view.py and the browser
test tests/airflow/test_ui_browser.py): attaching to the fixture cluster, a real reconciliation and a real
deep scrub written as run reports the way the Spark jobs write them, and the figures the fixture planted."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from kazoo.client import KazooClient

from tests.support.pulsar_cluster import (
    BASE_MS,
    HOUR_MS,
    IN_PROGRESS,
    LOCAL,
    ORPHAN,
    REFERENCED,
    ledger_close_ms,
)
from tieredcore.cli.main import main as tiered
from tieredcore.cold.blob import iter_objects
from tieredcore.config import Config
from tieredcore.workspace import Workspace

NOW = BASE_MS + 24 * HOUR_MS  # the view's clock: a day after the newest ledger closed
GRACE_MS = HOUR_MS
NAMESPACES = ["acme/metrics", "acme/orders", "public/default"]
PAYMENTS = "acme/orders/persistent/payments"


def attach(tmp_path: Path, cluster) -> Config:
    default = ["--brokers-default"] if cluster.spec.driver == LOCAL else []
    assert tiered(["init", str(tmp_path / "ws"), "--pulsar-zk", cluster.pulsar_zk, "--store-url", cluster.store_url,
                   *default]) == 0
    return Config.load(tmp_path / "ws" / "tiered.toml", env={})


def bucket(cluster) -> dict[str, tuple[int, float]]:
    return {o.key: (o.size, o.last_modified) for o in iter_objects(cluster.store, "")}


def reconcile_report(cfg: Config, cluster, run_id: str) -> None:
    """A dry-run reconciliation in-process, its report written as the Spark job writes it."""
    from spark_jobs._jobkit import Run, write_report
    from tieredcore.lifecycle.reconcile.run import reconcile

    as_of = cluster.as_of(GRACE_MS)
    with Workspace(cfg) as ws:
        rep = reconcile(ws, as_of, GRACE_MS, dry_run=True)
    write_report(None, Run("reconcile_orphans", argparse.Namespace(dry_run=True), cfg, as_of, run_id,
                           cfg.reports_dir, time.monotonic()), rep, env={})


def scrub_report(cfg: Config, cluster, run_id: str) -> None:
    """A deep scrub (no repair) in-process, its report written as spark_jobs/scrub.py writes it."""
    from spark_jobs._jobkit import Run, write_report
    from tieredcore.lifecycle.runner import run_work
    from tieredcore.lifecycle.scrub import plan_scrub
    from tieredcore.lifecycle.work import LedgerRunReport, RunSummary

    as_of = cluster.as_of(GRACE_MS)
    with Workspace(cfg) as ws:
        work = plan_scrub(ws, None, as_of, deep=True, repair=False)
    rows = list(run_work(cfg, [w.as_dict() for w in work]))
    write_report(None, Run("scrub", argparse.Namespace(dry_run=True), cfg, as_of, run_id, cfg.reports_dir,
                           time.monotonic()), LedgerRunReport(RunSummary.of("scrub", run_id, as_of, True, rows, 0.0),
                                                              rows), env={})


def set_offload_threshold(cluster, namespace: str, nbytes: int) -> None:
    """What `pulsar-admin namespaces set-offload-threshold` leaves in ZooKeeper: the Policies JSON with the
    offload policies' managedLedgerOffloadThresholdInBytes (and the older top-level field) changed."""
    zk = KazooClient(hosts=cluster.hosts)
    zk.start(timeout=15)
    try:
        path = f"{cluster.spec.chroot}/admin/policies/{namespace}"
        doc = json.loads(zk.get(path)[0])
        doc["offload_threshold"] = nbytes
        doc.setdefault("offload_policies", {})["managedLedgerOffloadThresholdInBytes"] = nbytes
        zk.set(path, json.dumps(doc, separators=(",", ":")).encode())
    finally:
        zk.stop()
        zk.close()


def closed_ms(cluster, topic: str, ledger_id: int) -> int:
    plan = cluster.topics[topic]
    return ledger_close_ms(plan, cluster.ledger(topic, ledger_id))


def expected(cluster) -> dict[str, dict]:
    """Per namespace, from the fixture's plan and planted objects."""
    out = {}
    for ns in NAMESPACES:
        plans = [p for name, p in cluster.topics.items() if name.startswith(ns + "/")]
        ledgers = [li for p in plans for li in p.ledgers]
        mine = [o for o in cluster.objects if o.managed_ledger and o.managed_ledger.startswith(ns + "/")
                and o.cluster == cluster.spec.cluster]
        offloaded = [li for li in ledgers if li.state in ("offloaded", "offloaded-deleted")]
        in_bk = [li for li in ledgers if li.state != "offloaded-deleted"]
        orphans = [o for o in mine if o.kind == ORPHAN]
        out[ns] = {
            "bookkeeper": {"ledgers": len(in_bk), "bytes": sum(li.size for li in in_bk)},
            "offloaded": {"ledgers": len(offloaded), "bytes": sum(li.size for li in offloaded),
                          "objects": len([o for o in mine if o.kind == REFERENCED])},
            "offloads_in_progress": len({o.uuid for o in mine if o.kind == IN_PROGRESS}),
            "orphans": {"objects": len(orphans), "bytes": sum(o.size for o in orphans)},
            "damaged": sorted(f"{p.full} {li.ledger_id}:{li.damaged_entry}" for p in plans for li in p.ledgers
                              if li.damaged_entry is not None),
        }
    return out
