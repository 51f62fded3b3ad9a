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

import pyarrow as pa

from tieredcore.config import Config
from tieredcore.formats.compacted import RETAIN_NULL_KEY_DEFAULT, parse_compacted_ledger_entry
from tieredcore.lifecycle.topic_compaction import (
    CompactionResult,
    TopicCompactionError,
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

# A position and whether it holds a value, packed into one decimal(38,0) (at most 2**126) so that Spark's
# max per key is a hash aggregate over a fixed-width value (a struct's max sorts every row, twice):
#   ledger id << (33 + E) | entry id << 33 | (batch index + 1) << 1 | (size > 0)
# E, the entry id's bits, is what the horizon's ledger id leaves: min(63, 93 - its bits).
PACKED = "decimal(38,0)"
LEDGER_BITS_MAX = 53


def entry_bits(horizon: Position) -> int:
    """E for a run up to ``horizon`` (every position it reads is at or before it)."""
    bits = max(1, horizon.ledger_id.bit_length())
    if bits > LEDGER_BITS_MAX:
        raise TopicCompactionError(f"ledger ids past 2**{LEDGER_BITS_MAX} (horizon {horizon}) are beyond what topic "
                                   "compaction on Spark packs; compact this topic in one process (tiered compact-topic)")
    return min(63, 93 - bits)


def pack(lids: Any, eids: Any, bis: Any, sizes: Any, e: int) -> pa.Array:
    """Positions (numpy int64s, batch indexes int32s) and sizes as PACKED values (Arrow decimal128)."""
    import numpy as np

    lids, eids = lids.astype(np.int64), eids.astype(np.int64)
    if len(eids) and (int(eids.min()) < 0 or int(eids.max()) >> e or int(lids.min()) < 0):
        raise ValueError(f"a position outside what topic compaction packs (entry ids below 2**{e})")
    u = np.uint64
    low = ((bis.astype(np.int64) + 1).astype(u) << u(1)) | (sizes > 0).astype(u)
    lo = low | ((eids.astype(u) & u((1 << 31) - 1)) << u(33))
    hi = (eids.astype(u) >> u(31)) | (lids.astype(u) << u(e - 31))
    words = np.empty(2 * len(lo), u)
    words[0::2], words[1::2] = lo, hi  # little-endian 128-bit integers, low word first
    return pa.Array.from_buffers(pa.decimal128(38, 0), len(lo), [None, pa.py_buffer(words)])


def unpack(packed: pa.Array, e: int) -> tuple[Any, Any, Any, Any]:
    """(ledger ids, entry ids, batch indexes, holds a value) of PACKED values (no nulls)."""
    import numpy as np

    u = np.uint64
    words = np.frombuffer(packed.buffers()[1], u)[2 * packed.offset : 2 * (packed.offset + len(packed))]
    lo, hi = words[0::2], words[1::2]
    value = (lo & u(1)).astype(bool)
    bis = ((lo >> u(1)) & u((1 << 32) - 1)).astype(np.int64) - 1
    eids = ((lo >> u(33)) | ((hi & u((1 << (e - 31)) - 1)) << u(31))).astype(np.int64)
    lids = (hi >> u(e - 31)).astype(np.int64)
    return lids, eids, bis.astype(np.int32), value


def partition_keys(spark: Any, n: int) -> list[int]:
    """For each of ``n`` partitions a long whose Spark hash partitioning (``repartition(n, col)``: pmod of its
    Murmur3 hash, seed 42) is that partition, found by Spark's own hash: phase two's rows carry their group's
    key, so group g is partition g without a range partitioner (whose sampling computes the key table twice)."""
    from pyspark.sql import functions as F  # noqa: N812 (Spark's convention)

    found: dict[int, int] = {}
    span = max(64, 16 * n)
    start = 0
    while len(found) < n:
        rows = (spark.range(start, start + span).select("id", F.pmod(F.hash("id"), F.lit(n)).alias("p"))
                .groupBy("p").agg(F.min("id").alias("id")).collect())
        for r in rows:
            found.setdefault(int(r.p), int(r.id))
        start += span
    return [found[g] for g in range(n)]


def _keyed_udf(starts: list[tuple[int, int]], e: int) -> Callable[..., pa.Array]:
    """A scalar Arrow UDF's function: each item's phase-two group (group_of) and packed position."""

    def keyed(ledger_ids: pa.Array, entry_ids: pa.Array, batch_indexes: pa.Array, sizes: pa.Array) -> pa.Array:
        lids, eids = ledger_ids.to_numpy(), entry_ids.to_numpy()
        return pa.StructArray.from_arrays(
            [group_of(starts, lids, eids), pack(lids, eids, batch_indexes.to_numpy(), sizes.to_numpy(), e)],
            names=["g", "p"])

    return keyed


def group_of(starts: list[tuple[int, int]], lids: Any, eids: Any) -> Any:
    """The index of the phase-two group holding each position (numpy arrays of ledger and entry ids), as an
    Arrow array: the last group starting at or before it (``starts`` sorted)."""
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
    return pa.array(g, pa.int32())


KEPT = f"key string, p {PACKED}, g int, n long, h long"
DONE_COLUMNS = ("g", "piece", "entries", "bytes", "keys_seen", "keys", "messages", "bytes_read")
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
             retain_null_key: bool, verify: bool, e: int) -> Callable[[Iterator], Iterator]:
    """Phase two over Arrow batches of per-key rows (KEPT: every key's latest item, packed, and its count of
    items; the keyless items' count in a row of its own; a row of no key and no items for every group)
    sorted by (g, p). The values among the keys' latest items (size > 0) are retained: each group's
    entries up to the horizon are read, those holding a retained value rewritten, and the group's compacted
    entries go to a piece, a sealed hot ledger of its own tagged with the topic (a task's result is one row
    per group: no entry travels through Spark's task results). Yields (g, piece ledger id or -1 for none,
    entries, bytes written, keys seen, keys retained, messages read, bytes read): each key's row is in one
    group, so the sums are the topic's."""

    last = (horizon.ledger_id, horizon.entry_id)

    def run(batches: Iterator) -> Iterator:
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        from tieredcore.formats.compacted import compacted_ledger_entry, rewrite_entry_at
        from tieredcore.query.scan import read_part
        from tieredcore.topic.writer import ledger_custom_metadata

        schema = pa.schema([(name, pa.int32() if name == "g" else pa.int64()) for name in DONE_COLUMNS])

        def kept_by_entry(packed: list[pa.Array]) -> tuple[int, dict[tuple[int, int], bytes]]:
            """Keys seen, and (ledger id, entry id) -> the sorted batch indexes (native int32s) of the values
            it retains."""
            if not sum(len(p) for p in packed):
                return 0, {}
            cols = [unpack(p, e) for p in packed]
            lid, eid, bi, value = (np.concatenate([c[i] for c in cols]) for i in range(4))
            seen = len(lid)
            lid, eid, bi = lid[value], eid[value], bi[value]  # tombstones: seen, not kept
            order = np.lexsort((bi, eid, lid))
            lid, eid, bi = lid[order], eid[order], bi[order]
            if not len(lid):
                return seen, {}
            cut = (np.flatnonzero((lid[1:] != lid[:-1]) | (eid[1:] != eid[:-1])) + 1).tolist()
            return seen, {(int(lid[a]), int(eid[a])): bi[a:b].tobytes()
                          for a, b in zip([0, *cut], [*cut, len(lid)], strict=True)}

        def group(ws: Workspace, g: int, rows: list[pa.RecordBatch]) -> pa.RecordBatch:
            messages = sum(pc.sum(r.column("n")).as_py() or 0 for r in rows)
            seen, kept = kept_by_entry([r.filter(r.column("key").is_valid()).column("p") for r in rows])
            piece = None
            n = size = read = 0
            try:
                for part in groups[g]:  # every group is read: the bytes read are the view's
                    for b in read_part(ws, part, raw=True):
                        outs = []
                        for lid, eid, d in zip(b.column("ledger_id").to_pylist(), b.column("entry_id").to_pylist(),
                                               b.column("entry"), strict=True):
                            if (lid, eid) > last:
                                continue
                            buf = d.as_buffer()
                            read += buf.size
                            at = kept.get((lid, eid))
                            if at is None and not retain_null_key:
                                continue
                            out = rewrite_entry_at(buf, lid, eid, at, retain_null_key, verify)
                            if out is not None:
                                outs.append(compacted_ledger_entry(out, lid, eid, partition))
                        if outs:
                            if piece is None:
                                piece = ws.hot.create_ledger(ledger_custom_metadata(topic))
                            piece.append_many(outs)
                            n += len(outs)
                            size += sum(map(len, outs))
            finally:
                if piece is not None:
                    piece.close()
            got = [g, -1 if piece is None else piece.ledger_id, n, size, seen, sum(len(a) // 4 for a in kept.values()),
                   messages, read]
            return pa.RecordBatch.from_pylist([dict(zip(DONE_COLUMNS, got, strict=True))], schema=schema)

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
                    rows.append(b.slice(a, z - a))
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
        opts = {"topic": t.full, "entries": "keys", "compacted": "true"}
        if config_path:
            opts["config"] = str(config_path)
        h = plan.horizon
        groups, starts = _groups(ws, t, h, min(part_bytes, RESULT_BYTES), 2 * spark.sparkContext.defaultParallelism)
        e = entry_bits(h)
        lid, eid = F.col("ledger_id"), F.col("entry_id")
        keyed = F.arrow_udf(_keyed_udf(starts, e), f"struct<g: int, p: {PACKED}>")
        items = (spark.read.format(FORMAT).options(**opts).load()
                 .where((lid < h.ledger_id) | ((lid == h.ledger_id) & (eid <= h.entry_id)))
                 .select("key", keyed(lid, eid, "batch_index", "size").alias("x"))
                 .select("key", "x.g", "x.p"))
        # per key its latest item and its count of items (the keyless items counted in a row of their own,
        # key null); the group of the latest item is the greatest group, as groups follow positions
        latest = (items.groupBy("key").agg(F.max("p").alias("p"), F.max("g").alias("g"), F.count(F.lit(1)).alias("n")))
        # a row for every group: each is read (its bytes counted; under retain_null_key its keyless messages stay)
        hkeys = partition_keys(spark, len(groups))
        latest = latest.unionByName(spark.createDataFrame([(None, None, g, 0) for g in range(len(groups))],
                                                          KEPT.rsplit(",", 1)[0]))
        by_group = F.element_at(F.array(*[F.lit(k) for k in hkeys]), F.col("g") + 1)
        done = (latest.withColumn("h", by_group).repartition(len(groups), "h")
                .sortWithinPartitions("g", "p")
                .mapInArrow(_rewrite(config, t, groups, h, partition_of(t), retain_null_key, verify, e),
                            ", ".join(f"{c} {'int' if c == 'g' else 'long'}" for c in DONE_COLUMNS))
                .collect())
        # a retried task leaves a piece no row names: tagged with the topic, reconciliation finds it
        pieces = sorted((r.g, r.piece) for r in done if r.piece >= 0)
        res = CompactionResult(t.managed_ledger_name, h, -1, "", plan.previous,
                               messages_read=sum(r.messages for r in done), bytes_read=sum(r.bytes_read for r in done),
                               keys_seen=sum(r.keys_seen for r in done), keys=sum(r.keys for r in done))
        try:
            write_compacted(ws, plan, _pieces_in_order(ws, pieces), res, clock_ms=lambda: as_of_ms,
                            uuid_factory=uuid_factory, on_step=on_step)
        finally:
            for _g, lid in pieces:  # copied into the compacted ledger (or the run failed): not needed
                ws.hot.delete_ledger(lid)
    res.seconds = time.monotonic() - started
    return res
