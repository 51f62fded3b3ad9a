"""DAG-run reports written the way the jobs and the summary task write them (tieredcore.reports:
RunReports.publish for a part's try, spark_jobs._jobkit.write_detail for its detail.parquet,
run_record + write_run for the run's run.json), for the view's tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from spark_jobs._jobkit import write_detail
from tieredcore.lifecycle.work import DETAIL_SCHEMA
from tieredcore.reports import PlannedPart, ReportPlace, RunReports, run_record

DETAIL_COLUMNS = [c.strip().split(" ")[0] for c in DETAIL_SCHEMA.split(",")]


def detail_row(topic: str, ledger: int, outcome: str = "offloaded", nbytes: int = 1000, error: str = "") -> tuple:
    """A row of the ledger jobs' detail.parquet (DETAIL_SCHEMA's columns, the rest empty)."""
    row: dict[str, Any] = dict.fromkeys(DETAIL_COLUMNS)
    row.update(topic=topic, namespace="/".join(topic.split("://", 1)[1].split("/")[:2]), ledger=ledger,
               kind="ledger", outcome=outcome, bytes=nbytes, blocks=1, entries=10, seconds=0.25, error=error or None)
    return tuple(row[c] for c in DETAIL_COLUMNS)


def publish_try(reports: RunReports, dag_id: str, run_id: str, task_id: str, map_index: int, attempt: int,
                rows: list[tuple], job: str = "offload_sweep", as_of_ms: int = 0,
                extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """One try of one part: its detail.parquet and summary.json (totals from the rows), published as
    the part's latest. Returns the summary."""
    place = ReportPlace(group=dag_id, run_id=run_id, part=f"{task_id}.{map_index}" if map_index >= 0 else task_id,
                        dag_id=dag_id, task_id=task_id, map_index=map_index)
    reports.claim(dag_id, run_id)
    write_detail(reports.detail_path(place.group, place.run_key, place.part, attempt), rows, DETAIL_SCHEMA)
    failed = [r for r in rows if r[DETAIL_COLUMNS.index("error")]]
    namespaces: dict[str, dict[str, Any]] = {}
    for r in rows:
        d = namespaces.setdefault(r[1], {"ledgers": 0, "bytes": 0, "failures": 0, "outcomes": {}})
        d["ledgers"] += 1
        d["bytes"] += r[DETAIL_COLUMNS.index("bytes")]
        d["failures"] += 1 if r in failed else 0
        d["outcomes"][r[4]] = d["outcomes"].get(r[4], 0) + 1
    totals = {"topics": len({r[0] for r in rows}), "ledgers": len(rows), "bytes": sum(d["bytes"] for d in namespaces.values()),
              "failures": len(failed), "outcomes": {}, "namespaces": namespaces, "counters": {}, "data_loss": [],
              "segments": 0, "segment_bytes": 0, "segments_held": 0}
    for d in namespaces.values():
        for k, v in d["outcomes"].items():
            totals["outcomes"][k] = totals["outcomes"].get(k, 0) + v
    summary = {"job": job, "run_id": run_id, "attempt": attempt, "as_of_ms": as_of_ms, "seconds": 12.5,
               "dry_run": False, "totals": totals, **place.fields(attempt), "namespaces": sorted(namespaces),
               "written_ms": as_of_ms + 60_000, **(extra or {})}
    reports.publish(place, attempt, json.dumps(summary))
    return summary


def write_run_json(reports: RunReports, dag_id: str, run_id: str, parts: list[tuple[str, int, list[str]]],
                   nothing_due: list[dict[str, str]], job: str = "offload_sweep", as_of_ms: int = 0) -> Path:
    """run.json as the DAG's summary task writes it: ``parts`` = (task id, map index, namespaces) planned."""
    planned = {job: [PlannedPart(part=f"{t}.{i}" if i >= 0 else t, task_id=t, map_index=i, job=job, namespaces=tuple(ns))
                     for t, i, ns in parts]}
    record = run_record(reports, dag_id, run_id, planned, dag_id=dag_id, logical_date="2026-01-01T00:00:00+00:00",
                        as_of_ms=as_of_ms, nothing_due=nothing_due, written_ms=as_of_ms + 120_000)
    return reports.write_run(dag_id, record)
