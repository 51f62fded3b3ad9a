"""What a compaction run is given as text (docs/compaction.md): threshold overrides and prices. One parser
each, used by `tiered compact`, spark_jobs/compact_segments.py and the tiered_compaction DAG, so the three
accept the same values and refuse the same ones with a message naming the flag (or param)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from tieredcore.errors import ValidationError
from tieredcore.lifecycle.compaction import CostModel
from tieredcore.lifecycle.compaction_run import Thresholds, check_prices
from tieredcore.units import non_negative_duration_ms, size_bytes

# what the thresholds are called on a command line (the CLI's and the Spark job's flags)
THRESHOLD_FLAGS = ("--min-object-size", "--target-size", "--delete-delay")


def positive_size(text: str, what: str) -> int:
    """A size of at least one byte (``8M``, ``256M``, ``1048576``): ValidationError naming ``what``."""
    try:
        n = size_bytes(text)
    except ValidationError as e:
        raise ValidationError(f"{what}: {e}") from None
    if n < 1:
        raise ValidationError(f"{what} {text!r}: must be a positive size like 8M or 256M")
    return n


def parse_thresholds(min_object_size: str | None, target_size: str | None, delete_delay: str | None,
                     names: tuple[str, str, str] = THRESHOLD_FLAGS) -> Thresholds:
    """A run's overrides of the policy thresholds (None: each topic's policy). ``names``: what the three
    are called where they were given (flags, or a DAG's params), for the messages. A min object size
    above the target size is refused here; against each topic's policy by :meth:`Thresholds.apply`."""
    low = None if min_object_size is None else positive_size(min_object_size, names[0])
    high = None if target_size is None else positive_size(target_size, names[1])
    delay = None if delete_delay is None else non_negative_duration_ms(delete_delay, names[2])
    if low is not None and high is not None and low > high:
        raise ValidationError(f"{names[0]} {min_object_size} exceeds {names[1]} {target_size} (compaction min object "
                              f"size {low} exceeds the target size {high}: objects would be rewritten into objects "
                              "no larger)")
    return Thresholds(low, high, delay)


@dataclass(frozen=True)
class PriceOption:
    """A price (or the listing rate) of the cost estimate as a flag: which CostModel field it sets."""

    flag: str
    field: str
    integer: bool  # listings a month are counted; prices are numbers
    what: str

    @property
    def default(self) -> float | int:
        return _DEFAULTS[self.field]

    @property
    def help(self) -> str:
        return f"{self.what} (default {self.default}: S3 Standard)"


_DEFAULTS: dict[str, float | int] = asdict(CostModel())
PRICE_OPTIONS = (
    PriceOption("--price-gb-month", "gb_month", False, "storage price per GB-month"),
    PriceOption("--price-put-1k", "put_per_1000", False, "price per 1,000 PUT/LIST requests"),
    PriceOption("--price-get-1k", "get_per_1000", False, "price per 1,000 GET requests"),
    PriceOption("--listings-per-month", "listings_per_month", True,
                "full listings of the store a month (orphan reconciliation)"),
)


def _price(text: str, opt: PriceOption) -> float | int:
    try:
        v: float | int = int(text.strip()) if opt.integer else float(text.strip())
    except ValueError:
        raise ValidationError(f"{opt.flag} {text!r}: expected {'an integer' if opt.integer else 'a number'} "
                              ">= 0") from None
    if not math.isfinite(v):
        raise ValidationError(f"{opt.flag} {text!r}: price {opt.field} must be a finite number >= 0")
    if v < 0:
        raise ValidationError(f"{opt.flag} {text!r}: price {opt.field} must be a non-negative number (>= 0)")
    return v


def parse_prices(given: Mapping[str, str | None]) -> CostModel:
    """The cost model from the prices given as text, keyed by CostModel field (:data:`PRICE_OPTIONS`);
    a price not given (None, or absent) keeps its default (S3 Standard's)."""
    values = {o.field: o.default if given.get(o.field) is None else _price(str(given[o.field]), o)
              for o in PRICE_OPTIONS}
    return check_prices(values)
