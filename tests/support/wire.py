"""Protobuf wire format written by hand, and random damage to bytes (for the readers' differential tests)."""

from __future__ import annotations

from hypothesis import strategies as st


def varint(v: int) -> bytes:
    """``v`` (taken mod 2**64, as protobuf does for negative numbers) as a base-128 varint."""
    v %= 1 << 64
    out = bytearray()
    while True:
        b, v = v & 0x7F, v >> 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def tag(num: int, wt: int) -> bytes:
    return varint(num << 3 | wt)


def ld(num: int, data: bytes) -> bytes:
    """A length-delimited field."""
    return tag(num, 2) + varint(len(data)) + data


def vi(num: int, v: int) -> bytes:
    """A varint field."""
    return tag(num, 0) + varint(v)


def damage(raw: bytearray, data: st.DataObject, most: int = 4) -> None:
    """1..most random changes in place: a bit flipped, a byte set, the tail cut, bytes inserted."""
    for _ in range(data.draw(st.integers(1, most))):
        how = data.draw(st.sampled_from(["flip", "set", "cut", "insert"]))
        at = data.draw(st.integers(0, max(len(raw) - 1, 0)))
        if how == "flip" and raw:
            raw[at] ^= 1 << data.draw(st.integers(0, 7))
        elif how == "set" and raw:
            raw[at] = data.draw(st.integers(0, 255))
        elif how == "cut":
            del raw[at:]
        else:
            raw[at:at] = data.draw(st.binary(min_size=1, max_size=4))
