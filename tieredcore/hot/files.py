"""File-descriptor chores of the local ledger store, shared by the store, its writer and its read
handles: close without raising, fsync a directory (so a rename or unlink in it is durable), and try
a writer's exclusive ``flock`` without waiting."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)
