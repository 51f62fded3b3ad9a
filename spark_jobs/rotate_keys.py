"""Key rotation (docs/keys.md) as a Spark job: re-wrap every encrypted object's data key under the active key.

    spark-submit spark_jobs/rotate_keys.py --config tiered.toml --as-of 2026-11-22T03:00:00Z [--to KEY] [--dry-run]

The driver resolves the target key (--to, default: the key ring's active key; a key not on the ring is bad
input, exit 2) and lists the manifests of every offload location of the workspace
(tieredcore.lifecycle.keys.find_manifests); Spark distributes them, and each task opens a Workspace and
re-wraps its objects' data keys (tieredcore.lifecycle.keys.rotate), rewriting only manifests. Objects
already under the target, unencrypted or another cluster's are skipped; --dry-run unwraps each data key
to prove it could be re-wrapped and writes nothing. A rerun after a failure or an interruption re-wraps
only what is left. Objects live per location, not per namespace (a manifest does not say which
namespace wrote it): --namespace is refused; every location is covered.

Every task needs the key ring: the configuration's ``key_ring`` directory must exist on every executor.

Report: `<reports>/<group>/<run key>/<part>/summary.json` (target key, outcomes rewrapped / would_rewrap /
skipped / failed / aborted in total and per location, the failed objects) + `detail.parquet` (one row per
object). Exit 0, 1 when any object failed or a location could not be listed, 2 on bad input.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from typing import Any

from spark_jobs._jobkit import Run, base_parser, counted_partitions, run_job
from tieredcore.config import Config
from tieredcore.errors import ValidationError
from tieredcore.lifecycle.keys import (
    Listing,
    ManifestRef,
    RotationReport,
    find_manifests,
    rotate,
    rotation_target,
)
from tieredcore.workspace import Workspace

JOB = "rotate_keys"


def rotate_partition(config: Config, target: str, dry_run: bool, refs: Iterator[tuple]) -> Iterator[dict[str, Any]]:
    """Executor side: one workspace per partition, one row per object."""
    todo = [ManifestRef(*r) for r in refs]
    if not todo:
        return
    with Workspace(config) as ws:
        for row in rotate(ws, todo, target, dry_run):
            yield asdict(row)


def main(argv: Sequence[str] | None = None) -> int:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--to", help="re-wrap under this key of the ring (default: the ring's active key)")
    args = p.parse_args(argv)

    def plan(run: Run) -> tuple[str, Listing]:
        if args.namespace:
            raise ValidationError("--namespace is not supported by key rotation (objects are per location, not "
                                  "per namespace: every location is rotated)")
        with Workspace(run.config) as ws:
            target = rotation_target(ws, args.to)  # resolved once: every task re-wraps under the same key
            return target, find_manifests(ws)

    def describe(planned: tuple[str, Listing]) -> str:
        target, listing = planned
        return (f"{len(listing.refs)} transformed object(s) in {len(listing.locations)} location(s) to re-wrap "
                f"under key {target}" + (f"; {len(listing.errors)} location error(s)" if listing.errors else ""))

    def execute(spark, run: Run, planned: tuple[str, Listing]) -> RotationReport:
        target, listing = planned
        rows: list[dict[str, Any]] = []
        if listing.refs:
            sc = spark.sparkContext
            refs = [r.as_tuple() for r in listing.refs]
            slices = max(1, min(len(refs), sc.defaultParallelism * 2))
            config, dry_run = run.config, run.dry_run
            rows = sc.parallelize(refs, slices).mapPartitions(counted_partitions(
                lambda it: rotate_partition(config, target, dry_run, it))).collect()
        return RotationReport.of(target, run.dry_run, rows, listing)

    return run_job(JOB, args, plan, describe, execute)


if __name__ == "__main__":
    sys.exit(main())
