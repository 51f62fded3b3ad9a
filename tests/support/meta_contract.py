"""The MetadataStore contract as a base class: every metadata store's test module extends it.

A store's test class (``class TestXContract(MetadataStoreContract)``) overrides the ``store`` fixture to
give a fresh, empty store (closed after the test) and sets the capability flag below where the store
legitimately differs. Today: the embedded SQLite file (tests/meta/test_metadata_store.py) and a real
ZooKeeper (tests/meta/test_zookeeper.py, each test under a chroot of its own). The contract covers the
store's compare-and-set records, children, paths, transactions, second handles and threads, and the
typed ManagedLedgerStore on top of it.

The class name does not start with ``Test``: pytest collects only the subclasses.
"""

from __future__ import annotations

import pickle
import threading
from collections.abc import Iterator
from typing import ClassVar

import pytest

from tieredcore.errors import (
    FormatError,
    MetadataStoreError,
    NodeExistsError,
    NodeNotFoundError,
    TopicNotFoundError,
    ValidationError,
    VersionConflictError,
)
from tieredcore.formats.mlinfo import ManagedLedgerInfo, decode_managed_ledger_info, is_compressed
from tieredcore.meta.managed_ledgers import ManagedLedgerStore, find_ledger, topic_path
from tieredcore.meta.store import CheckOp, CreateOp, DeleteOp, MetadataStore, PutOp, Versioned
from tieredcore.names import TopicName


def cas_increment(store: MetadataStore, path: str) -> None:
    """Add one to the decimal counter at ``path`` by compare-and-set, retrying on conflicts."""
    while True:
        cur = store.get(path)
        assert cur is not None
        try:
            store.put(path, str(int(cur.value) + 1).encode(), cur.version)
            return
        except VersionConflictError:
            continue


def sample_info() -> ManagedLedgerInfo:
    info = ManagedLedgerInfo()
    for lid in (3, 7, 12):
        li = info.ledgerInfo.add(ledgerId=lid, entries=10, size=100, timestamp=1_700_000_000_000 + lid)
        li.properties.add(key="k", value=f"v{lid}")
    ctx = info.ledgerInfo[0].offloadContext
    ctx.uidMsb = -0x1234567890ABCDEF
    ctx.uidLsb = 0x7EDCBA0987654321
    ctx.complete = True
    ctx.bookkeeperDeleted = False
    ctx.timestamp = 1_700_000_001_000
    ctx.driverMetadata.name = "aws-s3"
    ctx.driverMetadata.properties.add(key="bucket", value="b1")
    seg = ctx.offloadSegment.add(uidMsb=1, uidLsb=-2, complete=False, assignedTimestamp=5, endEntryId=9)
    seg.driverMetadata.name = "filesystem"
    info.ledgerInfo[2].timestamp = 0  # open ledger
    info.terminatedPosition.ledgerId = 12
    info.terminatedPosition.entryId = 4
    info.properties.add(key="owner", value="me")
    return info


class MetadataStoreContract:
    """What every MetadataStore must do (tieredcore/meta/store.py), written once."""

    # ZooKeeper's tree: creating a record creates its missing ancestors as empty records of their own, a
    # record with children cannot be deleted alone, and an emptied ancestor stays (and stays listed).
    # Otherwise (SQLite) ancestors are implied by their descendants only.
    ancestors_are_records: ClassVar[bool] = False

    @pytest.fixture
    def store(self) -> Iterator[MetadataStore]:
        """A fresh, empty store, closed after the test: each store's contract class overrides this."""
        raise NotImplementedError(f"{type(self).__name__} must override the `store` fixture")

    # --- basic CAS semantics --------------------------------------------------------------------

    def test_protocol_conformance(self, store):
        assert isinstance(store, MetadataStore)

    def test_create_get_and_create_twice(self, store):
        assert store.get("/a/b") is None
        assert store.create("/a/b", b"one") == 0
        assert store.get("/a/b") == Versioned(b"one", 0)
        with pytest.raises(NodeExistsError, match="/a/b"):
            store.create("/a/b", b"two")
        assert store.get("/a/b") == Versioned(b"one", 0)

    def test_put_cas_increments_and_rejects_stale(self, store):
        store.create("/x", b"0")
        assert store.put("/x", b"1", 0) == 1
        assert store.put("/x", bytearray(b"2"), 1) == 2
        with pytest.raises(VersionConflictError) as ei:
            store.put("/x", b"stale", 1)
        msg = str(ei.value)
        assert "/x" in msg and "expected version 1" in msg and "found 2" in msg
        assert store.get("/x") == Versioned(b"2", 2)

    def test_put_on_missing_is_conflict(self, store):
        with pytest.raises(VersionConflictError, match="/nope.*does not exist"):
            store.put("/nope", b"v", 0)
        assert store.get("/nope") is None

    def test_set_upserts(self, store):
        assert store.set("/p", b"a") == 0
        assert store.set("/p", b"b") == 1
        assert store.get("/p") == Versioned(b"b", 1)

    def test_delete_with_and_without_version(self, store):
        store.create("/d", b"v")
        store.put("/d", b"w", 0)
        with pytest.raises(VersionConflictError, match="expected version 0, found 1"):
            store.delete("/d", 0)
        assert store.get("/d") is not None
        store.delete("/d", 1)
        assert store.get("/d") is None
        with pytest.raises(NodeNotFoundError, match="/d"):
            store.delete("/d")
        store.create("/d", b"again")  # recreated at version 0
        assert store.get("/d") == Versioned(b"again", 0)
        store.delete("/d")
        assert store.get("/d") is None

    def test_empty_value_and_binary_roundtrip(self, store):
        store.create("/e", b"")
        assert store.get("/e") == Versioned(b"", 0)
        blob = bytes(range(256)) * 10
        store.create("/bin", blob)
        assert store.get("/bin").value == blob

    def test_bad_values_and_versions(self, store):
        with pytest.raises(ValidationError):
            store.create("/v", "text")  # type: ignore[arg-type]
        store.create("/v", b"x")
        for bad in (-1, True, "0", 1.0):
            with pytest.raises(ValidationError):
                store.put("/v", b"y", bad)  # type: ignore[arg-type]

    # --- children -------------------------------------------------------------------------------

    def test_children_immediate_sorted_and_implicit(self, store):
        for p in ["/r/b", "/r/a", "/r/a/x/y", "/r/a-b", "/r/c/d", "/r/a0", "/other", "/r2/z"]:
            store.create(p, b"")
        assert store.children("/r") == ["a", "a-b", "a0", "b", "c"]
        assert store.children("/r/a") == ["x"]
        assert store.children("/r/a/x") == ["y"]
        assert store.children("/r/c") == ["d"]  # /r/c itself was never stored
        assert store.children("/r/b") == []
        assert store.children("/missing") == []
        assert store.children("/") == ["other", "r", "r2"]
        if self.ancestors_are_records:
            # ancestors made on the way are empty records of their own, a record with children cannot be
            # deleted alone, and an emptied ancestor stays listed
            assert store.get("/r/c") == Versioned(b"", 0)
            with pytest.raises(NodeExistsError):
                store.create("/r/c", b"late")
            with pytest.raises(MetadataStoreError, match="has children.*nothing was deleted"):
                store.delete("/r/a")
            assert store.get("/r/a/x/y") == Versioned(b"", 0)
            store.delete("/r/a/x/y")
            assert store.children("/r/a/x") == [] and store.children("/r") == ["a", "a-b", "a0", "b", "c"]
            return
        assert store.get("/r/c") is None
        store.create("/r/c", b"late")  # a record may appear where only descendants were
        store.delete("/r/a")
        assert store.children("/r") == ["a", "a-b", "a0", "b", "c"]  # /r/a/x/y still below
        store.delete("/r/a/x/y")
        assert store.children("/r") == ["a-b", "a0", "b", "c"]

    def test_children_many(self, store):
        store.transaction([CreateOp(f"/many/t{i:04d}/c", b"") for i in range(500)])
        if not self.ancestors_are_records:  # (else /many/t0001 already is a record: the empty ancestor)
            store.create("/many/t0001", b"")  # a record and a parent at once is listed once
        assert store.children("/many") == [f"t{i:04d}" for i in range(500)]

    # --- path validation ------------------------------------------------------------------------

    @pytest.mark.parametrize(
        "path",
        ["a/b", "", "/a/", "/a//b", "//a", "/a/./b", "/a/..", "/..", "/a\x00b", "/a\nb", "/a\ud800", "/"],
    )
    def test_invalid_paths_rejected(self, store, path):
        with pytest.raises(ValidationError):
            store.create(path, b"v")
        with pytest.raises(ValidationError):
            store.put(path, b"v", 0)
        with pytest.raises(ValidationError):
            store.delete(path)
        if path != "/":
            with pytest.raises(ValidationError):
                store.get(path)
            with pytest.raises(ValidationError):
                store.children(path)

    # --- multi-op transactions ------------------------------------------------------------------

    def test_transaction_all_applied(self, store):
        store.create("/t/a", b"a0")
        store.create("/t/b", b"b0")
        res = store.transaction(
            [
                CreateOp("/t/c", b"c0"),
                PutOp("/t/a", b"a1", 0),
                DeleteOp("/t/b", 0),
                CheckOp("/t/c", 0),
                PutOp("/t/c", b"c1", 0),  # sees the create above
            ]
        )
        assert res == [0, 1, None, None, 1]
        assert store.get("/t/a") == Versioned(b"a1", 1)
        assert store.get("/t/b") is None
        assert store.get("/t/c") == Versioned(b"c1", 1)
        assert store.transaction([]) == []

    @pytest.mark.parametrize(
        "bad_op, err",
        [
            (PutOp("/t/a", b"x", 5), VersionConflictError),
            (PutOp("/t/missing", b"x", 0), VersionConflictError),
            (CreateOp("/t/b", b"x"), NodeExistsError),
            (DeleteOp("/t/missing"), NodeNotFoundError),
            (DeleteOp("/t/b", 3), VersionConflictError),
            (CheckOp("/t/b", 1), VersionConflictError),
        ],
    )
    def test_transaction_one_failure_applies_nothing(self, store, bad_op, err):
        store.create("/t/a", b"a0")
        store.create("/t/b", b"b0")
        ops = [CreateOp("/t/new", b"n"), PutOp("/t/a", b"a1", 0), DeleteOp("/t/a", 1), bad_op]
        with pytest.raises(err, match=f"transaction op {len(ops)} of {len(ops)}"):
            store.transaction(ops)
        assert store.get("/t/new") is None
        assert store.get("/t/a") == Versioned(b"a0", 0)
        assert store.get("/t/b") == Versioned(b"b0", 0)

    def test_transaction_invalid_op_rejected_before_anything(self, store):
        with pytest.raises(ValidationError):
            store.transaction([CreateOp("/ok", b""), CreateOp("relative", b"")])
        assert store.get("/ok") is None
        with pytest.raises(ValidationError):
            store.transaction([object()])  # type: ignore[list-item]

    # --- handles and threads --------------------------------------------------------------------

    def test_pickle_reopens(self, store):
        store.create("/p", b"1")
        s2 = pickle.loads(pickle.dumps(store))
        assert s2.get("/p") == Versioned(b"1", 0)
        s2.close()
        assert store.get("/p") == Versioned(b"1", 0)  # the original is unaffected

    def test_threads_cas_counter(self, store):
        store.create("/counter", b"0")

        def work():
            for _ in range(50):
                cas_increment(store, "/counter")

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        got = store.get("/counter")
        assert got == Versioned(b"200", 200)

    # --- ManagedLedgerStore ---------------------------------------------------------------------

    @pytest.fixture
    def mls(self, store):
        return ManagedLedgerStore(store)

    def test_topic_roundtrip_with_offload_context(self, mls, store):
        info = sample_info()
        assert mls.create_topic("persistent://t/ns/topic-1", info) == 0
        got, version = mls.get_topic("t/ns/topic-1")
        assert version == 0
        assert got == info
        ctx = find_ledger(got, 3).offloadContext
        assert (ctx.uidMsb, ctx.uidLsb, ctx.complete, ctx.timestamp) == (
            -0x1234567890ABCDEF,
            0x7EDCBA0987654321,
            True,
            1_700_000_001_000,
        )
        assert ctx.HasField("bookkeeperDeleted") and not ctx.bookkeeperDeleted
        assert ctx.driverMetadata.properties[0].value == "b1"
        assert ctx.offloadSegment[0].uidLsb == -2
        assert find_ledger(got, 99) is None
        # Pulsar's layout
        raw = store.get("/managed-ledgers/t/ns/persistent/topic-1")
        assert raw is not None and decode_managed_ledger_info(raw.value) == info
        assert mls.exists(TopicName.parse("t/ns/persistent/topic-1"))
        assert not mls.exists("t/ns/other")

    def test_topic_missing_and_exists_errors(self, mls):
        with pytest.raises(TopicNotFoundError, match="persistent://t/ns/nope"):
            mls.get_topic("t/ns/nope")
        with pytest.raises(TopicNotFoundError, match="persistent://t/ns/nope"):
            mls.update_topic("t/ns/nope", lambda info: None)
        with pytest.raises(TopicNotFoundError, match="persistent://t/ns/nope"):
            mls.delete_topic("t/ns/nope")
        mls.create_topic("t/ns/a")
        with pytest.raises(NodeExistsError):
            mls.create_topic("t/ns/a")
        with pytest.raises(ValidationError):
            mls.get_topic("t/ns/../x")

    def test_put_topic_cas_and_delete(self, mls):
        v = mls.create_topic("t/ns/a")
        info, _ = mls.get_topic("t/ns/a")
        info.ledgerInfo.add(ledgerId=1)
        assert mls.put_topic("t/ns/a", info, v) == 1
        with pytest.raises(VersionConflictError):
            mls.put_topic("t/ns/a", info, v)
        with pytest.raises(VersionConflictError):
            mls.delete_topic("t/ns/a", expected_version=0)
        mls.delete_topic("t/ns/a", expected_version=1)
        assert not mls.exists("t/ns/a")

    def test_update_topic_retries_on_concurrent_change(self, mls):
        mls.create_topic("t/ns/a")
        calls = []

        def mutate(info):
            calls.append(len(info.ledgerInfo))
            if len(calls) == 1:
                # a concurrent writer lands between our read and our CAS
                other, v = mls.get_topic("t/ns/a")
                other.ledgerInfo.add(ledgerId=1, size=10)
                mls.put_topic("t/ns/a", other, v)
            info.ledgerInfo.add(ledgerId=2, size=20)

        info, version = mls.update_topic("t/ns/a", mutate)
        assert calls == [0, 1]
        assert [li.ledgerId for li in info.ledgerInfo] == [1, 2]
        assert version == 2
        stored, v = mls.get_topic("t/ns/a")
        assert stored == info and v == 2

    def test_update_topic_abort_writes_nothing(self, mls):
        mls.create_topic("t/ns/a")

        def mutate(info):
            info.ledgerInfo.add(ledgerId=5)  # changes made before aborting are discarded
            return False

        info, version = mls.update_topic("t/ns/a", mutate)
        assert version == 0 and len(info.ledgerInfo) == 0
        assert mls.get_topic("t/ns/a")[1] == 0

    def test_update_topic_gives_up_after_max_attempts(self, mls):
        mls.create_topic("t/ns/a")
        n = []

        def always_race(info):
            n.append(1)
            other, v = mls.get_topic("t/ns/a")
            mls.put_topic("t/ns/a", other, v)

        with pytest.raises(VersionConflictError, match="gave up after 3"):
            mls.update_topic("t/ns/a", always_race, max_attempts=3)
        assert len(n) == 3

    def test_update_topic_metadata_store_error_propagates(self, mls, store):
        mls.create_topic("t/ns/a")

        class Boom(MetadataStoreError):
            pass

        original_put = store.put

        def failing_put(*args, **kwargs):
            raise Boom("disk on fire (outcome unknown)")

        store.put = failing_put
        try:
            with pytest.raises(Boom):
                mls.update_topic("t/ns/a", lambda info: None)
        finally:
            store.put = original_put

    def test_update_topic_mutate_exception_propagates(self, mls):
        mls.create_topic("t/ns/a")

        def mutate(info):
            info.ledgerInfo.add(ledgerId=1)
            raise RuntimeError("nope")

        with pytest.raises(RuntimeError):
            mls.update_topic("t/ns/a", mutate)
        assert mls.get_topic("t/ns/a") == (ManagedLedgerInfo(), 0)

    def test_compressed_records(self, store):
        z = ManagedLedgerStore(store, compression="ZSTD")
        z.create_topic("t/ns/z", sample_info())
        raw = store.get(topic_path("t/ns/z")).value
        assert is_compressed(raw)
        plain = ManagedLedgerStore(store)  # reads any form
        assert plain.get_topic("t/ns/z")[0] == sample_info()
        with pytest.raises(ValidationError):
            ManagedLedgerStore(store, compression="BROTLI")

    def test_corrupt_record_names_topic(self, mls, store):
        store.create("/managed-ledgers/t/ns/persistent/bad", b"\xff\xff\xff")
        with pytest.raises(FormatError, match="persistent://t/ns/bad"):
            mls.get_topic("t/ns/bad")

    def test_list_namespaces_and_topics(self, mls, store):
        for t in ["t1/ns1/a", "t1/ns1/b", "t1/ns2/c", "t2/ns/d", "persistent://t1/ns1/x:y"]:
            mls.create_topic(t)
        mls.set_policies("t3/only-policies", {"offload_threshold": 5})
        store.create("/managed-ledgers/t1/ns1/persistent/a/cursor", b"")  # Pulsar keeps cursors below
        store.create("/managed-ledgers/junk/..x", b"")  # not a namespace layout: ignored
        assert mls.list_namespaces() == ["t1/ns1", "t1/ns2", "t2/ns", "t3/only-policies"]
        assert [t.full for t in mls.list_topics("t1/ns1")] == [
            "persistent://t1/ns1/a",
            "persistent://t1/ns1/b",
            "persistent://t1/ns1/x:y",
        ]
        assert store.get("/managed-ledgers/t1/ns1/persistent/x%3Ay") is not None
        assert mls.list_topics("t9/none") == []

    def test_policies_roundtrip(self, mls, store):
        assert mls.get_policies("t/ns") is None
        pol = {"offload_threshold": 1024, "offload_deletion_lag_ms": 14400000, "nested": {"a": [1, 2]}}
        assert mls.set_policies("t/ns", pol) == 0
        assert mls.get_policies("t/ns") == pol
        assert mls.set_policies("t/ns", {"x": 1}) == 1
        assert store.get("/admin/policies/t/ns").value == b'{"x":1}'
        with pytest.raises(ValidationError):
            mls.set_policies("t/ns", [1, 2])  # type: ignore[arg-type]
        with pytest.raises(ValidationError):
            mls.set_policies("t/ns", {"bad": float("nan")})
        with pytest.raises(ValidationError):
            mls.get_policies("t/ns/extra")
        store.set("/admin/policies/t/broken", b"{not json")
        with pytest.raises(FormatError, match="t/broken"):
            mls.get_policies("t/broken")
        store.set("/admin/policies/t/list", b"[1]")
        with pytest.raises(FormatError, match="not an object"):
            mls.get_policies("t/list")
