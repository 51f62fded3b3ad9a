"""Read replicas (docs/recovery.md "Read replicas"): a workspace that follows another cluster's topic
manifests in its bucket and serves reads from its own metadata store, never writing to that bucket.

:func:`sync` lists ``{prefix}tiered-topic-manifests/{cluster}/`` once; per topic it takes the newest manifest
that decodes (recover's reading and validation: :func:`~tieredcore.lifecycle.recover.newest_valid_manifest`),
and when its sequence is newer than the one the topic's record was synced from, creates or replaces the
record (one compare-and-set, the synced sequence in the record itself: a crash leaves each topic either
before or after its change, and the rerun does the rest). A topic whose newest manifest is a tombstone, or
that has no manifest any more, is removed. Ledgers the manifest shows only in the source's hot tier are left
out of the record (the replica has no copy of them) and counted. The newest sequence listed per topic and the
sync's time are kept in one state record (``/tiered/replica``) for the lag.

The replica's metadata store refuses writes (tieredcore.meta.read_only): the sync alone writes, through the
wrapped store. The bucket is opened read-only: nothing here (or anywhere on a replica) writes or deletes in it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tieredcore.clock import now_ms
from tieredcore.cold.blob import BlobStore, iter_objects
from tieredcore.errors import (
    NodeExistsError,
    TopicNotFoundError,
    ValidationError,
    VersionConflictError,
)
from tieredcore.formats.keys import (
    TOPIC_MANIFEST_DIR,
    normalize_prefix,
    parse_topic_manifest_key,
    topic_manifests_prefix,
)
from tieredcore.formats.mlinfo import ManagedLedgerInfo
from tieredcore.lifecycle.recover import newest_valid_manifest, restrict_to_copies
from tieredcore.meta.managed_ledgers import ManagedLedgerStore
from tieredcore.names import TopicName
from tieredcore.workspace import Workspace

log = logging.getLogger(__name__)

__all__ = ["STATE_PATH", "SYNCED_PROPERTY", "ReplicaLag", "SyncReport", "lag", "manifest_clusters",
           "read_state", "sync"]

STATE_PATH = "/tiered/replica"
# the sequence of the manifest a replica's topic record was made from (written with the record: one CAS)
SYNCED_PROPERTY = "tiered.replicaSequence"


@dataclass(frozen=True)
class _Listed:
    sequence: int
    key: str
    last_modified: float  # seconds


def _list_manifests(store: BlobStore, prefix: str, cluster: str) -> dict[str, list[_Listed]]:
    """Managed-ledger name -> its manifests in the bucket, ascending (one listing of the cluster's manifests)."""
    out: dict[str, list[_Listed]] = {}
    for o in iter_objects(store, topic_manifests_prefix(prefix, cluster)):
        parsed = parse_topic_manifest_key(o.key, prefix, cluster)
        if parsed is not None:
            out.setdefault(parsed[0], []).append(_Listed(parsed[1], o.key, o.last_modified))
    for v in out.values():
        v.sort(key=lambda x: x.sequence)
    return out


def manifest_clusters(store: BlobStore, prefix: str) -> list[str]:
    """The clusters with topic manifests under ``prefix`` (sorted)."""
    start = normalize_prefix(prefix) + TOPIC_MANIFEST_DIR
    found: set[str] = set()
    for o in iter_objects(store, start):
        name = o.key[len(start):].split("/", 1)[0]
        if name and parse_topic_manifest_key(o.key, normalize_prefix(prefix), name) is not None:
            found.add(name)
    return sorted(found)


@dataclass
class SyncReport:
    source: str
    cluster: str
    synced_ms: int = 0
    topics_listed: int = 0
    created: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    unchanged: int = 0
    damaged_manifests: list[str] = field(default_factory=list)
    unusable_topics: list[str] = field(default_factory=list)  # no manifest decodes: record kept as it was
    hot_only: dict[str, list[int]] = field(default_factory=dict)  # ledgers only the source's hot tier holds

    def summary(self) -> str:
        return (f"synced from {self.source} (cluster {self.cluster!r}): {self.topics_listed} topic(s) listed, "
                f"{len(self.created)} created, {len(self.replaced)} updated, {len(self.removed)} removed, "
                f"{self.unchanged} unchanged; {len(self.damaged_manifests)} damaged manifest(s) skipped; "
                "nothing written to the bucket")

    def as_dict(self) -> dict[str, Any]:
        return {"source": self.source, "cluster": self.cluster, "synced_ms": self.synced_ms,
                "topics_listed": self.topics_listed, "created": self.created, "replaced": self.replaced,
                "removed": self.removed, "unchanged": self.unchanged, "damaged_manifests": self.damaged_manifests,
                "unusable_topics": self.unusable_topics, "hot_only": self.hot_only}


def _synced_sequence(info: ManagedLedgerInfo) -> int:
    for kv in info.properties:
        if kv.key == SYNCED_PROPERTY:
            try:
                return int(kv.value)
            except ValueError:
                return -1
    return -1


def _require_replica(ws: Workspace) -> ManagedLedgerStore:
    if not ws.replica:
        raise ValidationError("this workspace is not a read replica (tiered init DIR --replica-of STORE_URL)")
    writable = getattr(ws.metadata, "writable", None)
    if writable is None:
        raise ValidationError("a read replica's metadata store is opened read-only; none here")
    return ManagedLedgerStore(writable)


def read_state(ws: Workspace) -> dict[str, Any]:
    """The replica's sync state: {"synced_ms": .., "topics": {name: newest sequence listed}} ({} before any)."""
    got = ws.metadata.get(STATE_PATH)
    if got is None:
        return {}
    try:
        state = json.loads(got.value)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return state if isinstance(state, dict) else {}


def sync(ws: Workspace, *, clock_ms: Callable[[], int] = now_ms,
         on_step: Callable[[str, str], None] | None = None) -> SyncReport:
    """One sync of a replica from the manifests in the bucket it follows (reads only there). Idempotent:
    a rerun with no new manifest changes nothing. ``on_step(step, topic)`` runs before each write."""
    ml = _require_replica(ws)
    cfg = ws.config
    store = ws.open_location(cfg.store_location)
    prefix = normalize_prefix(cfg.store_location.prefix)
    step = on_step or (lambda _s, _t: None)
    rep = SyncReport(cfg.replica_of, cfg.cluster)
    listed = _list_manifests(store, prefix, cfg.cluster)
    rep.topics_listed = len(listed)
    present = {t.managed_ledger_name: t for ns in ml.list_namespaces() for t in ml.list_topics(ns)}
    for name, entries in sorted(listed.items()):
        topic = TopicName.parse(name)
        current = None
        if name in present:
            try:
                current = ml.get_topic(topic)
            except TopicNotFoundError:
                current = None
        synced = _synced_sequence(current[0]) if current is not None else -1
        if entries[-1].sequence <= synced:
            rep.unchanged += 1
            continue
        newer = [(e.sequence, e.key) for e in entries if e.sequence > synced]
        m = newest_valid_manifest(store, name, newer, rep.damaged_manifests)
        if m is None:
            rep.unusable_topics.append(name)
            continue
        if m.deleted:
            if current is not None:
                step("remove", name)
                _remove(ml, topic, current[1])
                rep.removed.append(name)
            else:
                rep.unchanged += 1
            continue
        info = m.info()
        _cold, hot_only = restrict_to_copies(info, lambda _lid: False)
        if hot_only:
            rep.hot_only[name] = hot_only
        keep = [kv for kv in info.properties if kv.key != SYNCED_PROPERTY]
        del info.properties[:]
        info.properties.extend(keep)
        info.properties.add(key=SYNCED_PROPERTY, value=str(m.sequence))
        if m.namespace_policy is not None and ml.get_policies(topic.namespace_name) != m.namespace_policy:
            step("namespace-policy", name)
            ml.set_policies(topic.namespace_name, m.namespace_policy)
        if m.topic_policy is not None and ml.get_topic_policies(topic) != m.topic_policy:
            step("topic-policy", name)
            ml.set_topic_policies(topic, m.topic_policy)
        elif m.topic_policy is None and ml.get_topic_policies(topic) is not None:
            step("topic-policy", name)
            ml.delete_topic_policies(topic)
        step("topic", name)
        if current is None:
            try:
                ml.create_topic(topic, info)
            except NodeExistsError:  # made meanwhile (another sync): the next run compares sequences again
                continue
            rep.created.append(name)
        else:
            try:
                ml.put_topic(topic, info, current[1])
            except VersionConflictError:  # another sync got there first: the next run compares again
                continue
            rep.replaced.append(name)
    for name, topic in sorted(present.items()):
        if name not in listed:  # no manifest left in the bucket (deleted and drained): gone from the source
            step("remove", name)
            try:
                _, version = ml.get_topic(topic)
                _remove(ml, topic, version)
                rep.removed.append(name)
            except TopicNotFoundError:
                pass
    rep.synced_ms = clock_ms()
    step("state", "")
    state = {"source": cfg.replica_of, "cluster": cfg.cluster, "synced_ms": rep.synced_ms,
             "topics": {name: entries[-1].sequence for name, entries in sorted(listed.items())}}
    ml.store.set(STATE_PATH, json.dumps(state, sort_keys=True).encode())
    log.info("%s", rep.summary())
    return rep


def _remove(ml: ManagedLedgerStore, topic: TopicName, version: int) -> None:
    try:
        ml.delete_topic(topic, version)
    except (TopicNotFoundError, VersionConflictError):
        return  # removed or changed meanwhile: the next run looks again
    ml.delete_topic_policies(topic)


@dataclass
class TopicLag:
    topic: str
    seen: int  # the newest sequence the last sync listed (-1: none)
    newest: int  # the newest in the bucket now
    behind: int  # manifests written since the last sync (still in the bucket)
    sequences_behind: int  # newest sequence in the bucket minus the newest the last sync saw
    unseen_age_ms: int  # age of the oldest manifest the last sync did not see (0: none): how stale the replica is
    newest_unseen_age_ms: int  # age of the newest one (0: none)


@dataclass
class ReplicaLag:
    source: str
    cluster: str
    synced_ms: int  # the last sync's time (0: never synced)
    topics: list[TopicLag]
    now_ms: int

    @property
    def behind(self) -> int:
        return sum(t.behind for t in self.topics)

    @property
    def sequences_behind(self) -> int:
        return sum(t.sequences_behind for t in self.topics)

    @property
    def unseen_age_ms(self) -> int:
        return max((t.unseen_age_ms for t in self.topics), default=0)

    @property
    def newest_unseen_age_ms(self) -> int:
        return min((t.newest_unseen_age_ms for t in self.topics if t.behind), default=0)

    def line(self) -> str:
        when = (f"last sync {max(0, self.now_ms - self.synced_ms) // 1000}s ago" if self.synced_ms
                else "never synced")
        if not self.behind:
            state = "up to date with the bucket"
        else:
            lagging = sum(1 for t in self.topics if t.behind)
            state = (f"{self.behind} manifest(s) ({self.sequences_behind} sequence(s)) behind on {lagging} "
                     f"topic(s), unseen ones written "
                     f"{self.newest_unseen_age_ms // 1000}s to {self.unseen_age_ms // 1000}s ago")
        return f"read replica of {self.source} (cluster {self.cluster!r}): {when}; {state}"

    def as_dict(self) -> dict[str, Any]:
        return {"source": self.source, "cluster": self.cluster, "synced_ms": self.synced_ms,
                "behind": self.behind, "sequences_behind": self.sequences_behind, "unseen_age_ms": self.unseen_age_ms,
                "newest_unseen_age_ms": self.newest_unseen_age_ms,
                "topics": [t.__dict__ for t in self.topics]}


def lag(ws: Workspace, *, clock_ms: Callable[[], int] = now_ms) -> ReplicaLag:
    """The replica's lag: per topic, the newest manifest its last sync listed against the newest in the bucket
    now (one listing of the manifests, reads only): how many sequences behind and how old the oldest manifest
    it has not seen is. A topic it has not seen at all counts from -1."""
    if not ws.replica:
        raise ValidationError("this workspace is not a read replica (tiered init DIR --replica-of STORE_URL)")
    cfg = ws.config
    store = ws.open_location(cfg.store_location)
    prefix = normalize_prefix(cfg.store_location.prefix)
    state = read_state(ws)
    seen: dict[str, int] = state.get("topics", {}) if isinstance(state.get("topics"), dict) else {}
    now = clock_ms()
    listed = _list_manifests(store, prefix, cfg.cluster)
    out = []
    for name in sorted(set(listed) | set(seen)):
        entries = listed.get(name, [])
        s = int(seen.get(name, -1))
        unseen = [e for e in entries if e.sequence > s]
        newest = entries[-1].sequence if entries else s
        age = max(0, now - int(min(e.last_modified for e in unseen) * 1000)) if unseen else 0
        newest_age = max(0, now - int(max(e.last_modified for e in unseen) * 1000)) if unseen else 0
        out.append(TopicLag(name, s, newest, len(unseen), max(0, newest - s), age, newest_age))
    return ReplicaLag(cfg.replica_of, cfg.cluster, int(state.get("synced_ms", 0) or 0), out, now)
