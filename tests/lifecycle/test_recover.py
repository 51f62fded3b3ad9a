"""Disaster drills for `tiered recover` (docs/recovery.md), on SQLite: a workspace with plain, compacted and
streaming topics loses its metadata store; recovery from the bucket alone gives back every record and
every entry byte for byte. The same with damaged and deleted manifests (fallback to the index objects,
reported), with a crash at every step of recover (the rerun completes, nothing duplicated), and bad input
(one line, exit 2, nothing written)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import uuid as uuidlib
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.workspaces import build_workspace, offload, sealed, stream
from tieredcore.cli import main as cli
from tieredcore.cold.blob import iter_objects
from tieredcore.config import Config
from tieredcore.errors import ValidationError
from tieredcore.formats.keys import index_key, is_topic_manifest_key, parse_topic_manifest_key
from tieredcore.formats.mlinfo import ManagedLedgerInfo
from tieredcore.formats.topic_manifest import decode_topic_manifest
from tieredcore.lifecycle.drain import drain
from tieredcore.lifecycle.reconcile.run import reconcile
from tieredcore.lifecycle.recover import MARKER_PATH, recover
from tieredcore.lifecycle.retention import delete_topic, trim_topic
from tieredcore.lifecycle.topic_compaction import compact_topic, compacted_entries, offloader_for_state
from tieredcore.names import TopicName
from tieredcore.offload.compacted_state import compaction_state
from tieredcore.offload.context import context_uuid
from tieredcore.offload.manifests import SEQUENCE_BASE_PROPERTY
from tieredcore.offload.ownership import read_identity
from tieredcore.offload.streaming import WATERMARK_KEY
from tieredcore.workspace import Workspace

A0, A1 = "persistent://t/a/topic-0000", "persistent://t/a/topic-0001"  # compacted; plain
S0, S1 = "persistent://t/s/topic-0000", "persistent://t/s/topic-0001"  # segments; hot only (never offloaded)
ML = {t: t.replace("persistent://", "").replace("/topic", "/persistent/topic") for t in (A0, A1, S0, S1)}
NOW = 1_900_000_000_000  # reconciliation's clock: every object is old enough


@dataclass
class Before:
    cfg: Path
    records: dict[str, ManagedLedgerInfo]
    entries: dict[str, list[tuple[str, bytes]]]
    compacted: list[tuple[int, int, bytes]]
    policy: dict
    identity: str


def read_all(ws: Workspace, topic: str) -> list[tuple[str, bytes]]:
    r = ws.reader()
    try:
        return [(str(p), bytes(d)) for p, d in r.read(topic)]
    finally:
        r.close()


def digest(entries: list[tuple[str, bytes]]) -> str:
    h = hashlib.sha256()
    for p, d in entries:
        h.update(p.encode() + b"\0" + d)
    return h.hexdigest()


def compacted_of(ws: Workspace, topic: str) -> list[tuple[int, int, bytes]]:
    st = compaction_state(ws.ml.get_topic(topic)[0])
    assert st is not None and st.uuid
    return [(lid, eid, bytes(d)) for lid, eid, d in compacted_entries(offloader_for_state(ws, st), st)]


def without_base(info: ManagedLedgerInfo) -> ManagedLedgerInfo:
    """The record but recovery's manifest sequence base and the streaming watermark (a scheduling hint
    written outside the protocol's commits, so no manifest holds it: docs/recovery.md)."""
    out = ManagedLedgerInfo()
    out.CopyFrom(info)
    keep = [kv for kv in out.properties if kv.key not in (SEQUENCE_BASE_PROPERTY, WATERMARK_KEY)]
    del out.properties[:]
    out.properties.extend(keep)
    return out


@pytest.fixture
def before(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Before:
    monkeypatch.setenv("TIERED_NO_PROGRESS", "1")
    cfg = build_workspace(tmp_path / "ws", ["t/a", "t/s"], topics=2, ledgers=4, entries=12, messages=True,
                          open_entries=3)
    with Workspace(Config.load(cfg, env={})) as ws:
        ws.policies.set_namespace("t/a", {"offload_threshold_bytes": 0, "retention_time_minutes": 10_000})
        offload(ws, A0, sealed(ws, A0))
        compact_topic(ws, A0)
        offload(ws, A1, sealed(ws, A1))
        stream(ws, S0, max_segment_size=1500)
        return Before(cfg, {t: ws.ml.get_topic(t)[0] for t in (A0, A1, S0)},
                      {t: read_all(ws, t) for t in (A0, A1, S0, S1)}, compacted_of(ws, A0),
                      ws.ml.get_policies("t/a"), ws.identity)


def lose_metadata(b: Before) -> Workspace:
    os.remove(b.cfg.parent / "metadata.db")
    return Workspace(Config.load(b.cfg, env={}))


def manifest_keys(ws: Workspace, topic: str) -> list[str]:
    """The topic's manifest keys, oldest first."""
    found = [(parse_topic_manifest_key(o.key, "", "standalone"), o.key) for o in iter_objects(ws.manifests.store)
             if is_topic_manifest_key(o.key, "")]
    return [k for p, k in sorted(found) if p is not None and p[0] == ML[topic]]


def test_recover_everything_from_manifests(before: Before) -> None:
    b = before
    with lose_metadata(b) as ws:
        listing = sorted((o.key, o.size) for o in iter_objects(ws.manifests.store))
        dry = recover(ws)
        assert [t.topic for t in dry.topics] == sorted(ML[t] for t in (A0, A1, S0))
        assert {t.source for t in dry.topics} == {"manifest"} and not ws.ml.list_namespaces()  # dry: nothing
        rep = recover(ws, apply=True)
        assert [t.action for t in rep.topics] == ["created"] * 3
        assert rep.damaged_manifests == rep.stale_manifests == rep.orphans == rep.not_recoverable == []
        for t, info in b.records.items():
            got = ws.ml.get_topic(t)[0]
            assert without_base(got) == without_base(info), t  # the record itself, field for field
        for t in (A0, A1, S0):
            got = read_all(ws, t)
            assert got == b.entries[t] and digest(got) == digest(b.entries[t])
        assert not ws.ml.exists(S1)  # hot only: nothing in the bucket knows it (docs/recovery.md)
        assert compacted_of(ws, A0) == b.compacted
        assert ws.ml.get_policies("t/a") == b.policy
        assert read_identity(ws.metadata) == b.identity  # the objects' owner: drain and reconcile take them as ours
        # the bucket is untouched, and reconciliation finds nothing foreign nor orphaned in it
        assert sorted((o.key, o.size) for o in iter_objects(ws.manifests.store)) == listing
        r = reconcile(ws, NOW, 0, dry_run=True)
        assert r.errors == [] and r.orphan_groups == 0 and r.foreign_cluster_groups == 0
        # manifests after recovery continue the topic's sequence
        old_newest = parse_topic_manifest_key(manifest_keys(ws, A1)[-1], "", "standalone")[1]
        info, _ = ws.ml.get_topic(A1)
        ws.topic_offloader().offload_ledgers(A1, [])  # nothing to do, nothing written
        assert parse_topic_manifest_key(manifest_keys(ws, A1)[-1], "", "standalone")[1] == old_newest
        ws.ml.after_offloaded_change(TopicName.parse(A1), info, 1)  # the record's first change after recovery
        assert parse_topic_manifest_key(manifest_keys(ws, A1)[-1], "", "standalone")[1] > old_newest
        # a second recovery is refused: the store is not empty any more
        with pytest.raises(ValidationError, match="not empty"):
            recover(ws, apply=True)


def test_damaged_and_deleted_manifests_fall_back_to_index_objects(before: Before) -> None:
    b = before
    with lose_metadata(b) as ws:
        store = ws.manifests.store
        every = [k for t in (A0, A1, S0) for k in manifest_keys(ws, t)]
        a1 = manifest_keys(ws, A1)
        damaged, deleted = a1[-1], a1[-2]  # 2 of the manifests (>= 10%)
        assert len(every) <= 20
        raw = bytearray(store.get(damaged))
        raw[len(raw) // 2] ^= 0xFF
        store.put(damaged, bytes(raw))
        store.delete([deleted])
        rep = recover(ws, apply=True)
        assert [k.split(":")[0] for k in rep.damaged_manifests] == [damaged]
        plan = {t.topic: t for t in rep.topics}[ML[A1]]
        assert plan.source == "manifest" and plan.from_index == sealed(ws, A1)[-2:]  # offloaded after it
        got = ws.ml.get_topic(A1)[0]
        for li, want in zip(got.ledgerInfo, b.records[A1].ledgerInfo, strict=True):
            assert (li.ledgerId, li.entries, li.size, context_uuid(li), li.offloadContext.complete) == \
                (want.ledgerId, want.entries, want.size, context_uuid(want), want.offloadContext.complete)
        for t in (A0, A1, S0):
            assert read_all(ws, t) == b.entries[t]


def test_a_topic_without_manifests_comes_back_from_its_index_objects(before: Before) -> None:
    b = before
    # a crashed second attempt at ledger 0 that wrote both objects (never committed): the latest wins
    lid0 = b.records[A1].ledgerInfo[0].ledgerId
    first = context_uuid(b.records[A1].ledgerInfo[0])
    again = str(uuidlib.uuid4())
    with Workspace(Config.load(b.cfg, env={})) as ws, ws.hot.open_ledger(lid0) as h:
        ws.offloader.offload(h, again, {"managedledgername": ML[A1]})
    with lose_metadata(b) as ws:
        ws.manifests.store.delete(manifest_keys(ws, A1))
        rep = recover(ws, apply=True)
        plan = {t.topic: t for t in rep.topics}[ML[A1]]
        assert plan.source == "index" and plan.from_index == [li.ledgerId for li in b.records[A1].ledgerInfo[:-1]]
        assert any(index_key("", first, lid0) in o for o in rep.orphans)  # reported, never deleted
        assert ws.manifests.store.head(index_key("", first, lid0)).size > 0
        got = ws.ml.get_topic(A1)[0]
        assert context_uuid(got.ledgerInfo[0]) == again
        offloaded = b.records[A1].ledgerInfo[:-1]  # the open ledger is hot only: no object knows it
        assert [(li.ledgerId, li.entries, li.size) for li in got.ledgerInfo] == \
            [(li.ledgerId, li.entries, li.size) for li in offloaded]
        n = sum(li.entries for li in offloaded)
        assert read_all(ws, A1) == b.entries[A1][:n]
        for t in (A0, S0):
            assert read_all(ws, t) == b.entries[t]


def test_hot_ledgers_gone_are_restored_cold_only(before: Before) -> None:
    b = before
    with lose_metadata(b) as ws:
        sealed_ids = [li.ledgerId for li in b.records[A1].ledgerInfo[:-1]]
        open_id = b.records[A1].ledgerInfo[-1].ledgerId
        for lid in (*sealed_ids, open_id):
            ws.hot.delete_ledger(lid)
        rep = recover(ws, apply=True)
        plan = {t.topic: t for t in rep.topics}[ML[A1]]
        assert plan.cold_only == sealed_ids and plan.lost == [open_id]
        got = ws.ml.get_topic(A1)[0]
        assert all(li.offloadContext.bookkeeperDeleted for li in got.ledgerInfo)
        assert [li.ledgerId for li in got.ledgerInfo] == sealed_ids
        assert read_all(ws, A1) == b.entries[A1][:sum(li.entries for li in b.records[A1].ledgerInfo[:-1])]


STEPS = ["marker", "namespace-policy", "topic", "topic", "topic", "done"]


@pytest.mark.parametrize("crash_at", range(len(STEPS)))
def test_a_crash_at_every_step_then_a_rerun_completes(before: Before, crash_at: int) -> None:
    b = before
    with lose_metadata(b) as ws:
        seen: list[str] = []

        def step(name: str, _topic: str) -> None:
            seen.append(name)
            if len(seen) - 1 == crash_at:
                raise RuntimeError(f"injected crash before {name}")

        with pytest.raises(RuntimeError, match="injected"):
            recover(ws, apply=True, on_step=step)
        assert seen[-1] == STEPS[crash_at]
        rep = recover(ws, apply=True)  # no --merge needed: the marker says a recovery is under way
        assert sorted(t.topic for t in rep.topics) == sorted(ML[t] for t in (A0, A1, S0))
        for t, info in b.records.items():
            assert without_base(ws.ml.get_topic(t)[0]) == without_base(info)
            assert read_all(ws, t) == b.entries[t]
        assert sorted(str(t) for ns in ws.ml.list_namespaces() for t in ws.ml.list_topics(ns)) == \
            sorted([A0, A1, S0])  # nothing duplicated, nothing extra
        assert b'"done"' in ws.metadata.get(MARKER_PATH).value
        with pytest.raises(ValidationError, match="not empty"):
            recover(ws, apply=True)


def test_a_record_created_meanwhile_is_kept_and_the_others_created(before: Before) -> None:
    """Records are created in batches, one transaction each: a topic another writer created between the
    plan and the write makes its batch fall back to one create per topic, keeping that record as it is."""
    b = before
    with lose_metadata(b) as ws:
        mine = ManagedLedgerInfo()
        mine.properties.add(key="writer", value="someone else")

        def step(name: str, topic: str) -> None:
            if name == "topic" and topic == ML[A1]:
                ws.ml.create_topic(A1, mine)

        rep = recover(ws, apply=True, on_step=step)
        assert {t.topic: t.action for t in rep.topics} == {ML[A0]: "created", ML[A1]: "exists", ML[S0]: "created"}
        assert ws.ml.get_topic(A1)[0] == mine
        for t in (A0, S0):
            assert without_base(ws.ml.get_topic(t)[0]) == without_base(b.records[t])
            assert read_all(ws, t) == b.entries[t]


def test_a_superseded_compacted_ledger_is_an_orphan(before: Before) -> None:
    """A second compaction supersedes the first compacted ledger (its objects wait in the deletion log):
    recovery restores the topic's pointer to the new one from the manifest and reports the old pair as an
    orphan, not as something it could not recover."""
    from tieredcore.clock import now_ms
    from tieredcore.formats.messages import OutMessage, encode_message
    from tieredcore.topic.writer import TopicWriter

    b = before
    with Workspace(Config.load(b.cfg, env={})) as ws:
        old = compaction_state(ws.ml.get_topic(A0)[0])
        w = TopicWriter(ws.ml, ws.hot, A0)
        w.append_many([encode_message(OutMessage(payload=b"v%d" % i, key=f"k{i}"), producer="t", sequence_id=10**9 + i,
                                      publish_time=now_ms()) for i in range(3)])
        w.close()
        compact_topic(ws, A0)
        new = compaction_state(ws.ml.get_topic(A0)[0])
        assert new.ledger_id != old.ledger_id
    with lose_metadata(b) as ws:
        rep = recover(ws, apply=True)
        assert rep.not_recoverable == [] and rep.unreadable == []
        assert [o for o in rep.orphans if index_key("", old.uuid, old.ledger_id) in o] == [
            f"{index_key('', old.uuid, old.ledger_id)} ({ML[A0]} ledger {old.ledger_id}: a compacted ledger its "
            "topic's manifest does not name: superseded)"]
        assert compaction_state(ws.ml.get_topic(A0)[0]) == new


def test_merge_never_overwrites_a_record(before: Before) -> None:
    b = before
    with lose_metadata(b) as ws:
        recover(ws, apply=True)
        ws.ml.delete_topic(A0)
        info, version = ws.ml.get_topic(A1)
        info.properties.add(key="newer", value="yes")
        ws.ml.put_topic(A1, info, version)
        rep = recover(ws, apply=True, merge=True)
        assert {t.topic: t.action for t in rep.topics} == {ML[A0]: "created", ML[A1]: "exists", ML[S0]: "exists"}
        assert {kv.key: kv.value for kv in ws.ml.get_topic(A1)[0].properties}["newer"] == "yes"
        assert without_base(ws.ml.get_topic(A0)[0]) == without_base(b.records[A0])


def test_bad_input_is_one_line_exit_2_and_writes_nothing(before: Before, tmp_path: Path, capsys) -> None:
    b = before
    ws_dir = str(b.cfg.parent)
    # a store with records, without --merge
    assert cli.main(["--workspace", ws_dir, "recover", "--apply"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not empty" in err[0]
    # a bucket with nothing of this format
    empty = tmp_path / "empty"
    cfg = build_workspace(empty, ["t/x"], ledgers=1)
    os.remove(empty / "metadata.db")
    capsys.readouterr()
    assert cli.main(["--workspace", str(empty), "recover", "--apply"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nothing to recover" in err[0]
    with Workspace(Config.load(cfg, env={})) as ws:
        assert not ws.ml.list_namespaces() and ws.metadata.get(MARKER_PATH) is None
    # the dry run from the command line: one line per topic and a summary, exit 0, nothing written
    os.remove(b.cfg.parent / "metadata.db")
    assert cli.main(["--workspace", ws_dir, "recover"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 4 and out[-1].startswith("would create 3 topic(s)")
    with Workspace(Config.load(b.cfg, env={})) as ws:
        assert not ws.ml.list_namespaces()
    assert cli.main(["--workspace", ws_dir, "recover", "--apply"]) == 0


def test_recover_into_zookeeper(before: Before, zk_url: str) -> None:
    """The same records through the same metadata-store Protocol, into a ZooKeeper ensemble (Pulsar's
    /managed-ledgers layout): a lost SQLite store's workspace moves to ZooKeeper by recovering there."""
    b = before
    os.remove(b.cfg.parent / "metadata.db")
    cfg = dataclasses.replace(Config.load(b.cfg, env={}), metadata_url=zk_url)
    with Workspace(cfg) as ws:
        rep = recover(ws, apply=True)
        assert [t.action for t in rep.topics] == ["created"] * 3
        for t, info in b.records.items():
            assert without_base(ws.ml.get_topic(t)[0]) == without_base(info)
            assert read_all(ws, t) == b.entries[t]
        assert compacted_of(ws, A0) == b.compacted
        assert read_identity(ws.metadata) == b.identity
        with pytest.raises(ValidationError, match="not empty"):
            recover(ws)


def test_a_topic_whose_manifests_were_never_written(before: Before, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every manifest write of a topic failed (a crash after each commit, before its manifest): recovery
    rebuilds the topic from its index objects."""
    b = before
    with Workspace(Config.load(b.cfg, env={})) as ws:
        real_put = ws.manifests.store.put

        def put(key, data, metadata=None, **kw):
            if is_topic_manifest_key(key, ""):
                raise OSError("injected: crashed before the manifest")
            return real_put(key, data, metadata, **kw)

        monkeypatch.setattr(ws.manifests.store, "put", put)
        offload(ws, S1, sealed(ws, S1))
        offloaded = ws.ml.get_topic(S1)[0].ledgerInfo[:-1]
        want = read_all(ws, S1)[:sum(li.entries for li in offloaded)]
    with lose_metadata(b) as ws:
        assert manifest_keys(ws, S1) == []
        rep = recover(ws, apply=True)
        plan = {t.topic: t for t in rep.topics}[ML[S1]]
        assert plan.source == "index" and plan.from_index == [li.ledgerId for li in offloaded]
        assert [context_uuid(li) for li in ws.ml.get_topic(S1)[0].ledgerInfo] == [context_uuid(li) for li in offloaded]
        assert read_all(ws, S1) == want
        for t in (A0, A1, S0):
            assert read_all(ws, t) == b.entries[t]


def test_stale_manifests_naming_drained_objects_are_skipped(before: Before, monkeypatch: pytest.MonkeyPatch) -> None:
    """A trim whose manifest write was lost, then drained: every manifest of the topic names ledger 0's
    deleted objects. They are reported stale and the topic comes back from its index objects, without
    ledger 0."""
    b = before
    lid0 = b.records[A1].ledgerInfo[0].ledgerId
    with Workspace(Config.load(b.cfg, env={})) as ws:
        real_put = ws.manifests.store.put

        def put(key, data, metadata=None, **kw):
            if is_topic_manifest_key(key, ""):
                raise OSError("injected: crashed before the manifest")
            return real_put(key, data, metadata, **kw)

        monkeypatch.setattr(ws.manifests.store, "put", put)
        ws.policies.set_namespace("t/a", {"retention_time_minutes": 0})
        rows = trim_topic(ws, A1, NOW, ledgers=[lid0])
        assert [(r.ledger, r.outcome) for r in rows] == [(lid0, "trimmed")]
        assert drain(ws, NOW).deleted >= 1
        kept = ws.ml.get_topic(A1)[0].ledgerInfo[:-1]
        want = read_all(ws, A1)[:sum(li.entries for li in kept)]
    with lose_metadata(b) as ws:
        rep = recover(ws, apply=True)
        assert len(rep.stale_manifests) == len(manifest_keys(ws, A1)) and ML[A1] in rep.fallback_topics
        plan = {t.topic: t for t in rep.topics}[ML[A1]]
        assert plan.source == "index" and plan.from_index == [li.ledgerId for li in kept]
        assert read_all(ws, A1) == want


def test_a_deleted_topic_is_not_brought_back(before: Before) -> None:
    """Topic deletion writes a tombstone manifest after the record is gone: recovery reports the topic as
    deleted and its objects (the drain has not deleted them yet) as orphans, and does not recreate it."""
    b = before
    with Workspace(Config.load(b.cfg, env={})) as ws:
        res = delete_topic(ws, A1, NOW)
        assert res.deleted and not ws.ml.exists(A1)
        newest = manifest_keys(ws, A1)[-1]
        assert decode_topic_manifest(ws.manifests.store.get(newest)).deleted
    with lose_metadata(b) as ws:
        rep = recover(ws, apply=True)
        assert rep.deleted_topics == [ML[A1]] and ML[A1] not in {t.topic for t in rep.topics}
        assert len([o for o in rep.orphans if "the topic was deleted" in o]) == len(b.records[A1].ledgerInfo) - 1
        assert not ws.ml.exists(A1)
        for t in (A0, S0):
            assert read_all(ws, t) == b.entries[t]


def test_refused_or_dry_recover_leaves_no_metadata_file(before: Before, tmp_path: Path, capsys) -> None:
    """A lost SQLite store stays lost when recovery is refused (a bucket with nothing of this format) or
    only planned: no empty metadata file is left behind; --apply creates it."""
    empty = tmp_path / "empty"
    build_workspace(empty, ["t/x"], ledgers=1)
    os.remove(empty / "metadata.db")
    assert cli.main(["--workspace", str(empty), "recover", "--apply"]) == 2
    assert "nothing to recover" in capsys.readouterr().err
    assert not any(p.name.startswith("metadata.db") for p in empty.iterdir())
    db = before.cfg.parent / "metadata.db"
    os.remove(db)
    assert cli.main(["--workspace", str(before.cfg.parent), "recover"]) == 0
    assert not db.exists()
    assert cli.main(["--workspace", str(before.cfg.parent), "recover", "--apply"]) == 0
    assert db.exists()
    with Workspace(Config.load(before.cfg, env={})) as ws:
        assert {t.full for ns in ws.ml.list_namespaces() for t in ws.ml.list_topics(ns)} == {A0, A1, S0}


def test_the_listing_keeps_one_int_per_pair_and_skips_ledger_ids_past_a_long(tmp_path: Path) -> None:
    """list_bucket's per-pair state, keyed by (uuid, ledger id) as one int: a data object and its index
    object are one pair whatever their order; a key whose ledger id is past a Java long (no Pulsar ledger
    has one) is not an offloader's and is skipped; the uuid and ledger id come back out of the key."""
    from tieredcore.cold.backends.fs import FilesystemBlobStore
    from tieredcore.lifecycle.recover import _uuid_str, list_bucket

    store = FilesystemBlobStore(tmp_path / "bucket", fsync=False)
    u = "0f1e2d3c-4b5a-4978-8877-665544332211"
    store.put(f"{u}-ledger-{2**63 - 1}-index", b"i")
    store.put(f"{u}-ledger-{2**63 - 1}", b"data")
    store.put(f"{u}-ledger-{2**63}", b"data")
    store.put(f"{u}-ledger-{2**63}-index", b"i")
    listing = list_bucket(store, "", "standalone")
    assert listing.objects == 4
    assert [(_uuid_str(k >> 64), k & (2**64 - 1)) for k in listing.ledgers] == [(u, 2**63 - 1)]
    assert listing.index_listed(u, 2**63 - 1) and listing.data_size(u, 2**63 - 1) == 4
    assert not listing.index_listed(u, 2**63) and not listing.chunked(u, 2**63 - 1)


def test_segments_no_manifest_names_are_reported_not_recoverable(before: Before) -> None:
    """The streamed topic's manifests all deleted: its segments are recovered from manifests only, so each
    listed segment index object is reported "not recoverable" and nothing is created for the topic; the
    other topics come back (their plans name no segment)."""
    from tieredcore.formats.keys import segment_index_key
    from tieredcore.offload.context import segment_uuids

    b = before
    segs = sorted({u for li in b.records[S0].ledgerInfo if li.offloadContext.offloadSegment
                   for u in segment_uuids(li)})
    assert segs
    with lose_metadata(b) as ws:
        ws.manifests.store.delete(manifest_keys(ws, S0))
        rep = recover(ws, apply=True)
        assert ML[S0] not in {t.topic for t in rep.topics} and not ws.ml.exists(S0)
        for u in segs:
            assert any(n.startswith(f"{segment_index_key('', u)}: a segment no recovered manifest names")
                       for n in rep.not_recoverable), rep.not_recoverable
        for t in (A0, A1):
            assert read_all(ws, t) == b.entries[t]
