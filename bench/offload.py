"""Offload and read-back throughput against a plain copy of the same bytes, on the median (not a test).

Method. Every measured case is a pair: a baseline (a plain copy of the same bytes) and a candidate (what
the project does). Each of --rounds rounds (at least 5) times every pair back to back, baseline then
candidate, and the next round candidate then baseline (A/B, then B/A), each side after an `os.sync()`, so
both sides of a ratio see the same disk weather and neither always goes first. Per case it reports:

  - the MEDIAN first: the median of the per-round ratios (baseline time / candidate time of the same
    round; > 1 means faster than the baseline), and the ratio of the medians;
  - the best-of ratio second (best baseline / best candidate): what a lucky round shows, not what users get;
  - the baseline's spread: its min-max MB/s over the rounds and (max - min) / median. When that spread
    exceeds --max-spread the disk swung too much within the run for any ratio to mean something: the case
    prints "too noisy, rerun" instead of ratios, the JSON says so, and the exit code is 3;
  - the issue's target (medians) and whether the median ratio meets it.

Cases, per entry size (--entry-sizes; ledgers totalling --total bytes written into a hot tier first):
  - fs offload: every ledger offloaded to the filesystem object store (Pulsar format, 64 MiB blocks)
    vs `cp` (shutil.copyfile, an in-kernel copy_file_range) of the ledgers' files, + fsync when the store
    fsyncs;
  - sequential read: every entry read back through the offloaded read handle, 1,000 entries or ~4 MiB per
    call, as EntryBatches (what catch-up readers use), vs the same `cp`;
  - Entry reads: the same read as Entry objects, vs `cp`;
  - the lag cleanup's proof: every offloaded frame read back and compared with the hot tier's CRC32C
    (tieredcore.offload.verify), vs `cp`;
  - secondary, the integrity costs: the offload without chunk checksums and the read without verifying
    them, each vs `cp` (no target; the cost of the checksums is the ratio of the candidates' medians).
With --s3-total (default 256M; 0 skips) on a moto server started on loopback: the S3 offload vs boto3's
upload_file (its transfer manager, default concurrency) of the same ledger files, and a catch-up read of
every offloaded ledger vs boto3's download_file of the same data objects, with the GETs per 8 MiB. moto
reads a whole object for every ranged GET, so the S3 ledgers are --s3-ledger-size (32 MiB) each.
Last, the peak RSS (VmHWM) of a child process offloading one --big-ledger sized ledger to the filesystem
store, and one --s3-big-ledger sized ledger to S3: target at most 2 blocks + 64 MiB, whatever the size.

Exit codes: 0 measured; 2 bad arguments; 3 at least one case too noisy (its ratios withheld).
--quick allows fewer than 5 rounds (default 2: one A/B and one B/A) for smoke runs; its figures are not
measurements.

    .venv/bin/python bench/offload.py                       # 1 GiB per entry size, 1 KiB and 64 KiB
    .venv/bin/python bench/offload.py --total 128M --big-ledger 0 --s3-total 128M
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tieredcore.cold.backends.fs import FilesystemBlobStore  # noqa: E402
from tieredcore.hot.local import LocalLedgerStore  # noqa: E402
from tieredcore.offload.offloader import LedgerOffloader  # noqa: E402
from tieredcore.offload.verify import hot_frame_ranges, verify_offloaded  # noqa: E402

MB = 1_000_000
MiB = 1 << 20
MIN_ROUNDS = 5
QUICK_ROUNDS = 2
TOO_NOISY_EXIT = 3  # 2 is argparse's usage error
# Default bound on the baseline's spread, (max - min) / median of its MB/s over the rounds; see README.md
# ("Benchmarks": how it was chosen).
DEFAULT_MAX_SPREAD = 0.25

# The targets (medians, ratio to the baseline), by case and entry size; None: no target.
TARGETS: dict[tuple[str, int | None], float] = {
    ("fs_offload", 1024): 0.9,
    ("fs_offload", 65536): 0.9,
    ("read_batches", 1024): 1.0,
    ("read_entries", 1024): 0.6,
    ("proof", 1024): 0.8,
    ("s3_offload", None): 0.95,
    ("s3_catchup", None): 1.0,
}


def target_for(case: str, entry_size: int | None) -> float | None:
    return TARGETS.get((case, entry_size))


def human_size(text: str) -> int:
    """'1G', '128M', '64K' or plain bytes; a clear error for anything else."""
    t = text.strip().upper()
    mult = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(t[-1:], 1)
    try:
        n = int(float(t[:-1] if mult > 1 else t) * mult)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (bytes, or a number with K, M or G)") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"a size cannot be negative: {text!r}")
    return n


def entry_sizes(text: str) -> list[int]:
    """'1024,65536': entry sizes in bytes, each at least 1."""
    try:
        sizes = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"entry sizes are comma-separated byte counts, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"entry sizes must be at least 1 byte, got {text!r}")
    return sizes


def spread_bound(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--max-spread is a fraction such as 0.25, got {text!r}") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"--max-spread must be above 0, got {text!r}")
    return v


# ---- the method: interleaved pairs and their statistics (pure, tested in tests/test_bench_offload.py) ----


def _nothing() -> None:
    return None


@dataclass
class Pair:
    """One measured case: a baseline and a candidate, timed back to back in every round."""

    key: str  # JSON key, e.g. "fs_offload_1024"
    what: str
    baseline: str
    payload: int  # bytes moved by either side, for MB/s
    run_baseline: Callable[[], object]
    run_candidate: Callable[[], object]
    target: float | None = None
    primary: bool = True  # False: a secondary line (integrity costs)
    baseline_repeat: int = 1  # run_baseline runs the baseline this many times: its time is divided by it
    # untimed, before each side: clear what the last run left (copies, objects), build handles
    reset_baseline: Callable[[], object] = _nothing
    reset_candidate: Callable[[], object] = _nothing
    base_s: list[float] = field(default_factory=list)
    cand_s: list[float] = field(default_factory=list)


def round_order(rnd: int) -> tuple[str, str]:
    """Round 0, 2, 4...: baseline first; 1, 3, 5...: candidate first, so neither always goes first."""
    return ("baseline", "candidate") if rnd % 2 == 0 else ("candidate", "baseline")


def time_pair(pair: Pair, rnd: int, sync: Callable[[], None] | None = None,
              clock: Callable[[], float] = time.perf_counter) -> tuple[float, float]:
    """Time both sides of `pair` for round `rnd`, in round_order(rnd), each after its reset and a sync;
    return (baseline seconds, candidate seconds)."""
    took: dict[str, float] = {}
    for side in round_order(rnd):
        reset, run = ((pair.reset_baseline, pair.run_baseline) if side == "baseline"
                      else (pair.reset_candidate, pair.run_candidate))
        reset()
        (sync or os.sync)()  # neither side inherits the other's dirty pages
        t0 = clock()
        run()
        took[side] = clock() - t0
    return took["baseline"] / pair.baseline_repeat, took["candidate"]


def spread_of(mbps: list[float]) -> float:
    """(max - min) / median: how far the rounds swung, as a fraction of the typical round."""
    return (max(mbps) - min(mbps)) / statistics.median(mbps)


def summarize(base_s: list[float], cand_s: list[float], payload: int, max_spread: float,
              target: float | None = None) -> dict:
    """The statistics of one case: medians first, best-of second, the baseline's spread, the verdict.

    Ratios are baseline time / candidate time (> 1: the candidate is faster). When the baseline's spread
    exceeds max_spread the ratios are withheld (None) and too_noisy is True."""
    if not base_s or len(base_s) != len(cand_s):
        raise ValueError(f"need one baseline and one candidate time per round, got {len(base_s)} and "
                         f"{len(cand_s)}")
    if min(base_s) <= 0 or min(cand_s) <= 0:
        raise ValueError("times must be positive")
    base_mbps = [payload / t / MB for t in base_s]
    med_mbps = statistics.median(base_mbps)
    spread = spread_of(base_mbps)
    too_noisy = spread > max_spread
    ratios = [b / c for b, c in zip(base_s, cand_s, strict=True)]
    out = {
        "rounds": len(base_s), "baseline_s": base_s, "candidate_s": cand_s,
        "baseline_MBps_min": min(base_mbps), "baseline_MBps_max": max(base_mbps),
        "baseline_MBps_median": med_mbps, "candidate_MBps_median": payload / statistics.median(cand_s) / MB,
        "baseline_spread": spread, "max_spread": max_spread, "too_noisy": too_noisy,
        "candidate_spread": spread_of([payload / t / MB for t in cand_s]),  # for the reader; not a bound
        "median_ratio": None, "ratio_of_medians": None, "best_of_ratio": None,
        "target": target, "met": None,
        "status": "too noisy, rerun" if too_noisy else "measured",
    }
    if not too_noisy:
        out["median_ratio"] = statistics.median(ratios)
        out["ratio_of_medians"] = statistics.median(base_s) / statistics.median(cand_s)
        out["best_of_ratio"] = min(base_s) / min(cand_s)
        if target is not None:
            out["met"] = out["median_ratio"] >= target
    return out


HEADER = (f"{'what':<38} {'baseline':<22} {'target':>7}  {'median ratio (of medians)':<26} {'best-of':>7}  "
          f"baseline MB/s min-max (spread)")


def format_case(what: str, baseline: str, s: dict) -> str:
    """One line of the table; a too-noisy case shows no ratio."""
    tgt = f">={s['target']:.2f}x" if s["target"] is not None else "-"
    base = (f"{s['baseline_MBps_min']:,.0f}-{s['baseline_MBps_max']:,.0f} "
            f"({s['baseline_spread']:.0%})")
    head = f"{what:<38} {baseline:<22} {tgt:>7}  "
    if s["too_noisy"]:
        return (f"{head}too noisy, rerun: baseline spread {s['baseline_spread']:.1%} > {s['max_spread']:.1%} "
                f"({base[:base.rindex(' (')]} MB/s)")
    verdict = "" if s["met"] is None else ("  met" if s["met"] else "  NOT met")
    med = f"{s['median_ratio']:.2f}x ({s['ratio_of_medians']:.2f}x)"
    return f"{head}{med:<26} {s['best_of_ratio']:>6.2f}x  {base}{verdict}"


# ---- the filesystem cases ----


def fill_ledgers(hot: LocalLedgerStore, total: int, entry_size: int, per_ledger: int) -> list[int]:
    payload_pool = os.urandom(entry_size * 64 + 64)
    ids = []
    written = 0
    while written < total:
        n_entries = max(1, min(per_ledger, total - written) // entry_size)
        led = hot.create_ledger({"application": b"bench"})
        batch = 4096
        done = 0
        while done < n_entries:
            k = min(batch, n_entries - done)
            led.append_many(payload_pool[(i % 64) * 1 : (i % 64) + entry_size] for i in range(done, done + k))
            done += k
        led.close()
        ids.append(led.ledger_id)
        written += n_entries * entry_size
    return ids


def copy_baseline(hot_root: Path, ids: list[int], dst: Path, fsync: bool) -> None:
    """`cp` of every ledger's file (an in-kernel copy), + fsync when the store fsyncs."""
    dst.mkdir(parents=True, exist_ok=True)
    for lid in ids:
        target = dst / f"{lid}.copy"
        shutil.copyfile(hot_root / f"{lid}.log", target)
        if fsync:
            fd = os.open(target, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)


def per_call(h) -> int:
    """Entries per read call: 1,000, or fewer to keep a call near 4 MiB (a catch-up reader's batch)."""
    return max(1, min(1000, (4 << 20) // max(1, h.length // (h.last_add_confirmed + 1))))


def read_back(off: LedgerOffloader, done: list[tuple[int, str]], per_entry: bool = False) -> tuple[int, int]:
    """Every entry, per_call() at a time: batches (what catch-up readers use), or Entry objects."""
    entries = nbytes = 0
    for lid, u in done:
        h = off.read_offloaded(lid, u)
        lac = h.last_add_confirmed
        step = per_call(h)
        for first in range(0, lac + 1, step):
            if per_entry:
                got = h.read(first, min(first + step - 1, lac))
                entries += len(got)
                nbytes += sum(len(e.data) for e in got)
            else:
                b = h.read_batch(first, min(first + step - 1, lac))
                entries += len(b)
                nbytes += b.payload_bytes
        h.close()
    return entries, nbytes


def verify_against_hot(off: LedgerOffloader, hot: LocalLedgerStore, done: list[tuple[int, str]]) -> int:
    """The deletion-lag cleanup's proof for every ledger: its whole offloaded copy against the hot CRCs."""
    entries = 0
    for lid, u in done:
        h, hh = off.read_offloaded(lid, u), hot.open_ledger(lid)
        entries += verify_offloaded(h, hh.entry_crcs(), expected_sizes=hh.entry_sizes(),
                                    expected_ranges=hot_frame_ranges(hh)).entries
        h.close()
        hh.close()
    return entries


def _expect(what: str, got: tuple[int, int] | int, want: tuple[int, int] | int) -> None:
    """A benchmark that moved the wrong bytes measured nothing: stop (not an assert: -O drops those)."""
    if got != want:
        raise RuntimeError(f"{what}: got {got}, expected {want}")


@dataclass
class FsCase:
    """One entry size's ledgers in a hot tier, and what the candidates share within a round."""

    root: Path
    hot: LocalLedgerStore
    ids: list[int]
    entries: int
    payload: int
    block: int
    fsync: bool
    off: LedgerOffloader | None = None
    off_unverified: LedgerOffloader | None = None
    done: list[tuple[int, str]] = field(default_factory=list)

    def offloader(self, cold: str, **kw) -> LedgerOffloader:
        return LedgerOffloader(FilesystemBlobStore(self.root / cold, fsync=self.fsync), max_block_size=self.block,
                               **kw)

    def clear_copy(self) -> None:
        shutil.rmtree(self.root / "copy", ignore_errors=True)

    def copy(self) -> None:
        copy_baseline(self.root / "hot", self.ids, self.root / "copy", self.fsync)

    def fresh_cold(self) -> None:
        shutil.rmtree(self.root / "cold", ignore_errors=True)
        self.off, self.done = self.offloader("cold"), []

    def offload(self) -> None:
        for lid in self.ids:
            u = str(uuid.uuid4())
            h = self.hot.open_ledger(lid)
            self.off.offload(h, u)
            h.close()
            self.done.append((lid, u))

    def offload_without_checksums(self) -> None:
        off = self.offloader("cold-nock", checksum_chunk=0)
        for lid in self.ids:
            h = self.hot.open_ledger(lid)
            off.offload(h, str(uuid.uuid4()))
            h.close()

    def read(self, per_entry: bool = False, verify: bool = True) -> None:
        off = self.off if verify else self.off_unverified
        _expect("read back", read_back(off, self.done, per_entry), (self.entries, self.payload))

    def unverified_reader(self) -> None:
        self.off_unverified = self.offloader("cold", verify_reads=False)

    def proof(self) -> None:
        _expect("proof", verify_against_hot(self.off, self.hot, self.done), self.entries)

    def pairs(self, es: int) -> list[Pair]:
        """The cases of this entry size, in the order each round times them (the offload first: the
        others read what it wrote)."""
        size = f"{es // 1024} KiB" if es % 1024 == 0 else f"{es} B"
        cp = "cp + fsync" if self.fsync else "cp"
        common = {"baseline": cp, "payload": self.payload, "run_baseline": self.copy,
                  "reset_baseline": self.clear_copy}
        nock_reset = lambda: shutil.rmtree(self.root / "cold-nock", ignore_errors=True)  # noqa: E731
        return [
            Pair(f"fs_offload_{es}", f"fs offload, {size}", run_candidate=self.offload,
                 reset_candidate=self.fresh_cold, target=target_for("fs_offload", es), **common),
            Pair(f"read_batches_{es}", f"sequential read (batches), {size}", run_candidate=self.read,
                 target=target_for("read_batches", es), **common),
            Pair(f"read_entries_{es}", f"Entry reads, {size}", run_candidate=lambda: self.read(per_entry=True),
                 target=target_for("read_entries", es), **common),
            Pair(f"proof_{es}", f"lag cleanup's proof, {size}", run_candidate=self.proof,
                 target=target_for("proof", es), **common),
            Pair(f"offload_no_checksums_{es}", f"  offload, no chunk checksums, {size}",
                 run_candidate=self.offload_without_checksums, reset_candidate=nock_reset, primary=False,
                 **common),
            Pair(f"read_unverified_{es}", f"  read w/o verifying, {size}",
                 run_candidate=lambda: self.read(verify=False), reset_candidate=self.unverified_reader,
                 primary=False, **common),
        ]


def run_rounds(pairs: list[Pair], rounds: int, warmup: int, label: str,
               before: Callable[[int], object] = lambda i: None) -> None:
    """`warmup` uncounted rounds, then `rounds` counted ones; each times every pair back to back (A/B, the
    next round B/A) and is printed. `before(i)` (untimed) prepares round i."""
    for i in range(warmup + rounds):
        rnd = i - warmup  # the counted rounds start with the baseline first
        before(i)
        times = [time_pair(p, rnd) for p in pairs]
        if rnd >= 0:
            for p, (b, c) in zip(pairs, times, strict=True):
                p.base_s.append(b)
                p.cand_s.append(c)
        first = "A/B" if round_order(rnd)[0] == "baseline" else "B/A"
        name = f"round {rnd + 1}" if rnd >= 0 else "warm-up (not counted)"
        parts = [f"{p.key} {p.payload / b / MB:,.0f}/{p.payload / c / MB:,.0f}"
                 for p, (b, c) in zip(pairs, times, strict=True)]
        print(f"  {label} {name} ({first}), MB/s baseline/candidate: " + ", ".join(parts), flush=True)


def fs_cases(a: argparse.Namespace, scratch: Path, es: int) -> list[Pair]:
    root = scratch / f"e{es}"
    hot = LocalLedgerStore(root / "hot")
    ids = fill_ledgers(hot, a.total, es, a.ledger_size)
    metas = [hot.ledger_metadata(i) for i in ids]
    case = FsCase(root, hot, ids, sum(m.entries for m in metas), sum(m.length for m in metas), a.block_size,
                  not a.no_fsync)
    pairs = case.pairs(es)
    print(f"entry {es} B: {len(ids)} ledgers, {case.payload / MiB:,.0f} MiB, {case.entries:,} entries", flush=True)
    try:
        run_rounds(pairs, a.rounds, a.warmup, f"{es} B")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return pairs


# ---- S3 (a moto server on loopback) ----


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_moto() -> tuple[subprocess.Popen, str]:
    import socket

    port = _free_port()
    exe = Path(sys.executable).parent / "moto_server"
    proc = subprocess.Popen([str(exe), "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise SystemExit("moto_server did not start (run scripts/setup.sh)") from None
            time.sleep(0.05)


@dataclass
class S3Case:
    """The S3 ledgers in a hot tier, the server, and what the candidates share within a round."""

    root: Path
    hot: LocalLedgerStore
    ids: list[int]
    payload: int
    block: int
    url: str
    client: object
    bucket: str = ""
    off: LedgerOffloader | None = None
    done: list[tuple[int, str, str]] = field(default_factory=list)
    gets: list[int] = field(default_factory=list)

    def new_bucket(self, rnd: int) -> None:
        """One bucket for the run, emptied before each round (moto keeps objects in memory)."""
        if self.bucket:
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket)
            for page in pages:
                for o in page.get("Contents", []):
                    self.client.delete_object(Bucket=self.bucket, Key=o["Key"])
        else:
            self.bucket = "bench-s3"
            self.client.create_bucket(Bucket=self.bucket)

    def upload_file(self) -> None:
        for lid in self.ids:
            self.client.upload_file(str(self.root / "hot" / f"{lid}.log"), self.bucket, f"copy/{lid}")

    def fresh_offloader(self) -> None:
        """The round's offloads start afresh; the offloader (its S3 client, part buffers and threads) is
        the run's, as a workspace's is for a sweep's ledgers. upload_file's client is the run's too: a
        fresh client's first requests would be timed on one side only."""
        from tieredcore.cold.backends.s3 import S3BlobStore

        if self.off is None:
            store = S3BlobStore(self.bucket, endpoint_url=self.url, region="us-east-1")
            self.off = LedgerOffloader(store, max_block_size=self.block)
        self.done = []

    def offload(self) -> None:
        for lid in self.ids:
            u = str(uuid.uuid4())
            h = self.hot.open_ledger(lid)
            self.done.append((lid, u, self.off.offload(h, u).data_key))
            h.close()

    def download_file(self) -> None:
        for _lid, _u, key in self.done:
            self.client.download_file(self.bucket, key, str(self.root / "download"))

    def catch_up(self) -> None:
        requests = nbytes = 0
        for lid, u, _key in self.done:
            h = self.off.read_offloaded(lid, u)
            lac = h.last_add_confirmed
            step = per_call(h)
            for first in range(0, lac + 1, step):
                nbytes += h.read_batch(first, min(first + step - 1, lac)).payload_bytes
            requests += h.requests
            h.close()
        _expect("S3 catch-up read", nbytes, self.payload)
        self.gets.append(requests)

    def pairs(self) -> list[Pair]:
        return [
            Pair("s3_offload", "S3 offload (moto)", "boto3 upload_file", self.payload, self.upload_file,
                 self.offload, reset_candidate=self.fresh_offloader, target=target_for("s3_offload", None)),
            Pair("s3_catchup", "S3 catch-up read (moto)", "boto3 download_file", self.payload, self.download_file,
                 self.catch_up, target=target_for("s3_catchup", None)),
        ]


def s3_cases(a: argparse.Namespace, root: Path) -> tuple[list[Pair], dict]:
    """Offload and catch-up read on a moto S3 server against boto3's own transfers of the same bytes;
    and the peak RSS of an S3 offload of one --s3-big-ledger ledger."""
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    import boto3

    proc, url = _start_moto()
    try:
        hot = LocalLedgerStore(root / "hot")
        ids = fill_ledgers(hot, a.s3_total, a.s3_entry_size, a.s3_ledger_size)
        payload = sum(hot.ledger_metadata(i).length for i in ids)
        client = boto3.client("s3", endpoint_url=url, region_name="us-east-1")
        case = S3Case(root, hot, ids, payload, a.block_size, url, client)
        pairs = case.pairs()
        print(f"S3 (moto), {a.s3_entry_size} B entries: {len(ids)} ledgers, {payload / MiB:,.0f} MiB", flush=True)
        run_rounds(pairs, a.rounds, a.warmup, "S3", before=case.new_bucket)
        case.gets = case.gets[a.warmup:]
        info = {"s3_entry_size": a.s3_entry_size, "s3_ledgers": len(ids), "s3_payload_bytes": payload,
                "s3_gets_per_8MiB": statistics.median(case.gets) / (payload / (8 << 20))}
        if a.s3_big_ledger:
            (lid,) = fill_ledgers(hot, a.s3_big_ledger, 65536, a.s3_big_ledger)
            client.create_bucket(Bucket="bench-big")
            info["s3_big_ledger"] = peak_rss("S3", a.s3_big_ledger, a.block_size, _s3_big_child,
                                             (str(root / "hot"), url, "bench-big", lid, a.block_size))
        return pairs, info
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(root, ignore_errors=True)


# ---- peak RSS of one big ledger's offload, in a child process ----


def _vm_kib(field: str) -> int:
    """VmHWM / VmRSS of this process from /proc (ru_maxrss would include the parent's peak: it
    survives exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return -1


def _measure_offload(off: LedgerOffloader, hot: LocalLedgerStore, lid: int, q) -> None:
    base = _vm_kib("VmHWM")
    t0 = time.perf_counter()
    obj = off.offload(hot.open_ledger(lid), uuid.uuid4())
    q.put({"seconds": time.perf_counter() - t0, "bytes": obj.payload_bytes,
           "rss_before_kib": base, "peak_rss_kib": _vm_kib("VmHWM")})


def _big_child(hot_root: str, store_root: str, lid: int, block: int, fsync: bool, q) -> None:
    off = LedgerOffloader(FilesystemBlobStore(store_root, fsync=fsync), max_block_size=block)
    _measure_offload(off, LocalLedgerStore(hot_root), lid, q)


def _s3_big_child(hot_root: str, url: str, bucket: str, lid: int, block: int, q) -> None:
    from tieredcore.cold.backends.s3 import S3BlobStore

    off = LedgerOffloader(S3BlobStore(bucket, endpoint_url=url, region="us-east-1"), max_block_size=block)
    _measure_offload(off, LocalLedgerStore(hot_root), lid, q)


def rss_verdict(peak_kib: int, block: int) -> tuple[int, bool]:
    """The peak-RSS target: at most 2 blocks + 64 MiB (bytes), and whether peak_kib meets it."""
    limit = 2 * block + 64 * MiB
    return limit, peak_kib * 1024 <= limit


def peak_rss(where: str, size: int, block: int, child: Callable, args: tuple) -> dict:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=child, args=(*args, q))
    p.start()
    m = _child_result(p, q)
    limit, met = rss_verdict(m["peak_rss_kib"], block)
    m.update(where=where, ledger_bytes=size, block_size=block, target_bytes=limit, met=met)
    print(f"  {rss_line(m)}", flush=True)
    return m


def _child_result(p, q) -> dict:
    """The child's report; a clear error, not a wait forever, when it dies without one."""
    import queue

    while True:
        try:
            m = q.get(timeout=0.5)
        except queue.Empty:
            if not p.is_alive():
                p.join()
                raise RuntimeError(f"the peak-RSS child process exited with code {p.exitcode} without a "
                                   "result (its traceback is above)") from None
            continue
        p.join()
        return m


def rss_line(m: dict) -> str:
    return (f"peak RSS, {m['where']} offload of one {m['ledger_bytes'] / MiB:,.0f} MiB ledger: "
            f"{m['peak_rss_kib'] / 1024:,.0f} MiB (at start {m['rss_before_kib'] / 1024:,.0f} MiB; "
            f"{m['seconds']:.1f}s) | target <= 2 blocks + 64 MiB = {m['target_bytes'] / MiB:,.0f} MiB: "
            f"{'met' if m['met'] else 'NOT met'}")


# ---- the report ----


def checksum_costs(pairs: list[Pair], rows: list[dict]) -> dict[str, float | None]:
    """What the chunk checksums cost: candidate time with them / without them (medians, same rounds);
    None when either case's baseline was too noisy."""
    by_key = {p.key: (p, r) for p, r in zip(pairs, rows, strict=True)}
    costs: dict[str, float | None] = {}
    for key, (p, r) in by_key.items():
        kind, _, es = key.rpartition("_")
        if kind not in ("offload_no_checksums", "read_unverified"):
            continue
        with_them, wr = by_key[("fs_offload_" if kind == "offload_no_checksums" else "read_batches_") + es]
        noisy = r["too_noisy"] or wr["too_noisy"]
        cost = None if noisy else statistics.median(with_them.cand_s) / statistics.median(p.cand_s)
        costs[f"{'write' if kind == 'offload_no_checksums' else 'read'}_{es}"] = cost
        print(f"  checksums cost the {with_them.what}: "
              + ("too noisy, rerun" if noisy else f"x{cost:.2f} its time (medians of the same rounds)"))
    return costs


def report(pairs: list[Pair], out: dict, max_spread: float) -> None:
    """Print the table (medians first) and the peak RSS, and put the JSON rows into `out`."""
    rows = []
    print(f"\nmedians of {len(pairs[0].base_s) if pairs else 0} interleaved rounds (after warm-up); "
          f"ratio = baseline time / candidate time (> 1: faster); baseline spread bound {max_spread:.0%}")
    print(HEADER)
    for p in pairs:
        s = summarize(p.base_s, p.cand_s, p.payload, max_spread, p.target)
        print(format_case(p.what, p.baseline, s))
        rows.append({"case": p.key, "what": p.what.strip(), "baseline": p.baseline, "primary": p.primary,
                     "payload_bytes": p.payload, **s})
    out["cases"] = rows
    out["checksum_costs"] = checksum_costs(pairs, rows)
    if "s3" in out:
        print(f"S3 catch-up: {out['s3']['s3_gets_per_8MiB']:.2f} GETs per 8 MiB (median)")
    for m in (out.get("big_ledger"), out.get("s3", {}).get("s3_big_ledger")):
        if m:
            print(rss_line(m))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--total", default="1G", type=human_size, help="payload bytes per entry size (e.g. 1G, 128M)")
    ap.add_argument("--entry-sizes", default="1024,65536", type=entry_sizes)
    ap.add_argument("--ledger-size", default="128M", type=human_size, help="payload bytes per ledger")
    ap.add_argument("--block-size", default="64M", type=human_size)
    ap.add_argument("--big-ledger", default="2G", type=human_size, help="size of the peak-RSS ledger (0 to skip)")
    ap.add_argument("--no-fsync", action="store_true", help="neither the store nor the baseline fsyncs")
    ap.add_argument("--dir", help="scratch directory (default: a temp dir on the repo's filesystem)")
    ap.add_argument("--rounds", type=int, help=f"interleaved rounds (default and minimum {MIN_ROUNDS})")
    ap.add_argument("--warmup", type=int, default=1,
                    help="uncounted rounds first (a process's first round faults its buffers in, moto warms up)")
    ap.add_argument("--quick", action="store_true",
                    help=f"a smoke run: fewer rounds allowed (default {QUICK_ROUNDS}); not a measurement")
    ap.add_argument("--max-spread", type=spread_bound, default=DEFAULT_MAX_SPREAD,
                    help="largest baseline spread, (max-min)/median MB/s, for which a ratio is printed "
                         f"(default {DEFAULT_MAX_SPREAD})")
    ap.add_argument("--s3-total", default="256M", type=human_size,
                    help="payload bytes offloaded to S3 (moto); 0 skips S3")
    ap.add_argument("--s3-entry-size", type=int, default=4096)
    ap.add_argument("--s3-ledger-size", default="32M", type=human_size)
    ap.add_argument("--s3-big-ledger", default="512M", type=human_size,
                    help="size of the S3 peak-RSS ledger (0 to skip)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.rounds is None:
        a.rounds = QUICK_ROUNDS if a.quick else MIN_ROUNDS
    if a.rounds < 1:
        ap.error(f"--rounds must be at least 1, got {a.rounds}")
    if a.warmup < 0:
        ap.error(f"--warmup cannot be negative, got {a.warmup}")
    if a.rounds < MIN_ROUNDS and not a.quick:
        ap.error(f"--rounds {a.rounds}: a measurement needs at least {MIN_ROUNDS} interleaved rounds for its "
                 "medians; pass --quick for a smoke run")
    if a.total < 1 or a.block_size < 1 or a.ledger_size < 1 or a.s3_ledger_size < 1 or a.s3_entry_size < 1:
        ap.error("--total, --ledger-size, --block-size, --s3-ledger-size and --s3-entry-size must be above 0")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="bench-offload-", dir=a.dir or Path(__file__).parent))
    pairs: list[Pair] = []
    out: dict = {"rounds": a.rounds, "warmup_rounds": a.warmup, "quick": a.quick, "max_spread": a.max_spread,
                 "fsync": not a.no_fsync}
    try:
        for es in a.entry_sizes:
            pairs += fs_cases(a, scratch, es)
        if a.s3_total:
            s3_pairs, out["s3"] = s3_cases(a, scratch / "s3")
            pairs += s3_pairs
        if a.big_ledger:
            root = scratch / "big"
            (lid,) = fill_ledgers(LocalLedgerStore(root / "hot"), a.big_ledger, 65536, a.big_ledger)
            out["big_ledger"] = peak_rss("fs", a.big_ledger, a.block_size, _big_child,
                                         (str(root / "hot"), str(root / "cold"), lid, a.block_size, not a.no_fsync))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report(pairs, out, a.max_spread)
    noisy = [r["case"] for r in out["cases"] if r["too_noisy"]]
    out["too_noisy"] = noisy
    out["exit_code"] = TOO_NOISY_EXIT if noisy else 0
    if noisy:
        print(f"\ntoo noisy, rerun: {', '.join(noisy)} (exit code {TOO_NOISY_EXIT})")
    if a.quick:
        print("--quick: a smoke run, not a measurement")
    if a.json:
        print(json.dumps(out, indent=2))
    return out["exit_code"]


if __name__ == "__main__":
    sys.exit(main())
