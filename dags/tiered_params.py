"""The DAGs' params and what a run makes of them: the shared params (`config` from the admin's allow-list,
`dry_run`, `namespaces`), nullable single-line fields checked by the formats of tiered_airflow (words, not
regexes, when the trigger refuses a value), the run's clock, and the Spark jobs' argument lists (``--namespace``,
``--as-of``, ``--run-id``, ``--dry-run``). Names are parsed again by tieredcore.names when a task runs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from airflow.sdk import Param
from tiered_airflow import NAMESPACE_FORMAT, allowed_configs, tiered_run_id


def config_param() -> Param | None:
    """The run's configuration, chosen from the admin's allow-list (``TIERED_CONFIG_ALLOWED`` when the DAG
    is parsed: a drop-down, never free text); empty: the deployment's (``TIERED_CONFIG`` of the workers).
    None without an allow-list: every run uses the deployment's. The task checks the value again
    (tiered_airflow.run_config_path) before it reads anything."""
    allowed = allowed_configs()
    if not allowed:
        return None
    return Param(None, type=["null", "string"], enum=[None, *allowed], title="Configuration",
                 values_display={"None": "the deployment's configuration"},
                 description="Empty: the deployment's configuration ($TIERED_CONFIG of the workers); or one "
                             "of the files an admin allowed (TIERED_CONFIG_ALLOWED).")


def dry_run_param() -> Param:
    return Param(False, type="boolean", title="Dry run", description="Plan and report; change nothing.")


def optional_param(fmt: str, title: str, description: str) -> Param:
    """A single-line text field that may stay empty (empty: the documented default), checked against one
    of tiered_airflow's formats when given: the trigger refuses a bad value before a run exists."""
    return Param(None, type=["null", "string"], format=fmt, title=title, description=description)


def namespaces_param(description: str = "tenant/namespace list; empty: every namespace.") -> Param:
    return Param([], type=["null", "array"], items={"type": "string", "format": NAMESPACE_FORMAT}, title="Namespaces",
                 description=description)


def namespace_args(params: dict[str, Any]) -> list[str]:
    """``--namespace`` arguments of the ``namespaces`` param, each name validated (before Spark starts)."""
    from airflow.sdk.exceptions import AirflowFailException

    from tieredcore.errors import ValidationError
    from tieredcore.names import NamespaceName

    out: list[str] = []
    try:
        for ns in params.get("namespaces") or []:
            out += ["--namespace", NamespaceName.parse(ns).name]
    except ValidationError as e:
        raise AirflowFailException(f"namespaces param: {e}") from None
    return out


def planned_namespaces(params: dict[str, Any], config: Any, enabled: Callable[[Any], list[str]],
                       what: str, kind: str | None = None) -> list[str]:
    """The ``namespaces`` param, or the namespaces ``enabled(policies)`` lists (a PolicyStore query, e.g.
    ``PolicyStore.namespaces_with_offload``), read from the metadata store now (at run time, never at
    parse time). None, with tieredcore's one line saying why, when the workspace is attached to a Pulsar
    cluster whose brokers do the job of ``kind`` (tieredcore.lifecycle.work.brokers_job)."""
    from airflow.sdk.exceptions import AirflowFailException

    from tieredcore.errors import TieredError
    from tieredcore.lifecycle.work import BROKERS_JOBS, brokers_job
    from tieredcore.names import NamespaceName
    from tieredcore.workspace import Workspace

    try:
        named = sorted({NamespaceName.parse(n).name for n in params.get("namespaces") or []})
        if kind in BROKERS_JOBS and config.attached:
            with Workspace(config) as ws:
                brokers_job(ws.policies.brokers, kind, named)  # the one line, logged in the task's log
            return []
        if named:
            return named
        with Workspace(config) as ws:
            return enabled(ws.policies)
    except TieredError as e:
        raise AirflowFailException(f"planning the {what}: {e}") from None


def as_of(context: dict[str, Any], field: str = "data_interval_end") -> str:
    """The run's logical time for the job's --as-of (ISO 8601): the data interval end (scheduled runs)
    or the logical date; a run without one (manual trigger without a date) uses its run_after."""
    when = context.get(field) or context["dag_run"].run_after
    return when.isoformat()


def as_of_ms(context: dict[str, Any], field: str = "data_interval_end") -> int:
    """:func:`as_of` in epoch milliseconds (the plan tasks' clock: the same one the job gets)."""
    from tieredcore.clock import parse_time_ms

    return parse_time_ms(as_of(context, field), "--as-of")


def shards_param() -> Param:
    """This run's number of Spark applications (shards); empty: the configuration's ``spark_shards``."""
    from tieredcore.config import MAX_SPARK_SHARDS

    return Param(None, type=["null", "integer"], minimum=1, maximum=MAX_SPARK_SHARDS, title="Spark applications",
                 description="At most this many spark-submits this run, the namespaces with work spread over them "
                             "by bytes; empty: the configuration's spark_shards (default 2, the spark pool's slots).")


def job_args(context: dict[str, Any], *, as_of_field: str = "data_interval_end", namespace: str | None = None,
             extra: Sequence[str] = (), namespaces: Sequence[str] = (), shard: int | None = None) -> list[str]:
    """A Spark job's arguments: ``--namespace`` (one, or the shard's ``namespaces``), ``--as-of``,
    ``--run-id`` (the run id; ``.<tenant>+<ns>`` for one namespace's job, ``.shard-<i>`` for shard i of
    several, so the shards' reports stay apart), ``--dry-run``, then ``extra``."""
    params = context["params"]
    names = [namespace] if namespace else list(namespaces)
    args = [a for ns in names for a in ("--namespace", ns)]
    rid = tiered_run_id(context["run_id"], namespace) + (f".shard-{shard}" if shard is not None else "")
    args += ["--as-of", as_of(context, as_of_field), "--run-id", rid]
    if params.get("dry_run"):
        args.append("--dry-run")
    return args + list(extra)


def run_ids(planned: Any) -> list[str]:
    """--run-id values of the planned job argument lists (one list, or a list of lists)."""
    if not planned:
        return []
    lists = planned if isinstance(planned[0], list) else [planned]
    out = []
    for args in lists:
        args = [str(a) for a in args]
        out.append(args[args.index("--run-id") + 1])
    return out
