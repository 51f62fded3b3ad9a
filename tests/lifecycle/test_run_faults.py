"""Faults that must not stop or hang a run: a topic leased by another runner (skipped, not failed), a
store that keeps failing (the run stops after N consecutive failures), a corrupt hot ledger (only that
ledger fails)."""

from __future__ import annotations

import json
import os
import socket
import threading

import pytest

from tests.support.workspaces import END_MS
from tieredcore.cold.blob import iter_objects
from tieredcore.cold.client_settings import S3_MAX_ATTEMPTS
from tieredcore.errors import LeaseHeldError
from tieredcore.lifecycle.runner import run_work
from tieredcore.lifecycle.sweep import plan_offload
from tieredcore.lifecycle.work import LedgerResult, RunSummary
from tieredcore.meta.leases import TopicLeases
from tieredcore.meta.store import Versioned
from tieredcore.workspace import Workspace

T0 = "persistent://t/a/topic-0000"


def rows(ws, plan, config=None):
    return [LedgerResult(**r) for r in run_work(config or ws.config, [w.as_dict() for w in plan])]


# -- leases -----------------------------------------------------------------------------------------


class Clock:
    def __init__(self, now: int = 1_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def test_lease_acquire_renew_release_and_expiry(make_ws):
    ws = make_ws(["t/a"], ledgers=1)
    clock = Clock()
    a = TopicLeases(ws.metadata, holder="runner-a", ttl_ms=1000, clock_ms=clock)
    b = TopicLeases(ws.metadata, holder="runner-b", ttl_ms=1000, clock_ms=clock)
    la = a.acquire(T0, "offload")
    assert a.current(T0)["holder"] == "runner-a"
    with pytest.raises(LeaseHeldError, match=r"runner-a \(offload, lease until"):
        b.acquire(T0, "offload")
    clock.now += 900
    la = a.renew(la)  # renewed: b still waits
    clock.now += 900
    with pytest.raises(LeaseHeldError):
        b.acquire(T0, "offload")
    clock.now += 200  # a crashed: its lease expires
    lb = b.acquire(T0, "offload")
    with pytest.raises(LeaseHeldError, match="lost"):
        a.renew(la)
    a.release(la)  # a stale release leaves b's lease alone
    assert b.current(T0)["holder"] == "runner-b"
    b.release(lb)
    assert b.current(T0) is None
    # a damaged lease record does not block anyone forever
    ws.metadata.create(TopicLeases.path(T0), b"{not json")
    assert a.acquire(T0, "offload").holder == "runner-a"


def test_a_second_runner_skips_a_leased_topic_and_says_so(make_ws):
    ws = make_ws(["t/a"], topics=2, ledgers=2)
    ws.policies.set_namespace("t/a", {"offload_threshold_bytes": 0})
    other = TopicLeases(ws.metadata, holder="other-sweep:123")
    held = other.acquire(T0, "offload")
    res = rows(ws, plan_offload(ws, None, END_MS))
    by_topic = {}
    for r in res:
        by_topic.setdefault(r.topic, []).append(r)
    busy = by_topic[T0]
    assert [r.outcome for r in busy] == ["busy", "busy"] and not any(r.failed for r in busy)
    assert "other-sweep:123" in busy[0].error
    assert [r.outcome for r in by_topic["persistent://t/a/topic-0001"]] == ["offloaded", "offloaded"]
    # nothing was written for the leased topic
    info, _ = ws.ml.get_topic(T0)
    assert not any(li.HasField("offloadContext") for li in info.ledgerInfo)
    assert RunSummary.of("s", "r", END_MS, False, [r.__dict__ for r in res], 0).failures == 0
    other.release(held)
    assert [r.outcome for r in rows(ws, plan_offload(ws, None, END_MS))] == ["offloaded"] * 2
    assert TopicLeases(ws.metadata).current(T0) is None  # released after the run


def test_lease_of_a_dead_process_on_this_host_is_taken_over_at_once(make_ws):
    import socket as _s
    import subprocess
    import sys

    ws = make_ws(["t/a"], ledgers=2)
    ws.policies.set_namespace("t/a", {"offload_threshold_bytes": 0})
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(child.stdout)  # exited: a runner that crashed while holding the lease
    held = TopicLeases(ws.metadata, holder=f"{_s.gethostname()}:{dead_pid}:abcd").acquire(T0, "offload")
    assert held.expires_ms > 0
    assert [r.outcome for r in rows(ws, plan_offload(ws, None, END_MS))] == ["offloaded"] * 2
    # a live process's lease is respected (this test process, as another holder name)
    live = TopicLeases(ws.metadata, holder=f"{_s.gethostname()}:{os.getppid()}:abcd")
    live.acquire(T0, "offload")
    with pytest.raises(LeaseHeldError):
        TopicLeases(ws.metadata).acquire(T0, "offload")


def test_lease_left_by_a_crashed_runner_expires(make_ws):
    ws = make_ws(["t/a"], ledgers=2)
    ws.policies.set_namespace("t/a", {"offload_threshold_bytes": 0})
    path = TopicLeases.path(T0)
    ws.metadata.create(path, json.dumps({"holder": "dead:1", "purpose": "offload", "acquired_ms": 0,
                                         "expires_ms": 1}).encode())
    assert [r.outcome for r in rows(ws, plan_offload(ws, None, END_MS))] == ["offloaded"] * 2
    assert isinstance(ws.metadata.get("/tiered/leases"), Versioned | type(None))


# -- a store that keeps failing ---------------------------------------------------------------------


class ResettingServer:
    """Accepts TCP connections and closes them at once (a broken endpoint); counts them."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            conn.close()

    def close(self) -> None:
        self._stop = True
        self.sock.close()


def _offload_to_broken_store(ws, limit: int) -> tuple[list[LedgerResult], int]:
    """Offload every sealed ledger to an S3 endpoint that resets every connection; returns the rows and
    the connections the endpoint saw."""
    srv = ResettingServer()
    try:
        ws.policies.set_namespace("t/a", {
            "offload_threshold_bytes": 0, "max_block_size": 5 * 1024 * 1024,
            "store": {"driver": "aws-s3", "bucket": "bucket-x", "prefix": "p",
                      "endpoint": f"http://127.0.0.1:{srv.port}", "region": "us-east-1"}})
        from dataclasses import replace

        res = rows(ws, plan_offload(ws, None, END_MS), replace(ws.config, store_failure_limit=limit))
        return res, srv.connections
    finally:
        srv.close()


def test_run_stops_after_n_consecutive_store_failures(make_ws, aws_env):
    ws = make_ws(["t/a"], topics=6, ledgers=2)
    every, all_connections = _offload_to_broken_store(ws, limit=0)  # 0: never stop
    assert [r.outcome for r in every] == ["failed"] * 12
    # the owner marker is asked for once per run, not once per ledger: one GET's attempts in all
    assert 0 < all_connections <= S3_MAX_ATTEMPTS
    res, connections = _offload_to_broken_store(ws, limit=3)
    outcomes = [r.outcome for r in res]
    assert outcomes[:3] == ["failed"] * 3 and set(outcomes[3:]) == {"aborted"} and len(outcomes) == 12
    assert all("BlobStoreError" in r.error for r in res[:3])
    assert all("failed 3 times in a row" in r.error and "BlobStoreError" in r.error for r in res[3:])
    summary = RunSummary.of("s", "r", END_MS, False, [r.__dict__ for r in res], 0)
    assert summary.failures == 12
    assert 0 < connections <= S3_MAX_ATTEMPTS


# -- a corrupt hot ledger ---------------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["idx-short", "meta-corrupt"])
def test_a_corrupt_hot_ledger_fails_only_itself(make_ws, damage):
    ws = make_ws(["t/a", "t/b"], ledgers=3)
    for ns in ("t/a", "t/b"):
        ws.policies.set_namespace(ns, {"offload_threshold_bytes": 0})
    info, _ = ws.ml.get_topic(T0)
    victim = info.ledgerInfo[1].ledgerId
    if damage == "idx-short":
        p = ws.hot._path(victim, "idx")
        with open(p, "r+b") as f:
            f.truncate(16 * 3 + 5)
    else:
        with open(ws.hot._path(victim, "meta"), "wb") as f:
            f.write(b"\xff\xfe garbage")
    ws2 = Workspace(ws.config)  # a fresh process's view (no cached handles)
    try:
        res = rows(ws2, plan_offload(ws2, None, END_MS))
    finally:
        ws2.close()
    bad = [r for r in res if r.failed]
    assert [(r.topic, r.ledger) for r in bad] == [(T0, victim)]
    assert "hot copy cannot be read" in bad[0].error
    assert sum(r.outcome == "offloaded" for r in res) == 5  # the other ledgers of both topics
    objs = [o for o in iter_objects(ws.store) if not o.key.startswith(("tiered-owner.", "tiered-topic-manifests/"))]
    assert len(objs) == 10
