"""`tiered compact-topic`: topic compaction (docs/topic-compaction.md) of one topic, in this process: the
latest value per key across every tier, written as a compacted ledger and recorded with one
compare-and-set. Not `tiered compact`, which repacks small offloaded objects and never changes data."""

from __future__ import annotations

import argparse
from typing import Any

from tieredcore.cli.common import EXIT_OK, CommandGroup, Progress
from tieredcore.lifecycle.topic_compaction import compact_topic
from tieredcore.lifecycle.topic_compaction_run import nothing_to_compact
from tieredcore.names import TopicName
from tieredcore.workspace import Workspace

COMMANDS = ("compact-topic",)


def add_parser(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    s = sub.add_parser(
        "compact-topic", parents=parents,
        help="topic compaction: keep the latest value per key (Pulsar's `topics compact`), read with "
             "`tiered read --compacted`",
        description="Compacts TOPIC up to its last confirmed position: the previous compacted ledger plus the "
                    "messages after its horizon (every tier) give the latest value per key; the compacted "
                    "ledger is offloaded as a V1 object pair and recorded in the topic record with one "
                    "compare-and-set; the previous one goes to the deletion log. Exit status: 0 compacted, or "
                    "nothing to compact (no message after the horizon: one line, nothing written); 1 when "
                    "the compaction state changed meanwhile (another run won; nothing recorded) or the data "
                    "cannot be read; 2 for an unknown topic or bad input.")
    s.add_argument("topic", help="the topic (tenant/namespace/topic or persistent://...)")
    s.add_argument("--retain-null-key", action="store_true",
                   help="keep messages without a key (Pulsar's topicCompactionRetainNullKey; default: dropped, "
                        "as Pulsar 3.2+)")


def run(a: argparse.Namespace, ws: Workspace, progress: Progress | None = None) -> dict[str, Any]:
    t = TopicName.parse(a.topic)
    why = nothing_to_compact(ws, t)  # TopicNotFoundError: exit 2
    if why is not None:
        return {"topic": t.full, "outcome": "nothing", "message": why, "_exit": EXIT_OK}
    if progress is not None:
        progress(f"compact-topic: {t.full}: reading every tier", force=True)
    # TopicCompactionError now: another run won the race (nothing recorded): exit 1, a rerun may succeed
    res = compact_topic(ws, t, retain_null_key=a.retain_null_key)
    prev = res.previous
    return {"topic": t.full, "outcome": "compacted", "horizon": str(res.horizon),
            "previous_ledger": prev.ledger_id if prev is not None else None,
            "previous_horizon": str(prev.horizon) if prev is not None else None,
            "messages_read": res.messages_read, "keys_before": res.keys_seen, "keys_after": res.keys,
            "bytes_before": res.bytes_read, "bytes_after": res.bytes_written, "entries_written": res.entries_written,
            "ledger_id": res.ledger_id, "uuid": res.uuid, "retain_null_key": a.retain_null_key,
            "seconds": round(res.seconds, 3), "_exit": EXIT_OK}


def print_human(cmd: str, res: dict[str, Any]) -> None:
    if res["outcome"] == "nothing":
        print(res["message"])
        return
    since = (f" (previous: ledger {res['previous_ledger']} up to {res['previous_horizon']})"
             if res["previous_ledger"] is not None else " (first compaction)")
    print(f"compacted {res['topic']} up to {res['horizon']}{since} in {res['seconds']:.2f} s")
    print(f"  messages read {res['messages_read']:,}")
    print(f"  keys          {res['keys_before']:,} → {res['keys_after']:,}")
    print(f"  bytes         {res['bytes_before']:,} → {res['bytes_after']:,} ({res['entries_written']:,} entries)")
    print(f"  compacted ledger {res['ledger_id']}, objects {res['uuid'] or '(none: nothing retained)'}")


GROUP = CommandGroup(COMMANDS, add_parser, run, print_human)
