"""Catch-up and backfills with a real scheduler (scheduler, DAG processor and the API server with the
LocalExecutor, on a temporary AIRFLOW_HOME and SQLite, set up by scripts/airflow-init.sh), over a
workspace with ledgers due in EVERY slot (README "Backfills", docs/deploy.md "Catch-up and backfills"):

- the UI's Backfill dialog with its default settings, sent as the UI sends it (PATCH the DAG unpaused,
  POST /api/v2/backfills with max_active_runs 1, reprocess "none", no conf), three slots;
- unpausing also makes the scheduler catch up the missed slots of the DAG's catch-up window
  (TIERED_CATCHUP_WINDOW: the last two hourly slots here), starting the first one in the same second;
- every run starts with the ``wait_turn`` gate: each run's report holds exactly its own slot's ledgers
  (closed after the slot before, up to its own --as-of), the scheduled runs only the remainder, and the
  runs did their work one after the other, oldest logical date first.

The fast tests check the catch-up clock (tiered_timetables.CatchUpCronTimetable) and that the DAG list's
descriptions name both halves of an asset-or-time schedule."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.conftest import free_port

from .conftest import DAGS, PLUGINS, REPO, set_policy, tiered

VENV_BIN = Path(sys.executable).parent
DAG_ID = "tiered_offload_sweep"
SCHEDULE = "0 * * * *"  # the sweep's clock for this test: hourly
CATCHUP_WINDOW = "2h"  # unpaused, the scheduler catches up the last two hourly slots
LEDGER_EVERY_S = 1800  # a ledger closes every 30 minutes: two per topic in every hourly slot
DEADLINE_S = 900
TIMEOUT_S = DEADLINE_S + 300  # the test's own pytest timeout: the deadline fires first, with the runs and logs
PASSWORD = "tiered-backfill-test"
MAX_RESTARTS = 3
RESTARTS: list[str] = []  # what the fixture's supervisor restarted (printed at the end of the test)


def _env(home: Path, cfg: Path, api_port: int, log_port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "TIERED_"))}
    pw = home / "passwords.json"
    pw.write_text(json.dumps({"admin": PASSWORD}))
    env.update({
        "PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
        "PYTHONPATH": str(REPO),
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(PLUGINS),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{api_port}/execution/",
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{api_port}",
        "AIRFLOW__API_AUTH__JWT_SECRET": "tiered-backfill-test-secret",
        "AIRFLOW__CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(pw),
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(log_port),
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "TIERED_CONFIG": str(cfg),  # the deployment's configuration: scheduled and backfill runs alike
        "TIERED_SWEEP_SCHEDULE": SCHEDULE,
        "TIERED_CATCHUP_WINDOW": CATCHUP_WINDOW,
        "TIERED_GATE_POKE": "10s",  # the gate looks again every 10 s (30 s in a deployment; at 5 s a loaded
        # machine made Airflow fail pokes whose end it saw after the next poke was queued)
        "TIERED_SPARK_POOL_SLOTS": "1",
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "TIERED_NO_PROGRESS": "1",
    })
    return env


def _airflow(env: dict[str, str], *args: str, timeout: float = 120) -> str:
    """An airflow CLI command; retried (3 attempts) while SQLite is locked by the scheduler's writes."""
    for _ in range(3):
        p = subprocess.run([str(VENV_BIN / "airflow"), *args], env=env, capture_output=True, text=True,
                           timeout=timeout)
        if p.returncode == 0 or "database is locked" not in p.stdout + p.stderr:
            break
        time.sleep(1)
    if p.returncode != 0:
        pytest.fail(f"airflow {' '.join(args)}: exit {p.returncode}\n{p.stdout[-1500:]}\n{p.stderr[-4000:]}")
    return p.stdout


def _floor_hour(t: dt.datetime) -> dt.datetime:
    return t.replace(minute=0, second=0, microsecond=0)


@pytest.fixture
def airflow_services(tmp_path: Path) -> Iterator[tuple[dict[str, str], Path, dt.datetime]]:
    """A workspace with a ledger closing every 30 minutes over the last six hours (the newest two
    minutes ago), its Airflow (airflow-init.sh), and scheduler + DAG processor + API server (the UI's
    API and the execution API); stopped (by PID, their process groups) afterwards. Yields (env,
    workspace, the hour the test started in)."""
    now = dt.datetime.now(dt.UTC)
    hour = _floor_hour(now)
    newest = now - dt.timedelta(minutes=2)
    ledgers = int((newest - (hour - dt.timedelta(hours=5))).total_seconds() // LEDGER_EVERY_S) + 1
    ws = tmp_path / "ws"
    assert tiered("init", str(ws)) == 0
    assert tiered("--workspace", str(ws), "generate", "--namespace", "public/default", "--topics", "2",
                  "--ledgers", str(ledgers), "--entries", "30", "--entry-size", "50-500", "--ledger-interval",
                  str(LEDGER_EVERY_S), "--end-time", newest.isoformat()) == 0
    set_policy(ws / "tiered.toml", "public/default", offload_threshold_bytes=0)  # every sealed ledger it sees
    home = tmp_path / "airflow"
    home.mkdir()
    dags = tmp_path / "dags"  # only the sweep's files: the DAG processor's first parse is quicker
    dags.mkdir()
    helpers = [p.name for p in DAGS.glob("tiered_*.py") if "with tiered_dag(" not in p.read_text()]
    for name in ("tiered_offload_sweep.py", *helpers):  # the sweep and the helper modules it imports
        (dags / name).symlink_to(DAGS / name)
    env = _env(home, ws / "tiered.toml", free_port(), free_port())
    env["AIRFLOW__CORE__DAGS_FOLDER"] = str(dags)
    init = subprocess.run([str(REPO / "scripts" / "airflow-init.sh")], env=env, capture_output=True, text=True,
                          timeout=180)
    assert init.returncode == 0, init.stderr[-3000:]
    procs: list[subprocess.Popen] = []
    logs = []
    api_port = env["AIRFLOW__API__BASE_URL"].rsplit(":", 1)[1]
    services = (("api-server", ["api-server", "-H", "127.0.0.1", "-p", api_port, "-w", "1"]),
                ("scheduler", ["scheduler"]), ("dag-processor", ["dag-processor"]))

    def start(i: int) -> None:
        name, args = services[i]
        p = subprocess.Popen([str(VENV_BIN / "airflow"), *args], env=env, stdout=logs[i],
                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        procs[i:i + 1] = [p]

    for i, (name, _args) in enumerate(services):
        logs.append(open(tmp_path / f"{name}.log", "ab"))  # noqa: SIM115 - closed below
        procs.append(None)  # type: ignore[arg-type]
        start(i)
    # A deployment's supervisor (compose's `restart: always`, stack.sh's) restarts a service that exits:
    # Airflow's scheduler on SQLite can exit on a StaleDataError ("UPDATE ... dag_run ... 0 were matched")
    # when the API server creates the backfill's runs under it. So does this fixture, up to
    # MAX_RESTARTS times per service, each restart noted in the service's log and in RESTARTS.
    stop = threading.Event()

    def supervise() -> None:
        count = [0] * len(services)
        while not stop.wait(1):
            for i, p in enumerate(procs):
                if p.poll() is not None and count[i] < MAX_RESTARTS and not stop.is_set():
                    count[i] += 1
                    line = f"{services[i][0]} exited with {p.returncode}: restarted ({count[i]})"
                    RESTARTS.append(line)
                    logs[i].write(f"\n=== test supervisor: {line}\n".encode())
                    logs[i].flush()
                    start(i)

    watcher = threading.Thread(target=supervise, daemon=True)
    watcher.start()
    try:
        yield env, ws, hour
    finally:
        stop.set()
        watcher.join()
        if RESTARTS:
            print("services restarted during the test:", *RESTARTS, sep="\n  ")
        RESTARTS.clear()
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for log in logs:
            log.close()


def _query(home: str, sql: str, *args) -> list[tuple]:
    """Rows of the scheduler's SQLite database (read only; [] while a table does not exist yet)."""
    db = sqlite3.connect(f"file:{home}/airflow.db?mode=ro", uri=True, timeout=5)
    try:
        return db.execute(sql, args).fetchall()
    except sqlite3.OperationalError:
        return []
    finally:
        db.close()


def _wait(what: str, check, deadline: float, tmp_path: Path):
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(1)
    logs = {f.name: f.read_text(errors="replace")[-3000:] for f in tmp_path.glob("*.log")}
    runs = _sweep_runs(str(tmp_path / "airflow"))
    tis = _query(str(tmp_path / "airflow"), "select run_id, task_id, state, try_number from task_instance "
                 "where dag_id = ? order by run_id, task_id", DAG_ID)
    pytest.fail(f"timed out waiting for {what}; runs: {runs}; task instances: {tis}; "
                f"logs: {json.dumps(logs, indent=1)}")


def _api(base: str, token: str | None, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    """One call of Airflow's REST API (the one the UI's dialogs use)."""
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    req = urllib.request.Request(f"{base}{path}", method=method, headers=headers,
                                 data=None if body is None else json.dumps(body).encode())
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        raise AssertionError(f"{method} {path}: HTTP {e.code}: {e.read()[:2000]!r}") from None


def _api_up(base: str) -> bool:
    try:
        return _api(base, None, "GET", "/api/v2/monitor/health") is not None
    except OSError:
        return False


def _ts(text: str | None) -> dt.datetime | None:
    """A timestamp of the SQLite database (UTC, naive or with an offset)."""
    if text is None:
        return None
    t = dt.datetime.fromisoformat(text)
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)


def _sweep_runs(home: str) -> list[dict[str, Any]]:
    """The sweep's runs, oldest logical date first, with the start of their plan task."""
    rows = _query(home, "select r.run_id, r.run_type, r.state, r.logical_date, r.end_date, "
                        "(select t.start_date from task_instance t where t.dag_id = r.dag_id and t.run_id = r.run_id "
                        "and t.task_id = 'plan') from dag_run r where r.dag_id = ? order by r.logical_date", DAG_ID)
    return [{"run_id": r[0], "type": r[1], "state": r[2], "logical": _ts(r[3]), "end": _ts(r[4]),
             "plan_start": _ts(r[5])} for r in rows]


def reports_by_as_of(reports_dir: Path) -> dict[int, set[int]]:
    """as_of_ms -> the ledgers offloaded by the reports of that clock (every part of a run: one per
    namespace or shard), read from each report's summary.json and detail.parquet (its latest attempt,
    the copy beside the attempt-<n> directories), wherever the layout puts them."""
    out: dict[int, set[int]] = {}
    for summary in reports_dir.rglob("summary.json"):
        if summary.parent.name.startswith("attempt-"):
            continue
        doc = json.loads(summary.read_text())
        if "as_of_ms" not in doc or not (summary.parent / "detail.parquet").exists():
            continue
        rows = pq.read_table(summary.parent / "detail.parquet").to_pylist()
        out.setdefault(int(doc["as_of_ms"]), set()).update(r["ledger"] for r in rows if r["outcome"] == "offloaded")
    return out


def _backfill_in_the_browser(base: str, slots: list[dt.datetime], tmp_path: Path) -> None:
    """A backfill through the UI in headless Chromium, as users start one (the dialog sends the same REST
    call a script would: POST /api/v2/backfills): the DAG's page → Trigger → Backfill, the range typed
    into the two date pickers (the UI's time zone is UTC), every other setting left as the dialog opens
    (asserted), Run Backfill."""
    from playwright.sync_api import sync_playwright

    from .test_ui_browser import ARTIFACTS, _chromium, login

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=_chromium(), headless=True, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1100})
            login(page, base, PASSWORD, timeout_ms=30_000)
            page.goto(f"{base}/dags/{DAG_ID}")
            page.get_by_role("button", name="Trigger").first.click()
            dialog = page.locator("[data-scope=dialog][data-part=content][data-state=open]")
            dialog.get_by_text("Backfill", exact=True).click()
            dialog.get_by_text("Run Backfill - ").wait_for()
            for i, when in enumerate((slots[0], slots[-1])):
                dialog.get_by_test_id("datetime-input").nth(i).click()
                picker = page.locator("[data-scope=popover][data-part=content][data-state=open]")
                picker.get_by_placeholder("YYYY/MM/DD").fill(when.strftime("%Y/%m/%d"))
                picker.get_by_placeholder("HH:mm").fill(when.strftime("%H:%M"))
                dialog.get_by_text("Date Range", exact=True).click()  # closes the picker
            dialog.get_by_text(f"{len(slots)} runs will be triggered.").wait_for()  # the dialog's dry run
            # the defaults, untouched
            assert dialog.locator("input[type=radio][value=none]").is_checked()  # Missing Runs
            assert dialog.locator("input[name=max_active_runs]").input_value() == "1"
            assert dialog.get_by_role("checkbox", name=f"Unpause {DAG_ID} on trigger").is_checked()
            assert not dialog.get_by_role("checkbox", name="Run Backwards").is_checked()
            assert not dialog.get_by_role("checkbox", name="Override parameters on existing runs").is_checked()
            page.screenshot(path=str(ARTIFACTS / "backfill-dialog.png"), full_page=True)
            dialog.get_by_role("button", name="Run Backfill").click()
            page.get_by_text("Backfill generated").wait_for()
        finally:
            browser.close()


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_S)
def test_ui_backfill_with_default_settings_and_catch_up_do_each_slots_own_work(airflow_services, tmp_path: Path
                                                                                 ) -> None:
    from tieredcore.config import Config
    from tieredcore.workspace import Workspace

    env, ws, hour = airflow_services
    home = env["AIRFLOW_HOME"]
    base = env["AIRFLOW__API__BASE_URL"]
    deadline = time.monotonic() + DEADLINE_S
    slots = [hour - dt.timedelta(hours=h) for h in (4, 3, 2)]  # older than the catch-up window
    _wait("the DAG processor to store the DAG", lambda: _query(
        home, "select 1 from serialized_dag where dag_id = ?", DAG_ID), deadline, tmp_path)
    assert _query(home, "select is_paused from dag where dag_id = ?", DAG_ID) == [(1,)]  # paused at creation
    _wait("the API server", lambda: _api_up(base), deadline, tmp_path)
    _backfill_in_the_browser(base, slots, tmp_path)
    assert _query(home, "select is_paused from dag where dag_id = ?", DAG_ID) == [(0,)]  # unpaused by it

    def finished() -> list[dict[str, Any]] | None:
        runs = _sweep_runs(home)
        bf = [r for r in runs if r["type"] == "backfill"]
        sched = [r for r in runs if r["type"] == "scheduled" and r["state"] in ("success", "failed")]
        if len(bf) == 3 and all(r["state"] in ("success", "failed") for r in bf) and len(sched) >= 2:
            return [r for r in runs if r["state"] in ("success", "failed")]
        return None

    runs = _wait("three backfill runs and two caught-up scheduled runs to finish", finished, deadline, tmp_path)
    assert [r["state"] for r in runs] == ["success"] * len(runs), runs
    assert [r["logical"] for r in runs if r["type"] == "backfill"] == slots
    scheduled = [r["logical"] for r in runs if r["type"] == "scheduled"]
    # the catch-up: the missed hourly slots of the window, each a run of its own (the hour may have
    # turned since the test began: then the window starts an hour later)
    assert scheduled[:2] in ([hour - dt.timedelta(hours=1), hour], [hour, hour + dt.timedelta(hours=1)]), scheduled
    # one after the other, oldest logical date first: each run's plan started after the older run ended
    for older, newer in zip(runs, runs[1:], strict=False):
        assert newer["plan_start"] >= older["end"], (older, newer)

    # each run's report: exactly the ledgers closed after the slot before and by its own --as-of
    with Workspace(Config.load(ws / "tiered.toml", env={})) as wsp:
        closed = {}  # ledger id -> close time (ms)
        for t in wsp.ml.list_topics("public/default"):
            info, _ = wsp.ml.get_topic(t)
            for li in info.ledgerInfo[:-1]:
                closed[li.ledgerId] = li.timestamp
    reports = reports_by_as_of(Path(Config.load(ws / "tiered.toml", env={}).reports_dir))
    previous = 0
    for r in runs:
        at = int(r["logical"].timestamp() * 1000)
        own = {lid for lid, ts in closed.items() if previous < ts <= at}
        # two topics, two ledgers each per hourly slot since the run before (two slots when the hour turned
        # between the fixture and the unpause: the catch-up window then starts an hour later)
        slots_since = round((at - previous) / 3_600_000) if previous else 0
        assert own and (previous == 0 or len(own) == 4 * slots_since), (r["run_id"], sorted(own))
        assert reports.get(at) == own, (r["run_id"], sorted(reports.get(at, ())), sorted(own))
        previous = at
    # the ledgers closed after the newest finished slot are the next slot's: still hot
    assert not any(lid in set().union(*reports.values()) for lid, ts in closed.items() if ts > previous)


# -- fast: the catch-up clock and the schedule descriptions --------------------------------------------


def _clock(cron: str, window_h: float, now: dt.datetime, monkeypatch: pytest.MonkeyPatch):
    import pendulum
    import tiered_timetables
    from tiered_timetables import CatchUpCronTimetable

    monkeypatch.setattr(tiered_timetables, "utcnow", lambda: pendulum.instance(now))
    return CatchUpCronTimetable(cron, window=dt.timedelta(hours=window_h))


def _next(clock, last: dt.datetime | None) -> dt.datetime:
    import pendulum
    from airflow.timetables.base import DataInterval, TimeRestriction

    interval = None if last is None else DataInterval(pendulum.instance(last), pendulum.instance(last))
    info = clock.next_dagrun_info(last_automated_data_interval=interval, restriction=TimeRestriction(
        pendulum.datetime(2026, 1, 1, tz="UTC"), None, True))
    return info.logical_date


def test_catch_up_clock_runs_the_missed_slots_of_its_window_oldest_first(monkeypatch) -> None:
    """After an outage (last run at 05:00, now 12:20) a 3 h window resumes at 10:00, then 11:00, 12:00
    (the scheduler asks again after each run); a slot inside the window follows the last run; a first
    start does not replay the months since the start date; window 0 is the newest slot only."""
    now = dt.datetime(2026, 3, 1, 12, 20, tzinfo=dt.UTC)
    clock = _clock("0 * * * *", 3, now, monkeypatch)
    at = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)
    assert _next(clock, at.replace(hour=5)) == at.replace(hour=10)
    assert _next(clock, at.replace(hour=10)) == at.replace(hour=11)
    assert _next(clock, at.replace(hour=11)) == at.replace(hour=12)
    assert _next(clock, at.replace(hour=12)) == at.replace(hour=13)  # the next slot: not yet due
    assert _next(clock, None) == at.replace(hour=10)
    assert _next(_clock("0 * * * *", 0, now, monkeypatch), None) == at.replace(hour=12)
    assert _next(_clock("*/15 * * * *", 0.75, now, monkeypatch), at.replace(hour=1)) == at.replace(hour=11, minute=45)
    # the slots between two dates (what a backfill creates runs for) are every slot, however old
    import pendulum
    from airflow.timetables.base import TimeRestriction

    info, got = None, []
    while info := clock.next_dagrun_info(last_automated_data_interval=info and info.data_interval,
                                         restriction=TimeRestriction(pendulum.instance(at.replace(hour=2)),
                                                                     pendulum.instance(at.replace(hour=4)), True)):
        got.append(info.logical_date)
    assert got == [at.replace(hour=2), at.replace(hour=3), at.replace(hour=4)]
    with pytest.raises(ValueError, match="negative"):
        _clock("0 * * * *", -1, now, monkeypatch)


def test_catch_up_clock_is_stored_and_read_back_by_airflow() -> None:
    """The DAG processor stores the clock (the plugin registers it) and the scheduler reads it back with
    its window; the DAG list's schedule tooltip says how far it catches up."""
    from airflow.serialization.serialized_objects import DagSerialization

    from .conftest import get_dag

    dag = get_dag(DAG_ID)
    back = DagSerialization.from_dict(DagSerialization.to_dict(dag))
    assert type(back.timetable).__name__ == "CatchUpCronTimetable"
    assert back.timetable.serialize() == dag.timetable.serialize()
    assert back.timetable.window == dt.timedelta(hours=6)
    assert back.timetable.summary == "*/15 * * * *"
    assert "catches up missed slots of the last 6 h" in back.timetable.description
    assert back.catchup is True and back.max_active_runs == 1


def test_descriptions_name_both_halves_of_asset_or_time_schedules() -> None:
    """The DAG list shows a DAG's description; an asset-or-time DAG's names its asset AND its clock."""
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS))
    assert not bag.import_errors, bag.import_errors
    both = {"tiered_deletion_lag_cleanup": ("tiered_offloaded", "0 * * * *"),
            "tiered_deletion_drain": ("tiered_deletions_pending", "*/10 * * * *")}
    for dag_id, (asset, cron) in both.items():
        dag = bag.get_dag(dag_id)
        assert type(dag.timetable).__name__ == "AssetOrTimeSchedule", dag_id
        for text in (dag.description, dag.doc_md.rsplit("**Schedule:**", 1)[1]):
            assert f"on each {asset} asset event" in text and f"cron {cron} UTC" in text, (dag_id, text)
    for dag_id in bag.dag_ids:  # every scheduled DAG starts with the gate; manual ones have none
        dag = bag.get_dag(dag_id)
        roots = [t.task_id for t in dag.roots]
        assert roots == (["wait_turn"] if dag.schedule is not None else roots) and (
            dag.schedule is not None or "wait_turn" not in dag.task_ids), (dag_id, roots)
        assert ("**One slot at a time, oldest first.**" in dag.doc_md) is (dag.schedule is not None), dag_id
    sweep = bag.get_dag(DAG_ID)
    assert sweep.description.endswith("Schedule: cron */15 * * * * UTC (Every 15 minutes; catches up missed "
                                      "slots of the last 6 h, oldest first)"), sweep.description
    assert bag.get_dag("tiered_offload_topic").description.endswith("Schedule: manual (no schedule)")


def test_the_gate_never_waits_for_a_finished_failed_or_queued_scheduled_run(tmp_path: Path, spark_env,
                                                                            monkeypatch) -> None:
    """``wait_turn`` in real DAG runs (dag.test, this session's metadata DB): an older run that failed does
    not block a newer one, nor does an older non-backfill run that is queued (it may be queued behind
    this very run: waiting would deadlock); a running one only up to the gate's maximum wait."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    from .conftest import make_workspace, run_dag

    cfg = make_workspace(tmp_path / "ws", ["public/default"], topics=1, ledgers=2, entries=10)  # nothing due
    at = dt.datetime(2026, 2, 1, 3, 0, tzinfo=dt.UTC)
    older, states = run_dag(DAG_ID, at, {"config": str(cfg)})
    assert states["wait_turn"] == "success" and states["offload"] == "skipped", states
    for i, state in enumerate(("failed", "queued"), start=1):
        with create_session() as session:
            session.query(DagRun).filter_by(dag_id=DAG_ID, run_id=older.run_id).update({"state": state})
        _, states = run_dag(DAG_ID, at + dt.timedelta(hours=i), {"config": str(cfg)})
        assert states["wait_turn"] == "success" and states["verdict"] == "success", (state, states)
    # a running older run is waited for, at most TIERED_GATE_MAX_WAIT: with 0 the gate goes on at once
    import tiered_pipeline

    with create_session() as session:
        session.query(DagRun).filter_by(dag_id=DAG_ID, run_id=older.run_id).update({"state": "running"})
    monkeypatch.setattr(tiered_pipeline, "GATE_MAX_WAIT", dt.timedelta(0))
    try:
        _, states = run_dag(DAG_ID, at + dt.timedelta(hours=3), {"config": str(cfg)})
        assert states["wait_turn"] == "success", states
    finally:
        with create_session() as session:
            session.query(DagRun).filter_by(dag_id=DAG_ID, run_id=older.run_id).update({"state": "failed"})
