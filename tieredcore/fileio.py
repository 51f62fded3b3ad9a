"""Whole-buffer file I/O shared by the local stores (the OS may transfer less than asked)."""

from __future__ import annotations

import os

Buffer = bytes | bytearray | memoryview

# Large buffers go down in slices of this size: on the machines measured, one 64 MiB write() into a new
# file ran at a third to a half of the speed of the same bytes in 4 MiB writes (bench notes in README).
WRITE_SLICE = 4 * 1024 * 1024


def write_all(fd: int, data: Buffer, offset: int | None = None) -> int:
    """Write every byte of `data` (at `offset` with pwrite, else at the file position)."""
    mv = memoryview(data).cast("B") if not isinstance(data, bytes) else memoryview(data)
    done, total = 0, len(mv)
    while done < total:
        piece = mv[done : done + WRITE_SLICE]
        done += os.write(fd, piece) if offset is None else os.pwrite(fd, piece, offset + done)
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
