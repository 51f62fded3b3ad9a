"""An attached workspace never writes what is Pulsar's: the ZooKeeper store refuses every write under
Pulsar's paths before it reaches the server (whatever code asks), the topic transaction refuses before
it records anything for deletion, the BookKeeper stand-in refuses ledgers, the workspace refuses bucket
writes, the policies refuse to be set. Each refusal: PulsarReadOnlyError, Pulsar's tree byte-identical."""

from __future__ import annotations

import pickle

import pytest

from tests.support.pulsar_cluster import LOCAL
from tieredcore.config import Config
from tieredcore.errors import (
    HotLedgerNotFoundError,
    InBookKeeperError,
    PulsarReadOnlyError,
    ValidationError,
)
from tieredcore.formats.mlinfo import ManagedLedgerInfo
from tieredcore.hot.bookkeeper import BookKeeperTier
from tieredcore.meta.deletion_log import DeletionLog
from tieredcore.meta.managed_ledgers import ManagedLedgerStore
from tieredcore.meta.store import CheckOp, CreateOp, DeleteOp, PutOp, write_refusal
from tieredcore.meta.zookeeper import ZkLocation, ZkMetadataStore
from tieredcore.offload.transaction import TopicTransaction
from tieredcore.workspace import Workspace

PULSAR_PATHS = ("/managed-ledgers/acme/orders/persistent/payments", "/managed-ledgers/acme/orders/persistent/new",
                "/admin/policies/acme/orders", "/admin/clusters/pulsar-a", "/admin/partitioned-topics/x/y/persistent/z",
                "/managed-ledgers")


@pytest.fixture
def attached(pulsar_cluster):
    c = pulsar_cluster(driver=LOCAL)
    store = ZkMetadataStore(f"zk://{c.hosts}/tiered-storage?chroot={c.spec.chroot}&attached=true")
    yield c, store
    store.close()


def test_urls_say_attached():
    loc = ZkLocation.parse("zk://h:1/tiered-storage?chroot=/p&attached=true")
    assert loc.attached and loc.url == "zk://h:1/tiered-storage?chroot=/p&attached=true"
    assert not ZkLocation.parse("zk://h:1/r?attached=false").attached
    assert loc.zk_path("/admin/policies/a/b") == "/p/admin/policies/a/b"  # Pulsar's own
    assert ZkLocation.parse("zk://h:1/r").zk_path("/admin/policies/a/b") == "/r/admin/policies/a/b"  # ours
    with pytest.raises(ValidationError, match="attached must be true or false"):
        ZkLocation.parse("zk://h:1/r?attached=yes")


def test_every_write_under_pulsars_paths_is_refused_before_it_is_sent(attached):
    c, store = attached
    before = c.snapshot()
    payments = store.get(PULSAR_PATHS[0])
    writes = {
        "create": lambda p: store.create(p, b"x"),
        "put": lambda p: store.put(p, b"x", 0),
        "set": lambda p: store.set(p, b"x"),
        "delete": lambda p: store.delete(p),
        "transaction": lambda p: store.transaction([CreateOp("/tiered/ok", b"ours"), PutOp(p, b"x", 0)]),
    }
    for path in PULSAR_PATHS:
        assert write_refusal(store, path) is not None
        for write in writes.values():
            with pytest.raises(PulsarReadOnlyError, match="never creates, changes or deletes a znode under Pulsar"):
                write(path)
    # a check op reads only; its transaction still refuses a Pulsar write anywhere in it, and applies nothing
    with pytest.raises(PulsarReadOnlyError, match="transaction op 2 of 2"):
        store.transaction([CheckOp(PULSAR_PATHS[0], payments.version), DeleteOp("/admin/policies/acme")])
    assert store.get("/tiered/ok") is None
    assert c.snapshot() == before
    # the project's own records: under its root, also conditional on a Pulsar record's version
    store.transaction([CheckOp(PULSAR_PATHS[0], payments.version), CreateOp("/tiered/ok", b"ours")])
    assert store.get("/tiered/ok").value == b"ours" and write_refusal(store, "/tiered/ok") is None
    assert c.snapshot() == before


def test_a_pickled_store_stays_attached(attached):
    c, store = attached
    again = pickle.loads(pickle.dumps(store))
    try:
        with pytest.raises(PulsarReadOnlyError):
            again.set("/admin/policies/acme/orders", b"{}")
    finally:
        again.close()


def test_topic_changes_are_refused_before_any_deletion_record(attached):
    c, store = attached
    before = c.snapshot()
    ml = ManagedLedgerStore(store)
    assert ml.read_only
    log = DeletionLog(store)
    txn = TopicTransaction(ml, log, "acme/orders/payments", clock_ms=lambda: 0)
    with pytest.raises(PulsarReadOnlyError):
        txn.cas(lambda info: True)
    with pytest.raises(PulsarReadOnlyError):
        txn.record([object()])  # refused before the records are even looked at
    with pytest.raises(PulsarReadOnlyError):
        ml.create_topic("acme/orders/new", ManagedLedgerInfo())
    with pytest.raises(PulsarReadOnlyError):
        ml.set_policies("acme/orders", {"offload_threshold": 0})
    assert log.pending() == []
    assert c.snapshot() == before


def test_the_bookkeeper_tier_holds_nothing_and_refuses_ledgers():
    bk = BookKeeperTier()
    with pytest.raises(InBookKeeperError, match=r"in BookKeeper \(ledger 7\)") as e:
        bk.open_ledger(7)
    assert e.value.ledger_id == 7 and isinstance(e.value, HotLedgerNotFoundError)
    again = pickle.loads(pickle.dumps(e.value))
    assert again.ledger_id == 7 and str(again) == str(e.value)
    assert bk.list_ledgers() == [] and not bk.exists(7)
    for refused in (lambda: bk.create_ledger(), lambda: bk.seal_ledger(7), lambda: bk.delete_ledger(7)):
        with pytest.raises(PulsarReadOnlyError, match="BookKeeper belongs to the Pulsar cluster's brokers"):
            refused()


def test_the_workspace_writes_nothing_to_the_bucket_and_sets_no_policy(attached, tmp_path):
    c, _ = attached
    from tieredcore.attach import attached_config

    cfg = attached_config(tmp_path / "ws", c.pulsar_zk, c.store_url, "pulsar-a")
    keys = {o.key for o in c.objects}
    with Workspace(cfg) as ws:
        assert ws.attached and ws.policies.brokers == "pulsar-a"
        with pytest.raises(PulsarReadOnlyError, match="writes no object there"):
            ws.claim(ws.store, "")
        with pytest.raises(PulsarReadOnlyError, match="never writes them"):
            ws.policies.set_namespace("acme/orders", {"offload_threshold_bytes": 0})
        with pytest.raises(PulsarReadOnlyError, match="never writes them"):
            ws.policies.set_topic("acme/orders/payments", {"offload_threshold_bytes": 0})
        with pytest.raises(PulsarReadOnlyError, match="writes no object there"):
            ws.offloader.before_write()  # what every offloader calls before its first object
    assert {o.key for o in c.objects} == keys


def test_a_bookkeeper_hot_tier_goes_with_an_attached_store_only(tmp_path):
    with pytest.raises(ValidationError, match="goes with a metadata_url attached"):
        Config.for_workspace(tmp_path, hot_url="bookkeeper:")
    with pytest.raises(ValidationError, match="goes with a metadata_url attached"):
        Config.for_workspace(tmp_path, metadata_url="zk://127.0.0.1:1/r?attached=true")
    cfg = Config.for_workspace(tmp_path, metadata_url="zk://127.0.0.1:1/r?attached=true", hot_url="bookkeeper:")
    assert cfg.attached and isinstance(cfg.open_hot(), BookKeeperTier)
    assert not Config.for_workspace(tmp_path).attached
