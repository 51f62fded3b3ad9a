"""Topic compaction on Spark (spark_jobs/_topic_shuffle.py) against reading the same topic through the data
source alone (not a test).

Method. A workspace is made once: one topic of Pulsar batches (--batch messages each, values of --value
bytes, keys drawn from --keys keys so each key has about --total / (--keys * --value) versions, 1% of the
messages tombstones), in --ledgers ledgers, all offloaded but the last (hot). One SparkSession (local[2])
serves every round.

  - throughput: each of --rounds rounds (at least 5; one uncounted warm-up first) times, back to back (A/B,
    then B/A), the baseline ``spark.read.format("tiered")`` of every message of the topic written to
    Spark's ``noop`` sink (every column materialised) and the candidate compact_on_spark of the topic (the
    compacted view read raw, phase one, the shuffle by key, phase two, the compacted ledger written, offloaded
    and recorded). Between rounds the topic's compaction state is removed and its objects deleted (untimed),
    so every round compacts from scratch. Reported as bench/offload.py reports: the median of the per-round
    ratios of messages per second (candidate / baseline; the baseline's time over the candidate's), the
    ratio of the medians, the best-of, and the baseline's min-max messages/s and spread ("too noisy, rerun",
    exit 3, instead of ratios past --max-spread). Target: median >= 0.5x.
  - memory (--memory): one compaction of the topic in a ``spark-submit --driver-memory 512m`` process (local
    mode: the executor is the driver's JVM) with a sampler of the resident memory of the JVM and of every
    Python worker (every 0.2 s, psutil); printed with the topic's size, so runs at two sizes show whether the
    peak follows the setting or the topic. The retained entries are checked against the keys' count.

    .venv/bin/python bench/topic_compaction.py                                  # 256 MiB, 1 M keys, 5 rounds
    .venv/bin/python bench/topic_compaction.py --total 2G --keys 10M --memory --rounds 0   # the memory run
    .venv/bin/python bench/topic_compaction.py --quick --total 16M --keys 50K --json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.offload import (  # noqa: E402
    DEFAULT_MAX_SPREAD,
    MIN_ROUNDS,
    QUICK_ROUNDS,
    TOO_NOISY_EXIT,
    Pair,
    human_size,
    run_rounds,
    spread_bound,
    summarize,
)

TOPIC = "persistent://bench/keys/table"
TARGET = 0.5
TOMBSTONE_EVERY = 100


def count(text: str) -> int:
    """A count like 10M, 50K or 1000."""
    t = text.strip().upper()
    mult = {"K": 1000, "M": 1_000_000}.get(t[-1:], 1)
    return int(float(t[:-1] if mult > 1 else t) * mult)


def make_workspace(root: Path, a: argparse.Namespace) -> dict:
    """The keyed topic (module docstring); returns its config path and sizes."""
    from tieredcore.cli import main as cli
    from tieredcore.config import Config
    from tieredcore.formats.messages import OutMessage, encode_batch
    from tieredcore.topic.writer import TopicWriter
    from tieredcore.workspace import Workspace

    ws_root = root / "ws"
    with open(os.devnull, "w") as quiet:
        old, sys.stdout = sys.stdout, quiet
        try:
            assert cli.main(["init", str(ws_root)]) == 0
        finally:
            sys.stdout = old
    config = str(ws_root / "tiered.toml")
    messages = max(a.batch, a.total // a.value)
    batches = messages // a.batch
    per_ledger = max(1, -(-batches // a.ledgers))
    rng = random.Random(7)
    value = bytes(rng.randrange(256) for _ in range(a.value))
    written = 0
    t0 = time.perf_counter()
    with Workspace(Config.load(config, env={})) as ws:
        w = TopicWriter(ws.ml, ws.hot, TOPIC)
        seq = 0
        pending: list[bytes] = []
        for b in range(batches):
            msgs = []
            for _ in range(a.batch):
                seq += 1
                key = f"key-{rng.randrange(a.keys):09d}"
                msgs.append(OutMessage(payload=b"" if seq % TOMBSTONE_EVERY == 0 else value, key=key))
            e = encode_batch(msgs, producer="bench", sequence_id=seq, publish_time=1_700_000_000_000 + b)
            written += len(e)
            pending.append(e)
            if len(pending) >= 64:
                w.append_many(pending)
                pending = []
            if (b + 1) % per_ledger == 0 and b + 1 < batches:
                if pending:
                    w.append_many(pending)
                    pending = []
                w.rollover()
            if (b + 1) % 20_000 == 0:
                print(f"  generate: {seq:,} messages, {written / 2**20:,.0f} MiB "
                      f"({time.perf_counter() - t0:.0f}s)", flush=True)
        if pending:
            w.append_many(pending)
        w.rollover()
        w.close(seal=False)
        info, _ = ws.ml.get_topic(TOPIC)
        sealed = [li.ledgerId for li in info.ledgerInfo if li.timestamp > 0]
        res = ws.topic_offloader().offload_ledgers(TOPIC, sealed[:-1])  # the newest stays hot
        assert all(r.outcome == "offloaded" for r in res), res
    return {"config": config, "messages": seq, "bytes": written, "ledgers": len(sealed),
            "offloaded": len(sealed) - 1, "seconds": round(time.perf_counter() - t0, 1)}


def reset(config: str) -> None:
    """The topic back to never compacted: its compaction state removed, the compacted ledgers' objects and
    the deletion log's records deleted."""
    from tieredcore.cold.blob import iter_objects
    from tieredcore.config import Config
    from tieredcore.formats.keys import parse_key
    from tieredcore.offload.compacted_state import PREFIX, compacted_uuids
    from tieredcore.workspace import Workspace

    with Workspace(Config.load(config, env={})) as ws:
        info, version = ws.ml.get_topic(TOPIC)
        uuids = compacted_uuids(info)
        keep = [kv for kv in info.properties if not kv.key.startswith(PREFIX)]
        del info.properties[:]
        info.properties.extend(keep)
        ws.ml.put_topic(TOPIC, info, version)
        pending = ws.deletion_log.pending()
        uuids |= {e.record.uuid for e in pending}
        prefix = ws.offloader.prefix
        doomed = [o.key for o in iter_objects(ws.store, prefix)
                  if (k := parse_key(o.key, prefix)) is not None and k.uuid in uuids]
        if doomed:
            ws.store.delete(doomed)
        ws.deletion_log.drop([e.id for e in pending])


def spark_session(driver_memory: str | None = None):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from spark_jobs.datasource import register

    b = (SparkSession.builder.appName("bench-topic-compaction").config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false").config("spark.driver.host", "127.0.0.1")
         .config("spark.driver.bindAddress", "127.0.0.1").config("spark.sql.shuffle.partitions", "8"))
    if not os.environ.get("PYSPARK_GATEWAY_PORT"):
        b = b.master("local[2]")
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def compact_once(spark, config: str) -> dict:
    from spark_jobs._topic_shuffle import compact_on_spark
    from tieredcore.config import Config

    r = compact_on_spark(spark, Config.load(config, env={}), TOPIC, as_of_ms=1_800_000_000_000, config_path=config)
    return {"messages_read": r.messages_read, "keys_seen": r.keys_seen, "keys": r.keys,
            "entries_written": r.entries_written, "bytes_read": r.bytes_read, "bytes_written": r.bytes_written,
            "seconds": round(r.seconds, 2)}


def throughput(a: argparse.Namespace, w: dict) -> dict:
    config = w["config"]
    spark = spark_session()
    try:
        src = lambda: spark.read.format("tiered").option("config", config).option("topic", TOPIC).load()  # noqa: E731
        n = src().count()
        if n != w["messages"]:
            raise RuntimeError(f"the data source read {n} messages, {w['messages']} were written")
        last: dict = {}

        def candidate() -> None:
            last.update(compact_once(spark, config))

        pair = Pair("topic_compaction", "compaction on Spark", "data source read", w["messages"] * 1_000_000,
                    run_baseline=lambda: src().write.format("noop").mode("overwrite").save(),
                    run_candidate=candidate, reset_candidate=lambda: reset(config), target=TARGET)
        run_rounds([pair], a.rounds, a.warmup, "compaction:")
        if last["messages_read"] != w["messages"]:
            raise RuntimeError(f"compaction read {last['messages_read']} messages of {w['messages']}")
    finally:
        spark.stop()
    # payload = messages x 1e6: the "MB/s" of bench/offload.py's statistics are messages per second
    s = summarize(pair.base_s, pair.cand_s, pair.payload, a.max_spread, TARGET)
    return {"case": "throughput", **s, "last_run": last}


def memory(a: argparse.Namespace, w: dict) -> dict:
    """One compaction in its own spark-submit with --driver-memory (module docstring)."""
    import psutil

    reset(w["config"])
    out = Path(w["config"]).parent / "memory.json"
    cmd = [str(Path(sys.executable).parent / "spark-submit"), "--master", "local[2]", "--driver-memory",
           a.executor_memory, "--conf", "spark.ui.enabled=false", str(Path(__file__).resolve()), "--child",
           w["config"], str(out)]
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               SPARK_LOCAL_IP="127.0.0.1", PYTHONPATH=str(ROOT))
    p = subprocess.Popen(cmd, env=env)
    peaks = {"jvm": 0, "python_worker": 0, "driver_python": 0}
    stop = threading.Event()

    def sample() -> None:
        me = psutil.Process(p.pid)
        while not stop.is_set():
            try:
                for c in [me, *me.children(recursive=True)]:
                    try:
                        rss, cmdline = c.memory_info().rss, " ".join(c.cmdline())
                    except psutil.Error:
                        continue
                    kind = ("jvm" if "java" in c.name() else "python_worker" if "pyspark.daemon" in cmdline
                            or "pyspark/worker" in cmdline or "pyspark.worker" in cmdline
                            else "driver_python" if "--child" in cmdline else None)
                    if kind:
                        peaks[kind] = max(peaks[kind], rss)
            except psutil.Error:
                pass
            stop.wait(0.2)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    rc = p.wait()
    stop.set()
    t.join()
    if rc != 0:
        raise RuntimeError(f"the memory run's spark-submit exited {rc}")
    run = json.loads(out.read_text())
    if a.check:
        run["check"] = check_against_dict(w["config"])
    return {"case": "memory", "executor_memory": a.executor_memory, "topic_bytes": w["bytes"],
            "messages": w["messages"], "peak_rss_bytes": peaks, **run}


def check_against_dict(config: str) -> dict:
    """The compacted ledger against a plain dict over the topic's messages (in this process, not Spark):
    key -> position of its latest value, tombstoned keys dropped; and each retained message's payload equal
    to the original message's at that position."""
    from tieredcore.config import Config
    from tieredcore.formats.compacted import compaction_items, latest_per_key
    from tieredcore.formats.messages import decode_entry
    from tieredcore.workspace import Workspace

    t0 = time.perf_counter()
    with Workspace(Config.load(config, env={})) as ws:
        r = ws.reader()
        want = latest_per_key(it for pos, d in r.read(TOPIC) for it in compaction_items(d, pos.ledger_id, pos.entry_id))
        got: dict = {}
        payloads: dict = {}
        for pos, d in r.read_compacted(TOPIC):
            for m in decode_entry(d, pos.ledger_id, pos.entry_id):
                if not m.compacted_out:
                    got[m.single.partition_key if m.single is not None else m.metadata.partition_key] = \
                        (m.ledger_id, m.entry_id, m.batch_index)
                    payloads[(m.ledger_id, m.entry_id, m.batch_index)] = bytes(m.payload)
        same = {k: tuple(v) for k, v in want.items()} == got
        for pos, d in r.read(TOPIC):  # the retained messages' payloads, byte for byte
            for m in decode_entry(d, pos.ledger_id, pos.entry_id):
                p = payloads.pop((m.ledger_id, m.entry_id, m.batch_index), None)
                if p is not None and p != bytes(m.payload):
                    same = False
        r.close()
    if not same or payloads:
        raise RuntimeError(f"the compacted ledger differs from the plain dict ({len(got):,} keys vs {len(want):,})")
    return {"keys": len(want), "equal": True, "seconds": round(time.perf_counter() - t0, 1)}


def child(config: str, out: str) -> int:
    spark = spark_session()
    try:
        Path(out).write_text(json.dumps(compact_once(spark, config)))
    finally:
        spark.stop()
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--total", default="256M", type=human_size, help="value bytes of the topic (e.g. 256M, 2G)")
    ap.add_argument("--keys", default="1M", type=count, help="keys the messages are drawn from (e.g. 1M, 10M)")
    ap.add_argument("--value", type=int, default=128, help="bytes per value (default 128)")
    ap.add_argument("--batch", type=int, default=100, help="messages per batch (default 100)")
    ap.add_argument("--ledgers", type=int, default=20)
    ap.add_argument("--memory", action="store_true", help="also the memory run (module docstring)")
    ap.add_argument("--executor-memory", default="512m", help="the memory run's --driver-memory (default 512m)")
    ap.add_argument("--check", action="store_true",
                    help="after the memory run, compare the compacted ledger with a plain dict (slow: minutes)")
    ap.add_argument("--dir", help="scratch directory (default: a temp dir on the repo's filesystem)")
    ap.add_argument("--rounds", type=int, help=f"interleaved rounds (default and minimum {MIN_ROUNDS}; 0: none)")
    ap.add_argument("--warmup", type=int, default=1, help="uncounted rounds first (default 1)")
    ap.add_argument("--quick", action="store_true",
                    help=f"smoke run: allow fewer than {MIN_ROUNDS} rounds (default {QUICK_ROUNDS})")
    ap.add_argument("--max-spread", type=spread_bound, default=DEFAULT_MAX_SPREAD)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.rounds is None:
        a.rounds = QUICK_ROUNDS if a.quick else MIN_ROUNDS
    if a.rounds < 0 or (0 < a.rounds < MIN_ROUNDS and not a.quick):
        ap.error(f"at least {MIN_ROUNDS} interleaved rounds (or --quick for a smoke run, 0 for none)")
    if a.rounds == 0 and not a.memory:
        ap.error("--rounds 0 measures nothing without --memory")
    for name in ("value", "batch", "ledgers", "keys", "total"):
        if getattr(a, name) < 1:
            ap.error(f"--{name} must be at least 1")
    return a


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child(argv[1], argv[2])
    a = parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="bench-topic-compaction-", dir=a.dir or ROOT))
    out: dict = {}
    try:
        w = make_workspace(scratch, a)
        print(f"workspace: {w['messages']:,} messages, {w['bytes'] / 2**20:,.1f} MiB in {w['ledgers']} ledgers "
              f"({w['offloaded']} offloaded), {a.keys:,} keys, made in {w['seconds']}s", flush=True)
        out["workspace"] = {k: v for k, v in w.items() if k != "config"}
        if a.rounds:
            t = out["throughput"] = throughput(a, w)
            if t["too_noisy"]:
                print(f"\nthroughput: too noisy, rerun (baseline spread {t['baseline_spread']:.1%})")
            else:
                print(f"\ncompaction vs data source read, messages/s: median ratio {t['median_ratio']:.2f}x "
                      f"(of medians {t['ratio_of_medians']:.2f}x, best-of {t['best_of_ratio']:.2f}x; target "
                      f">= {TARGET}x: {'met' if t['met'] else 'NOT met'}); baseline "
                      f"{t['baseline_MBps_min']:,.0f}-{t['baseline_MBps_max']:,.0f} messages/s "
                      f"(spread {t['baseline_spread']:.0%}), compaction median {t['candidate_MBps_median']:,.0f} "
                      f"messages/s; last run {t['last_run']}")
        if a.memory:
            m = out["memory"] = memory(a, w)
            mib = {k: round(v / 2**20) for k, v in m["peak_rss_bytes"].items()}
            print(f"\nmemory: {m['topic_bytes'] / 2**20:,.0f} MiB topic, {m['messages']:,} messages, "
                  f"{m['keys_seen']:,} keys ({m['keys']:,} retained) with --driver-memory {m['executor_memory']}: "
                  f"peak RSS MiB {mib}; {m['seconds']}s" + (f"; equal to a plain dict: {m['check']}" if "check" in m else ""))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    noisy = bool(out.get("throughput", {}).get("too_noisy"))
    out["exit_code"] = TOO_NOISY_EXIT if noisy else 0
    if a.json:
        print(json.dumps(out, indent=1, default=str))
    return out["exit_code"]


if __name__ == "__main__":
    sys.exit(main())
