"""The fixture cluster (tests/support/pulsar_cluster.py) is what Pulsar writes: checked here against the
bytes and names taken from Pulsar's sources (MetaStoreImpl, OffloadUtils, BlobStoreManagedLedgerOffloader,
Policies / OffloadPoliciesImpl), and read back by this project's own decoders and topic listing."""

from __future__ import annotations

import json
import struct
import uuid as uuidlib

import pytest
from kazoo.client import KazooClient

from tests.support.pulsar_cluster import (
    CODECS,
    DRIVER_VARIANTS,
    FOREIGN,
    IN_PROGRESS,
    LOCAL,
    ORPHAN,
    OTHER_CLUSTER,
    REFERENCED,
    YOUNG_ORPHAN,
    ClusterSpec,
    cursor_record,
    ml_record,
    plan_topics,
    topic_info,
)
from tieredcore.cold.blob import iter_objects
from tieredcore.formats import compression
from tieredcore.formats.messages import BadEntry, decode_entries
from tieredcore.formats.mlinfo import decode_managed_ledger_info
from tieredcore.formats.proto import MLDataFormats_pb2 as pb
from tieredcore.meta.managed_ledgers import ManagedLedgerStore
from tieredcore.meta.pulsar import PulsarRecords
from tieredcore.meta.zookeeper import ZkMetadataStore
from tieredcore.names import TopicName
from tieredcore.offload.copies import open_offloaded
from tieredcore.offload.offloader import LedgerOffloader


@pytest.fixture
def raw(zk_server):
    zk = KazooClient(hosts=zk_server.hosts)
    zk.start(timeout=15)
    yield zk
    zk.stop()
    zk.close()


@pytest.mark.parametrize("codec", CODECS)
def test_records_are_compressed_as_metastoreimpl_writes_them(codec):
    """compressLedgerInfo: [short 0x4778][int n][ManagedLedgerInfoMetadata(n bytes)][codec(record)];
    plain protobuf without compression or at / below MetadataCompressionConfig's threshold."""
    plan = plan_topics(ClusterSpec())["acme/orders/persistent/payments"]
    info = topic_info(plan, ("aws-s3", {"bucket": "b"}))
    raw_bytes = info.SerializeToString()
    data = ml_record(info, codec)
    assert decode_managed_ledger_info(data) == info
    if codec is None:
        assert data == raw_bytes
        return
    magic, n = struct.unpack_from(">hi", data)
    meta = pb.ManagedLedgerInfoMetadata.FromString(data[6:6 + n])
    assert magic == 0x4778 and meta.compressionType == pb.CompressionType.Value(codec)
    assert meta.uncompressedSize == len(raw_bytes)
    assert compression.decompress(compression.codec(codec), data[6 + n:], len(raw_bytes)) == raw_bytes
    assert ml_record(info, codec, threshold=len(raw_bytes)) == raw_bytes  # not above the threshold: plain


def test_offload_contexts_as_brokers_record_them():
    """uuid recorded first (complete unset: in progress), then complete + timestamp; bookkeeperDeleted
    only once set; driver metadata as OffloadUtils.setOffloadDriverMetadata; the open ledger: id and 0."""
    plan = plan_topics(ClusterSpec())["acme/orders/persistent/payments"]
    info = topic_info(plan, ("S3", {"managedLedgerOffloadDriver": "AWS_S3", "bucket": "b"}))
    by_id = {li.ledgerId: li for li in info.ledgerInfo}
    done, both, going, bk, open_ = (by_id[i] for i in (1001, 1002, 1003, 1004, 1005))
    u = uuidlib.UUID(plan.ledgers[0].uuid)
    assert (done.offloadContext.uidMsb & (2**64 - 1)) << 64 | (done.offloadContext.uidLsb & (2**64 - 1)) == u.int
    assert done.offloadContext.complete and done.offloadContext.bookkeeperDeleted
    assert both.offloadContext.complete and not both.offloadContext.HasField("bookkeeperDeleted")
    assert not going.offloadContext.HasField("complete") and not going.offloadContext.HasField("timestamp")
    assert going.offloadContext.driverMetadata.name == "S3"
    assert not bk.HasField("offloadContext")
    assert open_.timestamp == 0 and not open_.HasField("entries") and not open_.HasField("size")


def test_cursor_record_is_a_managed_cursor_info():
    # ManagedCursorInfo{cursorsLedgerId=7, markDeleteLedgerId=1001, markDeleteEntryId=3}
    assert cursor_record(7, (1001, 3)) == bytes.fromhex("0807" "10e907" "1803")


def test_the_tree_is_pulsars_layout_and_the_topic_listing_reads_it(pulsar_cluster, raw):
    """Cursors sit below their topic's node and are never listed as topics; a partitioned topic's
    partitions are topics of their own; an empty znode (a topic just created) is an empty record."""
    c = pulsar_cluster(driver=LOCAL)
    base = f"{c.spec.chroot}/managed-ledgers/acme/orders/persistent/payments"
    assert sorted(raw.get_children(base)) == ["audit-reader", "billing"]
    assert raw.get(f"{c.spec.chroot}/managed-ledgers/acme/orders/persistent/fresh")[0] == b""
    policies = json.loads(raw.get(f"{c.spec.chroot}/admin/policies/acme/orders")[0])
    assert policies["offload_policies"]["managedLedgerOffloadDriver"] == "tiered-local"
    assert "offload_deletion_lag_ms" not in json.loads(raw.get(f"{c.spec.chroot}/admin/policies/public/default")[0])
    store = ZkMetadataStore(f"zk://{c.hosts}/tiered-storage?chroot={c.spec.chroot}&attached=true")
    try:
        ml = ManagedLedgerStore(store)
        assert ml.list_namespaces() == ["acme/metrics", "acme/orders", "public/default"]
        assert [t.local_name for t in ml.list_topics("acme/orders")] == ["audit", "fresh", "payments"]
        assert [t.local_name for t in ml.list_topics("public/default")] == ["events-partition-0",
                                                                             "events-partition-1"]
        assert len(ml.get_topic("acme/orders/fresh")[0].ledgerInfo) == 0
        records = PulsarRecords(store)
        assert records.clusters() == ["pulsar-a"] and records.layout_problems() == []
        [events] = records.partitioned_topics("public/default")
        assert events.partitions == 2 and events.partition_topics() == ml.list_topics("public/default")
        assert records.partitioned_topic_of("public/default/events-partition-1") == events.topic
        assert records.partitioned_topic_of("acme/orders/payments") is None
        assert records.tenant("acme") == {"adminRoles": [], "allowedClusters": ["pulsar-a"]}
    finally:
        store.close()


def test_the_bucket_holds_what_was_planted_with_the_brokers_metadata(pulsar_cluster):
    c = pulsar_cluster(driver="S3")
    listed = {o.key: o.size for o in iter_objects(c.store, "")}
    assert listed == {o.key: o.size for o in c.objects}
    kinds = {k: {o.key for o in c.objects if o.kind == k} for k in
             (REFERENCED, IN_PROGRESS, ORPHAN, YOUNG_ORPHAN, OTHER_CLUSTER, FOREIGN)}
    assert all(kinds.values()) and sum(map(len, kinds.values())) == len(c.objects)
    ledger = c.ledger("acme/orders/persistent/payments", 1003)  # offload in progress: data, no index yet
    assert kinds[IN_PROGRESS] == {f"{ledger.uuid}-ledger-1003"}
    for o in c.objects:
        md = c.store.head(o.key).metadata
        if o.kind == FOREIGN:
            assert not md
            continue
        assert md["pulsarclustername"] == o.cluster and md["managedledgername"] == o.managed_ledger
        assert md["role"] == ("index" if o.key.endswith("-index") else "data")
        assert md["s3managedledgeroffloaderformatversion"] == "1"
        assert o.key.startswith(f"{o.uuid}-ledger-{o.ledger_id}")
    # ages: everything but the young orphans was written before the boundary, they after it
    for o in iter_objects(c.store, ""):
        young = o.key in c.keys(YOUNG_ORPHAN)
        assert (o.last_modified * 1000 > c.boundary_ms) == young, o


def test_the_damaged_message_fails_its_crc32c_and_only_it(pulsar_cluster):
    c = pulsar_cluster(driver=LOCAL)
    t = TopicName.parse("acme/orders/audit")
    store = ZkMetadataStore(f"zk://{c.hosts}/tiered-storage?chroot={c.spec.chroot}&attached=true")
    try:
        info, _ = ManagedLedgerStore(store).get_topic(t)
    finally:
        store.close()
    off = LedgerOffloader(c.store, "")
    h = open_offloaded(info.ledgerInfo[0], off, t.managed_ledger_name, lambda dm: off)
    bad: list[BadEntry] = []
    batch = h.read_batch(0, h.last_add_confirmed)
    decode_entries(batch, bad)
    assert [(str(b.position), b.checksum) for b in bad] == [("2001:4", True)]
    plan = c.ledger("acme/orders/persistent/audit", 2001)
    payloads = batch.payloads()
    assert [i for i, (got, want) in enumerate(zip(payloads, plan.entries, strict=True)) if got != want] == [4]


def test_the_same_spec_builds_the_same_bytes(pulsar_cluster):
    """Entries, uuids, object keys and bytes, the tree's shape: all from the spec (records differ only by
    the bucket name and endpoint their driver metadata and policies carry)."""
    spec = ClusterSpec(codec="ZSTD")
    assert plan_topics(spec) == plan_topics(spec) and plan_topics(spec) != plan_topics(ClusterSpec(seed=8))
    a, b = pulsar_cluster(driver="aws-s3", codec="ZSTD"), pulsar_cluster(driver="aws-s3", codec="ZSTD")

    def shape(c):
        return {p[len(c.spec.chroot):]: v[1] for p, v in c.snapshot().items()}

    assert shape(a) == shape(b)
    assert {o.key: a.store.get(o.key) for o in a.objects} == {o.key: b.store.get(o.key) for o in b.objects}
    assert set(DRIVER_VARIANTS) == {"aws-s3", "S3", "AWS-S3", "s3-legacy"}
