"""Topic compaction on Spark (docs/topic-compaction.md, "On Spark"): one topic's two phases distributed, a
shuffle by key in between, the compacted ledger written by the driver.

1. **Source**: the topic's compacted view up to this run's horizon, read through the ``tiered`` data source
   (``entries=raw``, ``compacted=true``): the previous compacted ledger's entries at the positions they
   stand for, then the entries after its horizon, from every tier. A first run reads the whole topic.
2. **Phase one** (``mapInArrow``): each entry's compaction items (tieredcore.formats.compacted.
   compaction_items: key, position, size), as Arrow batches.
3. **Shuffle by key**: per key the item at its greatest position (``max`` of the position struct); keys whose
   latest item is a tombstone are dropped, keyless items never enter (the reference reducer
   ``latest_per_key`` computes the same from items in order). The retained keys are grouped by the entry
   holding their latest value.
4. **Phase two** (a join on the entry's position, then ``mapInArrow``): each entry holding a retained value is
   rewritten (tieredcore.formats.compacted.rewrite_entry with that entry's keys alone) and framed as a
   compacted ledger entry; ``retain_null_key`` keeps every entry in the join (its keyless messages stay).
5. **Write**: the driver streams the rewritten entries in position order (``toLocalIterator``: one partition
   at a time, so its memory is bounded by a partition, not by the topic) into the steps of
   tieredcore.lifecycle.topic_compaction.write_compacted: hot ledger, V1 object pair, hot copy deleted,
   one compare-and-set.

Executors keep no per-key state of their own: the key map lives in Spark's shuffle (spilled to disk past
``spark.executor.memory``), so memory per executor is bounded by the settings, not by the topic's keys.
"""

from __future__ import annotations

import time
import uuid as uuidlib
from collections.abc import Callable, Iterator
from typing import Any

from tieredcore.config import Config
from tieredcore.formats.compacted import RETAIN_NULL_KEY_DEFAULT
from tieredcore.lifecycle.topic_compaction import (
    CompactionResult,
    partition_of,
    plan_compaction,
    write_compacted,
)
from tieredcore.names import TopicName
from tieredcore.workspace import Workspace

ITEMS = "key string, ledger_id long, entry_id long, batch_index int, size long"
REWRITTEN = "ledger_id long, entry_id long, entry binary"


def _items(verify: bool, counts: Any) -> Callable[[Iterator], Iterator]:
    """Phase one over Arrow batches of raw entries (ledger_id, entry_id, entry)."""

    def run(batches: Iterator) -> Iterator:
        import pyarrow as pa

        from tieredcore.formats.compacted import compaction_items

        schema = pa.schema([("key", pa.string()), ("ledger_id", pa.int64()), ("entry_id", pa.int64()),
                            ("batch_index", pa.int32()), ("size", pa.int64())])
        for b in batches:
            keys, lids, eids, bidx, sizes = [], [], [], [], []
            data = b.column("entry")
            n_bytes = 0
            for lid, eid, d in zip(b.column("ledger_id").to_pylist(), b.column("entry_id").to_pylist(), data,
                                   strict=True):
                buf = d.as_buffer()
                n_bytes += buf.size
                for it in compaction_items(buf, lid, eid, verify):
                    keys.append(it.key)
                    lids.append(lid)
                    eids.append(eid)
                    bidx.append(it.position.batch_index)
                    sizes.append(it.size)
            counts.add((len(keys), n_bytes))
            yield pa.RecordBatch.from_arrays([pa.array(keys, pa.string()), pa.array(lids, pa.int64()),
                                              pa.array(eids, pa.int64()), pa.array(bidx, pa.int32()),
                                              pa.array(sizes, pa.int64())], schema=schema)

    return run


def _rewrite(partition: int, retain_null_key: bool, verify: bool) -> Callable[[Iterator], Iterator]:
    """Phase two over Arrow batches of (ledger_id, entry_id, entry, kept: [(key, batch_index)])."""

    def run(batches: Iterator) -> Iterator:
        import pyarrow as pa

        from tieredcore.formats.compacted import compacted_ledger_entry, rewrite_entry
        from tieredcore.formats.messages import MessageId

        schema = pa.schema([("ledger_id", pa.int64()), ("entry_id", pa.int64()), ("entry", pa.binary())])
        for b in batches:
            lids, eids, outs = [], [], []
            for lid, eid, d, kept in zip(b.column("ledger_id").to_pylist(), b.column("entry_id").to_pylist(),
                                         b.column("entry"), b.column("kept").to_pylist(), strict=True):
                latest = {k["key"]: MessageId(lid, eid, k["batch_index"]) for k in kept or ()}
                out = rewrite_entry(d.as_buffer(), lid, eid, latest, retain_null_key, verify)
                if out is not None:
                    lids.append(lid)
                    eids.append(eid)
                    outs.append(compacted_ledger_entry(out, lid, eid, partition))
            yield pa.RecordBatch.from_arrays([pa.array(lids, pa.int64()), pa.array(eids, pa.int64()),
                                              pa.array(outs, pa.binary())], schema=schema)

    return run


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
                     verify: bool = True) -> CompactionResult:
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
        lid, eid = F.col("ledger_id"), F.col("entry_id")
        entries = (spark.read.format(FORMAT).options(**opts).load()
                   .where((lid < h.ledger_id) | ((lid == h.ledger_id) & (eid <= h.entry_id)))
                   .select("ledger_id", "entry_id", "entry"))
        counts = spark.sparkContext.accumulator((0, 0), _Pairs.param())
        items = entries.mapInArrow(_items(verify, counts), ITEMS)
        latest = (items.where(F.col("key").isNotNull()).groupBy("key")
                  .agg(F.max(F.struct("ledger_id", "entry_id", "batch_index", "size")).alias("m"))
                  .persist())
        try:
            keys_seen = latest.count()
            kept = latest.where(F.col("m.size") > 0).select("key", "m.ledger_id", "m.entry_id", "m.batch_index")
            per_entry = kept.groupBy("ledger_id", "entry_id").agg(
                F.collect_list(F.struct("key", "batch_index")).alias("kept"))
            keys = kept.count()
            joined = entries.join(per_entry, ["ledger_id", "entry_id"], "left" if retain_null_key else "inner")
            rewritten = (joined.select("ledger_id", "entry_id", "entry", "kept")
                         .mapInArrow(_rewrite(partition_of(t), retain_null_key, verify), REWRITTEN)
                         .orderBy("ledger_id", "entry_id"))
            messages, read = counts.value
            res = CompactionResult(t.managed_ledger_name, h, -1, "", plan.previous, messages_read=messages,
                                   bytes_read=read, keys_seen=keys_seen, keys=keys)
            write_compacted(ws, plan, (bytes(r.entry) for r in rewritten.toLocalIterator(prefetchPartitions=True)),
                            res, clock_ms=lambda: as_of_ms, uuid_factory=uuid_factory, on_step=on_step)
        finally:
            latest.unpersist()
    res.seconds = time.monotonic() - started
    return res
