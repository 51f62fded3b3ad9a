"""Compaction racing the other writers of a topic record (tieredcore/lifecycle/compaction.py): an
offload (a scrub repair replacing a covered ledger's V1 copy; a streaming offload of the open ledger), a
retention trim, a second compaction. The competing change is made between two steps of the compaction
(its ``on_step`` hook, or its first read of an old object: before it assigned anything).

Whatever the interleaving: exactly one writer wins per topic, the loser's new segment goes to the
deletion log (compaction-conflict) and the drain deletes it, nothing is lost (every entry reads back
byte-identical), no uuid is recorded twice on a ledger and no entry lies in two completed segments; the
next compaction run finishes the job. With leases a second runner does not even start (busy)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.support.compaction import (
    AS_OF,
    DELAY,
    HOUR,
    LATER,
    KiB,
    assert_clean,
    assert_single_copies,
    compactor,
    copies,
    cut_points,
    pending,
    read_everything,
    units_of,
    v1_topic,
)
from tests.support.segments import (
    NS,
    TOPIC,
    Snapshot,
    completed_segments,
    drain_and_reconcile,
    hot_snapshot,
    incomplete_segments,
    segment_keys_of,
    streaming,
)
from tests.support.workspaces import END_MS
from tieredcore.config import ENV_CONFIG, ENV_OVERRIDES, Config
from tieredcore.lifecycle.drain import drain
from tieredcore.lifecycle.retention import trim_topic
from tieredcore.meta.deletion_log import TYPE_OFFLOADED, TYPE_SEGMENT
from tieredcore.meta.leases import TopicLeases
from tieredcore.meta.reasons import Reason
from tieredcore.offload.compaction import Compactor
from tieredcore.workspace import Workspace

MIN_SIZE, TARGET = 80 * KiB, 160 * KiB  # the V1 topic: batches of ledgers 0-4, 5-9, 10-11


@pytest.fixture
def ws(tmp_path, monkeypatch) -> Iterator[Workspace]:
    for var in (*ENV_OVERRIDES, ENV_CONFIG):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TIERED_NO_PROGRESS", "1")
    with Workspace(Config.load(v1_topic(tmp_path / "ws"), env={})) as w:
        yield w


class At:
    """Runs ``action()`` once at ``step`` of the ``batch``-th batch (from 1) of a compaction; step
    "read" is the batch's first read of an old object, before its segment is assigned."""

    def __init__(self, step: str, action: Callable[[], object], batch: int = 1) -> None:
        self.step, self.action, self.batch = step, action, batch
        self.assigned: list[str] = []
        self.reads = 0
        self.result: object = None
        self.fired = False

    def on_step(self, step: str, uuid: str) -> None:
        if step == "assigned":
            self.assigned.append(uuid)
        if step == self.step and len(self.assigned) == self.batch:
            self._fire()

    def _fire(self) -> None:
        if not self.fired:
            self.fired = True
            self.result = self.action()

    def open_copy(self, real: Callable) -> Callable:
        def open_copy(li, topic):
            if self.step == "read" and len(self.assigned) == self.batch - 1:
                self._fire()
            return real(li, topic)

        return open_copy


def racing(ws: Workspace, at: At, **kw) -> Compactor:
    c = compactor(ws, min_object_size=MIN_SIZE, target_size=TARGET, on_step=at.on_step, **kw)
    c.open_copy = at.open_copy(c.open_copy)
    return c


def lost(ws: Workspace, rows, ours: str, why: str) -> None:
    """Our first batch lost: conflict, our segment nowhere in the record, recorded for deletion."""
    assert [r.outcome for r in rows] == ["conflict"], [(r.outcome, r.error) for r in rows]
    assert why in rows[0].error, rows[0].error
    assert ours not in completed_segments(ws) and ours not in incomplete_segments(ws)
    assert (TYPE_SEGMENT, "compaction-conflict", ours) in {(t, r, u) for t, r, u, _n in pending(ws)}


def finish(ws: Workspace, before: Snapshot, *, as_of: int = LATER) -> None:
    """What the next runs do: drain, compaction again, drain past the delay, reconciliation; then
    nothing lost, leaked or doubled."""
    rep = drain(ws, as_of)
    assert (rep.retrying, rep.dead_lettered) == (0, 0), rep.rows
    assert_single_copies(ws, before)
    rows = compactor(ws, min_object_size=MIN_SIZE, target_size=TARGET, clock_ms=as_of).compact_topic(TOPIC)
    assert rows and {r.outcome for r in rows} == {"compacted"}, [(r.outcome, r.error) for r in rows]
    drain_and_reconcile(ws, as_of)
    assert_clean(ws, before)


# -- an offload -----------------------------------------------------------------------------------


@pytest.mark.parametrize("step", ["verified", "recorded"])
def test_a_repair_replacing_a_covered_ledgers_copy_wins(ws, step):
    """A scrub repair replaces ledger 2's V1 copy (the batch covers it) while the compaction's segment is
    written: the switch finds the ledger changed and loses; the damaged copy goes (repair), the old
    objects of the other ledgers are kept (still in use), our segment goes."""
    before = hot_snapshot(ws)
    lids = list(before)
    layout = copies(ws)
    damaged = layout[lids[2]][0][1]
    at = At(step, lambda: ws.topic_offloader(clock_ms=lambda: AS_OF).replace_offload(TOPIC, lids[2], damaged))
    rows = racing(ws, at).compact_topic(TOPIC)

    assert at.result.outcome == "replaced", at.result
    lost(ws, rows, at.assigned[0], f"ledger {lids[2]} changed meanwhile")
    assert copies(ws)[lids[2]][0][1] == at.result.uuid
    recs = {(t, r, u) for t, r, u, _n in pending(ws)}
    assert (TYPE_OFFLOADED, Reason.REPAIR, damaged) in recs
    # recorded before the switch, the old objects' records (the damaged one's too) wait for the delay
    assert {(t, u) for t, r, u in recs if r == "compaction"} == {(t, u) for u, t in units_of(layout, lids[:5]).items()}
    rep = drain(ws, AS_OF + DELAY)
    assert segment_keys_of(ws, at.assigned[0]) == []
    assert rep.still_in_use == 4, rep.rows  # the other ledgers' old objects: they are still current
    read_everything(ws, before, cut_points(layout, copies(ws)))
    finish(ws, before)


@pytest.mark.parametrize("step", ["read", "recorded"])
def test_a_streaming_offload_of_the_open_ledger(ws, step):
    """The open ledger (5 entries, hot only) is streamed by a runner without the lease. Before our
    segment is assigned it touches nothing of ours: both land. While our segment is in flight the
    streaming offload, which holds that every incomplete segment entry it finds is a crashed attempt
    (it should hold the topic's lease), records ours for deletion and removes it: our switch finds its
    assignment gone and loses, safely (our objects were recorded before anyone could delete them), and
    the next run compacts."""
    before = hot_snapshot(ws)
    lids = list(before)
    so = streaming(ws, clock_ms=AS_OF, leases=False)

    def stream_then_drain():  # an operator's drain may run at any time (not yet the old objects' delay)
        res = so.offload_topic(TOPIC, max_segment_size=64 * KiB, rollover_ms=HOUR, as_of_ms=AS_OF, force_tail=True)
        return res, drain(ws, AS_OF)

    at = At(step, stream_then_drain)
    rows = racing(ws, at).compact_topic(TOPIC)

    res, rep = at.result
    assert [r.outcome for r in res] == ["offloaded"] and res[0].ledgers == [(lids[-1], 0, 4)]
    streamed = res[0].uuid
    # the drain deleted our segment in flight (recorded by the streaming offload) if there was one
    assert (rep.entries, rep.deleted) == ((0, 0) if step == "read" else (1, 1)), rep.rows
    if step == "read":
        assert [r.outcome for r in rows] == ["compacted"] * 3
        assert_single_copies(ws, before)
    else:
        lost(ws, rows, at.assigned[0], "assignment is gone")
        assert [(r.type, r.reason, r.outcome) for r in rep.rows] == [(TYPE_SEGMENT, Reason.OFFLOAD_CLEANUP, "deleted")]
    assert copies(ws)[lids[-1]] == [(TYPE_SEGMENT, streamed, 0, 4)]
    if step == "recorded":
        finish(ws, before)
    else:
        drain_and_reconcile(ws, LATER)
        assert_clean(ws, before)


def test_a_streaming_offload_with_the_lease_is_busy(ws):
    rival = TopicLeases(ws.metadata, holder="rival-host:1:streaming")
    so = streaming(ws, clock_ms=AS_OF, leases=False)
    so.leases = rival
    at = At("verified", lambda: so.offload_topic(TOPIC, max_segment_size=64 * KiB, rollover_ms=HOUR,
                                                 as_of_ms=AS_OF, force_tail=True))
    rows = racing(ws, at).compact_topic(TOPIC)
    assert [r.outcome for r in at.result] == ["busy"]
    assert [r.outcome for r in rows] == ["compacted"] * 3


# -- a retention trim -----------------------------------------------------------------------------


def trim(ws: Workspace, as_of: int):
    """Retention of 105 minutes: at END the oldest ledger only (closed 110 minutes before)."""
    ws.policies.set_namespace(NS, {"retention_time_minutes": 105})
    return trim_topic(ws, TOPIC, as_of)


@pytest.mark.parametrize("step", ["verified", "recorded"])
def test_a_retention_trim_of_a_covered_ledger_wins(ws, step):
    before = hot_snapshot(ws)
    lids = list(before)
    layout = copies(ws)
    at = At(step, lambda: trim(ws, END_MS))
    rows = racing(ws, at).compact_topic(TOPIC)

    assert [(r.ledger, r.outcome) for r in at.result] == [(lids[0], "trimmed")]
    ours = at.assigned[0]
    lost(ws, rows, ours, f"ledger {lids[0]} is no longer in the topic")
    # the trim recorded what ledger 0 referenced: its hot copy, its V1 objects, and our segment in flight
    recs = {(t, r, u) for t, r, u, _n in pending(ws)}
    assert {("ledger", "retention", ""), (TYPE_OFFLOADED, "retention", layout[lids[0]][0][1]),
            (TYPE_SEGMENT, "retention", ours)} <= recs
    rest = {lid: v for lid, v in before.items() if lid != lids[0]}
    rep = drain(ws, AS_OF + DELAY)
    assert (rep.retrying, rep.dead_lettered) == (0, 0) and segment_keys_of(ws, ours) == []
    assert rep.still_in_use == 4, rep.rows  # ledgers 1-4's old objects, recorded before the switch
    read_everything(ws, rest, cut_points(layout, copies(ws)))
    finish(ws, rest)


def test_a_retention_trim_of_an_already_compacted_ledger_does_not_conflict(ws):
    """Trimming ledger 0 (compacted by the first batch) while the second batch is in flight: the
    second batch's ledgers did not change, it lands; the first batch's segment is kept for ledgers 1-4."""
    before = hot_snapshot(ws)
    lids = list(before)
    at = At("recorded", lambda: trim(ws, END_MS), batch=2)
    rows = racing(ws, at).compact_topic(TOPIC)
    assert [(r.ledger, r.outcome) for r in at.result] == [(lids[0], "trimmed")]
    assert [r.outcome for r in rows] == ["compacted"] * 3
    rest = {lid: v for lid, v in before.items() if lid != lids[0]}
    drain_and_reconcile(ws, LATER)
    assert_clean(ws, rest)


# -- a second compaction --------------------------------------------------------------------------


def test_a_second_compactor_finds_the_lease_held(ws):
    before = hot_snapshot(ws)
    rival = compactor(ws, min_object_size=MIN_SIZE, target_size=TARGET,
                      leases=TopicLeases(ws.metadata, holder="rival-host:1:compaction"))
    at = At("verified", lambda: rival.compact_topic(TOPIC))
    rows = racing(ws, at).compact_topic(TOPIC)
    assert [r.outcome for r in at.result] == ["busy"] and "being processed by" in at.result[0].error
    assert [r.outcome for r in rows] == ["compacted"] * 3
    drain_and_reconcile(ws, LATER)
    assert_clean(ws, before)


@pytest.mark.parametrize("step", ["read", "verified", "recorded"])
def test_two_compactions_without_leases_one_wins(ws, step):
    """Both runners without leases (each believed the other's lease expired). The rival runs the whole
    topic in the middle of our first batch: before our assignment (ours then fails to assign, writing
    nothing), or while our segment is in flight (the rival records it as a crashed attempt and removes
    it; our switch loses). Exactly the rival's segments remain; ours is deleted by the drain."""
    before = hot_snapshot(ws)
    layout = copies(ws)
    rival = compactor(ws, min_object_size=MIN_SIZE, target_size=TARGET, leases=None)
    at = At(step, lambda: rival.compact_topic(TOPIC))
    rows = racing(ws, at, leases=None).compact_topic(TOPIC)

    assert [r.outcome for r in at.result] == ["compacted"] * 3, [(r.outcome, r.error) for r in at.result]
    winners = {u for r in at.result for u in r.segments}
    assert set(completed_segments(ws)) == winners
    assert_single_copies(ws, before)
    if step == "read":
        assert [r.outcome for r in rows] == ["conflict"] and "changed since planned" in rows[0].error
        assert at.assigned == [] and rows[0].segments == []
    else:
        (ours,) = at.assigned
        lost(ws, rows, ours, "")
        assert (TYPE_SEGMENT, Reason.OFFLOAD_CLEANUP, ours) in {(t, r, u) for t, r, u, _n in pending(ws)}
    read_everything(ws, before, cut_points(layout, copies(ws)))
    # the old objects: recorded by the rival (and by us when we got that far), due after the delay
    old = units_of(layout, list(before)[:-1])
    assert {(t, u) for t, r, u, _n in pending(ws) if r == "compaction"} == {(t, u) for u, t in old.items()}
    rep = drain(ws, AS_OF + DELAY - 1)  # before the delay: our segment only, recorded twice
    assert (rep.entries, rep.deleted + rep.already_deleted) == ((0, 0) if step == "read" else (2, 2)), rep.rows
    rep = drain(ws, AS_OF + DELAY)
    assert (rep.retrying, rep.dead_lettered, rep.still_in_use) == (0, 0, 0), rep.rows
    for u in at.assigned:
        assert segment_keys_of(ws, u) == []
    drain_and_reconcile(ws, LATER)
    assert_clean(ws, before)
    assert set(completed_segments(ws)) == winners


def test_a_lease_lost_between_batches_keeps_what_was_compacted(ws):
    """Our lease expires and another runner takes it over after our first batch landed: that batch is
    reported compacted, the others busy (left for the next run), nothing more is written."""
    before = hot_snapshot(ws)
    rival = TopicLeases(ws.metadata, holder="rival-host:1:x", clock_ms=lambda: 10 ** 15)  # far in the future
    at = At("switched", lambda: rival.acquire(TOPIC, "compaction"))
    rows = racing(ws, at).compact_topic(TOPIC)
    assert [r.outcome for r in rows] == ["compacted", "busy", "busy"], [(r.outcome, r.error) for r in rows]
    assert set(completed_segments(ws)) == set(rows[0].segments)
    assert "lease" in rows[1].error
    assert ws.leases.current(TOPIC)["holder"] == "rival-host:1:x"
    drain_and_reconcile(ws, LATER)
    assert_clean(ws, before)
