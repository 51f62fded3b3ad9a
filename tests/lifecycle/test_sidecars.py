"""Entry-offsets sidecars in a workspace (docs/formats.md "Entry offsets sidecar"): recorded by catch-up
reads and deep scrubs of pairs without checkpoints, written only into stores the workspace claimed, and
part of their pair's object group for the deletion drain and reconciliation.

The workspace's own objects are written with ``checkpoint_interval = 0`` and ``checksum_chunk = 0``: the
bytes Pulsar's offloader writes (tests/offload/test_sidecar.py checks that layout against
tests/support/pulsar_objects.py, built from Pulsar's BlobStoreManagedLedgerOffloader); pairs a Pulsar
broker wrote into a bucket the workspace never claimed come from tests/support/pulsar_objects.py."""

from __future__ import annotations

import logging
import random
import time
import uuid as uuidlib
from pathlib import Path

import pytest

from tests.support import pulsar_objects
from tests.support.workspaces import END_MS, sealed
from tieredcore.cold.blob import ObjectInfo, iter_objects
from tieredcore.cold.location import StoreLocation
from tieredcore.cold.requests import count_requests
from tieredcore.formats.keys import data_key, index_key, offsets_key
from tieredcore.lifecycle.drain import drain
from tieredcore.lifecycle.keys import find_manifests
from tieredcore.lifecycle.reconcile.listing import parse_row
from tieredcore.lifecycle.reconcile.orphans import find_object_orphans
from tieredcore.lifecycle.reconcile.run import reconcile
from tieredcore.lifecycle.runner import run_work
from tieredcore.lifecycle.scrub import plan_scrub
from tieredcore.lifecycle.work import LedgerResult
from tieredcore.meta.deletion_log import TYPE_OFFLOADED, DeletionLog, DeletionRecord
from tieredcore.offload.cache import OffsetCache
from tieredcore.offload.context import context_uuid
from tieredcore.offload.sidecar import flush_writes
from tieredcore.offload.verify import verify_offloaded

T = "persistent://t/a/topic-0000"
ML = "t/a/persistent/topic-0000"
GRACE = 3600 * 1000
PULSAR_LAYOUT = {"checksum_chunk": 0, "checkpoint_interval": 0}


@pytest.fixture
def ws(make_ws):
    """One topic, 3 sealed ledgers of 400 ~1 KiB entries, offloaded without checkpoints or checksums."""
    w = make_ws(["t/a"], ledgers=3, entries=400, entry_size="1000-1024", config_overrides=PULSAR_LAYOUT)
    res = w.topic_offloader().offload_ledgers(T, sealed(w, T))
    assert [r.outcome for r in res] == ["offloaded"] * 3
    return w


def copies(ws) -> list[tuple[int, str]]:
    info, _ = ws.ml.get_topic(T)
    return [(li.ledgerId, context_uuid(li)) for li in info.ledgerInfo if li.HasField("offloadContext")]


def sidecars(store) -> list[str]:
    return sorted(o.key for o in iter_objects(store) if o.key.endswith("-offsets"))


def scrub(ws, deep: bool) -> dict:
    work = plan_scrub(ws, None, END_MS, deep=deep)
    return {r["ledger"]: LedgerResult(**r) for r in run_work(ws.config, [w.as_dict() for w in work])}


def test_a_catch_up_read_records_them_and_random_reads_use_them(ws, make_ws) -> None:
    r = ws.reader()
    try:
        with count_requests() as c:
            n = sum(1 for _ in r.read(T))
            flush_writes()
    finally:
        r.close()
    info, _ = ws.ml.get_topic(T)
    assert n == sum(li.entries for li in info.ledgerInfo)
    want = sorted(offsets_key("", u, lid) for lid, u in copies(ws))
    assert sidecars(ws.store) == want and c.total()["PUT"] == 3
    md = ws.store.head(want[0]).metadata
    assert (md["tieredowner"], md["pulsarclustername"], md["role"]) == (ws.identity, "standalone", "offsets")

    lid, u = copies(ws)[1]
    off = ws.offloader_at(ws.config.store_location)
    off.offset_cache = OffsetCache()  # another process: nothing cached
    h = off.read_offloaded(lid, u)
    rng = random.Random(5)
    gets = []
    for _ in range(20):
        e = rng.randrange(h.last_add_confirmed + 1)
        with count_requests() as c:
            assert h.read(e, e)[0].entry_id == e
        gets.append(c.total()["GET"])
    assert h.sidecar.requests == 1 and gets[0] <= 3 and max(gets[1:]) <= 2, gets


def test_a_deep_scrub_records_them_once_and_a_shallow_one_never(ws) -> None:
    assert {r.outcome for r in scrub(ws, deep=False).values()} == {"ok"}
    flush_writes()
    assert sidecars(ws.store) == []
    with count_requests() as c:
        assert {r.outcome for r in scrub(ws, deep=True).values()} == {"ok"}
    assert sidecars(ws.store) == sorted(offsets_key("", u, lid) for lid, u in copies(ws))
    assert c.total()["PUT"] == 3
    with count_requests() as c:  # already there: read (one GET each), not written again
        assert {r.outcome for r in scrub(ws, deep=True).values()} == {"ok"}
    assert c.total()["PUT"] == 0


def test_nothing_is_written_into_a_store_the_workspace_never_claimed(ws, make_ws, tmp_path: Path, caplog) -> None:
    """A bucket a Pulsar broker wrote (the workspace only reads it) and a store another workspace claimed:
    reads work as before, no sidecar and no owner marker appear; once claimed, sidecars are recorded."""
    caplog.set_level(logging.INFO, "tieredcore.offload.sidecar")
    bucket = tmp_path / "pulsar-bucket"
    loc = StoreLocation.from_url(f"file://{bucket}")
    off = ws.offloader_at(loc)
    payloads = [bytes([i % 251]) * 1000 for i in range(300)]
    pair = pulsar_objects.build(payloads, ledger_id=77)
    pulsar_objects.write(off.store, pair)
    h = off.read_offloaded(77, pair.uuid)
    assert [bytes(e.data) for e in h.read(0, 299)] == payloads
    flush_writes()
    assert sorted(o.key for o in iter_objects(off.store)) == [pair.data_key, pair.index_key]
    assert "is not claimed by this workspace" in caplog.text

    other = make_ws(["t/b"], ledgers=1)
    lid, u = copies(ws)[0]
    h = other.offloader_at(ws.config.store_location).read_offloaded(lid, u)
    h.read(0, h.last_add_confirmed)
    flush_writes()
    assert sidecars(ws.store) == [] and "claimed by another workspace" in caplog.text

    ws.claim(off.store, "")  # e.g. the workspace offloads there too from now on
    h = off.read_offloaded(77, pair.uuid)
    h.read(0, 299)
    flush_writes()
    assert sidecars(off.store) == [offsets_key("", pair.uuid, 77)]


def _abandoned_with_sidecar(ws, lid: int) -> str:
    """An offload attempt nothing references, read in full once (so its sidecar is recorded)."""
    u = str(uuidlib.uuid4())
    ws.offloader.offload(ws.hot.open_ledger(lid), u, {"managedledgername": ML})
    verify_offloaded(ws.offloader.read_offloaded(lid, u))
    assert ws.store.head(offsets_key("", u, lid))
    return u


def test_the_drain_deletes_a_sidecar_with_its_pair_and_alone(ws) -> None:
    lid = sealed(ws, T)[0]
    u_pair, u_alone = _abandoned_with_sidecar(ws, lid), _abandoned_with_sidecar(ws, lid)
    ws.store.delete([data_key("", u_alone, lid), index_key("", u_alone, lid)])  # e.g. Pulsar deleted its pair
    drv = {"name": ws.offloader.location.driver_dict()["name"],
           "properties": ws.offloader.location.driver_dict()["properties"]}
    DeletionLog(ws.metadata).append([DeletionRecord(topic=ML, ledger_id=lid, type=TYPE_OFFLOADED,
                                                    reason="offload-cleanup", created_ms=END_MS, uuid=u,
                                                    driver=drv) for u in (u_pair, u_alone)])
    rep = drain(ws, END_MS + 1)
    assert sorted(r.outcome for r in rep.rows) == ["deleted", "deleted"]
    left = {o.key for o in iter_objects(ws.store) if not o.key.startswith("tiered-topic-manifests/")}
    assert not any(u_pair in k or u_alone in k for k in left)
    assert sum(1 for k in left if k.endswith("-offsets")) == 0 and len(left) == 1 + 2 * 3  # marker, 3 pairs


def test_reconciliation_keeps_a_sidecar_with_its_pair(ws) -> None:
    for lid, _u in copies(ws):  # referenced pairs with their sidecars: never orphans
        lid_h = ws.offloader.read_offloaded(lid, _u)
        verify_offloaded(lid_h)
    lid = sealed(ws, T)[1]
    u_pair, u_alone = _abandoned_with_sidecar(ws, lid), _abandoned_with_sidecar(ws, lid)
    ws.store.delete([data_key("", u_alone, lid), index_key("", u_alone, lid)])
    as_of = int(time.time() * 1000) + 3 * GRACE
    rep = reconcile(ws, as_of, GRACE)
    assert rep.orphan_groups == 2 and rep.foreign_keys == 0
    pending = {e.record.uuid: e.record for e in DeletionLog(ws.metadata).pending()}
    assert set(pending) == {u_pair, u_alone} and pending[u_alone].topic == ML  # the sidecar names its topic
    drain(ws, as_of)
    assert sidecars(ws.store) == sorted(offsets_key("", u, lid) for lid, u in copies(ws))
    assert reconcile(ws, as_of, GRACE, dry_run=True).orphan_groups == 0
    assert find_manifests(ws).refs == []  # key rotation: a sidecar is not a transformed object's manifest
    r = ws.reader()
    try:
        assert sum(1 for _ in r.read(T)) == sum(li.entries for li in ws.ml.get_topic(T)[0].ledgerInfo)
    finally:
        r.close()


def test_orphan_groups_count_a_sidecar_as_neither_data_nor_index() -> None:
    u = [str(uuidlib.UUID(int=i)) for i in range(1, 4)]

    def row(key: str):
        return parse_row(ObjectInfo(key, 10, 0.1), "")

    rows = [row(data_key("", u[0], 1)), row(index_key("", u[0], 1)), row(offsets_key("", u[0], 1)),  # referenced
            row(data_key("", u[1], 2)), row(index_key("", u[1], 2)), row(offsets_key("", u[1], 2)),  # orphan pair
            row(offsets_key("", u[2], 3)), row(offsets_key("", u[2], 3) + ".manifest")]  # a lone sidecar
    r = find_object_orphans(rows, {u[0]}, as_of_ms=10_000, grace_ms=100)
    assert [(g.uuid, g.ledger_id, len(g.keys), g.has_data, g.has_index, g.has_offsets) for g in r.groups] == [
        (u[1], 2, 3, True, True, True), (u[2], 3, 2, False, False, True)]
    assert (r.referenced_objects, r.foreign_keys) == (3, 0)
