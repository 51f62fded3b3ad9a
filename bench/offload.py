"""Offload and read-back throughput against a plain file copy of the same bytes (not a test).

For each entry size: write ledgers totalling --total bytes into a hot tier, then --rounds times, each
phase after a `sync` so none inherits another's dirty pages:
  1. baselines: copy the ledgers' files as plain files (shutil.copyfile, i.e. `cp`: an in-kernel
     copy_file_range), and again through a 1 MiB user-space buffer; + fsync when the store fsyncs,
  2. offload every ledger to the filesystem object store (Pulsar format, 64 MiB blocks),
  3. read every entry back sequentially through the offloaded read handle (1,000 entries or ~4 MiB per
     call, as EntryBatches, what catch-up readers use; and again as Entry objects),
  4. the integrity costs: the same offload without chunk checksums, the same read without verifying
     them, and the deletion-lag cleanup's proof (every offloaded frame read back and compared with the
     hot tier's CRC32C, tieredcore.offload.verify),
and print MB/s of payload bytes (best and median over the rounds) and the ratios to the baseline. The
machines are shared virtual machines whose disk throughput swings several-fold between seconds, so the
rounds alternate the phases and both the best-of and the median ratios are printed. A last phase
offloads one --big-ledger sized ledger in a child process and reports that process's peak RSS
(VmHWM): offloading holds about two blocks, whatever the ledger size.

With --s3-total (default 256M; 0 skips) the same is measured on S3, a moto server started on loopback
by the benchmark: the offload against boto3's upload_file (its transfer manager, default concurrency) of
the same ledger files to the same server, and a catch-up read of every offloaded ledger against boto3's
download_file of the same data objects, with the GETs per 8 MiB read, and the peak RSS of a process
offloading one --s3-big-ledger sized ledger to S3. moto reads a whole object for every ranged GET, so
the S3 ledgers are --s3-ledger-size (32 MiB) each.

    .venv/bin/python bench/offload.py                       # 1 GiB per entry size, 1 KiB and 64 KiB
    .venv/bin/python bench/offload.py --total 256M --big-ledger 0
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tieredcore.cold.backends.fs import FilesystemBlobStore  # noqa: E402
from tieredcore.hot.local import LocalLedgerStore  # noqa: E402
from tieredcore.offload.offloader import LedgerOffloader  # noqa: E402
from tieredcore.offload.verify import verify_offloaded  # noqa: E402

MB = 1_000_000


def human_size(text: str) -> int:
    """'1G', '128M', '64K' or plain bytes."""
    t = text.strip().upper()
    mult = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(t[-1:], 1)
    return int(float(t[:-1] if mult > 1 else t) * mult)


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
    dst.mkdir(parents=True, exist_ok=True)
    for lid in ids:
        target = dst / f"{lid}.copy"
        shutil.copyfile(hot_root / f"{lid}.log", target)
        if fsync:
            fd = os.open(target, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)


def copy_userspace(hot_root: Path, ids: list[int], dst: Path, fsync: bool) -> None:
    """The same copy through a 1 MiB user-space buffer (what a program moving the bytes itself does)."""
    dst.mkdir(parents=True, exist_ok=True)
    for lid in ids:
        with open(hot_root / f"{lid}.log", "rb") as src, open(dst / f"{lid}.copy", "wb") as out:
            shutil.copyfileobj(src, out, 1024 * 1024)
            out.flush()
            if fsync:
                os.fsync(out.fileno())


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
        entries += verify_offloaded(h, hh.entry_crcs(), expected_sizes=hh.entry_sizes()).entries
        h.close()
        hh.close()
    return entries


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


def _s3_big_child(hot_root: str, url: str, bucket: str, lid: int, block: int, q) -> None:
    from tieredcore.cold.backends.s3 import S3BlobStore

    hot = LocalLedgerStore(hot_root)
    off = LedgerOffloader(S3BlobStore(bucket, endpoint_url=url, region="us-east-1"), max_block_size=block)
    base = _vm_kib("VmHWM")
    t0 = time.perf_counter()
    obj = off.offload(hot.open_ledger(lid), uuid.uuid4())
    q.put({"seconds": time.perf_counter() - t0, "bytes": obj.payload_bytes,
           "rss_before_kib": base, "peak_rss_kib": _vm_kib("VmHWM")})


def s3_phase(a: argparse.Namespace, root: Path, block: int) -> dict:
    """Offload and catch-up read on a moto S3 server against boto3's own transfers of the same bytes."""
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    import boto3

    from tieredcore.cold.backends.s3 import S3BlobStore

    total, es = human_size(a.s3_total), a.s3_entry_size
    proc, url = _start_moto()
    try:
        hot = LocalLedgerStore(root / "hot")
        ids = fill_ledgers(hot, total, es, human_size(a.s3_ledger_size))
        payload = sum(hot.ledger_metadata(i).length for i in ids)
        client = boto3.client("s3", endpoint_url=url, region_name="us-east-1")
        up_s, off_s, down_s, read_s, gets = [], [], [], [], []
        for rnd in range(a.rounds):
            bucket = f"bench-{rnd}"
            client.create_bucket(Bucket=bucket)
            t0 = time.perf_counter()
            for lid in ids:
                client.upload_file(str(root / "hot" / f"{lid}.log"), bucket, f"copy/{lid}")
            up_s.append(time.perf_counter() - t0)
            store = S3BlobStore(bucket, endpoint_url=url, region="us-east-1")
            off = LedgerOffloader(store, max_block_size=block)
            t0 = time.perf_counter()
            done = []
            for lid in ids:
                u = str(uuid.uuid4())
                h = hot.open_ledger(lid)
                done.append((lid, u, off.offload(h, u).data_key))
                h.close()
            off_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            for _lid, _u, key in done:
                client.download_file(bucket, key, str(root / "download"))
            down_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            requests = 0
            for lid, u, _key in done:
                h = off.read_offloaded(lid, u)
                lac = h.last_add_confirmed
                step = per_call(h)
                for first in range(0, lac + 1, step):
                    h.read_batch(first, min(first + step - 1, lac))
                requests += h.requests
                h.close()
            read_s.append(time.perf_counter() - t0)
            gets.append(requests)
            print(f"  S3 round {rnd + 1}: upload_file {payload / up_s[-1] / MB:,.0f} MB/s, offload "
                  f"{payload / off_s[-1] / MB:,.0f} MB/s, download_file {payload / down_s[-1] / MB:,.0f} MB/s, "
                  f"catch-up read {payload / read_s[-1] / MB:,.0f} MB/s ({requests} GETs)", flush=True)
        r = {
            "s3_entry_size": es, "s3_ledgers": len(ids), "s3_payload_bytes": payload, "rounds": a.rounds,
            "upload_file_MBps": payload / min(up_s) / MB, "s3_offload_MBps": payload / min(off_s) / MB,
            "s3_offload_ratio": min(up_s) / min(off_s),
            "s3_offload_ratio_median": statistics.median(up_s) / statistics.median(off_s),
            "download_file_MBps": payload / min(down_s) / MB, "s3_read_MBps": payload / min(read_s) / MB,
            "s3_read_ratio": min(down_s) / min(read_s),
            "s3_read_ratio_median": statistics.median(down_s) / statistics.median(read_s),
            "s3_gets_per_8MiB": gets[-1] / (payload / (8 << 20)),
        }
        print(f"S3 (moto), {es} B entries, {len(ids)} ledgers, {payload / 2**20:,.0f} MiB, best of {a.rounds} | "
              f"offload {r['s3_offload_MBps']:,.0f} MB/s vs upload_file {r['upload_file_MBps']:,.0f} MB/s "
              f"(x{r['s3_offload_ratio']:.2f}; median x{r['s3_offload_ratio_median']:.2f}) | catch-up read "
              f"{r['s3_read_MBps']:,.0f} MB/s vs download_file {r['download_file_MBps']:,.0f} MB/s "
              f"(x{r['s3_read_ratio']:.2f}; median x{r['s3_read_ratio_median']:.2f}), "
              f"{r['s3_gets_per_8MiB']:.2f} GETs per 8 MiB", flush=True)
        big = human_size(a.s3_big_ledger)
        if big:
            (lid,) = fill_ledgers(hot, big, 65536, big)
            client.create_bucket(Bucket="bench-big")
            ctx = mp.get_context("spawn")
            q = ctx.Queue()
            p = ctx.Process(target=_s3_big_child, args=(str(root / "hot"), url, "bench-big", lid, block, q))
            p.start()
            m = q.get()
            p.join()
            r["s3_big_ledger"] = m
            print(f"S3 big ledger {big / 2**20:,.0f} MiB offloaded in {m['seconds']:.1f}s; peak RSS of the "
                  f"offloading process {m['peak_rss_kib'] / 1024:,.0f} MiB (at start {m['rss_before_kib'] / 1024:,.0f} "
                  f"MiB; block size {block / 2**20:.0f} MiB, parts sent 4 at a time)", flush=True)
        return r
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(root, ignore_errors=True)


def _vm_kib(field: str) -> int:
    """VmHWM / VmRSS of this process from /proc (ru_maxrss would include the parent's peak: it
    survives exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return -1


def _big_child(hot_root: str, store_root: str, lid: int, fsync: bool, q) -> None:
    hot = LocalLedgerStore(hot_root)
    off = LedgerOffloader(FilesystemBlobStore(store_root, fsync=fsync))
    base = _vm_kib("VmHWM")
    t0 = time.perf_counter()
    obj = off.offload(hot.open_ledger(lid), uuid.uuid4())
    q.put({"seconds": time.perf_counter() - t0, "bytes": obj.payload_bytes,
           "rss_before_kib": base, "peak_rss_kib": _vm_kib("VmHWM")})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--total", default="1G", help="payload bytes per entry size (e.g. 1G, 256M)")
    ap.add_argument("--entry-sizes", default="1024,65536")
    ap.add_argument("--ledger-size", default="128M", help="payload bytes per ledger")
    ap.add_argument("--block-size", default="64M")
    ap.add_argument("--big-ledger", default="2G", help="size of the peak-RSS ledger (0 to skip)")
    ap.add_argument("--no-fsync", action="store_true", help="neither the store nor the baseline fsyncs")
    ap.add_argument("--dir", help="scratch directory (default: a temp dir on the repo's filesystem)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds of copy / offload / read")
    ap.add_argument("--s3-total", default="256M", help="payload bytes offloaded to S3 (moto); 0 skips S3")
    ap.add_argument("--s3-entry-size", type=int, default=4096)
    ap.add_argument("--s3-ledger-size", default="32M")
    ap.add_argument("--s3-big-ledger", default="512M", help="size of the S3 peak-RSS ledger (0 to skip)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    total = human_size(a.total)
    per_ledger = human_size(a.ledger_size)
    block = human_size(a.block_size)
    fsync = not a.no_fsync
    scratch = Path(tempfile.mkdtemp(prefix="bench-offload-", dir=a.dir or Path(__file__).parent))
    results = []
    try:
        for es in (int(x) for x in a.entry_sizes.split(",")):
            root = scratch / f"e{es}"
            hot = LocalLedgerStore(root / "hot")
            t0 = time.perf_counter()
            ids = fill_ledgers(hot, total, es, per_ledger)
            gen_s = time.perf_counter() - t0
            payload = sum(hot.ledger_metadata(i).length for i in ids)

            copy_s, user_s, off_s, read_s = [], [], [], []
            nock_s, nover_s, proof_s, entry_s = [], [], [], []
            for rnd in range(a.rounds):
                for d in (root / "copy", root / "ucopy", root / "cold"):
                    shutil.rmtree(d, ignore_errors=True)
                os.sync()
                t0 = time.perf_counter()
                copy_baseline(root / "hot", ids, root / "copy", fsync)
                copy_s.append(time.perf_counter() - t0)
                os.sync()
                t0 = time.perf_counter()
                copy_userspace(root / "hot", ids, root / "ucopy", fsync)
                user_s.append(time.perf_counter() - t0)

                off = LedgerOffloader(FilesystemBlobStore(root / "cold", fsync=fsync), max_block_size=block)
                os.sync()
                t0 = time.perf_counter()
                done = []
                for lid in ids:
                    u = str(uuid.uuid4())
                    h = hot.open_ledger(lid)
                    off.offload(h, u)
                    h.close()
                    done.append((lid, u))
                off_s.append(time.perf_counter() - t0)

                os.sync()
                t0 = time.perf_counter()
                n, nb = read_back(off, done)
                read_s.append(time.perf_counter() - t0)
                assert nb == payload, (nb, payload)
                t0 = time.perf_counter()
                assert read_back(off, done, per_entry=True)[1] == payload
                entry_s.append(time.perf_counter() - t0)

                # integrity costs: reads without verifying, the lag cleanup's proof, writes without checksums
                off_nv = LedgerOffloader(FilesystemBlobStore(root / "cold", fsync=fsync), max_block_size=block,
                                         verify_reads=False)
                t0 = time.perf_counter()
                assert read_back(off_nv, done)[1] == payload
                nover_s.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                assert verify_against_hot(off, hot, done) == n
                proof_s.append(time.perf_counter() - t0)
                shutil.rmtree(root / "cold", ignore_errors=True)
                off_nc = LedgerOffloader(FilesystemBlobStore(root / "cold", fsync=fsync), max_block_size=block,
                                         checksum_chunk=0)
                os.sync()
                t0 = time.perf_counter()
                for lid in ids:
                    h = hot.open_ledger(lid)
                    off_nc.offload(h, str(uuid.uuid4()))
                    h.close()
                nock_s.append(time.perf_counter() - t0)
                print(f"  round {rnd + 1}: copy {payload / copy_s[-1] / MB:,.0f} MB/s, user-space copy "
                      f"{payload / user_s[-1] / MB:,.0f} MB/s, offload "
                      f"{payload / off_s[-1] / MB:,.0f} MB/s (no checksums {payload / nock_s[-1] / MB:,.0f}), read "
                      f"{payload / read_s[-1] / MB:,.0f} MB/s (unverified {payload / nover_s[-1] / MB:,.0f}, "
                      f"as Entry objects {payload / entry_s[-1] / MB:,.0f}), "
                      f"proof against hot {payload / proof_s[-1] / MB:,.0f} MB/s", flush=True)
            series = (("copy", copy_s), ("user", user_s), ("offload", off_s), ("read", read_s),
                      ("nock", nock_s), ("nover", nover_s), ("proof", proof_s), ("entry", entry_s))
            best = {k: min(v) for k, v in series}
            med = {k: statistics.median(v) for k, v in series}
            r = {
                "entry_size": es, "ledgers": len(ids), "entries": n, "payload_bytes": payload, "rounds": a.rounds,
                "generate_MBps": payload / gen_s / MB,
                "plain_copy_MBps": payload / best["copy"] / MB,
                "userspace_copy_MBps": payload / best["user"] / MB,
                "offload_ratio_userspace": best["user"] / best["offload"],
                "read_ratio_userspace": best["user"] / best["read"],
                "offload_MBps": payload / best["offload"] / MB,
                "read_MBps": payload / best["read"] / MB,
                "offload_ratio": best["copy"] / best["offload"],
                "read_ratio": best["copy"] / best["read"],
                "offload_ratio_median": med["copy"] / med["offload"],
                "read_ratio_median": med["copy"] / med["read"],
                # integrity: what checksums cost (time with / time without, medians), and the proof's speed
                "checksum_write_cost": med["offload"] / med["nock"],
                "checksum_read_cost": med["read"] / med["nover"],
                "proof_MBps": payload / best["proof"] / MB,
                "proof_ratio": best["copy"] / best["proof"],
                "entry_read_MBps": payload / best["entry"] / MB,
                "entry_read_ratio": best["copy"] / best["entry"],
            }
            results.append(r)
            print(f"entry {es:>6} B: {len(ids)} ledgers, {payload / 2**20:,.0f} MiB, best of {a.rounds} | plain copy "
                  f"{r['plain_copy_MBps']:,.0f} MB/s | offload {r['offload_MBps']:,.0f} MB/s "
                  f"(x{r['offload_ratio']:.2f}; median x{r['offload_ratio_median']:.2f}) | sequential read "
                  f"{r['read_MBps']:,.0f} MB/s (x{r['read_ratio']:.2f}; median x{r['read_ratio_median']:.2f}; "
                  f"as Entry objects {r['entry_read_MBps']:,.0f} MB/s, x{r['entry_read_ratio']:.2f})", flush=True)
            print(f"{'':>17} against a user-space copy ({r['userspace_copy_MBps']:,.0f} MB/s): offload "
                  f"x{r['offload_ratio_userspace']:.2f}, sequential read x{r['read_ratio_userspace']:.2f}", flush=True)
            print(f"{'':>17} integrity: writing chunk checksums costs x{r['checksum_write_cost']:.2f} offload time, "
                  f"verifying them x{r['checksum_read_cost']:.2f} read time (medians); the lag cleanup's proof "
                  f"against the hot CRCs runs at {r['proof_MBps']:,.0f} MB/s (x{r['proof_ratio']:.2f} of a plain "
                  f"copy)", flush=True)
            shutil.rmtree(root)

        if human_size(a.s3_total):
            results.append(s3_phase(a, scratch / "s3", block))
        big = human_size(a.big_ledger)
        if big:
            root = scratch / "big"
            hot = LocalLedgerStore(root / "hot")
            (lid,) = fill_ledgers(hot, big, 65536, big)
            q = mp.get_context("spawn").Queue()
            p = mp.get_context("spawn").Process(
                target=_big_child, args=(str(root / "hot"), str(root / "cold"), lid, fsync, q))
            p.start()
            m = q.get()
            p.join()
            m["ledger_bytes"] = big
            results.append({"big_ledger": m})
            print(f"big ledger {big / 2**30:.1f} GiB offloaded in {m['seconds']:.1f}s; peak RSS of the "
                  f"offloading process {m['peak_rss_kib'] / 1024:,.0f} MiB (at start {m['rss_before_kib'] / 1024:,.0f} "
                  f"MiB; block size {block / 2**20:.0f} MiB)", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if a.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
