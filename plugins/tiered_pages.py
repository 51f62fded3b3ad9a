"""What the plugin's pages share: the Jinja2 environment over ``plugins/templates/`` (autoescaped: a run
id or a namespace is text, never markup), pagination, the addresses of Airflow's own UI pages (a DAG run,
a task instance, its log) and of the plugin's views inside the UI, and the "needs attention" strip.

Rendering helpers only; the numbers come from tieredcore (``lifecycle.overview``, ``reports``)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import jinja2
import tiered_units as units
from fastapi.responses import HTMLResponse

from tieredcore.lifecycle.overview import TIERS

TEMPLATES = Path(__file__).resolve().parent / "templates"
STATIC = Path(__file__).resolve().parent / "static"
VENDOR_MANIFEST = STATIC / "vendor.json"
PAGE_SIZE = 50
# external views (tiered_plugin.py): the nav entry and the tabs of a DAG run and of a task instance
NAV_ROUTE = "tiered-storage"
RUN_TAB_ROUTE = "tiered-run-report"
TASK_TAB_ROUTE = "tiered-task-report"
LAG_ALERT_MS = 3_600_000  # offload lag the strip flags (?lag_alert= on the overview sets another)


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                             undefined=jinja2.ChainableUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(bytes=units.human_bytes, duration=units.duration, count=units.count, money=units.money,
                       time=units.iso_time, q=lambda s: quote(str(s), safe=""))
    env.globals.update(TIERS=TIERS, units=units, vendor=vendor())
    return env


def vendor() -> dict[str, Any]:
    """The vendored chart library's manifest entry (version, directory, sha256 of each file)."""
    return json.loads(VENDOR_MANIFEST.read_text())["uplot"]


_ENV: jinja2.Environment | None = None


def render(template: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    """A page from ``plugins/templates/<template>``; ``context`` must hold ``prefix`` (where the app is
    mounted, for links) and ``title``."""
    global _ENV
    if _ENV is None:
        _ENV = _environment()
    context.setdefault("in_ui_url", in_ui_url(context["prefix"]))
    return HTMLResponse(_ENV.get_template(template).render(**context), status_code=status_code)


# -- pagination --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pager:
    """Page ``page`` (1-based) of ``total`` items, ``size`` a page; ``param`` is its query parameter
    (a page may have several lists, each paged on its own)."""

    page: int
    size: int
    total: int
    param: str = "page"

    @classmethod
    def of(cls, total: int, page: int | None, size: int = PAGE_SIZE, param: str = "page") -> Pager:
        pages = max(1, math.ceil(total / size))
        return cls(min(max(1, page or 1), pages), size, total, param)

    @property
    def pages(self) -> int:
        return max(1, math.ceil(self.total / self.size))

    @property
    def offset(self) -> int:
        return (self.page - 1) * self.size

    @property
    def end(self) -> int:
        return min(self.total, self.offset + self.size)

    def slice(self, items: Sequence[Any]) -> list[Any]:
        return list(items[self.offset:self.end])

    def href(self, page: int, query: dict[str, Any]) -> str:
        """``?`` + the page's query with this list at ``page``."""
        q = {k: v for k, v in query.items() if v is not None and k != self.param}
        return "?" + urlencode({**q, self.param: page})


# -- where things are: the plugin's pages, Airflow's UI -----------------------------------------------


def ui_base(prefix: str) -> str:
    """The Airflow UI's base path, from where the plugin's app is mounted (``<base>/tiered``)."""
    return prefix[: -len("/tiered")] if prefix.endswith("/tiered") else prefix.rsplit("/", 1)[0]


def report_href(prefix: str, group: str, run: str, part: str | None = None, attempt: int | None = None) -> str:
    """A report page: the run (``part`` None), a part's latest try, or one try; a part named as its
    group (a run outside Airflow) is the run's own level."""
    url = f"{prefix}/reports/{quote(group, safe='')}/{quote(run, safe='')}/"
    if part is not None and part != group:
        url += f"{quote(part, safe='')}/"
    return url + (f"attempt-{attempt}/" if attempt is not None else "")


def dag_run_url(prefix: str, dag_id: str, run_id: str) -> str:
    return f"{ui_base(prefix)}/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}"


def task_url(prefix: str, dag_id: str, run_id: str, task_id: str, map_index: int | None) -> str:
    """The task instance's page (its Logs tab first); a mapped instance's own page."""
    url = f"{dag_run_url(prefix, dag_id, run_id)}/tasks/{quote(task_id, safe='')}"
    return url + (f"/mapped/{map_index}" if map_index is not None and map_index >= 0 else "")


def log_url(prefix: str, dag_id: str, run_id: str, task_id: str, map_index: int | None,
            try_number: int | None) -> str:
    """The task instance's log of one try (the Logs tab reads ``try_number``)."""
    url = task_url(prefix, dag_id, run_id, task_id, map_index)
    return url + (f"?try_number={try_number}" if try_number else "")


def in_ui_url(prefix: str) -> str:
    """Where a page of this app shows inside the UI: the nav view's route followed by the page's path
    (the UI loads that path into its frame)."""
    return f"{ui_base(prefix)}/plugin/{NAV_ROUTE}"


# -- needs attention -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Attention:
    kind: str  # failed-run, dead-letters, offload-lag, damaged, unreadable
    text: str
    href: str | None = None


def attention(ov: Any, prefix: str, lag_alert_ms: int = LAG_ALERT_MS,
              dag_runs: Sequence[tuple[str, str, dict[str, Any]]] = ()) -> list[Attention]:
    """What an operator should look at first, from what the overview already knows: the newest run of
    each job when it failed, the DAG runs holding them when a part failed or wrote no report
    (``dag_runs``: (group, run key, run.json)), dead-lettered deletions, offload lag over
    ``lag_alert_ms``, damaged messages found by scrubs, topic records that cannot be read."""
    out: list[Attention] = []
    for group, key, doc in dag_runs:
        failed = [p.get("part") for p in doc.get("parts") or [] if isinstance(p, dict) and p.get("failed")]
        if failed:
            out.append(Attention("failed-run", f"{group}: run {doc.get('dag_run_id') or key}: part(s) "
                                 f"{', '.join(map(str, failed))} failed or wrote no report",
                                 report_href(prefix, group, key)))
    for r in ov.last_runs:
        if r.failures:
            out.append(Attention("failed-run", f"{r.job}: run {r.run_id} failed ({units.count(r.failures)} "
                                 f"failure(s))", report_href(prefix, r.group, r.run_key, r.part or None) if getattr(r, "group", "") else None))
    for n in ov.namespaces:
        ns_href = namespace_href(prefix, n.namespace)
        dead = getattr(n, "deletion_dead_letter", 0)
        if dead:
            out.append(Attention("dead-letters", f"{n.namespace}: {units.count(dead)} dead-lettered deletion(s)",
                                 ns_href))
        lag = getattr(n, "offload_lag_ms", None)
        if lag is not None and lag > lag_alert_ms:
            out.append(Attention("offload-lag", f"{n.namespace}: offload lag {units.duration(lag)} (over "
                                 f"{units.duration(lag_alert_ms)})", ns_href))
        damaged = _damaged_count(n)
        if damaged:
            out.append(Attention("damaged", f"{n.namespace}: {units.count(damaged)} damaged message(s) found by "
                                 f"the latest scrub", ns_href))
        bad = len(getattr(n, "unreadable_topics", []) or [])
        if bad:
            out.append(Attention("unreadable", f"{n.namespace}: {bad} topic record(s) cannot be read", ns_href))
    return out


def _damaged_count(n: Any) -> int:
    messages = getattr(n, "messages", None)
    if isinstance(messages, dict):
        return int(messages.get("messages_damaged", 0) or 0)
    damaged = getattr(n, "damaged", None)  # an attached cluster's namespace
    return int(damaged.get("count", 0) or 0) if isinstance(damaged, dict) else 0


def namespace_href(prefix: str, namespace: str) -> str:
    tenant, _, ns = namespace.partition("/")
    return f"{prefix}/namespaces/{quote(tenant, safe='')}/{quote(ns, safe='')}/" if ns else f"{prefix}/overview"


def topic_href(prefix: str, topic: str) -> str:
    """``persistent://t/n/local`` -> ``<prefix>/topics/persistent/t/n/local/``."""
    domain, _, rest = topic.partition("://")
    return f"{prefix}/topics/{quote(domain, safe='')}/" + "/".join(quote(p, safe="") for p in rest.split("/")) + "/"
