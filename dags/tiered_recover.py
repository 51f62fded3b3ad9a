"""
### Recover: rebuild the metadata store from the bucket alone

Manual trigger only (no schedule). When the metadata store is lost (a SQLite file deleted, a ZooKeeper
ensemble wiped), every offloaded byte is still in the bucket: this DAG rebuilds every topic record (ledgers,
offload contexts, segments, the compacted-ledger pointer) and the namespace and topic policies from each
topic's newest valid **topic manifest**, else from the self-describing V1 index objects (docs/recovery.md;
the same as `tiered recover`). Ledgers whose hot copy is gone are restored cold-only; a ledger found under
two uuids keeps the latest attempt and the other is reported as an orphan. Nothing in the bucket is written
or deleted. **A dry run unless `apply` is set.**

1. **preflight** — the configuration loads, the stores answer (fails fast).
2. **plan** — the refusals, one clear line each, before Spark starts: a metadata store that already has
   topics or policies (unless `merge`), a bucket with nothing of this format, `apply` with `dry_run`.
3. **recover** — `spark-submit spark_jobs/recover.py`: the driver lists the bucket once (streamed); the
   executors read and check each topic's newest manifest and read the index objects of the topics without
   one; the driver plans and, with `apply`, writes the records (a marker record first: a failed run is
   triggered again and completes, nothing duplicated).
4. **summary** (runs even when the job failed) — topics created (or that would be), from manifests vs index
   objects, cold-only ledgers, orphans, damaged and stale manifests, what could not be recovered: XCom, log,
   and the run's `run.json` under `<reports_dir>/tiered_recover/<run key>/` (the part's `summary.json`
   lists every topic); **verdict** fails the run when something could not be recovered.

Params: `config` (only with an allow-list), `apply` (write the records; default off: a dry run that only
reports), `merge` (allow a store that has records: add what is missing, never overwrite a record),
`dry_run` (the same as leaving `apply` off; both together fail the run).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.sdk import Param, get_current_context, task
from tiered_common import QUICK_TASK, load_config, tiered_dag
from tiered_params import job_args
from tiered_pipeline import standard_pipeline
from tiered_spark import spark_task

JOB = "recover"

with tiered_dag(
    "tiered_recover",
    description="Rebuild the metadata store from the bucket alone: topic manifests, else index objects "
                "(dry run unless apply; Spark)",
    schedule=None,
    dagrun_timeout=dt.timedelta(hours=6),
    tags=["recovery"],
    doc_md=__doc__,
    params={
        "apply": Param(False, type="boolean", title="Apply",
                       description="Write the recovered records; off (the default): plan and report only."),
        "merge": Param(False, type="boolean", title="Merge",
                       description="Allow a metadata store that already has records: add the missing topics and "
                                   "policies, never overwrite a record. Off: such a store is refused."),
    },
) as dag:

    @task(task_id="plan", **QUICK_TASK)
    def plan() -> list[str]:
        """The recovery job's arguments, after the refusals (store with records, empty bucket) are checked
        here: one line, no Spark job."""
        from airflow.sdk.exceptions import AirflowFailException

        from tieredcore.errors import TieredError
        from tieredcore.lifecycle.recover_run import check_recoverable
        from tieredcore.workspace import Workspace

        ctx: Any = get_current_context()
        params = ctx["params"]
        config = load_config(params)
        apply, merge = bool(params.get("apply")), bool(params.get("merge"))
        if apply and params.get("dry_run"):
            raise AirflowFailException("apply and dry_run params contradict each other: set one")
        try:
            with Workspace(config) as ws:
                check_recoverable(ws, merge)
        except TieredError as e:
            raise AirflowFailException(f"recover refused: {e}") from None
        print(f"recover plan: {'apply' if apply else 'dry run'}{', merge' if merge else ''} from {config.store_url} "
              f"into {config.metadata_url}")
        return job_args(ctx, extra=(["--apply"] if apply else []) + (["--merge"] if merge else []))

    standard_pipeline(plan, lambda planned: spark_task("recover", JOB, planned), JOB)
