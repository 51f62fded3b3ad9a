"""V1 index trailer: this project's extensions after Pulsar's index entries (docs/formats.md).

Pulsar's reader stops after the ``20·n`` entry bytes and ignores the index-length field's count, so
bytes after the entries never break it (docs/formats.md). This project writes up to two sections there, in
this order:

``TSC1`` entry checkpoints: ``[magic][count:int32][count × (entryId:int64, frameOffset:int64)]``.

``TSK1`` checksums: ``[magic][chunkSize:int32][count:int32][count × crc32c:uint32][indexCrc:uint32]``.
Chunk *i* covers data-object bytes ``[i·chunkSize, min((i+1)·chunkSize, length))``;
``count = ceil(length / chunkSize)``. ``indexCrc`` is the CRC32C of every index byte before it (header,
ledger metadata, entries, checkpoints, this section): one flipped byte anywhere in the index is caught.

Readers that find no ``TSK1`` section read as Pulsar does (objects Pulsar wrote have no trailer); the
index object's user metadata says when a checksum section must be there (``tieredchecksums``), so a
damaged section cannot silently turn verification off.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

import crc32c

from tieredcore.errors import CorruptObjectError, ValidationError
from tieredcore.formats.constants import (
    BLOCK_HEADER_LENGTH,
    INDEX_CHECKPOINTS_MAGIC,
    INDEX_CHECKSUMS_MAGIC,
)

Buffer = bytes | bytearray | memoryview

_CP_HEADER = struct.Struct(">Ii")  # magic, count
_CK_HEADER = struct.Struct(">Iii")  # magic, chunk size, count
_U32 = struct.Struct(">I")
_crc = crc32c.crc32c


# ================================================================================================
# checksums
# ================================================================================================


@dataclass(frozen=True)
class ChunkChecksums:
    """CRC32C of every fixed-size chunk of a data object of ``object_length`` bytes."""

    chunk_size: int
    crcs: tuple[int, ...]
    object_length: int

    def align(self, start: int, end: int) -> tuple[int, int]:
        """The chunk-aligned range ``[a, b)`` covering ``[start, end)`` (b clipped at the object end)."""
        cs = self.chunk_size
        return start - start % cs, min(-(-end // cs) * cs, self.object_length)

    def verify(self, data: Buffer, start: int, what: str) -> None:
        """Check every chunk of ``data`` (the object's bytes from ``start``, chunk-aligned, ending at a
        chunk boundary or the object end); CorruptObjectError names the object range that fails."""
        cs = self.chunk_size
        mv = memoryview(data)
        n = len(mv)
        if start < 0 or start + n > self.object_length:  # no checksum there: never index past crcs
            raise ValidationError(f"{what}: range {start}+{n} outside the object's {self.object_length} bytes")
        if start % cs or (start + n != self.object_length and (start + n) % cs):
            raise ValidationError(f"{what}: range {start}+{n} is not chunk-aligned (chunk {cs})")
        first = start // cs
        for k, pos in enumerate(range(0, n, cs)):
            got = _crc(mv[pos : pos + cs])
            want = self.crcs[first + k]
            if got != want:
                a = start + pos
                b = min(a + cs, self.object_length) - 1
                raise CorruptObjectError(
                    f"{what}: bytes {a}-{b} fail their CRC32C checksum (stored {want:08x}, read {got:08x})"
                )


class ChunkCrcWriter:
    """Streaming CRC32C per ``chunk_size`` bytes, fed with the data object's bytes in order."""

    def __init__(self, chunk_size: int) -> None:
        if chunk_size <= 0:
            raise ValidationError(f"checksum chunk size must be positive, got {chunk_size}")
        self.chunk_size = chunk_size
        self.crcs: list[int] = []
        self._crc = 0
        self._fill = 0
        self.length = 0

    def update(self, data: Buffer) -> None:
        mv = memoryview(data)
        if mv.format != "B" or mv.ndim != 1:
            mv = mv.cast("B")
        cs = self.chunk_size
        pos, n = 0, len(mv)
        self.length += n
        if self._fill:  # complete the chunk a previous update started
            take = min(cs - self._fill, n)
            self._crc = _crc(mv[:take], self._crc)
            self._fill += take
            pos = take
            if self._fill == cs:
                self.crcs.append(self._crc)
                self._crc = self._fill = 0
        whole = (n - pos) // cs * cs
        if whole:  # whole chunks in one C-level loop (no bytecode per chunk)
            starts = range(pos, pos + whole, cs)
            self.crcs += map(_crc, map(mv.__getitem__, map(slice, starts, range(pos + cs, pos + whole + 1, cs))))
            pos += whole
        if pos < n:  # the start of the next chunk
            self._crc = _crc(mv[pos:], 0)
            self._fill = n - pos

    def finish(self) -> list[int]:
        if self._fill:
            self.crcs.append(self._crc)
            self._crc = self._fill = 0
        return self.crcs


def encode_checksums(index_prefix: Buffer, chunk_size: int, crcs: Sequence[int]) -> bytes:
    """The ``TSK1`` section to append after ``index_prefix`` (every index byte written before it)."""
    body = _CK_HEADER.pack(INDEX_CHECKSUMS_MAGIC, chunk_size, len(crcs)) + struct.pack(f">{len(crcs)}I", *crcs)
    return body + _U32.pack(_crc(body, _crc(index_prefix)))


# ================================================================================================
# checkpoints
# ================================================================================================


def encode_checkpoints(checkpoints: Sequence[tuple[int, int]]) -> bytes:
    """The ``TSC1`` section of ``(entryId, frame offset in the data object)`` pairs."""
    if not checkpoints:
        return b""
    flat = list(itertools.chain.from_iterable(checkpoints))
    return _CP_HEADER.pack(INDEX_CHECKPOINTS_MAGIC, len(checkpoints)) + struct.pack(f">{len(flat)}q", *flat)


def _valid_checkpoints(ids: Sequence[int], offs: Sequence[int], last_entry_id: int, object_length: int) -> bool:
    return (
        all(a < b for a, b in zip(ids, ids[1:], strict=False))
        and all(a < b for a, b in zip(offs, offs[1:], strict=False))
        and ids[0] > 0
        and ids[-1] <= last_entry_id
        and offs[0] >= BLOCK_HEADER_LENGTH
        and offs[-1] < object_length
    )


# ================================================================================================
# parsing
# ================================================================================================


@dataclass
class IndexTrailer:
    checkpoint_ids: list[int] = field(default_factory=list)
    checkpoint_offsets: list[int] = field(default_factory=list)
    checksums: ChunkChecksums | None = None
    problem: str = ""  # a checksum section is there but damaged (the index cannot be trusted)


def parse_trailer(trailer: Buffer, prefix_crc: int, last_entry_id: int, object_length: int) -> IndexTrailer:
    """Sections of a V1 index trailer. ``prefix_crc`` is the CRC32C of the index bytes before the
    trailer. Checkpoints that are not valid are ignored (readers then walk blocks); unknown sections end
    the walk (room for later extensions); a damaged checksum section is reported in ``problem``."""
    t = memoryview(trailer)
    out = IndexTrailer()
    pos = 0
    crc = prefix_crc
    while len(t) - pos >= 4:
        (magic,) = _U32.unpack_from(t, pos)
        if magic == INDEX_CHECKPOINTS_MAGIC:
            if len(t) - pos < _CP_HEADER.size:
                break
            _, count = _CP_HEADER.unpack_from(t, pos)
            end = pos + _CP_HEADER.size + 16 * count
            if count <= 0 or end > len(t):
                break
            flat = struct.unpack_from(f">{2 * count}q", t, pos + _CP_HEADER.size)
            ids, offs = list(flat[0::2]), list(flat[1::2])
            if _valid_checkpoints(ids, offs, last_entry_id, object_length):
                out.checkpoint_ids, out.checkpoint_offsets = ids, offs
            crc = _crc(t[pos:end], crc)
            pos = end
        elif magic == INDEX_CHECKSUMS_MAGIC:
            out.problem = _parse_checksums(t, pos, crc, object_length, out)
            break
        else:
            break
    return out


def _parse_checksums(t: memoryview, pos: int, crc: int, object_length: int, out: IndexTrailer) -> str:
    if len(t) - pos < _CK_HEADER.size + 4:
        return "index checksum section truncated"
    _, chunk, count = _CK_HEADER.unpack_from(t, pos)
    if chunk <= 0 or count < 0:
        return f"index checksum section: chunk size {chunk}, count {count}"
    want = -(-object_length // chunk) if object_length > 0 else 0
    if count != want:
        return (f"index checksum section has {count} chunk checksums, a data object of {object_length} bytes "
                f"in chunks of {chunk} needs {want}")
    body_end = pos + _CK_HEADER.size + 4 * count
    if len(t) < body_end + 4:
        return "index checksum section truncated"
    (stored,) = _U32.unpack_from(t, body_end)
    got = _crc(t[pos:body_end], crc)
    if got != stored:
        return f"index bytes fail their CRC32C checksum (stored {stored:08x}, read {got:08x})"
    crcs = struct.unpack_from(f">{count}I", t, pos + _CK_HEADER.size)
    out.checksums = ChunkChecksums(chunk, tuple(crcs), object_length)
    return ""
