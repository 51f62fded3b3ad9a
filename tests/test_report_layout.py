"""The reports' layout and its read/write API (tieredcore.reports.RunReports): run keys from run ids,
where a job writes inside and outside Airflow, attempts, parts, run.json, the layout before DAG runs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tieredcore.errors import FormatError, NotFoundError, ValidationError
from tieredcore.reports import (
    KEY_MAX,
    NOT_PLANNED,
    PlannedPart,
    ReportPlace,
    RunReports,
    planned_parts,
    report_name,
    report_place,
    run_record,
    totals,
    verdict_message,
)

# -- run keys ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("run_id,expected", [
    ("scheduled__2026-01-01T00:00:00+00:00", "scheduled__2026-01-01T00=3A00=3A00+00=3A00"),
    ("manual run/1", "manual=20run=2F1"),
    ("../../etc/passwd", "=2E.=2F..=2Fetc=2Fpasswd"),
    ("..", "=2E=2E"),
    (".", "=2E"),
    ("a=b", "a=3Db"),
    ("20260101T000000Z", "20260101T000000Z"),
    ("é", "=C3=A9"),
])
def test_report_name(run_id: str, expected: str) -> None:
    assert report_name(run_id) == expected


def test_report_name_refuses_an_empty_run_id() -> None:
    with pytest.raises(ValidationError, match="non-empty"):
        report_name("")


def _safe(key: str) -> bool:
    return key not in ("", ".", "..") and "/" not in key and "\0" not in key and len(key.encode()) <= KEY_MAX


@given(st.text(min_size=1, max_size=300))
def test_a_run_key_is_one_safe_path_component(run_id: str) -> None:
    key = report_name(run_id)
    assert _safe(key) and report_name(run_id) == key
    assert set(key) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.+=~-")


_UNSAFE_CHARS = st.sampled_from(list(":/ _=~%é\\#?"))


@given(st.lists(st.one_of(st.sampled_from(list("ab_.+-")), _UNSAFE_CHARS), min_size=1, max_size=30),
       st.lists(st.one_of(st.sampled_from(list("ab_.+-")), _UNSAFE_CHARS), min_size=1, max_size=30))
def test_distinct_run_ids_get_distinct_keys(a: list[str], b: list[str]) -> None:
    """Ids that differ only in unsafe characters (``a:b`` / ``a_b`` / ``a/b``) never share a key."""
    x, y = "".join(a), "".join(b)
    assert (report_name(x) == report_name(y)) == (x == y)


@given(st.text(min_size=1, max_size=250), st.text(min_size=1, max_size=250))
def test_a_run_with_its_unaltered_id_never_mixes_with_another(tmp_path_factory, x: str, y: str) -> None:
    """Whatever two run ids are, their reports never end in one directory: distinct keys, or (a clash of
    shortened keys) the second refused with both ids named. The unaltered id is what the run shows."""
    reports = RunReports(tmp_path_factory.mktemp("r"))
    d = reports.claim("g", x)
    assert reports.run_id("g", report_name(x)) == x and d.name == report_name(x)
    if report_name(x) == report_name(y) and x != y:
        with pytest.raises(ValidationError, match="already holds the reports of run"):
            reports.claim("g", y)
    else:
        assert reports.claim("g", y).name == report_name(y)


def test_a_key_clash_is_refused_with_both_ids(tmp_path: Path) -> None:
    """Shortened keys can clash (forced here by a marker of another id); the writer is refused."""
    reports = RunReports(tmp_path)
    long_id = "manual__" + "x" * 300
    d = reports.claim("dag", long_id)
    (d / "run_id").write_bytes(b"manual__another")
    with pytest.raises(ValidationError, match=r"already holds the reports of run 'manual__another'"):
        reports.publish(ReportPlace("dag", long_id, "t"), 1, "{}")
    assert not (d / "t").exists()


# -- where a job writes -----------------------------------------------------------------------------

AIRFLOW_ENV = {"TIERED_DAG_ID": "tiered_offload_sweep", "TIERED_DAG_RUN_ID": "manual__2026-01-01T00:00:00+00:00",
               "TIERED_TASK_ID": "offload", "TIERED_MAP_INDEX": "3", "TIERED_ATTEMPT": "2"}


def test_report_place_inside_and_outside_airflow() -> None:
    inside = report_place(AIRFLOW_ENV, "offload_sweep", "ignored")
    assert (inside.group, inside.run_id, inside.part) == ("tiered_offload_sweep", AIRFLOW_ENV["TIERED_DAG_RUN_ID"],
                                                          "offload.3")
    assert inside.fields(2) == {"group": "tiered_offload_sweep", "run_key": "manual__2026-01-01T00=3A00=3A00+00=3A00",
                                "part": "offload.3", "dag_id": "tiered_offload_sweep",
                                "dag_run_id": "manual__2026-01-01T00:00:00+00:00", "task_id": "offload",
                                "map_index": 3, "try_number": 2}
    unmapped = report_place({**AIRFLOW_ENV, "TIERED_MAP_INDEX": "-1"}, "offload_sweep", "x")
    assert unmapped.part == "offload" and unmapped.map_index == -1
    assert report_place({**AIRFLOW_ENV, "TIERED_MAP_INDEX": ""}, "j", "x").part == "offload"
    outside = report_place({"TIERED_ATTEMPT": "1"}, "scrub", "nightly:1")
    assert (outside.group, outside.run_id, outside.part, outside.dag_id) == ("scrub", "nightly:1", "scrub", None)
    assert outside.fields(1)["dag_run_id"] is None and outside.fields(1)["try_number"] is None


@pytest.mark.parametrize("change,match", [
    ({"TIERED_MAP_INDEX": "x"}, "TIERED_MAP_INDEX='x'"),
    ({"TIERED_MAP_INDEX": "-2"}, "integer >= -1"),
    ({"TIERED_MAP_INDEX": "1.5"}, "integer"),
    ({"TIERED_DAG_RUN_ID": ""}, "TIERED_DAG_RUN_ID is not set"),
    ({"TIERED_TASK_ID": ""}, "TIERED_TASK_ID is not set"),
    ({"TIERED_TASK_ID": "a/b"}, "one path component"),
    ({"TIERED_TASK_ID": "attempt-3", "TIERED_MAP_INDEX": "-1"}, "not a report part"),
    ({"TIERED_DAG_ID": ".."}, "group"),
])
def test_a_bad_airflow_environment_is_bad_input(change: dict, match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        report_place({**AIRFLOW_ENV, **change}, "offload_sweep", "r")


# -- the layout --------------------------------------------------------------------------------------


def _publish(reports: RunReports, place: ReportPlace, attempt: int, doc: dict) -> None:
    """What a job does (spark_jobs/_jobkit.write_report): the attempt's detail, then publish."""
    detail = reports.detail_path(place.group, place.run_key, place.part, attempt)
    detail.mkdir(parents=True)
    (detail / "part-0").write_text(f"rows of attempt {attempt}")
    reports.publish(place, attempt, json.dumps({**doc, "attempt": attempt}))


def _report(job: str, **t) -> dict:
    return {"job": job, "totals": totals(**t)}


RID = "scheduled__2026-01-01T00:00:00+00:00"
KEY = report_name(RID)


def test_layout_paths_attempts_and_the_latest_copy(tmp_path: Path) -> None:
    reports = RunReports(tmp_path)
    place = ReportPlace("tiered_scrub", RID, "scrub", "tiered_scrub", "scrub", -1)
    base = tmp_path / "tiered_scrub" / KEY / "scrub"
    assert reports.summary_path("tiered_scrub", KEY, "scrub") == base / "summary.json"
    assert reports.summary_path("tiered_scrub", KEY, "scrub", 3) == base / "attempt-3" / "summary.json"
    assert reports.detail_path("tiered_scrub", KEY, "scrub", 3) == base / "attempt-3" / "detail.parquet"
    assert reports.run_json_path("tiered_scrub", KEY) == tmp_path / "tiered_scrub" / KEY / "run.json"
    assert reports.groups() == [] and reports.attempt_number(place, {}) == 1
    _publish(reports, place, 1, _report("scrub", failures=1))
    _publish(reports, place, 2, _report("scrub"))
    assert reports.attempts("tiered_scrub", KEY, "scrub") == [1, 2]
    assert reports.read_summary("tiered_scrub", KEY, "scrub")["attempt"] == 2
    assert reports.read_summary("tiered_scrub", KEY, "scrub", 1)["totals"]["failures"] == 1
    assert (reports.detail_path("tiered_scrub", KEY, "scrub") / "part-0").read_text() == "rows of attempt 2"
    assert not list(base.glob(".*")) and not list(base.parent.glob(".*"))  # no temporary copy left behind
    assert reports.attempt_number(place, {}) == 3
    assert reports.attempt_number(place, {"TIERED_ATTEMPT": "7"}) == 7
    with pytest.raises(ValidationError, match="TIERED_ATTEMPT"):
        reports.attempt_number(place, {"TIERED_ATTEMPT": "0"})
    assert reports.groups() == ["tiered_scrub"] and reports.runs("tiered_scrub") == [KEY]
    assert reports.parts("tiered_scrub", KEY) == ["scrub"] and reports.run_id("tiered_scrub", KEY) == RID


def test_runs_newest_first_and_parts_of_a_mapped_task(tmp_path: Path) -> None:
    reports = RunReports(tmp_path)
    for i, rid in enumerate(("b", "a", "c")):
        for part in ("offload.0", "offload.1"):
            _publish(reports, ReportPlace("dag", rid, part, "dag", "offload", int(part[-1])), 1, _report("j"))
            os.utime(reports.summary_path("dag", rid, part), (1000 + i, 1000 + i))
    reports.claim("dag", "empty")
    os.utime(reports.run_dir("dag", "empty"), (500, 500))
    assert reports.runs("dag") == ["c", "a", "b", "empty"]
    assert reports.parts("dag", "a") == ["offload.0", "offload.1"]
    assert reports.written("dag", "empty") is None and reports.written("dag", "c") == 1002
    reports.write_run("dag", {"dag_run_id": "b"})  # run.json counts as written
    assert reports.runs("dag")[0] == "b"


def test_what_is_not_a_report_is_refused(tmp_path: Path) -> None:
    reports = RunReports(tmp_path)
    for group, run, part in (("..", "r", "p"), ("g", "..", "p"), ("g", "a/b", "p"), ("", "r", "p"), ("g", "", "p"),
                             ("g", "r", "attempt-1"), ("g", "r", "run.json"), ("g", "r", ".hidden")):
        with pytest.raises(ValidationError):
            reports.summary_path(group, run, part)
    with pytest.raises(NotFoundError):
        reports.runs("no_such_group")
    with pytest.raises(NotFoundError):
        reports.parts("g", "never")
    with pytest.raises(NotFoundError):
        reports.read_run("g", "never")
    with pytest.raises(NotFoundError):
        reports.read_summary("g", "never", "p")
    for part, text in (("bad", "{not json"), ("list", "[1, 2]")):
        (tmp_path / "g" / "r" / part).mkdir(parents=True)
        (tmp_path / "g" / "r" / part / "summary.json").write_text(text)
        with pytest.raises(FormatError, match="unreadable report"):
            reports.read_summary("g", "r", part)
    none = RunReports("")
    assert none.groups() == []
    with pytest.raises(ValidationError, match="no reports location"):
        none.run_dir("g", "r")


def test_reports_of_the_layout_before_dag_runs_read_as_runs_with_one_part(tmp_path: Path) -> None:
    """``<job>/<run>/attempt-<n>/summary.json`` and ``<job>/<run>/summary.json`` (written before reports
    were the DAG run's): a run of group <job>, one part <job>, its run id the directory's name."""
    run = tmp_path / "offload_sweep" / "r1.t+a"
    (run / "attempt-1").mkdir(parents=True)
    doc = {"job": "offload_sweep", "run_id": "r1.t+a", "attempt": 1, "as_of_ms": 0,
           "totals": totals(ledgers=2, failures=1, data_loss=["t ledger 4"])}
    (run / "attempt-1" / "summary.json").write_text(json.dumps(doc))
    (run / "summary.json").write_text(json.dumps(doc))
    reports = RunReports(tmp_path)
    assert reports.groups() == ["offload_sweep"] and reports.runs("offload_sweep") == ["r1.t+a"]
    assert reports.parts("offload_sweep", "r1.t+a") == ["offload_sweep"]
    assert reports.attempts("offload_sweep", "r1.t+a", "offload_sweep") == [1]
    assert reports.read_summary("offload_sweep", "r1.t+a", "offload_sweep", 1) == doc
    assert reports.detail_path("offload_sweep", "r1.t+a", "offload_sweep") == run / "detail.parquet"
    rec = reports.read_run("offload_sweep", "r1.t+a")
    assert rec["synthesized"] and rec["dag_run_id"] == "r1.t+a" and rec["jobs"] == ["offload_sweep"]
    assert rec["totals"]["reports"] == [str(run / "summary.json")]
    (tmp_path / "offload_sweep" / "a=b").mkdir()  # an old name with '=' (its run id): read where it is
    (tmp_path / "offload_sweep" / "a=b" / "summary.json").write_text(json.dumps(doc))
    assert reports.read_run("offload_sweep", "a=b")["totals"]["reports"] == [
        str(tmp_path / "offload_sweep" / "a=b" / "summary.json")]
    assert rec["totals"]["data_loss"] == ["t ledger 4"] and rec["parts"][0]["outcome"] == "data loss"


# -- run.json ----------------------------------------------------------------------------------------


def test_planned_parts_from_a_plan_xcom() -> None:
    per_shard = [["--namespace", "a/x", "--namespace", "a/y", "--as-of", "t"], ["--namespace", "b/z", "--as-of", "t"]]
    assert planned_parts("offload", "offload_sweep", per_shard) == [
        PlannedPart("offload.0", "offload", 0, "offload_sweep", ("a/x", "a/y")),
        PlannedPart("offload.1", "offload", 1, "offload_sweep", ("b/z",))]
    assert planned_parts("drain", "deletion_drain", ["--as-of", "t"]) == [
        PlannedPart("drain", "drain", -1, "deletion_drain", ())]
    assert planned_parts("drain", "deletion_drain", []) == []
    assert planned_parts("drain", "deletion_drain", None) is None


def test_run_record_over_mapped_parts_with_one_missing(tmp_path: Path) -> None:
    reports = RunReports(tmp_path)
    args = [["--namespace", f"t/n{i}", "--as-of", "t"] for i in range(3)]
    planned = {"offload_sweep": planned_parts("offload", "offload_sweep", args)}
    for i in (0, 2):
        ns = {f"t/n{i}": {"ledgers": 2, "bytes": 10, "failures": 0, "outcomes": {"offloaded": 2}}}
        _publish(reports, ReportPlace("tiered_offload_sweep", RID, f"offload.{i}", "tiered_offload_sweep", "offload", i),
                 1, {**_report("offload_sweep", topics=1, ledgers=2, bytes=10, outcomes={"offloaded": 2},
                               namespaces=ns), "planned_namespaces": [f"t/n{i}"], "task_id": "offload", "map_index": i})
    rec = run_record(reports, "tiered_offload_sweep", RID, planned, dag_id="tiered_offload_sweep", as_of="t",
                     nothing_due=["t/idle", {"namespace": "t/off", "reason": "offload disabled"}])
    assert rec["missing_parts"] == ["offload.1"]
    t = rec["totals"]
    assert (t["jobs"], t["ledgers"], t["bytes"], t["failed_jobs"]) == (3, 4, 20, ["offload.1"])
    assert set(t["namespaces"]) == {"t/n0", "t/n2"}
    assert [(p["part"], p["outcome"], p["failed"], p["namespaces"]) for p in rec["parts"]] == [
        ("offload.0", "ok", False, ["t/n0"]), ("offload.1", "missing", True, ["t/n1"]),
        ("offload.2", "ok", False, ["t/n2"])]
    assert rec["nothing_due"] == [{"namespace": "t/idle", "reason": "nothing due"},
                                  {"namespace": "t/off", "reason": "offload disabled"}]
    assert rec["dag_run_id"] == RID and rec["run_key"] == KEY
    assert "offload.1" in verdict_message(t)
    reports.write_run("tiered_offload_sweep", rec)
    assert reports.read_run("tiered_offload_sweep", KEY) == json.loads(json.dumps(rec))


def test_run_record_of_a_run_where_nothing_was_due_and_one_whose_plan_failed(tmp_path: Path) -> None:
    reports = RunReports(tmp_path)
    rec = run_record(reports, "tiered_retention", RID, {"retention_sweep": [], "deletion_drain": []},
                     dag_id="tiered_retention", nothing_due=[{"namespace": "a/b", "reason": "no ledger past retention"}])
    assert rec["parts"] == [] and rec["missing_parts"] == [] and rec["jobs"] == ["retention_sweep", "deletion_drain"]
    assert rec["totals"]["failures"] == 0 and not rec["totals"]["failed_jobs"] and verdict_message(rec["totals"]) is None
    assert rec["nothing_due"] == [{"namespace": "a/b", "reason": "no ledger past retention"}]
    path = reports.write_run("tiered_retention", rec)
    assert path == tmp_path / "tiered_retention" / KEY / "run.json"
    assert reports.runs("tiered_retention") == [KEY] and reports.parts("tiered_retention", KEY) == []
    failed = run_record(reports, "tiered_scrub", "r2", {"scrub": None}, dag_id="tiered_scrub")
    assert failed["totals"]["failed_jobs"] == [NOT_PLANNED] and verdict_message(failed["totals"])


def test_one_record_for_jobs_run_one_after_the_other_keeps_data_loss(tmp_path: Path) -> None:
    """Retention then drain: one run.json, each job's totals under by_job, the drain's data loss in the
    combined totals, and the verdict says DATA LOSS."""
    reports = RunReports(tmp_path)
    planned = {"retention_sweep": planned_parts("retention", "retention_sweep", ["--as-of", "t"]),
               "deletion_drain": planned_parts("drain", "deletion_drain", ["--as-of", "t"])}
    _publish(reports, ReportPlace("tiered_retention", RID, "retention", "tiered_retention", "retention", -1), 1,
             _report("retention_sweep", ledgers=2, outcomes={"marked": 2}))
    _publish(reports, ReportPlace("tiered_retention", RID, "drain", "tiered_retention", "drain", -1), 1,
             _report("deletion_drain", ledgers=1, failures=1, outcomes={"failed": 1},
                     data_loss=["persistent://a/b/t ledger 7"]))
    rec = run_record(reports, "tiered_retention", RID, planned, dag_id="tiered_retention")
    t = rec["totals"]
    assert t["job"] == "retention_sweep+deletion_drain" and t["data_loss"] == ["persistent://a/b/t ledger 7"]
    assert set(t["by_job"]) == {"retention_sweep", "deletion_drain"} and t["by_job"]["retention_sweep"]["ledgers"] == 2
    assert [p["outcome"] for p in rec["parts"]] == ["ok", "data loss"]
    assert verdict_message(t).startswith("DATA LOSS in 1 ledger(s) (named in the summary's log);")


def test_parts_the_plan_did_not_name_are_read_too(tmp_path: Path) -> None:
    """The summary reads every part of its run (a plan per namespace or per shard alike)."""
    reports = RunReports(tmp_path)
    _publish(reports, ReportPlace("d", RID, "extra", "d", "extra", -1), 1, _report("scrub", ledgers=5))
    rec = run_record(reports, "d", RID, {"scrub": []}, dag_id="d")
    assert rec["totals"]["ledgers"] == 5 and [p["part"] for p in rec["parts"]] == ["extra"]


def test_totals_over_parts_and_namespaces_count_a_part_without_a_report_as_failed(tmp_path: Path) -> None:
    from tieredcore.run_totals import summary_lines

    reports = RunReports(tmp_path)
    ns_x = {"ledgers": 2, "bytes": 20, "failures": 1, "outcomes": {"offloaded": 1, "failed": 1}}
    ns_s = {"ledgers": 0, "bytes": 5, "failures": 0, "outcomes": {"offloaded": 2}, "segments": 2,
            "segment_bytes": 5, "segments_held": 1}
    docs = [_report("offload_sweep", topics=1, ledgers=2, bytes=20, failures=1, outcomes={"offloaded": 1, "failed": 1},
                    namespaces={"a/x": ns_x}, data_loss=["t ledger 9"]),
            _report("offload_sweep", topics=2, bytes=5, outcomes={"offloaded": 2}, namespaces={"a/s": ns_s},
                    segments=2, segment_bytes=5, segments_held=1),
            _report("offload_sweep", topics=1, ledgers=1, bytes=7, outcomes={"offloaded": 1},
                    namespaces={"a/x": {"ledgers": 1, "bytes": 7, "failures": 0, "outcomes": {"offloaded": 1}}})]
    for i, doc in enumerate(docs):
        _publish(reports, ReportPlace("d", RID, f"offload.{i}", "d", "offload", i), 1, doc)
    (tmp_path / "d" / KEY / "offload.4").mkdir()
    (tmp_path / "d" / KEY / "offload.4" / "summary.json").write_text(json.dumps({"entries": 3}))  # no totals
    planned = planned_parts("offload", "offload_sweep", [["--as-of", "t"]] * 5)  # offload.3 wrote nothing
    rec = run_record(reports, "d", RID, {"offload_sweep": planned})
    d = rec["totals"]
    assert (d["jobs"], d["topics"], d["ledgers"], d["bytes"], d["failures"]) == (5, 4, 3, 32, 1)
    assert d["failed_jobs"] == rec["missing_parts"] == ["offload.3", "offload.4"] and d["data_loss"] == ["t ledger 9"]
    assert d["outcomes"] == {"offloaded": 4, "failed": 1}
    assert (d["segments"], d["segment_bytes"], d["segments_held"]) == (2, 5, 1)
    assert d["reports"] == [str(reports.summary_path("d", KEY, f"offload.{i}")) for i in range(3)]
    assert json.loads(json.dumps(d)) == d  # an XCom value
    assert d["namespaces"]["a/x"] == {"ledgers": 3, "bytes": 27, "failures": 1, "outcomes": {"offloaded": 2, "failed": 1}}
    # a streaming namespace keeps its segment counts, a ledger-mode one its shape
    assert d["namespaces"]["a/s"] == ns_s
    assert "counters" not in d  # no report had counters
    lines = summary_lines(d)
    assert lines[0].startswith("offload_sweep summary: 5 job(s), 4 topic(s), 3 ledger(s)/record(s), 32 bytes, "
                               "1 failure(s), failed jobs: ['offload.3', 'offload.4']")
    assert lines[0].endswith("; 2 segment(s) (5 bytes), 1 tail(s) held for their rollover")
    assert [line.split(":")[0] for line in lines[1:]] == ["  a/s", "  a/x", "DATA LOSS"]


def test_combined_totals_of_several_jobs_name_each_jobs_outcomes(tmp_path: Path) -> None:
    from tieredcore.reports import RunTotals, combine_totals
    from tieredcore.run_totals import summary_lines

    reports = RunReports(tmp_path)
    _publish(reports, ReportPlace("d", RID, "retention", "d", "retention", -1), 1, _report(
        "retention_sweep", topics=1, ledgers=2, bytes=20, outcomes={"marked": 2},
        namespaces={"a/b": {"ledgers": 2, "bytes": 20, "failures": 0, "outcomes": {"marked": 2}}}))
    _publish(reports, ReportPlace("d", RID, "drain.0", "d", "drain", 0), 1, _report(
        "deletion_drain", ledgers=3, failures=1, outcomes={"deleted": 2, "dead_lettered": 1},
        counters={"deleted_hot": 2}, namespaces={"c/d": {"ledgers": 3, "bytes": 0, "failures": 1,
                                                         "outcomes": {"dead_lettered": 1}, "counters": {"x": 1}}}))
    rec = run_record(reports, "d", RID, {
        "retention_sweep": planned_parts("retention", "retention_sweep", ["--as-of", "t"]),
        "deletion_drain": planned_parts("drain", "deletion_drain", [["--as-of", "t"]] * 2)})
    both = rec["totals"]
    assert json.loads(json.dumps(both)) == both
    assert both["job"] == "retention_sweep+deletion_drain" and both["jobs"] == 3
    assert (both["ledgers"], both["bytes"], both["failures"]) == (5, 20, 1)
    assert both["failed_jobs"] == ["deletion_drain/drain.1"]
    assert both["outcomes"] == {"retention_sweep.marked": 2, "deletion_drain.deleted": 2,
                                "deletion_drain.dead_lettered": 1}
    assert both["by_job"]["deletion_drain"]["counters"] == {"deleted_hot": 2}
    assert both["by_job"]["deletion_drain"]["namespaces"]["c/d"]["counters"] == {"x": 1}
    assert both["namespaces"] == {} and len(both["reports"]) == 2 and both["data_loss"] == []
    assert [line.split(" ")[0] for line in summary_lines(both) if "summary:" in line] == [
        "retention_sweep", "deletion_drain"]
    sweep = RunTotals.from_dict(both["by_job"]["retention_sweep"])
    assert combine_totals([sweep]) is sweep  # one job: its own totals
    # a job never planned (its plan failed) is a failed job of the run
    missing = combine_totals([sweep, RunTotals.not_run("deletion_drain")]).as_dict()
    assert missing["failed_jobs"] == [f"deletion_drain/{NOT_PLANNED}"] and missing["jobs"] == 1


def test_a_run_by_hand_beside_an_old_layout_run_of_the_same_id_gets_its_own_part(tmp_path: Path) -> None:
    """A job run by hand again with the id of a report of the layout before (same key): its report goes
    to its part directory, and from then on the run reads as the new layout's."""
    old = tmp_path / "scrub" / "20260101T000000Z"
    (old / "attempt-1").mkdir(parents=True)
    (old / "attempt-1" / "summary.json").write_text(json.dumps(_report("scrub")))
    (old / "summary.json").write_text(json.dumps(_report("scrub")))
    reports = RunReports(tmp_path)
    place = ReportPlace("scrub", "20260101T000000Z", "scrub")
    reports.check_writable(place)
    assert reports.attempt_number(place, {}) == 1
    _publish(reports, place, 1, _report("scrub", ledgers=4))
    assert reports.parts("scrub", "20260101T000000Z") == ["scrub"]
    assert reports.read_summary("scrub", "20260101T000000Z", "scrub")["totals"]["ledgers"] == 4


@pytest.mark.parametrize("run_id", [".0", ".hidden", "..x", ".", ".."])
def test_a_run_id_starting_with_a_dot_gets_a_key_that_is_not_hidden(tmp_path: Path, run_id: str) -> None:
    """Found by hypothesis: '.0' made a hidden key the layout refused. The leading dot is escaped."""
    reports = RunReports(tmp_path)
    d = reports.claim("g", run_id)
    assert not d.name.startswith(".") and reports.run_id("g", d.name) == run_id
