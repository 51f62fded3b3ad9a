"""The hot-tier seam (tieredcore.hot.tier): the local ledger store implements it, and the core
needs nothing beyond it. A proxy that exposes only the Protocols' members stands in for the store: a
topic is written, offloaded (through ``read()``: the proxy's ledgers are not FrameSources), proven against
the hot CRCs, read back and its hot copies deleted — and the offloaded bytes equal the fast path's."""

from __future__ import annotations

import uuid as uuidlib
from pathlib import Path
from typing import Any

from tieredcore.cli import main as cli
from tieredcore.cold.backends.fs import FilesystemBlobStore
from tieredcore.config import CONFIG_FILE_NAME, Config
from tieredcore.hot.local import LocalLedgerStore
from tieredcore.hot.tier import FrameSource, HotLedger, HotTier, LedgerWriter
from tieredcore.lifecycle.drain import drain
from tieredcore.lifecycle.sweep import lag_cleanup_topic
from tieredcore.lifecycle.work import KIND_LAG_CLEANUP, TopicWork
from tieredcore.model import ReadHandle
from tieredcore.names import TopicName
from tieredcore.offload.offloader import LedgerOffloader
from tieredcore.topic.writer import TopicWriter
from tieredcore.workspace import Workspace


def members(protocol: type) -> set[str]:
    out: set[str] = set()
    for klass in protocol.__mro__:
        if klass is object or getattr(klass, "_is_protocol", False) is False:
            continue
        out |= {n for n in vars(klass) if not n.startswith("_")}
    return out


class Only:
    """`inner` seen through `protocol`: any other attribute is an AttributeError; results of the
    methods named in `wrap` are wrapped in turn."""

    def __init__(self, inner: Any, protocol: type, wrap: dict[str, type] | None = None) -> None:
        self._inner, self._names, self._wrap = inner, members(protocol), wrap or {}
        self.used: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        if name not in self._names:
            raise AttributeError(f"{name!r} is not part of the declared seam")
        self.used.add(name)
        value = getattr(self._inner, name)
        if name in self._wrap:
            proto = self._wrap[name]
            return lambda *a, **k: Only(value(*a, **k), proto)
        return value

    def __enter__(self) -> Only:
        return self

    def __exit__(self, *exc: object) -> None:
        self._inner.close()


def restricted(hot: LocalLedgerStore) -> Only:
    return Only(hot, HotTier, {"open_ledger": HotLedger, "create_ledger": LedgerWriter})


def test_the_local_store_implements_the_seam(tmp_path: Path) -> None:
    hot = LocalLedgerStore(tmp_path / "hot")
    w = hot.create_ledger({"k": "v"})
    w.append_many([b"a", b"bc"])
    w.close()
    h = hot.open_ledger(w.ledger_id)
    assert isinstance(h, FrameSource) and isinstance(h, HotLedger) and isinstance(h, ReadHandle)
    assert members(HotTier) <= set(dir(hot)) and members(LedgerWriter) <= set(dir(w))
    # the proxy is not a FrameSource: the offloader takes its generic path
    assert not isinstance(restricted(hot).open_ledger(w.ledger_id), FrameSource)
    assert isinstance(restricted(hot).open_ledger(w.ledger_id), HotLedger)


def test_generic_path_writes_the_same_objects_as_the_fast_path(tmp_path: Path) -> None:
    hot = LocalLedgerStore(tmp_path / "hot")
    w = hot.create_ledger({"managed-ledger": "t/n/persistent/x"})
    w.append_many([bytes([i % 251]) * (i * 37 % 3000) for i in range(400)])
    w.close()
    u = uuidlib.uuid4()
    objects = {}
    for name, handle in (("fast", hot.open_ledger(w.ledger_id)), ("generic", restricted(hot).open_ledger(w.ledger_id))):
        store = FilesystemBlobStore(tmp_path / name)
        obj = LedgerOffloader(store, max_block_size=64 * 1024, checksum_chunk=8192).offload(handle, u)
        objects[name] = (store.get(obj.data_key), store.get(obj.index_key), obj.blocks)
    assert objects["fast"] == objects["generic"] and objects["fast"][2] > 1


def test_the_core_runs_over_nothing_but_the_seam(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    assert cli.main(["init", str(root)]) == 0
    config = Config.load(str(root / CONFIG_FILE_NAME), env={})
    topic = "persistent://t/n/x"
    with Workspace(config) as ws:
        hot = restricted(ws.hot)
        ws.__dict__["hot"] = hot  # every consumer below goes through the proxy
        writer = TopicWriter(ws.ml, hot, topic, max_entries=50, max_bytes=1 << 30)
        writer.append_many([f"entry-{i}".encode() * 20 for i in range(170)])
        writer.close()
        info, _ = ws.ml.get_topic(topic)
        ids = [li.ledgerId for li in info.ledgerInfo][:-1]  # the topic's last ledger stays hot
        assert len(ids) == 3
        results = ws.topic_offloader().offload_ledgers(topic, ids)
        assert [r.outcome for r in results] == ["offloaded"] * 3
        ps = ws.policies
        ps.set_namespace("t/n", {"deletion_lag_ms": 0})
        t = TopicName.parse(topic)
        rows = lag_cleanup_topic(ws, ps.for_topic(t), t, TopicWork(topic, KIND_LAG_CLEANUP, ids, 1 << 62))
        assert [r.outcome for r in rows] == ["marked"] * 3, rows  # proven against the hot CRCs
        rep = drain(ws, 1 << 62)
        assert rep.deleted_hot == 3 and not any(hot.exists(i) for i in ids)
        reader = ws.reader("bookkeeper-first")
        try:
            got = [data for _pos, data in reader.read(topic)]
        finally:
            reader.close()
        assert got == [f"entry-{i}".encode() * 20 for i in range(170)]
        assert {"create_ledger", "open_ledger", "exists", "delete_ledger"} <= hot.used
