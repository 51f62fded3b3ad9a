"""Retention with a compacted view in place (issue 25, item 5; docs/topic-compaction.md, "Retention").

Pulsar's ``__compaction`` subscription is a durable cursor whose mark-delete position is the compaction
horizon (pulsar-broker/src/main/java/org/apache/pulsar/broker/service/persistent/PersistentTopic.java,
``createPersistentSubscription``; PulsarCompactorSubscription.java in the same package), so retention
(managed-ledger/src/main/java/org/apache/bookkeeper/mledger/impl/ManagedLedgerImpl.java,
``internalTrimLedgers``) trims only ledgers that cursor has consumed; the compacted ledger is listed in no
``ledgerInfo`` and retention never sees it; the previous compacted ledger is deleted once the next one is
recorded (PulsarCompactorSubscription.acknowledgeMessageAsync). On a real workspace
(SQLite metadata, local hot tier, filesystem store): a keyed topic across the hot and offloaded tiers,
compacted, then retention (plan, run, drain), the deletion-lag cleanup, orphan reconciliation and a second
compaction; the compacted view is checked against a plain dict over the messages the test generated."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.lifecycle.test_topic_compaction import Producer as BaseProducer
from tests.support.workspaces import END_MS
from tieredcore.cli import main as cli
from tieredcore.clock import now_ms
from tieredcore.cold.blob import iter_objects
from tieredcore.config import Config
from tieredcore.formats import compression
from tieredcore.formats.compacted import compaction_items
from tieredcore.formats.messages import Message, decode_entry
from tieredcore.formats.proto import MLDataFormats_pb2 as pb
from tieredcore.lifecycle.drain import drain
from tieredcore.lifecycle.planner import select_retention, slowest_reader_ledger
from tieredcore.lifecycle.reconcile.run import reconcile
from tieredcore.lifecycle.retention import delete_topic, plan_retention
from tieredcore.lifecycle.runner import run_work
from tieredcore.lifecycle.sweep import plan_lag_cleanup
from tieredcore.lifecycle.topic_compaction import CompactionResult, compact_topic
from tieredcore.lifecycle.work import KIND_RETENTION, LedgerResult
from tieredcore.meta.deletion_log import TYPE_OFFLOADED
from tieredcore.meta.reasons import Reason
from tieredcore.model import Position
from tieredcore.offload.compacted_state import compaction_state
from tieredcore.offload.transaction import ObjectGroup
from tieredcore.policy import DEFAULT_COMPACTION_DELETE_DELAY_MS
from tieredcore.topic.writer import TopicWriter
from tieredcore.workspace import Workspace

NS = "acme/keys"
TOPIC = "acme/keys/persistent/table"
MIN = 60_000
T0 = END_MS  # every ledger of these tests is sealed (and offloaded) at T0
Entries = list[tuple[int, int, bytes]]  # (ledger id, entry id, entry) as the test wrote them


@pytest.fixture
def ws(tmp_path: Path) -> Iterator[Workspace]:
    root = tmp_path / "ws"
    assert cli.main(["init", str(root)]) == 0
    with Workspace(Config.load(root / "tiered.toml", env={})) as w:
        yield w


# -- what the test writes ----------------------------------------------------------------------------


class Producer(BaseProducer):
    def round(self, r: int) -> list[bytes]:
        """One ledger's entries: values and overwrites, tombstones (empty payload, null value, batched
        null value), keyless messages, batches of several codecs; keys k0..k7 plus one new key a round."""
        k = [f"k{i}" for i in range(8)]
        return [
            self.single(k[r % 8], b"v%d-a" % r),
            self.batch([(k[1], b"b1-%d" % r), (None, b"nokey-%d" % r), (k[2], b"b2-%d" % r)]),
            self.single(None, b"keyless-%d" % r),
            self.batch([(k[3], b"x" * 40 + b"%d" % r), (k[4], b"y%d" % r), (k[3], b"z%d" % r)], compression.LZ4),
            self.single(k[(r + 3) % 8], b""),  # empty payload: a tombstone
            self.batch([(k[5], None), (k[6], b"w%d" % r)], compression.ZSTD),  # a batched null value
            self.single(k[(r + 5) % 8], b"", null_value=True),
            self.single(f"only-{r}", b"o%d" % r),
            self.single(k[7], b"last-%d" % r),
        ]


def write(ws: Workspace, ledgers: list[list[bytes]]) -> Entries:
    """One sealed ledger per list (closed at T0), then an open empty one; what was written, with the
    positions the topic gave it."""
    w = TopicWriter(ws.ml, ws.hot, TOPIC, clock_ms=lambda: T0)
    out: Entries = []
    for entries in ledgers:
        w.append_many(entries)
        lid = ws.ml.get_topic(TOPIC)[0].ledgerInfo[-1].ledgerId
        out += [(lid, e, data) for e, data in enumerate(entries)]
        w.rollover()
    w.close(seal=False)
    return out


def offload(ws: Workspace, ledger_ids: list[int]) -> dict[int, str]:
    res = ws.topic_offloader(clock_ms=lambda: T0).offload_ledgers(TOPIC, ledger_ids)
    assert [r.outcome for r in res] == ["offloaded"] * len(ledger_ids), res
    return {r.ledger_id: r.uuid for r in res}


def _key(m: Message) -> str | None:
    own = m.single if m.single is not None else m.metadata
    return own.partition_key if own.HasField("partition_key") else None


Seen = list[tuple[tuple[int, int, int], str | None, bytes]]


def messages(written: Entries) -> Seen:
    """Every message the test wrote: (position with batch index, key, payload), in position order."""
    return [((m.ledger_id, m.entry_id, m.batch_index), _key(m), bytes(m.payload))
            for lid, eid, data in written for m in decode_entry(data, lid, eid)]


def expected_view(written: Entries, horizon: Position) -> Seen:
    """What a compacted read must deliver, from a plain dict over the written messages: for each key its
    last message up to the horizon, dropped when it has no payload (keyless messages are not retained),
    then every message after the horizon as it was written (keyless and tombstones included)."""
    latest: dict[str, tuple[tuple[int, int, int], bytes]] = {}
    after: Seen = []
    for pos, key, payload in messages(written):
        if Position(pos[0], pos[1]) > horizon:
            after.append((pos, key, payload))
        elif key is not None:
            latest[key] = (pos, payload)
    kept = sorted((pos, k, v) for k, (pos, v) in latest.items() if v)
    return kept + after


def seen_view(ws: Workspace) -> Seen:
    """What a consumer of the compacted view gets, in delivery order (compacted-out messages skipped)."""
    r = ws.reader()
    try:
        return [((m.ledger_id, m.entry_id, m.batch_index), _key(m), bytes(m.payload))
                for pos, data in r.read_compacted(TOPIC)
                for m in decode_entry(data, pos.ledger_id, pos.entry_id) if not m.compacted_out]
    finally:
        r.close()


def plain_read(ws: Workspace) -> Entries:
    r = ws.reader()
    try:
        return [(pos.ledger_id, pos.entry_id, bytes(data)) for pos, data in r.read(TOPIC)]
    finally:
        r.close()


def ids(ws: Workspace) -> list[int]:
    return [li.ledgerId for li in ws.ml.get_topic(TOPIC)[0].ledgerInfo]


def objects(ws: Workspace) -> dict[str, int]:
    """Every object of the store (key -> size), but topic manifests (docs/recovery.md)."""
    return {o.key: o.size for o in iter_objects(ws.store) if not o.key.startswith("tiered-topic-manifests/")}


def of_uuid(objs: dict[str, int], uuid: str) -> dict[str, int]:
    return {k: v for k, v in objs.items() if uuid in k}


def run(ws: Workspace, plan) -> list[LedgerResult]:
    return [LedgerResult(**r) for r in run_work(ws.config, [w.as_dict() for w in plan])]


def clean_drain(ws: Workspace, as_of: int):
    rep = drain(ws, as_of)
    assert (rep.still_in_use, rep.retrying, rep.dead_lettered, rep.malformed, rep.refused_mismatch,
            rep.refused_foreign) == (0, 0, 0, 0, 0, 0), rep.rows
    assert not ws.deletion_log.pending()
    return rep


def retention(ws: Workspace, as_of: int) -> list[LedgerResult]:
    """Retention's phases as the DAG runs them: plan, run (phase 1), drain (phase 2)."""
    rows = run(ws, plan_retention(ws, [NS], as_of))
    clean_drain(ws, as_of)
    return rows


# -- the rule, without I/O ---------------------------------------------------------------------------


def L(lid: int, entries: int, ts: int = T0) -> pb.ManagedLedgerInfo.LedgerInfo:
    li = pb.ManagedLedgerInfo.LedgerInfo(ledgerId=lid, timestamp=ts, size=100)
    if ts > 0:
        li.entries = entries
    return li


@pytest.mark.parametrize("held_at, cap, trimmed", [
    (None, None, [1, 2, 3]),  # never compacted: no durable cursor, every sealed ledger but the newest
    (Position(2, 9), 3, [1, 2]),  # the last entry of a sealed ledger: that ledger is consumed
    (Position(2, 4), 2, [1]),  # mid-ledger: that ledger holds unconsumed entries and stays
    (Position(1, 0), 1, []),  # the first entry of ledger 1: 9 of its entries are unconsumed
    (Position(4, 3), 4, [1, 2, 3]),  # in the open (newest) ledger: never +1
    (Position(3, 9), 4, [1, 2, 3]),
    (Position(0, 5), 0, []),  # a ledger no longer listed: its own id bounds the walk
])
def test_the_compaction_horizon_holds_retention_back(held_at, cap, trimmed) -> None:
    """Pulsar: ManagedLedgerImpl.internalTrimLedgers (managed-ledger/src/main/java/org/apache/bookkeeper/
    mledger/impl/ManagedLedgerImpl.java) walks ``ledgers.headMap(slowestReaderLedgerId, false)`` only, where
    slowestReaderLedgerId is the slowest durable cursor's mark-delete ledger, plus one when the position is
    the last entry of a ledger other than the current one; the ``__compaction`` cursor is durable
    (PersistentTopic.createPersistentSubscription → broker/service/persistent/PulsarCompactorSubscription.java,
    mark-delete = horizon)."""
    ledgers = [L(1, 10), L(2, 10), L(3, 10), L(4, 0, ts=0)]
    if cap is not None:
        assert slowest_reader_ledger(ledgers, held_at) == cap
    assert select_retention(ledgers, 0, None, T0 + MIN, held_at) == trimmed
    # size retention is held back the same way (the topic's size still counts every ledger)
    assert select_retention(ledgers, None, 0, T0 + MIN, held_at) == trimmed


# -- on a workspace ----------------------------------------------------------------------------------


def compact(ws: Workspace) -> CompactionResult:
    res = compact_topic(ws, TOPIC, clock_ms=lambda: T0)
    assert res.steps == ["ledger-created", "offloaded", "scratch-deleted", "recorded"]
    return res


def test_retention_trims_below_the_horizon_and_the_compacted_ledger_keeps_the_rest(ws: Workspace) -> None:
    """Five ledgers (two offloaded, three hot) compacted, two more written after the horizon (one of them
    offloaded). Retention of one minute, everything expired: only the ledgers up to the horizon go (the
    ones after it are held by the __compaction cursor), the drain deletes their copies and nothing of the
    compacted ledger; the compacted view is then exactly the latest value per key up to the horizon, then
    every message after it."""
    p = Producer()
    before = write(ws, [p.round(r) for r in range(5)])
    compacted_ids = sorted({lid for lid, _e, _d in before})
    uuids = offload(ws, compacted_ids[:2])
    first = compact(ws)
    assert first.horizon == Position(compacted_ids[-1], len(p.round(0)) - 1)
    after = write(ws, [p.round(r) for r in (5, 6)])
    after_ids = sorted({lid for lid, _e, _d in after})
    uuids.update(offload(ws, after_ids[:1]))
    written = before + after
    assert seen_view(ws) == expected_view(written, first.horizon)
    store_before = objects(ws)
    compacted_objects = of_uuid(store_before, first.uuid)
    assert compacted_objects and first.ledger_id not in ids(ws)

    ws.policies.set_namespace(NS, {"retention_time_minutes": 1})
    as_of = T0 + 2 * MIN  # every sealed ledger is past retention
    rows = retention(ws, as_of)
    assert [(r.ledger, r.kind, r.outcome) for r in rows] == [(lid, KIND_RETENTION, "trimmed") for lid in compacted_ids]
    assert ids(ws)[:2] == after_ids and len(ids(ws)) == 3  # and the open one
    assert plan_retention(ws, [NS], as_of) == []  # the rest is held, not forgotten
    # the trimmed ledgers' copies are gone, hot and offloaded; the compacted ledger's objects are untouched
    assert not any(ws.hot.exists(lid) for lid in compacted_ids)
    assert all(ws.hot.exists(lid) for lid in after_ids)
    store = objects(ws)
    assert not any(of_uuid(store, uuids[lid]) for lid in compacted_ids[:2])
    assert of_uuid(store, first.uuid) == compacted_objects and of_uuid(store, uuids[after_ids[0]])
    assert set(store) == set(store_before) - {k for lid in compacted_ids[:2] for k in of_uuid(store_before, uuids[lid])}
    # what is kept: the latest value of each key up to the horizon, from the compacted ledger, then the rest
    want = expected_view(written, first.horizon)
    assert seen_view(ws) == want
    assert [pos for pos, _k, _v in want if Position(pos[0], pos[1]) <= first.horizon]  # from trimmed ledgers
    # a plain read sees the ledgers after the horizon only
    assert plain_read(ws) == [(lid, e, d) for lid, e, d in written if lid in after_ids]
    st = compaction_state(ws.ml.get_topic(TOPIC)[0])
    assert st is not None and (st.ledger_id, st.uuid, st.horizon) == (first.ledger_id, first.uuid, first.horizon)

    # a second (incremental) compaction reads the previous compacted ledger, then what followed its horizon
    more = write(ws, [p.round(7)])
    written += more
    second = compact(ws)
    new_items = sum(len(compaction_items(d, lid, e)) for lid, e, d in after + more)
    assert second.messages_read == first.keys + new_items
    assert seen_view(ws) == expected_view(written, second.horizon)
    assert second.horizon == Position(more[-1][0], more[-1][1])
    # the previous compacted ledger's pair goes through the deletion log, due after the namespace's delete
    # delay (compacted reads that opened it finish); the drain then deletes it and nothing else
    recs = [e.record for e in ws.deletion_log.pending()]
    assert [(r.ledger_id, r.uuid, r.reason, r.next_attempt_ms) for r in recs] == \
        [(first.ledger_id, first.uuid, "topic-compaction", T0 + DEFAULT_COMPACTION_DELETE_DELAY_MS)]
    store_before = objects(ws)
    drain(ws, T0 + DEFAULT_COMPACTION_DELETE_DELAY_MS - 1)
    assert objects(ws) == store_before and len(ws.deletion_log.pending()) == 1
    clean_drain(ws, T0 + DEFAULT_COMPACTION_DELETE_DELAY_MS)
    assert objects(ws) == {k: v for k, v in store_before.items() if first.uuid not in k}
    assert of_uuid(store_before, first.uuid) == compacted_objects
    assert seen_view(ws) == expected_view(written, second.horizon)

    # the horizon now is the last entry of the newest sealed ledger: retention may take every sealed ledger,
    # and the compacted ledger alone holds the topic's history: one value per live key
    rows = retention(ws, T0 + 3 * MIN)
    assert [r.ledger for r in rows] == after_ids + [more[0][0]]
    assert plain_read(ws) == [] and len(ids(ws)) == 1
    latest: dict[str, bytes] = {}
    for _pos, key, payload in messages(written):
        if key is not None:
            latest[key] = payload
    got = seen_view(ws)
    assert {k: v for _p, k, v in got} == {k: v for k, v in latest.items() if v} and len(got) == len(
        [v for v in latest.values() if v])
    assert of_uuid(objects(ws), second.uuid)


def test_a_horizon_inside_a_ledger_keeps_that_ledger(ws: Workspace) -> None:
    """Compacted while its newest ledger was open: entries appended to that ledger after the horizon keep
    the whole ledger (Pulsar trims whole ledgers below the slowest durable cursor's ledger only), so no
    message after the horizon is ever lost to retention."""
    p = Producer()
    written = write(ws, [p.round(0)])
    w = TopicWriter(ws.ml, ws.hot, TOPIC, clock_ms=lambda: T0)
    open_id = ws.ml.get_topic(TOPIC)[0].ledgerInfo[-1].ledgerId
    head = p.round(1)
    w.append_many(head)
    first = compact(ws)
    assert first.horizon == Position(open_id, len(head) - 1)
    tail = p.round(2)
    w.append_many(tail)
    w.rollover()
    w.close(seal=False)
    written += [(open_id, e, d) for e, d in enumerate(head + tail)]
    written += write(ws, [p.round(3)])
    kept = ids(ws)[1:]
    ws.policies.set_namespace(NS, {"retention_size_mb": 0})  # everything sealed is over quota
    rows = retention(ws, T0 + MIN)
    assert [r.ledger for r in rows] == [written[0][0]]
    assert ids(ws) == kept
    assert seen_view(ws) == expected_view(written, first.horizon)
    assert plain_read(ws) == [(lid, e, d) for lid, e, d in written if lid != written[0][0]]


def test_lag_cleanup_and_reconciliation_know_the_compacted_ledger(ws: Workspace) -> None:
    """The deletion-lag cleanup deletes the hot copies of offloaded ledgers, never anything of the
    compacted ledger (it is in no ledgerInfo), and the compacted view still reads (after the horizon from
    the offloaded copies); orphan reconciliation with no grace period finds nothing to record, and the
    drain afterwards deletes nothing: the compacted ledger's objects are referenced while current."""
    p = Producer()
    written = write(ws, [p.round(r) for r in range(3)])
    offload(ws, sorted({lid for lid, _e, _d in written})[:1])
    first = compact(ws)
    after = write(ws, [p.round(r) for r in (3, 4)])
    written += after
    after_ids = sorted({lid for lid, _e, _d in after})
    offload(ws, after_ids)
    want = expected_view(written, first.horizon)
    assert seen_view(ws) == want
    compacted_objects = of_uuid(objects(ws), first.uuid)
    assert compacted_objects

    ws.policies.set_namespace(NS, {"deletion_lag_ms": 0})
    as_of = T0 + MIN
    plan = plan_lag_cleanup(ws, [NS], as_of)
    assert [(w.topic, sorted(w.ledgers)) for w in plan] == [
        ("persistent://acme/keys/table", [written[0][0], *after_ids])]
    rows = run(ws, plan)
    assert sorted((r.ledger, r.outcome) for r in rows) == sorted(
        (lid, "marked") for lid in [written[0][0], *after_ids])
    recs = [e.record for e in ws.deletion_log.pending()]
    assert recs and first.ledger_id not in {r.ledger_id for r in recs} and first.uuid not in {r.uuid for r in recs}
    clean_drain(ws, as_of)
    assert not any(ws.hot.exists(lid) for lid in after_ids)
    assert of_uuid(objects(ws), first.uuid) == compacted_objects
    assert seen_view(ws) == want  # after the horizon, read from the offloaded copies
    r = ws.reader()
    try:
        tiers = {tier for tier, _b in r.read_tiered_batches(TOPIC, Position(after_ids[0], 0))}
    finally:
        r.close()
    assert tiers == {"offloaded"}

    # reconciliation, days after the objects were written (wall clock) and with no grace period: nothing is
    # an orphan, nothing is recorded but the topic manifests beyond the newest three (docs/recovery.md)
    later = now_ms() + 3 * 24 * 3600 * 1000
    rep = reconcile(ws, later, grace_ms=0)
    assert rep.errors == [] and (rep.orphan_groups, rep.hot_orphans, rep.records_appended) == (0, 0, 0), rep.records
    assert rep.young_unreferenced == 0 and rep.withheld_groups == 0
    assert rep.referenced_objects >= len(compacted_objects)
    assert {e.record.type for e in ws.deletion_log.pending()} <= {"manifest"}
    dr = drain(ws, later)
    assert dr.entries == rep.manifests_superseded and dr.deleted == rep.manifests_superseded
    assert of_uuid(objects(ws), first.uuid) == compacted_objects and seen_view(ws) == want
    # a record naming the current compacted ledger anyway (an orphan record of a reconciliation that raced
    # the compaction's switch): acknowledged as still in use, nothing deleted
    st = compaction_state(ws.ml.get_topic(TOPIC)[0])
    assert st is not None and st.uuid == first.uuid
    ws.deletion_log.append([ObjectGroup(st.ledger_id, TYPE_OFFLOADED, st.uuid, st.driver).record(
        "acme/keys/persistent/table", Reason.ORPHAN, later)])
    dr = drain(ws, later)
    assert (dr.entries, dr.still_in_use, dr.deleted) == (1, 1, 0), dr.rows
    assert of_uuid(objects(ws), first.uuid) == compacted_objects and seen_view(ws) == want


def test_a_compaction_state_that_does_not_parse_trims_nothing(ws: Workspace) -> None:
    """What the horizon holds back is unknown: retention reports the topic's record as unreadable (one
    failed row) and removes no ledger."""
    p = Producer()
    write(ws, [p.round(r) for r in range(3)])
    compact(ws)

    def damage(info) -> bool:
        for kv in info.properties:
            if kv.key == "__compaction.markDeletePosition":
                kv.value = "not-a-position"
        return True

    ws.ml.update_topic(TOPIC, damage)
    before = ids(ws)
    ws.policies.set_namespace(NS, {"retention_time_minutes": 0})
    rows = run(ws, plan_retention(ws, [NS], T0 + MIN))
    assert [(r.kind, r.outcome) for r in rows] == [(KIND_RETENTION, "failed")]
    assert "compaction state in the topic record does not parse" in rows[0].error
    assert ids(ws) == before and not ws.deletion_log.pending()


def test_deleting_a_compacted_topic_records_its_compacted_ledger(ws: Workspace) -> None:
    """Topic deletion (phase 1) appends a record for the compacted ledger's objects beside its ledgers'
    (nothing names them once the record is gone); the drain deletes every object of the topic, and a
    reconciliation afterwards finds no orphan."""
    p = Producer()
    written = write(ws, [p.round(r) for r in range(3)])
    offload(ws, sorted({lid for lid, _e, _d in written}))
    first = compact(ws)
    assert of_uuid(objects(ws), first.uuid)
    dl = delete_topic(ws, TOPIC, T0 + MIN)
    assert dl.deleted
    recs = [e.record for e in ws.deletion_log.pending()]
    ours = [r for r in recs if r.uuid == first.uuid]
    assert [(r.ledger_id, r.type, r.reason) for r in ours] == [
        (first.ledger_id, TYPE_OFFLOADED, Reason.TOPIC_DELETION.value)]
    clean_drain(ws, T0 + MIN)
    assert set(objects(ws)) == {"tiered-owner.standalone"}  # every ledger's objects and the compacted ledger's gone
    later = now_ms() + 3 * 24 * 3600 * 1000
    rep = reconcile(ws, later, grace_ms=0)
    assert rep.errors == [] and (rep.orphan_groups, rep.hot_orphans) == (0, 0), rep.records
