"""One parser for logical times and positions, shared by the CLI and the Spark jobs."""

from __future__ import annotations

import pytest

from tieredcore.clock import parse_time_ms
from tieredcore.errors import ValidationError
from tieredcore.model import Position


@pytest.mark.parametrize(
    "text, ms",
    [
        ("2026-01-01T00:00:00Z", 1767225600000),
        ("2026-01-01T01:00:00+01:00", 1767225600000),
        ("2026-01-01T00:00:00", 1767225600000),  # naive = UTC
        ("2026-01-01T00:00:00.250000+00:00", 1767225600250),
        ("1767225600000", 1767225600000),
    ],
)
def test_parse_time_ms(text, ms):
    assert parse_time_ms(text) == ms


@pytest.mark.parametrize("text", ["yesterday", "2026-13-01", "", "12345"])
def test_parse_time_ms_rejects(text):
    with pytest.raises(ValidationError, match="--as-of"):
        parse_time_ms(text, "--as-of")


@pytest.mark.parametrize("text, pos", [("12:3", Position(12, 3)), ("12", Position(12, 0)), ("0:0", Position(0, 0))])
def test_position_parse(text, pos):
    assert Position.parse(text) == pos
    assert str(pos) == f"{pos.ledger_id}:{pos.entry_id}"


@pytest.mark.parametrize("text", ["x", "1:y", "", ":", "-1:0", "1:-2", "1:2:3"])
def test_position_parse_rejects(text):
    with pytest.raises(ValidationError, match="--up-to"):
        Position.parse(text, "--up-to")
