"""The DAGs chained by what they changed: assets, their aliases, the schedules (a clock, or a clock and an
asset's events) and the ``announce`` task that emits the events.

The sweep emits one OFFLOADED event per namespace it offloaded something in (extra: namespace, ledgers,
bytes, segments, as_of); the deletion-lag cleanup runs on those events (or its clock), so hot copies go
soon after their lag instead of at the next hourly slot. Retention and reconciliation emit one
DELETIONS_PENDING event per namespace they appended deletion records for; the drain runs on those (or its
clock). Events are added through an alias outlet, so a run that changed nothing emits none."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from airflow.sdk import (
    Asset,
    AssetAlias,
    AssetOrTimeSchedule,
    TriggerRule,
    get_current_context,
    task,
)
from tiered_common import QUICK_TASK, cron_clock, schedule_text  # noqa: F401 - schedule_text: re-exported
from tiered_params import as_of

OFFLOADED = Asset(name="tiered_offloaded", uri="tiered://lifecycle/offloaded")
DELETIONS_PENDING = Asset(name="tiered_deletions_pending", uri="tiered://lifecycle/deletions-pending")
OFFLOAD_EVENTS = AssetAlias(name="tiered_offload_events")
DELETION_EVENTS = AssetAlias(name="tiered_deletion_events")


def schedule_from_env(var: str, default: str) -> str | None:
    """A cron expression or preset from the environment; "none" (or empty) disables scheduling."""
    value = os.environ.get(var, default).strip()
    return None if value.lower() in ("", "none", "null") else value


def asset_or_time(cron: str | None, asset: Asset) -> Any:
    """A run on each event of ``asset`` or on the ``cron`` clock (UTC, tiered_common.cron_clock: missed
    slots caught up), whichever comes first; None (no schedule at all) when the clock is disabled."""
    if cron is None:
        return None
    return AssetOrTimeSchedule(timetable=cron_clock(cron), assets=asset)


def triggering_namespaces(context: dict[str, Any], asset: Asset) -> list[str]:
    """The namespaces named by the asset events that triggered this run ([] for a run on the clock or by
    hand)."""
    events = context.get("triggering_asset_events") or {}
    try:
        found = events[asset]
    except KeyError:
        return []
    return sorted({str(e.extra["namespace"]) for e in found if isinstance(e.extra, dict) and e.extra.get("namespace")})


def offloaded_namespaces(totals: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Namespaces a sweep offloaded something in (ledgers, segments, replaced copies)."""
    out = {}
    for ns, d in totals.get("namespaces", {}).items():
        o = d.get("outcomes") or {}
        if o.get("offloaded") or o.get("replaced"):
            out[ns] = {"ledgers": int(d.get("ledgers", 0)), "bytes": int(d.get("bytes", 0)),
                       "segments": int(d.get("segments", 0))}
    return out


@dataclass(frozen=True)
class Announcement:
    """What a DAG announces: one event on ``asset`` (through ``alias``) per namespace the run changed,
    from the summary's totals: ``changed(totals) -> {namespace: extra}``."""

    alias: AssetAlias
    asset: Asset
    changed: Callable[[dict[str, Any]], dict[str, dict[str, Any]]]


def announce_task(announcement: Announcement):
    """The ``announce`` task: the events of ``announcement``; nothing in a dry run."""
    alias, asset, changed = announcement.alias, announcement.asset, announcement.changed

    @task(task_id="announce", outlets=[alias], trigger_rule=TriggerRule.ALL_DONE, **QUICK_TASK)
    def announce() -> list[str]:
        """Emits one asset event per namespace this run changed (they trigger the DAGs downstream)."""
        ctx: Any = get_current_context()
        totals = ctx["ti"].xcom_pull(task_ids="summary") or {}
        if ctx["params"].get("dry_run") or not totals:
            print(f"announce: no {asset.name} event (dry run or no summary)")
            return []
        per_ns = changed(totals)
        for ns, extra in sorted(per_ns.items()):
            ctx["outlet_events"][alias].add(asset, extra={"namespace": ns, **extra, "as_of": as_of(ctx),
                                                          "run_id": ctx["run_id"]})
        print(f"announce: {asset.name} event(s) for {len(per_ns)} namespace(s): {', '.join(sorted(per_ns)) or '-'}")
        return sorted(per_ns)

    return announce()
