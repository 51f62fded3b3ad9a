"""Topic compaction on Spark (docs/topic-compaction.md, "On Spark"): one topic's two phases distributed, a
shuffle by key in between, the compacted ledger written by the driver.

1. **Source**: the topic's compacted view up to this run's horizon, read through the ``tiered`` data source
   (``entries=raw``, ``compacted=true``): the previous compacted ledger's entries at the positions they
   stand for, then the entries after its horizon, from every tier. A first run reads the whole topic.
2. **Phase one** (``mapInArrow``): each entry's compaction items (tieredcore.formats.compacted.
   compaction_items, read in C by tieredcore.query.rows.compaction_item_batches: key, position, size), as
   Arrow batches, each with the index of the phase-two group holding its position (step 4's groups are
   planned first).
3. **Shuffle by key**: per key the item at its greatest position (``max`` of the position struct, the group
   riding along); keyless items never enter (the reference reducer ``latest_per_key`` computes the same from
   items in order). Nothing is persisted or counted on its own: the key counts come back with phase two's
   results.
4. **Phase two**: the driver plans the same view as the data source (tieredcore.query.scan.plan_scan, its
   parts packed into groups as the data source packs them, of at most 32 MiB) and knows where each group
   starts (a compacted ledger's piece by its first entry's original position). The keys' latest items are
   range-partitioned by group, so partitions come in position order; each task drops the tombstones
   (counted as keys seen), reads its groups' parts (tieredcore.query.scan.read_part, raw: the data source's
   reader) and rewrites only the entries holding a retained value (tieredcore.formats.compacted.
   rewrite_entry_at with that entry's retained batch indexes; the batch loop in C), framed as compacted
   ledger entries, into a **piece**: a sealed hot ledger of its own, tagged with the topic. A group holding
   no retained value is not read. The topic's entries are never shuffled, only the keys' positions, and no
   entry travels as a task result (Spark keeps large results in the block manager, which loses them under
   memory pressure). ``retain_null_key`` visits every group (its keyless messages stay).
5. **Write**: the driver reads the pieces in group order (position order), a thousand entries at a time, into
   the steps of tieredcore.lifecycle.topic_compaction.write_compacted: hot ledger, V1 object pair, hot copy
   deleted, one compare-and-set; then deletes the pieces. A crash leaves pieces no topic lists: tagged with
   the topic, orphan reconciliation finds them as it finds step 1's ledger.

Executors keep no per-key state of their own: the key map lives in Spark's shuffle (spilled to disk past
``spark.executor.memory``), so memory per executor is bounded by the settings, not by the topic's keys.
"""

from __future__ import annotations

import time
import uuid as uuidlib
from collections.abc import Callable, Iterator
from typing import Any

from tieredcore.config import Config
from tieredcore.formats.compacted import RETAIN_NULL_KEY_DEFAULT, parse_compacted_ledger_entry
from tieredcore.lifecycle.topic_compaction import (
    CompactionResult,
    partition_of,
    plan_compaction,
    write_compacted,
)
from tieredcore.model import Position
from tieredcore.names import TopicName
from tieredcore.query.scan import (
    DEFAULT_PART_BYTES,
    ScanFilter,
    ScanPart,
    compacted_offloader,
    pack_parts,
    pack_target,
    plan_scan,
)
from tieredcore.workspace import Workspace

ITEMS = "key string, ledger_id long, entry_id long, batch_index int, size long, g int"


def group_of(starts: list[tuple[int, int]], lids: Any, eids: Any) -> Any:
    """The index of the phase-two group holding each position (numpy arrays of ledger and entry ids):
    the last group starting at or before it (``starts`` sorted)."""
    import numpy as np

    s_l = np.array([s[0] for s in starts], np.int64)
    s_e = np.array([s[1] for s in starts], np.int64)
    g = np.empty(len(lids), np.int32)
    for u in np.unique(lids):
        at = lids == u
        a, b = int(np.searchsorted(s_l, u, "left")), int(np.searchsorted(s_l, u, "right"))
        g[at] = a + np.searchsorted(s_e[a:b], eids[at], "right") - 1
    if len(g) and int(g.min()) < 0:
        raise RuntimeError("a position before the first group of phase two: the topic's view changed during the run")
    return g


def _items(verify: bool, counts: Any, starts: list[tuple[int, int]]) -> Callable[[Iterator], Iterator]:
    """Phase one over Arrow batches of raw entries (ledger_id, entry_id, entry): their compaction items
    (tieredcore.query.rows.compaction_item_batches: in C where it is built), each with the index of the
    phase-two group holding it."""

    def run(batches: Iterator) -> Iterator:
        import pyarrow as pa
        import pyarrow.compute as pc

        from tieredcore.query.rows import compaction_item_batches

        for b in batches:
            n = 0
            for out in compaction_item_batches(b.column("ledger_id"), b.column("entry_id"), b.column("entry"),
                                               verify):
                n += out.num_rows
                g = group_of(starts, out.column("ledger_id").to_numpy(), out.column("entry_id").to_numpy())
                yield out.append_column("g", pa.array(g, pa.int32()))
            counts.add((n, pc.sum(pc.binary_length(b.column("entry"))).as_py() or 0))

    return run


KEPT = "key string, ledger_id long, entry_id long, batch_index int, size long, g int"
# phase two's groups read at most this much of the topic (a task's unit of work and of retry)
RESULT_BYTES = 32 * 1024 * 1024


def _groups(ws: Workspace, t: TopicName, horizon: Position, part_bytes: int, tasks: int
            ) -> tuple[list[list[ScanPart]], list[tuple[int, int]]]:
    """Phase two's groups of parts (the compacted view up to ``horizon``, packed as the data source packs
    it) and each group's first position (a compacted ledger piece's: its first entry's original one)."""
    plan = plan_scan(ws, [t], ScanFilter(), part_bytes, compacted=True)
    parts = [p for p in plan.parts if p.compacted is not None or Position(p.ledger_id, p.first) <= horizon]
    groups = pack_parts(parts, pack_target(sum(p.size for p in parts), part_bytes, tasks))
    starts = []
    for g in groups:
        p = g[0]
        if p.compacted is None:
            starts.append((p.ledger_id, p.first))
            continue
        h = compacted_offloader(ws, p.compacted).read_offloaded(p.ledger_id, p.compacted.uuid)
        try:
            lid, eid, _part, _e = parse_compacted_ledger_entry(h.read(p.first, p.first)[0].data)
        finally:
            h.close()
        starts.append((lid, eid))
    return groups, starts


def _rewrite(config: Config, topic: TopicName, groups: list[list[ScanPart]], horizon: Position, partition: int,
             retain_null_key: bool, verify: bool) -> Callable[[Iterator], Iterator]:
    """Phase two over Arrow batches of every key's latest item (KEPT) sorted by (g, ledger_id, entry_id):
    the values among them (size > 0) are retained, and each group's compacted entries go to a piece, a
    sealed hot ledger of its own tagged with the topic (a task's result is one row per group: no entry travels
    through Spark's task results). Yields (g, piece ledger id or -1 for none, entries, bytes, keys seen,
    keys retained): each key is in one group, so the sums are the topic's."""

    last = (horizon.ledger_id, horizon.entry_id)

    def run(batches: Iterator) -> Iterator:
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        from tieredcore.formats.compacted import compacted_ledger_entry, rewrite_entry_at
        from tieredcore.query.scan import read_part
        from tieredcore.topic.writer import ledger_custom_metadata

        schema = pa.schema([("g", pa.int32()), ("piece", pa.int64()), ("entries", pa.int64()),
                            ("bytes", pa.int64()), ("keys_seen", pa.int64()), ("keys", pa.int64())])

        def kept_by_entry(rows: list[pa.RecordBatch]) -> dict[tuple[int, int], bytes]:
            """(ledger id, entry id) -> the sorted batch indexes (native int32s) of the values it retains."""
            if not sum(r.num_rows for r in rows):
                return {}
            lid, eid, bi = (np.concatenate([r.column(c).to_numpy(zero_copy_only=False) for r in rows])
                            for c in ("ledger_id", "entry_id", "batch_index"))
            order = np.lexsort((bi, eid, lid))
            lid, eid, bi = lid[order], eid[order], bi[order].astype(np.int32)
            cut = (np.flatnonzero((lid[1:] != lid[:-1]) | (eid[1:] != eid[:-1])) + 1).tolist()
            return {(int(lid[a]), int(eid[a])): bi[a:b].tobytes()
                    for a, b in zip([0, *cut], [*cut, len(lid)], strict=True)}

        def group(ws: Workspace, g: int, rows: list[pa.RecordBatch]) -> pa.RecordBatch:
            seen = sum(r.num_rows for r in rows)
            rows = [r.filter(pc.greater(r.column("size"), 0)) for r in rows]  # tombstones: seen, not kept
            kept = kept_by_entry(rows)
            stats = [seen, sum(r.num_rows for r in rows)]
            if not kept and not retain_null_key:  # nothing to write: the group's parts are not read
                return pa.RecordBatch.from_pylist([dict(zip(schema.names, [g, -1, 0, 0, *stats], strict=True))],
                                                  schema=schema)
            piece = ws.hot.create_ledger(ledger_custom_metadata(topic))
            n = size = 0
            try:
                for part in groups[g]:
                    for b in read_part(ws, part, raw=True):
                        outs = []
                        for lid, eid, d in zip(b.column("ledger_id").to_pylist(), b.column("entry_id").to_pylist(),
                                               b.column("entry"), strict=True):
                            at = kept.get((lid, eid))
                            if (at is None and not retain_null_key) or (lid, eid) > last:
                                continue
                            out = rewrite_entry_at(d.as_buffer(), lid, eid, at, retain_null_key, verify)
                            if out is not None:
                                outs.append(compacted_ledger_entry(out, lid, eid, partition))
                        if outs:
                            piece.append_many(outs)
                            n += len(outs)
                            size += sum(map(len, outs))
            finally:
                piece.close()
            return pa.RecordBatch.from_pylist(
                [dict(zip(schema.names, [g, piece.ledger_id, n, size, *stats], strict=True))], schema=schema)

        with Workspace(config) as ws:
            current, rows = -1, []
            for b in batches:
                gs = b.column("g").to_numpy(zero_copy_only=False)
                cut = (np.flatnonzero(gs[1:] != gs[:-1]) + 1).tolist()
                for a, z in zip([0, *cut], [*cut, len(gs)], strict=True):
                    if z == a:
                        continue
                    g = int(gs[a])
                    if g != current:
                        if current >= 0:
                            yield group(ws, current, rows)
                        current, rows = g, []
                    part = b.slice(a, z - a)
                    rows.append(part.filter(part.column("key").is_valid()))  # retain_null_key's group rows
            if current >= 0:
                yield group(ws, current, rows)

    return run


def _pieces_in_order(ws: Workspace, pieces: list[tuple[int, int]]) -> Iterator[bytes]:
    """The pieces' entries, group after group (``pieces``: (g, ledger id) sorted by g)."""
    for _g, lid in pieces:
        h = ws.hot.open_ledger(lid)
        try:
            for a in range(0, h.last_add_confirmed + 1, 1000):
                for e in h.read(a, min(h.last_add_confirmed, a + 999)):
                    yield bytes(e.data)
        finally:
            h.close()


class _Pairs:
    """An accumulator of (messages, bytes) pairs."""

    @staticmethod
    def param() -> Any:
        from pyspark.accumulators import AccumulatorParam

        class PairParam(AccumulatorParam):
            def zero(self, value: tuple[int, int]) -> tuple[int, int]:
                return (0, 0)

            def addInPlace(self, a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:  # noqa: N802 (Spark's)
                return (a[0] + b[0], a[1] + b[1])

        return PairParam()


def compact_on_spark(spark: Any, config: Config, topic: str | TopicName, *, as_of_ms: int,
                     retain_null_key: bool = RETAIN_NULL_KEY_DEFAULT,
                     uuid_factory: Callable[[], uuidlib.UUID] = uuidlib.uuid4,
                     on_step: Callable[[str], None] | None = None, config_path: str | None = None,
                     verify: bool = True, part_bytes: int = DEFAULT_PART_BYTES) -> CompactionResult:
    """Compact ``topic`` on ``spark`` (module docstring). Raises TopicNotFoundError for an unknown topic and
    TopicCompactionError when there is nothing to compact or the state changed meanwhile (nothing recorded).
    Deletion-log records are stamped with ``as_of_ms`` (the run's logical time). ``config_path`` is the
    configuration file the executors load (None: theirs, $TIERED_CONFIG or ./tiered.toml)."""
    from pyspark.sql import functions as F  # noqa: N812 (Spark's convention)

    from spark_jobs.datasource import FORMAT, register

    started = time.monotonic()
    t = topic if isinstance(topic, TopicName) else TopicName.parse(topic)
    with Workspace(config) as ws:
        reader = ws.reader()
        try:
            plan = plan_compaction(ws, reader, t)
        finally:
            reader.close()
        register(spark)
        opts = {"topic": t.full, "entries": "raw", "compacted": "true"}
        if config_path:
            opts["config"] = str(config_path)
        h = plan.horizon
        groups, starts = _groups(ws, t, h, min(part_bytes, RESULT_BYTES), 2 * spark.sparkContext.defaultParallelism)
        lid, eid = F.col("ledger_id"), F.col("entry_id")
        entries = (spark.read.format(FORMAT).options(**opts).load()
                   .where((lid < h.ledger_id) | ((lid == h.ledger_id) & (eid <= h.entry_id)))
                   .select("ledger_id", "entry_id", "entry"))
        counts = spark.sparkContext.accumulator((0, 0), _Pairs.param())
        items = entries.mapInArrow(_items(verify, counts, starts), ITEMS)
        # per key its latest item (the group rides along: it follows the position)
        latest = (items.where(F.col("key").isNotNull()).groupBy("key")
                  .agg(F.max(F.struct("ledger_id", "entry_id", "batch_index", "size", "g")).alias("m"))
                  .select("key", "m.ledger_id", "m.entry_id", "m.batch_index", "m.size", "m.g"))
        if retain_null_key:  # every group, even one holding no retained value: its keyless messages stay
            latest = latest.unionByName(spark.createDataFrame(
                [(None, -1, -1, -1, -1, g) for g in range(len(groups))], KEPT))
        done = (latest.repartitionByRange(max(1, len(groups)), "g")
                .sortWithinPartitions("g", "ledger_id", "entry_id")
                .mapInArrow(_rewrite(config, t, groups, h, partition_of(t), retain_null_key, verify),
                            "g int, piece long, entries long, bytes long, keys_seen long, keys long")
                .collect())
        # a retried task leaves a piece no row names: tagged with the topic, reconciliation finds it
        pieces = sorted((r.g, r.piece) for r in done if r.piece >= 0)
        messages, read = counts.value
        res = CompactionResult(t.managed_ledger_name, h, -1, "", plan.previous, messages_read=messages,
                               bytes_read=read, keys_seen=sum(r.keys_seen for r in done),
                               keys=sum(r.keys for r in done))
        try:
            write_compacted(ws, plan, _pieces_in_order(ws, pieces), res, clock_ms=lambda: as_of_ms,
                            uuid_factory=uuid_factory, on_step=on_step)
        finally:
            for _g, lid in pieces:  # copied into the compacted ledger (or the run failed): not needed
                ws.hot.delete_ledger(lid)
    res.seconds = time.monotonic() - started
    return res
