"""The Airflow UI in a real browser: `airflow api-server` on a free loopback port with the project's
plugin, over a demo workspace (namespaces offloaded by a real sweep DAG run and by the CLI, one left
hot), the simple auth manager; headless Chromium (Debian's, driven by Playwright: it cannot download
its own browser here). It logs in, opens the "Tiered storage" view and checks the numbers it shows are
the ones tieredcore computes, then follows a Spark task's "Run report" extra link to its report page.
Screenshots: tests/artifacts/ui/ (gitignored)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import REPO, SWEEP_AT, make_workspace, run_dag, set_policy, tiered, topic_ledgers

ARTIFACTS = REPO / "tests" / "artifacts" / "ui"
SERVER_READY_S = 60
PASSWORD = "tiered-ui-test"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _status(url: str, token: str | None = None) -> int | None:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (urllib.error.URLError, OSError):
        return None


@contextlib.contextmanager
def api_server(home: Path, config: Path, log: Path) -> Iterator[Any]:
    """`airflow api-server` (one worker) sharing the test session's metadata DB, started at once (its
    start overlaps the DAG run); ``.wait()`` gives its URL once healthy. Stopped by its PID's process
    group (it was started in a new session)."""
    port = _free_port()
    pw = home / "ui_test_passwords.json"
    pw.write_text(json.dumps({"admin": PASSWORD}))
    env = dict(os.environ, TIERED_CONFIG=str(config),
               AIRFLOW__CORE__AUTH_MANAGER="airflow.api_fastapi.auth.managers.simple.simple_auth_manager."
                                           "SimpleAuthManager",
               AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS="admin:admin",
               AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE=str(pw),
               AIRFLOW__CORE__LAZY_LOAD_PLUGINS="False",
               AIRFLOW__API__BASE_URL=f"http://127.0.0.1:{port}")
    airflow = Path(sys.executable).parent / "airflow"
    with open(log, "wb") as out:
        p = subprocess.Popen([str(airflow), "api-server", "--host", "127.0.0.1", "--port", str(port),
                              "--workers", "1"], env=env, stdout=out, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True)
    base = f"http://127.0.0.1:{port}"

    class Starting:
        def wait(self) -> str:
            """The server's URL once it answers its health check."""
            deadline = time.monotonic() + SERVER_READY_S
            while _status(f"{base}/api/v2/monitor/health") != 200:
                if p.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"airflow api-server did not come up (exit {p.poll()}): "
                                f"{log.read_text(errors='replace')[-3000:]}")
                time.sleep(0.2)
            return base

    try:
        yield Starting()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def fmt(v: float) -> str:
    return f"{int(v):,}" if float(v).is_integer() else f"{v:,.1f}"


def _chromium() -> str:
    exe = shutil.which("chromium")
    if exe is None:
        pytest.fail("Debian's chromium is not installed (apt-get install -y chromium): the UI test needs a real "
                    "browser, and Playwright cannot download its own here")
    return exe


def login(page, base: str, password: str = PASSWORD, timeout_ms: int = 20_000) -> None:
    """Log in to the Airflow UI at ``base`` as admin (the simple auth manager's form)."""
    page.set_default_timeout(timeout_ms)
    page.goto(base)
    page.fill("input[name=username]", "admin")
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_url(lambda u: "login" not in u)


def open_view(page, base: str, menu_shot: str | None = None):
    """Log in, then open the view from its nav entry (Browse → Tiered storage): the frame showing it."""
    login(page, base)
    page.get_by_role("button", name="Browse").click()
    entry = page.get_by_role("menuitem", name="Tiered storage")
    entry.wait_for()
    if menu_shot:
        page.screenshot(path=str(ARTIFACTS / menu_shot))
    entry.click()
    # the deadline of an event, not a pause: a machine busy building images (tests/compose) takes longer
    page.wait_for_url("**/plugin/tiered-storage", timeout=60_000)
    frame = page.frame_locator("iframe")
    frame.locator("#namespaces").wait_for()
    return frame


@pytest.mark.slow
def test_tiered_storage_view_and_run_report_in_a_browser(tmp_path, spark_env):
    from playwright.sync_api import sync_playwright

    from tieredcore.config import Config
    from tieredcore.lifecycle.overview import TIERS, Prices, build_overview
    from tieredcore.workspace import Workspace

    chromium = _chromium()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)

    home = Path(os.environ["AIRFLOW_HOME"])
    cfg = tmp_path / "ws" / "tiered.toml"  # read by the server per request: it may start before the run
    with api_server(home, cfg, tmp_path / "api-server.log") as base:
        # the demo workspace (while the server starts): public/default offloaded by a real sweep DAG run
        # (one Spark task), acme/orders by the CLI (one ledger; the rest still due), sandbox/dev never
        make_workspace(tmp_path / "ws", ["public/default", "acme/orders", "sandbox/dev"], topics=1, ledgers=3,
                       entries=40)
        set_policy(cfg, "public/default", offload_threshold_bytes=0, deletion_lag_ms=3600_000)
        set_policy(cfg, "acme/orders", offload_threshold_seconds=0)
        (orders,) = [t for t in topic_ledgers(cfg) if "/acme/orders/" in t]
        second = topic_ledgers(cfg)[orders][1].ledgerId
        assert tiered("--config", str(cfg), "offload", orders, "--up-to", f"{second}:0") == 0
        dr, states = run_dag("tiered_offload_sweep", SWEEP_AT, {"config": str(cfg), "namespaces": ["public/default"]})
        assert states["offload[0]"] == "success", states
        base = base.wait()

        # the plugin's pages are behind Airflow's auth: no session, no report
        assert _status(f"{base}/tiered/overview") == 401
        assert _status(f"{base}/tiered/reports/") == 401
        assert _status(f"{base}/tiered/overview.json", "not-a-token") == 403  # as the core API answers it
        # a user's API token (the auth manager's login endpoint) opens the JSON as the session does
        login = urllib.request.Request(f"{base}/auth/token", method="POST", headers={"Content-Type": "application/json"},
                                       data=json.dumps({"username": "admin", "password": PASSWORD}).encode())
        with urllib.request.urlopen(login, timeout=10) as r:
            token = json.loads(r.read())["access_token"]
        assert _status(f"{base}/tiered/overview.json", token) == 200
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
            try:
                page = browser.new_page(viewport={"width": 1500, "height": 1000})
                frame = open_view(page, base, "browse-menu.png")
                page.screenshot(path=str(ARTIFACTS / "tiered-storage-in-ui.png"), full_page=True)

                # its numbers are tieredcore's (computed at the time the page states)
                now = int(frame.locator("#as-of").get_attribute("data-now-ms"))
                config = Config.load(cfg, env={})
                with Workspace(config) as ws:
                    ov = build_overview(ws, config.reports_dir, now, Prices.of(config))
                assert [n.namespace for n in ov.namespaces] == ["acme/orders", "public/default", "sandbox/dev"]
                shown, exact = {}, {}
                for cell in frame.locator("#namespaces td[data-field]").all():
                    key = (cell.get_attribute("data-ns"), cell.get_attribute("data-field"))
                    shown[key], exact[key] = cell.inner_text(), cell.get_attribute("data-value")
                for n in ov.namespaces:
                    for t in TIERS:
                        assert shown[(n.namespace, f"{t}_ledgers")] == f"{n.tiers[t]['ledgers']:,}"
                        assert exact[(n.namespace, f"{t}_bytes")] == str(n.tiers[t]["bytes"])  # shown in KiB...
                    assert shown[(n.namespace, "objects")] == f"{n.objects:,}"
                    assert exact[(n.namespace, "cost_month")] == str(n.cost_month)
                    assert shown[(n.namespace, "deletion_in_flight")] == f"{n.deletion_in_flight:,}"
                by = {n.namespace: n for n in ov.namespaces}
                # what the workspace holds: sweep and CLI offloads, the rest hot
                assert by["public/default"].tiers["both"]["ledgers"] == 3 and by["public/default"].tiers["hot"][
                    "ledgers"] == 1  # the open ledger
                assert by["sandbox/dev"].tiers["both"]["ledgers"] == 0
                assert by["acme/orders"].tiers["both"]["ledgers"] == 1 and by["acme/orders"].offload_lag_ms > 0
                assert by["public/default"].requests_per_run["PUT"] > 0  # from the sweep's report
                for n in ov.namespaces:
                    per_run = ", ".join(f"{k} {fmt(v)}" for k, v in n.requests_per_run.items() if v) or "0"
                    assert shown[(n.namespace, "requests_per_run")] == per_run
                    assert shown[(n.namespace, "requests_per_month")] == fmt(n.requests_per_month)
                assert frame.locator("#tier-plot canvas").count() == 1  # uPlot (plugins/static/)
                assert frame.locator("#last-runs tr[data-job=offload_sweep]").count() == 1

                # the sweep's Spark task: its "Run report" extra link is a same-site link to its attempt's page
                # (the task instance's Details tab lists its extra links)
                page.goto(f"{base}/dags/tiered_offload_sweep/runs/{dr.run_id}/tasks/offload/mapped/0/details")
                link = page.get_by_role("link", name="Run report")
                link.wait_for()
                href = link.get_attribute("href")
                assert "/tiered/reports/tiered_offload_sweep/" in href and href.endswith("/offload.0/attempt-1/"), href
                page.screenshot(path=str(ARTIFACTS / "task-instance-run-report-link.png"), full_page=True)
                page.goto(href if href.startswith("http") else base + href)
                page.wait_for_url("**/plugin/tiered-storage/**")  # the page moves into the UI's frame
                report = page.frame_locator("iframe")
                report.locator("#headline").wait_for()
                assert report.locator("#attempt").inner_text() == "1"
                assert report.locator("#outcome").inner_text() == "no failures"
                assert report.locator("#report-namespaces tr[data-ns='public/default']").count() == 1
                page.screenshot(path=str(ARTIFACTS / "run-report.png"), full_page=True)
            finally:
                browser.close()


@pytest.mark.slow
def test_the_view_of_an_attached_pulsar_cluster_in_a_browser(tmp_path, pulsar_cluster):
    """The same nav entry over a workspace attached to the fixture Pulsar cluster (after a real dry-run
    reconciliation and a real deep scrub): the attached view, its columns labelled BookKeeper, its numbers
    tieredcore's and the fixture's, the damaged message with "repair impossible without BookKeeper";
    Pulsar's ZooKeeper paths and the bucket unchanged by serving it."""
    from playwright.sync_api import sync_playwright

    from tests.support.attached_view import attach, bucket, expected, reconcile_report, scrub_report
    from tests.support.pulsar_cluster import LOCAL
    from tieredcore.lifecycle.attached_view import REPAIR_IMPOSSIBLE, build_attached_overview
    from tieredcore.lifecycle.overview import Prices
    from tieredcore.workspace import Workspace

    chromium = _chromium()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    home = Path(os.environ["AIRFLOW_HOME"])
    cfg_path = tmp_path / "ws" / "tiered.toml"
    with api_server(home, cfg_path, tmp_path / "api-server.log") as starting:
        cluster = pulsar_cluster(driver=LOCAL)
        cfg = attach(tmp_path, cluster)
        reconcile_report(cfg, cluster, "rc1")
        scrub_report(cfg, cluster, "s1")
        zk, objects = cluster.snapshot(), bucket(cluster)
        base = starting.wait()
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
            try:
                page = browser.new_page(viewport={"width": 1700, "height": 1000})
                frame = open_view(page, base)
                page.screenshot(path=str(ARTIFACTS / "attached-cluster-in-ui.png"), full_page=True)
                assert frame.locator("#namespaces").get_attribute("data-attached") == "pulsar-a"
                heads = frame.locator("#namespaces th").all_inner_texts()
                assert "BookKeeper bytes" in heads and not any("hot" in h for h in heads), heads
                now = int(frame.locator("#as-of").get_attribute("data-now-ms"))
                with Workspace(cfg) as ws:
                    ov = build_attached_overview(ws, cfg.reports_dir, now, Prices.of(cfg))
                shown = {(c.get_attribute("data-ns"), c.get_attribute("data-field")): c.get_attribute("data-value")
                         for c in frame.locator("#namespaces td[data-field]").all()}  # exact values
                want = expected(cluster)
                for n in ov.namespaces:
                    w = want[n.namespace]
                    assert shown[(n.namespace, "bookkeeper_bytes")] == str(w["bookkeeper"]["bytes"])
                    assert shown[(n.namespace, "offloaded_bytes")] == str(w["offloaded"]["bytes"])
                    assert shown[(n.namespace, "orphan_bytes")] == str(w["orphans"]["bytes"])
                    assert shown[(n.namespace, "damaged_messages")] == str(len(w["damaged"]))
                    assert shown[(n.namespace, "cost_month")] == str(n.cost_month)
                assert frame.locator("#damaged li").all_inner_texts() == [
                    f"persistent://acme/orders/audit 2001:4: {REPAIR_IMPOSSIBLE}"]
            finally:
                browser.close()
    assert cluster.snapshot() == zk and bucket(cluster) == objects
