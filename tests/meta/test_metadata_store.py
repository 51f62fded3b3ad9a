"""The SQLite metadata store: the MetadataStore contract (tests/support/meta_contract.py; ZooKeeper runs it
in test_zookeeper.py), then what is SQLite's own: its file and schema, closing, processes sharing the file,
broken databases; and the path helpers every store uses."""

from __future__ import annotations

import multiprocessing
import sqlite3

import pytest

from tests.support.meta_contract import MetadataStoreContract, cas_increment
from tieredcore.errors import MetadataStoreError, ValidationError
from tieredcore.meta.managed_ledgers import ManagedLedgerStore
from tieredcore.meta.sqlite import SqliteMetadataStore
from tieredcore.meta.store import Versioned, join_path, parent_path, validate_path


class TestSqliteStoreContract(MetadataStoreContract):
    @pytest.fixture
    def store(self, tmp_path):
        s = SqliteMetadataStore(tmp_path / "meta.db")
        yield s
        s.close()


def test_path_helpers():
    assert validate_path("/a/b.c/d-e") == "/a/b.c/d-e"
    assert validate_path("/", allow_root=True) == "/"
    assert parent_path("/a/b") == "/a"
    assert parent_path("/a") == "/"
    assert join_path("a", "b") == "/a/b"
    with pytest.raises(ValidationError):
        join_path("a/b", "c")
    with pytest.raises(ValidationError):
        join_path("..")
    with pytest.raises(ValidationError, match="str"):
        validate_path(b"/a")


# --- persistence, processes ------------------------------------------------------------------------


def test_persistent_across_instances_and_wal(tmp_path):
    db = tmp_path / "m.db"
    with SqliteMetadataStore(db) as s:
        s.create("/k", b"v")
    s2 = SqliteMetadataStore(str(db))
    assert s2.get("/k") == Versioned(b"v", 0)
    s2.close()
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    cols = [r[1] for r in conn.execute("PRAGMA table_info(nodes)")]
    assert cols == ["path", "parent", "value", "version", "mtime"]
    assert conn.execute("SELECT parent FROM nodes WHERE path = '/k'").fetchone()[0] == "/"
    idx = [r[1] for r in conn.execute("PRAGMA index_list(nodes)")]
    assert "nodes_parent" in idx
    conn.close()


def test_closed_store_raises(tmp_path):
    s = SqliteMetadataStore(tmp_path / "m.db")
    s.close()
    s.close()  # idempotent
    with pytest.raises(MetadataStoreError, match="closed"):
        s.get("/a")


def _proc_worker(db: str, inherited: SqliteMetadataStore | None, n: int, q) -> None:
    try:
        s = inherited if inherited is not None else SqliteMetadataStore(db)
        for _ in range(n):
            cas_increment(s, "/counter")
        mls = ManagedLedgerStore(s)
        for _ in range(n):

            def bump(info):
                kv = {p.key: p.value for p in info.properties}
                del info.properties[:]
                info.properties.add(key="count", value=str(int(kv.get("count", "0")) + 1))

            mls.update_topic("t/ns/counter", bump, max_attempts=10_000)
        s.close()
        q.put(None)
    except BaseException as e:  # pragma: no cover - reported to the parent
        q.put(repr(e))


def test_processes_cas_counter(tmp_path):
    db = str(tmp_path / "meta.db")
    parent = SqliteMetadataStore(db)
    parent.create("/counter", b"0")
    mls = ManagedLedgerStore(parent)
    mls.create_topic("t/ns/counter")
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    # two workers open their own store, two use the store inherited through fork
    procs = [ctx.Process(target=_proc_worker, args=(db, parent if i % 2 else None, 50, q)) for i in range(4)]
    for p in procs:
        p.start()
    results = [q.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert results == [None] * 4
    assert all(p.exitcode == 0 for p in procs)
    assert parent.get("/counter") == Versioned(b"200", 200)
    info, version = mls.get_topic("t/ns/counter")
    assert {p.key: p.value for p in info.properties} == {"count": "200"}
    assert version == 200
    parent.close()


# --- broken databases ---------------------------------------------------------------------------


def test_directory_at_path_is_metadata_store_error(tmp_path):
    d = tmp_path / "adir"
    d.mkdir()
    with pytest.raises(MetadataStoreError, match=r"cannot open metadata store .*adir"):
        SqliteMetadataStore(d)


def test_garbage_file_is_metadata_store_error(tmp_path):
    f = tmp_path / "garbage.db"
    f.write_bytes(b"this is not a database" * 100)
    with pytest.raises(MetadataStoreError, match=r"garbage\.db.*not a database"):
        SqliteMetadataStore(f)


def test_missing_parent_directory_is_metadata_store_error(tmp_path):
    with pytest.raises(MetadataStoreError, match="cannot open"):
        SqliteMetadataStore(tmp_path / "no" / "such" / "dir" / "m.db")


def test_backend_failure_mid_operation_is_metadata_store_error(tmp_path):
    db = tmp_path / "m.db"
    s = SqliteMetadataStore(db)
    s.create("/a", b"1")
    conn = sqlite3.connect(db)
    conn.execute("DROP TABLE nodes")  # simulate a broken backend under the open store
    conn.commit()
    conn.close()
    with pytest.raises(MetadataStoreError, match=r"put /a failed.*outcome unknown"):
        s.put("/a", b"2", 0)
    with pytest.raises(MetadataStoreError, match="get /a"):
        s.get("/a")
    s.close()


def test_constructor_rejects_memory_and_short_timeout(tmp_path):
    with pytest.raises(ValidationError):
        SqliteMetadataStore(":memory:")
    with pytest.raises(ValidationError):
        SqliteMetadataStore(tmp_path / "m.db", busy_timeout_s=1)
