"""Small helpers shared by the filesystem store (fs.py) and its multipart emulation (fs_multipart.py).

Paths are bytes there (keys encoded as UTF-8), so these take bytes.
"""

from __future__ import annotations

import os
from contextlib import suppress


def short_repr(key: object) -> str:
    """repr() of a key or upload id for an error message, cut to 200 characters."""
    r = repr(key)
    return r if len(r) <= 200 else r[:197] + "..."


def unlink_quiet(path: bytes, dir_fd: int | None = None) -> None:
    with suppress(FileNotFoundError, NotADirectoryError):
        os.unlink(path, dir_fd=dir_fd)


def fsync_dir(path: bytes) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
