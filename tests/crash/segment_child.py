"""Child process of test_segment_crash.py (run as a script, never collected by pytest).

    segment_child.py <config.toml> <kill point> <json args>

Opens the workspace the configuration names and runs one streaming offload of ``args["topic"]`` (every
entry, the open ledger's included: the tail is forced) on the logical clock ``args["as_of"]``, then
prints ``DONE <json>`` (the outcome of every segment). At the kill point it prints ``AT <point>``,
flushes and blocks reading stdin: the parent SIGKILLs it there, so the process certainly dies at that
step (no sleeps, no timing).

Kill points (``N``: the N-th segment this run assigns, from 1):

  assigned@N      right after the step-1 CAS recorded segment N (complete=false); no object written
  part@N:K        right after the K-th multipart part of segment N's data object was uploaded
  multipart@N     right after segment N's multipart upload was completed, before its index is written
  written@N       right after segment N's index was written (its commit point), before the step-3 CAS
  completed@N     right after the step-3 CAS marked segment N complete
  append:<reason> right after a deletion-log append of a batch holding a record with that reason
                  (offload-cleanup: a crashed attempt's segment recorded, before the CAS removing it)
  none            run to completion

The step points come from StreamingOffloader's ``on_step`` hook, the object points from the store
object this process writes through (its methods wrapped on the instance), the append point from
DeletionLog.append (wrapped on the class). Nothing is changed for any other process.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout (tests.support)

from tests.support.segments import offload_everything, streaming  # noqa: E402
from tieredcore.config import Config  # noqa: E402
from tieredcore.meta.deletion_log import DeletionLog  # noqa: E402
from tieredcore.workspace import Workspace  # noqa: E402


def pause(point: str) -> None:
    print(f"AT {point}", flush=True)
    sys.stdin.readline()  # the parent kills us here; EOF means it went away
    raise SystemExit(f"not killed at {point}")


class Points:
    """Which segment the run is on, and whether the kill point was reached."""

    def __init__(self, point: str) -> None:
        self.point = point
        kind, _, where = point.partition("@")
        self.kind = kind
        seg, _, part = where.partition(":")
        self.segment = int(seg) if seg else 0
        self.part = int(part) if part else 0
        self.current = 0  # segments assigned so far by this run
        self.parts = 0  # parts uploaded for the current segment

    def here(self, kind: str) -> bool:
        return self.kind == kind and self.current == self.segment

    def on_step(self, step: str, _uuid: str) -> None:
        if step == "assigned":
            self.current += 1
            self.parts = 0
        if self.here(step):
            pause(self.point)


def install(ws: Workspace, pts: Points) -> None:
    store = ws.offloader.store  # the object the segment writer uploads through
    if pts.kind == "part":
        real_upload = store.upload_part

        def upload_part(key, upload_id, part_number, data):
            out = real_upload(key, upload_id, part_number, data)
            pts.parts += 1
            if pts.here("part") and pts.parts == pts.part:
                pause(pts.point)
            return out

        store.upload_part = upload_part
    elif pts.kind == "multipart":
        real_complete = store.complete_multipart

        def complete_multipart(key, upload_id, parts):
            out = real_complete(key, upload_id, parts)
            if pts.here("multipart"):
                pause(pts.point)
            return out

        store.complete_multipart = complete_multipart
    elif pts.kind.startswith("append:"):
        reason = pts.kind.partition(":")[2]
        real_append = DeletionLog.append

        def append(self, records):
            real_append(self, records)
            if any(r.reason == reason for r in records):
                pause(pts.point)

        DeletionLog.append = append
    elif pts.kind not in ("assigned", "written", "completed", "none"):
        raise SystemExit(f"unknown kill point {pts.point!r}")


def main() -> int:
    config, point, args = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    os.environ.setdefault("TIERED_NO_PROGRESS", "1")
    pts = Points(point)
    with Workspace(Config.load(Path(config), env={})) as ws:
        install(ws, pts)
        so = streaming(ws, clock_ms=args["as_of"], on_step=pts.on_step)
        res = offload_everything(so, args["as_of"], args["topic"])
        out = [[r.outcome, r.uuid, [list(x) for x in r.ledgers], r.error] for r in res]
    print(f"DONE {json.dumps(out)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
