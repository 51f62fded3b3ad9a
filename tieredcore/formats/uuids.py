"""UUID <-> Java (mostSigBits, leastSigBits) as stored in OffloadContext.uidMsb / uidLsb (docs/metadata.md)."""

from __future__ import annotations

import uuid

from tieredcore.errors import ValidationError

_MASK64 = (1 << 64) - 1
_SIGN64 = 1 << 63


def _to_signed(v: int) -> int:
    return v - (1 << 64) if v & _SIGN64 else v


def uuid_to_msb_lsb(u: uuid.UUID) -> tuple[int, int]:
    """Java's ``getMostSignificantBits()`` / ``getLeastSignificantBits()`` (signed int64 each)."""
    n = u.int
    return _to_signed(n >> 64), _to_signed(n & _MASK64)


def msb_lsb_to_uuid(msb: int, lsb: int) -> uuid.UUID:
    """Inverse of :func:`uuid_to_msb_lsb`; accepts signed or unsigned 64-bit halves."""
    for name, v in (("msb", msb), ("lsb", lsb)):
        if not -(1 << 63) <= v < (1 << 64):
            raise ValidationError(f"uuid {name} {v} is not a 64-bit value")
    return uuid.UUID(int=((msb & _MASK64) << 64) | (lsb & _MASK64))
