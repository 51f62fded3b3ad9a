"""A real process killed (SIGKILL) in the middle of an offload, then the offload rerun (docs/metadata.md, step 1:
the uuid is recorded before any object is written, so the killed attempt's leftovers are findable; the
rerun turns them into a pending-deletion record and the drain removes them, docs/deletion.md)."""

from __future__ import annotations

import signal
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tieredcore.clock import now_ms
from tieredcore.cold.blob import iter_objects
from tieredcore.config import Config
from tieredcore.formats.keys import data_key, parse_ledger_key
from tieredcore.lifecycle.drain import drain
from tieredcore.meta.managed_ledgers import find_ledger
from tieredcore.meta.reasons import Reason
from tieredcore.offload.managed import ABANDONED_PREFIX, abandoned_uuids, context_uuid
from tieredcore.outcomes import Outcome
from tieredcore.topic.writer import TopicWriter
from tieredcore.workspace import Workspace

CHILD = Path(__file__).with_name("kill_child.py")
TOPIC = "public/default/killed-offload"
ENTRY_SIZE = 64 * 1024
ENTRIES = 640  # 40 MiB
MAX_BLOCK = 1024 * 1024
KILL_AFTER_PARTS = 3


def entry(i: int) -> bytes:
    head = struct.pack(">I", i)
    return head + bytes([i % 251]) * (ENTRY_SIZE - len(head))


def object_keys(store) -> list[str]:
    """Every object key but the owner marker the workspace writes when it claims the store and its topic
    manifests (docs/recovery.md)."""
    return [o.key for o in iter_objects(store) if not o.key.startswith(("tiered-owner.", "tiered-topic-manifests/"))]


def uploads(store) -> list[tuple[str, str]]:
    return [(u.key, u.upload_id) for u in store.list_multipart_uploads("")]


def write_topic(config: Config) -> int:
    """One sealed 40 MiB ledger followed by the open (empty) newest ledger; returns the sealed id."""
    with Workspace(config) as ws:
        w = TopicWriter(ws.ml, ws.hot, TOPIC, max_entries=ENTRIES)
        lid = w.current_ledger_id
        w.append_many(entry(i) for i in range(ENTRIES))
        w.rollover()
        w.close(seal=False)
        info, _ = ws.ml.get_topic(TOPIC)
        li = find_ledger(info, lid)
        assert (li.entries, li.size) == (ENTRIES, ENTRIES * ENTRY_SIZE)
    return lid


def run_child_and_kill(tmp_path: Path, lid: int) -> list[str]:
    """Start the child, let it upload KILL_AFTER_PARTS parts, SIGKILL it while it waits after the last
    one (so it is certainly mid-offload). Returns the progress lines read."""
    stderr = open(tmp_path / "child.stderr", "w+")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), str(tmp_path / "ws"), TOPIC, str(lid), str(MAX_BLOCK)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        bufsize=1,
    )
    lines: list[str] = []
    try:
        while len(lines) < KILL_AFTER_PARTS:
            line = proc.stdout.readline()
            if not line:
                proc.wait()
                stderr.seek(0)
                pytest.fail(f"child exited ({proc.returncode}) after {lines}: {stderr.read()[-3000:]}")
            lines.append(line.strip())
            if len(lines) < KILL_AFTER_PARTS:
                proc.stdin.write("go\n")
                proc.stdin.flush()
        proc.send_signal(signal.SIGKILL)  # the child is blocked in its progress callback
        assert proc.wait() == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdin.close()
        proc.stdout.close()
        stderr.close()
    return lines


@pytest.mark.slow
def test_offload_killed_mid_upload_is_recovered_by_the_next_attempt(tmp_path):
    (tmp_path / "ws").mkdir()  # what `tiered init` does
    config = Config.for_workspace(tmp_path / "ws", max_block_size=MAX_BLOCK)
    lid = write_topic(config)

    lines = run_child_and_kill(tmp_path, lid)

    totals = {int(line.split()[2]) for line in lines}
    assert len(totals) == 1 and totals.pop() > 40 * MAX_BLOCK
    assert [int(line.split()[1]) for line in lines] == [MAX_BLOCK * (i + 1) for i in range(KILL_AFTER_PARTS)]

    with Workspace(config) as ws:
        # what the killed process left: its uuid recorded, not complete; an unfinished upload
        info, _ = ws.ml.get_topic(TOPIC)
        li = find_ledger(info, lid)
        assert li is not None
        killed = context_uuid(li)
        assert killed is not None
        assert not li.offloadContext.complete
        assert abandoned_uuids(li) == []
        assert object_keys(ws.store) == []
        left = uploads(ws.store)
        assert [k for k, _ in left] == [data_key("", killed, lid)]

        # rerun in-process: the killed attempt gets a pending-deletion record before it is replaced
        # (durable before any new object is written); nothing is deleted directly
        seen: dict = {}

        def progress(_topic, _lid, done, total):
            if not seen:
                cur = find_ledger(ws.ml.get_topic(TOPIC)[0], lid)
                seen["abandoned"] = abandoned_uuids(cur)
                seen["records"] = [(e.record.reason, e.record.ledger_id, e.record.uuid)
                                   for e in ws.deletion_log.pending()]
                seen["uploads"] = uploads(ws.store)

        res = ws.topic_offloader(progress=progress).offload_ledger(TOPIC, lid)

        assert res.outcome == Outcome.OFFLOADED, res.error
        assert res.uuid != killed
        assert seen["abandoned"] == []
        assert seen["records"] == [(Reason.OFFLOAD_CLEANUP, lid, killed)]
        assert sorted(k for k, _ in seen["uploads"]) == sorted([data_key("", killed, lid),
                                                                data_key("", res.uuid, lid)])

        info, _ = ws.ml.get_topic(TOPIC)
        li = find_ledger(info, lid)
        assert context_uuid(li) == res.uuid and li.offloadContext.complete
        assert abandoned_uuids(li) == []
        assert not any(kv.key.startswith(ABANDONED_PREFIX) for kv in li.properties)
        assert [k for k, _ in uploads(ws.store)] == [data_key("", killed, lid)]  # until the drain

        # phase 2: the killed attempt's upload is aborted, the record acknowledged
        rep = drain(ws, now_ms())
        assert (rep.deleted, rep.acknowledged, rep.retrying, rep.dead_lettered) == (1, 1, 0, 0), rep.rows
        assert ws.deletion_log.pending() == []
        assert uploads(ws.store) == []
        keys = object_keys(ws.store)
        assert {parse_ledger_key(k).uuid for k in keys} == {res.uuid}
        assert sorted(keys) == sorted([data_key("", res.uuid, lid), data_key("", res.uuid, lid) + "-index"])

        # read back every entry of the new offload
        h = ws.offloader.read_offloaded(lid, res.uuid)
        try:
            assert (h.last_add_confirmed, h.length) == (ENTRIES - 1, ENTRIES * ENTRY_SIZE)
            got = 0
            for first in range(0, ENTRIES, 64):
                for e in h.read(first, min(first + 63, ENTRIES - 1)):
                    assert e.data == entry(e.entry_id)
                    got += 1
            assert got == ENTRIES
        finally:
            h.close()
