"""Crash tests of the streaming (PIP-76) segment protocol (tieredcore/offload/streaming.py): a real
process running a streaming offload of a topic is SIGKILLed at each step of the per-segment protocol,
then the offload is rerun, the deletion log drained and reconciliation run (grace 0), and nothing may be
lost, leaked or doubled.

The topic (tests/support/segments.py): five ledgers sealed plus the open newest one holding entries; the
run writes five segments, which cross ledger boundaries, and the big ledgers each lie in two segments.
Kill points (segment_child.py; the child blocks at the step, the parent kills it, no sleeps), on the
first segment and on the third (two complete segments before it, the killed one spanning two ledgers):

- ``assigned``: after the step-1 CAS recorded the segment (complete=false), before any object;
- ``part``: after some multipart parts of the data object were uploaded (an unfinished upload);
- ``multipart``: after the data object was completed, before the index (the commit point);
- ``written``: after the index, before the step-3 CAS;
- ``completed``: after the step-3 CAS.

The rerun must record the killed attempt's segment for deletion before removing it (its objects are
then deleted by the drain), finish the topic, and leave: no incomplete offloadSegment entry, every entry
in exactly one completed segment, exactly the completed segments' objects in the store, every entry
reading back byte-identical to the hot tier (from the segments directly and through the topic reader),
an empty deletion log. Two more cases crash the rerun as well: right after it recorded the stale segment
(before its CAS removed it: a drain then must leave it alone), and right after its own first assignment.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.segments import (
    DAY_MS,
    TOPIC,
    assert_segments_clean,
    build_topic,
    completed_segments,
    digest_of,
    drain_and_reconcile,
    expected_payloads,
    generated_digest,
    hot_snapshot,
    incomplete_segments,
    read_topic,
    segment_keys_of,
    segment_offloader,
    store_uploads,
)
from tests.support.workspaces import END_MS
from tieredcore.clock import now_ms
from tieredcore.config import CONFIG_FILE_NAME, Config
from tieredcore.lifecycle.drain import drain
from tieredcore.meta.deletion_log import TYPE_SEGMENT
from tieredcore.meta.reasons import Reason
from tieredcore.workspace import Workspace

CHILD = Path(__file__).with_name("segment_child.py")
CHILD_TIMEOUT = 60
AS_OF = END_MS + 5000
SEGMENTS = 5  # segments of the whole topic (tests/support/segments.py)
STEP_POINTS = ["assigned", "part", "multipart", "written", "completed"]


def point_of(kind: str, segment: int) -> str:
    return f"part@{segment}:2" if kind == "part" else f"{kind}@{segment}"


def run_child(tmp_path: Path, config: Path, point: str, tag: str = "") -> str:
    """Run segment_child.py. With a kill point: wait for its ``AT <point>`` line, SIGKILL it, return the
    line. With "none": let it finish and return its ``DONE <json>`` line."""
    name = f"child-{tag}{point.replace(':', '-').replace('@', '-')}.stderr"
    stderr = open(tmp_path / name, "w+")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), str(config), point, json.dumps({"topic": TOPIC, "as_of": AS_OF})],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True, bufsize=1,
    )
    try:
        line = proc.stdout.readline().strip()
        if point == "none":
            assert proc.wait(CHILD_TIMEOUT) == 0 and line.startswith("DONE "), _failed(proc, line, stderr)
            return line
        if line != f"AT {point}":
            proc.kill()
            proc.wait()
            pytest.fail(_failed(proc, line, stderr))
        proc.send_signal(signal.SIGKILL)  # blocked at the step, reading stdin
        assert proc.wait(CHILD_TIMEOUT) == -signal.SIGKILL
        return line
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdin.close()
        proc.stdout.close()
        stderr.close()


def _failed(proc, line: str, stderr) -> str:
    stderr.seek(0)
    return f"child exited {proc.poll()} with {line!r}: {stderr.read()[-3000:]}"


def done_results(line: str) -> list[list]:
    assert line.startswith("DONE "), line
    return json.loads(line.split(" ", 1)[1])


@pytest.fixture
def topic_ws(tmp_path, monkeypatch, store_url):
    """(config, tiered.toml path, the hot tier's entries per ledger before any offload); on each store."""
    monkeypatch.setenv("TIERED_NO_PROGRESS", "1")
    cfg_path = build_topic(tmp_path / "ws", store_url)
    config = Config.load(cfg_path, env={})
    with Workspace(config) as ws:
        before = hot_snapshot(ws)
        info, _ = ws.ml.get_topic(TOPIC)
        assert info.ledgerInfo[-1].timestamp == 0 and len(before[info.ledgerInfo[-1].ledgerId]) == 6
        assert len(before) == 6 and sum(map(len, before.values())) == 150
    return config, tmp_path / "ws" / CONFIG_FILE_NAME, before


def killed_state(ws: Workspace, kind: str, segment: int) -> str | None:
    """What the kill left, checked against the step it happened at; the killed attempt's uuid (None
    when it had completed)."""
    done = completed_segments(ws)
    stale = incomplete_segments(ws)
    if kind == "completed":
        assert len(done) == segment and stale == {}, (done, stale)
        assert store_uploads(ws) == []
        return None
    assert len(done) == segment - 1, done
    assert len(stale) == 1, stale
    (killed, ledgers), = stale.items()
    if segment == 3:
        assert len(ledgers) == 2, "the third segment spans two ledgers"
    seg = segment_offloader(ws)
    dkey, ikey = seg.keys(killed)
    want_objects = {"assigned": [], "part": [], "multipart": [dkey], "written": sorted([dkey, ikey])}[kind]
    assert sorted(segment_keys_of(ws, killed)) == want_objects
    assert store_uploads(ws) == ([dkey] if kind == "part" else [])
    assert ws.deletion_log.pending() == []  # nothing recorded by the killed run
    return killed


def pending_segment_records(ws: Workspace) -> list[tuple[str, str, str]]:
    return sorted((e.record.type, e.record.reason, e.record.uuid) for e in ws.deletion_log.pending())


def final_checks(ws: Workspace, before: dict[int, list[bytes]]) -> None:
    assert_segments_clean(ws, before)
    # through the topic reader too, and against what the generator wrote
    got, _tiers = read_topic(ws)
    assert got == [e for entries in before.values() for e in entries]
    assert got == expected_payloads(ws, 150)
    count, sha = generated_digest(ws)
    assert digest_of(got[:count]) == sha


CASES = [pytest.param(k, s, id=f"{k}-segment{s}") for s in (1, 3) for k in STEP_POINTS]


@pytest.mark.parametrize("kind, segment", CASES)
def test_killed_at_a_segment_step_then_rerun_drain_reconcile(tmp_path, topic_ws, kind, segment):
    config, cfg_path, before = topic_ws
    run_child(tmp_path, cfg_path, point_of(kind, segment))

    with Workspace(config) as ws:
        killed = killed_state(ws, kind, segment)
        done_before = completed_segments(ws)

    rerun = done_results(run_child(tmp_path, cfg_path, "none"))
    assert [r[0] for r in rerun] == ["offloaded"] * (SEGMENTS - len(done_before)), rerun
    later = max(now_ms(), END_MS) + DAY_MS
    with Workspace(config) as ws:
        # the segments completed before the kill were kept; the killed attempt was recorded first
        done = completed_segments(ws)
        assert set(done_before) <= set(done) and len(done) == SEGMENTS
        if killed is None:
            assert ws.deletion_log.pending() == []
        else:
            assert killed not in done and killed not in {r[1] for r in rerun}
            assert pending_segment_records(ws) == [(TYPE_SEGMENT, Reason.OFFLOAD_CLEANUP, killed)]
            rep = drain(ws, later)
            assert rep.entries == 1 and rep.deleted + rep.already_deleted == 1, rep.rows
            assert (rep.still_in_use, rep.retrying, rep.dead_lettered) == (0, 0, 0), rep.rows
            assert segment_keys_of(ws, killed) == [] and store_uploads(ws) == []
        drain_and_reconcile(ws, later)
        final_checks(ws, before)


def test_rerun_killed_after_recording_the_stale_segment(tmp_path, topic_ws):
    """Crash mid-upload; the rerun dies right after durably recording the stale segment, before its CAS
    removes it. A drain in between must not delete what the topic still references (the record is
    acknowledged as in use); the next run records it again and the drain then deletes it."""
    config, cfg_path, before = topic_ws
    run_child(tmp_path, cfg_path, "part@2:2")
    with Workspace(config) as ws:
        killed = killed_state(ws, "part", 2)
    run_child(tmp_path, cfg_path, f"append:{Reason.OFFLOAD_CLEANUP}", tag="rerun-")
    later = max(now_ms(), END_MS) + DAY_MS
    with Workspace(config) as ws:
        assert incomplete_segments(ws) == {killed: incomplete_segments(ws)[killed]}
        assert pending_segment_records(ws) == [(TYPE_SEGMENT, Reason.OFFLOAD_CLEANUP, killed)]
        rep = drain(ws, later)
        assert (rep.entries, rep.still_in_use, rep.deleted) == (1, 1, 0), rep.rows
        assert store_uploads(ws) == [segment_offloader(ws).keys(killed)[0]]  # still there: still referenced
    rerun = done_results(run_child(tmp_path, cfg_path, "none"))
    assert [r[0] for r in rerun] == ["offloaded"] * (SEGMENTS - 1), rerun
    with Workspace(config) as ws:
        assert pending_segment_records(ws) == [(TYPE_SEGMENT, Reason.OFFLOAD_CLEANUP, killed)]
        drain_and_reconcile(ws, later)
        final_checks(ws, before)


def test_rerun_killed_after_its_own_assignment(tmp_path, topic_ws):
    """Crash after the index; the rerun records and removes that segment, assigns its own, and dies. The
    drain deletes the first attempt's objects; the third run cleans up the second attempt."""
    config, cfg_path, before = topic_ws
    run_child(tmp_path, cfg_path, "written@2")
    with Workspace(config) as ws:
        first = killed_state(ws, "written", 2)
    run_child(tmp_path, cfg_path, "assigned@1", tag="rerun-")
    later = max(now_ms(), END_MS) + DAY_MS
    with Workspace(config) as ws:
        stale = incomplete_segments(ws)
        assert first not in stale and len(stale) == 1
        (second,) = stale
        assert pending_segment_records(ws) == [(TYPE_SEGMENT, Reason.OFFLOAD_CLEANUP, first)]
        rep = drain(ws, later)
        assert (rep.entries, rep.deleted, rep.still_in_use) == (1, 1, 0), rep.rows
        assert segment_keys_of(ws, first) == []
    rerun = done_results(run_child(tmp_path, cfg_path, "none"))
    assert [r[0] for r in rerun] == ["offloaded"] * (SEGMENTS - 1), rerun
    with Workspace(config) as ws:
        assert pending_segment_records(ws) == [(TYPE_SEGMENT, Reason.OFFLOAD_CLEANUP, second)]
        drain_and_reconcile(ws, later)
        final_checks(ws, before)
