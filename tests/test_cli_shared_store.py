"""Two workspaces on one object store (normal for Pulsar clusters sharing a bucket): neither ever records
or deletes the other's objects; two with the same cluster name are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.clihelp import _clean_env  # noqa: F401  (autouse)
from tieredcore.cli.main import main


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def objects(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and ".tiered" not in p.parts}


@pytest.fixture
def ws1(tmp_path: Path, capsys) -> Path:
    ws = tmp_path / "ws1"
    assert run(capsys, "init", str(ws))[0] == 0
    for args in (["generate", "--topics", "2", "--ledgers", "3", "--entries", "20"],
                 ["offload", "--namespace", "public/default", "--keep-bytes", "0"]):
        code, _, err = run(capsys, "--workspace", str(ws), *args)
        assert code == 0, err
    return ws


def test_another_cluster_on_the_same_store_touches_nothing(ws1: Path, tmp_path: Path, capsys) -> None:
    store = ws1 / "cold"
    before = objects(store)
    assert sum(k.endswith("-index") for k in before) == 6
    ws2 = tmp_path / "ws2"
    code, _, err = run(capsys, "init", str(ws2), "--store-url", store.as_uri(), "--cluster", "east")
    assert code == 0, err
    assert (store / "tiered-owner.east").is_file() and (store / "tiered-owner.standalone").is_file()

    code, out, err = run(capsys, "--workspace", str(ws2), "--json", "reconcile", "--grace", "0s")
    assert code == 0, err
    rep = json.loads(out)
    assert rep["orphan_groups"] == 0 and rep["records_appended"] == 0
    assert rep["foreign_cluster_groups"] == 6 and rep["foreign_cluster_objects"] == 12
    assert all("written by cluster 'standalone'" in s for s in rep["foreign_cluster_samples"])
    code, out, err = run(capsys, "--workspace", str(ws2), "--json", "deletions", "drain")
    assert code == 0 and json.loads(out)["deleted"] == 0
    assert objects(store) == {**before, "tiered-owner.east": objects(store)["tiered-owner.east"]}
    code, _, err = run(capsys, "--workspace", str(ws1), "verify")
    assert code == 0, err

    # a forged record in ws2's log naming ws1's objects: refused by the drain, counted, nothing deleted
    import uuid as uuidlib

    from tieredcore.config import Config
    from tieredcore.meta.deletion_log import DeletionLog, DeletionRecord
    from tieredcore.workspace import Workspace

    index = next(k for k in before if k.endswith("-index"))  # {uuid}-ledger-{id}-index
    u, lid = index[:36], int(index[len("-ledger-") + 36 : -len("-index")])
    with Workspace(Config.load(ws2 / "tiered.toml", env={})) as w2:
        DeletionLog(w2.metadata).append([DeletionRecord(
            topic="public/default/persistent/topic-0000", ledger_id=lid, type="offloaded", reason="orphan",
            created_ms=1, uuid=str(uuidlib.UUID(u)), driver={"name": "filesystem", "properties": {"root": str(store)}})])
    code, out, err = run(capsys, "--workspace", str(ws2), "--json", "deletions", "drain")
    res = json.loads(out)
    assert res["refused_foreign"] == 1 and res["deleted"] == 0 and res["stats"]["counters"]["refused_foreign"] == 1
    assert objects(store).keys() >= before.keys()


def test_the_same_cluster_name_on_the_same_store_is_refused(ws1: Path, tmp_path: Path, capsys) -> None:
    store = ws1 / "cold"
    before = objects(store)
    ws2 = tmp_path / "ws2"
    code, out, err = run(capsys, "init", str(ws2), "--store-url", store.as_uri())
    assert code == 2 and out == ""
    assert "already used by cluster 'standalone' of another workspace" in err
    assert str(ws1 / "metadata.db") in err and "--cluster" in err
    assert not ws2.exists()  # nothing created
    assert objects(store) == before
    # a workspace pointed at the store later (its configuration edited by hand) cannot offload or reconcile
    assert run(capsys, "init", str(ws2))[0] == 0
    cfg = (ws2 / "tiered.toml").read_text().replace((ws2 / "cold").as_uri(), store.as_uri())
    (ws2 / "tiered.toml").write_text(cfg)
    run(capsys, "--workspace", str(ws2), "generate", "--topics", "1", "--ledgers", "2", "--entries", "5",
        "--prefix", "other")
    code, out, err = run(capsys, "--workspace", str(ws2), "--json", "offload", "--namespace", "public/default",
                         "--keep-bytes", "0")
    assert code == 1
    assert all("StoreOwnershipError" in r["error"] for r in json.loads(out)["results"])
    code, out, err = run(capsys, "--workspace", str(ws2), "--json", "reconcile", "--grace", "0s")
    assert code == 1 and "already used by cluster 'standalone'" in json.loads(out)["errors"][0]
    assert objects(store) == before
