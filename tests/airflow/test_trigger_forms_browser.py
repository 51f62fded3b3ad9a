"""The trigger forms in a real browser: headless Chromium (Playwright) on the real `airflow api-server`
of test_ui_browser.py, the DAGs stored as the DAG processor stores them. A valid trigger creates a run;
an invalid value (a bad namespace name, a size like "64Q") is refused in the form with the format's
words (never a regex) and no run exists afterwards (asked through the REST API); `tiered_offload_topic`
offers one mode, so both can never be given; `tiered_key_rotation` triggers with its defaults;
`tiered_topic_compaction` refuses a bad threshold or topic name and triggers for a topic named.
Screenshots: tests/artifacts/ui/ (gitignored)."""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from .conftest import make_workspace
from .test_ui_browser import ARTIFACTS, PASSWORD, _chromium, api_server, login


def store_dags() -> None:
    """The DAGs in the metadata database, as the DAG processor writes them (the API server reads them)."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import BundleDagBag, sync_bag_to_db

    manager = DagBundlesManager()
    manager.sync_bundles_to_db()
    for bundle in manager.get_all_dag_bundles():
        if not bundle.is_initialized:
            bundle.initialize()
        bag = BundleDagBag(dag_folder=bundle.path, bundle_path=bundle.path, bundle_name=bundle.name)
        assert not bag.import_errors, bag.import_errors
        sync_bag_to_db(bag, bundle.name, bundle.version)


class Api:
    """Airflow's REST API as the admin user (a token from the auth manager's login endpoint)."""

    def __init__(self, base: str) -> None:
        self.base = base
        login = urllib.request.Request(f"{base}/auth/token", method="POST",
                                       headers={"Content-Type": "application/json"},
                                       data=json.dumps({"username": "admin", "password": PASSWORD}).encode())
        with urllib.request.urlopen(login, timeout=10) as r:
            self.token = json.loads(r.read())["access_token"]

    def runs(self, dag_id: str) -> list[dict[str, Any]]:
        req = urllib.request.Request(f"{self.base}/api/v2/dags/{dag_id}/dagRuns?limit=100&order_by=-id",  # newest first
                                     headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())["dag_runs"]


def trigger_form(page, base: str, dag_id: str):
    """The DAG's trigger dialog (Single Run), its form filled with the DAG's defaults."""
    page.goto(f"{base}/dags/{dag_id}")
    page.get_by_role("button", name="Trigger").first.click()
    dialog = page.get_by_role("dialog")
    dialog.get_by_text("Run Parameters").wait_for()
    return dialog


def choose(dialog, page, field: str, option: str) -> None:
    """Picks ``option`` in a drop-down field of the form."""
    dialog.locator(f"input[name=element_{field}]").locator("xpath=ancestor::div[1]").click()
    page.get_by_role("option", name=option).click()


@pytest.mark.slow
def test_trigger_forms_refuse_bad_input_before_a_run_exists(tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    chromium = _chromium()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    home = Path(os.environ["AIRFLOW_HOME"])
    cfg = make_workspace(tmp_path / "ws", ["public/default"], topics=1, ledgers=2, entries=10)
    store_dags()
    with api_server(home, cfg, tmp_path / "api-server.log") as starting:
        base = starting.wait()
        api = Api(base)
        # runs other tests of the session left in the shared Airflow database: only new runs count here
        before = {d: {r["dag_run_id"] for r in api.runs(d)}
                  for d in ("tiered_offload_topic", "tiered_offload_sweep", "tiered_key_rotation",
                            "tiered_topic_compaction")}

        def new_runs(dag_id: str) -> list[dict[str, Any]]:
            return [r for r in api.runs(dag_id) if r["dag_run_id"] not in before[dag_id]]

        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                login(page, base)

                # tiered_offload_topic: one mode drop-down (both modes can never be given), one value field
                dialog = trigger_form(page, base, "tiered_offload_topic")
                button = dialog.get_by_role("button", name="Trigger")
                assert dialog.locator("input[name=element_up_to], input[name=element_keep_bytes]").count() == 0
                assert dialog.locator("input[name=element_mode]").count() == 1
                expect(button).to_be_disabled()  # topic and value are required
                dialog.locator("#element_topic").fill("public/default/topic-0000")
                choose(dialog, page, "mode", "Keep at most this size hot")
                value = dialog.locator("#element_value")
                assert value.evaluate("e => e.tagName") == "INPUT"  # single line, not a JSON editor
                value.fill("64Q")
                expect(button).to_be_enabled()
                button.click()
                error = dialog.get_by_text("is not a 'position LEDGER:ENTRY")
                error.wait_for()
                shown = dialog.inner_text()
                page.screenshot(path=str(ARTIFACTS / "trigger-form-refused.png"), full_page=True)
                assert "'64Q' is not a 'position LEDGER:ENTRY (e.g. 12:0) for mode up_to, or a size" in shown
                assert "[0-9]" not in shown and "^" not in shown, shown  # no regex
                assert new_runs("tiered_offload_topic") == []

                # a valid value: the run exists, with the form's mode and value (the refusal's toast covers
                # the button for a while: the click goes to the button itself)
                value.fill("64M")
                button.dispatch_event("click")
                page.wait_for_url("**/dags/tiered_offload_topic/runs/**")
                [run] = new_runs("tiered_offload_topic")
                assert run["conf"]["mode"] == "keep_bytes" and run["conf"]["value"] == "64M", run
                assert run["conf"]["topic"] == "public/default/topic-0000"

                # a bad namespace name in a sweep's list: refused, no run
                dialog = trigger_form(page, base, "tiered_offload_sweep")
                namespaces = dialog.locator("#element_namespaces")
                namespaces.fill("public/default\nno-slash")
                dialog.get_by_role("button", name="Trigger").click()
                dialog.get_by_text("'no-slash' is not a 'namespace name: tenant/namespace").wait_for()
                page.screenshot(path=str(ARTIFACTS / "trigger-form-bad-namespace.png"), full_page=True)
                assert new_runs("tiered_offload_sweep") == []

                # tiered_key_rotation with its documented defaults (Target key empty: the active key)
                dialog = trigger_form(page, base, "tiered_key_rotation")
                button = dialog.get_by_role("button", name="Trigger")
                expect(button).to_be_enabled()
                assert dialog.locator("#element_target").input_value() == ""
                button.click()
                page.wait_for_url("**/dags/tiered_key_rotation/runs/**")
                [run] = new_runs("tiered_key_rotation")
                assert run["conf"].get("target") is None, run

                # tiered_topic_compaction: a size like "10Q" and a bad topic name are refused in the form; a
                # topic named with the other defaults (retain keyless off) triggers a run
                dialog = trigger_form(page, base, "tiered_topic_compaction")
                button = dialog.get_by_role("button", name="Trigger")
                expect(button).to_be_enabled()  # every param has a default: the policy's topics
                dialog.locator("#element_threshold").fill("10Q")
                button.click()
                dialog.get_by_text("'10Q' is not a 'size: bytes, or a number with K, M or G").wait_for()
                assert new_runs("tiered_topic_compaction") == []
                dialog.locator("#element_threshold").fill("")
                dialog.locator("#element_topics").fill("public/default/topic-0000\npublic/no-topic-part")
                button.dispatch_event("click")
                dialog.get_by_text("'public/no-topic-part' is not a 'topic name: tenant/namespace/topic").wait_for()
                page.screenshot(path=str(ARTIFACTS / "trigger-form-topic-compaction.png"), full_page=True)
                assert new_runs("tiered_topic_compaction") == []
                dialog.locator("#element_topics").fill("public/default/topic-0000")
                button.dispatch_event("click")
                page.wait_for_url("**/dags/tiered_topic_compaction/runs/**")
                [run] = new_runs("tiered_topic_compaction")
                assert run["conf"]["topics"] == ["public/default/topic-0000"], run
                assert run["conf"]["retain_null_key"] is False and not run["conf"].get("threshold"), run
            finally:
                browser.close()
