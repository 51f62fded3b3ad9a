"""Read replicas (docs/recovery.md "Read replicas"): a source workspace on moto S3 runs its workload (generate,
offload, topic compaction, topic deletion, the deletion drain) while a replica of its bucket syncs after every
change, a day of hourly syncs: the bucket's listing (keys, ETags, sizes) is identical before and after each
sync, the replica reads every entry of every topic byte-identical to the source, and a deleted topic
disappears from it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.clihelp import Cli, snapshot
from tests.support.workspaces import END_ISO
from tieredcore.errors import ReplicaReadOnlyError
from tieredcore.lifecycle.replica import SYNCED_PROPERTY, lag, sync
from tieredcore.names import TopicName
from tieredcore.offload.compacted_state import compaction_state
from tieredcore.offload.context import is_complete, is_offloaded
from tieredcore.workspace import Workspace

KEYED = "acme/keys"
SYNCS = 24  # a day of hourly syncs


def bucket_listing(s3_store) -> dict[str, tuple[str, int]]:
    """Every object of the bucket: key -> (ETag, size), straight from S3's listing."""
    out: dict[str, tuple[str, int]] = {}
    for page in s3_store.client.get_paginator("list_objects_v2").paginate(Bucket=s3_store.bucket):
        for o in page.get("Contents", []):
            out[o["Key"]] = (o["ETag"], o["Size"])
    return out


def all_topics(ws: Workspace) -> list[TopicName]:
    return [t for ns in ws.ml.list_namespaces() for t in ws.ml.list_topics(ns)]


def offloaded_ledgers(ws: Workspace, t: TopicName) -> list[int]:
    info, _ = ws.ml.get_topic(t)
    return [li.ledgerId for li in info.ledgerInfo if is_complete(li) or is_offloaded(li)]


def assert_reads_match(src: Workspace, rep: Workspace) -> int:
    """Every topic of the source with offloaded ledgers is on the replica with exactly those ledgers, and every
    entry (and the compacted view) reads byte-identical on both; returns the entries compared."""
    n = 0
    src_topics = {t.managed_ledger_name: t for t in all_topics(src) if offloaded_ledgers(src, t)}
    rep_topics = {t.managed_ledger_name: t for t in all_topics(rep)}
    assert sorted(rep_topics) == sorted(src_topics)
    sr, rr = src.reader(), rep.reader()
    try:
        for name, t in sorted(src_topics.items()):
            ledgers = offloaded_ledgers(src, t)
            info, _ = rep.ml.get_topic(t)
            assert [li.ledgerId for li in info.ledgerInfo] == ledgers
            theirs = [(p, bytes(d)) for p, d in sr.read(t) if p.ledger_id in ledgers]
            ours = [(p, bytes(d)) for p, d in rr.read(t)]
            assert ours == theirs and ours, name
            n += len(ours)
            if compaction_state(src.ml.get_topic(t)[0]) is not None:
                assert [(p, bytes(d)) for p, d in rr.read_compacted(t)] == \
                    [(p, bytes(d)) for p, d in sr.read_compacted(t)]
    finally:
        sr.close()
        rr.close()
    return n


@pytest.fixture
def source(tmp_path: Path, capsys: pytest.CaptureFixture[str], s3_store, moto_endpoint: str,
           monkeypatch: pytest.MonkeyPatch) -> tuple[Cli, str]:
    monkeypatch.setenv("TIERED_NO_PROGRESS", "1")
    url = f"s3://{s3_store.bucket}/tiered?endpoint={moto_endpoint}&region=us-east-1"
    cli = Cli(tmp_path / "source", capsys)
    assert cli("init", str(cli.root), "--store-url", url, workspace=False)[0] == 0
    return cli, url


def generate(cli: Cli, ns: str, *extra: str) -> None:
    code, _, err = cli("generate", "--namespace", ns, "--topics", "2", "--ledgers", "3", "--entries", "15",
                       "--entry-size", "40-200", "--end-time", END_ISO, *extra)
    assert code == 0, err
    code, _, err = cli("offload", "--namespace", ns, "--keep-bytes", "0")
    assert code == 0, err


def test_a_day_of_syncs_never_changes_the_bucket_and_reads_match(source, s3_store, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    src, url = source
    generate(src, KEYED, "--keys", "5")
    generate(src, "public/default")
    rep = Cli(tmp_path / "replica", capsys)
    before = bucket_listing(s3_store)
    res = rep.json("init", str(rep.root), "--replica-of", url, workspace=False)
    assert res["cluster"] == "standalone" and res["replica_of"] == url
    assert bucket_listing(s3_store) == before  # init reads only

    deleted: list[str] = []
    compared = 0
    ever: set[str] = set(before)
    for i in range(SYNCS):
        step = i % 6
        if step == 1:
            assert src("compact-topic", f"{KEYED}/topic-0000")[0] == 0
        elif step == 2:
            victim = ["public/default/topic-0001", f"{KEYED}/topic-0001", "public/default/topic-0000"][
                len(deleted) % 3]
            if victim not in deleted:
                code, _, err = src("topics", "delete", victim, "--yes")
                assert code == 0, err
                deleted.append(victim)
        elif step == 3:
            generate(src, f"day/ns{i}")
        elif step == 4:  # due now: the deleted topics' objects and the replaced compacted ledgers go
            code, _, err = src("deletions", "drain", "--as-of", "2099-01-01T00:00:00Z")
            assert code == 0, err
        # steps 0 and 5: the source does nothing, the sync has nothing to do
        before = bucket_listing(s3_store)
        ever |= set(before)
        res = rep.json("replica-sync")
        assert bucket_listing(s3_store) == before, f"sync {i} changed the bucket"
        assert res["lag"]["behind"] == 0
        with Workspace(src.config()) as s, Workspace(rep.config()) as r:
            compared += assert_reads_match(s, r)
            names = {t.managed_ledger_name for t in all_topics(r)}
            for victim in deleted:
                assert TopicName.parse(victim).managed_ledger_name not in names
        if i and step in (0, 5):
            assert not (res["created"] or res["replaced"] or res["removed"])
    assert len(deleted) >= 3 and compared > 1000
    assert ever - set(bucket_listing(s3_store))  # the source's drain deleted objects during the day
    # a sync with nothing new changes nothing on the replica either
    snap = snapshot(rep.root)
    assert rep.json("replica-sync")["unchanged"] > 0
    after = snapshot(rep.root)
    assert {k: v for k, v in after.items() if k != "meta:/tiered/replica"} == \
        {k: v for k, v in snap.items() if k != "meta:/tiered/replica"}


def test_lag_shows_unseen_manifests(source, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, url = source
    generate(src, "public/default")
    rep = Cli(tmp_path / "replica", capsys)
    assert rep("init", str(rep.root), "--replica-of", url, workspace=False)[0] == 0
    st = rep.json("status")["replica"]
    # never synced: every manifest of both topics unseen (one per offload commit)
    assert st["synced_ms"] == 0 and sum(1 for t in st["topics"] if t["behind"]) == 2
    assert st["behind"] >= 2 and st["sequences_behind"] == sum(t["newest"] + 1 for t in st["topics"])
    rep.json("replica-sync")
    assert rep.json("status")["replica"]["behind"] == 0
    generate(src, "more/ns")  # two more topics, each with manifests the replica has not seen
    res = rep.json("status")["replica"]
    assert res["behind"] >= 2 and res["unseen_age_ms"] >= 0
    lagging = {t["topic"] for t in res["topics"] if t["behind"]}
    assert lagging == {"more/ns/persistent/topic-0000", "more/ns/persistent/topic-0001"}
    code, out, _ = rep("status")
    assert code == 0 and "read replica of" in out and "behind on 2 topic(s)" in out
    rep.json("replica-sync")
    assert rep.json("status")["replica"]["behind"] == 0


def test_sync_is_crash_safe_and_never_writes_through_the_workspace(source, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    src, url = source
    generate(src, "public/default")
    generate(src, "other/ns")
    rep = Cli(tmp_path / "replica", capsys)
    assert rep("init", str(rep.root), "--replica-of", url, workspace=False)[0] == 0

    class Crash(Exception):
        pass

    def crash_at_third(step: str, topic: str, seen: list[str] = []) -> None:  # noqa: B006 - a counter
        seen.append(step)
        if len(seen) == 3:
            raise Crash

    with Workspace(rep.config()) as ws, pytest.raises(Crash):
        sync(ws, on_step=crash_at_third)
    with Workspace(rep.config()) as ws:
        first = sync(ws)  # the rerun completes what the crash left
        assert len(first.created) + len(first.replaced) <= 4 and not first.removed
        again = sync(ws)
        assert not (again.created or again.replaced or again.removed) and again.unchanged == 4
        assert lag(ws).behind == 0
        for t in all_topics(ws):
            info, _ = ws.ml.get_topic(t)
            assert any(kv.key == SYNCED_PROPERTY for kv in info.properties)
        # the workspace's own stores refuse writes: the metadata store, the bucket
        with pytest.raises(ReplicaReadOnlyError, match="read replica of"):
            ws.ml.delete_topic(all_topics(ws)[0])
        with pytest.raises(ReplicaReadOnlyError, match="read replica of"):
            ws.store.put("tiered/x", b"x")
        with pytest.raises(ReplicaReadOnlyError, match="read replica of"):
            ws.store.delete(["tiered/x"])
        with pytest.raises(ReplicaReadOnlyError, match="read replica of"):
            ws.hot.create_ledger()  # no hot tier of its own
        assert ws.hot.list_ledgers() == []
    with Workspace(src.config()) as s, Workspace(rep.config()) as r:
        assert assert_reads_match(s, r) > 0
