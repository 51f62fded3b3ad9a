"""`tiered compact-topic` (docs/topic-compaction.md): one topic compacted in-process, keys and bytes before →
after printed; the compacted read shows one message per key; a rerun with nothing new is one line, exit 0,
nothing written; new messages then compact incrementally; an unknown topic is exit 2, one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.clihelp import (
    Cli,
    _clean_env,  # noqa: F401  (autouse)
    assert_usage_error,
    snapshot,
)
from tests.support.workspaces import END_ISO
from tieredcore.formats.messages import OutMessage, encode_message
from tieredcore.offload.compacted_state import compaction_state
from tieredcore.topic.writer import TopicWriter
from tieredcore.workspace import Workspace

NS = "acme/keys"
TOPIC = f"persistent://{NS}/topic-0000"
KEYS = 7


@pytest.fixture
def cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Cli:
    c = Cli(tmp_path / "ws", capsys)
    assert c("init", str(c.root), workspace=False)[0] == 0
    code, _, err = c("generate", "--namespace", NS, "--topics", "1", "--ledgers", "3", "--entries", "30",
                     "--entry-size", "50-200", "--keys", str(KEYS), "--end-time", END_ISO)
    assert code == 0, err
    return c


def compacted_keys(cli: Cli) -> list[str]:
    rows = cli.json("read", TOPIC, "--compacted", "--messages")["messages"]
    return [r["key"] for r in rows]


def test_compacts_then_nothing_then_incremental(cli: Cli) -> None:
    res = cli.json("compact-topic", TOPIC)
    with Workspace(cli.config()) as ws:
        st = compaction_state(ws.ml.get_topic(TOPIC)[0])
    assert res["outcome"] == "compacted" and (res["ledger_id"], res["uuid"], res["horizon"]) == \
        (st.ledger_id, st.uuid, str(st.horizon))
    assert res["keys_before"] == KEYS and res["keys_after"] == KEYS  # every key kept a value
    assert 0 < res["bytes_after"] < res["bytes_before"] and res["messages_read"] > 90
    assert res["previous_ledger"] is None
    keys = compacted_keys(cli)
    assert sorted(keys) == sorted(f"key-{i}" for i in range(KEYS))  # one message per key
    # human output: keys and bytes before → after
    code, out, _ = cli("compact-topic", TOPIC)
    assert code == 0 and out == f"topic {TOPIC} has no messages after its compaction horizon {st.horizon}: " \
                                "nothing to compact\n"
    before = snapshot(cli.root)
    assert cli.json("compact-topic", TOPIC)["outcome"] == "nothing"
    assert snapshot(cli.root) == before  # nothing written
    # more messages: the second run reads the compacted ledger plus what followed the horizon
    with Workspace(cli.config()) as ws:
        w = TopicWriter(ws.ml, ws.hot, TOPIC)
        w.append_many([encode_message(OutMessage(payload=b"new value", key="key-1"), producer="p", sequence_id=10**6,
                                      publish_time=1),
                       encode_message(OutMessage(payload=b"", key="key-2"), producer="p", sequence_id=10**6 + 1,
                                      publish_time=2),  # a tombstone
                       encode_message(OutMessage(payload=b"v", key="brand-new"), producer="p",
                                      sequence_id=10**6 + 2, publish_time=3)])
        w.close()
    code, out, _ = cli("compact-topic", TOPIC)
    lines = out.splitlines()
    assert code == 0 and lines[0].startswith(f"compacted {TOPIC} up to ") and \
        f"(previous: ledger {st.ledger_id} up to {st.horizon})" in lines[0]
    assert lines[2].split()[0] == "keys" and "→" in lines[2] and lines[3].split()[0] == "bytes"
    assert lines[2].split()[1:] == [str(KEYS + 1), "→", str(KEYS)]  # one key more, one tombstoned
    assert sorted(compacted_keys(cli)) == sorted([f"key-{i}" for i in range(KEYS) if i != 2] + ["brand-new"])
    rows = cli.json("read", TOPIC, "--compacted", "--messages")["messages"]
    assert [r["preview"] for r in rows if r["key"] == "key-1"] == ["new value"]


def test_unknown_topic_is_bad_input(cli: Cli) -> None:
    before = snapshot(cli.root)
    assert_usage_error(cli("compact-topic", f"{NS}/nope"), "compact-topic", "nope")
    assert_usage_error(cli("compact-topic", "not a topic"), "compact-topic")
    assert snapshot(cli.root) == before
