"""Child process of test_compaction_crash.py (run as a script, never collected by pytest).

    compaction_child.py <config.toml> <kill point> <json args>

Opens the workspace the configuration names and compacts ``args["topic"]`` (thresholds
``args["min"]`` / ``args["target"]``, delete delay ``args["delay"]``, logical clock ``args["as_of"]``),
then prints ``DONE <json>`` (outcome, ledgers and new segments of every batch).

Kill point ``<step>@<N>``: right after the N-th time (from 1) the Compactor reports ``step`` through its
``on_step`` hook — assigned, written, verified, recorded, switched — the process SIGKILLs itself: it
dies exactly there, nothing after the step runs (no cleanup, no lease release). ``none``: run to the end.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout (tests.support)

from tests.support.compaction import compactor  # noqa: E402
from tieredcore.config import Config  # noqa: E402
from tieredcore.workspace import Workspace  # noqa: E402


def main() -> int:
    config, point, args = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    os.environ.setdefault("TIERED_NO_PROGRESS", "1")
    step, _, nth = point.partition("@")
    seen = 0

    def on_step(s: str, _uuid: str) -> None:
        nonlocal seen
        if s == step:
            seen += 1
            if seen == int(nth):
                os.kill(os.getpid(), signal.SIGKILL)

    with Workspace(Config.load(Path(config), env={})) as ws:
        c = compactor(ws, min_object_size=args["min"], target_size=args["target"], delay_ms=args["delay"],
                      clock_ms=args["as_of"], on_step=on_step if point != "none" else None)
        rows = c.compact_topic(args["topic"])
        out = [[r.outcome, r.ledgers, r.segments, r.error] for r in rows]
    print(f"DONE {json.dumps(out)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
