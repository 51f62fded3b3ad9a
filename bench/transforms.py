"""Chunked transforms (zstd, AES-256-GCM) against the untransformed offload, and the chunk cache's reads
(not a test).

For a compressible payload (text-like log lines) and an incompressible one (random bytes): ledgers of
--ledger-size totalling --total payload bytes written into a hot tier, then --rounds alternating rounds
(the transforms' order rotated each round), each offload after a `sync` so none inherits another's
dirty pages:
  1. offload every ledger to the filesystem object store (fsync) with each transform: ``none`` (the
     plain store, as a namespace without a transform writes), ``chunked`` (the chunked store with the
     identity transform: what chunking and manifests cost without any transform; not a namespace
     setting), ``zstd``, ``aes``, ``zstd+aes`` (LedgerOffloader over a TransformedBlobStore, as
     Workspace.offloader_at builds it for a namespace policy with that transform);
  2. sequential catch-up: every ledger read back through the offloaded read handle (1,000 entries per
     call, read buffer 1 MiB) with no chunk cache, a memory chunk cache without prefetch, and one that
     prefetches --prefetch bytes ahead.
Then, once, on the last round's objects, random single-entry reads at --reads seeded random positions:
  3. cold: each read with an empty chunk cache (and the handle's own windows dropped): GETs and bytes
     fetched from the object store per read (a counting wrapper around the inner store);
  4. warm: the same reads again through one cache the reads have filled: GETs per read.
Prints MB/s of payload bytes (best of the rounds), stored bytes (every object the store holds,
manifests included) and ratios against ``none`` measured in the same run: of the best times, the
median of the per-round ratios, and of the offloading process's CPU time (user + system, all threads;
the plain store's in-kernel copy included), which machines shared with other work disturb far less
than wall time. Targets: encryption costs at most 15% of the untransformed offload throughput (aes >=
x0.85 of none, best of rounds); a warm-cache random read issues no GET; the bytes fetched per cold
random read are at most one chunk (the mean, against the object's largest stored chunk).
--get-latency-ms adds that much to every GET of the catch-up reads (a filesystem store answers in
microseconds, so prefetching only shows what it hides against an object store's round trips). --profile runs one more offload of the
compressible payload with ``aes`` and with ``zstd+aes`` under cProfile and prints the top costs.

    .venv/bin/python bench/transforms.py                          # 512 MiB per payload, 1 KiB entries
    .venv/bin/python bench/transforms.py --total 128M --rounds 3 --profile
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
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tieredcore.cold.backends.fs import FilesystemBlobStore  # noqa: E402
from tieredcore.cold.blob import BlobStore, iter_objects  # noqa: E402
from tieredcore.cold.chunk_cache import MemoryChunkCache  # noqa: E402
from tieredcore.cold.keyring import KeyRing  # noqa: E402
from tieredcore.cold.transformed import TransformedBlobStore  # noqa: E402
from tieredcore.formats.transform import GCM_OVERHEAD, TransformSpec  # noqa: E402
from tieredcore.hot.local import LocalLedgerStore  # noqa: E402
from tieredcore.offload.cache import OffsetCache  # noqa: E402
from tieredcore.offload.offloader import LedgerOffloader  # noqa: E402

MB = 1_000_000
POOL = 16 * 1024 * 1024  # payload pool: larger than any zstd window and chunk, so entries never repeat within one
TRANSFORMS = ("none", "chunked", "zstd", "aes", "zstd+aes")
TARGET_AES_RATIO = 0.85  # encryption costs <= 15% of the untransformed offload throughput
WORDS = (b"request served in, user session expired, cache miss for key, retrying upload of part, connection "
         b"reset by peer, checkpoint written at offset, GET /api/v2/topics, 200 OK, 404 Not Found, ledger "
         b"closed, consumer acknowledged, backlog quota exceeded, broker-3, broker-7, persistent://tenant/ns"
         ).split(b", ")


def human_size(text: str) -> int:
    """'1G', '128M', '64K' or plain bytes."""
    t = text.strip().upper()
    mult = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(t[-1:], 1)
    return int(float(t[:-1] if mult > 1 else t) * mult)


# -- payloads ---------------------------------------------------------------------------------------


def text_pool(n: int, seed: int) -> bytes:
    """Log lines in JSON: what a compressible topic looks like (timestamps, ids, repeated vocabulary)."""
    rng = random.Random(seed)
    levels = (b"INFO", b"INFO", b"INFO", b"DEBUG", b"WARN", b"ERROR")
    out, size, ts = [], 0, 1_700_000_000_000
    while size < n:
        ts += rng.randrange(1, 50)
        line = (b'{"ts":%d,"level":"%s","host":"node-%02d","trace":"%016x","msg":"%s %s","user":%d,'
                b'"latency_ms":%.2f}\n' % (ts, rng.choice(levels), rng.randrange(40), rng.getrandbits(64),
                                          rng.choice(WORDS), rng.choice(WORDS), rng.randrange(100_000),
                                          rng.expovariate(0.05)))
        out.append(line)
        size += len(line)
    return b"".join(out)[:n]


def fill_ledgers(hot: LocalLedgerStore, pool: bytes, total: int, entry_size: int, per_ledger: int) -> list[int]:
    """Ledgers of consecutive pool slices (entry i is bytes i*entry_size.. of the pool, wrapping)."""
    span = len(pool) - entry_size
    ids, written, i = [], 0, 0
    while written < total:
        n_entries = max(1, min(per_ledger, total - written) // entry_size)
        led = hot.create_ledger({"application": b"bench"})
        done = 0
        while done < n_entries:
            k = min(4096, n_entries - done)
            led.append_many(pool[(j * entry_size) % span: (j * entry_size) % span + entry_size]
                            for j in range(i, i + k))
            done += k
            i += k
        led.close()
        ids.append(led.ledger_id)
        written += n_entries * entry_size
    return ids


# -- stores -----------------------------------------------------------------------------------------


@dataclass
class Counts:
    gets: int = 0  # GET requests (whole and ranged)
    heads: int = 0
    bytes: int = 0  # bytes those GETs returned

    def copy(self) -> Counts:
        return Counts(self.gets, self.heads, self.bytes)

    def minus(self, o: Counts) -> Counts:
        return Counts(self.gets - o.gets, self.heads - o.heads, self.bytes - o.bytes)


class CountingStore:
    """Counts the requests a reader sends to the object store (prefetch threads included)."""

    def __init__(self, inner: BlobStore, latency_s: float = 0.0) -> None:
        self.inner = inner
        self.latency_s = latency_s
        self.counts = Counts()
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:  # everything else: the inner store's
        return getattr(self.inner, name)

    def _add(self, gets: int, heads: int, n: int) -> None:
        with self._lock:
            self.counts.gets += gets
            self.counts.heads += heads
            self.counts.bytes += n

    def get(self, key: str) -> bytes:
        if self.latency_s:
            time.sleep(self.latency_s)  # an object store's round trip
        b = self.inner.get(key)
        self._add(1, 0, len(b))
        return b

    def get_range(self, key: str, start: int, end: int) -> bytes:
        if self.latency_s:
            time.sleep(self.latency_s)
        b = self.inner.get_range(key, start, end)
        self._add(1, 0, len(b))
        return b

    def head(self, key: str):
        self._add(0, 1, 0)
        return self.inner.head(key)


def spec_of(transform: str, chunk: int, level: int) -> TransformSpec:
    return TransformSpec("none" if transform == "chunked" else transform, chunk_size=chunk, level=level)


def writer(transform: str, cold: Path, a, ring: KeyRing) -> LedgerOffloader:
    """The offloader a namespace with this transform writes with (Workspace.offloader_at)."""
    store: Any = FilesystemBlobStore(cold, fsync=a.fsync)
    if transform != "none":
        spec = spec_of(transform, a.chunk, a.level)
        store = TransformedBlobStore(store, spec, ring if spec.encryption else None)
    return LedgerOffloader(store, max_block_size=a.block)


def reader(transform: str, cold: Path, ring: KeyRing, cache: MemoryChunkCache | None, latency_s: float = 0.0
           ) -> tuple[LedgerOffloader, CountingStore, TransformedBlobStore | None]:
    """A reading offloader over a counting store (chunked objects through their manifests)."""
    counting = CountingStore(FilesystemBlobStore(cold, fsync=False), latency_s)
    ts = None
    store: Any = counting
    if transform != "none":
        ts = store = TransformedBlobStore(counting, TransformSpec("none"), ring, chunk_cache=cache)
    return LedgerOffloader(store, offset_cache=OffsetCache()), counting, ts


def offload_all(off: LedgerOffloader, hot: LocalLedgerStore, ids: list[int]) -> list[tuple[int, str]]:
    done = []
    for lid in ids:
        u = str(uuid.uuid4())
        h = hot.open_ledger(lid)
        off.offload(h, u)
        h.close()
        done.append((lid, u))
    return done


def stored_bytes(cold: Path) -> int:
    return sum(o.size for o in iter_objects(FilesystemBlobStore(cold, fsync=False)))


def largest_stored_chunk(ts: TransformedBlobStore, done: list[tuple[int, str]], off: LedgerOffloader) -> int:
    """The largest transformed chunk of the data objects (what 'one chunk' fetched costs)."""
    big = 0
    for lid, u in done:
        h = off.read_offloaded(lid, u)
        idx = ts.open(h.key).manifest.index
        big = max(big, max(idx.chunk(i).transformed_size for i in range(idx.count)))
        h.close()
    return big


def read_back(off: LedgerOffloader, done: list[tuple[int, str]]) -> int:
    nbytes = 0
    for lid, u in done:
        h = off.read_offloaded(lid, u)
        lac = h.last_add_confirmed
        for first in range(0, lac + 1, 1000):
            nbytes += sum(len(e.data) for e in h.read(first, min(first + 999, lac)))
        h.close()
    return nbytes


# -- phases -----------------------------------------------------------------------------------------

SEQ_MODES = ("nocache", "cache", "prefetch")


def sequential(transform: str, cold: Path, ring: KeyRing, done, payload: int, a) -> dict[str, float]:
    """Catch-up read MB/s of every ledger: no chunk cache, a cache without prefetch, with prefetch."""
    out = {}
    for mode in SEQ_MODES if transform != "none" else ("nocache",):
        cache = None if mode == "nocache" else MemoryChunkCache(a.cache_size, prefetch=a.prefetch if mode == "prefetch"
                                                                else 0)
        off, _, _ = reader(transform, cold, ring, cache, a.get_latency_ms / 1000)
        t0 = time.perf_counter()
        got = read_back(off, done)
        out[mode] = time.perf_counter() - t0
        assert got == payload, (transform, mode, got, payload)
        if cache is not None:
            cache.close()
    return out


def random_reads(transform: str, cold: Path, ring: KeyRing, done, a) -> dict[str, Any]:
    """Single-entry reads at seeded random positions: cold (empty chunk cache each read), then warm."""
    off, counting, ts = reader(transform, cold, ring, None)
    before = counting.counts.copy()
    handles = [off.read_offloaded(lid, u) for lid, u in done]
    opened = counting.counts.minus(before)
    sizes = [h.last_add_confirmed + 1 for h in handles]
    rng = random.Random(a.seed)
    picks = []
    for _ in range(a.reads):
        g = rng.randrange(sum(sizes))
        k = 0
        while g >= sizes[k]:
            g -= sizes[k]
            k += 1
        picks.append((k, g))

    def one(k: int, eid: int) -> tuple[Counts, float]:
        h = handles[k]
        h.close()  # drop the handle's own windows: the chunk cache (or the store) serves the read
        c0 = counting.counts.copy()
        t0 = time.perf_counter()
        got = h.read(eid, eid)
        dt = time.perf_counter() - t0
        assert len(got) == 1 and got[0].entry_id == eid and len(got[0].data) == a.entry_size
        return counting.counts.minus(c0), dt

    cold_c, cold_t = [], []
    for k, eid in picks:
        if ts is not None:
            ts.cache = MemoryChunkCache(a.cache_size)
        c, dt = one(k, eid)
        cold_c.append(c)
        cold_t.append(dt)
    r: dict[str, Any] = {
        "reads": a.reads, "open_gets": opened.gets / len(handles), "open_heads": opened.heads / len(handles),
        "cold_gets": statistics.mean(c.gets for c in cold_c),
        "cold_bytes": statistics.mean(c.bytes for c in cold_c),
        "cold_bytes_max": max(c.bytes for c in cold_c),
        "cold_ms": statistics.median(cold_t) * 1000,
    }
    if ts is not None:
        r["chunk_bytes"] = largest_stored_chunk(ts, done, off)
        ts.cache = MemoryChunkCache(a.cache_size)
        for k, eid in picks:  # fill
            one(k, eid)
        warm = [one(k, eid) for k, eid in picks]
        r["warm_gets"] = statistics.mean(c.gets for c, _ in warm)
        r["warm_gets_total"] = sum(c.gets for c, _ in warm)
        r["warm_ms"] = statistics.median(dt for _, dt in warm) * 1000
        r["cache"] = ts.cache.describe()
    for h in handles:
        h.close()
    return r


def profile(hot: LocalLedgerStore, ids: list[int], root: Path, ring: KeyRing, a) -> None:
    for t in ("aes", "zstd+aes"):
        cold = root / f"profile-{t}"
        shutil.rmtree(cold, ignore_errors=True)
        off = writer(t, cold, a, ring)
        prof = cProfile.Profile()
        prof.enable()
        offload_all(off, hot, ids)
        prof.disable()
        print(f"  cProfile of one {t} offload of the compressible payload (top 12 by own time):")
        pstats.Stats(prof).sort_stats("tottime").print_stats(12)
        shutil.rmtree(cold, ignore_errors=True)


# -- the run ----------------------------------------------------------------------------------------


def run_payload(kind: str, pool: bytes, scratch: Path, ring: KeyRing, a) -> dict[str, Any]:
    root = scratch / kind
    hot = LocalLedgerStore(root / "hot")
    ids = fill_ledgers(hot, pool, a.total, a.entry_size, a.ledger_size)
    payload = sum(hot.ledger_metadata(i).length for i in ids)
    transforms = [t for t in TRANSFORMS if t in a.transforms]
    off_s: dict[str, list[float]] = {t: [] for t in transforms}
    cpu_s: dict[str, list[float]] = {t: [] for t in transforms}  # CPU time of this process, all threads
    seq_s: dict[str, dict[str, list[float]]] = {t: {m: [] for m in SEQ_MODES} for t in transforms}
    stored: dict[str, int] = {}
    done: dict[str, list[tuple[int, str]]] = {}
    for rnd in range(a.rounds):
        order = transforms[rnd % len(transforms):] + transforms[:rnd % len(transforms)]
        for t in order:
            cold = root / f"cold-{t}"
            shutil.rmtree(cold, ignore_errors=True)
            off = writer(t, cold, a, ring)
            os.sync()
            t0, c0 = time.perf_counter(), time.process_time()
            done[t] = offload_all(off, hot, ids)
            off_s[t].append(time.perf_counter() - t0)
            cpu_s[t].append(time.process_time() - c0)
            stored[t] = stored_bytes(cold)
        for t in order:
            for m, s in sequential(t, root / f"cold-{t}", ring, done[t], payload, a).items():
                seq_s[t][m].append(s)
        print(f"  {kind} round {rnd + 1}: offload " + ", ".join(
            f"{t} {payload / off_s[t][-1] / MB:,.0f}" for t in transforms) + " MB/s", flush=True)
    if a.profile and kind == "text":
        profile(hot, ids, root, ring, a)

    base = "none" if "none" in transforms else transforms[0]
    rows = {}
    for t in transforms:
        best = min(off_s[t])
        rr = random_reads(t, root / f"cold-{t}", ring, done[t], a)
        rows[t] = {
            "offload_MBps": payload / best / MB,
            "offload_ratio": min(off_s[base]) / best,
            # per round (the two offloads close in time: the machine's speed drifts between rounds)
            "offload_ratio_median": statistics.median(b / x for b, x in zip(off_s[base], off_s[t], strict=True)),
            "offload_cpu_MBps": payload / min(cpu_s[t]) / MB,
            "offload_cpu_ratio": min(cpu_s[base]) / min(cpu_s[t]),
            "stored_bytes": stored[t], "stored_ratio": stored[t] / stored[base],
            **{f"seq_{m}_MBps": payload / min(v) / MB for m, v in seq_s[t].items() if v},
            "random": rr,
        }
    hot.close()
    shutil.rmtree(root)
    return {"payload": kind, "ledgers": len(ids), "payload_bytes": payload, "entry_size": a.entry_size,
            "chunk_size": a.chunk, "rounds": a.rounds, "baseline": base, "transforms": rows}


def print_table(r: dict[str, Any], a) -> None:
    rows = r["transforms"]
    base = r["baseline"]
    print(f"\n{r['payload']} payload: {r['ledgers']} ledgers, {r['payload_bytes'] / 2**20:,.0f} MiB of "
          f"{r['entry_size']}-byte entries, chunks of {r['chunk_size'] / 2**20:g} MiB, best of {r['rounds']} "
          f"(ratios against {base} in this run; median: of the per-round ratios)"
          + (f"; catch-up reads with {a.get_latency_ms:g} ms added to each GET" if a.get_latency_ms else ""))
    print(f"  {'transform':<10}{'offload MB/s':>14}{'x ' + base:>9}{'(median)':>9}{'CPU x':>7}{'stored MiB':>12}"
          f"{'stored x':>10}"
          f"{'catch-up MB/s: no cache':>25}{'cache':>8}{'prefetch':>10}")
    for t, x in rows.items():
        seq = "".join(f"{x[k]:>{w},.0f}" if k in x else f"{'-':>{w}}"
                      for k, w in (("seq_nocache_MBps", 25), ("seq_cache_MBps", 8), ("seq_prefetch_MBps", 10)))
        print(f"  {t:<10}{x['offload_MBps']:>14,.0f}{x['offload_ratio']:>9.2f}{x['offload_ratio_median']:>9.2f}"
              f"{x['offload_cpu_ratio']:>7.2f}{x['stored_bytes'] / 2**20:>12,.1f}{x['stored_ratio']:>10.3f}{seq}")
    print(f"  random single-entry reads ({a.reads} reads; GETs and KiB fetched from the store per read; opening a "
          f"handle, not counted per read, costs the GETs shown)")
    print(f"  {'transform':<10}{'open GETs':>10}{'cold GETs':>11}{'cold KiB':>10}{'max KiB':>9}{'chunk KiB':>11}"
          f"{'cold ms':>9}{'warm GETs':>11}{'warm ms':>9}")
    for t, x in rows.items():
        rr = x["random"]
        warm = (f"{rr['warm_gets']:>11.2f}{rr['warm_ms']:>9.3f}" if "warm_gets" in rr else f"{'-':>11}{'-':>9}")
        chunk = f"{rr['chunk_bytes'] / 1024:>11,.0f}" if "chunk_bytes" in rr else f"{'-':>11}"
        print(f"  {t:<10}{rr['open_gets']:>10.1f}{rr['cold_gets']:>11.2f}{rr['cold_bytes'] / 1024:>10,.1f}"
              f"{rr['cold_bytes_max'] / 1024:>9,.1f}{chunk}{rr['cold_ms']:>9.3f}{warm}")


def targets(results: list[dict[str, Any]]) -> bool:
    ok_all = True
    parts = []
    for r in results:
        rows = r["transforms"]
        if "aes" in rows and r["baseline"] == "none":
            x = rows["aes"]["offload_ratio"]
            ok = x >= TARGET_AES_RATIO
            parts.append(f"{r['payload']}: aes offload x{x:.2f} of none (>= x{TARGET_AES_RATIO}: "
                         f"{'met' if ok else 'NOT met'}; median x{rows['aes']['offload_ratio_median']:.2f}, CPU "
                         f"x{rows['aes']['offload_cpu_ratio']:.2f})")
            ok_all &= ok
        chunked = {t: x["random"] for t, x in rows.items() if "warm_gets" in x["random"]}
        if chunked:
            warm = sum(rr["warm_gets_total"] for rr in chunked.values())
            ok = warm == 0
            parts.append(f"{r['payload']}: warm random reads issued {warm} GETs (0: {'met' if ok else 'NOT met'})")
            ok_all &= ok
            worst = max(chunked.items(), key=lambda kv: kv[1]["cold_bytes"] / kv[1]["chunk_bytes"])
            frac = worst[1]["cold_bytes"] / worst[1]["chunk_bytes"]
            ok = all(rr["cold_bytes"] <= rr["chunk_bytes"] for rr in chunked.values())
            parts.append(f"{r['payload']}: cold random read fetches at most x{frac:.2f} of a chunk on average "
                         f"({worst[0]}; <= 1 chunk: {'met' if ok else 'NOT met'})")
            ok_all &= ok
    print("targets: " + "; ".join(parts), flush=True)
    return ok_all


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--total", default="512M", help="payload bytes per payload kind (e.g. 1G, 256M)")
    ap.add_argument("--entry-size", default="1024")
    ap.add_argument("--ledger-size", default="64M", help="payload bytes per ledger")
    ap.add_argument("--block-size", default="64M")
    ap.add_argument("--chunk-size", default="4M", help="transform chunk size (the policy default)")
    ap.add_argument("--level", type=int, default=3, help="zstd level")
    ap.add_argument("--transforms", default=",".join(TRANSFORMS))
    ap.add_argument("--payloads", default="text,random", help="text (compressible), random (incompressible)")
    ap.add_argument("--reads", type=int, default=300, help="random single-entry reads per transform")
    ap.add_argument("--cache-size", default="1G", help="memory chunk cache size for the read phases")
    ap.add_argument("--prefetch", default="8M", help="chunk cache prefetch of the catch-up read with prefetch")
    ap.add_argument("--get-latency-ms", type=float, default=0.0, help="added to every GET of the catch-up reads")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-fsync", action="store_true", help="the store does not fsync")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds of offloads and catch-up reads")
    ap.add_argument("--profile", action="store_true", help="cProfile one aes and one zstd+aes offload")
    ap.add_argument("--dir", help="scratch directory (default: a temp dir on the repo's filesystem)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    a.total, a.entry_size, a.ledger_size = human_size(a.total), human_size(a.entry_size), human_size(a.ledger_size)
    a.block, a.chunk = human_size(a.block_size), human_size(a.chunk_size)
    a.cache_size, a.prefetch = human_size(a.cache_size), human_size(a.prefetch)
    a.fsync = not a.no_fsync
    a.transforms = [t.strip() for t in a.transforms.split(",")]
    bad = [t for t in a.transforms if t not in TRANSFORMS]
    if bad:
        ap.error(f"unknown transform {bad[0]!r}: one of {', '.join(TRANSFORMS)}")
    scratch = Path(tempfile.mkdtemp(prefix="bench-transforms-", dir=a.dir or Path(__file__).parent))
    results = []
    try:
        ring = KeyRing.add_key(scratch / "ring", "k1", bits=3072)
        for kind in (p.strip() for p in a.payloads.split(",")):
            pool = {"text": lambda: text_pool(POOL, a.seed), "random": lambda: os.urandom(POOL)}[kind]()
            r = run_payload(kind, pool, scratch, ring, a)
            results.append(r)
            print_table(r, a)
        print(f"(GCM adds {GCM_OVERHEAD} bytes per chunk; the 'chunked' row is the chunked store without a "
              f"transform, not a namespace setting)")
        targets(results)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if a.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
