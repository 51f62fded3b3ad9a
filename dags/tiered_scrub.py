"""
### Scrub: check every offloaded copy, repair damaged ones from the hot tier, report data loss

Daily (env `TIERED_SCRUB_SCHEDULE`: a cron expression or preset, `none` to disable). For every ledger
whose offload is complete: both objects exist, their sizes match the index and the metadata, the index
parses, passes its checksum and describes its ledger. Weekly (param `deep` = `auto`: the runs whose
logical date is a Sunday, UTC) every byte is read back and checked against the chunk checksums and,
where the hot copy still exists, the hot tier's CRCs; in the same read every Pulsar message's CRC32C is
checked in objects without chunk checksums (Pulsar-written; param `messages` = `all`: every object), and
damaged messages are named by position. Objects a store lost (a bucket restored empty) are found here,
before a reader fails on them.

A damaged copy whose hot copy exists is **repaired**: re-offloaded under a new uuid, verified against the
hot copy, swapped in by compare-and-set; the damaged attempt goes to the deletion log (the drain DAG
deletes it). Without a hot copy the damage is **data loss**: the run fails and names the ledgers;
nothing is deleted.

On a workspace **attached to a Pulsar cluster** nothing is repaired or deleted: BookKeeper is Pulsar's (the
`repair` param is forced off with one line). A damaged copy is *unrepairable* ("repair impossible without
BookKeeper"), reported per namespace and position (`DAMAGED acme/orders persistent://acme/orders/audit
2001:4 CRC32C mismatch ...`) and under `damage` in the summary; the job exits 4 and the scrub task fails
without a retry (docs/pulsar.md, Scrub).

1. **preflight** — configuration loads, object store reachable (fails fast).
2. **plan** — the job's arguments (`--as-of` = data-interval end, `--deep`, `--repair`, namespaces).
3. **scrub** — `spark-submit spark_jobs/scrub.py`: one Spark task per group of topics.
4. **summary** (runs even when the job failed) — per namespace: units checked, bytes read, ok / damaged
   / repaired / unrecoverable, messages checked / damaged / not messages; **verdict** fails the run when
   anything is damaged or lost.

Params: `config` (only with an allow-list), `dry_run` (check and report only), `deep` (`auto` | `always` | `never`), `messages`
(`auto` | `all`), `repair` (default on), `namespaces` (empty: every namespace).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.sdk import Param, get_current_context, task
from tiered_assets import schedule_from_env
from tiered_common import QUICK_TASK, load_config, tiered_dag
from tiered_params import job_args, namespace_args, namespaces_param
from tiered_pipeline import standard_pipeline
from tiered_spark import spark_task

JOB = "scrub"

with tiered_dag(
    "tiered_scrub",
    description="Check offloaded copies (deep weekly), repair damaged ones from the hot tier (Spark)",
    schedule=schedule_from_env("TIERED_SCRUB_SCHEDULE", "@daily"),
    dagrun_timeout=dt.timedelta(hours=12),
    tags=["integrity", "scrub"],
    doc_md=__doc__,
    params={
        "deep": Param("auto", type="string", enum=["auto", "always", "never"], title="Deep scrub",
                      description="Read every byte back: auto (runs whose logical date is a Sunday), always, "
                                  "never."),
        "messages": Param("auto", type="string", enum=["auto", "all"], title="Message check",
                          description="Whose Pulsar messages a deep scrub checks (CRC32C): auto (objects without "
                                      "chunk checksums: Pulsar-written), all (every object)."),
        "repair": Param(True, type="boolean", title="Repair",
                        description="Replace damaged copies from the hot copy (off: report only)."),
        "namespaces": namespaces_param(),
    },
) as dag:

    @task(task_id="plan", **QUICK_TASK)
    def plan() -> list[str]:
        """The scrub job's arguments (params validated here, before Spark starts)."""
        from airflow.sdk.exceptions import AirflowFailException

        from tieredcore.lifecycle.scrub import DEEP_MODES, MESSAGE_MODES

        ctx: Any = get_current_context()
        params = ctx["params"]
        load_config(params)
        deep = str(params.get("deep") or "auto")
        if deep not in DEEP_MODES:
            raise AirflowFailException(f"deep param {deep!r}: one of {', '.join(DEEP_MODES)}")
        messages = str(params.get("messages") or "auto")
        if messages not in MESSAGE_MODES:
            raise AirflowFailException(f"messages param {messages!r}: one of {', '.join(MESSAGE_MODES)}")
        extra = ["--deep", deep, "--messages", messages, "--repair" if params.get("repair", True) else "--no-repair"]
        return job_args(ctx, extra=extra + namespace_args(params))

    standard_pipeline(plan, lambda planned: spark_task("scrub", JOB, planned), JOB)
