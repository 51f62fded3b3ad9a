"""Topic compaction over tiered data (issue 25, docs/topic-compaction.md "How it runs"): compact_topic on a
real workspace (SQLite metadata, local hot tier, filesystem store), its compacted view against a plain
dict, incremental runs, a crash after every step, bad input."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.workspaces import stream
from tieredcore.cli import main as cli
from tieredcore.cold.blob import iter_objects
from tieredcore.config import Config
from tieredcore.errors import TopicNotFoundError
from tieredcore.formats import compression
from tieredcore.formats.compacted import compaction_items, latest_per_key, rewrite_entry
from tieredcore.formats.keys import parse_key
from tieredcore.formats.messages import Message, OutMessage, decode_entry, encode_batch, encode_message
from tieredcore.lifecycle import topic_compaction
from tieredcore.lifecycle.drain import drain
from tieredcore.lifecycle.reconcile.run import reconcile
from tieredcore.lifecycle.topic_compaction import TopicCompactionError, compact_topic, partition_of
from tieredcore.meta.deletion_log import TYPE_OFFLOADED
from tieredcore.meta.reasons import Reason
from tieredcore.model import Position
from tieredcore.names import TopicName
from tieredcore.offload.compacted_state import compacted_uuids, compaction_state
from tieredcore.offload.context import referenced_uuids
from tieredcore.offload.transaction import ObjectGroup
from tieredcore.topic.writer import TopicWriter
from tieredcore.workspace import Workspace

TOPIC = "acme/keys/persistent/table"
DAY_MS = 24 * 3600 * 1000


@pytest.fixture
def ws(tmp_path: Path) -> Iterator[Workspace]:
    root = tmp_path / "ws"
    assert cli.main(["init", str(root)]) == 0
    with Workspace(Config.load(root / "tiered.toml", env={})) as w:
        yield w


class Producer:
    """Hand-built entries: single messages and batches (with codecs), keyed, keyless, tombstones."""

    def __init__(self) -> None:
        self.seq = 0

    def single(self, key: str | None, payload: bytes, null_value: bool = False) -> bytes:
        self.seq += 1
        return encode_message(OutMessage(payload=payload, key=key, null_value=null_value), producer="p",
                              sequence_id=self.seq, publish_time=1000 + self.seq)

    def batch(self, msgs: list[tuple[str | None, bytes | None]], codec: int = compression.NONE) -> bytes:
        self.seq += len(msgs)
        out = [OutMessage(payload=p or b"", key=k, null_value=p is None) for k, p in msgs]
        return encode_batch(out, producer="p", sequence_id=self.seq, publish_time=1000 + self.seq, codec=codec)


def round_of(p: Producer, r: int) -> list[bytes]:
    """One ledger's worth of entries of round ``r``: values, overwrites, tombstones (empty payload and
    null_value), keyless messages, batches of several codecs."""
    k = [f"k{i}" for i in range(8)]
    return [
        p.single(k[r % 8], b"v%d-a" % r),
        p.batch([(k[1], b"b1-%d" % r), (None, b"nokey"), (k[2], b"b2-%d" % r)]),
        p.single(None, b"keyless-%d" % r),
        p.batch([(k[3], b"x" * 40 + b"%d" % r), (k[4], b"y%d" % r), (k[3], b"z%d" % r)], compression.LZ4),
        p.single(k[(r + 3) % 8], b""),  # empty payload: a tombstone
        p.batch([(k[5], None), (k[6], b"w%d" % r)], compression.ZSTD),  # a batched null value
        p.single(k[(r + 5) % 8], b"", null_value=True),
        p.single(k[7], b"last-%d" % r),
    ]


def write(ws: Workspace, ledgers: list[list[bytes]], offload_first: int = 0) -> None:
    """One sealed ledger per list (then an open, empty one), the first ``offload_first`` offloaded."""
    w = TopicWriter(ws.ml, ws.hot, TOPIC)
    for entries in ledgers:
        w.append_many(entries)
        w.rollover()
    w.close(seal=False)
    info, _ = ws.ml.get_topic(TOPIC)
    ids = [li.ledgerId for li in info.ledgerInfo if li.timestamp > 0][:offload_first]
    if ids:
        res = ws.topic_offloader().offload_ledgers(TOPIC, ids)
        assert [r.outcome for r in res] == ["offloaded"] * len(ids), res


def expected_view(ws: Workspace) -> list[tuple[str, str, bytes]]:
    """The compacted view computed with a plain dict over every message of the topic (plain read): for
    each key its last message, dropped if it has no payload; keyless messages are not retained."""
    latest: dict[str, tuple[tuple[int, int, int], bytes]] = {}
    for pos, data in ws.reader().read(TOPIC):
        for m in decode_entry(data, pos.ledger_id, pos.entry_id):
            key = _key(m)
            if m.compacted_out or key is None:
                continue
            latest[key] = ((m.ledger_id, m.entry_id, m.batch_index), bytes(m.payload))
    return sorted((str(p), k, v) for k, (p, v) in latest.items() if v)


def seen_view(ws: Workspace, start: Position | None = None) -> list[tuple[str, str, bytes]]:
    """What a compacted read delivers to a consumer: messages not compacted out, their key and payload."""
    out = []
    for pos, data in ws.reader().read_compacted(TOPIC, start):
        for m in decode_entry(data, pos.ledger_id, pos.entry_id):
            if m.compacted_out:
                continue
            out.append((_pos(m), _key(m), bytes(m.payload)))
    return sorted(out)


def _pos(m: Message) -> str:
    return str((m.ledger_id, m.entry_id, m.batch_index))


def _key(m: Message) -> str | None:
    own = m.single if m.single is not None else m.metadata
    return own.partition_key if own.HasField("partition_key") else None


def test_compacted_view_equals_a_plain_dict(ws: Workspace) -> None:
    p = Producer()
    write(ws, [round_of(p, r) for r in range(4)], offload_first=2)  # keys in offloaded and hot ledgers
    stream(ws, TOPIC, as_of=10**13)  # and in PIP-76 segments
    write(ws, [round_of(p, 4)])  # and hot again
    tiers = {tier for tier, _b in ws.reader().read_tiered_batches(TOPIC)}
    assert tiers == {"hot", "offloaded", "segments"}, tiers
    res = compact_topic(ws, TOPIC)
    assert res.steps == ["ledger-created", "offloaded", "scratch-deleted", "recorded"]
    assert seen_view(ws) == expected_view(ws) and res.keys == len(expected_view(ws))
    info, _ = ws.ml.get_topic(TOPIC)
    st = compaction_state(info)
    assert st is not None and (st.ledger_id, st.uuid, st.horizon) == (res.ledger_id, res.uuid, res.horizon)
    assert not ws.hot.exists(res.ledger_id)  # only the V1 object pair holds it
    # messages after the horizon are read live, after the compacted ledger
    w = TopicWriter(ws.ml, ws.hot, TOPIC)
    w.append_many([p.single("k1", b"after"), p.single(None, b"live keyless")])
    w.close()
    got = [(_key(m), bytes(m.payload)) for pos, d in ws.reader().read_compacted(TOPIC)
           for m in decode_entry(d, pos.ledger_id, pos.entry_id) if not m.compacted_out]
    assert got[-2:] == [("k1", b"after"), (None, b"live keyless")]


def test_entries_are_byte_for_byte_the_rewritten_entries(ws: Workspace, monkeypatch) -> None:
    """Each compacted entry is either an original entry unchanged or its batch rewritten; the view is
    served at original positions in order (written to the compacted ledger a few entries per append)."""
    monkeypatch.setattr(topic_compaction, "APPEND_BATCH", 3)
    p = Producer()
    write(ws, [round_of(p, r) for r in range(3)], offload_first=1)
    assert compact_topic(ws, TOPIC).entries_written > 3
    original = {pos: data for pos, data in ws.reader().read(TOPIC)}
    latest = latest_per_key(it for pos, data in original.items()
                            for it in compaction_items(data, pos.ledger_id, pos.entry_id))
    want = [(pos, out) for pos, data in original.items()
            if (out := rewrite_entry(data, pos.ledger_id, pos.entry_id, latest)) is not None]
    got = list(ws.reader().read_compacted(TOPIC))
    assert got == want and len(got) < len(original)
    for pos, data in got:
        if decode_entry(data, pos.ledger_id, pos.entry_id)[0].single is None:
            assert data == original[pos]  # an entry taken whole is written unchanged


def test_incremental_equals_from_scratch(tmp_path: Path) -> None:
    views = []
    for incremental in (True, False):
        root = tmp_path / ("inc" if incremental else "full")
        assert cli.main(["init", str(root)]) == 0
        with Workspace(Config.load(root / "tiered.toml", env={})) as ws:
            p = Producer()
            write(ws, [round_of(p, r) for r in range(3)], offload_first=2)
            if incremental:
                first = compact_topic(ws, TOPIC)
            w = TopicWriter(ws.ml, ws.hot, TOPIC)
            w.append_many(round_of(p, 7) + [p.single("k2", b""), p.single("new", b"n")])
            w.close()
            res = compact_topic(ws, TOPIC)
            if incremental:
                # it read the previous compacted ledger plus what followed its horizon
                everything = sum(len(compaction_items(d, pos.ledger_id, pos.entry_id))
                                 for pos, d in ws.reader().read(TOPIC))
                after = sum(len(compaction_items(d, pos.ledger_id, pos.entry_id)) for pos, d in ws.reader().read(
                    TOPIC, Position(first.horizon.ledger_id, first.horizon.entry_id + 1)))
                assert res.messages_read == first.keys + after < everything
                assert first.ledger_id != res.ledger_id
                # the previous compacted ledger goes through the deletion log, never deleted directly
                recs = [e.record for e in ws.deletion_log.pending()]
                assert [(r.ledger_id, r.uuid, r.reason) for r in recs] == \
                    [(first.ledger_id, first.uuid, "topic-compaction")]
            assert seen_view(ws) == expected_view(ws)
            # the first compacted ledger took a ledger id: positions compared as (nth ledger, entry)
            nth = {li.ledgerId: i for i, li in enumerate(ws.ml.get_topic(TOPIC)[0].ledgerInfo)}
            views.append([(nth[pos.ledger_id], pos.entry_id, data)
                          for pos, data in ws.reader().read_compacted(TOPIC)])
    assert views[0] == views[1] and views[0]


class Crash(BaseException):
    """The process stops here: nothing after runs, no clean-up."""


STEPS = ["ledger-created", "offloaded", "scratch-deleted", "recorded"]


def stored_uuids(ws: Workspace) -> set[str]:
    """The uuid of every offloaded object in the store (the workspace's ownership marker aside)."""
    prefix = ws.offloader.prefix
    out = set()
    for o in iter_objects(ws.store, prefix):
        k = parse_key(o.key, prefix)
        if k is not None:
            out.add(k.uuid)
    return out


def referenced(ws: Workspace) -> set[str]:
    info, _ = ws.ml.get_topic(TOPIC)
    out = compacted_uuids(info)
    for li in info.ledgerInfo:
        out |= referenced_uuids(li)
    return out


@pytest.mark.parametrize("at", STEPS)
def test_a_crash_after_every_step(ws: Workspace, at: str) -> None:
    crash_drill(ws, at, lambda w, on_step=None: compact_topic(w, TOPIC, on_step=on_step))


def crash_drill(ws: Workspace, at: str, compact) -> None:
    """A crash after each step leaves the old state whole (the old compacted ledger, then the live
    messages after its horizon) or the new one; drain + reconcile then leave nothing unreferenced in the
    store or the hot tier, and the recorded compacted ledger is never deleted. ``compact(ws, on_step=)``
    compacts TOPIC (in one process, or on Spark: tests/spark/test_topic_compaction_spark.py)."""
    p = Producer()
    write(ws, [round_of(p, r) for r in range(2)], offload_first=1)
    first = compact(ws)
    old_view = list(ws.reader().read_compacted(TOPIC))
    w = TopicWriter(ws.ml, ws.hot, TOPIC)
    w.append_many(round_of(p, 5))
    w.close()
    after_horizon = list(ws.reader().read(TOPIC, Position(first.horizon.ledger_id, first.horizon.entry_id + 1)))
    assert after_horizon

    def crash(step: str) -> None:
        if step == at:
            raise Crash(step)

    with pytest.raises(Crash):
        compact(ws, on_step=crash)
    st = compaction_state(ws.ml.get_topic(TOPIC)[0])
    assert st is not None
    if at == "recorded":
        assert st.ledger_id != first.ledger_id and st.uuid != first.uuid
        assert seen_view(ws) == expected_view(ws)
    else:
        assert (st.ledger_id, st.uuid, st.horizon) == (first.ledger_id, first.uuid, first.horizon)
        assert list(ws.reader().read_compacted(TOPIC)) == old_view + after_horizon
    # the operator's scheduled jobs, days later, no grace: drain, reconcile, drain
    as_of = 10**13
    for _ in range(3):
        rep = drain(ws, as_of)
        assert (rep.retrying, rep.dead_lettered, rep.malformed, rep.refused_mismatch) == (0, 0, 0, 0), rep.rows
        rec = reconcile(ws, as_of, grace_ms=0)
        assert rec.errors == [], rec.errors
        as_of += DAY_MS
    drain(ws, as_of)
    assert not ws.deletion_log.pending()
    dry = reconcile(ws, as_of, grace_ms=0, dry_run=True)
    assert (dry.orphan_groups, dry.hot_orphans, dry.stale_uploads) == (0, 0, 0), dry.records
    assert stored_uuids(ws) == referenced(ws) and st.uuid in stored_uuids(ws)
    info, _ = ws.ml.get_topic(TOPIC)
    assert sorted(ws.hot.list_ledgers()) == sorted(li.ledgerId for li in info.ledgerInfo)
    # the state left reads, and a later run reaches the dict's view
    assert list(ws.reader().read_compacted(TOPIC))
    if at != "recorded":
        compact(ws)
    assert seen_view(ws) == expected_view(ws)


def state_of_everything(ws: Workspace) -> tuple:
    """The hot tier's ledgers, the store's objects, the deletion log and the topic records."""
    topics = tuple(ws.ml.store.get(f"/managed-ledgers/{t.managed_ledger_name}").value
                   for ns in ws.ml.list_namespaces() for t in ws.ml.list_topics(ns))
    objects = sorted(o.key for o in iter_objects(ws.store, ws.offloader.prefix))
    return sorted(ws.hot.list_ledgers()), objects, [e.raw for e in ws.deletion_log.pending()], topics


def test_unknown_topic_and_empty_topic_write_nothing(ws: Workspace) -> None:
    """Bad input: one line saying what is wrong, and nothing written anywhere."""
    before = state_of_everything(ws)
    with pytest.raises(TopicNotFoundError) as e:
        compact_topic(ws, "acme/keys/persistent/nope")
    assert str(e.value) == "topic persistent://acme/keys/nope not found (no managed-ledger record)"
    assert state_of_everything(ws) == before
    w = TopicWriter(ws.ml, ws.hot, TOPIC)
    w.close(seal=False)
    before = state_of_everything(ws)
    with pytest.raises(TopicCompactionError) as e:
        compact_topic(ws, TOPIC)
    assert str(e.value) == f"topic persistent://{TOPIC.replace('/persistent/', '/')} has no messages: " \
        "nothing to compact"
    assert state_of_everything(ws) == before and compaction_state(ws.ml.get_topic(TOPIC)[0]) is None


def test_nothing_after_the_horizon_writes_nothing(ws: Workspace) -> None:
    p = Producer()
    write(ws, [round_of(p, 0)])
    res = compact_topic(ws, TOPIC)
    before = state_of_everything(ws)
    with pytest.raises(TopicCompactionError, match=f"no messages after its compaction horizon {res.horizon}"):
        compact_topic(ws, TOPIC)
    assert state_of_everything(ws) == before


def test_partition_index_in_the_message_ids() -> None:
    assert partition_of(TopicName.parse("persistent://a/b/t-partition-3")) == 3
    assert partition_of(TopicName.parse("persistent://a/b/t")) == -1
    assert partition_of(TopicName.parse("persistent://a/b/-partition-3")) == -1



def test_the_drain_never_deletes_the_current_compacted_ledger(ws: Workspace) -> None:
    """A pending deletion naming the recorded compacted ledger (a cover step whose switch never landed)
    is acknowledged as still in use; its objects stay and the view reads."""
    p = Producer()
    write(ws, [round_of(p, 0)])
    res = compact_topic(ws, TOPIC)
    st = compaction_state(ws.ml.get_topic(TOPIC)[0])
    assert st is not None
    group = ObjectGroup(st.ledger_id, TYPE_OFFLOADED, st.uuid, st.driver)
    ws.deletion_log.append([group.record(TOPIC, Reason.TOPIC_COMPACTION, 0)])
    rep = drain(ws, 10**13)
    assert rep.still_in_use == 1 and rep.deleted == 0, rep.rows
    assert res.uuid in stored_uuids(ws) and seen_view(ws) == expected_view(ws)


def test_a_run_that_loses_the_switch_gives_its_ledger_back(ws: Workspace) -> None:
    """Another compaction lands while ours writes: ours is refused at the switch (one line), its objects
    become a pending deletion, the other's state stays."""
    p = Producer()
    write(ws, [round_of(p, 0)])
    other: list = []

    def race(step: str) -> None:
        if step == "scratch-deleted" and not other:
            other.append(compact_topic(ws, TOPIC))

    with pytest.raises(TopicCompactionError, match="compaction state changed meanwhile"):
        compact_topic(ws, TOPIC, on_step=race)
    st = compaction_state(ws.ml.get_topic(TOPIC)[0])
    assert st is not None and st.uuid == other[0].uuid
    recs = [e.record for e in ws.deletion_log.pending()]
    assert [r.reason for r in recs] == ["topic-compaction-conflict"] and recs[0].uuid != st.uuid
    drain(ws, 10**13)
    assert stored_uuids(ws) == referenced(ws) and seen_view(ws) == expected_view(ws)


def test_cli_reads_the_compacted_view(ws: Workspace, tmp_path: Path, capsys) -> None:
    """`tiered read --compacted --messages`: the messages a consumer of the compacted view gets."""
    p = Producer()
    write(ws, [round_of(p, r) for r in range(2)], offload_first=1)
    compact_topic(ws, TOPIC)
    capsys.readouterr()
    root = str(tmp_path / "ws")
    assert cli.main(["--workspace", root, "--json", "read", TOPIC, "--compacted", "--messages"]) == 0
    rows = json.loads(capsys.readouterr().out)["messages"]
    want = expected_view(ws)
    assert sorted((str((r["ledger"], r["entry"], r["batch_index"])), r["key"]) for r in rows) == \
        sorted((pos, key) for pos, key, _v in want)
    assert all(not r.get("compacted_out") for r in rows)
    assert cli.main(["--workspace", root, "--json", "read", TOPIC, "--compacted"]) == 0
    entries = json.loads(capsys.readouterr().out)["entries"]
    assert [e["position"] for e in entries] == [str(pos) for pos, _ in ws.reader().read_compacted(TOPIC)]


def test_a_compacted_read_from_a_start_position(ws: Workspace, monkeypatch) -> None:
    """read_compacted(start) finds its first compacted entry by binary search (CompactedTopicImpl.findStartPoint):
    from every position of the topic, and before and after it, it serves exactly the full view's entries at
    or after that position (the search runs for every start at or before the horizon)."""
    from tieredcore.topic import reader as reader_mod

    p = Producer()
    write(ws, [round_of(p, r) for r in range(4)], offload_first=2)
    compact_topic(ws, TOPIC)
    w = TopicWriter(ws.ml, ws.hot, TOPIC)
    w.append_many([p.single("k1", b"after")])
    w.close()
    full = list(ws.reader().read_compacted(TOPIC))
    probes = [pos for pos, _d in ws.reader().read(TOPIC)] + [Position(0, 0), Position(10**9, 0)]
    steps = []
    real = reader_mod._first_at_or_after
    monkeypatch.setattr(reader_mod, "_first_at_or_after", lambda h, s: steps.append(h.last_add_confirmed) or real(h, s))
    for start in probes:
        assert list(ws.reader().read_compacted(TOPIC, start)) == [(q, d) for q, d in full if q >= start], start
    assert len(steps) == len([s for s in probes if s <= compaction_state(ws.ml.get_topic(TOPIC)[0]).horizon])
