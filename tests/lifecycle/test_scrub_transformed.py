"""The daily (shallow) scrub sees a deleted or truncated chunks object of a compressed or encrypted ledger
whose manifest is still there: the manifest alone answers a HEAD of the logical object, so the scrub HEADs
the stored chunks too (TransformedBlobStore.check_stored). Before, only the weekly deep scrub saw it —
data loss the daily check reported as ok (8 of 8 cases)."""

from __future__ import annotations

import pytest

from tests.support.workspaces import END_MS
from tieredcore.cold.blob import iter_objects
from tieredcore.cold.keyring import KeyRing
from tieredcore.formats.keys import INDEX_SUFFIX, data_key
from tieredcore.lifecycle.runner import run_work
from tieredcore.lifecycle.scrub import plan_scrub
from tieredcore.lifecycle.sweep import plan_offload
from tieredcore.lifecycle.work import LedgerResult
from tieredcore.offload.context import context_uuid

T = "persistent://t/a/topic-0000"
HOUR = 3600 * 1000


@pytest.fixture(scope="module")
def ring_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys") / "ring"
    KeyRing.add_key(d, "kek-1", bits=2048)
    return d


def offloaded(make_ws, ring_dir, transform: str):
    ws = make_ws(["t/a"], ledgers=3, entries=60, entry_size="200-3000", config_overrides={"key_ring": str(ring_dir)})
    ws.policies.set_namespace("t/a", {"offload_threshold_bytes": 0, "transform": transform,
                                      "transform_chunk_size": 8192})
    rows = list(run_work(ws.config, [u.as_dict() for u in plan_offload(ws, None, END_MS)]))
    assert {r["outcome"] for r in rows} == {"offloaded"}
    return ws


def shallow(ws) -> dict[int, LedgerResult]:
    work = plan_scrub(ws, None, END_MS + HOUR, deep=False, repair=False)
    return {r["ledger"]: LedgerResult(**r) for r in run_work(ws.config, [w.as_dict() for w in work])}


def raw(ws):
    """The store under the transformed one (the same location: chunks objects and manifests)."""
    return ws.store


@pytest.mark.parametrize("transform", ["zstd", "aes", "zstd+aes"])
@pytest.mark.parametrize("damage", ["deleted", "truncated", "index-truncated"])
@pytest.mark.parametrize("hot", [True, False])
def test_a_missing_or_short_chunks_object_is_seen_by_the_shallow_scrub(make_ws, ring_dir, transform, damage, hot):
    ws = offloaded(make_ws, ring_dir, transform)
    info, _ = ws.ml.get_topic(T)
    li = info.ledgerInfo[1]
    key = data_key("", context_uuid(li), li.ledgerId) + (INDEX_SUFFIX if damage == "index-truncated" else "")
    store = raw(ws)
    assert f"{key}.manifest" in {o.key for o in iter_objects(store)}
    if damage == "deleted":
        store.delete([key])
    else:
        md, data = store.head(key).metadata, store.get(key)
        store.put(key, data[: len(data) - 7], md)
    if not hot:
        ws.hot.delete_ledger(li.ledgerId)
    rows = shallow(ws)
    r = rows[li.ledgerId]
    if hot:
        assert r.outcome == "damaged", r
    else:
        assert r.outcome == "unrecoverable" and r.error.startswith("DATA LOSS"), r
    said = {"deleted": "chunks are missing", "truncated": "bytes of chunks stored, its manifest says",
            "index-truncated": "short read"}[damage]  # the index is read even by a shallow scrub
    assert said in r.error and key in r.error, r.error
    others = [x for lid, x in rows.items() if lid != li.ledgerId]
    assert others and {x.outcome for x in others} == {"ok"}
