"""Caches of decoded chunks of transformed objects (spec/04 "Read path and caches").

Readers of chunked objects (:class:`~tieredcore.cold.transformed.TransformedBlobStore`) ask the cache
for chunk ids; what is missing is fetched with one ranged GET per run of adjacent chunks. The cache:

- is bounded by bytes (least recently used first out) and expires entries not accessed for a while;
- is **single-flight** per chunk: concurrent readers of one missing chunk cause one GET, the others wait
  for its result;
- **never caches a failure**: a load that fails is forgotten, the next reader tries again;
- prefetches the next ``prefetch`` bytes of an object after each access, in the background, never
  past the object's end.

:class:`MemoryChunkCache` keeps chunks in memory; :class:`DiskChunkCache` in files under a directory it
wipes when it starts, each written to a temporary file and renamed into place. **The disk cache holds
decoded (decrypted, decompressed) chunks: plaintext on local disk.** Put it on an encrypted volume or
use the memory cache for encrypted namespaces (docs/formats.md "Chunked objects").
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tieredcore.errors import ValidationError

__all__ = ["CacheStats", "ChunkCache", "DiskChunkCache", "MemoryChunkCache", "open_chunk_cache"]

ChunkKey = tuple[str, int]  # (object identity, chunk id)
Loader = Callable[[Sequence[int]], dict[int, bytes]]  # chunk ids (adjacent) -> their decoded bytes


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    expirations: int = 0
    loads: int = 0  # ranged GETs issued for missing chunks (one per run of adjacent chunks)
    load_failures: int = 0
    prefetched: int = 0  # chunks loaded ahead of readers
    waits: int = 0  # readers that waited for another reader's load (single flight)

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class _Entry:
    size: int
    accessed: float
    data: bytes | None = None  # memory cache
    path: Path | None = None  # disk cache


@dataclass
class _Flight:
    future: Future = field(default_factory=Future)


class ChunkCache(ABC):
    """The shared logic; subclasses store the bytes (memory or disk)."""

    kind = ""

    def __init__(self, max_bytes: int, *, ttl_s: float = 600.0, prefetch: int = 0,
                 clock: Callable[[], float] = time.monotonic, prefetch_workers: int = 2) -> None:
        if max_bytes <= 0:
            raise ValidationError(f"chunk cache size must be positive, got {max_bytes}")
        if ttl_s <= 0 or prefetch < 0:
            raise ValidationError("chunk cache: expiry must be positive and prefetch non-negative")
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self.prefetch = prefetch
        self.clock = clock
        self.stats = CacheStats()
        self._lock = threading.Lock()
        self._entries: OrderedDict[ChunkKey, _Entry] = OrderedDict()
        self._bytes = 0
        self._flights: dict[ChunkKey, _Flight] = {}
        self._pool = ThreadPoolExecutor(max_workers=prefetch_workers, thread_name_prefix="chunk-prefetch") \
            if prefetch else None
        self._pending: list[Future] = []

    # -- storage (subclasses) ------------------------------------------------------------------

    @abstractmethod
    def _store(self, key: ChunkKey, data: bytes) -> _Entry: ...

    @abstractmethod
    def _load_entry(self, e: _Entry) -> bytes: ...

    def _drop(self, e: _Entry) -> None:  # noqa: B027 - only the disk cache has something to remove
        return None

    # -- the protocol --------------------------------------------------------------------------

    @property
    def bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def _lookup(self, key: ChunkKey, now: float) -> bytes | None:
        e = self._entries.get(key)
        if e is None:
            return None
        if now - e.accessed > self.ttl_s:
            self._evict(key, expired=True)
            return None
        try:
            data = self._load_entry(e)
        except OSError:  # a disk entry gone or unreadable: a miss
            self._evict(key)
            return None
        e.accessed = now
        self._entries.move_to_end(key)
        return data

    def _evict(self, key: ChunkKey, expired: bool = False) -> None:
        e = self._entries.pop(key, None)
        if e is None:
            return
        self._bytes -= e.size
        self._drop(e)
        if expired:
            self.stats.expirations += 1
        else:
            self.stats.evictions += 1

    def _put(self, key: ChunkKey, data: bytes) -> None:
        if len(data) > self.max_bytes:
            return  # larger than the whole cache: served, not kept
        if key in self._entries:
            self._evict(key)
        e = self._store(key, data)
        e.accessed = self.clock()
        self._entries[key] = e
        self._bytes += e.size
        while self._bytes > self.max_bytes and self._entries:
            self._evict(next(iter(self._entries)))

    def get_chunks(self, obj: str, ids: Sequence[int], load: Loader, *, last_chunk: int | None = None,
                   chunk_size: int = 0) -> dict[int, bytes]:
        """The decoded chunks ``ids`` (adjacent, ascending) of object ``obj``: cached ones served, missing
        ones loaded by ``load`` (one call per run of adjacent chunks nobody is loading), chunks another
        reader is loading awaited. ``last_chunk``/``chunk_size``: the object's last chunk id and chunk
        size, for the prefetch after this access."""
        out: dict[int, bytes] = {}
        waits: dict[int, Future] = {}
        mine: list[int] = []
        now = self.clock()
        with self._lock:
            for i in ids:
                k = (obj, i)
                data = self._lookup(k, now)
                if data is not None:
                    self.stats.hits += 1
                    out[i] = data
                    continue
                self.stats.misses += 1
                f = self._flights.get(k)
                if f is not None:
                    self.stats.waits += 1
                    waits[i] = f.future
                else:
                    self._flights[k] = _Flight()
                    mine.append(i)
        if mine:
            out.update(self._fill(obj, mine, load))
        for i, fut in waits.items():
            out[i] = fut.result()  # a failed load raises here too (and was not cached)
        if self.prefetch and last_chunk is not None and chunk_size > 0 and ids:
            self._schedule_prefetch(obj, ids[-1], last_chunk, chunk_size, load)
        return out

    def _fill(self, obj: str, mine: list[int], load: Loader) -> dict[int, bytes]:
        """Load our flights, one ``load`` per run of adjacent ids; settle every flight either way."""
        runs: list[list[int]] = []
        for i in mine:
            if runs and runs[-1][-1] == i - 1:
                runs[-1].append(i)
            else:
                runs.append([i])
        out: dict[int, bytes] = {}
        error: BaseException | None = None
        for run in runs:
            if error is None:
                try:
                    got = load(run)
                    with self._lock:
                        self.stats.loads += 1
                    missing = [i for i in run if i not in got]
                    if missing:
                        raise ValidationError(f"{obj}: chunk load returned no chunk {missing[0]}")
                    out.update({i: got[i] for i in run})
                except BaseException as e:  # settle the waiters below, then re-raise
                    error = e
                    with self._lock:
                        self.stats.load_failures += 1
            with self._lock:
                for i in run:
                    f = self._flights.pop((obj, i), None)
                    if error is None:
                        self._put((obj, i), out[i])
                        if f is not None:
                            f.future.set_result(out[i])
                    elif f is not None:
                        f.future.set_exception(error)
        if error is not None:
            raise error
        return out

    def _schedule_prefetch(self, obj: str, after: int, last_chunk: int, chunk_size: int, load: Loader) -> None:
        n = max(1, -(-self.prefetch // chunk_size))
        want = list(range(after + 1, min(last_chunk, after + n) + 1))  # never past the object's end
        if not want or self._pool is None:
            return
        with self._lock:
            todo = [i for i in want if (obj, i) not in self._entries and (obj, i) not in self._flights]
            # only a leading run of adjacent ids: one GET
            run: list[int] = []
            for i in todo:
                if run and i != run[-1] + 1:
                    break
                run.append(i)
            for i in run:
                self._flights[(obj, i)] = _Flight()
        if not run:
            return

        def work() -> None:
            try:
                self._fill(obj, run, load)
                with self._lock:
                    self.stats.prefetched += len(run)
            except Exception:  # noqa: BLE001 - a prefetch failure is only a missed optimisation
                pass

        fut = self._pool.submit(work)
        with self._lock:
            self._pending = [p for p in self._pending if not p.done()] + [fut]

    def wait_prefetch(self, timeout: float | None = 30.0) -> None:
        """Block until scheduled prefetches are done (tests; orderly shutdown)."""
        with self._lock:
            pending = list(self._pending)
        for p in pending:
            p.result(timeout=timeout)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def describe(self) -> dict[str, Any]:
        with self._lock:
            return {"kind": self.kind, "max_bytes": self.max_bytes, "bytes": self._bytes,
                    "entries": len(self._entries), "prefetch": self.prefetch, "ttl_s": self.ttl_s,
                    **self.stats.as_dict()}


class MemoryChunkCache(ChunkCache):
    kind = "memory"

    def _store(self, key: ChunkKey, data: bytes) -> _Entry:
        return _Entry(len(data), 0.0, data=bytes(data))

    def _load_entry(self, e: _Entry) -> bytes:
        assert e.data is not None
        return e.data


class DiskChunkCache(ChunkCache):
    """Chunks as files under ``root`` (wiped when the cache starts: entries of an earlier process are
    not trusted). Plaintext on disk (see the module docstring)."""

    kind = "disk"

    def __init__(self, root: str | Path, max_bytes: int, **kw: Any) -> None:
        super().__init__(max_bytes, **kw)
        self.root = Path(root)
        if self.root.exists():
            shutil.rmtree(self.root)
        self.root.mkdir(parents=True, mode=0o700)
        self._seq = 0

    def _store(self, key: ChunkKey, data: bytes) -> _Entry:
        self._seq += 1
        path = self.root / f"c{self._seq:012d}"
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)  # a reader never sees a partly written chunk
        return _Entry(len(data), 0.0, path=path)

    def _load_entry(self, e: _Entry) -> bytes:
        assert e.path is not None
        return e.path.read_bytes()

    def _drop(self, e: _Entry) -> None:
        if e.path is not None:
            with contextlib.suppress(FileNotFoundError):
                e.path.unlink()


def open_chunk_cache(spec: str, max_bytes: int, *, ttl_s: float = 600.0, prefetch: int = 0) -> ChunkCache | None:
    """``none`` | ``memory`` | ``disk:/abs/dir`` (the configuration's ``chunk_cache``)."""
    if spec in ("", "none"):
        return None
    if spec == "memory":
        return MemoryChunkCache(max_bytes, ttl_s=ttl_s, prefetch=prefetch)
    if spec.startswith("disk:") and spec[5:].startswith("/"):
        return DiskChunkCache(spec[5:], max_bytes, ttl_s=ttl_s, prefetch=prefetch)
    raise ValidationError(f"chunk cache {spec!r}: none, memory or disk:/absolute/directory")
