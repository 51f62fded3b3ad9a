"""A Pulsar cluster as its brokers leave it: a ZooKeeper tree and a bucket, built for tests from Pulsar's code.

Every byte follows a Pulsar source file (apache/pulsar):

- ``managed-ledger/.../impl/MetaStoreImpl.java``: a topic's record at ``/managed-ledgers/<managed-ledger
  name>``, its ``ManagedLedgerInfo`` plain, or, with ``managedLedgerInfoCompressionType`` set, ``0x4778``
  (short), the ``ManagedLedgerInfoMetadata`` length (int), the metadata (codec, uncompressed size) and the
  compressed record (``compressLedgerInfo``; with ``MetadataCompressionConfig`` only above its size
  threshold); a topic just created is an empty znode (``store.put(path, new byte[0])``); cursors are the
  topic node's children (``PREFIX + ledgerName + "/" + cursorName``, a ``ManagedCursorInfo``).
- ``managed-ledger/.../offload/OffloadUtils.java`` (``setOffloadDriverMetadata``) and ManagedLedgerImpl's
  offload: ``OffloadContext{uidMsb, uidLsb, complete, timestamp, bookkeeperDeleted, driverMetadata}``;
  the uuid is recorded (complete = false) before anything is uploaded.
- ``tiered-storage/jcloud/.../BlobStoreManagedLedgerOffloader.java`` (``offload``) and
  ``BlockAwareSegmentInputStreamImpl`` / ``OffloadIndexBlockImpl`` (tests/support/pulsar_objects.py): keys
  ``{uuid}-ledger-{id}`` (multipart, block i = part i + 1) and ``{uuid}-ledger-{id}-index``; user metadata:
  the broker's (``LedgerOffloader.METADATA_SOFTWARE_VERSION_KEY``, ``METADATA_SOFTWARE_GITSHA_KEY``,
  ``METADATA_PULSAR_CLUSTER_NAME``), ``role`` = data | index, the ``extraMetadata`` ``ManagedLedgerName``
  (what ``OffloaderObjectsScannerUtils`` reads back, ignoring case) and the format version
  (``DataBlockUtils.addVersionInfo``). S3 returns user-metadata keys lower-cased; they are written so.
- ``pulsar-common/.../policies/data/Policies.java``, ``OffloadPoliciesImpl.java``, ``RetentionPolicies``,
  ``ClusterData``, ``TenantInfo``, ``PartitionedTopicMetadata``: JSON as Jackson writes them for Pulsar's
  metadata store (``ObjectMapperFactory``: null fields left out) at ``/admin/policies/<tenant>/<ns>``,
  ``/admin/clusters/<name>``, ``/admin/policies/<tenant>``, ``/admin/partitioned-topics/...``.
- ``tieredcore/cold/drivers.py`` names the driver spellings brokers record (``aws-s3``, ``S3`` with the
  jclouds properties; Pulsar 2.2 - 2.5's names with ``bucket`` / ``region`` / ``endpoint``).

What the cluster holds (:func:`build_cluster`; the same bytes for the same spec): topics with complete
offloads (the BookKeeper copy deleted or not), an offload in progress (data object written, index not
yet), ledgers only in BookKeeper, open ledgers, an empty record, a partitioned topic, cursors; a message
with a flipped payload byte in an offloaded object; orphans of this cluster (a failed attempt's pair, a
deleted topic's pair, a lone data object), some written after :attr:`PulsarCluster.boundary_ms` (younger
than any grace period counted from it), objects of another cluster (one naming a topic of ours) and a
file that is no Pulsar object at all.
"""

from __future__ import annotations

import json
import random
import struct
import time
import uuid as uuidlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from kazoo.client import KazooClient

from tests.support import pulsar_objects
from tests.support.wire import vi
from tieredcore.formats import compression
from tieredcore.formats.messages import OutMessage, encode_batch, encode_message
from tieredcore.formats.proto import MLDataFormats_pb2 as pb

# kinds of planted objects
REFERENCED, IN_PROGRESS, ORPHAN, YOUNG_ORPHAN, OTHER_CLUSTER, FOREIGN = (
    "referenced", "in-progress", "orphan", "young-orphan", "other-cluster", "foreign")
# driver-name spellings brokers record for S3: (OffloadDriverMetadata.name, property style)
DRIVER_VARIANTS = {"aws-s3": ("aws-s3", "jclouds"), "S3": ("S3", "jclouds"), "AWS-S3": ("AWS-S3", "jclouds"),
                   "s3-legacy": ("s3", "legacy")}
LOCAL = "local"  # the local store (tests without S3): this project's tiered-local driver stands in
CODECS = (None, "LZ4", "ZLIB", "ZSTD", "SNAPPY")
BASE_MS = 1_772_366_400_000  # 2026-03-01T12:00:00Z: the records' clock (the bucket's is the wall clock)
HOUR_MS = 3_600_000
MAX_BLOCK = 8 * 1024  # small blocks: data objects of several parts


@dataclass(frozen=True)
class ClusterSpec:
    cluster: str = "pulsar-a"
    other_cluster: str = "pulsar-b"
    chroot: str = "/pulsar"
    codec: str | None = None  # managedLedgerInfoCompressionType
    compression_threshold: int = 0  # MetadataCompressionConfig's threshold (bytes)
    driver: str = "aws-s3"  # a DRIVER_VARIANTS key, or LOCAL
    seed: int = 7
    entries: int = 12  # per ledger


@dataclass(frozen=True)
class Planted:
    key: str
    size: int
    kind: str
    cluster: str | None  # pulsarClusterName (None: not a Pulsar object)
    managed_ledger: str | None
    uuid: str
    ledger_id: int
    damaged: bool = False


@dataclass
class LedgerPlan:
    ledger_id: int
    state: str  # offloaded-deleted | offloaded | offloading | bookkeeper | open
    entries: list[bytes]
    uuid: str | None = None
    damaged_entry: int | None = None  # the entry whose payload has a flipped byte in the bucket

    @property
    def size(self) -> int:
        return sum(map(len, self.entries))


@dataclass
class TopicPlan:
    name: str  # managed-ledger name tenant/ns/persistent/topic
    ledgers: list[LedgerPlan] = field(default_factory=list)
    cursors: tuple[str, ...] = ()
    empty_record: bool = False

    @property
    def full(self) -> str:
        t, ns, _, local = self.name.split("/")
        return f"persistent://{t}/{ns}/{local}"


@dataclass
class PulsarCluster:
    spec: ClusterSpec
    hosts: str
    store: Any
    store_url: str
    bucket: str
    topics: dict[str, TopicPlan]
    objects: list[Planted]
    boundary_ms: int  # objects written before it are older than any grace period counted from it

    @property
    def pulsar_zk(self) -> str:
        """What `tiered init --pulsar-zk` takes: Pulsar's metadata store URL."""
        return f"zk://{self.hosts}{self.spec.chroot}"

    def keys(self, *kinds: str) -> set[str]:
        return {o.key for o in self.objects if o.kind in kinds}

    def as_of(self, grace_ms: int) -> int:
        """A reconciliation clock at which every orphan but the young ones is older than ``grace_ms``."""
        return self.boundary_ms + grace_ms

    def ledger(self, topic: str, ledger_id: int) -> LedgerPlan:
        return next(li for li in self.topics[topic].ledgers if li.ledger_id == ledger_id)

    def snapshot(self, own_root: str = "/tiered-storage") -> dict[str, tuple]:
        """Every znode of Pulsar's under the chroot: (data, children, data version, children version). The
        project's own root is left out, and so is the chroot node's own child count (the root is its
        child: the one change the project makes next to Pulsar's tree)."""
        zk = KazooClient(hosts=self.hosts)
        zk.start(timeout=15)
        top = self.spec.chroot or "/"
        mine = own_root.strip("/")
        try:
            out = {}
            for path, (data, children, version, cversion) in _walk(zk, top, {self.spec.chroot + own_root,
                                                                                "/zookeeper"}):
                if path == top:
                    children, cversion = tuple(c for c in children if c != mine), None
                out[path] = (data, children, version, cversion)
            return out
        finally:
            zk.stop()
            zk.close()


def _walk(zk: KazooClient, path: str, skip: set[str]) -> Iterator[tuple[str, tuple]]:
    data, stat = zk.get(path)
    children = sorted(zk.get_children(path))
    yield path, (data, tuple(children), stat.version, stat.cversion)
    for c in children:
        child = path.rstrip("/") + "/" + c
        if child not in skip:
            yield from _walk(zk, child, skip)


# -- records -------------------------------------------------------------------------------------------


def ml_record(info: pb.ManagedLedgerInfo, codec: str | None, threshold: int = 0) -> bytes:
    """MetaStoreImpl.compressLedgerInfo: plain protobuf, or [0x4778][int len][metadata][compressed]."""
    raw = info.SerializeToString()
    if codec is None or len(raw) <= threshold:
        return raw
    meta = pb.ManagedLedgerInfoMetadata(compressionType=pb.CompressionType.Value(codec),
                                        uncompressedSize=len(raw)).SerializeToString()
    return struct.pack(">hi", 0x4778, len(meta)) + meta + compression.compress(compression.codec(codec), raw)


def cursor_record(ledger_id: int, mark_delete: tuple[int, int]) -> bytes:
    """ManagedCursorInfo{cursorsLedgerId=1, markDeleteLedgerId=2, markDeleteEntryId=3} (protobuf varints)."""
    return b"".join(vi(tag, v) for tag, v in ((1, ledger_id), (2, mark_delete[0]), (3, mark_delete[1])))


def driver_metadata(spec: ClusterSpec, bucket: str, endpoint: str, root: str) -> tuple[str, dict[str, str]]:
    """(name, properties) the brokers record for the spec's driver (TieredStorageConfiguration)."""
    if spec.driver == LOCAL:
        return "tiered-local", {"root": root}
    name, style = DRIVER_VARIANTS[spec.driver]
    if style == "legacy":
        return name, {"bucket": bucket, "region": "us-east-1", "endpoint": endpoint}
    return name, {"managedLedgerOffloadDriver": "AWS_S3", "bucket": bucket, "region": "us-east-1",
                  "serviceEndpoint": endpoint}


def offload_policies(spec: ClusterSpec, bucket: str, endpoint: str) -> dict[str, Any]:
    """OffloadPoliciesImpl.create(driver, region, bucket, endpoint, ...) for an S3 driver, as Jackson
    writes it (nulls left out, the class's defaults included)."""
    name = "tiered-local" if spec.driver == LOCAL else DRIVER_VARIANTS[spec.driver][0]
    return {"offloadersDirectory": "./offloaders", "managedLedgerOffloadDriver": name,
            "managedLedgerOffloadMaxThreads": 2, "managedLedgerOffloadPrefetchRounds": 1,
            "managedLedgerOffloadThresholdInBytes": 1048576, "managedLedgerOffloadDeletionLagInMillis": 3600000,
            "managedLedgerOffloadedReadPriority": "TIERED_STORAGE_FIRST",
            "s3ManagedLedgerOffloadRegion": "us-east-1", "s3ManagedLedgerOffloadBucket": bucket,
            "s3ManagedLedgerOffloadServiceEndpoint": endpoint,
            "s3ManagedLedgerOffloadMaxBlockSizeInBytes": 67108864,
            "s3ManagedLedgerOffloadReadBufferSizeInBytes": 1048576,
            "s3ManagedLedgerOffloadRoleSessionName": "pulsar-s3-offload",
            "gcsManagedLedgerOffloadMaxBlockSizeInBytes": 67108864,
            "gcsManagedLedgerOffloadReadBufferSizeInBytes": 1048576,
            "managedLedgerOffloadBucket": bucket, "managedLedgerOffloadRegion": "us-east-1",
            "managedLedgerOffloadServiceEndpoint": endpoint, "managedLedgerOffloadMaxBlockSizeInBytes": 67108864,
            "managedLedgerOffloadReadBufferSizeInBytes": 1048576}


def namespace_policies(cluster: str, **fields: Any) -> bytes:
    """A namespace's Policies JSON: the fields every namespace has, then ``fields``."""
    doc: dict[str, Any] = {
        "auth_policies": {"namespace_auth": {}, "destination_auth": {}, "subscription_auth_roles": {}},
        "replication_clusters": [cluster], "allowed_clusters": [],
        "bundles": {"boundaries": ["0x00000000", "0x40000000", "0x80000000", "0xc0000000", "0xffffffff"],
                    "numBundles": 4},
        "backlog_quota_map": {}, "clusterDispatchRate": {}, "topicDispatchRate": {}, "subscriptionDispatchRate": {},
        "replicatorDispatchRate": {}, "clusterSubscribeRate": {}, "publishMaxMessageRate": {},
        "latency_stats_sample_rate": {}, "deleted": False, "encryption_required": False,
        "subscription_auth_mode": "None", "offload_threshold": -1, "offload_threshold_in_seconds": -1,
        "schema_compatibility_strategy": "UNDEFINED", "schema_validation_enforced": False,
        "subscription_types_enabled": [], "allowed_topic_properties_for_metrics": [], "properties": {},
        "migrated": False,
    }
    doc.update(fields)
    return json.dumps(doc, separators=(",", ":")).encode()


# -- the plan: topics, ledgers, entries ----------------------------------------------------------------


def _uuid(rng: random.Random) -> str:
    return str(uuidlib.UUID(int=rng.getrandbits(128), version=4))


def _entries(rng: random.Random, ledger_id: int, n: int, close_ms: int) -> list[bytes]:
    """Pulsar messages: every third entry a batch of 3 (LZ4 in odd ledgers), the others one message."""
    out = []
    for i in range(n):
        t = close_ms - (n - i) * 1000
        msgs = [OutMessage(rng.randbytes(rng.randint(40, 600)), key=f"k{rng.randint(0, 9)}",
                           properties={"ledger": str(ledger_id), "i": str(i)}) for _ in range(3 if i % 3 == 0 else 1)]
        if len(msgs) == 1:
            out.append(encode_message(msgs[0], producer="p-1", sequence_id=ledger_id * 1000 + i, publish_time=t))
        else:
            codec = compression.LZ4 if ledger_id % 2 else compression.NONE
            out.append(encode_batch(msgs, producer="p-1", sequence_id=ledger_id * 1000 + i, publish_time=t,
                                    codec=codec))
    return out


# (managed-ledger name, [(ledger id, state, damaged entry)], cursors, empty record)
TOPICS = (
    ("acme/orders/persistent/payments", [(1001, "offloaded-deleted", None), (1002, "offloaded", None),
                                         (1003, "offloading", None), (1004, "bookkeeper", None),
                                         (1005, "open", None)], ("billing", "audit-reader"), False),
    ("acme/orders/persistent/audit", [(2001, "offloaded-deleted", 4), (2002, "open", None)], (), False),
    ("acme/orders/persistent/fresh", [], (), True),
    ("acme/metrics/persistent/cpu", [(3001, "offloaded", None), (3002, "bookkeeper", None), (3003, "open", None)],
     ("dash",), False),
    ("public/default/persistent/events-partition-0", [(4001, "offloaded-deleted", None), (4002, "open", None)],
     ("sub",), False),
    ("public/default/persistent/events-partition-1", [(4101, "offloaded-deleted", None), (4102, "open", None)],
     ("sub",), False),
)
OFFLOADED_STATES = ("offloaded-deleted", "offloaded", "offloading")


def plan_topics(spec: ClusterSpec) -> dict[str, TopicPlan]:
    rng = random.Random(spec.seed)
    out = {}
    for name, ledgers, cursors, empty in TOPICS:
        plan = TopicPlan(name, cursors=cursors, empty_record=empty)
        for i, (lid, state, damaged) in enumerate(ledgers):
            close = BASE_MS - (len(ledgers) - 1 - i) * HOUR_MS
            entries = [] if state == "open" else _entries(rng, lid, spec.entries, close)
            uuid = _uuid(rng) if state in OFFLOADED_STATES else None
            plan.ledgers.append(LedgerPlan(lid, state, entries, uuid, damaged))
        out[name] = plan
    return out


def ledger_close_ms(plan: TopicPlan, ledger: LedgerPlan) -> int:
    i = plan.ledgers.index(ledger)
    return BASE_MS - (len(plan.ledgers) - 1 - i) * HOUR_MS


def topic_info(plan: TopicPlan, driver: tuple[str, dict[str, str]]) -> pb.ManagedLedgerInfo:
    """The record brokers keep for the topic (ManagedLedgerImpl, OffloadUtils.setOffloadDriverMetadata)."""
    info = pb.ManagedLedgerInfo()
    for ledger in plan.ledgers:
        if ledger.state == "open":  # the current ledger: its id, timestamp 0, nothing else yet
            info.ledgerInfo.add(ledgerId=ledger.ledger_id, timestamp=0)
            continue
        close = ledger_close_ms(plan, ledger)
        li = info.ledgerInfo.add(ledgerId=ledger.ledger_id, entries=len(ledger.entries), size=ledger.size,
                                 timestamp=close)
        if ledger.uuid is None:
            continue
        u = uuidlib.UUID(ledger.uuid)
        ctx = li.offloadContext
        ctx.uidMsb, ctx.uidLsb = _signed(u.int >> 64), _signed(u.int & ((1 << 64) - 1))
        ctx.driverMetadata.name = driver[0]
        for k, v in driver[1].items():
            ctx.driverMetadata.properties.add(key=k, value=v)
        if ledger.state != "offloading":
            ctx.complete = True
            ctx.timestamp = close + 10 * 60 * 1000
            if ledger.state == "offloaded-deleted":  # set once the lag has passed (never written False)
                ctx.bookkeeperDeleted = True
    return info


def _signed(n: int) -> int:
    return n - (1 << 64) if n >= 1 << 63 else n


# -- ZooKeeper ---------------------------------------------------------------------------------------------


def write_zookeeper(zk: KazooClient, spec: ClusterSpec, topics: dict[str, TopicPlan], bucket: str, endpoint: str,
                    root: str, register_other: bool = False) -> None:
    """The tree brokers leave under the chroot (module docstring)."""
    c = spec.chroot

    def put(path: str, data: bytes) -> None:
        zk.create(c + path, data, makepath=True)

    for name in [spec.cluster] + ([spec.other_cluster] if register_other else []):
        put(f"/admin/clusters/{name}", json.dumps({"serviceUrl": f"http://{name}:8080",
                                                     "brokerServiceUrl": f"pulsar://{name}:6650"}).encode())
    for tenant in ("acme", "public"):
        put(f"/admin/policies/{tenant}", json.dumps({"adminRoles": [], "allowedClusters": [spec.cluster]}).encode())
    put("/admin/policies/acme/orders", namespace_policies(
        spec.cluster, offload_threshold=1048576, offload_deletion_lag_ms=3600000,
        offload_policies=offload_policies(spec, bucket, endpoint),
        retention_policies={"retentionTimeInMinutes": 10080, "retentionSizeInMB": 10240}))
    put("/admin/policies/acme/metrics", namespace_policies(
        spec.cluster, offload_threshold_in_seconds=3600, offload_deletion_lag_ms=14400000))
    put("/admin/policies/public/default", namespace_policies(spec.cluster))
    put("/admin/partitioned-topics/public/default/persistent/events",
        json.dumps({"partitions": 2, "deleted": False}).encode())
    for path in ("/ledgers/available", "/loadbalance/brokers", "/namespace", "/schemas"):  # nodes brokers keep
        put(path, b"")
    driver = driver_metadata(spec, bucket, endpoint, root)
    for plan in topics.values():
        path = f"/managed-ledgers/{plan.name}"
        put(path, b"" if plan.empty_record else ml_record(topic_info(plan, driver), spec.codec,
                                                         spec.compression_threshold))
        for i, cursor in enumerate(plan.cursors):
            put(f"{path}/{cursor}", cursor_record(90_000 + i, (plan.ledgers[0].ledger_id, 3)))


# -- the bucket ----------------------------------------------------------------------------------------------


def object_metadata(cluster: str, managed_ledger: str, role: str) -> dict[str, str]:
    """A broker's user metadata on an offloaded object, as S3 returns it (keys lower-cased)."""
    return {"s3managedledgeroffloadersoftwareversion": "3.3.0", "s3managedledgeroffloadersoftwaregitsha": "0a1b2c3",
            "pulsarclustername": cluster, "role": role, "managedledgername": managed_ledger}


def _pair(rng: random.Random, spec: ClusterSpec, ml: str, lid: int, uuid: str | None = None,
          n: int | None = None) -> pulsar_objects.PulsarPair:
    entries = _entries(rng, lid, n or spec.entries, BASE_MS)
    custom = {"application": b"pulsar", "component": b"managed-ledger", "pulsar/managed-ledger": ml.encode()}
    return pulsar_objects.build(entries, MAX_BLOCK, ledger_id=lid, uuid=uuid or _uuid(rng), ctime=BASE_MS,
                                custom=custom)


def _upload(store: Any, pair: pulsar_objects.PulsarPair, cluster: str | None, ml: str, kind: str,
            index: bool = True, damaged: bool = False) -> list[Planted]:
    pulsar_objects.write_data(store, pair, "", object_metadata(cluster or "", ml, "data"))
    out = [Planted(pair.data_key, len(pair.data), kind, cluster, ml, pair.uuid, pair.ledger_id, damaged)]
    if index:
        pulsar_objects.write_index(store, pair, "", object_metadata(cluster or "", ml, "index"))
        out.append(Planted(pair.index_key, len(pair.index), kind, cluster, ml, pair.uuid, pair.ledger_id))
    return out


def flip_payload_byte(pair: pulsar_objects.PulsarPair, entry_id: int, entry: bytes) -> pulsar_objects.PulsarPair:
    """The pair with the last byte of ``entry`` (inside its message payload) flipped in the data object."""
    at = pair.data.find(struct.pack(">iq", len(entry), entry_id) + entry)
    assert at >= 0, f"entry {entry_id} not found in its block"
    data = bytearray(pair.data)
    data[at + 12 + len(entry) - 1] ^= 0x01
    return pulsar_objects.PulsarPair(pair.uuid, pair.ledger_id, pair.data_key, pair.index_key, bytes(data),
                                     pair.index, pair.blocks)


def write_referenced(store: Any, spec: ClusterSpec, topics: dict[str, TopicPlan]) -> list[Planted]:
    """The objects the records reference: complete pairs, the in-progress data object, the damaged pair."""
    out: list[Planted] = []
    for plan in topics.values():
        for ledger in plan.ledgers:
            if ledger.uuid is None:
                continue
            custom = {"application": b"pulsar", "component": b"managed-ledger",
                      "pulsar/managed-ledger": plan.name.encode()}
            pair = pulsar_objects.build(ledger.entries, MAX_BLOCK, ledger_id=ledger.ledger_id, uuid=ledger.uuid,
                                        ctime=ledger_close_ms(plan, ledger) - HOUR_MS, custom=custom)
            damaged = ledger.damaged_entry is not None
            if damaged:
                pair = flip_payload_byte(pair, ledger.damaged_entry, ledger.entries[ledger.damaged_entry])
            kind = IN_PROGRESS if ledger.state == "offloading" else REFERENCED
            out += _upload(store, pair, spec.cluster, plan.name, kind, index=kind == REFERENCED, damaged=damaged)
    return out


def write_unreferenced(store: Any, spec: ClusterSpec, young: bool) -> list[Planted]:
    """Orphans of this cluster (old or young), objects of the other cluster, a file of nobody's."""
    rng = random.Random(spec.seed * 31 + young)
    payments, cpu = "acme/orders/persistent/payments", "acme/metrics/persistent/cpu"
    if young:
        return (_upload(store, _pair(rng, spec, payments, 1004), spec.cluster, payments, YOUNG_ORPHAN)
                + _upload(store, _pair(rng, spec, cpu, 3002), spec.cluster, cpu, YOUNG_ORPHAN, index=False))
    gone = "acme/orders/persistent/gone"
    out = (_upload(store, _pair(rng, spec, payments, 1004), spec.cluster, payments, ORPHAN)  # a failed attempt
           + _upload(store, _pair(rng, spec, gone, 900), spec.cluster, gone, ORPHAN)  # a deleted topic's
           + _upload(store, _pair(rng, spec, payments, 1002), spec.cluster, payments, ORPHAN, index=False)
           + _upload(store, _pair(rng, spec, payments, 1001), spec.other_cluster, payments, OTHER_CLUSTER)
           + _upload(store, _pair(rng, spec, "other/ns/persistent/t", 5001), spec.other_cluster,
                     "other/ns/persistent/t", OTHER_CLUSTER))
    note = b"not a Pulsar object\n"
    store.put("notes/README.txt", note)
    return out + [Planted("notes/README.txt", len(note), FOREIGN, None, None, "", -1)]


def _next_second_boundary() -> int:
    """Wait until the wall clock is past the next whole second (stores keep whole seconds) and return a
    moment between what was written before and what is written after, in ms."""
    second = int(time.time() + 0.02) + 1
    time.sleep(max(0.0, second + 0.005 - time.time()))
    return second * 1000 - 10


def build_cluster(zk_hosts: str, store: Any, store_url: str, bucket: str, endpoint: str = "",
                  spec: ClusterSpec | None = None, *, root: str = "", register_other: bool = False) -> PulsarCluster:
    """Write the cluster's ZooKeeper tree (under ``spec.chroot``) and its bucket (``store``, reached at
    ``store_url``; ``root``: the local store's directory). About a second (the young orphans wait for the
    next whole second of the store's clock)."""
    spec = spec or ClusterSpec()
    topics = plan_topics(spec)
    zk = KazooClient(hosts=zk_hosts)
    zk.start(timeout=15)
    try:
        write_zookeeper(zk, spec, topics, bucket, endpoint, root, register_other)
    finally:
        zk.stop()
        zk.close()
    objects = write_referenced(store, spec, topics) + write_unreferenced(store, spec, young=False)
    boundary = _next_second_boundary()
    objects += write_unreferenced(store, spec, young=True)
    return PulsarCluster(spec, zk_hosts, store, store_url, bucket, topics, objects, boundary)
