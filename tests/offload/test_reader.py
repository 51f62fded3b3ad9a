"""Read path of offloaded ledgers (docs/formats.md): ranges, block boundaries, missing or foreign
objects, fetch amplification, sequential-stream detection, concurrent readers, the offset cache."""

from __future__ import annotations

import threading
import types
import uuid as uuidlib
from pathlib import Path

import pytest

import tieredcore.offload.cache as cache_mod
from tieredcore.errors import (
    BadRangeError,
    CorruptObjectError,
    FormatError,
    InvalidMagicError,
    OffloadedLedgerNotFoundError,
    TruncatedError,
    UnsupportedVersionError,
)
from tieredcore.formats import constants as C
from tieredcore.formats.index import LedgerIndex
from tieredcore.hot.local import LocalLedgerStore
from tieredcore.offload.cache import OffsetCache
from tieredcore.offload.offloader import LedgerOffloader

UUID = uuidlib.UUID("0badcafe-0000-4000-8000-000000000001")
MIB = 1024 * 1024


def payload(i: int, size: int) -> bytes:
    head = f"[{i}]".encode()
    return (head * (size // len(head) + 1))[:size]


def sealed_ledger(hot: LocalLedgerStore, payloads: list[bytes]):
    w = hot.create_ledger({"application": b"pulsar"})
    w.append_many(payloads)
    w.close()
    return hot.open_ledger(w.ledger_id)


class RecordingStore:
    """Delegates to a BlobStore and records every ranged GET."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.driver = inner.driver
        self.ranges: list[tuple[int, int]] = []
        self._lock = threading.Lock()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def get_range(self, key, start, end):
        with self._lock:
            self.ranges.append((start, end))
        return self.inner.get_range(key, start, end)


def offload(
    store,
    tmp_path: Path,
    payloads: list[bytes],
    *,
    max_block_size: int = C.DEFAULT_MAX_BLOCK_SIZE,
    read_buffer: int = C.DEFAULT_READ_BUFFER_SIZE,
    cache: OffsetCache | None = None,
    pulsar_index: bool = False,
):
    """Offload `payloads` as one ledger. `pulsar_index`: no trailer (no checkpoints, no checksums), the
    index exactly as Pulsar writes it."""
    hot = LocalLedgerStore(tmp_path / "hot")
    ledger = sealed_ledger(hot, payloads)
    off = LedgerOffloader(
        store,
        max_block_size=max_block_size,
        read_buffer=read_buffer,
        offset_cache=cache if cache is not None else OffsetCache(),
        **({"checkpoint_interval": 0, "checksum_chunk": 0} if pulsar_index else {}),
    )
    obj = off.offload(ledger, UUID)
    ledger.close()
    return off, obj


# --- ranges and block boundaries -------------------------------------------------------------------


def test_bad_ranges(fs_store, tmp_path: Path) -> None:
    off, obj = offload(fs_store, tmp_path, [payload(i, 10) for i in range(10)])
    h = off.read_offloaded(obj.ledger_id, UUID)
    for first, last in ((-1, 3), (5, 4), (0, 10), (10, 10), (9, 100), (-5, -1)):
        with pytest.raises(BadRangeError):
            h.read(first, last)
    assert h.requests == 0  # rejected before any GET
    assert [e.data for e in h.read(9, 9)] == [payload(9, 10)]


@pytest.mark.parametrize("read_buffer", [1, 100, 1000, 5000, MIB])
def test_reads_across_block_boundaries_and_padding(fs_store, tmp_path: Path, read_buffer: int) -> None:
    """docs/formats.md's second vector: 7 entries per 1000-byte block, 88 bytes of padding, last block 2."""
    payloads = [payload(i, 100) for i in range(100)]
    off, obj = offload(fs_store, tmp_path, payloads, max_block_size=1000, read_buffer=read_buffer)
    assert obj.blocks == 15
    for first in range(100):
        for span in (0, 1, 6, 7, 8, 13, 14, 99):
            last = min(first + span, 99)
            h = off.read_offloaded(obj.ledger_id, UUID)  # cold handle every time
            got = h.read(first, last)
            assert [e.entry_id for e in got] == list(range(first, last + 1))
            assert [e.data for e in got] == payloads[first : last + 1]


def test_zero_length_entries_and_block_end(blob_store, tmp_path: Path) -> None:
    payloads = [b"", b"", payload(2, 4096 - 140 - 24), b"", payload(4, 3000), b""]
    off, obj = offload(blob_store, tmp_path, payloads, max_block_size=4096, read_buffer=512)
    h = off.read_offloaded(obj.ledger_id, UUID)
    for first in range(len(payloads)):
        for last in range(first, len(payloads)):
            assert [e.data for e in h.read(first, last)] == payloads[first : last + 1]


# --- missing and foreign objects -----------------------------------------------------------------


def test_index_missing(blob_store, tmp_path: Path) -> None:
    off, obj = offload(blob_store, tmp_path, [b"a", b"b"], max_block_size=4096)
    blob_store.delete([obj.index_key])
    with pytest.raises(OffloadedLedgerNotFoundError):
        off.read_offloaded(obj.ledger_id, UUID)
    with pytest.raises(OffloadedLedgerNotFoundError):
        off.read_offloaded(obj.ledger_id + 1, UUID)  # never offloaded


def test_data_missing(blob_store, tmp_path: Path) -> None:
    off, obj = offload(blob_store, tmp_path, [b"a", b"b"], max_block_size=4096)
    blob_store.delete([obj.data_key])
    with pytest.raises(OffloadedLedgerNotFoundError):
        off.read_offloaded(obj.ledger_id, UUID)


def rewrite(store, key: str, *, data: bytes | None = None, drop: str | None = None, set_: dict | None = None):
    md = dict(store.head(key).metadata)
    body = store.get(key) if data is None else data
    if drop is not None:
        del md[drop]
    md.update(set_ or {})
    store.put(key, body, md)


@pytest.mark.parametrize("which", ["index", "data"])
@pytest.mark.parametrize("version", [None, "2", ""])
def test_format_version_checked(blob_store, tmp_path: Path, which: str, version: str | None) -> None:
    off, obj = offload(blob_store, tmp_path, [b"a", b"b"], max_block_size=4096)
    key = obj.index_key if which == "index" else obj.data_key
    if version is None:
        rewrite(blob_store, key, drop=C.METADATA_FORMAT_VERSION_KEY)
    else:
        rewrite(blob_store, key, set_={C.METADATA_FORMAT_VERSION_KEY: version})
    with pytest.raises(UnsupportedVersionError, match="Invalid object version"):
        off.read_offloaded(obj.ledger_id, UUID)


@pytest.mark.parametrize("pulsar_index", [True, False])
def test_index_garbage(blob_store, tmp_path: Path, pulsar_index: bool) -> None:
    off, obj = offload(blob_store, tmp_path, [b"a", b"b"], max_block_size=4096, pulsar_index=pulsar_index)
    raw = blob_store.get(obj.index_key)
    rewrite(blob_store, obj.index_key, data=b"\x00" * len(raw))
    with pytest.raises(InvalidMagicError):
        off.read_offloaded(obj.ledger_id, UUID)
    rewrite(blob_store, obj.index_key, data=raw[:-1])
    # Pulsar's index ends with its entries; this project's ends with the checksum section
    with pytest.raises(TruncatedError if pulsar_index else CorruptObjectError):
        off.read_offloaded(obj.ledger_id, UUID)
    rewrite(blob_store, obj.index_key, data=raw)
    assert off.read_offloaded(obj.ledger_id, UUID).read(0, 1)[1].data == b"b"


@pytest.mark.parametrize("delta", [-1, 1])
def test_data_size_differs_from_index(blob_store, tmp_path: Path, delta: int) -> None:
    off, obj = offload(blob_store, tmp_path, [payload(i, 50) for i in range(10)], max_block_size=4096)
    data = blob_store.get(obj.data_key)
    rewrite(blob_store, obj.data_key, data=data[:-1] if delta < 0 else data + b"\xfe")
    with pytest.raises(FormatError, match="differs"):
        off.read_offloaded(obj.ledger_id, UUID)


def test_corrupt_frame_is_a_format_error(fs_store, tmp_path: Path) -> None:
    """Without checksums (Pulsar's objects) frame ids still catch a damaged frame header."""
    payloads = [payload(i, 50) for i in range(10)]
    off, obj = offload(fs_store, tmp_path, payloads, max_block_size=4096, pulsar_index=True)
    data = bytearray(fs_store.get(obj.data_key))
    # entry 3's frame: header 128 + 3 frames of 62 bytes; overwrite its entry id
    pos = 128 + 3 * 62
    data[pos + 4 : pos + 12] = (99).to_bytes(8, "big")
    rewrite(fs_store, obj.data_key, data=bytes(data))
    h = off.read_offloaded(obj.ledger_id, UUID)
    assert [e.data for e in h.read(0, 2)] == payloads[:3]
    with pytest.raises(FormatError, match="expected entry 3"):
        off.read_offloaded(obj.ledger_id, UUID).read(0, 5)


# --- fetch amplification and stream detection ----------------------------------------------------

KIB_ENTRIES = [payload(i, 1024) for i in range(4000)]  # ~4 MiB of frames


@pytest.mark.parametrize("max_block_size", [C.DEFAULT_MAX_BLOCK_SIZE, MIB, 64 * 1024])
@pytest.mark.parametrize("entry", [1, 1999, 2000, 2001, 3998])
def test_cold_random_read_fetches_little_more_than_it_returns(
    fs_store, tmp_path: Path, max_block_size: int, entry: int
) -> None:
    off, obj = offload(fs_store, tmp_path, KIB_ENTRIES, max_block_size=max_block_size, read_buffer=MIB)
    h = off.read_offloaded(obj.ledger_id, UUID)
    got = h.read(entry, entry)
    assert got[0].data == KIB_ENTRIES[entry]
    # the walk from the nearest checkpoint (< one interval) widened to whole checksum chunks
    assert h.bytes_fetched - len(got[0].data) < C.DEFAULT_CHECKPOINT_INTERVAL + 2 * C.DEFAULT_CHECKSUM_CHUNK
    assert h.requests <= 2


def test_sequential_read_requests(fs_store, tmp_path: Path) -> None:
    store = RecordingStore(fs_store)
    off, obj = offload(store, tmp_path, KIB_ENTRIES, max_block_size=MIB, read_buffer=MIB)
    h = off.read_offloaded(obj.ledger_id, UUID)
    got = h.read(0, len(KIB_ENTRIES) - 1)
    assert [e.data for e in got] == KIB_ENTRIES
    assert h.requests <= obj.data_length // MIB + obj.blocks + 2
    assert h.bytes_fetched <= obj.data_length + MIB


def test_sequential_stream_detected_in_small_calls(fs_store, tmp_path: Path) -> None:
    store = RecordingStore(fs_store)
    off, obj = offload(store, tmp_path, KIB_ENTRIES, max_block_size=C.DEFAULT_MAX_BLOCK_SIZE, read_buffer=MIB)
    h = off.read_offloaded(obj.ledger_id, UUID)
    h.stream_window = 1536 * 1024  # (8 MiB by default: more than this object)
    store.ranges.clear()
    for first in range(0, len(KIB_ENTRIES), 100):
        got = h.read(first, first + 99)
        assert [e.data for e in got] == KIB_ENTRIES[first : first + 100]
    assert h.requests <= obj.data_length // MIB + obj.blocks + 2
    # after the first (non-sequential) call, every GET is a whole stream window (read ahead), except the
    # last one, clipped at the object end
    h.close()
    sizes = [end - start + 1 for start, end in store.ranges]
    assert len(sizes) >= 3 and all(s == 1536 * 1024 for s in sizes[1:-1]), sizes
    assert store.ranges[-1][1] == obj.data_length - 1
    assert h.bytes_fetched <= obj.data_length + 200 * 1024


def test_concurrent_readers_keep_their_buffers(fs_store, tmp_path: Path) -> None:
    store = RecordingStore(fs_store)
    off, obj = offload(store, tmp_path, KIB_ENTRIES, max_block_size=C.DEFAULT_MAX_BLOCK_SIZE, read_buffer=MIB)
    h = off.read_offloaded(obj.ledger_id, UUID)
    n_threads, region = 4, len(KIB_ENTRIES) // 4
    barrier = threading.Barrier(n_threads)
    errors: list[BaseException] = []

    def reader(t: int) -> None:
        try:
            lo, hi = t * region, (t + 1) * region
            barrier.wait()
            for _rep in range(3):
                for first in range(lo, hi, 10):
                    last = min(first + 9, hi - 1)
                    got = h.read(first, last)
                    assert [e.entry_id for e in got] == list(range(first, last + 1))
                    assert [e.data for e in got] == KIB_ENTRIES[first : last + 1]
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=reader, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    assert h.bytes_fetched <= 2 * obj.data_length
    assert h.requests <= 4 * (obj.data_length // MIB + 2 * n_threads)


# --- offset cache --------------------------------------------------------------------------------


def test_offset_cache_is_bounded_lru() -> None:
    c = OffsetCache(max_entries=3, ttl_seconds=60)
    for e in range(3):
        c.put(1, "u", e, 100 + e)
    assert c.get(1, "u", 0) == 100  # 0 becomes the most recently used
    c.put(1, "u", 3, 103)
    assert len(c) == 3
    assert c.get(1, "u", 1) is None  # least recently used: evicted
    assert [c.get(1, "u", e) for e in (0, 2, 3)] == [100, 102, 103]
    for e in range(1000):
        c.put(2, "v", e, e)
    assert len(c) == 3
    assert c.get(2, "v", 999) == 999
    assert c.get(1, "u", 3) is None
    # keys are (ledger, uuid, entry): another attempt's offsets are never used
    c.put(5, "a", 1, 10)
    assert c.get(5, "b", 1) is None
    assert c.get(6, "a", 1) is None


def test_offset_cache_ttl(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(cache_mod, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    c = OffsetCache(max_entries=10, ttl_seconds=0.5)
    c.put(1, "u", 1, 42)
    now[0] += 0.4
    assert c.get(1, "u", 1) == 42
    now[0] += 0.2  # 0.6 s after the put
    assert c.get(1, "u", 1) is None
    assert len(c) == 0  # expired entries are dropped when seen
    c.put(1, "u", 1, 43)  # a new put restarts the clock
    now[0] += 0.3
    assert c.get(1, "u", 1) == 43


def test_exact_offset_reuse_skips_the_index(
    fs_store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    payloads = [payload(i, 100) for i in range(50)]
    cache = OffsetCache()
    off, obj = offload(fs_store, tmp_path, payloads, cache=cache)
    h = off.read_offloaded(obj.ledger_id, UUID)
    assert [e.data for e in h.read(0, 9)] == payloads[:10]
    assert cache.get(obj.ledger_id, str(UUID), 10) == 128 + 10 * 112

    def no_index(self, entry_id):
        raise AssertionError(f"index consulted for entry {entry_id}")

    monkeypatch.setattr(LedgerIndex, "lookup", no_index)
    assert [e.data for e in h.read(10, 19)] == payloads[10:20]
    # another handle of the same ledger and attempt shares the process-wide cache
    h2 = off.read_offloaded(obj.ledger_id, UUID)
    assert [e.data for e in h2.read(20, 24)] == payloads[20:25]
    with pytest.raises(AssertionError, match="index consulted"):
        h2.read(3, 4)  # not a cached position: the index is needed


def test_close_drops_buffers(fs_store, tmp_path: Path) -> None:
    payloads = [payload(i, 100) for i in range(50)]
    off, obj = offload(fs_store, tmp_path, payloads)
    h = off.read_offloaded(obj.ledger_id, UUID)
    h.read(0, 49)
    before = h.requests
    h.read(0, 49)
    assert h.requests == before  # served from the handle's windows
    h.close()
    assert [e.data for e in h.read(0, 49)] == payloads
    assert h.requests == before + 1


# --- index trailer (checkpoints) -----------------------------------------------------------------


def test_index_without_checkpoints_reads_by_walking_the_block(fs_store, tmp_path: Path) -> None:
    """Pulsar's objects have no checkpoint trailer: a random read walks from its block's start."""
    hot = LocalLedgerStore(tmp_path / "hot")
    ledger = sealed_ledger(hot, KIB_ENTRIES[:500])
    off = LedgerOffloader(
        fs_store, max_block_size=64 * 1024, read_buffer=MIB, offset_cache=OffsetCache(), checkpoint_interval=0,
        checksum_chunk=0,
    )
    obj = off.offload(ledger, UUID)
    h = off.read_offloaded(obj.ledger_id, UUID)
    assert h.index.trailer == b""
    assert h.read(250, 250)[0].data == KIB_ENTRIES[250]
    assert h.bytes_fetched <= 64 * 1024 + 8192


def test_unknown_index_trailer_is_ignored(blob_store, tmp_path: Path) -> None:
    """An index whose metadata declares no checksums (another writer's) may carry any extension."""
    payloads = KIB_ENTRIES[:300]
    off, obj = offload(blob_store, tmp_path, payloads, max_block_size=64 * 1024)
    h = off.read_offloaded(obj.ledger_id, UUID)
    assert h.index.trailer != b""  # this project writes checkpoints and checksums
    raw = blob_store.get(obj.index_key)
    base = len(raw) - len(h.index.trailer)
    rewrite(blob_store, obj.index_key, data=raw[:base] + b"another extension, not checkpoints",
            drop=C.METADATA_CHECKSUMS_KEY)
    for e in (0, 1, 150, 299):
        assert off.read_offloaded(obj.ledger_id, UUID).read(e, e)[0].data == payloads[e]


def test_declared_checksums_cannot_be_dropped(blob_store, tmp_path: Path) -> None:
    """This project's index declares its checksums: a trailer replaced by anything else is corruption,
    never a silent fall back to unverified reads."""
    off, obj = offload(blob_store, tmp_path, KIB_ENTRIES[:300], max_block_size=64 * 1024)
    raw = blob_store.get(obj.index_key)
    base = len(raw) - len(off.read_offloaded(obj.ledger_id, UUID).index.trailer)
    for trailer in (b"", b"another extension, not checkpoints", raw[base:-40]):
        rewrite(blob_store, obj.index_key, data=raw[:base] + trailer)
        with pytest.raises(CorruptObjectError, match=obj.index_key):
            off.read_offloaded(obj.ledger_id, UUID)


# --- catch-up reads from S3: stream windows read ahead ----------------------------------------------


class FailingAhead(RecordingStore):
    """Fails the first GET made by a read-ahead thread (a dropped connection, a throttled request)."""

    failed = 0

    def get_range(self, key, start, end):
        if threading.current_thread().name.startswith("read-ahead") and not self.failed:
            self.failed += 1
            raise OSError("injected: read-ahead GET failed")
        return super().get_range(key, start, end)


@pytest.mark.parametrize("store_cls", [RecordingStore, FailingAhead])
def test_s3_catch_up_read_fetches_one_get_per_stream_window(s3_store, tmp_path: Path, store_cls) -> None:
    """A catch-up reader of a 20 MiB object fetches 8 MiB windows, the next two read ahead while the
    current one is parsed (frames straddling two windows are joined, not fetched again): ceil(object /
    8 MiB) GETs, each byte once. A failed read-ahead is fetched again by the reader, invisibly."""
    entries = [payload(i, 4096) for i in range(5000)]  # ~20 MiB, frames straddle every window border
    store = store_cls(s3_store)
    off, obj = offload(store, tmp_path, entries)
    h = off.read_offloaded(obj.ledger_id, UUID)
    store.ranges.clear()
    got = []
    for first in range(0, len(entries), 500):
        got += [e.data for e in h.read(first, first + 499)]
    h.close()
    assert got == entries
    w = C.DEFAULT_STREAM_WINDOW
    # 8 MiB windows, the last one stretched to the end when less than half a window would be left
    starts = list(range(0, obj.data_length, w))
    if obj.data_length - starts[-1] < w // 2:
        starts.pop()
    expected = [(a, (b if b else obj.data_length) - 1) for a, b in zip(starts, [*starts[1:], 0], strict=True)]
    assert obj.data_length - 2 * w < w // 2 and len(expected) == 2  # this object: 8 MiB, then the rest
    assert h.requests == len(store.ranges) == len(expected) <= obj.data_length / w
    if store_cls is FailingAhead:  # the window read ahead failed; the reader fetched it itself
        assert store.failed == 1
        assert h.bytes_fetched < obj.data_length + 2 * C.DEFAULT_CHECKSUM_CHUNK
    else:  # the window read ahead is asked for before the first one is awaited: any order
        assert sorted(store.ranges) == expected
        assert h.bytes_fetched == obj.data_length


# --- batch reads (EntryBatch: one buffer, offsets arrays) -------------------------------------------


def _check_batch(b, first: int, payloads: list[bytes]) -> None:
    """A batch holds exactly payloads (entries first..), and its frames are those entries' frames."""
    from tieredcore.formats.block import encode_consecutive_frames

    assert (b.first_entry, len(b)) == (first, len(payloads))
    assert b.payloads() == payloads
    assert [bytes(b.buf[s : s + n]) for s, n in zip(b.starts, b.lengths, strict=True)] == payloads
    assert bytes(b.frames()) == encode_consecutive_frames(first, payloads)
    assert b.payload_bytes == sum(map(len, payloads))
    assert [e.entry_id for e in b.entries()] == list(range(first, first + len(payloads)))


@pytest.mark.parametrize("read_buffer", [1, 700, 5000, MIB])
def test_read_batch_across_windows_blocks_and_padding(fs_store, tmp_path: Path, read_buffer: int) -> None:
    """Small read buffers put a batch's frames in several fetched windows and blocks (with padding and
    headers between them): the batch joins exactly the frames; in one window it is a view of it."""
    payloads = [payload(i, (i * 37) % 230) for i in range(120)]
    off, obj = offload(fs_store, tmp_path, payloads, max_block_size=1000, read_buffer=read_buffer)
    assert obj.blocks > 10
    for first, last in ((0, 119), (0, 0), (5, 6), (6, 7), (13, 40), (119, 119), (50, 119)):
        h = off.read_offloaded(obj.ledger_id, UUID)
        _check_batch(h.read_batch(first, last), first, payloads[first : last + 1])
        h.close()
    h = off.read_offloaded(obj.ledger_id, UUID)  # one handle, consecutive batches (a stream)
    for first in range(0, 120, 9):
        _check_batch(h.read_batch(first, min(first + 8, 119)), first, payloads[first : first + 9])
    with pytest.raises(BadRangeError):
        h.read_batch(3, 2)


def test_read_batch_of_the_hot_tier_is_the_verified_frames(tmp_path: Path) -> None:
    from tieredcore.model import EntryBatch

    hot = LocalLedgerStore(tmp_path / "hot")
    payloads = [payload(i, i % 50) for i in range(200)]
    h = sealed_ledger(hot, payloads)
    for first, last in ((0, 199), (17, 17), (3, 150)):
        _check_batch(h.read_batch(first, last), first, payloads[first : last + 1])
    both = EntryBatch.concat([h.read_batch(0, 99), h.read_batch(100, 149), h.read_batch(150, 199)])
    _check_batch(both, 0, payloads)
    h.close()
