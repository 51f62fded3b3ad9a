"""bench/offload.py's method: the interleaving, the statistics and the too-noisy refusal, and a real smoke run.

The statistics are pure functions of the timings, so fabricated timings are fed to them; the smoke run
checks the benchmark end to end on tiny sizes (its figures mean nothing)."""

from __future__ import annotations

import importlib
import json
import re

import pytest

# imported by name (the repository root is on sys.path) so that the spawned peak-RSS child finds it too
bench = importlib.import_module("bench.offload")

MB = 1_000_000


def _pair(calls: list[str]) -> bench.Pair:
    return bench.Pair("k", "what", "cp", 1, run_baseline=lambda: calls.append("A"),
                      run_candidate=lambda: calls.append("B"), reset_baseline=lambda: calls.append("reset A"),
                      reset_candidate=lambda: calls.append("reset B"))


def test_rounds_alternate_which_side_goes_first_and_sync_before_each_side():
    calls: list[str] = []
    ticks = iter(range(100))
    pair = _pair(calls)
    times = [bench.time_pair(pair, rnd, sync=lambda: calls.append("sync"), clock=lambda: float(next(ticks)))
             for rnd in range(4)]
    side = [c for c in calls if c in ("A", "B")]
    assert side == ["A", "B", "B", "A", "A", "B", "B", "A"]
    # each side: its reset, then a sync, then the timed run, nothing in between
    assert calls[:6] == ["reset A", "sync", "A", "reset B", "sync", "B"]
    assert calls[6:12] == ["reset B", "sync", "B", "reset A", "sync", "A"]
    assert times == [(1.0, 1.0)] * 4


def test_time_pair_attributes_times_to_the_right_side_when_the_candidate_runs_first():
    clock_values = iter([0.0, 2.0, 10.0, 15.0])  # round 1: candidate 0..2, then baseline 10..15
    assert bench.time_pair(_pair([]), 1, sync=lambda: None, clock=lambda: next(clock_values)) == (5.0, 2.0)


def test_warm_up_rounds_run_but_are_not_counted_and_counted_rounds_start_baseline_first(monkeypatch, capsys):
    calls: list[str] = []
    monkeypatch.setattr(bench.os, "sync", lambda: calls.append("sync"))
    pair = _pair(calls)
    prepared: list[int] = []
    bench.run_rounds([pair], rounds=2, warmup=1, label="t", before=prepared.append)
    assert [c for c in calls if c in ("A", "B")] == ["B", "A", "A", "B", "B", "A"]
    assert prepared == [0, 1, 2] and calls.count("sync") == 6
    assert len(pair.base_s) == len(pair.cand_s) == 2
    out = capsys.readouterr().out
    assert "t warm-up (not counted) (B/A)" in out and "t round 1 (A/B)" in out and "t round 2 (B/A)" in out


def test_round_order():
    assert bench.round_order(0) == ("baseline", "candidate")
    assert bench.round_order(1) == ("candidate", "baseline")
    assert bench.round_order(4) == ("baseline", "candidate")


def test_summary_reports_the_median_of_per_round_ratios_first_then_best_of():
    # 100 MB; baseline 1 s every round (100 MB/s, no spread); the candidate 2, 1, 4, 0.5, 1.25 s
    base = [1.0] * 5
    cand = [2.0, 1.0, 4.0, 0.5, 1.25]
    s = bench.summarize(base, cand, 100 * MB, max_spread=0.25, target=0.9)
    assert s["median_ratio"] == pytest.approx(0.8)  # ratios 0.5, 1, 0.25, 2, 0.8
    assert s["ratio_of_medians"] == pytest.approx(1.0 / 1.25)
    assert s["best_of_ratio"] == pytest.approx(2.0)  # the lucky round: best baseline / best candidate
    assert s["baseline_spread"] == 0 and not s["too_noisy"]
    assert s["baseline_MBps_min"] == s["baseline_MBps_max"] == pytest.approx(100)
    assert s["met"] is False  # 0.8 < 0.9: the best-of 2.0 does not rescue it
    assert s["status"] == "measured"


def test_median_of_ratios_pairs_rounds_not_sorted_series():
    # the disk swings together for both sides: per-round ratios are steady at 0.5 even though the series vary
    base = [1.0, 1.1, 0.9, 1.05, 0.95]
    cand = [2 * b for b in base]
    s = bench.summarize(base, cand, MB, max_spread=1.0)
    assert s["median_ratio"] == pytest.approx(0.5)
    assert s["met"] is None  # no target


def test_spread_is_max_minus_min_over_median_of_the_baselines_MBps():
    base = [1.0, 0.8, 1.0, 1.25, 1.0]  # 100, 125, 100, 80, 100 MB/s
    s = bench.summarize(base, [1.0] * 5, 100 * MB, max_spread=0.5)
    assert s["baseline_MBps_min"] == pytest.approx(80)
    assert s["baseline_MBps_max"] == pytest.approx(125)
    assert s["baseline_spread"] == pytest.approx(0.45)
    assert s["candidate_spread"] == 0
    assert not s["too_noisy"] and s["median_ratio"] == pytest.approx(1.0)


def test_too_noisy_baseline_withholds_every_ratio_and_the_verdict():
    base = [1.0, 0.8, 1.0, 1.25, 1.0]  # spread 45%
    s = bench.summarize(base, [0.5] * 5, 100 * MB, max_spread=0.25, target=0.9)
    assert s["too_noisy"] and s["status"] == "too noisy, rerun"
    assert s["median_ratio"] is None and s["ratio_of_medians"] is None and s["best_of_ratio"] is None
    assert s["met"] is None
    line = bench.format_case("fs offload, 1 KiB", "cp + fsync", s)
    assert "too noisy, rerun" in line and "45.0% > 25.0%" in line and "80-125 MB/s" in line
    assert ">=0.90x" in line and re.search(r"\d\.\d\dx", line.split(">=0.90x")[1]) is None  # target, no ratio


def test_a_spread_at_the_bound_is_measured():
    base = [1 / 1.1, 1.0, 1 / 0.9]  # 110, 100, 90 MB/s: spread exactly 0.2
    s = bench.summarize(base, base, 100 * MB, max_spread=0.2 + 1e-12)
    assert not s["too_noisy"] and s["median_ratio"] == pytest.approx(1.0)


def test_measured_line_names_ratios_target_and_verdict():
    s = bench.summarize([1.0] * 5, [1.0] * 5, MB, max_spread=0.25, target=0.9)
    line = bench.format_case("fs offload, 1 KiB", "cp + fsync", s)
    assert "1.00x (1.00x)" in line and ">=0.90x" in line and line.endswith("met") and "NOT" not in line


@pytest.mark.parametrize(("base", "cand", "message"), [
    ([], [], "one baseline and one candidate time per round"),
    ([1.0, 1.0], [1.0], "one baseline and one candidate time per round"),
    ([1.0, 0.0], [1.0, 1.0], "positive"),
])
def test_summary_refuses_malformed_series(base, cand, message):
    with pytest.raises(ValueError, match=message):
        bench.summarize(base, cand, MB, max_spread=0.25)


def test_targets_are_the_issues():
    assert bench.target_for("fs_offload", 1024) == 0.9 and bench.target_for("fs_offload", 65536) == 0.9
    assert bench.target_for("read_batches", 1024) == 1.0 and bench.target_for("read_batches", 65536) is None
    assert bench.target_for("read_entries", 1024) == 0.6 and bench.target_for("proof", 1024) == 0.8
    assert bench.target_for("s3_offload", None) == 0.95 and bench.target_for("s3_catchup", None) == 1.0
    limit, met = bench.rss_verdict(100 * 1024, 64 << 20)
    assert limit == 192 << 20 and met
    assert bench.rss_verdict(193 * 1024, 64 << 20) == (192 << 20, False)


@pytest.mark.parametrize(("argv", "message"), [
    (["--rounds", "3"], "at least 5 interleaved rounds"),
    (["--rounds", "0", "--quick"], "--rounds must be at least 1"),
    (["--max-spread", "0"], "--max-spread must be above 0"),
    (["--max-spread", "wide"], "--max-spread is a fraction"),
    (["--total", "12Q"], "not a size: '12Q'"),
    (["--entry-sizes", "1024,big"], "entry sizes are comma-separated byte counts"),
    (["--entry-sizes", "0"], "entry sizes must be at least 1 byte"),
    (["--block-size", "0"], "must be above 0"),
    (["--warmup", "-1"], "--warmup cannot be negative"),
])
def test_bad_arguments_exit_2_saying_why(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        bench.parse_args(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_rounds_default_to_five_and_quick_to_two():
    assert bench.parse_args([]).rounds == 5
    assert bench.parse_args(["--quick"]).rounds == 2
    assert bench.parse_args(["--quick", "--rounds", "1"]).rounds == 1


def _run(capsys, argv: list[str]) -> tuple[int, str, dict]:
    code = bench.main(["--quick", "--json", *argv])
    out = capsys.readouterr().out
    return code, out, json.loads(out[out.index("\n{") + 1:])


def _check_cases(code: int, out: str, doc: dict, keys: list[str]) -> None:
    assert code in (0, bench.TOO_NOISY_EXIT)
    assert [c["case"] for c in doc["cases"]] == keys
    for c in doc["cases"]:
        assert c["rounds"] == 2 and c["what"] in out
        assert (c["median_ratio"] is None) == c["too_noisy"]
    assert doc["exit_code"] == code and (code == bench.TOO_NOISY_EXIT) == bool(doc["too_noisy"])
    assert "warm-up (not counted)" in out and "round 1 (A/B)" in out and "round 2 (B/A)" in out


def test_quick_smoke_run_names_every_case(tmp_path, capsys):
    code, out, doc = _run(capsys, ["--total", "4M", "--ledger-size", "2M", "--s3-total", "0", "--big-ledger", "1M",
                                   "--block-size", "1M", "--dir", str(tmp_path)])
    _check_cases(code, out, doc, [f"{k}_{es}" for es in (1024, 65536) for k in (
        "fs_offload", "read_batches", "read_entries", "proof", "offload_no_checksums", "read_unverified")])
    assert set(doc["checksum_costs"]) == {"write_1024", "read_1024", "write_65536", "read_65536"}
    big = doc["big_ledger"]
    assert big["bytes"] == 1 << 20 and big["target_bytes"] == (2 + 64) << 20 and big["met"] is True
    assert "peak RSS, fs offload of one 1 MiB ledger" in out and "= 66 MiB: met" in out
    assert list(tmp_path.iterdir()) == []  # the scratch directory is gone


def test_a_peak_rss_child_that_dies_is_an_error_not_a_hang(tmp_path):
    args = (str(tmp_path / "hot"), str(tmp_path / "cold"), 12345, 1 << 20, False)  # no ledger 12345
    with pytest.raises(RuntimeError, match="peak-RSS child process exited with code 1 without a result"):
        bench.peak_rss("fs", 1 << 20, 1 << 20, bench._big_child, args)


def test_quick_smoke_run_on_s3(tmp_path, capsys):
    code, out, doc = _run(capsys, ["--total", "1M", "--entry-sizes", "1024", "--s3-total", "2M",
                                   "--s3-ledger-size", "1M", "--s3-big-ledger", "0", "--big-ledger", "0",
                                   "--dir", str(tmp_path)])
    _check_cases(code, out, doc, [f"{k}_1024" for k in (
        "fs_offload", "read_batches", "read_entries", "proof", "offload_no_checksums", "read_unverified")]
        + ["s3_offload", "s3_catchup"])
    assert doc["s3"]["s3_ledgers"] == 2 and doc["s3"]["s3_gets_per_8MiB"] > 0
    assert "GETs per 8 MiB" in out
