"""bench/query.py: its arguments, and a quick smoke run end to end on tiny data (its figures mean nothing)."""

from __future__ import annotations

import importlib
import json

import pytest

bench = importlib.import_module("bench.query")


@pytest.mark.parametrize(("argv", "message"), [
    (["--rounds", "3"], "at least 5 interleaved rounds"),
    (["--rounds", "0", "--quick"], "--rounds must be at least 1"),
    (["--max-spread", "0"], "--max-spread must be above 0"),
    (["--total", "12Q"], "not a size: '12Q'"),
    (["--entry-size", "big"], "--entry-size is a byte count or a range"),
    (["--entry-size", "2048-64"], "low <= high"),
    (["--ledgers", "0"], "--ledgers must be at least 1"),
    (["--range-ledgers", "0"], "--range-ledgers is a fraction"),
    (["--warmup", "-1"], "--warmup cannot be negative"),
    (["--baseline-repeat", "0"], "--baseline-repeat must be at least 1"),
])
def test_bad_arguments_exit_2_saying_why(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        bench.parse_args(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_defaults():
    a = bench.parse_args([])
    assert (a.rounds, a.total, a.ledgers, a.entry_size, a.range_ledgers) == (5, 256 << 20, 100, (64, 2048), 0.01)
    assert bench.parse_args(["--quick"]).rounds == 2


@pytest.mark.slow
def test_quick_smoke_run(tmp_path, capsys):
    code = bench.main(["--quick", "--json", "--baseline-repeat", "2", "--total", "2M", "--ledgers", "10", "--range-ledgers", "0.1",
                       "--dir", str(tmp_path)])
    out = capsys.readouterr().out
    doc = json.loads(out[out.index("\n{") + 1:])
    assert code in (0, bench.TOO_NOISY_EXIT) and doc["exit_code"] == code
    assert (code == bench.TOO_NOISY_EXIT) == bool(doc["too_noisy"])
    case, export = doc["cases"]
    assert case["case"] == "full_scan" and case["rounds"] == 2 and case["target"] == 0.5
    # the export against pyarrow alone, the same rounds, the same payload
    assert (export["case"], export["rounds"], export["target"]) == ("export", 2, 0.7)
    assert export["payload_bytes"] == doc["payload_bytes"] and (export["median_ratio"] is None) == export["too_noisy"]
    assert "Iceberg export (in-process)" in out and "pyarrow write_table" in out
    assert case["payload_bytes"] == doc["payload_bytes"]  # per scan, the baseline's repeats averaged
    assert (case["median_ratio"] is None) == case["too_noisy"]
    assert "warm-up (not counted)" in out and "round 1 (A/B)" in out and "round 2 (B/A)" in out
    assert "full scan (every column)" in out and "spark.read.parquet" in out
    r = doc["range"]
    # one ledger of ten in the range: the plan and the GETs touch that ledger alone
    assert len(r["ledgers_in_range"]) == 1 and r["planned_parts"] == 1 and r["pruned_parts"] == 9
    assert 0 < r["rows"] < doc["messages"]
    assert 0 < r["gets"] < r["full_gets"] and 0 < r["get_bytes"] < r["full_get_bytes"]
    assert r["get_bytes_fraction"] == pytest.approx(r["get_bytes"] / r["full_get_bytes"])
    assert r["met"] is False  # 1 of 10 ledgers is 10%, above the 2% target
    assert "publish-time range (1 of 10 ledgers" in out and "GET bytes" in out
    assert list(tmp_path.iterdir()) == []  # the scratch directory is gone
