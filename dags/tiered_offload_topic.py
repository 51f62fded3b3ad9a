"""
### Manual offload of one topic (Pulsar's `topics offload`)

Triggered by hand (no schedule) with params:

- `topic` — `tenant/namespace/topic` or `persistent://tenant/namespace/topic`;
- exactly one of `up_to` (`LEDGER:ENTRY`: offload the sealed ledgers before that position) or
  `keep_bytes` (keep at most that many bytes in the hot tier, like `topics offload -s`: an integer or a
  size like `64M`, `512K`, `1G`; `0` offloads every sealed ledger);
- `dry_run`.

The trigger form already refuses a malformed topic name, position or size (the params' patterns). That
exactly one of `up_to` / `keep_bytes` is given cannot be said in a param's schema (Airflow validates each
param on its own), so it is the first check of:

1. **validate** — fails before Spark starts on bad params: both or neither of up_to / keep_bytes, a
   malformed or out-of-range position or size, a bad or path-like topic name, an unknown topic, an
   unreachable object store.
2. **offload** — `spark-submit spark_jobs/offload_sweep.py --topic ... --up-to/--keep-bytes`,
   `--as-of` = the run's logical date (its run_after when triggered without one).
3. **summary** — totals from the run report as XCom and log; **verdict** fails the run when the
   validation or the job failed.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import Param, get_current_context, task
from tiered_airflow import TieredObjectStoreHook
from tiered_common import AWS_CONN_ID, QUICK_TASK, load_config, tiered_dag
from tiered_params import TOPIC_PATTERN, job_args
from tiered_pipeline import standard_pipeline
from tiered_spark import spark_task

JOB = "offload_sweep"
# the trigger form's own check; `validate` parses the value again (the same parser as the CLI and the job)
SIZE_PATTERN = r"^\s*([0-9]+[KMGkmg]?)?\s*$"
POSITION_PATTERN = r"^\s*([0-9]+:[0-9]+)?\s*$"  # LEDGER:ENTRY, or empty

with tiered_dag(
    "tiered_offload_topic",
    description="Offload one topic up to a position, or keep at most N bytes hot (Spark)",
    schedule=None,
    max_active_runs=4,
    tags=["offload", "manual"],
    doc_md=__doc__,
    params={
        "topic": Param("", type="string", pattern=TOPIC_PATTERN, title="Topic",
                       description="tenant/namespace/topic (or persistent://tenant/namespace/topic)"),
        "up_to": Param("", type=["null", "string"], pattern=POSITION_PATTERN, title="Up to (LEDGER:ENTRY)",
                       description="Offload sealed ledgers before this position, e.g. 12:0. Give exactly one "
                                   "of up_to and keep_bytes: leave this empty when keep_bytes is set."),
        "keep_bytes": Param(None, type=["null", "integer", "string"], minimum=0, maximum=2**63 - 1,
                            pattern=SIZE_PATTERN, title="Keep bytes (e.g. 0, 1048576, 64M, 1G)",
                            description="Keep at most this much in the hot tier, like `topics offload -s`: "
                                        "bytes, or a size with K, M or G (1024-based); 0 offloads every "
                                        "sealed ledger. Empty when up_to is set."),
    },
) as dag:

    @task(task_id="validate", **QUICK_TASK)
    def validate() -> list[str]:
        """Checks the params against the metadata store and returns the job's arguments."""
        from airflow.sdk.exceptions import AirflowFailException

        from tieredcore.errors import TieredError, ValidationError
        from tieredcore.lifecycle.planner import ManualOffload
        from tieredcore.names import TopicName
        from tieredcore.workspace import Workspace

        ctx: Any = get_current_context()
        params = ctx["params"]
        try:
            manual = ManualOffload.parse(params.get("up_to"), params.get("keep_bytes"), names=("up_to", "keep_bytes"))
        except ValidationError as e:
            raise AirflowFailException(str(e)) from None
        config = load_config(params)
        try:
            topic = TopicName.parse(params.get("topic") or "")
            with Workspace(config) as ws:
                exists = ws.ml.exists(topic)
        except TieredError as e:
            raise AirflowFailException(f"topic {params.get('topic')!r}: {e}") from None
        if not exists:
            raise AirflowFailException(f"topic {topic.full} does not exist")
        print(f"validate: object store: {TieredObjectStoreHook(config.store_url, aws_conn_id=AWS_CONN_ID).check()}")
        return job_args(ctx, as_of_field="logical_date", extra=["--topic", topic.full, *manual.job_args()])

    standard_pipeline(validate, lambda planned: spark_task("offload", JOB, planned), JOB, preflight=False)
