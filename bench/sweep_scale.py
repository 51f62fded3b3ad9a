"""Sweep scale: does an offload sweep cost what its work costs, or what its number of namespaces costs?

Two workspaces with the same total bytes due (embedded: SQLite metadata, filesystem hot tier and
store, so the figures are the sweep's, not an emulator's):

- (a) ``--namespaces`` namespaces (default 1,000) x 1 topic x 1 due ledger of ``--entries`` entries;
- (b) the baseline: 1 namespace x 1 topic x 1 due ledger holding as many bytes as all of (a).

Each round, each scenario starts from a fresh copy of its workspace and runs as the offload-sweep DAG
does: the plan task's planning (tieredcore.lifecycle.sweep.plan_offload_due on one Workspace, then
tieredcore.lifecycle.shards.assign_shards onto ``--shards`` shards) and one real ``spark-submit
spark_jobs/offload_sweep.py --namespace ... --as-of ...`` per shard, the shards at the same time (the
``spark`` pool runs that many at once), master ``local[2]`` (scripts/airflow-init.sh's spark_default).
Printed: the MEDIAN wall seconds of each, the median ratio (a)/(b) with the baseline's spread, the
Spark applications per sweep (<= shards), the plan's seconds and the jobs' phases from their reports.

    .venv/bin/python bench/sweep_scale.py [--namespaces 1000 --entries 10 --rounds 3 --shards 2]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tieredcore.cli import main as cli  # noqa: E402
from tieredcore.config import CONFIG_FILE_NAME, Config  # noqa: E402
from tieredcore.lifecycle.shards import assign_shards  # noqa: E402
from tieredcore.lifecycle.sweep import plan_offload_due  # noqa: E402
from tieredcore.reports import RunReports, report_name  # noqa: E402
from tieredcore.workspace import Workspace  # noqa: E402

os.environ.setdefault("TIERED_NO_PROGRESS", "1")  # generate's progress lines
VENV_BIN = Path(sys.executable).parent
AS_OF = "2026-01-01T01:00:00Z"
AS_OF_MS = 1767229200000
ENTRY_SIZE = 1000
JOB = "offload_sweep"


@dataclass
class Sweep:
    wall: float
    plan: float
    apps: int
    ledgers: int
    phases: dict[str, float]  # summed over the shards' reports


def make_template(root: Path, namespaces: list[str], entries: int) -> Path:
    """`generate` one topic per namespace with one sealed ledger (and the empty open one), every
    namespace's policy offloading every sealed ledger."""
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli.main(["init", str(root)]) == 0
        args = ["--workspace", str(root), "generate", "--topics", "1", "--ledgers", "1", "--entries", str(entries),
                "--entry-size", str(ENTRY_SIZE), "--raw", "--end-time", "2026-01-01T00:00:00Z"]
        for ns in namespaces:
            args += ["--namespace", ns]
        assert cli.main(args) == 0
    with Workspace(Config.load(root / CONFIG_FILE_NAME, env={})) as ws:
        for ns in namespaces:
            ws.policies.set_namespace(ns, {"offload_threshold_bytes": 0})
    return root


def fresh_copy(template: Path, dest: Path) -> Path:
    shutil.copytree(template, dest)
    (dest / CONFIG_FILE_NAME).write_text(Config.for_workspace(dest).to_toml())
    return dest / CONFIG_FILE_NAME


def spark_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TIERED_", "PYSPARK", "SPARK_"))}
    env.update(PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}", PYSPARK_PYTHON=sys.executable,
               PYSPARK_DRIVER_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1", TIERED_NO_PROGRESS="1",
               PYTHONPATH=str(REPO))
    return env


def submit(cfg: Path, args: list[str], log: Path) -> None:
    cmd = [str(VENV_BIN / "spark-submit"), "--master", "local[2]", "--conf", "spark.ui.enabled=false",
           str(REPO / "spark_jobs" / "offload_sweep.py"), "--config", str(cfg), *args]
    with open(log, "wb") as out:
        rc = subprocess.run(cmd, env=spark_env(), stdout=out, stderr=subprocess.STDOUT, cwd=log.parent).returncode
    if rc != 0:
        sys.exit(f"spark-submit exited {rc}; log {log}:\n{log.read_text()[-3000:]}")


def sweep(cfg: Path, shards: int, work: Path, expect_ledgers: int) -> Sweep:
    """The DAG's plan task, then its mapped Spark tasks, all shards at once."""
    t0 = time.monotonic()
    config = Config.load(cfg, env={})
    with Workspace(config) as ws:
        planned = assign_shards(plan_offload_due(ws, None, AS_OF_MS), shards)
    arg_lists = [[a for ns in s.namespaces for a in ("--namespace", ns)]
                 + ["--as-of", AS_OF, "--run-id", f"bench.shard-{i}"] for i, s in enumerate(planned)]
    plan_s = time.monotonic() - t0
    with ThreadPoolExecutor(max_workers=max(1, len(arg_lists))) as pool:
        list(pool.map(lambda ia: submit(cfg, ia[1], work / f"shard-{ia[0]}.log"), enumerate(arg_lists)))
    wall = time.monotonic() - t0
    reports = RunReports(config.reports_dir)
    ledgers = 0
    phases: dict[str, float] = {}
    for i in range(len(arg_lists)):
        summary = reports.read_summary(JOB, report_name(f"bench.shard-{i}"), JOB)  # a run outside Airflow: part = job
        assert summary["failures"] == 0 and set(summary["outcomes"]) == {"offloaded"}, summary["outcomes"]
        ledgers += summary["ledgers"]
        for k, v in summary["spark"]["phases"].items():
            phases[k] = round(phases.get(k, 0.0) + v, 2)
    assert ledgers == expect_ledgers, (ledgers, expect_ledgers)
    return Sweep(round(wall, 2), round(plan_s, 2), len(arg_lists), ledgers, phases)


def spread(xs: list[float]) -> str:
    return f"min {min(xs):.1f} / max {max(xs):.1f} s"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--namespaces", type=int, default=1000)
    p.add_argument("--entries", type=int, default=10, help="entries of 1000 bytes per namespace's ledger")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--shards", type=int, default=2, help="the setting spark_shards (the pool's slots)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="sweep-scale-") as tmp:
        root = Path(tmp)
        t0 = time.monotonic()
        many = make_template(root / "many", [f"bench/ns-{i:04d}" for i in range(args.namespaces)], args.entries)
        one = make_template(root / "one", ["bench/one"], args.entries * args.namespaces)
        print(f"workspaces built in {time.monotonic() - t0:.1f} s: (a) {args.namespaces} namespaces x 1 topic x 1 "
              f"ledger of {args.entries} x {ENTRY_SIZE} bytes; (b) 1 namespace x 1 topic x 1 ledger of "
              f"{args.entries * args.namespaces} x {ENTRY_SIZE} bytes; shards {args.shards}", flush=True)
        results: dict[str, list[Sweep]] = {"a": [], "b": []}
        for r in range(args.rounds):
            for name, template, ledgers in (("b", one, 1), ("a", many, args.namespaces)):
                work = root / f"r{r}-{name}"
                cfg = fresh_copy(template, work)
                s = sweep(cfg, args.shards, work, ledgers)
                results[name].append(s)
                print(f"round {r + 1} ({name}): {s.wall:.1f} s, plan {s.plan:.2f} s, {s.apps} Spark application(s), "
                      f"{s.ledgers} ledger(s); phases (summed over shards) {json.dumps(s.phases)}", flush=True)
                shutil.rmtree(work)
        a = [s.wall for s in results["a"]]
        b = [s.wall for s in results["b"]]
        ratios = [x / y for x, y in zip(a, b, strict=True)]
        apps = max(s.apps for s in results["a"] + results["b"])
        print(f"\n(b) baseline, 1 namespace: median {statistics.median(b):.1f} s ({spread(b)})")
        print(f"(a) {args.namespaces} namespaces: median {statistics.median(a):.1f} s ({spread(a)}); plan median "
              f"{statistics.median(s.plan for s in results['a']):.2f} s")
        print(f"MEDIAN ratio (a)/(b): {statistics.median(ratios):.2f} (per round: "
              f"{', '.join(f'{x:.2f}' for x in ratios)}; target <= 3)")
        print(f"Spark applications per sweep: at most {apps} (shards {args.shards})")
        return 0 if statistics.median(ratios) <= 3 and apps <= args.shards else 1


if __name__ == "__main__":
    sys.exit(main())
