"""detail.parquet written on the driver with pyarrow (spark_jobs._jobkit.write_detail): Spark's layout (a
directory with one part file and _SUCCESS), the columns and types of the job's DDL, replaced whole on a
rewrite; an unknown DDL type is refused by name."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs._jobkit import arrow_schema, write_detail
from tieredcore.lifecycle.compaction_run import DETAIL_SCHEMA as COMPACTION
from tieredcore.lifecycle.drain import DETAIL_SCHEMA as DRAIN
from tieredcore.lifecycle.keys import DETAIL_SCHEMA as KEYS
from tieredcore.lifecycle.reconcile.report import DETAIL_SCHEMA as RECONCILE
from tieredcore.lifecycle.work import DETAIL_SCHEMA as WORK


@pytest.mark.parametrize("ddl", [WORK, DRAIN, COMPACTION, RECONCILE, KEYS])
def test_every_report_schema_maps_to_arrow(ddl: str) -> None:
    schema = arrow_schema(ddl)
    assert schema.names == [c.strip().split(" ")[0] for c in ddl.split(",")]


def test_detail_round_trips_in_sparks_layout(tmp_path: Path) -> None:
    ddl = "topic string, ledger long, n int, seconds double, estimated boolean, error string"
    rows = [("t/a", 7, 3, 0.5, True, None), ("t/b", 2**40, -1, 1e-3, False, "boom")]
    out = tmp_path / "detail.parquet"
    write_detail(out, rows, ddl)
    assert sorted(p.name for p in out.iterdir()) == ["_SUCCESS", "part-00000.snappy.parquet"]
    table = pq.read_table(out)
    assert table.schema == pa.schema([("topic", pa.string()), ("ledger", pa.int64()), ("n", pa.int32()),
                                      ("seconds", pa.float64()), ("estimated", pa.bool_()), ("error", pa.string())])
    assert [tuple(r.values()) for r in table.to_pylist()] == rows
    write_detail(out, [], ddl)  # a rerun replaces the table whole
    assert pq.read_table(out).num_rows == 0 and not (tmp_path / ".detail.parquet.tmp").exists()


def test_unknown_ddl_type_is_named() -> None:
    with pytest.raises(ValueError, match="unsupported column 'when timestamp'"):
        arrow_schema("topic string, when timestamp")
