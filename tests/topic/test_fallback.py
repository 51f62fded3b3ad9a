"""Reads fall back to the other copy when one cannot be read, from the same entry, and say so; they fail
only when no copy can be read (never a short or a wrong result)."""

from __future__ import annotations

import pytest

from tests.support.workspaces import END_MS
from tieredcore.cli import main as cli
from tieredcore.errors import CorruptEntryError, CorruptObjectError, OffloadedLedgerNotFoundError
from tieredcore.formats.keys import data_key, index_key
from tieredcore.lifecycle.runner import run_work
from tieredcore.lifecycle.sweep import plan_offload
from tieredcore.meta.managed_ledgers import find_ledger
from tieredcore.offload.context import context_uuid
from tieredcore.policy import HOT_FIRST, TIERED_FIRST

T = "persistent://t/a/topic-0000"


@pytest.fixture
def ws(make_ws):  # noqa: F811
    """4 sealed ledgers of 50 entries (~1 KiB each) offloaded, hot copies still there."""
    w = make_ws(["t/a"], entries=50, entry_size="1000-1100",
                config_overrides={"read_buffer": 8192, "max_block_size": 16 * 1024})
    w.policies.set_namespace("t/a", {"offload_threshold_bytes": 0, "max_block_size": 16 * 1024,
                                          "read_buffer_size": 8192})
    rows = list(run_work(w.config, [u.as_dict() for u in plan_offload(w, None, END_MS)]))
    assert [r["outcome"] for r in rows] == ["offloaded"] * 4
    return w


def ledgers(ws):
    info, _ = ws.ml.get_topic(T)
    return list(info.ledgerInfo)


def read(ws, priority=TIERED_FIRST):
    r = ws.reader(priority)
    r.batch_entries = 7  # several batches per ledger: a failure mid-ledger continues mid-ledger
    try:
        return [(str(p), d) for p, d in r.read(T)], r
    finally:
        r.close()


def flip(ws, key: str, pos: int) -> None:
    md, data = ws.store.head(key).metadata, bytearray(ws.store.get(key))
    data[pos] ^= 0x20
    ws.store.put(key, bytes(data), md)


def test_lost_objects_read_from_the_hot_copy(ws):
    expected, _ = read(ws, HOT_FIRST)
    li = ledgers(ws)[1]
    u = context_uuid(li)
    ws.store.delete([index_key("", u, li.ledgerId), data_key("", u, li.ledgerId)])  # a store lost them
    got, r = read(ws)
    assert got == expected
    assert r.fallbacks == 1 and r.tier_reads == {"hot": 2, "offloaded": 3}
    assert "OffloadedLedgerNotFoundError" in r.fallback_notes[0] and f"ledger {li.ledgerId}" in r.fallback_notes[0]


def test_a_damaged_chunk_mid_ledger_continues_on_the_hot_copy_from_the_same_entry(ws):
    expected, _ = read(ws, HOT_FIRST)
    li = ledgers(ws)[0]
    flip(ws, data_key("", context_uuid(li), li.ledgerId), 40_000)  # well after the first batch
    got, r = read(ws)
    assert got == expected  # no entry lost, none twice, every byte as written
    assert r.fallbacks == 1 and "CorruptObjectError" in r.fallback_notes[0]


def test_a_damaged_hot_copy_reads_from_the_offloaded_copy(ws):
    expected, _ = read(ws)
    lid = ledgers(ws)[2].ledgerId
    hot_log = ws.hot._path(lid, "log")
    with open(hot_log, "r+b") as f:
        f.seek(12 + 500)
        b = f.read(1)
        f.seek(12 + 500)
        f.write(bytes([b[0] ^ 1]))
    got, r = read(ws, HOT_FIRST)
    assert got == expected and r.fallbacks == 1 and "CorruptEntryError" in r.fallback_notes[0]


def test_both_copies_damaged_fails_and_names_both(ws):
    li = ledgers(ws)[0]
    flip(ws, data_key("", context_uuid(li), li.ledgerId), 300)
    with open(ws.hot._path(li.ledgerId, "log"), "r+b") as f:
        f.seek(20)
        f.write(b"\x00\x00")
    r = ws.reader(TIERED_FIRST)
    out = []
    with pytest.raises(CorruptObjectError, match="the hot copy: CorruptEntryError"):
        for item in r.read(T):
            out.append(item)
    assert out == []  # nothing of that ledger was returned


def test_hot_copy_marked_deleted_but_not_yet_drained_rescues_a_damaged_offloaded_copy(ws):
    expected, _ = read(ws, HOT_FIRST)
    li = ledgers(ws)[0]

    def mark(info):
        find_ledger(info, li.ledgerId).offloadContext.bookkeeperDeleted = True

    ws.ml.update_topic(T, mark)
    flip(ws, data_key("", context_uuid(li), li.ledgerId), 100)
    for priority in (TIERED_FIRST, HOT_FIRST):
        got, r = read(ws, priority)
        assert got == expected and r.fallbacks == 1
    ws.hot.delete_ledger(li.ledgerId)  # drained: now only the damaged copy is left
    with pytest.raises(CorruptObjectError):
        read(ws)


def test_cli_read_succeeds_from_the_hot_copy_and_warns(ws, capsys):
    li = ledgers(ws)[0]
    u = context_uuid(li)
    ws.store.delete([index_key("", u, li.ledgerId)])
    cfg = str(ws.config.hot_url.replace("file://", "")).rsplit("/hot", 1)[0] + "/tiered.toml"
    assert cli.main(["--config", cfg, "read", T, "--limit", "3"]) == 0
    out, err = capsys.readouterr()
    assert out.count("\n") == 3 and f"ledger {li.ledgerId}" in err and "reading the hot copy" in err
    # without the hot copy the read fails with the reason, exit 1, no traceback
    ws.hot.delete_ledger(li.ledgerId)
    assert cli.main(["--config", cfg, "read", T]) == 1
    out, err = capsys.readouterr()
    assert "OffloadedLedgerNotFoundError" in err and "Traceback" not in err


def test_missing_index_without_hot_copy_is_a_clear_error(ws):
    li = ledgers(ws)[3]
    u = context_uuid(li)
    ws.store.delete([index_key("", u, li.ledgerId)])
    ws.hot.delete_ledger(li.ledgerId)
    r = ws.reader(TIERED_FIRST)
    with pytest.raises(OffloadedLedgerNotFoundError, match=f"ledger {li.ledgerId}"):
        list(r.read(T))


def test_hot_copy_with_other_entries_than_the_topic_lists_is_not_trusted(ws):
    expected, _ = read(ws)
    li = ledgers(ws)[1]

    def bump(info):
        find_ledger(info, li.ledgerId).entries += 1

    ws.ml.update_topic(T, bump)
    with pytest.raises(CorruptEntryError, match="holds 50 entries, the topic .* lists 51"):
        read(ws, HOT_FIRST)
