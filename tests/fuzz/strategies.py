"""Shared pieces of the decoder fuzz tests: byte mutations of valid encodings and the contract check.

Every decoder that reads bytes from outside must, for any input, return normally or raise a
:class:`~tieredcore.errors.TieredError`; anything else (IndexError, struct.error, RecursionError,
MemoryError, a codec's own exception, ...) is a bug. Random bytes rarely get past a magic word, so each
decoder is also fed mutations of a valid encoding: byte flips, inserts, deletes, truncations, extensions
and integer fields overwritten with extreme values (big-endian, as every format here is).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from tieredcore.errors import TieredError

T = TypeVar("T")

#: TIERED_FUZZ_SCALE=10 runs ten times as many examples (a deeper search than the test suite's)
_SCALE = max(1, int(os.environ.get("TIERED_FUZZ_SCALE", "1")))
#: per-decoder hypothesis settings: enough examples to get past the magic checks, a finite deadline so a
#: decoder gone quadratic fails the test (generous: machines are shared; a real hang is cut by the
#: modules' pytest timeout), no health check on slow data generation
FUZZ = settings(
    max_examples=300 * _SCALE,
    deadline=2000,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
#: the same for tests that touch files (stores, offloads): fewer, slower examples
FUZZ_IO = settings(
    max_examples=200 * _SCALE,
    deadline=4000,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)

#: a decoder that loops forever fails its test after this many seconds (pytest-timeout)
HANG_TIMEOUT = 120 * _SCALE

#: values a corrupted or forged length / count / id field is likely to hold
EXTREMES = (
    0, 1, -1, 2, 127, 128, 255, 0x7FFF, 0xFFFF, 2**31 - 1, -(2**31), 2**32 - 1,
    2**63 - 1, -(2**63), 2**64 - 1, 64 * 1024 * 1024, 128, 140,
)  # fmt: skip

_WIDTHS = {1: "B", 2: "H", 4: "I", 8: "Q"}


def _pack_extreme(value: int, width: int) -> bytes:
    """``value`` as a big-endian field of ``width`` bytes, two's complement when negative."""
    return struct.pack(">" + _WIDTHS[width], value % (1 << (8 * width)))


def _position(last: int) -> st.SearchStrategy[int]:
    """An offset in ``0..last``: hypothesis favours small integers (the magic word, the header); a uniform
    pick as well spreads damage over the whole structure."""
    return st.integers(0, last) | st.sampled_from(range(last + 1))


@st.composite
def mutated(
    draw: st.DrawFn,
    base: bytes,
    fields: Sequence[tuple[int, int]] = (),
    max_ops: int = 4,
    keep_length: bool = False,
) -> bytes:
    """``base`` after 1..max_ops random mutations. ``fields`` are ``(offset, width)`` of integer fields
    of the format (length, count, id fields); extreme values are written there as well as anywhere.
    ``keep_length``: only mutations that overwrite bytes."""
    buf = bytearray(base)
    ops = ("flip", "set", "int", "field") if keep_length else (
        "flip", "set", "insert", "delete", "truncate", "extend", "int", "field")
    for _ in range(draw(st.integers(1, max_ops))):
        op = draw(st.sampled_from(ops))
        n = len(buf)
        if op == "flip" and n:
            i = draw(_position(n - 1))
            buf[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "set" and n:
            i = draw(_position(n - 1))
            buf[i] = draw(st.integers(0, 255))
        elif op == "insert":
            i = draw(_position(n))
            buf[i:i] = draw(st.binary(min_size=1, max_size=32))
        elif op == "delete" and n:
            i = draw(_position(n - 1))
            del buf[i : i + draw(st.integers(1, 32))]
        elif op == "truncate":
            del buf[draw(_position(n)) :]
        elif op == "extend":
            buf += draw(st.binary(min_size=1, max_size=64))
        elif op in ("int", "field"):
            if op == "field" and fields:
                pos, width = draw(st.sampled_from(list(fields)))
            else:
                width = draw(st.sampled_from((1, 2, 4, 8)))
                pos = draw(_position(max(n - width, 0)))
            value = draw(st.sampled_from(EXTREMES) | st.integers(-(2**63), 2**64 - 1))
            buf[pos : pos + width] = _pack_extreme(value, width)[: len(buf) - pos if keep_length else width]
    return bytes(buf)


def fuzz_input(base: bytes, fields: Sequence[tuple[int, int]] = (), max_size: int = 512) -> st.SearchStrategy[bytes]:
    """Random bytes or a mutation of ``base`` (the two strategies every decoder is fuzzed with)."""
    return st.one_of(st.binary(max_size=max_size), mutated(base, fields))


def outcome(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T | TieredError:
    """``fn(*args)``'s result, or the project error it raised; any other exception fails the test
    (pytest reports it with its traceback)."""
    try:
        return fn(*args, **kwargs)
    except TieredError as e:
        return e
