"""Key management over a workspace's transformed objects: which key each object needs (status), rotation
that rewrites only manifests (dry run, idempotent rerun, interrupted then resumed), retiring refused while
anything needs the key, and clear errors when a key is missing or wrong.

The sweep writes the objects (namespace t/a: zstd+aes, t/b: zstd only, t/c: untransformed). RSA keys
are generated once per module and copied into each test's own ring."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support.offload_harness import FaultyBlobStore, raiser
from tests.support.segments import hot_snapshot
from tests.support.workspaces import END_MS, sealed
from tieredcore.cold.blob import iter_objects
from tieredcore.cold.keyring import KeyRing, KeyRingError
from tieredcore.errors import BlobStoreError, FormatError, NotFoundError, ValidationError
from tieredcore.formats.keys import MANIFEST_SUFFIX
from tieredcore.formats.manifest import Manifest
from tieredcore.lifecycle.keys import RotationReport, find_manifests, key_status, retire, rotate
from tieredcore.lifecycle.runner import run_work
from tieredcore.lifecycle.sweep import plan_offload
from tieredcore.lifecycle.work import LedgerResult
from tieredcore.names import TopicName
from tieredcore.offload.context import driver_metadata_from_dict
from tieredcore.offload.copies import open_offloaded
from tieredcore.outcomes import Outcome
from tieredcore.workspace import Workspace

ENC, ZSTD, PLAIN = "t/a", "t/b", "t/c"
TOPIC = {ns: f"persistent://{ns}/topic-0000" for ns in (ENC, ZSTD, PLAIN)}
LEDGERS = 3  # sealed ledgers per topic: 2 objects (data, index) each, each with a manifest when transformed


@pytest.fixture(scope="module")
def key_pool(tmp_path_factory) -> Path:
    """PEM files of keys k1, k2, k3 (generated once)."""
    d = tmp_path_factory.mktemp("pool")
    for k in ("k1", "k2", "k3"):
        KeyRing.add_key(d, k, bits=2048)
    return d


def make_ring(path: Path, pool: Path, ids: list[str], active: str) -> Path:
    path.mkdir(mode=0o700)
    for k in ids:
        shutil.copy(pool / f"{k}.pem", path / f"{k}.pem")
    (path / "active").write_text(active + "\n")
    return path


def add_to_ring(ring: Path, pool: Path, kek: str, activate: bool = True) -> None:
    shutil.copy(pool / f"{kek}.pem", ring / f"{kek}.pem")
    if activate:
        (ring / "active").write_text(kek + "\n")


@pytest.fixture
def setup(make_ws, key_pool, tmp_path):
    """(workspace config, ring dir, hot snapshot per namespace): every sealed ledger offloaded under k1."""
    ring = make_ring(tmp_path / "ring", key_pool, ["k1"], "k1")
    ws = make_ws([ENC, ZSTD, PLAIN], ledgers=LEDGERS, entries=60, entry_size="20-2000",
                 config_overrides={"key_ring": str(ring)})
    ps = ws.policies
    ps.set_namespace(ENC, {"offload_threshold_bytes": 0, "transform": "zstd+aes", "transform_chunk_size": 4096})
    ps.set_namespace(ZSTD, {"offload_threshold_bytes": 0, "transform": "zstd", "transform_chunk_size": 4096})
    ps.set_namespace(PLAIN, {"offload_threshold_bytes": 0})
    before = {ns: hot_snapshot(ws, TOPIC[ns]) for ns in TOPIC}
    res = [LedgerResult(**r) for r in run_work(ws.config, [w.as_dict() for w in plan_offload(ws, None, END_MS)])]
    assert len(res) == 3 * LEDGERS and all(r.outcome == "offloaded" for r in res), res
    return ws.config, ring, before


def fresh(config) -> Workspace:
    """A new workspace (the key ring loaded again, as a new process would)."""
    return Workspace(config)


def physical(ws: Workspace) -> dict[str, bytes]:
    """Every object of the workspace's store but the owner marker: key -> bytes."""
    store = ws.store
    return {o.key: store.get(o.key) for o in iter_objects(store) if "tiered-owner." not in o.key}


def data_objects(objs: dict[str, bytes]) -> dict[str, bytes]:
    return {k: v for k, v in objs.items() if not k.endswith(MANIFEST_SUFFIX)}


def kek_of(objs: dict[str, bytes]) -> dict[str, str | None]:
    return {k: Manifest.from_json(v, k).kek_id for k, v in objs.items() if k.endswith(MANIFEST_SUFFIX)}


def read_back(ws: Workspace, ns: str) -> dict[int, list[bytes]]:
    """Every entry of the namespace's topic from its offloaded copies (never the hot tier)."""
    info, _ = ws.ml.get_topic(TOPIC[ns])
    out = {}
    for li in info.ledgerInfo[:-1]:
        h = open_offloaded(li, ws.offloader, TopicName.parse(TOPIC[ns]).managed_ledger_name, ws.offloader_for_driver)
        try:
            out[li.ledgerId] = [bytes(e.data) for e in h.read(0, li.entries - 1)]
        finally:
            h.close()
    return out


def sealed_snapshot(ws: Workspace, before: dict, ns: str) -> dict[int, list[bytes]]:
    keep = set(sealed(ws, TOPIC[ns]))
    return {lid: v for lid, v in before[ns].items() if lid in keep}


def test_status_counts_objects_per_key(setup, key_pool):
    config, ring, _ = setup
    n_enc, n_zstd = 2 * LEDGERS, 2 * LEDGERS
    with fresh(config) as ws:
        st = key_status(ws)
        assert st.errors == [] and st.unreadable.objects == 0 and st.foreign == 0
        assert st.objects == n_enc + n_zstd  # untransformed objects have no manifest
        assert {k: u.objects for k, u in st.by_kek.items()} == {"k1": n_enc}
        assert st.unencrypted.objects == n_zstd
        assert st.active == "k1" and st.ring_keys == ["k1"] and st.missing == []
        assert len(st.by_kek["k1"].samples) == 5 and len(set(st.by_kek["k1"].samples)) == 5
        assert st.as_dict()["keys"] == [{"id": "k1", "active": True, "on_ring": True, "retired": False,
                                         "objects": n_enc, "samples": st.by_kek["k1"].samples}]
        # another cluster's object in the same location: counted apart, never needing our keys
        mkey = st.by_kek["k1"].samples[0] + MANIFEST_SUFFIX
        m = Manifest.from_json(ws.store.get(mkey), mkey)
        ws.store.put(mkey, Manifest(m.object_id, m.index, m.compression, m.data_key,
                                    {**m.metadata, "pulsarclustername": "elsewhere"}).to_json(),
                     ws.store.head(mkey).metadata)
    add_to_ring(ring, key_pool, "k2")
    with fresh(config) as ws:
        st = key_status(ws)
        assert st.foreign == 1 and st.needing("k1") == n_enc - 1 and st.needing("k2") == 0
        assert st.active == "k2" and st.ring_keys == ["k1", "k2"]
        rows = rotate(ws, find_manifests(ws).refs)
        (foreign,) = [r for r in rows if r.reason.startswith("not ours")]
        assert foreign.outcome == Outcome.SKIPPED and "cluster 'elsewhere'" in foreign.reason
        assert Manifest.from_json(ws.store.get(mkey), mkey).kek_id == "k1"  # left alone
        st = key_status(ws)
        assert st.needing("k1") == 0 and st.needing("k2") == n_enc - 1


def test_rotate_dry_run_then_rotate_then_retire(setup, key_pool):
    config, ring, before = setup
    n_enc, n_zstd = 2 * LEDGERS, 2 * LEDGERS
    add_to_ring(ring, key_pool, "k2")
    with fresh(config) as ws:
        start = physical(ws)
        with pytest.raises(ValidationError, match=rf"refused: key k1 is still needed by {n_enc} object\(s\).*"
                                                  r"run `tiered keys rotate`"):
            retire(ws, "k1")
        with pytest.raises(ValidationError, match="k2 is the active key"):
            retire(ws, "k2")
        with pytest.raises(NotFoundError, match="no key k9"):
            retire(ws, "k9")
        assert (ring / "k1.pem").exists()

        listing = find_manifests(ws)
        assert len(listing.refs) == n_enc + n_zstd and listing.errors == []
        dry = rotate(ws, listing.refs, dry_run=True)
        assert sorted(r.outcome for r in dry) == [Outcome.SKIPPED] * n_zstd + [Outcome.WOULD_REWRAP] * n_enc
        assert physical(ws) == start  # a dry run writes nothing

        rows = rotate(ws, listing.refs)
        rep = RotationReport.of("k2", False, rows, listing)
        assert rep.outcomes() == {Outcome.REWRAPPED: n_enc, Outcome.SKIPPED: n_zstd} and rep.failures == 0
        assert {r.reason for r in rows if r.outcome == Outcome.SKIPPED} == {"not encrypted"}
        assert {(r.kek_from, r.kek_to) for r in rows if r.outcome == Outcome.REWRAPPED} == {("k1", "k2")}
        after = physical(ws)
        assert data_objects(after) == data_objects(start)  # chunks never rewritten
        assert set(kek_of(after).values()) == {"k2", None}

        again = rotate(ws, find_manifests(ws).refs)  # idempotent
        assert {r.outcome for r in again} == {Outcome.SKIPPED}
        assert physical(ws) == after
        assert key_status(ws).needing("k1") == 0
        assert retire(ws, "k1") == ring / "k1.pem.retired"
    with fresh(config) as ws:
        st = key_status(ws)
        assert st.ring_keys == ["k2"] and st.retired_keys == ["k1"]
        assert [k["id"] for k in st.key_rows() if k["retired"]] == ["k1"]
        for ns in (ENC, ZSTD):
            assert read_back(ws, ns) == sealed_snapshot(ws, before, ns)


class Crash(BaseException):
    """The process dying mid-rotation (nothing catches it)."""


def test_rotation_interrupted_and_resumed(setup, key_pool):
    config, ring, before = setup
    n_enc = 2 * LEDGERS
    add_to_ring(ring, key_pool, "k2")
    with fresh(config) as ws:
        start = physical(ws)
        refs = find_manifests(ws).refs
        (driver,) = {str(r.driver): r.driver for r in refs}.values()
        store = ws.offloader_for_driver(driver_metadata_from_dict(driver)).store  # the one rotate uses
        faulty = FaultyBlobStore(store.inner)
        store.inner = faulty
        faulty.faults.on("put", 3, raiser(Crash()))  # rotation writes manifests only
        with pytest.raises(Crash):
            rotate(ws, refs)
    with fresh(config) as ws:
        st = key_status(ws)
        assert st.needing("k2") == 2 and st.needing("k1") == n_enc - 2  # each object under one key or the other
        assert read_back(ws, ENC) == sealed_snapshot(ws, before, ENC)  # both keys on the ring: all readable

        # a rerun whose store fails one manifest put: that object fails, the others go on
        refs = find_manifests(ws).refs
        store = ws.offloader_for_driver(driver_metadata_from_dict(refs[0].driver)).store
        faulty = FaultyBlobStore(store.inner)
        store.inner = faulty
        faulty.faults.on("put", 1, raiser(BlobStoreError("injected: the store failed a put")))
        rows = rotate(ws, refs)
        failed = [r for r in rows if r.failed]
        assert len(failed) == 1 and "injected" in failed[0].reason and failed[0].kek_from == "k1"
        assert sum(r.outcome == Outcome.REWRAPPED for r in rows) == n_enc - 2 - 1
    with fresh(config) as ws:
        rows = rotate(ws, find_manifests(ws).refs)  # resumed: only what is left
        assert [r.key for r in rows if r.outcome == Outcome.REWRAPPED] == [failed[0].key]
        end = physical(ws)
        assert data_objects(end) == data_objects(start)
        assert {k: v for k, v in kek_of(end).items() if v is not None} == {
            k: "k2" for k, v in kek_of(start).items() if v is not None}
        retire(ws, "k1")
    with fresh(config) as ws:
        assert read_back(ws, ENC) == sealed_snapshot(ws, before, ENC)


def test_missing_and_wrong_keys_are_clear_errors(setup, key_pool):
    config, ring, _ = setup
    add_to_ring(ring, key_pool, "k2")
    (ring / "k1.pem").rename(ring / "k1.pem.retired")  # taken off the ring with objects still needing it
    with fresh(config) as ws:
        st = key_status(ws)
        assert st.missing == ["k1"] and st.needing("k1") == 2 * LEDGERS
        assert [k for k in st.key_rows() if k["id"] == "k1"] == [
            {"id": "k1", "active": False, "on_ring": False, "retired": True, "objects": 2 * LEDGERS,
             "samples": st.by_kek["k1"].samples}]
        with pytest.raises(KeyRingError, match=r"wrapped by key k1, which is not on key ring .*restore its PEM"):
            read_back(ws, ENC)
        rows = rotate(ws, find_manifests(ws).refs)
        failed = [r for r in rows if r.failed]
        assert len(failed) == 2 * LEDGERS and all("which is not on key ring" in r.reason for r in failed)
        dry = rotate(ws, find_manifests(ws).refs, dry_run=True)
        assert sum(r.failed for r in dry) == 2 * LEDGERS  # a dry run finds it too
        with pytest.raises(NotFoundError, match="no key k1"):
            rotate(ws, [], target="k1")
    # a different key under the same id
    shutil.copy(key_pool / "k3.pem", ring / "k1.pem")
    with fresh(config) as ws, pytest.raises(KeyRingError, match=r"does not unwrap with k1.pem .*same id"):
        read_back(ws, ENC)


def test_unreadable_manifest_blocks_retiring(setup, key_pool):
    config, ring, _ = setup
    add_to_ring(ring, key_pool, "k2")
    with fresh(config) as ws:
        rotate(ws, find_manifests(ws).refs)
        bad = next(k for k, v in kek_of(physical(ws)).items() if v == "k2")
        ws.store.put(bad, b"{not json", ws.store.head(bad).metadata)
    with fresh(config) as ws:
        st = key_status(ws)
        assert st.unreadable.objects == 1 and bad.removesuffix(MANIFEST_SUFFIX) in st.unreadable.samples[0]
        with pytest.raises(ValidationError, match=r"cannot tell whether key k1 is still needed: 0 location\(s\) "
                                                  r"not listed, 1 manifest\(s\) unreadable"):
            retire(ws, "k1")
        rows = rotate(ws, find_manifests(ws).refs)
        (f,) = [r for r in rows if r.failed]
        assert f.reason.startswith(FormatError.__name__) and "not JSON" in f.reason
    assert (ring / "k1.pem").exists()
