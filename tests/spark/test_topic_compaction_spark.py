"""Topic compaction on Spark (spark_jobs/_topic_shuffle.py, docs/topic-compaction.md "On Spark") in a real
local Spark session: the shuffle by key gives the compacted ledger the one-process reference
(tieredcore.lifecycle.topic_compaction.compact_topic) writes, byte for byte, entry for entry; its view is
the plain dict's (tests/lifecycle/test_topic_compaction.py); a crash after every step of the Spark path
leaves the old state or the new one, and nothing unreferenced after reconcile + drain."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.lifecycle.test_topic_compaction import (
    STEPS,
    TOPIC,
    Producer,
    crash_drill,
    expected_view,
    round_of,
    seen_view,
    state_of_everything,
    write,
)
from tests.support.workspaces import stream
from tieredcore.cli import main as cli
from tieredcore.config import Config
from tieredcore.errors import TopicNotFoundError
from tieredcore.lifecycle.topic_compaction import TopicCompactionError, compact_topic
from tieredcore.topic.writer import TopicWriter
from tieredcore.workspace import Workspace

pytestmark = pytest.mark.slow
AS_OF = 1_800_000_000_000


@pytest.fixture(scope="module")
def spark():
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    s = (SparkSession.builder.master("local[2]").appName("tiered-topic-compaction-tests")
         .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "3").getOrCreate())
    yield s
    s.stop()


def workspace(root: Path) -> Workspace:
    assert cli.main(["init", str(root)]) == 0
    w = Workspace(Config.load(root / "tiered.toml", env={}))
    w.config_path = str(root / "tiered.toml")  # type: ignore[attr-defined]
    return w


@pytest.fixture
def ws(tmp_path: Path) -> Iterator[Workspace]:
    w = workspace(tmp_path / "ws")
    yield w
    w.close()


def on_spark(spark, w: Workspace, **kw):
    from spark_jobs._topic_shuffle import compact_on_spark

    return compact_on_spark(spark, w.config, TOPIC, as_of_ms=AS_OF, config_path=w.config_path, **kw)


def fill(w: Workspace, p: Producer, rounds: range) -> None:
    """Keys in offloaded V1 objects, PIP-76 segments and the hot tier."""
    write(w, [round_of(p, r) for r in rounds[:-1]], offload_first=2)
    stream(w, TOPIC, as_of=10**13)
    write(w, [round_of(p, rounds[-1])])


# one group of parts; and many small ones (phase two's groups, the compacted ledger in pieces)
@pytest.mark.parametrize(("retain_null_key", "part_bytes"), [(False, 1 << 27), (True, 1500)])
def test_the_shuffle_writes_what_the_reference_writes(spark, tmp_path: Path, retain_null_key: bool,
                                                      part_bytes: int) -> None:
    ref, dist = workspace(tmp_path / "ref"), workspace(tmp_path / "spark")
    try:
        for w in (ref, dist):
            fill(w, Producer(), range(5))
        tiers = {tier for tier, _b in dist.reader().read_tiered_batches(TOPIC)}
        assert tiers == {"hot", "offloaded", "segments"}, tiers
        want = compact_topic(ref, TOPIC, retain_null_key=retain_null_key)
        got = on_spark(spark, dist, retain_null_key=retain_null_key, part_bytes=part_bytes)
        assert got.steps == STEPS
        # (not the compacted ledger's id: the Spark run's pieces took ledger ids before it)
        for f in ("horizon", "messages_read", "bytes_read", "keys_seen", "keys", "entries_written",
                  "bytes_written"):
            assert getattr(got, f) == getattr(want, f), f
        assert view(dist) == view(ref)
        if not retain_null_key:
            assert seen_view(dist) == expected_view(dist)
        # an incremental run: the previous compacted ledger plus what followed its horizon
        for w in (ref, dist):
            p = Producer()
            p.seq = 10_000
            tw = TopicWriter(w.ml, w.hot, TOPIC)
            tw.append_many(round_of(p, 7) + [p.single("k2", b""), p.single("new", b"n")])
            tw.close()
        want2 = compact_topic(ref, TOPIC, retain_null_key=retain_null_key)
        got2 = on_spark(spark, dist, retain_null_key=retain_null_key, part_bytes=part_bytes)
        assert (got2.messages_read, got2.keys, got2.bytes_written) == \
            (want2.messages_read, want2.keys, want2.bytes_written)
        assert got2.messages_read < got.messages_read + 20  # not the whole topic again
        assert view(dist) == view(ref)
        recs = [(e.record.ledger_id, e.record.uuid, e.record.reason) for e in dist.deletion_log.pending()]
        assert recs == [(got.ledger_id, got.uuid, "topic-compaction")]
    finally:
        ref.close()
        dist.close()


# the first and the last step (the steps are write_compacted's, shared with the one-process run, whose
# drill stops after each of the four: tests/lifecycle/test_topic_compaction.py)
def view(w: Workspace) -> list[tuple[int, int, bytes]]:
    """The compacted view, each position as (nth ledger of the topic, entry): ledger ids differ between the
    runs (the Spark run's pieces take ids from the same space)."""
    nth = {li.ledgerId: i for i, li in enumerate(w.ml.get_topic(TOPIC)[0].ledgerInfo)}
    return [(nth[pos.ledger_id], pos.entry_id, data) for pos, data in w.reader().read_compacted(TOPIC)]


@pytest.mark.parametrize("at", [STEPS[0], STEPS[-1]])
def test_a_crash_after_the_first_and_the_last_step_on_spark(spark, ws: Workspace, at: str) -> None:
    crash_drill(ws, at, lambda w, on_step=None: on_spark(spark, w, on_step=on_step))


def test_nothing_to_compact_and_unknown_topic(spark, ws: Workspace) -> None:
    from spark_jobs._topic_shuffle import compact_on_spark

    with pytest.raises(TopicNotFoundError):
        compact_on_spark(spark, ws.config, "acme/keys/persistent/nope", as_of_ms=AS_OF, config_path=ws.config_path)
    write(ws, [round_of(Producer(), 0)])
    on_spark(spark, ws)
    before = state_of_everything(ws)
    with pytest.raises(TopicCompactionError, match="no messages after its compaction horizon"):
        on_spark(spark, ws)
    assert state_of_everything(ws) == before


def test_the_data_source_serves_the_compacted_view(spark, ws: Workspace) -> None:
    """``.option("compacted", "true")``: the rows of read_compacted's messages (compacted_out placeholders
    are not rows), in a Spark query; a bad value fails with one line."""
    from tests.query.test_compacted_scan import reader_view

    p = Producer()
    fill(ws, p, range(4))
    on_spark(spark, ws)
    tw = TopicWriter(ws.ml, ws.hot, TOPIC)
    tw.append_many([p.single("k1", b"after"), p.single(None, b"live")])
    tw.close()
    df = (spark.read.format("tiered").option("config", ws.config_path).option("topic", TOPIC)
          .option("compacted", "true").load())
    got = [(r.ledger_id, r.entry_id, r.batch_index, r.key, bytes(r.payload))
           for r in df.orderBy("ledger_id", "entry_id", "batch_index").collect()]
    assert got == sorted(reader_view(ws)) and got[-2:] == [got[-2][:3] + ("k1", b"after"), got[-1][:3] + (None, b"live")]
    assert {r.tier for r in df.select("tier").distinct().collect()} == {"compacted", "hot"}
    with pytest.raises(Exception, match="option compacted must be true or false, got 'maybe'"):
        spark.read.format("tiered").option("config", ws.config_path).option("topic", TOPIC).option(
            "compacted", "maybe").load().count()


@pytest.mark.parametrize("n", [1, 7, 40])
def test_each_groups_partition_key_lands_it_in_its_own_partition(spark, n: int) -> None:
    """Phase two's rows go to partition g by a key Spark's own hash partitioning sends there."""
    from pyspark.sql import functions as F  # noqa: N812

    from spark_jobs._topic_shuffle import partition_keys

    keys = partition_keys(spark, n)
    assert len(set(keys)) == n
    df = spark.createDataFrame([(g, k) for g, k in enumerate(keys)], "g int, h long").repartition(n, "h")
    got = {r.g: r.p for r in df.select("g", F.spark_partition_id().alias("p")).collect()}
    assert got == {g: g for g in range(n)}
