# ruff: noqa: E402
"""Querying the archive with Spark SQL through format("tiered"): five queries, notebook style.

Cells are separated by ``# %%`` (VS Code, Jupytext and PyCharm run them one by one); as a script:

    .venv/bin/python docs/query_examples.py              # makes a small workspace in a temp dir
    .venv/bin/python docs/query_examples.py WORKSPACE    # or queries yours (namespace acme/audit: --namespace)

The small workspace: `tiered init`, `tiered generate` of one namespace of keyed messages (3 topics x 20
ledgers, one every 5 minutes) and `tiered offload --keep-bytes 512K`: the older ledgers offloaded, the newest
left in the hot tier only, so the queries read across tiers (column ``tier``).
"""

# %% setup: a workspace, a SparkSession (local[2]) and the data source
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("workspace", nargs="?", help="a workspace (default: a new small one in a temp dir)")
ap.add_argument("--namespace", default="acme/audit")
args, _ = ap.parse_known_args()  # parse_known_args: a notebook kernel passes its own arguments
NS = args.namespace


def tiered(*a: str, cwd: str) -> None:
    subprocess.run([sys.executable, "-m", "tieredcore.cli.main", *a], cwd=cwd, check=True,
                   stdout=subprocess.DEVNULL, env=dict(os.environ, TIERED_NO_PROGRESS="1"))


SCRATCH = None  # the temp dir made here, removed in the last cell
if args.workspace:
    WS = str(Path(args.workspace).resolve())
else:
    SCRATCH = tempfile.mkdtemp(prefix="query-examples-")
    WS = f"{SCRATCH}/ws"
    tiered("init", WS, cwd=str(ROOT))
    tiered("generate", "--namespace", NS, "--topics", "3", "--ledgers", "20", "--entries", "500",
           "--entry-size", "16-512", "--batch", "0", "--keys", "20", "--ledger-interval", "300", cwd=WS)
    tiered("offload", "--namespace", NS, "--keep-bytes", "512K", cwd=WS)
CONFIG = f"{WS}/tiered.toml"
TOPIC = f"persistent://{NS}/topic-0000"

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # Spark's Python workers: this interpreter
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
from pyspark.sql import SparkSession

from spark_jobs.datasource import register, topic_view

spark = (SparkSession.builder.master("local[2]").appName("query-examples")
         .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
         .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.sql.shuffle.partitions", "2").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
register(spark)  # format("tiered"), with filter pushdown
print(f"workspace {WS}, namespace {NS}")

# %% 1. messages per key per hour, across tiers
# a view over every topic of the namespace, made with SQL: CREATE TEMPORARY VIEW ... USING tiered OPTIONS
spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW msgs USING tiered OPTIONS (config '{CONFIG}', namespace '{NS}')")
per_hour = spark.sql("""
    SELECT key, date_trunc('hour', publish_time) AS hour,
           count_if(tier = 'hot') AS hot, count_if(tier <> 'hot') AS offloaded, count(*) AS messages
    FROM msgs GROUP BY key, hour ORDER BY key, hour""")
print("== result 1: messages per key per hour, across tiers")
per_hour.show(6, truncate=False)
print(f"{per_hour.count()} (key, hour) groups; messages per tier:",
      {r.tier: r.n for r in spark.sql("SELECT tier, count(*) AS n FROM msgs GROUP BY tier").collect()})

# %% 2. a publish-time range: only the ledgers it needs are read
# cell 1 read every part whole, which recorded each part's publish-time range; a range inside one ledger
# now plans that ledger alone. The plan and the GETs, from the library the data source runs on:
from tieredcore.cold.requests import count_requests
from tieredcore.config import Config
from tieredcore.names import TopicName
from tieredcore.query import stats
from tieredcore.query.scan import Range, ScanFilter, plan_scan, read_part
from tieredcore.workspace import Workspace

with Workspace(Config.load(CONFIG)) as ws:
    known = sorted((int(k.split(":")[0]), lo, hi)
                   for k, (lo, hi, _) in stats.load(ws.metadata, TopicName.parse(TOPIC)).items())
    lid, lo, hi = known[len(known) // 2]
    lo, hi = lo + (hi - lo) // 4, hi - (hi - lo) // 4  # well inside ledger `lid`
    filt = ScanFilter(publish=Range(lo, hi))
    plan = plan_scan(ws, [TopicName.parse(TOPIC)], filt)
    with count_requests() as counts:
        read_rows = sum(b.num_rows for p in plan.parts for b in read_part(ws, p, filt=filt, record_stats=False))
topic_view(spark, "t0", config=CONFIG, topic=TOPIC)
r = spark.sql(f"""SELECT count(*) AS n, collect_set(ledger_id) AS ledgers FROM t0
                  WHERE publish_time BETWEEN timestamp_millis({lo}) AND timestamp_millis({hi})""").first()
print(f"== result 2: publish-time range inside ledger {lid} of {TOPIC}")
print(f"planned parts {len(plan.parts)}, pruned parts {plan.pruned} ({plan.bytes:,} bytes planned, "
      f"{plan.pruned_bytes:,} skipped); object-store GETs {counts.total()['GET']}; "
      f"rows {r.n} (read_part: {read_rows}) from ledgers {sorted(r.ledgers)}")

# %% 3. the latest value per key
latest = spark.sql("""
    SELECT key, max(publish_time) AS latest, max_by(concat(ledger_id, ':', entry_id), publish_time) AS position,
           max_by(substr(hex(payload), 1, 16), publish_time) AS payload_hex
    FROM msgs WHERE key IS NOT NULL GROUP BY key ORDER BY key""")
print("== result 3: the latest value per key")
latest.show(5, truncate=False)

# %% 4. the raw entries (entries=raw): stored entry sizes per ledger and tier
raw = (spark.read.format("tiered").option("config", CONFIG).option("topic", TOPIC)
       .option("entries", "raw").load())
raw.createOrReplaceTempView("raw_entries")
sizes = spark.sql("""
    SELECT ledger_id, tier, count(*) AS entries, sum(length(entry)) AS bytes, max(length(entry)) AS largest
    FROM raw_entries GROUP BY ledger_id, tier ORDER BY ledger_id""")
print("== result 4: raw entry sizes per ledger and tier")
sizes.show(5)
print("per tier:", {t.tier: t.bytes for t in spark.sql(
    "SELECT tier, sum(length(entry)) AS bytes FROM raw_entries GROUP BY tier").collect()})

# %% 5. message properties, exploded
props = spark.sql("""
    SELECT k AS property, count(*) AS messages, count(DISTINCT v) AS distinct_values
    FROM msgs LATERAL VIEW explode(properties) p AS k, v GROUP BY k ORDER BY k""")
print("== result 5: properties (explode(properties))")
props.show(truncate=False)

# %% done
spark.stop()
if SCRATCH:
    shutil.rmtree(SCRATCH, ignore_errors=True)
