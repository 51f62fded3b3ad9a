"""Orphan reconciliation of an attached Pulsar cluster's bucket through the CLI (docs/pulsar.md, "Orphan
reconciliation for Pulsar's bucket"), on the fixture cluster of tests/support/pulsar_cluster.py (built from
Pulsar's MetaStoreImpl, OffloadUtils and BlobStoreManagedLedgerOffloader), under every ManagedLedgerInfo
codec and every S3 driver-name spelling on moto, and the local store:

- a dry run (the default when attached) plans exactly the planted orphans, lists each with size, age and
  why, and lists what it left alone (another cluster's objects, young orphans, the non-Pulsar file);
- ``--apply`` + ``tiered deletions drain`` delete exactly the planted orphans (bucket diff);
- a uuid referenced again between apply and drain (a record written into ZooKeeper as MetaStoreImpl writes
  it) is skipped by the drain's re-read and reported;
- one unreadable topic record: no orphan at all is recorded;
- Pulsar's ZooKeeper paths are byte-identical before and after (``cluster.snapshot()``)."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
from kazoo.client import KazooClient

from tests.attach.test_attach_cli import attach, bucket
from tests.support.clihelp import Cli, assert_usage_error
from tests.support.pulsar_cluster import (
    CODECS,
    DRIVER_VARIANTS,
    FOREIGN,
    HOUR_MS,
    LOCAL,
    ORPHAN,
    OTHER_CLUSTER,
    REFERENCED,
    YOUNG_ORPHAN,
    LedgerPlan,
    driver_metadata,
    ml_record,
    topic_info,
)
from tieredcore.lifecycle.reconcile import ATTACHED_DEFAULT_GRACE_MS

PAYMENTS = "acme/orders/persistent/payments"
WEEK = ATTACHED_DEFAULT_GRACE_MS
VARIANTS = ([(codec, "aws-s3") for codec in CODECS] + [(None, d) for d in DRIVER_VARIANTS if d != "aws-s3"]
            + [("ZSTD", LOCAL)])


def reconcile(cli: Cli, cluster, *argv: str, grace_ms: int = WEEK, expect: int = 0) -> dict:
    return cli.json("reconcile", "--as-of", str(cluster.as_of(grace_ms)), *argv, expect=expect)


def drain(cli: Cli, cluster, expect: int = 0) -> dict:
    return cli.json("deletions", "drain", "--as-of", str(cluster.as_of(WEEK) + HOUR_MS), expect=expect)


def withheld(rep: dict) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for w in rep["withheld"]:
        out.setdefault(w["reason"], set()).add(w["key"])
    return out


@pytest.mark.parametrize(("codec", "driver"), VARIANTS)
def test_dry_run_plans_exactly_the_planted_orphans_and_apply_and_drain_delete_only_them(
        pulsar_cluster, tmp_path: Path, capsys, codec, driver):
    cluster = pulsar_cluster(codec=codec, driver=driver)
    cli = Cli(tmp_path / "ws", capsys)
    attach(cli, cluster)
    zk, objects = cluster.snapshot(), bucket(cluster)
    sizes = {o.key: o.size for o in cluster.objects}

    plan = reconcile(cli, cluster)  # no flag: an attached workspace only plans
    assert plan["dry_run"] and plan["attached"] and plan["grace_ms"] == WEEK and plan["records_appended"] == 0
    assert {c["key"] for c in plan["candidates"]} == cluster.keys(ORPHAN)
    assert len(plan["candidates"]) == len(cluster.keys(ORPHAN)) == 5 and plan["orphan_groups"] == 3
    for c in plan["candidates"]:
        assert c["size"] == sizes[c["key"]] and WEEK < c["age_ms"] < WEEK + 60_000, c
        assert c["why"].startswith("uuid referenced by no ManagedLedgerInfo (complete or in-progress offload "
                                   "context, any ledger, any topic) nor the deletion log; written by cluster "
                                   "'pulsar-a'; age 7.0d > grace 7.0d"), c["why"]
    assert withheld(plan) == {"other-cluster": cluster.keys(OTHER_CLUSTER), "young": cluster.keys(YOUNG_ORPHAN),
                              "foreign-key": cluster.keys(FOREIGN)}
    assert {w["why"] for w in plan["withheld"] if w["reason"] == "other-cluster"} == {
        f"{k}: written by cluster 'pulsar-b'" for k in cluster.keys(OTHER_CLUSTER) if k.endswith("-index")}
    orphan_bytes = sum(sizes[k] for k in cluster.keys(ORPHAN))
    assert plan["orphans_by_namespace"] == {"acme/orders": {"groups": 3, "objects": 5, "bytes": orphan_bytes}}
    assert [n for n in plan["notes"] if n.startswith("dry run")]
    assert cluster.snapshot() == zk and bucket(cluster) == objects

    applied = reconcile(cli, cluster, "--apply")
    assert not applied["dry_run"] and applied["records_appended"] == 3 and not applied["errors"]
    assert {c["key"] for c in applied["candidates"]} == cluster.keys(ORPHAN)
    assert bucket(cluster) == objects  # the records only: the drain deletes

    drained = drain(cli, cluster)
    assert drained["deleted"] == 3 and drained["referenced_again"] == 0, drained
    after = bucket(cluster)
    assert set(objects) - set(after) == cluster.keys(ORPHAN)
    assert {k: v for k, v in objects.items() if k in after} == after
    assert cluster.snapshot() == zk


def test_the_default_grace_is_a_week_and_a_shorter_one_is_taken_when_given(pulsar_cluster, tmp_path: Path, capsys):
    """An hour after the planted orphans were written, the week-long default makes every unreferenced
    object young (another cluster's too: age is looked at before whose an object is); --grace 1h makes the
    old ones candidates (the young stay young)."""
    cluster = pulsar_cluster(driver=LOCAL)
    cli = Cli(tmp_path / "ws", capsys)
    attach(cli, cluster)
    rep = reconcile(cli, cluster, grace_ms=HOUR_MS)
    assert rep["grace_ms"] == WEEK and rep["candidates"] == []
    assert withheld(rep)["young"] == cluster.keys(ORPHAN, YOUNG_ORPHAN, OTHER_CLUSTER)
    rep = reconcile(cli, cluster, "--grace", "1h", grace_ms=HOUR_MS)
    assert rep["grace_ms"] == HOUR_MS and {c["key"] for c in rep["candidates"]} == cluster.keys(ORPHAN)
    assert withheld(rep)["young"] == cluster.keys(YOUNG_ORPHAN)


def test_text_report_lists_every_candidate_and_what_was_withheld(pulsar_cluster, tmp_path: Path, capsys):
    cluster = pulsar_cluster(driver=LOCAL)
    cli = Cli(tmp_path / "ws", capsys)
    attach(cli, cluster)
    code, out, err = cli("reconcile", "--as-of", str(cluster.as_of(WEEK)))
    assert code == 0 and err == ""
    lines = out.splitlines()
    orphans = [ln for ln in lines if ln.startswith("  orphan   ")]
    assert {ln.split()[1] for ln in orphans} == cluster.keys(ORPHAN)
    assert all("written by cluster 'pulsar-a'; age 7.0d > grace 7.0d" in ln for ln in orphans)
    held = {ln.split()[1]: ln for ln in lines if ln.startswith("  withheld ")}
    assert set(held) == cluster.keys(OTHER_CLUSTER, YOUNG_ORPHAN, FOREIGN)
    assert all("(other-cluster)" in held[k] for k in cluster.keys(OTHER_CLUSTER))
    assert "would append 3 deletion record(s)" in lines
    assert any(ln.startswith("note: dry run: nothing recorded") for ln in lines)


def test_apply_and_dry_run_together_are_refused_with_one_line(pulsar_cluster, tmp_path: Path, capsys):
    cluster = pulsar_cluster(driver=LOCAL)
    cli = Cli(tmp_path / "ws", capsys)
    attach(cli, cluster)
    objects = bucket(cluster)
    assert_usage_error(cli("reconcile", "--apply", "--dry-run"), "reconcile", "--apply and --dry-run contradict")
    assert cli.json("deletions", "stats")["in_flight"] == 0 and bucket(cluster) == objects


def test_a_non_attached_workspace_still_applies_by_default(tmp_path: Path, capsys):
    cli = Cli(tmp_path / "ws", capsys)
    assert cli("init", str(cli.root), workspace=False)[0] == 0
    rep = cli.json("reconcile")
    assert rep["dry_run"] is False and rep["grace_ms"] == HOUR_MS and not rep["attached"]
    assert cli.json("reconcile", "--dry-run")["dry_run"] is True
    assert cli.json("reconcile", "--apply")["dry_run"] is False
    assert_usage_error(cli("reconcile", "--apply", "--dry-run"), "reconcile", "--apply and --dry-run contradict")


def _write_topic(cluster, plan) -> None:
    """The topic's record as a broker writes it (MetaStoreImpl: the spec's codec; OffloadUtils' driver)."""
    q = parse_qs(urlparse(cluster.store_url).query)
    endpoint = q.get("endpoint", [""])[0]
    driver = driver_metadata(cluster.spec, cluster.bucket, endpoint, cluster.bucket if cluster.spec.driver == LOCAL
                             else "")
    zk = KazooClient(hosts=cluster.hosts)
    zk.start(timeout=15)
    try:
        zk.set(f"{cluster.spec.chroot}/managed-ledgers/{plan.name}",
               ml_record(topic_info(plan, driver), cluster.spec.codec, cluster.spec.compression_threshold))
    finally:
        zk.stop()
        zk.close()


@pytest.mark.parametrize("driver", [LOCAL, "aws-s3"])
def test_a_uuid_referenced_again_before_the_drain_is_skipped_and_reported(pulsar_cluster, tmp_path: Path, capsys,
                                                                          driver):
    """Between apply and drain a broker starts offloading payments' ledger 1003 again under the uuid of the
    lone data object planted as ledger 1002's orphan. The drain's first check (the record's own ledger) sees
    nothing; its re-read of the ManagedLedgerInfo right before deleting finds the uuid and skips it."""
    cluster = pulsar_cluster(driver=driver, codec="LZ4")
    cli = Cli(tmp_path / "ws", capsys)
    attach(cli, cluster)
    objects = bucket(cluster)
    assert reconcile(cli, cluster, "--apply")["records_appended"] == 3
    lone = next(o for o in cluster.objects if o.kind == ORPHAN and o.ledger_id == 1002)
    plan = cluster.topics[PAYMENTS]
    i = next(n for n, li in enumerate(plan.ledgers) if li.ledger_id == 1003)
    plan.ledgers[i] = LedgerPlan(1003, "offloading", plan.ledgers[i].entries, lone.uuid)
    _write_topic(cluster, plan)
    zk = cluster.snapshot()

    drained = drain(cli, cluster)
    assert drained["deleted"] == 2 and drained["referenced_again"] == 1 and drained["still_in_use"] == 1
    (row,) = [r for r in drained["rows"] if r["outcome"] == "still_in_use"]
    assert row["ledger"] == 1002 and row["error"] == (
        f"referenced again: uuid {lone.uuid} by the ManagedLedgerInfo of {PAYMENTS} (re-read right before "
        "deleting); nothing deleted")
    after = bucket(cluster)
    assert set(objects) - set(after) == cluster.keys(ORPHAN) - {lone.key} and lone.key in after
    assert cluster.snapshot() == zk
    assert cli.json("deletions", "stats")["in_flight"] == 0  # acknowledged: the reference is live again


def test_one_unreadable_record_withholds_every_orphan(pulsar_cluster, tmp_path: Path, capsys):
    """acme/metrics/cpu's record is garbage: it may reference any uuid, so nothing is recorded, even the
    orphans of acme/orders; the report says so (exit 1), and the drain has nothing to delete."""
    cluster = pulsar_cluster(driver=LOCAL)
    zk = KazooClient(hosts=cluster.hosts)
    zk.start(timeout=15)
    try:
        zk.set(f"{cluster.spec.chroot}/managed-ledgers/acme/metrics/persistent/cpu", b"\x47\x78\x00\x00\x00\x09garbage!!")
    finally:
        zk.stop()
        zk.close()
    cli = Cli(tmp_path / "ws", capsys)
    attach(cli, cluster)
    before, objects = cluster.snapshot(), bucket(cluster)
    rep = reconcile(cli, cluster, "--apply", expect=1)
    assert rep["unreadable_topics"] == ["persistent://acme/metrics/cpu"]
    assert rep["candidates"] == [] and rep["records_appended"] == 0 and rep["records"] == []
    # cpu's own offloaded pair is unreferenced now that its record cannot be read: withheld too
    cpu = {o.key for o in cluster.objects if o.kind == REFERENCED and o.managed_ledger == "acme/metrics/persistent/cpu"}
    assert len(cpu) == 2 and withheld(rep)["unreadable-topics"] == cluster.keys(ORPHAN) | cpu
    assert rep["withheld_groups"] == 4
    assert any(n.startswith("unreadable topic records (1): NO orphan is recorded") for n in rep["notes"])
    assert any("no orphan at all is recorded for deletion until it can be read" in e for e in rep["errors"])
    assert drain(cli, cluster)["entries"] == 0
    assert cluster.snapshot() == before and bucket(cluster) == objects


def test_the_report_json_has_the_figures_the_view_reads(pulsar_cluster, tmp_path: Path, capsys):
    """orphans_by_namespace (orphan groups, objects, bytes per namespace) in the report the job writes."""
    cluster = pulsar_cluster(driver=LOCAL)
    cli = Cli(tmp_path / "ws", capsys)
    attach(cli, cluster)
    code, out, _ = cli("--json", "reconcile", "--as-of", str(cluster.as_of(WEEK)))
    rep = json.loads(out)
    assert code == 0 and set(rep["orphans_by_namespace"]) == {"acme/orders"}
    assert sum(c["size"] for c in rep["candidates"]) == rep["orphans_by_namespace"]["acme/orders"]["bytes"]


def test_the_help_states_the_default_grace_and_why(capsys):
    """The brokers' default offload deletion lag: managedLedgerOffloadDeletionLagMs = 4 h in Pulsar's
    pulsar-broker-common/src/main/java/org/apache/pulsar/broker/ServiceConfiguration.java; the week is
    well above it."""
    from tieredcore.cli.main import main

    assert WEEK == 7 * 24 * HOUR_MS > 4 * HOUR_MS * 10

    with pytest.raises(SystemExit):
        main(["reconcile", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "attached to a Pulsar cluster 7d: well above the brokers' offload deletion lag" in text
    assert "managedLedgerOffloadDeletionLagMs 4h by default" in text and "--apply" in text


def test_a_reference_that_appears_after_the_drains_first_check_is_caught_by_the_re_read(
        pulsar_cluster, tmp_path: Path, capsys, monkeypatch):
    """The race the re-read exists for: the drain checked the records (ledger 1004 of payments lists no
    offload), then a broker records the orphan pair's uuid as 1004's offload in progress, then the drain
    deletes. Its re-read of the ManagedLedgerInfo right before deleting finds the uuid: nothing of it goes."""
    from tieredcore.lifecycle import drain as drain_module

    cluster = pulsar_cluster(driver=LOCAL, codec="ZSTD")
    cli = Cli(tmp_path / "ws", capsys)
    attach(cli, cluster)
    objects = bucket(cluster)
    assert reconcile(cli, cluster, "--apply")["records_appended"] == 3
    pair = {o.key for o in cluster.objects if o.kind == ORPHAN and o.ledger_id == 1004}
    uuid = next(o.uuid for o in cluster.objects if o.kind == ORPHAN and o.ledger_id == 1004)
    plan = cluster.topics[PAYMENTS]
    i = next(n for n, li in enumerate(plan.ledgers) if li.ledger_id == 1004)
    original = drain_module._Drain.run_batches

    def broker_writes_then_run_batches(self) -> None:
        plan.ledgers[i] = LedgerPlan(1004, "offloading", plan.ledgers[i].entries, uuid)
        _write_topic(cluster, plan)
        original(self)

    monkeypatch.setattr(drain_module._Drain, "run_batches", broker_writes_then_run_batches)
    drained = drain(cli, cluster)
    assert drained["deleted"] == 2 and drained["referenced_again"] == 1, drained
    (row,) = [r for r in drained["rows"] if r["outcome"] == "still_in_use"]
    assert row["ledger"] == 1004 and row["error"].startswith(f"referenced again: uuid {uuid} by the ManagedLedgerInfo")
    after = bucket(cluster)
    assert len(pair) == 2 and pair <= set(after) and set(objects) - set(after) == cluster.keys(ORPHAN) - pair
