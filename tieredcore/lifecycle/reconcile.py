"""Orphan reconciliation (spec/05 "Orphan reconciliation"): find what leaked in both tiers and hand it
to two-phase deletion. Nothing here deletes an object or a ledger; orphans become pending-deletion
records (reason ``orphan``) that the phase-2 drain deletes with all its checks. The only direct action
is aborting incomplete multipart uploads older than the grace period.

The pieces are separate so that a Spark job can run them per key prefix:

- :func:`listing_prefixes` / :func:`list_objects` / :func:`list_rest`: the offload prefix split into 16
  disjoint listings (first hex digit of the uuid) plus one "rest" listing of every other key under the
  prefix (foreign keys), paginated; together they list every key exactly once.
- :func:`referenced_uuids`: every uuid the metadata store or the deletion log names.
- :func:`find_object_orphans`: the anti-join (pure; the Spark job does the same as a DataFrame join).
- :func:`find_hot_orphans`, :func:`abort_stale_uploads`, and :func:`reconcile` wiring it all together.

Ownership (tieredcore.stores.ownership): every location is claimed (or checked, in a dry run) before it is
listed, and a store whose owner marker names another metadata store for this cluster is skipped with an
error. Every orphan candidate is HEADed (candidates are few) and never recorded when its metadata names
another cluster or another workspace: those are counted (``foreign_cluster_*``) and left alone. Owner
markers are not listed.

Ordering makes a run safe against concurrent writers without any lock: objects are listed first, then
the topic records are read, then the deletion log. An offload records its uuid before writing any
object, so an object seen by the listing has its uuid in the later metadata read unless the attempt
was really abandoned; a phase-1 producer appends its record before changing the topic record, so a
reference that disappeared from the metadata read is in the (later) deletion-log read. Objects younger
than the grace period are never flagged whatever the metadata says.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import suppress
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from tieredcore import names
from tieredcore.errors import NotFoundError, StoreOwnershipError, TieredError, ValidationError
from tieredcore.formats.keys import INDEX_SUFFIX, OBJECT_KEY, UUID_PATTERN, normalize_prefix, parse_ledger_key
from tieredcore.names import UNKNOWN_NAMESPACE, TopicName
from tieredcore.offload.context import referenced_uuids as ledger_uuids
from tieredcore.reports import Totals, totals
from tieredcore.stores.blob import BlobStore, MultipartUploadInfo, ObjectInfo, iter_objects
from tieredcore.stores.deletion_log import (
    TYPE_LEDGER,
    TYPE_OFFLOADED,
    DeletionLog,
    DeletionRecord,
)
from tieredcore.stores.location import StoreLocation
from tieredcore.stores.ownership import foreign_reason, is_marker_key, read_marker
from tieredcore.workspace import Workspace

log = logging.getLogger(__name__)

REASON_ORPHAN = "orphan"
DEFAULT_GRACE_MS = 3600 * 1000
HEX_DIGITS = "0123456789abcdef"
# Topic of an orphaned object whose user metadata does not name its managed ledger (a lone data object
# written without metadata, a lone index...). It has the four components DeletionRecord.validate wants,
# and no real topic is expected under the tenant "__orphan__"; even if one existed, the drain's
# "still in use" check matches the record's uuid, which nothing references, so it would still delete.
UNKNOWN_TOPIC = "__orphan__/unknown/persistent/unknown"
KIND_OFFLOADED = "offloaded"  # object-store copy of one offload attempt (uuid, ledger id)
KIND_LEDGER = "ledger"  # hot-tier ledger
KIND_UPLOAD = "upload"  # incomplete multipart upload
HOT_TOPIC_MISSING = "topic-missing"
HOT_NOT_LISTED = "not-listed"
HOT_BOOKKEEPER_DELETED = "bookkeeper-deleted"  # listed, but the hot copy was marked deleted
MAX_SAMPLE_KEYS = 10
# the report's counters a run summary shows as its outcomes
OUTCOME_COUNTERS = ("orphan_groups", "orphan_objects", "hot_orphans", "records_appended", "stale_uploads",
                    "uploads_aborted", "foreign_keys", "foreign_cluster_groups", "young_unreferenced",
                    "young_hot_ledgers")
# the report's detail.parquet (Spark DDL): one row per orphan object, hot ledger or stale upload
DETAIL_SCHEMA = ("location string, kind string, key string, size long, last_modified_ms long, uuid string, "
                 "ledger_id long, topic string, namespace string")
APPEND_BATCH = 500  # records per deletion-log transaction
_MANAGED_LEDGER_METADATA_KEY = "managedledgername"  # object user metadata the offloader writes
_UUID_IN_TEXT = re.compile(UUID_PATTERN.encode())
# Highest code point: UTF-8 never has a byte above 0xF4, so p + c + this sorts after nearly every key
# starting with p + c (the rest listing still filters, so a key sorting after it is not listed twice)
_MAX_CHAR = "\U0010ffff"


# -- listing ------------------------------------------------------------------------------------


class ObjectRow(NamedTuple):
    """One listed object. `uuid`/`ledger_id`/`is_index` are None for keys this project did not write
    (foreign); a streaming-segment key (`{uuid}[-index]`, spec/03) has a uuid but no ledger id."""

    key: str
    size: int
    last_modified_ms: int
    uuid: str | None
    ledger_id: int | None
    is_index: bool | None


def parse_row(info: ObjectInfo, prefix: str) -> ObjectRow:
    """Key parsing of one listed object relative to the offload prefix (the grammar of
    tieredcore.formats.keys, matched without building an intermediate object: this runs once per
    object)."""
    key = info.key
    m = OBJECT_KEY.fullmatch(key, len(prefix)) if key.startswith(prefix) else None
    lm = int(info.last_modified * 1000)
    if m is None:
        return ObjectRow(key, info.size, lm, None, None, None)
    lid = m[2]
    return ObjectRow(key, info.size, lm, m[1], int(lid) if lid is not None else None, m[3] is not None)


def listing_prefixes(prefix: str) -> list[str]:
    """The offload prefix extended by each possible first character of a uuid ('0'..'f'): 16 disjoint
    listings. Every other key under the prefix is listed by :func:`list_rest`."""
    p = normalize_prefix(prefix)
    return [p + c for c in HEX_DIGITS]


def _excluded(key: str, exclude_prefixes: Sequence[str]) -> bool:
    return any(key.startswith(x) for x in exclude_prefixes)


def list_objects(
    store: BlobStore,
    prefix: str,
    listing_prefix: str | None = None,
    *,
    exclude_prefixes: Sequence[str] = (),
    page_size: int = 1000,
) -> Iterator[ObjectRow]:
    """Rows of every object under `listing_prefix` (default: the offload prefix itself; else one of
    :func:`listing_prefixes`), keys parsed relative to the offload `prefix`, following pagination.
    Keys under `exclude_prefixes` (other offload locations nested in this one) are skipped."""
    p = normalize_prefix(prefix)
    lp = p if listing_prefix is None else listing_prefix
    if not lp.startswith(p):
        raise ValidationError(f"listing prefix {lp!r} is not under the offload prefix {p!r}")
    for info in iter_objects(store, lp, page_size):
        if (exclude_prefixes and _excluded(info.key, exclude_prefixes)) or is_marker_key(info.key, p):
            continue  # a nested location's keys; owner markers (ours, never orphans)
        yield parse_row(info, p)


def _is_rest(key: str, plen: int) -> bool:
    return len(key) == plen or key[plen] not in HEX_DIGITS


def list_rest(
    store: BlobStore, prefix: str, *, exclude_prefixes: Sequence[str] = (), page_size: int = 1000
) -> Iterator[ObjectRow]:
    """Rows of the keys under the offload prefix whose next character is not a lowercase hex digit
    (or that equal the prefix): the complement of :func:`listing_prefixes`. Only the three key ranges
    around the hex digits are read (< '0', ':'..'`', > 'f'), each from its start (``start_after``)."""
    p = normalize_prefix(prefix)
    plen = len(p)

    def emit(infos: Iterable[ObjectInfo]) -> Iterator[ObjectRow]:
        for info in infos:
            if _is_rest(info.key, plen) and not (exclude_prefixes and _excluded(info.key, exclude_prefixes)) \
                    and not is_marker_key(info.key, p):  # the location's owner marker is ours, not foreign
                yield parse_row(info, p)

    # (start after, stop at the first key whose next character is >= this)
    ranges: list[tuple[str | None, str | None]] = [(None, "0"), (p + "9" + _MAX_CHAR, "a"), (p + "f" + _MAX_CHAR, None)]
    for after, stop in ranges:
        it = iter_objects(store, p, page_size, start_after=after)

        def until(infos: Iterator[ObjectInfo], stop: str | None = stop) -> Iterator[ObjectInfo]:
            for info in infos:
                if stop is not None and len(info.key) > plen and info.key[plen] >= stop:
                    return
                yield info

        yield from emit(until(it))


# -- references ---------------------------------------------------------------------------------


def _iter_topics(ws: Workspace) -> Iterator[tuple[TopicName, Any]]:
    """(topic, ManagedLedgerInfo) of every topic; topics deleted while listing are skipped."""
    for ns in ws.ml.list_namespaces():
        for t in ws.ml.list_topics(ns):
            try:
                info, _ = ws.ml.get_topic(t)
            except NotFoundError:
                continue
            yield t, info


def metadata_uuids(ws: Workspace) -> set[str]:
    """Every uuid any ledger references (tieredcore.offload.context.referenced_uuids): its
    OffloadContext (complete or not), offloadSegment entries, abandoned and replacement attempts."""
    out: set[str] = set()
    for _t, info in _iter_topics(ws):
        for li in info.ledgerInfo:
            out |= ledger_uuids(li)
    return out


@dataclass
class LogReferences:
    uuids: set[str] = field(default_factory=set)  # offloaded/segment records (and anything uuid-like in malformed ones)
    hot_ledgers: set[int] = field(default_factory=set)  # ledger records


def deletion_log_references(ws: Workspace) -> LogReferences:
    """What the deletion log already covers: pending, retrying AND dead-letter records (scheduled, or
    waiting for an operator), never to be recorded again. Malformed records are scanned for anything
    that looks like a uuid, to err on the side of not recording twice."""
    dl = DeletionLog(ws.metadata)
    refs = LogReferences()
    for e in [*dl.pending(), *dl.dead_letters()]:
        r = e.record
        if r is None:
            refs.uuids.update(m.decode() for m in _UUID_IN_TEXT.findall(e.raw))
            try:
                raw = json.loads(e.raw)
                inner = json.loads(raw["raw"]) if isinstance(raw, dict) and "raw" in raw else raw
                if isinstance(inner, dict) and inner.get("type") == TYPE_LEDGER and isinstance(inner.get("ledger_id"), int):
                    refs.hot_ledgers.add(inner["ledger_id"])
            except (ValueError, TypeError, KeyError):
                pass
            continue
        if r.type == TYPE_LEDGER:
            refs.hot_ledgers.add(r.ledger_id)
        elif r.uuid:
            refs.uuids.add(r.uuid)
    return refs


def referenced_uuids(ws: Workspace) -> set[str]:
    """Metadata references (:func:`metadata_uuids`), then the deletion log's uuids — in that order
    (see the module docstring)."""
    out = metadata_uuids(ws)
    out |= deletion_log_references(ws).uuids
    return out


# -- the anti-join ------------------------------------------------------------------------------


@dataclass
class OrphanGroup:
    """The objects of one offload attempt of one ledger: what one `offloaded` record deletes."""

    uuid: str
    ledger_id: int
    keys: list[str] = field(default_factory=list)
    bytes: int = 0
    oldest_modified_ms: int = 0
    newest_modified_ms: int = 0
    has_data: bool = False
    has_index: bool = False
    sizes: dict[str, int] = field(default_factory=dict)  # per key, for report detail rows
    modified: dict[str, int] = field(default_factory=dict)

    def age_ms(self, as_of_ms: int) -> int:
        return as_of_ms - self.oldest_modified_ms


@dataclass
class ObjectOrphans:
    groups: list[OrphanGroup] = field(default_factory=list)  # sorted by (uuid, ledger id)
    rows: int = 0
    bytes_listed: int = 0
    referenced_objects: int = 0
    foreign_keys: int = 0  # keys this project did not write: counted, never touched
    foreign_bytes: int = 0
    segment_keys: int = 0  # `{uuid}[-index]` keys: this project writes none; counted, never touched
    young_unreferenced: int = 0  # unreferenced objects within the grace period
    young_bytes: int = 0

    @property
    def objects(self) -> int:
        return sum(len(g.keys) for g in self.groups)

    @property
    def bytes(self) -> int:
        return sum(g.bytes for g in self.groups)

    def oldest_age_ms(self, as_of_ms: int) -> int | None:
        return max((g.age_ms(as_of_ms) for g in self.groups), default=None)


def find_object_orphans(rows: Iterable[ObjectRow], referenced: set[str] | frozenset[str], as_of_ms: int,
                        grace_ms: int = DEFAULT_GRACE_MS) -> ObjectOrphans:
    """Anti-join of listed objects against referenced uuids. A group (uuid, ledger id) is an orphan
    only when its uuid is referenced nowhere and **every** object of it was last modified before
    `as_of_ms - grace_ms` (a group with one young object may be an offload in flight: all its objects
    are counted as young). Pure: no I/O."""
    if grace_ms < 0:
        raise ValidationError(f"grace period must be >= 0 ms, got {grace_ms}")
    out = ObjectOrphans()
    groups: dict[tuple[str, int], OrphanGroup] = {}
    for r in rows:
        out.rows += 1
        out.bytes_listed += r.size
        u = r.uuid
        if u is None:
            out.foreign_keys += 1
            out.foreign_bytes += r.size
            continue
        if r.ledger_id is None:
            out.segment_keys += 1
            continue
        if u in referenced:
            out.referenced_objects += 1
            continue
        k = (u, r.ledger_id)
        g = groups.get(k)
        if g is None:
            g = groups[k] = OrphanGroup(u, r.ledger_id, oldest_modified_ms=r.last_modified_ms,
                                        newest_modified_ms=r.last_modified_ms)
        g.keys.append(r.key)
        g.sizes[r.key] = r.size
        g.modified[r.key] = r.last_modified_ms
        g.bytes += r.size
        g.oldest_modified_ms = min(g.oldest_modified_ms, r.last_modified_ms)
        g.newest_modified_ms = max(g.newest_modified_ms, r.last_modified_ms)
        if r.is_index:
            g.has_index = True
        else:
            g.has_data = True
    cutoff = as_of_ms - grace_ms
    for k in sorted(groups):
        g = groups[k]
        if g.newest_modified_ms < cutoff:
            g.keys.sort()
            out.groups.append(g)
        else:
            out.young_unreferenced += len(g.keys)
            out.young_bytes += g.bytes
    return out


# -- hot tier -----------------------------------------------------------------------------------


@dataclass
class HotOrphan:
    ledger_id: int
    topic: str  # managed-ledger name from the ledger's custom metadata
    ctime_ms: int
    bytes: int
    reason: str  # topic-missing | not-listed | bookkeeper-deleted


@dataclass
class HotOrphans:
    orphans: list[HotOrphan] = field(default_factory=list)
    ledgers: int = 0
    listed: int = 0  # still listed by their topic
    foreign: int = 0  # no (valid) managed-ledger custom metadata: counted, never touched
    young: int = 0  # unlisted but created within the grace period (or creation time unknown)
    scheduled: int = 0  # unlisted, but the deletion log already has a record for them

    @property
    def bytes(self) -> int:
        return sum(o.bytes for o in self.orphans)


def managed_ledger_of(custom_metadata: dict[str, bytes]) -> str | None:
    """The managed-ledger name a hot ledger's custom metadata names (application=pulsar,
    component=managed-ledger), normalised, or None (foreign, unparseable, schema ledger, or a cursor
    ledger: Pulsar tags those component=managed-ledger too, plus pulsar/cursor, and a topic record never
    lists them)."""
    if custom_metadata.get("application") != b"pulsar" or custom_metadata.get("component") != b"managed-ledger":
        return None
    if "pulsar/cursor" in custom_metadata:
        return None
    raw = custom_metadata.get("pulsar/managed-ledger")
    if not raw:
        return None
    try:
        return TopicName.parse(raw.decode("utf-8")).managed_ledger_name
    except (UnicodeDecodeError, ValidationError):
        return None


def find_hot_orphans(ws: Workspace, as_of_ms: int, grace_ms: int = DEFAULT_GRACE_MS,
                     scheduled_ledgers: set[int] | None = None) -> HotOrphans:
    """Hot ledgers whose custom metadata names a managed ledger that does not list them (or does not
    exist, or lists them with bookkeeperDeleted set), created (ctime) before `as_of_ms - grace_ms`, and
    not already in the deletion log. Order: hot tier, then topic records, then the deletion log.
    (list_ledgers also sweeps .log/.idx files left without .meta: the hot store's own crash repair.)"""
    out = HotOrphans()
    cutoff = as_of_ms - grace_ms
    candidates: list[tuple[int, str, int, int]] = []
    for lid in ws.hot.list_ledgers():
        try:
            md = ws.hot.ledger_metadata(lid)
        except TieredError:
            continue  # deleted since listed
        out.ledgers += 1
        name = managed_ledger_of(md.custom_metadata)
        if name is None:
            out.foreign += 1
            continue
        candidates.append((lid, name, md.ctime, md.length))
    topics: dict[str, dict[int, bool] | None] = {}  # name -> {ledger id: bookkeeperDeleted} or None (missing)
    unlisted: list[HotOrphan] = []
    for lid, name, ctime, length in candidates:
        if name not in topics:
            try:
                info, _ = ws.ml.get_topic(name)
                # the drain's rule: a listed hot copy is dropped only once complete and bookkeeperDeleted
                topics[name] = {li.ledgerId: bool(li.HasField("offloadContext") and li.offloadContext.complete
                                                  and li.offloadContext.bookkeeperDeleted)
                                for li in info.ledgerInfo}
            except NotFoundError:
                topics[name] = None
        listed = topics[name]
        if listed is None:
            reason = HOT_TOPIC_MISSING
        elif lid not in listed:
            reason = HOT_NOT_LISTED
        elif listed[lid]:
            reason = HOT_BOOKKEEPER_DELETED
        else:
            out.listed += 1
            continue
        if ctime <= 0 or ctime >= cutoff:
            out.young += 1
            continue
        unlisted.append(HotOrphan(lid, name, ctime, length, reason))
    scheduled = deletion_log_references(ws).hot_ledgers if scheduled_ledgers is None else scheduled_ledgers
    for o in unlisted:
        if o.ledger_id in scheduled:
            out.scheduled += 1
        else:
            out.orphans.append(o)
    return out


# -- multipart uploads --------------------------------------------------------------------------


@dataclass
class UploadsResult:
    stale: list[MultipartUploadInfo] = field(default_factory=list)  # aborted (or, in a dry run, to abort)
    aborted: int = 0
    young: int = 0
    foreign: int = 0  # uploads of keys this project did not write: never aborted
    errors: list[str] = field(default_factory=list)


def abort_stale_uploads(store: BlobStore, prefix: str, as_of_ms: int, grace_ms: int = DEFAULT_GRACE_MS,
                        dry_run: bool = False, *, exclude_prefixes: Sequence[str] = ()) -> UploadsResult:
    """Abort this project's incomplete multipart uploads under `prefix` initiated before
    `as_of_ms - grace_ms`. An offload still running on an aborted upload fails cleanly (its next
    upload or complete fails, it is retried later); nothing readable is lost."""
    p = normalize_prefix(prefix)
    out = UploadsResult()
    cutoff = as_of_ms - grace_ms
    for up in store.list_multipart_uploads(p):
        if exclude_prefixes and _excluded(up.key, exclude_prefixes):
            continue
        parsed = parse_ledger_key(up.key, p)
        if parsed is None:  # not an offloaded-ledger data/index key
            out.foreign += 1
            continue
        if int(up.initiated * 1000) >= cutoff:
            out.young += 1
            continue
        out.stale.append(up)
        if dry_run:
            continue
        try:
            store.abort_multipart(up.key, up.upload_id)
            out.aborted += 1
        except TieredError as e:
            out.errors.append(f"abort {up.key} {up.upload_id}: {e}")
    return out


# -- locations ----------------------------------------------------------------------------------


@dataclass
class Location:
    """One (object store, key prefix) this project offloads to."""

    store: BlobStore
    where: StoreLocation  # its identity: what driver metadata records
    exclude_prefixes: list[str] = field(default_factory=list)  # nested locations on the same store

    @property
    def prefix(self) -> str:
        return self.where.prefix

    @property
    def driver(self) -> dict[str, Any]:
        """DeletionRecord.driver: {"name": ..., "properties": {... "prefix": ...}}."""
        return self.where.driver_dict()

    @property
    def label(self) -> str:
        return self.where.label


def store_locations(ws: Workspace, errors: list[str] | None = None) -> list[Location]:
    """The workspace's store, every store a namespace or topic policy names, and every store named in
    a ledger's OffloadContext driver metadata (objects stay where they were written when a policy
    changes). Deduplicated; a location nested in another on the same store is excluded from it."""
    from tieredcore.lifecycle.work import policy_store

    found: dict[tuple, Location] = {}  # by StoreLocation.objects

    def add(offloader) -> None:
        where = offloader.location
        if where.objects not in found:
            found[where.objects] = Location(offloader.store, where)

    add(ws.offloader)
    ps = policy_store(ws)
    namespaces = sorted(set(ws.ml.list_namespaces()) | set(ws.ml.list_policy_namespaces()))
    for ns in namespaces:
        pols = [ps.for_namespace(ns)] + [ps.for_topic(t) for t in ws.ml.list_topic_policy_topics(ns)]
        for pol in pols:
            try:
                add(ws.offloader_for_policy(pol))
            except TieredError as e:
                if errors is not None:
                    errors.append(f"namespace {ns}: cannot open policy store: {e}")
    seen_drivers: set[bytes] = set()
    for t, info in _iter_topics(ws):
        for li in info.ledgerInfo:
            if not li.HasField("offloadContext") or not li.offloadContext.HasField("driverMetadata"):
                continue
            dm = li.offloadContext.driverMetadata
            sig = dm.SerializeToString(deterministic=True)
            if sig in seen_drivers:
                continue
            seen_drivers.add(sig)
            try:
                add(ws.offloader_for_driver(dm))
            except TieredError as e:
                if errors is not None:
                    errors.append(f"{t.full} ledger {li.ledgerId}: cannot open its offload driver: {e}")
    locs = list(found.values())
    for a in locs:
        for b in locs:  # b nested in a on the same store: a's listings skip b's keys
            if a.where.objects[:4] == b.where.objects[:4] and b.prefix != a.prefix and b.prefix.startswith(a.prefix):
                a.exclude_prefixes.append(b.prefix)
    return locs


# -- planning and the whole run -----------------------------------------------------------------


@dataclass(frozen=True)
class GroupOwner:
    topic: str  # managed-ledger name from the objects' metadata, or UNKNOWN_TOPIC
    foreign: str | None  # why the group is not ours (another cluster or workspace), None when it is


def inspect_group(store: BlobStore, group: OrphanGroup, cluster: str, identity: str) -> GroupOwner:
    """HEAD the group's objects (index first): its topic, and whether any object is not ours. A group
    whose every object vanished meanwhile is reported foreign ("gone"): nothing to record."""
    topic = UNKNOWN_TOPIC
    seen = False
    for key in sorted(group.keys, key=lambda k: not k.endswith(INDEX_SUFFIX)):
        try:
            md = store.head(key).metadata
        except NotFoundError:
            continue
        seen = True
        why = foreign_reason(md, cluster, identity)
        if why is not None:
            return GroupOwner(topic, f"{key}: {why}")
        name = md.get(_MANAGED_LEDGER_METADATA_KEY)
        if name and topic == UNKNOWN_TOPIC:
            with suppress(ValidationError):
                topic = TopicName.parse(name).managed_ledger_name
    return GroupOwner(topic, None if seen else "no longer exists")


def namespace_of(topic: str) -> str:
    return UNKNOWN_NAMESPACE if topic == UNKNOWN_TOPIC else names.namespace_of(topic)


@dataclass
class ReconcileReport:
    as_of_ms: int
    grace_ms: int
    dry_run: bool
    locations: list[str] = field(default_factory=list)
    objects_listed: int = 0
    bytes_listed: int = 0
    referenced_uuids: int = 0
    referenced_objects: int = 0
    orphan_groups: int = 0  # = offloaded records (appended, or to append in a dry run)
    orphan_objects: int = 0
    orphan_bytes: int = 0
    hot_ledgers: int = 0
    hot_orphans: int = 0
    hot_orphan_bytes: int = 0
    stale_uploads: int = 0
    uploads_aborted: int = 0
    young_uploads: int = 0
    foreign_uploads: int = 0
    foreign_keys: int = 0
    foreign_bytes: int = 0
    # unreferenced groups written by another cluster or workspace sharing the store: never recorded
    foreign_cluster_groups: int = 0
    foreign_cluster_objects: int = 0
    foreign_cluster_bytes: int = 0
    foreign_cluster_samples: list[str] = field(default_factory=list)
    segment_keys: int = 0
    foreign_hot_ledgers: int = 0
    young_unreferenced: int = 0  # objects
    young_hot_ledgers: int = 0
    scheduled_hot_ledgers: int = 0
    oldest_orphan_age_ms: int | None = None
    sample_keys: list[str] = field(default_factory=list)
    # namespace -> kind (offloaded | ledger | upload) -> {"count": records/uploads, "objects": n, "bytes": n}
    by_namespace: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)
    records_appended: int = 0
    records: list[dict] = field(default_factory=list)  # the records (appended, or planned in a dry run)
    errors: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)  # seconds per phase
    # one row per orphan object / hot ledger / stale upload (DETAIL_SCHEMA); not in as_dict()
    detail_rows: list[tuple] = field(default_factory=list, repr=False)

    def add(self, namespace: str, kind: str, count: int, objects: int, nbytes: int) -> None:
        d = self.by_namespace.setdefault(namespace, {}).setdefault(kind, {"count": 0, "objects": 0, "bytes": 0})
        d["count"] += count
        d["objects"] += objects
        d["bytes"] += nbytes

    def sample(self, key: str) -> None:
        if len(self.sample_keys) < MAX_SAMPLE_KEYS:
            self.sample_keys.append(key)

    def as_dict(self) -> dict:
        d = asdict(self)
        del d["detail_rows"]
        return d

    # -- tieredcore.reports.JobReport ---------------------------------------------------------------

    def totals(self) -> Totals:
        """ledgers = orphan records (object groups and hot ledgers), bytes = their bytes, failures = the
        run's errors (a listing, an append, an abort)."""
        namespaces: dict[str, dict[str, Any]] = {}
        for ns, kinds in self.by_namespace.items():
            acc = namespaces.setdefault(ns, {"ledgers": 0, "bytes": 0, "failures": 0, "outcomes": {}})
            for kind, d in kinds.items():
                if kind != KIND_UPLOAD:
                    acc["ledgers"] += d["count"]
                acc["bytes"] += d["bytes"]
                acc["outcomes"][kind] = d["count"]
        return totals(
            ledgers=self.orphan_groups + self.hot_orphans, bytes=self.orphan_bytes + self.hot_orphan_bytes,
            failures=len(self.errors), namespaces=namespaces,
            outcomes={k: getattr(self, k) for k in OUTCOME_COUNTERS if getattr(self, k)},
        )

    def summary(self) -> dict[str, Any]:
        return self.as_dict()

    def detail(self) -> tuple[list[tuple], str]:
        return self.detail_rows, DETAIL_SCHEMA

    def messages(self) -> list[str]:
        return [f"ERROR {e}" for e in self.errors]


def plan_object_records(
    loc: Location, orphans: ObjectOrphans, as_of_ms: int, cluster: str, identity: str
) -> tuple[list[tuple[OrphanGroup, DeletionRecord]], list[tuple[OrphanGroup, str]]]:
    """One `offloaded` record per orphan group that is ours (a HEAD per group: its topic, its owner);
    returns (group, record) pairs and the (group, reason) of those left alone as not ours."""
    planned: list[tuple[OrphanGroup, DeletionRecord]] = []
    skipped: list[tuple[OrphanGroup, str]] = []
    for g in orphans.groups:
        owner = inspect_group(loc.store, g, cluster, identity)
        if owner.foreign is not None:
            skipped.append((g, owner.foreign))
            continue
        planned.append((g, DeletionRecord(
            topic=owner.topic, ledger_id=g.ledger_id, type=TYPE_OFFLOADED, reason=REASON_ORPHAN,
            created_ms=as_of_ms, uuid=g.uuid, driver={"name": loc.driver["name"],
                                                      "properties": dict(loc.driver["properties"])},
        )))
    return planned, skipped


def owned_locations(ws: Workspace, locs: list[Location], errors: list[str], dry_run: bool) -> list[Location]:
    """The locations this workspace may reconcile: claimed for its cluster (created when missing, except
    in a dry run, which only checks). A location another metadata store claimed is skipped (an error)."""
    out = []
    for loc in locs:
        try:
            if dry_run:
                m = read_marker(loc.store, loc.prefix, ws.config.cluster)
                if m is not None and m.identity != (ws.identity_if_any() or ""):
                    raise StoreOwnershipError(f"{loc.label}: claimed by another workspace of cluster "
                                              f"{ws.config.cluster!r} (metadata store {m.metadata})")
            else:
                ws.claim(loc.store, loc.prefix)
        except StoreOwnershipError as e:
            errors.append(f"{loc.label}: location skipped: {e}")
            continue
        except TieredError as e:
            errors.append(f"{loc.label}: cannot check its owner, location skipped: {e}")
            continue
        out.append(loc)
    return out


def plan_and_apply(
    ws: Workspace,
    rep: ReconcileReport,
    locs: list[Location],
    found: list[tuple[Location, ObjectOrphans]],
    hot: HotOrphans,
    as_of_ms: int,
    grace_ms: int,
    dry_run: bool,
) -> list[DeletionRecord]:
    """Steps 4-6 of a reconciliation, shared by reconcile() and the Spark job: plan records for the
    orphans found, append them (phase 1; not in a dry run), abort stale multipart uploads; fills `rep`.
    ``rep.detail_rows`` gets one row per orphan object / hot ledger / stale upload (DETAIL_SCHEMA)."""
    clock = time.perf_counter
    emit = rep.detail_rows.append
    t0 = clock()
    records: list[DeletionRecord] = []
    oldest: list[int] = []
    cluster, identity = ws.config.cluster, ws.identity_if_any() or ""
    for loc, orph in found:
        rep.objects_listed += orph.rows
        rep.bytes_listed += orph.bytes_listed
        rep.referenced_objects += orph.referenced_objects
        rep.foreign_keys += orph.foreign_keys
        rep.foreign_bytes += orph.foreign_bytes
        rep.segment_keys += orph.segment_keys
        rep.young_unreferenced += orph.young_unreferenced
        pairs, skipped = plan_object_records(loc, orph, as_of_ms, cluster, identity)
        for g, why in skipped:
            rep.foreign_cluster_groups += 1
            rep.foreign_cluster_objects += len(g.keys)
            rep.foreign_cluster_bytes += g.bytes
            if len(rep.foreign_cluster_samples) < MAX_SAMPLE_KEYS:
                rep.foreign_cluster_samples.append(why)
        recs = [r for _, r in pairs]
        for g, r in pairs:
            ns = namespace_of(r.topic)
            rep.orphan_groups += 1
            rep.orphan_objects += len(g.keys)
            rep.orphan_bytes += g.bytes
            rep.add(ns, KIND_OFFLOADED, 1, len(g.keys), g.bytes)
            oldest.append(g.age_ms(as_of_ms))
            for k in g.keys:
                rep.sample(k)
                emit((loc.label, KIND_OFFLOADED, k, g.sizes.get(k, 0), g.modified.get(k, 0), g.uuid, g.ledger_id,
                      r.topic, ns))
        records.extend(recs)
    rep.hot_ledgers = hot.ledgers
    rep.foreign_hot_ledgers = hot.foreign
    rep.young_hot_ledgers = hot.young
    rep.scheduled_hot_ledgers = hot.scheduled
    for o in hot.orphans:
        ns = namespace_of(o.topic)
        rep.hot_orphans += 1
        rep.hot_orphan_bytes += o.bytes
        rep.add(ns, KIND_LEDGER, 1, 1, o.bytes)
        oldest.append(as_of_ms - o.ctime_ms)
        rep.sample(f"hot:{o.ledger_id}")
        emit(("hot", KIND_LEDGER, f"hot:{o.ledger_id}", o.bytes, o.ctime_ms, None, o.ledger_id, o.topic, ns))
        records.append(DeletionRecord(topic=o.topic, ledger_id=o.ledger_id, type=TYPE_LEDGER, reason=REASON_ORPHAN,
                                      created_ms=as_of_ms))
    for r in records:
        r.validate()
    rep.records = [asdict(r) for r in records]
    rep.timings["planning"] = round(clock() - t0, 6)

    # phase 1: append the records
    t0 = clock()
    if not dry_run and records:
        dl = DeletionLog(ws.metadata)
        for i in range(0, len(records), APPEND_BATCH):
            batch = records[i : i + APPEND_BATCH]
            try:
                dl.append(batch)
            except TieredError as e:
                rep.errors.append(f"appending {len(batch)} deletion records: {e}")
                continue
            rep.records_appended += len(batch)
    rep.timings["append"] = round(clock() - t0, 6)

    # stale multipart uploads
    t0 = clock()
    for loc in locs:
        try:
            up = abort_stale_uploads(loc.store, loc.prefix, as_of_ms, grace_ms, dry_run,
                                     exclude_prefixes=loc.exclude_prefixes)
        except TieredError as e:
            rep.errors.append(f"{loc.label}: listing multipart uploads failed: {e}")
            continue
        rep.stale_uploads += len(up.stale)
        rep.uploads_aborted += up.aborted
        rep.young_uploads += up.young
        rep.foreign_uploads += up.foreign
        rep.errors.extend(up.errors)
        for u in up.stale:
            initiated = int(u.initiated * 1000)
            rep.add(UNKNOWN_NAMESPACE, KIND_UPLOAD, 1, 0, 0)
            oldest.append(as_of_ms - initiated)
            rep.sample(f"upload:{u.key}")
            emit((loc.label, KIND_UPLOAD, u.key, 0, initiated, None, None, None, UNKNOWN_NAMESPACE))
    rep.oldest_orphan_age_ms = max(oldest, default=None)
    rep.timings["uploads"] = round(clock() - t0, 6)
    return records


def reconcile(ws: Workspace, as_of_ms: int, grace_ms: int = DEFAULT_GRACE_MS, dry_run: bool = False,
              *, page_size: int = 1000) -> ReconcileReport:
    """The whole reconciliation in one process (the Spark job distributes the listing and anti-join).

    Holds the listing in memory. Records are appended in batches of APPEND_BATCH (each batch all or
    nothing); a dry run appends and aborts nothing and reports what it would do."""
    rep = ReconcileReport(as_of_ms, grace_ms, dry_run)
    clock = time.perf_counter
    t0 = clock()
    locs = owned_locations(ws, store_locations(ws, rep.errors), rep.errors, dry_run)
    rep.locations = [loc.label for loc in locs]
    rep.timings["locations"] = round(clock() - t0, 6)

    # 1. list every location first (before any reference is read: see the module docstring)
    t0 = clock()
    listings: list[tuple[Location, list[ObjectRow]]] = []
    for loc in locs:
        try:
            rows = list(list_objects(loc.store, loc.prefix, exclude_prefixes=loc.exclude_prefixes,
                                     page_size=page_size))
        except TieredError as e:
            rep.errors.append(f"{loc.label}: listing failed, location skipped: {e}")
            continue
        listings.append((loc, rows))
    rep.timings["listing"] = round(clock() - t0, 6)

    # 2. hot tier, topic records and the deletion log, in that order
    t0 = clock()
    hot = find_hot_orphans(ws, as_of_ms, grace_ms)
    rep.timings["hot"] = round(clock() - t0, 6)
    t0 = clock()
    referenced = referenced_uuids(ws)
    rep.referenced_uuids = len(referenced)
    rep.timings["references"] = round(clock() - t0, 6)

    # 3. anti-join per location
    t0 = clock()
    found = [(loc, find_object_orphans(rows, referenced, as_of_ms, grace_ms)) for loc, rows in listings]
    rep.timings["anti_join"] = round(clock() - t0, 6)

    plan_and_apply(ws, rep, locs, found, hot, as_of_ms, grace_ms, dry_run)
    log.info("reconcile as of %s (grace %s ms, dry run %s): %s offloaded orphan groups (%s objects, %s bytes), "
             "%s hot orphans, %s stale uploads, %s foreign keys, %s young unreferenced",
             as_of_ms, grace_ms, dry_run, rep.orphan_groups, rep.orphan_objects, rep.orphan_bytes,
             rep.hot_orphans, rep.stale_uploads, rep.foreign_keys, rep.young_unreferenced)
    return rep
