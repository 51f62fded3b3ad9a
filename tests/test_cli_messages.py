"""`tiered generate` writes Pulsar messages by default (docs/formats.md "Messages inside entries"), `verify`
checks them byte for byte wherever they live, and `tiered read --messages` prints them, naming every
entry that is not a Pulsar message or fails its CRC32C."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.clihelp import (
    END_ISO,
    NS,
    T0,
    Cli,
    _clean_env,  # noqa: F401  (autouse)
    assert_usage_error,
    snapshot,
)
from tests.support.workspaces import END_MS
from tieredcore.cli.workload import MessageShape, PayloadGenerator
from tieredcore.errors import MessageChecksumError
from tieredcore.formats import compression
from tieredcore.formats.messages import OutMessage, decode_entries, decode_entry, encode_message
from tieredcore.names import TopicName
from tieredcore.topic.writer import TopicWriter
from tieredcore.workspace import Workspace

LEDGERS, ENTRIES = 3, 20


@pytest.fixture
def cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Cli:
    c = Cli(tmp_path / "ws", capsys)
    assert c("init", str(c.root), workspace=False)[0] == 0
    return c


def generate(cli: Cli, *extra: str, ns: str = NS) -> dict:
    return cli.json("generate", "--namespace", ns, "--topics", "1", "--ledgers", str(LEDGERS), "--entries",
                    str(ENTRIES), "--entry-size", "100-2000", "--end-time", END_ISO, *extra)


def entries_of(cli: Cli, topic: str) -> list:
    """Every entry's messages, read through the workspace's cross-tier reader as EntryBatches."""
    with Workspace(cli.config()) as ws:
        reader = ws.reader()
        try:
            return [decode_entries(b) for b in reader.read_batches(TopicName.parse(topic))]
        finally:
            reader.close()


def test_generated_entries_are_pulsar_messages(cli: Cli) -> None:
    res = generate(cli)
    assert res["format"] == "pulsar messages" and res["entries"] == LEDGERS * ENTRIES
    msgs = [m for batch in entries_of(cli, T0) for m in batch]
    per_entry: dict[tuple[int, int], list] = {}
    for m in msgs:
        per_entry.setdefault((m.ledger_id, m.entry_id), []).append(m)
    assert len(per_entry) == LEDGERS * ENTRIES
    # the defaults: batches of 1..10, NONE, keys from 100, two properties, no broker entry metadata
    assert all(1 <= len(v) <= 10 and [m.batch_index for m in v] == list(range(len(v))) for v in per_entry.values())
    assert all(100 <= sum(len(m.payload) for m in v) <= 2000 for v in per_entry.values())
    assert {m.metadata.compression for m in msgs} == {compression.NONE} and all(m.broker is None for m in msgs)
    assert {m.key for m in msgs} <= {f"key-{i}" for i in range(100)} and len({m.key for m in msgs}) > 10
    assert all(set(m.properties) == {"workload.entry", "workload.index"} for m in msgs)
    assert all(m.producer_name == "tiered-generate" and m.event_time <= m.publish_time for m in msgs)
    seqs = [m.sequence_id for m in msgs]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    # publish times spread over the ledgers' lifetimes, in order, none after the newest ledger closed
    times = [m.publish_time for m in msgs]
    assert times == sorted(times) and times[0] < times[-1]
    assert times[0] == END_MS - LEDGERS * 600_000 and times[-1] < END_MS
    assert cli.json("verify")["verified"] == 1


@pytest.mark.parametrize("codec", sorted(compression.CODECS))
def test_every_codec_and_shape_verifies_from_both_tiers(cli: Cli, codec: str) -> None:
    generate(cli, "--compression", codec, "--batch", "0-3", "--keys", "0", "--properties", "4",
             "--broker-entry-metadata", "--payload", "text")
    entries = entries_of(cli, T0)
    msgs = [m for batch in entries for m in batch]
    assert {m.metadata.compression for m in msgs} == {compression.codec(codec)}
    assert {m.batch_index == -1 for m in msgs} == {True, False}  # batches and messages sent without batching
    assert all(m.key is None and len(m.properties) == 4 and m.broker_index is not None for m in msgs)
    res = cli.json("offload", T0, "--keep-bytes", "0")
    assert res["offloaded"] == LEDGERS
    assert cli.json("verify", "--offloaded-only")["verified"] == 1
    assert cli.json("verify")["verified"] == 1
    # read --messages from the object store: the same messages
    got = cli.json("read", T0, "--messages")
    assert [r["position"] for r in got["messages"]] == [str(m.id) for m in msgs]
    assert got["bad_entries"] == [] and got["tier_reads"]["offloaded"] == LEDGERS


def test_mixed_codecs_are_used_in_turn(cli: Cli) -> None:
    generate(cli, "--compression", "mix")
    per_entry = [b[0].metadata.compression for batch in entries_of(cli, T0) for b in _group(batch)]
    assert per_entry[:10] == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4]
    assert cli.json("verify")["verified"] == 1


def _group(msgs: list) -> list[list]:
    out: dict[int, list] = {}
    for m in msgs:
        out.setdefault(m.entry_id, []).append(m)
    return list(out.values())


def test_the_shape_is_recorded_and_regenerates_every_entry(cli: Cli) -> None:
    generate(cli, "--compression", "ZSTD,LZ4", "--batch", "2-5", "--keys", "7", "--properties", "3")
    with Workspace(cli.config()) as ws:
        t = TopicName.parse(T0)
        info, _ = ws.ml.get_topic(t)
        props = {kv.key: kv.value for kv in info.properties}
        gen = PayloadGenerator.from_properties(props, t.managed_ledger_name)
        reader = ws.reader()
        try:
            stored = [p for b in reader.read_batches(t) for p in b.payloads()]
        finally:
            reader.close()
    assert gen.messages == MessageShape(gen.messages.publish_start_ms, 600_000 // ENTRIES, 2, 5,
                                        (compression.ZSTD, compression.LZ4), 7, 3, False)
    assert stored == list(gen.payloads(0, LEDGERS * ENTRIES))


def test_read_messages_prints_positions_times_keys_properties_and_previews(cli: Cli) -> None:
    generate(cli, "--payload", "text", "--batch", "3")
    code, out, err = cli("read", T0, "--messages", "--limit", "4")
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 4
    first = cli.ledgers(T0)[0]["ledger"]
    for n, line in enumerate(lines):
        pos, published, key, props, size, preview = line.split("\t")
        assert pos == f"{first}:{n // 3}:{n % 3}"
        assert published.startswith("2025-12-31T") and published.endswith("+00:00")
        assert key.startswith('key="key-') and props.startswith('{"workload.entry":')
        assert size.endswith(" B") and preview.startswith('"') and preview.endswith('…"')
    rows = cli.json("read", T0, "--messages", "--limit", "2")["messages"]
    assert [r["batch_index"] for r in rows] == [0, 1] and rows[0]["producer"] == "tiered-generate"
    assert rows[0]["size"] > 0 and len(rows[0]["preview"]) <= 4 * 32 + 1


def test_bad_entries_are_reported_with_their_position(cli: Cli) -> None:
    """A topic holding a good message, one whose bytes no longer match its CRC32C (damaged before the
    broker stored it), an opaque entry, and another good message."""
    generate(cli)
    good = encode_message(OutMessage(b"fine", key="k"), producer="p", sequence_id=1, publish_time=1_700_000_000_000)
    damaged = bytearray(encode_message(OutMessage(b"not fine"), producer="p", sequence_id=2,
                                       publish_time=1_700_000_000_000))
    damaged[-1] ^= 0xFF
    t = TopicName.parse(f"{NS}/damaged")
    with Workspace(cli.config()) as ws:
        w = TopicWriter(ws.ml, ws.hot, t, max_entries=10, max_bytes=1 << 30, clock_ms=lambda: 1_700_000_000_000)
        w.append_many([good, bytes(damaged), b"opaque bytes", good])
        w.close(seal=True)
    with pytest.raises(MessageChecksumError):
        decode_entry(bytes(damaged))
    code, out, err = cli("read", t.full, "--messages")
    assert code == 1 and "Traceback" not in err
    lines = out.splitlines()
    assert [line.split("\t")[0].count(":") for line in lines] == [1, 1, 1, 1]  # ledger:entry, not batched
    lid = lines[0].split(":")[0]
    assert lines[1].startswith(f"{lid}:1\tBAD ENTRY\tentry {lid}:1: CRC32C mismatch")
    assert lines[2].startswith(f"{lid}:2\tBAD ENTRY\tentry {lid}:2: not a Pulsar message")
    assert lines[3].startswith(f"{lid}:3\t") and 'key="k"' in lines[3] and '"fine"' in lines[3]
    res = cli.json("read", t.full, "--messages", expect=1)
    assert [(b["position"], b["checksum_mismatch"]) for b in res["bad_entries"]] == [(f"{lid}:1", True),
                                                                                  (f"{lid}:2", False)]
    assert len(res["messages"]) == 2 and res["entries"] == 4
    # the limit counts what is printed, bad entries included
    assert len(cli.json("read", t.full, "--messages", "--limit", "2", expect=1)["messages"]) == 1


def test_raw_keeps_opaque_entries(cli: Cli) -> None:
    res = generate(cli, "--raw")
    assert res["format"] == "raw"
    res = cli.json("read", T0, "--messages", "--limit", "3", expect=1)
    assert res["messages"] == [] and len(res["bad_entries"]) == 3
    assert all("not a Pulsar message" in b["reason"] for b in res["bad_entries"])
    assert cli.json("verify")["verified"] == 1


@pytest.mark.parametrize(("argv", "fragments"), [
    (["--raw", "--batch", "3"], ["--raw", "--batch"]),
    (["--raw", "--broker-entry-metadata"], ["--broker-entry-metadata"]),
    (["--batch", "5-2"], ["--batch", "5-2"]),
    (["--batch", "1001"], ["--batch", "1000"]),
    (["--batch", "x"], ["--batch", "'x'"]),
    (["--compression", "GZIP"], ["GZIP", "NONE"]),
    (["--keys", "-1"], ["--keys -1"]),
    (["--properties", "-2"], ["--properties -2"]),
])
def test_bad_message_options_change_nothing(cli: Cli, argv: list[str], fragments: list[str]) -> None:
    before = snapshot(cli.root)
    assert_usage_error(cli("generate", "--namespace", NS, *argv), "generate", *fragments)
    assert snapshot(cli.root) == before


def test_messages_and_show_do_not_mix(cli: Cli) -> None:
    generate(cli)
    assert_usage_error(cli("read", T0, "--messages", "--show", "hex"), "read", "--show")
