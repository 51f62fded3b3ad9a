"""The Tiered storage view of a workspace attached to the fixture cluster (tests/support/pulsar_cluster.py):
its JSON (tieredcore.lifecycle.attached_view) and its page (plugins/tiered_web.py through FastAPI's
TestClient, as tests/test_web.py does), per namespace: BookKeeper and offloaded ledgers and bytes, objects,
offloads in progress, the orphans of a real reconciliation, the damaged message of a real deep scrub
(repair impossible without BookKeeper), the cost estimate and the offload lag by Pulsar's own thresholds.
Every expected figure is computed from what the fixture planted. Pulsar's ZooKeeper paths and the bucket
are the same before and after the view is computed and served.

The offload lag follows ManagedLedgerImpl.maybeOffload (managed-ledger/src/main/java/org/apache/bookkeeper/
mledger/impl/ManagedLedgerImpl.java): newest to oldest, the open ledger (timestamp 0) skipped, sizes summed
over every visited ledger, a ledger without a complete offload due when the sum exceeds the byte threshold
or it closed at least the time threshold ago; thresholds as OffloadPoliciesImpl.oldPoliciesCompatible
resolves them (pulsar-common/.../policies/data/OffloadPoliciesImpl.java)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from tests.support.attached_view import (
    NAMESPACES,
    NOW,
    PAYMENTS,
    attach,
    bucket,
    closed_ms,
    expected,
    reconcile_report,
    scrub_report,
    set_offload_threshold,
)
from tests.support.pulsar_cluster import LOCAL
from tieredcore.lifecycle.attached_view import (
    NOT_RECONCILED,
    NOT_SCRUBBED,
    REPAIR_IMPOSSIBLE,
    build_attached_overview,
    pulsar_offload_due,
)
from tieredcore.lifecycle.overview import GIB, Prices
from tieredcore.workspace import Workspace

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"
if str(PLUGINS) not in sys.path:
    sys.path.append(str(PLUGINS))

@pytest.mark.parametrize(("driver", "codec"), [(LOCAL, None), ("aws-s3", "ZSTD")])
def test_the_view_of_the_fixture_cluster(pulsar_cluster, tmp_path: Path, driver, codec):
    cluster = pulsar_cluster(driver=driver, codec=codec)
    cfg = attach(tmp_path, cluster)
    prices = Prices.of(cfg)
    zk, objects = cluster.snapshot(), bucket(cluster)

    # before any reconciliation or scrub: the figures of ZooKeeper alone, the others "not yet"
    with Workspace(cfg) as ws:
        ov = build_attached_overview(ws, cfg.reports_dir, NOW, prices)
    assert [n.namespace for n in ov.namespaces] == NAMESPACES and ov.cluster == "pulsar-a"
    assert all(n.orphans is None and n.damaged is None for n in ov.namespaces)
    assert ov.totals["orphans"] is None and ov.totals["damaged"] is None

    assert cluster.snapshot() == zk and bucket(cluster) == objects

    reconcile_report(cfg, cluster, "rc1")
    scrub_report(cfg, cluster, "s1")
    zk, objects = cluster.snapshot(), bucket(cluster)
    with Workspace(cfg) as ws:
        ov = build_attached_overview(ws, cfg.reports_dir, NOW, prices)
    want = expected(cluster)
    by = {n.namespace: n for n in ov.namespaces}
    for ns, w in want.items():
        n = by[ns]
        assert n.bookkeeper == w["bookkeeper"], ns
        assert n.offloaded == w["offloaded"] and n.offloaded["objects"] == 2 * n.offloaded["ledgers"], ns
        assert n.offloads_in_progress == w["offloads_in_progress"], ns
        assert {k: n.orphans[k] for k in ("objects", "bytes")} == w["orphans"] and n.orphans["run_id"] == "rc1", ns
        assert n.damaged["count"] == len(w["damaged"]) and n.damaged["positions"] == w["damaged"], ns
        assert n.damaged["repair"] == (REPAIR_IMPOSSIBLE if w["damaged"] else None), ns
        assert n.storage_cost_month == pytest.approx((w["offloaded"]["bytes"] + w["orphans"]["bytes"]) / GIB
                                                     * prices.storage_gb_month)
    # the planted figures that make this test mean something
    assert want["acme/orders"]["orphans"]["objects"] == 5 and want["acme/metrics"]["orphans"]["objects"] == 0
    assert want["acme/orders"]["damaged"] == ["persistent://acme/orders/audit 2001:4"]
    assert want["acme/orders"]["offloads_in_progress"] == 1

    # offload lag by the policies in ZooKeeper: acme/orders' 1 MiB is more than all its ledgers hold
    orders = cluster.topics[PAYMENTS].ledgers + cluster.topics["acme/orders/persistent/audit"].ledgers
    assert sum(li.size for li in orders) <= 1048576 and by["acme/orders"].offload_lag_ms is None
    assert by["acme/orders"].thresholds == {"bytes": 1048576, "seconds": None}
    # acme/metrics: 1 h; cpu's ledger 3002 (closed, only in BookKeeper) is due, 3001 is offloaded
    cpu = "acme/metrics/persistent/cpu"
    assert by["acme/metrics"].thresholds == {"bytes": None, "seconds": 3600}
    assert by["acme/metrics"].offload_lag_ms == NOW - closed_ms(cluster, cpu, 3002)
    assert by["acme/metrics"].offload_lag_ledger == "persistent://acme/metrics/cpu ledger 3002"
    # public/default sets no threshold: broker.conf's applies, which ZooKeeper does not hold
    assert by["public/default"].offload_lag_ms is None and by["public/default"].notes
    assert ov.totals["offloaded"]["bytes"] == sum(w["offloaded"]["bytes"] for w in want.values())
    assert ov.totals["orphans"]["bytes"] == want["acme/orders"]["orphans"]["bytes"]
    assert ov.totals["damaged"] == 1 and ov.totals["offload_lag_ms"] == by["acme/metrics"].offload_lag_ms

    doc = json.loads(json.dumps(ov.as_dict()))  # what overview.json serves
    assert doc["attached"] == {"cluster": "pulsar-a", "hot_tier": "BookKeeper"}
    assert not any("hot" in k for n in doc["namespaces"] for k in n)
    assert cluster.snapshot() == zk and bucket(cluster) == objects


def test_offload_lag_follows_pulsars_byte_threshold(pulsar_cluster, tmp_path: Path):
    """payments: 1005 open, 1004 only in BookKeeper, 1003 an offload in progress (not complete: Pulsar
    offloads it again), 1002 / 1001 offloaded. The sum newest to oldest reaches 1003 at size(1004) +
    size(1003): a threshold one byte below makes 1003 due, that sum itself does not (Pulsar: sum >
    threshold)."""
    cluster = pulsar_cluster(driver=LOCAL)
    cfg = attach(tmp_path, cluster)
    at_1003 = cluster.ledger(PAYMENTS, 1004).size + cluster.ledger(PAYMENTS, 1003).size
    lag_1003 = NOW - closed_ms(cluster, PAYMENTS, 1003)
    # 0: every sealed ledger is due, 1003 still the oldest not offloaded
    for threshold, lag in ((at_1003 - 1, lag_1003), (at_1003, None), (0, lag_1003)):
        set_offload_threshold(cluster, "acme/orders", threshold)
        zk = cluster.snapshot()
        with Workspace(cfg) as ws:
            (orders,) = [n for n in build_attached_overview(ws, cfg.reports_dir, NOW, Prices.of(cfg)).namespaces
                         if n.namespace == "acme/orders"]
        assert orders.thresholds["bytes"] == threshold
        assert orders.offload_lag_ms == lag, threshold
        assert orders.offload_lag_ledger == (None if lag is None else "persistent://acme/orders/payments ledger 1003")
        assert cluster.snapshot() == zk


def test_pulsar_offload_due_matches_pulsars_test_matrix():
    """ManagedLedgerTest's automatic-offload cases (spec/02): 3 ledgers of 10 entries x 10 bytes, the
    newest open: (bytes None, secs 0) -> 2; (100, None) -> 1; (-1, None) -> 0; (None, None) -> 0; (1, 1) -> 2;
    (100, Long.MAX) -> 1."""
    from tieredcore.formats.proto import MLDataFormats_pb2 as pb

    now = 10_000_000
    info = pb.ManagedLedgerInfo()
    for lid in (1, 2):
        info.ledgerInfo.add(ledgerId=lid, entries=10, size=100, timestamp=now - 5000)
    info.ledgerInfo.add(ledgerId=3, timestamp=0)  # open
    ledgers = list(info.ledgerInfo)
    cases = {(None, 0): [1, 2], (100, None): [1], (-1, None): [], (None, None): [], (1, 1): [1, 2],
             (100, 2**63 - 1): [1]}
    for (tb, ts), want in cases.items():
        assert pulsar_offload_due(ledgers, tb, ts, now) == want, (tb, ts)
    ledgers[0].offloadContext.complete = True  # offloaded: summed, never due again
    assert pulsar_offload_due(ledgers, 100, None, now) == []
    assert pulsar_offload_due(ledgers, 99, None, now) == [2]


def test_the_page_of_an_attached_cluster(pulsar_cluster, tmp_path: Path):
    from fastapi import FastAPI
    from fastapi.testclient import TestClient
    from tiered_web import create_app

    cluster = pulsar_cluster(driver=LOCAL)
    cfg = attach(tmp_path, cluster)
    server = FastAPI()
    server.mount("/tiered", create_app(lambda: cfg, secured=False))
    client = TestClient(server, base_url="http://testserver/tiered")
    zk, objects = cluster.snapshot(), bucket(cluster)

    def cells(text: str) -> dict[tuple[str, str], tuple[str, str]]:
        """(namespace, field) -> (class, text shown); sizes and money: their exact value (data-value)."""
        return {(ns, f): (cls, v if v and (f.endswith("_bytes") or f == "cost_month") else shown)
                for cls, ns, f, v, shown in re.findall(
            r"<td class='(n(?: bad)?)' data-ns='([^']*)' data-field='([a-z_]+)'(?: data-value='([^']*)')?"
            r"(?: title='[^']*')?>([^<]*)</td>", text)}

    r = client.get(f"/overview?at={NOW}")
    assert r.status_code == 200 and "Pulsar cluster pulsar-a" in r.text
    shown = cells(r.text)
    assert shown[("acme/orders", "orphan_bytes")] == ("n", NOT_RECONCILED)
    assert shown[("acme/orders", "damaged_messages")] == ("n", NOT_SCRUBBED)

    reconcile_report(cfg, cluster, "rc1")
    scrub_report(cfg, cluster, "s1")
    r = client.get(f"/overview?at={NOW}")
    assert r.status_code == 200
    heads = re.findall(r"<th>([^<]*)</th>", r.text.split('<table id="namespaces"', 1)[1].split("</tr>", 1)[0])
    assert "BookKeeper bytes" in heads and "offloaded bytes" in heads and not any("hot" in h for h in heads)
    shown = cells(r.text)
    want = expected(cluster)
    with Workspace(cfg) as ws:
        ov = build_attached_overview(ws, cfg.reports_dir, NOW, Prices.of(cfg))
    for n in ov.namespaces:
        w = want[n.namespace]
        assert shown[(n.namespace, "bookkeeper_bytes")][1] == f"{w['bookkeeper']['bytes']}"
        assert shown[(n.namespace, "offloaded_bytes")][1] == f"{w['offloaded']['bytes']}"
        assert shown[(n.namespace, "objects")][1] == f"{w['offloaded']['objects']:,}"
        assert shown[(n.namespace, "orphan_bytes")][1] == f"{w['orphans']['bytes']}"
        assert shown[(n.namespace, "cost_month")][1] == f"{n.cost_month}"
    assert shown[("acme/orders", "orphan_objects")] == ("n bad", "5")
    assert shown[("acme/orders", "damaged_messages")] == ("n bad", "1")
    assert shown[("acme/orders", "repair")] == ("n bad", REPAIR_IMPOSSIBLE)
    assert shown[("acme/metrics", "damaged_messages")] == ("n", "0")
    assert shown[("acme/metrics", "offload_lag")] == ("n bad", "1 d 1 h")  # 3002 closed at BASE - 1 h
    assert shown[("acme/metrics", "offload_threshold")][1] == "1 h"
    assert shown[("public/default", "offload_threshold")][1] == "broker.conf"
    [item] = re.findall(r'<ul id="damaged"><li data-ns="acme/orders" class="bad">([^<]*)</li>', r.text)
    assert item == f"persistent://acme/orders/audit 2001:4: {REPAIR_IMPOSSIBLE}"
    assert "BookKeeper only" in r.text or "No run report records tiers yet" in r.text

    doc = client.get(f"/overview.json?at={NOW}").json()
    assert doc["attached"]["hot_tier"] == "BookKeeper"
    assert [n["orphans"]["bytes"] for n in doc["namespaces"]] == [want[ns]["orphans"]["bytes"] for ns in NAMESPACES]
    assert cluster.snapshot() == zk and bucket(cluster) == objects
