"""Sizes and durations as users write them (CLI flags, Spark job arguments, DAG params, policies, store
URLs): one parser each, every result within a Java long (Pulsar's metadata, SQLite and JSON consumers)."""

from __future__ import annotations

import re

from tieredcore.errors import ValidationError
from tieredcore.model import INT64_MAX, int64_or_none

_DURATION = re.compile(r"^(-1|[0-9]+)(ms|s|m|h|d)?$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, None: 1}
_SIZE = re.compile(r"^(-1|[0-9]+)([KMG])?$", re.I)
_UNIT_B = {None: 1, "K": 1024, "M": 1024**2, "G": 1024**3}
_SECONDS = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(ms|s)?$")


def _scaled(digits: str, unit: int) -> int | None:
    """digits * unit, or None beyond 64 bits."""
    n = int64_or_none(digits)
    return None if n is None or n * unit > INT64_MAX else n * unit


def duration_ms(text: str) -> int:
    """'4h', '90m', '3600s', '500ms', plain ms, or -1 (disabled)."""
    m = _DURATION.match(text.strip())
    if not m:
        raise ValidationError(f"duration {text!r}: expected e.g. 4h, 90m, 3600s, 500ms or -1")
    if m[1] == "-1":
        return -1
    ms = _scaled(m[1], _UNIT_MS[m[2]])
    if ms is None:
        raise ValidationError(f"duration {text!r}: more than the 64-bit maximum of {INT64_MAX} ms")
    return ms


def non_negative_duration_ms(text: str, what: str) -> int:
    """A duration that must not be -1 (a grace period, a retry delay): ValidationError naming ``what``."""
    try:
        ms = duration_ms(str(text))
    except ValidationError as e:
        raise ValidationError(f"{what}: {e}") from None
    if ms < 0:
        raise ValidationError(f"{what} {text!r}: must not be negative")
    return ms


def size_bytes(text: str) -> int:
    """'1048576', '512K', '64M', '1G' (binary units) or -1 (disabled)."""
    m = _SIZE.match(text.strip())
    if not m:
        raise ValidationError(f"size {text!r}: expected bytes like 1048576, 512K, 64M, 1G or -1")
    if m[1] == "-1":
        return -1
    n = _scaled(m[1], _UNIT_B[(m[2] or "").upper() or None])
    if n is None:
        raise ValidationError(f"size {text!r}: more than the 64-bit maximum of {INT64_MAX} bytes")
    return n


def parse_keep_bytes(value: int | str, what: str = "--keep-bytes") -> int:
    """`topics offload -s`: a size >= 0, as an integer or text like 64M (CLI, Spark job, DAG param)."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValidationError(f"{what} {value!r}: expected a size like 0, 1048576, 512K, 64M or 1G")
    if isinstance(value, int):
        n = value
    else:
        try:
            n = size_bytes(value)
        except ValidationError as e:
            raise ValidationError(f"{what}: {e}") from None
    if n < 0 or n > INT64_MAX:
        raise ValidationError(f"{what} {value!r}: must be a size between 0 and {INT64_MAX} bytes")
    return n


def timeout_seconds(text: str, what: str) -> float:
    """Seconds from '5', '2.5', '5s' or '500ms' (client timeouts), from 1 ms to 1 h."""
    m = _SECONDS.match(text)
    value = (float(m[1]) / (1000 if m[2] == "ms" else 1)) if m else -1.0
    if not 0.001 <= value <= 3600.0:
        raise ValidationError(f"{what} must be a duration like 5, 2.5, 5s or 500ms, from 1ms to 1h; got {text!r}")
    return value
