"""The plugin's web pages, served by Airflow's API server as a plugin FastAPI app under ``/tiered``
(``tiered_plugin.py``), behind Airflow's auth manager (the same session as the UI), shown inside the UI's
frame (the nav entry "Tiered storage", the "Tiered report" tabs of a DAG run and a task instance):

- ``/tiered/overview``: the "Tiered storage" view: needs-attention strip, namespaces (paged), bytes per tier
  over recent runs (uPlot, vendored under ``plugins/static/``), the last run of each job; an attached
  Pulsar cluster's own view. ``?at=`` (ISO 8601 or epoch ms) computes the ages at another time;
  ``?lag_alert=`` (ms) the offload lag the strip flags; ``overview.json``: the data.
- ``/tiered/namespaces/<tenant>/<ns>/`` → ``/tiered/topics/<domain>/<tenant>/<ns>/<topic>/``: drill-down to
  a topic's ledgers with their positions (what ``offload --up-to`` takes).
- ``/tiered/reports/``: groups (DAG ids, jobs) → runs (paged) → a run's report (run.json) → a part's try
  (summary.json and detail.parquet); ``/tiered/ui/run/...`` and ``/tiered/ui/task/...``: where the UI's tabs
  land (the report of that DAG run / task instance).

Routes only: the pages are ``tiered_views.py`` and ``tiered_report_pages.py`` over ``plugins/templates/``
(``tiered_pages.py``: the Jinja2 environment, pagination, links); the numbers are tieredcore's. Listed in
``.airflowignore``: imported by the plugin, not executed as a plugin file.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

import tiered_report_pages as report_pages
import tiered_views as views
from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from tiered_pages import LAG_ALERT_MS, STATIC, Pager, render, report_href

from tieredcore.clock import now_ms, parse_time_ms
from tieredcore.config import Config
from tieredcore.errors import FormatError, NotFoundError, TieredError, UnreadableRecordError, ValidationError
from tieredcore.lifecycle.attached_view import AttachedOverview, overview_of
from tieredcore.lifecycle.overview import Overview, Prices, namespace_topics, topic_ledgers
from tieredcore.reports import ATTEMPT_PREFIX, RunReports, part_name, report_name
from tieredcore.workspace import Workspace

URL_PREFIX = "/tiered"
_NAME = re.compile(r"^[A-Za-z0-9_.=+~-]+$")  # groups, run keys, parts (tieredcore.reports.report_name)
_MAP_INDEX = re.compile(r"^-?[0-9]{1,9}$")


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
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

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
                      at: str | None = Query(None, description="ISO 8601 or epoch ms (default: now)"),
                      ns_page: int | None = Query(None, ge=1), runs_page: int | None = Query(None, ge=1),
                      lag_alert: int = Query(LAG_ALERT_MS, ge=0, description="offload lag flagged (ms)")):
        ov, c = overview(at)
        return views.overview_page(ov, c, mounted_at(request), dict(request.query_params), ns_page, runs_page,
                                   lag_alert)

    @app.get("/overview.json")
    def overview_json(at: str | None = Query(None)) -> JSONResponse:
        ov, _ = overview(at)
        return JSONResponse(json.loads(json.dumps(ov.as_dict(), default=str)))

    @app.get("/namespaces/{tenant}/{ns}/", response_class=HTMLResponse)
    def namespace(request: Request, tenant: str, ns: str, page: int | None = Query(None, ge=1)) -> HTMLResponse:
        name = f"{tenant}/{ns}"
        with Workspace(config()) as ws:
            try:
                first = namespace_topics(ws, name, 0, 1)
                pager = Pager.of(first.total, page)
                found = namespace_topics(ws, name, pager.offset, pager.size)
            except (NotFoundError, ValidationError):
                raise HTTPException(status_code=404, detail=f"no namespace {name}") from None
            except TieredError as e:
                raise HTTPException(status_code=500, detail=f"reading the tiered metadata: {e}") from None
        return views.namespace_page(name, found, pager, mounted_at(request), dict(request.query_params))

    @app.get("/topics/{domain}/{tenant}/{ns}/{local}/", response_class=HTMLResponse)
    def topic(request: Request, domain: str, tenant: str, ns: str, local: str,
              page: int | None = Query(None, ge=1)) -> HTMLResponse:
        name = f"{domain}://{tenant}/{ns}/{local}"
        with Workspace(config()) as ws:
            try:
                total = topic_ledgers(ws, name, 0, 1).total
                pager = Pager.of(total, page)
                found = topic_ledgers(ws, name, pager.offset, pager.size)
            except (NotFoundError, ValidationError, ValueError):
                raise HTTPException(status_code=404, detail=f"no topic {name}") from None
            except (UnreadableRecordError, FormatError) as e:
                raise HTTPException(status_code=500, detail=f"the record of {name} cannot be read: {e}") from None
        return views.topic_page(name, f"{tenant}/{ns}", found, pager, mounted_at(request), dict(request.query_params))

    # -- run reports

    @app.get("/reports/", response_class=HTMLResponse)
    def groups(request: Request, page: int | None = Query(None, ge=1)) -> HTMLResponse:
        return report_pages.groups_page(run_reports(), mounted_at(request), page, dict(request.query_params))

    @app.get("/reports/{group}/", response_class=HTMLResponse)
    def runs(request: Request, group: str, page: int | None = Query(None, ge=1)) -> HTMLResponse:
        return report_pages.runs_page(run_reports(), _safe(group, "group"), mounted_at(request), page,
                                      dict(request.query_params))

    def parts_of(group: str, run: str) -> list[str]:
        try:
            return run_reports().parts(_safe(group, "group"), _safe(run, "run"))
        except NotFoundError:
            raise HTTPException(status_code=404, detail=f"no report of run {run} of {group}") from None

    def part_or_attempt(group: str, name: str) -> tuple[str, int | None]:
        """``<run>/<part>/`` or, for a run of one part named as its group, ``<run>/attempt-<n>/``."""
        if name.startswith(ATTEMPT_PREFIX):
            return group, _attempt(name)
        return _safe(name, "part"), None

    @app.get("/reports/{group}/{run}/", response_class=HTMLResponse)
    def run_page(request: Request, group: str, run: str, detail_page: int | None = Query(None, ge=1)) -> HTMLResponse:
        parts, prefix, query = parts_of(group, run), mounted_at(request), dict(request.query_params)
        if parts == [group]:  # a run outside Airflow: its one part is the run
            return report_pages.try_page(run_reports(), group, run, group, None, prefix, detail_page, query)
        return report_pages.run_page(run_reports(), group, run, prefix, query)

    @app.get("/reports/{group}/{run}/run.json")
    def run_json(group: str, run: str) -> JSONResponse:
        parts_of(group, run)
        try:
            return JSONResponse(run_reports().read_run(group, run))
        except FormatError as e:
            raise HTTPException(status_code=500, detail=str(e)) from None

    @app.get("/reports/{group}/{run}/summary.json")
    def run_summary_json(group: str, run: str) -> JSONResponse:
        parts = parts_of(group, run)
        if len(parts) == 1:
            return JSONResponse(_load(run_reports(), group, run, parts[0]))
        return run_json(group, run)

    @app.get("/reports/{group}/{run}/{name}/", response_class=HTMLResponse)
    def part_page(request: Request, group: str, run: str, name: str,
                  detail_page: int | None = Query(None, ge=1)) -> HTMLResponse:
        part, attempt = part_or_attempt(group, name)
        parts_of(group, run)
        return report_pages.try_page(run_reports(), group, run, part, attempt, mounted_at(request), detail_page,
                                     dict(request.query_params))

    @app.get("/reports/{group}/{run}/{name}/summary.json")
    def part_json(group: str, run: str, name: str) -> JSONResponse:
        return JSONResponse(_load(run_reports(), _safe(group, "group"), _safe(run, "run"), *part_or_attempt(group, name)))

    @app.get("/reports/{group}/{run}/{part}/{attempt}/", response_class=HTMLResponse)
    def attempt_page(request: Request, group: str, run: str, part: str, attempt: str,
                     detail_page: int | None = Query(None, ge=1)) -> HTMLResponse:
        parts_of(group, run)
        return report_pages.try_page(run_reports(), group, run, _safe(part, "part"), _attempt(attempt),
                                     mounted_at(request), detail_page, dict(request.query_params))

    @app.get("/reports/{group}/{run}/{part}/{attempt}/summary.json")
    def attempt_json(group: str, run: str, part: str, attempt: str) -> JSONResponse:
        return JSONResponse(_load(run_reports(), _safe(group, "group"), _safe(run, "run"), _safe(part, "part"),
                                  _attempt(attempt)))

    # -- where the UI's tabs land (tiered_plugin.py's external views fill in the DAG run and the task)

    @app.get("/ui/run/{dag_id}/{run_id}", response_class=HTMLResponse)
    def ui_run(request: Request, dag_id: str, run_id: str) -> HTMLResponse:
        return _landing(request, dag_id, run_id, None)

    @app.get("/ui/task/{dag_id}/{run_id}/{task_id}/{map_index}", response_class=HTMLResponse)
    def ui_task(request: Request, dag_id: str, run_id: str, task_id: str, map_index: str) -> HTMLResponse:
        # an unmapped task instance's page has no map index: the UI leaves its placeholder in the address
        index = int(map_index) if _MAP_INDEX.match(map_index) else -1
        return _landing(request, dag_id, run_id, part_name(task_id, index))

    def _landing(request: Request, dag_id: str, run_id: str, part: str | None):
        prefix, reports = mounted_at(request), run_reports()
        try:
            key = report_name(run_id)
            found = reports.has_run(dag_id, key) and (part is None or bool(reports.attempts(dag_id, key, part)))
        except TieredError:
            found = False
        if found:
            return RedirectResponse(report_href(prefix, dag_id, key, part), status_code=303)
        what = f"task {part}" if part else "this DAG run"
        return render("landing.html", status_code=404, title="No tiered report", prefix=prefix, what=what,
                      dag_id=dag_id, run_id=run_id, run_href=report_href(prefix, dag_id, report_name(run_id))
                      if part and reports.has_run(dag_id, report_name(run_id)) else None)

    return app


def mounted_at(request: Request) -> str:
    """Where the app is mounted, as links must start (the API server's mount point, ``/tiered``, behind
    whatever root path the server itself has)."""
    return str(request.scope.get("root_path", "")).rstrip("/")


def _safe(name: str, what: str) -> str:
    if not _NAME.match(name) or name in (".", ".."):
        raise HTTPException(status_code=404, detail=f"no such {what}")
    return name


def _load(reports: RunReports, group: str, run: str, part: str, attempt: int | None = None) -> dict:
    """A part's summary.json (its latest or an attempt's): 404 when it was never written, 500 when
    unreadable."""
    try:
        return reports.read_summary(_safe(group, "group"), _safe(run, "run"), _safe(part, "part"), attempt)
    except NotFoundError:
        raise HTTPException(status_code=404, detail=f"no report {run}/{part}" + (
            f"/{ATTEMPT_PREFIX}{attempt}" if attempt is not None else "")) from None
    except FormatError as e:
        raise HTTPException(status_code=500, detail=str(e)) from None


def _attempt(text: str) -> int:
    if not text.startswith(ATTEMPT_PREFIX) or not text[len(ATTEMPT_PREFIX):].isdigit():
        raise HTTPException(status_code=404, detail=f"no such attempt {text!r} (attempt-<n>)")
    return int(text[len(ATTEMPT_PREFIX):])
