"""`tiered verify` ledger by ledger: every bad ledger of every topic is reported (with its id and
reason), and a topic trimmed by retention is checked against what remains."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from tests.support.clihelp import (
    B0,
    END_ISO,
    ENTRIES,
    LEDGERS,
    NS,
    OTHER_NS,
    T0,
    T1,
    Cli,
    _clean_env,  # noqa: F401  (autouse)
    flip,
    generate,
)
from tieredcore.cli.workload import PROP_FIRST_SEQ
from tieredcore.formats.constants import BLOCK_HEADER_LENGTH, ENTRY_HEADER_SIZE
from tieredcore.names import TopicName
from tieredcore.workspace import Workspace

HOT_FRAME_HEADER = 12  # [len:int32][entryId:int64] before each payload in <id>.log (stores/hot_format.py)


@pytest.fixture
def cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Cli:
    c = Cli(tmp_path / "ws", capsys)
    assert c("init", str(c.root), workspace=False)[0] == 0
    generate(c, NS, OTHER_NS, topics=2)
    return c


def full(topic: str) -> str:
    return TopicName.parse(topic).full


def rows(res: dict) -> dict[str, dict]:
    return {r["topic"]: r for r in res["topics"]}


def test_generate_records_each_ledgers_first_sequence_number(cli: Cli) -> None:
    with Workspace(cli.config()) as ws:
        info, _ = ws.ml.get_topic(T0)
        starts = [{kv.key: kv.value for kv in li.properties}[PROP_FIRST_SEQ] for li in info.ledgerInfo]
    assert starts == [str(i * ENTRIES) for i in range(LEDGERS + 1)]  # the open ledger: where it would go on


def test_two_corrupt_ledgers_are_both_reported(cli: Cli) -> None:
    ids = [d["ledger"] for d in cli.ledgers(T0)]
    bad = [ids[0], ids[2]]
    for lid in bad:
        flip(cli.root / "hot" / f"{lid}.log", HOT_FRAME_HEADER + 3)  # inside entry 0's payload: CRC fails
    res = cli.json("verify", expect=1)
    row = rows(res)[full(T0)]
    assert row["ok"] is False
    assert [b["ledger"] for b in row["bad_ledgers"]] == bad
    for b in row["bad_ledgers"]:
        assert b["reason"].startswith("CorruptEntryError") and f"ledger {b['ledger']} entry 0" in b["reason"]
    assert row["reason"].startswith("2 bad ledger(s): ")
    # the good ledgers in between and after were read in full
    assert row["entries"] == (LEDGERS - 2) * ENTRIES
    assert res["failed"] == 1 and res["verified"] == 3

    code, out, err = cli("verify", T0)
    assert code == 1 and "Traceback" not in err
    lines = out.splitlines()
    assert lines[0].startswith(f"FAILED   {full(T0)} ") and lines[0].endswith("2 bad ledger(s)")
    assert lines[1].startswith(f"    ledger {bad[0]}: CorruptEntryError")
    assert lines[2].startswith(f"    ledger {bad[1]}: CorruptEntryError")


def test_bad_ledgers_of_several_topics_and_tiers(cli: Cli) -> None:
    """A payload changed in an offloaded copy (no CRC there: found by comparing) and a corrupt hot
    ledger in another topic."""
    assert cli.json("offload", T1, "--keep-bytes", "0")["offloaded"] == LEDGERS
    d1 = cli.ledgers(T1)[1]
    (obj,) = [p for p in (cli.root / "cold").iterdir() if p.name == f"{d1['uuid']}-ledger-{d1['ledger']}"]
    length, entry_id = struct.unpack_from(">iq", obj.read_bytes(), BLOCK_HEADER_LENGTH)
    assert entry_id == 0
    flip(obj, BLOCK_HEADER_LENGTH + ENTRY_HEADER_SIZE + length - 1)  # last byte of entry 0
    b_last = cli.ledgers(B0)[LEDGERS - 1]["ledger"]
    flip(cli.root / "hot" / f"{b_last}.log", HOT_FRAME_HEADER + 3)

    res = cli.json("verify", expect=1)
    by_topic = rows(res)
    # the offloaded copy fails its checksum: its entries are read from the intact hot copy (and are
    # right), and the damaged copy is named
    assert by_topic[full(T1)]["ok"] is True and by_topic[full(T1)]["bad_ledgers"] == []
    (note,) = by_topic[full(T1)]["damaged_copies"]
    assert f"ledger {d1['ledger']}: the offloaded copy" in note and "CorruptObjectError" in note
    # the corrupt hot ledger of B0 has no other copy: a bad ledger
    assert [b["ledger"] for b in by_topic[full(B0)]["bad_ledgers"]] == [b_last]
    assert by_topic[full(T0)]["ok"] is True and by_topic[full(T0)]["bad_ledgers"] == []
    assert res["failed"] == 1 and res["fallbacks"] == 1
    # the hot copy of T1's ledger is intact
    assert rows(cli.json("verify", T1, "--read-priority", "bookkeeper-first"))[full(T1)]["ok"] is True


def trim_two_oldest(cli: Cli, topic_ns: str = NS) -> None:
    # ledgers closed 30, 20, 10 and 0 min before END_ISO: a 15-minute retention at END trims two
    assert cli("policies", "set", topic_ns, "--retention-time-minutes", "15")[0] == 0
    res = cli.json("retention", "--namespace", topic_ns, "--as-of", END_ISO)
    assert res["ledgers"] == 2 * 2  # two per topic


def test_verify_after_a_retention_trim_checks_what_remains(cli: Cli) -> None:
    before = [d["ledger"] for d in cli.ledgers(T0)]
    trim_two_oldest(cli)
    assert [d["ledger"] for d in cli.ledgers(T0)] == before[2:]
    res = cli.json("verify")
    assert res["failed"] == 0 and res["verified"] == 4
    row = rows(res)[full(T0)]
    assert row["ok"] is True and row["reason"] == ""
    assert row["entries"] == (LEDGERS - 2) * ENTRIES and row["trimmed_entries"] == 2 * ENTRIES
    assert rows(res)[full(B0)]["trimmed_entries"] == 0  # untrimmed: the whole-topic digest was checked
    # offloaded remains verify the same way, and corruption after a trim is still found
    assert cli.json("offload", T0, "--keep-bytes", "0")["offloaded"] == LEDGERS - 2
    assert rows(cli.json("verify", T0))[full(T0)]["ok"] is True
    flip(cli.root / "hot" / f"{before[3]}.log", HOT_FRAME_HEADER + 3)
    row = rows(cli.json("verify", T0, "--read-priority", "bookkeeper-first", expect=1))[full(T0)]
    # the damaged hot copy is named, the entries came (right) from the offloaded copy
    assert row["ok"] is True and [f"ledger {before[3]}: the hot copy" in n for n in row["damaged_copies"]] == [True]


def test_topics_generated_before_per_ledger_starts_keep_the_whole_topic_check(cli: Cli) -> None:
    def strip(info) -> bool:
        for li in info.ledgerInfo:
            del li.properties[:]
        return True

    with Workspace(cli.config()) as ws:
        ws.ml.update_topic(T0, strip)
    row = rows(cli.json("verify", T0))[full(T0)]
    assert row["ok"] is True and row["entries"] == LEDGERS * ENTRIES and "trimmed_entries" not in row
    ids = [d["ledger"] for d in cli.ledgers(T0)]
    for lid in (ids[0], ids[2]):
        flip(cli.root / "hot" / f"{lid}.log", HOT_FRAME_HEADER + 3)
    row = rows(cli.json("verify", T0, expect=1))[full(T0)]
    # today's behaviour for such topics: the first unreadable ledger ends the topic
    assert row["ok"] is False and f"ledger {ids[0]} entry 0" in row["reason"] and row["entries"] == 0
