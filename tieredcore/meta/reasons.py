"""Why a pending-deletion record was appended (its ``reason``, docs/deletion.md): one vocabulary for every
producer of phase 1 of two-phase deletion."""

from __future__ import annotations

from enum import StrEnum


class Reason(StrEnum):
    OFFLOAD_CLEANUP = "offload-cleanup"  # an earlier attempt's objects, replaced by a new attempt
    OFFLOAD_CONFLICT = "offload-conflict"  # our own attempt lost (replaced, or the ledger left) or failed
    REPAIR = "repair"  # a damaged complete copy, replaced by a verified one
    VERIFY_FAILED = "verify-failed"  # the lag cleanup's proof failed: the damaged copy is replaced
    SCRUB_REPAIR = "scrub-repair"  # a damaged copy replaced by the scrub
    DELETION_LAG = "deletion-lag"  # a hot copy whose offloaded copy was proven and whose lag passed
    RETENTION = "retention"  # ledgers past retention
    TOPIC_DELETION = "topic-deletion"
    COMPACTION = "compaction"  # old objects replaced by a compacted segment (due after the delete delay)
    COMPACTION_CONFLICT = "compaction-conflict"  # our new segment lost the switch, or failed
    TOPIC_COMPACTION = "topic-compaction"  # a compacted ledger replaced by the next compaction of its topic
    TOPIC_COMPACTION_CONFLICT = "topic-compaction-conflict"  # our compacted ledger lost the switch
    MANIFEST_SUPERSEDED = "manifest-superseded"  # a topic manifest older than the newest N kept
    ORPHAN = "orphan"  # found by reconciliation: referenced by no topic record
