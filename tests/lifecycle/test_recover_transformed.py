"""Disaster drill for `tiered recover` on transformed topics (docs/recovery.md, docs/keys.md): a namespace
whose ledgers are stored compressed and encrypted in chunks (zstd+aes, a key ring) loses its metadata
store; recovery from the manifests gives back the records with their transform and key ids, and every
entry reads back byte-identical with the same key ring. Without manifests, chunked pairs cannot be
recovered from index objects (their index object is chunked too): recovery says so per object, exit 1,
and creates nothing it cannot read."""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path

import pytest

from tests.lifecycle.test_recover import read_all
from tests.support.workspaces import END_MS, build_workspace
from tieredcore.cli import main as cli
from tieredcore.cold.blob import iter_objects
from tieredcore.cold.keyring import KeyRing
from tieredcore.config import Config
from tieredcore.formats.keys import is_topic_manifest_key
from tieredcore.lifecycle.recover import recover
from tieredcore.lifecycle.runner import run_work
from tieredcore.lifecycle.sweep import plan_offload
from tieredcore.offload.context import context_driver, driver_dict
from tieredcore.workspace import Workspace

T0, T1 = "persistent://t/x/topic-0000", "persistent://t/x/topic-0001"


def view(li) -> tuple:
    dm = context_driver(li)
    return li.ledgerId, li.entries, li.size, li.offloadContext.complete, dm and driver_dict(dm)


@pytest.fixture
def transformed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TIERED_NO_PROGRESS", "1")
    ring = tmp_path / "ring"
    KeyRing.add_key(ring, "kek-1", bits=2048)
    cfg = build_workspace(tmp_path / "ws", ["t/x"], topics=2, ledgers=3, entries=30, entry_size="200-3000",
                          config_overrides={"key_ring": str(ring)})
    with Workspace(Config.load(cfg, env={})) as ws:
        ws.policies.set_namespace("t/x", {"offload_threshold_bytes": 0, "transform": "zstd+aes",
                                          "transform_chunk_size": 8192})
        rows = list(run_work(ws.config, [u.as_dict() for u in plan_offload(ws, None, END_MS)]))
        assert rows and {r["outcome"] for r in rows} == {"offloaded"}
        records = {t: ws.ml.get_topic(t)[0] for t in (T0, T1)}
        entries = {t: read_all(ws, t) for t in (T0, T1)}
    for info in records.values():  # the drill is about chunked objects: every sealed ledger is one
        offloaded = [li for li in info.ledgerInfo if li.offloadContext.complete]
        props = [driver_dict(context_driver(li))["properties"] for li in offloaded]
        assert offloaded and all(p.get("tieredTransform") == "zstd+aes" for p in props), props
    return cfg, records, entries


@pytest.mark.parametrize("metadata", ["sqlite", "zookeeper"])
def test_transformed_topics_come_back_from_their_manifests(transformed, metadata, request) -> None:
    cfg, records, entries = transformed
    os.remove(cfg.parent / "metadata.db")
    config = Config.load(cfg, env={})
    if metadata == "zookeeper":
        config = dataclasses.replace(config, metadata_url=request.getfixturevalue("zk_url"))
    with Workspace(config) as ws:
        listing = sorted((o.key, o.size) for o in iter_objects(ws.manifests.store))
        rep = recover(ws, apply=True)
        assert [(t.topic.rsplit("/", 1)[1], t.source, t.action) for t in rep.topics] == \
            [("topic-0000", "manifest", "created"), ("topic-0001", "manifest", "created")]
        assert rep.not_recoverable == rep.unreadable == rep.orphans == []
        for t in (T0, T1):
            got = ws.ml.get_topic(t)[0]
            want = records[t]
            assert [view(li) for li in got.ledgerInfo] == [view(li) for li in want.ledgerInfo]
            got_entries = read_all(ws, t)
            assert got_entries == entries[t]
            assert hashlib.sha256(b"".join(d for _, d in got_entries)).digest() == \
                hashlib.sha256(b"".join(d for _, d in entries[t])).digest()
        # read from the object store alone: the transformed copies themselves, decrypted with the ring
        for t in (T0, T1):
            info = ws.ml.get_topic(t)[0]
            for li in info.ledgerInfo:
                if li.offloadContext.complete:
                    ws.hot.delete_ledger(li.ledgerId)
        if metadata == "sqlite":  # the CLI reads the workspace's file (ZooKeeper: the same reads above)
            assert cli.main(["--workspace", str(cfg.parent), "verify", "--offloaded-only"]) == 0
        for t in (T0, T1):
            assert read_all(ws, t) == entries[t]  # the hot copies gone: every entry from the chunked objects
        assert sorted((o.key, o.size) for o in iter_objects(ws.manifests.store)) == listing  # bucket untouched


def test_without_manifests_chunked_pairs_are_reported_not_recovered(transformed, capsys) -> None:
    cfg, _, _ = transformed
    os.remove(cfg.parent / "metadata.db")
    with Workspace(Config.load(cfg, env={})) as ws:
        store = ws.manifests.store
        store.delete([o.key for o in iter_objects(store) if is_topic_manifest_key(o.key, "")])
        rep = recover(ws, apply=True)
        assert rep.topics == []  # nothing it cannot read is created
        said = rep.not_recoverable + rep.unreadable
        assert said, rep.as_dict()
        ledgers = {li.ledgerId for t in (T0, T1) for li in transformed[1][t].ledgerInfo
                   if li.offloadContext.complete}
        assert {lid for lid in ledgers if any(f"-ledger-{lid}" in s for s in said)} == ledgers
    capsys.readouterr()
    assert cli.main(["--workspace", str(cfg.parent), "recover"]) == 1  # dry run: the same, exit 1
    out = capsys.readouterr().out
    assert out.count("a transformed (chunked) pair is recovered from manifests only") == len(ledgers), out
