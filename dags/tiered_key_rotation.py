"""
### Key rotation: re-wrap every encrypted object's data key under the active key-encryption key

Manual trigger only (no schedule). Encrypted namespaces (transform `aes` / `zstd+aes`) keep one AES data
key per object, wrapped by an RSA key-encryption key (KEK) of the key ring named by the configuration's
`key_ring` (docs/keys.md). After `tiered keys new NEW` (the new key is active at once), trigger this DAG:
every object whose data key another KEK wraps gets it re-wrapped under the target key. Only manifests are
rewritten, never the data; each object reads under either key meanwhile (both stay on the ring), and a
failed or interrupted run is simply triggered again: what is done is skipped. Then `tiered keys status`
shows nothing needs the old key, and `tiered keys retire OLD` takes it off the ring (refused before).

1. **preflight** — the configuration loads, the object store is reachable (fails fast).
2. **plan** — the job's arguments: `--to` (the `target` param, checked to be a valid key id; empty: the
   ring's active key), `--dry-run`, `--run-id` from the run id.
3. **rotate** — `spark-submit spark_jobs/rotate_keys.py`: the driver lists the manifests of every offload
   location (objects are per location, not per namespace: every location is covered), Spark re-wraps them.
   A target key not on the ring is bad input: the job exits 2 and is not retried.
4. **summary** (runs even when the job failed) — objects rewrapped / skipped / failed as XCom and log
   (per location in the run report); **verdict** fails the run when any object failed.

Params: `config` (only with an allow-list), `target` (key id; empty = the active key), `dry_run` (unwrap every data key to prove it
could be re-wrapped; write nothing).
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import get_current_context, task
from tiered_airflow import KEY_ID_FORMAT
from tiered_common import QUICK_TASK, load_config, tiered_dag
from tiered_params import job_args, optional_param
from tiered_pipeline import standard_pipeline
from tiered_spark import spark_task

JOB = "rotate_keys"

with tiered_dag(
    "tiered_key_rotation",
    description="Re-wrap encrypted objects' data keys under the active (or a chosen) key-encryption key (Spark)",
    schedule=None,
    tags=["encryption", "keys"],
    doc_md=__doc__,
    params={
        "target": optional_param(KEY_ID_FORMAT, "Target key",
                                 "Key id of the ring to re-wrap under; empty: the ring's active key."),
    },
) as dag:

    @task(task_id="plan", **QUICK_TASK)
    def plan() -> list[str]:
        """The rotation job's arguments (the key ring configured, the target a valid key id)."""
        from airflow.sdk.exceptions import AirflowFailException

        from tieredcore.cold.keyring import check_key_id
        from tieredcore.errors import ValidationError

        ctx: Any = get_current_context()
        params = ctx["params"]
        config = load_config(params)
        if not config.key_ring:
            raise AirflowFailException("no key ring configured: set key_ring in the configuration")
        target = str(params.get("target") or "").strip()
        extra: list[str] = []
        if target:
            try:
                extra = ["--to", check_key_id(target)]
            except ValidationError as e:
                raise AirflowFailException(f"target param: {e}") from None
        return job_args(ctx, extra=extra)

    standard_pipeline(plan, lambda planned: spark_task("rotate", JOB, planned), JOB)
