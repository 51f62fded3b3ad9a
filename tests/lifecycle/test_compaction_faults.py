"""Compaction when a store fails under it (tieredcore/lifecycle/compaction.py).

- S3 (moto behind tests/support/faulty_s3_proxy.py, one attempt per request) answers one request of the
  new segment with a 500 InternalError: its second UploadPart, its CompleteMultipartUpload or the PUT of
  its index (four small V1 objects, one batch).
- On the filesystem store (the mixed topic of tests/support/compaction.py, two batches) a byte of the new
  segment's data object is flipped after it was written, before it is verified (a store that corrupted
  it).

In both the batch fails and nothing the topic references changes (its record is exactly as before); the
attempt leaves no object or unfinished upload (or, written whole, only its recorded objects), its segment
is in the deletion log (compaction-conflict); after the drain and reconciliation no orphan; every entry
reads back; the next run compacts.

- The metadata store fails the switch CAS (applied or not): the outcome is unknown, nothing is taken
  back; the next run resolves it.
"""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Iterator

import boto3
import pytest

from tests.support.compaction import (
    LATER,
    KiB,
    assert_clean,
    compactor,
    copies,
    mixed_topic,
    pending,
    units_of,
)
from tests.support.faulty_s3_proxy import INTERNAL_ERROR, FaultyS3Proxy, segment_write_request
from tests.support.offload_harness import FaultyMetadataStore, raiser
from tests.support.segments import (
    NS,
    TOPIC,
    Snapshot,
    completed_segments,
    drain_and_reconcile,
    hot_snapshot,
    incomplete_segments,
    segment_keys_of,
    segment_offloader,
    store_uploads,
)
from tests.support.workspaces import END_MS, build_workspace, offload, sealed
from tieredcore.config import ENV_CONFIG, ENV_OVERRIDES, Config
from tieredcore.errors import MetadataStoreError
from tieredcore.lifecycle.drain import drain
from tieredcore.meta.deletion_log import TYPE_SEGMENT
from tieredcore.meta.managed_ledgers import ManagedLedgerStore
from tieredcore.meta.reasons import Reason
from tieredcore.offload.batches import BLOCK_SIZE
from tieredcore.offload.offloader import LedgerOffloader
from tieredcore.offload.segments import SegmentOffloader
from tieredcore.workspace import Workspace

MIN_SIZE, TARGET = 80 * KiB, 160 * KiB


@pytest.fixture
def env_clean(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (*ENV_OVERRIDES, ENV_CONFIG):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TIERED_NO_PROGRESS", "1")


@pytest.fixture
def s3_ws(tmp_path, moto_endpoint: str, env_clean) -> Iterator[tuple[Workspace, Snapshot, FaultyS3Proxy]]:
    bucket = f"cpt-{uuidlib.uuid4().hex[:20]}"
    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    with FaultyS3Proxy(moto_endpoint, rate=0.0) as proxy:
        url = f"s3://{bucket}/p?endpoint={proxy.url}&region=us-east-1&max_attempts=1&read_timeout=10"
        # four ~32 KiB ledgers offloaded as V1 objects: one batch
        cfg = build_workspace(tmp_path / "ws", [NS], ledgers=4, entries=20, entry_size="100-3000", store_url=url)
        with Workspace(Config.load(cfg, env={})) as ws:
            offload(ws, TOPIC, sealed(ws, TOPIC), END_MS)
            yield ws, hot_snapshot(ws), proxy




class First:
    """on_step hook: ``action(uuid)`` once, at ``step`` of the first segment assigned."""

    def __init__(self, step: str, action) -> None:
        self.step, self.action = step, action
        self.uuids: list[str] = []

    def __call__(self, step: str, uuid: str) -> None:
        if step == "assigned":
            self.uuids.append(uuid)
        if step == self.step and self.uuids == [uuid]:
            self.action(uuid)


def failed_cleanly(ws: Workspace, rows, ours: str, record_before: bytes, error: str, objects: int = 0) -> None:
    """The batch failed, the record is as before, our segment is recorded for deletion; ``objects``: how
    many of its objects the writer left (a complete segment is only recorded: the drain deletes it)."""
    assert [r.outcome for r in rows] == ["failed"], [(r.outcome, r.error) for r in rows]
    assert error in rows[0].error, rows[0].error
    info, _ = ws.ml.get_topic(TOPIC)
    assert info.SerializeToString() == record_before  # nothing the topic references changed
    assert incomplete_segments(ws) == {}
    assert len(segment_keys_of(ws, ours)) == objects and store_uploads(ws) == []
    assert [(t, r, u) for t, r, u, _n in pending(ws)] == [(TYPE_SEGMENT, "compaction-conflict", ours)]


def rerun_and_check(ws: Workspace, before: Snapshot, batches: int) -> None:
    drain_and_reconcile(ws, LATER)  # the failed attempt leaves nothing for reconciliation
    assert_clean(ws, before)
    rows = compactor(ws, min_object_size=MIN_SIZE, target_size=TARGET, clock_ms=LATER).compact_topic(TOPIC)
    assert [r.outcome for r in rows] == ["compacted"] * batches, [(r.outcome, r.error) for r in rows]
    drain_and_reconcile(ws, LATER)
    assert_clean(ws, before)
    assert {t for ps in copies(ws).values() for t, _u, _f, _l in ps} == {TYPE_SEGMENT}


@pytest.mark.parametrize("op", ["upload_part", "complete_multipart", "put_index"])
def test_a_store_failure_while_writing_the_new_segment(s3_ws, op):
    ws, before, proxy = s3_ws
    record_before = ws.ml.get_topic(TOPIC)[0].SerializeToString()
    hook = First("assigned", lambda u: proxy.inject(segment_write_request(op, u), INTERNAL_ERROR))
    # 8 KiB blocks in parts of at least 16 KiB: the segment takes several parts
    c = compactor(ws, min_object_size=MIN_SIZE, target_size=TARGET, on_step=hook, block_size=8 * KiB,
                  min_part_size=16 * KiB)
    rows = c.compact_topic(TOPIC)
    assert proxy.faults == {INTERNAL_ERROR: 1}
    failed_cleanly(ws, rows, hook.uuids[0], record_before, "InternalError")
    rerun_and_check(ws, before, 1)
    assert proxy.faults == {INTERNAL_ERROR: 1}


@pytest.mark.parametrize("checksums", [True, False], ids=["chunk-checksums", "no-checksums"])
def test_a_segment_that_does_not_read_back_as_written_is_not_switched_to(tmp_path, env_clean, checksums):
    """With chunk checksums the read-back fails on them; without, compaction's own comparison of what
    it read back with what it wrote (per ledger: entries, bytes, CRC32C) catches the flipped byte."""
    cfg, before = mixed_topic(tmp_path / "ws")
    with Workspace(Config.load(cfg, env={})) as ws:
        record_before = ws.ml.get_topic(TOPIC)[0].SerializeToString()
        seg = segment_offloader(ws)

        def flip(uuid: str) -> None:  # a payload byte of the last block, as a faulty store might
            dkey = seg.keys(uuid)[0]
            md, data = ws.store.head(dkey).metadata, bytearray(ws.store.get(dkey))
            data[-5] ^= 0x01
            ws.store.put(dkey, bytes(data), md)

        hook = First("written", flip)
        c = compactor(ws, min_object_size=MIN_SIZE, target_size=TARGET, on_step=hook)
        if not checksums:
            off = LedgerOffloader(ws.store, ws.offloader.prefix, cluster=ws.config.cluster, checksum_chunk=0,
                                  owner=ws.identity)
            c.segments = SegmentOffloader(off, block_size=BLOCK_SIZE)
        rows = c.compact_topic(TOPIC)
        failed_cleanly(ws, rows, hook.uuids[0], record_before,
                       "fail their CRC32C checksum" if checksums else "read back", objects=2)
        rerun_and_check(ws, before, 2)


@pytest.mark.parametrize("landed", [False, True], ids=["not-landed", "landed"])
def test_a_metadata_error_at_the_switch_leaves_the_outcome_to_the_next_run(tmp_path, env_clean, landed):
    """The switch CAS raises MetadataStoreError (a wrapper around the real SQLite store: applied or not,
    the client cannot tell). Outcome unknown: nothing taken back, nothing recorded beyond the old objects
    (due after the delay, and kept by the drain while they are still referenced). The next run resolves
    it: a switch that landed stays (nothing left to do), one that did not is a crashed attempt, recorded
    and replaced."""
    cfg, before = mixed_topic(tmp_path / "ws")
    with Workspace(Config.load(cfg, env={})) as ws:
        layout = copies(ws)
        meta = FaultyMetadataStore(ws.metadata)

        def arm(_uuid: str) -> None:  # the next topic-record write is the switch
            nth = meta.faults.calls["put"] + 1
            if landed:
                meta.fail_after_put(nth)
            else:
                meta.faults.on("put", nth, raiser(MetadataStoreError("injected: connection lost at the switch")))

        hook = First("recorded", arm)
        c = compactor(ws, min_object_size=MIN_SIZE, target_size=TARGET, on_step=hook)
        c.ml = ManagedLedgerStore(meta)
        rows = c.compact_topic(TOPIC)
        assert [r.outcome for r in rows] == ["unknown"], [(r.outcome, r.error) for r in rows]
        ours = hook.uuids[0]
        assert len(segment_keys_of(ws, ours)) == 2
        old = units_of(layout, list(before)[:2])
        assert [(t, r, u) for t, r, u, _n in pending(ws)] == sorted((t, "compaction", u) for u, t in old.items())
        if landed:
            assert incomplete_segments(ws) == {} and ours in {p[1] for p in copies(ws)[list(before)[0]]}
        else:
            assert copies(ws) == layout and list(incomplete_segments(ws)) == [ours]
            rep = drain(ws, LATER)  # the old objects are still what the topic reads from
            assert (rep.entries, rep.still_in_use, rep.deleted) == (2, 2, 0), rep.rows

        rows = compactor(ws, min_object_size=MIN_SIZE, target_size=TARGET).compact_topic(TOPIC)
        assert [r.outcome for r in rows] == ["compacted"] * (1 if landed else 2), [(r.outcome, r.error) for r in rows]
        if not landed:
            assert (TYPE_SEGMENT, Reason.OFFLOAD_CLEANUP, ours) in {(t, r, u) for t, r, u, _n in pending(ws)}
        drain_and_reconcile(ws, LATER)
        assert_clean(ws, before)
        assert (ours in completed_segments(ws)) == landed and len(segment_keys_of(ws, ours)) == 2 * landed
