"""`tiered recover`: rebuild the metadata store from the workspace's bucket alone (docs/recovery.md). A dry
run by default (one line per topic it would create, then a summary); --apply writes; --merge lets it add
to a store that already has records, never overwriting one."""

from __future__ import annotations

import argparse
from typing import Any

from tieredcore.cli.common import CommandGroup
from tieredcore.lifecycle.recover import recover
from tieredcore.workspace import Workspace

EXIT_OK, EXIT_FAILED = 0, 1

COMMANDS = ("recover",)


def add_parser(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    s = sub.add_parser(
        "recover", parents=parents,
        help="rebuild the metadata store from the bucket alone (dry run unless --apply)",
        description="Rebuild every topic record (ledgers, offload contexts, segments, the compacted-ledger "
                    "pointer) and the namespace and topic policies from the configured store: from each "
                    "topic's newest valid manifest, else from the V1 index objects. Ledgers whose hot copy "
                    "is gone are restored cold-only; a ledger under two uuids keeps the latest attempt and the "
                    "other is reported as an orphan. Nothing in the bucket is written or deleted. Refuses a "
                    "metadata store that already has topics or policies unless --merge (which only adds what is "
                    "missing). Exit status: 0 done, 1 something could not be recovered, 2 bad input.",
    )
    s.add_argument("--apply", action="store_true", help="write the records (default: print what it would write)")
    s.add_argument("--merge", action="store_true",
                   help="allow a store with records: add missing topics and policies, never overwrite one")


def run(a: argparse.Namespace, ws: Workspace, progress: Any = None) -> dict[str, Any]:
    rep = recover(ws, apply=a.apply, merge=a.merge)
    res = rep.as_dict()
    problems = bool(rep.not_recoverable or rep.unreadable or any(t.lost for t in rep.topics))
    res["_exit"] = EXIT_FAILED if problems else EXIT_OK
    if not a.json:
        for t in rep.topics:
            print(t.line())
        for what, items in (("damaged manifest", rep.damaged_manifests), ("stale manifest", rep.stale_manifests),
                            ("orphan (not deleted)", rep.orphans), ("unreadable", rep.unreadable),
                            ("not recoverable", rep.not_recoverable)):
            for x in items:
                print(f"  {what}: {x}")
        for topic in rep.deleted_topics:
            print(f"  deleted: {topic}: its newest manifest is a tombstone, not recreated")
        for topic in rep.fallback_topics:
            print(f"  fallback: {topic}: no usable manifest, recovered from index objects")
        print(rep.summary())
        res["_printed"] = True
    return res


GROUP = CommandGroup(COMMANDS, add_parser, run)
