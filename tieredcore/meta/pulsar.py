"""What a Pulsar cluster keeps in its ZooKeeper beside the topic records, as an attached workspace reads it
(never writes it). Paths are relative to Pulsar's metadata-store root (its chroot, if any):

=====================================================================  ====================================
``/managed-ledgers/<tenant>/<namespace>/persistent/<topic>``          ``ManagedLedgerInfo`` (MetaStoreImpl);
                                                                       its children are the topic's cursors
``/admin/clusters/<cluster>``                                          ``ClusterData`` JSON
``/admin/policies/<tenant>``                                           ``TenantInfo`` JSON
``/admin/policies/<tenant>/<namespace>``                               ``Policies`` JSON (namespace policies)
``/admin/partitioned-topics/<tenant>/<namespace>/persistent/<topic>``  ``PartitionedTopicMetadata`` JSON
=====================================================================  ====================================

A partitioned topic has no managed ledger of its own: each partition ``<topic>-partition-<i>`` is one, a
topic like any other under ``persistent/``. The JSON records are Jackson's (Pulsar's ObjectMapperFactory:
null fields left out, unknown fields ignored); this module returns them as dicts, and
:mod:`tieredcore.pulsar_policies` maps namespace policies to this project's :class:`OffloadPolicy`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tieredcore.errors import FormatError, ValidationError
from tieredcore.meta.managed_ledgers import MANAGED_LEDGERS_ROOT, POLICIES_ROOT
from tieredcore.meta.store import MetadataStore
from tieredcore.names import PERSISTENT, NamespaceName, TopicName

CLUSTERS_ROOT = "/admin/clusters"
PARTITIONED_ROOT = "/admin/partitioned-topics"
#: the node older Pulsar versions keep for global namespaces: not a cluster of brokers
GLOBAL_CLUSTER = "global"
PARTITION_INFIX = "-partition-"


@dataclass(frozen=True)
class PartitionedTopic:
    """A partitioned topic (``/admin/partitioned-topics``): its name and how many partitions it has."""

    topic: TopicName
    partitions: int

    def partition(self, i: int) -> TopicName:
        """Partition ``i``: the managed ledger ``<topic>-partition-<i>``."""
        t = self.topic
        return TopicName(t.tenant, t.namespace, f"{t.local_name}{PARTITION_INFIX}{i}")

    def partition_topics(self) -> list[TopicName]:
        return [self.partition(i) for i in range(self.partitions)]


class PulsarRecords:
    """Read-only access to a Pulsar cluster's administrative records in an attached metadata store."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store

    def _json(self, path: str, what: str) -> dict[str, Any] | None:
        got = self.store.get(path)
        if got is None:
            return None
        if not got.value:  # a node Pulsar created without data (a parent on the way)
            return {}
        try:
            value = json.loads(got.value)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise FormatError(f"{what} ({path}): not valid JSON: {e}") from None
        if not isinstance(value, dict):
            raise FormatError(f"{what} ({path}): a JSON {type(value).__name__}, not an object")
        return value

    # -- the layout ----------------------------------------------------------------------------

    def layout_problems(self) -> list[str]:
        """What is missing for this to be a Pulsar cluster's metadata store ([] when nothing is)."""
        return [f"no {p}" for p in (MANAGED_LEDGERS_ROOT, CLUSTERS_ROOT) if self.store.get(p) is None]

    def clusters(self) -> list[str]:
        """The clusters registered here (``/admin/clusters``), sorted; never the legacy ``global``."""
        return [c for c in self.store.children(CLUSTERS_ROOT) if c != GLOBAL_CLUSTER]

    def cluster(self, name: str) -> dict[str, Any] | None:
        """The cluster's ``ClusterData`` (service URLs...), or None when no such cluster is registered."""
        return self._json(f"{CLUSTERS_ROOT}/{name}", f"cluster {name}")

    # -- tenants and namespaces ----------------------------------------------------------------

    def tenants(self) -> list[str]:
        return self.store.children(POLICIES_ROOT)

    def tenant(self, tenant: str) -> dict[str, Any] | None:
        """The tenant's ``TenantInfo`` (adminRoles, allowedClusters), or None."""
        return self._json(f"{POLICIES_ROOT}/{tenant}", f"tenant {tenant}")

    def namespace_policies(self, namespace: str | NamespaceName) -> dict[str, Any] | None:
        """The namespace's ``Policies`` as Pulsar stored them, or None when it has none."""
        ns = NamespaceName.parse(namespace)
        return self._json(f"{POLICIES_ROOT}/{ns.name}", f"namespace {ns.name} policies")

    # -- partitioned topics --------------------------------------------------------------------

    def partitioned_topics(self, namespace: str | NamespaceName) -> list[PartitionedTopic]:
        """The namespace's partitioned topics, sorted by name (names that do not parse are skipped)."""
        ns = NamespaceName.parse(namespace)
        base = f"{PARTITIONED_ROOT}/{ns.name}/{PERSISTENT}"
        out = []
        for encoded in self.store.children(base):
            try:
                topic = TopicName.parse(f"{ns.name}/{PERSISTENT}/{encoded}")
            except ValidationError:
                continue
            meta = self._json(f"{base}/{encoded}", f"partitioned topic {topic.full}") or {}
            n = meta.get("partitions")
            if isinstance(n, int) and not isinstance(n, bool) and n > 0:
                out.append(PartitionedTopic(topic, n))
        return out

    def partitioned_topic_of(self, topic: str | TopicName) -> TopicName | None:
        """The partitioned topic a managed ledger is a partition of (by its name), or None."""
        t = TopicName.parse(topic)
        base, sep, index = t.local_name.rpartition(PARTITION_INFIX)
        if not sep or not base or not index.isdigit():
            return None
        for p in self.partitioned_topics(t.namespace_name):
            if p.topic.local_name == base and int(index) < p.partitions:
                return p.topic
        return None
