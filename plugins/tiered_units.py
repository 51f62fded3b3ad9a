"""How the plugin's pages write numbers for a reader: bytes in binary units (KiB, MiB, GiB), durations
as "3 h 12 min", counts with thousands separators, money, times in ISO 8601. The exact figure always
travels beside the human one (a cell's ``data-value``, a ``title``), so nothing is lost by rounding.

Pure functions (no Airflow, no FastAPI): the tests check them with hypothesis (monotonic, parse back
within the rounding shown)."""

from __future__ import annotations

import datetime as dt
import re

BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
# (name, milliseconds), largest first: a duration shows its two largest non-zero units
DURATION_UNITS = (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1000))
NONE = "—"


def human_bytes(n: int | float | None) -> str:
    """``1536`` -> ``1.5 KiB``: three significant digits at most ("512 B", "9.8 MiB", "120 GiB");
    '—' for None. Negative sizes keep their sign."""
    if n is None:
        return NONE
    sign, v = ("-" if n < 0 else ""), abs(float(n))
    if v < 1024:
        return f"{sign}{int(v)} B"
    unit = 0
    while v >= 1024 and unit < len(BYTE_UNITS) - 1:
        v /= 1024
        unit += 1
    text = f"{v:.1f}" if v < 100 else f"{v:.0f}"
    if float(text) >= 1024 and unit < len(BYTE_UNITS) - 1:  # 1023.96 KiB shows as 1.0 MiB
        unit += 1
        text = f"{v / 1024:.1f}"
    return f"{sign}{text} {BYTE_UNITS[unit]}"


_BYTES = re.compile(r"^(-?)([0-9]+(?:\.[0-9]+)?) (B|KiB|MiB|GiB|TiB|PiB|EiB)$")


def parse_bytes(text: str) -> float:
    """The inverse of :func:`human_bytes` (to its rounding): ``1.5 KiB`` -> 1536.0. ValueError otherwise."""
    m = _BYTES.match(text)
    if not m:
        raise ValueError(f"not a size: {text!r}")
    v = float(m.group(2)) * 1024 ** BYTE_UNITS.index(m.group(3))
    return -v if m.group(1) else v


def duration(ms: int | float | None) -> str:
    """A duration as its two largest units, truncated: ``11_520_000`` -> ``3 h 12 min``; ``42 s``;
    ``2 d 4 h``; under a second ``0 s``; '—' for None (nothing to measure)."""
    if ms is None:
        return NONE
    sign, left = ("-" if ms < 0 else ""), int(abs(ms))
    shown: list[str] = []
    for name, size in DURATION_UNITS:
        if left >= size or (shown and len(shown) < 2):
            q, left = divmod(left, size)
            if q or not shown:
                shown.append(f"{q} {name}")
            else:
                break  # "3 h" rather than "3 h 0 min"
        if len(shown) == 2:
            break
    return sign + (" ".join(shown) if shown else "0 s")


_DURATION_PART = re.compile(r"([0-9]+) (d|h|min|s)")


def parse_duration(text: str) -> int:
    """The inverse of :func:`duration` (to its truncation): ``3 h 12 min`` -> 11_520_000 ms."""
    sign = -1 if text.startswith("-") else 1
    parts = _DURATION_PART.findall(text.lstrip("-"))
    if not parts or " ".join(f"{q} {u}" for q, u in parts) != text.lstrip("-"):
        raise ValueError(f"not a duration: {text!r}")
    sizes = dict(DURATION_UNITS)
    return sign * sum(int(q) * sizes[u] for q, u in parts)


def count(n: int | float | None) -> str:
    """Counts exact, thousands separated (``12,345``; ``12.5`` for a mean); '—' for None."""
    if n is None:
        return NONE
    return f"{int(n):,}" if isinstance(n, int) or float(n).is_integer() else f"{n:,.1f}"


def money(x: float | None) -> str:
    """USD; cents for sums of a dollar or more, four places below (request costs are small)."""
    if x is None:
        return NONE
    return f"${x:,.2f}" if abs(x) >= 1 else f"${x:,.4f}"


def iso_time(ms: int | None) -> str:
    """Epoch ms as ``2026-01-01 00:00:00 UTC``; '—' for None or 0 (never recorded)."""
    if not ms:
        return NONE
    try:
        return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):
        return NONE


def ago(ms: int | None, now_ms: int) -> str:
    """``3 h 12 min ago`` for a time before ``now_ms``; '—' for none."""
    if not ms:
        return NONE
    return f"{duration(now_ms - ms)} ago" if now_ms >= ms else f"in {duration(ms - now_ms)}"
