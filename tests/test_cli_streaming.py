"""Streaming offload (PIP-76) from the command line, as an operator drives it: `tiered offload --streaming`
(topics or a namespace; the tail closed now unless --respect-rollover; --as-of), `tiered status` (segments,
their bytes, the ledgers they cover, the ledgers only partly in them), `tiered read` / `tiered verify`
over a topic whose ledgers lie in the hot tier, in V1 objects and in segments, and `tiered verify
--offloaded-only` (the object-store copies alone). Bad input: one line on stderr, exit 2, nothing changed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.clihelp import (
    NS,
    Cli,
    _clean_env,  # noqa: F401  (autouse)
    assert_usage_error,
    flip,
    snapshot,
)
from tests.support.workspaces import END_ISO, END_MS
from tieredcore.cli.workload import PayloadGenerator
from tieredcore.offload.context import covered_through, segment_refs

T0, T1 = f"{NS}/topic-0000", f"{NS}/topic-0001"
MINUTE = 60_000
LEDGERS, ENTRIES, OPEN = 3, 40, 25


@pytest.fixture
def cli(tmp_path: Path, capsys) -> Cli:
    """Two topics of 3 sealed ledgers x 40 opaque entries of 100 bytes and an open ledger of 25, in a namespace
    in streaming mode: 1 KiB blocks (8 entries each), segments of at most 4 KiB, a 5-minute rollover."""
    c = Cli(tmp_path / "ws", capsys)
    assert c("init", str(c.root), workspace=False)[0] == 0
    code, _, err = c("generate", "--namespace", NS, "--topics", "2", "--ledgers", str(LEDGERS), "--entries",
                     str(ENTRIES), "--entry-size", "100", "--end-time", END_ISO, "--open-entries", str(OPEN), "--raw")
    assert code == 0, err
    code, _, err = c("policies", "set", NS, "--offload-mode", "streaming", "--max-segment-size", "4K",
                     "--streaming-block-size", "1K", "--max-segment-rollover", "5m")
    assert code == 0, err
    return c


def topic_info(cli: Cli, topic: str):
    from tieredcore.workspace import Workspace

    with Workspace(cli.config()) as ws:
        return ws.ml.get_topic(topic)[0]


def expected_payloads(cli: Cli, topic: str) -> list[bytes]:
    from tieredcore.names import TopicName

    gen = PayloadGenerator(1, TopicName.parse(topic).managed_ledger_name, 100, 100)
    return [gen.payload(i) for i in range(LEDGERS * ENTRIES + OPEN)]


def test_offload_streaming_a_topic_closes_the_tail_now(cli: Cli) -> None:
    res = cli.json("offload", "--streaming", T0, "--as-of", "2026-01-01T00:02:00Z")
    assert res["mode"] == "streaming" and res["topics"] == 1 and res["failed"] == res["held"] == 0
    results = res["results"]
    # 145 entries in 1 KiB blocks of up to 8 (one ledger per block): 19 blocks, 4 to a segment
    assert [r["covers"] for r in results] == [
        "0:0-31", "0:32-39,1:0-23", "1:24-39,2:0-15", "2:16-39,3:0-7", "3:8-24"]
    assert all(r["outcome"] == "offloaded" and r["unit"] == "segment" for r in results)
    assert res["segments"] == 5 and res["entries"] == LEDGERS * ENTRIES + OPEN
    assert res["bytes"] == sum(r["bytes"] for r in results) == 19 * 1024
    info = topic_info(cli, T0)
    assert covered_through(info.ledgerInfo[-1]) == OPEN - 1  # the open ledger, through its last entry
    stamps = {(ref.assigned_ms, ref.offloaded_ms) for li in info.ledgerInfo for ref in segment_refs(li)}
    assert stamps == {(END_MS + 2 * MINUTE,) * 2}  # --as-of is the clock of what is recorded
    assert not any(segment_refs(li) for li in topic_info(cli, T1).ledgerInfo)  # only the topic named

    again = cli.json("offload", "--streaming", T0)  # nothing new since: nothing written
    assert again["segments"] == 0 and again["results"] == []


def test_respect_rollover_holds_the_tail_until_its_time(cli: Cli) -> None:
    res = cli.json("offload", "--streaming", "--namespace", NS, "--respect-rollover", "--as-of", END_ISO)
    assert res["topics"] == 2 and res["held"] == 2 and res["failed"] == 0
    held = [r for r in res["results"] if r["outcome"] == "held"]
    assert [r["covers"] for r in held] == ["3:8-24", "7:8-24"] and all(r["uuid"] == "" for r in held)
    code, out, _ = cli("offload", "--streaming", "--namespace", NS, "--respect-rollover", "--as-of", END_ISO)
    assert code == 0
    assert out.startswith("offloaded 0 segment(s) of 2 topic(s), 0 entries") and "2 held until their rollover" in out
    # five minutes after the open ledger was created, on the logical clock, the tail goes
    res = cli.json("offload", "--streaming", "--namespace", NS, "--respect-rollover", "--as-of",
                   str(END_MS + 5 * MINUTE))
    assert [(r["outcome"], r["covers"]) for r in res["results"]] == [("offloaded", "3:8-24"), ("offloaded", "7:8-24")]


def test_status_shows_segments_and_partly_streamed_ledgers(cli: Cli) -> None:
    (row,) = cli.json("status", T0)["topics"]
    assert (row["segments"], row["segment_bytes"], row["segment_ledgers"], row["partially_streamed"]) == (0, 0, 0, [])
    cli.json("offload", "--streaming", T0, "--respect-rollover", "--as-of", END_ISO)  # the tail is held
    res = cli.json("status", T0, "--ledgers")
    (row,) = res["topics"]
    assert row["segments"] == 4 and row["segment_ledgers"] == 4 and row["segments_in_flight"] == 0
    # the sealed ledgers' 12,000 bytes and the open ledger's first 8 entries
    assert row["segment_bytes"] == LEDGERS * ENTRIES * 100 + 8 * 100
    assert row["partially_streamed"] == [{"ledger": 3, "open": True, "streamed_through": 7, "last_entry": OPEN - 1}]
    assert row["both"] == LEDGERS and row["hot_only"] == 1  # sealed and fully streamed: in both tiers
    detail = row["ledger_detail"]
    assert [d["streamed_through"] for d in detail] == [39, 39, 39, 7]
    assert [len(d["segments"]) for d in detail] == [2, 2, 2, 1] and [d["tier"] for d in detail] == ["both"] * 3 + ["hot"]
    assert all(d["offloaded_at"] == END_MS for d in detail[:3]) and detail[3]["offloaded_at"] is None
    code, out, _ = cli("status", T0)
    assert code == 0
    assert "    segments: 4 holding 12,800 bytes of 4 ledger(s)" in out
    assert "    partially streamed: 3 (open) through entry 7 of 24" in out
    cli.json("offload", "--streaming", T0, "--as-of", END_ISO)  # the tail too: the open ledger is all streamed
    code, out, _ = cli("status", T0)
    assert code == 0 and "    partially streamed: 3 (open) through its last confirmed entry 24" in out
    by_ns = cli.json("status", "--by-namespace")["namespaces"][NS]
    assert by_ns["segments"] == 5 and by_ns["segment_bytes"] == 14_500 and by_ns["both"] == LEDGERS
    code, out, _ = cli("status", "--by-namespace")
    assert code == 0 and "segments" in out.splitlines()[0]


def test_read_and_verify_across_hot_ledgers_v1_objects_and_segments(cli: Cli) -> None:
    """Ledger 0 as a V1 object (a ledger-mode offload), ledgers 1-2 and part of the open ledger in
    segments, the rest of the open ledger hot only; the other topic all hot."""
    assert cli.json("offload", T0, "--up-to", "1:0")["offloaded"] == 1  # a ledger-mode offload: ledger 0
    cli.json("offload", "--streaming", T0, "--respect-rollover", "--as-of", END_ISO)
    (row,) = cli.json("status", T0)["topics"]
    # ledgers 1-2 and the open ledger's first 16 entries in 3 segments (its last 9 entries: the held tail)
    assert row["segments"] == 3 and row["segment_ledgers"] == 3
    assert row["partially_streamed"][0]["streamed_through"] == 15 and row["both"] == LEDGERS
    want = expected_payloads(cli, T0)
    for priority in ("tiered-storage-first", "bookkeeper-first"):
        got = cli.json("read", T0, "--show", "hex", "--read-priority", priority)["entries"]
        assert [e["data"] for e in got] == [p[:64].hex() for p in want]
        assert [e["position"] for e in got][::40] == ["0:0", "1:0", "2:0", "3:0"] and len(got) == len(want)
    res = cli.json("verify")
    assert res["verified"] == 2 and res["failed"] == 0
    assert [r["entries"] for r in res["topics"]] == [len(want)] * 2

    # the object-store copies alone: ledger 0 from its V1 object, 1-2 and 3's first 16 entries from segments
    res = cli.json("verify", "--offloaded-only")
    by_topic = {r["topic"]: r for r in res["topics"]}
    r0, r1 = by_topic[f"persistent://{T0}"], by_topic[f"persistent://{T1}"]
    assert r0["ok"] and r0["entries"] == LEDGERS * ENTRIES + 16 and r0["offloaded_ledgers"] == 4
    assert r0["hot_only_entries"] == OPEN - 16
    assert r1["ok"] and r1["entries"] == 0 and r1["hot_only_entries"] == LEDGERS * ENTRIES + OPEN
    assert res["verified"] == 2 and res["failed"] == 0
    code, out, _ = cli("verify", "--offloaded-only", T0)
    assert code == 0 and "4 offloaded ledger(s), 9 hot-only entries" in out
    assert "verified the object-store copies of 1 topic(s), 0 failed: 136 entries" in out


def test_verify_offloaded_only_finds_a_damaged_segment(cli: Cli) -> None:
    res = cli.json("offload", "--streaming", T0)
    victim = res["results"][1]
    assert victim["covers"] == "0:32-39,1:0-23"
    flip(cli.root / "cold" / victim["uuid"], 2048 + 200)  # in its third block (ledger 1's entries 8-15)
    res = cli.json("verify", "--offloaded-only", T0, expect=1)
    (row,) = res["topics"]
    # the segment's chunk checksum covers both ledgers' sections: both are reported, the others read fine
    assert row["ok"] is False and [b["ledger"] for b in row["bad_ledgers"]] == [0, 1]
    assert all("CorruptObjectError" in b["reason"] for b in row["bad_ledgers"]), row
    code, out, _ = cli("verify", "--offloaded-only", T0)
    assert code == 1 and "FAILED" in out and "    ledger 1: " in out


@pytest.mark.parametrize(
    "argv,fragments",
    [
        (["offload", "--streaming", T0, "--keep-bytes", "0"], ["--streaming", "--keep-bytes"]),
        (["offload", "--streaming", T0, "--up-to", "1:0"], ["--streaming", "--up-to"]),
        (["offload", "--streaming"], ["--streaming: name the topics, or a --namespace"]),
        (["offload", "--streaming", T0, "--namespace", NS], ["not both"]),
        (["offload", "--respect-rollover", T0, "--keep-bytes", "0"], ["--respect-rollover goes with --streaming"]),
        (["offload", "--streaming", T0, "--as-of", "yesterday"], ["--as-of 'yesterday'"]),
        (["offload", "--streaming", f"{NS}/nope"], ["does not exist"]),
        (["offload", "--streaming", "--namespace", "acme/none"], ["unknown namespace", "acme/none"]),
        (["offload", "--streaming", "public/default/../x"], ["public/default/../x"]),
        (["verify", "--offloaded-only", "--read-priority", "bookkeeper-first"], ["--read-priority"]),
        (["generate", "--namespace", "x/y", "--open-entries", "-1"], ["--open-entries -1"]),
    ],
)
def test_bad_input_is_refused_and_changes_nothing(cli: Cli, argv, fragments) -> None:
    before = snapshot(cli.root)
    assert_usage_error(cli(*argv), argv[0], *fragments)
    assert snapshot(cli.root) == before
