"""Entry-offsets sidecar: checkpoints of a V1 object pair whose index has none (docs/formats.md, "Entry
offsets sidecar").

Pulsar's offloader writes one index point per block (64 MiB by default), so a random read of one entry
of a Pulsar-written object walks its block from the start. The first full read (or deep scrub) of such
an object records where its entries are, as this project's index trailer would have (``TSC1``
checkpoints, :mod:`tieredcore.formats.trailer`), in an object of its own beside the pair
(``{uuid}-ledger-{id}-offsets``, :func:`tieredcore.formats.keys.offsets_key`); Pulsar's objects are
never modified. Layout, big-endian:

=====  ====  ==================================================================
offset size  field
=====  ====  ==================================================================
0      4     magic ``0x54534F31`` ("TSO1")
4      4     version, 1
8      16    uuid of the offload (the key's uuid, its 16 bytes)
24     8     ledger id
32     8     data object length
40     8     last entry id
48     4     CRC32C of the index object (all its bytes)
52     4     checkpoint interval the writer used (bytes, > 0)
56     4     count ``k``
60     16·k  ``[entryId:int64][frameOffset:int64]``, strictly increasing in both
60+16k 4     CRC32C of every byte before this field
=====  ====  ==================================================================

The identity fields bind a sidecar to one object pair: a sidecar whose uuid, ledger, lengths or index
CRC differ from the pair it sits beside is *stale* and ignored, as is one that does not decode (a
:class:`SidecarError` naming the problem). Nothing here does I/O.
"""

from __future__ import annotations

import struct
import sys
import uuid as uuidlib
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

import crc32c

from tieredcore.errors import FormatError, ValidationError
from tieredcore.formats.constants import BLOCK_HEADER_LENGTH, ENTRY_HEADER_SIZE
from tieredcore.formats.index import LedgerIndex

OFFSETS_MAGIC = 0x54534F31  # "TSO1"
OFFSETS_VERSION = 1
_HEADER = struct.Struct(">II16sqqqIII")  # magic, version, uuid, ledger, length, last entry, index crc, interval, k
_U32 = struct.Struct(">I")
HEADER_LENGTH = _HEADER.size  # 60
_crc = crc32c.crc32c
_LITTLE = sys.byteorder == "little"  # the int64 arrays are big-endian on disk


class SidecarError(FormatError):
    """A sidecar that cannot be used: it does not decode, or it belongs to another object pair."""


@dataclass(frozen=True)
class PairIdentity:
    """What binds a sidecar to one object pair."""

    uuid: str
    ledger_id: int
    object_length: int
    last_entry_id: int
    index_crc: int

    def describe(self) -> str:
        return (f"uuid {self.uuid}, ledger {self.ledger_id}, {self.object_length} data bytes, last entry "
                f"{self.last_entry_id}, index CRC32C {self.index_crc:08x}")


@dataclass(frozen=True)
class EntryOffsets:
    identity: PairIdentity
    interval: int
    ids: list[int]
    offsets: list[int]


def encode_offsets(identity: PairIdentity, interval: int, checkpoints: Sequence[tuple[int, int]]) -> bytes:
    """The sidecar bytes of ``checkpoints`` (``(entryId, frame offset)``) of the pair ``identity``."""
    if interval <= 0:
        raise ValidationError(f"checkpoint interval must be positive, got {interval}")
    flat = array("q", (v for cp in checkpoints for v in cp))
    if _LITTLE:
        flat.byteswap()
    head = _HEADER.pack(OFFSETS_MAGIC, OFFSETS_VERSION, uuidlib.UUID(identity.uuid).bytes, identity.ledger_id,
                        identity.object_length, identity.last_entry_id, identity.index_crc, interval,
                        len(checkpoints))
    body = head + flat.tobytes()
    return body + _U32.pack(_crc(body))


def decode_offsets(raw: bytes | bytearray | memoryview, what: str = "sidecar") -> EntryOffsets:
    """Decode and check a sidecar: SidecarError (naming ``what``) for a short or damaged one, an unknown
    version, a failing CRC32C or checkpoints that are not strictly increasing."""
    mv = memoryview(raw)
    if len(mv) < HEADER_LENGTH + 4:
        raise SidecarError(f"{what}: {len(mv)} bytes, shorter than a sidecar header ({HEADER_LENGTH + 4})")
    magic, version = struct.unpack_from(">II", mv)
    if magic != OFFSETS_MAGIC:
        raise SidecarError(f"{what}: magic 0x{magic:08x}, expected 0x{OFFSETS_MAGIC:08x}")
    if version != OFFSETS_VERSION:
        raise SidecarError(f"{what}: version {version}, this build reads version {OFFSETS_VERSION}")
    _m, _v, ub, lid, length, last, icrc, interval, k = _HEADER.unpack_from(mv)
    if len(mv) != HEADER_LENGTH + 16 * k + 4:
        raise SidecarError(f"{what}: {len(mv)} bytes, {k} checkpoints need {HEADER_LENGTH + 16 * k + 4}")
    (stored,) = _U32.unpack_from(mv, len(mv) - 4)
    got = _crc(mv[:-4])
    if got != stored:
        raise SidecarError(f"{what}: fails its CRC32C (stored {stored:08x}, read {got:08x})")
    if interval <= 0 or lid < 0 or length <= 0 or last < 0:
        raise SidecarError(f"{what}: interval {interval}, ledger {lid}, length {length}, last entry {last}")
    flat = array("q")
    flat.frombytes(mv[HEADER_LENGTH : HEADER_LENGTH + 16 * k])
    if _LITTLE:
        flat.byteswap()
    ids, offs = flat[0::2].tolist(), flat[1::2].tolist()
    if k and not (all(map(int.__lt__, ids, ids[1:])) and all(map(int.__lt__, offs, offs[1:]))
                  and ids[0] > 0 and ids[-1] <= last and offs[0] >= BLOCK_HEADER_LENGTH and offs[-1] < length):
        raise SidecarError(f"{what}: its checkpoints are not strictly increasing inside the object")
    return EntryOffsets(PairIdentity(str(uuidlib.UUID(bytes=bytes(ub))), lid, length, last, icrc), interval, ids, offs)


def stale_reason(got: EntryOffsets, pair: PairIdentity, index: LedgerIndex) -> str | None:
    """Why the sidecar ``got`` cannot describe the pair (another identity, or a checkpoint outside its
    entry's block), or None when it can."""
    if got.identity != pair:
        return f"it describes {got.identity.describe()}; the pair is {pair.describe()}"
    blocks = index.entries
    firsts = [b.first_entry_id for b in blocks]
    for eid, off in zip(got.ids, got.offsets, strict=True):
        i = bisect_right(firsts, eid) - 1
        end = blocks[i + 1].offset if i + 1 < len(blocks) else index.data_object_length
        # a checkpoint is never a block's first entry (the index has those) and lies in its block's frames
        if i < 0 or firsts[i] == eid or not blocks[i].offset + BLOCK_HEADER_LENGTH < off < end:
            return f"its checkpoint of entry {eid} at offset {off} is outside that entry's block"
    return None


def block_checkpoints(data_start: int, first_entry: int, sizes: Sequence[int], interval: int) -> list[tuple[int, int]]:
    """Checkpoints of one block whose frames start at ``data_start`` with entry ``first_entry`` and have
    payload ``sizes``: the first frame at least ``interval`` bytes after the block's first frame or the
    previous checkpoint, as the offloader places its trailer checkpoints
    (:func:`tieredcore.formats.block.checkpoints_for`). Python work per checkpoint, not per entry."""
    if interval <= 0 or len(sizes) < 2:
        return []
    cum = list(accumulate(map(ENTRY_HEADER_SIZE.__add__, sizes), initial=0))  # frame starts, relative
    out: list[tuple[int, int]] = []
    last_cp = 0
    n = len(sizes)
    while True:
        k = bisect_left(cum, last_cp + interval, 1, n)
        if k >= n:
            return out
        out.append((first_entry + k, data_start + cum[k]))
        last_cp = cum[k]
