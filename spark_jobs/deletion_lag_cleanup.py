"""Deletion-lag cleanup as a Spark job: hot copies whose offload completed more than the namespace's
deletion lag before --as-of, after verifying the offloaded copy opens and matches, are marked for
deletion (two-phase deletion, docs/deletion.md: a `ledger` record in the deletion log, then bookkeeperDeleted).
With --drain (the default) the driver then drains the deletion log as of --as-of, so the run ends with
the hot copies deleted; the Spark drain job (deletion_drain.py) is for large logs.

    spark-submit spark_jobs/deletion_lag_cleanup.py --config tiered.toml --as-of 2026-11-22T04:00:00Z
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from spark_jobs._jobkit import Run, base_parser, run_ledger_job, say
from tieredcore.config import Config
from tieredcore.errors import TieredError
from tieredcore.lifecycle.drain import drain
from tieredcore.lifecycle.sweep import plan_lag_cleanup
from tieredcore.outcomes import Outcome
from tieredcore.workspace import Workspace

JOB = "deletion_lag_cleanup"


def drain_after(config: Config, as_of: int, rows: list[dict]) -> tuple[dict[str, Any], int]:
    """Phase 2 on the driver, over every record due at `as_of` (ours included). A delete that fails is
    retried by the log (the drain DAG picks it up), so it is reported, not counted as a run failure;
    a drain that cannot run at all is one failure, and so is each record kept because its topic's record
    cannot be read (an operator must repair that record)."""
    try:
        with Workspace(config) as ws:
            rep = drain(ws, as_of)
    except TieredError as e:
        say(JOB, "ERROR", f"drain failed: {type(e).__name__}: {e}")
        return {"error": f"{type(e).__name__}: {e}"}, 1
    for r in rep.rows:
        if r.outcome in (Outcome.RETRYING, Outcome.DEAD_LETTERED, Outcome.UNREADABLE_TOPIC):
            say(JOB, "WARNING" if r.outcome == Outcome.RETRYING else "ERROR",
                f"drain: {r.type} ledger {r.ledger} of {r.topic}: {r.outcome}: {r.error}")
    out = {k: v for k, v in rep.as_dict().items() if k not in ("rows", "as_of_ms", "dry_run")}
    return out, rep.unreadable_topic


def main(argv: Sequence[str] | None = None) -> int:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--drain", action=argparse.BooleanOptionalAction, default=True,
                   help="drain the deletion log on the driver after marking (default: on)")
    args = p.parse_args(argv)

    def plan(run: Run):
        with Workspace(run.config) as ws:
            return plan_lag_cleanup(ws, args.namespace, run.as_of_ms, args.dry_run)

    return run_ledger_job(JOB, args, plan, after=drain_after if args.drain and not args.dry_run else None)


if __name__ == "__main__":
    sys.exit(main())
