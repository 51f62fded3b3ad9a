"""Airflow plugin of the tiered-storage project: the macros (``{{ macros.tiered.<name>(...) }}``) and the
"Run report" operator extra link of the project's Spark tasks. The code lives in ``tiered_airflow.py``
(imported, not executed as a plugin file, so the DAGs and the plugin share one operator class)."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin
from tiered_airflow import (
    PLUGIN_NAME,
    TieredReportLink,
    tiered_report_path,
    tiered_report_url,
    tiered_reports_dir,
    tiered_run_id,
)


class TieredPlugin(AirflowPlugin):
    name = PLUGIN_NAME
    macros = [tiered_run_id, tiered_report_path, tiered_report_url, tiered_reports_dir]
    operator_extra_links = [TieredReportLink()]
