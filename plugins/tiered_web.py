"""The plugin's web pages, served by Airflow's API server as a plugin FastAPI app under ``/tiered``
(``tiered_plugin.py``), behind Airflow's auth manager (the same session as the UI):

- ``/tiered/overview``: the "Tiered storage" view (an Airflow nav entry): per namespace, ledgers and bytes
  hot / both / cold, objects, offload and deletion lag, orphan bytes, deletion-log records, requests per
  run and the monthly cost estimate, the Pulsar messages the latest scrub checked (checked, damaged, not
  messages); the last run of each job; bytes per tier over recent runs (SVG).
  All from ``tieredcore.lifecycle.overview`` (the metadata store and the run reports), never Airflow's
  database. A workspace attached to a Pulsar cluster gets its own view (``tieredcore.lifecycle.attached_view``,
  docs/pulsar.md): per namespace BookKeeper and offloaded ledgers and bytes, objects, orphans of the latest
  reconciliation, damaged messages of the latest scrub (repair impossible without BookKeeper), offload
  lag by Pulsar's own thresholds, the cost estimate; hot-tier figures are labelled BookKeeper. ``?at=`` (ISO 8601 or epoch ms) computes the ages at another time; ``overview.json``: the data.
- ``/tiered/reports/``: jobs → runs → attempts; each attempt's summary rendered, and its raw JSON
  (``.../summary.json``). The "Run report" extra link of a Spark task opens its attempt's page.

Listed in ``.airflowignore``: imported by the plugin, not executed as a plugin file. Rendering only; no
numbers are computed here.
"""

from __future__ import annotations

import datetime as dt
import html
import json
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse

from tieredcore.clock import iso_ms, now_ms, parse_time_ms
from tieredcore.cold.requests import REQUEST_KINDS
from tieredcore.config import Config
from tieredcore.errors import FormatError, NotFoundError, TieredError
from tieredcore.lifecycle.attached_view import (
    NOT_RECONCILED,
    NOT_SCRUBBED,
    TIER_LABELS,
    AttachedNamespace,
    AttachedOverview,
    overview_of,
)
from tieredcore.lifecycle.overview import TIERS, Overview, Prices
from tieredcore.reports import ATTEMPT_PREFIX, SUMMARY_FILE, RunReports, attempt_dir_name
from tieredcore.workspace import Workspace

URL_PREFIX = "/tiered"
_NAME = re.compile(r"^[A-Za-z0-9_.=+~-]+$")  # groups, run keys, parts (tieredcore.reports.report_name)

CSS = """
body{font-family:system-ui,sans-serif;margin:1.2rem;color:#1a202c;background:#fff}
h1{font-size:1.4rem}h2{font-size:1.1rem;margin-top:1.6rem}
table{border-collapse:collapse;font-size:.85rem}th,td{border:1px solid #cbd5e0;padding:.25rem .5rem}
th{background:#edf2f7;text-align:left}td.n{text-align:right;font-variant-numeric:tabular-nums}
.muted{color:#718096}.bad{color:#c53030;font-weight:600}pre{background:#f7fafc;padding:.6rem;overflow:auto}
nav a{margin-right:1rem}
"""


def _page(title: str, body: str, prefix: str) -> HTMLResponse:
    return HTMLResponse(f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
                        f"<style>{CSS}</style></head><body>"
                        f"<nav><a href='{prefix}/overview'>Tiered storage</a>"
                        f"<a href='{prefix}/reports/'>Run reports</a></nav>"
                        f"<h1>{html.escape(title)}</h1>{body}</body></html>")


def _e(v: Any) -> str:
    return html.escape(str(v))


def num(n: int | float | None) -> str:
    """How the pages show counts and bytes (exact, thousands separated); '—' for none."""
    if n is None:
        return "—"
    return f"{int(n):,}" if isinstance(n, int) or float(n).is_integer() else f"{n:,.1f}"


def money(x: float) -> str:
    return f"${x:,.4f}"


def age(ms: int | None) -> str:
    """A duration as 1d 2h / 3h 4m / 5m 6s; '—' for none."""
    if ms is None:
        return "—"
    s = max(0, ms // 1000)
    d, h, m = s // 86400, s % 86400 // 3600, s % 3600 // 60
    if d:
        return f"{d}d {h}h"
    if h:
        return f"{h}h {m}m"
    return f"{m}m {s % 60}s"


def report_href(prefix: str, job: str, run_id: str, attempt: int | None = None, part: str | None = None) -> str:
    """A report page: ``job`` the group, ``run_id`` the run key; a part named as its group (a run outside
    Airflow, or one of the layout before DAG runs) is the run's own level."""
    base = f"{prefix}/reports/{quote(job)}/{quote(run_id)}/"
    if part is not None and part != job:
        base += f"{quote(part)}/"
    return base + (f"{attempt_dir_name(attempt)}/" if attempt is not None else "")


# -- the overview page ------------------------------------------------------------------------------


def _cell(value: str, field: str, ns: str, raw: Any = None, bad: bool = False) -> str:
    data = f" data-value='{_e(raw)}'" if raw is not None else ""
    return f"<td class='n{' bad' if bad else ''}' data-ns='{_e(ns)}' data-field='{field}'{data}>{_e(value)}</td>"


def _message_cells(m: dict[str, Any] | None, ns: str) -> list[str]:
    """Entries whose CRC32C the latest scrub checked, damaged ones (red when any), entries that are not
    messages; '—' where no scrub checked the namespace's messages."""
    if m is None:
        return [_cell("—", f, ns) for f in ("messages_checked", "messages_damaged", "not_messages")]
    return [_cell(num(m["messages_checked"]), "messages_checked", ns),
            _cell(num(m["messages_damaged"]), "messages_damaged", ns, bad=m["messages_damaged"] > 0),
            _cell(num(m["not_messages"]), "not_messages", ns)]


def overview_rows(ov: Overview) -> str:
    head = ("<tr><th>namespace</th>" + "".join(f"<th>{t} ledgers</th><th>{t} bytes</th>" for t in TIERS)
            + "<th>objects</th><th>offload lag</th><th>deletion lag</th><th>orphan bytes</th>"
            "<th>deletions in flight</th><th>dead letters</th><th>requests / run</th><th>requests / month</th>"
            "<th>est. cost / month</th><th>messages checked</th><th>damaged messages</th><th>not messages</th></tr>")
    rows = []
    for n in ov.namespaces:
        cells = [f"<td>{_e(n.namespace)}</td>"]
        for t in TIERS:
            cells += [_cell(num(n.tiers[t]["ledgers"]), f"{t}_ledgers", n.namespace),
                      _cell(num(n.tiers[t]["bytes"]), f"{t}_bytes", n.namespace)]
        per_run = ", ".join(f"{k} {num(n.requests_per_run[k])}" for k in REQUEST_KINDS if n.requests_per_run[k])
        cells += [_cell(num(n.objects), "objects", n.namespace),
                  _cell(age(n.offload_lag_ms), "offload_lag", n.namespace, n.offload_lag_ms),
                  _cell(age(n.deletion_lag_ms), "deletion_lag", n.namespace, n.deletion_lag_ms),
                  _cell(num(n.orphan_bytes), "orphan_bytes", n.namespace),
                  _cell(num(n.deletion_in_flight), "deletion_in_flight", n.namespace),
                  _cell(num(n.deletion_dead_letter), "deletion_dead_letter", n.namespace),
                  _cell(per_run or "0", "requests_per_run", n.namespace),
                  _cell(num(n.requests_per_month), "requests_per_month", n.namespace),
                  _cell(money(n.cost_month), "cost_month", n.namespace), *_message_cells(n.messages, n.namespace)]
        rows.append("<tr>" + "".join(cells) + "</tr>")
    t = ov.totals
    per_run = ", ".join(f"{k} {num(t['requests_per_run'][k])}" for k in REQUEST_KINDS if t["requests_per_run"][k])
    total = ["<td><b>all</b></td>"]
    for tier in TIERS:
        total += [_cell(num(t["tiers"][tier]["ledgers"]), f"{tier}_ledgers", "*"),
                  _cell(num(t["tiers"][tier]["bytes"]), f"{tier}_bytes", "*")]
    total += [_cell(num(t["objects"]), "objects", "*"), "<td></td>", "<td></td>",
              _cell(num(t["orphan_bytes"]), "orphan_bytes", "*"),
              _cell(num(t["deletion_in_flight"]), "deletion_in_flight", "*"),
              _cell(num(t["deletion_dead_letter"]), "deletion_dead_letter", "*"),
              _cell(per_run or "0", "requests_per_run", "*"),
              _cell(num(t["requests_per_month"]), "requests_per_month", "*"),
              _cell(money(t["cost_month"]), "cost_month", "*"), *_message_cells(t.get("messages"), "*")]
    return f"<table id='namespaces'>{head}{''.join(rows)}<tr>{''.join(total)}</tr></table>"


def tier_plot(history: list[dict[str, Any]], width: int = 720, height: int = 220,
              labels: dict[str, str] | None = None) -> str:
    """Bytes per tier over the recent runs (one point per run report) as an inline SVG (``labels``: what
    each tier is called; an attached cluster's: BookKeeper and its bucket)."""
    labels = labels or {t: t for t in TIERS}
    if not history:
        return "<p class='muted'>No run report records tiers yet.</p>"
    colors = {"hot": "#dd6b20", "both": "#3182ce", "cold": "#38a169"}
    top = max(max(h[t] for t in TIERS) for h in history) or 1
    left, pad = 70, 20
    xs = [left + (i * (width - left - pad) / max(1, len(history) - 1)) for i in range(len(history))]

    def y(v: int) -> float:
        return pad + (height - 2 * pad) * (1 - v / top)

    parts = [f"<svg id='tier-plot' xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height + 20}' "
             f"role='img' aria-label='bytes per tier over the last {len(history)} runs'>",
             f"<line x1='{left}' y1='{y(0)}' x2='{width - pad}' y2='{y(0)}' stroke='#a0aec0'/>",
             f"<line x1='{left}' y1='{pad}' x2='{left}' y2='{y(0)}' stroke='#a0aec0'/>",
             f"<text x='{left - 4}' y='{pad + 4}' text-anchor='end' font-size='10'>{_e(num(top))}</text>",
             f"<text x='{left - 4}' y='{y(0)}' text-anchor='end' font-size='10'>0</text>"]
    for i, t in enumerate(TIERS):
        pts = " ".join(f"{x:.1f},{y(h[t]):.1f}" for x, h in zip(xs, history, strict=True))
        parts.append(f"<polyline data-tier='{t}' fill='none' stroke='{colors[t]}' stroke-width='2' points='{pts}'/>")
        for x, h in zip(xs, history, strict=True):
            parts.append(f"<circle cx='{x:.1f}' cy='{y(h[t]):.1f}' r='3' fill='{colors[t]}'><title>"
                         f"{_e(h['job'])} {_e(h['run_id'])}: {_e(labels[t])} {_e(num(h[t]))} bytes</title></circle>")
        step = max(90, 10 + 8 * max(len(v) for v in labels.values()))
        parts.append(f"<text x='{left + 10 + i * step}' y='{height + 14}' font-size='12' fill='{colors[t]}'>"
                     f"■ {_e(labels[t])}</text>")
    parts.append("</svg>")
    return "".join(parts)


def last_runs_table(ov: Overview | AttachedOverview, prefix: str) -> str:
    if not ov.last_runs:
        return "<p class='muted'>No run reports yet.</p>"
    rows = []
    for r in ov.last_runs:
        req = sum(int(v) for v in (r.requests.get("total") or {}).values())
        rows.append(f"<tr data-job='{_e(r.job)}'><td>{_e(r.job)}</td>"
                    f"<td><a href='{report_href(prefix, r.job, r.run_id)}'>{_e(r.run_id)}</a></td>"
                    f"<td class='n'>{r.attempt}</td><td>{_e(iso_ms(r.as_of_ms))}</td>"
                    f"<td class='n{' bad' if r.failures else ''}'>{r.failures}</td><td class='n'>{num(req)}</td></tr>")
    return ("<table id='last-runs'><tr><th>job</th><th>last run</th><th>attempt</th><th>logical time</th>"
            "<th>failures</th><th>requests</th></tr>" + "".join(rows) + "</table>")


def unreadable_list(ov: Overview) -> str:
    """The topics whose record cannot be read (in none of the numbers above), with where and why."""
    bad = [u for n in ov.namespaces for u in n.unreadable_topics]
    if not bad:
        return ""
    items = "".join(f"<li>{_e(u)}</li>" for u in bad)
    return (f"<div id='unreadable' class='bad'><p>{len(bad)} topic record(s) cannot be read; those topics are "
            f"in none of the numbers above:</p><ul>{items}</ul></div>")


def overview_page(ov: Overview | AttachedOverview, config: Config, prefix: str) -> HTMLResponse:
    if isinstance(ov, AttachedOverview):
        return attached_page(ov, config, prefix)
    p = ov.prices
    body = (f"<p class='muted' id='as-of' data-now-ms='{ov.now_ms}'>As of {_e(iso_ms(ov.now_ms))}; store "
            f"{_e(config.store_url)}; prices: storage ${p.storage_gb_month}/GiB-month, per 1,000 requests "
            + ", ".join(f"{k} ${v}" for k, v in p.per_1000.items()) + ".</p>"
            + overview_rows(ov) + unreadable_list(ov)
            + "<p class='muted'>hot: only in the hot tier; both: hot and in the object store; cold: only in the "
              "object store. Offload lag: age of the oldest ledger due for offload but not offloaded; deletion "
              "lag: how long the oldest hot copy has been past its deletion lag. Requests per run: mean over the "
              "runs of each job that worked on the namespace; per month at each job's pace (its runs' spacing). "
              "Cost: object-store bytes (both + cold + orphans) and those requests at the configured prices. "
              "Messages: entries whose Pulsar CRC32C the latest deep scrub of the namespace checked (a batch is "
              "one entry; objects without chunk checksums, or every object with messages = all), those that "
              "failed in ledgers of messages (damaged: named in the scrub's report), and failing entries of "
              "ledgers that do not hold messages (opaque entries, never damage); — where no scrub checked "
              "them.</p>"
            + f"<h2>Bytes per tier over the last {len(ov.history)} run(s)</h2>" + tier_plot(ov.history)
            + "<h2>Last run of each job</h2>" + last_runs_table(ov, prefix))
    return _page("Tiered storage", body, prefix)


# -- the view of an attached Pulsar cluster --------------------------------------------------------


ATTACHED_HEAD = ("namespace", "BookKeeper ledgers", "BookKeeper bytes", "offloaded ledgers", "offloaded bytes",
                 "objects", "offloads in progress", "orphan objects", "orphan bytes", "damaged messages", "repair",
                 "offload lag", "offload threshold", "deletions in flight", "dead letters", "requests / month",
                 "est. cost / month")


def _threshold(t: dict[str, int | None]) -> str:
    """The thresholds Pulsar's policies in ZooKeeper set ('broker.conf' when neither is)."""
    parts = [f"{num(t['bytes'])} bytes" if t["bytes"] is not None and t["bytes"] >= 0 else "",
             f"{age(t['seconds'] * 1000)}" if t["seconds"] is not None and t["seconds"] >= 0 else ""]
    return " or ".join(p for p in parts if p) or "broker.conf"


def _attached_cells(n: AttachedNamespace) -> list[str]:
    ns = n.namespace
    if n.orphans is None:
        orphans = [_cell(NOT_RECONCILED, "orphan_objects", ns), _cell(NOT_RECONCILED, "orphan_bytes", ns)]
    else:
        orphans = [_cell(num(n.orphans["objects"]), "orphan_objects", ns, bad=n.orphans["objects"] > 0),
                   _cell(num(n.orphans["bytes"]), "orphan_bytes", ns, bad=n.orphans["bytes"] > 0)]
    d = n.damaged
    damaged = ([_cell(NOT_SCRUBBED, "damaged_messages", ns), _cell("—", "repair", ns)] if d is None else
               [_cell(num(d["count"]), "damaged_messages", ns, bad=d["count"] > 0),
                _cell(d["repair"] or "—", "repair", ns, bad=bool(d["repair"]))])
    lag = _cell(age(n.offload_lag_ms), "offload_lag", ns, n.offload_lag_ms, bad=n.offload_lag_ms is not None)
    if n.offload_lag_ledger:
        lag = lag.replace("<td ", f"<td title='oldest due, not offloaded: {_e(n.offload_lag_ledger)}' ", 1)
    return [f"<td>{_e(ns)}</td>",
            _cell(num(n.bookkeeper["ledgers"]), "bookkeeper_ledgers", ns),
            _cell(num(n.bookkeeper["bytes"]), "bookkeeper_bytes", ns),
            _cell(num(n.offloaded["ledgers"]), "offloaded_ledgers", ns),
            _cell(num(n.offloaded["bytes"]), "offloaded_bytes", ns),
            _cell(num(n.offloaded["objects"]), "objects", ns),
            _cell(num(n.offloads_in_progress), "offloads_in_progress", ns),
            *orphans, *damaged, lag, _cell(_threshold(n.thresholds), "offload_threshold", ns),
            _cell(num(n.deletion_in_flight), "deletion_in_flight", ns),
            _cell(num(n.deletion_dead_letter), "deletion_dead_letter", ns),
            _cell(num(n.requests_per_month), "requests_per_month", ns),
            _cell(money(n.cost_month), "cost_month", ns)]


def attached_rows(ov: AttachedOverview) -> str:
    head = "<tr>" + "".join(f"<th>{_e(h)}</th>" for h in ATTACHED_HEAD) + "</tr>"
    rows = "".join("<tr>" + "".join(_attached_cells(n)) + "</tr>" for n in ov.namespaces)
    t = ov.totals
    orphans = t["orphans"]
    total = ["<td><b>all</b></td>",
             _cell(num(t["bookkeeper"]["ledgers"]), "bookkeeper_ledgers", "*"),
             _cell(num(t["bookkeeper"]["bytes"]), "bookkeeper_bytes", "*"),
             _cell(num(t["offloaded"]["ledgers"]), "offloaded_ledgers", "*"),
             _cell(num(t["offloaded"]["bytes"]), "offloaded_bytes", "*"),
             _cell(num(t["offloaded"]["objects"]), "objects", "*"),
             _cell(num(t["offloads_in_progress"]), "offloads_in_progress", "*"),
             _cell(NOT_RECONCILED if orphans is None else num(orphans["objects"]), "orphan_objects", "*"),
             _cell(NOT_RECONCILED if orphans is None else num(orphans["bytes"]), "orphan_bytes", "*"),
             _cell(NOT_SCRUBBED if t["damaged"] is None else num(t["damaged"]), "damaged_messages", "*",
                   bad=bool(t["damaged"])), "<td></td>",
             _cell(age(t["offload_lag_ms"]), "offload_lag", "*", t["offload_lag_ms"]), "<td></td>",
             _cell(num(t["deletion_in_flight"]), "deletion_in_flight", "*"),
             _cell(num(t["deletion_dead_letter"]), "deletion_dead_letter", "*"),
             _cell(num(t["requests_per_month"]), "requests_per_month", "*"),
             _cell(money(t["cost_month"]), "cost_month", "*")]
    return f"<table id='namespaces' data-attached='{_e(ov.cluster)}'>{head}{rows}<tr>{''.join(total)}</tr></table>"


def attached_details(ov: AttachedOverview) -> str:
    """The damaged messages' positions (with why they stay damaged), the oldest overdue ledger per
    namespace, and what could not be read."""
    items = [f"<li data-ns='{_e(n.namespace)}' class='bad'>{_e(p)}: {_e(n.damaged['repair'])}</li>"
             for n in ov.namespaces if n.damaged for p in n.damaged["positions"]]
    out = ""
    if items:
        out += ("<h2>Damaged messages</h2><p>Found by the latest scrub that checked each namespace's messages "
                "(CRC32C); the project never deletes them and cannot rewrite them: the only other copy is in "
                "BookKeeper, which belongs to the brokers.</p><ul id='damaged'>" + "".join(items) + "</ul>")
    lagging = [f"<li data-ns='{_e(n.namespace)}'>{_e(n.namespace)}: {_e(n.offload_lag_ledger)}, due for "
               f"{_e(age(n.offload_lag_ms))}</li>" for n in ov.namespaces if n.offload_lag_ledger]
    if lagging:
        out += ("<h2>Offload lag</h2><ul id='offload-lag'>" + "".join(lagging) + "</ul>")
    notes = [f"<li>{_e(n.namespace)}: {_e(x)}</li>" for n in ov.namespaces for x in n.notes]
    bad = [f"<li>{_e(u)}</li>" for n in ov.namespaces for u in n.unreadable_topics]
    if bad:
        out += (f"<div id='unreadable' class='bad'><p>{len(bad)} topic record(s) cannot be read; those topics are "
                f"in none of the numbers above:</p><ul>{''.join(bad)}</ul></div>")
    if notes:
        out += f"<h2>Notes</h2><ul id='notes' class='muted'>{''.join(notes)}</ul>"
    return out


def attached_page(ov: AttachedOverview, config: Config, prefix: str) -> HTMLResponse:
    p = ov.prices
    body = (f"<p class='muted' id='as-of' data-now-ms='{ov.now_ms}'>As of {_e(iso_ms(ov.now_ms))}; attached to "
            f"Pulsar cluster <b id='cluster'>{_e(ov.cluster)}</b> (hot tier: {_e(ov.hot_tier)}, run by the brokers); "
            f"bucket {_e(config.store_url)}; prices: storage ${p.storage_gb_month}/GiB-month, per 1,000 requests "
            + ", ".join(f"{k} ${v}" for k, v in p.per_1000.items()) + ".</p>"
            + attached_rows(ov) + attached_details(ov)
            + "<p class='muted'>From the cluster's ZooKeeper (ManagedLedgerInfo of every topic, namespace policies) "
              "and this project's run reports; nothing is written. BookKeeper: ledgers whose BookKeeper copy the "
              "brokers have not deleted (the open ledger counts with size 0 until it closes). Offloaded: complete "
              "offloads, ledger sizes as Pulsar counts them; objects: data + index per offload. Orphans: the latest "
              "reconciliation's candidates (this cluster's, past the grace period). Damaged messages: the latest "
              "scrub that checked the namespace's messages. Offload lag: age of the oldest ledger Pulsar's "
              "offload threshold makes due but that is not offloaded (a stuck offloader). Cost: offloaded and "
              "orphan bytes and the project's requests at the configured prices.</p>"
            + f"<h2>Bytes over the last {len(ov.history)} run(s)</h2>" + tier_plot(ov.history, labels=TIER_LABELS)
            + "<h2>Last run of each job</h2>" + last_runs_table(ov, prefix))
    return _page(f"Tiered storage · Pulsar cluster {ov.cluster}", body, prefix)


# -- report pages ---------------------------------------------------------------------------------


def _safe(name: str, what: str) -> str:
    if not _NAME.match(name) or name in (".", ".."):
        raise HTTPException(status_code=404, detail=f"no such {what}")
    return name


def _load(reports: RunReports, job: str, run_id: str, part: str, attempt: int | None = None) -> dict[str, Any]:
    """A part's summary.json (its latest or an attempt's): 404 when it was never written, 500 when
    unreadable."""
    try:
        return reports.read_summary(_safe(job, "job"), _safe(run_id, "run"), _safe(part, "part"), attempt)
    except NotFoundError:
        what = run_id if attempt is None else attempt_dir_name(attempt)
        raise HTTPException(status_code=404, detail=f"no report {what}") from None
    except FormatError as e:
        raise HTTPException(status_code=500, detail=str(e)) from None


def _kv_table(d: dict[str, Any], table_id: str = "") -> str:
    rows = []
    for k, v in d.items():
        if isinstance(v, dict) and v and all(not isinstance(x, dict | list) for x in v.values()):
            shown = ", ".join(f"{_e(a)}: {_e(num(b) if isinstance(b, int | float) and not isinstance(b, bool) else b)}"
                              for a, b in v.items())
        elif isinstance(v, dict | list):
            shown = f"<pre>{_e(json.dumps(v, indent=1, sort_keys=True, default=str))}</pre>" if v else "—"
        elif isinstance(v, int) and not isinstance(v, bool) and k.endswith("_ms") and v > 10**11:
            shown = f"{_e(iso_ms(v))} <span class='muted'>({v})</span>"  # an epoch-ms time
        elif isinstance(v, int | float) and not isinstance(v, bool):
            shown = _e(num(v))
        else:
            shown = _e(v)
        rows.append(f"<tr data-key='{_e(k)}'><th>{_e(k)}</th><td>{shown}</td></tr>")
    return f"<table{f' id={table_id!r}' if table_id else ''}>" + "".join(rows) + "</table>"


def summary_body(prefix: str, job: str, run_id: str, doc: dict[str, Any], attempts: list[int],
                 shown: int | None, part: str | None = None) -> str:
    """A summary.json readably: the headline (attempt, logical time, outcome), totals per namespace,
    requests, then every other field."""
    totals = doc.get("totals") if isinstance(doc.get("totals"), dict) else {}
    attempt_links = " ".join(
        (f"<b>{n}</b>" if n == shown else f"<a href='{report_href(prefix, job, run_id, n, part)}'>{n}</a>")
        for n in attempts)
    raw = report_href(prefix, job, run_id, shown, part) + SUMMARY_FILE
    failures = int(totals.get("failures", 0) or 0)
    head = (f"<p id='headline'>Job <b>{_e(job)}</b>, run <b>{_e(run_id)}</b>, attempt "
            f"<b id='attempt'>{_e(doc.get('attempt', shown or '?'))}</b> of {len(attempts)} "
            f"(attempts: {attempt_links or '—'}); logical time {_e(iso_ms(int(doc.get('as_of_ms', 0) or 0)))}; "
            f"{_e(doc.get('seconds', '?'))} s; <span class='{'bad' if failures else ''}' id='outcome'>"
            f"{'FAILED: ' + str(failures) + ' failure(s)' if failures else 'no failures'}</span>"
            f"{' (dry run)' if doc.get('dry_run') else ''}. <a href='{raw}'>raw JSON</a></p>")
    parts = [head]
    if totals:
        parts.append("<h2>Totals</h2>" + _kv_table({k: v for k, v in totals.items() if k != "namespaces"},
                                                    "totals"))
        ns = totals.get("namespaces") or {}
        if ns:
            rows = "".join(f"<tr data-ns='{_e(n)}'><td>{_e(n)}</td><td class='n'>{num(d.get('ledgers', 0))}</td>"
                           f"<td class='n'>{num(d.get('bytes', 0))}</td><td class='n'>{num(d.get('failures', 0))}</td>"
                           f"<td>{_e(', '.join(f'{k} {v}' for k, v in (d.get('outcomes') or {}).items()))}</td>"
                           f"<td>{_e(', '.join(f'{k} {num(v)}' for k, v in (d.get('counters') or {}).items()))}</td></tr>"
                           for n, d in sorted(ns.items()))
            parts.append("<h2>Per namespace</h2><table id='report-namespaces'><tr><th>namespace</th><th>units</th>"
                         f"<th>bytes</th><th>failures</th><th>outcomes</th><th>counters</th></tr>{rows}</table>")
    req = doc.get("requests")
    if isinstance(req, dict) and isinstance(req.get("total"), dict):
        parts.append("<h2>Object-store requests</h2>" + _kv_table(
            {"total": req["total"], **{ns: v for ns, v in (req.get("namespaces") or {}).items()}}, "requests"))
    rest = {k: v for k, v in doc.items() if k not in ("totals", "requests", "tiers")}
    parts.append("<h2>Report fields</h2>" + _kv_table(rest, "fields"))
    return "".join(parts)


async def require_ui_user(request: Request) -> None:
    """Airflow's own check for its UI pages, per request: the user from the session cookie (or a bearer
    token) as the core API resolves it, authorized by the auth manager for the website view and for
    reading DAGs (the view shows every DAG's runs and reports); 401 / 403 otherwise. (A plugin's app is
    mounted without the core API's dependencies: it must check itself.) Airflow's API modules are
    imported here, in the API server, not where the plugin is only loaded."""
    from airflow.api_fastapi.auth.managers.models.resource_details import AccessView
    from airflow.api_fastapi.core_api.security import get_user, requires_access_dag, requires_access_view
    from fastapi.security import HTTPBearer

    bearer = await HTTPBearer(auto_error=False)(request)
    user = await get_user(request, None, bearer)
    requires_access_view(AccessView.WEBSITE)(request, user)
    requires_access_dag("GET")(request, user)


def create_app(load_config: Callable[[], Config] = Config.load, *, secured: bool = True) -> FastAPI:
    """The plugin's FastAPI app. ``load_config``: the configuration, read per request (the API server's
    $TIERED_CONFIG by default). ``secured``: every route requires a user of the Airflow UI (the auth
    manager's check for the website view), as the UI's own pages do."""
    deps = [Depends(require_ui_user)] if secured else []
    app = FastAPI(title="Tiered storage", dependencies=deps, docs_url=None, redoc_url=None, openapi_url=None)

    def config() -> Config:
        try:
            return load_config()
        except TieredError as e:
            raise HTTPException(status_code=500, detail=f"tiered configuration: {e}") from None

    def run_reports() -> RunReports:
        c = config()
        if not c.reports_dir:
            raise HTTPException(status_code=500, detail="no reports_dir in the tiered configuration")
        return RunReports(c.reports_dir)

    def overview(at: str | None) -> tuple[Overview | AttachedOverview, Config]:
        c = config()
        try:
            when = parse_time_ms(at, "at") if at else now_ms()
        except TieredError as e:
            raise HTTPException(status_code=400, detail=str(e)) from None
        try:
            with Workspace(c) as ws:
                return overview_of(ws, c.reports_dir, when, Prices.of(c)), c
        except TieredError as e:
            raise HTTPException(status_code=500, detail=f"reading the tiered metadata: {e}") from None

    @app.get("/", include_in_schema=False)
    def root(request: Request) -> RedirectResponse:
        return RedirectResponse(f"{mounted_at(request)}/overview")

    @app.get("/overview", response_class=HTMLResponse)
    def overview_html(request: Request,
                      at: str | None = Query(None, description="ISO 8601 or epoch ms (default: now)")):
        ov, c = overview(at)
        return overview_page(ov, c, mounted_at(request))

    @app.get("/overview.json")
    def overview_json(at: str | None = Query(None)) -> JSONResponse:
        ov, _ = overview(at)
        return JSONResponse(json.loads(json.dumps(ov.as_dict(), default=str)))

    @app.get("/reports/", response_class=HTMLResponse)
    def jobs(request: Request) -> HTMLResponse:
        reports, prefix = run_reports(), mounted_at(request)
        items = "".join(f"<li><a href='{prefix}/reports/{quote(j)}/'>{_e(j)}</a> "
                        f"<span class='muted'>({len(reports.runs(j))} run(s))</span></li>" for j in reports.groups())
        return _page("Run reports", f"<ul id='jobs'>{items}</ul>" if items else "<p>No reports yet.</p>", prefix)

    @app.get("/reports/{job}/", response_class=HTMLResponse)
    def runs(request: Request, job: str) -> HTMLResponse:
        prefix = mounted_at(request)
        reports = run_reports()
        try:
            names = reports.runs(_safe(job, "job"))
        except NotFoundError:
            raise HTTPException(status_code=404, detail=f"no reports of job {job}") from None
        found = [(reports.written(job, r) or 0.0, r,
                  sorted({a for p in reports.parts(job, r) for a in reports.attempts(job, r, p)})) for r in names]
        rows = "".join(f"<tr><td><a href='{report_href(prefix, job, name)}'>{_e(name)}</a></td>"
                       f"<td>{_e(dt.datetime.fromtimestamp(m, dt.UTC).isoformat(timespec='seconds') if m else '—')}"
                       f"</td><td>{_e(', '.join(map(str, att)) or '—')}</td></tr>" for m, name, att in found)
        return _page(f"Runs of {job}", "<table id='runs'><tr><th>run</th><th>written</th><th>attempts</th></tr>"
                     f"{rows}</table>", prefix)

    def render(prefix: str, job: str, run_id: str, part: str, attempt: int | None) -> HTMLResponse:
        reports = run_reports()
        attempts = reports.attempts(_safe(job, "job"), _safe(run_id, "run"), _safe(part, "part"))
        if not reports.summary_path(job, run_id, part, attempt).is_file():
            if not reports.has_run(job, run_id):
                raise HTTPException(status_code=404, detail=f"no report of run {run_id} of {job}")
            links = " ".join(f"<a href='{report_href(prefix, job, run_id, n, part)}'>{n}</a>" for n in attempts)
            return HTMLResponse(_page(f"{job} · {run_id}", f"<p id='missing'>Attempt {attempt} wrote no report "
                                      f"(it failed before the job finished?). Attempts with a report: "
                                      f"{links or 'none'}.</p>", prefix).body, status_code=404)
        doc = _load(reports, job, run_id, part, attempt)
        shown = attempt if attempt is not None else doc.get("attempt")
        return _page(f"{job} · {run_id}" + (f" · {part}" if part != job else ""),
                     summary_body(prefix, job, run_id, doc, attempts, int(shown) if isinstance(shown, int) else None,
                                  part), prefix)

    def parts_of(job: str, run_id: str) -> list[str]:
        try:
            return run_reports().parts(_safe(job, "job"), _safe(run_id, "run"))
        except NotFoundError:
            raise HTTPException(status_code=404, detail=f"no report of run {run_id} of {job}") from None

    def part_or_attempt(job: str, run_id: str, name: str) -> tuple[str, int | None]:
        """``<run>/<part>/`` or, for a run of one part named as its group, ``<run>/attempt-<n>/``."""
        if name.startswith(ATTEMPT_PREFIX):
            return job, _attempt(name)
        return _safe(name, "part"), None

    @app.get("/reports/{job}/{run_id}/", response_class=HTMLResponse)
    def run_page(request: Request, job: str, run_id: str) -> HTMLResponse:
        prefix, parts = mounted_at(request), parts_of(job, run_id)
        if parts == [job] or len(parts) == 1:
            return render(prefix, job, run_id, parts[0], None)
        items = "".join(f"<li><a href='{report_href(prefix, job, run_id, None, p)}'>{_e(p)}</a></li>" for p in parts)
        return _page(f"{job} · {run_id}", f"<ul id='parts'>{items}</ul>" if items else "<p>No parts.</p>", prefix)

    @app.get("/reports/{job}/{run_id}/summary.json")
    def run_json(job: str, run_id: str) -> JSONResponse:
        parts = parts_of(job, run_id)
        if len(parts) == 1:
            return JSONResponse(_load(run_reports(), job, run_id, parts[0]))
        return JSONResponse(run_reports().read_run(job, run_id))

    @app.get("/reports/{job}/{run_id}/{name}/", response_class=HTMLResponse)
    def part_page(request: Request, job: str, run_id: str, name: str) -> HTMLResponse:
        return render(mounted_at(request), job, run_id, *part_or_attempt(job, run_id, name))

    @app.get("/reports/{job}/{run_id}/{name}/summary.json")
    def part_json(job: str, run_id: str, name: str) -> JSONResponse:
        return JSONResponse(_load(run_reports(), job, run_id, *part_or_attempt(job, run_id, name)))

    @app.get("/reports/{job}/{run_id}/{part}/{attempt}/", response_class=HTMLResponse)
    def attempt_page(request: Request, job: str, run_id: str, part: str, attempt: str) -> HTMLResponse:
        return render(mounted_at(request), job, run_id, _safe(part, "part"), _attempt(attempt))

    @app.get("/reports/{job}/{run_id}/{part}/{attempt}/summary.json")
    def attempt_json(job: str, run_id: str, part: str, attempt: str) -> JSONResponse:
        return JSONResponse(_load(run_reports(), job, run_id, part, _attempt(attempt)))

    return app


def mounted_at(request: Request) -> str:
    """Where the app is mounted, as links must start (the API server's mount point, ``/tiered``, behind
    whatever root path the server itself has)."""
    return str(request.scope.get("root_path", "")).rstrip("/")


def _attempt(text: str) -> int:
    if not text.startswith(ATTEMPT_PREFIX) or not text[len(ATTEMPT_PREFIX):].isdigit():
        raise HTTPException(status_code=404, detail=f"no such attempt {text!r} (attempt-<n>)")
    return int(text[len(ATTEMPT_PREFIX):])
