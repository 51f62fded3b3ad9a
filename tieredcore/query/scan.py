"""Plan a scan of topics from metadata alone, then read each part as Arrow record batches.

A part is one ledger, or an entry range of a ledger larger than ``part_bytes`` (its size from the topic
record, split into equal entry counts: the offloaded reader then fetches only the blocks of that range).
Plans prune parts before any GET: by topic, by ledger and entry ranges, and by publish time where the
part's statistics are known (tieredcore.query.stats). A part is read through the cross-tier reader
(read priority, fallback to the other copy), so every tier and every object kind (V1 objects, PIP-76
segments, transformed objects) reads the same way. An attached Pulsar cluster's ledgers that only its
BookKeeper holds are not planned (listed in the plan).

Damaged data never becomes rows: an entry whose message checksum or framing is bad ends the read with its
position, or, with ``on_damage="skip"``, is counted (``ReadCounters``) and left out. A copy that cannot be
read at all (and has no other copy) ends the read in both modes: there is nothing to count it by.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tieredcore.errors import MessageFormatError, NotFoundError, ValidationError
from tieredcore.formats.compacted import compacted_out_indexes, parse_compacted_ledger_entry
from tieredcore.formats.messages import BadEntry
from tieredcore.meta.managed_ledgers import ManagedLedgerStore
from tieredcore.model import EntryBatch, Position
from tieredcore.names import NamespaceName, TopicName
from tieredcore.offload.compacted_state import CompactionState, compaction_state
from tieredcore.offload.context import driver_metadata_from_dict, is_offloaded
from tieredcore.offload.offloader import LedgerOffloader
from tieredcore.policy import TIERED_FIRST
from tieredcore.query import rows, stats
from tieredcore.topic.reader import TopicReader
from tieredcore.workspace import Workspace

log = logging.getLogger(__name__)

DEFAULT_PART_BYTES = 128 * 1024 * 1024
COMPACTED_BATCH = 1000  # compacted ledger entries per read
TIER_COMPACTED = "compacted"  # the tier column of rows read from a compacted ledger
ON_DAMAGE = ("fail", "skip")
RAW_VALUES = ("messages", "raw", "keys")


@dataclass(frozen=True)
class Range:
    """Inclusive bounds; None is unbounded."""

    lo: int | None = None
    hi: int | None = None

    def narrow(self, lo: int | None = None, hi: int | None = None) -> Range:
        nlo = self.lo if lo is None else lo if self.lo is None else max(self.lo, lo)
        nhi = self.hi if hi is None else hi if self.hi is None else min(self.hi, hi)
        return Range(nlo, nhi)

    @property
    def empty(self) -> bool:
        return self.lo is not None and self.hi is not None and self.lo > self.hi

    @property
    def bounded(self) -> bool:
        return self.lo is not None or self.hi is not None

    def overlaps(self, lo: int, hi: int) -> bool:
        return not self.empty and (self.hi is None or lo <= self.hi) and (self.lo is None or hi >= self.lo)


@dataclass(frozen=True)
class ScanFilter:
    """What a scan may skip: parts outside these bounds are not read (``publish`` in epoch milliseconds).
    ``topics`` (full names) and ``ledger_in`` restrict to sets when given."""

    topics: frozenset[str] | None = None
    ledger_in: frozenset[int] | None = None
    ledgers: Range = Range()
    entries: Range = Range()
    publish: Range = Range()

    def describe(self) -> str:
        out = []
        if self.topics is not None:
            out.append(f"topic in {sorted(self.topics)}")
        if self.ledger_in is not None:
            out.append(f"ledger_id in {sorted(self.ledger_in)}")
        for name, r in (("ledger_id", self.ledgers), ("entry_id", self.entries), ("publish_time ms", self.publish)):
            if r.bounded:
                out.append(f"{name} in [{'' if r.lo is None else r.lo}, {'' if r.hi is None else r.hi}]")
        return "; ".join(out) or "none"


# -- filters from a query ----------------------------------------------------------------------------------

PRUNING_COLUMNS = ("topic", "ledger_id", "entry_id", "publish_time")
OPS = ("=", ">", ">=", "<", "<=", "in")


def epoch_us(value: object) -> int:
    """A publish-time bound as microseconds since the epoch: a datetime (naive: UTC), an int (ms)."""
    if isinstance(value, datetime):
        v = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        delta = v - datetime(1970, 1, 1, tzinfo=UTC)
        return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds
    if isinstance(value, int) and not isinstance(value, bool):
        return value * 1000
    raise ValidationError(f"publish_time compared with {value!r}: a timestamp is needed")


def _int(column: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(f"{column} compared with {value!r}: an integer is needed")
    return value


def add_condition(f: ScanFilter, column: str, op: str, value: object) -> ScanFilter | None:
    """``f`` narrowed by ``column op value`` (a conjunct of the query's WHERE), or None when this condition
    cannot prune (Spark evaluates every condition anyway: pruning only has to be safe)."""
    if column not in PRUNING_COLUMNS or op not in OPS:
        return None
    try:
        if column == "topic":
            names = value if op == "in" else (value,) if op == "=" else None
            if names is None or not all(isinstance(x, str) for x in names):
                return None
            full = frozenset(_full_topic(x) for x in names)
            return replace(f, topics=full if f.topics is None else f.topics & full)
        if column == "publish_time":
            if op == "in":
                us = [epoch_us(x) for x in value]  # type: ignore[union-attr]
                return replace(f, publish=f.publish.narrow(_ceil_ms(min(us)), max(us) // 1000)) if us else None
            us = epoch_us(value)
            lo, hi = {"=": (_ceil_ms(us), us // 1000), ">": (us // 1000 + 1, None), ">=": (_ceil_ms(us), None),
                      "<": (None, _ceil_ms(us) - 1), "<=": (None, us // 1000)}[op]
            return replace(f, publish=f.publish.narrow(lo, hi))
        if op == "in":
            vals = [_int(column, x) for x in value]  # type: ignore[union-attr]
            if column == "ledger_id":
                s = frozenset(vals)
                return replace(f, ledger_in=s if f.ledger_in is None else f.ledger_in & s)
            return replace(f, entries=f.entries.narrow(min(vals), max(vals))) if vals else None
        v = _int(column, value)
        lo, hi = {"=": (v, v), ">": (v + 1, None), ">=": (v, None), "<": (None, v - 1), "<=": (None, v)}[op]
        if column == "ledger_id":
            return replace(f, ledgers=f.ledgers.narrow(lo, hi))
        return replace(f, entries=f.entries.narrow(lo, hi))
    except ValidationError:
        return None  # a comparison Spark can make but we cannot read: Spark keeps it


def _ceil_ms(us: int) -> int:
    return -((-us) // 1000)


def _full_topic(name: str) -> str:
    try:
        return TopicName.parse(name).full
    except ValidationError:
        return name  # matches no topic


def parse_time(text: str, what: str) -> int:
    """An option's publish-time bound: epoch milliseconds or ISO 8601 (no zone: UTC) -> epoch ms."""
    t = text.strip()
    if t.lstrip("-").isdigit():
        return int(t)
    try:
        d = datetime.fromisoformat(t.replace("Z", "+00:00"))
    except ValueError:
        raise ValidationError(f"{what}: {text!r} is neither epoch milliseconds nor an ISO 8601 time "
                              "(e.g. 2026-11-28T09:00:00Z)") from None
    return epoch_us(d) // 1000


# -- what to read -------------------------------------------------------------------------------------------


def resolve_topics(ml: ManagedLedgerStore, topic: str | None, namespace: str | None) -> list[TopicName]:
    """The topics a scan names: one topic, or every topic of a namespace (sorted). Unknown names fail."""
    if (topic is None) == (namespace is None):
        raise ValidationError("name exactly one of the options 'topic' (persistent://tenant/ns/topic) and "
                              "'namespace' (tenant/ns)")
    if topic is not None:
        t = TopicName.parse(topic)
        if not ml.exists(t):
            raise ValidationError(f"topic {t.full} does not exist")
        return [t]
    ns = NamespaceName.parse(namespace)  # type: ignore[arg-type]
    topics = sorted(ml.list_topics(ns), key=lambda x: x.full)
    if not topics:
        known = ml.list_namespaces()
        raise ValidationError(f"namespace {ns} has no topics" + ("" if str(ns) in known else
                              f" (known namespaces: {', '.join(known[:10]) or 'none'})"))
    return topics


@dataclass(frozen=True)
class ScanPart:
    topic: str  # full name
    ledger_id: int
    first: int
    last: int
    size: int  # bytes, estimated from the topic record
    # a piece of the topic's compacted ledger (ledger_id is its id, first..last its entries, which carry
    # their original positions); None: a ledger of the topic
    compacted: CompactionState | None = None

    @property
    def key(self) -> str:
        return stats.part_key(self.ledger_id, self.first, self.last)


@dataclass
class ScanPlan:
    parts: list[ScanPart] = field(default_factory=list)
    pruned: int = 0  # parts skipped by the filter before any read
    pruned_bytes: int = 0
    in_bookkeeper: list[str] = field(default_factory=list)  # "topic ledger" only Pulsar's BookKeeper holds

    @property
    def bytes(self) -> int:
        return sum(p.size for p in self.parts)


PACK_MIN = 8 * 1024 * 1024
PACK_SPREAD = 16  # tasks a scan is packed into when the cluster's parallelism is not known


def pack_target(total: int, part_bytes: int, tasks: int = PACK_SPREAD) -> int:
    """Bytes per task when parts are packed together: ``total / tasks`` within [8 MiB, part_bytes] (never
    above ``part_bytes``; a ``part_bytes`` below 8 MiB packs nothing larger than itself)."""
    return max(min(part_bytes, PACK_MIN), min(part_bytes, -(-total // max(1, tasks))))


def pack_parts(parts: list[ScanPart], target: int) -> list[list[ScanPart]]:
    """Consecutive parts grouped into tasks of at most ``target`` bytes (a larger part alone), in plan order:
    a task per small ledger would cost more to start than to read (as Spark packs small files)."""
    out: list[list[ScanPart]] = []
    size = 0
    for p in parts:
        if out and size + p.size <= target:
            out[-1].append(p)
            size += p.size
        else:
            out.append([p])
            size = p.size
    return out


def _ledger_entries(ws: Workspace, li) -> int:
    if li.HasField("entries") and li.entries > 0:
        return li.entries
    if li.HasField("entries") and li.timestamp > 0:
        return 0  # sealed and empty
    try:  # the open ledger: its hot copy says how far it goes
        h = ws.hot.open_ledger(li.ledgerId)
    except NotFoundError:
        return 0
    try:
        return h.last_add_confirmed + 1
    finally:
        h.close()


def compacted_offloader(ws: Workspace, state: CompactionState) -> LedgerOffloader:
    """The offloader that reads a compacted ledger's objects (the store its driver metadata names)."""
    return ws.offloader_for_driver(driver_metadata_from_dict(state.driver)) if state.driver else ws.offloader


def _compacted_parts(ws: Workspace, t: TopicName, state: CompactionState, part_bytes: int) -> list[ScanPart]:
    """The compacted ledger in pieces of about ``part_bytes`` (its size and entry count from its index)."""
    h = compacted_offloader(ws, state).read_offloaded(state.ledger_id, state.uuid)
    try:
        n, size = h.last_add_confirmed + 1, h.index.length
    finally:
        h.close()
    if n <= 0:
        return []
    per = math.ceil(n / max(1, min(n, math.ceil(size / part_bytes))))
    return [ScanPart(t.full, state.ledger_id, first, min(n - 1, first + per - 1),
                     size * (min(n - 1, first + per - 1) - first + 1) // n, state)
            for first in range(0, n, per)]


def plan_scan(ws: Workspace, topics: Iterable[TopicName], filt: ScanFilter = ScanFilter(),
              part_bytes: int = DEFAULT_PART_BYTES, compacted: bool = False) -> ScanPlan:
    """The parts of ``topics``; with ``compacted``, a compacted topic's view (Pulsar's readCompacted): its
    compacted ledger (never pruned by position: its entries carry the positions they stand for; Spark
    applies the conditions to the rows), then its entries after the compaction horizon."""
    if part_bytes < 1:
        raise ValidationError(f"part size must be >= 1 byte, got {part_bytes}")
    plan = ScanPlan()
    attached = ws.attached
    for t in topics:
        if filt.topics is not None and t.full not in filt.topics:
            continue
        info, _ = ws.ml.get_topic(t)
        known = stats.load(ws.metadata, t) if filt.publish.bounded else {}
        live = {li.ledgerId for li in info.ledgerInfo}
        if any(int(k.split(":", 1)[0]) not in live for k in known):  # trimmed ledgers' statistics
            stats.forget(ws.metadata, t, live)
        state = compaction_state(info) if compacted else None
        after = None  # the first position after the compaction horizon
        if state is not None:
            if not state.empty:
                plan.parts.extend(_compacted_parts(ws, t, state, part_bytes))
            after = Position(state.horizon.ledger_id, state.horizon.entry_id + 1)
        for li in info.ledgerInfo:
            lid = li.ledgerId
            if after is not None and lid < after.ledger_id:
                continue
            if not filt.ledgers.overlaps(lid, lid) or (filt.ledger_in is not None and lid not in filt.ledger_in):
                continue
            if attached and not is_offloaded(li):
                plan.in_bookkeeper.append(f"{t.full} {lid}")
                continue
            n = _ledger_entries(ws, li)
            start = after.entry_id if after is not None and lid == after.ledger_id else 0
            if n <= start:
                continue
            size = li.size if li.size > 0 else 0
            size = size * (n - start) // n
            pieces = max(1, min(n - start, math.ceil(size / part_bytes))) if size else 1
            per = math.ceil((n - start) / pieces)
            for first in range(start, n, per):
                last = min(n - 1, first + per - 1)
                part = ScanPart(t.full, lid, first, last, size * (last - first + 1) // (n - start))
                s = known.get(part.key)
                if not filt.entries.overlaps(first, last) or (s is not None and not filt.publish.overlaps(s[0], s[1])):
                    plan.pruned += 1
                    plan.pruned_bytes += part.size
                    continue
                plan.parts.append(part)
    return plan


# -- reading a part -------------------------------------------------------------------------------------------


@dataclass
class ReadCounters:
    entries: int = 0
    messages: int = 0  # decoded (before the publish-time filter)
    rows: int = 0
    damaged: list[BadEntry] = field(default_factory=list)  # skipped with on_damage="skip"
    tiers: dict[str, int] = field(default_factory=dict)  # entries per copy read
    seconds: float = 0.0


def check_options(raw: str, on_damage: str) -> None:
    if raw not in RAW_VALUES:
        raise ValidationError(f"option entries must be one of {', '.join(RAW_VALUES)}, got {raw!r}")
    if on_damage not in ON_DAMAGE:
        raise ValidationError(f"option onDamage must be one of {', '.join(ON_DAMAGE)}, got {on_damage!r}")


def read_part(ws: Workspace, part: ScanPart, *, raw: bool = False, on_damage: str = "fail",
              filt: ScanFilter = ScanFilter(), counters: ReadCounters | None = None,
              reader: TopicReader | None = None, read_priority: str = TIERED_FIRST,
              record_stats: bool = True, keys: bool = False) -> Iterator[pa.RecordBatch]:
    """The rows of one part, a record batch per read of up to the reader's batch of entries. Rows outside
    ``filt.publish`` are dropped here; the publish-time range of the whole part is recorded when every entry
    of it was read (message rows). ``raw``: one row per entry; ``keys``: one per message as topic compaction
    sees it (rows.key_batches; like raw rows, never filtered by publish time)."""
    check_options("keys" if keys else "raw" if raw else "messages", on_damage)
    c = counters if counters is not None else ReadCounters()
    if part.compacted is not None:
        yield from _read_compacted(ws, part, raw, on_damage, filt, c, keys)
        return
    t = TopicName.parse(part.topic)
    first = part.first if filt.entries.lo is None else max(part.first, filt.entries.lo)
    last = part.last if filt.entries.hi is None else min(part.last, filt.entries.hi)
    if first > last:
        return
    whole = (first, last) == (part.first, part.last)
    own = reader is None
    r = reader if reader is not None else ws.reader(read_priority, skip_in_bookkeeper=ws.attached)
    lo = hi = None
    count = 0
    started = time.monotonic()
    try:
        for tier, batch in r.read_tiered_batches(t, Position(part.ledger_id, first), Position(part.ledger_id, last)):
            c.entries += len(batch)
            c.tiers[tier] = c.tiers.get(tier, 0) + len(batch)
            if raw:
                out = rows.entry_batch(part.topic, tier, batch)
                if out.num_rows:
                    c.rows += out.num_rows
                    yield out
                continue
            if keys:
                yield from _key_rows(part, tier, batch, on_damage, c)
                continue
            outs, bad = _decoded(part, on_damage, c,
                                 lambda bad, tier=tier, batch=batch: rows.message_batches(part.topic, tier, batch, bad))
            if bad:
                whole = False  # statistics only from complete parts
            for out in outs:
                c.messages += out.num_rows
                count += out.num_rows
                pt = out.column(4)
                mn, mx = pc.min_max(pt).values()
                if pt.null_count:  # a publish time no timestamp holds: no statistics for this part
                    whole = False
                elif mn.is_valid:
                    mn, mx = mn.value // 1000, mx.value // 1000
                    lo = mn if lo is None else min(lo, mn)
                    hi = mx if hi is None else max(hi, mx)
                if filt.publish.bounded:
                    out = _publish_filter(out, filt.publish)
                if out.num_rows:
                    c.rows += out.num_rows
                    yield out
    finally:
        c.seconds += time.monotonic() - started
        if own:
            r.close()
    if record_stats and not raw and not keys and whole and lo is not None and hi is not None:
        stats.record(ws.metadata, t, {part.key: (lo, hi, count)})


def _decoded(part: ScanPart, on_damage: str, c: ReadCounters,
             decode: Callable[[list[BadEntry] | None], Iterable[pa.RecordBatch]]
             ) -> tuple[list[pa.RecordBatch], list[BadEntry]]:
    """``decode(bad)``'s batches: a damaged entry raised with the part's topic (onDamage=fail), or counted,
    logged and skipped (onDamage=skip; the skipped entries returned)."""
    bad: list[BadEntry] | None = [] if on_damage == "skip" else None
    try:
        outs = list(decode(bad))
    except MessageFormatError as e:
        raise MessageFormatError(f"{part.topic}: damaged entry, no rows returned: {e} "
                                 "(option onDamage=skip counts and skips such entries)",
                                 position=getattr(e, "position", None)) from e
    for b in bad or ():
        c.damaged.append(b)
        log.warning("%s: entry %s skipped (onDamage=skip): %s", part.topic, b.position, b.reason)
    return outs, bad or []


def _key_rows(part: ScanPart, tier: str, batch: EntryBatch, on_damage: str, c: ReadCounters,
              lids: np.ndarray | None = None, eids: np.ndarray | None = None) -> Iterator[pa.RecordBatch]:
    """The keys rows of ``batch`` (rows.key_batches), damaged entries raised or counted as message rows'."""
    outs, _bad = _decoded(part, on_damage, c,
                          lambda bad: rows.key_batches(part.topic, tier, batch, bad, lids=lids, eids=eids))
    for out in outs:
        c.messages += out.num_rows
        c.rows += out.num_rows
        yield out


def _read_compacted(ws: Workspace, part: ScanPart, raw: bool, on_damage: str, filt: ScanFilter,
                    c: ReadCounters, keys: bool = False) -> Iterator[pa.RecordBatch]:
    """The rows of a piece of a compacted ledger, at the positions its entries stand for (tier
    ``compacted``); messages marked ``compacted_out`` are not rows (Pulsar's consumer skips them)."""
    assert part.compacted is not None
    started = time.monotonic()
    h = compacted_offloader(ws, part.compacted).read_offloaded(part.ledger_id, part.compacted.uuid)
    try:
        for a in range(part.first, part.last + 1, COMPACTED_BATCH):
            entries = h.read(a, min(part.last, a + COMPACTED_BATCH - 1))
            lids = np.empty(len(entries), np.int64)
            eids = np.empty(len(entries), np.int64)
            pieces, starts, lengths = [], [], []
            off = 0
            for i, e in enumerate(entries):
                lids[i], eids[i], _partition, data = parse_compacted_ledger_entry(e.data)
                pieces.append(data)
                starts.append(off)
                lengths.append(len(data))
                off += len(data)
            batch = EntryBatch(0, 0, b"".join(pieces), starts, lengths, 0, 0)  # pseudo ids 0..n-1
            c.entries += len(batch)
            c.tiers[TIER_COMPACTED] = c.tiers.get(TIER_COMPACTED, 0) + len(batch)
            if raw:
                yield _at_positions(rows.entry_batch(part.topic, TIER_COMPACTED, batch), lids, eids)
                c.rows += len(batch)
                continue
            if keys:  # compacted_out messages are no items
                yield from _key_rows(part, TIER_COMPACTED, batch, on_damage, c, lids, eids)
                continue
            drop = [(i << 32) | k for i, data in enumerate(pieces)
                    for k in compacted_out_indexes(data, int(lids[i]), int(eids[i]))]
            bad: list[BadEntry] | None = [] if on_damage == "skip" else None
            try:
                outs = list(rows.message_batches(part.topic, TIER_COMPACTED, batch, bad))
            except MessageFormatError as ex:
                pos = getattr(ex, "position", None)
                raise MessageFormatError(f"{part.topic}: damaged entry in compacted ledger {part.ledger_id}, no rows "
                                         f"returned: {ex} (option onDamage=skip counts and skips such entries)",
                                         position=pos) from ex
            if bad:
                c.damaged.extend(bad)
            for out in outs:
                if drop:
                    pseudo = out.column(2).to_numpy()
                    idx = (pseudo << 32) | out.column(3).to_numpy().astype(np.int64)
                    out = out.filter(pa.array(~np.isin(idx, np.array(drop, np.int64))))
                c.messages += out.num_rows
                if filt.publish.bounded:
                    out = _publish_filter(out, filt.publish)
                if out.num_rows:
                    c.rows += out.num_rows
                    yield _at_positions(out, lids, eids)
    finally:
        h.close()
        c.seconds += time.monotonic() - started


def _at_positions(batch: pa.RecordBatch, lids: np.ndarray, eids: np.ndarray) -> pa.RecordBatch:
    """Rows of pseudo entry ids (column 2: an index into ``lids`` / ``eids``) moved to the positions the
    compacted ledger's entries stand for."""
    pseudo = batch.column(2).to_numpy()
    cols = batch.columns
    cols[1] = pa.array(lids[pseudo])
    cols[2] = pa.array(eids[pseudo])
    return pa.RecordBatch.from_arrays(cols, schema=batch.schema)


def _publish_filter(batch: pa.RecordBatch, r: Range) -> pa.RecordBatch:
    col = batch.column(4).cast(pa.int64())
    mask = None
    if r.lo is not None:
        mask = pc.greater_equal(col, r.lo * 1000)
    if r.hi is not None:
        m = pc.less_equal(col, r.hi * 1000 + 999)
        mask = m if mask is None else pc.and_(mask, m)
    return batch.filter(mask)
