"""Namespace policies of an attached Pulsar cluster, read from Pulsar's own ``/admin/policies/<tenant>/<ns>``
JSON and mapped to this project's :class:`~tieredcore.policy.OffloadPolicy` — read-only: they are the
brokers' (set them with ``pulsar-admin namespaces set-offload-policies`` and friends).

What is read (Pulsar's ``Policies`` and ``OffloadPoliciesImpl``, serialised by Jackson with null fields left
out; a value in ``offload_policies`` wins over the older top-level field, which Pulsar's admin API keeps in
step with it):

===================================================================  =====================================
Pulsar                                                               OffloadPolicy
===================================================================  =====================================
``offload_policies.managedLedgerOffloadThresholdInBytes``,           ``offload_threshold_bytes``
``offload_threshold`` (-1 there is also Pulsar's "not set")
``offload_policies.managedLedgerOffloadThresholdInSeconds``,         ``offload_threshold_seconds``
``offload_threshold_in_seconds``
``offload_policies.managedLedgerOffloadDeletionLagInMillis``,        ``deletion_lag_ms``
``offload_deletion_lag_ms``
``retention_policies.retentionTimeInMinutes`` / ``retentionSizeInMB``  ``retention_time_minutes`` / ``_size_mb``
``offload_policies.managedLedgerOffloadedReadPriority``              ``read_priority``
``offload_policies.managedLedgerOffloadDriver`` and bucket, region,  ``store`` (aws-s3 for ``S3`` / ``aws-s3``
endpoint (``managedLedgerOffload*``, else the ``s3*`` / ``gcs*``       in any case, google-cloud-storage,
fields of that driver)                                                azureblob); Pulsar has no key prefix
``...MaxBlockSizeInBytes`` / ``...ReadBufferSizeInBytes``             ``max_block_size`` / ``read_buffer_size``
===================================================================  =====================================

Anything not set in ZooKeeper is the brokers' default (``broker.conf``), which ZooKeeper does not hold: the
project's defaults stand in (offload off, a 4 h deletion lag as Pulsar's default, unlimited retention).
Pulsar keeps topic-level policies in its ``__change_events`` system topic, not in ZooKeeper: none are read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tieredcore.cold.drivers import DRIVER_AZURE, DRIVER_GCS, DRIVER_S3, DRIVER_S3_LEGACY
from tieredcore.errors import PulsarReadOnlyError
from tieredcore.meta.pulsar import PulsarRecords
from tieredcore.names import NamespaceName, TopicName
from tieredcore.policy import HOT_FIRST, TIERED_FIRST, OffloadPolicy, PolicyStore, StoreSpec

#: Pulsar's OffloadedReadPriority, as Jackson writes the enum (its name) or as configured (its value)
READ_PRIORITIES = {"TIERED_STORAGE_FIRST": TIERED_FIRST, "tiered-storage-first": TIERED_FIRST,
                   "BOOKKEEPER_FIRST": HOT_FIRST, "bookkeeper-first": HOT_FIRST}
#: driver names as brokers match them (ignoring case) -> this project's policy driver
DRIVERS = {DRIVER_S3.lower(): DRIVER_S3, DRIVER_S3_LEGACY.lower(): DRIVER_S3, DRIVER_GCS: DRIVER_GCS,
           DRIVER_AZURE: DRIVER_AZURE}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


@dataclass(frozen=True)
class PulsarNamespacePolicy:
    """A namespace's offload, deletion-lag and retention settings as Pulsar records them (None: not set in
    ZooKeeper, the brokers' default applies); ``raw`` is the whole Policies JSON."""

    namespace: str
    threshold_bytes: int | None = None
    threshold_seconds: int | None = None
    deletion_lag_ms: int | None = None
    retention_minutes: int | None = None
    retention_mb: int | None = None
    read_priority: str | None = None
    driver: str | None = None  # as configured (Pulsar matches it ignoring case)
    bucket: str | None = None
    region: str | None = None
    endpoint: str | None = None
    max_block_size: int | None = None
    read_buffer_size: int | None = None
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def parse(cls, namespace: str, raw: dict[str, Any] | None) -> PulsarNamespacePolicy:
        raw = raw or {}
        off = raw.get("offload_policies") if isinstance(raw.get("offload_policies"), dict) else {}
        retention = raw.get("retention_policies") if isinstance(raw.get("retention_policies"), dict) else {}
        driver = _str(off.get("managedLedgerOffloadDriver"))
        kind = DRIVERS.get(driver.lower()) if driver else None
        family = "s3" if kind == DRIVER_S3 else "gcs" if kind == DRIVER_GCS else ""

        def pick(name: str, typ=_str) -> Any:
            """managedLedgerOffload<name>, else the driver family's own <family>ManagedLedgerOffload<name>."""
            v = typ(off.get(f"managedLedgerOffload{name}"))
            return v if v is not None or not family else typ(off.get(f"{family}ManagedLedgerOffload{name}"))

        def threshold(name: str, top: str) -> int | None:
            """offload_policies' value, else the top-level field's (whose -1 is Pulsar's "not set")."""
            v = _int(off.get(f"managedLedgerOffloadThresholdIn{name}"))
            t = _int(raw.get(top))
            return v if v is not None else None if t in (None, -1) else t

        lag = _int(off.get("managedLedgerOffloadDeletionLagInMillis"))
        return cls(
            namespace=NamespaceName.parse(namespace).name,
            threshold_bytes=threshold("Bytes", "offload_threshold"),
            threshold_seconds=threshold("Seconds", "offload_threshold_in_seconds"),
            deletion_lag_ms=lag if lag is not None else _int(raw.get("offload_deletion_lag_ms")),
            retention_minutes=_int(retention.get("retentionTimeInMinutes")),
            retention_mb=_int(retention.get("retentionSizeInMB")),
            read_priority=READ_PRIORITIES.get(str(off.get("managedLedgerOffloadedReadPriority"))),
            driver=driver, bucket=pick("Bucket"), region=pick("Region") if kind == DRIVER_S3 else None,
            endpoint=pick("ServiceEndpoint"), max_block_size=pick("MaxBlockSizeInBytes", _int),
            read_buffer_size=pick("ReadBufferSizeInBytes", _int), raw=raw)

    @property
    def store(self) -> StoreSpec | None:
        """The store the policies name, when it is one this build opens (S3, GCS, Azure) and has a bucket."""
        kind = DRIVERS.get(self.driver.lower()) if self.driver else None
        if kind is None or not self.bucket:
            return None
        return StoreSpec(driver=kind, bucket=self.bucket, endpoint=self.endpoint or "", region=self.region or "")

    def overrides(self) -> dict[str, Any]:
        """The project's policy fields these settings set (what is not set keeps the defaults)."""
        pairs = {"offload_threshold_bytes": self.threshold_bytes, "offload_threshold_seconds": self.threshold_seconds,
                 "deletion_lag_ms": self.deletion_lag_ms, "retention_time_minutes": self.retention_minutes,
                 "retention_size_mb": self.retention_mb, "read_priority": self.read_priority,
                 "max_block_size": self.max_block_size, "read_buffer_size": self.read_buffer_size}
        out: dict[str, Any] = {k: v for k, v in pairs.items() if v is not None}
        store = self.store
        if store is not None:
            out["store"] = {k: v for k, v in store.__dict__.items() if v}
        return out


def brokers_own_policies(cluster: str, what: str) -> PulsarReadOnlyError:
    return PulsarReadOnlyError(
        f"refused to {what}: the namespace and topic policies of an attached workspace belong to the brokers of "
        f"Pulsar cluster {cluster!r} (set them with pulsar-admin, e.g. `pulsar-admin namespaces "
        "set-offload-policies`); this workspace reads them from ZooKeeper and never writes them")


@dataclass
class PulsarPolicyStore(PolicyStore):
    """:class:`PolicyStore` of an attached workspace: Pulsar's namespace policies, mapped, read-only."""

    cluster: str = ""

    @property
    def records(self) -> PulsarRecords:
        return PulsarRecords(self.ml.store)

    @property
    def brokers(self) -> str | None:
        return self.cluster

    def pulsar(self, namespace: str) -> PulsarNamespacePolicy:
        """The namespace's settings as Pulsar records them (FormatError when its JSON is not readable)."""
        ns = NamespaceName.parse(namespace).name
        return PulsarNamespacePolicy.parse(ns, self.records.namespace_policies(ns))

    def namespace_overrides(self, namespace: str) -> dict[str, Any]:
        return self.pulsar(namespace).overrides()

    def topic_overrides(self, topic: str | TopicName) -> dict[str, Any]:
        return {}  # Pulsar keeps topic policies in a system topic (__change_events), not in ZooKeeper

    def set_namespace(self, namespace: str, updates: dict[str, Any], replace_all: bool = False) -> OffloadPolicy:
        raise brokers_own_policies(self.cluster, f"set the policies of namespace {NamespaceName.parse(namespace).name}")

    def set_topic(self, topic: str | TopicName, updates: dict[str, Any], replace_all: bool = False) -> OffloadPolicy:
        raise brokers_own_policies(self.cluster, f"set the policies of topic {TopicName.parse(topic).full}")

    def namespaces_with_compaction(self) -> list[str]:
        return []  # repacking objects is this project's; Pulsar's brokers read only their own layout

    def stores(self) -> dict[str, StoreSpec]:
        """Namespace -> the store its policies name (namespaces that name none are left out)."""
        out = {}
        for ns in sorted(set(self.ml.list_namespaces()) | set(self.ml.list_policy_namespaces())):
            store = self.pulsar(ns).store
            if store is not None:
                out[ns] = store
        return out
