"""Metadata operations per second: SQLite vs ZooKeeper, the offload protocol's compare-and-set pattern.

One run, both stores, the same work: for each of --topics topics with --ledgers ledgers, what the
offload of one ledger does to metadata (docs/metadata.md, "Offloading one ledger, crash-safe"):
read the topic record and compare-and-set the attempt's uuid in it (assign), then read it again and
compare-and-set completion; then one deletion-log record appended and acknowledged per ledger (the
drain). With --threads > 1, that many threads work on distinct topics at once, and a final phase has
every thread update the *same* topic (conflicts and retries, as concurrent runners cause).

ZooKeeper is Debian's zookeeper 3.8 started here on a loopback port (tests/support/zk.py), data on the
same disk as the SQLite file; both stores sync to disk on every write (SQLite synchronous=FULL, ZooKeeper
forceSync=yes). Prints operations per second and the ratio ZooKeeper / SQLite.

    .venv/bin/python bench/metadata.py [--topics 20 --ledgers 20 --threads 4]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.zk import ZooKeeperServer  # noqa: E402
from tieredcore.formats.mlinfo import ManagedLedgerInfo  # noqa: E402
from tieredcore.meta.deletion_log import DeletionLog, DeletionRecord  # noqa: E402
from tieredcore.meta.managed_ledgers import ManagedLedgerStore  # noqa: E402
from tieredcore.meta.sqlite import SqliteMetadataStore  # noqa: E402
from tieredcore.meta.store import MetadataStore  # noqa: E402
from tieredcore.meta.zookeeper import ZkMetadataStore  # noqa: E402
from tieredcore.names import TopicName  # noqa: E402


def topic_info(ledgers: int) -> ManagedLedgerInfo:
    info = ManagedLedgerInfo()
    for i in range(ledgers):
        info.ledgerInfo.add(ledgerId=i, entries=1000, size=1 << 20, timestamp=1_700_000_000_000 + i)
    return info


def offload_pattern(store: MetadataStore, topics: list[str], ledgers: int) -> int:
    """Assign + complete per ledger (two update_topic CAS loops), then append + ack per ledger.
    Returns the number of ledgers (each: 2 reads, 2 CAS, 1 append, 1 listing share, 1 ack)."""
    mls = ManagedLedgerStore(store)
    dlog = DeletionLog(store)
    ops = 0
    for t in topics:
        for lid in range(ledgers):
            u = uuid.uuid4()

            def assign(info, lid=lid, u=u):
                ctx = info.ledgerInfo[lid].offloadContext
                ctx.uidMsb = (u.int >> 64) - (1 << 64 if u.int >> 127 else 0)
                ctx.uidLsb = (u.int & ((1 << 64) - 1)) - (1 << 64 if (u.int >> 63) & 1 else 0)

            def complete(info, lid=lid):
                info.ledgerInfo[lid].offloadContext.complete = True

            mls.update_topic(t, assign)
            mls.update_topic(t, complete)
            ops += 4  # get + CAS, twice
        recs = [DeletionRecord(topic=TopicName.parse(t).managed_ledger_name, ledger_id=lid, type="ledger",
                               reason="deletion-lag", created_ms=0) for lid in range(ledgers)]
        dlog.append(recs)
        ours = {r.id for r in recs}
        for e in dlog.due(1):
            if e.record.id in ours:
                dlog.ack(e, deleted_hot=1)
    return ops // 4


def contended(store: MetadataStore, topic: str, threads: int, per_thread: int) -> tuple[int, int]:
    """Every thread increments one property of the same topic record: CAS conflicts and retries."""
    mls = ManagedLedgerStore(store)
    conflicts = [0]
    lock = threading.Lock()

    def work() -> None:
        for _ in range(per_thread):
            attempts = [0]

            def bump(info, attempts=attempts):
                attempts[0] += 1
                info.ledgerInfo[0].size += 1

            mls.update_topic(topic, bump, max_attempts=1000)
            with lock:
                conflicts[0] += attempts[0] - 1

    ts = [threading.Thread(target=work) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return threads * per_thread * 2, conflicts[0]


def run(store: MetadataStore, name: str, args: argparse.Namespace) -> dict[str, float]:
    mls = ManagedLedgerStore(store)
    topics = [f"persistent://bench/ns{i % 4}/t{i}" for i in range(args.topics)]
    for t in topics:
        mls.create_topic(t, topic_info(args.ledgers))
    per = [topics[i :: args.threads] for i in range(args.threads)]
    counts = [0] * args.threads
    t0 = time.perf_counter()

    def worker(i: int) -> None:
        counts[i] = offload_pattern(store, per[i], args.ledgers)

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(args.threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    seq = time.perf_counter() - t0
    ops = sum(counts)
    t0 = time.perf_counter()
    cops, conflicts = contended(store, topics[0], args.threads, args.contended)
    cs = time.perf_counter() - t0
    print(f"{name:10s} offload pattern: {ops:5d} ledgers in {seq:6.2f} s = {ops / seq:7.0f} ledgers/s | "
          f"one hot topic, {args.threads} threads: {cops} ops in {cs:5.2f} s = {cops / cs:7.0f} ops/s "
          f"({conflicts} CAS conflicts retried)", flush=True)
    return {"ops_s": ops / seq, "contended_ops_s": cops / cs}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--topics", type=int, default=20)
    p.add_argument("--ledgers", type=int, default=20)
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--contended", type=int, default=50, help="updates per thread on the one hot topic")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-meta-", dir=Path(__file__).parent) as tmp:
        sq = SqliteMetadataStore(Path(tmp) / "meta.db")
        a = run(sq, "sqlite", args)
        sq.close()
        with ZooKeeperServer(Path(tmp) / "zk") as zk:
            zs = ZkMetadataStore(zk.url("/tiered-storage"))
            b = run(zs, "zookeeper", args)
            zs.close()
    print(f"ratio zookeeper / sqlite: offload pattern x{b['ops_s'] / a['ops_s']:.2f}, "
          f"one hot topic x{b['contended_ops_s'] / a['contended_ops_s']:.2f}")


if __name__ == "__main__":
    main()
