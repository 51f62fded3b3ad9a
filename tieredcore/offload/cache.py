"""Bounded caches of the read path.

Pulsar once kept an unbounded entry-offset cache and ran out of memory (PR #22679); this one is an LRU
bounded by entry count with a time-to-live, shared by every handle of a process.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict


class OffsetCache:
    """Exact byte offsets of entries in offloaded data objects: (ledger, uuid, entry) -> offset."""

    def __init__(self, max_entries: int = 1_000_000, ttl_seconds: float = 300.0) -> None:
        self.max_entries = max_entries
        self.ttl = ttl_seconds
        self._d: OrderedDict[tuple[int, str, int], tuple[int, float]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, ledger_id: int, uuid: str, entry_id: int) -> int | None:
        k = (ledger_id, uuid, entry_id)
        with self._lock:
            v = self._d.get(k)
            if v is None:
                return None
            if v[1] < time.monotonic():
                del self._d[k]
                return None
            self._d.move_to_end(k)
            return v[0]

    def put(self, ledger_id: int, uuid: str, entry_id: int, offset: int) -> None:
        k = (ledger_id, uuid, entry_id)
        with self._lock:
            self._d[k] = (offset, time.monotonic() + self.ttl)
            self._d.move_to_end(k)
            while len(self._d) > self.max_entries:
                self._d.popitem(last=False)

    def __len__(self) -> int:
        return len(self._d)


SHARED_OFFSET_CACHE = OffsetCache()


class SegmentIndexCache:
    """Parsed V2 indexes of segments, by data key, for a short while: a compacted segment holds many
    ledgers, and a reader walking them would otherwise fetch and parse the same index once per ledger.
    Only readers use it (opt-in); checks that must see the store as it is now (scrub, verification)
    open indexes fresh."""

    def __init__(self, max_entries: int = 256, ttl_seconds: float = 30.0) -> None:
        self.max_entries = max_entries
        self.ttl = ttl_seconds
        self._d: OrderedDict[str, tuple[object, float]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> object | None:
        with self._lock:
            v = self._d.get(key)
            if v is None or v[1] < time.monotonic():
                self._d.pop(key, None)
                self.misses += 1
                return None
            self._d.move_to_end(key)
            self.hits += 1
            return v[0]

    def put(self, key: str, value: object) -> None:
        with self._lock:
            self._d[key] = (value, time.monotonic() + self.ttl)
            self._d.move_to_end(key)
            while len(self._d) > self.max_entries:
                self._d.popitem(last=False)


SHARED_SEGMENT_INDEX_CACHE = SegmentIndexCache()
