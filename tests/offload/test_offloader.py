"""LedgerOffloader write path (docs/formats.md): round trips on both object stores, conformance of the written
objects, user metadata and keys, rejections that write nothing, and delete_offloaded."""

from __future__ import annotations

import random
import tempfile
import uuid as uuidlib
from pathlib import Path

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tieredcore.cold.backends.fs import FilesystemBlobStore
from tieredcore.cold.blob import iter_objects
from tieredcore.errors import (
    CorruptEntryError,
    LedgerStateError,
    NoSuchObjectError,
    OffloadedLedgerNotFoundError,
    ValidationError,
)
from tieredcore.formats import constants as C
from tieredcore.formats.block import check_data_object, iter_data_object
from tieredcore.formats.index import (
    LedgerIndex,
    check_index_v1,
    index_trailer,
    parse_checkpoints,
    parse_index,
)
from tieredcore.formats.keys import data_key, index_key
from tieredcore.hot.local import LocalLedgerStore
from tieredcore.offload.cache import OffsetCache
from tieredcore.offload.offloader import LedgerOffloader

ML_NAME = "public/default/persistent/my-topic"
CUSTOM = {
    "application": b"pulsar",
    "component": b"managed-ledger",
    "pulsar/managed-ledger": ML_NAME.encode(),
}
UUID = uuidlib.UUID("1b2c3d4e-0000-4000-8000-00000000abcd")


def payload(i: int, size: int) -> bytes:
    """Distinct, position-dependent bytes (a misplaced entry cannot compare equal)."""
    if size == 0:
        return b""
    head = f"<{i}:".encode()
    body = (head + bytes((i * 7 + k) % 256 for k in range(64))) * (size // (len(head) + 64) + 1)
    return body[:size]


def sealed_ledger(hot: LocalLedgerStore, payloads: list[bytes]):
    w = hot.create_ledger(CUSTOM, ctime_ms=1_700_000_000_000)
    if payloads:
        w.append_many(payloads)
    w.close()
    return hot.open_ledger(w.ledger_id)


def all_keys(store) -> list[str]:
    return [o.key for o in iter_objects(store)]


def read_all(handle, step: int) -> list[bytes]:
    out: list[bytes] = []
    lac = handle.last_add_confirmed
    for first in range(0, lac + 1, step):
        entries = handle.read(first, min(first + step - 1, lac))
        assert [e.entry_id for e in entries] == list(range(first, first + len(entries)))
        out.extend(bytes(e.data) for e in entries)
    return out


def check_checkpoints(index: LedgerIndex, data: bytes, interval: int) -> None:
    """The trailer's checkpoints point at the frames they name, inside blocks, and no frame is more
    than `interval` bytes after the nearest index point or checkpoint before it."""
    ids, offsets = parse_checkpoints(index)
    if interval == 0:
        assert ids == [] and not index.trailer.startswith(b"TSC1")
        return
    for eid, off in zip(ids, offsets, strict=True):
        length, fid = (
            int.from_bytes(data[off : off + 4], "big", signed=True),
            int.from_bytes(data[off + 4 : off + 12], "big"),
        )
        assert fid == eid and length >= 0
        assert eid not in index.entry_ids  # block starts are index points already
    points = sorted(
        [(e.first_entry_id, e.offset + 128) for e in index.entries] + list(zip(ids, offsets, strict=True))
    )
    pos = 0
    for e in index.entries:
        pos = e.offset + 128
        eid = e.first_entry_id
        while True:
            length, fid = (
                int.from_bytes(data[pos : pos + 4], "big", signed=True),
                int.from_bytes(data[pos + 4 : pos + 12], "big"),
            )
            if length < 0 or fid != eid or pos + 12 > len(data):
                break
            floor = max(p for p in points if p[0] <= eid)
            assert pos - floor[1] < interval or floor[0] == eid
            pos += 12 + length
            eid += 1
            if pos >= len(data):
                break


def check_conformance(store, dkey: str, ikey: str, ledger_id: int, payloads: list[bytes], max_block: int):
    raw_index = store.get(ikey)
    data = store.get(dkey)
    index = parse_index(raw_index, ledger_id)
    assert isinstance(index, LedgerIndex)
    check_index_v1(
        index,
        len(data),
        max_block_size=max_block,
        expected_last_entry_id=len(payloads) - 1,
        expected_length=sum(map(len, payloads)),
    )
    check_data_object(data, index, max_block)
    assert [p for _, p in iter_data_object(data, index)] == payloads
    # every non-last block is exactly the max block size; the last one fits its entries exactly
    sizes = index.block_sizes()
    assert all(s == max_block for s in sizes[:-1])
    assert sizes[-1] <= max_block
    # the hot ledger's custom metadata, plus the ledger id (the V1 format keeps it only in the key)
    assert index.metadata.custom_metadata == {**CUSTOM, "tiered/ledgerId": str(ledger_id).encode()}
    # the trailer's chunk checksums cover the data object exactly, and its index checksum holds
    trailer = index_trailer(index)
    assert trailer.problem == "" and trailer.checksums is not None
    ck = trailer.checksums
    assert ck.chunk_size == C.DEFAULT_CHECKSUM_CHUNK and ck.object_length == len(data)
    assert list(ck.crcs) == [crc32c.crc32c(data[i : i + ck.chunk_size]) for i in range(0, len(data), ck.chunk_size)]
    assert store.head(ikey).metadata["tieredchecksums"] == f"crc32c/{C.DEFAULT_CHECKSUM_CHUNK}"
    return index, data


# --- round trips -----------------------------------------------------------------------------------

RNG = random.Random(1234)
CASES = {
    # name: (payload sizes, max block size)
    "zero-byte-entries": ([0, 0, 5, 0, 4096 - 140, 0, 0, 1000, 0], 4096),
    "only-zero-byte-entries": ([0] * 500, 4096),
    "one-entry-fills-block": ([4096 - 140], 4096),
    "many-small": ([RNG.randrange(0, 60) for _ in range(3000)], 4096),
    "two-mib-entry": ([100, 2 * 1024 * 1024, 0, 5000, 3], 2 * 1024 * 1024 + 140),
    "blocks-64k": ([1000] * 300 + [0, 65536 - 140, 7], 64 * 1024),
}


@pytest.mark.parametrize("prefix", ["", "tenant-a/offload"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_round_trip_conformance(blob_store, tmp_path: Path, case: str, prefix: str) -> None:
    sizes, max_block = CASES[case]
    payloads = [payload(i, s) for i, s in enumerate(sizes)]
    hot = LocalLedgerStore(tmp_path / "hot")
    ledger = sealed_ledger(hot, payloads)
    lid = ledger.ledger_id
    off = LedgerOffloader(
        blob_store,
        prefix,
        max_block_size=max_block,
        read_buffer=8192,
        cluster="c1",
        offset_cache=OffsetCache(),
    )
    progress: list[tuple[int, int]] = []
    obj = off.offload(
        ledger, UUID, {"ManagedLedgerName": ML_NAME}, progress=lambda d, t: progress.append((d, t))
    )

    p = "tenant-a/offload/" if prefix else ""
    dkey, ikey = f"{p}{UUID}-ledger-{lid}", f"{p}{UUID}-ledger-{lid}-index"
    assert (obj.data_key, obj.index_key) == (dkey, ikey)
    assert (dkey, ikey) == (data_key(off.prefix, UUID, lid), index_key(off.prefix, UUID, lid))
    assert sorted(all_keys(blob_store)) == sorted([dkey, ikey])
    assert blob_store.list_multipart_uploads() == []

    index, data = check_conformance(blob_store, dkey, ikey, lid, payloads, max_block)
    check_checkpoints(index, data, C.DEFAULT_CHECKPOINT_INTERVAL)
    assert obj.data_length == len(data) == index.data_object_length
    assert obj.blocks == len(index.entries)
    assert obj.entries == len(payloads)
    assert obj.payload_bytes == sum(sizes)
    # progress reports every block (every part where parts go up concurrently), ending at the total
    concurrent = blob_store.concurrent_parts and off.upload_concurrency > 1
    assert len(progress) == (max(1, obj.data_length // off.part_size) if concurrent else obj.blocks)
    assert progress[-1] == (len(data), len(data))
    assert [d for d, _ in progress] == sorted(d for d, _ in progress)

    for key, role in ((dkey, C.ROLE_DATA), (ikey, C.ROLE_INDEX)):
        md = blob_store.head(key).metadata
        assert md[C.METADATA_FORMAT_VERSION_KEY] == "1"
        assert md[C.METADATA_ROLE_KEY] == role
        assert md[C.METADATA_MANAGED_LEDGER_NAME_KEY] == ML_NAME
        assert md[C.METADATA_CLUSTER_NAME_KEY] == "c1"
        assert C.METADATA_SOFTWARE_VERSION_KEY in md

    h = off.read_offloaded(lid, UUID)
    assert h.ledger_id == lid and h.is_closed
    assert h.last_add_confirmed == len(payloads) - 1 and h.length == sum(sizes)
    assert read_all(h, 1 if len(payloads) < 50 else 97) == payloads
    # a fresh handle, one read of everything
    h2 = off.read_offloaded(lid, str(UUID))
    assert [bytes(e.data) for e in h2.read(0, len(payloads) - 1)] == payloads


def test_worked_example_2_layout(fs_store, tmp_path: Path) -> None:
    """docs/formats.md's second vector: 100 entries of 100 bytes, max block 1000."""
    hot = LocalLedgerStore(tmp_path / "hot")
    payloads = [payload(i, 100) for i in range(100)]
    ledger = sealed_ledger(hot, payloads)
    off = LedgerOffloader(fs_store, max_block_size=1000, offset_cache=OffsetCache())
    obj = off.offload(ledger, UUID)
    assert (obj.data_length, obj.blocks) == (14352, 15)
    index = parse_index(fs_store.get(obj.index_key), ledger.ledger_id)
    assert [(e.first_entry_id, e.part_id, e.offset) for e in index.entries] == [
        (7 * i, i + 1, 1000 * i) for i in range(15)
    ]
    data = fs_store.get(obj.data_key)
    assert data[1000:1004] == bytes.fromhex("fbdbabcb")
    assert data[912:1000] == b"\xfe\xdc\xde\xad" * 22


def test_extra_metadata_keys_are_lower_cased_and_cannot_override_format_keys(
    fs_store, tmp_path: Path
) -> None:
    hot = LocalLedgerStore(tmp_path / "hot")
    ledger = sealed_ledger(hot, [b"x"])
    off = LedgerOffloader(fs_store, cluster="prod", offset_cache=OffsetCache())
    extra = {"ManagedLedgerName": ML_NAME, "Role": "forged", C.METADATA_FORMAT_VERSION_KEY: "9"}
    obj = off.offload(ledger, UUID, extra)
    md = fs_store.head(obj.data_key).metadata
    assert md["managedledgername"] == ML_NAME
    assert md["role"] == "data"
    assert md[C.METADATA_FORMAT_VERSION_KEY] == "1"
    assert md["pulsarclustername"] == "prod"
    assert off.read_offloaded(ledger.ledger_id, UUID).read(0, 0)[0].data == b"x"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(min_value=0, max_value=3000), min_size=1, max_size=60),
    extra_block=st.integers(min_value=0, max_value=6000),
    read_buffer=st.integers(min_value=1, max_value=10_000),
    step=st.integers(min_value=1, max_value=70),
    interval=st.sampled_from([0, 1, 100, 2000, C.DEFAULT_CHECKPOINT_INTERVAL]),
)
def test_round_trip_property(
    sizes: list[int], extra_block: int, read_buffer: int, step: int, interval: int
) -> None:
    max_block = C.MIN_BLOCK_SIZE + max(sizes) + extra_block
    payloads = [payload(i, s) for i, s in enumerate(sizes)]
    with tempfile.TemporaryDirectory() as d:
        hot = LocalLedgerStore(Path(d) / "hot")
        store = FilesystemBlobStore(Path(d) / "store", fsync=False)
        ledger = sealed_ledger(hot, payloads)
        off = LedgerOffloader(
            store,
            max_block_size=max_block,
            read_buffer=read_buffer,
            offset_cache=OffsetCache(),
            checkpoint_interval=interval,
        )
        obj = off.offload(ledger, UUID)
        index, data = check_conformance(
            store, obj.data_key, obj.index_key, ledger.ledger_id, payloads, max_block
        )
        check_checkpoints(index, data, interval)
        assert read_all(off.read_offloaded(ledger.ledger_id, UUID), step) == payloads
        # random single-entry reads on cold handles start at the nearest checkpoint
        for e in range(len(payloads) - 1, -1, -7):
            assert off.read_offloaded(ledger.ledger_id, UUID).read(e, e)[0].data == payloads[e]


# --- rejections: nothing written -----------------------------------------------------------------


def assert_nothing_written(store) -> None:
    assert all_keys(store) == []
    assert store.list_multipart_uploads() == []


def test_open_ledger_is_rejected(blob_store, tmp_path: Path) -> None:
    hot = LocalLedgerStore(tmp_path / "hot")
    w = hot.create_ledger(CUSTOM)
    w.append_many([b"a", b"b"])
    h = hot.open_ledger(w.ledger_id)  # live writer: read as is, still OPEN
    assert not h.is_closed
    off = LedgerOffloader(blob_store, max_block_size=4096, offset_cache=OffsetCache())
    with pytest.raises(LedgerStateError, match="open"):
        off.offload(h, UUID)
    assert_nothing_written(blob_store)
    w.close()


def test_empty_ledger_is_rejected(blob_store, tmp_path: Path) -> None:
    hot = LocalLedgerStore(tmp_path / "hot")
    h = sealed_ledger(hot, [])
    assert h.is_closed and h.last_add_confirmed == -1
    off = LedgerOffloader(blob_store, max_block_size=4096, offset_cache=OffsetCache())
    with pytest.raises(LedgerStateError, match="no entries"):
        off.offload(h, UUID)
    assert_nothing_written(blob_store)


@pytest.mark.parametrize("largest", [4096 - 140 + 1, 10_000])
def test_block_too_small_for_largest_entry(blob_store, tmp_path: Path, largest: int) -> None:
    hot = LocalLedgerStore(tmp_path / "hot")
    h = sealed_ledger(hot, [b"small", bytes(largest), b""])
    off = LedgerOffloader(blob_store, max_block_size=4096, offset_cache=OffsetCache())
    with pytest.raises(ValidationError):
        off.offload(h, UUID)
    assert_nothing_written(blob_store)


@pytest.mark.parametrize(
    "kwargs",
    [{"max_block_size": 139}, {"max_block_size": 0}, {"read_buffer": 0}, {"checkpoint_interval": -1}],
)
def test_bad_configuration(fs_store, kwargs: dict) -> None:
    with pytest.raises(ValidationError):
        LedgerOffloader(fs_store, **kwargs)


def test_bad_prefix(fs_store) -> None:
    for prefix in ("/abs", "a/../b"):
        with pytest.raises(ValidationError):
            LedgerOffloader(fs_store, prefix)


# --- delete_offloaded ----------------------------------------------------------------------------


def test_delete_offloaded_removes_both_objects_and_is_idempotent(blob_store, tmp_path: Path) -> None:
    hot = LocalLedgerStore(tmp_path / "hot")
    h = sealed_ledger(hot, [payload(i, 500) for i in range(20)])
    off = LedgerOffloader(blob_store, "p", max_block_size=4096, offset_cache=OffsetCache())
    other = uuidlib.uuid4()
    obj = off.offload(h, UUID)
    kept = off.offload(h, other)  # another attempt of the same ledger: untouched
    off.delete_offloaded(h.ledger_id, UUID)
    assert sorted(all_keys(blob_store)) == sorted([kept.data_key, kept.index_key])
    with pytest.raises(NoSuchObjectError):
        blob_store.head(obj.data_key)
    with pytest.raises(OffloadedLedgerNotFoundError):
        off.read_offloaded(h.ledger_id, UUID)
    off.delete_offloaded(h.ledger_id, UUID)  # again: nothing to do, no error
    off.delete_offloaded(h.ledger_id, uuidlib.uuid4())  # never offloaded: no error
    assert sorted(all_keys(blob_store)) == sorted([kept.data_key, kept.index_key])
    assert off.read_offloaded(h.ledger_id, other).read(19, 19)[0].data == payload(19, 500)


def test_delete_offloaded_aborts_unfinished_upload_of_that_attempt(blob_store, tmp_path: Path) -> None:
    off = LedgerOffloader(blob_store, max_block_size=4096, offset_cache=OffsetCache())
    lid = 7
    mine = data_key("", UUID, lid)
    other_attempt = data_key("", uuidlib.uuid4(), lid)
    other_ledger = data_key("", UUID, 70)  # shares the key prefix "{uuid}-ledger-7"
    for key in (mine, other_attempt, other_ledger):
        up = blob_store.initiate_multipart(key, {"role": "data"})
        blob_store.upload_part(key, up, 1, b"\x00" * 2048)
    off.delete_offloaded(lid, UUID)
    left = sorted(u.key for u in blob_store.list_multipart_uploads())
    assert left == sorted([other_attempt, other_ledger])
    assert all_keys(blob_store) == []
    off.delete_offloaded(lid, UUID)  # idempotent
    assert sorted(u.key for u in blob_store.list_multipart_uploads()) == left


def test_checkpoint_interval_zero_writes_exactly_pulsars_index(tmp_path):
    """With checkpoints and checksums off, the index object is exactly header + metadata + 20·n entry
    bytes."""
    import struct as _struct
    import uuid as _uuid

    from tieredcore.cold.backends.fs import FilesystemBlobStore as _Fs
    from tieredcore.hot.local import LocalLedgerStore as _Hot
    from tieredcore.offload.offloader import LedgerOffloader as _Off

    hot = _Hot(tmp_path / "hot")
    led = hot.create_ledger({"application": b"pulsar"})
    led.append_many([bytes([i % 251]) * 300 for i in range(200)])
    led.close()
    store = _Fs(tmp_path / "cold")
    u = _uuid.uuid4()
    for interval, trailer in ((0, False), (1024, True)):
        off = _Off(store, max_block_size=4096, checkpoint_interval=interval, checksum_chunk=interval)
        off.offload(hot.open_ledger(led.ledger_id), u)
        raw = store.get(f"{u}-ledger-{led.ledger_id}-index")
        _magic, length, _dlen, _hdr, n, m = _struct.unpack_from(">iiqqii", raw)
        assert length == 32 + m + 20 * n
        assert (len(raw) > length) is trailer
        h = off.read_offloaded(led.ledger_id, u)
        assert [e.data for e in h.read(0, 199)] == [bytes([i % 251]) * 300 for i in range(200)]
        off.delete_offloaded(led.ledger_id, u)


@pytest.mark.parametrize("suffix", ["\n", "x", "-index\n", "-indexes"])
def test_parse_ledger_key_rejects_near_misses(suffix):
    from tieredcore.formats.keys import parse_ledger_key

    u = "12345678-1234-1234-1234-123456789abc"
    assert parse_ledger_key(f"{u}-ledger-5") is not None
    assert parse_ledger_key(f"{u}-ledger-5{suffix}") is None
    assert parse_ledger_key(f"{u}-ledger-\u0663") is None  # a non-ASCII digit


def test_object_key_grammar_round_trips_ledger_and_segment_keys():
    from tieredcore.formats.keys import (
        data_key,
        index_key,
        parse_key,
        parse_ledger_key,
        segment_data_key,
        segment_index_key,
    )

    u = str(uuidlib.UUID(int=0xABCDEF1234))
    assert data_key("p/", u, 7) == f"p/{u}-ledger-7" and index_key("p/", u, 7) == f"p/{u}-ledger-7-index"
    assert segment_data_key("p/", u) == f"p/{u}" and segment_index_key("p/", u) == f"p/{u}-index"
    for key, lid, is_index in ((data_key("p/", u, 7), 7, False), (index_key("p/", u, 7), 7, True),
                               (segment_data_key("p/", u), None, False), (segment_index_key("p/", u), None, True)):
        parsed = parse_key(key, "p/")
        assert parsed is not None and (parsed.uuid, parsed.ledger_id, parsed.is_index) == (u, lid, is_index)
        assert parsed.is_segment == (lid is None)
        assert (parse_ledger_key(key, "p/") is not None) == (lid is not None)
    assert parse_key(f"p/{u}\n", "p/") is None and parse_key(f"q/{u}", "p/") is None
    assert parse_key(f"p/{u.upper()}", "p/") is None  # uuids are lowercase


def flip_byte(path: Path, at: int, mask: int) -> None:
    """Damage one byte of a hot-tier file in place (what a bad disk sector does)."""
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ mask]))


@pytest.mark.parametrize("bad_block", [0, 2])
def test_a_corrupt_hot_frame_commits_nothing_while_its_block_is_copied(blob_store, tmp_path: Path,
                                                                      bad_block: int) -> None:
    """A local store copies a block's frames in the kernel while they are CRC-checked alongside; a bad
    frame in any block (the first, a later one) fails the offload and leaves no object or upload."""
    hot = LocalLedgerStore(tmp_path / "hot")
    payloads = [payload(i, 900) for i in range(40)]
    h = sealed_ledger(hot, payloads)
    entry = bad_block * 4 + 1  # 4 entries of 900 B per 4 KiB block
    off_in_log = h.frame_offset(entry) + 20
    h.close()
    flip_byte(tmp_path / "hot" / f"{h.ledger_id}.log", off_in_log, 0x5A)
    h = hot.open_ledger(h.ledger_id)
    off = LedgerOffloader(blob_store, max_block_size=4096, offset_cache=OffsetCache())
    with pytest.raises(CorruptEntryError, match=rf"(?i)crc.*entry {entry}|entry {entry}.*crc"):
        off.offload(h, UUID)
    h.close()
    assert_nothing_written(blob_store)


@pytest.mark.parametrize("bad_entry", [0, 13, 38, 39])
def test_frames_are_checked_in_windows_smaller_than_a_block(blob_store, tmp_path: Path, monkeypatch,
                                                           bad_entry: int) -> None:
    """The offloader checks the hot tier's frames a window of whole entries at a time (windows much
    smaller than a block here, entries larger than a window too), whether the filesystem store copies
    them itself or they go to S3 as streamed parts: a bad frame in any window fails the offload with
    nothing written, and good ledgers read back exactly."""
    import tieredcore.offload.offloader as offloader_mod

    monkeypatch.setattr(offloader_mod, "CHECK_WINDOW", 4096)
    hot = LocalLedgerStore(tmp_path / "hot")
    sizes = [900, 3000, 5000, 12_000, 0, 1] * 6 + [20_000, 7, 4083, 4084]  # some larger than the window
    payloads = [payload(i, n) for i, n in enumerate(sizes)]
    good = sealed_ledger(hot, payloads)
    off = LedgerOffloader(blob_store, max_block_size=64 * 1024, offset_cache=OffsetCache())
    obj = off.offload(good, UUID)
    assert obj.blocks > 1
    h = off.read_offloaded(good.ledger_id, UUID)
    assert read_all(h, 7) == payloads
    h.close()
    good.close()
    off.delete_offloaded(obj.ledger_id, UUID)
    assert_nothing_written(blob_store)

    bad = sealed_ledger(hot, payloads)
    at = bad.frame_offset(bad_entry) + 12 + max(0, sizes[bad_entry] - 1)  # the last payload byte (or a header byte)
    bad.close()
    flip_byte(tmp_path / "hot" / f"{bad.ledger_id}.log", at, 0x01)
    bad = hot.open_ledger(bad.ledger_id)
    with pytest.raises(CorruptEntryError, match=rf"(?i)entry {bad_entry}\b"):
        off.offload(bad, uuidlib.uuid4())
    bad.close()
    assert_nothing_written(blob_store)


class _PartSpy:
    """The S3 store as is, recording the parts it is sent (and failing one, when asked)."""

    def __init__(self, store, fail_part: int = 0) -> None:
        self._store, self.fail_part = store, fail_part
        self.parts: list[tuple[int, int]] = []

    def __getattr__(self, name):
        return getattr(self._store, name)

    def upload_part(self, key, upload_id, n, data):
        self.parts.append((n, len(memoryview(data))))
        if n == self.fail_part:
            raise OSError(f"injected failure of part {n}")
        return self._store.upload_part(key, upload_id, n, data)


def test_s3_blocks_go_up_as_concurrent_parts_and_read_back(s3_store, tmp_path: Path) -> None:
    """The object goes up as parts of one size (at least part_size; the last: the rest, so no tiny last
    part), cut across block boundaries and sent several at once (S3 takes them in any order); the object
    is Pulsar's all the same: block boundaries, index and checksums do not depend on parts."""
    mib = 1024 * 1024
    payloads = [payload(i, 512 * 1024) for i in range(30)]  # 15 MiB: an 11 MiB block and a 4 MiB one
    h = sealed_ledger(LocalLedgerStore(tmp_path / "hot"), payloads)
    spy = _PartSpy(s3_store)
    off = LedgerOffloader(spy, max_block_size=11 * mib, upload_concurrency=4, part_size=5 * mib,
                          offset_cache=OffsetCache())
    obj = off.offload(h, UUID)
    sizes = dict(spy.parts)
    assert obj.data_length > 15 * mib
    assert sorted(sizes) == [1, 2, 3]  # 15 MiB and a little: three parts, part 3 across blocks 1 and 2
    assert sizes[1] == sizes[2] == -(-obj.data_length // 3) > 5 * mib
    assert sizes[3] == obj.data_length - 2 * sizes[1] >= 5 * mib
    check_conformance(s3_store, obj.data_key, obj.index_key, h.ledger_id, payloads, 11 * mib)
    handle = off.read_offloaded(h.ledger_id, UUID)
    assert read_all(handle, 7) == payloads
    handle.close()


def test_s3_a_failed_concurrent_part_aborts_and_leaves_nothing(s3_store, tmp_path: Path) -> None:
    mib = 1024 * 1024
    h = sealed_ledger(LocalLedgerStore(tmp_path / "hot"), [payload(i, 512 * 1024) for i in range(30)])
    spy = _PartSpy(s3_store, fail_part=2)
    off = LedgerOffloader(spy, max_block_size=11 * mib, upload_concurrency=4, part_size=5 * mib,
                          offset_cache=OffsetCache())
    with pytest.raises(OSError, match="injected failure of part 2"):
        off.offload(h, UUID)
    assert_nothing_written(s3_store)


@pytest.mark.parametrize("kwargs, match", [
    ({"upload_concurrency": 0}, "upload_concurrency must be an integer from 1 to 64"),
    ({"part_size": 1024}, "part_size must be at least 5242880 bytes"),
])
def test_bad_upload_settings(fs_store, kwargs: dict, match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        LedgerOffloader(fs_store, **kwargs)
