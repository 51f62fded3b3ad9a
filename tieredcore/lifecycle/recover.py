"""Rebuild the metadata store from the bucket alone (docs/recovery.md; `tiered recover`).

One listing of the workspace's configured store (its prefix), streamed (:func:`list_bucket` keeps per V1
pair one int, per topic the manifests' sequences, never the keys), finds the topic manifests and the
offloaded objects. The per-topic reads (each topic's newest manifest, the index objects no manifest names)
go through a mapper: in this process, or over Spark executors (spark_jobs/recover.py). Per topic the newest manifest that decodes (checksum) and names only objects the listing holds is
the source; ledgers it does not show as offloaded but whose V1 index object exists (an offload whose
manifest write was lost) are taken from the index. Topics without a usable manifest are rebuilt from the
self-describing V1 index objects (their ledger metadata names the managed ledger). A ledger found under
two uuids is resolved as the offload protocol resolves attempts: the latest attempt wins (here: the
complete pair whose index object was written last); the loser is reported as an orphan, never deleted.
Ledgers whose hot copy is gone are restored cold-only (``bookkeeperDeleted``); a ledger with neither an
offloaded copy nor a hot copy is lost and reported.

Applying is crash-safe and rerunnable: a marker record (``/tiered/recovery``) is written first; topic
records are created in batches, each one transaction (all or nothing); a rerun that finds the marker still "running" continues where the crash
left it, creating only what is missing. Nothing is ever written to or deleted from the bucket.
"""

from __future__ import annotations

import json
import logging
import uuid as uuidlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from tieredcore.clock import now_ms
from tieredcore.cold.blob import BlobStore, iter_objects
from tieredcore.cold.location import StoreLocation
from tieredcore.errors import FormatError, NodeExistsError, NoSuchObjectError, TieredError, ValidationError
from tieredcore.formats.constants import METADATA_OWNER_KEY
from tieredcore.formats.index import parse_index_v1
from tieredcore.formats.keys import (
    COMPACTED_LEDGER_METADATA_KEY,
    OBJECT_KEY,
    TOPIC_MANIFEST_DIR,
    index_key,
    parse_topic_manifest_key,
    segment_index_key,
    topic_manifest_key,
)
from tieredcore.formats.mlinfo import (
    ManagedLedgerInfo,
    decode_checked_managed_ledger_info,
)
from tieredcore.formats.topic_manifest import TOMBSTONE_PROPERTY, TopicManifest, decode_topic_manifest
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
    uuid_from_halves,
)
from tieredcore.offload.manifests import set_sequence_base
from tieredcore.offload.ownership import IDENTITY_PATH, foreign_reason, read_identity, read_marker
from tieredcore.workspace import Workspace

log = logging.getLogger(__name__)

__all__ = ["MARKER_PATH", "IndexFacts", "Mapper", "RecoverReport", "TopicPlan", "apply_recovery", "check_store",
           "list_bucket", "local_mapper", "mark_existing", "newest_valid_manifest", "plan_recovery", "read_indexes",
           "read_manifests", "read_topic_manifest", "recover", "restrict_to_copies"]

MARKER_PATH = "/tiered/recovery"
MANAGED_LEDGER_KEY = "pulsar/managed-ledger"  # the ledger's custom metadata naming its topic


@dataclass
class TopicPlan:
    topic: str  # managed-ledger name
    source: str  # "manifest" | "index"
    sequence: int  # the manifest's (0 from index objects)
    next_base: int  # the new record's manifest sequence base: past every manifest seen of the topic
    _info: ManagedLedgerInfo | None  # the record being planned; None once frozen (then in _record)
    namespace_policy: dict[str, Any] | None = None
    topic_policy: dict[str, Any] | None = None
    from_index: list[int] = field(default_factory=list)  # ledgers taken from index objects
    cold_only: list[int] = field(default_factory=list)  # hot copy gone: restored bookkeeperDeleted
    lost: list[int] = field(default_factory=list)  # neither copy: left out of the record
    action: str = "create"  # create | created | exists (kept: never overwritten)
    _record: bytes = field(default=b"", repr=False)

    @property
    def info(self) -> ManagedLedgerInfo:
        """The planned record (once frozen: a fresh copy decoded on each access)."""
        return self._info if self._info is not None else decode_checked_managed_ledger_info(self._record)

    def freeze(self) -> None:
        """Keep the planned record serialized: a bucket's worth of plans stays a fraction of the size of
        their decoded messages."""
        if self._info is not None:
            self._record, self._info = self._info.SerializeToString(), None

    def line(self) -> str:
        info = self.info
        n = len(info.ledgerInfo)
        off = sum(1 for li in info.ledgerInfo if is_offloaded(li) or is_complete(li))
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


# a V1 pair's listing state packed in one int: bits 0-47 the plain index object's last-modified time in
# ms + 1 (0: none listed), bit 48 a chunked index (``-index.manifest``) listed, above it the plain data
# object's size + 1 (0: none listed)
_TIME_BITS = 48
_TIME_MASK = (1 << _TIME_BITS) - 1
_INDEX_BITS = _TIME_MASK | (1 << _TIME_BITS)  # a plain or a chunked index object listed
# a V1 pair's key in the listing: its uuid as a 128-bit int above its ledger id (a Java long, so below 2**63:
# a key naming a larger one is not an offloader's). Ints, not (uuid string, id) tuples: a tenth of the
# memory, and a record's (msb, lsb) halves make the key without formatting a uuid string per ledger.
_M64 = (1 << 64) - 1
_LEDGER_ID_LIMIT = 1 << 63


def _uuid_int(uuid: str) -> int:
    return int(uuid.replace("-", ""), 16)


def _uuid_str(n: int) -> str:
    return uuid_from_halves(n >> 64, n & _M64)


def _pair(uuid: str, ledger_id: int) -> int:
    return (_uuid_int(uuid) << 64) | ledger_id


@dataclass
class _Listing:
    """What planning needs of one streamed listing, without holding every key: per (uuid, ledger) of a V1
    pair one int (:func:`_pack`), the uuids of segment index objects, the topic manifests' sequences."""

    objects: int = 0  # every object listed (counted, not kept)
    ledgers: dict[int, int] = field(default_factory=dict)  # _pair(uuid, ledger id) -> packed state
    segments: set[str] = field(default_factory=set)  # uuids with a plain segment index object
    chunked_segments: set[str] = field(default_factory=set)  # uuids with a segment index's .manifest
    manifests: dict[str, list[int]] = field(default_factory=dict)  # topic -> manifest sequences, ascending

    def manifest_count(self) -> int:
        return sum(len(v) for v in self.manifests.values())

    def index_listed(self, uuid: str, ledger_id: int) -> bool:
        """The pair's index object, plain or chunked, is in the listing."""
        return bool(self.ledgers.get(_pair(uuid, ledger_id), 0) & _INDEX_BITS)

    def segment_listed(self, uuid: str) -> bool:
        return uuid in self.segments or uuid in self.chunked_segments

    def index_time_ms(self, uuid: str, ledger_id: int) -> int:
        """When the pair's plain index object was written (its listing's last-modified time, ms)."""
        return (self.ledgers[_pair(uuid, ledger_id)] & _TIME_MASK) - 1

    def data_size(self, uuid: str, ledger_id: int) -> int | None:
        size = self.ledgers.get(_pair(uuid, ledger_id), 0) >> (_TIME_BITS + 1)
        return size - 1 if size else None

    def chunked(self, uuid: str, ledger_id: int) -> bool:
        return bool((self.ledgers.get(_pair(uuid, ledger_id), 0) >> _TIME_BITS) & 1)

    def empty(self) -> bool:
        return not self.manifests and not self.segments and not any(st & _TIME_MASK for st in self.ledgers.values())


def list_bucket(store: BlobStore, prefix: str, cluster: str) -> _Listing:
    """The listing planning needs, streamed page by page (memory: one int per V1 pair and the manifests'
    sequences per topic, not the keys)."""
    out = _Listing()
    ledgers, manifest_dir, plen = out.ledgers, prefix + TOPIC_MANIFEST_DIR, len(prefix)
    match, get, flag, low = OBJECT_KEY.fullmatch, ledgers.get, 1 << _TIME_BITS, (1 << (_TIME_BITS + 1)) - 1
    n = 0
    for o in iter_objects(store, prefix):
        n += 1
        key = o.key
        p = match(key, plen)  # groups: uuid, ledger id, -index, -offsets, .manifest
        if p is None:
            if key.startswith(manifest_dir):
                m = parse_topic_manifest_key(key, prefix, cluster)
                if m is not None:
                    out.manifests.setdefault(m[0], []).append(m[1])
            continue
        u, lid, is_index, offsets, is_manifest = p.groups()
        if offsets is not None:
            continue
        if lid is None:
            if is_index is not None:
                (out.chunked_segments if is_manifest is not None else out.segments).add(u)
            continue
        lid = int(lid)
        if lid >= _LEDGER_ID_LIMIT:
            continue  # not a ledger id (Pulsar's are Java longs): a foreign key
        k = (int(u.replace("-", ""), 16) << 64) | lid  # _pair(u, lid), inline: once per listed object
        st = get(k, 0)
        if is_index is not None:
            if is_manifest is not None:
                st |= flag
            else:
                st = (st & ~_TIME_MASK) | (int(o.last_modified * 1000) + 1)
        elif is_manifest is None:
            st = (st & low) | ((o.size + 1) << (_TIME_BITS + 1))
        ledgers[k] = st
    out.objects = n
    for v in out.manifests.values():
        v.sort()
    return out


# -- the per-topic work (in this process, or distributed: spark_jobs/recover.py) ----------------------

# a mapper runs ``fn(ws, items) -> results`` (one result per item, in order) over ``items``: in this process
# by default; the Spark job's splits the items over executors, each opening its own Workspace
Mapper = Callable[[Callable[[Workspace, list], list], list], list]


def local_mapper(ws: Workspace) -> Mapper:
    return lambda fn, items: fn(ws, items) if items else []


@dataclass(frozen=True)
class IndexFacts:
    """What recovery takes from a V1 index object (its ledger metadata)."""

    entries: int
    length: int
    ctime: int


def read_manifests(ws: Workspace, items: list[tuple[str, int, str]]) -> list[tuple[bytes | None, str]]:
    """Per (topic, sequence, key): the manifest's bytes when it decodes (checksum) and names that topic and
    sequence, else (None, why)."""
    store = ws.open_location(ws.config.store_location)
    out: list[tuple[bytes | None, str]] = []
    for topic, seq, key in items:
        try:
            raw = store.get(key)
            _decode_checked(raw, topic, seq)
        except (TieredError, NoSuchObjectError) as e:
            out.append((None, str(e)))
            continue
        out.append((bytes(raw), ""))
    return out


def read_indexes(ws: Workspace, items: list[tuple[int, str, int | None, bool, str]]) -> list[tuple[str, Any]]:
    """Per (ledger id, uuid, listed data size, chunked, identity): ("ok", (managed-ledger name, IndexFacts)),
    ("compacted", (the managed-ledger name its metadata names or "", why)), or ("unreadable" |
    "not_recoverable", why)."""
    store = ws.open_location(ws.config.store_location)
    prefix = ws.offloader.prefix
    cluster = ws.config.cluster
    return [_read_index(store, prefix, cluster, *it) for it in items]


def _read_index(store: BlobStore, prefix: str, cluster: str, ledger_id: int, uuid: str, data_size: int | None,
                chunked: bool, identity: str) -> tuple[str, Any]:
    ikey = index_key(prefix, uuid, ledger_id)
    if chunked:
        return "not_recoverable", f"{ikey}: a transformed (chunked) pair is recovered from manifests only"
    try:
        idx = parse_index_v1(store.get(ikey), ledger_id)
    except (TieredError, NoSuchObjectError) as e:
        return "unreadable", f"{ikey}: {e}"
    if data_size != idx.data_object_length:
        return "unreadable", f"{ikey}: its data object is missing or not {idx.data_object_length} bytes"
    try:
        meta = store.head(ikey).metadata
    except (TieredError, NoSuchObjectError) as e:
        return "unreadable", f"{ikey}: {e}"
    # a bucket shared with other clusters or workspaces: only what this workspace's marker owns
    foreign = foreign_reason(meta, cluster, identity or meta.get(METADATA_OWNER_KEY, ""))
    if foreign is not None:
        return "not_recoverable", f"{ikey}: not this workspace's: {foreign}"
    raw = idx.metadata.custom_metadata.get(MANAGED_LEDGER_KEY)
    if meta.get(COMPACTED_LEDGER_METADATA_KEY) == "true":  # its pointer and horizon: in the manifest only
        try:
            owner = TopicName.parse(bytes(raw).decode()).managed_ledger_name if raw else ""
        except (UnicodeDecodeError, ValidationError):
            owner = ""
        return "compacted", (owner, f"{ikey}: a compacted ledger, restored from its topic's manifest only")
    if not raw:
        return "not_recoverable", f"{ikey}: its ledger metadata names no managed ledger"
    try:
        name = TopicName.parse(bytes(raw).decode()).managed_ledger_name
    except (UnicodeDecodeError, ValidationError) as e:
        return "unreadable", f"{ikey}: managed-ledger name: {e}"
    md = idx.metadata
    return "ok", (name, IndexFacts(md.last_entry_id + 1, md.length, md.ctime))


# -- planning ---------------------------------------------------------------------------------------


class _Recovery:
    def __init__(self, ws: Workspace, store: BlobStore, prefix: str, listing: _Listing,
                 hot_exists: Callable[[int], bool], report: RecoverReport) -> None:
        self.ws, self.store, self.prefix, self.listing, self.hot_exists = ws, store, prefix, listing, hot_exists
        self.report = report
        self.location = ws.config.store_location
        self.driver = self.location.driver_metadata()
        self._ours: dict[bytes, bool] = {}

    def ours(self, dm) -> bool:
        """Whether driver metadata names the store being listed (only those objects can be checked); one
        answer per distinct driver metadata (a bucket's ledgers name a handful)."""
        if dm is None or not dm.name:
            return True
        k = dm.SerializeToString(deterministic=True)
        got = self._ours.get(k)
        if got is None:
            try:
                got = StoreLocation.from_driver_metadata(dm).same_objects(self.location)
            except ValidationError:
                got = False
            self._ours[k] = got
        return got

    def missing(self, info: ManagedLedgerInfo, named: set[int] | None = None) -> list[str]:
        """Index keys in the listed store a record names that the listing lacks; every uuid the record
        references is added to ``named`` (as ints, :func:`_uuid_int`) when given."""
        out = []
        seen: set[int] = set() if named is None else named
        last_dm, last_ours = None, True  # a topic's ledgers mostly name one store: asked once in a row
        state = self.listing.ledgers.get  # index_listed(), inline: this loop runs once per ledger of the bucket
        for li in info.ledgerInfo:
            has_ctx = li.HasField("offloadContext")
            if not li.properties and (not has_ctx or not li.offloadContext.offloadSegment):
                # the common case: at most the context's own uuid
                ctx = li.offloadContext
                if has_ctx and (ctx.HasField("uidMsb") or ctx.HasField("uidLsb")):
                    n = ((ctx.uidMsb & _M64) << 64) | (ctx.uidLsb & _M64)  # uuid_from_halves, as an int
                    seen.add(n)
                    dm = ctx.driverMetadata if ctx.HasField("driverMetadata") else None
                    if dm is None or last_dm is None or dm != last_dm:
                        last_dm, last_ours = dm, self.ours(dm)
                    lid = li.ledgerId
                    if last_ours and not state((n << 64) | lid, 0) & _INDEX_BITS:
                        out.append(index_key(self.prefix, _uuid_str(n), lid))
                continue
            segs = set(segment_uuids(li))
            drivers = segment_drivers(li)
            refs = referenced_uuids(li)
            seen.update(_uuid_int(u) for u in refs)
            for u in refs:
                if u in segs:
                    if self.ours(drivers.get(u)) and not self.listing.segment_listed(u):
                        out.append(segment_index_key(self.prefix, u))
                elif self.ours(context_driver(li)) and not self.listing.index_listed(u, li.ledgerId):
                    out.append(index_key(self.prefix, u, li.ledgerId))
        st = compaction_state(info)
        if st is not None and st.uuid and self.ours(driver_metadata_from_dict(st.driver) if st.driver else None) \
                and not self.listing.index_listed(st.uuid, st.ledger_id):
            out.append(index_key(self.prefix, st.uuid, st.ledger_id))
        seen.update(_uuid_int(u) for u in compacted_uuids(info))
        return out

    def winners(self, named: set[int], mapper: Mapper, manifest_topics: frozenset[str] | set[str] = frozenset()
                ) -> dict[str, dict[int, tuple[str, IndexFacts]]]:
        """topic -> ledger id -> (uuid, index facts) of every readable V1 pair no chosen manifest names
        (``named``: their uuids, as ints), one per ledger: the latest attempt (the index object written last; equal
        times: the greater uuid) wins, the others are orphans. The index objects are read by ``mapper``.
        A compacted ledger of a topic with a chosen manifest (``manifest_topics``) that does not name it
        was superseded by a later compaction (awaiting deletion): an orphan; of any other topic its
        pointer is lost with the manifests: not recoverable."""
        # ledgers in id order, each one's uuids in order (no grouping of the pairs the manifests name)
        wanted = sorted((k & _M64, _uuid_str(k >> 64)) for k, st in self.listing.ledgers.items()
                        if st & _TIME_MASK and k >> 64 not in named)
        identity = self.report.identity
        got = mapper(read_indexes, [(lid, u, self.listing.data_size(u, lid), self.listing.chunked(u, lid), identity)
                                    for lid, u in wanted])
        out: dict[str, dict[int, tuple[str, IndexFacts]]] = {}
        found: dict[int, dict[str, list[tuple[int, str, IndexFacts]]]] = {}
        for (lid, u), (kind, value) in zip(wanted, got, strict=True):
            if kind == "unreadable":
                self.report.unreadable.append(value)
            elif kind == "not_recoverable":
                self.report.not_recoverable.append(value)
            elif kind == "compacted":
                owner, why = value
                if owner and owner in manifest_topics:
                    self.report.orphans.append(f"{index_key(self.prefix, u, lid)} ({owner} ledger {lid}: a compacted "
                                               "ledger its topic's manifest does not name: superseded)")
                else:
                    self.report.not_recoverable.append(why)
            else:
                name, facts = value
                found.setdefault(lid, {}).setdefault(name, []).append((self.listing.index_time_ms(u, lid), u, facts))
        for lid, topics in sorted(found.items()):
            for topic, cands in topics.items():
                cands.sort(key=lambda c: (c[0], c[1]))
                _, u, facts = cands[-1]
                out.setdefault(topic, {})[lid] = (u, facts)
                for _, loser, _ in cands[:-1]:
                    self.report.orphans.append(f"{index_key(self.prefix, loser, lid)} ({topic} ledger {lid}: "
                                               f"superseded by attempt {u})")
        return out

    def context_from_index(self, li: LedgerInfo, uuid: str) -> None:
        msb, lsb = uuid_to_msb_lsb(uuidlib.UUID(uuid))
        ctx = li.offloadContext
        ctx.Clear()
        ctx.uidMsb, ctx.uidLsb, ctx.complete = msb, lsb, True
        ctx.timestamp = self.listing.index_time_ms(uuid, li.ledgerId)
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
        # an absent context reads as the default one (complete false, no segments): is_complete() without
        # its HasField, once per ledger of every topic
        ctx = li.offloadContext
        if ctx.bookkeeperDeleted and (ctx.complete or ctx.offloadSegment or is_offloaded(li)):
            keep.append(li)  # cold-only already: kept as it is whether or not a hot copy is left
        elif hot_exists(li.ledgerId):
            keep.append(li)
        elif ctx.complete or ctx.offloadSegment or is_offloaded(li):
            if not ctx.bookkeeperDeleted:
                ctx.bookkeeperDeleted = True
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
    return _decode_checked(store.get(key), topic, sequence)


def _decode_checked(raw: bytes, topic: str, sequence: int) -> TopicManifest:
    m = decode_topic_manifest(raw)
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


@dataclass
class _Chosen:
    """What planning keeps of a topic's chosen manifest (not its bytes)."""

    sequence: int
    namespace_policy: dict[str, Any] | None
    topic_policy: dict[str, Any] | None
    record: bytes  # the manifest's record (decoded when the topic's plan is made)


MANIFEST_BATCH = 1000  # topics whose newest manifests are read (and held) at a time


def nothing_to_recover(ws: Workspace) -> str:
    return (f"nothing to recover: {ws.config.store_url} holds no topic manifests and no offloaded objects of "
            f"this format under prefix {ws.offloader.prefix!r}")


def plan_recovery(ws: Workspace, *, hot_exists: Callable[[int], bool] | None = None,
                  listing: _Listing | None = None, mapper: Mapper | None = None) -> RecoverReport:
    """What recovery would create (reads only): from one streamed listing of the configured store (or the
    ``listing`` given, made by :func:`list_bucket`); the manifests and index objects are read through
    ``mapper`` (default: in this process; spark_jobs/recover.py distributes them)."""
    loc = ws.config.store_location
    store = ws.open_location(loc)
    prefix = ws.offloader.prefix
    if listing is None:
        listing = list_bucket(store, prefix, ws.config.cluster)
    run = mapper or local_mapper(ws)
    rep = RecoverReport(ws.config.store_url, applied=False, objects_listed=listing.objects,
                        manifests=listing.manifest_count())
    if listing.empty():
        raise ValidationError(nothing_to_recover(ws))
    marker = read_marker(store, prefix, ws.config.cluster)
    rep.identity = marker.identity if marker is not None else ""
    r = _Recovery(ws, store, prefix, listing, hot_exists or ws.hot.exists, rep)
    cluster = ws.config.cluster
    topics = sorted(listing.manifests)
    # each topic's newest manifest, read (and its checksum checked) by the mapper, MANIFEST_BATCH topics at
    # a time (their bytes are dropped once decoded); an older one only when the newest is damaged or stale
    # (read here, newest first)
    chosen_of: dict[str, _Chosen] = {}
    named: set[int] = set()  # every uuid a chosen manifest references (as ints)
    for start in range(0, len(topics), MANIFEST_BATCH):
        batch = topics[start:start + MANIFEST_BATCH]
        newest = run(read_manifests, [(t, listing.manifests[t][-1],
                                       topic_manifest_key(prefix, cluster, t, listing.manifests[t][-1])) for t in batch])
        for topic, first in zip(batch, newest, strict=True):
            chosen: _Chosen | None = None
            for i, seq in enumerate(reversed(listing.manifests[topic])):
                key = topic_manifest_key(prefix, cluster, topic, seq)
                raw, why = first if i == 0 else read_manifests(ws, [(topic, seq, key)])[0]
                if raw is None:
                    rep.damaged_manifests.append(f"{key}: {why}")
                    continue
                m = decode_topic_manifest(raw, check_record=False)  # read_manifests decoded it whole
                m_info = decode_checked_managed_ledger_info(m.record)
                refs: set[int] = set()
                gone = r.missing(m_info, refs)
                if gone:
                    rep.stale_manifests.append(f"{key}: {len(gone)} named object(s) missing, e.g. {gone[0]}")
                    continue
                named |= refs
                chosen = _Chosen(m.sequence, m.namespace_policy, m.topic_policy, m.record)
                break
            if chosen is None:
                rep.fallback_topics.append(topic)
            else:
                chosen_of[topic] = chosen
        del newest
    by_topic = r.winners(named, run, set(chosen_of))
    plans: dict[str, TopicPlan] = {}
    segments_named: set[str] = set()

    def done(plan: TopicPlan) -> None:
        r.hot_state(plan)
        if listing.segments:  # only compared with the listed segments (none listed: nothing to collect)
            segments_named.update(u for li in plan.info.ledgerInfo if li.offloadContext.offloadSegment
                                  for u in segment_uuids(li))
        plan.freeze()
        plans[plan.topic] = plan

    for topic in list(chosen_of):
        chosen = chosen_of.pop(topic)
        info = decode_checked_managed_ledger_info(chosen.record)
        if any(kv.key == TOMBSTONE_PROPERTY for kv in info.properties):  # the topic was deleted
            rep.deleted_topics.append(topic)
            for lid, (u, _f) in sorted(by_topic.pop(topic, {}).items()):
                rep.orphans.append(f"{index_key(prefix, u, lid)} ({topic} ledger {lid}: the topic was deleted)")
            continue
        plan = TopicPlan(topic, "manifest", chosen.sequence, listing.manifests[topic][-1] + 1, info,
                         chosen.namespace_policy, chosen.topic_policy)
        pairs = by_topic.pop(topic, {})
        listed = {li.ledgerId for li in info.ledgerInfo}
        for li in info.ledgerInfo:
            win = pairs.get(li.ledgerId)
            if win is not None and not is_complete(li) and not is_offloaded(li):
                r.context_from_index(li, win[0])  # offloaded after the manifest was written
                plan.from_index.append(li.ledgerId)
        newest_lid = max(listed, default=-1)
        for lid, (u, facts) in sorted(pairs.items()):
            if lid in listed:
                cur = next(li for li in info.ledgerInfo if li.ledgerId == lid)
                if u not in referenced_uuids(cur):
                    rep.orphans.append(f"{index_key(prefix, u, lid)} ({topic} ledger {lid}: not the recorded copy)")
            elif lid > newest_lid:  # a ledger newer than the manifest (its change's manifest was lost)
                _append_ledger(r, info, lid, u, facts)
                plan.from_index.append(lid)
            else:  # left the topic (retention) before the manifest: awaiting deletion
                rep.orphans.append(f"{index_key(prefix, u, lid)} ({topic} ledger {lid}: not in the topic)")
        done(plan)
    for topic, pairs in sorted(by_topic.items()):
        info = ManagedLedgerInfo()
        for lid, (u, facts) in sorted(pairs.items()):
            _append_ledger(r, info, lid, u, facts)
        seqs = listing.manifests.get(topic, [])
        done(TopicPlan(topic, "index", 0, (seqs[-1] + 1) if seqs else 0, info, from_index=sorted(pairs)))
    for topic in rep.fallback_topics:
        if topic not in plans:
            rep.not_recoverable.append(f"{topic}: no usable manifest and no readable V1 index object")
    for u in sorted(listing.segments - segments_named):
        rep.not_recoverable.append(f"{segment_index_key(prefix, u)}: a segment no recovered manifest names "
                                   "(segments are recovered from manifests only)")
    rep.topics = [plans[t] for t in sorted(plans)]
    return rep


def _append_ledger(r: _Recovery, info: ManagedLedgerInfo, lid: int, uuid: str, facts: IndexFacts) -> None:
    li = info.ledgerInfo.add(ledgerId=lid, entries=facts.entries, size=facts.length,
                             timestamp=facts.ctime or r.listing.index_time_ms(uuid, lid))
    r.context_from_index(li, uuid)
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


def check_store(ws: Workspace, merge: bool) -> tuple[bool, dict[str, Any] | None]:
    """(whether the store holds records, the recovery marker), or ValidationError when recovery is refused
    there: an attached workspace, a store with records (unless ``merge`` or an unfinished recovery)."""
    if ws.attached:
        raise ValidationError("refused: an attached workspace's records are its Pulsar cluster's")
    used, marker = store_state(ws)
    resuming = marker is not None and marker.get("state") == "running"
    if used and not merge and not resuming:
        raise ValidationError("the metadata store is not empty (it has topics or policies): recover writes into "
                              "an empty store only; --merge adds what is missing and never overwrites a record")
    return used, marker


def recover(ws: Workspace, *, apply: bool = False, merge: bool = False,
            on_step: Callable[[str, str], None] | None = None, mapper: Mapper | None = None) -> RecoverReport:
    """Plan, and with ``apply`` write, the recovered records. ValidationError (nothing written) for a
    store with records (unless ``merge``, or an unfinished recovery: then it continues) and for a bucket
    with nothing of this format. ``on_step(step, topic)`` runs before each write (tests inject crashes).
    A SQLite file this call created (the store was lost) is removed again when nothing was written."""
    created = _missing_sqlite_file(ws)
    try:
        used, marker = check_store(ws, merge)
        rep = plan_recovery(ws, mapper=mapper)
        mark_existing(ws, rep)
    except ValidationError:
        _forget_file(ws, created)
        raise
    if apply:
        apply_recovery(ws, rep, used=used, marker=marker, on_step=on_step)
    else:
        _forget_file(ws, created)
    return rep


def mark_existing(ws: Workspace, rep: RecoverReport) -> None:
    """Topics the store already has are kept as they are (``exists``)."""
    for plan in rep.topics:
        if ws.ml.exists(plan.topic):
            plan.action = "exists"


def apply_recovery(ws: Workspace, rep: RecoverReport, *, used: bool, marker: dict[str, Any] | None,
                   on_step: Callable[[str, str], None] | None = None) -> None:
    """Write a planned recovery: the marker first, each topic one create, the marker "done" last."""
    step = on_step or (lambda _s, _t: None)
    rep.applied = True
    now = now_ms()
    body = json.dumps({"state": "running", "started_ms": now, "store": ws.config.store_url}).encode()
    step("marker", "")
    if marker is None:
        ws.metadata.create(MARKER_PATH, body)
    if rep.identity and not used:
        _restore_identity(ws, rep.identity)
    batch: list[tuple[TopicPlan, TopicName, ManagedLedgerInfo]] = []
    size = 0
    namespaces_done: set[str] = set()  # a namespace's policy is restored (or found stored) once per run
    for plan in rep.topics:
        t = TopicName.parse(plan.topic)
        ns = t.namespace_name
        if plan.namespace_policy is not None and ns not in namespaces_done:
            if ws.ml.get_policies(ns) is None:
                step("namespace-policy", plan.topic)
                ws.ml.set_policies(ns, plan.namespace_policy)
            namespaces_done.add(ns)
        if plan.topic_policy is not None and ws.ml.get_topic_policies(t) is None:
            step("topic-policy", plan.topic)
            ws.ml.set_topic_policies(t, plan.topic_policy)
        if plan.action == "exists":
            continue
        step("topic", plan.topic)
        info = plan.info
        set_sequence_base(info, plan.next_base)
        batch.append((plan, t, info))
        size += info.ByteSize()
        if len(batch) >= CREATE_BATCH or size >= CREATE_BATCH_BYTES:
            _create(ws, batch)
            batch, size = [], 0
    _create(ws, batch)
    step("done", "")
    got = ws.metadata.get(MARKER_PATH)
    done = json.dumps({"state": "done", "started_ms": now, "finished_ms": now_ms(),
                       "store": ws.config.store_url}).encode()
    if got is not None:
        ws.metadata.put(MARKER_PATH, done, got.version)
    log.info("recovered %s topic(s) into %s", len(rep.topics), ws.config.metadata_url)


# topic records created per metadata transaction (all or none), and at most about this many bytes in one
# (ZooKeeper's requests are limited to 1 MiB by default)
CREATE_BATCH = 100
CREATE_BATCH_BYTES = 256 * 1024


def _create(ws: Workspace, batch: list[tuple[TopicPlan, TopicName, ManagedLedgerInfo]]) -> None:
    """Create the batch's records in one transaction; when one exists (created by the run that crashed, or
    a writer meanwhile), one by one, keeping those that exist as they are."""
    if not batch:
        return
    try:
        ws.ml.create_topics([(t, info) for _p, t, info in batch])
    except NodeExistsError:
        for plan, t, info in batch:
            try:
                ws.ml.create_topic(t, info)
                plan.action = "created"
            except NodeExistsError:
                plan.action = "exists"
        return
    for plan, _t, _info in batch:
        plan.action = "created"


def _missing_sqlite_file(ws: Workspace) -> Path | None:
    """The configured SQLite file when it does not exist yet (opening the store will create it)."""
    u = urlparse(ws.config.metadata_url)
    if u.scheme != "sqlite" or "metadata" in ws.__dict__:
        return None
    path = Path(unquote(u.path))
    return None if path.exists() else path


def _forget_file(ws: Workspace, path: Path | None) -> None:
    """Close and remove the SQLite file (and its journal files) this run created and wrote nothing into:
    bad input and dry runs leave no trace."""
    if path is None:
        return
    if "metadata" in ws.__dict__:
        ws.metadata.close()
    for name in ("metadata", "ml", "policies", "deletion_log", "leases", "identity", "manifests", "pulsar"):
        ws.__dict__.pop(name, None)
    for p in (path, *(path.with_name(path.name + s) for s in ("-wal", "-shm", "-journal"))):
        p.unlink(missing_ok=True)


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

