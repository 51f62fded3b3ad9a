"""format("tiered") in a real Spark session (local mode): the rows of every tier and object kind equal the
generator's messages, pushed-down filters prune partitions before anything is read, damaged entries fail
the query with their position or are skipped, bad options fail with one line. The functions under it are
tested without Spark in tests/query/test_scan.py."""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.support.query import damaged_topic, expected_rows, generated_entries, scanned_rows
from tests.support.workspaces import build_workspace, offload, sealed, stream
from tieredcore.config import Config
from tieredcore.errors import ValidationError
from tieredcore.workspace import Workspace

pytestmark = pytest.mark.slow

NS = "acme/orders"
T0, T1 = f"persistent://{NS}/topic-0000", f"persistent://{NS}/topic-0001"


@pytest.fixture(scope="module")
def spark():
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from spark_jobs.datasource import register

    s = (SparkSession.builder.master("local[2]").appName("tiered-datasource-tests")
         .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2").getOrCreate())
    register(s)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    cfg = build_workspace(tmp_path_factory.mktemp("ds"), [NS], topics=2, ledgers=4, entries=30,
                          entry_size="64-700", open_entries=9, messages=True)
    w = Workspace(Config.load(cfg, env={}))
    offload(w, T0, sealed(w, T0)[:2])
    stream(w, T1)
    w.config_path = str(cfg)  # type: ignore[attr-defined]
    yield w
    w.close()


def read(spark, ws, **options):
    r = spark.read.format("tiered").option("config", ws.config_path)
    for k, v in options.items():
        r = r.option(k, str(v))
    return r.load()


def rows_of(df):
    return scanned_rows(r.asDict() for r in df.collect())


def test_a_namespace_reads_back_as_the_generators_messages(spark, ws):
    df = read(spark, ws, namespace=NS)
    assert rows_of(df) == sorted(expected_rows(ws, T0) + expected_rows(ws, T1), key=lambda r: r[:4])
    tiers = {(r["topic"], r["tier"]) for r in df.select("topic", "tier").distinct().collect()}
    assert tiers == {(T0, "offloaded"), (T0, "hot"), (T1, "segments"), (T1, "hot")}


def test_raw_entries(spark, ws):
    df = read(spark, ws, topic=T0, entries="raw")
    assert df.columns == ["topic", "ledger_id", "entry_id", "entry", "tier"]
    got = {(r["ledger_id"], r["entry_id"]): bytes(r["entry"]) for r in df.collect()}
    assert got == generated_entries(ws, T0)


def test_pushed_filters_prune_partitions_and_spark_still_filters(spark, ws):
    # parts of at most 4 KiB: one Spark task each (small parts are packed up to this size)
    full = read(spark, ws, namespace=NS, partitionBytes=4096)
    every = full.rdd.getNumPartitions()
    assert every > 8
    ids = sealed(ws, T0)
    one = full.where(f"topic = '{T0}' AND ledger_id = {ids[1]} AND entry_id <= 2")
    assert one.rdd.getNumPartitions() == 1
    assert rows_of(one) == [r for r in expected_rows(ws, T0) if r[1] == ids[1] and r[2] <= 2]
    # by default a small namespace is packed into few tasks (two per core of the session)
    assert read(spark, ws, namespace=NS).rdd.getNumPartitions() <= 4
    # publish times: the first full read recorded each part's range; a range inside one ledger reads it alone
    full.count()
    want = [r for r in expected_rows(ws, T0) if r[1] == ids[2]]
    lo, hi = min(r[4] for r in want), max(r[4] for r in want)
    q = full.where(full.topic == T0).where(full.publish_time.between(datetime.fromtimestamp(lo / 1000, UTC),
                                                                     datetime.fromtimestamp(hi / 1000, UTC)))
    assert q.rdd.getNumPartitions() < every
    assert rows_of(q) == [r for r in expected_rows(ws, T0) if lo <= r[4] <= hi]
    sql = spark.sql  # the same through SQL on a view
    full.createOrReplaceTempView("orders")
    n = sql(f"SELECT count(*) AS n FROM orders WHERE ledger_id = {ids[0]} AND entry_id < 3").first()["n"]
    assert n == len([r for r in expected_rows(ws, T0) + expected_rows(ws, T1) if r[1] == ids[0] and r[2] < 3])


def test_publish_time_options_filter_rows(spark, ws):
    rows = expected_rows(ws, T0)
    mid = sorted(r[4] for r in rows)[len(rows) // 2]
    df = read(spark, ws, topic=T0, publishTimeFrom=str(mid),
              publishTimeTo=datetime.fromtimestamp((mid + 5000) / 1000, UTC).isoformat())
    assert rows_of(df) == [r for r in rows if mid <= r[4] <= mid + 5000]


def test_a_sql_view_over_the_source(spark, ws):
    spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW t0 USING tiered OPTIONS (config '{ws.config_path}', topic '{T0}')")
    per_key = {r["key"]: r["n"] for r in spark.sql("SELECT key, count(*) AS n FROM t0 GROUP BY key").collect()}
    want: dict = {}
    for r in expected_rows(ws, T0):
        want[r[6]] = want.get(r[6], 0) + 1
    assert per_key == want


def test_topic_view_helper_checks_options_first(spark, ws):
    from spark_jobs.datasource import topic_view

    df = topic_view(spark, "t1", config=ws.config_path, topic=T1)
    assert spark.sql("SELECT count(*) AS n FROM t1").first()["n"] == len(expected_rows(ws, T1)) == df.count()
    with pytest.raises(ValidationError, match=f"topic persistent://{NS}/nope does not exist"):
        topic_view(spark, "bad", config=ws.config_path, topic=f"persistent://{NS}/nope")


@pytest.mark.parametrize(("options", "line"), [
    ({"topic": f"persistent://{NS}/nope"}, f"topic persistent://{NS}/nope does not exist"),
    ({"topic": T0, "publishTimeFrom": "yesterday"}, "option publishTimeFrom: 'yesterday' is neither epoch"),
    ({"topic": T0, "onDamage": "ignore"}, "option onDamage must be one of fail, skip, got 'ignore'"),
    ({"topic": T0, "colour": "red"}, "unknown option(s) of the tiered data source: colour"),
    ({"topic": T0, "config": "/nonexistent/tiered.toml"}, "configuration file /nonexistent/tiered.toml does not exist"),
])
def test_bad_options_fail_with_one_clear_line(spark, ws, options, line):
    from pyspark.errors import PySparkException

    r = spark.read.format("tiered").option("config", ws.config_path)
    for k, v in options.items():
        r = r.option(k, v)
    with pytest.raises(PySparkException) as e:
        r.load().count()
    assert line in str(e.value)


def test_damaged_entries_fail_the_query_or_are_skipped(spark, ws, tmp_path):
    from pyspark.errors import PySparkException

    topic = f"persistent://{NS}/damaged"
    if not ws.ml.exists(topic):
        damaged_topic(ws, topic)
    lid = ws.ml.get_topic(topic)[0].ledgerInfo[0].ledgerId
    with pytest.raises(PySparkException) as e:
        read(spark, ws, topic=topic).collect()
    assert f"{topic}: damaged entry" in str(e.value) and f"{lid}:3" in str(e.value)
    got = [r["entry_id"] for r in read(spark, ws, topic=topic, onDamage="skip").orderBy("entry_id").collect()]
    assert got == [0, 1, 2, 4, 5]


def test_a_read_replica_reads_what_the_source_offloaded(spark, ws, tmp_path):
    """format("tiered") over a read replica of the workspace's bucket (after `tiered replica-sync`): every
    message of every offloaded ledger and segment, equal to the source's rows of the same positions; the
    bucket is the same before and after."""
    from tieredcore.cli.main import main

    bucket = Path(ws.config.store_location.root)
    before = {p: p.read_bytes() for p in sorted(bucket.rglob("*")) if p.is_file()}
    rep = tmp_path / "replica"
    assert main(["init", str(rep), "--replica-of", ws.config.store_url]) == 0
    assert main(["--workspace", str(rep), "replica-sync"]) == 0
    for topic in (T0, T1):
        theirs = read(spark, ws, topic=topic)
        ours = spark.read.format("tiered").option("config", str(rep / "tiered.toml")).option("topic", topic).load()
        got = rows_of(ours)
        assert got and got == rows_of(theirs.where("tier != 'hot'"))
        assert {r["tier"] for r in ours.select("tier").distinct().collect()} <= {"offloaded", "segments"}
    assert {p: p.read_bytes() for p in sorted(bucket.rglob("*")) if p.is_file()} == before
