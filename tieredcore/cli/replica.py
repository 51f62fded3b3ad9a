"""`tiered replica-sync`: bring a read replica's records up to the manifests in the bucket it follows
(docs/recovery.md "Read replicas"). Reads only in that bucket; rerunnable at any time."""

from __future__ import annotations

import argparse
from typing import Any

from tieredcore.cli.common import EXIT_FAILED, EXIT_OK, CommandGroup
from tieredcore.lifecycle.replica import lag, sync
from tieredcore.workspace import Workspace

COMMANDS = ("replica-sync",)


def add_parser(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    sub.add_parser(
        "replica-sync", parents=parents,
        help="read replica: follow the source cluster's topic manifests (reads only in its bucket)",
        description="On a read replica (tiered init DIR --replica-of STORE_URL): list the source cluster's topic "
                    "manifests, create or update each topic whose newest valid manifest is newer than the one it "
                    "was synced from, remove topics the source deleted, then show the lag. Nothing in the bucket "
                    "is written or deleted. Exit status: 0 done, 1 a topic's manifests could not be read, 2 bad "
                    "input (not a replica).",
    )


def run(a: argparse.Namespace, ws: Workspace, progress: Any = None) -> dict[str, Any]:
    rep = sync(ws)
    after = lag(ws)
    res = {**rep.as_dict(), "lag": after.as_dict()}
    res["_exit"] = EXIT_FAILED if rep.unusable_topics else EXIT_OK
    if not a.json:
        for verb, names in (("created", rep.created), ("updated", rep.replaced), ("removed", rep.removed)):
            for n in names:
                print(f"{verb:<8} {n}")
        for n, lids in sorted(rep.hot_only.items()):
            print(f"  {n}: ledger(s) {lids} only in the source's hot tier (not readable here until offloaded)")
        for x in rep.damaged_manifests:
            print(f"  damaged manifest (skipped): {x}")
        for n in rep.unusable_topics:
            print(f"  unusable: {n}: no newer manifest decodes; its record stays as it was")
        print(rep.summary())
        print(after.line())
        res["_printed"] = True
    return res


GROUP = CommandGroup(COMMANDS, add_parser, run)
