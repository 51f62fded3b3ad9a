"""Crash tests of two-phase deletion (docs/deletion.md, the crash tests of two-phase deletion), on the
filesystem store and on moto's S3 server: a real process running one phase-1 producer (or the phase-2 drain) is SIGKILLed at an exact step, then the next drain + reconciliation
must leave zero orphans in both tiers, nothing stuck in the deletion log, and every retained entry
reading back identical.

Kill points (see crash_child.py; the child blocks at the step, the parent kills it, no sleeps):

- ``append:<reason>``: right after the producer durably appended its records, before its metadata CAS;
- ``ack:hot`` / ``ack:offloaded``: the producer completed, then the drain is killed right after deleting
  (a hot copy / the objects of a batch) and before acknowledging the record.

Producers: retention trim, topic deletion, deletion-lag cleanup, offload cleanup of an abandoned attempt
(a uuid recorded complete=false with its objects and an unfinished multipart upload, replaced by a new
offload), and an offload attempt that loses to a competing attempt (its ``offload-conflict`` record).

After each kill: drain; the drain alone must leave no orphan (reconciliation dry run finds none; the one
thing allowed is the abandoned attempt's stale multipart upload, which only reconciliation aborts); then
reconcile (grace 0) + drain; then the checks. A producer killed before its CAS is then rerun to
completion (drain, checks again, and its effect is there).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import uuid as uuidlib
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.workspaces import END_MS, build_workspace, offload, sealed
from tieredcore.clock import now_ms
from tieredcore.cold.blob import iter_objects
from tieredcore.config import CONFIG_FILE_NAME, Config
from tieredcore.formats.keys import data_key, parse_ledger_key
from tieredcore.formats.uuids import uuid_to_msb_lsb
from tieredcore.lifecycle.drain import drain
from tieredcore.lifecycle.reconcile.orphans import managed_ledger_of
from tieredcore.lifecycle.reconcile.run import reconcile
from tieredcore.meta.managed_ledgers import find_ledger
from tieredcore.names import TopicName
from tieredcore.offload.managed import abandoned_uuids, context_uuid
from tieredcore.offload.ownership import is_marker_key
from tieredcore.policy import HOT_FIRST, TIERED_FIRST
from tieredcore.workspace import Workspace

CHILD = Path(__file__).with_name("crash_child.py")
MIN = 60_000
DAY = 24 * 3600 * 1000
NS = "t/a"
T0 = "persistent://t/a/topic-0000"
T1 = "persistent://t/a/topic-0001"
CHILD_TIMEOUT = 60

Key = tuple[str, int]  # (persistent://topic, ledger id)


# -- workspace ------------------------------------------------------------------------------------


def build(root: Path, topics: int, store_url: str | None = None) -> Config:
    """4 sealed ledgers of 10 entries per topic (closed 10 min apart, the last at END) plus the open
    newest ledger; the object store: the embedded filesystem store, or ``store_url``."""
    return Config.load(build_workspace(root, [NS], topics=topics, ledgers=4, store_url=store_url), env={})


def set_ns(ws: Workspace, **fields) -> None:
    ws.policies.set_namespace(NS, fields)


def lag_clean_everything_offloaded(ws: Workspace, as_of: int) -> None:
    """Deletion-lag cleanup (lag 0) and its drain, in-process: every offloaded ledger loses its hot copy."""
    from tieredcore.lifecycle.runner import run_work
    from tieredcore.lifecycle.sweep import plan_lag_cleanup

    set_ns(ws, deletion_lag_ms=0)
    rows = list(run_work(ws.config, [w.as_dict() for w in plan_lag_cleanup(ws, None, as_of)]))
    assert rows and {r["outcome"] for r in rows} == {"marked"}, rows
    set_ns(ws, deletion_lag_ms=-1)
    rep = drain(ws, as_of)
    assert rep.deleted == len(rows) and rep.retrying == rep.dead_lettered == 0


def topics(ws: Workspace) -> dict[str, object]:
    """persistent://topic -> its ManagedLedgerInfo, for every topic of the workspace."""
    out = {}
    for ns in ws.ml.list_namespaces():
        for t in ws.ml.list_topics(ns):
            out[t.full] = ws.ml.get_topic(t)[0]
    return out


def read_all(ws: Workspace, priority: str) -> dict[Key, list[bytes]]:
    """Every entry of every ledger of every topic, through the workspace reader."""
    out: dict[Key, list[bytes]] = {}
    r = ws.reader(priority)
    try:
        for name, info in topics(ws).items():
            for li in info.ledgerInfo:
                out[(name, li.ledgerId)] = []
            for pos, data in r.read(name):
                out[(name, pos.ledger_id)].append(bytes(data))
    finally:
        r.close()
    return out


def read_handle(h) -> list[bytes]:
    lac = h.last_add_confirmed
    return [bytes(e.data) for e in h.read(0, lac)] if lac >= 0 else []


# -- the checks -----------------------------------------------------------------------------------


def hot_relied_on(li) -> bool:
    """The drain's rule: a listed ledger relies on its hot copy unless offloaded and bookkeeperDeleted."""
    ctx = li.offloadContext if li.HasField("offloadContext") else None
    return not (ctx is not None and ctx.complete and ctx.bookkeeperDeleted)


def assert_clean(ws: Workspace, before: dict[Key, list[bytes]], listed: set[Key], as_of: int) -> None:
    # no record stuck
    st = ws.deletion_log.stats()
    assert (st["in_flight"], st["dead_letter"]) == (0, 0), (st, [e.record for e in ws.deletion_log.pending()])

    # zero orphans in both tiers, as reconciliation sees it (dry run, no grace)
    rep = reconcile(ws, as_of, grace_ms=0, dry_run=True)
    assert (rep.orphan_groups, rep.hot_orphans, rep.stale_uploads) == (0, 0, 0), rep.records
    assert rep.errors == []

    # ... and directly: every object belongs to an attempt a ledger of a topic references
    infos = topics(ws)
    refs: set[tuple[str, int]] = set()
    for info in infos.values():
        for li in info.ledgerInfo:
            for u in [context_uuid(li), *abandoned_uuids(li)]:
                if u is not None:
                    refs.add((u, li.ledgerId))
    prefix = ws.offloader.prefix
    for o in iter_objects(ws.store, prefix):
        if is_marker_key(o.key, prefix) or o.key.startswith(prefix + "tiered-topic-manifests/"):
            continue  # the workspace's owner marker, topic manifests (docs/recovery.md)
        k = parse_ledger_key(o.key, prefix)
        assert k is not None, f"foreign object {o.key}"
        assert (str(k.uuid), k.ledger_id) in refs, f"orphaned object {o.key}"
    assert ws.store.list_multipart_uploads(prefix) == []
    # every hot ledger is listed by the topic its custom metadata names, and relied on
    by_ml = {TopicName.parse(t).managed_ledger_name: info for t, info in infos.items()}
    for lid in ws.hot.list_ledgers():
        name = managed_ledger_of(ws.hot.ledger_metadata(lid).custom_metadata)
        assert name in by_ml, f"hot ledger {lid} of missing topic {name}"
        li = find_ledger(by_ml[name], lid)
        assert li is not None, f"hot ledger {lid} not listed by {name}"
        assert hot_relied_on(li), f"hot ledger {lid} left behind after bookkeeperDeleted"

    # the ledgers still listed are the expected ones, and every entry reads back identical: through the
    # reader (both priorities) and directly from each tier that holds a copy the topic relies on
    assert {(t, li.ledgerId) for t, info in infos.items() for li in info.ledgerInfo} == listed
    for priority in (TIERED_FIRST, HOT_FIRST):
        got = read_all(ws, priority)
        assert set(got) == listed
        for k, entries in got.items():
            assert entries == before[k], f"{k} read {priority}"
    for t, info in infos.items():
        for li in info.ledgerInfo:
            want = before[(t, li.ledgerId)]
            if hot_relied_on(li):
                with ws.hot.open_ledger(li.ledgerId) as h:
                    assert read_handle(h) == want, f"hot copy of {t} ledger {li.ledgerId}"
            if li.HasField("offloadContext") and li.offloadContext.complete:
                off = ws.offloader_for_driver(li.offloadContext.driverMetadata)
                h = off.read_offloaded(li.ledgerId, context_uuid(li))
                try:
                    assert read_handle(h) == want, f"offloaded copy of {t} ledger {li.ledgerId}"
                finally:
                    h.close()


# -- the child ------------------------------------------------------------------------------------


def run_child(tmp_path: Path, config: Path, job: str, point: str, args: dict) -> str:
    """Run crash_child.py. With a kill point: wait for its ``AT <point>`` line, SIGKILL it, return the
    line. With "none": let it finish and return its ``DONE <json>`` line."""
    stderr = open(tmp_path / f"child-{job}-{point.replace(':', '-')}.stderr", "w+")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), str(config), job, point, json.dumps(args)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True, bufsize=1,
    )
    try:
        line = proc.stdout.readline().strip()
        if point == "none":
            assert proc.wait(CHILD_TIMEOUT) == 0 and line.startswith("DONE "), _failed(proc, line, stderr)
            return line
        if line != f"AT {point}":
            proc.kill()
            proc.wait()
            pytest.fail(_failed(proc, line, stderr))
        proc.send_signal(signal.SIGKILL)  # blocked at the step, reading stdin
        assert proc.wait(CHILD_TIMEOUT) == -signal.SIGKILL
        return line
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdin.close()
        proc.stdout.close()
        stderr.close()


def _failed(proc, line: str, stderr) -> str:
    stderr.seek(0)
    return f"child exited {proc.poll()} with {line!r}: {stderr.read()[-3000:]}"


# -- scenarios ------------------------------------------------------------------------------------


@dataclass
class Scenario:
    job: str
    args: dict
    gone: set[Key]  # what the completed producer removes from the topic records
    stale_upload_after_kill: bool = False  # left by the setup; only reconciliation aborts it
    in_use_after_append: bool = True  # killed before its CAS, every record names storage still in use
    check_done: object = None  # (ws, before) -> None: the completed producer's effect


def setup_retention(ws: Workspace) -> Scenario:
    """Ledger 0 offloaded with its hot copy deleted, 1 offloaded (both tiers), 2 hot only, 3 offloaded
    (both tiers, retained); retention 10 min at END + 1 min removes 0, 1, 2."""
    l0, l1, l2, l3 = sealed(ws, T0)
    offload(ws, T0, [l0], END_MS)
    lag_clean_everything_offloaded(ws, END_MS + 1)
    offload(ws, T0, [l1, l3], END_MS + 2)
    set_ns(ws, retention_time_minutes=10)
    return Scenario("trim", {"topic": T0, "as_of": END_MS + MIN}, {(T0, l0), (T0, l1), (T0, l2)})


def setup_topic_deletion(ws: Workspace) -> Scenario:
    """Topic 0 as for retention (ledger 0 cold only, 1 in both tiers); topic 1 (kept) has one ledger in
    both tiers. Topic 0 is deleted."""
    l0, l1, _l2, _l3 = sealed(ws, T0)
    offload(ws, T0, [l0], END_MS)
    lag_clean_everything_offloaded(ws, END_MS + 1)
    offload(ws, T0, [l1], END_MS + 2)
    offload(ws, T1, sealed(ws, T1)[:1], END_MS + 2)
    info, _ = ws.ml.get_topic(T0)

    def done(ws: Workspace, _before) -> None:
        assert T0 not in topics(ws)

    return Scenario("delete-topic", {"topic": T0, "as_of": END_MS + MIN},
                    {(T0, li.ledgerId) for li in info.ledgerInfo}, check_done=done)


def setup_lag_cleanup(ws: Workspace) -> Scenario:
    """Ledgers 0-2 offloaded at END, deletion lag 0: the cleanup at END + 1 marks all three."""
    ids = sealed(ws, T0)[:3]
    offload(ws, T0, ids, END_MS)
    set_ns(ws, deletion_lag_ms=0)

    def done(ws: Workspace, _before) -> None:
        info, _ = ws.ml.get_topic(T0)
        assert [not hot_relied_on(find_ledger(info, lid)) for lid in ids] == [True] * 3
        assert set(ws.hot.list_ledgers()).isdisjoint(ids)

    return Scenario("lag-cleanup", {"as_of": END_MS + 1}, set(), check_done=done)


def setup_abandoned_attempt(ws: Workspace) -> Scenario:
    """Ledger 0 offloaded; ledger 1 has an abandoned attempt: its uuid recorded (complete=false), its
    objects written, and an unfinished multipart upload on its data key. A new offload of ledger 1
    replaces it."""
    l0, l1, _l2, _l3 = sealed(ws, T0)
    offload(ws, T0, [l0], END_MS)
    abandoned = str(uuidlib.uuid4())
    msb, lsb = uuid_to_msb_lsb(uuidlib.UUID(abandoned))
    dm = ws.topic_offloader()._driver_metadata()

    def record(info) -> bool:
        ctx = find_ledger(info, l1).offloadContext
        ctx.uidMsb, ctx.uidLsb, ctx.complete = msb, lsb, False
        ctx.driverMetadata.CopyFrom(dm)
        return True

    ws.ml.update_topic(T0, record)
    ml = TopicName.parse(T0).managed_ledger_name
    with ws.hot.open_ledger(l1) as h:
        ws.offloader.offload(h, abandoned, {"managedledgername": ml})
    key = data_key(ws.offloader.prefix, abandoned, l1)
    upload = ws.store.initiate_multipart(key, {"managedledgername": ml})
    ws.store.upload_part(key, upload, 1, b"x" * 2048)
    assert len([o for o in iter_objects(ws.store) if abandoned in o.key]) == 2

    def done(ws: Workspace, _before) -> None:
        li = find_ledger(ws.ml.get_topic(T0)[0], l1)
        assert li.offloadContext.complete and context_uuid(li) not in (None, abandoned)
        assert not any(abandoned in o.key for o in iter_objects(ws.store))

    return Scenario("offload", {"topic": T0, "ledger": l1, "as_of": END_MS + 1}, set(),
                    stale_upload_after_kill=True, check_done=done)


def setup_conflicted_attempt(ws: Workspace) -> Scenario:
    """Ledger 0 offloaded; the offload of ledger 1 loses to a competing attempt (crash_child.py
    offload-race): its objects are written, its uuid replaced, its completion CAS fails."""
    l0, l1, _l2, _l3 = sealed(ws, T0)
    offload(ws, T0, [l0], END_MS)

    def done(ws: Workspace, _before) -> None:
        li = find_ledger(ws.ml.get_topic(T0)[0], l1)
        assert li.offloadContext.complete
        uuids = {parse_ledger_key(o.key).uuid for o in iter_objects(ws.store) if f"-ledger-{l1}" in o.key}
        assert uuids == {context_uuid(li)}

    # the conflict record's uuid was replaced (by the competitor, which recorded it first): not in use
    return Scenario("offload-race", {"topic": T0, "ledger": l1, "as_of": END_MS + 1}, set(),
                    in_use_after_append=False, check_done=done)


SETUPS = {
    "retention": (setup_retention, 1, "append:retention", ["ack:hot", "ack:offloaded"]),
    "topic-deletion": (setup_topic_deletion, 2, "append:topic-deletion", ["ack:hot", "ack:offloaded"]),
    "lag-cleanup": (setup_lag_cleanup, 1, "append:deletion-lag", ["ack:hot"]),
    "offload-cleanup": (setup_abandoned_attempt, 1, "append:offload-cleanup", ["ack:offloaded"]),
    "offload-conflict": (setup_conflicted_attempt, 1, "append:offload-conflict", ["ack:offloaded"]),
}
CASES = [pytest.param(p, k, id=f"{p}-{k}") for p, (_s, _n, a, acks) in SETUPS.items() for k in [a, *acks]]


@pytest.mark.parametrize("producer, point", CASES)
def test_kill_then_drain_and_reconcile_leave_nothing_behind(tmp_path, monkeypatch, store_url, producer, point):
    monkeypatch.setenv("TIERED_NO_PROGRESS", "1")
    setup, ntopics, _append, _acks = SETUPS[producer]
    config = build(tmp_path / "ws", ntopics, store_url)
    cfg_path = tmp_path / "ws" / CONFIG_FILE_NAME
    with Workspace(config) as ws:
        before = read_all(ws, HOT_FIRST)
        assert before and all(len(v) == 10 for k, v in before.items() if k[1] in sealed(ws, k[0]))
        sc = setup(ws)
        assert read_all(ws, TIERED_FIRST) == before  # the setup itself lost nothing
        assert ws.deletion_log.stats()["in_flight"] == 0
    everything = set(before)
    complete = everything - sc.gone

    if point.startswith("append:"):
        run_child(tmp_path, cfg_path, sc.job, point, sc.args)
        listed_after_kill = everything  # killed before the metadata change: nothing left a topic
    else:
        done = json.loads(run_child(tmp_path, cfg_path, sc.job, "none", sc.args).split(" ", 1)[1])
        if sc.job == "offload-race":
            assert done[0] == "conflict", done
        with Workspace(config) as ws:
            assert ws.deletion_log.stats()["in_flight"] > 0
        run_child(tmp_path, cfg_path, "drain", point, {"as_of": END_MS + MIN})
        listed_after_kill = complete

    later = max(now_ms(), END_MS) + DAY  # after every object's and hot ledger's creation
    with Workspace(config) as ws:
        assert ws.deletion_log.stats()["in_flight"] > 0  # the kill left records to process
        rep = drain(ws, later)
        assert (rep.retrying, rep.dead_lettered, rep.malformed, rep.refused_mismatch) == (0, 0, 0, 0), rep.rows
        if not point.startswith("append:"):
            # the record the drain was killed on: its storage is gone, acknowledged now (idempotent delete)
            assert rep.already_deleted >= 1 and rep.still_in_use == 0, rep.rows
        elif sc.in_use_after_append:
            assert rep.still_in_use == rep.entries and rep.deleted == 0, rep.rows
        else:
            assert rep.deleted + rep.already_deleted == rep.entries and rep.deleted >= 1, rep.rows
        # two-phase deletion leaves no orphan: the drain alone cleaned up after the crash
        dry = reconcile(ws, later, grace_ms=0, dry_run=True)
        assert (dry.orphan_groups, dry.hot_orphans) == (0, 0), dry.records
        assert dry.stale_uploads == (1 if sc.stale_upload_after_kill and point.startswith("append:") else 0)
        rec = reconcile(ws, later, grace_ms=0)
        assert rec.errors == []
        drain(ws, later)
        assert_clean(ws, before, listed_after_kill, later)

    if point.startswith("append:"):
        # the producer, run again to completion, finishes the job
        run_child(tmp_path, cfg_path, sc.job, "none", sc.args)
        with Workspace(config) as ws:
            rep = drain(ws, later)
            assert (rep.retrying, rep.dead_lettered) == (0, 0), rep.rows
            assert_clean(ws, before, complete, later)
    if sc.check_done is not None:
        with Workspace(config) as ws:
            sc.check_done(ws, before)
