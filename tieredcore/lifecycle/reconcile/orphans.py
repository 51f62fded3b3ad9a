"""Finding orphans: the anti-join of listed objects against referenced uuids (pure; the Spark job does
the same as a DataFrame join), unlisted hot ledgers, stale multipart uploads (the only direct action
of a reconciliation: aborted), and who owns an orphan group (HEAD of its objects)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field

from tieredcore.cold.blob import BlobStore, MultipartUploadInfo
from tieredcore.errors import NotFoundError, TieredError, UnreadableRecordError, ValidationError
from tieredcore.formats.constants import METADATA_CLUSTER_NAME_KEY
from tieredcore.formats.keys import INDEX_SUFFIX, MANIFEST_SUFFIX, OFFSETS_SUFFIX, normalize_prefix, parse_key
from tieredcore.lifecycle.reconcile.listing import ObjectRow, excluded
from tieredcore.lifecycle.reconcile.references import deletion_log_references
from tieredcore.names import TopicName
from tieredcore.offload.context import is_offloaded
from tieredcore.offload.ownership import foreign_reason
from tieredcore.workspace import Workspace

DEFAULT_GRACE_MS = 3600 * 1000
# The default on a workspace attached to a Pulsar cluster (docs/pulsar.md, "Orphan reconciliation"): a week,
# well above the brokers' offload deletion lag (managedLedgerOffloadDeletionLagMs, 4 h by default in Pulsar's
# ServiceConfiguration; namespaces may set more), above the longest offload of a ledger (hours for the
# biggest) and the brokers' own retried cleanup of a replaced attempt, and long enough for an operator to
# notice a broker that lost metadata before the data it names goes.
ATTACHED_DEFAULT_GRACE_MS = 7 * 24 * 3600 * 1000
# most withheld objects (young, foreign keys) a report names one by one; the rest are counted
MAX_WITHHELD_LISTED = 10_000
# Topic of an orphaned object whose user metadata does not name its managed ledger (a lone data object
# written without metadata, a lone index...). It has the four components DeletionRecord.validate wants,
# and no real topic is expected under the tenant "__orphan__"; even if one existed, the drain's
# "still in use" check matches the record's uuid, which nothing references, so it would still delete.
UNKNOWN_TOPIC = "__orphan__/unknown/persistent/unknown"
HOT_TOPIC_MISSING = "topic-missing"
HOT_NOT_LISTED = "not-listed"
HOT_BOOKKEEPER_DELETED = "bookkeeper-deleted"  # listed, but the hot copy was marked deleted
_MANAGED_LEDGER_METADATA_KEY = "managedledgername"  # object user metadata the offloader writes
_SIDECAR_ENDINGS = (OFFSETS_SUFFIX, OFFSETS_SUFFIX + MANIFEST_SUFFIX)


# -- the anti-join ------------------------------------------------------------------------------


@dataclass
class OrphanGroup:
    """The objects of one offload attempt of one ledger (what one `offloaded` record deletes: data, index,
    the entry-offsets sidecar, their manifests), or of one streaming segment (``ledger_id`` None: what
    one `segment` record deletes)."""

    uuid: str
    ledger_id: int | None
    keys: list[str] = field(default_factory=list)
    bytes: int = 0
    oldest_modified_ms: int = 0
    newest_modified_ms: int = 0
    has_data: bool = False
    has_index: bool = False
    has_offsets: bool = False  # the entry-offsets sidecar of a ledger pair (it goes with its pair)
    sizes: dict[str, int] = field(default_factory=dict)  # per key, for report detail rows
    modified: dict[str, int] = field(default_factory=dict)
    writer: str | None = None  # the cluster its objects' metadata names (known once HEADed when planning)

    @property
    def is_segment(self) -> bool:
        return self.ledger_id is None

    def age_ms(self, as_of_ms: int) -> int:
        return as_of_ms - self.oldest_modified_ms


@dataclass
class ObjectOrphans:
    groups: list[OrphanGroup] = field(default_factory=list)  # sorted by (uuid, ledger id; a segment first)
    rows: int = 0
    bytes_listed: int = 0
    referenced_objects: int = 0
    foreign_keys: int = 0  # keys this project did not write: counted, never touched
    foreign_bytes: int = 0
    segment_keys: int = 0  # `{uuid}[-index]` keys (streaming segments), referenced or not
    young_unreferenced: int = 0  # unreferenced objects within the grace period
    young_bytes: int = 0
    young_groups: list[OrphanGroup] = field(default_factory=list)  # those objects, grouped (for the report)
    foreign_rows: list[ObjectRow] = field(default_factory=list)  # the first MAX_WITHHELD_LISTED foreign keys

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
    """Anti-join of listed objects against referenced uuids. A group (uuid, ledger id) — or (uuid, None),
    the `{uuid}` / `{uuid}-index` objects of a streaming segment — is an orphan only when its uuid is
    referenced nowhere (a segment assigned or completed on any ledger is referenced) and **every** object
    of it was last modified before `as_of_ms - grace_ms` (a group with one young object may be an
    offload in flight: all its objects are counted as young). Pure: no I/O."""
    if grace_ms < 0:
        raise ValidationError(f"grace period must be >= 0 ms, got {grace_ms}")
    out = ObjectOrphans()
    groups: dict[tuple[str, int], OrphanGroup] = {}  # (uuid, ledger id or -1 for a segment)
    for r in rows:
        out.rows += 1
        out.bytes_listed += r.size
        u = r.uuid
        if u is None:
            out.foreign_keys += 1
            out.foreign_bytes += r.size
            if len(out.foreign_rows) < MAX_WITHHELD_LISTED:
                out.foreign_rows.append(r)
            continue
        if r.ledger_id is None:
            out.segment_keys += 1
        if u in referenced:
            out.referenced_objects += 1
            continue
        k = (u, -1 if r.ledger_id is None else r.ledger_id)
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
        elif r.key.endswith(_SIDECAR_ENDINGS):  # the pair's entry-offsets sidecar (or its manifest)
            g.has_offsets = True
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
            g.keys.sort()
            out.young_groups.append(g)
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
    unreadable: int = 0  # their topic's record cannot be read: whether it lists them is unknown, never touched

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
    unreadable: set[str] = set()  # topics whose record cannot be read
    unlisted: list[HotOrphan] = []
    for lid, name, ctime, length in candidates:
        if name in unreadable:
            out.unreadable += 1
            continue
        if name not in topics:
            try:
                info, _ = ws.ml.get_topic(name)
                # the drain's rule: a listed hot copy is dropped only once offloaded (a complete V1 copy or
                # completed segments holding every entry) and bookkeeperDeleted
                topics[name] = {li.ledgerId: bool(is_offloaded(li) and li.offloadContext.bookkeeperDeleted)
                                for li in info.ledgerInfo}
            except NotFoundError:
                topics[name] = None
            except UnreadableRecordError:  # it may list this ledger: never an orphan while unreadable
                unreadable.add(name)
                out.unreadable += 1
                continue
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
    scheduled = deletion_log_references(ws.metadata).hot_ledgers if scheduled_ledgers is None else scheduled_ledgers
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
        if exclude_prefixes and excluded(up.key, exclude_prefixes):
            continue
        parsed = parse_key(up.key, p)
        if parsed is None:  # not an offloaded-ledger or segment data/index key
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

# -- owner of an orphan group -------------------------------------------------------------------


@dataclass(frozen=True)
class GroupOwner:
    topic: str  # managed-ledger name from the objects' metadata, or UNKNOWN_TOPIC
    foreign: str | None  # why the group is not ours (another cluster or workspace), None when it is
    writer: str | None = None  # the cluster its objects' metadata names (pulsarclustername)


def inspect_group(store: BlobStore, group: OrphanGroup, cluster: str, identity: str) -> GroupOwner:
    """HEAD the group's objects (index first): its topic, and whether any object is not ours. A group
    whose every object vanished meanwhile is reported foreign ("gone"): nothing to record."""
    topic = UNKNOWN_TOPIC
    seen = False
    writer: str | None = None
    for key in sorted(group.keys, key=lambda k: not k.endswith(INDEX_SUFFIX)):
        try:
            md = store.head(key).metadata
        except NotFoundError:
            continue
        seen = True
        why = foreign_reason(md, cluster, identity)
        if why is not None:
            return GroupOwner(topic, f"{key}: {why}", md.get(METADATA_CLUSTER_NAME_KEY))
        writer = md.get(METADATA_CLUSTER_NAME_KEY)
        name = md.get(_MANAGED_LEDGER_METADATA_KEY)
        if name and topic == UNKNOWN_TOPIC:
            with suppress(ValidationError):
                topic = TopicName.parse(name).managed_ledger_name
    return GroupOwner(topic, None if seen else "no longer exists", writer)
