"""
### Compaction: repack small offloaded objects into large segments

Daily (env `TIERED_COMPACTION_SCHEDULE`: a cron expression or preset, `none` to disable). Topics with
small ledgers leave thousands of small objects in the store (each V1 offload is a data object and an
index); every one costs requests and listing time. In the namespaces whose policy enables compaction
(`tiered policies set NS --compaction on`), runs of consecutive objects smaller than the *min object
size* (default 8 MiB) are rewritten into PIP-76 segments of up to the *target size* (default 256 MiB).
Data and read results never change, only the layout: each new segment is verified entry by entry
against the old objects before the topic record is switched to it in one compare-and-set. The old
objects go to the deletion log, due after the *delete delay* (default 1 h) so that readers that opened
them before the switch can finish; the `tiered_deletion_drain` DAG deletes them then. A topic that
changed meanwhile (an offload, a retention trim) loses the switch: its new objects go to the deletion
log, nothing else changes, and the next run tries again.

1. **preflight** — configuration loads, object store reachable (fails fast, no retry).
2. **plan** — the namespaces with compaction enabled (or the `namespaces` param) and the threshold
   params checked; one argument list per namespace (`--as-of` = data-interval end, `--run-id` = run id
   plus namespace).
3. **compact** — one mapped `spark-submit spark_jobs/compact_segments.py` per namespace (labelled by
   it): one Spark task per group of topics, each topic under its lease.
4. **summary** (runs even when jobs failed) — per namespace: ledgers repacked, objects and bytes
   before → after, outcomes (compacted, conflict, failed, busy); **verdict** fails the run when a
   batch failed or lost its switch (retried by the next run) or a job wrote no report.

Each mapped task's report `<reports_dir>/tiered_compaction/<run key>/compact.<map index>/summary.json` also estimates the
monthly storage and listing cost change. A **dry run** writes nothing and reports the same numbers,
estimated from the topic records; with the `namespaces` param it also plans topics whose compaction is
off (what would enabling it save?), which a real run leaves out with a note.

Params: `config`, `dry_run`, `namespaces` (empty: every namespace with compaction enabled),
`min_object_size`, `target_size` (sizes like `8M`, `256M`, `1G`), `delete_delay` (a duration like `1h`,
`90m`); empty thresholds keep each namespace's policy.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.sdk import Param, get_current_context, task
from tiered_assets import schedule_from_env
from tiered_common import QUICK_TASK, load_config, tiered_dag
from tiered_params import job_args, namespaces_param, planned_namespaces
from tiered_pipeline import standard_pipeline
from tiered_spark import spark_task_per_namespace

JOB = "compact_segments"
# the trigger form's own checks; `plan` parses the values again (the CLI's and the job's parser,
# tieredcore.lifecycle.compaction_settings.parse_thresholds)
SIZE_PATTERN = r"^\s*([0-9]+[KMGkmg]?)?\s*$"
DURATION_PATTERN = r"^\s*([0-9]+(ms|s|m|h|d)?)?\s*$"
# the threshold params, in the order the parser takes them, and the job's options for them
THRESHOLDS = {"min_object_size": "--min-object-size", "target_size": "--target-size", "delete_delay": "--delete-delay"}


def threshold_param(title: str, description: str, pattern: str) -> Param:
    return Param(None, type=["null", "string"], pattern=pattern, title=title,
                 description=description + " Empty: each namespace's policy.")


with tiered_dag(
    "tiered_compaction",
    description="Repack runs of small offloaded objects into large segments, namespaces with compaction on (Spark)",
    schedule=schedule_from_env("TIERED_COMPACTION_SCHEDULE", "@daily"),
    dagrun_timeout=dt.timedelta(hours=12),
    tags=["compaction"],
    doc_md=__doc__,
    params={
        "namespaces": namespaces_param("tenant/namespace list; empty: every namespace with compaction enabled."),
        "min_object_size": threshold_param(
            "Min object size (e.g. 8M)", "Objects smaller than this are repacked: bytes, or a size with K, M or G "
                                         "(1024-based).", SIZE_PATTERN),
        "target_size": threshold_param(
            "Target size (e.g. 256M)", "New segments of up to this size: bytes, or a size with K, M or G.",
            SIZE_PATTERN),
        "delete_delay": threshold_param(
            "Delete delay (e.g. 1h)", "Old objects are deleted this long after the switch (readers that "
                                      "opened them finish): ms, or a duration like 90m, 1h, 3600s.",
            DURATION_PATTERN),
    },
) as dag:

    @task(task_id="plan", **QUICK_TASK)
    def plan() -> list[list[str]]:
        """One job argument list per namespace to compact (params checked and policies read now)."""
        from airflow.sdk.exceptions import AirflowFailException

        from tieredcore.errors import ValidationError
        from tieredcore.lifecycle.compaction_settings import parse_thresholds
        from tieredcore.lifecycle.work import KIND_COMPACTION
        from tieredcore.policy import PolicyStore

        ctx: Any = get_current_context()
        params = ctx["params"]
        config = load_config(params)
        given = {name: str(params.get(name) or "").strip() or None for name in THRESHOLDS}  # empty: the policy's
        try:
            parse_thresholds(given["min_object_size"], given["target_size"], given["delete_delay"],
                             names=("min_object_size param", "target_size param", "delete_delay param"))
        except ValidationError as e:
            raise AirflowFailException(str(e)) from None
        extra = [arg for name, option in THRESHOLDS.items() if given[name] for arg in (option, given[name])]
        namespaces = planned_namespaces(params, config, PolicyStore.namespaces_with_compaction, "compaction",
                                        KIND_COMPACTION)
        print(f"compaction plan: {len(namespaces)} namespace(s): {', '.join(namespaces) or '-'}"
              + (f"; thresholds {' '.join(extra)}" if extra else "; thresholds of each namespace's policy"))
        return [job_args(ctx, namespace=ns, extra=extra) for ns in namespaces]

    standard_pipeline(plan, lambda planned: spark_task_per_namespace("compact", JOB, planned), JOB)
