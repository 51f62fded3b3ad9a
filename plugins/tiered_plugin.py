"""Airflow plugin of the tiered-storage project: the macros (``{{ macros.tiered.<name>(...) }}``), the
"Run report" operator extra link of the project's Spark tasks, and the web pages (``tiered_web.py``): a
FastAPI app under ``/tiered`` serving run reports and the "Tiered storage" view, which an external view
puts in the UI's navigation (shown inside the UI). The code lives in ``tiered_airflow.py`` and
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


def _web_app():
    """The FastAPI app, built only where plugins' apps are served (the API server)."""
    from tiered_web import create_app

    return create_app()


class TieredPlugin(AirflowPlugin):
    name = PLUGIN_NAME
    macros = [tiered_run_id, tiered_report_path, tiered_report_url, tiered_reports_dir]
    operator_extra_links = [TieredReportLink()]
    fastapi_apps = [{"app": _web_app(), "url_prefix": WEB_PREFIX, "name": "Tiered storage"}]
    # a nav entry showing the overview inside the UI (same site: the UI's session authenticates it)
    external_views = [{"name": "Tiered storage", "href": f"{WEB_PREFIX}/overview", "url_route": "tiered-storage",
                       "destination": "nav", "category": "browse"}]
