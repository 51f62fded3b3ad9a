"""Small value types shared by every layer."""

from __future__ import annotations

import array
import itertools
import operator
import re
from collections.abc import Sequence
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


Buffer = bytes | bytearray | memoryview


@dataclass(frozen=True)
class FileSlice:
    """`length` bytes at `offset` of a local file. A part given as pieces may contain these: a store
    with ``copies_file_slices`` copies them in the kernel (copy_file_range) without the bytes passing
    through Python; any other store reads them."""

    path: str
    offset: int
    length: int


class Entry(NamedTuple):
    entry_id: int
    data: bytes


@dataclass(frozen=True, eq=False)
class EntryBatch:
    """Entries ``first_entry..`` of one ledger as one buffer and two arrays, for readers that go through
    many entries (catch-up reads, verification, compaction): no object per entry.

    Entry ``first_entry + i``'s payload is ``buf[starts[i] : starts[i] + lengths[i]]``, and
    ``buf[frames_start:frames_end]`` holds exactly the batch's frames (``[len][entryId][payload]``) back to
    back, so a CRC32C of the whole frame run is one call.
    """

    ledger_id: int
    first_entry: int
    buf: bytes | bytearray | memoryview
    starts: Sequence[int]
    lengths: Sequence[int]
    frames_start: int
    frames_end: int

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def last_entry(self) -> int:
        return self.first_entry + len(self.lengths) - 1

    @property
    def payload_bytes(self) -> int:
        return sum(self.lengths)

    def frames(self) -> memoryview:
        """The batch's frames, contiguous (a view of ``buf``)."""
        return memoryview(self.buf)[self.frames_start : self.frames_end]

    def payload(self, i: int) -> bytes:
        s = self.starts[i]
        return bytes(self.buf[s : s + self.lengths[i]])

    def payloads(self) -> list[bytes]:
        """Every payload as bytes (one slice per entry, in C)."""
        b, st = self.buf, self.starts
        if not isinstance(b, bytes):
            b = bytes(b)
        return list(map(b.__getitem__, map(slice, st, map(operator.add, st, self.lengths))))

    @staticmethod
    def concat(batches: Sequence[EntryBatch]) -> EntryBatch:
        """Consecutive batches of one ledger as one (their frames joined, offsets moved in C)."""
        if len(batches) == 1:
            return batches[0]
        starts: array.array = array.array("q")
        lengths: array.array = array.array("i")
        pieces, at = [], 0
        for b in batches:
            shift = at - b.frames_start
            starts.extend(map(operator.add, b.starts, itertools.repeat(shift)))
            lengths.extend(b.lengths)
            pieces.append(b.frames())
            at += b.frames_end - b.frames_start
        joined = b"".join(pieces)
        return EntryBatch(batches[0].ledger_id, batches[0].first_entry, joined, starts, lengths, 0, len(joined))

    def entries(self) -> list[Entry]:
        """The per-entry form (what ReadHandle.read returns)."""
        return list(map(Entry, range(self.first_entry, self.first_entry + len(self.lengths)), self.payloads()))


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

    def read_batch(self, first: int, last: int) -> EntryBatch:
        """The same entries as one EntryBatch (checked the same way): for readers of many entries."""
        ...

    def close(self) -> None: ...
