"""Pulsar's namespace policies (Policies / OffloadPoliciesImpl / RetentionPolicies JSON, as Jackson writes
them) mapped to this project's OffloadPolicy, read-only."""

from __future__ import annotations

import json

import pytest

from tests.support.pulsar_cluster import ClusterSpec, namespace_policies, offload_policies
from tieredcore.policy import HOT_FIRST, TIERED_FIRST, OffloadPolicy, StoreSpec, merge
from tieredcore.pulsar_policies import PulsarNamespacePolicy

ENDPOINT = "http://127.0.0.1:9000"


def parse(**fields) -> PulsarNamespacePolicy:
    return PulsarNamespacePolicy.parse("acme/orders", json.loads(namespace_policies("pulsar-a", **fields)))


@pytest.mark.parametrize("driver", ["aws-s3", "S3", "AWS-S3", "s3-legacy"])
def test_offload_policies_of_every_s3_spelling(driver):
    p = parse(offload_threshold=1048576, offload_deletion_lag_ms=3600000,
              offload_policies=offload_policies(ClusterSpec(driver=driver), "tiered-b", ENDPOINT),
              retention_policies={"retentionTimeInMinutes": 10080, "retentionSizeInMB": 10240})
    assert p.store == StoreSpec(driver="aws-s3", bucket="tiered-b", endpoint=ENDPOINT, region="us-east-1")
    eff = merge(OffloadPolicy(), p.overrides(), "acme/orders")
    assert (eff.offload_threshold_bytes, eff.offload_threshold_seconds, eff.deletion_lag_ms) == (1048576, -1, 3600000)
    assert (eff.retention_time_minutes, eff.retention_size_mb) == (10080, 10240)
    assert eff.read_priority == TIERED_FIRST and eff.max_block_size == 67108864 and eff.store == p.store


def test_the_top_level_fields_stand_when_offload_policies_say_nothing():
    """Pulsar's top-level offload_threshold(_in_seconds) (-1: not set), offload_deletion_lag_ms (null: not
    set); a value in offload_policies wins (the admin API writes both)."""
    p = parse(offload_threshold_in_seconds=3600, offload_deletion_lag_ms=14400000)
    assert (p.threshold_bytes, p.threshold_seconds, p.deletion_lag_ms, p.store) == (None, 3600, 14400000, None)
    assert p.overrides() == {"offload_threshold_seconds": 3600, "deletion_lag_ms": 14400000}
    nothing = parse()
    assert nothing.overrides() == {} and merge(OffloadPolicy(), {}, "x") == OffloadPolicy()
    both = parse(offload_threshold=5, offload_policies={"managedLedgerOffloadThresholdInBytes": 7,
                                                        "managedLedgerOffloadThresholdInSeconds": -1,
                                                        "managedLedgerOffloadDeletionLagInMillis": 0,
                                                        "managedLedgerOffloadedReadPriority": "BOOKKEEPER_FIRST"})
    assert (both.threshold_bytes, both.threshold_seconds, both.deletion_lag_ms) == (7, -1, 0)
    assert both.read_priority == HOT_FIRST
    assert PulsarNamespacePolicy.parse("a/b", None) == PulsarNamespacePolicy("a/b")


@pytest.mark.parametrize(("off", "store"), [
    ({"managedLedgerOffloadDriver": "google-cloud-storage", "gcsManagedLedgerOffloadBucket": "g-bucket",
      "gcsManagedLedgerOffloadRegion": "europe-west1"}, StoreSpec(driver="google-cloud-storage", bucket="g-bucket")),
    ({"managedLedgerOffloadDriver": "azureblob", "managedLedgerOffloadBucket": "container-1",
      "managedLedgerOffloadServiceEndpoint": "http://az:10000/acct"},
     StoreSpec(driver="azureblob", bucket="container-1", endpoint="http://az:10000/acct")),
    ({"managedLedgerOffloadDriver": "filesystem", "fileSystemURI": "hdfs://nn:9000"}, None),  # Hadoop MapFiles
    ({"managedLedgerOffloadDriver": "aliyun-oss", "managedLedgerOffloadBucket": "oss-b"}, None),
    ({"managedLedgerOffloadDriver": "aws-s3"}, None),  # no bucket here: the brokers' default
])
def test_drivers_this_build_opens_and_the_others(off, store):
    p = parse(offload_policies=off)
    assert p.store == store and p.driver == off["managedLedgerOffloadDriver"]
    assert ("store" in p.overrides()) == (store is not None)
