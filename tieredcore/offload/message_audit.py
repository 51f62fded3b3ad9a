"""The Pulsar messages inside one ledger's offloaded copy, checked during verify.py's single read of it
(spec/07; docs/formats.md "Messages inside entries").

Each entry's CRC32C (``0x0e01`` magic, checksum over metadata size, metadata and payload) is checked
where the walk already holds the entry's bytes, a stream window at a time: no second read, memory
bounded by the window (plus at most :data:`MAX_LISTED` named positions). Counts are per entry: one
CRC32C covers a whole batch.

**The ledger decides whether its entries are messages.** A Pulsar cluster's entries always are; a
workspace may also hold opaque entries (``tiered generate --raw``, other writers). Opaque bytes that
happen to start with the checksum magic fail the CRC like a damaged message would, so no single entry
can tell. So each ledger is classified once all its entries were seen: it is a *message ledger* when
the entries that read as messages (CRC32C right; no checksum but metadata that parses, as old clients
wrote; CRC32C wrong but metadata that still parses, i.e. a message whose bytes changed) outnumber those
that do not. In a message ledger every entry that fails — a CRC32C mismatch or framing that does not
parse — is a **damaged message**; in any other ledger the failing entries are **not messages**, never
damage. A ledger whose every entry is damaged beyond recognition would count as not messages; its
frames still have to pass every structural check and, where the hot copy exists, its CRCs.
"""

from __future__ import annotations

import itertools
import operator
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import crc32c

from tieredcore.errors import CorruptObjectError, MessageFormatError
from tieredcore.formats.messages import MAGIC_CHECKSUM, BadEntry, check_entries, parse_entry
from tieredcore.model import EntryBatch

MAX_LISTED = 20  # damaged positions named per ledger (the counts cover every one)

_HEAD = struct.Struct(">HII").unpack_from  # magic, CRC32C, metadata size
_crc = crc32c.crc32c


@dataclass
class MessageTally:
    """What the message check of one or more ledgers found (entries; a batch is one entry)."""

    checked: int = 0  # CRC32C present and right
    unchecked: int = 0  # messages without a checksum (old clients): metadata parses, nothing to prove
    damaged: int = 0  # entries of message ledgers whose CRC32C or framing fails
    not_messages: int = 0  # failing entries of ledgers that do not hold messages (opaque entries)
    damaged_at: list[BadEntry] = field(default_factory=list)  # the first MAX_LISTED damaged ones

    def counters(self) -> dict[str, int]:
        """As run reports count them (LedgerResult's message fields, a namespace's counters)."""
        return {"messages_checked": self.checked, "messages_unchecked": self.unchecked,
                "messages_damaged": self.damaged, "not_messages": self.not_messages}

    def describe(self, limit: int = 5) -> str:
        """'3 damaged message(s): 5:12 (CRC32C mismatch ...); 5:40 (...); ...' naming at most ``limit``."""
        shown = "; ".join(f"{b.position} ({_reason(b)})" for b in self.damaged_at[:limit])
        more = self.damaged - min(limit, len(self.damaged_at))
        return (f"{self.damaged} damaged message(s) of {self.entries} entries: {shown}"
                + (f"; and {more} more" if more > 0 else ""))

    @property
    def entries(self) -> int:
        return self.checked + self.unchecked + self.damaged + self.not_messages


def _reason(b: BadEntry) -> str:
    """The reason without the 'entry L:E: ' prefix the position already gives."""
    prefix = f"entry {b.position}: "
    return b.reason[len(prefix):] if b.reason.startswith(prefix) else b.reason


class DamagedMessagesError(CorruptObjectError):
    """A copy whose structure (and chunk checksums, and hot CRCs where given) passed, but which holds
    damaged Pulsar messages; ``tally`` names them. ``same_as_hot``: every frame matched the hot copy's
    CRC32C, so the hot copy holds the same damaged bytes (damaged before it was offloaded). ``report``:
    the verification's report (bytes read, blocks), when a verification raised it."""

    def __init__(self, what: str, tally: MessageTally, same_as_hot: bool, report: Any = None) -> None:
        super().__init__(f"{what}: {tally.describe()}"
                         + ("; the hot copy holds the same bytes" if same_as_hot else ""))
        self.tally = tally
        self.same_as_hot = same_as_hot
        self.report = report


class LedgerMessages:
    """One ledger's message check: fed the entries of each stream window in order (their payload offsets
    in the window's buffer), classified by :meth:`finish` (see the module docstring)."""

    def __init__(self, ledger_id: int) -> None:
        self.ledger_id = ledger_id
        self.checked = self.unchecked = 0
        self.bad = 0  # entries that failed, whatever they turn out to be
        self.bad_messages = 0  # of those, CRC32C mismatches whose metadata still parses
        self.listed: list[BadEntry] = []

    def feed_frames(self, buf: Any, first_entry: int, bounds: Sequence[int]) -> None:
        """Entries ``first_entry..`` whose frames (12-byte header + payload) lie back to back in ``buf``
        from ``bounds[0]``, frame i ending at ``bounds[i + 1]``."""
        if len(bounds) < 2:
            return
        starts = list(map(operator.add, itertools.islice(bounds, 0, len(bounds) - 1), itertools.repeat(12)))
        lengths = list(map(operator.sub, itertools.islice(bounds, 1, None), starts))
        self.feed(buf, first_entry, starts, lengths)

    def feed(self, buf: Any, first_entry: int, starts: Sequence[int], lengths: Sequence[int]) -> None:
        """Entries ``first_entry..`` with payloads ``buf[starts[i] : starts[i] + lengths[i]]``.

        The common entry (checksum magic first, metadata inside the entry, CRC32C right) is counted in
        one tight loop: exactly the checks check_entries makes of it, at about half its cost per entry
        (bench/scrub_messages.py). Every other entry (broker entry metadata, old clients' entries, opaque
        bytes, damage) goes through check_entries, runs of them at a time."""
        mv = memoryview(buf)
        head, crc, magic = _HEAD, _crc, MAGIC_CHECKSUM
        ok = 0
        run = -1  # index of the first entry of the current run of other entries
        for i, (s, n) in enumerate(zip(starts, lengths, strict=True)):
            if n >= 10:
                m, stored, msize = head(mv, s)
                if m == magic and msize <= n - 10 and crc(mv[s + 6 : s + n]) == stored:
                    ok += 1
                    if run >= 0:
                        self._check(mv, first_entry + run, starts[run:i], lengths[run:i])
                        run = -1
                    continue
            if run < 0:
                run = i
        if run >= 0:
            self._check(mv, first_entry + run, starts[run:], lengths[run:])
        self.checked += ok

    def _check(self, buf: memoryview, first_entry: int, starts: Sequence[int], lengths: Sequence[int]) -> None:
        res = check_entries(EntryBatch(self.ledger_id, first_entry, buf, starts, lengths, 0, 0))
        self.checked += res.checked
        self.unchecked += res.unchecked
        for b in res.bad:
            self.bad += 1
            if b.checksum and self._metadata_parses(buf, starts[b.position.entry_id - first_entry],
                                                    lengths[b.position.entry_id - first_entry], b):
                self.bad_messages += 1
            if len(self.listed) < MAX_LISTED:
                self.listed.append(b)

    def _metadata_parses(self, buf: Any, start: int, length: int, b: BadEntry) -> bool:
        try:
            parse_entry(memoryview(buf)[start : start + length], *b.position, verify=False)
        except MessageFormatError:
            return False
        return True

    @property
    def holds_messages(self) -> bool:
        """More of its entries read as messages than not (the ledger decides)."""
        return self.checked + self.unchecked + self.bad_messages > self.bad - self.bad_messages

    def finish(self) -> MessageTally:
        if self.holds_messages:
            return MessageTally(self.checked, self.unchecked, damaged=self.bad, damaged_at=list(self.listed))
        return MessageTally(self.checked, self.unchecked, not_messages=self.bad)
