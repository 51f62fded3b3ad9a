"""Chunk indexes of transformed objects (spec/04 "Chunking"; docs/formats.md "Chunked objects").

A logical data object (the bytes of a V1 or V2 data object) of ``F`` bytes is cut into chunks of ``C``
original bytes (the last one shorter); each chunk is transformed on its own (compressed, then
encrypted) and the transformed chunks are concatenated into one physical object. The chunk index maps
a logical byte range to the physical range holding the chunks that overlap it.

Two kinds (as Aiven's tiered storage names them):

- **fixed**: every transformed chunk but the last has the same size (no compression: ``C``, or ``C + 28``
  with AES-GCM), so only that size and the last chunk's are stored;
- **variable**: compression on, every transformed size is stored with the size-list codec.

Size-list codec (big-endian, compact: 1-2 bytes per value typically)::

    n == 0 → int32(0)
    n == 1 → int32(1) ‖ int32(v0)
    n >= 2 → int32(n) ‖ int32(base) ‖ uint8(width) ‖ (v - base, `width` bytes each, for v in values[:-1])
             ‖ int32(values[-1])        base = min(values[:-1]); width = bytes needed by the largest
                                        difference (1..4, never 0)

The binary form is stored zstd-compressed (content size in the frame header) and base64-encoded in the
object's manifest (:mod:`tieredcore.formats.manifest`).
"""

from __future__ import annotations

import base64
import binascii
import struct
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate

import zstandard

from tieredcore.errors import FormatError, ValidationError

__all__ = [
    "Chunk",
    "ChunkIndex",
    "decode_index_text",
    "decode_sizes",
    "encode_index_text",
    "encode_sizes",
]

_I32 = struct.Struct(">i")
KIND_FIXED = "fixed"
KIND_VARIABLE = "variable"


def _bytes_needed(v: int) -> int:
    if v <= 0xFF:
        return 1
    if v <= 0xFFFF:
        return 2
    if v <= 0xFFFFFF:
        return 3
    return 4


def encode_sizes(values: Sequence[int]) -> bytes:
    """The size-list codec's bytes of ``values`` (each 0..2^31-1)."""
    if any(v < 0 or v > 0x7FFFFFFF for v in values):
        raise ValidationError("chunk sizes must be within 0..2^31-1")
    n = len(values)
    if n == 0:
        return _I32.pack(0)
    if n == 1:
        return _I32.pack(1) + _I32.pack(values[0])
    body = values[:-1]
    base = min(body)
    width = max(_bytes_needed(v - base) for v in body)
    out = bytearray(_I32.pack(n) + _I32.pack(base) + bytes([width]))
    for v in body:
        out += (v - base).to_bytes(width, "big")
    out += _I32.pack(values[-1])
    return bytes(out)


def decode_sizes(buf: bytes | memoryview, what: str = "chunk sizes") -> list[int]:
    """The values encoded in ``buf`` (which must hold exactly one list)."""
    mv = memoryview(buf)
    try:
        (n,) = _I32.unpack_from(mv, 0)
        if n < 0:
            raise FormatError(f"{what}: negative count {n}")
        if n == 0:
            end, out = 4, []
        elif n == 1:
            end, out = 8, [_I32.unpack_from(mv, 4)[0]]
        else:
            (base,) = _I32.unpack_from(mv, 4)
            width = mv[8]
            if not 1 <= width <= 4:
                raise FormatError(f"{what}: value width {width} is not 1..4")
            pos = 9
            end = pos + width * (n - 1) + 4
            if len(mv) < end:
                raise FormatError(f"{what}: {len(mv)} bytes, {n} values of width {width} need {end}")
            raw = bytes(mv[pos: pos + width * (n - 1)])
            out = [base + int.from_bytes(raw[i: i + width], "big") for i in range(0, len(raw), width)]
            out.append(_I32.unpack_from(mv, pos + width * (n - 1))[0])
    except struct.error as e:
        raise FormatError(f"{what}: truncated ({len(mv)} bytes): {e}") from None
    except IndexError:
        raise FormatError(f"{what}: truncated ({len(mv)} bytes)") from None
    if end != len(mv):
        raise FormatError(f"{what}: {len(mv) - end} trailing bytes after {n} values")
    if any(v < 0 for v in out):
        raise FormatError(f"{what}: negative size")
    return out


@dataclass(frozen=True)
class Chunk:
    id: int
    original_position: int
    original_size: int
    transformed_position: int
    transformed_size: int


@dataclass(frozen=True)
class ChunkIndex:
    """Chunk ``i`` covers logical bytes ``[i·C, min((i+1)·C, F))`` and physical bytes
    ``[t_i, t_i + size_i)`` (``t`` the prefix sums of the transformed sizes, precomputed)."""

    chunk_size: int  # C: original bytes per chunk
    original_size: int  # F: the logical object's length
    transformed_sizes: tuple[int, ...]
    kind: str = KIND_VARIABLE
    _starts: tuple[int, ...] = field(repr=False, compare=False, default=())

    def __post_init__(self) -> None:
        if self.chunk_size <= 0:
            raise FormatError(f"chunk index: chunk size {self.chunk_size} must be positive")
        if self.original_size < 0:
            raise FormatError(f"chunk index: negative original size {self.original_size}")
        want = -(-self.original_size // self.chunk_size)
        if len(self.transformed_sizes) != want:
            raise FormatError(f"chunk index: {len(self.transformed_sizes)} chunk sizes for {self.original_size} bytes "
                              f"in chunks of {self.chunk_size} (expected {want})")
        if any(s <= 0 for s in self.transformed_sizes):
            raise FormatError("chunk index: a transformed chunk size is not positive")
        object.__setattr__(self, "_starts", tuple(accumulate(self.transformed_sizes, initial=0)))

    @classmethod
    def fixed(cls, chunk_size: int, original_size: int, transformed_chunk_size: int,
              final_transformed_chunk_size: int) -> ChunkIndex:
        n = -(-original_size // chunk_size) if chunk_size > 0 else 0
        sizes = (transformed_chunk_size,) * max(0, n - 1) + ((final_transformed_chunk_size,) if n else ())
        return cls(chunk_size, original_size, sizes, KIND_FIXED)

    @classmethod
    def of(cls, chunk_size: int, original_size: int, transformed_sizes: Sequence[int]) -> ChunkIndex:
        """The compact kind for these sizes: fixed when every chunk but the last has one size."""
        body = set(transformed_sizes[:-1])
        kind = KIND_FIXED if len(body) <= 1 else KIND_VARIABLE
        return cls(chunk_size, original_size, tuple(transformed_sizes), kind)

    @property
    def count(self) -> int:
        return len(self.transformed_sizes)

    @property
    def transformed_size(self) -> int:
        """The physical object's length."""
        return self._starts[-1]

    def chunk(self, i: int) -> Chunk:
        if not 0 <= i < self.count:
            raise FormatError(f"chunk index: no chunk {i} (0..{self.count - 1})")
        start = i * self.chunk_size
        return Chunk(i, start, min(self.chunk_size, self.original_size - start), self._starts[i],
                     self.transformed_sizes[i])

    def chunks(self) -> list[Chunk]:
        return [self.chunk(i) for i in range(self.count)]

    def chunk_ids(self, start: int, end: int) -> range:
        """Ids of the chunks overlapping logical bytes ``[start, end)``."""
        if start < 0 or end > self.original_size or start >= end:
            raise FormatError(f"logical range {start}..{end} outside 0..{self.original_size}")
        return range(start // self.chunk_size, (end - 1) // self.chunk_size + 1)

    def physical_range(self, first: int, last: int) -> tuple[int, int]:
        """Physical bytes ``[a, b)`` holding chunks ``first..last``: one ranged GET."""
        return self._starts[first], self._starts[last + 1]

    def chunk_at_physical(self, pos: int) -> int:
        return bisect_right(self._starts, pos) - 1

    # -- encoding ------------------------------------------------------------------------------

    def body(self) -> bytes:
        """The size list's codec bytes: every transformed size (variable), or [size, final] (fixed)."""
        if self.kind == KIND_FIXED:
            sizes = self.transformed_sizes
            if not sizes:
                return encode_sizes([])
            return encode_sizes([sizes[0], sizes[-1]] if len(sizes) > 1 else [sizes[0]])
        return encode_sizes(self.transformed_sizes)


def encode_index_text(index: ChunkIndex) -> str:
    """The size list wrapped as a zstd frame (content size in its header), base64: the manifest's form."""
    raw = zstandard.ZstdCompressor(level=3, write_content_size=True).compress(index.body())
    return base64.b64encode(raw).decode("ascii")


def decode_index_text(text: str, kind: str, chunk_size: int, original_size: int, what: str = "chunk index") -> ChunkIndex:
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
        body = zstandard.ZstdDecompressor().decompress(raw, max_output_size=1 << 26)
    except (binascii.Error, UnicodeEncodeError, zstandard.ZstdError, ValueError) as e:
        raise FormatError(f"{what}: not base64 zstd: {e}") from None
    sizes = decode_sizes(body, what)
    n = -(-original_size // chunk_size) if chunk_size > 0 else 0
    if kind == KIND_FIXED:
        if n == 0 and not sizes:
            return ChunkIndex(chunk_size, original_size, (), KIND_FIXED)
        if n == 1 and len(sizes) == 1:
            return ChunkIndex(chunk_size, original_size, (sizes[0],), KIND_FIXED)
        if len(sizes) != 2:
            raise FormatError(f"{what}: a fixed index holds 2 sizes (chunk, final), got {len(sizes)}")
        return ChunkIndex.fixed(chunk_size, original_size, sizes[0], sizes[1])
    if kind != KIND_VARIABLE:
        raise FormatError(f"{what}: unknown chunk index kind {kind!r}")
    return ChunkIndex(chunk_size, original_size, tuple(sizes), KIND_VARIABLE)

