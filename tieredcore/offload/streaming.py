"""Streaming offload (PIP-76, docs/metadata.md "Streaming offload"): a topic's entries after its last
offloaded position — the open ledger's up to its last confirmed entry included — cut into segments.

Planning. The pending entries are, per ledger in topic order, those after the ledger's V1 copy (a
complete one means nothing pending) or after its completed segments. They are laid out as streaming
blocks and cut into segments of at most ``max_segment_size`` data-object bytes (at least one block). Every
segment that is full (one more block would not fit) is written; the last, smaller one (the tail) only
when ``rollover`` has passed since its oldest entry was written, on the run's logical clock, or when
the caller forces it. The oldest entry's write time is bounded from below by the topic's *watermark*
(``tiered.streamingWatermark`` = ``ledger:entry:ms``: at ``ms`` every entry up to that position was
already offloaded, so later entries were written after ``ms``) and by the hot ledger's creation time. A
run that leaves nothing pending advances the watermark; re-running for the same logical time offloads
nothing new.

Per segment, the same crash-safety rules as the ledger protocol (tieredcore.offload.managed):

1. CAS: an ``offloadSegment`` entry (uuid, ``complete=false``, assigned time, ``endEntryId``, driver)
   on every ledger the segment covers, only if each ledger is still offloaded exactly up to where the
   plan starts. Segments left incomplete by an earlier attempt (a crash) are removed by the same CAS,
   after a durable ``segment`` pending-deletion record for each (reason ``offload-cleanup``).
2. Write the data object (multipart) then the V2 index (the commit point).
3. CAS ``complete=true`` + offloaded time only if every entry still names our uuid. A conflict or a
   failure sends our own segment to the deletion log (reason ``offload-conflict``); an unknown outcome
   (metadata-store error) deletes and records nothing.
"""

from __future__ import annotations

import logging
import time
import uuid as uuidlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from tieredcore.clock import now_ms
from tieredcore.cold.failures import StoreFailureBudget
from tieredcore.errors import (
    HotLedgerNotFoundError,
    LeaseHeldError,
    StaleHandleError,
    TieredError,
)
from tieredcore.formats.proto import MLDataFormats_pb2 as pb
from tieredcore.formats.segment import LedgerRun, SegmentPlan, plan_segment
from tieredcore.formats.uuids import uuid_to_msb_lsb
from tieredcore.hot.tier import HotTier
from tieredcore.meta.deletion_log import TYPE_SEGMENT, DeletionLog
from tieredcore.meta.leases import TopicLeases
from tieredcore.meta.managed_ledgers import ManagedLedgerStore, find_ledger
from tieredcore.meta.reasons import Reason
from tieredcore.model import Position, ReadHandle
from tieredcore.names import TopicName
from tieredcore.offload.context import (
    add_segment,
    covered_through,
    driver_dict,
    is_complete,
    is_sealed,
)
from tieredcore.offload.offloader import entry_sizes
from tieredcore.offload.segments import OffloadedSegment, SegmentOffloader, SegmentSource
from tieredcore.offload.transaction import (
    ObjectGroup,
    Refusal,
    TopicTransaction,
    Uncovered,
    drop_incomplete_segments,
    settle,
    stale_segments,
)
from tieredcore.outcomes import Outcome

log = logging.getLogger(__name__)

WATERMARK_KEY = "tiered.streamingWatermark"
MAX_SEGMENTS_PER_RUN = 64  # a backlog larger than this many segments is worked off over several runs



@dataclass
class SegmentOffloadResult:
    topic: str
    outcome: str
    uuid: str | None = None
    ledgers: list[tuple[int, int, int]] = field(default_factory=list)  # (ledger, first entry, last entry)
    bytes: int = 0
    blocks: int = 0
    entries: int = 0
    payload_bytes: int = 0
    seconds: float = 0.0
    error: str | None = None
    error_type: str = ""

    @property
    def ok(self) -> bool:
        return self.outcome in (Outcome.OFFLOADED, Outcome.HELD, Outcome.BUSY)

    @property
    def ledger_id(self) -> int:
        return self.ledgers[0][0] if self.ledgers else -1

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class PlannedSegment:
    ranges: tuple[tuple[int, int, int], ...]  # (ledger, first entry, last entry)
    length: int  # data-object bytes
    full: bool  # one more block would not fit: written whatever the rollover


@dataclass
class StreamingPlan:
    segments: list[PlannedSegment]
    held: PlannedSegment | None = None  # the tail, waiting for its rollover time
    held_since_ms: int = 0  # lower bound of its oldest entry's write time
    lac: Position | None = None  # the topic's last confirmed entry when planned (None: no entries)


def parse_watermark(info: Any) -> tuple[Position, int] | None:
    for kv in info.properties:
        if kv.key == WATERMARK_KEY:
            try:
                lid, eid, ms = (int(x) for x in kv.value.split(":"))
            except ValueError:
                return None
            return Position(lid, eid), ms
    return None


def _set_watermark(info: Any, pos: Position, ms: int) -> None:
    keep = [kv for kv in info.properties if kv.key != WATERMARK_KEY]
    del info.properties[:]
    info.properties.extend(keep)
    info.properties.add(key=WATERMARK_KEY, value=f"{pos.ledger_id}:{pos.entry_id}:{ms}")


class StreamingOffloader:
    """Runs the segment protocol for the topics of one namespace over one hot tier and one store."""

    def __init__(
        self,
        ml: ManagedLedgerStore,
        hot: HotTier,
        segments: SegmentOffloader,
        *,
        clock_ms: Callable[[], int] = now_ms,
        uuid_factory: Callable[[], uuidlib.UUID] = uuidlib.uuid4,
        deletion_log: DeletionLog | None = None,
        leases: TopicLeases | None = None,
        progress: Callable[[str, int, int, int], None] | None = None,
        on_step: Callable[[str, str], None] | None = None,
    ) -> None:
        self.ml = ml
        self.hot = hot
        self.segments = segments
        self.clock_ms = clock_ms
        self.uuid_factory = uuid_factory
        self.deletion_log = deletion_log if deletion_log is not None else DeletionLog(ml.store)
        self.leases = leases
        self.progress = progress  # (topic, first ledger, bytes done, bytes total)
        # (step, segment uuid) once a step of the protocol is done: "assigned" (step-1 CAS landed),
        # "written" (data object and index written), "completed" (step-3 CAS landed). For crash tests.
        self.on_step = on_step

    def _driver(self) -> pb.OffloadDriverMetadata:
        return self.segments.off.location.driver_metadata()

    # -- planning -----------------------------------------------------------------------------

    def plan(self, topic: str | TopicName, *, max_segment_size: int, rollover_ms: int, as_of_ms: int,
             force_tail: bool = False, upto: Position | None = None) -> StreamingPlan:
        """What a run at ``as_of_ms`` writes (see the module docstring). ``upto``: offload nothing after
        this position (a manual offload); ``force_tail``: close the tail whatever its age."""
        t = topic if isinstance(topic, TopicName) else TopicName.parse(topic)
        info, _ = self.ml.get_topic(t)
        runs: list[LedgerRun] = []
        lac: Position | None = None
        tail_ctime: dict[int, int] = {}
        budget = max_segment_size * MAX_SEGMENTS_PER_RUN  # payload bytes planned per run (memory bound)
        planned = 0
        truncated = False
        for i, li in enumerate(info.ledgerInfo):
            if upto is not None and li.ledgerId > upto.ledger_id:
                break
            open_ledger = i == len(info.ledgerInfo) - 1 and not is_sealed(li)
            if not open_ledger and li.HasField("entries") and (
                    is_complete(li) or covered_through(li) >= li.entries - 1):
                if li.entries > 0:
                    lac = Position(li.ledgerId, li.entries - 1)
                continue  # offloaded already: its hot copy is not even opened
            if truncated:
                continue
            h = self.hot.open_ledger(li.ledgerId)
            try:
                last = h.last_add_confirmed if open_ledger or not li.HasField("entries") else li.entries - 1
                if last >= 0:
                    lac = Position(li.ledgerId, last)
                if upto is not None and li.ledgerId == upto.ledger_id:
                    last = min(last, upto.entry_id)
                first = covered_through(li) + 1
                if last < first or is_complete(li):
                    continue
                sizes = entry_sizes(h, last)
                run = LedgerRun(li.ledgerId, first, list(sizes[first: last + 1]))
                runs.append(run)
                tail_ctime[li.ledgerId] = h.metadata.ctime
                planned += run.payload_bytes
                truncated = planned >= budget
            finally:
                h.close()
        out = StreamingPlan([], lac=lac)
        if not runs:
            return out
        whole = plan_segment(runs, self.segments.block_size)
        cuts = _cut(whole, max_segment_size, self.segments.block_size)
        for seg in cuts[:-1]:
            out.segments.append(seg)
        tail = cuts[-1]
        if truncated:  # more is pending than one run plans: the unfilled last segment continues next run
            if tail.full:
                out.segments.append(tail)
            out.lac = None
            return out
        if tail.full or force_tail:
            out.segments.append(tail)
            return out
        first_lid, first_eid, _ = tail.ranges[0]
        since = tail_ctime.get(first_lid, 0)
        wm = parse_watermark(info)
        if wm is not None and Position(first_lid, first_eid) > wm[0]:
            since = max(since, wm[1])
        if as_of_ms - since >= rollover_ms:
            out.segments.append(tail)
        else:
            out.held, out.held_since_ms = tail, since
        return out

    # -- the protocol -------------------------------------------------------------------------

    def offload_topic(self, topic: str | TopicName, *, max_segment_size: int, rollover_ms: int, as_of_ms: int,
                      force_tail: bool = False, upto: Position | None = None,
                      budget: StoreFailureBudget | None = None) -> list[SegmentOffloadResult]:
        """Plan and write the topic's segments, oldest first, under the topic's lease; a held tail is
        reported as ``held``. Stops at the first segment that does not land (the next ones start where
        it should have ended)."""
        t = topic if isinstance(topic, TopicName) else TopicName.parse(topic)
        name = t.managed_ledger_name
        if self.leases is None:
            return self._offload(t, max_segment_size, rollover_ms, as_of_ms, force_tail, upto, budget)
        try:
            with self.leases.hold(t, "offload"):
                return self._offload(t, max_segment_size, rollover_ms, as_of_ms, force_tail, upto, budget)
        except LeaseHeldError as e:
            return [SegmentOffloadResult(name, Outcome.BUSY, error=str(e))]

    def _offload(self, t: TopicName, max_segment_size: int, rollover_ms: int, as_of_ms: int, force_tail: bool,
                 upto: Position | None, budget: StoreFailureBudget | None) -> list[SegmentOffloadResult]:
        name = t.managed_ledger_name
        try:
            plan = self.plan(t, max_segment_size=max_segment_size, rollover_ms=rollover_ms, as_of_ms=as_of_ms,
                             force_tail=force_tail, upto=upto)
        except TieredError as e:
            return [SegmentOffloadResult(name, Outcome.FAILED, error=f"planning: {type(e).__name__}: {e}",
                                         error_type=type(e).__name__)]
        out: list[SegmentOffloadResult] = []
        for seg in plan.segments:
            if budget is not None and budget.exhausted:
                out.append(SegmentOffloadResult(name, Outcome.ABORTED, ledgers=list(seg.ranges), error=budget.reason))
                continue
            r = self.offload_segment(t, seg.ranges)
            if budget is not None:
                budget.record(r.error_type if not r.ok else "", r.error or "")
            out.append(r)
            if not r.ok:
                return out
        if plan.held is not None:
            out.append(SegmentOffloadResult(
                name, Outcome.HELD, ledgers=list(plan.held.ranges), bytes=plan.held.length,
                error=None))
        elif plan.lac is not None and upto is None:
            self._advance_watermark(t, plan.lac, as_of_ms, rollover_ms)
        return out

    def offload_segment(self, topic: str | TopicName, ranges: Sequence[tuple[int, int, int]]) -> SegmentOffloadResult:
        """Write one segment holding ``ranges`` (ledger, first, last), in topic order."""
        t = topic if isinstance(topic, TopicName) else TopicName.parse(topic)
        started = time.monotonic()
        res = SegmentOffloadResult(t.managed_ledger_name, Outcome.FAILED, ledgers=[tuple(r) for r in ranges])
        new_uuid = str(self.uuid_factory())
        driver = self._driver()
        txn = TopicTransaction(self.ml, self.deletion_log, t, clock_ms=self.clock_ms)
        step = txn.begin(self._assign(txn, ranges, new_uuid, driver), "recording the segment")
        if not settle(res, step):
            return self._finish(res, started)
        res.uuid = new_uuid
        self._step("assigned", new_uuid)
        own = [ObjectGroup(ranges[0][0], TYPE_SEGMENT, new_uuid, driver_dict(driver))]

        # step 2: the objects
        try:
            obj = self._write(t, ranges, new_uuid)
        except (HotLedgerNotFoundError, StaleHandleError) as e:
            res.outcome, res.error = Outcome.CONFLICT, f"hot-tier ledger gone: {e}"
            txn.give_back(own, Reason.OFFLOAD_CONFLICT, unassign=True)
            return self._finish(res, started)
        except Exception as e:
            res.error, res.error_type = f"{type(e).__name__}: {e}", type(e).__name__
            txn.give_back(own, Reason.OFFLOAD_CONFLICT, unassign=True)
            return self._finish(res, started)
        res.bytes, res.blocks, res.entries, res.payload_bytes = obj.data_length, obj.blocks, obj.entries, obj.payload_bytes
        self._step("written", new_uuid)

        # step 3: complete only where our uuid is still assigned
        msb_lsb = uuid_to_msb_lsb(uuidlib.UUID(new_uuid))

        def complete(info) -> bool:
            now = self.clock_ms()
            for lid, _first, _last in ranges:
                li = find_ledger(info, lid)
                seg = None if li is None else next(
                    (s for s in li.offloadContext.offloadSegment if (s.uidMsb, s.uidLsb) == msb_lsb), None)
                if seg is None:
                    raise Refusal(f"segment {new_uuid} is no longer assigned to ledger {lid}")
                seg.complete = True
                seg.offloadedTimestamp = now
            return True

        step = txn.commit(complete, "completing the segment", lambda: txn.give_back(own, Reason.OFFLOAD_CONFLICT))
        if settle(res, step, Outcome.OFFLOADED):
            self._step("completed", new_uuid)
        return self._finish(res, started)

    def _assign(self, txn: TopicTransaction, ranges: Sequence[tuple[int, int, int]], new_uuid: str,
                driver: pb.OffloadDriverMetadata) -> Callable[[Any], bool]:
        """Step 1's mutation: an incomplete ``offloadSegment`` entry naming our uuid on every ledger the
        segment covers, only if each is still offloaded exactly up to where the plan starts. Segments
        left incomplete by an earlier attempt are removed by the same CAS, once covered by a record."""
        msb, lsb = uuid_to_msb_lsb(uuidlib.UUID(new_uuid))
        name = txn.name

        def assign(info) -> bool:
            stale = stale_segments(info, driver_dict(driver))
            missing = [g for g in stale if g.key not in txn.covered]
            if missing:
                raise Uncovered([g.record(name, Reason.OFFLOAD_CLEANUP, self.clock_ms()) for g in missing])
            lis = [(self._still_planned(info, name, lid, first, last), last) for lid, first, last in ranges]
            if stale:
                drop_incomplete_segments(info, {g.uuid for g in stale})
            now = self.clock_ms()
            for li, last in lis:
                add_segment(li, (msb, lsb), last, driver, now)
            return True

        return assign

    @staticmethod
    def _still_planned(info: Any, name: str, lid: int, first: int, last: int) -> Any:
        """The ledger's LedgerInfo if it is still offloaded exactly up to ``first``; else a refusal."""
        li = find_ledger(info, lid)
        if li is None:
            raise Refusal(f"ledger {lid} is not in topic {name} (trimmed?)")
        if is_complete(li):
            raise Refusal(f"ledger {lid} was offloaded meanwhile (ledger mode)")
        if covered_through(li) != first - 1:
            raise Refusal(f"ledger {lid} is now offloaded through entry {covered_through(li)}, "
                          f"the segment starts at {first}")
        if li.HasField("entries") and is_sealed(li) and last > li.entries - 1:
            raise Refusal(f"ledger {lid} holds {li.entries} entries, the segment ends at {last}")
        return li

    def _write(self, t: TopicName, ranges: Sequence[tuple[int, int, int]], new_uuid: str) -> OffloadedSegment:
        """Step 2: the segment's data object then its index, from the hot copies."""
        name = t.managed_ledger_name
        handles: list[ReadHandle] = []
        try:
            info, _ = self.ml.get_topic(t)
            sources = []
            for lid, first, last in ranges:
                h = self.hot.open_ledger(lid)
                handles.append(h)
                li = find_ledger(info, lid)
                sizes = entry_sizes(h, last)
                ts = li.timestamp if li is not None and is_sealed(li) and li.entries - 1 == last else 0
                sources.append(SegmentSource(h, first, last, size_through=sum(sizes[: last + 1]), timestamp=ts))
            cb = None
            if self.progress is not None:
                cb = lambda done, total: self.progress(name, ranges[0][0], done, total)  # noqa: E731
            return self.segments.write(sources, new_uuid, {"managedledgername": name}, progress=cb)
        finally:
            for h in handles:
                h.close()

    # -- helpers ------------------------------------------------------------------------------

    def _step(self, step: str, uuid: str) -> None:
        if self.on_step is not None:
            self.on_step(step, uuid)

    def _advance_watermark(self, t: TopicName, lac: Position, as_of_ms: int, rollover_ms: int) -> None:
        """Everything up to ``lac`` is offloaded at ``as_of_ms``: later entries are younger than that.
        Written only when it moves (or has aged by half a rollover), so idle topics cost few writes."""
        def mutate(info) -> bool:
            wm = parse_watermark(info)
            if wm is not None and (wm[1] >= as_of_ms or (wm[0] == lac and as_of_ms - wm[1] < rollover_ms // 2)):
                return False
            last = info.ledgerInfo[-1] if info.ledgerInfo else None
            if last is None:
                return False
            _set_watermark(info, lac, as_of_ms)
            return True

        try:
            self.ml.update_topic(t, mutate)
        except TieredError as e:  # only makes the next tail close a little early or late
            log.warning("%s: could not advance the streaming watermark: %s", t.managed_ledger_name, e)

    @staticmethod
    def _finish(res: SegmentOffloadResult, started: float) -> SegmentOffloadResult:
        res.seconds = round(time.monotonic() - started, 6)
        (log.info if res.ok else log.warning)(
            "segment offload %s %s: %s%s", res.topic, res.ledgers, res.outcome, f" ({res.error})" if res.error else "")
        return res


def _cut(plan: SegmentPlan, max_size: int, block_size: int) -> list[PlannedSegment]:
    """Cut the blocks of ``plan`` into segments of at most ``max_size`` bytes (at least one block each)."""
    segs: list[PlannedSegment] = []
    cur: list = []
    size = 0

    def close(full: bool) -> None:
        ranges: list[tuple[int, int, int]] = []
        for b in cur:
            if ranges and ranges[-1][0] == b.ledger_id:
                ranges[-1] = (b.ledger_id, ranges[-1][1], b.last_entry)
            else:
                ranges.append((b.ledger_id, b.first_entry, b.last_entry))
        segs.append(PlannedSegment(tuple(ranges), size, full))

    for b in plan.blocks:
        if cur and size + b.block_size > max_size:
            close(True)
            cur, size = [], 0
        cur.append(b)
        size += b.block_size
    if cur:
        close(size + block_size > max_size)
    return segs


def segment_summary(results: Iterable[SegmentOffloadResult]) -> dict[str, int]:
    done = [r for r in results if r.outcome == Outcome.OFFLOADED]
    return {"segments": len(done), "segment_bytes": sum(r.bytes for r in done),
            "segment_entries": sum(r.entries for r in done)}


__all__ = [
    "WATERMARK_KEY",
    "PlannedSegment",
    "SegmentOffloadResult",
    "StreamingOffloader",
    "StreamingPlan",
    "parse_watermark",
    "segment_summary",
]
