"""What `tiered status` shows, computed from the topic records (and, for segments partly streamed, the hot
copies): per topic, which tier holds each ledger, bytes per tier, segments and the object-store objects;
per namespace the same added up; the object store's own totals; the chunk cache of transformed objects.
The CLI only prints it (``as_dict()`` is its ``--json`` output, key order included)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tieredcore.cold.location import StoreLocation
from tieredcore.errors import (
    FormatError,
    HotLedgerNotFoundError,
    NotFoundError,
    TieredError,
    UnreadableRecordError,
    ValidationError,
)
from tieredcore.formats.keys import INDEX_SUFFIX, LEDGER_INFIX, MANIFEST_SUFFIX, normalize_prefix
from tieredcore.formats.manifest import Manifest
from tieredcore.formats.proto import MLDataFormats_pb2 as pb
from tieredcore.hot.tier import FrameSource
from tieredcore.names import TopicName
from tieredcore.offload.context import (
    context_uuid,
    covered_through,
    incomplete_segment_uuids,
    is_complete,
    is_offloaded,
    is_sealed,
    segment_drivers,
    segment_pieces,
    segment_refs,
)
from tieredcore.offload.copies import copy_uuids
from tieredcore.reports import RunReports
from tieredcore.workspace import Workspace

# a ledger's tier: hot only, hot + object store, object store only (its hot copy deleted)
HOT, BOTH, OFFLOADED = "hot", "both", "offloaded"


def ledger_tier(li) -> str:
    """hot / both / offloaded; a ledger's object-store copy is its V1 object or, once sealed, the
    streaming segments holding all its entries."""
    if is_offloaded(li):
        return OFFLOADED if li.offloadContext.bookkeeperDeleted else BOTH
    return HOT


def offloaded_at(li) -> int:
    """When the ledger's object-store copy was complete: its V1 offload, or its last segment."""
    if is_complete(li):
        return li.offloadContext.timestamp
    return max((r.offloaded_ms for r in segment_refs(li) if r.complete), default=0)


@dataclass
class LedgerStatus:
    """One ledger of a topic (``status --ledgers``)."""

    ledger: int
    entries: int
    size: int
    state: str  # open | sealed
    tier: str
    uuid: str | None
    offloaded_at: int | None  # None: hot only
    segments: list[str]
    streamed_through: int  # -1: in no segment


@dataclass
class PartialLedger:
    """A ledger only partly in streaming segments."""

    ledger: int
    open: bool
    streamed_through: int
    last_entry: int | None  # None: unknown (no hot copy to ask)


@dataclass
class TopicStatus:
    topic: str
    version: Any  # the topic record's version in the metadata store
    ledgers: int
    hot_bytes: int = 0
    offloaded_bytes: int = 0
    hot_only: int = 0
    both: int = 0
    offloaded_only: int = 0
    open: int = 0
    entries: int = 0
    ledger_detail: list[LedgerStatus] | None = None  # None: not asked for
    segments: int = 0  # completed segments
    segment_bytes: int = 0  # payload bytes they hold
    segment_ledgers: int = 0  # ledgers (partly) in segments
    partially_streamed: list[PartialLedger] = field(default_factory=list)
    segments_in_flight: int = 0  # segments not (or no longer) completed: in flight or abandoned
    objects: int = 0  # object-store objects holding the topic's data (data + index per V1 copy or segment)
    # the topic's record cannot be read ("path: reason"): nothing else is known of it (version None)
    error: str = ""

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if self.ledger_detail is None:
            del d["ledger_detail"]
        if not self.error:
            del d["error"]
        return d


@dataclass
class NamespaceStatus:
    topics: int = 0
    ledgers: int = 0
    hot_only: int = 0
    both: int = 0
    offloaded_only: int = 0
    hot_bytes: int = 0
    offloaded_bytes: int = 0
    entries: int = 0
    segments: int = 0
    segment_bytes: int = 0
    objects: int = 0
    unreadable: int = 0  # topics whose record cannot be read (in ``topics``, in no other count)

    def add(self, t: TopicStatus) -> None:
        self.topics += 1
        if t.error:
            self.unreadable += 1
            return
        self.ledgers += t.ledgers
        self.hot_only += t.hot_only
        self.both += t.both
        self.offloaded_only += t.offloaded_only
        self.hot_bytes += t.hot_bytes
        self.offloaded_bytes += t.offloaded_bytes
        self.entries += t.entries
        self.segments += t.segments
        self.segment_bytes += t.segment_bytes
        self.objects += t.objects


@dataclass
class StoreTotals:
    """Objects under the workspace store's offload prefix (what an operator's bill is made of)."""

    url: str
    objects: int
    bytes: int


@dataclass
class TransformedBytes:
    """A namespace's transformed (chunked) objects: logical bytes and what the store holds for them."""

    objects: int = 0
    logical_bytes: int = 0
    stored_bytes: int = 0
    compressed: int = 0
    encrypted: int = 0


@dataclass
class LastRunCache:
    """The chunk cache counters of a job's newest run report that has them."""

    job: str
    run_id: Any
    cache: Any


@dataclass
class CacheStatus:
    configured: dict[str, Any]  # the configuration (and a disk cache's directory as it is now)
    process: dict[str, Any] | None  # this process's cache, when it has one open
    last_runs: list[LastRunCache]
    namespaces: dict[str, TransformedBytes]
    errors: list[str]


@dataclass
class StatusReport:
    topics: list[TopicStatus]
    namespaces: dict[str, NamespaceStatus] | None = None  # with the store's totals (``--by-namespace``)
    store: StoreTotals | None = None
    cache: CacheStatus | None = None

    @property
    def unreadable(self) -> list[TopicStatus]:
        return [t for t in self.topics if t.error]

    def as_dict(self) -> dict[str, Any]:
        res: dict[str, Any] = {"topics": [t.as_dict() for t in self.topics]}
        if self.namespaces is not None:
            res["namespaces"] = {ns: asdict(a) for ns, a in self.namespaces.items()}
            res["store"] = asdict(self.store) if self.store is not None else None
        if self.cache is not None:
            res["cache"] = asdict(self.cache)
        return res


def topic_status(ws: Workspace, topics: Sequence[TopicName], *, ledgers: bool = False, by_namespace: bool = False,
                 cache: bool = False) -> StatusReport:
    """The status of ``topics``; ``ledgers``: each ledger's too; ``by_namespace``: namespace and store
    totals; ``cache``: the chunk cache and the transformed objects (reads their manifests)."""
    rows = [_topic(ws, t, ledgers) for t in topics]
    report = StatusReport(rows)
    if by_namespace:
        report.namespaces = {}
        for t, row in zip(topics, rows, strict=True):
            report.namespaces.setdefault(t.namespace_name, NamespaceStatus()).add(row)
        report.store = store_totals(ws)
    if cache:
        report.cache = cache_status(ws, list(topics))
    return report


def _topic(ws: Workspace, t: TopicName, with_ledgers: bool) -> TopicStatus:
    try:
        info, version = ws.ml.get_topic(t)
    except UnreadableRecordError as e:  # this topic's row says so; every other topic is shown as usual
        return TopicStatus(t.full, None, 0, ledger_detail=[] if with_ledgers else None,
                           error=f"{e.path}: {e.reason}")
    row = TopicStatus(t.full, version, len(info.ledgerInfo), ledger_detail=[] if with_ledgers else None)
    per_ledger = _segment_status(ws, info, row)
    row.objects = 2 * len({u for li in info.ledgerInfo for u in copy_uuids(li)})
    for li in info.ledgerInfo:
        tier = ledger_tier(li)
        is_open = li.timestamp <= 0
        row.open += is_open
        row.entries += li.entries
        if tier == HOT:
            row.hot_only += 1
        elif tier == BOTH:
            row.both += 1
        else:
            row.offloaded_only += 1
        if tier in (HOT, BOTH):
            row.hot_bytes += li.size
        if tier in (BOTH, OFFLOADED):
            row.offloaded_bytes += li.size
        if row.ledger_detail is not None:
            segments, through = per_ledger.get(li.ledgerId, ([], -1))
            row.ledger_detail.append(LedgerStatus(
                ledger=li.ledgerId, entries=li.entries, size=li.size, state="open" if is_open else "sealed",
                tier=tier, uuid=context_uuid(li), offloaded_at=offloaded_at(li) if tier != HOT else None,
                segments=segments, streamed_through=through))
    return row


def _segment_status(ws: Workspace, info, row: TopicStatus) -> dict[int, tuple[list[str], int]]:
    """The topic's completed segments (count), the payload bytes they hold, the ledgers they cover and
    the ledgers only partly in them, into ``row``; per ledger: its segments and how far they reach. A
    partly streamed ledger's hot copy gives its last confirmed entry and entry sizes."""
    uuids: set[str] = set()
    in_flight: set[str] = set()
    per_ledger: dict[int, tuple[list[str], int]] = {}
    for i, li in enumerate(info.ledgerInfo):
        in_flight.update(incomplete_segment_uuids(li))
        pieces = segment_pieces(li)
        if not pieces:
            continue
        uuids.update(p.uuid for p in pieces)
        row.segment_ledgers += 1
        through = covered_through(li)
        per_ledger[li.ledgerId] = ([p.uuid for p in pieces], through)
        if is_sealed(li) and li.HasField("entries") and through >= li.entries - 1:
            row.segment_bytes += li.size
            continue
        is_open = i == len(info.ledgerInfo) - 1 and not is_sealed(li)
        last, nbytes = _hot_extent(ws, li, is_open, through)
        row.segment_bytes += nbytes or 0
        row.partially_streamed.append(PartialLedger(li.ledgerId, is_open, through, last))
    row.segments = len(uuids)
    row.segments_in_flight = len(in_flight - uuids)
    return per_ledger


def _hot_extent(ws: Workspace, li, is_open: bool, through: int) -> tuple[int | None, int | None]:
    """(last entry, bytes of the entries through ``through``) of a partly streamed ledger, from its hot
    copy when it still has one (an open ledger's last entry is its last confirmed one)."""
    last, nbytes = (li.entries - 1 if li.HasField("entries") else None), None
    try:
        h = ws.hot.open_ledger(li.ledgerId)
    except HotLedgerNotFoundError:
        return last, nbytes
    try:
        last = h.last_add_confirmed if is_open or last is None else last
        if isinstance(h, FrameSource):
            nbytes = sum(h.entry_sizes()[: through + 1])
    finally:
        h.close()
    return last, nbytes


def store_totals(ws: Workspace) -> StoreTotals:
    """Objects under the workspace store's offload prefix, but the owner markers
    (tieredcore.offload.ownership) and the topic manifests (docs/recovery.md)."""
    from tieredcore.cold.blob import iter_objects
    from tieredcore.formats.keys import is_topic_manifest_key
    from tieredcore.offload.ownership import is_marker_key

    n = size = 0
    prefix = ws.offloader.prefix
    for o in iter_objects(ws.store, prefix):
        if is_marker_key(o.key, prefix) or is_topic_manifest_key(o.key, prefix):
            continue
        n += 1
        size += o.size
    return StoreTotals(ws.config.store_url, n, size)


# -- the chunk cache and transformed objects (``status --cache``) --------------------------------


def _disk_cache_usage(root: Path) -> dict[str, Any]:
    """Bytes and entries in a disk cache's directory now (the files of whichever process uses it)."""
    n = size = 0
    if root.is_dir():
        for p in root.iterdir():
            if p.suffix != ".tmp" and p.is_file():
                n += 1
                size += p.stat().st_size
    return {"directory": str(root), "exists": root.is_dir(), "bytes": size, "entries": n}


def _copies(li) -> list[tuple[pb.OffloadDriverMetadata | None, list[str]]]:
    """(driver metadata, uuids) of the ledger's object-store copy: its V1 uuid, or its segments."""
    if is_complete(li):
        uuid = context_uuid(li)
        dm = li.offloadContext.driverMetadata if li.offloadContext.HasField("driverMetadata") else None
        return [(dm, [f"{uuid}{LEDGER_INFIX}{li.ledgerId}"])] if uuid else []
    drivers = segment_drivers(li)
    return [(drivers.get(p.uuid), [p.uuid]) for p in segment_pieces(li)]


def transformed_bytes(ws: Workspace, topics: list[TopicName]) -> tuple[dict[str, TransformedBytes], list[str]]:
    """Per namespace: the transformed (chunked) objects of its topics' object-store copies, their logical
    bytes (the manifests' ``size``) and what the store holds for them (chunks + manifest). Manifests are
    read from the plain store: no key is unwrapped and no chunk cache is opened (opening a disk cache
    wipes its directory). Objects shared by several ledgers (segments) count once."""
    stores: dict[tuple, tuple[Any, str]] = {}
    seen: set[tuple] = set()
    out: dict[str, TransformedBytes] = {}
    errors: list[str] = []
    for t in topics:
        try:
            info, _ = ws.ml.get_topic(t)
        except UnreadableRecordError as e:
            errors.append(str(e))
            continue
        except NotFoundError:
            continue  # deleted since listed
        agg = out.setdefault(t.namespace_name, TransformedBytes())
        for li in info.ledgerInfo:
            for dm, names in _copies(li):
                try:
                    loc = StoreLocation.from_driver_metadata(dm) if dm is not None and dm.name else None
                except ValidationError as e:
                    errors.append(f"{t.full} ledger {li.ledgerId}: {e}")
                    continue
                if loc is None or not loc.chunked:
                    continue  # untransformed: stored as it is
                if loc.same_objects(ws.config.store_location):  # the configured client settings
                    loc = ws.config.store_location
                opened = stores.get(loc.objects)
                if opened is None:
                    opened = stores[loc.objects] = (ws.open_location(loc), normalize_prefix(loc.prefix))
                store, prefix = opened
                for name in names:
                    for key in (prefix + name, prefix + name + INDEX_SUFFIX):
                        if (loc.objects, key) not in seen:
                            seen.add((loc.objects, key))
                            _add_manifest(store, key, agg, errors, f"{t.full} ledger {li.ledgerId}")
    return {ns: a for ns, a in out.items() if a.objects}, errors


def _add_manifest(store, key: str, agg: TransformedBytes, errors: list[str], what: str) -> None:
    mkey = key + MANIFEST_SUFFIX
    try:
        raw = store.get(mkey)
        m = Manifest.from_json(raw, mkey)
    except TieredError as e:
        errors.append(f"{what}: {type(e).__name__}: {e}")
        return
    agg.objects += 1
    agg.logical_bytes += m.size
    agg.stored_bytes += m.index.transformed_size + len(raw)
    agg.compressed += m.compression != "none"
    agg.encrypted += m.encrypted


def last_run_caches(reports_dir: str) -> list[LastRunCache]:
    """The chunk cache counters of each job's newest run report that has them."""
    reports = RunReports(reports_dir)
    newest: dict[str, tuple[int, LastRunCache]] = {}
    for group in reports.groups():  # per DAG (or job run outside Airflow): its newest run with cache counters
        for run in reports.runs(group):
            found = [doc for part in reports.parts(group, run) if (doc := _summary(reports, group, run, part))
                     and doc.get("cache")]
            for doc in found:
                job, written = str(doc.get("job") or group), int(doc.get("written_ms") or 0)
                if job not in newest or newest[job][0] < written:
                    newest[job] = (written, LastRunCache(job, doc.get("run_id", run), doc["cache"]))
            if found:
                break
    return [c for _, (_, c) in sorted(newest.items())]


def _summary(reports: RunReports, group: str, run: str, part: str) -> dict[str, Any] | None:
    try:
        return reports.read_summary(group, run, part)
    except (NotFoundError, FormatError):
        return None


def cache_status(ws: Workspace, topics: list[TopicName]) -> CacheStatus:
    c = ws.config
    kind = "disk" if c.chunk_cache.startswith("disk:") else c.chunk_cache
    configured: dict[str, Any] = {"chunk_cache": c.chunk_cache, "kind": kind, "max_bytes": c.chunk_cache_size,
                                  "prefetch_bytes": c.chunk_cache_prefetch, "ttl_ms": c.chunk_cache_ttl_ms}
    if kind == "disk":  # looked at before anything could open (and wipe) it
        configured.update(_disk_cache_usage(Path(c.chunk_cache[len("disk:"):])))
    namespaces, errors = transformed_bytes(ws, topics)
    # this process's cache: a memory cache is cheap to open; a disk cache only if this command opened it
    opened = ws.opened_chunk_cache()
    process = opened.describe() if opened is not None else ws.chunk_cache.describe() if kind == "memory" else None
    return CacheStatus(configured, process, last_run_caches(c.reports_dir), namespaces, errors)
