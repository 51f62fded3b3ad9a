"""
### Read replica sync (docs/recovery.md "Read replicas")

Every 15 minutes (env `TIERED_REPLICA_SYNC_SCHEDULE`: a cron expression or preset, `none` to disable) and on
demand: on a read replica (`tiered init DIR --replica-of STORE_URL`), follow the source cluster's topic
manifests in its bucket — `tiered replica-sync` as a task (a listing and a few small reads: no Spark job).

1. **wait_turn** — one slot at a time, oldest first (a backfill's runs sync in order).
2. **sync** — `tieredcore.lifecycle.replica.sync`: topics whose newest valid manifest is newer than the one
   their record was synced from are created or updated, topics the source deleted are removed. Reads only in
   the bucket; idempotent and crash-safe, so a retry (with backoff) or an overlapping run is harmless. A
   workspace that is not a replica, or a configuration that does not load, fails at once (no retry).
3. The task's XCom: what changed and the lag after the sync (manifests and sequences behind, the age of
   the oldest unseen manifest); the same lag is on the "Tiered storage" view.

The replica is read-only: every other DAG's job refuses to write on it. Params: `config` (only with an
allow-list); `dry_run` does not apply (a sync writes only the replica's own records).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.sdk import get_current_context, task
from tiered_assets import schedule_from_env
from tiered_common import load_config, tiered_dag
from tiered_pipeline import wait_turn_task

with tiered_dag(
    "tiered_replica_sync",
    description="Read replica: follow the source cluster's topic manifests (reads only in its bucket)",
    schedule=schedule_from_env("TIERED_REPLICA_SYNC_SCHEDULE", "*/15 * * * *"),
    dagrun_timeout=dt.timedelta(hours=1),
    tags=["replica"],
    doc_md=__doc__,
) as dag:

    @task(task_id="sync", execution_timeout=dt.timedelta(minutes=30))
    def sync_replica() -> dict[str, Any]:
        """One sync; retried with backoff on a store or metadata failure (the DAG's default args)."""
        from airflow.sdk.exceptions import AirflowFailException

        from tieredcore.errors import ValidationError
        from tieredcore.lifecycle.replica import lag, sync
        from tieredcore.workspace import Workspace

        ctx: Any = get_current_context()
        config = load_config(ctx["params"])
        if not config.replica:
            raise AirflowFailException("this workspace is not a read replica (tiered init DIR --replica-of "
                                       "STORE_URL): nothing to sync")
        with Workspace(config) as ws:
            try:
                rep = sync(ws)
                after = lag(ws)
            except ValidationError as e:  # bad input: retrying does not help
                raise AirflowFailException(f"replica sync: {e}") from None
        print(rep.summary())
        print(after.line())
        return {**rep.as_dict(), "lag": after.as_dict()}

    wait_turn_task() >> sync_replica()
