"""Chunk caches of transformed objects: warm reads issue no GET, bounded by bytes, expiry after access,
one GET for concurrent readers of one chunk, failures never cached, prefetch never past the end, and a
disk cache that starts empty and never exposes a partial file."""

from __future__ import annotations

import threading
import time

import pytest

from tieredcore.cold.backends.fs import FilesystemBlobStore
from tieredcore.cold.chunk_cache import DiskChunkCache, MemoryChunkCache, open_chunk_cache
from tieredcore.cold.transformed import TransformedBlobStore
from tieredcore.errors import BlobStoreError, ValidationError
from tieredcore.formats.transform import TransformSpec

CHUNK = 4096
DATA = bytes((i * 7 + i // 300) % 256 for i in range(10 * CHUNK + 123))  # 11 chunks


class Gets:
    """The inner store's ranged GETs, counted; optionally failing or held until released."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.count = 0
        self.fail_next = 0
        self.gate: threading.Event | None = None

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def get_range(self, key, start, end):
        self.count += 1
        if self.gate is not None:
            assert self.gate.wait(10)
        if self.fail_next:
            self.fail_next -= 1
            raise BlobStoreError("injected GET failure")
        return self.inner.get_range(key, start, end)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _store(tmp_path, cache, transform="zstd"):
    inner = Gets(FilesystemBlobStore(tmp_path / "s"))
    s = TransformedBlobStore(inner, TransformSpec(transform, chunk_size=CHUNK), None, chunk_cache=cache)
    s.put("obj", DATA)
    return s, inner


@pytest.fixture(params=["memory", "disk"])
def make_cache(request, tmp_path):
    made = []

    def make(max_bytes=1 << 20, **kw):
        c = (MemoryChunkCache(max_bytes, **kw) if request.param == "memory"
             else DiskChunkCache(tmp_path / f"cache{len(made)}", max_bytes, **kw))
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def test_warm_reads_issue_no_get(tmp_path, make_cache):
    cache = make_cache()
    s, gets = _store(tmp_path, cache)
    assert s.get_range("obj", 5000, 5010) == DATA[5000:5011]
    assert gets.count == 1
    for a, b in ((5000, 5010), (CHUNK, 2 * CHUNK - 1), (4500, 4600)):
        assert s.get_range("obj", a, b) == DATA[a: b + 1]
    assert gets.count == 1 and cache.stats.hits == 3
    # a range over a cached and two missing chunks: the missing ones in one GET
    assert s.get_range("obj", CHUNK + 1, 3 * CHUNK + 5) == DATA[CHUNK + 1: 3 * CHUNK + 6]
    assert gets.count == 2


def test_bounded_by_bytes_and_evictions_during_reads(tmp_path, make_cache):
    cache = make_cache(max_bytes=2 * CHUNK)
    s, gets = _store(tmp_path, cache)
    for i in range(0, len(DATA), 1000):
        assert s.get_range("obj", i, i + 999) == DATA[i: i + 1000]
    assert cache.bytes <= 2 * CHUNK and len(cache) <= 2
    assert cache.stats.evictions >= 8


def test_expiry_after_access(tmp_path, make_cache):
    clock = Clock()
    cache = make_cache(ttl_s=60, clock=clock)
    s, gets = _store(tmp_path, cache)
    s.get_range("obj", 0, 10)
    clock.t += 59
    s.get_range("obj", 0, 10)  # an access renews it
    clock.t += 59
    s.get_range("obj", 0, 10)
    assert gets.count == 1
    clock.t += 61
    s.get_range("obj", 0, 10)
    assert gets.count == 2 and cache.stats.expirations == 1


def test_concurrent_readers_of_one_chunk_cause_one_get(tmp_path, make_cache):
    cache = make_cache()
    s, gets = _store(tmp_path, cache)
    s.open("obj")  # the manifest read is not what is counted
    gets.gate = threading.Event()
    results: list[bytes] = []
    threads = [threading.Thread(target=lambda: results.append(s.get_range("obj", 100, 200))) for _ in range(6)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 10
    while cache.stats.waits < 5 and time.monotonic() < deadline:  # the other five wait on the first's load
        time.sleep(0.001)
    gets.gate.set()
    for t in threads:
        t.join(10)
    assert results == [DATA[100:201]] * 6
    assert gets.count == 1 and cache.stats.waits == 5


def test_a_failed_load_is_not_cached(tmp_path, make_cache):
    cache = make_cache()
    s, gets = _store(tmp_path, cache)
    s.open("obj")
    gets.fail_next = 1
    with pytest.raises(BlobStoreError, match="injected"):
        s.get_range("obj", 0, 10)
    assert cache.stats.load_failures == 1 and len(cache) == 0
    assert s.get_range("obj", 0, 10) == DATA[:11]  # retried, served
    assert gets.count == 2


def test_prefetch_never_past_the_end(tmp_path, make_cache):
    cache = make_cache(prefetch=3 * CHUNK)
    s, gets = _store(tmp_path, cache)
    s.get_range("obj", 0, 10)
    cache.wait_prefetch()
    assert gets.count == 2  # the read, then chunks 1-3 in one GET
    before = gets.count
    assert s.get_range("obj", CHUNK, 4 * CHUNK - 1) == DATA[CHUNK: 4 * CHUNK]
    assert gets.count == before  # prefetched
    cache.wait_prefetch()
    s.get_range("obj", 9 * CHUNK, 9 * CHUNK + 1)  # chunk 9 of 0..10: only chunk 10 is left to prefetch
    cache.wait_prefetch()
    assert {k[1] for k in cache._entries} >= {9, 10} and max(k[1] for k in cache._entries) == 10
    n = gets.count
    assert s.get_range("obj", len(DATA) - 5, len(DATA) + 100) == DATA[-5:]
    cache.wait_prefetch()
    assert gets.count == n  # nothing beyond the last chunk was fetched


def test_disk_cache_starts_empty_and_writes_atomically(tmp_path):
    root = tmp_path / "dc"
    root.mkdir()
    (root / "stale").write_bytes(b"from an earlier process")
    cache = DiskChunkCache(root, 1 << 20)
    assert list(root.iterdir()) == []
    s, _ = _store(tmp_path, cache)
    s.get_range("obj", 0, 3 * CHUNK)
    files = sorted(p.name for p in root.iterdir())
    assert len(files) == 4 and not any(f.endswith(".tmp") for f in files)
    cache.close()


def test_open_chunk_cache_specs(tmp_path):
    assert open_chunk_cache("none", 10) is None
    assert isinstance(open_chunk_cache("memory", 10), MemoryChunkCache)
    assert isinstance(open_chunk_cache(f"disk:{tmp_path}/c", 10), DiskChunkCache)
    for bad in ("disk:relative", "redis"):
        with pytest.raises(ValidationError):
            open_chunk_cache(bad, 10)
    with pytest.raises(ValidationError):
        MemoryChunkCache(0)
