"""Workspaces built the way an operator builds them (`tiered init` + `tiered generate`), and the few
steps the tests repeat on them (the sealed ledgers of a topic, offloading some of them)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tieredcore.cli import main as cli
from tieredcore.config import CONFIG_FILE_NAME, Config
from tieredcore.offload.offloader import LedgerOffloader
from tieredcore.offload.segments import SegmentOffloader
from tieredcore.offload.streaming import SegmentOffloadResult, StreamingOffloader
from tieredcore.outcomes import Outcome
from tieredcore.workspace import Workspace

# the newest sealed ledger of every generated topic closes at END; the others INTERVAL earlier each
END_ISO = "2026-01-01T00:00:00Z"
END_MS = int(dt.datetime(2026, 1, 1, tzinfo=dt.UTC).timestamp() * 1000)
INTERVAL_S = 600
INTERVAL_MS = INTERVAL_S * 1000


def build_workspace(
    root: Path,
    namespaces: Iterable[str],
    *,
    topics: int = 1,
    ledgers: int = 3,
    entries: int = 10,
    entry_size: str = "100",
    end: str = END_ISO,
    interval_s: float = INTERVAL_S,
    open_entries: int = 0,
    store_url: str | None = None,
    config_overrides: dict[str, Any] | None = None,
    messages: bool = False,
) -> Path:
    """`topics` topics per namespace with `ledgers` sealed ledgers each (the newest ledger of a topic
    stays open, holding `open_entries` entries written at `end`); sealed ledger i of N closes at
    `end` - (N - 1 - i) * `interval_s`. Entries are opaque and exactly `entry_size` bytes (`generate
    --raw`): the protocol tests count bytes (thresholds, blocks, segments); `messages` writes Pulsar
    messages instead (`generate`'s default: framing and batches make entries larger). Returns tiered.toml."""
    if config_overrides:
        root.mkdir(parents=True, exist_ok=True)
        (root / CONFIG_FILE_NAME).write_text(Config.for_workspace(root, **config_overrides).to_toml())
    assert cli.main(["init", str(root)] + (["--store-url", store_url] if store_url else [])) == 0
    args = ["--workspace", str(root), "generate", "--topics", str(topics), "--ledgers", str(ledgers),
            "--entries", str(entries), "--entry-size", entry_size, "--end-time", end,
            "--ledger-interval", str(interval_s)] + (["--open-entries", str(open_entries)] if open_entries else [])
    if not messages:
        args.append("--raw")
    for ns in namespaces:
        args += ["--namespace", ns]
    assert cli.main(args) == 0
    return root / CONFIG_FILE_NAME


def sealed(ws: Workspace, topic: str) -> list[int]:
    """The topic's ledger ids but the newest (the open one)."""
    info, _ = ws.ml.get_topic(topic)
    return [li.ledgerId for li in info.ledgerInfo[:-1]]


def offload(ws: Workspace, topic: str, ledgers: Iterable[int], as_of: int | None = None,
            offloader: LedgerOffloader | None = None) -> dict[int, str]:
    """Offload the ledgers (the offload's clock: `as_of`); every one must succeed. ledger -> uuid."""
    kw: dict[str, Any] = {"offloader": offloader}
    if as_of is not None:
        kw["clock_ms"] = lambda: as_of
    res = ws.topic_offloader(**kw).offload_ledgers(topic, list(ledgers))
    assert [r.outcome for r in res] == ["offloaded"] * len(res), res
    return {r.ledger_id: r.uuid for r in res}


def offload_one(ws: Workspace, topic: str, ledger: int, offloader: LedgerOffloader | None = None) -> str:
    """Offload one ledger; its uuid."""
    return offload(ws, topic, [ledger], offloader=offloader)[ledger]


def stream(ws: Workspace, topic: str, *, max_segment_size: int = 64 * 1024, as_of: int = END_MS,
           block_size: int = 8192, force_tail: bool = True, offloader: LedgerOffloader | None = None,
           rollover_ms: int = 600_000) -> list[SegmentOffloadResult]:
    """Streaming offload (PIP-76) of the topic's pending entries into segments of at most
    `max_segment_size` bytes (blocks of `block_size`, one block per multipart part), at logical time
    `as_of` (also the clock of its assigned/offloaded timestamps); every segment must land."""
    seg = SegmentOffloader(offloader or ws.offloader, block_size=block_size, min_part_size=0)
    so = StreamingOffloader(ws.ml, ws.hot, seg, deletion_log=ws.deletion_log, leases=ws.leases,
                            clock_ms=lambda: as_of)
    res = so.offload_topic(topic, max_segment_size=max_segment_size, rollover_ms=rollover_ms, as_of_ms=as_of,
                           force_tail=force_tail)
    assert all(r.outcome in ("offloaded", Outcome.HELD) for r in res), res
    return [r for r in res if r.outcome == "offloaded"]
