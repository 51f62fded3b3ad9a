"""The demo's Spark SQL over its topics through format("tiered") (scripts/demo.sh calls this near its end).

    python scripts/demo_queries.py WORKSPACE [--namespace acme/audit]

Three queries over one namespace (default acme/audit: keyed messages, some ledgers offloaded, some hot):
  1. messages per key per hour, per tier (the first rows, and how many groups in all);
  2. a publish-time range read that touches only the ledgers it needs: a range inside one ledger of a
     topic, after query 1 recorded every part's publish-time statistics; the plan's parts (planned /
     pruned), the object-store GETs of reading the planned parts in this process, and the Spark query's rows;
  3. the latest message per key (max_by over publish time), through a view made with
     ``CREATE TEMPORARY VIEW ... USING tiered OPTIONS (...)``;
  4. with --iceberg: the topic's exported Iceberg table (`tiered export`), messages per day, read with
     spark.read.parquet over its current snapshot's files (no Iceberg runtime).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def spark_session():
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from spark_jobs.datasource import register

    spark = (SparkSession.builder.master("local[2]").appName("tiered-demo-queries")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def show(rows, columns: list[str], limit: int = 10) -> None:
    """A small fixed-width table of Spark rows."""
    rows = list(rows)
    cells = [[str(r[c]) for c in columns] for r in rows[:limit]]
    widths = [max([len(c)] + [len(x[i]) for x in cells]) for i, c in enumerate(columns)]
    print("  " + "  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    for x in cells:
        print("  " + "  ".join(v.ljust(w) for v, w in zip(x, widths, strict=True)))
    if len(rows) > limit:
        print(f"  ... {len(rows) - limit} more")


def range_in_one_ledger(config: str, topic: str) -> tuple[int, int, int]:
    """(from, to) epoch ms strictly inside one ledger in the middle of the topic, from the recorded
    statistics, and that ledger's id."""
    from tieredcore.config import Config
    from tieredcore.names import TopicName
    from tieredcore.query import stats
    from tieredcore.workspace import Workspace

    with Workspace(Config.load(config)) as ws:
        known = stats.load(ws.metadata, TopicName.parse(topic))
    if not known:
        raise SystemExit(f"demo queries: no publish-time statistics recorded for {topic}")
    per = sorted((int(k.split(":")[0]), lo, hi) for k, (lo, hi, _) in known.items())
    lid, lo, hi = per[len(per) // 2]
    q = (hi - lo) // 4
    return lo + q, hi - q, lid


def planned_read(config: str, topic: str, lo: int, hi: int) -> dict:
    """The plan of a publish-time range and the GETs of reading its parts (read_part, this process)."""
    from tieredcore.cold.requests import count_requests
    from tieredcore.config import Config
    from tieredcore.names import TopicName
    from tieredcore.query.scan import Range, ScanFilter, plan_scan, read_part
    from tieredcore.workspace import Workspace

    filt = ScanFilter(publish=Range(lo, hi))
    with Workspace(Config.load(config)) as ws:
        plan = plan_scan(ws, [TopicName.parse(topic)], filt)
        rows = 0
        with count_requests() as counts:
            for part in plan.parts:
                rows += sum(b.num_rows for b in read_part(ws, part, filt=filt, record_stats=False))
    return {"parts": len(plan.parts), "pruned": plan.pruned, "bytes": plan.bytes, "pruned_bytes": plan.pruned_bytes,
            "ledgers": sorted({p.ledger_id for p in plan.parts}), "gets": counts.total()["GET"], "rows": rows}


def iceberg_query(spark, config: str, topic: str) -> None:
    """4. the topic's Iceberg table (`tiered export` wrote it) read by plain Spark, without an Iceberg
    runtime: spark.read.parquet over the current snapshot's data files (current_files.json), its rows
    checked against the catalog's own count."""
    from tieredcore.config import Config
    from tieredcore.lifecycle.export import current_files, load_settings, open_catalog, table_ident
    from tieredcore.names import TopicName
    from tieredcore.workspace import Workspace

    cfg = Config.load(config)
    t = TopicName.parse(topic)
    with Workspace(cfg) as ws:
        ident = table_ident(t, load_settings(ws, f"{t.tenant}/{t.namespace}").layout)
    catalog = open_catalog(cfg)
    table = catalog.load_table(ident)
    files = current_files(catalog, ident)
    if not files:
        raise SystemExit(f"demo queries: no exported table {'.'.join(ident)} (run `tiered export` first)")
    print(f"\n-- 4. the Iceberg table {'.'.join(ident)} ({len(files)} data file(s), snapshot "
          f"{table.current_snapshot().snapshot_id}) read with spark.read.parquet(current_files.json)")
    spark.read.parquet(*files).createOrReplaceTempView("exported")
    rows = spark.sql("""
        SELECT date_format(publish_time, 'yyyy-MM-dd') AS day, count(*) AS messages,
               count(DISTINCT key) AS keys, min(ledger_id) AS first_ledger, max(ledger_id) AS last_ledger
        FROM exported GROUP BY day ORDER BY day""").collect()
    show(rows, ["day", "messages", "keys", "first_ledger", "last_ledger"])
    n = sum(r.messages for r in rows)
    want = int(table.current_snapshot().summary["total-records"])
    print(f"  {n:,} rows; the Iceberg snapshot says {want:,}")
    if n != want:
        raise SystemExit(f"demo queries: the table's files hold {n} rows, its snapshot {want}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workspace")
    ap.add_argument("--namespace", default="acme/audit")
    ap.add_argument("--iceberg", action="store_true",
                    help="also query the topic's exported Iceberg table (after `tiered export`)")
    a = ap.parse_args(argv)
    config = str(Path(a.workspace).resolve() / "tiered.toml")
    if not Path(config).is_file():
        ap.error(f"no tiered.toml in {a.workspace}")
    topic = f"persistent://{a.namespace}/topic-0000"

    from spark_jobs.datasource import topic_view

    spark = spark_session()
    try:
        topic_view(spark, "ns", config=config, namespace=a.namespace)
        print(f"-- 1. messages per key per hour, per tier ({a.namespace}, every topic)")
        rows = spark.sql("""
            SELECT key, date_format(date_trunc('hour', publish_time), 'yyyy-MM-dd HH:00') AS hour, tier,
                   count(*) AS messages
            FROM ns GROUP BY key, hour, tier ORDER BY key, hour, tier""").collect()
        show(rows, ["key", "hour", "tier", "messages"], limit=8)
        tiers = spark.sql("SELECT tier, count(*) AS messages FROM ns GROUP BY tier ORDER BY tier").collect()
        print(f"  {len(rows)} groups; messages per tier: "
              + ", ".join(f"{r.tier} {r.messages:,}" for r in tiers))

        lo, hi, lid = range_in_one_ledger(config, topic)
        print(f"\n-- 2. a publish-time range inside ledger {lid} of {topic}")
        p = planned_read(config, topic, lo, hi)
        topic_view(spark, "t0", config=config, topic=topic)
        r = spark.sql(f"""
            SELECT count(*) AS n, min(publish_time) AS first, max(publish_time) AS last, collect_set(ledger_id) AS l
            FROM t0 WHERE publish_time BETWEEN timestamp_millis({lo}) AND timestamp_millis({hi})""").first()
        print(f"  plan: {p['parts']} part(s) planned (ledgers {p['ledgers']}), {p['pruned']} pruned by the "
              f"publish-time statistics; {p['bytes']:,} bytes planned, {p['pruned_bytes']:,} skipped")
        print(f"  read_part over the planned parts: {p['rows']:,} rows, {p['gets']} object-store GET(s)")
        print(f"  Spark: {r.n:,} rows from {r.first} to {r.last}, ledgers {sorted(r.l)}")
        if r.n != p["rows"]:
            raise SystemExit(f"demo queries: Spark counted {r.n} rows, the planned read {p['rows']}")

        print(f"\n-- 3. the latest message per key (CREATE TEMPORARY VIEW ... USING tiered, {a.namespace})")
        spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW audit USING tiered "
                  f"OPTIONS (config '{config}', namespace '{a.namespace}')")
        rows = spark.sql("""
            SELECT key, max(publish_time) AS latest,
                   max_by(concat(topic, ' ', ledger_id, ':', entry_id), publish_time) AS position,
                   max_by(length(payload), publish_time) AS payload_bytes
            FROM audit WHERE key IS NOT NULL GROUP BY key ORDER BY key""").collect()
        show(rows, ["key", "latest", "position", "payload_bytes"], limit=5)
        print(f"  {len(rows)} keys")
        if a.iceberg:
            iceberg_query(spark, config, topic)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
