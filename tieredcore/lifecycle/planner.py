"""Pure selection rules over a ManagedLedgerInfo (docs/metadata.md). No I/O: easy to test exhaustively."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tieredcore.errors import ValidationError
from tieredcore.model import Position
from tieredcore.offload.context import covering_offloaded_ms, is_offloaded
from tieredcore.units import parse_keep_bytes


def _is_sealed(li, is_last: bool) -> bool:
    # the newest ledger is the one being written; timestamp 0/absent also marks an open ledger
    return not is_last and li.timestamp > 0


def _complete(li) -> bool:
    """Has a complete object-store copy: a complete V1 offload, or completed PIP-76 segments holding
    every entry (never offloaded again)."""
    return is_offloaded(li)


def select_prefix(ledgers: Sequence, position: Position) -> list[int]:
    """Manual offload up to `position`: sealed, not yet complete, non-empty ledgers with id < its ledger."""
    out = []
    for i, li in enumerate(ledgers):
        if li.ledgerId >= position.ledger_id:
            break
        if _is_sealed(li, i == len(ledgers) - 1) and not _complete(li) and li.size > 0:
            out.append(li.ledgerId)
    return out


def select_keep_bytes(ledgers: Sequence, keep_bytes: int) -> list[int]:
    """`topics offload -s S` (Pulsar's admin findFirstLedgerWithinThreshold, docs/metadata.md): the list ends with
    the open ledger at its current size; walking newest to oldest and summing sizes, at the first ledger
    whose sum exceeds S offload up to (excluding) the ledger visited just before it. The kept suffix is
    the longest one of at most S bytes, so with S = 0 every sealed ledger goes. Then as select_prefix:
    sealed, non-empty, not yet complete ledgers only."""
    if keep_bytes < 0:
        raise ValidationError(f"keep-bytes must be >= 0, got {keep_bytes}")
    if not ledgers:
        return []
    total = 0
    previous = ledgers[-1].ledgerId  # Pulsar starts with the newest ledger itself
    for i in range(len(ledgers) - 1, -1, -1):
        total += ledgers[i].size
        if total > keep_bytes:
            return select_prefix(ledgers, Position(previous, 0))
        previous = ledgers[i].ledgerId
    return []



@dataclass(frozen=True)
class ManualOffload:
    """A manual offload (`tiered offload`, the Spark job's --topic, `tiered_offload_topic`): a prefix up to
    a position, or keep at most N bytes hot; exactly one of the two."""

    up_to: Position | None = None
    keep_bytes: int | None = None

    def __post_init__(self) -> None:
        if (self.up_to is None) == (self.keep_bytes is None):
            raise ValidationError("give exactly one of an up-to position or keep-bytes")

    @classmethod
    def parse(cls, up_to: str | None, keep_bytes: int | str | None,
              names: tuple[str, str] = ("--up-to", "--keep-bytes")) -> ManualOffload:
        """From user input (empty text counts as not given): a LEDGER:ENTRY position or a size."""
        up_name, keep_name = names
        up = (up_to or "").strip()
        keep = None if isinstance(keep_bytes, str) and not keep_bytes.strip() else keep_bytes
        if bool(up) == (keep is not None):
            raise ValidationError(f"give exactly one of {up_name} LEDGER:ENTRY or {keep_name} SIZE; "
                                  f"got {up_name}={up_to!r}, {keep_name}={keep_bytes!r}")
        if up:
            return cls(up_to=Position.parse(up, up_name, require_entry=True))
        assert keep is not None
        return cls(keep_bytes=parse_keep_bytes(keep, keep_name))

    def select(self, ledgers: Sequence) -> list[int]:
        if self.up_to is not None:
            return select_prefix(ledgers, self.up_to)
        return select_keep_bytes(ledgers, self.keep_bytes or 0)

    def job_args(self) -> list[str]:
        """The Spark job's arguments for it (spark_jobs/offload_sweep.py)."""
        return ["--up-to", str(self.up_to)] if self.up_to is not None else ["--keep-bytes", str(self.keep_bytes)]


def select_by_threshold(
    ledgers: Sequence, threshold_bytes: int | None, threshold_seconds: int | None, now_ms: int
) -> list[int]:
    """Automatic offload (Pulsar semantics): newest to oldest, skip the open ledger, running size over
    every visited ledger; chosen when over the byte threshold or old enough. Oldest first."""
    tb = -1 if threshold_bytes is None else threshold_bytes
    ts = -1 if threshold_seconds is None else threshold_seconds
    if tb < 0 and ts < 0:
        return []
    chosen: list[int] = []
    total = 0
    for i in range(len(ledgers) - 1, -1, -1):
        li = ledgers[i]
        if not _is_sealed(li, i == len(ledgers) - 1):
            continue
        total += li.size
        if _complete(li):
            continue
        if (tb >= 0 and total > tb) or (ts >= 0 and now_ms - li.timestamp >= ts * 1000):
            chosen.append(li.ledgerId)
    chosen.reverse()
    return chosen


def deletion_lag_due(li, lag_ms: int | None, now_ms: int) -> bool:
    """Hot copy may be deleted: complete, not yet deleted, and completed strictly more than lag ago. A
    ledger held by PIP-76 segments is complete once it is sealed and completed segments hold every entry
    of it; it completed when the last of those segments did (their latest offloadedTimestamp)."""
    if lag_ms is None or not li.HasField("offloadContext"):
        return False
    ctx = li.offloadContext
    if ctx.bookkeeperDeleted:
        return False
    if ctx.complete:
        return now_ms - ctx.timestamp > lag_ms
    return is_offloaded(li) and now_ms - covering_offloaded_ms(li) > lag_ms


def ledgers_as_of(ledgers: Sequence, as_of_ms: int) -> list:
    """The topic as it stood at logical time `as_of_ms`: ledgers closed by then, followed by the one that
    was open at that time (the first not closed by then). Backfills plan on this view, so a run for an
    older logical date never touches ledgers sealed after it."""
    out = []
    for li in ledgers:
        out.append(li)
        if li.timestamp <= 0 or li.timestamp > as_of_ms:
            break
    return out


def slowest_reader_ledger(ledgers: Sequence, mark_delete: Position) -> int:
    """Pulsar's ``slowestReaderLedgerId`` for a durable cursor whose mark-delete position is
    ``mark_delete`` (ManagedLedgerImpl.internalTrimLedgers): only ledgers with a smaller id may be
    trimmed. It is the position's ledger, or the next id when the position is the last entry of a ledger
    that is not the newest one (that ledger is then fully consumed)."""
    for i, li in enumerate(ledgers):
        if li.ledgerId == mark_delete.ledger_id:
            if i != len(ledgers) - 1 and li.HasField("entries") and li.entries == mark_delete.entry_id + 1:
                return li.ledgerId + 1
            break
    return mark_delete.ledger_id


def select_retention(
    ledgers: Sequence, retention_time_ms: int | None, retention_size_bytes: int | None, now_ms: int,
    held_at: Position | None = None,
) -> list[int]:
    """Retention trim (Pulsar's ManagedLedgerImpl.internalTrimLedgers, docs/metadata.md): ledgers to remove from
    the topic, oldest first.

    Candidates are the sealed ledgers before the newest one, and before the slowest durable cursor's
    ledger (:func:`slowest_reader_ledger`) when ``held_at`` names that cursor's mark-delete position. This
    project models one durable cursor only: a compacted topic's ``__compaction`` subscription, whose
    mark-delete position is the compaction horizon (docs/topic-compaction.md, "Retention"); without it the
    slowest reader is at the newest ledger, as in Pulsar for a topic without subscriptions. Walking oldest
    first with ``to_delete += size``, a ledger goes if ``time >= 0 and now - timestamp > time`` or
    ``size >= 0 and total - to_delete >= size``, where ``total`` is the size of every ledger given
    (offloaded ones included); the walk stops at the first ledger that is neither. None or -1 disables
    a limit. A ledger that is not sealed (timestamp 0) also stops the walk."""
    rt = -1 if retention_time_ms is None else retention_time_ms
    rs = -1 if retention_size_bytes is None else retention_size_bytes
    if rt < 0 and rs < 0:
        return []
    cap = None if held_at is None else slowest_reader_ledger(ledgers, held_at)
    total = sum(li.size for li in ledgers)
    to_delete = 0
    out: list[int] = []
    for i, li in enumerate(ledgers):
        if not _is_sealed(li, i == len(ledgers) - 1):
            break
        if cap is not None and li.ledgerId >= cap:
            break  # not yet consumed by the durable cursor (Pulsar: ledgers.headMap(slowestReaderLedgerId))
        to_delete += li.size
        expired = rt >= 0 and now_ms - li.timestamp > rt
        over_quota = rs >= 0 and total - to_delete >= rs
        if not (expired or over_quota):
            break
        out.append(li.ledgerId)
    return out
