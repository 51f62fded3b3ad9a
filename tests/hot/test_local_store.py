"""Hot tier: LocalLedgerStore (append, seal, read, recovery, deletion, crash safety)."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import struct
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tieredcore.errors import (
    BadRangeError,
    CorruptEntryError,
    HotLedgerNotFoundError,
    LedgerStateError,
    StaleHandleError,
    ValidationError,
)
from tieredcore.formats.proto.DataFormats_pb2 import LedgerMetadataFormat
from tieredcore.hot.local import LocalLedgerStore
from tieredcore.model import STATE_CLOSED, STATE_OPEN, Entry, ReadHandle

ML_METADATA = {
    "application": "pulsar",
    "component": "managed-ledger",
    "pulsar/managed-ledger": "public/default/persistent/t1",
}


def payload_for(entry_id: int) -> bytes:
    """Deterministic payload of entry_id, sizes 0..4099 bytes (shared with the kill-test child)."""
    size = (entry_id * 7919) % 4100
    return (entry_id.to_bytes(8, "big") * (size // 8 + 1))[:size]


def frame(entry_id: int, payload: bytes) -> bytes:
    return struct.pack(">iq", len(payload), entry_id) + payload


@pytest.fixture
def store(tmp_path: Path):
    s = LocalLedgerStore(tmp_path / "hot")
    yield s
    s.close()


def make_ledger(store: LocalLedgerStore, payloads: list[bytes], close: bool = True) -> int:
    w = store.create_ledger(ML_METADATA)
    w.append_many(payloads)
    if close:
        w.close()
    return w.ledger_id


# --- basics ----------------------------------------------------------------------------------


def test_create_append_close_read(store: LocalLedgerStore) -> None:
    w = store.create_ledger(ML_METADATA)
    assert w.last_add_confirmed == -1 and w.length == 0
    assert w.append(b"first") == 0
    assert w.append(bytearray(b"second")) == 1
    assert w.append_many([b"a", memoryview(b"bb"), b""]) == 4
    assert w.append_many([]) == 4
    assert w.last_add_confirmed == 4 and w.length == 5 + 6 + 1 + 2
    meta = w.close()
    assert meta.state == STATE_CLOSED and meta.last_entry_id == 4 and meta.length == 14
    assert w.close() == meta  # idempotent

    h = store.open_ledger(w.ledger_id)
    assert isinstance(h, ReadHandle)
    assert h.is_closed and h.last_add_confirmed == 4 and h.length == 14
    assert h.read(0, 4) == [
        Entry(0, b"first"),
        Entry(1, b"second"),
        Entry(2, b"a"),
        Entry(3, b"bb"),
        Entry(4, b""),
    ]
    assert h.read(3, 3) == [Entry(3, b"bb")]
    assert h.read(1, 2) == [Entry(1, b"second"), Entry(2, b"a")]
    assert list(h.entry_sizes()) == [5, 6, 1, 2, 0]
    assert h.frame_offset(0) == 0
    assert h.frame_offset(1) == 12 + 5
    assert h.frame_offset(5) == h.data_length == 14 + 5 * 12
    assert h.read_frames(1, 3) == frame(1, b"second") + frame(2, b"a") + frame(3, b"bb")
    h.close()


def test_bad_ranges(store: LocalLedgerStore) -> None:
    lid = make_ledger(store, [b"x"] * 3)
    h = store.open_ledger(lid)
    for first, last in [(-1, 0), (2, 1), (0, 3), (3, 3)]:
        with pytest.raises(BadRangeError):
            h.read(first, last)
        with pytest.raises(BadRangeError):
            h.read_frames(first, last)
    with pytest.raises(BadRangeError):
        h.frame_offset(4)
    with pytest.raises(ValidationError):
        h.read("0", 1)  # type: ignore[arg-type]


def test_empty_ledger(store: LocalLedgerStore) -> None:
    w = store.create_ledger({})
    meta = w.close()
    assert meta.last_entry_id == -1 and meta.length == 0 and meta.is_closed
    h = store.open_ledger(w.ledger_id)
    assert h.last_add_confirmed == -1 and h.length == 0 and h.is_closed
    assert list(h.entry_sizes()) == []
    assert h.frame_offset(0) == 0
    with pytest.raises(BadRangeError):
        h.read(0, 0)


def test_zero_and_large_entries(store: LocalLedgerStore) -> None:
    big = os.urandom(2 * 1024 * 1024)
    w = store.create_ledger({})
    w.append(b"")
    w.append(big)
    w.append_many([b"", big, b""])
    w.close()
    h = store.open_ledger(w.ledger_id)
    assert [e.data for e in h.read(0, 4)] == [b"", big, b"", big, b""]
    assert h.length == 2 * len(big)
    assert h.read_frames(1, 2) == frame(1, big) + frame(2, b"")


def test_open_ledger_read_while_writing(store: LocalLedgerStore) -> None:
    w = store.create_ledger({})
    w.append_many([b"a", b"b"])
    h = store.open_ledger(w.ledger_id)  # live writer: no recovery, sees confirmed entries
    assert not h.is_closed and h.last_add_confirmed == 1 and h.length == 2
    assert h.metadata.state == STATE_OPEN
    w.append(b"c")
    assert store.open_ledger(w.ledger_id).read(0, 2)[2] == Entry(2, b"c")
    assert store.ledger_metadata(w.ledger_id).state == STATE_OPEN
    w.close()
    assert h.read(0, 1) == [Entry(0, b"a"), Entry(1, b"b")]  # the snapshot handle still works
    assert store.open_ledger(w.ledger_id).is_closed


def test_append_after_close(store: LocalLedgerStore) -> None:
    with store.create_ledger({}) as w:
        w.append(b"x")
    assert w.is_closed
    with pytest.raises(LedgerStateError):
        w.append(b"y")
    with pytest.raises(LedgerStateError):
        w.append_many([b"y"])
    assert store.ledger_metadata(w.ledger_id).last_entry_id == 0


def test_invalid_payloads(store: LocalLedgerStore) -> None:
    w = store.create_ledger({})
    with pytest.raises(ValidationError):
        w.append("text")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        w.append_many([b"ok0", b"ok1", "bad", b"never"])  # type: ignore[list-item]
    assert w.last_add_confirmed == 1  # entries before the bad one were appended
    w.append(b"ok2")
    w.close()
    h = store.open_ledger(w.ledger_id)
    assert [e.data for e in h.read(0, 2)] == [b"ok0", b"ok1", b"ok2"]


def test_append_many_iterator_error_keeps_prefix(store: LocalLedgerStore) -> None:
    def gen():
        yield b"a"
        yield b"b"
        raise RuntimeError("source broke")

    w = store.create_ledger({})
    with pytest.raises(RuntimeError):
        w.append_many(gen())
    assert w.last_add_confirmed == 1
    w.close()
    assert [e.data for e in store.open_ledger(w.ledger_id).read(0, 1)] == [b"a", b"b"]


def test_append_many_large_generator_in_chunks(store: LocalLedgerStore) -> None:
    n = 20_000
    w = store.create_ledger({})
    assert w.append_many(payload_for(i) for i in range(n)) == n - 1
    w.close()
    h = store.open_ledger(w.ledger_id)
    assert h.length == sum(len(payload_for(i)) for i in range(n))
    got = h.read(0, n - 1)
    assert all(e.data == payload_for(e.entry_id) for e in got) and len(got) == n


def test_buffer_payload_types(store: LocalLedgerStore) -> None:
    import array

    w = store.create_ledger({})
    w.append(array.array("H", [1, 2]))
    w.append_many([array.array("B", [7]), memoryview(b"abcdef")[1:4]])
    w.close()
    h = store.open_ledger(w.ledger_id)
    assert [e.data for e in h.read(0, 2)] == [array.array("H", [1, 2]).tobytes(), b"\x07", b"bcd"]


def test_index_offsets_beyond_4gib(store: LocalLedgerStore, tmp_path: Path) -> None:
    w = store.create_ledger({})
    base = (1 << 32) + 5  # pretend the log is already > 4 GiB: checks the hi/lo split of offsets
    w._log_end = base
    w.append_many([b"ab", b"cde"])
    w.append(b"f")
    idx = (tmp_path / "hot" / f"{w.ledger_id}.idx").read_bytes()
    records = list(struct.iter_unpack(">qIi", idx))
    assert [(r[0], r[2]) for r in records] == [(base, 2), (base + 14, 3), (base + 29, 1)]
    assert records[1][1] == crc32c.crc32c(frame(1, b"cde"))


def test_concurrent_readers_of_one_handle(store: LocalLedgerStore) -> None:
    from concurrent.futures import ThreadPoolExecutor

    n = 3000
    lid = make_ledger(store, [payload_for(i) for i in range(n)])
    h = store.open_ledger(lid)

    def worker(seed: int) -> int:
        rng = random.Random(seed)
        for _ in range(200):
            first = rng.randrange(n)
            last = min(n - 1, first + rng.randrange(50))
            got = h.read(first, last)
            assert [e.data for e in got] == [payload_for(i) for i in range(first, last + 1)]
            assert h.read_frames(first, last) == b"".join(
                frame(i, payload_for(i)) for i in range(first, last + 1)
            )
        return 1

    with ThreadPoolExecutor(8) as pool:
        assert sum(pool.map(worker, range(8))) == 8
    h.close()


# --- metadata, ids, listing, deletion --------------------------------------------------------


def test_custom_metadata_round_trip(store: LocalLedgerStore, tmp_path: Path) -> None:
    custom = {"pulsar/managed-ledger": "a/b/persistent/c", "application": b"pulsar", "bin": b"\x00\xff"}
    w = store.create_ledger(custom, ctime_ms=1234567)
    w.append(b"abc")
    w.close()
    meta = store.ledger_metadata(w.ledger_id)
    assert meta.custom_metadata == {
        "pulsar/managed-ledger": b"a/b/persistent/c",
        "application": b"pulsar",
        "bin": b"\x00\xff",
    }
    assert meta.ctime == 1234567 and meta.last_entry_id == 0 and meta.length == 3
    # the file is BookKeeper's LedgerMetadataFormat, custom metadata sorted by key
    fmt = LedgerMetadataFormat()
    fmt.ParseFromString((tmp_path / "hot" / f"{w.ledger_id}.meta").read_bytes())
    assert (fmt.quorumSize, fmt.ensembleSize, fmt.ackQuorumSize) == (1, 1, 1)
    assert fmt.state == LedgerMetadataFormat.CLOSED and fmt.digestType == LedgerMetadataFormat.CRC32C
    assert (fmt.lastEntryId, fmt.length, fmt.ctime) == (0, 3, 1234567)
    assert [kv.key for kv in fmt.customMetadata] == ["application", "bin", "pulsar/managed-ledger"]
    assert len(fmt.segment) == 1 and fmt.segment[0].firstEntryId == 0
    # reopening the store reads the same thing
    assert LocalLedgerStore(tmp_path / "hot").ledger_metadata(w.ledger_id) == meta


def test_ctime_defaults_to_now(store: LocalLedgerStore) -> None:
    import time

    before = time.time_ns() // 1_000_000
    w = store.create_ledger({})
    assert before <= store.ledger_metadata(w.ledger_id).ctime <= time.time_ns() // 1_000_000


@pytest.mark.parametrize(
    "bad",
    [{"": b"x"}, {1: b"x"}, {"k": 5}, {"k": None}, ["not", "a", "mapping"]],
)
def test_custom_metadata_validation(store: LocalLedgerStore, bad: object) -> None:
    with pytest.raises(ValidationError):
        store.create_ledger(bad)  # type: ignore[arg-type]
    assert store.list_ledgers() == []


@pytest.mark.parametrize("bad", [-1, "1", 1.0, True, None])
def test_ledger_id_validation(store: LocalLedgerStore, bad: object) -> None:
    for op in (store.open_ledger, store.ledger_metadata, store.delete_ledger, store.exists):
        with pytest.raises(ValidationError):
            op(bad)  # type: ignore[arg-type]


def test_ids_increasing_list_delete(store: LocalLedgerStore, tmp_path: Path) -> None:
    ids = [make_ledger(store, [b"x"]) for _ in range(5)]
    assert ids == sorted(ids) and len(set(ids)) == 5
    assert store.list_ledgers() == ids
    store.delete_ledger(ids[1])
    store.delete_ledger(ids[1])  # idempotent
    assert not store.exists(ids[1]) and store.exists(ids[0])
    assert store.list_ledgers() == [ids[0]] + ids[2:]
    with pytest.raises(HotLedgerNotFoundError):
        store.open_ledger(ids[1])
    with pytest.raises(HotLedgerNotFoundError):
        store.ledger_metadata(ids[1])
    assert not (tmp_path / "hot" / f"{ids[1]}.log").exists()
    # ids never reused, also by a new store instance on the same directory
    new = make_ledger(LocalLedgerStore(tmp_path / "hot"), [])
    assert new > max(ids)
    store.delete_ledger(10**9)  # never existed: fine


def test_stale_handle_after_delete(store: LocalLedgerStore) -> None:
    lid = make_ledger(store, [b"a", b"b"])
    h = store.open_ledger(lid)
    assert h.read(0, 0) == [Entry(0, b"a")]
    store.delete_ledger(lid)
    with pytest.raises(StaleHandleError):
        h.read(0, 1)
    with pytest.raises(StaleHandleError):
        h.read_frames(0, 1)


def test_delete_open_ledger_makes_writer_stale(store: LocalLedgerStore) -> None:
    w = store.create_ledger({})
    w.append(b"a")
    store.delete_ledger(w.ledger_id)
    with pytest.raises(StaleHandleError):
        w.append(b"b")
    with pytest.raises(StaleHandleError):
        w.close()
    assert not store.exists(w.ledger_id) and store.list_ledgers() == []


def test_leftovers_without_meta_are_swept(store: LocalLedgerStore, tmp_path: Path) -> None:
    keep = make_ledger(store, [b"x"])
    gone = make_ledger(store, [b"y"])
    root = tmp_path / "hot"
    (root / f"{gone}.meta").unlink()  # crash right after the delete point
    assert store.list_ledgers() == [keep]
    assert not (root / f"{gone}.log").exists() and not (root / f"{gone}.idx").exists()
    (root / "777.log").write_bytes(b"junk")
    assert store.sweep() == [777]
    assert not (root / "777.log").exists()
    assert store.list_ledgers() == [keep]


def test_handle_close_and_store_close(tmp_path: Path) -> None:
    s = LocalLedgerStore(tmp_path / "hot")
    lid = make_ledger(s, [b"x"])
    h = s.open_ledger(lid)
    h.close()
    h.close()
    with pytest.raises(LedgerStateError):
        h.read(0, 0)
    w = s.create_ledger({})
    w.append(b"kept")
    h2 = s.open_ledger(lid)
    s.close()
    with pytest.raises(LedgerStateError):
        h2.read(0, 0)
    with pytest.raises(LedgerStateError):
        w.append(b"lost")
    with pytest.raises(LedgerStateError):
        s.create_ledger({})
    s2 = LocalLedgerStore(tmp_path / "hot")
    h3 = s2.open_ledger(w.ledger_id)  # released without sealing: still OPEN, entry kept
    assert not h3.is_closed and h3.read(0, 0) == [Entry(0, b"kept")]


def _create_worker(root: str, count: int, start, out) -> None:
    s = LocalLedgerStore(root, recover_on_open=False)
    start.wait()
    ids = []
    for _ in range(count):
        w = s.create_ledger({"worker": str(os.getpid())})
        ids.append(w.ledger_id)
        w.close()
    out.put(ids)


def test_concurrent_creation_from_processes(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    root = str(tmp_path / "hot")
    LocalLedgerStore(root)
    start = ctx.Event()
    out = ctx.Queue()
    procs = [ctx.Process(target=_create_worker, args=(root, 25, start, out)) for _ in range(4)]
    for p in procs:
        p.start()
    start.set()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    all_ids = [i for ids in results for i in ids]
    assert len(all_ids) == 100 and len(set(all_ids)) == 100
    for ids in results:
        assert ids == sorted(ids)  # strictly increasing within each process
    assert LocalLedgerStore(root).list_ledgers() == sorted(all_ids)


# --- corruption and recovery -----------------------------------------------------------------


def test_corrupt_payload_detected(store: LocalLedgerStore, tmp_path: Path) -> None:
    payloads = [bytes([i]) * 100 for i in range(5)]
    lid = make_ledger(store, payloads)
    h = store.open_ledger(lid)
    log = tmp_path / "hot" / f"{lid}.log"
    data = bytearray(log.read_bytes())
    data[h.frame_offset(2) + 12 + 50] ^= 0x01
    log.write_bytes(bytes(data))
    with pytest.raises(CorruptEntryError, match=rf"ledger {lid} entry 2"):
        h.read(2, 2)
    with pytest.raises(CorruptEntryError, match="entry 2"):
        h.read(0, 4)
    with pytest.raises(CorruptEntryError, match="entry 2"):
        h.read_frames(1, 3)
    assert h.read(0, 1) == [Entry(0, payloads[0]), Entry(1, payloads[1])]
    assert h.read(3, 4) == [Entry(3, payloads[3]), Entry(4, payloads[4])]
    # a corrupted header (length field) is caught too
    data[h.frame_offset(4)] ^= 0x10
    log.write_bytes(bytes(data))
    with pytest.raises(CorruptEntryError, match="entry 4"):
        h.read(4, 4)


def test_sealed_ledger_not_recovered(store: LocalLedgerStore, tmp_path: Path) -> None:
    lid = make_ledger(store, [b"abc", b"def"])
    log = tmp_path / "hot" / f"{lid}.log"
    size = log.stat().st_size
    with open(log, "r+b") as f:
        f.truncate(size - 1)
    assert store.recover_ledger(lid).last_entry_id == 1  # untouched
    assert log.stat().st_size == size - 1
    h = store.open_ledger(lid)
    assert h.read(0, 0) == [Entry(0, b"abc")]
    with pytest.raises(CorruptEntryError):
        h.read(1, 1)


def _open_ledger_with_dead_writer(root: Path, payloads: list[bytes]) -> int:
    s = LocalLedgerStore(root)
    w = s.create_ledger(ML_METADATA)
    w.append_many(payloads)
    w._abandon()  # the writer "dies": files released, ledger stays OPEN
    return w.ledger_id


PAYLOADS = [bytes([65 + i]) * (10 + i) for i in range(6)]


def _check_recovered(root: Path, lid: int, expect_entries: int) -> None:
    s = LocalLedgerStore(root, recover_on_open=False)
    h = s.open_ledger(lid)
    assert not h.is_closed
    assert h.last_add_confirmed == expect_entries - 1
    assert h.length == sum(map(len, PAYLOADS[:expect_entries]))
    assert [e.data for e in h.read(0, expect_entries - 1)] == PAYLOADS[:expect_entries]
    log_size = (root / f"{lid}.log").stat().st_size
    assert log_size == sum(12 + len(p) for p in PAYLOADS[:expect_entries])
    assert (root / f"{lid}.idx").stat().st_size == 16 * expect_entries
    assert s.ledger_metadata(lid).state == STATE_OPEN


def test_torn_tail_truncated_log(tmp_path: Path) -> None:
    root = tmp_path / "hot"
    lid = _open_ledger_with_dead_writer(root, PAYLOADS)
    log = root / f"{lid}.log"
    with open(log, "r+b") as f:
        f.truncate(log.stat().st_size - 5)  # middle of the last frame
    _check_recovered(root, lid, 5)


def test_torn_tail_truncated_log_header(tmp_path: Path) -> None:
    root = tmp_path / "hot"
    lid = _open_ledger_with_dead_writer(root, PAYLOADS)
    log = root / f"{lid}.log"
    with open(log, "r+b") as f:
        f.truncate(log.stat().st_size - len(PAYLOADS[-1]) - 6)  # middle of the last header
    _check_recovered(root, lid, 5)


def test_torn_tail_garbage_idx(tmp_path: Path) -> None:
    root = tmp_path / "hot"
    lid = _open_ledger_with_dead_writer(root, PAYLOADS)
    with open(root / f"{lid}.idx", "ab") as f:
        f.write(os.urandom(16 * 3 + 7))
    _check_recovered(root, lid, 6)


def test_torn_tail_idx_record_pointing_to_valid_looking_range(tmp_path: Path) -> None:
    root = tmp_path / "hot"
    lid = _open_ledger_with_dead_writer(root, PAYLOADS)
    with open(root / f"{lid}.idx", "ab") as f:  # a record inside the log but with a wrong crc
        f.write(struct.pack(">qIi", 0, 12345, 10))
    _check_recovered(root, lid, 6)


def test_torn_tail_frame_without_idx_record(tmp_path: Path) -> None:
    root = tmp_path / "hot"
    lid = _open_ledger_with_dead_writer(root, PAYLOADS)
    with open(root / f"{lid}.log", "ab") as f:
        f.write(frame(6, b"unacknowledged"))
    _check_recovered(root, lid, 6)


def test_torn_tail_partial_idx_record(tmp_path: Path) -> None:
    root = tmp_path / "hot"
    lid = _open_ledger_with_dead_writer(root, PAYLOADS)
    idx = root / f"{lid}.idx"
    with open(idx, "r+b") as f:
        f.truncate(idx.stat().st_size - 9)  # last record torn: its frame becomes unacknowledged
    _check_recovered(root, lid, 5)


def test_recovery_at_store_open_and_explicit(tmp_path: Path) -> None:
    root = tmp_path / "hot"
    lid = _open_ledger_with_dead_writer(root, PAYLOADS)
    with open(root / f"{lid}.log", "ab") as f:
        f.write(b"\x00\x00")
    s = LocalLedgerStore(root)  # recover_on_open=True
    assert (root / f"{lid}.log").stat().st_size == sum(12 + len(p) for p in PAYLOADS)
    meta = s.recover_ledger(lid)
    assert meta.state == STATE_OPEN and meta.last_entry_id == 5


def test_no_recovery_under_live_writer(store: LocalLedgerStore, tmp_path: Path) -> None:
    w = store.create_ledger({})
    w.append(b"abc")
    with open(tmp_path / "hot" / f"{w.ledger_id}.log", "ab") as f:
        f.write(b"in-flight")  # looks like a torn tail, but the writer is alive
    with pytest.raises(LedgerStateError):
        store.recover_ledger(w.ledger_id)
    other = LocalLedgerStore(tmp_path / "hot")  # recovery at open skips it too
    assert other.open_ledger(w.ledger_id).read(0, 0) == [Entry(0, b"abc")]
    assert (tmp_path / "hot" / f"{w.ledger_id}.log").stat().st_size == 15 + 9


# --- crash test with a real process ----------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import sys
    from tieredcore.hot.local import LocalLedgerStore

    def payload_for(entry_id):
        size = (entry_id * 7919) % 4100
        return (entry_id.to_bytes(8, "big") * (size // 8 + 1))[:size]

    store = LocalLedgerStore(sys.argv[1])
    w = store.create_ledger({"application": "pulsar"})
    out = sys.stdout
    out.write(f"L {w.ledger_id}\\n")
    out.flush()
    i = 0
    while True:
        eid = w.append(payload_for(i))
        assert eid == i
        out.write(f"{eid}\\n")
        out.flush()
        i += 1
    """
)


@pytest.mark.slow
def test_kill_writer_keeps_acknowledged_entries(tmp_path: Path) -> None:
    root = tmp_path / "hot"
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first = proc.stdout.readline()
        assert first.startswith("L "), proc.stderr.read()
        lid = int(first.split()[1])
        last_ack = -1
        while last_ack < 2000:
            line = proc.stdout.readline()
            assert line.endswith("\n"), proc.stderr.read()
            last_ack = int(line)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        for line in proc.stdout:  # anything printed before the kill landed was acknowledged too
            if line.endswith("\n"):
                last_ack = int(line)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    store = LocalLedgerStore(root)
    h = store.open_ledger(lid)
    assert not h.is_closed
    assert h.last_add_confirmed >= last_ack
    entries = h.read(0, h.last_add_confirmed)
    assert [e.entry_id for e in entries] == list(range(h.last_add_confirmed + 1))
    bad = [e.entry_id for e in entries if e.data != payload_for(e.entry_id)]
    assert bad == []
    assert h.length == sum(len(e.data) for e in entries)


# --- property: round trip --------------------------------------------------------------------

_HYP_ROOT = tempfile.TemporaryDirectory(prefix="hot-hyp-")
_HYP_STORE = LocalLedgerStore(_HYP_ROOT.name, recover_on_open=False)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(min_value=0, max_value=64 * 1024), max_size=40),
    seed=st.integers(min_value=0, max_value=2**32 - 1),
    split=st.integers(min_value=0, max_value=40),
    data=st.data(),
)
def test_round_trip_property(sizes: list[int], seed: int, split: int, data: st.DataObject) -> None:
    rng = random.Random(seed)
    payloads = [rng.randbytes(n) for n in sizes]
    w = _HYP_STORE.create_ledger({"seed": str(seed)})
    split = min(split, len(payloads))
    w.append_many(payloads[:split])
    for p in payloads[split : split + 1]:
        w.append(p)
    w.append_many(iter(payloads[split + 1 :]))
    meta = w.close()
    assert meta.last_entry_id == len(payloads) - 1 and meta.length == sum(sizes)
    h = _HYP_STORE.open_ledger(w.ledger_id)
    try:
        assert list(h.entry_sizes()) == sizes
        if payloads:
            first = data.draw(st.integers(0, len(payloads) - 1))
            last = data.draw(st.integers(first, len(payloads) - 1))
            assert h.read(first, last) == [Entry(i, payloads[i]) for i in range(first, last + 1)]
            expected = b"".join(frame(i, payloads[i]) for i in range(first, last + 1))
            assert h.read_frames(first, last) == expected
            assert h.frame_offset(first) == sum(12 + n for n in sizes[:first])
            whole = h.read_frames(0, len(payloads) - 1)
            assert whole == b"".join(frame(i, p) for i, p in enumerate(payloads))
            # the idx records match the frames (offset, crc of the whole frame, len)
            idx = Path(_HYP_ROOT.name, f"{w.ledger_id}.idx").read_bytes()
            off = 0
            for i, p in enumerate(payloads):
                assert struct.unpack_from(">qIi", idx, 16 * i) == (off, crc32c.crc32c(frame(i, p)), len(p))
                off += 12 + len(p)
    finally:
        h.close()
        _HYP_STORE.delete_ledger(w.ledger_id)


def test_frames_slice_points_at_the_frames_of_sealed_ledgers_only(tmp_path):
    from tieredcore.errors import LedgerStateError as _LSE
    from tieredcore.hot.local import LocalLedgerStore as _Store

    store = _Store(tmp_path / "hot")
    led = store.create_ledger({"a": b"b"})
    led.append_many([b"x" * 10, b"yy" * 20, b"z"])
    with pytest.raises(_LSE):
        store.open_ledger(led.ledger_id).frames_slice(0, 1)  # still open: bytes may change
    led.close()
    h = store.open_ledger(led.ledger_id)
    sl = h.frames_slice(1, 2)
    with open(sl.path, "rb") as f:
        f.seek(sl.offset)
        assert f.read(sl.length) == h.read_frames(1, 2)
