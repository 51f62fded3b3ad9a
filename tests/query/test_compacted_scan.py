"""The archive's compacted view (issue 25 item 3; docs/query.md, option ``compacted``): plan_scan(compacted=True)
and read_part serve a compacted topic as Pulsar's readCompacted does: its compacted ledger's messages at the
positions they stand for (tier ``compacted``, ``compacted_out`` placeholders never rows, as pulsar-client's
``ConsumerImpl.receiveIndividualMessagesFromBatch`` skips them), then the topic's messages after the horizon.
Checked against TopicReader.read_compacted decoded message by message, and against a plain dict."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from tests.lifecycle.test_topic_compaction import TOPIC, Producer, _key, expected_view, round_of, write
from tieredcore.cli import main as cli
from tieredcore.config import Config
from tieredcore.formats.compacted import compacted_out_indexes, compaction_items
from tieredcore.formats.messages import decode_entry
from tieredcore.lifecycle.topic_compaction import compact_topic
from tieredcore.names import TopicName
from tieredcore.query.scan import TIER_COMPACTED, plan_scan, read_part
from tieredcore.topic.writer import TopicWriter
from tieredcore.workspace import Workspace


@pytest.fixture
def ws(tmp_path: Path) -> Iterator[Workspace]:
    root = tmp_path / "ws"
    assert cli.main(["init", str(root)]) == 0
    with Workspace(Config.load(root / "tiered.toml", env={})) as w:
        yield w


def scan(ws: Workspace, raw: bool = False, part_bytes: int = 1 << 27, compacted: bool = True) -> pa.Table:
    plan = plan_scan(ws, [TopicName.parse(TOPIC)], part_bytes=part_bytes, compacted=compacted)
    batches = [b for part in plan.parts for b in read_part(ws, part, raw=raw)]
    return pa.Table.from_batches(batches) if batches else pa.table({})


def reader_view(ws: Workspace) -> list[tuple[int, int, int, str | None, bytes]]:
    return [(pos.ledger_id, pos.entry_id, m.batch_index, _key(m),
             bytes(m.payload))
            for pos, d in ws.reader().read_compacted(TOPIC)
            for m in decode_entry(d, pos.ledger_id, pos.entry_id) if not m.compacted_out]


def rows_of(t: pa.Table) -> list[tuple[int, int, int, str | None, bytes]]:
    return [(r["ledger_id"], r["entry_id"], r["batch_index"], r["key"], r["payload"]) for r in t.to_pylist()]


@pytest.mark.parametrize("part_bytes", [1 << 27, 300])  # one part, and the compacted ledger in many pieces
def test_compacted_scan_is_the_readers_compacted_view(ws: Workspace, part_bytes: int) -> None:
    p = Producer()
    write(ws, [round_of(p, r) for r in range(4)], offload_first=2)
    compact_topic(ws, TOPIC)
    w = TopicWriter(ws.ml, ws.hot, TOPIC)
    w.append_many([p.single("k1", b"after"), p.single(None, b"live keyless")] + round_of(p, 9))
    w.close()
    t = scan(ws, part_bytes=part_bytes)
    assert rows_of(t) == reader_view(ws)
    tiers = t.column("tier").to_pylist()
    n = tiers.count(TIER_COMPACTED)
    assert n and set(tiers[:n]) == {TIER_COMPACTED} and TIER_COMPACTED not in tiers[n:]
    # the compacted part holds exactly the plain dict's latest value per key up to the horizon
    assert sorted((str((r[0], r[1], r[2])), r[3], r[4]) for r in rows_of(t)[:n]) == \
        expected_view_up_to_horizon(ws)
    # a plain scan still reads every message of the topic
    plain = scan(ws, compacted=False)
    assert plain.num_rows > t.num_rows and TIER_COMPACTED not in plain.column("tier").to_pylist()


def expected_view_up_to_horizon(ws: Workspace) -> list[tuple[str, str, bytes]]:
    from tieredcore.offload.compacted_state import compaction_state

    st = compaction_state(ws.ml.get_topic(TOPIC)[0])
    assert st is not None
    return [(pos, k, v) for pos, k, v in expected_view_upto(ws, st.horizon)]


def expected_view_upto(ws: Workspace, horizon) -> list[tuple[str, str, bytes]]:
    latest: dict[str, tuple[tuple[int, int, int], bytes]] = {}
    for pos, data in ws.reader().read(TOPIC, None, horizon):
        for m in decode_entry(data, pos.ledger_id, pos.entry_id):
            key = _key(m)
            if m.compacted_out or key is None:
                continue
            latest[key] = ((m.ledger_id, m.entry_id, m.batch_index), bytes(m.payload))
    return sorted((str(p), k, v) for k, (p, v) in latest.items() if v)


def test_raw_compacted_scan_gives_the_entries_at_their_positions(ws: Workspace) -> None:
    p = Producer()
    write(ws, [round_of(p, r) for r in range(3)], offload_first=1)
    compact_topic(ws, TOPIC)
    t = scan(ws, raw=True, part_bytes=200)
    assert [(r["ledger_id"], r["entry_id"], r["entry"]) for r in t.to_pylist()] == \
        [(pos.ledger_id, pos.entry_id, data) for pos, data in ws.reader().read_compacted(TOPIC)]


def test_keys_of_the_compacted_view_leave_placeholders_out(ws: Workspace) -> None:
    """entries=keys with compacted=true: each message of the compacted view as compaction sees it, at the
    position it stands for; the compacted ledger's compacted_out placeholders are no rows."""
    p = Producer()
    write(ws, [round_of(p, r) for r in range(3)], offload_first=1)
    compact_topic(ws, TOPIC)
    plan = plan_scan(ws, [TopicName.parse(TOPIC)], part_bytes=200, compacted=True)
    got = [(r["ledger_id"], r["entry_id"], r["batch_index"], r["key"], r["size"], r["tier"])
           for part in plan.parts for b in read_part(ws, part, keys=True) for r in b.to_pylist()]
    want = [(pos.ledger_id, pos.entry_id, it.position.batch_index, it.key, it.size)
            for pos, data in ws.reader().read_compacted(TOPIC)
            for it in compaction_items(data, pos.ledger_id, pos.entry_id)]
    assert [g[:5] for g in got] == want and {g[5] for g in got} == {TIER_COMPACTED}
    placeholders = sum(len(compacted_out_indexes(d, pos.ledger_id, pos.entry_id))
                       for pos, d in ws.reader().read_compacted(TOPIC))
    assert placeholders > 0  # the view has them, and no row stands for one


def test_a_topic_never_compacted_scans_as_a_plain_topic(ws: Workspace) -> None:
    p = Producer()
    write(ws, [round_of(p, r) for r in range(2)])
    assert rows_of(scan(ws)) == rows_of(scan(ws, compacted=False))
    assert expected_view(ws)  # (the fixture has keys)
