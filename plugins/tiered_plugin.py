"""Airflow plugin of the tiered-storage project: the macros (``{{ macros.tiered.<name>(...) }}``), the
"Run report" operator extra link of the project's Spark tasks, and the web pages (``tiered_web.py``): a
FastAPI app under ``/tiered`` serving run reports and the "Tiered storage" view, shown inside the UI by
Airflow 3's external views: the view in the navigation (Browse), a "Tiered report" tab on every DAG run
(its run.json) and task instance (its part's latest try). The code lives in ``tiered_airflow.py`` and
``tiered_web.py`` (imported, not executed as plugin files, so the DAGs and the plugin share one operator
class)."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin
from tiered_airflow import (
    PLUGIN_NAME,
    WEB_PREFIX,
    TieredReportLink,
    tiered_report_path,
    tiered_report_url,
    tiered_reports_dir,
    tiered_run_id,
)

# the external views' routes (tiered_pages.py: the pages link to them; no FastAPI imported here)
NAV_ROUTE, RUN_TAB_ROUTE, TASK_TAB_ROUTE = "tiered-storage", "tiered-run-report", "tiered-task-report"


class _WebApps:
    """``fastapi_apps``, built on first use: only the API server asks for them, so the other processes
    that load the plugin (task runs, the scheduler) do not import FastAPI for it."""

    apps: list[dict] | None = None

    def __get__(self, obj: object, owner: type) -> list[dict]:
        if _WebApps.apps is None:
            from tiered_web import create_app

            _WebApps.apps = [{"app": create_app(), "url_prefix": WEB_PREFIX, "name": "Tiered storage"}]
        return _WebApps.apps


class TieredPlugin(AirflowPlugin):
    name = PLUGIN_NAME
    macros = [tiered_run_id, tiered_report_path, tiered_report_url, tiered_reports_dir]
    operator_extra_links = [TieredReportLink()]
    fastapi_apps = _WebApps()
    # Shown inside the UI (same site: the UI's session authenticates the frames); hrefs are relative to
    # the UI's base URL (its <base href>), so a deployment under a path prefix works too. The UI fills in
    # {DAG_ID}, {RUN_ID}, {TASK_ID}, {MAP_INDEX} (left as is on an unmapped task's page) for the tabs.
    external_views = [
        {"name": "Tiered storage", "href": f"{WEB_PREFIX.lstrip('/')}/overview", "url_route": NAV_ROUTE,
         "destination": "nav", "category": "browse"},
        {"name": "Tiered report", "href": f"{WEB_PREFIX.lstrip('/')}/ui/run/{{DAG_ID}}/{{RUN_ID}}",
         "url_route": RUN_TAB_ROUTE, "destination": "dag_run"},
        {"name": "Tiered report", "href": f"{WEB_PREFIX.lstrip('/')}/ui/task/{{DAG_ID}}/{{RUN_ID}}/{{TASK_ID}}/{{MAP_INDEX}}",
         "url_route": TASK_TAB_ROUTE, "destination": "task_instance"},
    ]
