"""Namespace / topic offload policies: validation matrix and PolicyStore semantics."""

from __future__ import annotations

import pytest

from tieredcore.cold.location import check_bucket_name
from tieredcore.errors import ValidationError
from tieredcore.meta.managed_ledgers import ManagedLedgerStore
from tieredcore.policy import HOT_FIRST, S3_MIN_PART, TIERED_FIRST, OffloadPolicy, PolicyStore, StoreSpec

MIB = 1024 * 1024


@pytest.fixture
def ml(any_meta):
    return ManagedLedgerStore(any_meta)  # every policy test runs on SQLite and on ZooKeeper


@pytest.fixture
def ps(ml):
    return PolicyStore(ml)


# -- OffloadPolicy.validate -----------------------------------------------------------------------


def test_threshold_bytes_at_or_above_retention_size_is_refused_with_an_explanation():
    for threshold in (10 * MIB, 10 * MIB + 1, 50 * MIB):
        with pytest.raises(ValidationError) as e:
            OffloadPolicy(offload_threshold_bytes=threshold, retention_size_mb=10).validate("namespace t/n")
        msg = str(e.value)
        assert "namespace t/n" in msg and "retention size" in msg and str(10 * MIB) in msg
        assert "deleted before it is offloaded" in msg


def test_threshold_seconds_at_or_above_retention_time_is_refused():
    for threshold in (600, 601, 10_000):
        with pytest.raises(ValidationError, match=r"retention time 600 s \(10 min\)"):
            OffloadPolicy(offload_threshold_seconds=threshold, retention_time_minutes=10).validate()


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(offload_threshold_bytes=-1, offload_threshold_seconds=-1, retention_size_mb=1, retention_time_minutes=1),
        dict(offload_threshold_bytes=10 * MIB - 1, retention_size_mb=10),
        dict(offload_threshold_seconds=599, retention_time_minutes=10),
        dict(offload_threshold_bytes=0, offload_threshold_seconds=0, retention_size_mb=1, retention_time_minutes=1),
        # unlimited retention: any threshold
        dict(offload_threshold_bytes=10**15, offload_threshold_seconds=2**63 - 1),
        # disabled thresholds are not compared with retention, even retention 0
        dict(retention_size_mb=0, retention_time_minutes=0),
    ],
)
def test_thresholds_below_retention_or_disabled_are_fine(kwargs):
    pol = OffloadPolicy(**kwargs)
    assert pol.validate() is pol


@pytest.mark.parametrize("field", ["offload_threshold_bytes", "offload_threshold_seconds", "deletion_lag_ms",
                                   "retention_time_minutes", "retention_size_mb"])
@pytest.mark.parametrize("bad", [-2, "5", 1.5, True, None])
def test_numeric_fields_must_be_integers_of_at_least_minus_one(field, bad):
    with pytest.raises(ValidationError, match=field):
        OffloadPolicy(**{field: bad}).validate()


def test_s3_store_needs_5_mib_blocks():
    s3 = StoreSpec("aws-s3", bucket="my-bucket")
    with pytest.raises(ValidationError, match="S3 parts must be at least 5 MiB"):
        OffloadPolicy(store=s3, max_block_size=S3_MIN_PART - 1).validate()
    OffloadPolicy(store=s3, max_block_size=S3_MIN_PART).validate()
    # no store override: the workspace's default store decides
    with pytest.raises(ValidationError, match="5 MiB"):
        OffloadPolicy(max_block_size=1 * MIB).validate(default_store_is_s3=True)
    OffloadPolicy(max_block_size=1 * MIB).validate(default_store_is_s3=False)
    # a filesystem override on an S3 workspace may use small blocks
    OffloadPolicy(store=StoreSpec("filesystem", root="/x"), max_block_size=4096).validate(default_store_is_s3=True)
    with pytest.raises(ValidationError, match="below the minimum 1024"):
        OffloadPolicy(max_block_size=1023).validate()


def test_unknown_driver_is_refused_naming_the_known_ones():
    with pytest.raises(ValidationError, match=r"unknown offload driver 'gcs'.*filesystem, aws-s3"):
        OffloadPolicy(store=StoreSpec("gcs", bucket="abc")).validate()


BAD_BUCKETS = [
    ("ab", "too short"),
    ("a" * 64, "too long"),
    ("", "empty"),
    ("MyBucket", "uppercase"),
    ("my_bucket", "underscore"),
    ("192.168.1.10", "IP address"),
    ("-bucket", "leading dash"),
    ("bucket-", "trailing dash"),
    (".bucket", "leading dot"),
    ("my..bucket", "double dot"),
    ("my.-bucket", "dot dash"),
    ("my bucket", "space"),
]
GOOD_BUCKETS = ["abc", "my-bucket", "my.bucket.example", "a" * 63, "bucket-123", "1bucket", "192.168.1.10x"]


@pytest.mark.parametrize("name,why", BAD_BUCKETS, ids=[w for _, w in BAD_BUCKETS])
def test_bad_bucket_names(name, why):
    with pytest.raises(ValidationError, match="bad bucket name"):
        check_bucket_name(name)
    with pytest.raises(ValidationError, match="bad bucket name"):
        OffloadPolicy(store=StoreSpec("aws-s3", bucket=name)).validate()


@pytest.mark.parametrize("name", GOOD_BUCKETS)
def test_good_bucket_names(name):
    check_bucket_name(name)
    OffloadPolicy(store=StoreSpec("aws-s3", bucket=name)).validate()


@pytest.mark.parametrize("root", ["", "relative/dir", "./cold"])
def test_filesystem_store_needs_an_absolute_root(root):
    with pytest.raises(ValidationError, match="absolute root"):
        OffloadPolicy(store=StoreSpec("filesystem", root=root)).validate()
    OffloadPolicy(store=StoreSpec("filesystem", root="/abs/cold")).validate()


@pytest.mark.parametrize("prefix", ["/abs", "a/../b", ".."])
def test_store_prefix_must_be_relative_without_dotdot(prefix):
    with pytest.raises(ValidationError, match="prefix"):
        OffloadPolicy(store=StoreSpec("filesystem", root="/x", prefix=prefix)).validate()


def test_store_url_round_trip():
    from tieredcore.cold.location import StoreLocation

    # prefixes are normalised (the key prefix always ends with '/')
    assert StoreSpec("filesystem", root="/a/b", prefix="p").url() == "file:///a/b?prefix=p/"
    s3 = StoreSpec("aws-s3", bucket="bkt", prefix="x/", endpoint="http://h:1", region="r")
    assert s3.url() == "s3://bkt/x/?endpoint=http://h:1&region=r"
    for spec in (StoreSpec("filesystem", root="/a/b", prefix="p"), s3):
        loc = spec.location()
        assert StoreLocation.from_url(loc.url()) == loc
        assert StoreLocation.from_driver_metadata(loc.driver_metadata()).same_objects(loc)


def test_read_priority_validation():
    OffloadPolicy(read_priority=TIERED_FIRST).validate()
    OffloadPolicy(read_priority=HOT_FIRST).validate()
    with pytest.raises(ValidationError, match="read priority 'hot-first'"):
        OffloadPolicy(read_priority="hot-first").validate()


def test_read_buffer_must_be_positive():
    with pytest.raises(ValidationError, match="read buffer"):
        OffloadPolicy(read_buffer_size=0).validate()


def test_enabled_and_lag_properties():
    assert not OffloadPolicy().offload_enabled
    assert OffloadPolicy(offload_threshold_bytes=0).offload_enabled
    assert OffloadPolicy(offload_threshold_seconds=0).offload_enabled
    assert OffloadPolicy().deletion_lag == 4 * 3600 * 1000
    assert OffloadPolicy(deletion_lag_ms=-1).deletion_lag is None
    assert OffloadPolicy(deletion_lag_ms=0).deletion_lag == 0


# -- PolicyStore --------------------------------------------------------------------------------


def test_unknown_field_is_refused_naming_it(ps, ml):
    with pytest.raises(ValidationError, match="offload_treshold_bytes"):
        ps.set_namespace("t/n", {"offload_treshold_bytes": 5})
    with pytest.raises(ValidationError, match="colour"):
        ps.set_topic("t/n/x", {"colour": "red"})
    with pytest.raises(ValidationError, match="store needs 'driver'"):
        ps.set_namespace("t/n", {"store": {"root": "/x"}})
    with pytest.raises(ValidationError, match="store needs 'driver'"):
        ps.set_namespace("t/n", {"store": {"driver": "filesystem", "root": "/x", "colour": 1}})
    assert ml.get_policies("t/n") is None and ml.get_topic_policies("t/n/x") is None


def test_partial_updates_merge_and_replace_all_drops_earlier_fields(ps, ml):
    ps.set_namespace("t/n", {"offload_threshold_bytes": 1000})
    eff = ps.set_namespace("t/n", {"deletion_lag_ms": 60_000})
    assert eff.offload_threshold_bytes == 1000 and eff.deletion_lag_ms == 60_000
    assert ml.get_policies("t/n") == {"offload_threshold_bytes": 1000, "deletion_lag_ms": 60_000}
    assert ps.for_namespace("t/n") == eff

    eff = ps.set_namespace("t/n", {"retention_time_minutes": 60}, replace_all=True)
    assert ml.get_policies("t/n") == {"retention_time_minutes": 60}
    assert eff.offload_threshold_bytes == -1 and eff.deletion_lag_ms == OffloadPolicy().deletion_lag_ms

    # a store override is stored as given and resolved to a StoreSpec
    ps.set_namespace("t/n", {"store": {"driver": "filesystem", "root": "/cold2", "prefix": "p"}})
    assert ps.for_namespace("t/n").store == StoreSpec("filesystem", root="/cold2", prefix="p")
    assert ps.for_namespace("t/n").retention_time_minutes == 60
    # store None drops the override again
    ps.set_namespace("t/n", {"store": None})
    assert ps.for_namespace("t/n").store is None


def test_topic_over_namespace_over_defaults(ps):
    ps.set_namespace("t/n", {"offload_threshold_bytes": 1000, "deletion_lag_ms": 5})
    ps.set_topic("persistent://t/n/special", {"offload_threshold_bytes": 0, "read_priority": HOT_FIRST})
    special = ps.for_topic("t/n/special")
    other = ps.for_topic("t/n/other")
    assert special.offload_threshold_bytes == 0 and special.read_priority == HOT_FIRST
    assert special.deletion_lag_ms == 5  # from the namespace
    assert special.offload_threshold_seconds == -1  # default
    assert other.offload_threshold_bytes == 1000 and other.read_priority == TIERED_FIRST
    assert ps.for_topic("t/elsewhere/x") == OffloadPolicy()
    # topic updates merge too
    ps.set_topic("t/n/special", {"deletion_lag_ms": 7})
    assert ps.for_topic("t/n/special").offload_threshold_bytes == 0
    assert ps.for_topic("t/n/special").deletion_lag_ms == 7


def test_invalid_set_changes_nothing_stored(ps, ml):
    ps.set_namespace("t/n", {"offload_threshold_bytes": 1000, "retention_size_mb": 10})
    before = ml.get_policies("t/n")
    bad_updates = [
        {"offload_threshold_bytes": 10 * MIB},  # >= retention size once merged
        {"retention_size_mb": 0},  # makes the stored threshold invalid
        {"store": {"driver": "aws-s3", "bucket": "Bad_Bucket"}},
        {"store": {"driver": "aws-s3", "bucket": "good-bucket"}, "max_block_size": 1024 * 1024},
        {"read_priority": "nope"},
        {"deletion_lag_ms": -5},
        {"nonsense": 1},
    ]
    for upd in bad_updates:
        with pytest.raises(ValidationError):
            ps.set_namespace("t/n", upd)
        assert ml.get_policies("t/n") == before, upd
    # topic level: validated against the merged namespace policy
    with pytest.raises(ValidationError, match="retention size"):
        ps.set_topic("t/n/x", {"offload_threshold_bytes": 20 * MIB})
    assert ml.get_topic_policies("t/n/x") is None
    ps.set_topic("t/n/x", {"offload_threshold_bytes": 5})
    with pytest.raises(ValidationError):
        ps.set_topic("t/n/x", {"read_priority": "x"})
    assert ml.get_topic_policies("t/n/x") == {"offload_threshold_bytes": 5}


def test_default_store_is_s3_applies_to_stored_block_sizes(ml):
    ps = PolicyStore(ml, default_store_is_s3=True)
    with pytest.raises(ValidationError, match="5 MiB"):
        ps.set_namespace("t/n", {"max_block_size": 1 * MIB})
    assert ml.get_policies("t/n") is None
    ps.set_namespace("t/n", {"max_block_size": 8 * MIB})


def test_namespaces_with_offload(ps, ml):
    ps.set_namespace("t/on", {"offload_threshold_seconds": 3600})
    ps.set_namespace("t/off", {"offload_threshold_bytes": -1, "deletion_lag_ms": 1})
    ml.create_topic("t/topiconly/x")  # the namespace has topics but no policy record at all
    ml.create_topic("t/topiconly/z")
    ps.set_topic("t/topiconly/x", {"offload_threshold_bytes": 0})
    ps.set_namespace("t/topicoff", {"deletion_lag_ms": 1})
    ps.set_topic("t/topicoff/y", {"offload_threshold_bytes": -1})
    got = ps.namespaces_with_offload()
    assert "t/on" in got and "t/off" not in got and "t/topicoff" not in got
    assert "t/topiconly" in got, got
    # cluster defaults that enable offload enable every known namespace
    ps2 = PolicyStore(ml, defaults=OffloadPolicy(offload_threshold_bytes=0))
    assert ps2.namespaces_with_offload() == ["t/on", "t/topicoff", "t/topiconly"]  # t/off: -1 overrides
