"""Compaction throughput, memory and layout against a plain copy of the same bytes (not a test).

The workload: --objects offloaded V1 ledger objects of ~1 MiB (--entries entries of --entry-size
bytes each, default 16 x 64 KiB), spread over --topics topics of one namespace with compaction on,
built the way an operator builds it (`tiered init`, `tiered generate`, each ledger offloaded by the
workspace's topic offloader into the filesystem object store, fsync on). The metadata database and
the store's file list are snapshotted; before every run the snapshot is put back and the new segments
removed (the old objects stay: compaction only sends them to the deletion log), so every run starts
from the same layout. Then --rounds alternating rounds, each phase after a `sync`:

  1. baseline: the old objects (data + index) copied one by one as plain files into the same store
     directory (shutil.copyfile, i.e. `cp`: an in-kernel copy) + fsync of each;
  2. packed copy: the same bytes appended (copy_file_range) into files of the compaction target size
     (256 MiB), each fsynced: what a copy costs when it writes a few large files, as compaction does;
  3. compaction of every topic (tieredcore.lifecycle.compaction_run.run_topics, the Spark job's
     partition work; thresholds from the namespace policy) in a spawned child process, which reports
     its wall time and its peak RSS (VmHWM): at start, after the first topic, at the end.

Prints MB/s of old-object bytes (best and median of the rounds) and the ratio to the baseline measured
in the same run (target >= x0.5) and to the packed copy; the peak RSS against what the write path's
buffers can hold (on top of them: the batch's metadata, a few KiB per ledger, which matters only for
batches of thousands of tiny ledgers); objects per GiB of payload before and after (objects the topic records reference
after the switch; objects left in the store once the deletion drain has run past the delete delay).
The same work in --processes plain processes side by side against one, --rounds alternating rounds
(what the machine gains from parallel compactions, whatever runs them). Then, unless --spark-rounds 0, the same work through
spark_jobs/compact_segments.py under spark-submit with --master local[1] and local[2] (alternating, the
snapshot restored before each run): wall time, the job's own time from its summary.json, and the 2-vs-1
speed-up. --profile runs one more in-process
compaction under cProfile and prints the top costs.

The issue's figure is --objects 10000 (~10 GiB of payload; the scratch directory then needs about three
times the payload: the hot tier, the old objects, and the copy or the new segments):

    .venv/bin/python bench/compaction.py                       # 2,000 objects (~2 GiB), 3 rounds
    .venv/bin/python bench/compaction.py --objects 10000 --rounds 2
    .venv/bin/python bench/compaction.py --objects 400 --rounds 1 --spark-rounds 0 --profile
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import datetime as dt
import io
import json
import multiprocessing as mp
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tieredcore.cli import main as cli  # noqa: E402
from tieredcore.config import CONFIG_FILE_NAME, Config  # noqa: E402
from tieredcore.errors import NotFoundError  # noqa: E402
from tieredcore.formats.keys import parse_key  # noqa: E402
from tieredcore.lifecycle.compaction_run import run_topics  # noqa: E402
from tieredcore.lifecycle.drain import drain  # noqa: E402
from tieredcore.offload.batches import BLOCK_SIZE  # noqa: E402
from tieredcore.offload.compaction import READ_BYTES  # noqa: E402
from tieredcore.offload.context import referenced_uuids  # noqa: E402
from tieredcore.offload.reader import _MAX_WINDOWS as MAX_WINDOWS  # noqa: E402
from tieredcore.offload.segments import S3_MIN_PART_SIZE  # noqa: E402
from tieredcore.reports import RunReports, report_name  # noqa: E402
from tieredcore.workspace import Workspace  # noqa: E402

MB = 1_000_000
GIB = 1024**3
NAMESPACE = "bench/compaction"
END_ISO = "2026-01-01T00:00:00Z"  # the newest generated ledger closes then
AS_OF_MS = int(dt.datetime(2026, 1, 2, tzinfo=dt.UTC).timestamp() * 1000)  # the compaction's clock
AS_OF_ISO = "2026-01-02T00:00:00Z"
TARGET_RATIO = 0.5
INTERNAL = ".tiered"  # the filesystem store's internal area (uploads, sidecars): not objects
META_FILES = ("metadata.db", "metadata.db-wal", "metadata.db-shm")
SPARK_JOB = REPO / "spark_jobs" / "compact_segments.py"


def human_size(text: str) -> int:
    """'1G', '128M', '64K' or plain bytes."""
    t = text.strip().upper()
    mult = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(t[-1:], 1)
    return int(float(t[:-1] if mult > 1 else t) * mult)


# -- the workload and its snapshot ------------------------------------------------------------------


class Bench:
    """The workspace under ``root`` and what restores it to its offloaded, not yet compacted state."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.config_path = root / CONFIG_FILE_NAME
        self.cold = root / "cold"
        self.snap = root.parent / "snapshot"
        self.objects: list[Path] = []  # the old objects (data and index files)
        self.store_files: set[Path] = set()

    @property
    def config(self) -> Config:
        return Config.load(self.config_path)

    def build(self, n_objects: int, topics: int, entries: int, entry_size: int) -> tuple[list[str], int]:
        """(topic names, payload bytes): ``n_objects`` ledgers over ``topics`` topics, each offloaded."""
        per_topic = -(-n_objects // topics)
        os.environ["TIERED_NO_PROGRESS"] = "1"
        with contextlib.redirect_stdout(io.StringIO()):  # the commands' own reports
            assert cli.main(["init", str(self.root)]) == 0
            assert cli.main(["--workspace", str(self.root), "generate", "--namespace", NAMESPACE, "--topics",
                             str(topics), "--ledgers", str(per_topic), "--entries", str(entries), "--entry-size",
                             str(entry_size), "--end-time", END_ISO, "--ledger-interval", "60"]) == 0
        names: list[str] = []
        payload = 0
        with Workspace(self.config) as ws:
            ws.policies.set_namespace(NAMESPACE, {"compaction_enabled": True})
            off = ws.topic_offloader()
            for t in ws.ml.list_topics(NAMESPACE):
                info, _ = ws.ml.get_topic(t)
                sealed = [li for li in info.ledgerInfo[:-1]]  # the newest stays open, as on a live broker
                res = off.offload_ledgers(t, [li.ledgerId for li in sealed])
                bad = [r for r in res if r.outcome != "offloaded"]
                if bad:
                    raise SystemExit(f"offload of {t.full} failed: {bad[0].outcome}: {bad[0].error}")
                payload += sum(li.size for li in sealed)
                names.append(t.managed_ledger_name)
        return names, payload

    def store_walk(self, internal: bool = False) -> list[Path]:
        """The store's files: its objects, and with ``internal`` its own files (metadata sidecars...)."""
        return [p for p in self.cold.rglob("*")
                if p.is_file() and (internal or INTERNAL not in p.relative_to(self.cold).parts)]

    def snapshot(self) -> None:
        """The metadata database (the workspace is closed: no connection holds its WAL) and the store's
        files as they are now."""
        self.snap.mkdir()
        for f in META_FILES:
            if (self.root / f).exists():
                shutil.copy2(self.root / f, self.snap / f)
        self.store_files = set(self.store_walk(internal=True))
        prefix = self.config.store_location.prefix
        self.objects = sorted(p for p in self.store_walk()
                              if parse_key(p.relative_to(self.cold).as_posix(), prefix) is not None)

    def restore(self) -> None:
        """Back to the snapshot: its metadata database; the store's files written since removed (the
        new segments and their metadata sidecars, unfinished uploads)."""
        for p in self.store_walk(internal=True):
            if p not in self.store_files:
                p.unlink()
        shutil.rmtree(self.cold / INTERNAL / "uploads", ignore_errors=True)
        for f in META_FILES:
            (self.root / f).unlink(missing_ok=True)
            if (self.snap / f).exists():
                shutil.copy2(self.snap / f, self.root / f)

    def copy_baseline(self) -> int:
        """The old objects copied as plain files into the store directory + fsync; bytes copied."""
        dst = self.cold / "bench-copy"
        dst.mkdir()
        n = 0
        for i, src in enumerate(self.objects):
            target = dst / f"{i}.copy"
            shutil.copyfile(src, target)
            fd = os.open(target, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
            n += target.stat().st_size
        return n

    def copy_packed(self, file_size: int) -> int:
        """The same bytes appended (in-kernel copy_file_range) into files of about ``file_size`` bytes,
        each fsynced: a copy writing a few large files, as compaction does."""
        dst = self.cold / "bench-copy"
        dst.mkdir()
        n, files, out = 0, 0, -1
        fill = file_size
        try:
            for src in self.objects:
                if fill >= file_size:
                    if out >= 0:
                        os.fsync(out)
                        os.close(out)
                        out = -1
                    out = os.open(dst / f"{files}.packed", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                    files, fill = files + 1, 0
                fd = os.open(src, os.O_RDONLY)
                try:
                    left = os.fstat(fd).st_size
                    while left:
                        c = os.copy_file_range(fd, out, left)
                        if c == 0:
                            raise OSError(f"{src}: copy_file_range copied nothing")
                        left, fill, n = left - c, fill + c, n + c
                finally:
                    os.close(fd)
        finally:
            if out >= 0:
                os.fsync(out)
                os.close(out)
        return n

    def drop_copy(self) -> None:
        shutil.rmtree(self.cold / "bench-copy", ignore_errors=True)


# -- compaction in a child process ------------------------------------------------------------------


def _vm_kib(field: str) -> int:
    """VmHWM / VmRSS of this process from /proc (ru_maxrss would include the parent's peak: it
    survives exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return -1


def _compact_child(config_path: str, topics: list[str], q) -> None:
    config = Config.load(config_path)
    start = _vm_kib("VmHWM")
    t0 = time.perf_counter()
    rows: list[dict] = []
    first = -1
    for r in run_topics(config, topics, as_of_ms=AS_OF_MS, dry_run=False):
        rows.append(r)
        if first < 0:
            first = _vm_kib("VmHWM")  # one topic done: a bounded write path grows no further
    q.put({"seconds": time.perf_counter() - t0, "rows": rows, "rss_start_kib": start,
           "rss_first_topic_kib": first, "peak_rss_kib": _vm_kib("VmHWM")})


def compact_in_children(b: Bench, slices: list[list[str]]) -> tuple[float, list[dict]]:
    """Compactions of ``slices`` of the topics, a spawned child each, all at once: (wall seconds from
    the first start to the last report, interpreter start-ups included; each child's report)."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_compact_child, args=(str(b.config_path), s, q)) for s in slices]
    t0 = time.perf_counter()
    for p in procs:
        p.start()
    got = [q.get() for _ in procs]
    wall = time.perf_counter() - t0
    for p in procs:
        p.join()
    return wall, got


def compact_in_child(b: Bench, topics: list[str]) -> dict:
    return compact_in_children(b, [topics])[1][0]


def processes_compare(b: Bench, topics: list[str], n: int, rounds: int, old_bytes: int) -> dict:
    """The same work in one process and in ``n`` processes (topics dealt round-robin), alternating
    which goes first (the first of a pair warms the page cache for the second): how much the machine
    gains from running compactions side by side, whatever runs them (the frame of Spark's figure)."""
    walls: dict[int, list[float]] = {1: [], n: []}
    for rnd in range(rounds):
        for k in (1, n) if rnd % 2 == 0 else (n, 1):
            b.restore()
            os.sync()
            wall, got = compact_in_children(b, [topics[i::k] for i in range(k)])
            for m in got:
                check_rows(m["rows"])
            walls[k].append(wall)
    one, many = min(walls[1]), min(walls[n])
    r = {"processes": n, "rounds": rounds, "wall_1_s": one, f"wall_{n}_s": many, "speedup": one / many}
    print(f"plain processes, best of {rounds}: 1 process {one:,.1f} s ({old_bytes / one / MB:,.0f} MB/s), {n} "
          f"processes side by side {many:,.1f} s ({old_bytes / many / MB:,.0f} MB/s): x{r['speedup']:.2f} "
          f"({os.cpu_count()} CPUs)", flush=True)
    return r


def check_rows(rows: list[dict]) -> dict:
    bad = [r for r in rows if r["outcome"] != "compacted"]
    if bad:
        raise SystemExit(f"compaction of {bad[0]['topic']}: {bad[0]['outcome']}: {bad[0]['error']}")
    return {k: sum(r[k] for r in rows) for k in ("objects_before", "objects_after", "bytes_before", "bytes_after",
                                                 "payload_bytes", "entries", "bytes_read", "requests")}


def referenced_objects(b: Bench) -> int:
    """Objects (data + index) the topic records reference."""
    with Workspace(b.config) as ws:
        uuids: set[str] = set()
        for t in ws.ml.list_topics(NAMESPACE):
            info, _ = ws.ml.get_topic(t)
            for li in info.ledgerInfo:
                uuids |= referenced_uuids(li)
        return 2 * len(uuids)


# -- Spark ------------------------------------------------------------------------------------------


def spark_env() -> dict[str, str]:
    venv_bin = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERED_")}  # the configuration decides
    env.update(PATH=f"{venv_bin}{os.pathsep}{env.get('PATH', '')}", PYSPARK_PYTHON=sys.executable,
               PYSPARK_DRIVER_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1", TIERED_NO_PROGRESS="1",
               PYTHONPATH=str(REPO))  # this checkout first, before the installed one
    return env


def spark_run(b: Bench, job: Path, master: str, run_id: str, scratch: Path) -> dict:
    cmd = [str(Path(sys.executable).parent / "spark-submit"), "--master", master,
           "--conf", "spark.ui.enabled=false", str(job), "--config", str(b.config_path), "--as-of", AS_OF_ISO,
           "--namespace", NAMESPACE, "--run-id", run_id, "--report-dir", str(scratch / "reports")]
    log = scratch / f"{run_id}.log"
    t0 = time.perf_counter()
    with open(log, "wb") as f:
        rc = subprocess.run(cmd, cwd=REPO, env=spark_env(), stdout=f, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL).returncode
    wall = time.perf_counter() - t0
    if rc != 0:
        raise SystemExit(f"spark-submit {master} exited {rc}; log {log}:\n{log.read_text(errors='replace')[-3000:]}")
    try:
        summary = RunReports(scratch / "reports").read_summary(job.stem, report_name(run_id), job.stem)
    except NotFoundError:
        summary = {}
    return {"wall_s": wall, "job_s": summary.get("seconds"), "summary": summary}


def spark_compare(b: Bench, job: Path, rounds: int, n_topics: int, old_bytes: int, scratch: Path) -> dict:
    """The Spark job on local[1] and local[2], alternating, the snapshot restored before each run."""
    times: dict[str, list[dict]] = {"local[1]": [], "local[2]": []}
    for rnd in range(rounds):
        for master in ("local[1]", "local[2]") if rnd % 2 == 0 else ("local[2]", "local[1]"):
            b.restore()
            os.sync()
            s = spark_run(b, job, master, f"bench-{master[6]}-{rnd}", scratch)
            counters = s["summary"].get("totals", {}).get("counters", {})
            times[master].append(s)
            print(f"  spark {master} round {rnd + 1}: wall {s['wall_s']:,.1f} s, job "
                  f"{s['job_s'] if s['job_s'] is not None else '?'} s, objects "
                  f"{counters.get('objects_before', '?')} -> {counters.get('objects_after', '?')}", flush=True)
    w1 = min(s["wall_s"] for s in times["local[1]"])
    w2 = min(s["wall_s"] for s in times["local[2]"])
    j1 = min((s["job_s"] for s in times["local[1]"] if s["job_s"]), default=None)
    j2 = min((s["job_s"] for s in times["local[2]"] if s["job_s"]), default=None)
    sp = {"rounds": rounds, "wall_1_s": w1, "wall_2_s": w2, "speedup_wall": w1 / w2, "job_1_s": j1, "job_2_s": j2,
          "speedup_job": j1 / j2 if j1 and j2 else None, "MBps_1": old_bytes / w1 / MB, "MBps_2": old_bytes / w2 / MB}
    job_s = f"; the job's own time {j1:,.1f} s vs {j2:,.1f} s: x{sp['speedup_job']:.2f}" if sp["speedup_job"] else ""
    print(f"Spark {job.name}, {n_topics} topics, best of {rounds}: local[1] {w1:,.1f} s ({sp['MBps_1']:,.0f} MB/s), "
          f"local[2] {w2:,.1f} s ({sp['MBps_2']:,.0f} MB/s): 2 executors x{sp['speedup_wall']:.2f} the speed of 1 "
          f"(wall time, spark-submit included{job_s}; {os.cpu_count()} CPUs)", flush=True)
    return sp


# -- main -------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--objects", type=int, default=2000, help="offloaded ledger objects (the issue: 10000)")
    ap.add_argument("--entries", type=int, default=16, help="entries per ledger (object)")
    ap.add_argument("--entry-size", default="64K", help="bytes per entry")
    ap.add_argument("--topics", type=int, default=8, help="topics the objects are spread over (Spark's parallelism)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds of copy / compaction")
    ap.add_argument("--spark-rounds", type=int, default=1, help="rounds of spark-submit local[1] / local[2] (0: none)")
    ap.add_argument("--processes", type=int, default=2,
                    help="also compact in this many plain processes side by side vs 1 (0 or 1: skip)")
    ap.add_argument("--spark-job", default=str(SPARK_JOB), help="the compaction Spark job")
    ap.add_argument("--profile", action="store_true", help="cProfile one more in-process compaction")
    ap.add_argument("--dir", help="scratch directory (default: a temp dir on the repo's filesystem)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.objects < a.topics or a.topics <= 0 or a.entries <= 0 or a.rounds <= 0 or a.spark_rounds < 0 \
            or not 0 <= a.processes <= a.topics:
        ap.error("need --objects >= --topics > 0, --entries > 0, --rounds > 0, --spark-rounds >= 0, "
                 "0 <= --processes <= --topics")
    entry_size = human_size(a.entry_size)
    scratch = Path(tempfile.mkdtemp(prefix="bench-compaction-", dir=a.dir or Path(__file__).parent))
    b = Bench(scratch / "ws")
    res: dict = {}
    try:
        t0 = time.perf_counter()
        topics, payload = b.build(a.objects, a.topics, a.entries, entry_size)
        b.snapshot()
        build_s = time.perf_counter() - t0
        old_bytes = sum(p.stat().st_size for p in b.objects)
        n_ledgers = len(b.objects) // 2
        print(f"workload: {n_ledgers:,} offloaded ledger objects ({len(b.objects):,} objects with their indexes) of "
              f"{a.entries} x {entry_size:,} B over {len(topics)} topics; payload {payload / 2**20:,.0f} MiB, "
              f"old objects {old_bytes / 2**20:,.0f} MiB (built in {build_s:,.0f} s)", flush=True)

        with Workspace(b.config) as ws:
            target = ws.policies.for_namespace(NAMESPACE).compaction_target_size
        copy_s, packed_s, comp_s, peaks = [], [], [], []
        last: dict = {}
        for rnd in range(a.rounds):
            if rnd:
                b.restore()
            for phase, times in (("copy", copy_s), ("packed", packed_s)):
                os.sync()
                t0 = time.perf_counter()
                copied = b.copy_baseline() if phase == "copy" else b.copy_packed(target)
                times.append(time.perf_counter() - t0)
                assert copied == old_bytes, (phase, copied, old_bytes)
                b.drop_copy()
            os.sync()
            m = compact_in_child(b, topics)
            last = check_rows(m["rows"])
            comp_s.append(m["seconds"])
            peaks.append(m)
            print(f"  round {rnd + 1}: copy + fsync {old_bytes / copy_s[-1] / MB:,.0f} MB/s, packed copy "
                  f"{old_bytes / packed_s[-1] / MB:,.0f} MB/s, compaction "
                  f"{last['bytes_before'] / comp_s[-1] / MB:,.0f} MB/s ({last['objects_after'] // 2} segments written "
                  f"and verified in {comp_s[-1]:,.1f} s), peak RSS {m['peak_rss_kib'] / 1024:,.0f} MiB (at start "
                  f"{m['rss_start_kib'] / 1024:,.0f} MiB, after "
                  f"the first topic {m['rss_first_topic_kib'] / 1024:,.0f} MiB)", flush=True)
        refs_after = referenced_objects(b)  # the compacted layout (every run produces the same)
        gib = payload / GIB
        best_copy, best_packed, best_comp = min(copy_s), min(packed_s), min(comp_s)
        rss_start = max(m["rss_start_kib"] for m in peaks)
        rss_first = max(m["rss_first_topic_kib"] for m in peaks)
        rss_peak = max(m["peak_rss_kib"] for m in peaks)
        # what the write path holds at once: a read's entries (copies), its handle's read windows, the
        # forming block and the pending part (below the minimum part size, plus the block that crosses it);
        # reading the new segment back (verification) holds less. The rest is the interpreter.
        read_buffer = b.config.read_buffer
        bound_kib = (READ_BYTES + MAX_WINDOWS * read_buffer + BLOCK_SIZE + S3_MIN_PART_SIZE + BLOCK_SIZE) // 1024
        comp_Bps = last["bytes_before"] / best_comp
        res["compaction"] = r = {
            "objects": len(b.objects), "ledgers": n_ledgers, "topics": len(topics), "payload_bytes": payload,
            "old_object_bytes": old_bytes, "compacted_bytes_before": last["bytes_before"],
            "new_object_bytes": last["bytes_after"], "new_objects": last["objects_after"], "rounds": a.rounds,
            "copy_MBps": old_bytes / best_copy / MB, "packed_copy_MBps": old_bytes / best_packed / MB,
            "compaction_MBps": comp_Bps / MB,
            "ratio": comp_Bps / (old_bytes / best_copy),
            "ratio_median": (last["bytes_before"] / statistics.median(comp_s))
            / (old_bytes / statistics.median(copy_s)),
            "ratio_packed": comp_Bps / (old_bytes / best_packed),
            "bytes_read_per_byte": last["bytes_read"] / last["bytes_before"], "requests": last["requests"],
            "peak_rss_kib": rss_peak, "rss_start_kib": rss_start, "rss_first_topic_kib": rss_first,
            "write_path_bound_kib": bound_kib,
        }
        met = r["ratio"] >= TARGET_RATIO
        print(f"compaction of {len(b.objects):,} objects ({last['bytes_before'] / 2**20:,.0f} MiB) into "
              f"{last['objects_after']} objects ({last['bytes_after'] / 2**20:,.0f} MiB), best of {a.rounds} | plain "
              f"copy + fsync {r['copy_MBps']:,.0f} MB/s | compaction {r['compaction_MBps']:,.0f} MB/s "
              f"(x{r['ratio']:.2f}; median x{r['ratio_median']:.2f}) (target >= x{TARGET_RATIO}: "
              f"{'met' if met else 'NOT met'})", flush=True)
        print(f"{'':>10} against a packed copy (the same bytes into {target / 2**20:,.0f} MiB files, "
              f"{r['packed_copy_MBps']:,.0f} MB/s): x{r['ratio_packed']:.2f}; compaction reads "
              f"{r['bytes_read_per_byte']:.2f} B per old byte (the old objects, then the new ones back to verify)",
              flush=True)
        grown = rss_peak - rss_start
        print(f"{'':>10} peak RSS {rss_peak / 1024:,.0f} MiB = {rss_start / 1024:,.0f} MiB at start + "
              f"{grown / 1024:,.0f} MiB ({(rss_first - rss_start) / 1024:,.0f} MiB after the first of "
              f"{len(topics)} topics); the write path's buffers are at most {bound_kib / 1024:,.0f} MiB (a read "
              f"batch {READ_BYTES // 2**20} MiB, {MAX_WINDOWS} read windows of {read_buffer // 2**20} MiB, a block "
              f"{BLOCK_SIZE // 2**20} MiB, a part < {S3_MIN_PART_SIZE // 2**20} MiB + a block): "
              f"{'within' if grown <= bound_kib else 'ABOVE'}", flush=True)

        if a.profile:
            b.restore()
            prof = cProfile.Profile()
            prof.enable()
            check_rows(list(run_topics(b.config, topics, as_of_ms=AS_OF_MS, dry_run=False)))
            prof.disable()
            print("  cProfile of one in-process compaction (top 15 by cumulative time, top 15 by own time):")
            pstats.Stats(prof).sort_stats("cumulative").print_stats(15)
            pstats.Stats(prof).sort_stats("tottime").print_stats(15)

        if a.processes > 1:
            res["processes"] = processes_compare(b, topics, a.processes, a.rounds, old_bytes)

        if a.spark_rounds:
            if not Path(a.spark_job).exists():
                print(f"Spark: skipped, {a.spark_job} not found", flush=True)
            else:
                res["spark"] = spark_compare(b, Path(a.spark_job), a.spark_rounds, len(topics), old_bytes, scratch)

        # last, as it deletes the old objects (no restore after it): the drain past the delete delay
        with Workspace(b.config) as ws:
            delay = ws.policies.for_namespace(NAMESPACE).compaction_delete_delay_ms
            dr = drain(ws, AS_OF_MS + delay + 1)
        prefix = b.config.store_location.prefix
        store_after = sum(1 for p in b.store_walk()
                          if parse_key(p.relative_to(b.cold).as_posix(), prefix) is not None)
        res["layout"] = r = {
            "objects_before": len(b.objects), "objects_after_switch": refs_after, "objects_after_drain": store_after,
            "objects_per_gib_before": len(b.objects) / gib, "objects_per_gib_after_switch": refs_after / gib,
            "objects_per_gib_after_drain": store_after / gib, "drain": dr.counts(),
        }
        done = ", ".join(f"{k} {v}" for k, v in dr.counts().items() if v)
        print(f"layout: objects per GiB of payload {r['objects_per_gib_before']:,.0f} before, "
              f"{r['objects_per_gib_after_switch']:,.1f} after (referenced by the topic records after the switch); "
              f"in the store after the deletion drain past the delete delay: {store_after:,} objects "
              f"({r['objects_per_gib_after_drain']:,.1f} per GiB; drain: {done})", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if a.json:
        print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
