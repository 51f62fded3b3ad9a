"""The workflows on ZooKeeper metadata survive a ZooKeeper restart in their middle.

A real ZooKeeper server is killed and started again while an offload writes its objects, while a drain
deletes storage and while a reconciliation lists the store. Every metadata operation after that meets a
dropped connection (and, for writes, an unknown outcome settled by re-reading). Afterwards nothing is
lost (every entry reads back against the generator's digest) and nothing is orphaned (a reconciliation
finds no unreferenced storage; the deletion log is empty)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.support.clihelp import _clean_env  # noqa: F401  (autouse)
from tests.support.workspaces import END_MS, build_workspace
from tieredcore.cli.main import main
from tieredcore.cold.backends.fs import FilesystemBlobStore
from tieredcore.config import Config
from tieredcore.workspace import Workspace

pytestmark = pytest.mark.slow
# a month after both the workload and the objects' real mtimes: everything is old
LATER = str(max(END_MS, int(time.time() * 1000)) + 30 * 24 * 3600 * 1000)


def cli(capsys, ws: Path, *argv: str) -> tuple[int, dict | str]:
    code = main(["--workspace", str(ws), "--json", *argv])
    out, err = capsys.readouterr()
    try:
        return code, json.loads(out)
    except json.JSONDecodeError:
        return code, out + err


def restart_on_call(monkeypatch, zk_server, method: str, nth: int = 1) -> list[int]:
    """Restart ZooKeeper inside the nth call of FilesystemBlobStore.<method> (before it runs)."""
    calls: list[int] = []
    original = getattr(FilesystemBlobStore, method)

    def hooked(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == nth:
            zk_server.restart()
        return original(self, *args, **kwargs)

    monkeypatch.setattr(FilesystemBlobStore, method, hooked)
    return calls


@pytest.fixture
def ws(tmp_path: Path, zk_url: str) -> Path:
    root = tmp_path / "ws"
    build_workspace(root, ["acme/keep", "acme/trim"], topics=2, ledgers=4, entries=20,
                    config_overrides={"metadata_url": zk_url})
    return root


def assert_nothing_lost_nothing_orphaned(capsys, ws: Path, namespaces=("acme/keep", "acme/trim")) -> None:
    for ns in namespaces:
        code, out = cli(capsys, ws, "verify", "--namespace", ns)
        assert code == 0, out
    code, rep = cli(capsys, ws, "reconcile", "--grace", "0s", "--as-of", LATER, "--dry-run")
    assert code == 0, rep
    assert rep["orphan_groups"] == 0, rep
    code, stats = cli(capsys, ws, "deletions", "stats")
    assert code == 0 and stats["in_flight"] == 0 and stats["dead_letter"] == 0, stats


def offloaded_ledgers(ws: Path) -> int:
    with Workspace(Config.load(ws / "tiered.toml")) as w:
        return sum(li.offloadContext.complete for ns in ("acme/keep", "acme/trim")
                   for t in w.ml.list_topics(ns) for li in w.ml.get_topic(t)[0].ledgerInfo)


def test_restart_in_the_middle_of_an_offload(capsys, monkeypatch, ws, zk_server):
    calls = restart_on_call(monkeypatch, zk_server, "put", nth=3)
    code, out = cli(capsys, ws, "offload", "--keep-bytes", "0")
    assert code == 0, out
    assert len(calls) >= 3, "the restart did not happen inside the offload"
    assert offloaded_ledgers(ws) == 2 * 2 * 4  # every sealed ledger of both namespaces
    assert_nothing_lost_nothing_orphaned(capsys, ws)


def test_restart_in_the_middle_of_a_drain(capsys, monkeypatch, ws, zk_server):
    assert cli(capsys, ws, "offload", "--keep-bytes", "0")[0] == 0
    assert cli(capsys, ws, "policies", "set", "acme/trim", "--retention-time-minutes", "1")[0] == 0
    code, rep = cli(capsys, ws, "retention", "--namespace", "acme/trim", "--as-of", LATER)
    assert code == 0, rep
    calls = restart_on_call(monkeypatch, zk_server, "delete", nth=1)
    code, rep = cli(capsys, ws, "deletions", "drain", "--as-of", LATER)
    assert code == 0, rep
    assert len(calls) >= 1, "the restart did not happen inside the drain"
    assert rep["acknowledged"] >= 4, rep
    assert_nothing_lost_nothing_orphaned(capsys, ws, namespaces=("acme/keep",))
    assert offloaded_ledgers(ws) == 2 * 4  # acme/trim's sealed ledgers are gone, acme/keep's all stay


def test_restart_in_the_middle_of_a_reconciliation(capsys, monkeypatch, ws, zk_server):
    assert cli(capsys, ws, "offload", "--keep-bytes", "0")[0] == 0
    with Workspace(Config.load(ws / "tiered.toml")) as w:  # forget one ledger's copy: its objects are orphans
        topic = w.ml.list_topics("acme/keep")[0]
        w.ml.update_topic(topic, lambda info: info.ledgerInfo[0].ClearField("offloadContext"))
    calls = restart_on_call(monkeypatch, zk_server, "list", nth=1)
    code, rep = cli(capsys, ws, "reconcile", "--grace", "0s", "--as-of", LATER)
    assert code == 0, rep
    assert len(calls) >= 1
    assert rep["orphan_groups"] == 1 and rep["records_appended"] == 1, json.dumps(rep)
    superseded = rep["manifests_superseded"]  # topic manifests beyond the newest three (docs/recovery.md)
    code, again = cli(capsys, ws, "reconcile", "--grace", "0s", "--as-of", LATER)
    assert code == 0 and again["records_appended"] == 0, again  # recorded once, not twice
    assert again["manifests_superseded"] == 0, again
    code, rep = cli(capsys, ws, "deletions", "drain", "--as-of", LATER)
    assert code == 0 and rep["acknowledged"] == 1 + superseded, rep
    assert_nothing_lost_nothing_orphaned(capsys, ws)
