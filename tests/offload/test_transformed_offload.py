"""Namespace transforms end to end: the sweep offloads into chunked zstd / AES-GCM objects, the topic
reader reads them back byte-identical whatever the read pattern, the driver metadata tells readers how
to open them (a later policy change does not matter), deletion removes manifests too, and transformed
objects never carry Pulsar's format version."""

from __future__ import annotations

import pytest

from tests.support.segments import hot_snapshot
from tests.support.workspaces import END_MS, sealed
from tieredcore.clock import now_ms
from tieredcore.cold.blob import iter_objects
from tieredcore.cold.keyring import KeyRing
from tieredcore.cold.transformed import TransformedBlobStore
from tieredcore.errors import ValidationError
from tieredcore.formats import constants as C
from tieredcore.formats.keys import parse_key
from tieredcore.formats.manifest import TRANSFORMED_FORMAT_VERSION, Manifest
from tieredcore.lifecycle.drain import drain
from tieredcore.lifecycle.reconcile.run import reconcile
from tieredcore.lifecycle.runner import run_work
from tieredcore.lifecycle.sweep import plan_offload
from tieredcore.lifecycle.work import LedgerResult
from tieredcore.offload.copies import open_offloaded

T = "persistent://t/a/topic-0000"
ML = "t/a/persistent/topic-0000"


@pytest.fixture(scope="module")
def ring_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys") / "ring"
    KeyRing.add_key(d, "kek-1", bits=2048)
    return d


def _offload(ws):
    res = [LedgerResult(**r) for r in run_work(ws.config, [w.as_dict() for w in plan_offload(ws, None, END_MS)])]
    assert res and all(r.outcome == "offloaded" for r in res), res


def _raw_keys(ws):
    store = ws.store.inner if isinstance(ws.store, TransformedBlobStore) else ws.store
    # but the owner marker and topic manifests (docs/recovery.md: plain, in no namespace's transform)
    return store, sorted(o.key for o in iter_objects(store)
                         if "tiered-owner." not in o.key and "tiered-topic-manifests/" not in o.key)


@pytest.mark.parametrize("transform", ["zstd", "aes", "zstd+aes"])
def test_sweep_offloads_transformed_objects_and_reads_them_back(make_ws, ring_dir, transform):
    ws = make_ws(["t/a"], ledgers=4, entries=200, entry_size="20-3000", config_overrides={"key_ring": str(ring_dir)})
    ws.policies.set_namespace("t/a", {"offload_threshold_bytes": 0, "transform": transform,
                                           "transform_chunk_size": 8192})
    before = hot_snapshot(ws, T)
    _offload(ws)
    store, keys = _raw_keys(ws)
    manifests = [k for k in keys if k.endswith(".manifest")]
    assert len(manifests) == 2 * len(sealed(ws, T)) and all(parse_key(k).is_manifest for k in manifests)
    for k in keys:
        assert store.head(k).metadata[C.METADATA_FORMAT_VERSION_KEY] == TRANSFORMED_FORMAT_VERSION
    m = Manifest.from_json(store.get(manifests[0]), "m")
    assert m.encrypted == ("aes" in transform) and (m.kek_id in (None, "kek-1"))
    # the reader follows the driver metadata, whatever the policy says now
    ws.policies.set_namespace("t/a", {"transform": "none"})
    info, _ = ws.ml.get_topic(T)
    for li in info.ledgerInfo[:-1]:
        props = {kv.key: kv.value for kv in li.offloadContext.driverMetadata.properties}
        assert props["tieredChunked"] == "true"
        h = open_offloaded(li, ws.offloader, ML, ws.offloader_for_driver)
        want = before[li.ledgerId]
        assert [bytes(e.data) for e in h.read(0, len(want) - 1)] == want
        for first, last in ((0, 0), (1, 3), (len(want) // 2, len(want) // 2 + 7), (len(want) - 1, len(want) - 1)):
            assert [bytes(e.data) for e in h.read(first, last)] == want[first: last + 1]
        h.close()
    r = ws.reader()
    try:
        got = [bytes(d) for _p, d in r.read(T)]
    finally:
        r.close()
    assert got == [e for lid in before for e in before[lid]]


def test_deleting_transformed_objects_removes_their_manifests(make_ws, ring_dir):
    ws = make_ws(["t/a"], ledgers=3, entries=50, config_overrides={"key_ring": str(ring_dir)})
    ws.policies.set_namespace("t/a", {"offload_threshold_bytes": 0, "transform": "zstd+aes",
                                           "retention_time_minutes": 0, "transform_chunk_size": 4096})
    with pytest.raises(ValidationError, match="below the retention"):  # sanity: the policy validates as a whole
        ws.policies.set_namespace("t/a", {"offload_threshold_seconds": 10})
    _offload(ws)
    store, keys = _raw_keys(ws)
    assert keys
    # orphan reconciliation takes every object of a group, manifests included
    info, _ = ws.ml.get_topic(T)
    for li in info.ledgerInfo[:-1]:
        li.offloadContext.Clear()
    ws.ml.put_topic(T, info, ws.ml.get_topic(T)[1])
    later = now_ms() + 86_400_000  # the objects' modification times are the wall clock's
    rep = reconcile(ws, later, grace_ms=0)
    n = len(info.ledgerInfo) - 1
    assert rep.errors == [] and rep.orphan_groups == n and rep.orphan_objects == 4 * n  # data, index, 2 manifests
    d = drain(ws, later)
    assert d.deleted_offloaded == n and d.retrying == d.dead_lettered == 0, d.rows
    assert _raw_keys(ws)[1] == []


def test_encrypting_policy_without_a_key_ring_is_refused(make_ws):
    ws = make_ws(["t/a"], ledgers=2)
    with pytest.raises(ValidationError, match="needs a key ring"):
        ws.policies.set_namespace("t/a", {"transform": "aes"})
    with pytest.raises(ValidationError, match="is not one of none, zstd, aes, zstd\\+aes"):
        ws.policies.set_namespace("t/a", {"transform": "gzip"})
    with pytest.raises(ValidationError, match="chunk size"):
        ws.policies.set_namespace("t/a", {"transform": "zstd", "transform_chunk_size": 10})
    assert ws.policies.for_namespace("t/a").transform == "none"



def test_streaming_segments_honour_the_transform(make_ws, ring_dir):
    ws = make_ws(["t/s"], ledgers=3, entries=60, entry_size="20-2000", open_entries=25,
                 config_overrides={"key_ring": str(ring_dir)})
    ws.policies.set_namespace("t/s", {"offload_mode": "streaming", "max_segment_size": 16 * 1024,
                                           "streaming_block_size": 1024, "max_segment_rollover_ms": 0,
                                           "transform": "zstd+aes", "transform_chunk_size": 4096})
    topic = "persistent://t/s/topic-0000"
    before = hot_snapshot(ws, topic)
    res = [LedgerResult(**r) for r in run_work(ws.config, [w.as_dict() for w in plan_offload(ws, None, END_MS)])]
    assert res and all(r.outcome in ("offloaded", "held") for r in res), res
    store, keys = _raw_keys(ws)
    segs = [k for k in keys if parse_key(k) and parse_key(k).is_segment and not parse_key(k).is_manifest
            and not parse_key(k).is_index]
    assert len(segs) >= 3 and all(k + ".manifest" in keys for k in segs)
    assert all(Manifest.from_json(store.get(k + ".manifest"), k).kek_id == "kek-1" for k in segs)
    info, _ = ws.ml.get_topic(topic)
    for li in info.ledgerInfo:
        want = before[li.ledgerId]
        h = open_offloaded(li, ws.offloader, "t/s/persistent/topic-0000", ws.offloader_for_driver)
        n = h.last_add_confirmed + 1
        assert n > 0 and [bytes(e.data) for e in h.read(0, n - 1)] == want[:n]
        h.close()


def test_compaction_re_transforms_objects_offloaded_before_compression(make_ws, ring_dir):
    """Large uncompressed V1 objects (above the min object size) are rewritten into compressed
    segments once the namespace compresses; the report shows the bytes saved; entries read back equal."""
    from tieredcore.lifecycle.compaction_run import CompactionReport, run_topics

    ws = make_ws(["t/a"], ledgers=4, entries=400, entry_size="500-1500", config_overrides={"key_ring": str(ring_dir)})
    ws.policies.set_namespace("t/a", {"offload_threshold_bytes": 0})
    before = hot_snapshot(ws, T)
    _offload(ws)
    ws.policies.set_namespace("t/a", {"transform": "zstd", "transform_chunk_size": 65536,
                                           "compaction_enabled": True, "compaction_min_object_size": 4096,
                                           "compaction_target_size": 1 << 20})
    rows = list(run_topics(ws.config, [ML], as_of_ms=END_MS, dry_run=False))
    assert rows and all(r["outcome"] == "compacted" and r["retransformed"] for r in rows), rows
    rep = CompactionReport(END_MS, False, rows, [ML])
    assert rep.summary()["bytes_saved"] > 0 and rep.summary()["retransformed_batches"] == len(rows)
    assert any("saved" in m for m in rep.messages())
    info, _ = ws.ml.get_topic(T)
    for li in info.ledgerInfo[:-1]:
        assert not li.offloadContext.complete and li.offloadContext.offloadSegment
        props = {kv.key: kv.value for kv in li.offloadContext.offloadSegment[0].driverMetadata.properties}
        assert props["tieredTransform"] == "zstd"
        h = open_offloaded(li, ws.offloader, ML, ws.offloader_for_driver)
        assert [bytes(e.data) for e in h.read(0, li.entries - 1)] == before[li.ledgerId]
        h.close()
    # compressed now: a second run has nothing to do
    assert list(run_topics(ws.config, [ML], as_of_ms=END_MS, dry_run=False)) == []
