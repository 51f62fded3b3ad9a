"""Child process of test_kill.py (run as a script, never collected by pytest).

Opens the workspace under argv[1] and offloads ledger argv[3] of topic argv[2] with max block size
argv[4]. After every uploaded part it prints ``part <done> <total>`` and then waits for a ``go`` line
on stdin before going on, so the parent decides exactly where the process is when it kills it.
"""

from __future__ import annotations

import sys

from tieredcore.config import Config
from tieredcore.workspace import Workspace


def main() -> int:
    root, topic, ledger_id, max_block = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    ws = Workspace(Config.for_workspace(root, max_block_size=max_block))

    def progress(_topic: str, _ledger: int, done: int, total: int) -> None:
        print(f"part {done} {total}", flush=True)
        if sys.stdin.readline().strip() != "go":
            raise SystemExit("parent went away")

    res = ws.topic_offloader(progress=progress).offload_ledger(topic, ledger_id)
    print(f"done {res.outcome} {res.uuid}", flush=True)
    ws.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
