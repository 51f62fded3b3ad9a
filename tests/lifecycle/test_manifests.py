"""Topic manifests in the bucket (docs/recovery.md): written after every committed change of a topic's
offloaded state (offload, segments, retention), never naming an object that does not exist, superseded ones
through the deletion log, never taken for orphans or foreign keys by reconciliation, and a failed write
leaving the older manifest as the newest while the change itself stands."""

from __future__ import annotations

import time

from tests.support.workspaces import END_MS, offload, sealed, stream
from tieredcore.cold.blob import iter_objects
from tieredcore.formats.keys import is_topic_manifest_key, parse_topic_manifest_key, topic_manifests_prefix
from tieredcore.formats.topic_manifest import decode_topic_manifest
from tieredcore.lifecycle.drain import drain
from tieredcore.lifecycle.reconcile.run import reconcile
from tieredcore.lifecycle.retention import trim_topic
from tieredcore.lifecycle.topic_compaction import compact_topic
from tieredcore.meta.deletion_log import TYPE_MANIFEST
from tieredcore.names import TopicName
from tieredcore.offload.compacted_state import compaction_state
from tieredcore.offload.context import referenced_uuids, segment_uuids
from tieredcore.offload.manifests import TopicManifests

T = "persistent://t/a/topic-0000"
ML = "t/a/persistent/topic-0000"


def manifests(ws, topic: str = ML) -> dict[int, bytes]:
    """sequence -> bytes of the topic's manifests in the store."""
    s = ws.manifests
    out = {}
    for o in iter_objects(s.store, topic_manifests_prefix(s.prefix, s.cluster, topic)):
        parsed = parse_topic_manifest_key(o.key, s.prefix, s.cluster)
        assert parsed is not None and parsed[0] == topic, o.key
        out[parsed[1]] = s.store.get(o.key)
    return out


def named_keys(ws, m) -> set[str]:
    """Every index key a manifest names (V1 pairs and segments, in the configured store)."""
    info = m.info()
    prefix = ws.offloader.prefix
    out = set()
    for li in info.ledgerInfo:
        segs = set(segment_uuids(li))
        for u in referenced_uuids(li):
            out.add(f"{prefix}{u}-index" if u in segs else f"{prefix}{u}-ledger-{li.ledgerId}-index")
    return out


def watch_writes(ws, monkeypatch) -> list[tuple[str, set[str]]]:
    """Record, at the moment each manifest is put, the keys it names that are missing from the store."""
    seen: list[tuple[str, set[str]]] = []
    store = ws.manifests.store
    real_put = store.put

    def put(key, data, metadata=None, **kw):
        if is_topic_manifest_key(key, ws.manifests.prefix):
            m = decode_topic_manifest(data)
            present = {o.key for o in iter_objects(ws.store, ws.offloader.prefix)}
            seen.append((key, named_keys(ws, m) - present))
        return real_put(key, data, metadata, **kw)

    monkeypatch.setattr(store, "put", put)
    return seen


def test_offload_writes_one_manifest_per_commit_naming_only_present_objects(make_ws, monkeypatch):
    ws = make_ws(ledgers=4)
    seen = watch_writes(ws, monkeypatch)
    uuids = offload(ws, T, sealed(ws, T))
    assert len(seen) == 4 and all(missing == set() for _, missing in seen)  # never an absent object
    ms = manifests(ws)
    newest = decode_topic_manifest(ms[max(ms)])
    info, version = ws.ml.get_topic(T)
    assert newest.sequence == version and newest.topic == ML
    assert newest.info() == info  # nothing in flight: the view is the record itself
    assert {li.ledgerId: (li.entries, li.size) for li in newest.info().ledgerInfo if li.offloadContext.complete} \
        == {lid: (10, 1000) for lid in uuids}
    assert len(ms) == 4 and not ws.deletion_log.pending()  # the write path only writes
    # reconciliation records what is beyond the newest keep=3 (a dry run counts it); the drain deletes it
    now = int(time.time() * 1000)
    assert reconcile(ws, now, dry_run=True).manifests_superseded == 1 and not ws.deletion_log.pending()
    assert reconcile(ws, now).manifests_superseded == 1
    recs = [e.record for e in ws.deletion_log.pending()]
    assert [(r.type, r.topic, r.ledger_id, r.reason) for r in recs] == \
        [(TYPE_MANIFEST, ML, min(ms), "manifest-superseded")]
    assert reconcile(ws, now).manifests_superseded == 0  # not appended twice
    assert sorted(manifests(ws)) == sorted(ms)  # recorded, nothing deleted yet
    rep = drain(ws, now + 1)
    assert rep.deleted_offloaded == 1 and rep.dead_lettered == rep.retrying == 0
    assert sorted(manifests(ws)) == sorted(ms)[1:]
    assert not ws.deletion_log.pending()


def test_streaming_segments_and_retention_write_manifests(make_ws, monkeypatch):
    ws = make_ws(ledgers=3, open_entries=5)
    seen = watch_writes(ws, monkeypatch)
    stream(ws, T, max_segment_size=2500)
    assert seen and all(missing == set() for _, missing in seen)
    newest = decode_topic_manifest(manifests(ws)[max(manifests(ws))])
    assert any(li.offloadContext.offloadSegment for li in newest.info().ledgerInfo)
    n = len(seen)
    ws.policies.set_namespace("t/a", {"retention_size_mb": 0, "retention_time_minutes": 0})
    trim_topic(ws, TopicName.parse(T), END_MS + 3600_000)
    assert len(seen) > n and all(missing == set() for _, missing in seen)
    info, version = ws.ml.get_topic(T)
    ms = manifests(ws)
    assert max(ms) == version and decode_topic_manifest(ms[version]).info() == info
    assert decode_topic_manifest(ms[version]).namespace_policy["retention_size_mb"] == 0


def test_a_failed_manifest_write_leaves_the_older_one_and_the_change_stands(make_ws, monkeypatch):
    ws = make_ws(ledgers=3)
    first, second = sealed(ws, T)[:2]
    offload(ws, T, [first])
    before = manifests(ws)
    store = ws.manifests.store
    real_put = store.put

    def failing_put(key, data, metadata=None, **kw):
        if is_topic_manifest_key(key, ws.manifests.prefix):
            raise OSError("injected: crash between the commit and the manifest")
        return real_put(key, data, metadata, **kw)

    monkeypatch.setattr(store, "put", failing_put)
    uuid = offload(ws, T, [second])[second]  # the offload itself lands
    assert manifests(ws) == before  # a stale manifest: older sequence, missing the second ledger
    stale = decode_topic_manifest(before[max(before)])
    assert uuid not in {u for li in stale.info().ledgerInfo for u in referenced_uuids(li)}
    assert max(before) < ws.ml.get_topic(T)[1]


def test_reconcile_never_takes_manifests_for_orphans(make_ws):
    ws = make_ws(ledgers=3)
    offload(ws, T, sealed(ws, T))
    keys = {o.key for o in iter_objects(ws.store) if is_topic_manifest_key(o.key, ws.offloader.prefix)}
    assert keys
    far = int(time.time() * 1000) + 10 * 86_400_000  # everything is old enough to be an orphan
    rep = reconcile(ws, far, 0)
    assert rep.errors == [] and rep.orphan_groups == 0 and rep.foreign_keys == 0
    assert not [s for s in rep.sample_keys if "tiered-topic-manifests" in s]
    drain(ws, far)
    assert keys <= {o.key for o in iter_objects(ws.store)}


def test_superseded_manifests_are_recorded_once_per_topic(make_ws):
    ws = make_ws(["t/a", "t/b"], ledgers=2)
    t2 = "persistent://t/b/topic-0000"
    offload(ws, T, sealed(ws, T))
    offload(ws, t2, sealed(ws, t2))
    tm: TopicManifests = ws.manifests
    t = TopicName.parse(T)
    info, version = ws.ml.get_topic(T)
    for v in range(version + 1, version + 4):  # three more manifests of the same state
        tm.write(t, info, v)
    assert tm.supersede() == 2  # T has 5, the t/b topic 2: only T's two oldest
    pending = sorted((e.record.topic, e.record.ledger_id) for e in ws.deletion_log.pending())
    assert pending == [(ML, s) for s in tm.sequences(t)[:-3]]
    assert tm.supersede() == 0  # nothing appended twice


def test_topic_compaction_writes_a_manifest_with_its_pointer(make_ws, monkeypatch):
    ws = make_ws(ledgers=3, messages=True)
    offload(ws, T, sealed(ws, T))
    seen = watch_writes(ws, monkeypatch)
    res = compact_topic(ws, T)
    assert len(seen) == 1 and seen[0][1] == set()
    newest = decode_topic_manifest(manifests(ws)[max(manifests(ws))])
    st = compaction_state(newest.info())
    assert st is not None and (st.ledger_id, st.uuid) == (res.ledger_id, res.uuid)
    assert ws.store.head(f"{ws.offloader.prefix}{st.uuid}-ledger-{st.ledger_id}-index").size > 0
