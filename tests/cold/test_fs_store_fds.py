"""The filesystem store's lock descriptor is closed with the store (found by the model-based test,
tests/model/test_system_model.py: every Workspace opens its stores again, and a long-lived process — a
reused Spark Python worker, the Airflow plugin's web view — ran out of descriptors after about a
thousand workspaces: "Too many open files")."""

from __future__ import annotations

import gc
import os
from pathlib import Path

from tieredcore.cold.backends.fs import FilesystemBlobStore


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_dropped_store_leaves_no_descriptor_open(tmp_path: Path) -> None:
    FilesystemBlobStore(tmp_path, fsync=False).put("warm-up", b"x")  # imports, caches: not counted
    gc.collect()
    before = open_fds()
    for i in range(50):
        store = FilesystemBlobStore(tmp_path, fsync=False)
        store.put(f"k{i}", b"data")  # takes the store lock (opens its descriptor)
        assert store.head(f"k{i}").size == 4
        del store
    gc.collect()
    assert open_fds() == before


def test_the_lock_still_works_after_a_store_was_dropped(tmp_path: Path) -> None:
    a = FilesystemBlobStore(tmp_path, fsync=False)
    a.put("k", b"1")
    del a
    gc.collect()
    b = FilesystemBlobStore(tmp_path, fsync=False)
    b.put("k", b"2", if_absent=False)
    assert b.get("k") == b"2"
