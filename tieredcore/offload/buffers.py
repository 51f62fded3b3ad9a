"""Reused block and part buffers of the offloader."""

from __future__ import annotations

import mmap
import threading
from contextlib import suppress


class BufferPool:
    """Block buffers reused across blocks and ledgers; at most `keep` idle buffers are retained.

    Buffers are anonymous mmaps: the kernel supplies zero pages lazily as the read-ahead thread fills
    them, where bytearray(n) would memset all n bytes up front on the caller's thread."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._idle: list[mmap.mmap] = []
        self._lock = threading.Lock()

    def take(self, size: int) -> mmap.mmap:
        with self._lock:
            for i, b in enumerate(self._idle):
                if len(b) >= size and not b.closed:
                    return self._idle.pop(i)
        return mmap.mmap(-1, max(size, 1))

    def give(self, buf: mmap.mmap) -> None:
        with self._lock:
            self._idle.append(buf)
            self._idle.sort(key=len, reverse=True)
            extra, self._idle = self._idle[self.keep :], self._idle[: self.keep]
        for b in extra:
            # a view of it may still be alive (e.g. held by the traceback of a failed upload): then it is
            # left to the garbage collector; reusing a buffer with stale views is harmless, closing is not
            with suppress(BufferError):
                b.close()
