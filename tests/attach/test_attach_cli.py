"""`tiered init --pulsar-zk` and the commands that work on an attached workspace (status, read --messages,
verify --offloaded-only, policies get), on the fixture cluster of tests/support/pulsar_cluster.py, under
every ManagedLedgerInfo codec and every S3 driver-name spelling; every refusal (no Pulsar layout, an
unknown cluster, a bucket the policies do not name, a write of what is Pulsar's) is one line, exit 2,
nothing created. Pulsar's ZooKeeper paths and the bucket are byte-identical before and after each."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from tests.support.clihelp import Cli, assert_usage_error
from tests.support.pulsar_cluster import CODECS, DRIVER_VARIANTS, LOCAL
from tieredcore.cold.blob import iter_objects
from tieredcore.formats.messages import decode_entry

PAYMENTS = "acme/orders/persistent/payments"
REPO = Path(__file__).resolve().parents[2]


def bucket(cluster) -> dict[str, tuple[int, float]]:
    return {o.key: (o.size, o.last_modified) for o in iter_objects(cluster.store, "")}


def attach(cli: Cli, cluster, *extra: str) -> dict:
    default = ["--brokers-default"] if cluster.spec.driver == LOCAL else []
    return cli.json("init", str(cli.root), "--pulsar-zk", cluster.pulsar_zk, "--store-url", cluster.store_url,
                    *default, *extra, workspace=False)


def expected_messages(cluster, topic: str, ledger_ids: list[int]) -> list[tuple[str, str | None, int]]:
    out = []
    for lid in ledger_ids:
        for eid, entry in enumerate(cluster.ledger(topic, lid).entries):
            out += [(str(m.id), m.key, len(m.payload)) for m in decode_entry(entry, lid, eid)]
    return out


VARIANTS = [(codec, "aws-s3") for codec in CODECS] + [(None, d) for d in DRIVER_VARIANTS if d != "aws-s3"]


@pytest.mark.parametrize(("codec", "driver"), VARIANTS)
def test_attach_status_read_and_verify(pulsar_cluster, tmp_path: Path, capsys, codec, driver):
    cluster = pulsar_cluster(codec=codec, driver=driver)
    zk, objects = cluster.snapshot(), bucket(cluster)
    cli = Cli(tmp_path / "ws", capsys)
    res = attach(cli, cluster)
    assert res["attached"] and res["cluster"] == "pulsar-a" and res["hot"] == "bookkeeper:"
    assert res["bucket"] == "named by the offload policies of acme/orders"

    status = cli.json("status", "--ledgers")
    assert status["attached"] == {"cluster": "pulsar-a", "hot_tier": "BookKeeper"}
    rows = {r["topic"]: r for r in status["topics"]}
    tiers = {d["ledger"]: d["tier"] for d in rows["persistent://acme/orders/payments"]["ledger_detail"]}
    assert tiers == {1001: "offloaded", 1002: "both", 1003: "hot", 1004: "hot", 1005: "hot"}
    assert rows["persistent://acme/orders/fresh"]["ledgers"] == 0
    assert set(rows) >= {"persistent://public/default/events-partition-0", "persistent://public/default/events-partition-1"}

    code, out, err = cli("--json", "read", "--messages", "acme/orders/payments")
    read = json.loads(out)
    assert code == 0 and read["in_bookkeeper"] == [1003, 1004, 1005] and read["bad_entries"] == []
    assert [(m["position"], m["key"], m["size"]) for m in read["messages"]] == expected_messages(
        cluster, PAYMENTS, [1001, 1002])
    assert [ln for ln in err.splitlines() if "in BookKeeper" in ln] == [
        f"tiered read: in BookKeeper (ledger {i}): not offloaded; Pulsar's brokers serve its entries"
        for i in (1003, 1004, 1005)]
    assert "Error" not in err

    verify = cli.json("verify", "--offloaded-only", expect=1)  # the damaged message fails its topic
    rows = {r["topic"]: r for r in verify["topics"]}
    assert verify["failed"] == 1 and not rows["persistent://acme/orders/audit"]["ok"]
    assert [b["position"] for b in rows["persistent://acme/orders/audit"]["bad_entries"]] == ["2001:4"]
    assert rows["persistent://acme/orders/payments"]["ok"] and rows["persistent://acme/orders/payments"]["entries"] == 24
    assert rows["persistent://acme/orders/payments"]["hot_only_ledgers"] == [1003, 1004, 1005]
    assert verify["hot_tier"] == "BookKeeper"
    assert cluster.snapshot() == zk and bucket(cluster) == objects


def test_the_local_store_attaches_once_stated_as_the_brokers_default(pulsar_cluster, tmp_path: Path, capsys):
    cluster = pulsar_cluster(driver=LOCAL)
    cli = Cli(tmp_path / "ws", capsys)
    assert_usage_error(cli("init", str(cli.root), "--pulsar-zk", cluster.pulsar_zk, "--store-url", cluster.store_url,
                           workspace=False), "init", "named by no namespace's offload policies", "--brokers-default")
    assert not cli.root.exists()
    res = attach(cli, cluster)
    assert res["bucket"] == "the brokers' default (as stated)"
    assert cli.json("init", str(cli.root), workspace=False)["created"] is False  # again: checked again, kept
    code, out, _ = cli("read", "--messages", "acme/orders/audit")
    assert code == 1 and "2001:4\tBAD ENTRY\tentry 2001:4: CRC32C mismatch" in out


def _no_trace(cluster, cli: Cli) -> None:
    """Nothing created: no workspace directory, no node of the project's in ZooKeeper."""
    assert not cli.root.exists()
    zk = KazooClient(hosts=cluster.hosts)
    zk.start(timeout=15)
    try:
        assert not zk.exists(f"{cluster.spec.chroot}/tiered-storage")
    finally:
        zk.stop()
        zk.close()


def test_attach_refusals_are_one_line_and_change_nothing(pulsar_cluster, zk_server, tmp_path: Path, capsys):
    cluster = pulsar_cluster(register_other=True)  # two clusters registered: pulsar-a and pulsar-b
    zk, objects = cluster.snapshot(), bucket(cluster)
    cli = Cli(tmp_path / "ws", capsys)

    def init(*argv: str) -> tuple[int, str, str]:
        return cli("init", str(cli.root), *argv, workspace=False)

    url = cluster.store_url
    cases = [
        (("--pulsar-zk", f"zk://{zk_server.hosts}/no-pulsar-here", "--store-url", url, "--cluster", "pulsar-a"),
         ("holds no Pulsar cluster (no /managed-ledgers, no /admin/clusters)", "chroot")),
        (("--pulsar-zk", cluster.pulsar_zk, "--store-url", url, "--cluster", "pulsar-c"),
         ("cluster 'pulsar-c' is not registered", "pulsar-a, pulsar-b")),
        (("--pulsar-zk", cluster.pulsar_zk, "--store-url", url), ("registers 2 clusters", "--cluster")),
        (("--pulsar-zk", cluster.pulsar_zk, "--store-url", url.replace(cluster.bucket, "some-other-bucket"),
          "--cluster", "pulsar-a"), ("'some-other-bucket'", f"they name: s3://{cluster.bucket}")),
        (("--pulsar-zk", cluster.pulsar_zk, "--store-url", url.replace("?", "/ledgers?"), "--cluster", "pulsar-a"),
         ("without a prefix",)),
        (("--pulsar-zk", cluster.pulsar_zk, "--cluster", "pulsar-a"), ("needs --store-url",)),
        (("--pulsar-zk", cluster.pulsar_zk, "--store-url", url, "--metadata-url", "zk://h:1/r"), ("no --metadata-url",)),
        (("--store-url", url, "--brokers-default"), ("--brokers-default goes with --pulsar-zk",)),
        (("--pulsar-zk", "http://h:1/x", "--store-url", url), ("expected zk://HOST:PORT",)),
    ]
    for argv, fragments in cases:
        assert_usage_error(init(*argv), "init", *fragments)
        _no_trace(cluster, cli)
    assert cluster.snapshot() == zk and bucket(cluster) == objects
    # named: attached (the other cluster's objects share the bucket; nothing of theirs is read here)
    assert attach(cli, cluster, "--cluster", "pulsar-a")["cluster"] == "pulsar-a"
    assert cluster.snapshot() == zk and bucket(cluster) == objects


def test_what_belongs_to_the_brokers_is_refused(pulsar_cluster, tmp_path: Path, capsys):
    cluster = pulsar_cluster(driver=LOCAL)
    cli = Cli(tmp_path / "ws", capsys)
    attach(cli, cluster)
    zk, objects = cluster.snapshot(), bucket(cluster)
    for argv, fragments in [
        (("generate", "--namespace", "acme/orders"), ("refused: `tiered generate` writes topics",)),
        (("offload", "acme/orders/payments", "--keep-bytes", "0"), ("offloads (Pulsar's brokers do)",)),
        (("topics", "delete", "acme/orders/payments", "--yes"), ("pulsar-admin topics delete",)),
        (("compact-topic", "acme/orders/payments"), ("pulsar-admin topics compact",)),
        (("policies", "set", "acme/orders", "--offload-threshold-bytes", "0"), ("pulsar-admin namespaces",)),
        (("policies", "delete", "acme/orders"), ("belong to the brokers of Pulsar cluster 'pulsar-a'",)),
        (("verify",), ("use `tiered verify --offloaded-only`",)),
        (("read", "acme/orders/payments", "--read-priority", "bookkeeper-first"), ("never BookKeeper",)),
    ]:
        assert_usage_error(cli(*argv), argv[0], *fragments)
    # the brokers' jobs: nothing done, one line saying why (the core's warning: on stderr of a real run)
    for argv, line in ((["retention"], "retention: skipped every namespace: "),
                       (["compact", "--namespace", "acme/orders"], "compaction: skipped acme/orders: ")):
        run = subprocess.run([sys.executable, "-m", "tieredcore.cli.main", "--workspace", str(cli.root), *argv],
                             capture_output=True, text=True, timeout=120, cwd=REPO,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
        assert run.returncode == 0, run.stderr
        assert [ln for ln in run.stderr.splitlines() if ln.startswith(line)] == [
            f"{line}attached to Pulsar cluster 'pulsar-a', whose brokers do "
            + ("retention" if argv[0] == "retention" else "writing its offloaded objects")
            + " (this workspace never does)"], run.stderr
    assert cluster.snapshot() == zk and bucket(cluster) == objects


def test_policies_are_read_from_pulsar(pulsar_cluster, tmp_path: Path, capsys):
    cluster = pulsar_cluster()
    cli = Cli(tmp_path / "ws", capsys)
    attach(cli, cluster)
    got = cli.json("policies", "get", "acme/orders")
    assert got["pulsar"]["offload_policies"]["s3ManagedLedgerOffloadBucket"] == cluster.bucket
    eff = got["effective"]
    assert (eff["offload_threshold_bytes"], eff["deletion_lag_ms"], eff["retention_time_minutes"]) == (
        1048576, 3600000, 10080)
    assert eff["store"]["bucket"] == cluster.bucket and eff["store"]["driver"] == "aws-s3"
    listed = {r["namespace"]: r for r in cli.json("policies", "list")["namespaces"]}
    assert listed["acme/metrics"]["overrides"] == {"offload_threshold_seconds": 3600, "deletion_lag_ms": 14400000}
    assert listed["public/default"]["overrides"] == {} and not listed["public/default"]["offload_enabled"]


def test_an_unreadable_record_fails_its_topic_only(pulsar_cluster, tmp_path: Path, capsys):
    """A record no codec reads (as a broker bug would leave it): status names it and exits 1, every other
    topic is shown and read as usual; nothing is written."""
    cluster = pulsar_cluster(driver=LOCAL)
    zk = KazooClient(hosts=cluster.hosts)
    zk.start(timeout=15)
    try:
        zk.set(f"{cluster.spec.chroot}/managed-ledgers/acme/metrics/persistent/cpu", b"\x47\x78\x00\x00\x00\x09garbage!!")
    finally:
        zk.stop()
        zk.close()
    before, objects = cluster.snapshot(), bucket(cluster)
    cli = Cli(tmp_path / "ws", capsys)
    attach(cli, cluster)
    status = cli.json("status", expect=1)
    rows = {r["topic"]: r for r in status["topics"]}
    assert "cannot be read" not in rows["persistent://acme/orders/payments"].get("error", "")
    assert rows["persistent://acme/metrics/cpu"]["error"].startswith(
        "/managed-ledgers/acme/metrics/persistent/cpu: ")
    assert cli("read", "acme/orders/payments")[0] == 0
    assert cluster.snapshot() == before and bucket(cluster) == objects


def test_gcs_and_azure_buckets_attach_when_the_policies_name_them(pulsar_cluster, tmp_path: Path, capsys):
    """Only the configuration and the project's identity are written: no store is opened to attach."""
    cluster = pulsar_cluster(driver=LOCAL)
    zk = KazooClient(hosts=cluster.hosts)
    zk.start(timeout=15)
    try:
        for ns, off in (("acme/gcs", {"managedLedgerOffloadDriver": "google-cloud-storage",
                                      "gcsManagedLedgerOffloadBucket": "pulsar-gcs-offload"}),
                        ("acme/azure", {"managedLedgerOffloadDriver": "azureblob",
                                        "managedLedgerOffloadBucket": "pulsar-azure"})):
            zk.create(f"{cluster.spec.chroot}/admin/policies/{ns}", json.dumps({"offload_policies": off}).encode())
    finally:
        zk.stop()
        zk.close()
    for i, (url, ns) in enumerate((("gs://pulsar-gcs-offload?endpoint=http://127.0.0.1:1", "acme/gcs"),
                                   ("azure://pulsar-azure?endpoint=http://127.0.0.1:1/acct", "acme/azure"))):
        cli = Cli(tmp_path / f"ws{i}", capsys)
        res = cli.json("init", str(cli.root), "--pulsar-zk", cluster.pulsar_zk, "--store-url", url, workspace=False)
        assert res["bucket"] == f"named by the offload policies of {ns}"
        assert_usage_error(cli("init", str(tmp_path / f"no{i}"), "--pulsar-zk", cluster.pulsar_zk, "--store-url",
                               url.replace("pulsar-", "nobodys-"), workspace=False), "init", "named by no namespace")


def test_reconciliation_drain_and_scrub_run_and_write_nothing_of_pulsars(pulsar_cluster, tmp_path: Path, capsys):
    """What other work makes right for Pulsar's bucket already runs here without touching Pulsar's tree or
    bucket in its dry runs; the scrub reads the damaged message's ledger as damage, never deletes it."""
    cluster = pulsar_cluster()
    cli = Cli(tmp_path / "ws", capsys)
    attach(cli, cluster)
    zk, objects = cluster.snapshot(), bucket(cluster)
    for argv in (("reconcile", "--dry-run", "--grace", "1h"), ("deletions", "drain", "--dry-run"),
                 ("scrub", "--deep"), ("status", "--by-namespace")):
        code, out, err = cli("--json", *argv)
        assert code in (0, 1) and "Traceback" not in err, (argv, code, err)
        json.loads(out)
    assert cluster.snapshot() == zk and bucket(cluster) == objects
