"""What happened to one unit of work (a ledger, a segment, a batch, a deletion record, a manifest): one
vocabulary for every job, its reports and the DAGs that read them.

Members are strings (``StrEnum``): they compare equal to the words already in reports, and
:func:`plain` turns them back into ``str`` where a row leaves Python (Spark rows, Parquet, JSON)."""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class Outcome(StrEnum):
    # offload (ledger and streaming) and repairs
    OFFLOADED = "offloaded"
    SKIPPED = "skipped"  # already done, no longer selected, or changed meanwhile (nothing to do)
    CONFLICT = "conflict"  # the topic changed meanwhile (trimmed, another attempt took over): retried next run
    FAILED = "failed"
    UNKNOWN = "unknown"  # a metadata-store error at the committing step: the change may have landed
    REPLACED = "replaced"  # a damaged complete copy replaced by a verified one
    NO_HOT_COPY = "no-hot-copy"  # nothing to replace a damaged copy from
    BUSY = "busy"  # another runner holds the topic's lease: skipped this time (not a failure)
    ABORTED = "aborted"  # not attempted: the store kept failing (the run's failure budget was spent)
    HELD = "held"  # a streaming tail waits for its rollover time (not a failure)
    PLANNED = "planned"  # dry run
    # deletion-lag cleanup and retention (phase 1 of two-phase deletion)
    MARKED = "marked"  # bookkeeperDeleted set, the hot copy's deletion pending in the log
    VERIFY_FAILED = "verify-failed"  # the offloaded copy does not read back as the hot copy: hot kept
    TRIMMED = "trimmed"  # removed from the topic; its storage is in the deletion log
    # compaction
    COMPACTED = "compacted"
    WOULD_COMPACT = "would_compact"  # dry run
    # scrub
    OK = "ok"
    DAMAGED = "damaged"
    REPAIRED = "repaired"
    UNRECOVERABLE = "unrecoverable"  # damaged and no other copy: data loss
    # damaged, on a workspace attached to a Pulsar cluster: BookKeeper may or may not still hold the ledger
    # (the brokers delete it after their offload deletion lag), but it is Pulsar's, never read here: repair
    # impossible without BookKeeper (reported, never deleted; not "data loss": that is not known here)
    UNREPAIRABLE = "unrepairable"
    # deletion drain (phase 2)
    DELETED = "deleted"
    ALREADY_DELETED = "already_deleted"
    STILL_IN_USE = "still_in_use"
    UNREADABLE_TOPIC = "unreadable_topic"  # the topic's record cannot be read: taken as in use, record kept
    REFUSED_MISMATCH = "refused_mismatch"  # the record does not match what the storage says it is
    REFUSED_FOREIGN = "refused_foreign"  # the objects belong to another cluster or workspace
    MALFORMED = "malformed"
    RETRYING = "retrying"
    DEAD_LETTERED = "dead_lettered"
    LOST_RACE = "lost_race"  # another consumer changed or removed the record first
    WOULD_DELETE = "would_delete"  # dry run
    # key rotation
    REWRAPPED = "rewrapped"
    WOULD_REWRAP = "would_rewrap"  # dry run


def plain(value: Any) -> Any:
    """``value`` with every Outcome (at any depth of dicts, lists and tuples) as a plain ``str``: rows
    handed to Spark are pickled for the JVM, which knows no Python enum."""
    if isinstance(value, StrEnum):
        return str(value)
    if isinstance(value, dict):
        return {plain(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(plain(v) for v in value)
    return value
