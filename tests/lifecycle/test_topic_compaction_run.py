"""Topic compaction's planning and report (tieredcore/lifecycle/topic_compaction_run.py): the backlog after
the compaction horizon from the topic record's ledger sizes, which topics a policy threshold makes due,
one topic's run as a report row (compacted, nothing to compact, a lost race), the report's counters."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tieredcore.cli import main as cli
from tieredcore.config import Config
from tieredcore.errors import TopicNotFoundError
from tieredcore.lifecycle import topic_compaction
from tieredcore.lifecycle.topic_compaction import TopicCompactionError, compact_topic
from tieredcore.lifecycle.topic_compaction_run import (
    NOTHING,
    TopicCompactionReport,
    backlog_bytes,
    compaction_row,
    plan_topic_compaction,
    plan_topic_compaction_due,
)
from tieredcore.model import Position
from tieredcore.names import TopicName
from tieredcore.offload.compacted_state import compaction_state
from tieredcore.reports import exit_code
from tieredcore.topic.writer import TopicWriter
from tieredcore.workspace import Workspace

NS, OTHER = "acme/keys", "acme/plain"
T0, T1 = f"persistent://{NS}/topic-0000", f"persistent://{NS}/topic-0001"
O0 = f"persistent://{OTHER}/topic-0000"
LEDGERS, ENTRIES = 3, 40


@pytest.fixture
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Workspace]:
    monkeypatch.setenv("TIERED_NO_PROGRESS", "1")
    root = tmp_path / "ws"
    assert cli.main(["init", str(root)]) == 0
    assert cli.main(["--workspace", str(root), "generate", "--namespace", NS, "--namespace", OTHER, "--topics", "2",
                     "--ledgers", str(LEDGERS), "--entries", str(ENTRIES), "--entry-size", "100-400", "--keys", "10",
                     "--open-entries", "5", "--end-time", "2026-03-01T12:00:00Z"]) == 0
    with Workspace(Config.load(root / "tiered.toml", env={})) as w:
        yield w


def entry_sizes(ws: Workspace, topic: str) -> dict[tuple[int, int], int]:
    return {(p.ledger_id, p.entry_id): len(d) for p, d in ws.reader().read(topic)}


def test_backlog_is_every_entry_then_what_follows_the_horizon(ws: Workspace, monkeypatch) -> None:
    sizes = entry_sizes(ws, T0)
    info, _ = ws.ml.get_topic(T0)
    sealed = sum(li.size for li in info.ledgerInfo if li.timestamp > 0)
    open_bytes = sum(n for (lid, _e), n in sizes.items() if lid == info.ledgerInfo[-1].ledgerId)
    assert open_bytes > 0 and len(sizes) == LEDGERS * ENTRIES + 5
    # never compacted: the sealed ledgers' recorded sizes plus the open ledger's hot copy
    assert backlog_bytes(ws, T0) == sealed + open_bytes
    res = compact_topic(ws, T0)
    assert backlog_bytes(ws, T0) == 0 and res.horizon.ledger_id == info.ledgerInfo[-1].ledgerId
    w = TopicWriter(ws.ml, ws.hot, T0)
    w.append_many([b"x" * 100] * 4)
    w.close()
    assert backlog_bytes(ws, T0) == 4 * 100
    # a horizon inside a sealed ledger: the fraction of its entries after the horizon
    info, _ = ws.ml.get_topic(T1)
    first = info.ledgerInfo[0]
    assert compaction_state(info) is None
    monkeypatch.setattr(topic_compaction, "last_position", lambda reader, t: Position(first.ledgerId, 9))
    assert compact_topic(ws, T1).horizon == Position(first.ledgerId, 9)
    after_first = first.size * (ENTRIES - 10) // ENTRIES
    rest = sum(n for (lid, _e), n in entry_sizes(ws, T1).items() if lid != first.ledgerId)
    assert backlog_bytes(ws, T1) == after_first + rest


def test_plan_by_threshold_and_explicit_topics(ws: Workspace) -> None:
    # no threshold anywhere: nothing planned
    assert plan_topic_compaction(ws) == ([], [])
    assert plan_topic_compaction_due(ws) == []
    b0, b1 = backlog_bytes(ws, T0), backlog_bytes(ws, T1)
    threshold = (b0 + b1) // 2
    ws.policies.set_namespace(NS, {"topic_compaction_threshold_bytes": threshold})
    big = max((T0, b0), (T1, b1), key=lambda x: x[1])
    assert b0 != b1
    due, notes = plan_topic_compaction(ws)
    assert due == [big] and notes == [f"namespace {NS}: 1 topic(s) with a backlog below the threshold"]
    (d,) = plan_topic_compaction_due(ws)
    assert (d.namespace, d.units, d.bytes) == (NS, 1, big[1])
    # the override (0: any backlog) applies to the named namespaces, policy off or not
    due, _ = plan_topic_compaction(ws, [NS, OTHER], threshold_override=0)
    assert [t for t, _ in due] == [T0, T1, O0, O0.replace("0000", "0001")]
    due, notes = plan_topic_compaction(ws, [OTHER])
    assert due == [] and "topic compaction off in their policy" in notes[0]
    (idle,) = plan_topic_compaction_due(ws, [OTHER])
    assert idle.units == 0 and "--compaction-threshold" in idle.reason
    # a topic's own policy turns it off inside an enabled namespace
    ws.policies.set_topic(big[0], {"topic_compaction_threshold_bytes": -1})
    assert plan_topic_compaction(ws)[0] == []
    # explicit topics: always planned (a manual trigger), whatever the policy; each once
    due, _ = plan_topic_compaction(ws, topics=[O0, "acme/plain/topic-0000", T1])
    assert due == [(O0, backlog_bytes(ws, O0)), (T1, b1)]
    with pytest.raises(TopicNotFoundError):
        plan_topic_compaction(ws, topics=["acme/keys/nope"])


def test_rows_and_report(ws: Workspace) -> None:
    def compact(t: str):
        return compact_topic(ws, t)

    row = compaction_row(ws, T0, 123, compact)
    info, _ = ws.ml.get_topic(T0)
    st = compaction_state(info)
    assert row["outcome"] == "compacted" and row["new_ledger"] == st.ledger_id and row["uuid"] == st.uuid
    assert row["horizon"] == f"{st.horizon.ledger_id}:{st.horizon.entry_id}" and row["previous_ledger"] == -1
    assert row["keys_before"] == 10 and 0 < row["keys_after"] <= 10 and row["backlog"] == 123
    assert 0 < row["bytes_after"] < row["bytes_before"] and row["messages"] > LEDGERS * ENTRIES
    again = compaction_row(ws, T0, 0, compact)  # nothing after the horizon: not a failure, nothing written
    assert again["outcome"] == NOTHING and "nothing to compact" in again["error"]
    assert compaction_state(ws.ml.get_topic(T0)[0]) == st

    def lost(t: str):
        raise TopicCompactionError(f"{t}: the compaction state changed meanwhile")

    conflict = compaction_row(ws, T1, 5, lost)
    assert conflict["outcome"] == "conflict" and "changed meanwhile" in conflict["error"]
    dry = compaction_row(ws, T1, 5, lost, dry_run=True)  # never calls compact
    assert dry["outcome"] == "planned" and dry["horizon"]
    report = TopicCompactionReport(0, False, [row, again, conflict])
    t = report.totals()
    # the job's exit code: a conflict fails the run (retried next run), nothing to compact does not
    assert exit_code(t) == 1 and exit_code(TopicCompactionReport(0, False, [row, again]).totals()) == 0
    assert t["failures"] == 1 and t["outcomes"] == {"compacted": 1, "nothing": 1, "conflict": 1}
    assert t["counters"]["keys_before"] == 10 and t["counters"]["bytes_after"] == row["bytes_after"]
    ns = report.summary()["namespaces"][NS]
    assert (ns["topics"], ns["compacted"], ns["nothing"], ns["conflicts"], ns["failed"]) == (3, 1, 1, 1, 0)
    rows, ddl = report.detail()
    assert len(rows) == 3 and len(rows[0]) == len(ddl.split(","))
    msgs = report.messages()
    assert any(m.startswith("CONFLICT " + T1) for m in msgs)
    assert any(m.startswith(f"{T0}: compacted up to {row['horizon']}") for m in msgs)
    assert TopicName.parse(T0).namespace_name == NS
