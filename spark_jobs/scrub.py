"""Scrub (and repair) offloaded copies as a Spark job: find damaged or lost objects, repair them from the
hot copy, report data loss.

    spark-submit spark_jobs/scrub.py --config tiered.toml --as-of 2026-11-22T03:00:00Z [--deep auto]

The driver plans, for the given namespaces (default: every namespace) or --topic names, one unit per topic
with complete offloads (tieredcore.lifecycle.scrub.plan_scrub); Spark distributes the units by topic.
Every complete offload is checked (objects exist, sizes, the index parses, passes its checksum and
describes its ledger); with --deep (``auto``: on Sundays of the logical date; ``always``; ``never``) every
byte is read back and checked against the chunk checksums and, where the hot copy exists, its CRCs; the
same read checks every Pulsar message's CRC32C in objects without chunk checksums (Pulsar-written;
--messages all: in every object), naming damaged ones by position (ledger:entry) — without a hot copy
they are the only proof of such an object.
A damaged copy with a hot copy is replaced by a verified re-offload (--no-repair: reported only); one
without a hot copy is DATA LOSS: reported, never deleted, and the job fails.

Report: `<reports>/<group>/<run key>/<part>/summary.json` (per namespace: units, bytes read, outcomes ok / damaged /
repaired / unrecoverable, and the message check's counters messages_checked / messages_unchecked /
messages_damaged / not_messages where messages were checked; `data_loss` names the ledgers) +
`detail.parquet` (one row per ledger, with its message counts).
On a workspace attached to a Pulsar cluster nothing is repaired (docs/pulsar.md, Scrub): --repair is forced
off with one line, a damaged copy is ``unrepairable`` (repair impossible without BookKeeper), listed per
namespace under ``damage`` in the summary and logged as ``DAMAGED <namespace> <topic> <position> <reason>``.

Exit 0 when every ledger is ok or repaired, 3 on data loss, 4 when every failure is an unrepairable copy
(attached; not retried by the DAG), 1 otherwise, 2 on bad input (nothing started).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from spark_jobs._jobkit import Run, base_parser, run_ledger_job
from tieredcore.lifecycle.scrub import DEEP_MODES, MESSAGE_MODES, deep_for, plan_scrub
from tieredcore.workspace import Workspace

JOB = "scrub"


def main(argv: Sequence[str] | None = None) -> int:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--topic", action="append", help="scrub these topics only (repeatable)")
    p.add_argument("--deep", choices=DEEP_MODES, default="auto",
                   help="read every byte back: auto (Sundays of the logical date), always, never")
    p.add_argument("--messages", choices=MESSAGE_MODES, default="auto",
                   help="whose Pulsar messages a deep scrub checks: auto (objects without chunk checksums), all")
    p.add_argument("--repair", action=argparse.BooleanOptionalAction, default=True,
                   help="replace damaged copies from the hot copy (default: on; --no-repair reports only)")
    args = p.parse_args(argv)

    def plan(run: Run):
        with Workspace(run.config) as ws:
            return plan_scrub(ws, args.namespace, run.as_of_ms, topics=args.topic,
                              deep=deep_for(args.deep, run.as_of_ms), repair=args.repair, dry_run=args.dry_run,
                              messages=args.messages)

    return run_ledger_job(JOB, args, plan)


if __name__ == "__main__":
    sys.exit(main())
