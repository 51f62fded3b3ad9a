"""What checking every Pulsar message's CRC32C adds to a deep scrub (not a test).

A deep scrub reads each offloaded copy once (tieredcore.offload.verify.verify_offloaded): structure, chunk
checksums, every frame against the hot copy's CRC32C. The message check (tieredcore.offload.message_audit)
rides on that read. This measures what it costs, to decide where the scrub runs it:

For each shape (payload bytes per entry x messages per entry): ledgers of --total bytes of generator
entries (`tiered generate`'s messages: keys, two properties, text), offloaded to a filesystem store as
this project writes them (chunk checksums, checkpoints) and as Pulsar's offloader does (neither). Then
--rounds rounds, the steps in a rotated order each round, each one a deep scrub's verification of every
ledger, the files in the page cache (what is measured is the CPU the check adds, not the disk):

  own        the project's objects against the hot CRCs, messages not checked (the baseline)
  own+msg    the same, every message's CRC32C checked too (the second witness)
  pulsar     Pulsar-written objects without a hot copy, structure only (what proved them before)
  pulsar+msg the same with the message check (what a scrub does now: the messages' CRCs are the proof)

Prints the medians (MB/s of entry payload bytes), the baseline's spread ((max - min) / median) and the
ratios own+msg / own and pulsar+msg / pulsar of the medians (time, so > 1 is slower).

    .venv/bin/python bench/scrub_messages.py                    # 3 shapes, 64 MiB each, 7 rounds
    .venv/bin/python bench/scrub_messages.py --sizes 1K --batches 1 --total 16M --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tieredcore.cli.workload import PAYLOAD_TEXT, MessageShape, PayloadGenerator  # noqa: E402
from tieredcore.cold.backends.fs import FilesystemBlobStore  # noqa: E402
from tieredcore.hot.local import LocalLedgerStore  # noqa: E402
from tieredcore.offload.offloader import LedgerOffloader  # noqa: E402
from tieredcore.offload.verify import verify_offloaded  # noqa: E402

MB = 1_000_000
LEDGER_BYTES = 16 * 1024 * 1024


def size_arg(text: str) -> int:
    t = text.strip().upper()
    mult = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(t[-1:], 1)
    return int(t[:-1] if mult > 1 else t) * mult


class Shape:
    """Ledgers of one entry shape, offloaded both ways."""

    def __init__(self, root: Path, entry_bytes: int, per_entry: int, total: int) -> None:
        self.hot = LocalLedgerStore(root / "hot")
        shape = MessageShape(1_700_000_000_000, 10, per_entry, per_entry, keys=100, properties=2)
        gen = PayloadGenerator(1, "bench/scrub/persistent/t", entry_bytes, entry_bytes, PAYLOAD_TEXT, shape)
        self.ids: list[int] = []
        self.payload = 0
        seq = 0
        while self.payload < total:
            n = max(1, min(LEDGER_BYTES, total - self.payload) // entry_bytes)
            led = self.hot.create_ledger()
            led.append_many(list(gen.payloads(seq, n)))
            led.close()
            seq += n
            self.ids.append(led.ledger_id)
            self.payload += self.hot.ledger_metadata(led.ledger_id).length
        self.entries = seq
        self.own = LedgerOffloader(FilesystemBlobStore(root / "own"))
        self.pulsar = LedgerOffloader(FilesystemBlobStore(root / "pulsar"), checkpoint_interval=0, checksum_chunk=0)
        self.copies = {name: [(lid, self._offload(off, lid)) for lid in self.ids]
                       for name, off in (("own", self.own), ("pulsar", self.pulsar))}

    def _offload(self, off: LedgerOffloader, lid: int) -> str:
        u = str(uuid.uuid4())
        off.offload(self.hot.open_ledger(lid), u)
        return u

    def scrub(self, which: str, messages: bool) -> Callable[[], None]:
        off = self.own if which == "own" else self.pulsar

        def run() -> None:
            for lid, u in self.copies[which]:
                h = off.read_offloaded(lid, u)
                try:
                    if which == "own":  # against the hot copy, as a deep scrub with a hot copy does
                        hh = self.hot.open_ledger(lid)
                        crcs, sizes = hh.entry_crcs(), hh.entry_sizes()
                        hh.close()
                        rep = verify_offloaded(h, crcs, expected_sizes=sizes, messages=messages)
                    else:  # no hot copy any more
                        rep = verify_offloaded(h, messages=messages)
                    assert rep.messages is None or rep.messages.checked == rep.entries
                finally:
                    h.close()
        return run


def measure(steps: dict[str, Callable[[], None]], rounds: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {k: [] for k in steps}
    names = list(steps)
    for r in range(rounds):
        for k in names[r % len(names):] + names[: r % len(names)]:  # rotated: no step always first
            t = time.perf_counter()
            steps[k]()
            times[k].append(time.perf_counter() - t)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="128,1K,16K", help="payload bytes per entry")
    ap.add_argument("--batches", default="1,10", help="messages per entry (0: no batching)")
    ap.add_argument("--total", type=size_arg, default=64 * 1024**2, help="payload bytes per shape")
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    print(f"{a.total / 2**20:.0f} MiB of entries per shape, {a.rounds} rounds; medians, MB/s of entry payload bytes; "
          "ratios of median times (> 1: slower)")
    print(f"{'shape':<14} {'entries':>8} {'own':>14} {'own+msg':>8} {'ratio':>6}   {'pulsar':>14} "
          f"{'pulsar+msg':>10} {'ratio':>6}")
    for size in (size_arg(s) for s in a.sizes.split(",")):
        for per_entry in (int(b) for b in a.batches.split(",")):
            with tempfile.TemporaryDirectory(prefix="bench-scrub-messages-") as tmp:
                sh = Shape(Path(tmp), size, per_entry, a.total)
                steps = {"own": sh.scrub("own", False), "own+msg": sh.scrub("own", True),
                         "pulsar": sh.scrub("pulsar", False), "pulsar+msg": sh.scrub("pulsar", True)}
                steps["own"]()  # the page cache warmed for every step alike
                steps["pulsar"]()
                times = measure(steps, a.rounds)
                med = {k: statistics.median(v) for k, v in times.items()}
                mbs = {k: sh.payload / v / MB for k, v in med.items()}

                spread = {k: f"±{(max(v) - min(v)) / med[k]:4.0%}" for k, v in times.items()}
                print(f"{size:>6}B x{per_entry:<5} {sh.entries:>8,} {mbs['own']:7,.0f} {spread['own']} "
                      f"{mbs['own+msg']:8,.0f} {med['own+msg'] / med['own']:5.2f}x   {mbs['pulsar']:7,.0f} "
                      f"{spread['pulsar']} {mbs['pulsar+msg']:10,.0f} {med['pulsar+msg'] / med['pulsar']:5.2f}x",
                      flush=True)


if __name__ == "__main__":
    main()
