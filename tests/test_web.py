"""The plugin's web pages (plugins/tiered_web.py and the modules beside it) through FastAPI's TestClient,
without Airflow (its auth dependency is off here; tests/airflow/test_ui_browser.py and
tests/airflow/test_view_browser.py check it behind the real API server): the overview's numbers (exact in
data-value, human in the text), the attention strip, pagination, drill-down to a topic's ledgers, a DAG
run's report and a part's try with its detail.parquet, the UI's tab landings, input escaped, the vendored
chart library checked against its manifest."""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient

from tests.support.dag_run_reports import detail_row, publish_try, write_run_json
from tests.support.workspaces import END_MS, build_workspace, offload, sealed
from tieredcore.config import Config
from tieredcore.lifecycle.overview import Prices, build_overview
from tieredcore.meta.deletion_log import DeletionRecord
from tieredcore.reports import RunReports, report_name
from tieredcore.workspace import Workspace

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"
if str(PLUGINS) not in sys.path:
    sys.path.append(str(PLUGINS))

from tiered_units import human_bytes  # noqa: E402
from tiered_web import create_app  # noqa: E402

TOPIC = "persistent://t/a/topic-0000"
DAG = "tiered_offload_sweep"
RUN = "manual__2026-01-01T00:00:00+00:00"
CELL = re.compile(r"<td class='(n(?: bad)?)' data-ns='([^']*)' data-field='([a-z_]+)'(?: data-value='([^']*)')?"
                  r"(?: title='[^']*')?>([^<]*)</td>")


def cells(text: str) -> dict[tuple[str, str], tuple[str, str | None, str]]:
    """(namespace, field) -> (class, exact value, shown text) of the overview's number cells."""
    return {(ns, f): (cls, v, shown) for cls, ns, f, v, shown in CELL.findall(text)}


@pytest.fixture
def config(tmp_path: Path) -> Config:
    """Two namespaces, t/a's first two ledgers offloaded; one DAG run of the sweep with two shards: shard
    0 failed its first try (a failed ledger) and succeeded its second, shard 1 succeeded; t/c had nothing
    due."""
    cfg = Config.load(build_workspace(tmp_path / "ws", ["t/a", "t/b"]), env={})
    with Workspace(cfg) as ws:
        offload(ws, TOPIC, sealed(ws, TOPIC)[:2], as_of=END_MS)
    reports = RunReports(cfg.reports_dir)
    tiers = {"tiers": {"t/a": {"hot": {"ledgers": 2, "bytes": 1000}, "both": {"ledgers": 2, "bytes": 2000},
                               "cold": {"ledgers": 0, "bytes": 0}, "objects": 4}},
             "requests": {"total": {"GET": 1, "PUT": 8, "LIST": 0, "DELETE": 0},
                          "namespaces": {"t/a": {"GET": 1, "PUT": 8, "LIST": 0, "DELETE": 0}}}}
    publish_try(reports, DAG, RUN, "offload", 0, 1, [detail_row(TOPIC, 1), detail_row(TOPIC, 2, "failed", 0, "boom")],
                as_of_ms=END_MS, extra=tiers)
    publish_try(reports, DAG, RUN, "offload", 0, 2, [detail_row(TOPIC, 1), detail_row(TOPIC, 2)], as_of_ms=END_MS,
                extra=tiers)
    publish_try(reports, DAG, RUN, "offload", 1, 1, [detail_row("persistent://t/b/topic-0000", 7)], as_of_ms=END_MS)
    write_run_json(reports, DAG, RUN, [("offload", 0, ["t/a"]), ("offload", 1, ["t/b"])],
                   [{"namespace": "t/c", "reason": "no ledger past the offload threshold"}], as_of_ms=END_MS)
    return cfg


def mount(config: Config, at: str = "/tiered") -> TestClient:
    """The app mounted as Airflow's API server mounts a plugin's app."""
    from fastapi import FastAPI

    server = FastAPI()
    server.mount(at, create_app(lambda: config, secured=False))
    return TestClient(server, base_url=f"http://testserver{at}")


@pytest.fixture
def client(config: Config) -> TestClient:
    return mount(config)


def run_href(part: str = "", attempt: int | None = None) -> str:
    """A report page's link as the pages write it (under /tiered); ``[len("/tiered"):]`` to request it."""
    url = f"/tiered/reports/{DAG}/{quote(report_name(RUN), safe='')}/"
    return url + (f"{part}/" if part else "") + (f"attempt-{attempt}/" if attempt else "")


def test_a_dag_runs_report(client: TestClient) -> None:
    """run.json as tables: the run id unaltered, each part with its tries and its task and log in
    Airflow's UI, what had nothing due and why, the totals per namespace; never a JSON dump."""
    r = client.get(run_href()[7:])
    assert r.status_code == 200, r.text
    assert f"<b id=\"run-id\">{RUN}</b>" in r.text
    assert f'id="dag-run-link" data-ui href="/dags/{DAG}/runs/{quote(RUN, safe="")}"' in r.text
    parts = re.findall(r'<tr data-part="([^"]*)"', r.text)
    assert parts == ["offload.0", "offload.1"]
    assert f'href="{run_href("offload.0", 1)}">1</a> <a href="{run_href("offload.0", 2)}">2</a>' in r.text
    assert f'href="/dags/{DAG}/runs/{quote(RUN, safe="")}/tasks/offload/mapped/1?try_number=1">log</a>' in r.text
    assert '<tr data-ns="t/c"><td class="id">t/c</td><td>no ledger past the offload threshold</td>' in r.text
    assert "every part succeeded" in r.text
    row = re.search(r"<tr data-ns='t/a'>.*?</tr>", r.text, re.S).group(0)
    assert "data-value='2000'" in row and ">2.0 KiB<" in row
    assert "{&#34;" not in r.text and '{"' not in r.text.split("<body>", 1)[1].split("<script>")[0]  # no JSON dumps
    assert client.get(run_href()[7:] + "run.json").json()["nothing_due"][0]["namespace"] == "t/c"


def test_a_parts_try_with_its_detail(client: TestClient) -> None:
    """A try: headline, back to the run, the task instance and this try's log; detail.parquet's failed
    rows first."""
    r = client.get(run_href("offload.0", 1)[7:])
    assert r.status_code == 200
    assert '<b id="attempt">1</b> of 2' in r.text and "FAILED: 1 failure(s)" in r.text
    assert '(namespaces <span id="planned">t/a</span>)' in r.text  # the namespaces this shard was given
    assert f'id="back-to-run" href="{run_href()}"' in r.text
    assert f'href="/dags/{DAG}/runs/{quote(RUN, safe="")}/tasks/offload/mapped/0?try_number=1"' in r.text
    rows = re.findall(r"<tr( class=\"failed\" data-failed=\"1\")?><td>persistent://t/a/topic-0000</td><td>t/a</td>"
                      r"<td class=\"n\">(\d+)</td>", r.text.replace("\n", ""))
    assert rows == [(' class="failed" data-failed="1"', "2"), ("", "1")]  # the failed ledger first
    assert ">boom<" in r.text
    latest = client.get(run_href("offload.0")[7:])
    assert '<b id="attempt">2</b> of 2' in latest.text and "no failures" in latest.text
    assert client.get(run_href("offload.0", 1)[7:] + "summary.json").json()["attempt"] == 1
    missing = client.get(run_href("offload.0", 3)[7:])
    assert missing.status_code == 404 and "Attempt 3 wrote no report" in missing.text


def test_detail_rows_are_paged_failed_first(tmp_path: Path) -> None:
    cfg = Config.load(build_workspace(tmp_path / "ws", ["t/a"], ledgers=1), env={})
    reports = RunReports(cfg.reports_dir)
    rows = [detail_row(TOPIC, i, *(("failed", 0, f"error {i}") if i % 40 == 39 else ())) for i in range(120)]
    publish_try(reports, DAG, RUN, "offload", -1, 1, rows)
    c = mount(cfg)
    first = c.get(run_href("offload", 1)[7:]).text
    assert first.count("<tr class=\"failed\" data-failed=\"1\">") == 3  # 39, 79, 119 lead page 1
    assert len(re.findall(r"<tr[^>]*><td>persistent://", first)) == 50
    assert "1–50 of 120" in first and "detail_page=2" in first
    last = c.get(run_href("offload", 1)[7:] + "?detail_page=3").text
    assert len(re.findall(r"<tr[^>]*><td>persistent://", last)) == 20 and "← previous" in last and "next →" not in last


def test_run_lists_are_paged(tmp_path: Path) -> None:
    """2,000-report groups are not one table: 50 runs a page, newest first, next / previous."""
    cfg = Config.load(build_workspace(tmp_path / "ws", ["t/a"], ledgers=1), env={})
    reports = RunReports(cfg.reports_dir)
    for i in range(120):
        publish_try(reports, DAG, f"scheduled__{i:04d}", "offload", -1, 1, [detail_row(TOPIC, i)])
    c = mount(cfg)
    page1 = c.get(f"/reports/{DAG}/").text
    runs = re.findall(r'<tr data-run="([^"]*)"', page1)
    assert len(runs) == 50 and "1–50 of 120" in page1 and 'rel="next" href="?page=2"' in page1
    page3 = c.get(f"/reports/{DAG}/?page=3").text
    assert len(re.findall(r'<tr data-run="', page3)) == 20 and 'rel="prev" href="?page=2"' in page3
    assert set(runs).isdisjoint(re.findall(r'<tr data-run="([^"]*)"', page3))
    assert c.get(f"/reports/{DAG}/?page=99").status_code == 200  # clamped to the last page


@pytest.mark.parametrize("path", ["/reports/no_such_dag/", f"/reports/{DAG}/nope/",
                                  f"/reports/{DAG}/{quote(report_name(RUN))}/offload.0/attempt-x/",
                                  "/reports/..%2F..%2Fetc/", f"/reports/{DAG}/..%2F..%2Fws/summary.json",
                                  f"/reports/{DAG}/{quote(report_name(RUN))}/offload.0/attempt-9/summary.json",
                                  "/namespaces/no/such/", "/topics/persistent/t/a/no-such-topic/",
                                  "/topics/persistent/t/a/%2E%2E/", "/namespaces/t/%2E%2E/"])
def test_what_is_not_there_is_404(client: TestClient, path: str) -> None:
    assert client.get(path).status_code == 404


def test_html_in_names_is_text(tmp_path: Path) -> None:
    """A run id and a namespace holding markup are shown as text on every page that names them."""
    cfg = Config.load(build_workspace(tmp_path / "ws", ["t/a"], ledgers=1), env={})
    reports = RunReports(cfg.reports_dir)
    evil_run, evil_topic = "manual__<img src=x onerror=alert(1)>", "persistent://t/<b>x</b>/topic-'\""
    publish_try(reports, DAG, evil_run, "offload", -1, 1, [detail_row(evil_topic, 1, "failed", 0, "<script>x()</script>")])
    write_run_json(reports, DAG, evil_run, [("offload", -1, ["t/<b>x</b>"])],
                   [{"namespace": "t/<i>y</i>", "reason": "<script>alert(2)</script>"}])
    c = mount(cfg)
    key = quote(report_name(evil_run), safe="")
    for path in (f"/reports/{DAG}/", f"/reports/{DAG}/{key}/", f"/reports/{DAG}/{key}/offload/",
                 f"/reports/{DAG}/{key}/offload/attempt-1/"):
        r = c.get(path)
        assert r.status_code == 200, path
        body = r.text.split("<body>", 1)[1]
        assert "<img" not in body and "<b>x</b>" not in body and "<i>y</i>" not in body, path
        assert "<script>alert" not in body and "<script>x()" not in body, path
    run = c.get(f"/reports/{DAG}/{key}/").text
    assert "manual__&lt;img src=x onerror=alert(1)&gt;" in run and "&lt;script&gt;alert(2)&lt;/script&gt;" in run


def test_the_uis_tabs_land_on_the_report(client: TestClient) -> None:
    """The DAG run's and the task instance's "Tiered report" tabs: the run's report, the part's latest
    try (an unmapped task's page leaves {MAP_INDEX} unfilled), a page saying so when there is none."""
    r = client.get(f"/ui/run/{DAG}/{quote(RUN, safe='')}", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == run_href()
    r = client.get(f"/ui/task/{DAG}/{quote(RUN, safe='')}/offload/1", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == run_href("offload.1")
    r = client.get(f"/ui/task/{DAG}/{quote(RUN, safe='')}/plan/%7BMAP_INDEX%7D", follow_redirects=False)
    assert r.status_code == 404 and "No tiered report of task plan" in r.text and run_href() in r.text
    assert client.get(f"/ui/run/{DAG}/other-run", follow_redirects=False).status_code == 404


def test_overview_page_shows_tieredcore_numbers(client: TestClient, config: Config) -> None:
    now = END_MS + 3_600_000
    r = client.get(f"/overview?at={now}")
    assert r.status_code == 200
    with Workspace(config) as ws:
        ov = build_overview(ws, config.reports_dir, now, Prices.of(config))
    shown = cells(r.text)
    a = next(n for n in ov.namespaces if n.namespace == "t/a")
    assert shown[("t/a", "both_ledgers")] == ("n", "2", "2")
    for tier in ("hot", "both"):
        assert shown[("t/a", f"{tier}_bytes")] == ("n", str(a.tiers[tier]["bytes"]), human_bytes(a.tiers[tier]["bytes"]))
    assert shown[("t/a", "objects")][2] == "4" and shown[("t/b", "objects")][2] == "0"
    assert shown[("t/a", "requests_per_run")][2] == "GET 1, PUT 8"
    assert shown[("t/a", "cost_month")][1] == str(a.cost_month)
    assert shown[("*", "hot_ledgers")][2] == f"{ov.totals['tiers']['hot']['ledgers']:,}"
    assert f'data-now-ms="{now}"' in r.text and '<div id="tier-plot"' in r.text
    plot = json.loads(re.search(r'<script type="application/json" id="tier-data">(.*?)</script>', r.text).group(1))
    assert plot["x"] == [END_MS / 1000] and [s["tier"] for s in plot["series"]] == ["hot", "both", "cold"]
    assert 'src="/tiered/static/uplot-1.6.32/uPlot.iife.min.js"' in r.text
    assert '<a href="/tiered/namespaces/t/a/">t/a</a>' in r.text
    assert client.get(f"/overview.json?at={now}").json()["namespaces"][0]["namespace"] == "t/a"
    r = client.get("/overview?at=yesterday")
    assert r.status_code == 400 and "at 'yesterday'" in r.text


def test_the_attention_strip(client: TestClient, config: Config) -> None:
    """Offload lag over the threshold (t/a's third ledger due, not offloaded), a job's latest run that
    failed, a DAG's latest run with a failed or missing part: each a line linking where to look; nothing
    flagged under a higher threshold."""
    now = END_MS + 3 * 3_600_000
    with Workspace(config) as ws:
        ws.policies.set_namespace("t/a", {"offload_threshold_seconds": 0})  # every sealed ledger due
    items = re.findall(r'<li class="bad" data-kind="([a-z-]+)"><a href="([^"]*)">([^<]*)</a>',
                       client.get(f"/overview?at={now}&lag_alert=3600000").text)
    assert ("offload-lag", "/tiered/namespaces/t/a/") in [(k, h) for k, h, _ in items], items
    lag = next(t for k, _, t in items if k == "offload-lag")
    assert re.fullmatch(r"t/a: offload lag \d+ h( \d+ min)? \(over 1 h\)", lag), lag
    calm = client.get(f"/overview?at={now}&lag_alert={10**12}").text
    assert 'id="attention" class="calm"' in calm
    with Workspace(config) as ws:  # a deletion the drain gave up on: dead-lettered in the deletion log
        ws.deletion_log.append([DeletionRecord(topic="t/b/persistent/topic-0000", ledger_id=1, type="ledger",
                                               reason="retention", created_ms=1)])
        [entry] = ws.deletion_log.pending()
        ws.deletion_log.dead_letter(entry, "gave up")
    items = re.findall(r'<li class="bad" data-kind="([a-z-]+)"><a href="([^"]*)">([^<]*)</a>',
                       client.get(f"/overview?at={now}&lag_alert={10**12}").text)
    assert items == [("dead-letters", "/tiered/namespaces/t/b/", "t/b: 1 dead-lettered deletion(s)")]
    with Workspace(config) as ws:
        ws.deletion_log.drop([e.id for e in ws.deletion_log.dead_letters()])
    reports = RunReports(config.reports_dir)
    publish_try(reports, DAG, "scheduled__late", "offload", 0, 1, [detail_row(TOPIC, 3, "failed", 0, "store down")],
                as_of_ms=END_MS + 1)
    items = re.findall(r'<li class="bad" data-kind="([a-z-]+)"><a href="([^"]*)">([^<]*)</a>',
                       client.get(f"/overview?at={now}&lag_alert={10**12}").text)
    assert items == [("failed-run", f"/tiered/reports/{DAG}/scheduled__late/offload.0/",
                      "offload_sweep: run scheduled__late failed (1 failure(s))")]
    # the DAG's summary task recorded the run: a shard that wrote no report is flagged with the run
    write_run_json(reports, DAG, "scheduled__late", [("offload", 0, ["t/a"]), ("offload", 1, ["t/b"])], [])
    items = re.findall(r'<li class="bad" data-kind="([a-z-]+)"><a href="([^"]*)">([^<]*)</a>',
                       client.get(f"/overview?at={now}&lag_alert={10**12}").text)
    assert items[0] == ("failed-run", f"/tiered/reports/{DAG}/scheduled__late/",
                        f"{DAG}: run scheduled__late: part(s) offload.0, offload.1 failed or wrote no report")


def test_drill_down_to_a_topics_ledgers(client: TestClient, config: Config) -> None:
    """Overview → namespace → topic: each ledger with the positions `offload --up-to` takes, its tier,
    bytes and whether it is offloaded, as the topic's record has them."""
    ns = client.get("/namespaces/t/a/").text
    assert f'<a href="/tiered/topics/persistent/t/a/topic-0000/">{TOPIC}</a>' in ns
    r = client.get("/topics/persistent/t/a/topic-0000/")
    assert r.status_code == 200
    with Workspace(config) as ws:
        ledgers = sorted(ws.ml.get_topic(TOPIC)[0].ledgerInfo, key=lambda li: li.ledgerId)
    rows = re.findall(r'<tr data-ledger="(\d+)">.*?data-field="first">([^<]*)</td><td class="n" data-field="last">'
                      r'([^<]*)</td>\s*<td data-field="tier">(\w+)</td>.*?data-value=\'(\d+)\'.*?'
                      r'data-field="offloaded">(yes|no)</td>', r.text, re.S)
    assert [(int(i), f, la, t, int(b), o) for i, f, la, t, b, o in rows] == [
        (li.ledgerId, f"{li.ledgerId}:0" if li.entries else "—", f"{li.ledgerId}:{li.entries - 1}" if li.entries else "—",
         "both" if i < 2 else "hot", li.size, "yes" if i < 2 else "no") for i, li in enumerate(ledgers)]


def test_links_follow_where_the_app_is_mounted(config: Config) -> None:
    c = mount(config, "/elsewhere/tiered")
    r = c.get(run_href("offload.0")[7:])
    assert f'href="/elsewhere/tiered/reports/{DAG}/' in r.text and 'href="/elsewhere/tiered/overview"' in r.text
    assert f'data-ui href="/elsewhere/dags/{DAG}/runs/' in r.text
    assert '"/elsewhere/plugin/tiered-storage"' in r.text  # where a page opened on its own moves to
    assert c.get("/", follow_redirects=False).headers["location"] == "/elsewhere/tiered/overview"


def test_the_vendored_chart_library_is_the_pinned_one(client: TestClient) -> None:
    """plugins/static/vendor.json pins uPlot's version and each file's sha256 (from the npm tarball
    registry.npmjs.org/uplot/-/uplot-<version>.tgz, its integrity recorded); the files match and are served."""
    manifest = json.loads((PLUGINS / "static" / "vendor.json").read_text())["uplot"]
    d = PLUGINS / "static" / manifest["dir"]
    assert manifest["dir"] == f"uplot-{manifest['version']}" and manifest["license"] == "MIT"
    assert sorted(p.name for p in d.iterdir()) == sorted(manifest["sha256"])
    for name, digest in manifest["sha256"].items():
        assert hashlib.sha256((d / name).read_bytes()).hexdigest() == digest, name
    assert "MIT License" in (d / "LICENSE").read_text()
    r = client.get(f"/static/{manifest['dir']}/uPlot.iife.min.js")
    assert r.status_code == 200 and hashlib.sha256(r.content).hexdigest() == manifest["sha256"]["uPlot.iife.min.js"]
    assert client.get("/static/../vendor.json").status_code == 404


def test_overview_page_lists_unreadable_topic_records(client: TestClient, config: Config) -> None:
    """A topic whose record cannot be read is named on the page with its path and reason (and in the
    attention strip); the others are counted as before."""
    from tieredcore.meta.managed_ledgers import topic_path

    now = END_MS + 3_600_000
    before = client.get(f"/overview.json?at={now}").json()
    assert 'id="unreadable"' not in client.get(f"/overview?at={now}").text
    with Workspace(config) as ws:
        bad = ws.ml.list_topics("t/b")[0]
        ws.metadata.set(topic_path(bad), b"\x47\x78\x00\x00\x00\x02\x08\x02")  # header, metadata cut short
    r = client.get(f"/overview?at={now}")
    assert r.status_code == 200
    [item] = re.findall(r'<div id="unreadable" class="bad">.*?<li>([^<]*)</li>', r.text, re.S)
    assert item.startswith(f"{bad.full}: {topic_path(bad)}: ") and "missing required fields" in item
    assert 'data-kind="unreadable"><a href="/tiered/namespaces/t/b/">t/b: 1 topic record(s) cannot be read' in r.text
    doc = client.get(f"/overview.json?at={now}").json()
    assert doc["totals"]["unreadable_topics"] == 1
    a_before, a_after = ([n for n in d["namespaces"] if n["namespace"] == "t/a"][0] for d in (before, doc))
    assert a_after["tiers"] == a_before["tiers"] and a_after["unreadable_topics"] == []
    assert "cannot be read: " in client.get("/namespaces/t/b/").text


def _scrub_report(config: Config, run_id: str, as_of: int, deep: bool) -> None:
    """A scrub run in-process, its report written as the Spark job writes it (spark_jobs._jobkit.write_report,
    through RunReports)."""
    import argparse
    import time

    from spark_jobs._jobkit import Run, write_report
    from tieredcore.lifecycle.runner import run_work
    from tieredcore.lifecycle.scrub import plan_scrub
    from tieredcore.lifecycle.work import LedgerRunReport, RunSummary

    with Workspace(config) as ws:
        work = plan_scrub(ws, None, as_of, deep=deep, repair=False)
    rows = list(run_work(config, [w.as_dict() for w in work]))
    run = Run("scrub", argparse.Namespace(dry_run=True), config, as_of, run_id, config.reports_dir, time.monotonic())
    write_report(None, run, LedgerRunReport(RunSummary.of("scrub", run_id, as_of, True, rows, 0.0), rows), env={})


def test_overview_page_shows_the_latest_scrubs_message_counts(tmp_path: Path) -> None:
    """Per namespace, the Pulsar messages the latest scrub that checked them counted (a later shallow
    scrub checks none and changes nothing shown); damaged ones stand out; '—' where none were checked."""
    from tests.support import pulsar_objects
    from tieredcore.formats.keys import data_key
    from tieredcore.offload.context import context_uuid

    cfg = Config.load(build_workspace(tmp_path / "ws", ["t/a", "t/b", "t/c"], ledgers=3, entries=20, messages=True,
                                      config_overrides={"checksum_chunk": 0, "checkpoint_interval": 0}), env={})
    with Workspace(cfg) as ws:
        for ns in ("t/a", "t/b"):  # t/c: nothing offloaded, nothing scrubbed
            t = f"persistent://{ns}/topic-0000"
            offload(ws, t, sealed(ws, t), as_of=END_MS)
    _scrub_report(cfg, "s0", END_MS + 1, deep=True)
    with Workspace(cfg) as ws:
        li = ws.ml.get_topic("persistent://t/a/topic-0000")[0].ledgerInfo[1]
        key = data_key("", context_uuid(li), li.ledgerId)
        md, data = ws.store.head(key).metadata, bytearray(ws.store.get(key))
        pulsar_objects.flip_payload_byte(data, 7)
        ws.store.put(key, bytes(data), md)
        ws.hot.delete_ledger(li.ledgerId)
    _scrub_report(cfg, "s1", END_MS + 2, deep=True)
    _scrub_report(cfg, "s2", END_MS + 3, deep=False)

    server = __import__("fastapi").FastAPI()
    server.mount("/tiered", create_app(lambda: cfg, secured=False))
    client = TestClient(server, base_url="http://testserver/tiered")
    now = END_MS + 3_600_000
    r = client.get(f"/overview?at={now}")
    assert r.status_code == 200
    shown = {k: (cls, text) for k, (cls, _, text) in cells(r.text).items()}
    with Workspace(cfg) as ws:
        ov = build_overview(ws, cfg.reports_dir, now, Prices.of(cfg))
    a, b, c = ov.namespaces
    assert a.messages["run_id"] == "s1" and a.messages["messages_damaged"] == 1
    assert a.messages["messages_checked"] == 3 * 20 - 1 and b.messages["messages_checked"] == 3 * 20
    assert c.messages is None and ov.totals["messages"]["messages_checked"] == 6 * 20 - 1
    assert shown[("t/a", "messages_checked")] == ("n", "59") and shown[("t/a", "messages_damaged")] == ("n bad", "1")
    assert shown[("t/b", "messages_damaged")] == ("n", "0") and shown[("t/a", "not_messages")] == ("n", "0")
    assert shown[("t/c", "messages_checked")] == ("n", "—")
    assert shown[("*", "messages_checked")] == ("n", "119") and shown[("*", "messages_damaged")] == ("n bad", "1")
    # the scrub's own report page: the counters per namespace, the position of the damaged message
    r = client.get("/reports/scrub/s1/")  # a run outside Airflow: its one part is the run
    assert r.status_code == 200 and "messages_damaged 1" in r.text
    assert f"persistent://t/a/topic-0000 {li.ledgerId}:7" in r.text  # summary.json's damaged_messages


def test_the_overview_shows_exported_tables_and_their_lag(tmp_path: Path) -> None:
    """After `tiered export`, the view lists the table (its rows and bytes as the Iceberg snapshot says) and
    how far it is behind the offload: a ledger offloaded after the export is counted, its age is the lag."""
    from tieredcore.cli import main as cli
    from tieredcore.lifecycle.export import open_catalog
    from tieredcore.names import TopicName
    from tieredcore.query.scan import plan_scan, read_part

    cfg = Config.load(build_workspace(tmp_path / "ws", ["t/a"], ledgers=3, entries=20, messages=True), env={})
    with Workspace(cfg) as ws:
        ids = sealed(ws, TOPIC)
        offload(ws, TOPIC, ids[:2], as_of=END_MS)
        messages = sum(b.num_rows for p in plan_scan(ws, [TopicName.parse(TOPIC)]).parts
                       if p.ledger_id in ids[:2] for b in read_part(ws, p))
    client = mount(cfg)
    assert 'id="exports"' not in client.get(f"/overview?at={END_MS}").text  # no export yet: no section, no catalog
    assert not (tmp_path / "ws" / "iceberg").exists()
    assert cli.main(["--workspace", str(tmp_path / "ws"), "export", "--namespace", "t/a", "--as-of",
                     "2026-01-01T00:00:00Z"]) == 0
    with Workspace(cfg) as ws:
        offload(ws, TOPIC, ids[2:], as_of=END_MS + 60_000)
    now = END_MS + 3_600_000
    r = client.get(f"/overview?at={now}")
    assert r.status_code == 200 and 'id="exports"' in r.text
    shown = cells(r.text)
    table = "t_a.topic_0000"
    snap = open_catalog(cfg).load_table(("t_a", "topic_0000")).current_snapshot()
    assert shown[(table, "rows")] == ("n", str(messages), f"{messages:,}")
    assert shown[(table, "bytes")][1] == snap.summary["total-files-size"]
    assert shown[(table, "unexported_ledgers")][2] == "1"
    assert shown[(table, "export_lag")][1] == str(now - (END_MS + 60_000))
    assert shown[(table, "dlq_rows")][2] == "—"
    (row,) = client.get(f"/overview.json?at={now}").json()["exports"]
    assert (row["table"], row["rows"], row["topics"], row["unexported_ledgers"]) == (table, messages, 1, 1)


def test_a_read_replicas_overview_shows_its_lag(tmp_path: Path) -> None:
    """On a read replica the overview says so, with its lag behind the source's manifests: every topic's
    manifests unseen before the first sync (a table of them), up to date after it; also in overview.json."""
    from tieredcore.cli import main as cli

    src = Config.load(build_workspace(tmp_path / "src", ["t/a"], ledgers=3, entries=20), env={})
    with Workspace(src) as ws:
        offload(ws, TOPIC, sealed(ws, TOPIC), as_of=END_MS)
    rep = tmp_path / "replica"
    assert cli.main(["init", str(rep), "--replica-of", src.store_url]) == 0
    client = mount(Config.load(rep / "tiered.toml", env={}))
    r = client.get("/overview")
    assert r.status_code == 200 and 'id="replica"' in r.text
    assert "never synced" in r.text and "t/a/persistent/topic-0000" in r.text and 'id="replica-topics"' in r.text
    assert int(re.search(r'id="replica-lag" class="bad" data-behind="(\d+)"', r.text)[1]) >= 1
    assert cli.main(["--workspace", str(rep), "replica-sync"]) == 0
    r = client.get("/overview")
    assert 'data-behind="0"' in r.text and "up to date with the bucket" in r.text
    assert 'id="replica-topics"' not in r.text
    got = client.get("/overview.json").json()["replica"]
    assert got["behind"] == 0 and got["synced_ms"] > 0 and got["source"] == src.store_url
    # the source's own overview has no replica section
    assert 'id="replica"' not in mount(src).get("/overview").text
