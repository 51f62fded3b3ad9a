"""`tiered init --replica-of` and what a read replica serves or refuses (docs/recovery.md "Read replicas"), on
the embedded filesystem store: reads work; every write gets one line naming the replica and its source, exit 2,
and changes nothing, neither in the replica's workspace nor in the bucket it follows."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.clihelp import END_ISO, Cli, assert_usage_error, snapshot
from tieredcore.config import CONFIG_FILE_NAME, Config

NS = "public/default"
T0 = f"{NS}/topic-0000"


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def pair(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> tuple[Cli, Cli]:
    monkeypatch.setenv("TIERED_NO_PROGRESS", "1")
    src = Cli(tmp_path / "source", capsys)
    assert src("init", str(src.root), workspace=False)[0] == 0
    code, _, err = src("generate", "--namespace", NS, "--topics", "2", "--ledgers", "3", "--entries", "10",
                       "--entry-size", "20-100", "--keys", "4", "--end-time", END_ISO)
    assert code == 0, err
    assert src("offload", "--namespace", NS, "--keep-bytes", "0")[0] == 0
    rep = Cli(tmp_path / "replica", capsys)
    res = rep.json("init", str(rep.root), "--replica-of", f"file://{src.root / 'cold'}", workspace=False)
    assert res["cluster"] == "standalone"
    cfg = Config.load(rep.root / CONFIG_FILE_NAME, env={})
    assert cfg.replica and cfg.replica_of == cfg.store_url == f"file://{src.root / 'cold'}"
    assert rep.json("replica-sync")["created"] == [f"{NS}/persistent/topic-0000", f"{NS}/persistent/topic-0001"]
    return src, rep


def test_replica_serves_reads(pair: tuple[Cli, Cli]) -> None:
    src, rep = pair
    res = rep.json("verify")
    assert res["failed"] == 0 and [t["ok"] for t in res["topics"]] == [True, True]
    theirs = src.json("read", T0, "--show", "hex")["entries"]
    ours = rep.json("read", T0, "--show", "hex")["entries"]
    assert ours and ours == theirs[:len(ours)]
    assert rep.json("read", T0, "--compacted", "--messages", expect=0) is not None
    assert rep("policies", "get", NS)[0] == 0
    assert rep("deletions", "stats")[0] == 0
    code, out, _ = rep("status")
    assert code == 0 and "read replica of file://" in out and "up to date" in out


REFUSED = [
    ("offload", "--namespace", NS, "--keep-bytes", "0"),
    ("offload", "--namespace", NS, "--streaming"),
    ("generate", "--namespace", "x/y"),
    ("compact-topic", T0),
    ("compact", "--namespace", NS),
    ("retention", "--namespace", NS),
    ("deletions", "drain"),
    ("deletions", "dlq", "drop", "--all"),
    ("reconcile", "--apply"),
    ("topics", "delete", T0, "--yes"),
    ("policies", "set", NS, "--offload-threshold-bytes", "0"),
    ("policies", "delete", NS),
    ("recover", "--apply"),
    ("recover", "--merge", "--apply"),
    ("scrub", "--repair"),
    ("export", "--namespace", NS),
]


@pytest.mark.parametrize("argv", REFUSED, ids=lambda a: " ".join(a[:2]))
def test_every_write_is_refused_and_changes_nothing(pair: tuple[Cli, Cli], argv: tuple[str, ...]) -> None:
    src, rep = pair
    bucket, before = src.root / "cold", snapshot(rep.root)
    objects = tree(bucket)
    result = rep(*argv)
    assert_usage_error(result, argv[0], "read replica of file://", "(cluster 'standalone')",
                       "tiered replica-sync")
    assert snapshot(rep.root) == before
    assert tree(bucket) == objects


def test_sync_follows_a_deleted_topic(pair: tuple[Cli, Cli]) -> None:
    src, rep = pair
    assert src("topics", "delete", T0, "--yes")[0] == 0
    objects = tree(src.root / "cold")
    res = rep.json("replica-sync")
    assert res["removed"] == [f"{NS}/persistent/topic-0000"]
    assert tree(src.root / "cold") == objects
    assert [t["topic"] for t in rep.json("status")["topics"]] == [f"persistent://{NS}/topic-0001"]


def test_init_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str], pair: tuple[Cli, Cli]) -> None:
    src, _ = pair
    url = f"file://{src.root / 'cold'}"
    # a second cluster writing manifests under the same prefix: the replica must be told which
    other = Cli(tmp_path / "other", capsys)
    assert other("init", str(other.root), "--store-url", url, "--cluster", "east", workspace=False)[0] == 0
    code, _, err = other("generate", "--namespace", NS, "--topics", "1", "--ledgers", "2", "--entries", "5")
    assert code == 0, err
    assert other("offload", "--namespace", NS, "--keep-bytes", "0")[0] == 0
    objects = tree(src.root / "cold")
    new = Cli(tmp_path / "r2", capsys)
    assert_usage_error(new("init", str(new.root), "--replica-of", url, workspace=False), "init",
                       "2 clusters: east, standalone", "--cluster")
    assert_usage_error(new("init", str(new.root), "--replica-of", url, "--cluster", "west", workspace=False),
                       "init", "no topic manifests of cluster 'west'", "east, standalone")
    assert_usage_error(new("init", str(new.root), "--replica-of", f"file://{tmp_path / 'empty'}",
                           workspace=False), "init", "no topic manifests under")
    assert_usage_error(new("init", str(new.root), "--replica-of", url, "--store-url", url, workspace=False),
                       "init", "no --store-url")
    assert not new.root.exists() and tree(src.root / "cold") == objects
    res = new.json("init", str(new.root), "--replica-of", url, "--cluster", "east", workspace=False)
    assert res["cluster"] == "east"
    assert new.json("replica-sync")["created"] == [f"{NS}/persistent/topic-0000"]
    assert new.json("verify")["failed"] == 0
    assert tree(src.root / "cold") == objects
    # not a replica: replica-sync says so; init --replica-of over an existing workspace is refused
    assert_usage_error(src("replica-sync"), "replica-sync", "not a read replica")
    before = snapshot(src.root)
    assert_usage_error(src("init", str(src.root), "--replica-of", url, workspace=False), "init",
                       "is not a read replica", "--force")
    assert snapshot(src.root) == before
    assert new.json("init", str(new.root), workspace=False)["replica_of"] == url  # rerun: kept as it is
