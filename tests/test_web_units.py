"""How the view writes numbers (plugins/tiered_units.py) and pages lists (plugins/tiered_pages.Pager):
sizes and durations read back within the rounding they show, never out of order, and pages that cover
a list exactly once."""

from __future__ import annotations

import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"
if str(PLUGINS) not in sys.path:
    sys.path.append(str(PLUGINS))

from tiered_pages import Pager  # noqa: E402
from tiered_units import count, duration, human_bytes, iso_time, money, parse_bytes, parse_duration  # noqa: E402

SIZES = st.integers(min_value=0, max_value=2**62)
MS = st.integers(min_value=0, max_value=10**12)


def test_examples() -> None:
    assert [human_bytes(n) for n in (None, 0, 1023, 1024, 1536, 10**6, 1048575, 120 * 2**30)] == [
        "—", "0 B", "1023 B", "1.0 KiB", "1.5 KiB", "977 KiB", "1.0 MiB", "120 GiB"]
    assert [duration(ms) for ms in (None, 0, 999, 42_000, 60_000, 61_000, 11_520_000, 10_800_000, 187_200_005)] == [
        "—", "0 s", "0 s", "42 s", "1 min", "1 min 1 s", "3 h 12 min", "3 h", "2 d 4 h"]
    assert [count(None), count(1234567), count(2.5), money(0.0123), money(12.5)] == [
        "—", "1,234,567", "2.5", "$0.0123", "$12.50"]
    assert iso_time(1767225600000) == "2026-01-01 00:00:00 UTC" and iso_time(0) == "—"


@given(SIZES)
def test_a_size_reads_back_within_its_rounding(n: int) -> None:
    """Three significant digits: what is shown is within 5 % (or exact under 1 KiB)."""
    back = parse_bytes(human_bytes(n))
    assert back == n if n < 1024 else abs(back - n) <= 0.05 * n


@given(SIZES, SIZES)
def test_sizes_keep_their_order(a: int, b: int) -> None:
    lo, hi = sorted((a, b))
    assert parse_bytes(human_bytes(lo)) <= parse_bytes(human_bytes(hi))


@given(MS)
def test_a_duration_reads_back_truncated(ms: int) -> None:
    """The two largest units, truncated: never more than what passed, and short by less than the unit
    below the largest one shown ("3 h 12 min" and "3 h" by under a minute, "2 d 4 h" by under an hour)."""
    text = duration(ms)
    back = parse_duration(text)
    below = {"d": 3_600_000, "h": 60_000, "min": 1000, "s": 1000}[text.split(" ")[1]]
    assert back <= ms < back + below


@given(MS, MS)
def test_durations_keep_their_order(a: int, b: int) -> None:
    lo, hi = sorted((a, b))
    assert parse_duration(duration(lo)) <= parse_duration(duration(hi))


@given(st.integers(min_value=0, max_value=5000), st.integers(min_value=1, max_value=200))
def test_pages_cover_a_list_once(total: int, size: int) -> None:
    items = list(range(total))
    pages = [Pager.of(total, n, size) for n in range(1, Pager.of(total, 1, size).pages + 1)]
    assert [x for p in pages for x in p.slice(items)] == items
    assert all(len(p.slice(items)) <= size for p in pages)
    assert Pager.of(total, 10**6, size).page == pages[-1].page and Pager.of(total, -3, size).page == 1


def test_a_page_link_keeps_the_other_lists_pages() -> None:
    p = Pager.of(500, 2, 50, param="runs_page")
    assert p.href(3, {"ns_page": "4", "runs_page": "2", "at": "2026-01-01T00:00:00Z"}) == (
        "?ns_page=4&at=2026-01-01T00%3A00%3A00Z&runs_page=3")
