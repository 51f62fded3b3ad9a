"""Spark scaling of the offload sweep: the same workload offloaded by `spark-submit` on local[1] (the
baseline), local[2], and a standalone cluster (scripts/stack.sh's way: `spark-class ...Master` and
`...Worker` on loopback, one core each) with one worker, then two.

Every run starts from a fresh copy of one generated workspace (embedded: SQLite metadata, filesystem
store, so the figures are Spark's and the offload's, not an emulator's) and reports:

- wall seconds of the spark-submit and the ratio to the baseline measured in the same run (also with
  the JVM options of docker/spark-conf/spark-defaults.conf, "tuned": C1 compiler only, serial GC);
- the per-phase cost from the job's own run report (`spark` section: planning, session start-up,
  distributed work, report) and the sum of the per-ledger offload seconds inside the tasks;
- a CPU profile taken while it ran (/proc sampled every 0.1 s): CPU seconds of the driver JVM, the
  driver's Python, the executor JVMs, the Python workers, the Spark daemons, and of everything else on
  the machine (other users of the 2 cores), against the capacity (cores × wall).

    .venv/bin/python bench/spark_scaling.py [--topics 16 --ledgers 8 --entries 1000 --rounds 1]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tieredcore.cli import main as cli  # noqa: E402
from tieredcore.config import CONFIG_FILE_NAME, Config  # noqa: E402
from tieredcore.reports import RunReports  # noqa: E402
from tieredcore.workspace import Workspace  # noqa: E402

VENV_BIN = Path(sys.executable).parent
TUNED = REPO / "docker" / "spark-conf" / "spark-defaults.conf"  # what scripts/stack.sh and compose use
NAMESPACE = "bench/scaling"
CLK_TCK = os.sysconf("SC_CLK_TCK")
CPU_CLASSES = ("driver JVM", "driver python", "executor JVMs", "python workers", "spark daemons", "other processes")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- CPU profile ------------------------------------------------------------------------------------


def classify(cmdline: str) -> str | None:
    if "org.apache.spark.deploy.SparkSubmit" in cmdline:
        return "driver JVM"
    if "CoarseGrainedExecutorBackend" in cmdline:
        return "executor JVMs"
    if "deploy.master.Master" in cmdline or "deploy.worker.Worker" in cmdline:
        return "spark daemons"
    if "pyspark.daemon" in cmdline or "pyspark.worker" in cmdline:
        return "python workers"
    if "offload_sweep.py" in cmdline:
        return "driver python"
    return None


class CpuProfile:
    """CPU seconds per process class while running: /proc/<pid>/stat's utime+stime, the last sample of
    every process kept (a process that ends loses at most one interval), and /proc/stat's busy time."""

    def __init__(self, interval: float = 0.1) -> None:
        self.interval = interval
        self.last: dict[int, tuple[str, float, float]] = {}  # pid -> (class, cpu at first sight, cpu now)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.me = os.getpid()
        self.ours: set[int] = set()

    @staticmethod
    def _busy() -> float:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + fields[4]
        return (sum(fields[:8]) - idle) / CLK_TCK

    def _sample(self) -> None:
        rows = []
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
                cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            rest = stat.rsplit(")", 1)[1].split()
            rows.append((int(d), int(rest[1]), (int(rest[11]) + int(rest[12])) / CLK_TCK, cmd))
        # only this benchmark's descendants (spark-submit, the cluster's daemons and their executors) are
        # classified: other Spark applications on the machine count as "other processes"
        grown = True
        while grown:
            more = {pid for pid, ppid, _, _ in rows if (ppid == self.me or ppid in self.ours) and pid not in self.ours}
            self.ours |= more
            grown = bool(more)
        for pid, _, cpu, cmd in rows:
            if pid not in self.ours:
                continue
            # the latest command line decides (spark-submit execs into the JVM); an exiting process has none
            cls = classify(cmd) or (self.last[pid][0] if pid in self.last else "")
            if pid in self.last:
                self.last[pid] = (cls, self.last[pid][1], cpu)
            else:  # processes that existed before the run count from now; new ones from their start
                self.last[pid] = (cls, 0.0 if self._started else cpu, cpu)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            time.sleep(self.interval)

    def __enter__(self) -> CpuProfile:
        self._started = False
        self._sample()
        self._started = True
        self.t0, self.busy0 = time.monotonic(), self._busy()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
        self.wall = time.monotonic() - self.t0
        self.busy = self._busy() - self.busy0

    def by_class(self) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for pid, (cls, first, now) in self.last.items():
            if cls and pid != self.me:
                out[cls] += now - first
        out["other processes"] = max(0.0, self.busy - sum(out.values()))
        return {k: round(out.get(k, 0.0), 1) for k in CPU_CLASSES}


# -- runs -------------------------------------------------------------------------------------------


@dataclass
class Result:
    name: str
    wall: float
    phases: dict[str, float]
    offload_seconds: float
    executors: int | None
    cpu: dict[str, float]
    capacity: float
    ledgers: int = 0
    extra: dict = field(default_factory=dict)


def make_template(root: Path, topics: int, ledgers: int, entries: int) -> Path:
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli.main(["init", str(root)]) == 0
        assert cli.main(["--workspace", str(root), "generate", "--namespace", NAMESPACE, "--topics", str(topics),
                         "--ledgers", str(ledgers), "--entries", str(entries), "--entry-size", "1000-3000",
                         "--end-time", "2026-01-01T00:00:00Z"]) == 0
    with Workspace(Config.load(root / CONFIG_FILE_NAME, env={})) as ws:
        ws.policies.set_namespace(NAMESPACE, {"offload_threshold_bytes": 0})
    return root


def fresh_copy(template: Path, dest: Path) -> Path:
    shutil.copytree(template, dest)
    cfg = Config.for_workspace(dest)
    (dest / CONFIG_FILE_NAME).write_text(cfg.to_toml())
    return dest / CONFIG_FILE_NAME


def spark_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TIERED_", "PYSPARK", "SPARK_"))}
    env.update(PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}", PYSPARK_PYTHON=sys.executable,
               PYSPARK_DRIVER_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1", TIERED_NO_PROGRESS="1",
               PYTHONPATH=str(REPO))  # this checkout's code, not another the venv may have installed
    return env


def run_sweep(name: str, master: str, cfg: Path, workdir: Path, cores: int, extra_conf: list[str]) -> Result:
    cmd = [str(VENV_BIN / "spark-submit"), "--master", master, "--conf", "spark.ui.enabled=false",
           *extra_conf, str(REPO / "spark_jobs" / "offload_sweep.py"), "--config", str(cfg),
           "--as-of", "2026-01-01T01:00:00Z", "--run-id", "bench"]
    log = workdir / f"{name.replace(' ', '_').replace('[', '').replace(']', '')}.log"
    with CpuProfile() as prof, open(log, "wb") as out:
        t0 = time.monotonic()
        rc = subprocess.run(cmd, env=spark_env(), stdout=out, stderr=subprocess.STDOUT, cwd=workdir).returncode
        wall = time.monotonic() - t0
    if rc != 0:
        sys.exit(f"{name}: spark-submit exited {rc}; log {log}:\n{log.read_text()[-3000:]}")
    reports = RunReports(cfg.parent / "reports")
    summary = reports.read_summary("offload_sweep", "bench", "offload_sweep")
    import pyarrow.parquet as pq

    rows = pq.read_table(reports.detail_path("offload_sweep", "bench", "offload_sweep")).to_pylist()
    assert summary["outcomes"] == {"offloaded": len(rows)}, summary["outcomes"]
    return Result(name, round(wall, 2), summary["spark"]["phases"], round(sum(r["seconds"] for r in rows), 2),
                  summary["spark"]["executors"], prof.by_class(), round(prof.wall * os.cpu_count(), 1),
                  ledgers=len(rows))


class Cluster:
    """A standalone master and workers on loopback, as scripts/stack.sh starts them."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.procs: list[subprocess.Popen] = []
        self.env = spark_env()
        del self.env["PYTHONPATH"]  # the executors get the project from the --py-files zip only
        self.env["SPARK_DAEMON_MEMORY"] = "256m"
        self.env["SPARK_DAEMON_JAVA_OPTS"] = "-XX:+UseSerialGC"  # as scripts/stack.sh
        self.master_log = workdir / "master.log"
        self._spawn("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port",
                               str(self.port), "--webui-port", str(free_port())])
        self._wait(lambda: "I have been elected leader" in self.master_log.read_text(errors="replace"), "master")

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _spawn(self, name: str, args: list[str]) -> None:
        log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115 - owned by the process' lifetime
        self.procs.append(subprocess.Popen([str(VENV_BIN / "spark-class"), *args], env=self.env, stdout=log,
                                           stderr=subprocess.STDOUT, start_new_session=True))

    def _wait(self, ready, what: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                self.stop()
                sys.exit(f"Spark {what} did not start; logs in {self.workdir}")
            time.sleep(0.2)

    def add_worker(self) -> None:
        n = len(self.procs)  # the master is procs[0]: workers are numbered from 1
        wd = self.workdir / f"worker-{n}"
        wd.mkdir()
        self._spawn(f"worker-{n}", ["org.apache.spark.deploy.worker.Worker", self.url, "--host", "127.0.0.1",
                                    "--cores", "1", "--memory", "1g", "--webui-port", str(free_port()),
                                    "--work-dir", str(wd)])
        self._wait(lambda: self.master_log.read_text(errors="replace").count("Registering worker") >= n,
                   f"worker {n}")

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, 15)
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
                p.wait()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--topics", type=int, default=16)
    ap.add_argument("--ledgers", type=int, default=8)
    ap.add_argument("--entries", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=1, help="runs per configuration (the fastest is reported)")
    args = ap.parse_args(argv)
    os.environ["TIERED_NO_PROGRESS"] = "1"

    with tempfile.TemporaryDirectory(prefix="spark-scaling-") as tmp:
        tmp_path = Path(tmp)
        template = make_template(tmp_path / "template", args.topics, args.ledgers, args.entries)
        print(f"workload: {args.topics} topics x {args.ledgers} sealed ledgers x {args.entries} entries "
              f"(1-3 KB); {os.cpu_count()} cores; best of {args.rounds} round(s)", flush=True)
        results: dict[str, Result] = {}
        n = 0

        def measure(name: str, master: str, cores: int, conf: list[str]) -> None:
            nonlocal n
            n += 1
            cfg = fresh_copy(template, tmp_path / f"ws-{n}")
            r = run_sweep(name, master, cfg, tmp_path, cores, conf)
            if name not in results or r.wall < results[name].wall:
                results[name] = r
            print(f"  {name}: {r.wall:.1f} s", flush=True)

        cluster = Cluster(tmp_path)
        try:
            zip_path = tmp_path / "tiered-pyfiles.zip"
            subprocess.run([str(REPO / "scripts" / "build_pyfiles.sh"), str(zip_path)], check=True,
                           capture_output=True, env={**os.environ, "PYTHON": sys.executable})
            conf = ["--py-files", str(zip_path), "--conf", "spark.executor.memory=512m"]
            cluster.add_worker()
            cluster.add_worker()
            # rounds interleave the configurations, so a change in the machine's load hits all of them;
            # "1 worker": spark.cores.max=1 gives the application one executor on one of the two workers
            for _ in range(args.rounds):
                measure("local[1]", "local[1]", 1, [])
                measure("local[2]", "local[2]", 2, [])
                measure("cluster, 1 worker", cluster.url, 1, [*conf, "--conf", "spark.cores.max=1"])
                measure("cluster, 2 workers", cluster.url, 2, conf)
                # the JVM options the stacks use (C1 compiler only, serial GC): docker/spark-conf
                measure("local[1], tuned", "local[1]", 1, ["--properties-file", str(TUNED)])
                measure("cluster 2w, tuned", cluster.url, 2, [*conf, "--properties-file", str(TUNED)])
        finally:
            cluster.stop()

    base = results["local[1]"]
    print(f"\n{'run':<20} {'wall s':>7} {'vs local[1]':>11} {'planning':>9} {'start-up':>9} {'distributed':>12} "
          f"{'report':>7} {'offload in tasks':>17} {'executors':>9}")
    for r in results.values():
        p = r.phases
        print(f"{r.name:<20} {r.wall:>7.1f} {base.wall / r.wall:>10.2f}x {p['planning']:>9.2f} "
              f"{p['session_startup']:>9.2f} {p['distributed_work']:>12.2f} {p['report']:>7.2f} "
              f"{r.offload_seconds:>17.2f} {r.executors if r.executors is not None else '-':>9}")
    print(f"\nCPU seconds while each run ran (capacity = {os.cpu_count()} cores x wall):")
    print(f"{'run':<20} " + " ".join(f"{c:>15}" for c in CPU_CLASSES) + f" {'the run':>8} {'capacity':>9} {'busy':>6}")
    for r in results.values():
        used = sum(r.cpu.values())
        own = used - r.cpu["other processes"]  # the run's own CPU: robust against the machine's other load
        print(f"{r.name:<20} " + " ".join(f"{r.cpu[c]:>15.1f}" for c in CPU_CLASSES)
              + f" {own:>8.1f} {r.capacity:>9.1f} {used / r.capacity:>5.0%}")
    print("\nwhere the time goes (share of wall: outside the job's phases = JVM launch and shutdown; "
          "CPU share of the JVMs vs the Python workers doing the offload):")
    for r in results.values():
        phases = sum(r.phases.values())
        jvm = r.cpu["driver JVM"] + r.cpu["executor JVMs"] + r.cpu["spark daemons"]
        ours = sum(v for k, v in r.cpu.items() if k != "other processes")
        print(f"  {r.name:<20} start-up+report+launch {(r.wall - r.phases['distributed_work'] - r.phases['planning']) / r.wall:.0%}"
              f" (outside the phases {max(0.0, r.wall - phases):.1f} s); distributed {r.phases['distributed_work'] / r.wall:.0%};"
              f" CPU: JVMs {jvm / max(ours, 1e-9):.0%}, Python workers {r.cpu['python workers'] / max(ours, 1e-9):.0%},"
              f" other users of the machine {r.cpu['other processes'] / max(sum(r.cpu.values()), 1e-9):.0%}")
    print(f"\nper ledger ({base.ledgers} ledgers): distributed work "
          + ", ".join(f"{r.name} {r.phases['distributed_work'] / r.ledgers * 1000:.0f} ms" for r in results.values()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
