"""Decoding Pulsar messages (tieredcore/formats/messages.py) against decompression alone and a plain copy
(not a test).

For each shape (message size x messages per entry x codec): a block of entries holding --block bytes of
message payloads, written by the workload generator (`tiered generate`'s entries: keys, two properties,
event times, log-like text that compresses about 3:1) into a local hot ledger and read back as one
EntryBatch, as every read handle returns entries. Then --rounds rounds, the three measurements in a
rotated order each round:
  1. decode: ``decode_entries(batch)``: every entry's CRC32C checked, its metadata parsed, its payload
     inflated and its batch split into typed messages (positions, metadata, payload views);
  2. decompress: the same entries' compressed payloads (sliced out beforehand) inflated with the same
     library, called the cheapest way it allows (LZ4: cramjam's raw block into a buffer, ZLIB: a zlib
     decompress object, ZSTD: one reused zstandard decompressor, SNAPPY: cramjam's raw Snappy); nothing
     for NONE;
  3. copy: the block's bytes copied once (``bytearray(buf)``).
Prints medians over the rounds (MB/s of message payload bytes, messages/s), the baseline's spread
((max - min) / median of the decompress times) and the ratios decompress / decode and copy / decode of
the medians. Target: decode runs at >= 0.8x the speed of decompression alone.

    .venv/bin/python bench/messages.py                        # 20 shapes, 8 MiB blocks, 7 rounds
    .venv/bin/python bench/messages.py --sizes 1K --batches 100 --codecs LZ4 --profile
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import cramjam
import zstandard

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tieredcore.cli.workload import PAYLOAD_TEXT, MessageShape, PayloadGenerator  # noqa: E402
from tieredcore.formats import compression  # noqa: E402
from tieredcore.formats.messages import decode_entries, parse_entry  # noqa: E402
from tieredcore.hot.local import LocalLedgerStore  # noqa: E402
from tieredcore.model import EntryBatch  # noqa: E402

MB = 1_000_000
TARGET = 0.8  # decode >= 0.8x the speed of decompression alone


def size_arg(text: str) -> int:
    t = text.strip().upper()
    mult = {"K": 1024, "M": 1024**2}.get(t[-1:], 1)
    return int(t[:-1] if mult > 1 else t) * mult


@dataclass
class Block:
    batch: EntryBatch
    codec: int
    payloads: list[tuple[memoryview, int]]  # (compressed payload, uncompressed size) per entry
    message_bytes: int
    messages: int


def build_block(root: Path, msg_size: int, per_entry: int, codec: int, block_bytes: int) -> Block:
    entries = max(block_bytes // (msg_size * per_entry), 4)
    size = msg_size * per_entry  # the generator splits an entry's bytes evenly over its messages
    shape = MessageShape(1_700_000_000_000, 10, per_entry, per_entry, (codec,), keys=100, properties=2)
    gen = PayloadGenerator(1, "bench/messages/persistent/t", size, size, PAYLOAD_TEXT, shape)
    hot = LocalLedgerStore(root / f"hot-{msg_size}-{per_entry}-{codec}")
    w = hot.create_ledger()
    w.append_many(list(gen.payloads(0, entries)))
    w.close()
    h = hot.open_ledger(w.ledger_id)
    batch = h.read_batch(0, entries - 1)
    h.close()
    hot.close()
    mv = memoryview(batch.buf)
    msgs = decode_entries(batch)
    payloads = []
    for s, n in zip(batch.starts, batch.lengths, strict=True):
        frame = parse_entry(mv[s : s + n])
        payloads.append((frame.payload, frame.metadata.uncompressed_size))
    return Block(batch, codec, payloads, sum(len(m.payload) for m in msgs), len(msgs))


def decompressor(codec: int) -> Callable[[list[tuple[memoryview, int]]], None] | None:
    """Decompression alone, with the library Pulsar's codec maps to, called its cheapest way."""
    if codec == compression.LZ4:
        def run(ps):
            for p, n in ps:
                cramjam.lz4.decompress_block_into(p, bytearray(n))
    elif codec == compression.ZLIB:
        def run(ps):
            for p, n in ps:
                zlib.decompressobj().decompress(p, n + 1)
    elif codec == compression.ZSTD:
        d = zstandard.ZstdDecompressor()

        def run(ps):
            for p, _ in ps:
                d.decompress(p)
    elif codec == compression.SNAPPY:
        def run(ps):
            for p, _ in ps:
                cramjam.snappy.decompress_raw(p)
    else:
        return None
    return run


def timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def measure(block: Block, rounds: int) -> dict[str, list[float]]:
    dec = decompressor(block.codec)
    steps: dict[str, Callable[[], object]] = {
        "decode": lambda: decode_entries(block.batch),
        "copy": lambda: bytearray(block.batch.buf),
    }
    if dec is not None:
        steps["decompress"] = lambda: dec(block.payloads)
    times: dict[str, list[float]] = {k: [] for k in steps}
    names = list(steps)
    for r in range(rounds):
        for k in names[r % len(names):] + names[: r % len(names)]:  # rotated: no step always first
            times[k].append(timed(steps[k]))
    return times


def report(label: str, block: Block, times: dict[str, list[float]]) -> tuple[str, float | None]:
    med = {k: statistics.median(v) for k, v in times.items()}
    mbs = {k: block.message_bytes / v / MB for k, v in med.items()}
    ratio = None
    base = "-"
    if "decompress" in med:
        t = times["decompress"]
        spread = (max(t) - min(t)) / med["decompress"]
        ratio = med["decompress"] / med["decode"]
        base = f"{mbs['decompress']:9,.0f} ±{spread:4.0%}"
    line = (f"{label:<22} {block.messages:>7,} {mbs['decode']:9,.0f} {block.messages / med['decode'] / 1e6:7.2f}  "
            f"{base:>15}  {mbs['copy']:8,.0f}  "
            f"{'-' if ratio is None else f'{ratio:5.2f}x':>7}  {med['copy'] / med['decode']:6.3f}x  "
            f"{'' if ratio is None else ('ok' if ratio >= TARGET else 'MISSED')}")
    return line, ratio


def profile(block: Block) -> None:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(3):
        decode_entries(block.batch)
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(12)
    print(out.getvalue())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1K,16K", help="message payload sizes")
    ap.add_argument("--batches", default="1,100", help="messages per entry")
    ap.add_argument("--codecs", default="NONE,LZ4,ZLIB,ZSTD,SNAPPY")
    ap.add_argument("--block", type=size_arg, default=8 * 1024 * 1024, help="message payload bytes per block")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--profile", action="store_true", help="cProfile the decode of each shape")
    args = ap.parse_args()
    sizes = [size_arg(s) for s in args.sizes.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    codecs = [compression.codec(c) for c in args.codecs.split(",")]
    print(f"blocks of {args.block / 2**20:.0f} MiB of message payloads, {args.rounds} rounds; medians; MB/s of "
          "message payload bytes")
    print(f"{'shape':<22} {'msgs':>7} {'decode':>9} {'Mmsg/s':>7}  {'decompress':>15}  {'copy':>8}  "
          f"{'dec/dcmp':>7}  {'dec/copy':>7}")
    missed = []
    with tempfile.TemporaryDirectory(prefix="bench-messages-") as tmp:
        for size in sizes:
            for per_entry in batches:
                for codec in codecs:
                    block = build_block(Path(tmp), size, per_entry, codec, args.block)
                    label = f"{size // 1024}KiB x{per_entry} {compression.name(codec)}"
                    line, ratio = report(label, block, measure(block, args.rounds))
                    print(line, flush=True)
                    if ratio is not None and ratio < TARGET:
                        missed.append(label)
                    if args.profile:
                        profile(block)
    print(f"target: decode >= {TARGET}x decompression alone: "
          + ("met by every compressed shape" if not missed else f"missed by {', '.join(missed)}"))


if __name__ == "__main__":
    main()
