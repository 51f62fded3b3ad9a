"""The one parser of compaction thresholds and the one of prices (tieredcore.lifecycle.compaction_settings),
shared by `tiered compact`, the Spark job and the DAG: what they accept, and what they refuse with a
message naming the flag or param."""

from __future__ import annotations

import pytest

from tieredcore.errors import ValidationError
from tieredcore.lifecycle.compaction import CostModel
from tieredcore.lifecycle.compaction_run import Thresholds
from tieredcore.lifecycle.compaction_settings import PRICE_OPTIONS, parse_prices, parse_thresholds
from tieredcore.policy import OffloadPolicy

MiB = 1024**2


@pytest.mark.parametrize("given, expected", [
    ((None, None, None), Thresholds()),
    (("8M", "256M", "1h"), Thresholds(8 * MiB, 256 * MiB, 3_600_000)),
    ((" 512k ", None, "0"), Thresholds(512 * 1024, None, 0)),
    ((None, "1048576", "90m"), Thresholds(None, MiB, 90 * 60_000)),
    (("4M", "4M", "500ms"), Thresholds(4 * MiB, 4 * MiB, 500)),  # equal is fine: nothing grows
])
def test_thresholds_accepted(given, expected):
    assert parse_thresholds(*given) == expected


@pytest.mark.parametrize("given, fragments", [
    (("0", None, None), ["--min-object-size '0'", "positive size"]),
    (("-1", None, None), ["--min-object-size '-1'", "positive size"]),
    ((None, "big", None), ["--target-size: size 'big'"]),
    ((None, "256T", None), ["--target-size: size '256T'"]),
    (("64M", "8M", None), ["--min-object-size 64M exceeds --target-size 8M", "exceeds the target size"]),
    ((None, None, "-1"), ["--delete-delay '-1': must not be negative"]),
    ((None, None, "soon"), ["--delete-delay: duration 'soon'"]),
])
def test_thresholds_refused_naming_the_flag(given, fragments):
    with pytest.raises(ValidationError) as e:
        parse_thresholds(*given)
    for f in fragments:
        assert f in str(e.value)


def test_thresholds_name_what_the_caller_calls_them():
    """The DAG gives its params' names: the messages name the param, not a flag."""
    names = ("min_object_size param", "target_size param", "delete_delay param")
    with pytest.raises(ValidationError, match="^min_object_size param: size '8 MB'"):
        parse_thresholds("8 MB", None, None, names=names)
    with pytest.raises(ValidationError, match="^min_object_size param 64M exceeds target_size param 1M"):
        parse_thresholds("64M", "1M", None, names=names)
    with pytest.raises(ValidationError, match="^delete_delay param: duration '1y'"):
        parse_thresholds(None, None, "1y", names=names)


def test_thresholds_still_meet_each_policy():
    """A min object size alone is not compared with anything here; against a topic's policy it is."""
    th = parse_thresholds("512M", None, None)
    with pytest.raises(ValidationError, match="topic t: compaction min object size 536870912 exceeds the target"):
        th.apply(OffloadPolicy(), "topic t")
    assert th.apply(OffloadPolicy(compaction_target_size=1024 * MiB), "t").compaction_min_object_size == 512 * MiB


def test_prices_default_to_s3_standard_and_parse_what_is_given():
    assert parse_prices({}) == CostModel()
    assert parse_prices({o.field: None for o in PRICE_OPTIONS}) == CostModel()
    cost = parse_prices({"gb_month": "0.01", "put_per_1000": " 5 ", "get_per_1000": "0",
                         "listings_per_month": "4", "unrelated": "x"})
    assert cost == CostModel(gb_month=0.01, put_per_1000=5.0, get_per_1000=0.0, listings_per_month=4)
    assert isinstance(cost.listings_per_month, int)
    assert [o.flag for o in PRICE_OPTIONS] == ["--price-gb-month", "--price-put-1k", "--price-get-1k",
                                               "--listings-per-month"]
    assert all(str(o.default) in o.help for o in PRICE_OPTIONS)


@pytest.mark.parametrize("field, text, fragments", [
    ("gb_month", "-0.5", ["--price-gb-month '-0.5'", "price gb_month must be a non-negative number", ">= 0"]),
    ("put_per_1000", "nan", ["--price-put-1k 'nan'", "must be a finite number"]),
    ("get_per_1000", "inf", ["--price-get-1k 'inf'", "price get_per_1000 must be a finite number"]),
    ("get_per_1000", "free", ["--price-get-1k 'free'", "expected a number >= 0"]),
    ("listings_per_month", "1.5", ["--listings-per-month '1.5'", "expected an integer >= 0"]),
    ("listings_per_month", "-3", ["--listings-per-month '-3'", "non-negative"]),
])
def test_prices_refused_naming_the_flag(field, text, fragments):
    with pytest.raises(ValidationError) as e:
        parse_prices({field: text})
    for f in fragments:
        assert f in str(e.value)
