"""Rebuild the metadata store from the bucket alone (docs/recovery.md; `tiered recover`).

One listing of the workspace's configured store (its prefix) finds the topic manifests and the offloaded
objects. Per topic the newest manifest that decodes (checksum) and names only objects the listing holds is
the source; ledgers it does not show as offloaded but whose V1 index object exists (an offload whose
manifest write was lost) are taken from the index. Topics without a usable manifest are rebuilt from the
self-describing V1 index objects (their ledger metadata names the managed ledger). A ledger found under
two uuids is resolved as the offload protocol resolves attempts: the latest attempt wins (here: the
complete pair whose index object was written last); the loser is reported as an orphan, never deleted.
Ledgers whose hot copy is gone are restored cold-only (``bookkeeperDeleted``); a ledger with neither an
offloaded copy nor a hot copy is lost and reported.

Applying is crash-safe and rerunnable: a marker record (``/tiered/recovery``) is written first; each topic
is one create (all or nothing); a rerun that finds the marker still "running" continues where the crash
left it, creating only what is missing. Nothing is ever written to or deleted from the bucket.
"""

from __future__ import annotations

import json
import logging
import uuid as uuidlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tieredcore.clock import now_ms
from tieredcore.cold.blob import BlobStore, iter_objects
from tieredcore.cold.location import StoreLocation
from tieredcore.errors import FormatError, NodeExistsError, NoSuchObjectError, TieredError, ValidationError
from tieredcore.formats.constants import METADATA_OWNER_KEY
from tieredcore.formats.index import parse_index_v1
from tieredcore.formats.keys import (
    COMPACTED_LEDGER_METADATA_KEY,
    MANIFEST_SUFFIX,
    data_key,
    index_key,
    parse_key,
    parse_topic_manifest_key,
    segment_index_key,
)
from tieredcore.formats.mlinfo import ManagedLedgerInfo
from tieredcore.formats.topic_manifest import TopicManifest, decode_topic_manifest
from tieredcore.formats.uuids import uuid_to_msb_lsb
from tieredcore.names import TopicName
from tieredcore.offload.compacted_state import compacted_uuids, compaction_state
from tieredcore.offload.context import (
    LedgerInfo,
    context_driver,
    driver_metadata_from_dict,
    is_complete,
    is_offloaded,
    referenced_uuids,
    segment_drivers,
    segment_uuids,
)
from tieredcore.offload.manifests import set_sequence_base
from tieredcore.offload.ownership import IDENTITY_PATH, foreign_reason, read_identity, read_marker
from tieredcore.workspace import Workspace

log = logging.getLogger(__name__)

__all__ = ["MARKER_PATH", "RecoverReport", "TopicPlan", "newest_valid_manifest", "plan_recovery", "read_topic_manifest",
           "recover", "restrict_to_copies"]

MARKER_PATH = "/tiered/recovery"
MANAGED_LEDGER_KEY = "pulsar/managed-ledger"  # the ledger's custom metadata naming its topic


@dataclass
class TopicPlan:
    topic: str  # managed-ledger name
    source: str  # "manifest" | "index"
    sequence: int  # the manifest's (0 from index objects)
    next_base: int  # the new record's manifest sequence base: past every manifest seen of the topic
    info: ManagedLedgerInfo
    namespace_policy: dict[str, Any] | None = None
    topic_policy: dict[str, Any] | None = None
    from_index: list[int] = field(default_factory=list)  # ledgers taken from index objects
    cold_only: list[int] = field(default_factory=list)  # hot copy gone: restored bookkeeperDeleted
    lost: list[int] = field(default_factory=list)  # neither copy: left out of the record
    action: str = "create"  # create | created | exists (kept: never overwritten)

    def line(self) -> str:
        n = len(self.info.ledgerInfo)
        off = sum(1 for li in self.info.ledgerInfo if is_offloaded(li) or is_complete(li))
        src = f"manifest #{self.sequence}" if self.source == "manifest" else "index objects"
        extra = "".join([f", {len(self.from_index)} from index objects" if self.from_index and self.source ==
                         "manifest" else "", f", {len(self.cold_only)} cold-only" if self.cold_only else "",
                         f", LOST (no copy) {self.lost}" if self.lost else ""])
        return f"{self.action:<8} {self.topic}: {n} ledger(s), {off} offloaded, from {src}{extra}"


@dataclass
class RecoverReport:
    store: str
    applied: bool
    objects_listed: int = 0
    manifests: int = 0
    damaged_manifests: list[str] = field(default_factory=list)  # key: why
    stale_manifests: list[str] = field(default_factory=list)  # named an object the listing lacks
    fallback_topics: list[str] = field(default_factory=list)  # had manifests, none usable
    orphans: list[str] = field(default_factory=list)  # object groups no recovered record names
    unreadable: list[str] = field(default_factory=list)  # index objects that could not be read
    not_recoverable: list[str] = field(default_factory=list)  # objects recovery cannot attribute alone
    deleted_topics: list[str] = field(default_factory=list)  # newest manifest a tombstone: not recreated
    topics: list[TopicPlan] = field(default_factory=list)
    identity: str = ""

    def summary(self) -> str:
        created = sum(1 for t in self.topics if t.action in ("create", "created"))
        kept = sum(1 for t in self.topics if t.action == "exists")
        verb = "created" if self.applied else "would create"
        return (f"{verb} {created} topic(s) ({sum(t.source == 'manifest' for t in self.topics)} from manifests, "
                f"{sum(t.source == 'index' for t in self.topics)} from index objects), {kept} kept as they are; "
                f"{self.objects_listed} object(s) listed, {self.manifests} manifest(s), "
                f"{len(self.damaged_manifests)} damaged, {len(self.stale_manifests)} stale, "
                f"{len(self.orphans)} orphan group(s) reported (nothing deleted)"
                + ("" if self.applied else "; rerun with --apply to write"))

    def as_dict(self) -> dict[str, Any]:
        return {"store": self.store, "applied": self.applied, "objects_listed": self.objects_listed,
                "manifests": self.manifests, "damaged_manifests": self.damaged_manifests,
                "stale_manifests": self.stale_manifests, "fallback_topics": self.fallback_topics,
                "orphans": self.orphans, "unreadable": self.unreadable, "not_recoverable": self.not_recoverable,
                "deleted_topics": self.deleted_topics,
                "identity": self.identity,
                "topics": [{"topic": t.topic, "action": t.action, "source": t.source, "sequence": t.sequence,
                            "ledgers": [li.ledgerId for li in t.info.ledgerInfo], "from_index": t.from_index,
                            "cold_only": t.cold_only, "lost": t.lost} for t in self.topics]}


@dataclass
class _Listing:
    keys: dict[str, float]  # key -> last modified (s)
    sizes: dict[str, int]
    manifests: dict[str, list[tuple[int, str]]]  # topic -> [(sequence, key)], ascending
    pairs: dict[int, list[str]]  # ledger id -> uuids with a V1 index object
    segments: set[str]  # uuids with a segment index object


def _list(store: BlobStore, prefix: str, cluster: str) -> _Listing:
    out = _Listing({}, {}, {}, {}, set())
    for o in iter_objects(store, prefix):
        out.keys[o.key] = o.last_modified
        out.sizes[o.key] = o.size
        m = parse_topic_manifest_key(o.key, prefix, cluster)
        if m is not None:
            out.manifests.setdefault(m[0], []).append((m[1], o.key))
            continue
        p = parse_key(o.key, prefix)
        if p is None or not p.is_index or p.is_manifest:
            continue
        if p.ledger_id is None:
            out.segments.add(p.uuid)
        else:
            out.pairs.setdefault(p.ledger_id, []).append(p.uuid)
    for v in out.manifests.values():
        v.sort()
    return out


# -- planning ---------------------------------------------------------------------------------------


class _Recovery:
    def __init__(self, ws: Workspace, store: BlobStore, prefix: str, listing: _Listing,
                 hot_exists: Callable[[int], bool], report: RecoverReport) -> None:
        self.ws, self.store, self.prefix, self.listing, self.hot_exists = ws, store, prefix, listing, hot_exists
        self.report = report
        self.location = ws.config.store_location
        self.driver = self.location.driver_metadata()
        self._index_cache: dict[tuple[int, str], tuple[str, Any] | None] = {}

    def ours(self, dm) -> bool:
        """Whether driver metadata names the store being listed (only those objects can be checked)."""
        if dm is None or not dm.name:
            return True
        try:
            return StoreLocation.from_driver_metadata(dm).same_objects(self.location)
        except ValidationError:
            return False

    def missing(self, info: ManagedLedgerInfo) -> list[str]:
        """Index keys in the listed store a record names that the listing lacks."""
        out = []
        for li in info.ledgerInfo:
            segs = set(segment_uuids(li))
            drivers = segment_drivers(li)
            for u in referenced_uuids(li):
                if u in segs:
                    key, ours = segment_index_key(self.prefix, u), self.ours(drivers.get(u))
                else:
                    key, ours = index_key(self.prefix, u, li.ledgerId), self.ours(context_driver(li))
                if ours and key not in self.listing.keys and key + MANIFEST_SUFFIX not in self.listing.keys:
                    out.append(key)
        st = compaction_state(info)
        if st is not None and st.uuid and self.ours(driver_metadata_from_dict(st.driver) if st.driver else None):
            key = index_key(self.prefix, st.uuid, st.ledger_id)
            if key not in self.listing.keys and key + MANIFEST_SUFFIX not in self.listing.keys:
                out.append(key)
        return out

    def index_owner(self, ledger_id: int, uuid: str) -> tuple[str, Any] | None:
        """(managed-ledger name, parsed index) of a plain V1 pair, or None (unreadable, foreign, partial)."""
        k = (ledger_id, uuid)
        if k not in self._index_cache:
            self._index_cache[k] = self._read_index(ledger_id, uuid)
        return self._index_cache[k]

    def _read_index(self, ledger_id: int, uuid: str) -> tuple[str, Any] | None:
        ikey, dkey = index_key(self.prefix, uuid, ledger_id), data_key(self.prefix, uuid, ledger_id)
        if ikey + MANIFEST_SUFFIX in self.listing.keys:
            self.report.not_recoverable.append(f"{ikey}: a transformed (chunked) pair is recovered from manifests only")
            return None
        try:
            idx = parse_index_v1(self.store.get(ikey), ledger_id)
        except (TieredError, NoSuchObjectError) as e:
            self.report.unreadable.append(f"{ikey}: {e}")
            return None
        if self.listing.sizes.get(dkey) != idx.data_object_length:
            self.report.unreadable.append(f"{ikey}: its data object is missing or not {idx.data_object_length} bytes")
            return None
        try:
            meta = self.store.head(ikey).metadata
        except (TieredError, NoSuchObjectError) as e:
            self.report.unreadable.append(f"{ikey}: {e}")
            return None
        # a bucket shared with other clusters or workspaces: only what this workspace's marker owns
        foreign = foreign_reason(meta, self.ws.config.cluster, self.report.identity or meta.get(METADATA_OWNER_KEY, ""))
        if foreign is not None:
            self.report.not_recoverable.append(f"{ikey}: not this workspace's: {foreign}")
            return None
        compacted = meta.get(COMPACTED_LEDGER_METADATA_KEY) == "true"
        if compacted:  # its pointer and horizon are in the topic's record (manifest) only
            self.report.not_recoverable.append(f"{ikey}: a compacted ledger, restored from its topic's manifest only")
            return None
        raw = idx.metadata.custom_metadata.get(MANAGED_LEDGER_KEY)
        if not raw:
            self.report.not_recoverable.append(f"{ikey}: its ledger metadata names no managed ledger")
            return None
        try:
            name = TopicName.parse(bytes(raw).decode()).managed_ledger_name
        except (UnicodeDecodeError, ValidationError) as e:
            self.report.unreadable.append(f"{ikey}: managed-ledger name: {e}")
            return None
        return name, idx

    def winners(self, named: set[str]) -> dict[str, dict[int, tuple[str, Any]]]:
        """topic -> ledger id -> (uuid, index) of every readable V1 pair no chosen manifest names (``named``:
        their uuids), one per ledger: the latest attempt (the index object written last; equal times: the
        greater uuid) wins, the others are orphans."""
        out: dict[str, dict[int, tuple[str, Any]]] = {}
        for lid, uuids in sorted(self.listing.pairs.items()):
            found: dict[str, list[tuple[float, str, Any]]] = {}
            for u in uuids:
                if u in named:
                    continue
                got = self.index_owner(lid, u)
                if got is not None:
                    found.setdefault(got[0], []).append((self.listing.keys[index_key(self.prefix, u, lid)], u, got[1]))
            for topic, cands in found.items():
                cands.sort(key=lambda c: (c[0], c[1]))
                _, u, idx = cands[-1]
                out.setdefault(topic, {})[lid] = (u, idx)
                for _, loser, _ in cands[:-1]:
                    self.report.orphans.append(f"{index_key(self.prefix, loser, lid)} ({topic} ledger {lid}: "
                                               f"superseded by attempt {u})")
        return out

    def context_from_index(self, li: LedgerInfo, uuid: str, idx: Any) -> None:
        msb, lsb = uuid_to_msb_lsb(uuidlib.UUID(uuid))
        ctx = li.offloadContext
        ctx.Clear()
        ctx.uidMsb, ctx.uidLsb, ctx.complete = msb, lsb, True
        ctx.timestamp = int(self.listing.keys[index_key(self.prefix, uuid, li.ledgerId)] * 1000)
        ctx.driverMetadata.CopyFrom(self.driver)

    def hot_state(self, plan: TopicPlan) -> None:
        """Ledgers whose hot copy is gone: cold-only when offloaded (or partly held by segments), else lost."""
        cold_only, lost = restrict_to_copies(plan.info, self.hot_exists)
        plan.cold_only.extend(cold_only)
        plan.lost.extend(lost)


def restrict_to_copies(info: ManagedLedgerInfo, hot_exists: Callable[[int], bool]) -> tuple[list[int], list[int]]:
    """Keep in ``info`` the ledgers with a copy: those ``hot_exists`` holds, and offloaded ones (or partly held
    by segments) without a hot copy, marked cold-only (``bookkeeperDeleted``). Returns (ledgers newly marked
    cold-only, ledgers left out: neither copy here)."""
    keep, cold_only, lost = [], [], []
    for li in info.ledgerInfo:
        if hot_exists(li.ledgerId):
            keep.append(li)
        elif is_complete(li) or is_offloaded(li) or li.offloadContext.offloadSegment:
            if not li.offloadContext.bookkeeperDeleted:
                li.offloadContext.bookkeeperDeleted = True
                cold_only.append(li.ledgerId)
            keep.append(li)
        else:
            lost.append(li.ledgerId)
    if len(keep) != len(info.ledgerInfo):
        copies = [LedgerInfo() for _ in keep]
        for c, x in zip(copies, keep, strict=True):
            c.CopyFrom(x)
        del info.ledgerInfo[:]
        info.ledgerInfo.extend(copies)
    return cold_only, lost


def read_topic_manifest(store: BlobStore, key: str, topic: str, sequence: int) -> TopicManifest:
    """The manifest at ``key`` (listed as ``topic`` #``sequence``): FormatError when it does not decode
    (checksum, format) or names another topic or sequence than its key; NoSuchObjectError when gone."""
    m = decode_topic_manifest(store.get(key))
    if m.topic != topic or m.sequence != sequence:
        raise FormatError(f"names {m.topic} #{m.sequence}, its key {topic} #{sequence}")
    return m


def newest_valid_manifest(store: BlobStore, topic: str, entries: list[tuple[int, str]], damaged: list[str],
                          stale: Callable[[TopicManifest], str | None] | None = None,
                          stale_out: list[str] | None = None) -> TopicManifest | None:
    """The newest of a topic's manifests (``entries``: (sequence, key), ascending) that decodes and, with
    ``stale``, that it does not find stale (its answer: why, appended to ``stale_out``); the skipped ones
    are appended to ``damaged`` ("key: why"). None when none is usable."""
    for seq, key in reversed(entries):
        try:
            m = read_topic_manifest(store, key, topic, seq)
        except (TieredError, NoSuchObjectError) as e:
            damaged.append(f"{key}: {e}")
            continue
        why = stale(m) if stale is not None else None
        if why is not None:
            if stale_out is not None:
                stale_out.append(f"{key}: {why}")
            continue
        return m
    return None


def plan_recovery(ws: Workspace, *, hot_exists: Callable[[int], bool] | None = None) -> RecoverReport:
    """What recovery would create, from one listing of the configured store (reads only)."""
    loc = ws.config.store_location
    store = ws.open_location(loc)
    prefix = ws.offloader.prefix
    listing = _list(store, prefix, ws.config.cluster)
    rep = RecoverReport(ws.config.store_url, applied=False, objects_listed=len(listing.keys),
                        manifests=sum(len(v) for v in listing.manifests.values()))
    if not listing.manifests and not listing.pairs and not listing.segments:
        raise ValidationError(f"nothing to recover: {ws.config.store_url} holds no topic manifests and no "
                              f"offloaded objects of this format under prefix {prefix!r}")
    marker = read_marker(store, prefix, ws.config.cluster)
    rep.identity = marker.identity if marker is not None else ""
    r = _Recovery(ws, store, prefix, listing, hot_exists or ws.hot.exists, rep)
    chosen_of: dict[str, TopicManifest] = {}

    def stale(m: TopicManifest) -> str | None:
        gone = r.missing(m.info())
        return f"{len(gone)} named object(s) missing, e.g. {gone[0]}" if gone else None

    for topic, entries in sorted(listing.manifests.items()):
        chosen = newest_valid_manifest(store, topic, entries, rep.damaged_manifests, stale, rep.stale_manifests)
        if chosen is None:
            rep.fallback_topics.append(topic)
        else:
            chosen_of[topic] = chosen
    named: set[str] = set()
    for m in chosen_of.values():
        info = m.info()
        named |= compacted_uuids(info)
        for li in info.ledgerInfo:
            named |= referenced_uuids(li)
    by_topic = r.winners(named)
    plans: dict[str, TopicPlan] = {}
    for topic, chosen in chosen_of.items():
        if chosen.deleted:  # its newest usable manifest is a tombstone: the topic was deleted
            rep.deleted_topics.append(topic)
            for lid, (u, _idx) in sorted(by_topic.pop(topic, {}).items()):
                rep.orphans.append(f"{index_key(prefix, u, lid)} ({topic} ledger {lid}: the topic was deleted)")
            continue
        info = chosen.info()
        plan = TopicPlan(topic, "manifest", chosen.sequence, listing.manifests[topic][-1][0] + 1, info,
                         chosen.namespace_policy, chosen.topic_policy)
        pairs = by_topic.pop(topic, {})
        listed = {li.ledgerId for li in info.ledgerInfo}
        for li in info.ledgerInfo:
            win = pairs.get(li.ledgerId)
            if win is not None and not is_complete(li) and not is_offloaded(li):
                r.context_from_index(li, win[0], win[1])  # offloaded after the manifest was written
                plan.from_index.append(li.ledgerId)
        newest = max(listed, default=-1)
        for lid, (u, idx) in sorted(pairs.items()):
            if lid in listed:
                cur = next(li for li in info.ledgerInfo if li.ledgerId == lid)
                if u not in referenced_uuids(cur):
                    rep.orphans.append(f"{index_key(prefix, u, lid)} ({topic} ledger {lid}: not the recorded copy)")
            elif lid > newest:  # a ledger newer than the manifest (its change's manifest was lost)
                _append_ledger(r, info, lid, u, idx)
                plan.from_index.append(lid)
            else:  # left the topic (retention) before the manifest: awaiting deletion
                rep.orphans.append(f"{index_key(prefix, u, lid)} ({topic} ledger {lid}: not in the topic)")
        plans[topic] = plan
    for topic, pairs in sorted(by_topic.items()):
        info = ManagedLedgerInfo()
        for lid, (u, idx) in sorted(pairs.items()):
            _append_ledger(r, info, lid, u, idx)
        seqs = listing.manifests.get(topic, [])
        plans[topic] = TopicPlan(topic, "index", 0, (seqs[-1][0] + 1) if seqs else 0, info,
                                 from_index=sorted(pairs))
    for topic in rep.fallback_topics:
        if topic not in plans:
            rep.not_recoverable.append(f"{topic}: no usable manifest and no readable V1 index object")
    for plan in plans.values():
        r.hot_state(plan)
    named = {u for p in plans.values() for li in p.info.ledgerInfo for u in segment_uuids(li)}
    for u in sorted(listing.segments - named):
        rep.not_recoverable.append(f"{segment_index_key(prefix, u)}: a segment no recovered manifest names "
                                   "(segments are recovered from manifests only)")
    rep.topics = [plans[t] for t in sorted(plans)]
    return rep


def _append_ledger(r: _Recovery, info: ManagedLedgerInfo, lid: int, uuid: str, idx: Any) -> None:
    md = idx.metadata
    li = info.ledgerInfo.add(ledgerId=lid, entries=md.last_entry_id + 1, size=md.length,
                             timestamp=md.ctime or int(r.listing.keys[index_key(r.prefix, uuid, lid)] * 1000))
    r.context_from_index(li, uuid, idx)
    # ledgers in id order, as a topic lists them
    items = sorted(info.ledgerInfo, key=lambda x: x.ledgerId)
    copies = [LedgerInfo() for _ in items]
    for c, x in zip(copies, items, strict=True):
        c.CopyFrom(x)
    del info.ledgerInfo[:]
    info.ledgerInfo.extend(copies)


# -- applying ---------------------------------------------------------------------------------------


def store_state(ws: Workspace) -> tuple[bool, dict[str, Any] | None]:
    """(whether the metadata store holds topics or policies, the recovery marker if any)."""
    got = ws.metadata.get(MARKER_PATH)
    marker = json.loads(got.value) if got is not None else None
    ml = ws.ml
    used = bool(ml.list_namespaces() or ml.list_policy_namespaces())
    return used, marker


def recover(ws: Workspace, *, apply: bool = False, merge: bool = False,
            on_step: Callable[[str, str], None] | None = None) -> RecoverReport:
    """Plan, and with ``apply`` write, the recovered records. ValidationError (nothing written) for a
    store with records (unless ``merge``, or an unfinished recovery: then it continues) and for a bucket
    with nothing of this format. ``on_step(step, topic)`` runs before each write (tests inject crashes)."""
    if ws.attached:
        raise ValidationError("refused: an attached workspace's records are its Pulsar cluster's")
    used, marker = store_state(ws)
    resuming = marker is not None and marker.get("state") == "running"
    if used and not merge and not resuming:
        raise ValidationError("the metadata store is not empty (it has topics or policies): recover writes into "
                              "an empty store only; --merge adds what is missing and never overwrites a record")
    rep = plan_recovery(ws)
    step = on_step or (lambda _s, _t: None)
    for plan in rep.topics:
        if ws.ml.exists(plan.topic):
            plan.action = "exists"
    if not apply:
        return rep
    rep.applied = True
    now = now_ms()
    body = json.dumps({"state": "running", "started_ms": now, "store": ws.config.store_url}).encode()
    step("marker", "")
    if marker is None:
        ws.metadata.create(MARKER_PATH, body)
    if rep.identity and not used:
        _restore_identity(ws, rep.identity)
    for plan in rep.topics:
        t = TopicName.parse(plan.topic)
        if plan.namespace_policy is not None and ws.ml.get_policies(t.namespace_name) is None:
            step("namespace-policy", plan.topic)
            ws.ml.set_policies(t.namespace_name, plan.namespace_policy)
        if plan.topic_policy is not None and ws.ml.get_topic_policies(t) is None:
            step("topic-policy", plan.topic)
            ws.ml.set_topic_policies(t, plan.topic_policy)
        if plan.action == "exists":
            continue
        step("topic", plan.topic)
        set_sequence_base(plan.info, plan.next_base)
        try:
            ws.ml.create_topic(t, plan.info)
            plan.action = "created"
        except NodeExistsError:  # created by the run that crashed (or a writer meanwhile): kept as it is
            plan.action = "exists"
    step("done", "")
    got = ws.metadata.get(MARKER_PATH)
    done = json.dumps({"state": "done", "started_ms": now, "finished_ms": now_ms(),
                       "store": ws.config.store_url}).encode()
    if got is not None:
        ws.metadata.put(MARKER_PATH, done, got.version)
    log.info("recovered %s topic(s) into %s", len(rep.topics), ws.config.metadata_url)
    return rep


def _restore_identity(ws: Workspace, identity: str) -> None:
    """The store's owner marker names the identity its objects carry: the recovered store takes it, so that
    the drain and reconciliation take those objects for this workspace's (an empty store's fresh identity
    has written nothing)."""
    got = ws.metadata.get(IDENTITY_PATH)
    body = json.dumps({"id": identity, "created_ms": now_ms()}).encode()
    if got is None:
        ws.metadata.create(IDENTITY_PATH, body)
    elif read_identity(ws.metadata) != identity:
        ws.metadata.put(IDENTITY_PATH, body, got.version)
    ws.__dict__.pop("identity", None)

