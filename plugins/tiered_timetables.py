"""The clock of the scheduled tiered-storage DAGs: a cron trigger that catches up missed slots, oldest
first, but only those of the last ``window`` (the DAGs' catch-up window, docs/deploy.md "Catch-up and
backfills").

Airflow's own ``catchup=True`` replays every slot since the DAG's start date: a first deployment, or a
DAG unpaused after months, would queue thousands of sweeps. ``catchup=False`` runs only the newest slot,
which then does every missed slot's work at once (the jobs' only clock is the run's logical time). This
timetable keeps Airflow's catch-up (one run per missed slot, in order, each with its own --as-of) and
bounds it: after an outage the scheduler runs the missed slots newer than ``now - window`` one after the
other (the DAGs run one at a time), and always at least the newest slot; older gaps are a backfill's job.

A core timetable registered by this plugin (``TieredTimetablesPlugin``), so the DAG processor can store
it and the scheduler read it back."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pendulum
from airflow.plugins_manager import AirflowPlugin
from airflow.timetables.base import DagRunInfo, DataInterval, TimeRestriction
from airflow.timetables.trigger import CronTriggerTimetable


def utcnow() -> pendulum.DateTime:
    """Now, in UTC (the tests set the clock through this name)."""
    return pendulum.now("UTC")


class CatchUpCronTimetable(CronTriggerTimetable):
    """A cron trigger (UTC by default; data interval = the slot time) whose catch-up reaches back at most
    ``window`` before now. ``window == 0`` is Airflow's ``catchup=False``: the newest slot only."""

    def __init__(self, cron: str, *, timezone: Any = "UTC", window: dt.timedelta = dt.timedelta(hours=6)) -> None:
        super().__init__(cron, timezone=pendulum.timezone(timezone) if isinstance(timezone, str) else timezone)
        if window < dt.timedelta(0):
            raise ValueError(f"catch-up window must not be negative: {window}")
        self.window = window
        hours = window.total_seconds() / 3600
        # the UI's schedule tooltip: cron_descriptor's words plus how far back a restart catches up
        self.description = (f"{self.description}; catches up missed slots of the last {hours:g} h, oldest first"
                            if hours else f"{self.description}; no catch-up (the newest slot only)")

    @property
    def expression(self) -> str:
        return self._expression

    def next_dagrun_info(self, *, last_automated_data_interval: DataInterval | None,
                         restriction: TimeRestriction) -> DagRunInfo | None:
        info = super().next_dagrun_info(last_automated_data_interval=last_automated_data_interval,
                                        restriction=restriction)
        # Airflow asks this for the scheduler's next run (restriction: the DAG's start date, no end date:
        # tiered_dag sets none) and to list the slots between two dates (a backfill, its dry run in the
        # UI: ``latest`` given); only the scheduler's catch-up is bounded, a backfill gets every slot
        if info is None or not restriction.catchup or restriction.latest is not None:
            return info
        now = utcnow()
        # the oldest slot still caught up: the first one inside the window, or the newest past slot
        floor = min(self._align_to_next(now - self.window), self._align_to_prev(now))
        if info.run_after >= floor:
            return info
        return DagRunInfo.interval(floor - self._interval, floor)

    def serialize(self) -> dict[str, Any]:
        return {**super().serialize(), "catchup_window_s": self.window.total_seconds()}

    @classmethod
    def deserialize(cls, data: dict[str, Any]) -> CatchUpCronTimetable:
        return cls(data["expression"], timezone=data["timezone"],
                   window=dt.timedelta(seconds=float(data["catchup_window_s"])))

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, CatchUpCronTimetable) and self._expression == other._expression
                and self._timezone == other._timezone and self.window == other.window)

    def __hash__(self) -> int:
        return hash((self._expression, str(self._timezone), self.window))


class TieredTimetablesPlugin(AirflowPlugin):
    name = "tiered_timetables"
    timetables = [CatchUpCronTimetable]
