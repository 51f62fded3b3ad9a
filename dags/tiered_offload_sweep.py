"""
### Offload sweep (PIP-17 / PIP-76 by namespace policy)

Every 15 minutes (env `TIERED_SWEEP_SCHEDULE`: a cron expression or preset, `none` to disable), offload
the sealed ledgers that the namespaces' offload policies make due at the run's logical time. A namespace
in streaming mode (`offload_mode = streaming`) has its topics' new entries, the open ledger's included,
written as PIP-76 segments: full ones at once, the last, smaller one once its rollover time has passed
(until then it is *held*, not a failure).

1. **preflight** — the configuration loads and the object store is reachable (fails fast, no retry).
2. **plan** — the namespaces with offload enabled (from the metadata store's policies; or the
   `namespaces` param), planned here with tieredcore's own offload planning at the run's clock, on one
   Workspace: a namespace with nothing due gets no Spark job, and the XCom `nothing_due` says why (a
   sweep with nothing due ends in seconds). The namespaces with work are spread by bytes over at most
   `spark_shards` shards (configuration, default 2: the `spark` pool's slots; the `shards` param
   overrides it for a run); one argument list per shard: its namespaces (`--namespace` repeated),
   `--as-of` the run's data-interval end, `--run-id` the run id (plus `.shard-<i>` when several).
3. **offload** — one mapped `spark-submit spark_jobs/offload_sweep.py` per shard (labelled by its
   namespaces, e.g. `acme/audit +3 more`); skipped when nothing is due anywhere. A thousand namespaces
   with a ledger each cost a few Spark applications, not a thousand.
4. **summary** (runs even when jobs failed) — totals of the run reports (topics, ledgers, bytes,
   failures; segments written, their bytes and tails held, for streaming namespaces) as XCom and log;
   **verdict** fails the run when any namespace job failed.
5. **announce** — one `tiered_offloaded` asset event per namespace the run offloaded something in
   (extra: `namespace`, `ledgers`, `bytes`, `segments`, `as_of`); none for a namespace with nothing
   done, none in a dry run. `tiered_deletion_lag_cleanup` runs on them.

Idempotent: a retry or a rerun for the same logical date offloads only what is left; an older logical
date never offloads more (the job's only clock is `--as-of`). Params: `config` (only with an allow-list),
`dry_run`, `max_topics` (per namespace), `namespaces` (override list), `shards` (Spark applications).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.sdk import Param, get_current_context, task
from tiered_assets import OFFLOAD_EVENTS, OFFLOADED, Announcement, offloaded_namespaces, schedule_from_env
from tiered_common import QUICK_TASK, load_config, tiered_dag
from tiered_params import as_of_ms, namespaces_param, planned_namespaces, shards_param
from tiered_pipeline import NOTHING_DUE_KEY, shard_plan, standard_pipeline
from tiered_spark import spark_task_per_shard

JOB = "offload_sweep"

with tiered_dag(
    "tiered_offload_sweep",
    description="Offload sealed ledgers (or, in streaming mode, PIP-76 segments) to the object store by namespace "
                "policy (Spark)",
    schedule=schedule_from_env("TIERED_SWEEP_SCHEDULE", "*/15 * * * *"),
    dagrun_timeout=dt.timedelta(hours=2),
    tags=["offload"],
    doc_md=__doc__,
    params={
        "max_topics": Param(None, type=["null", "integer"], minimum=1, title="Max topics",
                            description="At most this many topics per namespace this run (the rest next run)."),
        "namespaces": namespaces_param("tenant/namespace list; empty: every namespace with offload enabled."),
        "shards": shards_param(),
    },
) as dag:

    @task(task_id="plan", **QUICK_TASK)
    def plan() -> list[list[str]]:
        """One job argument list per shard: the namespaces with offload work due (policies and topics
        read from the metadata store now, on one Workspace) spread over the run's Spark applications by
        bytes; namespaces with nothing due, and why, under the XCom `nothing_due`, the shards under `shards`."""
        from tieredcore.lifecycle.sweep import plan_offload_due
        from tieredcore.lifecycle.work import KIND_OFFLOAD
        from tieredcore.policy import PolicyStore

        ctx: Any = get_current_context()
        params = ctx["params"]
        config = load_config(params)
        namespaces = planned_namespaces(params, config, PolicyStore.namespaces_with_offload, "sweep", KIND_OFFLOAD)
        if not namespaces:
            ctx["ti"].xcom_push(key="shards", value=[])
            ctx["ti"].xcom_push(key=NOTHING_DUE_KEY, value=[])
            print("sweep plan: no namespace with offload enabled: no Spark job")
            return []
        at = as_of_ms(ctx)
        max_topics = params.get("max_topics")
        extra = ["--max-topics", str(max_topics)] if max_topics else []
        return shard_plan(ctx, config, lambda ws: plan_offload_due(ws, namespaces, at, max_topics), "sweep", extra)

    standard_pipeline(plan, lambda planned: spark_task_per_shard("offload", JOB, planned), JOB,
                      announce=Announcement(OFFLOAD_EVENTS, OFFLOADED, offloaded_namespaces))
