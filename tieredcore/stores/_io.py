"""Whole-buffer file I/O shared by the local stores (the OS may transfer less than asked)."""

from __future__ import annotations

import os

Buffer = bytes | bytearray | memoryview


def write_all(fd: int, data: Buffer, offset: int | None = None) -> int:
    """Write every byte of `data` (at `offset` with pwrite, else at the file position)."""
    mv = memoryview(data).cast("B") if not isinstance(data, bytes) else memoryview(data)
    done = 0
    while done < len(mv):
        done += os.write(fd, mv[done:]) if offset is None else os.pwrite(fd, mv[done:], offset + done)
    return done


def pread_exact(fd: int, size: int, offset: int) -> bytes:
    """`size` bytes from `offset`, fewer only at end of file."""
    buf = os.pread(fd, size, offset)
    if len(buf) == size or not buf:
        return buf
    parts = [buf]
    got = len(buf)
    while got < size:
        more = os.pread(fd, size - got, offset + got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def preadv_exact(fd: int, out: memoryview, offset: int) -> int:
    """Fill `out` from `offset` without an intermediate copy; returns bytes read (less only at EOF)."""
    done = 0
    while done < len(out):
        n = os.preadv(fd, [out[done:]], offset + done)
        if n == 0:
            break
        done += n
    return done
