"""Time: the logical clock that runs are given, and its parsing (one place for every entry point)."""

from __future__ import annotations

import datetime as dt
import re
import time

from tieredcore.errors import ValidationError
from tieredcore.model import INT64_MAX, int64_or_none


def now_ms() -> int:
    """Wall clock in ms: only for interactive commands; workflow runs get their logical time."""
    return int(time.time() * 1000)


def parse_time_ms(text: str, what: str = "time") -> int:
    """ISO 8601 (as Airflow renders dates; naive means UTC) or epoch milliseconds -> epoch ms, within
    the 64-bit range every consumer (Pulsar's longs, SQLite integers, Parquet) can hold."""
    if re.fullmatch(r"[0-9]{10,}", text):
        ms = int64_or_none(text)
        if ms is None:
            raise ValidationError(f"{what} {text!r}: epoch milliseconds above the 64-bit maximum {INT64_MAX}")
        return ms
    try:
        t = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as e:
        raise ValidationError(f"{what} {text!r}: expected ISO 8601 (e.g. 2026-01-01T00:00:00+00:00) "
                              "or epoch milliseconds") from e
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    return int(t.timestamp() * 1000)  # years 1..9999: always within 64 bits


def iso_ms(ms: int) -> str:
    """Epoch ms as ISO 8601 UTC to the second (for messages); '?' when out of range."""
    try:
        return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="seconds")
    except (OverflowError, OSError, ValueError):
        return "?"
