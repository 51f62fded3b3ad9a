"""Orphan reconciliation (docs/deletion.md) on real stores: a workspace built with `tiered init` / `generate`,
offloaded with TopicOffloader, plus a seeded set of orphans among many valid objects. Ages are set
explicitly (os.utime on the filesystem store's files, ledger ctimes, the upload manifest) and every
run uses an explicit as_of_ms."""

from __future__ import annotations

import json
import os
import time
import uuid as uuidlib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.workspaces import sealed
from tieredcore.cold.backends.fs import FilesystemBlobStore
from tieredcore.cold.blob import ObjectInfo, iter_objects
from tieredcore.formats.keys import data_key, index_key, parse_ledger_key
from tieredcore.lifecycle.reconcile.listing import (
    ObjectRow,
    list_objects,
    list_rest,
    listing_prefixes,
    parse_row,
)
from tieredcore.lifecycle.reconcile.orphans import (
    HOT_NOT_LISTED,
    HOT_TOPIC_MISSING,
    abort_stale_uploads,
    find_hot_orphans,
    find_object_orphans,
)
from tieredcore.lifecycle.reconcile.references import referenced_uuids
from tieredcore.lifecycle.reconcile.run import reconcile
from tieredcore.meta.deletion_log import (
    TYPE_LEDGER,
    TYPE_OFFLOADED,
    DeletionLog,
    DeletionRecord,
)
from tieredcore.meta.managed_ledgers import find_ledger
from tieredcore.names import TopicName
from tieredcore.offload.managed import ABANDONED_PREFIX, context_uuid
from tieredcore.offload.offloader import LedgerOffloader
from tieredcore.topic.writer import ledger_custom_metadata

GRACE = 3600 * 1000
A = "t/a/persistent/topic-0000"
B = "t/a/persistent/topic-0001"  # deleted after its offload: objects and hot ledgers leak
C = "t/b/persistent/topic-0000"  # namespace t/b offloads to prefix pfx/ of the same store


def set_mtime(path: Path, ms: int) -> None:
    os.utime(path, ns=(ms * 1_000_000, ms * 1_000_000))


def age_objects(root: Path, ms: int, keys=None) -> None:
    """Object files (and metadata sidecars) of the filesystem store: all of them, or `keys`."""
    if keys is None:
        for d, dirs, files in os.walk(root):
            if Path(d) == root:
                dirs[:] = [x for x in dirs if x != ".tiered"]
            for f in files:
                set_mtime(Path(d) / f, ms)
        return
    for k in keys:
        set_mtime(root / k, ms)
        side = root / ".tiered" / "meta" / k
        if side.exists():
            set_mtime(side, ms)


def hot_ledger(ws, custom, ctime_ms):
    led = ws.hot.create_ledger(custom, ctime_ms=ctime_ms)
    led.append(b"payload")
    led.close()
    return led.ledger_id


@dataclass
class Seeded:
    ws: object
    cold: Path
    as_of: int
    groups: dict = field(default_factory=dict)  # (uuid, ledger id) -> (topic, prefix)
    hot: dict = field(default_factory=dict)  # ledger id -> (topic, reason)
    stale_upload: tuple = ()
    young_upload: tuple = ()
    foreign_upload: tuple = ()
    young_keys: list = field(default_factory=list)
    valid_keys: list = field(default_factory=list)
    foreign: dict = field(default_factory=dict)  # (uuid, ledger id) -> why not ours: never recorded


@pytest.fixture
def seeded(make_ws):
    ws = make_ws(["t/a", "t/b"], topics=2, ledgers=3, entries=8)
    cold = Path(ws.store.root)
    ps = ws.policies
    ps.set_namespace("t/b", {"store": {"driver": "filesystem", "root": str(cold), "prefix": "pfx"}})
    pol_off = ws.offloader_for_policy(ps.for_namespace("t/b"))
    assert pol_off.store.root == ws.store.root and pol_off.prefix == "pfx/"

    # every sealed ledger offloaded, the t/b ones to the policy's prefix
    for t in (A, B):
        res = ws.topic_offloader().offload_ledgers(t, sealed(ws, t))
        assert all(r.outcome == "offloaded" for r in res), res
    for t in (C, "t/b/persistent/topic-0001"):
        res = ws.topic_offloader(offloader=pol_off).offload_ledgers(t, sealed(ws, t))
        assert all(r.outcome == "offloaded" for r in res), res
    valid_keys = sorted(o.key for o in iter_objects(ws.store))

    as_of = max(int(time.time() * 1000), 1_767_225_600_000) + 3 * GRACE
    old, young = as_of - 2 * GRACE, as_of - GRACE // 2
    s = Seeded(ws, cold, as_of)
    off = ws.offloader
    a0, a1, a2 = sealed(ws, A)

    # 1. an abandoned attempt nothing references
    u1 = str(uuidlib.uuid4())
    off.offload(ws.hot.open_ledger(a0), u1, {"managedledgername": A})
    s.groups[(u1, a0)] = (A, "")
    # 2. a deleted topic: its objects and every hot ledger of it
    info_b, _ = ws.ml.get_topic(B)
    for li in info_b.ledgerInfo:
        if li.HasField("offloadContext"):
            s.groups[(context_uuid(li), li.ledgerId)] = (B, "")
        s.hot[li.ledgerId] = (B, HOT_TOPIC_MISSING)
    assert len(info_b.ledgerInfo) == 4
    ws.ml.delete_topic(B)
    # 3. a lone index without data and without user metadata: nobody's we know, so not ours to delete
    u3 = str(uuidlib.uuid4())
    ws.store.put(index_key("", u3, 4242), b"index-bytes")
    s.foreign[(u3, 4242)] = "names no cluster"
    # 3b. a lone index of ours whose data object is gone: the topic is in its metadata
    u3b = str(uuidlib.uuid4())
    o3b = off.offload(ws.hot.open_ledger(a2), u3b, {"managedledgername": A})
    ws.store.delete([o3b.data_key])
    s.groups[(u3b, a2)] = (A, "")
    # 3c. objects another cluster (sharing the bucket) and another workspace of this cluster wrote
    for cluster, owner, why in (("east", "", "written by cluster 'east'"),
                                ("standalone", "0" * 32, "another workspace")):
        other = LedgerOffloader(ws.store, cluster=cluster, owner=owner)
        u = str(uuidlib.uuid4())
        other.offload(ws.hot.open_ledger(a2), u, {"managedledgername": A})
        s.foreign[(u, a2)] = why
    # 3d. a crashed offload of another cluster: its data object alone, no index (a group without an index
    # must be checked for its owner too: a planted bug that looked only at groups with an index survived)
    u3d = str(uuidlib.uuid4())
    o3d = LedgerOffloader(ws.store, cluster="east").offload(ws.hot.open_ledger(a2), u3d, {"managedledgername": A})
    ws.store.delete([o3d.index_key])
    s.foreign[(u3d, a2)] = "written by cluster 'east'"
    # 4. multipart uploads: stale (ours), young (ours), stale foreign
    u4 = str(uuidlib.uuid4())
    k4 = data_key("", u4, 4343)
    s.stale_upload = (k4, ws.store.initiate_multipart(k4))
    ws.store.upload_part(k4, s.stale_upload[1], 1, b"y" * 100)
    k5 = data_key("", str(uuidlib.uuid4()), 4444)
    s.young_upload = (k5, ws.store.initiate_multipart(k5))
    manifest = cold / ".tiered" / "uploads" / s.young_upload[1] / "manifest.json"
    m = json.loads(manifest.read_text())
    m["initiated"] = young / 1000
    manifest.write_text(json.dumps(m))
    s.foreign_upload = ("notes/big.bin", ws.store.initiate_multipart("notes/big.bin"))
    # 5. hot tier: unlisted ledger of a live topic; foreign; cursor ledger; young unlisted; scheduled
    tA = TopicName.parse(A)
    s.hot[hot_ledger(ws, ledger_custom_metadata(tA), old)] = (A, HOT_NOT_LISTED)
    hot_ledger(ws, {"application": b"bench"}, old)
    hot_ledger(ws, {**ledger_custom_metadata(tA), "pulsar/cursor": b"sub"}, old)
    hot_ledger(ws, ledger_custom_metadata(tA), young)
    scheduled_hot = hot_ledger(ws, ledger_custom_metadata(tA), old)
    dl = DeletionLog(ws.metadata)
    dl.append([DeletionRecord(topic=A, ledger_id=scheduled_hot, type=TYPE_LEDGER, reason="retention",
                              created_ms=old)])
    # 6. a foreign key
    ws.store.put("notes/readme.txt", b"hello")
    # 7. an offload in flight, younger than the grace period, uuid not visible
    u7 = str(uuidlib.uuid4())
    o7 = off.offload(ws.hot.open_ledger(a1), u7, {"managedledgername": A})
    s.young_keys = [o7.data_key, o7.index_key]
    # 8. an abandoned attempt under the t/b policy's prefix
    u8 = str(uuidlib.uuid4())
    c0 = sealed(ws, C)[0]
    pol_off.offload(ws.hot.open_ledger(c0), u8, {"managedledgername": C})
    s.groups[(u8, c0)] = (C, "pfx/")
    # 9./10. unreferenced uuids already in the deletion log: pending, and dead-lettered
    u9, u10 = str(uuidlib.uuid4()), str(uuidlib.uuid4())
    drv = {"name": "filesystem", "properties": {"root": str(cold)}}
    for u in (u9, u10):
        off.offload(ws.hot.open_ledger(a2), u, {"managedledgername": A})
    dl.append([DeletionRecord(topic=A, ledger_id=a2, type=TYPE_OFFLOADED, reason="offload-cleanup",
                              created_ms=old, uuid=u, driver=drv) for u in (u9, u10)])
    [e10] = [e for e in dl.pending() if e.record.uuid == u10]
    assert dl.dead_letter(e10, "operator needed")
    # 11. an abandoned attempt remembered in the ledger's properties
    u11 = str(uuidlib.uuid4())
    off.offload(ws.hot.open_ledger(a1), u11, {"managedledgername": A})

    def remember(info):
        find_ledger(info, a1).properties.add(key=ABANDONED_PREFIX + u11, value="1")
        return True

    ws.ml.update_topic(A, remember)

    age_objects(cold, old)
    age_objects(cold, young, s.young_keys)
    s.valid_keys = [k for k in valid_keys if not any(k.endswith(f"{u}-ledger-{lid}") or
                                                     k.endswith(f"{u}-ledger-{lid}-index") for u, lid in s.groups)]
    return s


def group_keys(s: Seeded) -> set[str]:
    return {k for (u, lid), (_t, p) in s.groups.items() for k in (data_key(p, u, lid), index_key(p, u, lid))
            if (s.cold / k).exists()}


def test_finds_exactly_the_seeded_orphans(seeded):
    s, ws = seeded, seeded.ws
    before = {e.id for e in DeletionLog(ws.metadata).pending()}
    rep = reconcile(ws, s.as_of, GRACE)
    assert rep.errors == []
    assert len(rep.locations) == 2

    new = [e.record for e in DeletionLog(ws.metadata).pending() if e.id not in before]
    assert rep.records_appended == len(new) == len(s.groups) + len(s.hot)
    off = {(r.uuid, r.ledger_id): r for r in new if r.type == TYPE_OFFLOADED}
    hot = {r.ledger_id: r for r in new if r.type == TYPE_LEDGER}
    assert set(off) == set(s.groups)
    assert set(hot) == set(s.hot)
    for k, r in off.items():
        topic, prefix = s.groups[k]
        assert (r.reason, r.topic, r.created_ms, r.component) == ("orphan", topic, s.as_of, "managed-ledger")
        props = {"root": str(s.cold), **({"prefix": prefix} if prefix else {})}
        assert r.driver == {"name": "tiered-local", "properties": props}
        r.validate()
    for lid, r in hot.items():
        assert (r.topic, r.reason, r.uuid, r.created_ms) == (s.hot[lid][0], "orphan", "", s.as_of)

    expected_keys = group_keys(s)
    assert rep.orphan_groups == len(s.groups)
    assert rep.orphan_objects == len(expected_keys) == 2 * len(s.groups) - 1  # the lone index
    # what another cluster or workspace wrote is counted and never recorded
    assert rep.foreign_cluster_groups == len(s.foreign) == 4 and rep.foreign_cluster_objects == 6
    assert all(any(why in x for x in rep.foreign_cluster_samples) for why in s.foreign.values())
    assert not {u for u, _ in s.foreign} & {r.uuid for r in new}
    assert rep.orphan_bytes == sum((s.cold / k).stat().st_size for k in expected_keys)
    assert rep.hot_orphans == len(s.hot) == 5
    assert rep.foreign_keys == 1  # notes/readme.txt; the nested pfx/ keys belong to the other location
    assert rep.young_unreferenced == 2
    assert (rep.foreign_hot_ledgers, rep.young_hot_ledgers, rep.scheduled_hot_ledgers) == (2, 1, 1)
    assert (rep.stale_uploads, rep.uploads_aborted, rep.young_uploads, rep.foreign_uploads) == (1, 1, 1, 1)
    assert rep.oldest_orphan_age_ms is not None and rep.oldest_orphan_age_ms >= 2 * GRACE
    assert 0 < len(rep.sample_keys) <= 10
    assert set(k for k in rep.sample_keys if not k.startswith(("hot:", "upload:"))) <= expected_keys
    assert rep.by_namespace["t/a"]["offloaded"]["count"] == 5  # u1, u3b + three of the deleted topic
    assert rep.by_namespace["t/a"]["ledger"]["count"] == 5
    assert rep.by_namespace["t/b"]["offloaded"] == {"count": 1, "objects": 2,
                                                    "bytes": sum((s.cold / k).stat().st_size for k in expected_keys
                                                                 if k.startswith("pfx/"))}
    assert "offloaded" not in rep.by_namespace["(unknown)"]
    assert rep.by_namespace["(unknown)"]["upload"]["count"] == 1

    # nothing was deleted by reconciliation itself; only the stale upload is gone
    assert all((s.cold / k).exists() for k in expected_keys | set(s.valid_keys))
    assert all(ws.hot.exists(lid) for lid in s.hot)
    ups = {(u.key, u.upload_id) for u in ws.store.list_multipart_uploads()}
    assert ups == {s.young_upload, s.foreign_upload}

    # running again appends nothing (the pending records are references) and finds nothing new
    again = reconcile(ws, s.as_of, GRACE)
    assert (again.records_appended, again.orphan_groups, again.hot_orphans, again.stale_uploads) == (0, 0, 0, 0)
    assert again.scheduled_hot_ledgers == 1 + len(s.hot)
    assert len(DeletionLog(ws.metadata).pending()) == len(before) + len(new)


def test_dry_run_writes_nothing(seeded):
    s, ws = seeded, seeded.ws
    pending = sorted(e.id for e in DeletionLog(ws.metadata).pending())
    counters = DeletionLog(ws.metadata).counters()
    ups = ws.store.list_multipart_uploads()
    rep = reconcile(ws, s.as_of, GRACE, dry_run=True)
    assert (rep.orphan_groups, rep.hot_orphans, rep.stale_uploads) == (len(s.groups), len(s.hot), 1)
    assert rep.records_appended == 0 and rep.uploads_aborted == 0
    assert len(rep.records) == len(s.groups) + len(s.hot)
    assert sorted(e.id for e in DeletionLog(ws.metadata).pending()) == pending
    assert DeletionLog(ws.metadata).counters() == counters
    assert ws.store.list_multipart_uploads() == ups
    # the real run after a dry run does exactly what the dry run said
    real = reconcile(ws, s.as_of, GRACE)
    assert sorted((r["type"], r["uuid"], r["ledger_id"], r["topic"]) for r in real.records) == \
        sorted((r["type"], r["uuid"], r["ledger_id"], r["topic"]) for r in rep.records)


def test_as_of_and_grace_decide_age(seeded):
    s, ws = seeded, seeded.ws
    # an earlier logical date sees every seeded object as young: nothing is flagged
    rep = reconcile(ws, s.as_of - 2 * GRACE, GRACE, dry_run=True)
    assert rep.orphan_groups == 0 and rep.stale_uploads == 0
    assert rep.young_unreferenced == len(group_keys(s)) + 2 + 6  # + the 6 objects written by others
    # a longer grace period makes the in-flight offload and everything else young too
    assert reconcile(ws, s.as_of, 10 * GRACE, dry_run=True).orphan_groups == 0
    # grace 0 at a later date flags the in-flight attempt as well
    later = reconcile(ws, s.as_of + GRACE, 0, dry_run=True)
    assert later.orphan_groups == len(s.groups) + 1 and later.young_unreferenced == 0


def test_drain_deletes_every_orphan_and_nothing_else(seeded):
    from tieredcore.lifecycle.drain import drain

    s, ws = seeded, seeded.ws
    rep = reconcile(ws, s.as_of, GRACE)
    assert rep.records_appended == len(s.groups) + len(s.hot)
    drain(ws, s.as_of)
    assert not any((s.cold / k).exists() for k in group_keys(s))
    assert all((s.cold / k).exists() for k in s.valid_keys)
    assert all((s.cold / index_key("", u, lid)).exists() or (s.cold / data_key("", u, lid)).exists()
               for u, lid in s.foreign)  # never touched
    assert not any(ws.hot.exists(lid) for lid in s.hot)
    left = [e.record for e in DeletionLog(ws.metadata).pending()]
    assert not [r for r in left if r is not None and r.reason == "orphan"]
    assert not [e for e in DeletionLog(ws.metadata).dead_letters() if e.record and e.record.reason == "orphan"]
    # every remaining topic still reads back in full
    r = ws.reader()
    try:
        for t in (A, C, "t/b/persistent/topic-0001"):
            info, _ = ws.ml.get_topic(t)
            assert sum(1 for _ in r.read(t)) == sum(li.entries for li in info.ledgerInfo)
    finally:
        r.close()
    # and a later run finds nothing to do in the object store
    after = reconcile(ws, s.as_of, GRACE, dry_run=True)
    assert after.orphan_groups == 0 and after.hot_orphans == 0 and after.foreign_keys == 1
    assert after.foreign_cluster_groups == 4


def test_referenced_uuids_cover_contexts_abandoned_and_log(seeded):
    s, ws = seeded, seeded.ws
    refs = referenced_uuids(ws.ml, ws.metadata)
    listed = {parse_ledger_key(k, "pfx/" if k.startswith("pfx/") else "").uuid for k in s.valid_keys
              if parse_ledger_key(k, "pfx/" if k.startswith("pfx/") else "")}
    assert listed <= refs
    assert not {u for u, _ in s.groups} & refs


def test_hot_orphans_directly(seeded):
    s, ws = seeded, seeded.ws
    h = find_hot_orphans(ws, s.as_of, GRACE)
    assert {o.ledger_id: (o.topic, o.reason) for o in h.orphans} == s.hot
    assert (h.foreign, h.young, h.scheduled) == (2, 1, 1)
    assert h.listed == 3 * 4  # three live topics, four ledgers each (the open one included)


def test_stale_uploads_on_the_filesystem_store(tmp_path):
    store = FilesystemBlobStore(tmp_path / "s")
    u = str(uuidlib.uuid4())
    k = data_key("p/", u, 1)
    uid = store.initiate_multipart(k)
    store.initiate_multipart("p/foreign-key")
    store.initiate_multipart(data_key("other/", u, 1))  # outside the prefix
    now = int(time.time() * 1000)
    assert abort_stale_uploads(store, "p", now, GRACE).young == 1  # just initiated
    dry = abort_stale_uploads(store, "p", now + 2 * GRACE, GRACE, dry_run=True)
    assert [(x.key, x.upload_id) for x in dry.stale] == [(k, uid)] and dry.aborted == 0 and dry.foreign == 1
    assert len(store.list_multipart_uploads("p/")) == 2
    done = abort_stale_uploads(store, "p", now + 2 * GRACE, GRACE)
    assert done.aborted == 1 and done.foreign == 1
    assert [x.key for x in store.list_multipart_uploads()] == [data_key("other/", u, 1), "p/foreign-key"]


# -- the pure anti-join ---------------------------------------------------------------------------


def row(key, lm, size=10, prefix=""):
    r = parse_row(ObjectInfo(key, size, lm / 1000), prefix)
    assert isinstance(r, ObjectRow) and r.last_modified_ms == lm
    return r


def test_find_object_orphans_pure():
    u = [str(uuidlib.UUID(int=i)) for i in range(1, 6)]
    rows = [
        row(data_key("", u[0], 1), 100), row(index_key("", u[0], 1), 100),  # referenced
        row(data_key("", u[1], 2), 100), row(index_key("", u[1], 2), 150),  # orphan
        row(data_key("", u[2], 3), 100), row(index_key("", u[2], 3), 950),  # index young: whole group young
        row(index_key("", u[3], 4), 200),  # lone index orphan
        row(data_key("", u[1], 9), 120),  # same uuid, another ledger: its own group
        row("notes/readme.txt", 0), row(u[4], 300), row(u[4] + "-index", 300),  # an unreferenced segment
    ]
    r = find_object_orphans(rows, {u[0]}, as_of_ms=1000, grace_ms=100)
    assert [(g.uuid, g.ledger_id, g.keys, g.bytes) for g in r.groups] == [
        (u[1], 2, sorted([data_key("", u[1], 2), index_key("", u[1], 2)]), 20),
        (u[1], 9, [data_key("", u[1], 9)], 10),
        (u[3], 4, [index_key("", u[3], 4)], 10),
        (u[4], None, [u[4], u[4] + "-index"], 20),
    ]
    assert r.groups[2].has_index and not r.groups[2].has_data
    assert r.groups[3].is_segment and r.groups[3].has_data and r.groups[3].has_index
    assert (r.foreign_keys, r.young_unreferenced, r.referenced_objects, r.rows) == (1, 2, 2, len(rows))
    assert r.segment_keys == 2  # {uuid} / {uuid}-index keys: one segment group per uuid
    # a referenced segment (assigned or complete on some ledger) is never flagged
    assert [g.uuid for g in find_object_orphans(rows, {u[0], u[4]}, 1000, 100).groups] == [u[1], u[1], u[3]]
    assert r.oldest_age_ms(1000) == 900
    # parse_row agrees with keys.parse_ledger_key on ledger keys, and is strict where it is lenient
    for k in (data_key("x/", u[0], 12), index_key("x/", u[0], 0)):
        p = parse_ledger_key(k, "x/")
        assert row(k, 0, prefix="x/")[3:] == (p.uuid, p.ledger_id, p.is_index)
    assert row(data_key("", u[0], 1) + "\n", 0).uuid is None
    assert row(f"{u[0]}-ledger-\u0661", 0).uuid is None  # ARABIC-INDIC DIGIT ONE
    assert row(data_key("x/", u[0], 1), 0).uuid is None  # not under the prefix
    # the boundary: last modified exactly at as_of - grace is still young
    assert find_object_orphans([row(index_key("", u[3], 4), 900)], set(), 1000, 100).groups == []


# -- split listing --------------------------------------------------------------------------------


def test_listing_prefixes():
    assert listing_prefixes("") == list("0123456789abcdef")
    assert listing_prefixes("a/b") == [f"a/b/{c}" for c in "0123456789abcdef"]


@pytest.mark.parametrize("prefix", ["", "base"])
def test_split_listing_equals_one_full_listing(blob_store, prefix):
    p = prefix + "/" if prefix else ""
    keys = []
    for i in range(40):
        u = str(uuidlib.UUID(int=(i * 0x0F0F0F0F0F0F0F0F0F0F0F0F0F0F0F0F) % (1 << 128)))
        keys += [data_key(p, u, i), index_key(p, u, i)]
    odd = ["notes/readme.txt", "Zebra", ":colon", "`tick", "9z-not-a-uuid", "A-upper", "g-after-f", "~tilde",
           "!bang", "f\u00e9-hex-first", "\u00e9-non-ascii", "fff", "0", "nested/" + data_key("", str(uuidlib.uuid4()), 1)]
    keys += [p + k for k in odd]
    keys += [data_key(p + "pfx/", str(uuidlib.uuid4()), 7)]  # a nested location, excluded
    keys += ["outside-the-prefix"] if p else []
    for k in keys:
        blob_store.put(k, b"x")
    excl = [p + "pfx/"]
    full = list(list_objects(blob_store, prefix, exclude_prefixes=excl, page_size=7))
    parts = [r for lp in listing_prefixes(prefix)
             for r in list_objects(blob_store, prefix, lp, exclude_prefixes=excl, page_size=3)]
    rest = list(list_rest(blob_store, prefix, exclude_prefixes=excl, page_size=2))
    split = parts + rest
    assert len(split) == len({r.key for r in split})  # nothing listed twice
    assert sorted(split) == sorted(full)
    assert {r.key for r in full} == {k for k in keys if k.startswith(p) and not k.startswith(p + "pfx/")}
    assert {r.key for r in rest} == {p + k for k in odd if k[0] not in "0123456789abcdef"}
    parsed = [r for r in full if r.uuid is not None]
    assert len(parsed) == 80 and all(r.ledger_id is not None for r in parsed)
    assert all(r.is_index is None for r in full if r.uuid is None)


def test_uuid_from_halves_matches_the_formats_module():
    import random

    from tieredcore.formats.uuids import msb_lsb_to_uuid, uuid_to_msb_lsb
    from tieredcore.offload.context import uuid_from_halves

    rnd = random.Random(7)
    for u in [uuidlib.UUID(int=0), uuidlib.UUID(int=(1 << 128) - 1)] + [uuidlib.UUID(int=rnd.getrandbits(128))
                                                                        for _ in range(200)]:
        msb, lsb = uuid_to_msb_lsb(u)  # signed halves, as in the protobuf
        assert uuid_from_halves(msb, lsb) == str(msb_lsb_to_uuid(msb, lsb)) == str(u)


def test_gc_paused_restores_the_collectors_state() -> None:
    import gc

    from tieredcore.lifecycle.reconcile.listing import gc_paused

    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError("a listing failed")
    assert gc.isenabled()  # back on after an error too
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # a caller that had it off keeps it off
    finally:
        gc.enable()
