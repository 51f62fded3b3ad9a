"""The shared parsers of operator input (positions, times, sizes, durations, keep-bytes): every value a
Java long cannot hold is refused with a message naming the flag and the value, never a traceback."""

from __future__ import annotations

import pytest

from tieredcore.clock import parse_time_ms
from tieredcore.errors import ValidationError
from tieredcore.model import INT64_MAX, Position
from tieredcore.units import duration_ms, parse_keep_bytes, size_bytes

TOO_BIG = str(INT64_MAX + 1)
HUGE = "9" * 5000  # beyond int()'s own 4300-digit limit: must still be a ValidationError


# --- positions -------------------------------------------------------------------------------


def test_position_at_the_64_bit_limit():
    assert Position.parse(f"{INT64_MAX}:{INT64_MAX}") == Position(INT64_MAX, INT64_MAX)
    assert Position.parse("007:01") == Position(7, 1)


@pytest.mark.parametrize("text", [f"{TOO_BIG}:0", f"0:{TOO_BIG}", TOO_BIG, f"{HUGE}:0", f"1:{HUGE}"])
def test_position_beyond_64_bits(text):
    with pytest.raises(ValidationError, match="--to .*64-bit"):
        Position.parse(text, "--to")


@pytest.mark.parametrize("text", ["+1:0", "1:+0", "1_0:0", "١:0", " : ", "0x10:0"])
def test_position_only_ascii_digits(text):
    with pytest.raises(ValidationError, match="--from .*LEDGER:ENTRY"):
        Position.parse(text, "--from")


def test_position_entry_part_required_for_offload_bounds():
    assert Position.parse("2") == Position(2, 0)  # a read start may name a ledger
    with pytest.raises(ValidationError, match=r"--up-to '2': expected LEDGER:ENTRY"):
        Position.parse("2", "--up-to", require_entry=True)
    assert Position.parse("2:0", "--up-to", require_entry=True) == Position(2, 0)


# --- times -----------------------------------------------------------------------------------


def test_time_at_the_64_bit_limit():
    assert parse_time_ms(str(INT64_MAX), "--as-of") == INT64_MAX
    assert parse_time_ms("9999-12-31T23:59:59.999Z") == 253402300799999  # the ISO form's maximum


@pytest.mark.parametrize("text", [TOO_BIG, "99999999999999999999", HUGE])
def test_epoch_ms_beyond_64_bits(text):
    with pytest.raises(ValidationError, match="--as-of .*64-bit"):
        parse_time_ms(text, "--as-of")


@pytest.mark.parametrize("text", ["10000-01-01T00:00:00Z", "+275760-09-13T00:00:00Z", "١٧٦٧٢٢٥٦٠٠٠٠٠"])
def test_iso_time_out_of_range_or_not_ascii(text):
    with pytest.raises(ValidationError, match="--as-of"):
        parse_time_ms(text, "--as-of")


# --- sizes and durations ---------------------------------------------------------------------


@pytest.mark.parametrize("text, n", [(str(INT64_MAX), INT64_MAX), (f"{INT64_MAX // 2**30}G", INT64_MAX // 2**30 * 2**30),
                                     ("0", 0), ("-1", -1)])
def test_size_up_to_64_bits(text, n):
    assert size_bytes(text) == n


@pytest.mark.parametrize("text", [TOO_BIG, f"{INT64_MAX // 2**30 + 1}G", f"{2**54}K", HUGE, HUGE + "M"])
def test_size_beyond_64_bits(text):
    with pytest.raises(ValidationError, match="size .*64-bit"):
        size_bytes(text)


@pytest.mark.parametrize("text", [TOO_BIG, f"{INT64_MAX // 86_400_000 + 1}d", f"{INT64_MAX}s", HUGE + "ms"])
def test_duration_beyond_64_bits(text):
    with pytest.raises(ValidationError, match="duration .*64-bit"):
        duration_ms(text)


def test_duration_at_the_64_bit_limit():
    assert duration_ms(str(INT64_MAX)) == INT64_MAX
    assert duration_ms(f"{INT64_MAX // 1000}s") == INT64_MAX // 1000 * 1000


# --- keep-bytes (CLI, Spark job, DAG param) --------------------------------------------------


@pytest.mark.parametrize("value, n", [(0, 0), ("0", 0), ("64M", 64 * 2**20), ("512k", 512 * 1024),
                                      (" 1G ", 2**30), (12345, 12345), (INT64_MAX, INT64_MAX)])
def test_keep_bytes_accepts_integers_and_sizes(value, n):
    assert parse_keep_bytes(value) == n


@pytest.mark.parametrize("value", [-1, "-1", "-5", "64Q", "1.5M", "", INT64_MAX + 1, TOO_BIG, True, None, 1.0])
def test_keep_bytes_rejects(value):
    with pytest.raises(ValidationError, match="keep_bytes"):
        parse_keep_bytes(value, "keep_bytes")
