"""Per-chunk zstd and AES-256-GCM: round trips, the compressibility heuristic, and authentication that
binds every chunk to its object and position."""

from __future__ import annotations

import os
import random
import threading

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from tieredcore.errors import CorruptObjectError, ValidationError
from tieredcore.formats.transform import (
    GCM_OVERHEAD,
    ChunkTransformer,
    TransformSpec,
    new_data_key,
    worth_compressing,
)

TEXT = b"".join(b"entry %06d: the quick brown fox jumps over the lazy dog\n" % i for i in range(2000))


@settings(max_examples=40, deadline=None)
@given(data=st.binary(max_size=5000), compress=st.booleans(), encrypt=st.booleans(), index=st.integers(0, 10**6))
def test_round_trip(data, compress, encrypt, index):
    t = ChunkTransformer("p/obj", compress=compress, data_key=new_data_key() if encrypt else None)
    out = t.apply(index, data)
    if encrypt:
        assert bytes(out) != data or not data
    assert bytes(t.invert(index, out, len(data))) == data


def test_zstd_frames_carry_content_size_and_gcm_adds_28_bytes():
    z = ChunkTransformer("o", compress=True, data_key=None)
    frame = z.apply(0, TEXT)
    assert zstandard.get_frame_parameters(frame).content_size == len(TEXT)
    assert len(frame) < len(TEXT) // 5
    a = ChunkTransformer("o", compress=False, data_key=new_data_key())
    assert len(a.apply(0, TEXT)) == len(TEXT) + GCM_OVERHEAD


def test_heuristic_skips_incompressible_and_compressed_data():
    assert worth_compressing(TEXT)
    assert not worth_compressing(os.urandom(65536))
    rnd = random.Random(7)
    records = b"".join(b'{"id": %d, "price": %.6f, "qty": %d}\n' % (i, rnd.random() * 1000, rnd.randrange(10**6))
                       for i in range(5000))
    assert worth_compressing(records)
    assert not worth_compressing(zstandard.ZstdCompressor().compress(records))  # never double-compressed
    assert not worth_compressing(b"")


def test_swapped_moved_truncated_or_tampered_chunks_fail():
    key = new_data_key()
    t = ChunkTransformer("p/obj-1", compress=True, data_key=key)
    c0, c1 = t.apply(0, TEXT[:1000]), t.apply(1, TEXT[1000:2000])
    with pytest.raises(CorruptObjectError, match="chunk 1 failed authentication"):
        t.invert(1, c0, 1000)  # chunk 0 served in place of chunk 1
    other = ChunkTransformer("p/obj-2", compress=True, data_key=key)
    with pytest.raises(CorruptObjectError, match="failed authentication"):
        other.invert(0, c0, 1000)  # the same chunk under another object's id
    with pytest.raises(CorruptObjectError, match="failed authentication"):
        t.invert(1, c1[:-1], 1000)  # truncated
    flipped = bytearray(c1)
    flipped[20] ^= 1
    with pytest.raises(CorruptObjectError, match="failed authentication"):
        t.invert(1, bytes(flipped), 1000)
    with pytest.raises(CorruptObjectError, match="shorter than its nonce"):
        t.invert(1, c1[:10], 1000)
    wrong = ChunkTransformer("p/obj-1", compress=True, data_key=new_data_key())
    with pytest.raises(CorruptObjectError, match="wrong data key"):
        wrong.invert(0, c0, 1000)


def test_decompressed_size_is_checked():
    t = ChunkTransformer("o", compress=True, data_key=None)
    with pytest.raises(CorruptObjectError, match="expected 999|does not decompress"):
        t.invert(0, t.apply(0, TEXT[:1000]), 999)


def test_spec_validation():
    assert TransformSpec("zstd+aes").compression and TransformSpec("zstd+aes").encryption
    assert not TransformSpec().active
    for bad in ({"name": "gzip"}, {"chunk_size": 100}, {"level": 0}, {"chunk_size": True}):
        with pytest.raises(ValidationError):
            TransformSpec(**bad)
    with pytest.raises(ValidationError, match="data key"):
        ChunkTransformer("o", compress=False, data_key=b"short")


def test_one_transformer_inverts_chunks_from_many_threads():
    """A store caches one transformer per object; its readers and the chunk cache's prefetch threads
    invert chunks concurrently (a shared zstd decompression context corrupted output, or crashed)."""
    rnd = random.Random(7)
    chunks = [b"".join(b"%06d %s\n" % (i, b"abcdefgh" * rnd.randrange(1, 9)) for i in range(8000)) for _ in range(4)]
    t = ChunkTransformer("p/obj", compress=True, data_key=new_data_key())
    stored = [t.apply(i, c) for i, c in enumerate(chunks)]
    start = threading.Barrier(4)
    failures: list[BaseException] = []

    def work(k: int) -> None:
        start.wait()
        for n in range(60):
            i = (k + n) % len(chunks)
            try:
                assert bytes(t.invert(i, stored[i], len(chunks[i]))) == chunks[i]
            except BaseException as e:  # noqa: BLE001 - reported by the assertion below
                failures.append(e)
                return

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert failures == []
