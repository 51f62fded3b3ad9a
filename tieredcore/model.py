"""Small value types shared by every layer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Protocol, runtime_checkable


class Entry(NamedTuple):
    entry_id: int
    data: bytes


class Position(NamedTuple):
    ledger_id: int
    entry_id: int

    def __str__(self) -> str:
        return f"{self.ledger_id}:{self.entry_id}"

    @classmethod
    def parse(cls, text: str, what: str = "position") -> Position:
        """'LEDGER:ENTRY' or 'LEDGER' (entry 0)."""
        from tieredcore.errors import ValidationError

        lid, sep, eid = text.partition(":")
        try:
            pos = cls(int(lid), int(eid) if sep else 0)
        except ValueError:
            raise ValidationError(f"{what} {text!r}: expected LEDGER:ENTRY, e.g. 12:0") from None
        if pos.ledger_id < 0 or pos.entry_id < 0:
            raise ValidationError(f"{what} {text!r}: ledger and entry ids are not negative")
        return pos


# BookKeeper LedgerMetadataFormat.State values (spec/02)
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


@runtime_checkable
class ReadHandle(Protocol):
    """Read side of a ledger, whichever tier it lives in."""

    @property
    def ledger_id(self) -> int: ...

    @property
    def last_add_confirmed(self) -> int: ...

    @property
    def length(self) -> int: ...

    @property
    def is_closed(self) -> bool: ...

    def read(self, first: int, last: int) -> list[Entry]:
        """Entries first..last inclusive; BadRangeError outside 0..LAC."""
        ...

    def close(self) -> None: ...
