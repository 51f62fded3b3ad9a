"""Per-chunk transforms of chunked objects (spec/04 "Compression", "Encryption"): zstd, then AES-256-GCM.

- **zstd**: each chunk an independent frame with its content size in the header (a reader knows the
  size to expect and checks it). Whether an object is compressed at all is decided once, on its first
  chunk (:func:`worth_compressing`): payloads already compressed or random gain nothing and only cost
  CPU, so such objects are stored uncompressed (never double-compressed).
- **AES-256-GCM**: a random 256-bit data key per object; per chunk a fresh random 12-byte nonce, wire
  layout ``nonce(12) ‖ ciphertext ‖ tag(16)`` (+28 bytes). The additional authenticated data binds each
  chunk to its object and position (:func:`chunk_aad`): a chunk swapped with another, moved to another
  position or object, or truncated fails authentication instead of decrypting into wrong data.

The data key is wrapped by a key ring's RSA key (:mod:`tieredcore.cold.keyring`); this module only
transforms bytes.
"""

from __future__ import annotations

import os
import struct
import threading
from dataclasses import dataclass

import zstandard
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from tieredcore.errors import CorruptObjectError, ValidationError

__all__ = [
    "GCM_OVERHEAD",
    "TRANSFORMS",
    "ChunkTransformer",
    "TransformSpec",
    "chunk_aad",
    "new_data_key",
    "worth_compressing",
]

NONCE_SIZE = 12
TAG_SIZE = 16
GCM_OVERHEAD = NONCE_SIZE + TAG_SIZE
DATA_KEY_SIZE = 32
TRANSFORMS = ("none", "zstd", "aes", "zstd+aes")
MIN_CHUNK_SIZE = 4096
MAX_CHUNK_SIZE = 64 * 1024 * 1024
DEFAULT_CHUNK_SIZE = 4 * 1024 * 1024
DEFAULT_LEVEL = 3
# the first chunk must shrink to at most this fraction of its size for the object to be compressed
COMPRESS_MAX_RATIO = 0.9


@dataclass(frozen=True)
class TransformSpec:
    """A namespace's transform: ``none`` | ``zstd`` | ``aes`` | ``zstd+aes``, chunk size, zstd level."""

    name: str = "none"
    chunk_size: int = DEFAULT_CHUNK_SIZE
    level: int = DEFAULT_LEVEL

    def __post_init__(self) -> None:
        if self.name not in TRANSFORMS:
            raise ValidationError(f"transform {self.name!r} is not one of {', '.join(TRANSFORMS)}")
        if isinstance(self.chunk_size, bool) or not isinstance(self.chunk_size, int) \
                or not MIN_CHUNK_SIZE <= self.chunk_size <= MAX_CHUNK_SIZE:
            raise ValidationError(f"chunk size {self.chunk_size!r} is not within {MIN_CHUNK_SIZE}..{MAX_CHUNK_SIZE}")
        if isinstance(self.level, bool) or not isinstance(self.level, int) or not 1 <= self.level <= 22:
            raise ValidationError(f"zstd level {self.level!r} is not within 1..22")

    @property
    def compression(self) -> bool:
        return self.name.startswith("zstd")

    @property
    def encryption(self) -> bool:
        return self.name.endswith("aes")

    @property
    def active(self) -> bool:
        return self.name != "none"


def chunk_aad(object_id: str, index: int) -> bytes:
    """Authenticated data of chunk ``index`` of object ``object_id`` (its key without the prefix)."""
    return b"tiered-chunk\x00" + object_id.encode("utf-8") + b"\x00" + struct.pack(">q", index)


def new_data_key() -> bytes:
    return AESGCM.generate_key(bit_length=DATA_KEY_SIZE * 8)


def worth_compressing(sample: bytes | bytearray | memoryview, level: int = DEFAULT_LEVEL) -> bool:
    """Whether compressing pays off, measured on a sample (an object's first chunk)."""
    if len(sample) == 0:
        return False
    packed = zstandard.ZstdCompressor(level=level).compress(sample)
    return len(packed) <= COMPRESS_MAX_RATIO * len(sample)


class ChunkTransformer:
    """Transforms the chunks of one object: ``apply`` on write, ``invert`` on read."""

    def __init__(self, object_id: str, *, compress: bool, data_key: bytes | None, level: int = DEFAULT_LEVEL) -> None:
        if data_key is not None and len(data_key) != DATA_KEY_SIZE:
            raise ValidationError(f"data key of {len(data_key)} bytes, AES-256 needs {DATA_KEY_SIZE}")
        self.object_id = object_id
        self.compress = compress
        self.level = level
        self._aes = AESGCM(data_key) if data_key is not None else None
        # zstd contexts are not thread safe and one transformer serves concurrent readers (a store's
        # cached object, the chunk cache's prefetch threads): one context per thread
        self._local = threading.local()

    @property
    def _zc(self) -> zstandard.ZstdCompressor | None:
        if not self.compress:
            return None
        zc = getattr(self._local, "zc", None)
        if zc is None:
            zc = self._local.zc = zstandard.ZstdCompressor(level=self.level, write_content_size=True)
        return zc

    @property
    def _zd(self) -> zstandard.ZstdDecompressor | None:
        if not self.compress:
            return None
        zd = getattr(self._local, "zd", None)
        if zd is None:
            zd = self._local.zd = zstandard.ZstdDecompressor()
        return zd

    @property
    def identity(self) -> bool:
        return not self.compress and self._aes is None

    def apply(self, index: int, data: bytes | bytearray | memoryview, *,
              into: bytearray | None = None) -> bytes | bytearray | memoryview:
        """The chunk's stored bytes (``data`` itself when neither compressed nor encrypted). ``into``: a
        buffer whose contents are no longer needed, reused for the encrypted chunk when its size fits."""
        zc = self._zc
        out = zc.compress(data) if zc is not None else data
        if self._aes is None:
            return out
        # nonce, ciphertext and tag written into one buffer (no copy of the chunk to prepend the nonce)
        size = NONCE_SIZE + memoryview(out).nbytes + TAG_SIZE
        sealed = into if into is not None and len(into) == size else bytearray(size)
        nonce = os.urandom(NONCE_SIZE)
        sealed[:NONCE_SIZE] = nonce
        self._aes.encrypt_into(nonce, out, chunk_aad(self.object_id, index), memoryview(sealed)[NONCE_SIZE:])
        return sealed

    def invert(self, index: int, data: bytes | memoryview, original_size: int) -> bytes | memoryview:
        """The chunk's original bytes; CorruptObjectError when it fails authentication or its size."""
        out: bytes | memoryview = data
        if self._aes is not None:
            if len(data) < GCM_OVERHEAD:
                raise CorruptObjectError(f"{self.object_id}: chunk {index} is {len(data)} bytes, shorter than "
                                         f"its nonce and tag")
            mv = memoryview(data)
            try:
                out = self._aes.decrypt(mv[:NONCE_SIZE], mv[NONCE_SIZE:], chunk_aad(self.object_id, index))
            except InvalidTag:
                raise CorruptObjectError(f"{self.object_id}: chunk {index} failed authentication (tampered, "
                                         f"swapped or truncated data, or the wrong data key)") from None
        zd = self._zd
        if zd is not None:
            try:
                out = zd.decompress(out, max_output_size=original_size)
            except zstandard.ZstdError as e:
                raise CorruptObjectError(f"{self.object_id}: chunk {index} does not decompress: {e}") from None
        if len(out) != original_size:
            raise CorruptObjectError(f"{self.object_id}: chunk {index} holds {len(out)} bytes, expected "
                                     f"{original_size}")
        return out
