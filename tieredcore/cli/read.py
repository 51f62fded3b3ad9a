"""`tiered read`: entries across tiers, falling back to the other copy when one cannot be read."""


from __future__ import annotations

import argparse
from typing import Any

from tieredcore.cli.common import (
    CommandGroup,
    Progress,
    err,
)
from tieredcore.errors import ValidationError
from tieredcore.model import Position
from tieredcore.names import TopicName
from tieredcore.policy import READ_PRIORITIES, TIERED_FIRST
from tieredcore.workspace import Workspace

COMMANDS = ("read",)


def add_parser(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    s = sub.add_parser("read", parents=parents, help="read entries across tiers")
    s.add_argument("topic")
    s.add_argument("--from", dest="start", help="first position LEDGER:ENTRY")
    s.add_argument("--to", dest="end", help="last position LEDGER:ENTRY (inclusive)")
    s.add_argument("--limit", type=int)
    s.add_argument("--show", choices=("size", "hex", "text"), default="size")
    s.add_argument("--read-priority", choices=READ_PRIORITIES, default=TIERED_FIRST)


def run(args: argparse.Namespace, ws: Workspace, progress: Progress) -> dict[str, Any]:
    t = TopicName.parse(args.topic)
    start = Position.parse(args.start, '--from') if args.start else None
    end = Position.parse(args.end, '--to') if args.end else None
    if args.limit is not None and args.limit < 0:
        raise ValidationError(f"--limit {args.limit}: must be 0 or more")
    if start is not None and end is not None and start > end:
        raise ValidationError(f"--from {start} is after --to {end}")
    reader = ws.reader(args.read_priority)
    out = []
    try:
        for n, (pos, data) in enumerate(reader.read(t, start, end)):
            if args.limit is not None and n >= args.limit:
                break
            item = {"position": str(pos), "size": len(data)}
            if args.show == "hex":
                item["data"] = data[:64].hex()
            elif args.show == "text":
                item["data"] = data[:64].decode("utf-8", "replace")
            out.append(item)
            if not args.json:
                print(f"{pos}\t{len(data)}" + (f"\t{item['data']}" if "data" in item else ""))
    finally:
        reader.close()
    for note in reader.fallback_notes:
        err(f"tiered read: {note}")
    return {"entries": out, "tier_reads": reader.tier_reads, "fallbacks": reader.fallbacks, "_printed": True}


GROUP = CommandGroup(COMMANDS, add_parser, run)
