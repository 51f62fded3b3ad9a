"""What a compaction batch is made of and how big things are (docs/compaction.md): the units (offloaded
object pairs) a batch repacks, and the size estimates planning and the executor share, from the topic
record alone. The planner is :mod:`tieredcore.lifecycle.compaction`, the executor
:mod:`tieredcore.offload.compaction`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tieredcore.formats.constants import (
    BLOCK_HEADER_LENGTH,
    DEFAULT_CHECKPOINT_INTERVAL,
    DEFAULT_CHECKSUM_CHUNK,
    DEFAULT_MAX_BLOCK_SIZE,
    ENTRY_HEADER_SIZE,
)
from tieredcore.meta.deletion_log import TYPE_OFFLOADED, TYPE_SEGMENT
from tieredcore.offload.context import (
    LedgerInfo,
    incomplete_segment_uuids,
    is_offloaded,
    is_sealed,
    referenced_uuids,
)
from tieredcore.offload.copies import copy_uuids
from tieredcore.offload.transaction import ObjectGroup

__all__ = ["BLOCK_SIZE", "KIND_LEDGER", "KIND_SEGMENT", "Batch", "Unit", "compacted_bytes", "piece_bytes",
           "repackable", "v1_bytes"]

# Blocks of compacted segments: entries are packed into blocks of up to this; a ledger's last block is
# not padded (BlockFormer pad_last=False), so a small ledger takes its own bytes, not a whole block
# (Pulsar's 5 MiB streaming blocks would pad every 100 KiB ledger to 5 MiB), and within a ledger the
# padding is less than one entry per block. Parts group blocks to the store's minimum part size.
BLOCK_SIZE = 4 * 1024 * 1024

KIND_LEDGER = "ledger"  # a V1 object pair holding one ledger
KIND_SEGMENT = "segment"


@dataclass(frozen=True)
class Unit:
    """One offloaded object pair (data object + index) holding whole ledgers or parts of them."""

    kind: str  # KIND_LEDGER | KIND_SEGMENT
    uuid: str
    ledgers: tuple[int, ...]
    bytes: int  # estimated data-object bytes (from the topic record; exact ones are measured when read)
    driver: dict[str, Any]  # where it lies (a deletion record's driver)
    transform: str = "none"  # what it was written with (driver metadata: tieredTransform)

    def group(self) -> ObjectGroup:
        """The unit as a storage object group (its deletion record, once compacted away)."""
        return ObjectGroup(self.ledgers[0], TYPE_OFFLOADED if self.kind == KIND_LEDGER else TYPE_SEGMENT,
                           self.uuid, self.driver)


@dataclass(frozen=True)
class Batch:
    """Ledgers whose objects become one new segment."""

    ledgers: tuple[int, ...]
    units: tuple[Unit, ...]
    entries: int
    payload_bytes: int
    bytes_before: int  # estimated
    bytes_after: int  # estimated
    objects_after: int  # estimated new segments (normally 1)
    transform: str = "none"  # what the new segment is written with (the namespace policy's)

    @property
    def objects_before(self) -> int:
        return 2 * len(self.units)

    @property
    def retransform(self) -> bool:
        """Some old object was written with another transform than the policy's now."""
        return any(u.transform != self.transform for u in self.units)


def _index_bytes(frames: int, blocks: int, base: int) -> int:
    """About an index's size: a fixed part (``base``: V1 ≈ 448 with the ledger's metadata, a V2 section
    ≈ 112), 20 bytes per block, this project's checkpoints and chunk checksums at their defaults."""
    return (base + 20 * blocks + 22 * math.ceil(frames / DEFAULT_CHECKPOINT_INTERVAL)
            + 6 * math.ceil(frames / DEFAULT_CHECKSUM_CHUNK))


def v1_bytes(li: LedgerInfo) -> int:
    """A V1 pair's size: data blocks of up to the default max block size (the last one unpadded) and
    the index."""
    frames = li.size + ENTRY_HEADER_SIZE * li.entries
    blocks = max(1, math.ceil(frames / (DEFAULT_MAX_BLOCK_SIZE - BLOCK_HEADER_LENGTH)))
    return frames + BLOCK_HEADER_LENGTH * blocks + _index_bytes(frames, blocks, 448)


def compacted_bytes(entries: int, payload: int, block_size: int = BLOCK_SIZE) -> int:
    """About what one ledger's entries take in a compacted segment: its frames, block headers (the
    padding of blocks within the ledger, less than an entry each, is left out) and its index section."""
    frames = payload + ENTRY_HEADER_SIZE * entries
    blocks = max(1, math.ceil(frames / (block_size - BLOCK_HEADER_LENGTH)))
    return frames + BLOCK_HEADER_LENGTH * blocks + _index_bytes(frames, blocks, 112)


def repackable(li: LedgerInfo) -> bool:
    """Sealed, fully offloaded, and nothing else referenced or in flight: safe to repack."""
    if not (is_sealed(li) and li.HasField("entries") and li.entries > 0 and is_offloaded(li)):
        return False
    if incomplete_segment_uuids(li):
        return False
    return referenced_uuids(li) == set(copy_uuids(li))


def piece_bytes(li: LedgerInfo, n: int) -> int:
    """A segment's bytes for ``n`` entries of ``li`` as planning estimates them from the topic record
    (the ledger's average entry, frame headers, a block header, its index section; no padding): what
    makes a segment small."""
    share = li.size * n // li.entries if li.entries else 0
    frames = share + ENTRY_HEADER_SIZE * n
    return frames + BLOCK_HEADER_LENGTH + _index_bytes(frames, 1, 112)
