"""bench/topic_compaction.py: its arguments, and a smoke run of the memory case with its check against a
plain dict, end to end on tiny data (its figures mean nothing)."""

from __future__ import annotations

import importlib
import json

import pytest

bench = importlib.import_module("bench.topic_compaction")


@pytest.mark.parametrize(("argv", "message"), [
    (["--rounds", "3"], "at least 5 interleaved rounds"),
    (["--rounds", "0"], "--rounds 0 measures nothing without --memory"),
    (["--keys", "0"], "--keys must be at least 1"),
    (["--batch", "0"], "--batch must be at least 1"),
])
def test_bad_arguments_exit_2_saying_why(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        bench.parse_args(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_counts():
    assert [bench.count(t) for t in ("10M", "50K", "1000", "1.5k")] == [10_000_000, 50_000, 1000, 1500]


@pytest.mark.slow
def test_memory_run_with_its_check(tmp_path, capsys):
    code = bench.main(["--rounds", "0", "--memory", "--check", "--json", "--total", "400K", "--keys", "2K",
                       "--ledgers", "3", "--dir", str(tmp_path)])
    assert code == 0
    out = capsys.readouterr().out
    doc = json.loads(out[out.index("{\n"):])
    m = doc["memory"]
    assert m["messages_read"] == doc["workspace"]["messages"] and m["check"]["equal"] is True
    assert 0 < m["keys"] <= m["keys_seen"] <= 2000 and m["peak_rss_bytes"]["jvm"] > 0
