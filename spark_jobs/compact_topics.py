"""Topic compaction (docs/topic-compaction.md) as a Spark job: the latest value per key of each due topic.

    spark-submit spark_jobs/compact_topics.py --config tiered.toml --as-of 2026-11-22T03:00:00Z
    spark-submit spark_jobs/compact_topics.py --as-of ... --topic acme/keys/table --retain-null-key
    spark-submit spark_jobs/compact_topics.py --as-of ... --namespace acme/keys --threshold 10M --dry-run

The driver plans the topics (tieredcore.lifecycle.topic_compaction_run.plan_topic_compaction): the --topic
names, always (a manual trigger); else the topics of the --namespace list (default: every namespace whose
policy sets a compaction threshold, `tiered policies set NS --compaction-threshold 100M`) whose backlog
after their compaction horizon reaches the threshold (--threshold overrides each policy's). Topics are
compacted ONE AFTER ANOTHER on the driver, each by spark_jobs._topic_shuffle.compact_on_spark (which
distributes that topic's phases over the cluster and writes its compacted ledger), on the --as-of clock.
A dry run plans and reports each topic's backlog and horizon, and writes nothing.

Report: `<reports>/<group>/<run key>/<part>/summary.json` (per namespace: topics, compacted, nothing to
compact, conflicts, failed; ``counters`` keys_before / keys_after / bytes_before / bytes_after / messages;
per topic its row under ``topics``) + `detail.parquet` (one row per topic: horizon, previous and new
compacted ledger, uuid, keys and bytes before → after, messages, seconds, outcome). Exit 0 when every
topic was compacted or had nothing to compact (or was planned), 1 when one failed or lost the switch to a
concurrent compaction (outcome conflict: retried next run), 2 on bad input (nothing started).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

from spark_jobs._jobkit import Run, base_parser, run_job, say
from spark_jobs._topic_shuffle import compact_on_spark
from tieredcore.errors import ValidationError
from tieredcore.lifecycle.topic_compaction_run import (
    TopicCompactionReport,
    compaction_row,
    plan_topic_compaction,
)
from tieredcore.units import parse_keep_bytes
from tieredcore.workspace import Workspace

JOB = "compact_topics"


@dataclass(frozen=True)
class Planned:
    topics: list[tuple[str, int]]  # (topic, backlog bytes), in order
    notes: list[str]
    threshold: int | None


def parse_threshold(text: str | None) -> int | None:
    """--threshold: a size (bytes, K, M, G) >= 0, or None (each topic's policy)."""
    if text is None or not text.strip():
        return None
    return parse_keep_bytes(text, "--threshold")


def plan_run(ws: Workspace, namespaces: Sequence[str] | None, topics: Sequence[str] | None,
             threshold: int | None) -> Planned:
    if namespaces and topics:
        raise ValidationError("--namespace and --topic exclude each other (the topics name their namespaces)")
    if topics and threshold is not None:
        raise ValidationError("--threshold applies to --namespace plans; --topic names are always compacted")
    due, notes = plan_topic_compaction(ws, namespaces, topics, threshold)
    return Planned(due, notes, threshold)


def main(argv: Sequence[str] | None = None) -> int:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--topic", action="append", help="compact these topics, whatever their backlog (repeatable)")
    p.add_argument("--threshold", metavar="SIZE",
                   help="compact topics whose backlog after the compaction horizon is at least this (e.g. 100M; "
                        "0: any backlog); default: each topic's policy (compaction_threshold)")
    p.add_argument("--retain-null-key", action="store_true",
                   help="keep messages without a key (Pulsar's topicCompactionRetainNullKey; default: dropped)")
    args = p.parse_args(argv)

    def plan(run: Run) -> Planned:
        threshold = parse_threshold(args.threshold)
        with Workspace(run.config) as ws:
            return plan_run(ws, args.namespace, args.topic, threshold)

    def describe(planned: Planned) -> str:
        return (f"{len(planned.topics)} topic(s) planned, {sum(b for _t, b in planned.topics):,} bytes of backlog"
                + (f", {len(planned.notes)} note(s)" if planned.notes else "")
                + (f", threshold {planned.threshold:,} bytes" if planned.threshold is not None else "")
                + (", keyless messages retained" if args.retain_null_key else ""))

    def execute(spark, run: Run, planned: Planned) -> TopicCompactionReport:
        def compact(topic: str):
            # the data source on the executors loads the same configuration file (else their $TIERED_CONFIG)
            return compact_on_spark(spark, run.config, topic, as_of_ms=run.as_of_ms,
                                    retain_null_key=args.retain_null_key, config_path=args.config)

        rows = []
        with Workspace(run.config) as ws:
            for i, (topic, backlog) in enumerate(planned.topics):
                say(JOB, "INFO", f"topic {i + 1}/{len(planned.topics)}: {topic} ({backlog:,} bytes of backlog)")
                rows.append(compaction_row(ws, topic, backlog, compact, dry_run=run.dry_run))
        return TopicCompactionReport(run.as_of_ms, run.dry_run, rows, list(planned.notes), planned.threshold,
                                     bool(args.retain_null_key))

    return run_job(JOB, args, plan, describe, execute)


if __name__ == "__main__":
    sys.exit(main())
