"""Offload sweep (policy-driven) or manual offload of one topic, as a Spark job.

    spark-submit spark_jobs/offload_sweep.py --config tiered.toml --as-of 2026-11-22T03:00:00Z
    spark-submit spark_jobs/offload_sweep.py --as-of ... --topic public/default/t --keep-bytes 64M

Namespaces in streaming mode (PIP-76) get one unit per topic with entries not yet offloaded; the executor
writes its segments under the topic's lease on the --as-of clock (tieredcore.lifecycle.sweep.stream_topic),
one report row per segment; the summary's totals carry ``segments``, ``segment_bytes``, ``segments_held``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from spark_jobs._jobkit import Run, base_parser, run_ledger_job
from tieredcore.errors import ValidationError
from tieredcore.lifecycle.planner import ManualOffload
from tieredcore.lifecycle.sweep import plan_manual_offload, plan_offload
from tieredcore.workspace import Workspace

JOB = "offload_sweep"


def main(argv: Sequence[str] | None = None) -> int:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--max-topics", type=int, help="at most this many topics per namespace this run (the rest next run)")
    p.add_argument("--topic", help="manual offload of one topic (with --up-to or --keep-bytes)")
    p.add_argument("--up-to", help="manual: offload sealed ledgers before LEDGER:ENTRY")
    p.add_argument("--keep-bytes", metavar="SIZE",
                   help="manual: keep at most SIZE bytes in the hot tier (e.g. 0, 1048576, 64M, 1G)")
    args = p.parse_args(argv)

    def plan(run: Run):
        if args.max_topics is not None and args.max_topics <= 0:
            raise ValidationError("--max-topics must be positive")
        if args.topic is None:
            if args.up_to is not None or args.keep_bytes is not None:
                raise ValidationError("--up-to / --keep-bytes go with --topic (a manual offload of one topic)")
            manual = None
        else:
            manual = ManualOffload.parse(args.up_to, args.keep_bytes)
        with Workspace(run.config) as ws:
            if manual is not None:
                return plan_manual_offload(ws.ml, args.topic, run.as_of_ms, manual, args.dry_run)
            return plan_offload(ws, args.namespace, run.as_of_ms, args.max_topics, args.dry_run)

    return run_ledger_job(JOB, args, plan)


if __name__ == "__main__":
    sys.exit(main())
