"""The "Tiered storage" view and the report pages inside Airflow 3's UI in headless Chromium, behind the
real API server (tests/airflow/test_ui_browser.py's fixtures), over a workspace a real sweep DAG run
offloaded and `tiered export` exported (the view's "Exported tables"): the view at 1400 px and 1024 px
in the UI's light and dark mode, checked for clipping (the frame's document never wider than the frame; a
table wider than its box only inside its own scroll box) with screenshots under tests/artifacts/ui/view-*.png; drill-down to a topic's ledgers by clicking; the
task instance's "Tiered report" tab showing its try, back to the run's report and on to the DAG run in
the UI; the "Run report" extra link opening inside the UI."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import quote

import pytest

from .conftest import SWEEP_AT, make_workspace, run_dag, set_policy, tiered, topic_ledgers
from .test_ui_browser import ARTIFACTS, _chromium, api_server, open_view

DAG = "tiered_offload_sweep"

# in the view's frame: the document fits the frame, and every table either fits its box or sits in a box
# that scrolls horizontally on its own (overflow-x auto/scroll)
CLIPPING = """() => {
  const doc = document.documentElement, problems = [];
  if (doc.scrollWidth > doc.clientWidth + 1) problems.push(`document ${doc.scrollWidth} > ${doc.clientWidth}`);
  for (const t of document.querySelectorAll("table")) {
    if (t.closest("table.nested")) continue;
    const box = t.parentElement, style = getComputedStyle(box);
    const scrolls = ["auto", "scroll"].includes(style.overflowX);
    if (t.getBoundingClientRect().right > box.getBoundingClientRect().right + 1 && !scrolls)
      problems.push(`#${t.id || t.className} wider than its box, which does not scroll`);
    if (scrolls && box.getBoundingClientRect().right > doc.clientWidth + 1)
      problems.push(`#${t.id}'s scroll box ends past the frame`);
  }
  return problems;
}"""


@pytest.mark.slow
def test_the_view_and_reports_inside_the_ui(tmp_path, spark_env):
    from playwright.sync_api import sync_playwright

    chromium = _chromium()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    home = Path(os.environ["AIRFLOW_HOME"])
    cfg = tmp_path / "ws" / "tiered.toml"
    with api_server(home, cfg, tmp_path / "api-server.log") as starting:
        make_workspace(tmp_path / "ws", ["public/default", "acme/orders", "sandbox/dev"], topics=1, ledgers=3,
                       entries=40)
        set_policy(cfg, "public/default", offload_threshold_bytes=0)
        set_policy(cfg, "acme/orders", offload_threshold_seconds=0)  # due, never offloaded: lag
        dr, states = run_dag(DAG, SWEEP_AT, {"config": str(cfg), "namespaces": ["public/default"]})
        assert states["offload[0]"] == "success", states
        # the Iceberg export of what the sweep offloaded: the view lists its table
        assert tiered("--config", str(cfg), "export", "--namespace", "public/default", "--as-of",
                      SWEEP_AT.isoformat()) == 0
        base = starting.wait()
        run_id = dr.run_id
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
            try:
                for width in (1400, 1024):
                    for scheme in ("light", "dark"):
                        _view_fits(browser, base, width, scheme)
                page = browser.new_page(viewport={"width": 1400, "height": 900})
                _drill_down(page, base, cfg)
                _report_from_the_task_tab(page, base, run_id)
                _run_report_link(page, base, run_id)
            finally:
                browser.close()


@pytest.mark.slow
def test_a_read_replicas_lag_in_the_view(tmp_path) -> None:
    """The view of a read replica (`tiered init --replica-of`, not synced yet) inside the UI: the "Read
    replica" section with its lag (every topic's manifests unseen) is visible, nothing clipped."""
    from playwright.sync_api import sync_playwright

    chromium = _chromium()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    home = Path(os.environ["AIRFLOW_HOME"])
    src, rep = tmp_path / "source", tmp_path / "replica"
    with api_server(home, rep / "tiered.toml", tmp_path / "api-server.log") as starting:
        make_workspace(src, ["public/default"], topics=2, ledgers=2, entries=20)
        assert tiered("--workspace", str(src), "offload", "--namespace", "public/default", "--keep-bytes", "0") == 0
        assert tiered("init", str(rep), "--replica-of", f"file://{src / 'cold'}") == 0
        base = starting.wait()
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
            try:
                page = browser.new_page(viewport={"width": 1024, "height": 900})
                frame = open_view(page, base)
                lag = frame.locator("#replica-lag")
                lag.wait_for()
                assert lag.is_visible() and "never synced" in lag.inner_text()
                assert int(lag.get_attribute("data-behind")) >= 2
                rows = frame.locator("#replica-topics tbody tr")
                assert rows.count() == 2 and rows.first.is_visible()
                assert page.frames[-1].evaluate(CLIPPING) == []
                page.screenshot(path=str(ARTIFACTS / "view-replica.png"))
            finally:
                browser.close()


def _view_fits(browser, base: str, width: int, scheme: str) -> None:
    """The view in the UI's ``scheme`` (the system's, which the UI follows by default) at ``width``:
    nothing clipped, the frame in the same colour mode, the plot drawn on a time axis."""
    context = browser.new_context(viewport={"width": width, "height": 900}, color_scheme=scheme)
    page = context.new_page()
    try:
        frame = open_view(page, base)
        frame.locator("#tier-plot canvas").wait_for()
        assert page.evaluate("document.documentElement.classList.contains('dark')") == (scheme == "dark")
        inner = page.frames[-1]
        assert inner.evaluate("document.documentElement.dataset.theme") == scheme
        bg = inner.evaluate("getComputedStyle(document.body).backgroundColor")
        assert (bg == "rgb(26, 32, 44)") == (scheme == "dark"), bg
        problems = inner.evaluate(CLIPPING)
        page.screenshot(path=str(ARTIFACTS / f"view-{width}-{scheme}.png"))
        assert problems == [], (width, scheme, problems)
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")  # the UI itself
        # the strip names the namespace whose offload is overdue; sizes in binary units
        assert frame.locator("#attention li[data-kind=offload-lag]").first.inner_text().startswith("acme/orders: ")
        cell = frame.locator("#namespaces td[data-ns='public/default'][data-field=both_bytes]")
        assert cell.inner_text().endswith(("B", "KiB", "MiB")) and int(cell.get_attribute("data-value")) > 0
        # the exported table: its rows, nothing left to export
        table = frame.locator("#exports tr[data-table='public_default.topic_0000']")
        assert int(table.locator("td[data-field=rows]").get_attribute("data-value")) > 0
        assert table.locator("td[data-field=unexported_ledgers]").inner_text() == "0"
        # the time axis: uPlot's x axis labelled with the runs' logical time
        assert frame.locator("#tier-plot .u-axis").count() == 2
        # switching the UI's mode switches the frame's (the frame watches the UI's <html> class)
        other = "light" if scheme == "dark" else "dark"
        page.evaluate(f"document.documentElement.classList.replace('{scheme}', '{other}')")
        inner.wait_for_function(f"document.documentElement.dataset.theme === '{other}'")
    finally:
        context.close()


def _drill_down(page, base: str, cfg: Path) -> None:
    """Overview → namespace → topic, by clicking; the ledgers with the positions `up_to` takes."""
    frame = open_view(page, base)
    frame.locator("#namespaces").get_by_role("link", name="public/default", exact=True).click()
    frame.locator("#topics").wait_for()
    [topic] = [t for t in topic_ledgers(cfg) if "/public/default/" in t]
    frame.get_by_role("link", name=topic).click()
    frame.locator("#ledgers").wait_for()
    page.screenshot(path=str(ARTIFACTS / "view-topic-ledgers.png"), full_page=True)
    want = [(str(li.ledgerId), f"{li.ledgerId}:{li.entries - 1}" if li.entries else "—")
            for li in sorted(topic_ledgers(cfg)[topic], key=lambda li: li.ledgerId)]
    shown = [(r.get_attribute("data-ledger"), r.locator("td[data-field=last]").inner_text())
             for r in frame.locator("#ledgers tbody tr").all()]
    assert shown == want
    offloaded = frame.locator("#ledgers td[data-field=offloaded]").all_inner_texts()
    assert offloaded.count("yes") == 3  # the sweep offloaded the three sealed ledgers
    assert "/plugin/tiered-storage/tiered/topics/" in page.url  # the UI's address follows the frame


def _report_from_the_task_tab(page, base: str, run_id: str) -> None:
    """The task instance's "Tiered report" tab: its try; back to the run's report; on to the DAG run."""
    page.goto(f"{base}/dags/{DAG}/runs/{quote(run_id, safe='')}/tasks/offload/mapped/0")
    page.get_by_role("tab", name="Tiered report").or_(page.get_by_role("link", name="Tiered report")).first.click()
    page.wait_for_url("**/plugin/tiered-task-report")
    frame = page.frame_locator("iframe")
    frame.locator("#headline").wait_for()
    assert frame.locator("#attempt").inner_text() == "1"
    assert frame.locator("#outcome").inner_text() == "no failures"
    assert frame.locator("#report-namespaces tr[data-ns='public/default']").count() == 1
    assert frame.locator("#detail tbody tr").count() == 3
    page.screenshot(path=str(ARTIFACTS / "view-task-report-tab.png"), full_page=True)
    frame.locator("#back-to-run").click()
    frame.locator("#parts").wait_for()
    assert frame.locator("#run-id").inner_text() == run_id
    assert frame.locator("#parts tr[data-part='offload.0']").count() == 1
    page.screenshot(path=str(ARTIFACTS / "view-run-report.png"), full_page=True)
    frame.locator("#dag-run-link").click()
    page.wait_for_url(f"**/dags/{DAG}/runs/{quote(run_id, safe='')}")
    # the DAG run's own tab shows the same report
    page.goto(f"{base}/dags/{DAG}/runs/{quote(run_id, safe='')}/plugin/tiered-run-report")
    page.frame_locator("iframe").locator("#parts").wait_for()


def _run_report_link(page, base: str, run_id: str) -> None:
    """The "Run report" extra link (on the task's Details tab) opens the try inside the UI."""
    page.goto(f"{base}/dags/{DAG}/runs/{quote(run_id, safe='')}/tasks/offload/mapped/0/details")
    link = page.get_by_role("link", name="Run report")
    link.wait_for()
    href = link.get_attribute("href")
    page.goto(href if href.startswith("http") else base + href)
    page.wait_for_url("**/plugin/tiered-storage/tiered/reports/**")
    frame = page.frame_locator("iframe")
    frame.locator("#headline").wait_for()
    assert frame.locator("#attempt").inner_text() == "1"
