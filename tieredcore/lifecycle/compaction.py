"""Compaction planning (docs/compaction.md): which runs of small offloaded objects of a topic are worth
repacking into large PIP-76 segments, and what that costs. Planning reads the topic record only, no store
request; the executor that writes the new segments is :mod:`tieredcore.offload.compaction`, configured
for a workspace here (:func:`compactor_for`), and used by the scrub too: a damaged segment is repaired
as a batch rewritten from the hot copies (:func:`repair_segments`).

A topic's sealed, fully offloaded ledgers are grouped by the objects holding them (a segment spanning
ledgers joins them into one group). A group is *small* when each of its objects (a V1 ``{uuid}-ledger-{id}``
pair or a segment) is estimated below ``compaction_min_object_size``. Consecutive small groups form a run;
a run is cut at ledger boundaries into batches of about ``compaction_target_size``, each becoming one new
segment. A batch that would not reduce the number of objects is left alone. A ledger with anything in
flight (an incomplete segment, a replacement being written, an abandoned attempt) is never touched.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tieredcore.cold.location import CHUNKED_PROPERTY, TRANSFORM_PROPERTY
from tieredcore.errors import HotLedgerNotFoundError, ValidationError
from tieredcore.formats.proto import MLDataFormats_pb2 as pb
from tieredcore.meta.reasons import Reason
from tieredcore.names import TopicName
from tieredcore.offload.batches import (
    BLOCK_SIZE,
    KIND_LEDGER,
    KIND_SEGMENT,
    Batch,
    Unit,
    compacted_bytes,
    piece_bytes,
    repackable,
    v1_bytes,
)
from tieredcore.offload.compaction import (
    DEFAULT_MIN_OBJECT_SIZE,
    DEFAULT_TARGET_SIZE,
    CompactionResult,
    Compactor,
)
from tieredcore.offload.context import (
    LedgerInfo,
    context_uuid,
    driver_dict,
    is_complete,
    referenced_uuids,
    segment_drivers,
    segment_pieces,
)
from tieredcore.offload.copies import open_offloaded
from tieredcore.offload.segments import S3_MIN_PART_SIZE, SegmentOffloader
from tieredcore.policy import OffloadPolicy
from tieredcore.workspace import Workspace

__all__ = ["CostModel", "compactor_for", "plan_topic", "repair_batch", "repair_segments"]


def _units(lis: Sequence[LedgerInfo]) -> tuple[dict[str, Unit], dict[int, list[str]]]:
    """Every object pair the clean ledgers are read from (uuid -> Unit) and each ledger's uuids."""
    est: dict[str, int] = {}
    members: dict[str, list[int]] = {}
    kinds: dict[str, str] = {}
    drivers: dict[str, dict[str, Any]] = {}
    of_ledger: dict[int, list[str]] = {}
    for li in lis:
        if is_complete(li):
            u = context_uuid(li)
            assert u is not None
            kinds[u], est[u] = KIND_LEDGER, v1_bytes(li)
            members.setdefault(u, []).append(li.ledgerId)
            dm = li.offloadContext.driverMetadata if li.offloadContext.HasField("driverMetadata") else None
            drivers[u] = driver_dict(dm) if dm is not None else {}
            of_ledger[li.ledgerId] = [u]
            continue
        segs = segment_drivers(li)
        of_ledger[li.ledgerId] = []
        for p in segment_pieces(li):
            kinds[p.uuid] = KIND_SEGMENT
            est[p.uuid] = est.get(p.uuid, 0) + piece_bytes(li, p.last - p.first + 1)
            members.setdefault(p.uuid, []).append(li.ledgerId)
            if p.uuid in segs:
                drivers[p.uuid] = driver_dict(segs[p.uuid])
            of_ledger[li.ledgerId].append(p.uuid)
    units = {u: Unit(kinds[u], u, tuple(members[u]), est[u], drivers.get(u, {}), _transform_of(drivers.get(u, {})))
             for u in members}
    return units, of_ledger


def _transform_of(driver: dict[str, Any]) -> str:
    props = driver.get("properties") or {}
    if props.get(CHUNKED_PROPERTY) != "true":
        return "none"
    return props.get(TRANSFORM_PROPERTY) or "none"


def plan_topic(info: pb.ManagedLedgerInfo, *, min_object_size: int = DEFAULT_MIN_OBJECT_SIZE,
               target_size: int = DEFAULT_TARGET_SIZE, block_size: int = BLOCK_SIZE,
               transform: str = "none") -> list[Batch]:
    """The batches a compaction of the topic record ``info`` would write (see the module docstring).
    ``transform``: the namespace's transform now; objects written with another one are rewritten
    whatever their size (e.g. compressed once compression is enabled)."""
    lis = list(info.ledgerInfo)
    clean = [li for li in lis if repackable(li)]
    units, of_ledger = _units(clean)
    # every ledger referencing a unit some unclean ledger also references is out (shared with data in flight)
    index = {li.ledgerId: i for i, li in enumerate(lis)}
    clean_ids = {li.ledgerId for li in clean}
    for li in lis:
        if li.ledgerId not in clean_ids:
            for u in referenced_uuids(li):
                if u in units:
                    for lid in units[u].ledgers:
                        clean_ids.discard(lid)
    # groups: ledgers joined by a shared object, as intervals of the ledger list
    # (a ledger that cannot be repacked — not offloaded, in flight, sharing an object with one in flight —
    # ends a run: runs are consecutive in topic order; an empty ledger nothing references does not)
    groups: list[list[int]] = []
    for li in lis:
        lid = li.ledgerId
        if lid not in clean_ids:
            if not (li.HasField("entries") and li.entries == 0 and not referenced_uuids(li)):
                groups.append([])  # a barrier: runs do not cross it
            continue
        first_of = [min(index[m] for m in units[u].ledgers) for u in of_ledger[lid]]
        if groups and groups[-1] and first_of and min(first_of) <= index[groups[-1][-1]]:
            groups[-1].append(lid)
        else:
            groups.append([lid])
    by_id = {li.ledgerId: li for li in clean}
    out: list[Batch] = []
    run: list[list[int]] = []

    def flush_run() -> None:
        cur: list[list[int]] = []
        size = 0
        for g in run:
            g_after = sum(compacted_bytes(by_id[lid].entries, by_id[lid].size, block_size) for lid in g)
            if cur and size + g_after > target_size:
                _emit(cur)
                cur, size = [], 0
            cur.append(g)
            size += g_after
        if cur:
            _emit(cur)

    def _emit(gs: list[list[int]]) -> None:
        lids = tuple(lid for g in gs for lid in g)
        us: dict[str, Unit] = {}
        for lid in lids:
            for u in of_ledger[lid]:
                us.setdefault(u, units[u])
        after = sum(compacted_bytes(by_id[lid].entries, by_id[lid].size, block_size) for lid in lids)
        objects_after = max(1, math.ceil(after / target_size))
        if len(us) <= objects_after and all(u.transform == transform for u in us.values()):
            return  # no fewer objects and nothing to re-transform: nothing to gain
        out.append(Batch(lids, tuple(us.values()), sum(by_id[lid].entries for lid in lids),
                         sum(by_id[lid].size for lid in lids), sum(u.bytes for u in us.values()), after,
                         objects_after, transform))

    for g in groups:
        # small objects, or objects to re-transform (written with another transform than the policy's)
        small = bool(g) and all(units[u].bytes < min_object_size or units[u].transform != transform
                                for lid in g for u in of_ledger[lid])
        if small:
            run.append(g)
            continue
        if run:
            flush_run()
            run = []
    if run:
        flush_run()
    return out


# -- cost -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CostModel:
    """Object-store prices (defaults: S3 Standard, us-east-1) and how often the store is listed."""

    gb_month: float = 0.023  # storage, per GB-month
    put_per_1000: float = 0.005  # PUT, COPY, POST, LIST requests
    get_per_1000: float = 0.0004  # GET and other requests
    listings_per_month: int = 30  # full listings (orphan reconciliation runs) a month

    def validate(self) -> CostModel:
        for f in ("gb_month", "put_per_1000", "get_per_1000", "listings_per_month"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int | float) or v < 0 or v != v:
                raise ValidationError(f"price {f} must be a non-negative number, got {v!r}")
        return self

    def estimate(self, objects_before: int, objects_after: int, bytes_before: int, bytes_after: int,
                 reads_per_object_month: float = 0.0) -> dict[str, float]:
        """Monthly cost change (negative: a saving) and the one-time cost of compacting. Storage by GB;
        listings: one LIST request per 1,000 keys per listing; reads: GETs of whole objects (an object's
        index and data) when ``reads_per_object_month`` is given. One-time: the old objects read (index
        + a GET per 8 MiB), the new ones written (a PUT per 5 MiB part, the completion, the index)."""
        gb = 1024 ** 3
        storage = (bytes_after - bytes_before) / gb * self.gb_month
        listing = (math.ceil(objects_after / 1000) - math.ceil(objects_before / 1000)) \
            * self.listings_per_month * self.put_per_1000 / 1000
        reads = (objects_after - objects_before) * reads_per_object_month * self.get_per_1000 / 1000
        gets = objects_before + math.ceil(bytes_before / (8 * 1024 * 1024))
        puts = math.ceil(bytes_after / S3_MIN_PART_SIZE) + objects_after
        once = gets * self.get_per_1000 / 1000 + puts * self.put_per_1000 / 1000
        return {"storage_month": round(storage, 6), "listing_month": round(listing, 6),
                "reads_month": round(reads, 6), "total_month": round(storage + listing + reads, 6),
                "one_time": round(once, 6)}




# -- repair of damaged segments -------------------------------------------------------------------


def repair_batch(info: pb.ManagedLedgerInfo, damaged: set[str], transform: str = "none") -> Batch | str:
    """The batch that rewrites segments ``damaged`` (uuids) of the topic record ``info``: every ledger
    holding a piece of one, and every ledger sharing an object with those (a segment spans ledgers, a
    ledger spans segments), all of it written again into new segment(s) from the hot copies. A reason
    (str) when that cannot be done by this protocol: a ledger in flight or not sealed (the open ledger's
    segments are the streaming offload's), or none referencing the segments any more."""
    lis = list(info.ledgerInfo)
    members: dict[str, set[int]] = {}
    for li in lis:
        for u in referenced_uuids(li):
            members.setdefault(u, set()).add(li.ledgerId)
    todo, seen_u, lids = list(damaged), set(), set()
    while todo:  # the closure: ledgers of the damaged objects, the objects of those ledgers, ...
        u = todo.pop()
        if u in seen_u:
            continue
        seen_u.add(u)
        for lid in members.get(u, ()):
            if lid not in lids:
                lids.add(lid)
                todo.extend(referenced_uuids(next(li for li in lis if li.ledgerId == lid)))
    if not lids:
        return "no ledger references the damaged segment(s) any more"
    chosen = [li for li in lis if li.ledgerId in lids]
    blocked = [li.ledgerId for li in chosen if not repackable(li)]
    if blocked:
        return (f"ledger(s) {', '.join(map(str, blocked))} are not sealed and fully offloaded with nothing in "
                "flight (an open ledger's segments are rewritten by its streaming offload)")
    units, _ = _units(chosen)
    after = sum(compacted_bytes(li.entries, li.size) for li in chosen)
    return Batch(tuple(li.ledgerId for li in chosen), tuple(units.values()), sum(li.entries for li in chosen),
                 sum(li.size for li in chosen), sum(u.bytes for u in units.values()), after, 1, transform)


def compactor_for(ws: Workspace, policy: OffloadPolicy, *, clock_ms: Callable[[], int],
                  on_step: Callable[[str, str], None] | None = None,
                  progress: Callable[[str, int, int], None] | None = None) -> Compactor:
    """A Compactor writing into the store the policy names, reading old objects wherever they lie."""
    segments = SegmentOffloader(ws.offloader_for_policy(policy), block_size=BLOCK_SIZE)

    def open_copy(li, topic: str):
        return open_offloaded(li, ws.offloader, topic, ws.offloader_for_driver)

    def planner(info, block_size: int) -> list[Batch]:
        return plan_topic(info, min_object_size=policy.compaction_min_object_size,
                          target_size=policy.compaction_target_size, block_size=block_size,
                          transform=policy.transform)

    return Compactor(ws.ml, segments, open_copy, planner=planner, deletion_log=ws.deletion_log, leases=ws.leases,
                     clock_ms=clock_ms,
                     min_object_size=policy.compaction_min_object_size, target_size=policy.compaction_target_size,
                     delete_delay_ms=policy.compaction_delete_delay_ms, transform=policy.transform,
                     on_step=on_step, progress=progress)


class _HotCopy:
    """A ledger's hot copy read as a copy handle: the source a segment repair rewrites from (every frame
    CRC-checked as the hot tier reads it)."""

    requests = bytes_fetched = index_bytes = 0

    def __init__(self, h: Any) -> None:
        self._h = h

    def object_handles(self) -> list:
        return []

    def read_batch(self, first: int, last: int):
        return self._h.read_batch(first, last)

    def close(self) -> None:
        self._h.close()


def repair_segments(ws: Workspace, policy: OffloadPolicy, topic: TopicName, damaged: set[str], *,
                    clock_ms: Callable[[], int]) -> CompactionResult | str:
    """Rewrite damaged segments (uuids) of ``topic`` from the hot copies of every ledger they hold (and
    of the ledgers sharing objects with those), through the compaction executor's protocol: new
    segment(s) written and verified, the damaged objects recorded for deletion (reason
    ``scrub-repair``), one compare-and-set switching the ledgers over. The caller holds the topic's
    lease. A reason (str) when it cannot be done; then nothing was written."""
    info, _ = ws.ml.get_topic(topic)
    batch = repair_batch(info, damaged, policy.transform)
    if isinstance(batch, str):
        return batch
    gone = []
    for lid in batch.ledgers:
        try:
            ws.hot.open_ledger(lid).close()
        except HotLedgerNotFoundError:
            gone.append(lid)
    if gone:
        return f"no hot copy of ledger(s) {', '.join(map(str, gone))} to rewrite the segment(s) from"
    c = compactor_for(ws, policy, clock_ms=clock_ms)
    c.open_copy = lambda li, _topic: _HotCopy(ws.hot.open_ledger(li.ledgerId))
    c.reason = Reason.SCRUB_REPAIR
    return c.compact_batch(topic, batch)
