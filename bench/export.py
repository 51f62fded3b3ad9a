"""The Iceberg export's cost against writing the same rows with pyarrow alone (docs/export.md).

    PYTHONPATH=. .venv/bin/python bench/export.py [--topics 2] [--ledgers 4] [--entries 5000] [--runs 3]

One workspace (`tiered init` + `generate` (Pulsar messages) + `offload`), then per run, in-process, each on
a fresh catalog/output: (1) read only: every part through tieredcore.query.scan.read_part; (2) pyarrow:
the same read + pq.write_table of the rows (zstd, one file per topic): the floor of any export; (3) the
export (tieredcore.lifecycle.export.run_export, local writer): read, day split, Parquet, Iceberg commit,
snapshot expiry, current_files.json. Prints the medians as rows/s and MiB/s of payload+row data (Arrow
bytes), and the export's overhead over pyarrow alone.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tieredcore.cli.main import main as tiered
from tieredcore.config import Config
from tieredcore.lifecycle import export as ex
from tieredcore.query.scan import ScanFilter, plan_scan, read_part
from tieredcore.workspace import Workspace

NS = "public/bench"


def build(root: Path, topics: int, ledgers: int, entries: int) -> Config:
    assert tiered(["init", str(root)]) == 0
    assert tiered(["--workspace", str(root), "generate", "--namespace", NS, "--topics", str(topics), "--ledgers",
                   str(ledgers), "--entries", str(entries), "--entry-size", "200-1000", "--batch", "4",
                   "--end-time", "2026-01-01T00:00:00Z"]) == 0
    assert tiered(["--workspace", str(root), "offload", "--namespace", NS, "--keep-bytes", "0"]) == 0
    return Config.load(root / "tiered.toml", env={})


def parts(ws: Workspace):
    topics = sorted(ws.ml.list_topics(NS), key=lambda t: t.full)
    out = []
    for t in topics:
        ok, _ = ex.eligible_ledgers(ws, t, 2**62)
        out += plan_scan(ws, [t], ScanFilter(ledger_in=frozenset(ok))).parts
    return out


def read_only(config: Config) -> tuple[int, int]:
    rows = nbytes = 0
    with Workspace(config) as ws:
        for p in parts(ws):
            for b in read_part(ws, p, record_stats=False):
                rows += b.num_rows
                nbytes += b.nbytes
    return rows, nbytes


def pyarrow_only(config: Config, out: Path) -> tuple[int, int]:
    rows = nbytes = 0
    with Workspace(config) as ws:
        by_topic: dict[str, list[pa.RecordBatch]] = {}
        for p in parts(ws):
            by_topic.setdefault(p.topic, []).extend(read_part(ws, p, record_stats=False))
        for i, (_, batches) in enumerate(sorted(by_topic.items())):
            t = pa.Table.from_batches(batches).drop_columns(["tier"])
            pq.write_table(t, out / f"{i}.parquet", compression="zstd")
            rows += t.num_rows
            nbytes += t.nbytes
    return rows, nbytes


def export(config: Config) -> tuple[int, int]:
    with Workspace(config) as ws:
        cat = ex.open_catalog(config)
        plan = ex.plan_export(ws, cat, sorted(ws.ml.list_topics(NS), key=lambda t: t.full), 2**62)
        res = ex.run_export(config, cat, plan, ex.local_writer(config))
    return sum(r.rows for r in res), 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--topics", type=int, default=2)
    p.add_argument("--ledgers", type=int, default=4)
    p.add_argument("--entries", type=int, default=5000)
    p.add_argument("--runs", type=int, default=3)
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-export-"))
    try:
        config = build(tmp / "ws", a.topics, a.ledgers, a.entries)
        rows, nbytes = read_only(config)  # warm-up, and the size
        times: dict[str, list[float]] = {"read only": [], "pyarrow alone": [], "iceberg export": []}
        for run in range(a.runs):
            t0 = time.perf_counter()
            read_only(config)
            times["read only"].append(time.perf_counter() - t0)
            out = tmp / f"pa-{run}"
            out.mkdir()
            t0 = time.perf_counter()
            pyarrow_only(config, out)
            times["pyarrow alone"].append(time.perf_counter() - t0)
            shutil.rmtree(tmp / "ws" / "iceberg", ignore_errors=True)  # a fresh catalog each run
            t0 = time.perf_counter()
            got, _ = export(config)
            times["iceberg export"].append(time.perf_counter() - t0)
            assert got == rows, (got, rows)
        med = {k: statistics.median(v) for k, v in times.items()}
        out = {"rows": rows, "arrow_mib": round(nbytes / 2**20, 1), "runs": a.runs,
               **{k: {"seconds": round(s, 3), "rows_per_s": round(rows / s), "mib_per_s": round(nbytes / 2**20 / s, 1)}
                  for k, s in med.items()},
               "export_over_pyarrow": round(med["iceberg export"] / med["pyarrow alone"], 2)}
        print(json.dumps(out, indent=2))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
