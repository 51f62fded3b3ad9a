"""Streaming offload (PIP-76) throughput against a plain file copy, and the cold-tier lag of a slow topic
on a logical clock (not a test).

1. Throughput. For each entry size: a topic of --total payload bytes in ledgers of --ledger-size, written
   by the TopicWriter into a hot tier (SQLite metadata), then --rounds alternating rounds, each phase
   after a `sync` so none inherits another's dirty pages:
     a. baseline: copy the topic's hot ledger files as plain files (shutil.copyfile, i.e. `cp`) + fsync;
     b. the streaming offload of the whole topic (StreamingOffloader.offload_topic, the tail forced)
        into the filesystem object store (fsync), segments of --segment-size in blocks of --block-size
        (the namespace policy defaults), then the segment records are cleared for the next round.
   Prints MB/s of payload bytes (best and median of the rounds) and the ratio to the baseline measured in
   the same run (best of / median). Target: at least x0.7 at 1 KiB entries. --profile runs one more
   streaming offload of the first entry size under cProfile and prints the top costs.

2. Cold-tier lag of a slow topic, simulated on a logical clock (no sleeping, no wall clock): entries
   appended at seeded random logical times (--lag-rate entries per logical second on average, for
   --lag-duration), the hot ledger rolling over every --lag-ledger-age; a streaming offload sweep every
   --sweep logical seconds with rollover --rollover (and the default segment size, which a slow topic
   never fills: only the rollover closes its segments). An entry is readable from the store once a
   completed segment holds it; its lag is that sweep's time minus its write time. Prints the max and
   the p50 lag against the target: rollover + one sweep interval.

    .venv/bin/python bench/streaming.py                      # 1 GiB per entry size, 1 KiB and 64 KiB
    .venv/bin/python bench/streaming.py --total 128M --rounds 3
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tieredcore.cold.backends.fs import FilesystemBlobStore  # noqa: E402
from tieredcore.formats.constants import STREAMING_MIN_BLOCK_SIZE  # noqa: E402
from tieredcore.hot.local import LocalLedgerStore  # noqa: E402
from tieredcore.meta.managed_ledgers import ManagedLedgerStore  # noqa: E402
from tieredcore.meta.sqlite import SqliteMetadataStore  # noqa: E402
from tieredcore.offload.context import covered_through  # noqa: E402
from tieredcore.offload.offloader import LedgerOffloader  # noqa: E402
from tieredcore.offload.segments import S3_MIN_PART_SIZE, SegmentOffloader  # noqa: E402
from tieredcore.offload.streaming import WATERMARK_KEY, StreamingOffloader  # noqa: E402
from tieredcore.policy import DEFAULT_MAX_SEGMENT_SIZE  # noqa: E402
from tieredcore.topic.writer import TopicWriter  # noqa: E402

MB = 1_000_000
TOPIC = "bench/streaming/topic"
TARGET_RATIO_1K = 0.7


def human_size(text: str) -> int:
    """'1G', '128M', '64K' or plain bytes."""
    t = text.strip().upper()
    mult = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(t[-1:], 1)
    return int(float(t[:-1] if mult > 1 else t) * mult)


def human_ms(text: str) -> int:
    """'600', '10m', '2h' (seconds unless suffixed: s, m, h) -> milliseconds."""
    t = text.strip().lower()
    mult = {"s": 1, "m": 60, "h": 3600}.get(t[-1:], 0)
    return int(float(t[:-1] if mult else t) * (mult or 1) * 1000)


# -- 1. throughput ---------------------------------------------------------------------------------


def fill_topic(ml: ManagedLedgerStore, hot: LocalLedgerStore, total: int, entry_size: int, per_ledger: int) -> int:
    """Write ``total`` payload bytes of ``entry_size`` entries into the topic, every ledger sealed."""
    pool = os.urandom(entry_size * 64 + 64)
    n = max(1, total // entry_size)
    w = TopicWriter(ml, hot, TOPIC, max_entries=1 << 40, max_bytes=per_ledger, clock_ms=lambda: 1)
    w.append_many(pool[(i % 64): (i % 64) + entry_size] for i in range(n))
    w.close(seal=True)
    return n * entry_size


def copy_baseline(hot_root: Path, ids: list[int], dst: Path) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    for lid in ids:
        target = dst / f"{lid}.copy"
        shutil.copyfile(hot_root / f"{lid}.log", target)
        fd = os.open(target, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)


def clear_segments(ml: ManagedLedgerStore) -> None:
    """Forget every segment and the watermark (the next round offloads the whole topic again)."""
    def mutate(info) -> bool:
        for li in info.ledgerInfo:
            del li.offloadContext.offloadSegment[:]
        keep = [kv for kv in info.properties if kv.key != WATERMARK_KEY]
        del info.properties[:]
        info.properties.extend(keep)
        return True

    ml.update_topic(TOPIC, mutate)


def stream_once(ml, hot, cold: Path, block: int, part: int, seg_size: int) -> int:
    off = LedgerOffloader(FilesystemBlobStore(cold, fsync=True))
    so = StreamingOffloader(ml, hot, SegmentOffloader(off, block_size=block, min_part_size=part), clock_ms=lambda: 2)
    res = so.offload_topic(TOPIC, max_segment_size=seg_size, rollover_ms=0, as_of_ms=2, force_tail=True)
    bad = [r for r in res if r.outcome != "offloaded"]
    if bad:
        raise SystemExit(f"streaming offload failed: {bad[0].outcome}: {bad[0].error}")
    return sum(r.payload_bytes for r in res)


def throughput(a, scratch: Path) -> list[dict]:
    total, per_ledger = human_size(a.total), human_size(a.ledger_size)
    block, part, seg_size = human_size(a.block_size), human_size(a.part_size), human_size(a.segment_size)
    out = []
    for es in (int(x) for x in a.entry_sizes.split(",")):
        root = scratch / f"e{es}"
        root.mkdir(parents=True)
        meta = SqliteMetadataStore(root / "meta.db")
        ml, hot = ManagedLedgerStore(meta), LocalLedgerStore(root / "hot")
        payload = fill_topic(ml, hot, total, es, per_ledger)
        ids = [li.ledgerId for li in ml.get_topic(TOPIC)[0].ledgerInfo]
        copy_s, stream_s = [], []
        for rnd in range(a.rounds):
            for d in (root / "copy", root / "cold"):
                shutil.rmtree(d, ignore_errors=True)
            os.sync()
            t0 = time.perf_counter()
            copy_baseline(root / "hot", ids, root / "copy")
            copy_s.append(time.perf_counter() - t0)
            clear_segments(ml)
            os.sync()
            t0 = time.perf_counter()
            got = stream_once(ml, hot, root / "cold", block, part, seg_size)
            stream_s.append(time.perf_counter() - t0)
            assert got == payload, (got, payload)
            print(f"  entry {es} B round {rnd + 1}: copy {payload / copy_s[-1] / MB:,.0f} MB/s, streaming offload "
                  f"{payload / stream_s[-1] / MB:,.0f} MB/s", flush=True)
        if a.profile and not out:
            shutil.rmtree(root / "cold", ignore_errors=True)
            clear_segments(ml)
            prof = cProfile.Profile()
            prof.enable()
            stream_once(ml, hot, root / "cold", block, part, seg_size)
            prof.disable()
            print(f"  cProfile of one streaming offload at {es}-byte entries (top 15 by cumulative time):")
            pstats.Stats(prof).sort_stats("cumulative").print_stats(15)
            pstats.Stats(prof).sort_stats("tottime").print_stats(12)
        best_copy, best_stream = min(copy_s), min(stream_s)
        r = {
            "entry_size": es, "ledgers": len(ids), "payload_bytes": payload, "rounds": a.rounds,
            "copy_MBps": payload / best_copy / MB, "streaming_MBps": payload / best_stream / MB,
            "ratio": best_copy / best_stream,
            "ratio_median": statistics.median(copy_s) / statistics.median(stream_s),
        }
        out.append(r)
        target = f" (target >= x{TARGET_RATIO_1K}: {'met' if r['ratio'] >= TARGET_RATIO_1K else 'NOT met'})" \
            if es == 1024 else ""
        print(f"entry {es:>6} B: {len(ids)} ledgers, {payload / 2**20:,.0f} MiB, best of {a.rounds} | plain copy + fsync "
              f"{r['copy_MBps']:,.0f} MB/s | streaming offload {r['streaming_MBps']:,.0f} MB/s "
              f"(x{r['ratio']:.2f}; median x{r['ratio_median']:.2f}){target}", flush=True)
        meta.close()
        hot.close()
        shutil.rmtree(root)
    return out


# -- 2. cold-tier lag on a logical clock -----------------------------------------------------------


def lag(a, scratch: Path) -> dict:
    rate = a.lag_rate
    duration, sweep, rollover = human_ms(a.lag_duration), human_ms(a.sweep), human_ms(a.rollover)
    ledger_age = human_ms(a.lag_ledger_age)
    rng = random.Random(a.seed)
    root = scratch / "lag"
    root.mkdir(parents=True)
    meta = SqliteMetadataStore(root / "meta.db")
    ml, hot = ManagedLedgerStore(meta), LocalLedgerStore(root / "hot")
    clock = {"now": 0}
    w = TopicWriter(ml, hot, TOPIC, max_age_ms=ledger_age, clock_ms=lambda: clock["now"])
    off = LedgerOffloader(FilesystemBlobStore(root / "cold", fsync=False))
    so = StreamingOffloader(ml, hot, SegmentOffloader(off, block_size=64 * 1024, min_part_size=0),
                            clock_ms=lambda: clock["now"])
    # entries at seeded exponential gaps (a Poisson stream of `rate` per logical second)
    times, t = [], 0.0
    while True:
        t += rng.expovariate(rate) * 1000
        if t >= duration:
            break
        times.append(int(t))
    written: list[tuple[int, int, int]] = []  # (ledger, entry, write time)
    readable: dict[tuple[int, int], int] = {}
    segments = 0
    i = 0
    for s in range(sweep, duration + rollover + 2 * sweep, sweep):
        while i < len(times) and times[i] < s:
            clock["now"] = times[i]
            pos = w.append(b"x" * 1024)
            written.append((pos.ledger_id, pos.entry_id, times[i]))
            i += 1
        clock["now"] = s
        res = so.offload_topic(TOPIC, max_segment_size=DEFAULT_MAX_SEGMENT_SIZE, rollover_ms=rollover, as_of_ms=s)
        failed = [r for r in res if not r.ok]
        if failed:
            raise SystemExit(f"sweep at {s} ms: {failed[0].outcome}: {failed[0].error}")
        segments += sum(r.outcome == "offloaded" for r in res)
        info, _ = ml.get_topic(TOPIC)
        through = {li.ledgerId: covered_through(li) for li in info.ledgerInfo}
        for lid, eid, _wt in written:
            if (lid, eid) not in readable and eid <= through.get(lid, -1):
                readable[(lid, eid)] = s
    w.close(seal=False)
    missing = [x for x in written if (x[0], x[1]) not in readable]
    lags = sorted(readable[(lid, eid)] - wt for lid, eid, wt in written if (lid, eid) in readable)
    r = {
        "entries": len(written), "segments": segments, "never_readable": len(missing),
        "rollover_s": rollover / 1000, "sweep_s": sweep / 1000, "target_s": (rollover + sweep) / 1000,
        "max_lag_s": lags[-1] / 1000 if lags else None, "p50_lag_s": statistics.median(lags) / 1000 if lags else None,
    }
    met = not missing and lags and lags[-1] <= rollover + sweep
    print(f"cold-tier lag of a slow topic ({len(written)} entries at ~{rate:g}/s over {duration / 3.6e6:g} logical h, "
          f"ledger rollover every {ledger_age / 1000:g} s, sweep every {sweep / 1000:g} s, rollover "
          f"{rollover / 1000:g} s, {segments} segments): max {r['max_lag_s']:,.0f} s, p50 {r['p50_lag_s']:,.0f} s "
          f"(target: max <= rollover + one sweep = {r['target_s']:,.0f} s: {'met' if met else 'NOT met'}"
          f"{f'; {len(missing)} entries never readable' if missing else ''})", flush=True)
    meta.close()
    hot.close()
    return r


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--total", default="1G", help="payload bytes per entry size (e.g. 1G, 256M)")
    ap.add_argument("--entry-sizes", default="1024,65536")
    ap.add_argument("--ledger-size", default="32M", help="payload bytes per hot ledger")
    ap.add_argument("--segment-size", default=str(DEFAULT_MAX_SEGMENT_SIZE), help="max segment size")
    ap.add_argument("--block-size", default=str(STREAMING_MIN_BLOCK_SIZE), help="streaming block size")
    ap.add_argument("--part-size", default=str(S3_MIN_PART_SIZE), help="minimum multipart part size")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds of copy / streaming offload")
    ap.add_argument("--profile", action="store_true", help="cProfile one streaming offload of the first entry size")
    ap.add_argument("--lag-rate", type=float, default=0.1, help="entries per logical second (slow topic)")
    ap.add_argument("--lag-duration", default="6h", help="logical time the slow topic is written for")
    ap.add_argument("--lag-ledger-age", default="1h", help="hot ledger rollover age (logical)")
    ap.add_argument("--sweep", default="5m", help="logical time between streaming offload sweeps")
    ap.add_argument("--rollover", default="10m", help="segment rollover (max segment rollover time)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--dir", help="scratch directory (default: a temp dir on the repo's filesystem)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="bench-streaming-", dir=a.dir or Path(__file__).parent))
    results: dict = {}
    try:
        if not a.skip_throughput:
            results["throughput"] = throughput(a, scratch)
        results["lag"] = lag(a, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if a.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
