"""The view's pages with many run reports (not a test): issue 27 measured the overview at 0.6 s with no
reports and 2.6 s with 2,000, one 2,000-row table.

A workspace of --namespaces namespaces (`tiered init` + `tiered generate`), then --reports DAG-run
reports of the sweep (one part each, written as the jobs write them: tests/support/dag_run_reports.py).
Each round, alternating, through the plugin's app (FastAPI's TestClient, no Airflow):

  1. baseline: the overview over the same workspace with an empty reports directory;
  2. the overview with the reports (its lists paged: 50 rows);
  3. the first page of the DAG's runs (50 of them);
  4. a part's try page with its detail.parquet.

Prints the median seconds of each over --rounds rounds, the baseline's spread (min-max), and the ratio
of each page to the baseline, plus the rows each page rendered.

    PYTHONPATH=$PWD .venv/bin/python bench/view_pages.py --reports 2000 --rounds 5
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "plugins")]

from fastapi import FastAPI  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from tests.support.dag_run_reports import detail_row, publish_try, write_run_json  # noqa: E402
from tests.support.workspaces import END_MS, build_workspace  # noqa: E402
from tieredcore.config import Config  # noqa: E402
from tieredcore.reports import RunReports, report_name  # noqa: E402

DAG = "tiered_offload_sweep"


def client(config: Config) -> TestClient:
    from tiered_web import create_app

    server = FastAPI()
    server.mount("/tiered", create_app(lambda: config, secured=False))
    return TestClient(server, base_url="http://testserver/tiered")


def timed(c: TestClient, path: str) -> tuple[float, str]:
    t0 = time.perf_counter()
    r = c.get(path)
    dt = time.perf_counter() - t0
    assert r.status_code == 200, (path, r.status_code, r.text[:300])
    return dt, r.text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--namespaces", type=int, default=20)
    ap.add_argument("--reports", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        cfg = Config.load(build_workspace(root / "ws", [f"t/ns{i:03d}" for i in range(a.namespaces)], ledgers=2),
                          env={})
        empty = Config.load(root / "ws" / "tiered.toml",
                            env={"TIERED_REPORTS_DIR": str(root / "no-reports")})
        reports = RunReports(cfg.reports_dir)
        for i in range(a.reports):
            run_id = f"scheduled__2026-01-01T00:{i // 60 % 60:02d}:{i % 60:02d}+00:00.{i}"
            ns = f"t/ns{i % a.namespaces:03d}"
            publish_try(reports, DAG, run_id, "offload", 0, 1, [detail_row(f"persistent://{ns}/topic-0000", j)
                                                               for j in range(20)], as_of_ms=END_MS + i * 900_000)
            write_run_json(reports, DAG, run_id, [("offload", 0, [ns])], [], as_of_ms=END_MS + i * 900_000)
        last = f"scheduled__2026-01-01T00:{(a.reports - 1) // 60 % 60:02d}:{(a.reports - 1) % 60:02d}+00:00.{a.reports - 1}"
        pages = {"baseline: overview, no reports": (client(empty), "/overview"),
                 f"overview, {a.reports} reports": (client(cfg), "/overview"),
                 "runs of the DAG, page 1": (client(cfg), f"/reports/{DAG}/"),
                 "a try with its detail": (client(cfg), f"/reports/{DAG}/{report_name(last)}/offload.0/attempt-1/")}
        times: dict[str, list[float]] = {k: [] for k in pages}
        rows: dict[str, int] = {}
        for _ in range(a.rounds):
            for name, (c, path) in pages.items():
                dt, text = timed(c, path)
                times[name].append(dt)
                rows[name] = len(re.findall(r"<tr[ >]", text))
        base = statistics.median(times["baseline: overview, no reports"])
        spread = (min(times["baseline: overview, no reports"]), max(times["baseline: overview, no reports"]))
        print(f"{a.namespaces} namespaces, {a.reports} DAG-run reports, {a.rounds} rounds (median seconds)")
        print(f"baseline spread: {spread[0]:.3f}-{spread[1]:.3f} s")
        for name, ts in times.items():
            m = statistics.median(ts)
            print(f"  {name:40s} {m:7.3f} s  x{m / base:5.2f}  ({rows[name]} table rows)")


if __name__ == "__main__":
    main()
