"""spark_jobs/export_tables.py: bad input in-process (exit 2, nothing started); one real spark-submit (slow)
whose executors read the parts and write the Parquet files, the driver committing with pyiceberg; the
tables equal the topics' messages, `current_files.json` read by spark.read.parquet (no Iceberg runtime)
equals the Iceberg scan, and an in-process rerun for the same logical time adds nothing.

spark-submit invocations in this module: 1."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from spark_jobs import export_tables
from tests.support.workspaces import build_workspace, offload, sealed
from tieredcore.config import Config
from tieredcore.formats.messages import OutMessage, encode_message
from tieredcore.lifecycle import export as ex
from tieredcore.names import TopicName
from tieredcore.query.scan import ScanFilter, plan_scan, read_part
from tieredcore.topic.writer import TopicWriter
from tieredcore.workspace import Workspace

from .conftest import spark_env, spark_submit

NS = "public/default"
AS_OF = "2026-01-02T00:00:00Z"
KEY = ["topic", "ledger_id", "entry_id", "batch_index"]


JSON_NS = "public/json"


def workspace(root: Path) -> Path:
    """Two generated topics (no schema), and a topic of JSON payloads, a third of which do not match the
    schema its namespace sets (DLQ); every sealed ledger offloaded."""
    cfg = build_workspace(root, [NS], topics=2, ledgers=3, entries=40, entry_size="16-300", messages=True)
    with Workspace(Config.load(cfg, env={})) as ws:
        t = TopicName.parse(f"{JSON_NS}/orders")
        for _ in range(3):
            w = TopicWriter(ws.ml, ws.hot, t, max_entries=1000, max_bytes=1 << 30, clock_ms=lambda: 1_767_225_600_000)
            w.append_many([encode_message(OutMessage(json.dumps({"id": i}).encode() if i % 3 else b"oops"),
                                          producer="p", sequence_id=i, publish_time=1_767_225_600_000 + i)
                           for i in range(30)])
            w.close(seal=True)
        ex.save_settings(ws, JSON_NS, ex.ExportSettings(schema={"id": "long"}, required=("id",)))
        for ns in (NS, JSON_NS):
            for t in ws.ml.list_topics(ns):
                offload(ws, t.full, sealed(ws, t.full))
    return cfg


def test_bad_input_exits_2_before_spark(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = build_workspace(tmp_path / "ws", [NS], topics=1, ledgers=1, entries=2, messages=True)
    assert export_tables.main(["--config", str(cfg), "--as-of", AS_OF, "--topic", f"{NS}/nope"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert export_tables.main(["--config", str(cfg), "--as-of", "soon"]) == 2
    assert not (tmp_path / "ws" / "reports").exists() or not any((tmp_path / "ws" / "reports").rglob("summary.json"))


@pytest.mark.slow
def test_export_job_writes_on_executors_and_commits_once(tmp_path: Path) -> None:
    cfg = workspace(tmp_path / "ws")
    config = Config.load(cfg, env={})
    rc, log = spark_submit("export_tables", "--config", str(cfg), "--as-of", AS_OF, "--run-id", "export-1",
                           log=tmp_path / "spark.log")
    assert rc == 0, log
    summary = json.loads(next((tmp_path / "ws" / "reports").rglob("summary.json")).read_text())
    t = summary["totals"]
    assert t["ledgers"] == 8 and t["failures"] == 0 and t["outcomes"] == {"exported": 8}
    assert t["namespaces"][NS]["tables"] == 2 and t["counters"]["rows"] > 0
    # the JSON topic: 2 offloaded ledgers of 30 messages, every third one not JSON
    assert t["namespaces"][JSON_NS]["rows"] == 40 and t["namespaces"][JSON_NS]["dlq_rows"] == 20
    assert all(x["snapshot_id"] for x in summary["tables"]) and summary["spark"]["master"].startswith("local")

    cat = ex.open_catalog(config)
    orders = ex.read_table(cat, ("public_json", "orders"))
    assert sorted(v["id"] for v in orders.column("value").to_pylist()) == sorted([i for i in range(30) if i % 3] * 2)
    dlq = ex.read_table(cat, ("public_json", "orders_dlq"))
    assert set(dlq.column("payload").to_pylist()) == {b"oops"} and dlq.num_rows == 20
    with Workspace(config) as ws:
        for topic in ws.ml.list_topics(NS):
            ident = ex.table_ident(topic, "topic")
            got = ex.read_table(cat, ident).sort_by([(k, "ascending") for k in KEY])
            parts = plan_scan(ws, [topic], ScanFilter(ledger_in=frozenset(sealed(ws, topic.full)))).parts
            want = pa.Table.from_batches([b for p in parts for b in read_part(ws, p, record_stats=False)])
            want = want.drop_columns(["tier"]).sort_by([(k, "ascending") for k in KEY])
            assert got.num_rows == want.num_rows > 0 and got.equals(want.cast(got.schema))
        # the same logical time again, in-process: nothing new
        plan = ex.plan_export(ws, cat, [TopicName.parse(f"{NS}/topic-0000")], ex_ms(AS_OF))
        assert [w.ledger_count for w in plan.tables] == [0] and plan.tables[0].already == 3

    # current_files.json read by plain spark.read.parquet equals the Iceberg scan
    import os

    from pyspark.sql import SparkSession

    os.environ.update({k: v for k, v in spark_env().items() if k.startswith(("PYSPARK", "SPARK"))})
    spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
    try:
        ident = ("public_default", "topic_0001")
        files = ex.current_files(cat, ident)
        df = spark.read.parquet(*files)
        iceberg = ex.read_table(cat, ident)
        assert df.count() == iceberg.num_rows
        got = sorted((r.ledger_id, r.entry_id, r.batch_index, bytes(r.payload)) for r in
                     df.select("ledger_id", "entry_id", "batch_index", "payload").collect())
        want = sorted(zip(*(iceberg.column(c).to_pylist() for c in ("ledger_id", "entry_id", "batch_index", "payload")),
                          strict=True))
        assert got == want
    finally:
        spark.stop()


def ex_ms(iso: str) -> int:
    from tieredcore.clock import parse_time_ms

    return parse_time_ms(iso, "as of")
