"""The filesystem store's lock descriptor is closed with the store (found by the model-based test,
tests/model/test_system_model.py: every Workspace opens its stores again, and a long-lived process — a
reused Spark Python worker, the Airflow plugin's web view — ran out of descriptors after about a
thousand workspaces: "Too many open files")."""

from __future__ import annotations

import gc
import os
from pathlib import Path

from tieredcore.cold.backends.fs import FilesystemBlobStore


def open_fds(under: Path) -> int:
    """Descriptors of this process open on files under ``under``: only the store's own (a process-wide
    count also sees other tests' background threads — servers, pools — opening files meanwhile)."""
    root = str(under.resolve())
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed between the listing and the readlink
            continue
        n += target == root or target.startswith(root + "/")
    return n


def test_a_dropped_store_leaves_no_descriptor_open(tmp_path: Path) -> None:
    FilesystemBlobStore(tmp_path, fsync=False).put("warm-up", b"x")  # imports, caches: not counted
    gc.collect()
    before = open_fds(tmp_path)
    assert before == 0
    for i in range(50):
        store = FilesystemBlobStore(tmp_path, fsync=False)
        store.put(f"k{i}", b"data")  # takes the store lock (opens its descriptor)
        assert store.head(f"k{i}").size == 4
        del store
    gc.collect()
    assert open_fds(tmp_path) == before


def test_the_lock_still_works_after_a_store_was_dropped(tmp_path: Path) -> None:
    a = FilesystemBlobStore(tmp_path, fsync=False)
    a.put("k", b"1")
    del a
    gc.collect()
    b = FilesystemBlobStore(tmp_path, fsync=False)
    b.put("k", b"2", if_absent=False)
    assert b.get("k") == b"2"
