"""
### Topic compaction: the latest value per key of each topic (Pulsar's `topics compact`)

Hourly (env `TIERED_TOPIC_COMPACTION_SCHEDULE`: a cron expression or preset, `none` to disable). A topic is
compacted when its **backlog** (the bytes of its entries after its compaction horizon, every entry when it
was never compacted) reaches its namespace policy's **compaction threshold**
(`tiered policies set NS --compaction-threshold 100M`, Pulsar's `compaction-threshold`; -1, the default,
is off). Compaction reads the previous compacted ledger plus the messages after its horizon, across every
tier, keeps the latest value per key (a tombstone removes its key), writes a new compacted ledger
offloaded as a V1 object pair, and records it in the topic record with one compare-and-set; the previous
compacted ledger goes to the deletion log (the `tiered_deletion_drain` DAG deletes it). Readers see it
with `tiered read --compacted` (Pulsar's `readCompacted`). Not the `tiered_compaction` DAG, which repacks
small objects and never changes data. See docs/topic-compaction.md.

1. **preflight** — configuration loads, object store reachable (fails fast, no retry).
2. **plan** — with the `topics` param (a manual trigger): those topics, whatever their backlog, spread
   over at most `shards` Spark applications (`--topic` repeated). Otherwise the namespaces whose policy
   sets a threshold (or the `namespaces` param): each topic's backlog against its threshold (the
   `threshold` param overrides it); the namespaces with topics due spread by backlog bytes over the
   shards (`--namespace` repeated); the others, and why, under `nothing_due`.
3. **compact** — one mapped `spark-submit spark_jobs/compact_topics.py` per shard: its topics compacted
   one after another, each one's work distributed over the cluster.
4. **summary** (runs even when jobs failed) — per namespace: topics compacted, with nothing to compact,
   lost to a concurrent compaction (conflict), failed; keys, bytes and messages before → after. Each
   part's report (`<reports_dir>/tiered_topic_compaction/<run key>/compact.<map index>/summary.json`,
   `detail.parquet`) has per topic the horizon, previous and new compacted ledger, keys and bytes before →
   after, seconds; the job's log one line per topic. **verdict** fails the run when a topic failed or lost
   its switch (retried by the next run) or a job wrote no report. A topic with nothing after its horizon
   is not a failure.

A **dry run** plans and reports each due topic's backlog and horizon, and writes nothing.

Params: `config` (only with an allow-list), `dry_run`, `topics` (a list of topic names: compact these now),
`namespaces` (empty: every namespace whose policy sets a threshold), `shards`, `threshold` (a size like
`10M`; empty: each topic's policy; not with `topics`), `retain_null_key` (keep keyless messages, Pulsar's
`topicCompactionRetainNullKey`; default off, as Pulsar 3.2+).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.sdk import Param, get_current_context, task
from tiered_airflow import SIZE_FORMAT, TOPIC_FORMAT
from tiered_assets import schedule_from_env
from tiered_common import QUICK_TASK, load_config, tiered_dag
from tiered_params import job_args, namespaces_param, optional_param, planned_namespaces, shards_param
from tiered_pipeline import NOTHING_DUE_KEY, SHARDS_KEY, shard_plan, standard_pipeline
from tiered_spark import spark_task_per_shard

JOB = "compact_topics"


with tiered_dag(
    "tiered_topic_compaction",
    description="Topic compaction: the latest value per key of topics whose backlog reaches their policy's "
                "compaction threshold, or of the topics named (Spark)",
    schedule=schedule_from_env("TIERED_TOPIC_COMPACTION_SCHEDULE", "@hourly"),
    dagrun_timeout=dt.timedelta(hours=6),
    tags=["topic-compaction"],
    doc_md=__doc__,
    params={
        "topics": Param([], type=["null", "array"], items={"type": "string", "format": TOPIC_FORMAT},
                        title="Topics",
                        description="Compact these topics now, whatever their backlog (tenant/namespace/topic "
                                    "or persistent://...); empty: the topics due by their policy's threshold."),
        "namespaces": namespaces_param("tenant/namespace list; empty: every namespace whose policy sets a "
                                       "compaction threshold. Not with topics."),
        "shards": shards_param(),
        "threshold": optional_param(
            SIZE_FORMAT, "Threshold (e.g. 10M)",
            "Compact topics whose backlog after their compaction horizon is at least this: bytes, or a size "
            "with K, M or G (1024-based); 0: any backlog. Empty: each topic's policy. Not with topics."),
        "retain_null_key": Param(False, type="boolean", title="Retain keyless messages",
                                 description="Keep messages without a key in the compacted ledger (Pulsar's "
                                             "topicCompactionRetainNullKey); off: dropped, as Pulsar 3.2+."),
    },
) as dag:

    @task(task_id="plan", **QUICK_TASK)
    def plan() -> list[list[str]]:
        """One job argument list per shard: the topics named (spread by backlog), or the namespaces with
        topics due (policies, topics and backlogs read now) spread by backlog bytes."""
        from airflow.sdk.exceptions import AirflowFailException

        from tieredcore.errors import TieredError, ValidationError
        from tieredcore.policy import PolicyStore

        ctx: Any = get_current_context()
        params = ctx["params"]
        config = load_config(params)
        topics = [str(t) for t in params.get("topics") or []]
        threshold = str(params.get("threshold") or "").strip() or None
        try:
            if topics and (params.get("namespaces") or threshold is not None):
                raise ValidationError("the topics param names what to compact: leave namespaces and threshold empty")
            if threshold is not None:
                from tieredcore.units import parse_keep_bytes

                threshold_bytes = parse_keep_bytes(threshold, "threshold param")
        except ValidationError as e:
            raise AirflowFailException(str(e)) from None
        extra = (["--threshold", threshold] if threshold is not None else []) + \
            (["--retain-null-key"] if params.get("retain_null_key") else [])
        if topics:
            try:
                return topic_shards(ctx, config, topics, extra)
            except TieredError as e:
                raise AirflowFailException(f"planning the topic compaction: {e}") from None
        namespaces = planned_namespaces(params, config, PolicyStore.namespaces_with_topic_compaction,
                                        "topic compaction")
        if not namespaces:
            ctx["ti"].xcom_push(key=SHARDS_KEY, value=[])
            ctx["ti"].xcom_push(key=NOTHING_DUE_KEY, value=[])
            print("topic compaction plan: no namespace sets a compaction threshold: no Spark job")
            return []
        from tieredcore.lifecycle.topic_compaction_run import plan_topic_compaction_due

        return shard_plan(ctx, config, lambda ws: plan_topic_compaction_due(
            ws, namespaces, threshold_bytes if threshold is not None else None), "topic compaction", extra)

    def topic_shards(ctx: Any, config: Any, topics: list[str], extra: list[str]) -> list[list[str]]:
        """The topics named, each must exist, spread by backlog over the run's shards (`--topic` lists)."""
        from tieredcore.config import check_spark_shards
        from tieredcore.lifecycle.shards import NamespaceDue, assign_shards
        from tieredcore.lifecycle.topic_compaction_run import plan_topic_compaction
        from tieredcore.workspace import Workspace

        override = ctx["params"].get("shards")
        n = config.spark_shards if override is None else check_spark_shards(override, "shards param")
        with Workspace(config) as ws:
            due, _ = plan_topic_compaction(ws, None, topics)
        # a topic with no backlog still weighs one byte: every named topic is in a shard
        shards = assign_shards([NamespaceDue(t, 1, max(b, 1)) for t, b in due], n)
        ctx["ti"].xcom_push(key=NOTHING_DUE_KEY, value=[])
        ctx["ti"].xcom_push(key=SHARDS_KEY, value=[s.as_dict() for s in shards])
        several = len(shards) > 1
        out = []
        for i, s in enumerate(shards):
            print(f"topic compaction plan: shard {i}: {', '.join(s.namespaces)} ({s.bytes:,} bytes of backlog)")
            out.append([a for t in s.namespaces for a in ("--topic", t)]
                       + job_args(ctx, shard=i if several else None, extra=extra))
        return out

    standard_pipeline(plan, lambda planned: spark_task_per_shard("compact", JOB, planned), JOB)
