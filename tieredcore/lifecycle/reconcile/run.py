"""A whole reconciliation: the locations to reconcile (every store the workspace, its policies or its
ledgers' driver metadata name, claimed for this cluster), the records planned for the orphans found,
their append (phase 1), and :func:`reconcile`, which runs every step in one process."""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from tieredcore.cold.blob import BlobStore
from tieredcore.cold.location import StoreLocation
from tieredcore.errors import StoreOwnershipError, TieredError, UnreadableRecordError, ValidationError
from tieredcore.lifecycle.reconcile.listing import ObjectRow, gc_paused, list_objects
from tieredcore.lifecycle.reconcile.orphans import (
    DEFAULT_GRACE_MS,
    UNKNOWN_TOPIC,
    HotOrphans,
    ObjectOrphans,
    OrphanGroup,
    abort_stale_uploads,
    find_hot_orphans,
    find_object_orphans,
    inspect_group,
)
from tieredcore.lifecycle.reconcile.references import iter_topics, referenced_uuids
from tieredcore.lifecycle.reconcile.report import (
    KIND_LEDGER,
    KIND_OFFLOADED,
    KIND_SEGMENT,
    KIND_UPLOAD,
    MAX_SAMPLE_KEYS,
    WITHHELD_OTHER_CLUSTER,
    WITHHELD_UNREADABLE,
    ReconcileReport,
    namespace_of,
)
from tieredcore.meta.deletion_log import (
    TYPE_LEDGER,
    TYPE_OFFLOADED,
    TYPE_SEGMENT,
    DeletionLog,
    DeletionRecord,
)
from tieredcore.meta.reasons import Reason
from tieredcore.names import UNKNOWN_NAMESPACE
from tieredcore.offload.context import segment_drivers
from tieredcore.offload.ownership import read_marker
from tieredcore.workspace import Workspace

log = logging.getLogger(__name__)

APPEND_BATCH = 500  # records per deletion-log transaction


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

    found: dict[tuple, Location] = {}  # by StoreLocation.objects

    def add(offloader) -> None:
        where = offloader.location
        if where.objects not in found:
            found[where.objects] = Location(offloader.store, where)

    add(ws.offloader)
    ps = ws.policies
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
    last_dm = None
    for t, info in iter_topics(ws.ml):
        for li in info.ledgerInfo:
            if not li.HasField("offloadContext"):
                continue
            ctx = li.offloadContext
            # streaming segments record their own
            dms = list(segment_drivers(li).values()) if ctx.offloadSegment else []
            if ctx.HasField("driverMetadata") and ctx.driverMetadata != last_dm:
                # (most ledgers name the store the previous one did: compared, not serialized again)
                last_dm = ctx.driverMetadata
                dms.insert(0, last_dm)
            for dm in dms:
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


def plan_object_records(
    loc: Location, orphans: ObjectOrphans, as_of_ms: int, cluster: str, identity: str
) -> tuple[list[tuple[OrphanGroup, DeletionRecord]], list[tuple[OrphanGroup, str]]]:
    """One `offloaded` record per orphan group that is ours (a HEAD per group: its topic, its owner), a
    `segment` record for a streaming segment's group (ledger id 0: no topic record names it any more;
    the drain matches segment records by uuid); returns (group, record) pairs and the (group, reason)
    of those left alone as not ours."""
    planned: list[tuple[OrphanGroup, DeletionRecord]] = []
    skipped: list[tuple[OrphanGroup, str]] = []
    for g in orphans.groups:
        owner = inspect_group(loc.store, g, cluster, identity)
        g.writer = owner.writer
        if owner.foreign is not None:
            skipped.append((g, owner.foreign))
            continue
        planned.append((g, DeletionRecord(
            topic=owner.topic, ledger_id=0 if g.ledger_id is None else g.ledger_id,
            type=TYPE_SEGMENT if g.is_segment else TYPE_OFFLOADED, reason=Reason.ORPHAN,
            created_ms=as_of_ms, uuid=g.uuid, driver={"name": loc.driver["name"],
                                                      "properties": dict(loc.driver["properties"])},
        )))
    return planned, skipped


def owned_locations(ws: Workspace, locs: list[Location], errors: list[str], dry_run: bool) -> list[Location]:
    """The locations this workspace may reconcile: claimed for its cluster (created when missing, except
    in a dry run, which only checks). A location another metadata store claimed is skipped (an error).
    Attached to a Pulsar cluster: every location, unclaimed. Its brokers write no owner marker and the
    workspace writes none into their bucket; each object's ``pulsarClusterName`` (and a ``tieredowner``,
    should an object carry one) decides whose it is, object by object."""
    if ws.attached:
        return list(locs)
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
    t0 = clock()
    oldest: list[int] = []  # ages of every orphan and stale upload, for rep.oldest_orphan_age_ms
    cluster, identity = ws.config.cluster, ws.identity_if_any() or ""
    records = _plan_object_orphans(rep, found, as_of_ms, cluster, identity, oldest)
    records.extend(_plan_hot_orphans(rep, hot, as_of_ms, oldest))
    for r in records:
        r.validate()
    rep.records = [asdict(r) for r in records]
    rep.timings["planning"] = round(clock() - t0, 6)

    # phase 1: append the records
    t0 = clock()
    if not dry_run and records:
        _append_records(DeletionLog(ws.metadata), records, rep)
    rep.timings["append"] = round(clock() - t0, 6)

    t0 = clock()
    _supersede_manifests(ws, rep, dry_run)
    rep.timings["manifests"] = round(clock() - t0, 6)

    t0 = clock()
    _abort_stale_uploads_in(rep, locs, as_of_ms, grace_ms, dry_run, oldest)
    rep.oldest_orphan_age_ms = max(oldest, default=None)
    rep.timings["uploads"] = round(clock() - t0, 6)
    return records


def _supersede_manifests(ws: Workspace, rep: ReconcileReport, dry_run: bool) -> None:
    """Topic manifests beyond the newest ``manifests_keep`` of their topic go to the deletion log
    (docs/recovery.md); a dry run counts them. Never on an attached workspace (it writes none)."""
    if ws.attached:
        return
    try:
        records = ws.manifests.superseded()
        rep.manifests_superseded = len(records) if dry_run else ws.manifests.supersede(records)
    except TieredError as e:
        rep.errors.append(f"topic manifests: {e}")


def _plan_object_orphans(
    rep: ReconcileReport,
    found: list[tuple[Location, ObjectOrphans]],
    as_of_ms: int,
    cluster: str,
    identity: str,
    oldest: list[int],
) -> list[DeletionRecord]:
    """Deletion records for the orphan objects of every location (counted, sampled, one detail row and one
    ``candidates`` row per object in `rep`); groups of another cluster's objects are only counted, and
    with what else was left alone (young, foreign keys, unreadable topic records) listed in ``withheld``."""
    emit = rep.detail_rows.append
    records: list[DeletionRecord] = []
    for loc, orph in found:
        _count_listing(rep, orph)
        pairs, skipped = plan_object_records(loc, orph, as_of_ms, cluster, identity)
        for g, why in skipped:
            rep.foreign_cluster_groups += 1
            rep.foreign_cluster_objects += len(g.keys)
            rep.foreign_cluster_bytes += g.bytes
            rep.withhold_group(WITHHELD_OTHER_CLUSTER, g, why)
            if len(rep.foreign_cluster_samples) < MAX_SAMPLE_KEYS:
                rep.foreign_cluster_samples.append(why)
        if rep.unreadable_topics:
            blocked = {namespace_of(t) for t in rep.unreadable_topics}
            for g, _r in (p for p in pairs if _withheld(blocked, p[1].topic, rep.attached)):
                rep.withheld_groups += 1
                rep.withheld_objects += len(g.keys)
                rep.withheld_bytes += g.bytes
                rep.withhold_group(WITHHELD_UNREADABLE, g, _unreadable_why(rep))
            pairs = [(g, r) for g, r in pairs if not _withheld(blocked, r.topic, rep.attached)]
        for g, r in pairs:
            ns = namespace_of(r.topic)
            kind = KIND_SEGMENT if g.is_segment else KIND_OFFLOADED
            rep.orphan_groups += 1
            rep.orphan_segments += int(g.is_segment)
            rep.orphan_objects += len(g.keys)
            rep.orphan_bytes += g.bytes
            rep.add(ns, kind, 1, len(g.keys), g.bytes)
            oldest.append(g.age_ms(as_of_ms))
            for k in g.keys:
                rep.sample(k)
                rep.candidate(loc.label, kind, g, k, r.topic)
                emit((loc.label, kind, k, g.sizes.get(k, 0), g.modified.get(k, 0), g.uuid, g.ledger_id,
                      r.topic, ns))
            records.append(r)
    return records


def _count_listing(rep: ReconcileReport, orph: ObjectOrphans) -> None:
    """A location's listing counters, and its young groups and foreign keys listed as withheld."""
    rep.objects_listed += orph.rows
    rep.bytes_listed += orph.bytes_listed
    rep.referenced_objects += orph.referenced_objects
    rep.foreign_keys += orph.foreign_keys
    rep.foreign_bytes += orph.foreign_bytes
    rep.segment_keys += orph.segment_keys
    rep.young_unreferenced += orph.young_unreferenced
    for g in orph.young_groups:
        rep.withhold_young(g)
    for row in orph.foreign_rows:
        rep.withhold_foreign_key(row)
    rep.withheld_not_listed += max(0, orph.foreign_keys - len(orph.foreign_rows))


def _unreadable_why(rep: ReconcileReport) -> str:
    scope = "any topic's" if rep.attached else "an unreadable namespace's (or an unnamed topic's)"
    return (f"old enough and unreferenced, but {len(rep.unreadable_topics)} topic record(s) cannot be read "
            f"({', '.join(rep.unreadable_topics[:3])}{', ...' if len(rep.unreadable_topics) > 3 else ''}): it may "
            f"be {scope} data; nothing of it is recorded until they can be read")


def _withheld(blocked: set[str], topic: str, everything: bool = False) -> bool:
    """Whether an unreferenced group whose objects name ``topic`` stays out of the deletion log while the
    namespaces ``blocked`` hold topic records that cannot be read.

    An unreadable record's references (and its driver metadata: which stores hold its objects) are
    unknown, so an unreferenced group might be its only copy of data. Withheld: every group naming a
    topic of such a namespace, and every group naming no topic (Pulsar's objects carry none). Groups
    naming a topic of another namespace are still recorded: the offloader names its own topic on its
    objects, and the drain refuses a record whose objects name another topic. ``everything`` (attached to
    a Pulsar cluster, with any topic unreadable): every group, since an unreadable ManagedLedgerInfo may
    reference any uuid and a broker's object names a topic only in recent Pulsar versions."""
    return everything or topic == UNKNOWN_TOPIC or namespace_of(topic) in blocked


def _plan_hot_orphans(rep: ReconcileReport, hot: HotOrphans, as_of_ms: int, oldest: list[int]) -> list[DeletionRecord]:
    """Deletion records for the orphan hot-tier ledgers (counted, sampled, one detail row each in `rep`)."""
    emit = rep.detail_rows.append
    records: list[DeletionRecord] = []
    rep.hot_ledgers = hot.ledgers
    rep.foreign_hot_ledgers = hot.foreign
    rep.young_hot_ledgers = hot.young
    rep.scheduled_hot_ledgers = hot.scheduled
    rep.withheld_hot_ledgers = hot.unreadable
    for o in hot.orphans:
        ns = namespace_of(o.topic)
        rep.hot_orphans += 1
        rep.hot_orphan_bytes += o.bytes
        rep.add(ns, KIND_LEDGER, 1, 1, o.bytes)
        oldest.append(as_of_ms - o.ctime_ms)
        rep.sample(f"hot:{o.ledger_id}")
        emit(("hot", KIND_LEDGER, f"hot:{o.ledger_id}", o.bytes, o.ctime_ms, None, o.ledger_id, o.topic, ns))
        records.append(DeletionRecord(topic=o.topic, ledger_id=o.ledger_id, type=TYPE_LEDGER, reason=Reason.ORPHAN,
                                      created_ms=as_of_ms))
    return records


def _append_records(dl: DeletionLog, records: list[DeletionRecord], rep: ReconcileReport) -> None:
    """Phase 1: the records appended to the deletion log, APPEND_BATCH at a time; a batch that fails is
    reported in `rep` and the next one is tried."""
    for i in range(0, len(records), APPEND_BATCH):
        batch = records[i : i + APPEND_BATCH]
        try:
            dl.append(batch)
        except TieredError as e:
            rep.errors.append(f"appending {len(batch)} deletion records: {e}")
            continue
        rep.records_appended += len(batch)


def _abort_stale_uploads_in(rep: ReconcileReport, locs: list[Location], as_of_ms: int, grace_ms: int,
                            dry_run: bool, oldest: list[int]) -> None:
    """Stale multipart uploads of every location aborted (listed only in a dry run); counted, sampled and
    one detail row each in `rep`. A location whose uploads cannot be listed is reported and skipped."""
    emit = rep.detail_rows.append
    if rep.attached:
        # the brokers' uploads are neither listed nor aborted: the bucket grants list, get and delete only,
        # and an AbortIncompleteMultipartUpload lifecycle rule on the bucket is the place for them
        return
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


def start(ws: Workspace, as_of_ms: int, grace_ms: int, dry_run: bool) -> tuple[ReconcileReport, list[Location]]:
    """A run's report and the locations it may reconcile (claimed, or checked in a dry run)."""
    rep = ReconcileReport(as_of_ms, grace_ms, dry_run, attached=ws.attached, cluster=ws.config.cluster)
    if ws.attached and dry_run:
        rep.notes.append("dry run: nothing recorded (an attached workspace only plans unless --apply / the DAG's "
                         "apply param)")
    t0 = time.perf_counter()
    locs = owned_locations(ws, store_locations(ws, rep.errors), rep.errors, dry_run)
    rep.locations = [loc.label for loc in locs]
    rep.timings["locations"] = round(time.perf_counter() - t0, 6)
    return rep, locs


def read_references(ws: Workspace, rep: ReconcileReport, as_of_ms: int, grace_ms: int):
    """Step 2 of a reconciliation, after every listing: the hot tier's orphans, then every uuid the topic
    records and the deletion log reference (in that order: see the package docstring); timed in ``rep``."""
    clock = time.perf_counter
    t0 = clock()
    hot = find_hot_orphans(ws, as_of_ms, grace_ms)
    rep.timings["hot"] = round(clock() - t0, 6)
    t0 = clock()
    unreadable: list[UnreadableRecordError] = []
    referenced = referenced_uuids(ws.ml, ws.metadata, unreadable)
    note_unreadable(rep, unreadable)
    rep.referenced_uuids = len(referenced)
    rep.timings["references"] = round(clock() - t0, 6)
    return hot, referenced


def resolve_dry_run(attached: bool, dry_run: bool, apply: bool) -> bool:
    """Whether a reconciliation only plans. Attached to a Pulsar cluster: unless ``apply`` (the brokers'
    bucket is deleted from only when asked for); otherwise as before: unless ``dry_run``. Both at once:
    ValidationError (one line)."""
    if dry_run and apply:
        raise ValidationError("--apply and --dry-run contradict each other: give one")
    return not apply if attached else dry_run


def note_unreadable(rep: ReconcileReport, unreadable: list[UnreadableRecordError]) -> None:
    """Each unreadable topic record: one error of the run (a failure of its namespace), and its namespace's
    unreferenced objects withheld from the deletion log (:func:`plan_and_apply`)."""
    for e in unreadable:
        if e.topic in rep.unreadable_topics:
            continue
        rep.unreadable_topics.append(e.topic)
        if rep.attached:
            rep.errors.append(f"{e}; what it references is unknown: no orphan at all is recorded for deletion "
                              "until it can be read")
            continue
        rep.errors.append(f"{e}; what it references is unknown: no unreferenced object of namespace "
                          f"{namespace_of(e.topic)} (nor any naming no topic) and no hot ledger of the topic is "
                          "recorded for deletion until it can be read")
    if unreadable and rep.attached and not any(n.startswith("unreadable") for n in rep.notes):
        rep.notes.append(f"unreadable topic records ({len(rep.unreadable_topics)}): NO orphan is recorded for "
                         "deletion this run (any record may reference any uuid)")


def reconcile(ws: Workspace, as_of_ms: int, grace_ms: int = DEFAULT_GRACE_MS, dry_run: bool = False,
              *, page_size: int = 1000) -> ReconcileReport:
    """The whole reconciliation in one process (the Spark job distributes the listing and anti-join).

    Holds the listing in memory. Records are appended in batches of APPEND_BATCH (each batch all or
    nothing); a dry run appends and aborts nothing and reports what it would do."""
    rep, locs = start(ws, as_of_ms, grace_ms, dry_run)
    clock = time.perf_counter

    # (the cyclic garbage collector paused while the listing is built and joined: gc_paused)
    with gc_paused():
        # 1. list every location first (before any reference is read: see the package docstring)
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
        hot, referenced = read_references(ws, rep, as_of_ms, grace_ms)

        # 3. anti-join per location
        t0 = clock()
        found = [(loc, find_object_orphans(listed, referenced, as_of_ms, grace_ms)) for loc, listed in listings]
        rep.timings["anti_join"] = round(clock() - t0, 6)
        # the rows go by reference counting before the collector is back (else its first run walks them)
        rows = None
        del listings, referenced

    plan_and_apply(ws, rep, locs, found, hot, as_of_ms, grace_ms, dry_run)
    log.info("reconcile as of %s (grace %s ms, dry run %s): %s offloaded orphan groups (%s objects, %s bytes), "
             "%s hot orphans, %s stale uploads, %s foreign keys, %s young unreferenced",
             as_of_ms, grace_ms, dry_run, rep.orphan_groups, rep.orphan_objects, rep.orphan_bytes,
             rep.hot_orphans, rep.stale_uploads, rep.foreign_keys, rep.young_unreferenced)
    return rep
