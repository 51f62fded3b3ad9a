"""
### Manual offload of one topic (Pulsar's `topics offload`)

Triggered by hand (no schedule) with params:

- `topic` — `tenant/namespace/topic` or `persistent://tenant/namespace/topic`;
- exactly one of `up_to` (`LEDGER:ENTRY`: offload the sealed ledgers before that position) or
  `keep_bytes` (keep at most N bytes in the hot tier, like `topics offload -s`);
- `dry_run`.

1. **validate** — fails before Spark starts on bad params: both or neither of up_to / keep_bytes, a
   malformed position, a bad or path-like topic name, an unknown topic, an unreachable object store.
2. **offload** — `spark-submit spark_jobs/offload_sweep.py --topic ... --up-to/--keep-bytes`,
   `--as-of` = the run's logical date (its run_after when triggered without one).
3. **summary** — totals from the run report as XCom and log; **verdict** fails the run when the
   validation or the job failed.
"""

from __future__ import annotations

import re
from typing import Any

from airflow.sdk import Param, get_current_context, task
from tiered_common import (
    QUICK_TASK,
    check_object_store,
    job_args,
    load_config,
    spark_task,
    summary_task,
    tiered_dag,
    verdict_task,
)

JOB = "offload_sweep"
POSITION = re.compile(r"^\d+:\d+$")

with tiered_dag(
    "tiered_offload_topic",
    description="Offload one topic up to a position, or keep at most N bytes hot (Spark)",
    schedule=None,
    max_active_runs=4,
    tags=["offload", "manual"],
    doc_md=__doc__,
    params={
        "topic": Param("", type="string", title="Topic", description="tenant/namespace/topic"),
        "up_to": Param("", type=["null", "string"], title="Up to (LEDGER:ENTRY)",
                       description="Offload sealed ledgers before this position; empty when keep_bytes is set."),
        "keep_bytes": Param(None, type=["null", "integer"], minimum=0, title="Keep bytes",
                            description="Keep at most this many bytes in the hot tier; empty when up_to is set."),
    },
) as dag:

    @task(task_id="validate", **QUICK_TASK)
    def validate() -> list[str]:
        """Checks the params against the metadata store and returns the job's arguments."""
        from airflow.sdk.exceptions import AirflowFailException

        from tieredcore.errors import TieredError
        from tieredcore.topics import TopicName
        from tieredcore.workspace import Workspace

        ctx: Any = get_current_context()
        params = ctx["params"]
        up_to = (params.get("up_to") or "").strip()
        keep_bytes = params.get("keep_bytes")
        if bool(up_to) == (keep_bytes is not None):
            raise AirflowFailException(
                f"give exactly one of up_to (LEDGER:ENTRY) or keep_bytes; got up_to={up_to!r}, keep_bytes={keep_bytes!r}"
            )
        if up_to and not POSITION.match(up_to):
            raise AirflowFailException(f"up_to {up_to!r}: expected LEDGER:ENTRY, e.g. 12:0")
        if keep_bytes is not None and (isinstance(keep_bytes, bool) or not isinstance(keep_bytes, int) or keep_bytes < 0):
            raise AirflowFailException(f"keep_bytes must be a non-negative integer, got {keep_bytes!r}")
        config = load_config(params)
        try:
            topic = TopicName.parse(params.get("topic") or "")
            with Workspace(config) as ws:
                exists = ws.ml.exists(topic)
        except TieredError as e:
            raise AirflowFailException(f"topic {params.get('topic')!r}: {e}") from None
        if not exists:
            raise AirflowFailException(f"topic {topic.full} does not exist")
        print(f"validate: object store: {check_object_store(config.store_url)}")
        extra = ["--topic", topic.full] + (["--up-to", up_to] if up_to else ["--keep-bytes", str(keep_bytes)])
        return job_args(ctx, as_of_field="logical_date", extra=extra)

    planned = validate()
    offload = spark_task("offload", JOB, planned)
    summary = summary_task(JOB, plan_task_id="validate")
    offload >> summary
    [offload, summary] >> verdict_task()
