"""Failures of the streaming (PIP-76) segment protocol (tieredcore/offload/streaming.py), one at an exact
call, then the next run and the drain: data intact, nothing leaked or doubled (tests/support/segments.py
``assert_segments_clean``).

- The object store failing an UploadPart, the CompleteMultipartUpload or the index PUT of the second
  segment: a real S3 server (moto) behind tests/support/faulty_s3_proxy.py, which answers that one
  request with a 500 InternalError (the client makes one attempt). The writer leaves nothing behind, the
  attempt's segment goes to the deletion log (reason offload-conflict) and the run stops.
- The metadata store raising MetadataStoreError at the completion CAS (a wrapper around the real SQLite
  store: a server cannot be made to fail one exact write, let alone fail it after applying it): the
  outcome is unknown, so nothing is deleted and nothing recorded; whether the write landed or not, the
  next run resolves it.
- A concurrent run (another process that took the topic over) completing the topic between our index
  and our completion CAS: ours loses, goes to the deletion log, the drain deletes it.
"""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Iterator

import boto3
import pytest

from tests.support.faulty_s3_proxy import INTERNAL_ERROR, FaultyS3Proxy, segment_write_request
from tests.support.offload_harness import FaultyMetadataStore, raiser
from tests.support.segments import (
    DAY_MS,
    assert_segments_clean,
    build_topic,
    completed_segments,
    drain_and_reconcile,
    hot_snapshot,
    incomplete_segments,
    offload_everything,
    read_topic,
    segment_keys_of,
    segment_offloader,
    store_uploads,
    streaming,
)
from tests.support.workspaces import END_MS
from tieredcore.clock import now_ms
from tieredcore.config import ENV_CONFIG, ENV_OVERRIDES, Config
from tieredcore.errors import MetadataStoreError
from tieredcore.lifecycle.drain import drain
from tieredcore.meta.deletion_log import TYPE_SEGMENT
from tieredcore.meta.managed_ledgers import ManagedLedgerStore
from tieredcore.meta.reasons import Reason
from tieredcore.outcomes import Outcome
from tieredcore.workspace import Workspace

SEGMENTS = 5
LATER = max(now_ms(), END_MS) + DAY_MS


@pytest.fixture
def env_clean(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (*ENV_OVERRIDES, ENV_CONFIG):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TIERED_NO_PROGRESS", "1")


@pytest.fixture
def fs_ws(tmp_path, env_clean) -> Iterator[Workspace]:
    with Workspace(Config.load(build_topic(tmp_path / "ws"), env={})) as ws:
        yield ws


@pytest.fixture
def s3_ws(tmp_path, moto_endpoint: str, env_clean) -> Iterator[tuple[Workspace, FaultyS3Proxy]]:
    """The topic on a fresh bucket of the moto server, through a proxy that injects no fault unless told;
    the store makes one attempt per request (a fault reaches the code)."""
    bucket = f"seg-{uuidlib.uuid4().hex[:20]}"
    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    with FaultyS3Proxy(moto_endpoint, rate=0.0) as proxy:
        url = f"s3://{bucket}/p?endpoint={proxy.url}&region=us-east-1&max_attempts=1&read_timeout=10"
        with Workspace(Config.load(build_topic(tmp_path / "ws", store_url=url), env={})) as ws:
            yield ws, proxy


def pending(ws: Workspace) -> list[tuple[str, str, str]]:
    return sorted((e.record.type, e.record.reason, e.record.uuid) for e in ws.deletion_log.pending())


class OnSegment:
    """An on_step hook running ``action(uuid)`` at ``step`` of the ``nth`` segment a run assigns."""

    def __init__(self, nth: int, step: str, action) -> None:
        self.nth, self.step, self.action = nth, step, action
        self.assigned: list[str] = []

    def __call__(self, step: str, uuid: str) -> None:
        if step == "assigned":
            self.assigned.append(uuid)
        if step == self.step and len(self.assigned) == self.nth:
            self.action(uuid)


# -- the object store failing -------------------------------------------------------------------




@pytest.mark.parametrize("op", ["upload_part", "complete_multipart", "put_index"])
def test_store_failure_while_writing_a_segment(s3_ws, op):
    ws, proxy = s3_ws
    before = hot_snapshot(ws)
    hook = OnSegment(2, "assigned", lambda u: proxy.inject(segment_write_request(op, u), INTERNAL_ERROR))

    res = offload_everything(streaming(ws, on_step=hook))

    assert [r.outcome for r in res] == [Outcome.OFFLOADED, Outcome.FAILED], [(r.outcome, r.error) for r in res]
    bad = res[1]
    assert bad.uuid == hook.assigned[1] and "InternalError" in bad.error, bad
    assert proxy.faults == {INTERNAL_ERROR: 1}
    # the writer left nothing (upload aborted, or data object deleted after a failed index write); the
    # attempt is recorded for deletion, never deleted directly
    assert segment_keys_of(ws, bad.uuid) == [] and store_uploads(ws) == []
    assert pending(ws) == [(TYPE_SEGMENT, Reason.OFFLOAD_CONFLICT, bad.uuid)]
    assert list(completed_segments(ws)) == [res[0].uuid]
    # its assignment is taken back before the record is appended, so the drain may act on the record now
    assert list(incomplete_segments(ws)) == []
    rep = drain(ws, LATER)
    assert (rep.entries, rep.still_in_use) == (1, 0), rep.rows

    res = offload_everything(streaming(ws))
    assert [r.outcome for r in res] == [Outcome.OFFLOADED] * (SEGMENTS - 1), [(r.outcome, r.error) for r in res]
    assert pending(ws) == []
    drain_and_reconcile(ws, LATER)
    assert_segments_clean(ws, before)
    assert read_topic(ws)[0] == [e for v in before.values() for e in v]
    assert proxy.faults == {INTERNAL_ERROR: 1}


# -- the metadata store failing at the completion CAS -------------------------------------------


@pytest.mark.parametrize("landed", [False, True], ids=["not-landed", "landed"])
def test_metadata_error_at_completion_leaves_the_outcome_to_the_next_run(fs_ws, landed):
    ws = fs_ws
    before = hot_snapshot(ws)
    meta = FaultyMetadataStore(ws.metadata)

    def arm(_uuid: str) -> None:  # the next topic-record write is the completion CAS
        nth = meta.faults.calls["put"] + 1
        if landed:
            meta.fail_after_put(nth)
        else:
            meta.faults.on("put", nth, raiser(MetadataStoreError("injected: connection lost at the completion CAS")))

    hook = OnSegment(2, "written", arm)
    res = offload_everything(streaming(ws, ml=ManagedLedgerStore(meta), on_step=hook))

    assert [r.outcome for r in res] == [Outcome.OFFLOADED, Outcome.UNKNOWN], [(r.outcome, r.error) for r in res]
    u = res[1].uuid
    assert u == hook.assigned[1] and "outcome unknown" in res[1].error
    # outcome unknown: nothing deleted, nothing recorded
    seg = segment_offloader(ws)
    assert sorted(segment_keys_of(ws, u)) == sorted(seg.keys(u))
    assert pending(ws) == []
    if landed:
        assert u in completed_segments(ws) and incomplete_segments(ws) == {}
    else:
        assert u not in completed_segments(ws) and list(incomplete_segments(ws)) == [u]

    # the next run resolves it: a landed completion stays; one that did not land is an abandoned
    # attempt, recorded and replaced
    res = offload_everything(streaming(ws))
    assert [r.outcome for r in res] == [Outcome.OFFLOADED] * (SEGMENTS - (2 if landed else 1))
    if landed:
        assert pending(ws) == [] and u in completed_segments(ws)
    else:
        assert pending(ws) == [(TYPE_SEGMENT, Reason.OFFLOAD_CLEANUP, u)]
        rep = drain(ws, LATER)
        assert (rep.entries, rep.deleted) == (1, 1), rep.rows
        assert segment_keys_of(ws, u) == []
    drain_and_reconcile(ws, LATER)
    assert_segments_clean(ws, before)


# -- a concurrent run wins the completion race --------------------------------------------------


def test_losing_the_completion_race_sends_our_segment_to_the_deletion_log(fs_ws):
    """Between our index and our completion CAS, another runner (no lease: it took over a lease it
    believed expired) runs the whole topic: it records our in-flight segment as abandoned, replaces it,
    writes and completes its own. Our CAS finds our uuid gone: conflict, our segment to the deletion
    log; the drain deletes it, the topic reads back intact."""
    ws = fs_ws
    before = hot_snapshot(ws)
    rival: dict = {}

    def race(_uuid: str) -> None:
        rival["results"] = offload_everything(streaming(ws, leases=False))

    hook = OnSegment(2, "written", race)
    res = offload_everything(streaming(ws, on_step=hook))

    ours = hook.assigned[1]
    assert [r.outcome for r in rival["results"]] == [Outcome.OFFLOADED] * (SEGMENTS - 1)
    assert [r.outcome for r in res] == [Outcome.OFFLOADED, Outcome.CONFLICT], [(r.outcome, r.error) for r in res]
    assert res[1].uuid == ours and "no longer assigned" in res[1].error
    assert ours not in completed_segments(ws) and incomplete_segments(ws) == {}
    # recorded twice (by the rival replacing it, by us losing), deleted once
    assert pending(ws) == sorted([(TYPE_SEGMENT, Reason.OFFLOAD_CLEANUP, ours),
                                  (TYPE_SEGMENT, Reason.OFFLOAD_CONFLICT, ours)])
    assert len(segment_keys_of(ws, ours)) == 2
    rep = drain(ws, LATER)
    assert (rep.entries, rep.deleted + rep.already_deleted, rep.still_in_use) == (2, 2, 0), rep.rows
    assert segment_keys_of(ws, ours) == []
    drain_and_reconcile(ws, LATER)
    assert_segments_clean(ws, before)
    assert read_topic(ws)[0] == [e for v in before.values() for e in v]
