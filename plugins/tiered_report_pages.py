"""The run-report pages over tieredcore.reports' layout (``<group>/<run key>/<part>/attempt-<n>``): a
group's runs (paged), a DAG run's report (its run.json: totals, namespaces, parts with their tries,
nothing-due reasons, missing parts) and a part's try (its summary.json as tables, its detail.parquet
failed rows first, paged), each linked to the DAG run, the task instance and its log in Airflow's UI."""

from __future__ import annotations

from typing import Any

import tiered_units as units
from fastapi import HTTPException
from fastapi.responses import HTMLResponse
from tiered_pages import Pager, dag_run_url, log_url, namespace_href, render, report_href, task_url

from tieredcore.errors import FormatError, NotFoundError
from tieredcore.lifecycle.work import FAILED_OUTCOMES, SEGMENT_FAILED_OUTCOMES
from tieredcore.reports import RunReports

FAILED = FAILED_OUTCOMES | SEGMENT_FAILED_OUTCOMES
# summary.json fields shown in the headline or their own tables, not again under "other fields"
SHOWN = {"totals", "requests", "tiers", "job", "run_id", "attempt", "as_of_ms", "seconds", "dry_run", "dag_id",
         "dag_run_id", "task_id", "map_index", "try_number", "part", "group", "run_key", "namespaces",
         "planned_namespaces"}
TOTALS_SHOWN = {"namespaces", "outcomes", "counters", "data_loss"}


def _read(fn, *args) -> dict[str, Any]:
    try:
        return fn(*args)
    except NotFoundError as e:
        raise HTTPException(status_code=404, detail=str(e)) from None
    except FormatError as e:
        raise HTTPException(status_code=500, detail=str(e)) from None


def airflow_links(prefix: str, doc: dict[str, Any], try_number: int | None = None) -> dict[str, str]:
    """Links into Airflow's UI for a report written inside a DAG run (none for a run outside Airflow)."""
    dag_id, run_id = doc.get("dag_id"), doc.get("dag_run_id")
    if not dag_id or not run_id:
        return {}
    out = {"dag_run": dag_run_url(prefix, dag_id, run_id)}
    task_id = doc.get("task_id")
    if task_id:
        mi = doc.get("map_index")
        mi = mi if isinstance(mi, int) else None
        out["task"] = task_url(prefix, dag_id, run_id, task_id, mi)
        out["log"] = log_url(prefix, dag_id, run_id, task_id, mi, try_number or doc.get("try_number"))
    return out


def runs_page(reports: RunReports, group: str, prefix: str, page: int | None, query: dict[str, Any]) -> HTMLResponse:
    """A group's runs, newest first, one page: only that page's runs are read."""
    try:
        keys = reports.runs(group)
    except NotFoundError:
        raise HTTPException(status_code=404, detail=f"no reports of {group}") from None
    pager = Pager.of(len(keys), page)
    rows = []
    for key in pager.slice(keys):
        try:
            doc = reports.read_run(group, key)
        except (NotFoundError, FormatError) as e:
            rows.append({"key": key, "run_id": key, "href": report_href(prefix, group, key), "error": str(e)})
            continue
        parts = doc.get("parts") or []
        rows.append({"key": key, "run_id": doc.get("dag_run_id") or reports.run_id(group, key),
                     "href": report_href(prefix, group, key), "written_ms": doc.get("written_ms"),
                     "as_of": doc.get("as_of"), "parts": len(parts),
                     "failed": sum(1 for p in parts if p.get("failed")), "nothing_due": len(doc.get("nothing_due") or []),
                     "ui": airflow_links(prefix, doc).get("dag_run"), "error": None})
    return render("runs.html", title=f"Runs of {group}", prefix=prefix, group=group, rows=rows, pager=pager,
                  query=query)


def groups_page(reports: RunReports, prefix: str, page: int | None, query: dict[str, Any]) -> HTMLResponse:
    groups = reports.groups()
    pager = Pager.of(len(groups), page)
    rows = [{"group": g, "href": f"{prefix}/reports/{g}/"} for g in pager.slice(groups)]
    return render("groups.html", title="Run reports", prefix=prefix, rows=rows, pager=pager, query=query)


def run_page(reports: RunReports, group: str, run: str, prefix: str, query: dict[str, Any]) -> HTMLResponse:
    """A DAG run's report (run.json, or one made from its parts)."""
    doc = _read(reports.read_run, group, run)
    parts = []
    for p in doc.get("parts") or []:
        part = str(p.get("part"))
        attempts = reports.attempts(group, run, part) if reports.has_run(group, run) else []
        links = airflow_links(prefix, {**doc, "task_id": p.get("task_id"), "map_index": p.get("map_index")},
                              p.get("attempt"))
        parts.append({**p, "href": report_href(prefix, group, run, part),
                      "tries": [(n, report_href(prefix, group, run, part, n)) for n in attempts], **links})
    totals = doc.get("totals") if isinstance(doc.get("totals"), dict) else {}
    return render("run.html", title=f"{group} · {doc.get('dag_run_id') or run}", prefix=prefix, group=group, run=run,
                  doc=doc, totals=totals, parts=parts, ui=airflow_links(prefix, doc), query=query,
                  totals_rest={k: v for k, v in totals.items() if k not in TOTALS_SHOWN},
                  ns_href=lambda ns: namespace_href(prefix, ns), json_href=report_href(prefix, group, run) + "run.json")


def try_page(reports: RunReports, group: str, run: str, part: str, attempt: int | None, prefix: str,
             page: int | None, query: dict[str, Any]) -> HTMLResponse:
    """A part's try (``attempt`` None: its latest): headline, totals, namespaces, requests, the other
    fields, and its detail.parquet (failed rows first, one page)."""
    attempts = reports.attempts(group, run, part)
    if not reports.summary_path(group, run, part, attempt).is_file():
        if not reports.has_run(group, run):
            raise HTTPException(status_code=404, detail=f"no report of run {run} of {group}")
        return render("missing.html", status_code=404, title=f"{group} · {run} · {part}", prefix=prefix,
                      attempt=attempt, run_href=report_href(prefix, group, run),
                      tries=[(n, report_href(prefix, group, run, part, n)) for n in attempts])
    doc = _read(reports.read_summary, group, run, part, attempt)
    shown = attempt if attempt is not None else doc.get("attempt")
    totals = doc.get("totals") if isinstance(doc.get("totals"), dict) else {}
    detail = detail_rows(reports.detail_path(group, run, part, attempt), page)
    run_id = doc.get("dag_run_id") or doc.get("run_id") or run
    return render("try.html", title=f"{group} · {run_id}" + (f" · {part}" if part != group else ""), prefix=prefix,
                  doc=doc, group=group, run=run, part=part, run_id=run_id, shown=shown, totals=totals,
                  tries=[(n, report_href(prefix, group, run, part, n)) for n in attempts],
                  ui=airflow_links(prefix, doc, shown if isinstance(shown, int) else None),
                  run_href=report_href(prefix, group, run) if part != group else None,
                  json_href=report_href(prefix, group, run, part, shown if isinstance(shown, int) else None)
                  + "summary.json",
                  totals_rest={k: v for k, v in totals.items() if k not in TOTALS_SHOWN},
                  rest={k: v for k, v in doc.items() if k not in SHOWN}, requests=_requests(doc),
                  detail=detail, query=query, ns_href=lambda ns: namespace_href(prefix, ns),
                  seconds=units.duration(float(doc["seconds"]) * 1000) if isinstance(doc.get("seconds"), int | float)
                  else "—")


def _requests(doc: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    req = doc.get("requests")
    if not isinstance(req, dict) or not isinstance(req.get("total"), dict):
        return []
    per_ns = req.get("namespaces") if isinstance(req.get("namespaces"), dict) else {}
    return [("all", req["total"]), *sorted(per_ns.items())]


def _failed(row: dict[str, Any]) -> bool:
    return row.get("outcome") in FAILED or bool(row.get("error"))


def detail_rows(path, page: int | None) -> dict[str, Any] | None:
    """A page of detail.parquet (a Spark-style directory or one file): failed rows first, then in the
    order written; None when the try wrote none."""
    import pyarrow.parquet as pq

    if not path.exists():
        return None
    try:
        table = pq.read_table(path)
    except (OSError, ValueError) as e:
        return {"error": f"{path.name} cannot be read: {e}", "columns": [], "rows": [], "pager": Pager.of(0, 1),
                "failed": 0}
    rows = table.to_pylist()
    order = sorted(range(len(rows)), key=lambda i: (not _failed(rows[i]), i))
    pager = Pager.of(len(rows), page, param="detail_page")
    shown = [{**rows[i], "_failed": _failed(rows[i])} for i in pager.slice(order)]
    columns = [c for c in table.column_names if any(r.get(c) not in (None, "") for r in shown)] or table.column_names
    return {"error": None, "columns": columns, "rows": shown, "pager": pager,
            "failed": sum(1 for r in rows if _failed(r))}
