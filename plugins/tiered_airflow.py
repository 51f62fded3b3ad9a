"""The tiered-storage project's Airflow pieces shared by the DAGs and the plugin.

- Macros (registered by ``tiered_plugin.py`` as ``{{ macros.tiered.tiered_run_id(run_id) }}``,
  ``tiered_report_path``, ``tiered_report_url``, ``tiered_reports_dir``): where a DAG run's reports are
  (tieredcore.reports: ``<reports_dir>/<dag id>/<run key>/<part>/attempt-<n>/``) and their pages, so
  templates, tasks and links agree.
- ``TieredSparkSubmitOperator``: the project's SparkSubmitOperator (built by ``dags/tiered_spark.py``).
  It adds the run-time environment (PATH with the venv's ``bin``, AWS credentials and endpoint from the
  Amazon provider's AWS connection, Azure and GCS credentials from the ``wasb_default`` and
  ``google_cloud_default`` connections) when it submits, so secrets are never in the DAG, in rendered
  template fields or in the logged spark-submit command line.
- ``TieredObjectStoreHook`` (from ``tiered_hooks.py``): the preflight check of the configured object
  store (a directory, or an S3 bucket through the Amazon provider's S3Hook).
- ``on_failure``: the DAGs' ``on_failure_callback`` (task and DAG-run level): one ERROR line naming what
  failed, then the callable named by ``TIERED_ON_FAILURE_CALLBACK`` (``package.module:function``), the
  hook point for alerting (a notifier, a pager).
- The run's configuration (:func:`run_config_path`): the deployment's (``TIERED_CONFIG`` in the workers'
  environment), or, when the DAGs' ``config`` param names one, a file of the admin's allow-list
  ``TIERED_CONFIG_ALLOWED``; anything else fails the task before a file is read.
- The trigger forms' value formats (:data:`PARAM_FORMATS`): jsonschema ``format`` checkers registered
  at import (the API server imports this module through the plugin, the workers through the DAGs), so a
  bad value is refused when the run is triggered, with a message in words instead of a regex.
- ``TieredReportLink``: the operator extra link "Run report" from each Spark task instance to the page
  of its try's report, served by the plugin's FastAPI app (``tiered_web.py``) on Airflow's own site:
  ``/tiered/reports/<dag_id>/<run key>/<task_id>[.<map_index>]/attempt-<try_number>/`` (the run's page:
  ``/tiered/reports/<dag_id>/<run key>/``; Airflow 3's UI shows only http(s), mailto and same-site links;
  ``[api] base_url`` or ``$TIERED_REPORTS_URL`` give another base).

Listed in ``plugins/.airflowignore`` (as is ``tiered_hooks.py``): the plugins manager executes every
plugin file under its own module object; this module must be imported normally (once), so the DAGs and
the plugin share one operator class. No I/O at import time.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import BaseOperatorLink
from tiered_hooks import GCP_CONN_ID, WASB_CONN_ID, cloud_environment
from tiered_hooks import TieredObjectStoreHook as TieredObjectStoreHook  # re-exported for the DAGs

from tieredcore.reports import (
    EXIT_DATA_LOSS,
    EXIT_UNREPAIRABLE,
    EXIT_USAGE,
    RunReports,
    attempt_dir_name,
    part_name,
    report_name,
)

PLUGIN_NAME = "tiered"
ENV_REPORTS_URL = "TIERED_REPORTS_URL"
WEB_PREFIX = "/tiered"  # where the plugin's FastAPI app (tiered_web.py) is mounted
REPORTS_PATH = f"{WEB_PREFIX}/reports"
ENV_ON_FAILURE = "TIERED_ON_FAILURE_CALLBACK"
log = logging.getLogger(__name__)


# -- the run's configuration ------------------------------------------------------------------------

ENV_CONFIG = "TIERED_CONFIG"  # the deployment's configuration file (the workers' environment)
ENV_CONFIG_ALLOWED = "TIERED_CONFIG_ALLOWED"  # further files a run may choose, os.pathsep-separated


class ConfigNotAllowed(ValueError):
    """A run asked for a configuration file the deployment does not allow (nothing was read)."""


def allowed_configs(env: Mapping[str, str] | None = None) -> list[str]:
    """The files an admin allows a run to choose (``TIERED_CONFIG_ALLOWED``, separated like PATH)."""
    raw = (os.environ if env is None else env).get(ENV_CONFIG_ALLOWED, "")
    return [p.strip() for p in raw.split(os.pathsep) if p.strip()]


def run_config_path(params: Mapping[str, Any], env: Mapping[str, str] | None = None) -> str | None:
    """The configuration file of a run: the deployment's (``$TIERED_CONFIG``; None: tieredcore's own
    default) unless its ``config`` param names the deployment's or one of :func:`allowed_configs`,
    compared as given (no path resolution: ``/allowed/../other`` is another file). Any other value
    raises ConfigNotAllowed, before anything is read."""
    env = os.environ if env is None else env
    deployment = env.get(ENV_CONFIG) or None
    requested = params.get("config")
    if requested is None or (isinstance(requested, str) and not requested.strip()):
        return deployment
    allowed = allowed_configs(env)
    if isinstance(requested, str) and (requested == deployment or requested in allowed):
        return requested
    choices = ", ".join(allowed) if allowed else f"none ({ENV_CONFIG_ALLOWED} is not set)"
    raise ConfigNotAllowed(f"config param {requested!r}: not a configuration this deployment allows; leave it "
                           f"empty for the deployment's (${ENV_CONFIG}) or choose one of the files an admin "
                           f"allowed in ${ENV_CONFIG_ALLOWED}: {choices}")


# -- the trigger forms' value formats ---------------------------------------------------------------
# Airflow validates a trigger's params with jsonschema before it creates the run; a failed "pattern"
# shows the raw regex, a failed "format" its name: so each format's name is its description in words.

SIZE_FORMAT = "size: bytes, or a number with K, M or G (e.g. 0, 1048576, 64M, 1G)"
DURATION_FORMAT = "duration: milliseconds, or a number with ms, s, m, h or d (e.g. 90m, 1h, 3600s)"
NAMESPACE_FORMAT = "namespace name: tenant/namespace (e.g. public/default)"
TOPIC_FORMAT = "topic name: tenant/namespace/topic or persistent://tenant/namespace/topic"
POSITION_OR_SIZE_FORMAT = ("position LEDGER:ENTRY (e.g. 12:0) for mode up_to, or a size (bytes, or a number "
                           "with K, M or G, e.g. 64M) for mode keep_bytes")
KEY_ID_FORMAT = "key id: 1-64 characters of A-Z a-z 0-9 _ . - (e.g. kek-2026)"
_KEY_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def _size(text: str) -> bool:
    from tieredcore.units import parse_keep_bytes

    parse_keep_bytes(text.strip())
    return True


def _duration(text: str) -> bool:
    from tieredcore.units import non_negative_duration_ms

    non_negative_duration_ms(text.strip(), "duration")
    return True


def _position_or_size(text: str) -> bool:
    from tieredcore.errors import ValidationError
    from tieredcore.model import Position

    try:
        Position.parse(text.strip(), require_entry=True)  # as `validate` parses it (ManualOffload.parse)
    except ValidationError:
        return _size(text)
    return True


def _namespace(text: str) -> bool:
    from tieredcore.names import NamespaceName

    NamespaceName.parse(text)  # as the tasks parse it: exact
    return True


def _topic(text: str) -> bool:
    from tieredcore.names import TopicName

    TopicName.parse(text)  # as the tasks parse it: exact
    return True


PARAM_FORMATS: dict[str, Callable[[str], bool]] = {
    SIZE_FORMAT: _size,
    DURATION_FORMAT: _duration,
    NAMESPACE_FORMAT: _namespace,
    TOPIC_FORMAT: _topic,
    POSITION_OR_SIZE_FORMAT: _position_or_size,
    KEY_ID_FORMAT: lambda t: bool(_KEY_ID.match(t)) and t not in (".", ".."),
}


def check_param_format(fmt: str, value: Any) -> bool:
    """Does ``value`` have format ``fmt``? Only non-empty strings are checked (null, "" and other types
    pass: an optional field left empty means its default; the schema's ``type`` and ``minLength`` say
    what a required field needs)."""
    if not isinstance(value, str) or value == "":
        return True
    from tieredcore.errors import ValidationError

    try:
        return PARAM_FORMATS[fmt](value)
    except ValidationError:
        return False


def register_param_formats() -> None:
    """Registers :data:`PARAM_FORMATS` with jsonschema's FormatChecker (the checker Airflow's params
    validate with, on the API server and in tasks). Idempotent."""
    from jsonschema import FormatChecker

    for fmt in PARAM_FORMATS:
        FormatChecker.checkers[fmt] = (functools.partial(check_param_format, fmt), ())


register_param_formats()


# -- macros ---------------------------------------------------------------------------------------


def tiered_run_id(run_id: str, namespace: str | None = None) -> str:
    """The run key of an Airflow run id (tieredcore.reports.report_name): the name of the DAG run's
    reports directory, ``manual__2026-01-01T00:00:00+00:00`` -> ``manual__2026-01-01T00=3A00=3A00+00=3A00``.
    ``namespace`` is accepted for callers of the layout before DAG runs had their own reports: a DAG run
    has one key, its parts (task instances) tell its jobs apart."""
    del namespace
    return report_name(run_id)


def tiered_reports_dir(config: str | None = None) -> str:
    """The configuration's reports location (``config``: a tiered.toml path; default $TIERED_CONFIG)."""
    from tieredcore.config import Config

    return Config.load(config or None).reports_dir


def tiered_report_path(dag_id: str, run_id: str, part: str | None = None, attempt: int | None = None,
                       reports_dir: str | None = None, config: str | None = None) -> str:
    """Where a DAG run's reports are: its ``run.json`` (``part`` None), a part's ``summary.json`` (its
    latest try's) or one try's. ``run_id``: the Airflow run id, unaltered."""
    reports = RunReports(reports_dir or tiered_reports_dir(config))
    if part is None:
        return str(reports.run_json_path(dag_id, report_name(run_id)))
    return str(reports.summary_path(dag_id, report_name(run_id), part, None if attempt is None else int(attempt)))


def reports_base_url() -> str:
    """Where the report pages are: ``$TIERED_REPORTS_URL``, else ``[api] base_url`` + ``/tiered/reports``,
    else the same-site path ``/tiered/reports`` (the UI renders it; the browser resolves it on Airflow's
    own origin)."""
    base = os.environ.get(ENV_REPORTS_URL, "").rstrip("/")
    if base:
        return base
    from airflow.configuration import conf

    api = (conf.get("api", "base_url", fallback="") or "").rstrip("/")
    if api and "://" not in api:
        api = ""  # a relative base_url is not a site: keep the same-site path
    return f"{api}{REPORTS_PATH}"


def tiered_report_url(dag_id: str, run_id: str, part: str | None = None, attempt: int | None = None) -> str:
    """The report page of a DAG run (``part`` None), of a part (its latest try) or of one of its tries
    (``attempt``: the try number); ``run_id`` unaltered. The pages' paths follow the reports' layout
    (tieredcore.reports.RunReports; the pages are tiered_web.py's)."""
    url = f"{reports_base_url()}/{quote(dag_id, safe='')}/{quote(report_name(run_id), safe='')}/"
    if part is not None:
        url += f"{quote(part, safe='')}/"
        if attempt is not None:
            url += f"{attempt_dir_name(int(attempt))}/"
    return url


# -- alerting ---------------------------------------------------------------------------------------


def failure_hook(spec: str | None = None) -> Callable[[Any], Any] | None:
    """The callable ``TIERED_ON_FAILURE_CALLBACK`` names (``package.module:function`` or
    ``package.module.function``; unset or empty: None). ValueError names the setting when it is not an
    importable callable."""
    spec = (os.environ.get(ENV_ON_FAILURE, "") if spec is None else spec).strip()
    if not spec:
        return None
    module, _, name = spec.partition(":") if ":" in spec else spec.rpartition(".")
    try:
        fn = getattr(importlib.import_module(module), name) if module and name else None
    except ImportError as e:
        raise ValueError(f"{ENV_ON_FAILURE}={spec!r}: cannot import {module!r}: {e}") from None
    except AttributeError:
        fn = None
    if not callable(fn):
        raise ValueError(f"{ENV_ON_FAILURE}={spec!r}: not a callable (expected package.module:function)")
    return fn


def on_failure(context: Any) -> None:
    """``on_failure_callback`` of every task and DAG run: logs what failed as one ERROR line, then calls
    the ``TIERED_ON_FAILURE_CALLBACK`` callable with the same context. A failing hook is logged, never
    raised (the run's own failure is what matters)."""
    ti = context.get("ti") or context.get("task_instance")
    dag_run = context.get("dag_run")
    what = (f"task {ti.dag_id}.{ti.task_id}" + (f"[{ti.map_index}]" if getattr(ti, "map_index", -1) >= 0 else "")
            if ti is not None else f"DAG run {getattr(dag_run, 'dag_id', '?')}")
    reason = context.get("exception") or context.get("reason") or "failed"
    log.error("tiered failure: %s, run %s: %s", what, getattr(dag_run, "run_id", context.get("run_id")), reason)
    try:
        hook = failure_hook()
        if hook is not None:
            hook(context)
    except Exception as e:  # an alerting problem must not hide the failure itself
        log.error("tiered failure hook %s: %s: %s", os.environ.get(ENV_ON_FAILURE), type(e).__name__, e)


# -- the operator and its link ----------------------------------------------------------------------


class TieredReportLink(BaseOperatorLink):
    """"Run report": the page of the report this try of this task instance wrote: its DAG run's part
    ``<task_id>[.<map_index>]``, ``attempt-<try_number>`` (the operator gives the job its place in the
    run as TIERED_DAG_ID, TIERED_DAG_RUN_ID, TIERED_TASK_ID, TIERED_MAP_INDEX, TIERED_ATTEMPT). Airflow 3
    computes the link when the task finishes, on the worker."""

    name = "Run report"

    def get_link(self, operator, *, ti_key) -> str:
        if not getattr(operator, "job", None):
            return ""
        part = part_name(ti_key.task_id, getattr(ti_key, "map_index", -1))
        return tiered_report_url(ti_key.dag_id, ti_key.run_id, part, getattr(ti_key, "try_number", None) or None)


def aws_environment(aws_conn_id: str | None) -> dict[str, str]:
    """Environment for boto3 in a Spark job from the Amazon provider's AWS connection: credentials
    (masked in task logs by the provider), region, and the connection's ``endpoint_url`` extra as
    ``AWS_ENDPOINT_URL_S3`` (MinIO, Ceph, moto). No connection -> {} (boto3's default chain: instance
    roles, the worker's environment)."""
    if not aws_conn_id:
        return {}
    from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        BaseHook.get_connection(aws_conn_id)
    except AirflowNotFoundException:
        return {}
    from airflow.sdk.log import mask_secret

    hook = AwsBaseHook(aws_conn_id=aws_conn_id, client_type="s3")
    env: dict[str, str] = {}
    creds = hook.get_session().get_credentials()
    if creds is not None:
        frozen = creds.get_frozen_credentials()
        for secret in (frozen.secret_key, frozen.token):
            if secret:
                mask_secret(secret)  # any log line that would show it shows *** instead
        env["AWS_ACCESS_KEY_ID"] = frozen.access_key
        env["AWS_SECRET_ACCESS_KEY"] = frozen.secret_key
        if frozen.token:
            env["AWS_SESSION_TOKEN"] = frozen.token
    region = hook.conn_config.region_name
    if region:
        env["AWS_DEFAULT_REGION"] = env["AWS_REGION"] = region
    endpoint = hook.conn_config.get_service_endpoint_url("s3")
    if endpoint:
        env["AWS_ENDPOINT_URL_S3"] = endpoint
    return env


# exit codes of spark_jobs/_jobkit.py after which a retry cannot succeed
NO_RETRY_EXIT_CODES = {
    EXIT_USAGE: "bad input: nothing was started", EXIT_DATA_LOSS: "DATA LOSS reported by the job",
    EXIT_UNREPAIRABLE: "DAMAGED offloaded copies on the attached Pulsar cluster, repair impossible without "
                       "BookKeeper: the job reported them (namespace, topic, position) and changed nothing; an "
                       "operator must act (docs/pulsar.md, Scrub)",
}


_EXIT_CODE = re.compile(r"Error code is: (-?\d+)")


def submit_exit_code(error: BaseException) -> int | None:
    """spark-submit's exit code from the Spark hook's failure (its message: "... Error code is: N")."""
    m = _EXIT_CODE.search(str(error))
    return int(m.group(1)) if m else None


class TieredSparkSubmitOperator(SparkSubmitOperator):
    """SparkSubmitOperator running one of the project's ``spark_jobs/<job>.py``.

    When it executes (never at parse time) it adds to the subprocess environment (:meth:`runtime_env`):
    the worker's venv ``bin`` on PATH (spark-submit must be found), ``SPARK_LOCAL_IP=127.0.0.1`` for
    ``local`` masters, the AWS connection's credentials/endpoint, and the Azure (``wasb_conn_id``) and
    Google Cloud (``gcp_conn_id``) connections as tieredcore's azure:// / gs:// environment
    (tiered_hooks.azure_environment / gcs_environment). Those go in the environment of
    spark-submit, not in the command line the hook logs, and not in the declared ``env_vars`` (so not in
    rendered template fields either)."""

    operator_extra_links = (TieredReportLink(),)

    def __init__(self, *, job: str, aws_conn_id: str | None = "aws_default", wasb_conn_id: str | None = WASB_CONN_ID,
                 gcp_conn_id: str | None = GCP_CONN_ID, conn_id: str = "spark_default", **kwargs: Any) -> None:
        super().__init__(conn_id=conn_id, **kwargs)
        self.job = job
        self.aws_conn_id = aws_conn_id
        self.wasb_conn_id = wasb_conn_id
        self.gcp_conn_id = gcp_conn_id
        self.spark_conn_id = conn_id  # the provider keeps its own copy private

    def _spark_master(self) -> str:
        from airflow.sdk import BaseHook
        from airflow.sdk.exceptions import AirflowNotFoundException

        try:
            conn = BaseHook.get_connection(self.spark_conn_id)
        except AirflowNotFoundException:
            return ""
        return conn.host or ""

    def runtime_env(self) -> dict[str, str]:
        """Environment added to ``env_vars`` when the job is submitted (contains secrets: never log it)."""
        env: dict[str, str] = {}
        venv_bin = str(Path(sys.executable).parent)
        path = os.environ.get("PATH", "")
        env["PATH"] = path if venv_bin in path.split(os.pathsep) else os.pathsep.join(p for p in (venv_bin, path) if p)
        env["PYSPARK_PYTHON"] = os.environ.get("PYSPARK_PYTHON") or sys.executable
        if self._spark_master().startswith("local"):
            env["SPARK_LOCAL_IP"] = "127.0.0.1"
        env.update(aws_environment(self.aws_conn_id))
        env.update(cloud_environment(self.wasb_conn_id, self.gcp_conn_id))
        return env

    def _get_hook(self):
        """The provider's SparkSubmitHook, its log wrapped so the job's lines keep their level."""
        hook = super()._get_hook()
        hook._log = JobLineLevels(hook.log)
        return hook

    def execute(self, context: Any) -> None:
        """As SparkSubmitOperator, with the run-time environment added to ``env_vars`` while the job is
        submitted (the parent's execute builds its SparkSubmitHook from ``env_vars``; the declared value
        is restored afterwards, so rendered template fields never hold it): the run's configuration
        (``TIERED_CONFIG``, :func:`run_config_path`: a file outside the allow-list fails the task before
        anything starts), the connections' secrets. Empty ``application_args`` (the plan found nothing due)
        skip the task without submitting anything; a job that exits 2 (bad input) or 3 (data loss) fails
        the task without retries: running it again cannot help (spark_jobs/_jobkit.py, exit codes). The
        failure names the exit code only: the job's lines (each failure once) are in the log above it."""
        from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

        if not self.application_args:  # the plan task found nothing due
            raise AirflowSkipException(f"spark job {self.job}: nothing due, no spark-submit")
        try:
            config = run_config_path(context.get("params") or {})
        except ConfigNotAllowed as e:
            raise AirflowFailException(str(e)) from None
        declared = self.env_vars
        runtime = self.runtime_env()
        if config:
            runtime[ENV_CONFIG] = config
        self.log.info("spark job %s: run-time environment adds %s", self.job, ", ".join(sorted(runtime)))
        # declared env_vars (PYSPARK_PYTHON...) win over run-time defaults
        self.env_vars = {**runtime, **(declared or {})}
        try:
            super().execute(context)
        except AirflowException as e:
            code = submit_exit_code(e)
            what = f"spark job {self.job} failed (spark-submit exit {code}); its ERROR lines are above"
            if code in NO_RETRY_EXIT_CODES:
                raise AirflowFailException(f"{what}: {NO_RETRY_EXIT_CODES[code]}; not retried") from None
            raise AirflowException(what if code is not None else first_line(e)) from None
        finally:
            self.env_vars = declared


def first_line(error: BaseException) -> str:
    """The first line of an error's message (the Spark hook appends spark-submit's last output lines,
    already in the log)."""
    return str(error).split("\n", 1)[0]


# a line of spark-submit's output: the job's own (spark_jobs/_jobkit.py `say`: "ERROR <job>: ...") or
# Spark's log4j lines (spark_jobs/log4j2.properties: "26/01/01 12:00:00 WARN <logger>: ...")
_JOB_LINE = re.compile(r"^(ERROR|WARNING|INFO|DEBUG) [A-Za-z0-9_.+-]+: ")
_LOG4J_LINE = re.compile(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d (FATAL|ERROR|WARN|INFO|DEBUG|TRACE) ")
_LEVELS = {"FATAL": "error", "ERROR": "error", "WARN": "warning", "WARNING": "warning", "INFO": "info",
           "DEBUG": "debug", "TRACE": "debug"}


def line_level(line: str) -> str:
    """The logger method for one line of spark-submit's output: its own level when it states one (the
    job's lines, Spark's log4j lines), else info."""
    m = _JOB_LINE.match(line) or _LOG4J_LINE.match(line)
    return _LEVELS[m.group(1)] if m else "info"


class JobLineLevels:
    """The Spark hook's logger, but the lines of spark-submit's output at their own level: the provider
    logs each line with ``log.info(line)`` (SparkSubmitHook._process_spark_submit_log), so an ERROR
    line of the job would show at INFO and the UI's level filter would hide it. Everything else is the
    wrapped logger's."""

    def __init__(self, logger: Any) -> None:
        self._logger = logger

    def info(self, msg: Any, *args: Any, **kw: Any) -> Any:
        if isinstance(msg, str) and not args and not kw:
            return getattr(self._logger, line_level(msg))(msg)
        return self._logger.info(msg, *args, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._logger, name)
