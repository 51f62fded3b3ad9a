"""The "Tiered storage" view's pages: the overview (a local workspace's or an attached Pulsar cluster's),
a namespace's topics and a topic's ledgers. Each builds its template's context from tieredcore's numbers
(``lifecycle.overview``, ``lifecycle.attached_view``) and renders ``plugins/templates/``."""

from __future__ import annotations

from typing import Any

import tiered_units as units
from fastapi.responses import HTMLResponse
from tiered_pages import (
    LAG_ALERT_MS,
    Pager,
    attention,
    namespace_href,
    render,
    report_href,
    topic_href,
)

from tieredcore.cold.requests import REQUEST_KINDS
from tieredcore.config import Config
from tieredcore.errors import TieredError
from tieredcore.lifecycle.attached_view import NOT_RECONCILED, NOT_SCRUBBED, TIER_LABELS, AttachedOverview
from tieredcore.lifecycle.overview import TIERS, Overview, Page, RunInfo
from tieredcore.reports import RunReports

ATTACHED_HEAD = ("namespace", "BookKeeper ledgers", "BookKeeper bytes", "offloaded ledgers", "offloaded bytes",
                 "objects", "offloads in progress", "orphan objects", "orphan bytes", "damaged messages", "repair",
                 "offload lag", "offload threshold", "deletions in flight", "dead letters", "requests / month",
                 "est. cost / month")


def per_run(requests: dict[str, float]) -> str:
    """Requests per run by kind: ``GET 1, PUT 8``; ``0`` for none."""
    return ", ".join(f"{k} {units.count(requests[k])}" for k in REQUEST_KINDS if requests.get(k)) or "0"


def threshold(t: dict[str, int | None]) -> str:
    """The offload thresholds Pulsar's policies in ZooKeeper set ('broker.conf' when neither is)."""
    parts = [units.human_bytes(t["bytes"]) if t["bytes"] is not None and t["bytes"] >= 0 else "",
             units.duration(t["seconds"] * 1000) if t["seconds"] is not None and t["seconds"] >= 0 else ""]
    return " or ".join(p for p in parts if p) or "broker.conf"


def plot_data(history: list[dict[str, Any]], labels: dict[str, str]) -> dict[str, Any]:
    """uPlot's columns: x in epoch seconds (the runs' logical times), one series of bytes per tier."""
    return {"x": [h["as_of_ms"] / 1000 for h in history],
            "series": [{"tier": t, "label": labels[t], "values": [h[t] for h in history]} for t in TIERS]}


def _last_run(r: RunInfo, prefix: str) -> dict[str, Any]:
    group, run_key, part = getattr(r, "group", ""), getattr(r, "run_key", ""), getattr(r, "part", "")
    href = report_href(prefix, group, run_key, part or None) if group and run_key else None
    return {"job": r.job, "run_id": r.run_id, "attempt": r.attempt, "as_of_ms": r.as_of_ms, "failures": r.failures,
            "requests_total": sum(int(v) for v in (r.requests.get("total") or {}).values()), "href": href}


def latest_dag_runs(reports_dir: str, last_runs: list[RunInfo]) -> list[tuple[str, str, dict[str, Any]]]:
    """The DAG runs holding each job's newest report, when their summary task recorded them (run.json):
    (group, run key, record). Only those few records are read."""
    reports, out = RunReports(reports_dir), []
    for group, key in sorted({(r.group, r.run_key) for r in last_runs if r.group and r.run_key}):
        try:
            if reports.run_json_path(group, key).is_file():
                out.append((group, key, reports.read_run(group, key)))
        except TieredError:
            continue  # an unreadable record: its run's page says why
    return out


def overview_page(ov: Overview | AttachedOverview, config: Config, prefix: str, query: dict[str, Any],
                  ns_page: int | None = None, runs_page: int | None = None,
                  lag_alert_ms: int = LAG_ALERT_MS) -> HTMLResponse:
    """The overview: the attention strip, namespaces (a page of them), the tier plot, the last runs."""
    ns_pager = Pager.of(len(ov.namespaces), ns_page, param="ns_page")
    runs_pager = Pager.of(len(ov.last_runs), runs_page, param="runs_page")
    attached = isinstance(ov, AttachedOverview)
    common = dict(
        prefix=prefix, ov=ov, store_url=config.store_url, query=query, ns_pager=ns_pager, runs_pager=runs_pager,
        namespaces=ns_pager.slice(ov.namespaces), items=attention(ov, prefix, lag_alert_ms, latest_dag_runs(config.reports_dir, ov.last_runs) if config.reports_dir else ()), lag_alert_ms=lag_alert_ms,
        last_runs=[_last_run(r, prefix) for r in runs_pager.slice(ov.last_runs)], history=ov.history,
        plot=plot_data(ov.history, TIER_LABELS if attached else {t: t for t in TIERS}),
        unreadable=[u for n in ov.namespaces for u in n.unreadable_topics],
        ns_href=lambda ns: namespace_href(prefix, ns))
    if not attached:
        return render("overview.html", title="Tiered storage", per_run=per_run, **common)
    return render("attached.html", title=f"Tiered storage · Pulsar cluster {ov.cluster}", head=ATTACHED_HEAD,
                  threshold=threshold, not_reconciled=NOT_RECONCILED, not_scrubbed=NOT_SCRUBBED,
                  damaged=[(n.namespace, p, n.damaged["repair"]) for n in ov.namespaces if n.damaged
                           for p in n.damaged["positions"]],
                  lagging=[n for n in ov.namespaces if n.offload_lag_ledger],
                  notes=[(n.namespace, x) for n in ov.namespaces for x in n.notes], **common)


def namespace_page(namespace: str, page: Page, pager: Pager, prefix: str, query: dict[str, Any]) -> HTMLResponse:
    return render("namespace.html", title=f"Namespace {namespace}", prefix=prefix, namespace=namespace, rows=page.items,
                  pager=pager, query=query, topic_href=lambda t: topic_href(prefix, t))


def topic_page(topic: str, namespace: str, page: Page, pager: Pager, prefix: str,
               query: dict[str, Any]) -> HTMLResponse:
    return render("topic.html", title=f"Topic {topic}", prefix=prefix, topic=topic, namespace=namespace,
                  rows=page.items, pager=pager, query=query, ns_href=lambda ns: namespace_href(prefix, ns))
