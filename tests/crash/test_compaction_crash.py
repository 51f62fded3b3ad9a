"""Crash tests of compaction (tieredcore/lifecycle/compaction.py): a real process compacting a topic
SIGKILLs itself right after each step of a batch, then compaction is rerun, the deletion log drained as
of after the delete delay, reconciliation run (grace 0) and the log drained again; nothing may be lost,
leaked or doubled.

The topic (tests/support/compaction.py ``mixed_topic``): two V1 ledgers whose hot copies are gone, three
ledgers in segments spanning them, the open ledger in the hot tier only; compacted in two batches
(ledgers 0-1 from their V1 objects, ledgers 2-4-5 from their segments). Kill points (compaction_child.py),
in the first batch and in the second (the first one landed):

- ``assigned``: the new segment's uuid recorded (incomplete) on the batch's first ledger, no object yet;
- ``written``: the new segment's objects written (its index: the commit point);
- ``verified``: the new segment read back and compared;
- ``recorded``: the old objects appended to the deletion log (due after the delay), before the switch;
- ``switched``: the switch CAS landed.

The rerun records the killed attempt's segment for deletion before taking it off the topic (unless it
landed), compacts what is left; the drain then deletes the killed attempt's objects and, after the delay,
the old ones, never one still referenced: the store holds exactly the objects the topic references, no
incomplete segment entry remains, every entry reads back byte-identical.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.compaction import (
    AS_OF,
    DELAY,
    LATER,
    KiB,
    assert_clean,
    compactor,
    copies,
    mixed_topic,
    pending,
    units_of,
)
from tests.support.segments import (
    TOPIC,
    assert_segments_clean,
    completed_segments,
    drain_and_reconcile,
    incomplete_segments,
    segment_keys_of,
    segment_offloader,
    store_uploads,
)
from tieredcore.config import CONFIG_FILE_NAME, Config
from tieredcore.lifecycle.drain import drain
from tieredcore.meta.deletion_log import TYPE_SEGMENT
from tieredcore.meta.reasons import Reason
from tieredcore.workspace import Workspace

pytestmark = pytest.mark.slow

CHILD = Path(__file__).with_name("compaction_child.py")
CHILD_TIMEOUT = 60
MIN_SIZE, TARGET = 80 * KiB, 160 * KiB
STEPS = ["assigned", "written", "verified", "recorded", "switched"]


def run_child(tmp_path: Path, cfg: Path, point: str) -> str:
    """Run compaction_child.py; a kill point must kill it, "none" must finish (its DONE line)."""
    args = json.dumps({"topic": TOPIC, "as_of": AS_OF, "min": MIN_SIZE, "target": TARGET, "delay": DELAY})
    with open(tmp_path / f"child-{point.replace('@', '-')}.stderr", "w+") as err:
        proc = subprocess.run([sys.executable, str(CHILD), str(cfg), point, args], stdout=subprocess.PIPE,
                              stderr=err, text=True, timeout=CHILD_TIMEOUT)
        err.seek(0)
        detail = f"exit {proc.returncode}, stdout {proc.stdout!r}: {err.read()[-3000:]}"
    if point == "none":
        assert proc.returncode == 0 and proc.stdout.startswith("DONE "), detail
        return proc.stdout
    assert proc.returncode == -signal.SIGKILL and proc.stdout == "", detail
    return ""


@pytest.fixture
def topic(tmp_path, monkeypatch, store_url):
    """(config, tiered.toml, the entries per ledger, the batches' ledgers, the layout before); on each store."""
    monkeypatch.setenv("TIERED_NO_PROGRESS", "1")
    cfg_path, before = mixed_topic(tmp_path / "ws", store_url)
    config = Config.load(cfg_path, env={})
    with Workspace(config) as ws:
        batches = [b.ledgers for b in compactor(ws, min_object_size=MIN_SIZE, target_size=TARGET).plan(TOPIC)]
        lids = list(before)
        assert batches == [tuple(lids[:2]), tuple(lids[2:-1])]
        layout = copies(ws)
    return config, tmp_path / "ws" / CONFIG_FILE_NAME, before, batches, layout


def records(ws: Workspace) -> set[tuple[str, str, str]]:
    return {(t, r, u) for t, r, u, _n in pending(ws)}


def killed_state(ws: Workspace, step: str, batch: int, batches, layout) -> str | None:
    """What the kill left, checked against its step; the killed attempt's uuid (None: it landed)."""
    done = completed_segments(ws)
    stale = incomplete_segments(ws)
    landed = batch - 1 + (step == "switched")
    compacted = [lid for b in batches[:landed] for lid in b]
    assert {lid for ps in done.values() for lid, _f, _l in ps} >= set(compacted)
    # what the killed run recorded: the old objects of the batches that got to "recorded"
    recorded = [lid for b in batches[:batch - 1 + (step in ("recorded", "switched"))] for lid in b]
    want = {(t, "compaction", u, AS_OF + DELAY) for u, t in units_of(layout, recorded).items()}
    assert set(pending(ws)) == want
    if step == "switched":
        assert stale == {}
        return None
    (killed, on), = stale.items()
    assert on == [batches[batch - 1][0]]  # recorded on the batch's first ledger
    seg = segment_offloader(ws)
    keys = [] if step == "assigned" else sorted(seg.keys(killed))
    assert sorted(segment_keys_of(ws, killed)) == keys and store_uploads(ws) == []
    for lid in batches[batch - 1]:  # the killed batch's ledgers still read from their old objects
        assert copies(ws)[lid] == layout[lid]
    return killed


CASES = [pytest.param(step, batch, id=f"{step}-batch{batch}") for batch in (1, 2) for step in STEPS]


@pytest.mark.parametrize("step, batch", CASES)
def test_killed_after_a_step_then_rerun_drain_reconcile(tmp_path, topic, step, batch):
    config, cfg_path, before, batches, layout = topic
    run_child(tmp_path, cfg_path, f"{step}@{batch}")
    with Workspace(config) as ws:
        killed = killed_state(ws, step, batch, batches, layout)
        landed = set(completed_segments(ws)) - set(units_of(layout, layout))  # the killed run's new segments

        rows = compactor(ws, min_object_size=MIN_SIZE, target_size=TARGET, clock_ms=AS_OF).compact_topic(TOPIC)
        left = len(batches) - (batch - 1 + (step == "switched"))
        assert [r.outcome for r in rows] == ["compacted"] * left, [(r.outcome, r.error) for r in rows]
        assert landed <= set(completed_segments(ws))
        if killed is not None:
            # recorded before it was taken off the topic; not referenced by anything now
            assert (TYPE_SEGMENT, Reason.OFFLOAD_CLEANUP, killed) in records(ws)
            assert killed not in completed_segments(ws) and killed not in incomplete_segments(ws)

        rep = drain(ws, AS_OF + DELAY)  # after the delete delay: the killed attempt and the old objects
        assert (rep.retrying, rep.dead_lettered, rep.still_in_use) == (0, 0, 0), rep.rows
        if killed is not None:
            assert segment_keys_of(ws, killed) == []
        drain_and_reconcile(ws, LATER)
        assert_clean(ws, before)
        assert_segments_clean(ws, before, hot_only={list(before)[-1]})


def test_a_drain_after_the_delay_keeps_the_old_objects_of_a_switch_that_never_happened(tmp_path, topic):
    """Killed after recording the old objects, before the switch; the drain runs past the delay before
    any rerun: those objects are still what the topic reads from, so the drain keeps them (still in use)
    and so does it keep the killed attempt's segment (still referenced, incomplete). The rerun records
    both again; then they go."""
    config, cfg_path, before, batches, layout = topic
    run_child(tmp_path, cfg_path, "recorded@1")
    with Workspace(config) as ws:
        killed = killed_state(ws, "recorded", 1, batches, layout)
        keys = segment_keys_of(ws, killed)
        rep = drain(ws, LATER)
        assert (rep.entries, rep.still_in_use, rep.deleted) == (2, 2, 0), rep.rows
        assert pending(ws) == [] and copies(ws) == layout and segment_keys_of(ws, killed) == keys
    done = json.loads(run_child(tmp_path, cfg_path, "none").split(" ", 1)[1])
    assert [r[0] for r in done] == ["compacted", "compacted"], done
    with Workspace(config) as ws:
        assert (TYPE_SEGMENT, Reason.OFFLOAD_CLEANUP, killed) in records(ws)
        drain_and_reconcile(ws, LATER)
        assert_clean(ws, before)
        assert segment_keys_of(ws, killed) == []
