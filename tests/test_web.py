"""The plugin's web pages (plugins/tiered_web.py) through FastAPI's TestClient, without Airflow (its auth
dependency is off here; tests/airflow/test_ui_browser.py checks it behind the real API server): report
listings, an attempt's summary rendered and raw, the run level showing the latest attempt, names that
are not report names refused, and the overview page's numbers and plot."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.support.workspaces import END_MS, build_workspace, offload, sealed
from tieredcore.config import Config
from tieredcore.lifecycle.overview import Prices, build_overview
from tieredcore.workspace import Workspace

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"
if str(PLUGINS) not in sys.path:
    sys.path.append(str(PLUGINS))

from tiered_web import age, create_app  # noqa: E402

TOPIC = "persistent://t/a/topic-0000"


@pytest.fixture
def config(tmp_path: Path) -> Config:
    cfg = Config.load(build_workspace(tmp_path / "ws", ["t/a", "t/b"]), env={})
    with Workspace(cfg) as ws:
        offload(ws, TOPIC, sealed(ws, TOPIC)[:2], as_of=END_MS)
    run = Path(cfg.reports_dir) / "offload_sweep" / "r1.t+a"
    for attempt, failures in ((1, 2), (2, 0)):
        doc = {"job": "offload_sweep", "run_id": "r1.t+a", "attempt": attempt, "as_of_ms": END_MS, "seconds": 1.5,
               "dry_run": False, "outcomes": {"offloaded": 2},
               "totals": {"failures": failures, "ledgers": 2, "bytes": 2000,
                          "namespaces": {"t/a": {"ledgers": 2, "bytes": 2000, "failures": failures,
                                                 "outcomes": {"offloaded": 2}}}},
               "requests": {"total": {"GET": 1, "PUT": 8, "LIST": 0, "DELETE": 0},
                            "namespaces": {"t/a": {"GET": 1, "PUT": 8, "LIST": 0, "DELETE": 0}}},
               "tiers": {"t/a": {"hot": {"ledgers": 2, "bytes": 1000}, "both": {"ledgers": 2, "bytes": 2000},
                                 "cold": {"ledgers": 0, "bytes": 0}, "objects": 4}}}
        (run / f"attempt-{attempt}").mkdir(parents=True)
        (run / f"attempt-{attempt}" / "summary.json").write_text(json.dumps(doc))
    (run / "summary.json").write_text(json.dumps(doc))  # the latest attempt's copy
    return cfg


@pytest.fixture
def client(config: Config) -> TestClient:
    """The app mounted under /tiered, as Airflow's API server mounts a plugin's app."""
    from fastapi import FastAPI

    server = FastAPI()
    server.mount("/tiered", create_app(lambda: config, secured=False))
    return TestClient(server, base_url="http://testserver/tiered")


def test_report_pages(client: TestClient) -> None:
    r = client.get("/reports/")
    assert r.status_code == 200 and "/tiered/reports/offload_sweep/" in r.text
    r = client.get("/reports/offload_sweep/")
    assert r.status_code == 200 and "/tiered/reports/offload_sweep/r1.t%2Ba/" in r.text and "1, 2" in r.text
    # the run level: its latest attempt, with links to every attempt
    r = client.get("/reports/offload_sweep/r1.t+a/")
    assert r.status_code == 200
    assert re.search(r"attempt <b id='attempt'>2</b> of 2", r.text) and "no failures" in r.text
    assert "/tiered/reports/offload_sweep/r1.t%2Ba/attempt-1/" in r.text
    assert "<tr data-ns='t/a'><td>t/a</td><td class='n'>2</td><td class='n'>2,000</td>" in r.text
    assert "<th>as_of_ms</th><td>2026-01-01T00:00:00+00:00" in r.text  # times readable
    # an earlier attempt is still there, as it was
    r = client.get("/reports/offload_sweep/r1.t+a/attempt-1/")
    assert r.status_code == 200 and "FAILED: 2 failure(s)" in r.text
    assert client.get("/reports/offload_sweep/r1.t+a/attempt-1/summary.json").json()["attempt"] == 1
    assert client.get("/reports/offload_sweep/r1.t+a/summary.json").json()["attempt"] == 2
    # an attempt that wrote nothing says so and links the ones that did
    r = client.get("/reports/offload_sweep/r1.t+a/attempt-3/")
    assert r.status_code == 404 and "Attempt 3 wrote no report" in r.text and "attempt-2/" in r.text


@pytest.mark.parametrize("path", ["/reports/no_such_job/", "/reports/offload_sweep/nope/",
                                  "/reports/offload_sweep/r1.t+a/attempt-x/", "/reports/..%2F..%2Fetc/",
                                  "/reports/offload_sweep/..%2F..%2Fws/summary.json",
                                  "/reports/offload_sweep/r1.t+a/attempt-9/summary.json"])
def test_what_is_not_a_report_is_404(client: TestClient, path: str) -> None:
    assert client.get(path).status_code == 404


def test_overview_page_shows_tieredcore_numbers(client: TestClient, config: Config) -> None:
    now = END_MS + 3_600_000
    r = client.get(f"/overview?at={now}")
    assert r.status_code == 200
    with Workspace(config) as ws:
        ov = build_overview(ws, config.reports_dir, now, Prices.of(config))
    cells = dict(((ns, f), v) for ns, f, v in re.findall(
        r"<td class='n' data-ns='([^']*)' data-field='([a-z_]+)'(?: data-value='[^']*')?>([^<]*)</td>", r.text))
    a = next(n for n in ov.namespaces if n.namespace == "t/a")
    assert cells[("t/a", "both_ledgers")] == "2" and cells[("t/a", "both_bytes")] == f"{a.tiers['both']['bytes']:,}"
    assert cells[("t/a", "hot_bytes")] == f"{a.tiers['hot']['bytes']:,}"
    assert cells[("t/a", "objects")] == "4" and cells[("t/b", "objects")] == "0"
    assert cells[("t/a", "requests_per_run")] == "GET 1, PUT 8"
    assert cells[("t/a", "cost_month")] == f"${a.cost_month:,.4f}"
    assert cells[("*", "hot_ledgers")] == f"{ov.totals['tiers']['hot']['ledgers']:,}"
    assert f"data-now-ms='{now}'" in r.text and "<svg id='tier-plot'" in r.text and r.text.count("<polyline") == 3
    assert client.get(f"/overview.json?at={now}").json()["namespaces"][0]["namespace"] == "t/a"
    r = client.get("/overview?at=yesterday")
    assert r.status_code == 400 and "at 'yesterday'" in r.text


def test_links_follow_where_the_app_is_mounted(config: Config) -> None:
    from fastapi import FastAPI

    server = FastAPI()
    server.mount("/elsewhere/tiered", create_app(lambda: config, secured=False))
    c = TestClient(server)
    r = c.get("/elsewhere/tiered/reports/offload_sweep/r1.t+a/")
    assert "href='/elsewhere/tiered/reports/offload_sweep/r1.t%2Ba/attempt-1/'" in r.text
    assert "href='/elsewhere/tiered/overview'" in r.text
    assert c.get("/elsewhere/tiered/", follow_redirects=False).headers["location"] == "/elsewhere/tiered/overview"


def test_ages() -> None:
    assert [age(None), age(59_000), age(3_660_000), age(90_000_000)] == ["—", "0m 59s", "1h 1m", "1d 1h"]


def test_overview_page_lists_unreadable_topic_records(client: TestClient, config: Config) -> None:
    """A topic whose record cannot be read is named on the page with its path and reason; the others
    are counted as before."""
    from tieredcore.meta.managed_ledgers import topic_path

    now = END_MS + 3_600_000
    before = client.get(f"/overview.json?at={now}").json()
    assert "id='unreadable'" not in client.get(f"/overview?at={now}").text
    with Workspace(config) as ws:
        bad = ws.ml.list_topics("t/b")[0]
        ws.metadata.set(topic_path(bad), b"\x47\x78\x00\x00\x00\x02\x08\x02")  # header, metadata cut short
    r = client.get(f"/overview?at={now}")
    assert r.status_code == 200
    [item] = re.findall(r"<div id='unreadable' class='bad'>.*?<li>([^<]*)</li>", r.text)
    assert item.startswith(f"{bad.full}: {topic_path(bad)}: ") and "missing required fields" in item
    doc = client.get(f"/overview.json?at={now}").json()
    assert doc["totals"]["unreadable_topics"] == 1
    a_before, a_after = ([n for n in d["namespaces"] if n["namespace"] == "t/a"][0] for d in (before, doc))
    assert a_after["tiers"] == a_before["tiers"] and a_after["unreadable_topics"] == []


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
    cells = {(ns, f): (cls, v) for cls, ns, f, v in re.findall(
        r"<td class='(n(?: bad)?)' data-ns='([^']*)' data-field='(messages_checked|messages_damaged|not_messages)'"
        r">([^<]*)</td>", r.text)}
    with Workspace(cfg) as ws:
        ov = build_overview(ws, cfg.reports_dir, now, Prices.of(cfg))
    a, b, c = ov.namespaces
    assert a.messages["run_id"] == "s1" and a.messages["messages_damaged"] == 1
    assert a.messages["messages_checked"] == 3 * 20 - 1 and b.messages["messages_checked"] == 3 * 20
    assert c.messages is None and ov.totals["messages"]["messages_checked"] == 6 * 20 - 1
    assert cells[("t/a", "messages_checked")] == ("n", "59") and cells[("t/a", "messages_damaged")] == ("n bad", "1")
    assert cells[("t/b", "messages_damaged")] == ("n", "0") and cells[("t/a", "not_messages")] == ("n", "0")
    assert cells[("t/c", "messages_checked")] == ("n", "—")
    assert cells[("*", "messages_checked")] == ("n", "119") and cells[("*", "messages_damaged")] == ("n bad", "1")
    # the scrub's own report page: the counters per namespace, the position of the damaged message
    r = client.get("/reports/scrub/s1/")
    assert r.status_code == 200 and "messages_damaged 1" in r.text
    assert f"persistent://t/a/topic-0000 {li.ledgerId}:7" in r.text  # summary.json's damaged_messages
