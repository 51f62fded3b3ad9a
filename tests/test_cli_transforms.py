"""What the operator sees of transforms: `tiered policies set --transform ...` (validated on the policy as it
would be stored; bad values exit 2 and store nothing), shown by `policies get` / `list`; `tiered generate
--payload text`; `tiered status --cache` (the configured chunk cache, this process's counters, the last
runs' counters, stored vs logical bytes of each namespace's transformed objects)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.support.clihelp import (
    NS,
    OTHER_NS,
    T0,
    Cli,
    _clean_env,  # noqa: F401  (autouse)
    assert_usage_error,
    snapshot,
)
from tests.support.workspaces import END_ISO
from tieredcore.cold.blob import iter_objects
from tieredcore.cold.keyring import KeyRing
from tieredcore.cold.transformed import TransformedBlobStore
from tieredcore.config import CONFIG_FILE_NAME, Config
from tieredcore.lifecycle.work import LedgerRunReport, RunSummary
from tieredcore.names import TopicName
from tieredcore.offload.ownership import is_marker_key
from tieredcore.reports import summary_document
from tieredcore.workspace import Workspace

MIB = 1024 * 1024


@pytest.fixture(scope="module")
def key_pool(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("pool") / "ring"
    KeyRing.add_key(d, "k1", bits=2048)
    return d


def workspace(tmp_path: Path, capsys, key_ring: Path | None = None, **overrides) -> Cli:
    """A workspace (its configuration naming ``key_ring`` when given) with text-like topics in NS and OTHER_NS."""
    c = Cli(tmp_path / "ws", capsys)
    c.root.mkdir()
    if key_ring is not None:
        overrides["key_ring"] = str(key_ring)
    (c.root / CONFIG_FILE_NAME).write_text(Config.for_workspace(c.root, **overrides).to_toml())
    code, _, err = c("init", str(c.root), workspace=False)
    assert code == 0, err
    code, _, err = c("generate", "--namespace", NS, "--namespace", OTHER_NS, "--topics", "1", "--ledgers", "3",
                     "--entries", "60", "--entry-size", "1K-8K", "--payload", "text", "--end-time", END_ISO)
    assert code == 0, err
    return c


def test_transform_fields_are_set_and_shown(tmp_path, capsys, key_pool):
    cli = workspace(tmp_path, capsys)
    res = cli.json("policies", "set", NS, "--transform", "zstd+aes", "--transform-chunk-size", "64K",
                   "--compression-level", "7", "--key-ring", str(key_pool))
    assert res["overrides"] == {"transform": "zstd+aes", "transform_chunk_size": 65536, "compression_level": 7,
                                "key_ring": str(key_pool)}
    eff = cli.json("policies", "get", NS)["effective"]
    assert (eff["transform"], eff["transform_chunk_size"], eff["compression_level"], eff["key_ring"]) == (
        "zstd+aes", 65536, 7, str(key_pool))
    # a topic overrides the chunk size only; the rest comes from its namespace
    res = cli.json("policies", "set", T0, "--topic", "--transform-chunk-size", "1M")
    assert res["overrides"] == {"transform_chunk_size": MIB}
    assert (res["effective"]["transform"], res["effective"]["transform_chunk_size"]) == ("zstd+aes", MIB)
    rows = {r["namespace"]: r for r in cli.json("policies", "list")["namespaces"]}
    assert rows[NS]["transform"] == "zstd+aes" and rows[OTHER_NS]["transform"] == "none"
    code, out, _ = cli("policies", "list")
    assert code == 0
    lines = {ln.split()[0]: ln for ln in out.splitlines()}
    assert "transform zstd+aes" in lines[NS] and "transform none" in lines[OTHER_NS]
    # turned off again: new objects untransformed, the stored override says so
    assert cli.json("policies", "set", NS, "--transform", "none")["effective"]["transform"] == "none"


def test_encryption_with_the_configured_key_ring(tmp_path, capsys, key_pool):
    cli = workspace(tmp_path, capsys, key_ring=key_pool)
    res = cli.json("policies", "set", NS, "--transform", "aes")
    assert res["overrides"] == {"transform": "aes"} and res["effective"]["key_ring"] == ""


@pytest.mark.parametrize(
    ("argv", "fragments"),
    [
        (["--transform-chunk-size", "1K"], ["chunk size 1024 is not within 4096..67108864"]),
        (["--transform-chunk-size", "65M"], ["is not within 4096..67108864"]),
        (["--transform-chunk-size", "lots"], ["--transform-chunk-size: size 'lots'"]),
        (["--transform-chunk-size", "-1"], ["chunk size -1 is not within"]),
        (["--compression-level", "0"], ["zstd level 0 is not within 1..22"]),
        (["--compression-level", "23"], ["zstd level 23 is not within 1..22"]),
        (["--compression-level", "high"], ["--compression-level: 'high'"]),
        (["--transform", "aes"], ["transform aes encrypts and needs a key ring"]),
        (["--transform", "zstd+aes", "--key-ring", "relative/keys"], ["key ring 'relative/keys' must be an absolute"]),
        (["--transform", "aes", "--key-ring", "/nonexistent/keys"],
         ["--key-ring: namespace public/default would encrypt with key ring /nonexistent/keys", "no such directory"]),
        (["--key-ring", "EMPTY"], ["--key-ring", "no 'active' file"]),
    ],
)
def test_bad_transform_values_exit_2_and_store_nothing(tmp_path, capsys, argv, fragments):
    cli = workspace(tmp_path, capsys)  # no key ring configured
    empty = tmp_path / "empty-ring"
    empty.mkdir()
    assert cli.json("policies", "set", NS, "--transform", "zstd", "--offload-threshold-bytes", "0")
    before = snapshot(cli.root)
    argv = [str(empty) if a == "EMPTY" else a for a in argv]
    assert_usage_error(cli("policies", "set", NS, *argv), "policies", *fragments)
    assert snapshot(cli.root) == before


def test_unknown_transform_is_refused_by_the_parser(tmp_path, capsys):
    cli = workspace(tmp_path, capsys)
    before = snapshot(cli.root)
    with pytest.raises(SystemExit) as e:
        cli("policies", "set", NS, "--transform", "gzip")
    out, err = capsys.readouterr()
    assert e.value.code == 2 and out == "" and "invalid choice: 'gzip'" in err and "zstd+aes" in err
    assert snapshot(cli.root) == before


def test_a_ring_that_stops_loading_refuses_turning_encryption_on(tmp_path, capsys, key_pool):
    ring = tmp_path / "ring"
    shutil.copytree(key_pool, ring)
    cli = workspace(tmp_path, capsys, key_ring=ring)
    (ring / "active").unlink()
    before = snapshot(cli.root)
    assert_usage_error(cli("policies", "set", NS, "--transform", "aes"), "policies",
                       f"--transform aes: namespace {NS} would encrypt with key ring {ring}", "no 'active' file")
    assert snapshot(cli.root) == before
    assert cli.json("policies", "set", NS, "--transform", "zstd")["effective"]["transform"] == "zstd"


# -- status --cache ---------------------------------------------------------------------------------


def _offload_transformed(cli: Cli) -> None:
    assert cli.json("policies", "set", NS, "--transform", "zstd", "--transform-chunk-size", "16K")
    assert cli.json("policies", "set", OTHER_NS, "--transform", "zstd+aes")
    for ns in (NS, OTHER_NS):
        res = cli.json("offload", "--namespace", ns, "--keep-bytes", "0")
        assert res["offloaded"] == 3 and res["failed"] == 0


def test_status_cache_shows_stored_vs_logical_bytes(tmp_path, capsys, key_pool):
    cli = workspace(tmp_path, capsys, key_ring=key_pool)
    _offload_transformed(cli)
    res = cli.json("status", "--cache")
    c = res["cache"]
    assert c["configured"] == {"chunk_cache": "memory", "kind": "memory", "max_bytes": 256 * MIB,
                               "prefetch_bytes": 8 * MIB, "ttl_ms": 600_000}
    assert c["process"]["kind"] == "memory" and c["process"]["hits"] == 0  # status reads manifests, no chunk
    assert c["errors"] == [] and c["last_runs"] == []
    ns, other = c["namespaces"][NS], c["namespaces"][OTHER_NS]
    payload = {TopicName.parse(r["topic"]).namespace_name: r["offloaded_bytes"] for r in res["topics"]}
    for name, a in ((NS, ns), (OTHER_NS, other)):
        assert a["objects"] == 6  # data and index object of 3 ledgers
        assert a["compressed"] == 6 and a["logical_bytes"] > payload[name]  # every payload byte, framed
        assert a["stored_bytes"] < a["logical_bytes"] / 2  # text compresses (manifests included)
    assert ns["encrypted"] == 0 and other["encrypted"] == 6
    # stored: every byte of the store but its owner marker and the topic manifests (docs/recovery.md)
    with Workspace(cli.config()) as ws:
        store = ws.store.inner if isinstance(ws.store, TransformedBlobStore) else ws.store
        stored = sum(o.size for o in iter_objects(store)
                     if not is_marker_key(o.key, "") and not o.key.startswith("tiered-topic-manifests/"))
    assert stored == ns["stored_bytes"] + other["stored_bytes"]
    code, out, _ = cli("status", "--cache")
    assert code == 0
    assert "chunk cache: memory, at most 256.0 MiB, prefetch 8.0 MiB" in out
    line = next(ln for ln in out.splitlines() if ln.startswith(OTHER_NS + " "))
    assert line.split()[1] == "6" and line.split()[-2:] == ["6", "6"]
    # verify reads every entry back from the transformed objects
    res = cli.json("verify", "--offloaded-only")
    assert res["failed"] == 0 and res["verified"] == 2 and res["hot_only_entries"] == 0


def test_status_cache_of_untransformed_data_and_no_cache(tmp_path, capsys):
    cli = workspace(tmp_path, capsys, chunk_cache="none")
    assert cli.json("offload", "--namespace", NS, "--keep-bytes", "0")["offloaded"] == 3
    c = cli.json("status", "--cache")["cache"]
    assert c["configured"]["kind"] == "none" and c["process"] is None and c["namespaces"] == {}
    code, out, _ = cli("status", "--cache")
    assert code == 0 and "chunk cache: none\n" in out and "transformed objects" not in out


def test_status_cache_looks_at_a_disk_cache_without_wiping_it(tmp_path, capsys):
    cache_dir = tmp_path / "chunk-cache"
    cli = workspace(tmp_path, capsys, chunk_cache=f"disk:{cache_dir}")
    cache_dir.mkdir()
    (cache_dir / "c000000000001").write_bytes(b"x" * 1000)  # another process's entries
    (cache_dir / "c000000000002.tmp").write_bytes(b"x" * 10)  # being written: not an entry yet
    c = cli.json("status", "--cache")["cache"]
    assert c["configured"] == {"chunk_cache": f"disk:{cache_dir}", "kind": "disk", "max_bytes": 256 * MIB,
                               "prefetch_bytes": 8 * MIB, "ttl_ms": 600_000, "directory": str(cache_dir),
                               "exists": True, "bytes": 1000, "entries": 1}
    assert c["process"] is None  # not opened: opening a disk cache wipes its directory
    assert (cache_dir / "c000000000001").read_bytes() == b"x" * 1000
    code, out, _ = cli("status", "--cache")
    assert f"directory {cache_dir}: 1 entries, 0.0 MiB (plaintext)" in out


def test_reports_of_a_cli_run_and_a_dag_run_are_both_listed(tmp_path, capsys):
    """A job run outside Airflow (group = part = the job) and a DAG run's mapped part (group = DAG id) are
    both in the CLI's last runs and in the overview's runs, by the job that wrote them."""
    import argparse
    import time

    from spark_jobs._jobkit import Run, place_for, write_report
    from tieredcore.lifecycle.overview import run_infos

    cli = workspace(tmp_path, capsys)
    config = cli.config()
    dag_env = {"TIERED_DAG_ID": "tiered_offload_sweep", "TIERED_DAG_RUN_ID": "scheduled__2026-01-01T00:00:00+00:00",
               "TIERED_TASK_ID": "offload", "TIERED_MAP_INDEX": "0", "TIERED_ATTEMPT": "1"}
    for job, run_id, env, hits in (("scrub", "by-hand", {}, 5), ("offload_sweep", "ignored", dag_env, 9)):
        args = argparse.Namespace(dry_run=False, run_id=run_id, namespace=None)
        place = place_for(job, args, 0, env)
        run = Run(job, args, config, 0, place.run_id, config.reports_dir, time.monotonic(), place)
        s = RunSummary(job, place.run_id, 0, False, cache={"hits": hits, "misses": 1, "loads": 1})
        write_report(None, run, LedgerRunReport(s, []), env=env)
    c = cli.json("status", "--cache")["cache"]
    assert c["last_runs"] == [
        {"job": "offload_sweep", "run_id": "scheduled__2026-01-01T00:00:00+00:00",
         "cache": {"hits": 9, "misses": 1, "loads": 1}},
        {"job": "scrub", "run_id": "by-hand", "cache": {"hits": 5, "misses": 1, "loads": 1}}]
    runs = {(r.job, r.run_id) for r in run_infos(config.reports_dir)}
    assert runs == {("scrub", "by-hand"), ("offload_sweep", "scheduled__2026-01-01T00:00:00+00:00")}


def test_status_cache_shows_the_last_runs_counters(tmp_path, capsys):
    cli = workspace(tmp_path, capsys)
    reports = Path(cli.config().reports_dir)
    for run_id, hits in (("r1", 5), ("r2", 7)):
        s = RunSummary("scrub", run_id, 0, False, cache={"hits": hits, "misses": 3, "loads": 2})
        out = reports / "scrub" / run_id
        out.mkdir(parents=True)
        (out / "summary.json").write_text(json.dumps(summary_document(LedgerRunReport(s, []), "scrub", run_id, 1.0)))
    (reports / "offload_sweep" / "r0").mkdir(parents=True)  # a run that read nothing transformed
    (reports / "offload_sweep" / "r0" / "summary.json").write_text(json.dumps({"run_id": "r0", "cache": {}}))
    newest = reports / "scrub" / "r2" / "summary.json"
    older = reports / "scrub" / "r1" / "summary.json"
    os.utime(older, (1, 1))
    os.utime(newest, (2, 2))
    c = cli.json("status", "--cache")["cache"]
    assert c["last_runs"] == [{"job": "scrub", "run_id": "r2", "cache": {"hits": 7, "misses": 3, "loads": 2}}]
    code, out, _ = cli("status", "--cache")
    assert "last scrub run r2: 7 hits, 3 misses, 2 loads (GETs)" in out
