"""Small value types shared by every layer."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol, runtime_checkable

# Pulsar / BookKeeper ids, sizes and times are Java longs: anything larger cannot be stored or compared
INT64_MAX = 2**63 - 1
_POSITION = re.compile(r"([0-9]+)(?::([0-9]+))?")


def int64_or_none(digits: str) -> int | None:
    """Value of an ASCII digit string, or None when above INT64_MAX (decided on the text first, so a
    huge argument never reaches int()'s own digit limit)."""
    digits = digits.lstrip("0") or "0"
    if len(digits) > len(str(INT64_MAX)):
        return None
    n = int(digits)
    return n if n <= INT64_MAX else None


class Entry(NamedTuple):
    entry_id: int
    data: bytes


class Position(NamedTuple):
    ledger_id: int
    entry_id: int

    def __str__(self) -> str:
        return f"{self.ledger_id}:{self.entry_id}"

    @classmethod
    def parse(cls, text: str, what: str = "position", require_entry: bool = False) -> Position:
        """'LEDGER:ENTRY', or 'LEDGER' (entry 0) unless `require_entry`: for an offload bound a bare
        ledger id reads as "up to and including that ledger", which is not what it means."""
        from tieredcore.errors import ValidationError

        form = "LEDGER:ENTRY, e.g. 12:0" if require_entry else "LEDGER:ENTRY (or LEDGER), e.g. 12:0"
        m = _POSITION.fullmatch(text.strip())
        if m is None or (require_entry and m[2] is None):
            raise ValidationError(f"{what} {text!r}: expected {form}; ledger and entry ids are not negative")
        lid, eid = int64_or_none(m[1]), int64_or_none(m[2] or "0")
        if lid is None or eid is None:
            raise ValidationError(f"{what} {text!r}: ledger and entry ids are 64-bit (at most {INT64_MAX})")
        return cls(lid, eid)


# BookKeeper LedgerMetadataFormat.State values (docs/metadata.md)
STATE_OPEN = 1
STATE_IN_RECOVERY = 2
STATE_CLOSED = 3


@dataclass(frozen=True)
class LedgerMetadata:
    """What a tier knows about one ledger; mirrors BookKeeper's LedgerMetadataFormat."""

    ledger_id: int
    state: int  # STATE_OPEN / STATE_CLOSED
    last_entry_id: int  # -1 when empty
    length: int  # sum of payload sizes
    ctime: int = 0  # ms
    custom_metadata: dict[str, bytes] = field(default_factory=dict)

    @property
    def is_closed(self) -> bool:
        return self.state == STATE_CLOSED

    @property
    def entries(self) -> int:
        return self.last_entry_id + 1


class LedgerView(Protocol):
    """What any handle of a ledger tells: its id, last entry, payload bytes."""

    @property
    def ledger_id(self) -> int: ...

    @property
    def last_add_confirmed(self) -> int: ...

    @property
    def length(self) -> int: ...


@runtime_checkable
class ReadHandle(LedgerView, Protocol):
    """Read side of a ledger, whichever tier it lives in."""

    @property
    def is_closed(self) -> bool: ...

    @property
    def metadata(self) -> LedgerMetadata:
        """The tier's metadata of the ledger (its custom metadata names the owning topic)."""
        ...

    def read(self, first: int, last: int) -> list[Entry]:
        """Entries first..last inclusive; BadRangeError outside 0..LAC."""
        ...

    def close(self) -> None: ...
