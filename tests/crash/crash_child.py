"""Child process of test_crash.py (run as a script, never collected by pytest).

    crash_child.py <config.toml> <job> <kill point> <json args>

Opens the workspace the configuration names and runs ONE phase-1 producer or the phase-2 drain. The kill
point patches a method of this process only so that, at the named step, the child prints
``AT <point>`` on stdout, flushes, and blocks reading stdin: the parent SIGKILLs it there, so the process
certainly dies at that step (no sleeps, no timing).

Jobs (args is a JSON object):
  trim           trim_topic(ws, topic, as_of)                 retention trim
  delete-topic   delete_topic(ws, topic, as_of)               topic deletion
  lag-cleanup    run_work(plan_lag_cleanup(ws, None, as_of))  deletion-lag cleanup
  offload        a new offload of ledger `ledger` of `topic`  cleans up the abandoned attempt there
  offload-race   the same, but another offload attempt replaces ours between writing the objects and
                 completing (the competitor runs in this process, to completion): ours conflicts
  drain          drain(ws, as_of)                             phase 2

Kill points:
  append:<reason>  right AFTER DeletionLog.append of a batch holding a record with that reason
                   (records durable, the metadata change not done)
  ack:hot          right BEFORE the first DeletionLog.ack of a deleted hot copy (deleted, not acknowledged)
  ack:offloaded    right BEFORE the first DeletionLog.ack of deleted offloaded objects
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tieredcore.config import Config
from tieredcore.meta.deletion_log import DeletionLog
from tieredcore.workspace import Workspace


def pause(point: str) -> None:
    print(f"AT {point}", flush=True)
    sys.stdin.readline()  # the parent kills us here; EOF means it went away
    raise SystemExit(f"not killed at {point}")


def install(point: str) -> None:
    kind, _, what = point.partition(":")
    if kind == "append":
        real_append = DeletionLog.append

        def append(self, records):
            real_append(self, records)
            if any(r.reason == what for r in records):
                pause(point)

        DeletionLog.append = append
    elif kind == "ack":
        counter = {"hot": "deleted_hot", "offloaded": "deleted_offloaded"}[what]
        real_ack = DeletionLog.ack

        def ack(self, entry, **counters):
            if counters.get(counter):
                pause(point)
            return real_ack(self, entry, **counters)

        DeletionLog.ack = ack
    elif point != "none":
        raise SystemExit(f"unknown kill point {point!r}")


def run(ws: Workspace, job: str, a: dict) -> object:
    if job == "trim":
        from tieredcore.lifecycle.retention import trim_topic

        return [r.outcome for r in trim_topic(ws, a["topic"], a["as_of"])]
    if job == "delete-topic":
        from tieredcore.lifecycle.retention import delete_topic

        return delete_topic(ws, a["topic"], a["as_of"]).as_dict()
    if job == "lag-cleanup":
        from tieredcore.lifecycle.runner import run_work
        from tieredcore.lifecycle.sweep import plan_lag_cleanup

        plan = plan_lag_cleanup(ws, None, a["as_of"])
        return [r["outcome"] for r in run_work(ws.config, [w.as_dict() for w in plan])]
    if job in ("offload", "offload-race"):
        if job == "offload-race":
            race_offload(ws, a["topic"], a["ledger"], a["as_of"])
        res = ws.topic_offloader(clock_ms=lambda: a["as_of"]).offload_ledger(a["topic"], a["ledger"])
        return [res.outcome, res.uuid, res.error]
    if job == "drain":
        from tieredcore.lifecycle.drain import drain

        return drain(ws, a["as_of"]).counts()
    raise SystemExit(f"unknown job {job!r}")


def race_offload(ws: Workspace, topic: str, ledger: int, as_of: int) -> None:
    """Make the next offload of `ledger` lose: once it has written its objects, a competing attempt runs
    the whole protocol (records our uuid, replaces it, writes, completes)."""
    from tieredcore.offload.offloader import LedgerOffloader

    real_offload = LedgerOffloader.offload
    state = {"raced": False}

    def offload(self, handle, uuid, extra_metadata=None, progress=None):
        obj = real_offload(self, handle, uuid, extra_metadata, progress)
        if not state["raced"]:
            state["raced"] = True
            other = ws.topic_offloader(clock_ms=lambda: as_of).offload_ledger(topic, ledger)
            assert other.outcome == "offloaded", other
        return obj

    LedgerOffloader.offload = offload


def main() -> int:
    config, job, point, args = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    os.environ.setdefault("TIERED_NO_PROGRESS", "1")
    install(point)
    with Workspace(Config.load(Path(config), env={})) as ws:
        out = run(ws, job, args)
    print(f"DONE {json.dumps(out)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
