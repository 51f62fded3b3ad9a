"""The Iceberg export (tieredcore.lifecycle.export, `tiered export`): real pyiceberg SQL catalog (SQLite) in a
workspace built by `tiered init` / `generate` / `offload`. Every exported row equals the topic's messages,
exactly once: reruns, a kill before the commit, an overlapping run, DLQ commits."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tests.support.clihelp import (
    END_ISO,
    NS,
    T0,
    T1,
    Cli,
    _clean_env,  # noqa: F401  (autouse)
    assert_usage_error,
    generate,
)
from tieredcore.formats.messages import OutMessage, encode_message
from tieredcore.lifecycle import export as ex
from tieredcore.names import TopicName
from tieredcore.query.scan import ScanFilter, plan_scan, read_part
from tieredcore.topic.writer import TopicWriter
from tieredcore.workspace import Workspace

LATER = "2026-01-02T00:00:00Z"
KEY = ["topic", "ledger_id", "entry_id", "batch_index"]


@pytest.fixture
def cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Cli:
    c = Cli(tmp_path / "ws", capsys)
    code, _, err = c("init", str(c.root), workspace=False)
    assert code == 0, err
    return c


def offload(cli: Cli) -> None:
    code, _, err = cli("offload", "--namespace", NS, "--keep-bytes", "0")
    assert code == 0, err


def expected(cli: Cli, topic: str) -> pa.Table:
    """The topic's messages in its offloaded ledgers, read through tieredcore.query (tier dropped)."""
    with Workspace(cli.config()) as ws:
        t = TopicName.parse(topic)
        done = set(ex.eligible_ledgers(ws, t, 2**62)[0])
        parts = plan_scan(ws, [t], ScanFilter(ledger_in=frozenset(done))).parts
        batches = [b for p in parts for b in read_part(ws, p, record_stats=False)]
    return pa.Table.from_batches(batches).drop_columns(["tier"]).sort_by([(k, "ascending") for k in KEY])


def table_of(cli: Cli, topic: str, suffix: str = "") -> pa.Table:
    ident = ex.table_ident(TopicName.parse(topic), "topic")
    cat = ex.open_catalog(cli.config())
    return ex.read_table(cat, (ident[0], ident[1] + suffix)).sort_by([(k, "ascending") for k in KEY])


def export(cli: Cli, *args: str, expect: int = 0) -> dict:
    return cli.json("export", "--as-of", LATER, *args, expect=expect)


def test_rows_equal_the_topics_messages_and_a_rerun_adds_nothing(cli: Cli) -> None:
    generate(cli, NS, topics=2)
    offload(cli)
    res = export(cli)
    assert [t["table"] for t in res["tables"]] == ["public_default.topic_0000", "public_default.topic_0001"]
    assert all(t["ledgers"] == 4 and t["rows"] > 0 and t["snapshot_id"] for t in res["tables"])
    for topic in (T0, T1):
        got, want = table_of(cli, topic), expected(cli, topic)
        assert got.num_rows == want.num_rows > 0
        assert got.equals(want.cast(got.schema)), topic
    cat = ex.open_catalog(cli.config())
    tbl = cat.load_table(("public_default", "topic_0000"))
    assert tbl.properties[ex.EXPORTED_PREFIX + f"persistent://{T0}"] == "0-3"
    assert tbl.spec().fields[0].name == "publish_day"
    snap = tbl.metadata.current_snapshot_id
    again = export(cli)
    assert [t["ledgers"] for t in again["tables"]] == [0, 0] and [t["already"] for t in again["tables"]] == [4, 4]
    assert table_of(cli, T0).num_rows == expected(cli, T0).num_rows
    assert cat.load_table(("public_default", "topic_0000")).metadata.current_snapshot_id == snap


def test_logical_time_decides_which_ledgers_and_the_rest_follows_once(cli: Cli) -> None:
    generate(cli, NS)
    offload(cli)
    # sealed ledger i of 4 closes at END - (3 - i) * 10 min: two of them by END - 15 min
    first = cli.json("export", T0, "--as-of", "2025-12-31T23:45:00Z")
    assert first["tables"][0]["ledgers"] == 2
    second = export(cli, T0)
    assert second["tables"][0]["ledgers"] == 2 and second["tables"][0]["already"] == 2
    assert table_of(cli, T0).equals(expected(cli, T0).cast(table_of(cli, T0).schema))


def test_a_kill_before_the_commit_leaves_nothing_visible_and_the_rerun_adds_all_once(
        cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    generate(cli, NS)
    offload(cli)

    class Killed(BaseException):
        pass

    def kill(table: str) -> None:
        raise Killed(table)

    monkeypatch.setattr(ex, "before_commit", kill)
    with pytest.raises(Killed):
        export(cli, T0)
    monkeypatch.setattr(ex, "before_commit", lambda table: None)
    cat = ex.open_catalog(cli.config())
    tbl = cat.load_table(("public_default", "topic_0000"))
    assert tbl.metadata.current_snapshot_id is None and tbl.scan().to_arrow().num_rows == 0
    root = Path(tbl.location().removeprefix("file://"))
    orphans = sorted((root / "data").rglob("*.parquet"))
    assert orphans  # written, never committed
    with Workspace(cli.config()) as ws:
        plan = ex.plan_export(ws, cat, [TopicName.parse(T0)], 2**62)
        (res,) = ex.run_export(ws.config, cat, plan, ex.local_writer(ws.config), orphan_age_s=0)
    assert res.ledgers == 4 and res.orphans_deleted == len(orphans)
    assert not any(p.exists() for p in orphans)
    got = table_of(cli, T0)
    assert got.equals(expected(cli, T0).cast(got.schema))
    files = ex.current_files(cat, ("public_default", "topic_0000"))
    assert files and all(Path(f.removeprefix("file://")).exists() for f in files)


def test_overlapping_runs_conflict_and_add_nothing_twice(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    generate(cli, NS, topics=2)
    offload(cli)
    config = cli.config()
    raced: list[list] = []

    def race(table: str) -> None:
        if raced:
            return
        raced.append([])  # the other run commits first, in full, between our write and our commit
        with Workspace(config) as ws:
            cat = ex.open_catalog(config)
            plan = ex.plan_export(ws, cat, [TopicName.parse(T0), TopicName.parse(T1)], 2**62)
            raced[0] = ex.run_export(config, cat, plan, ex.local_writer(config))

    monkeypatch.setattr(ex, "before_commit", race)
    res = export(cli)
    first = {r.table: r for r in raced[0]}
    ours = {t["table"]: t for t in res["tables"]}
    assert ours["public_default.topic_0000"]["conflicts"] == 1
    assert ours["public_default.topic_0000"]["ledgers"] == 0 and first["public_default.topic_0000"].ledgers == 4
    for topic in (T0, T1):
        got = table_of(cli, topic)
        assert got.num_rows == expected(cli, topic).num_rows
        assert not pc.any(pc.greater(pc.value_counts(
            pc.binary_join_element_wise(pc.cast(got["ledger_id"], pa.string()), pc.cast(got["entry_id"], pa.string()),
                                        pc.cast(got["batch_index"], pa.string()), ":")).field("counts"), 1)).as_py()
    # our dropped files are gone; what is on disk is what the table references
    cat = ex.open_catalog(config)
    tbl = cat.load_table(("public_default", "topic_0000"))
    on_disk = {str(p) for p in Path(tbl.location().removeprefix("file://")).rglob("*.parquet")}
    assert on_disk == {f.removeprefix("file://") for f in ex.current_files(cat, ("public_default", "topic_0000"))}


def json_topic(cli: Cli) -> tuple[str, int, int]:
    """A topic whose payloads are JSON objects matching the schema, mixed with ones that are not: three sealed
    ledgers, of which `offload --keep-bytes 0` offloads the first two (the newest stays for its readers)."""
    good = [{"id": i, "name": f"n{i}", "price": i / 4, "ok": i % 2 == 0, "at": "2026-01-01T00:00:00Z"} for i in range(9)]
    bad = [b"not json", b"[1, 2]", json.dumps({"id": "x"}).encode(), json.dumps({"name": "no id"}).encode()]
    payloads = [json.dumps(g).encode() for g in good[:5]] + bad[:2] + [json.dumps(g).encode() for g in good[5:]] + bad[2:]
    t = TopicName.parse(f"{NS}/json")
    with Workspace(cli.config()) as ws:
        for ledger in range(3):
            w = TopicWriter(ws.ml, ws.hot, t, max_entries=100, max_bytes=1 << 30, clock_ms=lambda: 1_767_225_600_000)
            w.append_many([encode_message(OutMessage(p, key=f"k{i}"), producer="p", sequence_id=ledger * 100 + i,
                                          publish_time=1_767_225_600_000 + i) for i, p in enumerate(payloads)])
            w.close(seal=True)
    return t.full, 2 * len(good), 2 * len(bad)


def test_json_schema_types_the_value_and_sends_the_rest_to_the_dlq(cli: Cli, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    topic, n_good, n_bad = json_topic(cli)
    offload(cli)
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"type": "object", "required": ["id"], "properties": {
        "id": {"type": "integer"}, "name": {"type": "string"}, "price": {"type": "number"},
        "ok": {"type": "boolean"}, "at": {"type": "string", "format": "date-time"}}}))
    s = cli.json("export-settings", NS, "--schema", str(schema), "--snapshots-kept", "2")
    assert s["schema"]["id"] == "long" and s["required"] == ["id"]

    # killed after the DLQ's commit, before the main table's: the rerun must not add the DLQ rows again
    real = ex._commit
    calls: list = []

    def commit_then_die(tbl, files, ledgers, run_id):
        calls.append(tbl.name())
        if tbl.name()[-1] == "json":
            raise KeyboardInterrupt("killed")
        return real(tbl, files, ledgers, run_id)

    monkeypatch.setattr(ex, "_commit", commit_then_die)
    with pytest.raises(KeyboardInterrupt):
        export(cli, topic)
    monkeypatch.setattr(ex, "_commit", real)
    assert table_of(cli, topic, "_dlq").num_rows == n_bad
    res = export(cli, topic)
    (t,) = res["tables"]
    assert t["rows"] == n_good and t["dlq_rows"] == 0 and t["ledgers"] == 2
    main, dlq = table_of(cli, topic), table_of(cli, topic, "_dlq")
    assert main.num_rows == n_good and dlq.num_rows == n_bad
    values = main.column("value").to_pylist()
    assert values[0] == {"id": 0, "name": "n0", "price": 0.0, "ok": True,
                         "at": values[0]["at"]} and values[0]["at"].year == 2026
    assert sorted({e.split(":")[0] for e in dlq.column("error").to_pylist()}) == [
        "field 'id'", "not JSON", "not a JSON object", "required field 'id' missing"]
    # the DLQ keeps the payload bytes and the lineage; together they are the topic
    every = expected(cli, topic)
    assert main.num_rows + dlq.num_rows == every.num_rows
    assert dlq.column("payload").to_pylist()[0] == b"not json"
    export(cli, topic)  # nothing new: snapshots beyond 2 expired
    cat = ex.open_catalog(cli.config())
    assert len(cat.load_table(("public_default", "json_dlq")).metadata.snapshots) <= 2


def test_namespace_layout_holds_every_topic_in_one_table(cli: Cli) -> None:
    generate(cli, NS, topics=2)
    offload(cli)
    cli.json("export-settings", NS, "--layout", "namespace", "--target-file-size", "4K")
    res = export(cli)
    (t,) = res["tables"]
    assert t["table"] == "public_default.messages" and t["ledgers"] == 8 and t["files"] > 2
    cat = ex.open_catalog(cli.config())
    got = ex.read_table(cat, ("public_default", "messages"))
    assert got.num_rows == expected(cli, T0).num_rows + expected(cli, T1).num_rows
    files = ex.current_files(cat, ("public_default", "messages"))
    assert len(files) == t["files"]
    assert sum(pq.read_metadata(f.removeprefix("file://")).num_rows for f in files) == got.num_rows


def test_dry_run_plans_and_creates_nothing(cli: Cli) -> None:
    generate(cli, NS)
    offload(cli)
    res = cli.json("export", "--dry-run", "--as-of", LATER)
    assert [(t["table"], t["ledgers"]) for t in res["tables"]] == [("public_default.topic_0000", 4)]
    assert not (cli.root / "iceberg" / "warehouse" / "public_default").exists()


def test_bad_input_is_one_line_and_exit_2(cli: Cli, tmp_path: Path) -> None:
    generate(cli, NS)
    assert_usage_error(cli("export", f"{NS}/nope"), "export", "does not exist")
    assert_usage_error(cli("export", T0, "--as-of", "yesterday"), "export", "--as-of")
    assert_usage_error(cli("export", "--namespace", "acme/none"), "export", "acme/none")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert_usage_error(cli("export-settings", NS, "--schema", str(bad)), "export-settings", "not JSON")
    bad.write_text(json.dumps({"id": "uuid"}))
    assert_usage_error(cli("export-settings", NS, "--schema", str(bad)), "export-settings", "'uuid'")
    assert_usage_error(cli("export-settings", NS, "--schema", str(tmp_path / "missing.json")), "export-settings",
                       "cannot read")
    assert_usage_error(cli("export-settings", NS, "--snapshots-kept", "0"), "export-settings", "snapshots kept")
    assert END_ISO  # the generator's clock: ledgers close before LATER


def test_ranges_round_trip() -> None:
    assert ex.range_text([5, 0, 1, 2, 3, 41, 45, 40]) == "0-3,5,40-41,45"
    assert ex.parse_ranges("0-3,5,40-41,45") == {0, 1, 2, 3, 5, 40, 41, 45}
    assert ex.parse_ranges("") == set()


KILLED_RUN = """
import os, signal, sys
from tieredcore.lifecycle import export as ex
from tieredcore.cli.main import main
ex.before_commit = lambda table: os.kill(os.getpid(), signal.SIGKILL)
sys.exit(main(sys.argv[1:]))
"""


def test_a_process_killed_with_sigkill_before_its_commit_is_redone_exactly_once(cli: Cli) -> None:
    import os
    import subprocess
    import sys

    generate(cli, NS)
    offload(cli)
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo), "TIERED_NO_PROGRESS": "1"}
    p = subprocess.run([sys.executable, "-c", KILLED_RUN, "--workspace", str(cli.root), "export", T0, "--as-of", LATER],
                       env=env, capture_output=True, timeout=120)
    assert p.returncode == -9, p.stderr.decode()
    cat = ex.open_catalog(cli.config())
    tbl = cat.load_table(("public_default", "topic_0000"))
    assert tbl.metadata.current_snapshot_id is None  # files written, nothing visible
    assert any(Path(tbl.location().removeprefix("file://")).rglob("*.parquet"))
    res = export(cli, T0)
    assert res["tables"][0]["ledgers"] == 4
    got = table_of(cli, T0)
    assert got.equals(expected(cli, T0).cast(got.schema))
    assert export(cli, T0)["tables"][0]["ledgers"] == 0


def test_payloads_against_the_schema() -> None:
    schema = {"id": "long", "name": "string", "at": "timestamp", "x": "double", "ok": "boolean"}
    assert ex.parse_value(b'{"id": 1, "x": 2, "at": 5}', schema, ("id",)) == {
        "id": 1, "name": None, "at": 5000, "x": 2.0, "ok": None}
    for at in ("2026-01-01T00:00:00Z", "2026-01-01T00:00:00", "2026-01-01T01:00:00+01:00"):  # no zone: UTC
        assert ex.parse_value(b'{"id": 1, "at": "%s"}' % at.encode(), schema, ())["at"] == 1_767_225_600_000_000
    for payload, why in ((b"\xff", "not JSON"), (b'"text"', "not a JSON object"), (b'{"id": true}', "not a long"),
                         (b'{"id": 2, "name": "\\ud800"}', "not a string"), (b'{"id": 1, "at": 1e400}', "timestamp"),
                         (b'{"id": 1, "at": 99999999999999999999}', "range"), (b"{}", "required field 'id'"),
                         (b'{"id": 1, "ok": 1}', "not a boolean"),
                         (b'{"id": 1, "at": "yesterday"}', "field 'at'")):
        with pytest.raises(ValueError, match=why):
            ex.parse_value(payload, schema, ("id",))
    with pytest.raises(ex.ValidationError, match="'uuid'"):
        ex.parse_schema({"a": "uuid"})
    assert ex.parse_schema({"properties": {"a": {"type": "integer"}}, "required": ["a"]}) == ({"a": "long"}, ("a",))


def no_duplicates(t: pa.Table) -> bool:
    keys = pc.binary_join_element_wise(pc.cast(t["ledger_id"], pa.string()), pc.cast(t["entry_id"], pa.string()),
                                       pc.cast(t["batch_index"], pa.string()), ":")
    return len(pc.unique(keys)) == t.num_rows


def test_a_run_that_loses_part_of_its_file_to_an_overlapping_run_redoes_the_rest(
        cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """The other run commits the two older ledgers between our write (one file holding all four) and our
    commit: the file cannot be added in part, so it is dropped and the two newer ledgers are redone."""
    generate(cli, NS)
    offload(cli)
    config = cli.config()
    raced: list = []

    def race(table: str) -> None:
        if raced:
            return
        raced.append(None)
        with Workspace(config) as ws:
            cat = ex.open_catalog(config)
            plan = ex.plan_export(ws, cat, [TopicName.parse(T0)], ex_ms("2025-12-31T23:45:00Z"))
            raced[:] = ex.run_export(config, cat, plan, ex.local_writer(config))

    monkeypatch.setattr(ex, "before_commit", race)
    (res,) = export(cli, T0)["tables"]
    assert raced[0].ledgers == 2
    assert res["conflicts"] == 1 and res["redone"] == 2 and res["ledgers"] == 2
    got = table_of(cli, T0)
    assert no_duplicates(got) and got.equals(expected(cli, T0).cast(got.schema))
    tbl = ex.open_catalog(config).load_table(("public_default", "topic_0000"))
    assert tbl.properties[ex.EXPORTED_PREFIX + f"persistent://{T0}"] == "0-3"


def test_two_runs_in_threads_meeting_at_the_commit_add_everything_once(cli: Cli,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    generate(cli, NS, topics=2)
    offload(cli)
    config = cli.config()
    gate = threading.Barrier(2, timeout=20)
    met: set[int] = set()

    def meet(table: str) -> None:
        me = threading.get_ident()
        if me not in met:  # each run's first commit waits for the other's: both decided on the same state
            met.add(me)
            gate.wait()

    monkeypatch.setattr(ex, "before_commit", meet)
    results: dict[int, list] = {}

    def run(i: int) -> None:
        with Workspace(config) as ws:
            cat = ex.open_catalog(config)
            plan = ex.plan_export(ws, cat, [TopicName.parse(T0), TopicName.parse(T1)], 2**62)
            results[i] = ex.run_export(config, cat, plan, ex.local_writer(config))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert set(results) == {0, 1}
    for name, topic in (("public_default.topic_0000", T0), ("public_default.topic_0001", T1)):
        mine = [r for rs in results.values() for r in rs if r.table == name]
        assert sorted(r.ledgers for r in mine) == [0, 4] and sum(r.conflicts for r in mine) >= 1
        got = table_of(cli, topic)
        assert no_duplicates(got) and got.equals(expected(cli, topic).cast(got.schema))


def ex_ms(iso: str) -> int:
    from tieredcore.clock import parse_time_ms

    return parse_time_ms(iso, "as of")


@pytest.mark.parametrize("far", [False, True])
def test_files_split_rows_by_day_and_keep_rows_without_a_publish_day(tmp_path: Path, far: bool) -> None:
    """A task's files: one per day, rows of three days and rows whose publish time no timestamp holds
    (null) in one read batch, split into one file per day (nulls in their own), none dropped; rows gathered
    into one row group per file. ``far``: a day past year 9999 (the strftime path, not the date cast)."""
    schema = pa.schema([pa.field("publish_time", pa.timestamp("us", tz="UTC")), pa.field("n", pa.int64())])
    day = 86_400 * 10**6
    times = [0, 5, day + 1, 2 * day, None, 2 * day + 7, 9] + ([20_000 * 365 * day] if far else [])
    table = pa.table({"publish_time": pa.array(times, schema.field(0).type), "n": list(range(len(times)))})
    files = ex._Files(f"file://{tmp_path}", schema, "run", 0, 2**30)
    files.add(table.slice(0, 3), "t", 1)
    files.add(table.slice(3), "t", 2)
    done = files.close()
    got = {}
    for rec in done:
        f = pq.ParquetFile(rec["path"].removeprefix("file://"))
        assert f.metadata.num_row_groups == 1
        got[rec["path"].split("publish_day=")[1].split("/")[0]] = sorted(f.read().column("n").to_pylist())
    want = {"1970-01-01": [0, 1, 6], "1970-01-02": [2], "1970-01-03": [3, 5], "None": [4]}
    if far:
        want[pc.strftime(table.column("publish_time")[7:], format="%Y-%m-%d").to_pylist()[0]] = [7]
    assert got == want
    assert sum(r["rows"] for r in done) == len(times)
