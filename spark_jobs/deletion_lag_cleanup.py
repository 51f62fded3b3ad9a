"""Deletion-lag cleanup as a Spark job: delete hot copies whose offload completed more than the
namespace's deletion lag before --as-of, after verifying the offloaded copy opens and matches.

    spark-submit spark_jobs/deletion_lag_cleanup.py --config tiered.toml --as-of 2026-11-22T04:00:00Z
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from spark_jobs._jobkit import base_parser, run_job
from tieredcore.config import Config
from tieredcore.lifecycle.sweep import plan_lag_cleanup
from tieredcore.workspace import Workspace

JOB = "deletion_lag_cleanup"


def main(argv: Sequence[str] | None = None) -> int:
    args = base_parser(__doc__.splitlines()[0]).parse_args(argv)

    def plan(config: Config, as_of: int):
        with Workspace(config) as ws:
            return plan_lag_cleanup(ws, args.namespace, as_of, args.dry_run)

    return run_job(JOB, args, plan)


if __name__ == "__main__":
    sys.exit(main())
