"""``spark.read.format("tiered")``: topics of every tier as rows, through Spark 4's Python Data Source API
(docs/query.md). Planning runs on the driver from metadata alone (tieredcore.query.scan.plan_scan);
executors read their parts as Arrow record batches (tieredcore.query.scan.read_part).

    from spark_jobs.datasource import register
    register(spark)   # the format, and filter pushdown (spark.sql.python.filterPushdown.enabled)
    df = (spark.read.format("tiered").option("config", "workspace/tiered.toml")
          .option("topic", "persistent://acme/orders/payments").load())
    spark.sql("SELECT count(*) FROM tiered.`persistent://acme/orders/payments`")

Options: ``config`` (a tiered.toml; default $TIERED_CONFIG or ./tiered.toml), ``topic`` or ``namespace`` (or
the path: a name with ``://`` is a topic, ``tenant/ns`` a namespace), ``entries`` (``messages`` | ``raw`` |
``keys``: one row per message as topic compaction sees it: key, position, size),
``onDamage`` (``fail`` | ``skip``), ``publishTimeFrom`` / ``publishTimeTo`` (epoch ms or ISO 8601, inclusive),
``partitionBytes`` (default 128 MiB), ``readPriority`` (``tiered-storage-first`` | ``bookkeeper-first``),
``compacted`` (``false`` | ``true``: a compacted topic's view, as Pulsar's readCompacted: its compacted ledger,
rows at the positions they stand for, tier ``compacted``, then its messages after the compaction horizon).
"""

from __future__ import annotations

import atexit
import logging
import os
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)

from tieredcore.config import Config
from tieredcore.errors import ValidationError
from tieredcore.policy import READ_PRIORITIES, TIERED_FIRST
from tieredcore.query import rows
from tieredcore.query.scan import (
    DEFAULT_PART_BYTES,
    PACK_SPREAD,
    Range,
    ReadCounters,
    ScanFilter,
    ScanPart,
    add_condition,
    check_options,
    pack_parts,
    pack_target,
    parse_time,
    plan_scan,
    read_part,
    resolve_topics,
)
from tieredcore.workspace import Workspace

log = logging.getLogger(__name__)

FORMAT = "tiered"
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"
_OPS = {EqualTo: "=", GreaterThan: ">", GreaterThanOrEqual: ">=", LessThan: "<", LessThanOrEqual: "<=", In: "in"}


def register(spark: Any) -> None:
    """Make ``format("tiered")`` known to this session, with filter pushdown. The session's parallelism
    goes with it (a subclass made here, pickled by value): small ledgers are packed into two tasks per
    core, as Spark packs small files (a Python task costs ~50-100 ms to start)."""
    spark.conf.set(PUSHDOWN_CONF, "true")
    cores = spark.sparkContext.defaultParallelism
    spark.dataSource.register(type("TieredDataSource", (TieredDataSource,), {"parallelism": cores}))


def topic_view(spark: Any, view: str, *, config: str | None = None, topic: str | None = None,
               namespace: str | None = None, **options: str) -> Any:
    """A temporary view ``view`` over a topic or a namespace (options checked here first: a bad one fails
    with one line before Spark plans anything); returns the DataFrame."""
    opts = {k: str(v) for k, v in options.items()}
    if config is not None:
        opts["config"] = config
    if topic is not None:
        opts["topic"] = topic
    if namespace is not None:
        opts["namespace"] = namespace
    ScanOptions.parse(opts).check()
    register(spark)
    df = spark.read.format(FORMAT).options(**opts).load()
    df.createOrReplaceTempView(view)
    return df


class ScanOptions:
    """The data source's options, checked."""

    def __init__(self, config: str | None, topic: str | None, namespace: str | None, raw: bool,
                 on_damage: str, publish: Range, part_bytes: int, read_priority: str,
                 compacted: bool = False, keys: bool = False) -> None:
        self.config, self.topic, self.namespace = config, topic, namespace
        self.keys = keys
        self.raw, self.on_damage, self.publish = raw, on_damage, publish
        self.part_bytes, self.read_priority, self.compacted = part_bytes, read_priority, compacted

    @classmethod
    def parse(cls, options: Any) -> ScanOptions:
        o = {k.lower(): v for k, v in dict(options).items()}
        known = {"config", "topic", "namespace", "path", "entries", "ondamage", "publishtimefrom",
                 "publishtimeto", "partitionbytes", "readpriority", "compacted"}
        unknown = sorted(set(o) - known)
        if unknown:
            raise ValidationError(f"unknown option(s) of the tiered data source: {', '.join(unknown)} "
                                  f"(known: {', '.join(sorted(known))})")
        topic, namespace = o.get("topic"), o.get("namespace")
        path = o.get("path")
        if path and topic is None and namespace is None:
            if "://" in path:
                topic = path
            else:
                namespace = path
        entries = o.get("entries", "messages")
        on_damage = o.get("ondamage", "fail")
        check_options(entries, on_damage)
        lo = parse_time(o["publishtimefrom"], "option publishTimeFrom") if o.get("publishtimefrom") else None
        hi = parse_time(o["publishtimeto"], "option publishTimeTo") if o.get("publishtimeto") else None
        if lo is not None and hi is not None and lo > hi:
            raise ValidationError(f"option publishTimeFrom ({lo}) is after publishTimeTo ({hi})")
        try:
            part_bytes = int(o.get("partitionbytes", DEFAULT_PART_BYTES))
        except ValueError:
            raise ValidationError(f"option partitionBytes must be an integer, got {o['partitionbytes']!r}") from None
        if part_bytes < 1:
            raise ValidationError(f"option partitionBytes must be >= 1, got {part_bytes}")
        priority = o.get("readpriority", TIERED_FIRST)
        if priority not in READ_PRIORITIES:
            raise ValidationError(f"option readPriority must be one of {', '.join(READ_PRIORITIES)}, got {priority!r}")
        compacted = str(o.get("compacted", "false")).strip().lower()
        if compacted not in ("true", "false"):
            raise ValidationError(f"option compacted must be true or false, got {o['compacted']!r}")
        return cls(o.get("config") or None, topic, namespace, entries == "raw", on_damage, Range(lo, hi),
                   part_bytes, priority, compacted == "true", entries == "keys")

    def load_config(self) -> Config:
        return Config.load(self.config)

    def check(self) -> None:
        """Everything the driver can check before Spark plans: the configuration and the names."""
        with Workspace(self.load_config()) as ws:
            resolve_topics(ws.ml, self.topic, self.namespace)


class TieredDataSource(DataSource):
    parallelism = 0  # the session's default parallelism (register() sets it); 0: not known

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        o = ScanOptions.parse(self.options)
        return rows.spark_ddl(raw=o.raw, keys=o.keys)

    def reader(self, schema: Any) -> DataSourceReader:
        return TieredReader(ScanOptions.parse(self.options), self.parallelism)


class TieredReader(DataSourceReader):
    def __init__(self, opts: ScanOptions, parallelism: int = 0) -> None:
        self.opts = opts
        self.tasks = 2 * parallelism if parallelism > 0 else PACK_SPREAD
        self.filter = ScanFilter(publish=opts.publish)
        with Workspace(opts.load_config()) as ws:  # bad names fail here, at planning, in one line
            self.topics = [t.full for t in resolve_topics(ws.ml, opts.topic, opts.namespace)]

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:  # noqa: N802 (Spark's name)
        """Conditions on topic, ledger_id, entry_id and publish_time prune parts; every condition is handed
        back too, so Spark evaluates it on the rows (pruning only has to be safe)."""
        for f in filters:
            op = _OPS.get(type(f))
            if op is not None and len(f.attribute) == 1:
                value = f.value
                narrowed = add_condition(self.filter, f.attribute[0], op, value)
                if narrowed is not None:
                    self.filter = narrowed
            yield f

    def partitions(self) -> Sequence[InputPartition]:
        from tieredcore.names import TopicName

        with Workspace(self.opts.load_config()) as ws:
            plan = plan_scan(ws, [TopicName.parse(t) for t in self.topics], self.filter, self.opts.part_bytes,
                             compacted=self.opts.compacted)
        if plan.in_bookkeeper:
            log.warning("tiered: %d ledger(s) only Pulsar's BookKeeper holds are not read (first: %s)",
                        len(plan.in_bookkeeper), plan.in_bookkeeper[0])
        tasks = pack_parts(plan.parts, pack_target(plan.bytes, self.opts.part_bytes, self.tasks))
        log.info("tiered: %d part(s) in %d task(s), %d bytes; %d part(s) pruned (%d bytes) by %s", len(plan.parts),
                 len(tasks), plan.bytes, plan.pruned, plan.pruned_bytes, self.filter.describe())
        return [InputPartition(t) for t in tasks]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        parts: list[ScanPart] = partition.value
        ws = _workspace(self.opts)
        for part in parts:
            c = ReadCounters()
            yield from read_part(ws, part, raw=self.opts.raw, on_damage=self.opts.on_damage, filt=self.filter,
                                 counters=c, read_priority=self.opts.read_priority, keys=self.opts.keys)
            if c.damaged:
                print(f"WARNING tiered: {part.topic} ledger {part.ledger_id} entries {part.first}..{part.last}: "
                      f"{len(c.damaged)} damaged entr{'y' if len(c.damaged) == 1 else 'ies'} skipped "
                      f"(first: {c.damaged[0].position}: {c.damaged[0].reason})", flush=True)


# one workspace per Python worker and configuration (workers are reused across tasks)
_workspaces: dict[tuple[str, float], Workspace] = {}


def _workspace(opts: ScanOptions) -> Workspace:
    path = opts.config or os.environ.get("TIERED_CONFIG") or "tiered.toml"
    try:
        key = (os.path.abspath(path), os.path.getmtime(path))
    except OSError:
        key = (path, 0.0)
    ws = _workspaces.get(key)
    if ws is None:
        ws = _workspaces[key] = Workspace(opts.load_config())
    return ws


@atexit.register
def _close_workspaces() -> None:
    for ws in _workspaces.values():
        ws.close()
    _workspaces.clear()
