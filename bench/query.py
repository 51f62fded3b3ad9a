"""Queries over the archive through Spark's format("tiered") against plain Parquet of the same messages (not a test).

Method (bench/offload.py's, whose helpers this reuses). A workspace is made once: one topic of --ledgers
ledgers of Pulsar messages (entries of --entry-size bytes, --total payload bytes in all), every ledger
offloaded to the filesystem object store (nothing kept hot). One SparkSession (local[2]) serves every round.
Before timing, the topic is written once through the data source to Parquet (the baseline's input).

Cases:
  - full scan: every column of every message of the topic read (``df.write.format("noop")``) through the
    data source, vs ``spark.read.parquet`` of the same messages. Each of --rounds rounds (at least 5) times
    both back to back, baseline then candidate, the next round candidate then baseline (A/B, then B/A). As
    in bench/offload.py: the MEDIAN of the per-round ratios (baseline time / candidate time; > 1: the data
    source is faster) and the ratio of the medians first, the best-of ratio second, the baseline's min-max
    MB/s (payload bytes / s) and spread, and "too noisy, rerun" (exit 3) instead of ratios when the
    baseline's spread exceeds --max-spread. Target: median >= 0.5x. The Parquet scan is short (about a
    second for 256 MiB here), so its side of a round runs it --baseline-repeat times back to back (default 3)
    and counts the mean: one ~1 s Spark job swings by half with job-start and GC jitter alone.
  - publish-time range: the full scans above recorded each part's publish-time statistics; a query
    ``WHERE publish_time BETWEEN a AND b`` whose range lies inside --range-ledgers of the ledgers (default
    1%). Reported: the plan (parts planned / pruned, planned bytes / the topic's bytes), and, measured in this
    process with count_requests() and a byte count of every object-store GET while reading the planned parts
    with read_part (a fresh workspace: no cache), the GETs and GET bytes against those of reading every part
    the same way. Target: GET bytes <= 2% of the full read's. The Spark query's rows are checked against
    the in-process read, and its time is printed (median of the rounds).
  - export throughput vs pyarrow alone: the Iceberg export of the topic (in-process: read, day split,
    Parquet, the commit, snapshot expiry, the data-file list) vs read_part + pyarrow's write_table of the
    same rows, in the same interleaved rounds, each into a fresh catalog / directory (pyarrow's side, now a
    ~1.5 s run, --baseline-repeat times back to back, its mean counted, as the Parquet scans). Target >= 0.7x.

Exit codes: 0 measured (a missed target is reported as "NOT met", not as an exit code); 2 bad arguments;
3 the full scan's baseline too noisy (its ratios withheld). --quick allows fewer than 5 rounds
(default 2) for smoke runs; its figures are not measurements.

    .venv/bin/python bench/query.py                        # 256 MiB in 100 ledgers, 5 rounds
    .venv/bin/python bench/query.py --quick --total 8M --ledgers 10 --json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.offload import (  # noqa: E402
    DEFAULT_MAX_SPREAD,
    HEADER,
    MIN_ROUNDS,
    QUICK_ROUNDS,
    TOO_NOISY_EXIT,
    Pair,
    format_case,
    human_size,
    run_rounds,
    spread_bound,
    summarize,
)

NAMESPACE = "bench/query"
TOPIC = f"persistent://{NAMESPACE}/topic-0000"
TARGETS = {"full_scan": 0.5, "range_get_bytes_fraction": 0.02, "export": 0.7}
LEDGER_INTERVAL = 60  # seconds between the generated ledgers' closes


def entry_size_range(text: str) -> tuple[int, int]:
    """'64-2048' or '1024': the generator's entry sizes, and their mean for sizing the workload."""
    try:
        lo, _, hi = text.partition("-")
        a, b = int(lo), int(hi or lo)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--entry-size is a byte count or a range like 64-2048, got {text!r}") from None
    if a < 1 or b < a:
        raise argparse.ArgumentTypeError(f"--entry-size must be >= 1 and low <= high, got {text!r}")
    return a, b


# ---- the workspace ----


def tiered(*args: str, cwd: Path) -> str:
    """The project's CLI in a child process (as a user runs it)."""
    env = dict(os.environ, TIERED_NO_PROGRESS="1")
    p = subprocess.run([sys.executable, "-m", "tieredcore.cli.main", *args], cwd=cwd, env=env,
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"tiered {' '.join(args)} exited {p.returncode}: {p.stderr.strip()[-800:]}")
    return p.stdout


def make_workspace(root: Path, total: int, ledgers: int, sizes: tuple[int, int]) -> dict:
    """One topic of `ledgers` ledgers totalling about `total` payload bytes, all offloaded."""
    ws = root / "ws"
    tiered("init", str(ws), cwd=root)
    entries = max(1, total // (ledgers * ((sizes[0] + sizes[1]) // 2)))
    doc = json.loads(tiered("--json", "generate", "--namespace", NAMESPACE, "--topics", "1", "--ledgers", str(ledgers),
                            "--entries", str(entries), "--entry-size", f"{sizes[0]}-{sizes[1]}",
                            "--ledger-interval", str(LEDGER_INTERVAL), cwd=ws))
    tiered("offload", "--namespace", NAMESPACE, "--keep-bytes", "0", cwd=ws)
    return {"config": str(ws / "tiered.toml"), "ledgers": ledgers, "entries_per_ledger": entries,
            "generated": doc}


# ---- object-store GET bytes, counted in this process ----


@contextlib.contextmanager
def count_get_bytes() -> Iterator[dict[str, int]]:
    """Counts the bytes every filesystem-store get / get_range of this process returns (the store's
    request counter, tieredcore.cold.requests, counts requests, not bytes)."""
    from tieredcore.cold.backends.fs import FilesystemBlobStore

    got = {"bytes": 0}
    saved = {n: FilesystemBlobStore.__dict__[n] for n in ("get", "get_range")}

    def wrap(fn):
        def op(self, *a, **kw):
            data = fn(self, *a, **kw)
            got["bytes"] += len(data)
            return data
        return op

    for n, fn in saved.items():
        setattr(FilesystemBlobStore, n, wrap(fn))
    try:
        yield got
    finally:
        for n, fn in saved.items():
            setattr(FilesystemBlobStore, n, fn)


def read_in_process(config: str, publish: tuple[int, int] | None) -> dict:
    """Plan (with the publish range, if any) and read every planned part with read_part in a fresh
    workspace, counting GETs and GET bytes."""
    from tieredcore.cold.requests import count_requests
    from tieredcore.config import Config
    from tieredcore.names import TopicName
    from tieredcore.query.scan import Range, ScanFilter, plan_scan, read_part
    from tieredcore.workspace import Workspace

    filt = ScanFilter(publish=Range(*publish)) if publish else ScanFilter()
    with Workspace(Config.load(config)) as ws:
        plan = plan_scan(ws, [TopicName.parse(TOPIC)], filt)
        rows = 0
        t0 = time.perf_counter()
        with count_requests() as counts, count_get_bytes() as got:
            for part in plan.parts:
                for b in read_part(ws, part, filt=filt, record_stats=False):
                    rows += b.num_rows
        took = time.perf_counter() - t0
    return {"parts": len(plan.parts), "pruned": plan.pruned, "planned_bytes": plan.bytes,
            "pruned_bytes": plan.pruned_bytes, "gets": counts.total()["GET"], "get_bytes": got["bytes"],
            "rows": rows, "seconds": took}


def range_inside_ledgers(config: str, n: int) -> tuple[int, int, list[int]]:
    """A publish-time range (epoch ms, inclusive) inside `n` consecutive ledgers in the middle of the topic,
    from the statistics the full scans recorded: the first one's min + a quarter of its span to the last
    one's max - a quarter, so neighbours that share a boundary millisecond are not touched."""
    from tieredcore.config import Config
    from tieredcore.names import TopicName
    from tieredcore.query import stats
    from tieredcore.workspace import Workspace

    with Workspace(Config.load(config)) as ws:
        known = stats.load(ws.metadata, TopicName.parse(TOPIC))
    if not known:
        raise RuntimeError("no publish-time statistics were recorded by the full scan")
    per = sorted((int(k.split(":")[0]), lo, hi) for k, (lo, hi, _) in known.items())
    mid = max(0, len(per) // 2 - n // 2)
    chosen = per[mid: mid + n]
    a = chosen[0][1] + (chosen[0][2] - chosen[0][1]) // 4
    b = chosen[-1][2] - (chosen[-1][2] - chosen[-1][1]) // 4
    return a, b, [c[0] for c in chosen]


# ---- the hook for the export ----


def export_pairs(a: argparse.Namespace, spark, config: str, out_root: Path) -> list[Pair]:
    """The Iceberg export (tieredcore.lifecycle.export.run_export with its in-process writer: read, split
    by day, Parquet (zstd), the Iceberg commit with its exported ledgers, snapshot expiry, the data-file
    list) vs pyarrow alone writing the same rows (read_part of every part, pyarrow.parquet.write_table,
    zstd): both in this process, each run into a fresh catalog / directory (reset, untimed). Target: the
    export at >= 0.7x pyarrow's throughput."""
    from dataclasses import replace

    import pyarrow as pa
    import pyarrow.parquet as pq

    from tieredcore.config import Config
    from tieredcore.lifecycle import export as ex
    from tieredcore.names import TopicName
    from tieredcore.query.scan import plan_scan, read_part
    from tieredcore.workspace import Workspace

    base = Config.load(config)
    runs = {"n": 0}
    out = out_root / "export-bench"

    def fresh() -> Path:
        runs["n"] += 1
        d = out / f"run-{runs['n']}"
        shutil.rmtree(out, ignore_errors=True)
        d.mkdir(parents=True)
        return d

    dirs: dict[str, Path] = {}

    def reset_pyarrow() -> None:
        dirs["pyarrow"] = fresh()

    def reset_export() -> None:
        dirs["export"] = fresh()

    def pyarrow_alone() -> None:
        for i in range(a.baseline_repeat):  # a ~1.5 s run swings by a third alone: the mean of several
            with Workspace(base) as ws:
                batches = [b for p in plan_scan(ws, [TopicName.parse(TOPIC)]).parts
                           for b in read_part(ws, p, record_stats=False)]
            t = pa.Table.from_batches(batches).drop_columns(["tier"])
            pq.write_table(t, dirs["pyarrow"] / f"topic-{i}.parquet", compression="zstd")

    def export() -> None:
        d = dirs["export"]
        cfg = replace(base, export_catalog_url=f"sqlite:///{d / 'catalog.db'}", export_warehouse=f"file://{d / 'wh'}")
        with Workspace(cfg) as ws:
            cat = ex.open_catalog(cfg)
            plan = ex.plan_export(ws, cat, [TopicName.parse(TOPIC)], 2**62)
            res = ex.run_export(cfg, cat, plan, ex.local_writer(cfg))
        if sum(r.rows for r in res) == 0:
            raise RuntimeError("the export wrote no rows")

    payload = int(spark.read.format("tiered").option("config", config).option("topic", TOPIC).load()
                  .selectExpr("sum(length(payload)) AS b").first().b)
    return [Pair("export", "Iceberg export (in-process)", "pyarrow write_table", payload,
                 run_baseline=pyarrow_alone, run_candidate=export, target=TARGETS["export"],
                 reset_baseline=reset_pyarrow, reset_candidate=reset_export, baseline_repeat=a.baseline_repeat)]


# ---- the run ----


def spark_session():
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from spark_jobs.datasource import register

    spark = (SparkSession.builder.master("local[2]").appName("bench-query")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false").config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1").config("spark.sql.shuffle.partitions", "2")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def run(a: argparse.Namespace, scratch: Path) -> dict:
    from pyspark.sql import functions as F  # noqa: N812

    t0 = time.perf_counter()
    w = make_workspace(scratch, a.total, a.ledgers, a.entry_size)
    print(f"workspace: {w['ledgers']} ledgers x {w['entries_per_ledger']:,} entries, "
          f"{w['generated'].get('bytes', 0) / 2**20:.1f} MiB generated and offloaded "
          f"in {time.perf_counter() - t0:.1f}s", flush=True)
    config = w["config"]
    spark = spark_session()
    try:
        src = lambda: spark.read.format("tiered").option("config", config).option("topic", TOPIC).load()  # noqa: E731
        parquet = str(scratch / "parquet")
        t0 = time.perf_counter()
        src().write.mode("overwrite").parquet(parquet)
        print(f"parquet copy written in {time.perf_counter() - t0:.1f}s", flush=True)
        check = lambda df: df.agg(F.count("*").alias("n"), F.sum(F.length("payload")).alias("b")).first()  # noqa: E731
        want, got = check(spark.read.parquet(parquet)), check(src())
        if (want.n, want.b) != (got.n, got.b):
            raise RuntimeError(f"the data source read {got.n} rows / {got.b} payload bytes, Parquet holds "
                               f"{want.n} / {want.b}")
        messages, payload = int(want.n), int(want.b)

        def noop(df) -> None:
            df.write.format("noop").mode("overwrite").save()

        def parquet_scans() -> None:
            for _ in range(a.baseline_repeat):
                noop(spark.read.parquet(parquet))

        full = Pair("full_scan", "full scan (every column)", "spark.read.parquet", payload,
                    run_baseline=parquet_scans, run_candidate=lambda: noop(src()), target=TARGETS["full_scan"],
                    baseline_repeat=a.baseline_repeat)  # the baseline's times: per Parquet scan
        # both sides' Parquet into memory (tmpfs) when the machine has it: written to disk, the kernel's
        # writeback of a few hundred MB per round swung pyarrow's side by 40% between rounds
        shm = Path("/dev/shm")
        out_root = Path(tempfile.mkdtemp(prefix="bench-query-", dir=shm)) \
            if shm.is_dir() and os.access(shm, os.W_OK) else scratch
        try:
            pairs = [full, *export_pairs(a, spark, config, out_root)]
            run_rounds(pairs, a.rounds, a.warmup, "queries:")
        finally:
            if out_root != scratch:
                shutil.rmtree(out_root, ignore_errors=True)

        # the range query: the full scans recorded statistics
        n_range = max(1, round(a.ledgers * a.range_ledgers))
        lo, hi, chosen = range_inside_ledgers(config, n_range)
        to_ts = lambda ms: f"timestamp_millis({ms})"  # noqa: E731
        where = f"publish_time BETWEEN {to_ts(lo)} AND {to_ts(hi)}"
        src().createOrReplaceTempView("bench_topic")
        query = f"SELECT count(*) AS n, sum(length(payload)) AS b FROM bench_topic WHERE {where}"
        spark_s: list[float] = []
        spark_rows = None
        for _ in range(max(2, a.rounds)):
            t0 = time.perf_counter()
            r = spark.sql(query).first()
            spark_s.append(time.perf_counter() - t0)
            spark_rows = int(r.n)
        ranged = read_in_process(config, (lo, hi))
        whole = read_in_process(config, None)
        if spark_rows != ranged["rows"]:
            raise RuntimeError(f"range query: Spark counted {spark_rows} rows, read_part {ranged['rows']}")
        frac = ranged["get_bytes"] / whole["get_bytes"] if whole["get_bytes"] else None
        range_doc = {
            "case": "publish_time_range", "where": where, "publish_ms": [lo, hi], "ledgers_in_range": chosen,
            "ledgers": a.ledgers, "rows": ranged["rows"], "messages": messages,
            "planned_parts": ranged["parts"], "pruned_parts": ranged["pruned"],
            "planned_bytes": ranged["planned_bytes"], "topic_bytes": whole["planned_bytes"],
            "planned_bytes_fraction": ranged["planned_bytes"] / whole["planned_bytes"],
            "gets": ranged["gets"], "get_bytes": ranged["get_bytes"],
            "full_gets": whole["gets"], "full_get_bytes": whole["get_bytes"], "get_bytes_fraction": frac,
            "target_fraction": TARGETS["range_get_bytes_fraction"],
            "met": None if frac is None else frac <= TARGETS["range_get_bytes_fraction"],
            "spark_seconds_median": statistics.median(spark_s), "spark_seconds": spark_s,
        }
    finally:
        spark.stop()
    return {"workspace": {k: v for k, v in w.items() if k != "config"}, "messages": messages,
            "payload_bytes": payload, "pairs": pairs, "range": range_doc}


def report(res: dict, max_spread: float) -> dict:
    print()
    print(HEADER)
    cases, noisy = [], []
    for p in res["pairs"]:
        s = summarize(p.base_s, p.cand_s, p.payload, max_spread, p.target)
        print(format_case(p.what, p.baseline, s))
        cases.append({"case": p.key, "what": p.what, "baseline": p.baseline, "payload_bytes": p.payload, **s})
        if s["too_noisy"]:
            noisy.append(p.key)
    r = res["range"]
    frac = r["get_bytes_fraction"]
    verdict = "" if r["met"] is None else ("met" if r["met"] else "NOT met")
    print(f"\npublish-time range ({len(r['ledgers_in_range'])} of {r['ledgers']} ledgers; {r['where']}):")
    print(f"  plan: {r['planned_parts']} part(s) planned, {r['pruned_parts']} pruned; "
          f"{r['planned_bytes']:,} of {r['topic_bytes']:,} bytes planned ({r['planned_bytes_fraction']:.2%})")
    print(f"  GETs (read_part in-process): {r['gets']} of a full read's {r['full_gets']}; "
          f"GET bytes {r['get_bytes']:,} of {r['full_get_bytes']:,} "
          f"({'-' if frac is None else f'{frac:.2%}'}; target <= {r['target_fraction']:.0%}) {verdict}")
    print(f"  rows {r['rows']:,} of {res['messages']:,}; Spark query median {r['spark_seconds_median']:.2f}s")
    return {"cases": cases, "too_noisy": noisy, "range": r, "workspace": res["workspace"],
            "messages": res["messages"], "payload_bytes": res["payload_bytes"]}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--total", default="256M", type=human_size, help="payload bytes of the topic (e.g. 256M)")
    ap.add_argument("--ledgers", type=int, default=100)
    ap.add_argument("--entry-size", default="64-2048", type=entry_size_range)
    ap.add_argument("--range-ledgers", type=float, default=0.01,
                    help="fraction of the ledgers the publish-time range lies in (default 0.01; at least one)")
    ap.add_argument("--baseline-repeat", type=int, default=3,
                    help="Parquet scans per baseline side of a round, their mean counted (default 3)")
    ap.add_argument("--dir", help="scratch directory (default: a temp dir on the repo's filesystem)")
    ap.add_argument("--rounds", type=int, help=f"interleaved rounds (default and minimum {MIN_ROUNDS})")
    ap.add_argument("--warmup", type=int, default=1, help="uncounted rounds first (default 1)")
    ap.add_argument("--quick", action="store_true",
                    help=f"smoke run: allow fewer than {MIN_ROUNDS} rounds (default {QUICK_ROUNDS})")
    ap.add_argument("--max-spread", type=spread_bound, default=DEFAULT_MAX_SPREAD,
                    help=f"largest baseline spread with a ratio printed (default {DEFAULT_MAX_SPREAD})")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.rounds is None:
        a.rounds = QUICK_ROUNDS if a.quick else MIN_ROUNDS
    if a.rounds < 1:
        ap.error("--rounds must be at least 1")
    if a.rounds < MIN_ROUNDS and not a.quick:
        ap.error(f"at least {MIN_ROUNDS} interleaved rounds (or --quick for a smoke run)")
    if a.warmup < 0:
        ap.error("--warmup cannot be negative")
    if a.baseline_repeat < 1:
        ap.error("--baseline-repeat must be at least 1")
    if a.ledgers < 1:
        ap.error("--ledgers must be at least 1")
    if not 0 < a.range_ledgers <= 1:
        ap.error("--range-ledgers is a fraction in (0, 1]")
    if a.total < 1:
        ap.error("--total must be above 0")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="bench-query-", dir=a.dir or ROOT))
    try:
        out = report(run(a, scratch), a.max_spread)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    out["exit_code"] = TOO_NOISY_EXIT if out["too_noisy"] else 0
    if out["too_noisy"]:
        print(f"\ntoo noisy, rerun: {', '.join(out['too_noisy'])} (exit code {TOO_NOISY_EXIT})")
    if a.json:
        print(json.dumps(out, indent=2, default=str))
    return out["exit_code"]


if __name__ == "__main__":
    sys.exit(main())
