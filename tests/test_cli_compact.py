"""`tiered compact` as an operator drives it (docs/compaction.md): a dry run on any topic prints the plan
and its cost and changes nothing; a real run on topics whose policy enables compaction repacks their
small V1 objects into segments, every entry reading back byte for byte, the old objects due for deletion
after the delete delay; a second run has nothing to do. Compaction off, bad sizes, prices or times: exit
2, one line on stderr, nothing changed. The policy fields through `tiered policies`."""

from __future__ import annotations

import uuid
from pathlib import Path

import boto3
import pytest

from tests.support.clihelp import (
    Cli,
    _clean_env,  # noqa: F401  (autouse)
    assert_usage_error,
    snapshot,
)
from tests.support.workspaces import END_MS, build_workspace
from tieredcore.cli.main import main
from tieredcore.cli.workload import PayloadGenerator
from tieredcore.config import ENV_CONFIG, ENV_OVERRIDES
from tieredcore.meta.reasons import Reason
from tieredcore.names import TopicName
from tieredcore.offload.copies import copy_uuids
from tieredcore.policy import TIERED_FIRST
from tieredcore.workspace import Workspace

NS, OFF = "iot/sensors", "acme/payments"  # compaction is enabled in NS by the tests that compact
T0, T1, B0 = f"{NS}/topic-0000", f"{NS}/topic-0001", f"{OFF}/topic-0000"
LEDGERS, ENTRIES, MIN_SIZE, MAX_SIZE = 12, 20, 16, 300  # ledgers of ~3 KiB: every object is small
AS_OF, AS_OF_MS = "2026-01-01T01:00:00Z", END_MS + 3_600_000
HOUR = 3_600_000


def build(root: Path, store_url: str | None = None) -> None:
    """Two namespaces of two topics, 12 sealed ledgers of 20 entries each, all offloaded (V1, one object
    pair per ledger)."""
    build_workspace(root, [NS, OFF], topics=2, ledgers=LEDGERS, entries=ENTRIES,
                    entry_size=f"{MIN_SIZE}-{MAX_SIZE}", store_url=store_url)


@pytest.fixture
def cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Cli:
    c = Cli(tmp_path / "ws", capsys)
    build(c.root)
    res = c.json("offload", "--keep-bytes", "0")
    assert res["failed"] == 0 and res["offloaded"] == 4 * LEDGERS
    return c


@pytest.fixture(scope="module")
def shared_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One workspace as `cli` builds it, compaction enabled in NS, for the tests that must change nothing
    (each checks it did not)."""
    root = tmp_path_factory.mktemp("shared") / "ws"
    with pytest.MonkeyPatch.context() as mp:
        for var in (*ENV_OVERRIDES, ENV_CONFIG):
            mp.delenv(var, raising=False)
        mp.setenv("TIERED_NO_PROGRESS", "1")
        build(root)
        assert main(["--workspace", str(root), "--json", "offload", "--keep-bytes", "0"]) == 0
        assert main(["--workspace", str(root), "policies", "set", NS, "--compaction", "on"]) == 0
    return root


@pytest.fixture
def enabled(shared_root: Path, capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli(shared_root, capsys)


def enable(cli: Cli, target: str = NS, *extra: str) -> None:
    code, _, err = cli("policies", "set", target, *extra, "--compaction", "on")
    assert code == 0, err


def read_all(cli: Cli, topic: str) -> tuple[list[tuple[str, bytes]], int]:
    """Every entry of the topic through the cross-tier reader (the object store first), and the number
    of ledgers it read from the object store."""
    with Workspace(cli.config()) as ws:
        reader = ws.reader(TIERED_FIRST)
        try:
            entries = [(str(pos), data) for pos, data in reader.read(topic)]
        finally:
            reader.close()
        return entries, reader.tier_reads["offloaded"]


def generated(topic: str) -> list[bytes]:
    gen = PayloadGenerator(1, TopicName.parse(topic).managed_ledger_name, MIN_SIZE, MAX_SIZE)
    return list(gen.payloads(0, LEDGERS * ENTRIES))


def copies(cli: Cli, topic: str) -> dict[int, list[str]]:
    """ledger -> the uuids of the object-store copy a read opens."""
    with Workspace(cli.config()) as ws:
        info, _ = ws.ml.get_topic(topic)
        return {li.ledgerId: copy_uuids(li) for li in info.ledgerInfo if copy_uuids(li)}


def pending(cli: Cli) -> list:
    with Workspace(cli.config()) as ws:
        return [e.record for e in ws.deletion_log.pending()]


def store_files(cli: Cli) -> set[str]:
    """The objects of the workspace's filesystem store (not its owner marker nor its internal area)."""
    return {p.name for p in (cli.root / "cold").iterdir() if p.is_file() and not p.name.startswith("tiered-owner.")}


def state(cli: Cli) -> tuple:
    """What a compaction changes: the topic records, the store's objects, the deletion log."""
    with Workspace(cli.config()) as ws:
        topics = {t.full: bytes(ws.ml.get_topic(t)[0].SerializeToString())
                  for ns in (NS, OFF) for t in ws.ml.list_topics(ns)}
        log = sorted(e.raw for e in ws.deletion_log.pending())
    return topics, store_files(cli), log


# -- dry run ----------------------------------------------------------------------------------------


def test_dry_run_prints_the_plan_and_cost_and_changes_nothing(cli: Cli) -> None:
    before = snapshot(cli.root)
    code, out, err = cli("compact", "--dry-run", "--namespace", NS)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("compaction dry run (nothing changed) as of ") and "2 topic(s) in 1 namespace(s)" in lines[0]
    ns_line = next(line for line in lines if line.startswith(f"{NS}: "))
    # compaction is off in its policy: a dry run shows what enabling it would do
    assert "2 topic(s), 2 batch(es) planned, objects 48 → 4" in ns_line and "(estimated)" in ns_line
    assert "compaction off in its policy" in ns_line
    for t in (T0, T1):
        assert f"  persistent://{t}: 1 batch(es) of {LEDGERS} ledger(s): objects 24 → 2" in out
    assert "monthly cost change " in out and "one-time cost +$" in out and "$0.023/GB-month" in out
    assert snapshot(cli.root) == before

    res = cli.json("compact", "--dry-run")  # no selection: every namespace, whatever its policy
    assert sorted(res["namespaces"]) == [OFF, NS] and res["compaction_off"] == [OFF, NS]
    assert (res["objects_before"], res["objects_after"]) == (8 * LEDGERS, 8)
    assert {r["outcome"] for r in res["rows"]} == {"would_compact"} and all(r["estimated"] for r in res["rows"])
    assert res["rows"][0]["segments"] == [] and res["cost"]["one_time"] > 0
    assert snapshot(cli.root) == before


def test_threshold_overrides_change_the_plan(enabled: Cli) -> None:
    # segments of at most 16 KiB: several batches a topic, none above the target
    res = enabled.json("compact", "--dry-run", T0, "--min-object-size", "8K", "--target-size", "16K")
    rows = res["rows"]
    assert len(rows) > 1 and all(r["bytes_after"] <= 16 * 1024 for r in rows)
    assert [lid for r in rows for lid in r["ledgers"]] == sorted(copies(enabled, T0))  # in order, each once
    assert res["thresholds"] == {"min_object_size": 8 * 1024, "target_size": 16 * 1024, "delete_delay_ms": None}
    # objects of ~3 KiB are not small below 1 KiB: nothing to do
    res = enabled.json("compact", "--dry-run", T0, "--min-object-size", "1K")
    assert res["rows"] == [] and res["topics"] == {f"persistent://{T0}": {
        "batches": 0, "ledgers": 0, "objects_before": 0, "objects_after": 0, "bytes_before": 0, "bytes_after": 0,
        "outcomes": {}}}
    code, out, _ = enabled("compact", "--dry-run", T0, "--min-object-size", "1K")
    assert code == 0 and f"  persistent://{T0}: nothing to compact" in out


# -- a real run -------------------------------------------------------------------------------------


def test_compaction_repacks_small_objects_and_every_entry_reads_the_same(cli: Cli) -> None:
    enable(cli)
    old = {t: copies(cli, t) for t in (T0, T1)}
    read_before = {t: read_all(cli, t) for t in (T0, T1)}
    for t in (T0, T1):
        assert [d for _, d in read_before[t][0]] == generated(t) and read_before[t][1] == LEDGERS
    (row,) = cli.json("status", T0)["topics"]
    assert row["objects"] == 2 * LEDGERS
    other_before = state(cli)[0][f"persistent://{B0}"]

    res = cli.json("compact", "--namespace", NS, "--as-of", AS_OF)
    assert res["dry_run"] is False and res["failed"] == [] and res["notes"] == []
    assert [(r["topic"], r["outcome"], r["ledgers"], r["objects_before"], r["objects_after"], len(r["segments"]))
            for r in res["rows"]] == [
        (TopicName.parse(t).managed_ledger_name, "compacted", sorted(old[t]), 2 * LEDGERS, 2, 1) for t in (T0, T1)]
    assert (res["objects_before"], res["objects_after"]) == (4 * LEDGERS, 4)

    for t, r in zip((T0, T1), res["rows"], strict=True):
        # every ledger is read from the new segment now, and reads exactly what it read before
        assert copies(cli, t) == {lid: r["segments"] for lid in old[t]}
        assert read_all(cli, t) == read_before[t]
        (row,) = cli.json("status", t)["topics"]
        assert row["objects"] == 2 and row["segments"] == 1
    assert cli.json("verify", "--offloaded-only", "--namespace", NS)["failed"] == 0
    assert state(cli)[0][f"persistent://{B0}"] == other_before  # compaction off there: untouched

    # the old objects: in the deletion log, due an hour (the default delete delay) after the switch
    records = pending(cli)
    assert {r.uuid for r in records} == {u for t in (T0, T1) for us in old[t].values() for u in us}
    assert {(r.reason, r.next_attempt_ms) for r in records} == {(Reason.COMPACTION, AS_OF_MS + HOUR)}

    # a second run finds nothing to do and changes nothing
    after = state(cli)
    code, out, err = cli("compact", "--namespace", NS, "--as-of", AS_OF)
    assert code == 0, err
    assert f"  persistent://{T0}: nothing to compact" in out and f"{NS}: 2 topic(s), 0 batch(es) compacted" in out
    assert state(cli) == after

    # readers that opened an old object had the delay to finish: the drain keeps them until it ends
    drained = cli.json("deletions", "drain", "--as-of", str(AS_OF_MS + HOUR - 1))
    assert drained["entries"] == 0 and store_files(cli) == after[1]
    drained = cli.json("deletions", "drain", "--as-of", str(AS_OF_MS + HOUR))
    assert drained["entries"] == drained["deleted"] == 2 * LEDGERS  # a record per object pair
    assert store_files(cli) == {f"{u}{s}" for r in res["rows"] for u in r["segments"] for s in ("", "-index")} \
        | {n for n in after[1] if "-ledger-" in n and not any(u in n for t in (T0, T1) for us in old[t].values()
                                                               for u in us)}
    assert all(read_all(cli, t) == read_before[t] for t in (T0, T1))
    assert cli.json("verify", "--namespace", NS)["failed"] == 0


def test_human_output_of_a_run_and_the_delete_delay_override(cli: Cli) -> None:
    enable(cli)
    code, out, err = cli("compact", T0, f"persistent://{T0}", "--delete-delay", "10m", "--as-of", AS_OF)
    assert code == 0, err
    assert out.splitlines()[0].startswith("compaction as of 2026-01-01T01:00:00+00:00: 1 topic(s) in 1 namespace(s)")
    assert f"{NS}: 1 topic(s), 1 batch(es) compacted, objects 24 → 2" in out and "(estimated)" not in out
    assert f"  persistent://{T0}: 1 batch(es) of {LEDGERS} ledger(s): objects 24 → 2" in out
    assert {r.next_attempt_ms for r in pending(cli)} == {AS_OF_MS + 10 * 60_000}
    assert len(copies(cli, T1)) == LEDGERS and all(len(u) == 1 for u in copies(cli, T1).values())  # not named


def test_a_topic_policy_enables_one_topic_and_the_other_is_noted(cli: Cli) -> None:
    enable(cli, T0, "--topic")
    t1_before = copies(cli, T1)
    res = cli.json("compact", T0, T1, "--as-of", AS_OF)
    assert [r["outcome"] for r in res["rows"]] == ["compacted"]
    assert res["notes"] == [f"persistent://{T1}: compaction is off in its policy (skipped)"]
    assert copies(cli, T1) == t1_before
    # no selection: namespaces with compaction on in a policy (here through a topic's)
    res = cli.json("compact", "--as-of", AS_OF)
    assert res["rows"] == [] and list(res["topics"]) == [f"persistent://{T0}"]


def test_a_failed_batch_exits_1_and_leaves_the_topic_as_it_was(cli: Cli) -> None:
    enable(cli)
    before = copies(cli, T0)
    lid = sorted(before)[5]
    (cli.root / "cold" / f"{before[lid][0]}-ledger-{lid}").unlink()  # one old object lost
    code, out, err = cli("compact", "--namespace", NS, "--as-of", AS_OF)
    assert code == 1, (out, err)
    assert f"FAILED {TopicName.parse(T0).managed_ledger_name} failed: " in out and "retried next run" in out
    assert copies(cli, T0) == before  # nothing switched
    assert len({u for us in copies(cli, T1).values() for u in us}) == 1  # the other topic was compacted
    res = cli.json("compact", "--namespace", NS, "--as-of", AS_OF, expect=1)
    assert [(r["topic"], r["outcome"]) for r in res["rows"]] == [(TopicName.parse(T0).managed_ledger_name, "failed")]
    assert res["failed"] and "ledger" in res["failed"][0]


def test_a_topic_another_runner_holds_is_skipped_busy(cli: Cli) -> None:
    enable(cli)
    with Workspace(cli.config()) as ws:
        lease = ws.leases.acquire(T0, "offload")  # an offload of T0 in progress elsewhere
        before = copies(cli, T0)
        code, out, err = cli("compact", "--namespace", NS, "--as-of", AS_OF)
        assert code == 0, err  # busy is not a failure: the next run compacts it
        assert f"  persistent://{T0}: 0 batch(es) of 0 ledger(s): objects 0 → 0, 0.0 MiB → 0.0 MiB (1 busy)" in out
        assert f"  persistent://{T1}: 1 batch(es) of {LEDGERS} ledger(s)" in out
        assert copies(cli, T0) == before
        ws.leases.release(lease)
    res = cli.json("compact", "--namespace", NS, "--as-of", AS_OF)
    assert [(r["topic"], r["outcome"]) for r in res["rows"]] == [(TopicName.parse(T0).managed_ledger_name, "compacted")]


# -- compaction off, bad input ----------------------------------------------------------------------


@pytest.mark.parametrize("argv", [[], ["--namespace", NS], [T0, T1]], ids=["all", "namespace", "topics"])
def test_compaction_off_is_refused_with_the_way_to_enable_it(cli: Cli, argv: list[str]) -> None:
    before = snapshot(cli.root)
    assert_usage_error(cli("compact", *argv), "compact", "--compaction on", "--dry-run")
    assert snapshot(cli.root) == before


@pytest.mark.parametrize("argv, fragments", [
    (["--min-object-size", "0"], ["--min-object-size", "positive"]),
    (["--min-object-size", "-1"], ["--min-object-size"]),
    (["--target-size", "big"], ["--target-size", "size 'big'"]),
    (["--min-object-size", "64M", "--target-size", "1M"], ["exceeds the target size"]),
    (["--min-object-size", "512M"], ["exceeds the target size 268435456"]),  # above the policy's target
    (["--target-size", "1M"], ["with the overrides", "min object size 8388608 exceeds"]),  # below its min
    (["--delete-delay", "-1"], ["--delete-delay", "negative"]),
    (["--delete-delay", "soon"], ["--delete-delay", "duration"]),
    (["--price-gb-month", "-0.1"], ["--price-gb-month", ">= 0"]),
    (["--price-put-1k", "nan"], ["--price-put-1k"]),
    (["--price-get-1k", "free"], ["--price-get-1k", "number"]),
    (["--listings-per-month", "1.5"], ["--listings-per-month", "integer"]),
    (["--as-of", "yesterday"], ["--as-of"]),
], ids=lambda v: " ".join(v) if isinstance(v, list) and v and v[0].startswith("--") else None)
def test_bad_input_is_refused_and_changes_nothing(enabled: Cli, argv: list[str], fragments: list[str]) -> None:
    before = snapshot(enabled.root)
    for dry in ([], ["--dry-run"]):
        assert_usage_error(enabled("compact", "--namespace", NS, *dry, *argv), "compact", *fragments)
    assert snapshot(enabled.root) == before


@pytest.mark.parametrize("argv, fragment", [
    (["--namespace", "no/such"], "unknown namespace(s) no/such"),
    ([f"{NS}/nope"], "not found"),
    (["--namespace", NS, T0], "not both"),
])
def test_bad_selection_is_refused(enabled: Cli, argv: list[str], fragment: str) -> None:
    before = snapshot(enabled.root)
    assert_usage_error(enabled("compact", *argv), "compact", fragment)
    assert snapshot(enabled.root) == before


def test_json_shape_and_prices(enabled: Cli) -> None:
    res = enabled.json("compact", "--dry-run", "--namespace", NS, "--price-gb-month", "0", "--price-put-1k", "0",
                   "--price-get-1k", "0", "--listings-per-month", "0", "--as-of", AS_OF)
    assert set(res) == {"as_of_ms", "as_of", "dry_run", "namespaces", "objects_before", "objects_after", "bytes_before",
                        "bytes_after", "bytes_saved", "retransformed_batches", "cost", "prices", "thresholds", "notes", "failed", "compaction_off", "topics",
                        "rows"}
    assert res["as_of_ms"] == AS_OF_MS and res["dry_run"] is True
    assert res["prices"] == {"gb_month": 0.0, "put_per_1000": 0.0, "get_per_1000": 0.0, "listings_per_month": 0}
    assert set(res["cost"]) == {"storage_month", "listing_month", "reads_month", "total_month", "one_time"}
    assert all(v == 0 for v in res["cost"].values())  # free storage and requests: nothing to gain or pay
    ns = res["namespaces"][NS]
    assert (ns["topics"], ns["batches"], ns["ledgers"], ns["objects_before"], ns["objects_after"]) == (
        2, 2, 2 * LEDGERS, 4 * LEDGERS, 4)
    assert set(res["topics"]) == {f"persistent://{T0}", f"persistent://{T1}"}
    assert {"topic", "namespace", "outcome", "ledgers", "segments", "objects_before", "objects_after", "bytes_before",
            "bytes_after", "entries", "estimated", "error"} <= set(res["rows"][0])
    assert res["rows"][0]["entries"] == LEDGERS * ENTRIES
    # the default prices are S3 Standard's; a dearer PUT makes the one-time cost dearer
    default = enabled.json("compact", "--dry-run", "--namespace", NS)
    assert default["prices"] == {"gb_month": 0.023, "put_per_1000": 0.005, "get_per_1000": 0.0004,
                                 "listings_per_month": 30}
    dear = enabled.json("compact", "--dry-run", "--namespace", NS, "--price-put-1k", "5")
    assert dear["cost"]["one_time"] > default["cost"]["one_time"] > 0


# -- S3 ---------------------------------------------------------------------------------------------


def test_compaction_on_s3(tmp_path: Path, capsys: pytest.CaptureFixture[str], moto_endpoint: str) -> None:
    bucket = f"compact-{uuid.uuid4().hex[:16]}"
    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    c = Cli(tmp_path / "ws", capsys)
    build(c.root, store_url=f"s3://{bucket}/p?endpoint={moto_endpoint}&region=us-east-1")
    assert c.json("offload", "--keep-bytes", "0", "--namespace", NS)["offloaded"] == 2 * LEDGERS
    read_before = read_all(c, T0)
    enable(c)
    res = c.json("compact", "--namespace", NS, "--as-of", AS_OF)
    assert [r["outcome"] for r in res["rows"]] == ["compacted", "compacted"]
    assert read_all(c, T0) == read_before
    assert c.json("verify", "--offloaded-only", "--namespace", NS)["failed"] == 0
    assert c.json("status", "--by-namespace")["namespaces"][NS]["objects"] == 4


# -- policies ---------------------------------------------------------------------------------------


def test_policies_set_and_get_the_compaction_fields(cli: Cli) -> None:
    res = cli.json("policies", "set", NS, "--compaction", "on", "--compaction-min-object-size", "4M",
                   "--compaction-target-size", "128M", "--compaction-delete-delay", "30m")
    assert res["overrides"] == {"compaction_enabled": True, "compaction_min_object_size": 4 * 2**20,
                                "compaction_target_size": 128 * 2**20, "compaction_delete_delay_ms": 1_800_000}
    eff = cli.json("policies", "get", NS)["effective"]
    assert (eff["compaction_enabled"], eff["compaction_min_object_size"], eff["compaction_target_size"],
            eff["compaction_delete_delay_ms"]) == (True, 4 * 2**20, 128 * 2**20, 1_800_000)
    assert cli.json("policies", "get", OFF)["effective"]["compaction_enabled"] is False  # off by default
    code, out, _ = cli("policies", "list")
    assert code == 0
    lines = {line.split()[0]: line for line in out.splitlines()}
    assert "compaction on " in lines[NS] and "compaction off" in lines[OFF]
    # a topic override
    res = cli.json("policies", "set", T0, "--topic", "--compaction", "off")
    assert res["effective"]["compaction_enabled"] is False and res["effective"]["compaction_target_size"] == 128 * 2**20
    # the policy's delete delay is the run's
    cli.json("compact", T1, "--as-of", AS_OF)
    assert {r.next_attempt_ms for r in pending(cli)} == {AS_OF_MS + 1_800_000}


@pytest.mark.parametrize("argv, fragment", [
    (["--compaction-min-object-size", "512M"], "exceeds the target size"),  # above the default 256M target
    (["--compaction-min-object-size", "64M", "--compaction-target-size", "32M"], "exceeds the target size"),
    (["--compaction-min-object-size", "0"], "compaction_min_object_size must be a positive integer"),
    (["--compaction-target-size", "-1"], "compaction_target_size must be a positive integer"),
    (["--compaction-target-size", "lots"], "--compaction-target-size"),
    (["--compaction-delete-delay", "-1"], "compaction_delete_delay_ms must be a non-negative integer"),
    (["--compaction-delete-delay", "1y"], "--compaction-delete-delay"),
])
def test_bad_compaction_policies_are_refused_and_nothing_is_stored(enabled: Cli, argv: list[str], fragment: str) -> None:
    before = snapshot(enabled.root)
    assert_usage_error(enabled("policies", "set", NS, *argv), "policies", fragment)
    assert snapshot(enabled.root) == before
    assert enabled.json("policies", "get", NS)["overrides"] == {"compaction_enabled": True}
