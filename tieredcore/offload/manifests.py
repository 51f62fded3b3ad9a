"""Writing topic manifests (docs/recovery.md): after every compare-and-set that changes what a topic has
offloaded, one small object in the workspace's configured store describes the topic as committed.

The manifest is written *after* the record it describes, and names only complete copies (the format's
offloaded view), so it never names an object that does not exist yet. A crash between the commit and the
manifest leaves the previous manifest (an older sequence) as the newest: recovery checks every manifest
against the listing and falls back to the index objects for what it lacks. The newest ``keep`` manifests
of a topic stay; orphan reconciliation sends older ones through the deletion log (type ``manifest``):
nothing deletes a manifest directly.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from typing import Any

from tieredcore.cold.blob import BlobStore, iter_objects
from tieredcore.errors import NodeExistsError, ValidationError
from tieredcore.formats.constants import METADATA_CLUSTER_NAME_KEY, METADATA_OWNER_KEY
from tieredcore.formats.keys import parse_topic_manifest_key, topic_manifest_key, topic_manifests_prefix
from tieredcore.formats.mlinfo import ManagedLedgerInfo
from tieredcore.formats.topic_manifest import (
    TOMBSTONE_PROPERTY,
    TopicManifest,
    encode_topic_manifest,
    encode_view,
)
from tieredcore.meta.deletion_log import TYPE_MANIFEST, DeletionLog, DeletionRecord
from tieredcore.meta.reasons import Reason
from tieredcore.names import TopicName

log = logging.getLogger(__name__)

__all__ = ["SEQUENCE_BASE_PROPERTY", "TopicManifests", "manifest_sequence", "set_sequence_base", "tombstone"]

# The manifest sequence is base + the record's version. Recovery restores a record at version 0 and sets the
# base past the newest manifest it read, so sequences stay monotonic across a recovery.
SEQUENCE_BASE_PROPERTY = "tiered.manifestSequenceBase"
# user metadata naming the topic (the drain's owner check reads the same key on ledger objects)
TOPIC_METADATA_KEY = "managedledgername"

Policies = Callable[[TopicName], tuple[dict[str, Any] | None, dict[str, Any] | None]]


def sequence_base(info: ManagedLedgerInfo) -> int:
    for kv in info.properties:
        if kv.key == SEQUENCE_BASE_PROPERTY:
            try:
                return max(0, int(kv.value))
            except ValueError:
                return 0
    return 0


def set_sequence_base(info: ManagedLedgerInfo, base: int) -> None:
    keep = [kv for kv in info.properties if kv.key != SEQUENCE_BASE_PROPERTY]
    del info.properties[:]
    info.properties.extend(keep)
    info.properties.add(key=SEQUENCE_BASE_PROPERTY, value=str(base))


def manifest_sequence(info: ManagedLedgerInfo, version: int) -> int:
    return sequence_base(info) + version


def tombstone(info: ManagedLedgerInfo) -> ManagedLedgerInfo:
    """The record a deleted topic's last manifest holds: no ledgers, the tombstone property, the sequence
    base of the record it replaces (so its sequence follows the topic's)."""
    out = ManagedLedgerInfo()
    out.properties.add(key=TOMBSTONE_PROPERTY, value="true")
    set_sequence_base(out, sequence_base(info))
    return out


def offloaded_state(info: ManagedLedgerInfo) -> bytes:
    """What a manifest would record of ``info`` (the base property aside): compared before and after a
    compare-and-set to decide whether a manifest is due."""
    view = ManagedLedgerInfo()
    view.CopyFrom(info)
    keep = [kv for kv in view.properties if kv.key != SEQUENCE_BASE_PROPERTY]
    del view.properties[:]
    view.properties.extend(keep)
    return encode_view(view)


class TopicManifests:
    """The manifests of one store location (``store`` plain, never transformed: a manifest must read
    without a key ring)."""

    def __init__(self, store: BlobStore, prefix: str, *, deletion_log: DeletionLog, keep: int, cluster: str,
                 identity: Callable[[], str], policies: Policies, clock_ms: Callable[[], int],
                 driver: dict[str, Any], before_write: Callable[[], None] = lambda: None) -> None:
        if keep < 1:
            raise ValidationError(f"manifests to keep must be >= 1, got {keep}")
        self.store, self.prefix, self.deletion_log, self.keep = store, prefix, deletion_log, keep
        self.cluster, self.identity, self.policies, self.clock_ms = cluster, identity, policies, clock_ms
        self.driver, self.before_write = driver, before_write

    def sequences(self, topic: TopicName) -> list[int]:
        """The sequence numbers of the topic's manifests in the store, ascending."""
        name = topic.managed_ledger_name
        out = []
        for o in iter_objects(self.store, topic_manifests_prefix(self.prefix, self.cluster, name)):
            parsed = parse_topic_manifest_key(o.key, self.prefix, self.cluster)
            if parsed is not None and parsed[0] == name:
                out.append(parsed[1])
        return sorted(out)

    def write(self, topic: TopicName, info: ManagedLedgerInfo, version: int) -> str:
        """Write the manifest of ``info`` as committed at ``version`` (one PUT; superseded manifests are
        recorded for deletion by reconciliation, not here). Returns the key."""
        name = topic.managed_ledger_name
        ns_policy, topic_policy = self.policies(topic)
        seq = manifest_sequence(info, version)
        m = TopicManifest(name, seq, self.clock_ms(), encode_view(info), ns_policy, topic_policy)
        key = topic_manifest_key(self.prefix, self.cluster, name, seq)
        self.before_write()
        self.store.put(key, encode_topic_manifest(m), {
            METADATA_CLUSTER_NAME_KEY: self.cluster, METADATA_OWNER_KEY: self.identity(), TOPIC_METADATA_KEY: name})
        return key

    def all_sequences(self) -> dict[str, list[int]]:
        """Managed-ledger name -> the sequence numbers of its manifests in the store, ascending (one listing
        of the manifest directory)."""
        out: dict[str, list[int]] = {}
        for o in iter_objects(self.store, topic_manifests_prefix(self.prefix, self.cluster)):
            parsed = parse_topic_manifest_key(o.key, self.prefix, self.cluster)
            if parsed is not None:
                out.setdefault(parsed[0], []).append(parsed[1])
        return {k: sorted(v) for k, v in out.items()}

    def superseded(self) -> list[DeletionRecord]:
        """A deletion record (type ``manifest``) for each manifest older than its topic's newest ``keep``.
        Record ids are derived from the topic and sequence, so a record appended before is not appended
        twice. Orphan reconciliation appends them: it lists the store anyway, and the write path stays one
        PUT per change."""
        out = []
        now = self.clock_ms()
        for name, seqs in sorted(self.all_sequences().items()):
            tag = hashlib.sha256(name.encode()).hexdigest()[:24]
            for seq in seqs[:-self.keep]:
                out.append(DeletionRecord(topic=name, ledger_id=seq, type=TYPE_MANIFEST,
                                          reason=Reason.MANIFEST_SUPERSEDED, created_ms=now,
                                          driver=dict(self.driver), id=f"manifest-{tag}-{seq}"))
        return out

    def supersede(self, records: list[DeletionRecord] | None = None) -> int:
        """Append the :meth:`superseded` records not appended before; how many were appended now."""
        n = 0
        for rec in self.superseded() if records is None else records:
            try:
                self.deletion_log.append([rec])
                n += 1
            except NodeExistsError:
                continue  # appended by an earlier run; the drain has not got to it yet
        return n

    def after_commit(self, topic: TopicName, info: ManagedLedgerInfo, version: int) -> None:
        """The hook a committed change calls: the commit stands whatever happens here, so a failure is
        logged, and the topic keeps its older manifest until the next change (or recovery's fallback)."""
        try:
            self.write(topic, info, version)
        except Exception as e:  # noqa: BLE001 - whatever failed, the committed change must not be undone
            log.warning("%s: topic manifest not written (an older one stays the newest): %s",
                        topic.managed_ledger_name, e)
