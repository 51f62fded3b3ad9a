"""ZooKeeper metadata store on a real server: the MetadataStore contract (tests/support/meta_contract.py;
SQLite runs it in test_metadata_store.py), then what is ZooKeeper's own: Pulsar's layout on the server,
URLs, limits, and what happens when a connection or session is lost."""

from __future__ import annotations

import logging
import uuid

import pytest
from kazoo.client import KazooClient

from tests.support.meta_contract import MetadataStoreContract
from tests.support.zk import expire_session
from tests.support.zk_proxy import ZkCutProxy
from tieredcore.config import Config, check_metadata_url
from tieredcore.errors import MetadataStoreError, NodeExistsError, ValidationError, VersionConflictError
from tieredcore.formats.mlinfo import (
    ManagedLedgerInfo,
    decode_managed_ledger_info,
    encode_managed_ledger_info,
)
from tieredcore.meta.managed_ledgers import ManagedLedgerStore
from tieredcore.meta.store import CheckOp, CreateOp, DeleteOp, PutOp, Versioned
from tieredcore.meta.zookeeper import MAX_RECORD_BYTES, ZkLocation, ZkMetadataStore


class TestZkStoreContract(MetadataStoreContract):
    ancestors_are_records = True

    @pytest.fixture
    def store(self, zk_url):
        """A store on the session's server, under a chroot of its own (conftest.zk_url)."""
        s = ZkMetadataStore(zk_url)
        yield s
        s.close()


@pytest.fixture
def chroot() -> str:
    return f"/test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def raw(zk_server):
    """A plain kazoo client: what Pulsar (or zkCli) sees."""
    zk = KazooClient(hosts=zk_server.hosts)
    zk.start(timeout=15)
    yield zk
    zk.stop()
    zk.close()


def _info(n: int) -> ManagedLedgerInfo:
    info = ManagedLedgerInfo()
    for i in range(1, n + 1):
        info.ledgerInfo.add(ledgerId=i, entries=10 * i, size=1000 * i, timestamp=1_700_000_000_000 + i)
    return info


# --- Pulsar's layout --------------------------------------------------------------------------


@pytest.mark.parametrize("compression", [None, "ZLIB", "ZSTD", "LZ4", "SNAPPY"])
def test_topic_record_at_pulsars_path_in_any_compression(zk_server, raw, chroot, compression):
    """What a broker writes at /managed-ledgers/... (plain or behind 0x4778) is what we read, and ours
    is what a broker reads: the same znode, Pulsar's protobuf."""
    store = ZkMetadataStore(zk_server.url("/tiered-storage", chroot=chroot))
    mls = ManagedLedgerStore(store)
    znode = f"{chroot}/managed-ledgers/acme/logs/persistent/app%3Aevents"
    raw.create(znode, encode_managed_ledger_info(_info(3), compression), makepath=True)
    raw.create(znode + "/my-subscription", b"cursor bytes")  # Pulsar keeps cursors below the topic
    info, version = mls.get_topic("persistent://acme/logs/app:events")
    assert info == _info(3) and version == 0
    assert [t.full for t in mls.list_topics("acme/logs")] == ["persistent://acme/logs/app:events"]

    mls2 = ManagedLedgerStore(store, compression=compression)
    mls2.put_topic("persistent://acme/logs/app:events", _info(4), 0)
    data, stat = raw.get(znode)
    assert stat.version == 1 and decode_managed_ledger_info(data) == _info(4)
    assert data[:2] == (b"\x47\x78" if compression else data[:2])
    store.close()


def test_our_records_live_under_the_root_never_in_pulsars_tree(zk_server, raw, chroot):
    store = ZkMetadataStore(zk_server.url("/tiered-storage", chroot=chroot))
    mls = ManagedLedgerStore(store)
    raw.create(f"{chroot}/admin/policies/acme/logs", b'{"pulsar": "namespace policies"}', makepath=True)
    mls.set_policies("acme/logs", {"offload_threshold": 5})
    store.create("/tiered/deletion-log/pending/r1", b"{}")
    mls.create_topic("acme/logs/t")
    # Pulsar's own namespace policies are untouched; ours sit under the root
    assert raw.get(f"{chroot}/admin/policies/acme/logs")[0] == b'{"pulsar": "namespace policies"}'
    assert raw.get(f"{chroot}/tiered-storage/admin/policies/acme/logs")[0] == b'{"offload_threshold":5}'
    assert raw.exists(f"{chroot}/tiered-storage/tiered/deletion-log/pending/r1")
    assert raw.exists(f"{chroot}/managed-ledgers/acme/logs/persistent/t")
    assert sorted(raw.get_children(chroot)) == ["admin", "managed-ledgers", "tiered-storage"]
    assert store.children("/") == ["admin", "managed-ledgers", "tiered"]
    assert mls.get_policies("acme/logs") == {"offload_threshold": 5}
    store.close()


# --- URLs and limits --------------------------------------------------------------------------


def test_url_parsing():
    loc = ZkLocation.parse("zk://zk1:2181,zk2:2181/tiered?chroot=/pulsar&session_timeout=10s&timeout=2m")
    assert (loc.hosts, loc.root, loc.chroot, loc.session_timeout_s, loc.timeout_s) == (
        "zk1:2181,zk2:2181", "/tiered", "/pulsar", 10.0, 120.0)
    assert loc.zk_path("/managed-ledgers/a/b/persistent/t") == "/pulsar/managed-ledgers/a/b/persistent/t"
    assert loc.zk_path("/admin/policies/a/b") == "/pulsar/tiered/admin/policies/a/b"
    assert ZkLocation.parse("zk://h:1").root == "/tiered-storage"


@pytest.mark.parametrize("url, message", [
    ("zk://h:2181/managed-ledgers", "Pulsar's own /managed-ledgers"),
    ("zk://h:2181/admin/x", "Pulsar's own /admin"),
    ("zk://h/root", "'h' is not host:port"),
    ("zk://h:99999/root", "is not host:port"),
    ("zk://user:pw@h:1/root", "credentials"),
    ("zk://h:1/root?color=red", "unknown option(s) color"),
    ("zk://h:1/root?timeout=0s", "timeout must be positive"),
    ("zk://h:1/root/", "ends with '/'"),
    ("zk://h:1/root?chroot=relative", "not absolute"),
    ("etcd://h:1/root", "unsupported scheme 'etcd'"),
])
def test_bad_urls_are_refused_before_anything_connects(url, message, tmp_path):
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_metadata_url(url)
    with pytest.raises(ValidationError):
        Config.for_workspace(tmp_path, metadata_url=url)


def test_unreachable_server_is_a_clear_error():
    from tests.support.zk import free_port

    with pytest.raises(MetadataStoreError, match=r"cannot connect to ZooKeeper at 127.0.0.1:\d+.*is the server running"):
        ZkMetadataStore(f"zk://127.0.0.1:{free_port()}/t?timeout=1s")


def test_record_above_the_znode_limit_is_refused_with_the_reason(zk_url):
    store = ZkMetadataStore(zk_url)
    with pytest.raises(ValidationError, match="exceeds ZooKeeper's znode limit.*managedLedgerInfoCompressionType"):
        store.create("/managed-ledgers/a/b/persistent/t", b"x" * (MAX_RECORD_BYTES + 1))
    with pytest.raises(ValidationError, match="exceeds ZooKeeper's znode limit"):
        store.transaction([CreateOp("/ok", b"1"), CreateOp("/big", b"x" * (MAX_RECORD_BYTES + 1))])
    assert store.get("/managed-ledgers/a/b/persistent/t") is None and store.get("/ok") is None
    store.create("/fits", b"x" * MAX_RECORD_BYTES)
    assert len(store.get("/fits").value) == MAX_RECORD_BYTES
    store.close()


# --- connection and session loss ------------------------------------------------------------


@pytest.fixture
def proxied(zk_server, chroot):
    proxy = ZkCutProxy(zk_server.port)
    store = ZkMetadataStore(f"zk://{proxy.hosts}/tiered-storage?chroot={chroot}&timeout=30s")
    other = ZkMetadataStore(zk_server.url("/tiered-storage", chroot=chroot))
    yield proxy, store, other
    store.close()
    other.close()
    proxy.close()


WRITES = {
    "create": (lambda s: s.create("/n", b"new"), {"create", "create2"}, 0, Versioned(b"new", 0)),
    "put": (lambda s: s.put("/n", b"v1", 0), {"setData"}, 1, Versioned(b"v1", 1)),
    "set": (lambda s: s.set("/n", b"v1"), {"setData"}, 1, Versioned(b"v1", 1)),
    "delete": (lambda s: s.delete("/n", 0), {"delete"}, None, None),
    "transaction": (lambda s: s.transaction([PutOp("/n", b"v1", 0), CreateOp("/m", b"m"), CheckOp("/sibling", 0)]),
                    {"multi"}, None, Versioned(b"v1", 1)),
}


@pytest.mark.parametrize("op", list(WRITES))
@pytest.mark.parametrize("mode", ["after_reply", "before_send"])
def test_lost_write_is_settled_by_rereading_never_blindly_repeated(proxied, op, mode, caplog):
    """after_reply: the write landed but the reply was lost; repeating it blindly would fail (create:
    exists, put: bad version) or apply it twice. before_send: it never reached the server; the re-read
    shows the old state, so it is sent again. Either way the caller gets the write's own result."""
    proxy, store, other = proxied
    fn, ops, want_result, want_after = WRITES[op]
    other.create("/sibling", b"")  # the parent exists: a create is one request
    if op != "create":
        other.create("/n", b"old")
    proxy.arm(mode, ops)
    caplog.set_level(logging.INFO, logger="tieredcore.meta.zookeeper")
    result = fn(store)
    assert proxy.cuts == [(mode, next(iter(ops & {c[1] for c in proxy.cuts})))]
    if op == "transaction":
        assert result == [1, 0, None] and other.get("/m") == Versioned(b"m", 0)
    elif want_result is not None:
        assert result == want_result
    assert other.get("/n") == want_after
    said = "it landed" if mode == "after_reply" else "did not land; sending it again"
    assert any(said in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]


def test_lost_write_overtaken_by_another_writer_is_an_unknown_outcome(proxied):
    """The reply is lost and, before the re-read, another writer changes the node: nobody can tell
    whether our compare-and-set landed, so the caller is told exactly that (and re-reads itself)."""
    proxy, store, other = proxied
    other.create("/n", b"old")
    proxy.arm("after_reply", {"setData"}, on_cut=lambda: other.put("/n", b"theirs", 1))
    with pytest.raises(MetadataStoreError, match="cannot tell whether it landed.*outcome unknown"):
        store.put("/n", b"ours", 0)
    assert other.get("/n") == Versioned(b"theirs", 2)


def test_conflicts_stay_conflicts_through_the_proxy(proxied):
    proxy, store, other = proxied
    other.create("/n", b"old")
    with pytest.raises(VersionConflictError, match="expected version 5, found 0"):
        store.put("/n", b"x", 5)
    with pytest.raises(NodeExistsError):
        store.transaction([CreateOp("/m", b""), CreateOp("/n", b"")])
    assert other.get("/m") is None
    store.transaction([DeleteOp("/n", 0)])
    assert other.get("/n") is None and proxy.cuts == []


def test_server_restart_and_session_expiry_lose_nothing(zk_server, zk_url):
    store = ZkMetadataStore(zk_url)
    store.create("/c", b"0")
    for i in range(3):
        zk_server.restart()
        assert store.put("/c", str(i + 1).encode(), i) == i + 1
    sid = store._client().client_id[0]
    expire_session(zk_server, store._client())
    assert store.get("/c") == Versioned(b"3", 3)  # waits for the new session, then reads
    assert store.put("/c", b"4", 3) == 4
    assert store._client().client_id[0] != sid
    store.close()
