"""LedgerOffloader write path (spec/01): round trips on both object stores, conformance of the written
objects, user metadata and keys, rejections that write nothing, and delete_offloaded."""

from __future__ import annotations

import random
import tempfile
import uuid as uuidlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tieredcore.errors import LedgerStateError, NoSuchLedgerError, NoSuchObjectError, ValidationError
from tieredcore.formats import constants as C
from tieredcore.formats.block import check_data_object, iter_data_object
from tieredcore.formats.index import LedgerIndex, check_index_v1, parse_index
from tieredcore.offload.cache import OffsetCache
from tieredcore.offload.keys import data_key, index_key
from tieredcore.offload.offloader import LedgerOffloader
from tieredcore.stores.blob import iter_objects
from tieredcore.stores.fs import FilesystemBlobStore
from tieredcore.stores.hot import LocalLedgerStore

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
    assert index.metadata.custom_metadata == CUSTOM
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
        blob_store, prefix, max_block_size=max_block, read_buffer=8192, cluster="c1",
        offset_cache=OffsetCache(),
    )
    progress: list[tuple[int, int]] = []
    obj = off.offload(ledger, UUID, {"ManagedLedgerName": ML_NAME}, progress=lambda d, t: progress.append((d, t)))

    p = "tenant-a/offload/" if prefix else ""
    dkey, ikey = f"{p}{UUID}-ledger-{lid}", f"{p}{UUID}-ledger-{lid}-index"
    assert (obj.data_key, obj.index_key) == (dkey, ikey)
    assert (dkey, ikey) == (data_key(off.prefix, UUID, lid), index_key(off.prefix, UUID, lid))
    assert sorted(all_keys(blob_store)) == sorted([dkey, ikey])
    assert blob_store.list_multipart_uploads() == []

    index, data = check_conformance(blob_store, dkey, ikey, lid, payloads, max_block)
    assert obj.data_length == len(data) == index.data_object_length
    assert obj.blocks == len(index.entries)
    assert obj.entries == len(payloads)
    assert obj.payload_bytes == sum(sizes)
    # progress reports every block, ending at the total
    assert len(progress) == obj.blocks
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
    """spec/01 example 2: 100 entries of 100 bytes, max block 1000."""
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


def test_extra_metadata_keys_are_lower_cased_and_cannot_override_format_keys(fs_store, tmp_path: Path) -> None:
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
)
def test_round_trip_property(sizes: list[int], extra_block: int, read_buffer: int, step: int) -> None:
    max_block = C.MIN_BLOCK_SIZE + max(sizes) + extra_block
    payloads = [payload(i, s) for i, s in enumerate(sizes)]
    with tempfile.TemporaryDirectory() as d:
        hot = LocalLedgerStore(Path(d) / "hot")
        store = FilesystemBlobStore(Path(d) / "store", fsync=False)
        ledger = sealed_ledger(hot, payloads)
        off = LedgerOffloader(store, max_block_size=max_block, read_buffer=read_buffer, offset_cache=OffsetCache())
        obj = off.offload(ledger, UUID)
        check_conformance(store, obj.data_key, obj.index_key, ledger.ledger_id, payloads, max_block)
        assert read_all(off.read_offloaded(ledger.ledger_id, UUID), step) == payloads


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


@pytest.mark.parametrize("kwargs", [{"max_block_size": 139}, {"max_block_size": 0}, {"read_buffer": 0}])
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
    with pytest.raises(NoSuchLedgerError):
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
