"""Random single-entry reads of Pulsar-written objects before and after their entry-offsets sidecar exists,
and of this project's own objects; catch-up reads with and without recording the sidecar (not a test).

One sealed ledger of --ledger-size payload bytes of --entry-size entries is offloaded twice to each store
(the filesystem store; S3 on a moto server started on loopback, unless --no-s3):
  - as Pulsar's offloader writes it: one block (64 MiB maximum block size, so a 40 MB ledger is one
    block), the V1 index with no trailer. Written by this project's writer with checkpoint_interval = 0
    and checksum_chunk = 0, whose data object is byte for byte what tests/support/pulsar_objects.py builds
    from Pulsar's BlobStoreManagedLedgerOffloader (tests/offload/test_sidecar.py);
  - as this project writes it (8 KiB checkpoints and CRC32C chunks in the index trailer).
Then:
  1. GETs per random read: --trials trials, each on a fresh handle with an empty offset cache (a new
     reader process), of --reads single-entry reads at seeded random positions, counted with the stores'
     request counting (tieredcore.cold.requests; a stream's read-ahead GETs are waited for and counted
     with the read that started them). Phases: "pulsar, no sidecar" (today's path), "pulsar, sidecar"
     (after one full read recorded it; the sidecar's own GET, once per handle, is counted apart, like the
     index's), "own objects". Printed per trial (median and max per read, total) and over all trials.
  2. catch-up reads (every entry, 1,000 entries per read_batch call, fresh handle each): --rounds rounds
     alternating "recording off" (the baseline: a reader without a sidecar writer, today's path),
     "recording on" (the sidecar deleted before the round, so every round records; its background write
     is waited for after the timed read and timed apart) and this project's own objects. Prints the
     median seconds, the baseline's spread (min..max) and the median of the per-round ratios to the
     baseline.

With --against DIR (a source tree of another revision, e.g. ``git archive REV | tar -x -C DIR``), also
  3. catch-up reads of both objects on the filesystem store by that tree's code and by this one, in child
     processes alternating --rounds times (each the best of 5 reads): the medians, the other tree's
     spread and the median of the per-round ratios (what the read path's changes cost catch-up reads).

    .venv/bin/python bench/random_reads.py                      # 40 MB of 1 KiB entries, fs and S3
    .venv/bin/python bench/random_reads.py --ledger-size 8M --trials 3 --no-s3
    .venv/bin/python bench/random_reads.py --no-s3 --against /tmp/base
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import wait
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tieredcore.cold.backends.fs import FilesystemBlobStore  # noqa: E402
from tieredcore.cold.requests import count_requests  # noqa: E402
from tieredcore.formats.keys import offsets_key  # noqa: E402
from tieredcore.hot.local import LocalLedgerStore  # noqa: E402
from tieredcore.offload.cache import OffsetCache  # noqa: E402
from tieredcore.offload.offloader import LedgerOffloader  # noqa: E402
from tieredcore.offload.sidecar import Permit, flush_writes  # noqa: E402

PULSAR_UUID = "00000000-0000-4000-8000-0000000000aa"
OWN_UUID = "00000000-0000-4000-8000-0000000000bb"


def human_size(text: str) -> int:
    t = text.strip().upper()
    mult = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(t[-1:], 1)
    return int(float(t[:-1] if mult > 1 else t) * mult)


def permit(_md) -> Permit:
    return Permit(owner="bench")


def reader(store, record: bool) -> LedgerOffloader:
    """A new reader (an empty offset cache), writing sidecars or not."""
    return LedgerOffloader(store, offset_cache=OffsetCache(), sidecar_permit=permit if record else None)


def random_trial(store, lid: int, uuid: str, n: int, seed: int, entries: int) -> tuple[list[int], int, int]:
    """GETs of each of ``n`` random single-entry reads on a fresh handle; the sidecar's GETs; the data
    object's bytes fetched."""
    h = reader(store, False).read_offloaded(lid, uuid)
    rng = random.Random(seed)
    out = []
    try:
        for _ in range(n):
            e = rng.randrange(entries)
            with count_requests() as c:
                got = h.read(e, e)
                wait([f for _end, f in list(h._ahead.values())])  # a stream's read-ahead counts with it
            assert got[0].entry_id == e
            out.append(c.total()["GET"])
    finally:
        h.close()
    side = h.sidecar.requests if h.sidecar is not None else 0
    if side:
        out[0] -= side  # the sidecar's GET, once per handle (like the index's)
    return out, side, h.bytes_fetched


def catch_up(store, lid: int, uuid: str, record: bool) -> tuple[float, float]:
    """Seconds to read every entry (1,000 per call) on a fresh handle; then seconds until a sidecar it
    recorded was written (0 when none)."""
    h = reader(store, record).read_offloaded(lid, uuid)
    last = h.last_add_confirmed
    t0 = time.perf_counter()
    for first in range(0, last + 1, 1000):
        h.read_batch(first, min(first + 999, last))
    t1 = time.perf_counter()
    if h.sidecar is not None:
        h.sidecar.wait()
    t2 = time.perf_counter()
    h.close()
    return t1 - t0, (t2 - t1) if record else 0.0


def print_trials(name: str, trials: list[tuple[list[int], int, int]]) -> dict:
    print(f"  {name}")
    allr: list[int] = []
    for i, (gets, side, nbytes) in enumerate(trials):
        allr += gets
        extra = f" (+{side} sidecar GET)" if side else ""
        print(f"    trial {i + 1}: median {statistics.median(gets):>4} max {max(gets):>3} total {sum(gets):>4} GETs"
              f"{extra}, {nbytes / 1e6:6.2f} MB fetched, per {len(gets)} reads   {gets}")
    totals = [sum(t[0]) for t in trials]
    print(f"    all trials: median {statistics.median(allr)} / max {max(allr)} GETs per read; "
          f"per trial of {len(trials[0][0])} reads: median {statistics.median(totals)}, {min(totals)}..{max(totals)}")
    return {"median": statistics.median(allr), "max": max(allr), "totals": totals}


def store_phase(name: str, store, hot: LocalLedgerStore, lid: int, a: argparse.Namespace) -> dict:
    entries = hot.ledger_metadata(lid).last_entry_id + 1
    LedgerOffloader(store, checkpoint_interval=0, checksum_chunk=0).offload(hot.open_ledger(lid), PULSAR_UUID)
    LedgerOffloader(store).offload(hot.open_ledger(lid), OWN_UUID)
    side_key = offsets_key("", PULSAR_UUID, lid)
    print(f"\n{name}: one ledger, {entries} entries of {a.entry_size} B "
          f"({hot.ledger_metadata(lid).length / 1e6:.1f} MB payload)")
    print(f"1. GETs per random single-entry read ({a.trials} trials x {a.reads} reads, a fresh handle each)")
    res: dict = {}
    res["no_sidecar"] = print_trials("Pulsar-written, no sidecar (today)",
                                     [random_trial(store, lid, PULSAR_UUID, a.reads, t, entries)
                                      for t in range(a.trials)])
    catch_up(store, lid, PULSAR_UUID, True)  # the first full read records the sidecar
    assert store.head(side_key).size > 0
    res["sidecar"] = print_trials("Pulsar-written, sidecar recorded by one full read",
                                  [random_trial(store, lid, PULSAR_UUID, a.reads, t, entries)
                                   for t in range(a.trials)])
    res["own"] = print_trials("this project's own objects (checkpoint trailer)",
                              [random_trial(store, lid, OWN_UUID, a.reads, t, entries) for t in range(a.trials)])

    phases: dict[str, Callable[[], tuple[float, float]]] = {
        "off": lambda: catch_up(store, lid, PULSAR_UUID, False),
        "on": lambda: (store.delete([side_key]), catch_up(store, lid, PULSAR_UUID, True))[1],
        "own": lambda: catch_up(store, lid, OWN_UUID, False),
    }
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in phases}
    order = list(phases)
    for r in range(a.rounds):
        for k in order[r % 3:] + order[: r % 3]:
            times[k].append(phases[k]())
    base = [t for t, _w in times["off"]]
    print(f"2. catch-up read of every entry ({a.rounds} rounds, median seconds; baseline = recording off, "
          f"spread {min(base):.3f}..{max(base):.3f} s)")
    for k, label in (("off", "Pulsar-written, recording off (baseline)"),
                     ("on", "Pulsar-written, recording on"), ("own", "own objects")):
        secs = [t for t, _w in times[k]]
        ratios = [b / t for b, t in zip(base, secs, strict=True)]
        write = f"; sidecar write after it {statistics.median(w for _t, w in times[k]) * 1000:.1f} ms" if k == "on" else ""
        print(f"    {label:42} {statistics.median(secs):.3f} s ({min(secs):.3f}..{max(secs):.3f}), "
              f"speed x{statistics.median(ratios):.3f} of the baseline (median of per-round ratios){write}")
    res["catch_up"] = {k: [t for t, _w in v] for k, v in times.items()}
    return res


_CHILD = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
from tieredcore.cold.backends.fs import FilesystemBlobStore
from tieredcore.offload.cache import OffsetCache
from tieredcore.offload.offloader import LedgerOffloader
store, lid, out = FilesystemBlobStore(sys.argv[2]), int(sys.argv[3]), {}
for name, u in zip(("pulsar", "own"), sys.argv[4:6], strict=True):
    best = float("inf")
    for _ in range(5):
        h = LedgerOffloader(store, offset_cache=OffsetCache()).read_offloaded(lid, u)
        t0 = time.perf_counter()
        for f in range(0, h.last_add_confirmed + 1, 1000):
            h.read_batch(f, min(f + 999, h.last_add_confirmed))
        best = min(best, time.perf_counter() - t0)
        h.close()
    out[name] = best
print(json.dumps(out))
"""


def versions_phase(other: Path, store_root: Path, lid: int, rounds: int) -> None:
    """Catch-up reads by another tree's code and this one's, in alternating child processes."""
    this = Path(__file__).resolve().parents[1]
    got: dict[Path, list[dict]] = {other: [], this: []}
    for r in range(rounds):
        for tree in ((other, this) if r % 2 == 0 else (this, other)):
            cmd = [sys.executable, "-c", _CHILD, str(tree), str(store_root), str(lid), PULSAR_UUID, OWN_UUID]
            got[tree].append(json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout))
    print(f"\n3. catch-up reads by {other} (baseline) and this tree ({rounds} rounds, best of 5 each, seconds)")
    for k in ("pulsar", "own"):
        b, n = [x[k] for x in got[other]], [x[k] for x in got[this]]
        print(f"    {k:7} baseline {statistics.median(b):.4f} ({min(b):.4f}..{max(b):.4f}), this tree "
              f"{statistics.median(n):.4f} ({min(n):.4f}..{max(n):.4f}): speed "
              f"x{statistics.median(x / y for x, y in zip(b, n, strict=True)):.3f} of the baseline")


def _start_moto() -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ledger-size", default="40M", help="payload bytes of the ledger (default 40M)")
    ap.add_argument("--entry-size", type=int, default=1024)
    ap.add_argument("--reads", type=int, default=20, help="random reads per trial")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5, help="catch-up rounds per phase")
    ap.add_argument("--no-s3", action="store_true", help="the filesystem store only")
    ap.add_argument("--against", type=Path, help="another revision's source tree: compare catch-up reads")
    a = ap.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="bench-random-"))
    hot = LocalLedgerStore(root / "hot")
    w = hot.create_ledger({"application": b"bench"})
    n = human_size(a.ledger_size) // a.entry_size
    pool = os.urandom(a.entry_size * 64 + 64)
    w.append_many(pool[i % 64: i % 64 + a.entry_size] for i in range(n))
    w.close()
    store_phase("filesystem store", FilesystemBlobStore(root / "cold"), hot, w.ledger_id, a)
    if a.against is not None:
        versions_phase(a.against, root / "cold", w.ledger_id, a.rounds)
    if not a.no_s3:
        os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
        from tieredcore.cold.backends.s3 import S3BlobStore

        proc, url = _start_moto()
        try:
            store = S3BlobStore("bench-random", endpoint_url=url, region="us-east-1")
            store.client.create_bucket(Bucket="bench-random")
            store_phase(f"S3 (moto at {url})", store, hot, w.ledger_id, a)
        finally:
            proc.terminate()
            proc.wait()
    flush_writes()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
