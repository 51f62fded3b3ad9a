"""bench/recover.py: its arguments, and a smoke run at a tiny size (its figures mean nothing): the listing
fixture lists the real and the synthetic objects in key order across pages, and recovery plans and applies
every topic (the bench's own checks)."""

from __future__ import annotations

import importlib
import json

import pytest

bench = importlib.import_module("bench.recover")


@pytest.mark.parametrize("argv", [["--topics", "5"], ["--ledgers", "0"], ["--rounds", "0"], ["--apply-rounds", "-1"],
                                  ["--spark-rounds", "-1"]])
def test_bad_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as e:
        bench.parse_args(argv)
    assert e.value.code == 2
    assert "--topics >= 20" in capsys.readouterr().err


def test_smoke_run(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TIERED_NO_PROGRESS", "1")
    code = bench.main(["--topics", "40", "--ledgers", "3", "--rounds", "2", "--apply-rounds", "1", "--json",
                       "--cache", str(tmp_path)])
    assert code == 0
    out = capsys.readouterr().out
    doc = json.loads(out[out.index("{\n"):])
    # 36 synthetic topics x 3 ledgers x 2 objects, 4 real topics' objects and the manifests
    assert doc["topics"] == 40 and doc["objects"] > 36 * 3 * 2 + 36
    assert doc["dry_run_ratio"] > 0 and doc["apply_ratio"] > 0 and doc["peak_rss_mib"] > 0
    store = bench.ListingFixtureStore(None, 3, 2)
    store.real = type("Empty", (), {"list": lambda self, *a, **k: bench.ListPage([], None)})()
    first = store.list("", None, 5)
    keys = [o.key for o in first.objects]
    rest = [o.key for o in store.list("", first.next_token, 100).objects]
    assert keys + rest == sorted(keys + rest) and len(keys + rest) == 12
