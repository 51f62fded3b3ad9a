"""
### Manual offload of one topic (Pulsar's `topics offload`)

Triggered by hand (no schedule) with params:

- `topic` — `tenant/namespace/topic` or `persistent://tenant/namespace/topic`;
- `mode` — one of `up_to` (offload the sealed ledgers before a position) or `keep_bytes` (keep at most
  that many bytes in the hot tier, like `topics offload -s`); one choice, so both can never be given;
- `value` — for `up_to` a position `LEDGER:ENTRY` (e.g. `12:0`); for `keep_bytes` a size: bytes or a
  number with K, M or G (`64M`, `512K`, `1G`; `0` offloads every sealed ledger);
- `dry_run`.

The trigger form refuses a malformed topic name or value before a run exists (the params' formats, in
words). Whether the value fits the mode (a position for `up_to`, a size for `keep_bytes`) involves two
params, which Airflow validates one by one, so it is the first check of:

1. **validate** — fails before Spark starts on bad params: a value that does not fit the mode, an
   out-of-range position or size, a bad or path-like topic name, an unknown topic, an unreachable
   object store.
2. **offload** — `spark-submit spark_jobs/offload_sweep.py --topic ... --up-to/--keep-bytes`,
   `--as-of` = the run's logical date (its run_after when triggered without one).
3. **summary** — totals from the run report as XCom and log; **verdict** fails the run when the
   validation or the job failed.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import Param, get_current_context, task
from tiered_airflow import POSITION_OR_SIZE_FORMAT, TOPIC_FORMAT, TieredObjectStoreHook
from tiered_common import AWS_CONN_ID, QUICK_TASK, load_config, tiered_dag
from tiered_params import job_args
from tiered_pipeline import standard_pipeline
from tiered_spark import spark_task

JOB = "offload_sweep"
MODES = {"up_to": "Up to a position (LEDGER:ENTRY)", "keep_bytes": "Keep at most this size hot"}



def manual_offload(mode: Any, value: Any):
    """The ManualOffload of the ``mode`` and ``value`` params (tieredcore's parsers); ValidationError
    naming the mode when the value does not fit it."""
    from tieredcore.errors import ValidationError
    from tieredcore.lifecycle.planner import ManualOffload

    if mode not in MODES:
        raise ValidationError(f"mode param {mode!r}: one of {', '.join(MODES)}")
    text = str(value if value is not None else "").strip()
    if not text:
        raise ValidationError(f"value param: empty; mode {mode} needs "
                              + ("a position LEDGER:ENTRY" if mode == "up_to" else "a size such as 64M"))
    if mode == "up_to":
        return ManualOffload.parse(text, None, names=("value (mode up_to)", "value (mode keep_bytes)"))
    return ManualOffload.parse(None, text, names=("value (mode up_to)", "value (mode keep_bytes)"))


with tiered_dag(
    "tiered_offload_topic",
    description="Offload one topic up to a position, or keep at most N bytes hot (Spark)",
    schedule=None,
    max_active_runs=4,
    tags=["offload", "manual"],
    doc_md=__doc__,
    params={
        # the trigger form's own checks (formats); `validate` parses them again (the CLI's and the job's parsers)
        "topic": Param("", type="string", minLength=1, format=TOPIC_FORMAT, title="Topic",
                       description="tenant/namespace/topic (or persistent://tenant/namespace/topic)"),
        "mode": Param("up_to", type="string", enum=list(MODES), values_display=MODES, title="Mode",
                      description="up_to: offload the sealed ledgers before a position; keep_bytes: keep at most "
                                  "a size in the hot tier, like `topics offload -s`."),
        "value": Param("", type="string", minLength=1, format=POSITION_OR_SIZE_FORMAT, title="Position or size",
                       description="For up_to a position LEDGER:ENTRY, e.g. 12:0; for keep_bytes a size: bytes, "
                                   "or a number with K, M or G (1024-based), e.g. 64M; 0 offloads every sealed "
                                   "ledger."),
    },
) as dag:

    @task(task_id="validate", **QUICK_TASK)
    def validate() -> list[str]:
        """Checks the params against the metadata store and returns the job's arguments."""
        from airflow.sdk.exceptions import AirflowFailException

        from tieredcore.errors import TieredError, ValidationError
        from tieredcore.names import TopicName
        from tieredcore.workspace import Workspace

        ctx: Any = get_current_context()
        params = ctx["params"]
        try:
            manual = manual_offload(params.get("mode"), params.get("value"))
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
