"""Single-ledger offload to an object store in Pulsar's format (docs/formats.md).

Write order: data object (multipart, block i = part i+1), then index object (single PUT). The index is
the commit point. On any failure the multipart upload is aborted, or the data object deleted, before
the error propagates: a failed offload leaves no object behind.

Integrity (docs/formats.md): the index trailer carries a CRC32C per fixed-size chunk of the data object
and one over the index itself, computed from the CRC-verified hot-tier bytes as they are uploaded; the
ledger metadata inside the index names the ledger id. Opening an offloaded ledger checks the index's
structure, its checksum and (given the topic's LedgerInfo) that it describes this ledger of this topic;
reads verify every chunk they fetch.
"""

from __future__ import annotations

import logging
import mmap
import queue
import threading
import uuid as uuidlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import suppress
from dataclasses import dataclass, replace

from crc32c import crc32c

from tieredcore import __version__
from tieredcore.cold.blob import MAX_PART_NUMBER, BlobStore
from tieredcore.cold.location import StoreLocation
from tieredcore.cold.transformed import TransformedBlobStore
from tieredcore.errors import (
    CorruptObjectError,
    FormatError,
    LedgerStateError,
    NoSuchObjectError,
    OffloadedLedgerNotFoundError,
    UnsupportedVersionError,
    ValidationError,
)
from tieredcore.formats import constants as C
from tieredcore.formats.block import (
    BlockPlan,
    block_header,
    build_block,
    checkpoints_for,
    encode_frames,
    frame_ends,
    index_entries_for,
    padding,
    plan_blocks,
)
from tieredcore.formats.frame_ranges import RangeCheck
from tieredcore.formats.index import LedgerIndex, check_index_v1, encode_index_v1, index_trailer, parse_index
from tieredcore.formats.keys import data_key, index_key, normalize_prefix
from tieredcore.formats.ledger_metadata import encode_ledger_metadata
from tieredcore.formats.offsets import PairIdentity
from tieredcore.formats.trailer import ChunkCrcWriter, encode_checkpoints, encode_checksums
from tieredcore.hot.tier import FrameSource
from tieredcore.model import Buffer, LedgerMetadata, ReadHandle
from tieredcore.offload.buffers import BufferPool
from tieredcore.offload.cache import SHARED_OFFSET_CACHE, OffsetCache
from tieredcore.offload.frame_check import check_block, frame_runs, range_check_for, read_checked
from tieredcore.offload.reader import ExpectedLedger, OffloadedLedgerHandle
from tieredcore.offload.sidecar import OffsetsSidecar, Permit, SidecarWriter
from tieredcore.offload.transaction import delete_pair

log = logging.getLogger(__name__)

ProgressFn = Callable[[int, int], None]  # (bytes uploaded so far, total bytes)

# frames proven per read from the hot tier while the store copies them (or the parts are filled):
# a window stays in the CPU's cache from the read to the CRCs, and the CRCs of small entries run in one
# C loop holding the GIL for the whole window, so smaller windows let the copying thread in between
# (256 MiB of 1 KiB entries, best of 6: 0.68x cp with 4 MiB windows, 0.82x with 512 KiB; 64 KiB entries
# 1.41x and 1.43x; whole 64 MiB blocks were slower still)
CHECK_WINDOW = 512 << 10


@dataclass(frozen=True)
class OffloadedObject:
    ledger_id: int
    uuid: str
    data_key: str
    index_key: str
    data_length: int
    blocks: int
    entries: int
    payload_bytes: int


@dataclass(frozen=True)
class _Layout:
    """One offload's plan: the ledger, its blocks and where they go (shared by the steps of offload)."""

    ledger_id: int
    ledger: ReadHandle
    frames: FrameSource | None  # the ledger itself when its entries are stored as offload frames
    sizes: Sequence[int]
    ends: Sequence[int]
    plans: list[BlockPlan]
    total: int  # bytes of the data object
    data_key: str
    index_key: str
    # the hot ledger's range CRCs, checked as its frames are read (None: each frame's own CRC is)
    ranges: RangeCheck | None = None


class LedgerOffloader:
    """Offloads sealed ledgers to one object store; opens and deletes offloaded ledgers."""

    def __init__(
        self,
        store: BlobStore,
        prefix: str = "",
        *,
        max_block_size: int = C.DEFAULT_MAX_BLOCK_SIZE,
        read_buffer: int = C.DEFAULT_READ_BUFFER_SIZE,
        cluster: str = "standalone",
        offset_cache: OffsetCache | None = None,
        checkpoint_interval: int = C.DEFAULT_CHECKPOINT_INTERVAL,
        checksum_chunk: int = C.DEFAULT_CHECKSUM_CHUNK,
        verify_reads: bool = True,
        owner: str = "",
        before_write: Callable[[], None] | None = None,
        upload_concurrency: int = C.DEFAULT_UPLOAD_CONCURRENCY,
        part_size: int = C.DEFAULT_UPLOAD_PART_SIZE,
        sidecar_permit: Callable[[Mapping[str, str]], Permit] | None = None,
    ) -> None:
        if isinstance(upload_concurrency, bool) or not isinstance(upload_concurrency, int) or not (
            1 <= upload_concurrency <= 64
        ):
            raise ValidationError(f"upload_concurrency must be an integer from 1 to 64, got {upload_concurrency!r}")
        if isinstance(part_size, bool) or not isinstance(part_size, int) or part_size < C.MIN_UPLOAD_PART_SIZE:
            raise ValidationError(
                f"part_size must be at least {C.MIN_UPLOAD_PART_SIZE} bytes (S3's minimum part), got {part_size!r}"
            )
        if max_block_size < C.BLOCK_HEADER_LENGTH + C.ENTRY_HEADER_SIZE:
            raise ValidationError(f"max_block_size {max_block_size} is below the 140-byte minimum")
        if read_buffer <= 0:
            raise ValidationError("read_buffer must be positive")
        if checkpoint_interval < 0:
            raise ValidationError("checkpoint_interval must be >= 0 (0: no checkpoints)")
        if checksum_chunk < 0 or (0 < checksum_chunk < 512):
            raise ValidationError(f"checksum_chunk must be 0 (no checksums) or at least 512 bytes, got {checksum_chunk}")
        self.store = store
        self.prefix = normalize_prefix(prefix)
        # where its objects go, as OffloadContext driver metadata records it
        self.location = StoreLocation.of_store(store, self.prefix)
        self.max_block_size = max_block_size
        self.read_buffer = read_buffer
        self.cluster = cluster
        self.offset_cache = offset_cache if offset_cache is not None else SHARED_OFFSET_CACHE
        self._pool = BufferPool(keep=max(2, upload_concurrency + 2))  # two blocks, or the parts in flight
        # exact frame offsets every `checkpoint_interval` frame bytes, in the index trailer (which
        # Pulsar ignores): a random read walks at most that far instead of from its block's start
        self.checkpoint_interval = checkpoint_interval
        # a CRC32C per `checksum_chunk` bytes of the data object, in the index trailer; reads verify them
        self.checksum_chunk = checksum_chunk
        self.verify_reads = verify_reads
        self.owner = owner  # identity of the metadata store this workspace writes for (ownership checks)
        self.before_write = before_write  # e.g. the store-ownership check, before the first object is written
        # parts of a block sent at once to a store that takes them concurrently (S3): one request at a
        # time leaves a remote store's bandwidth unused. The pool is made on first use and kept.
        self.upload_concurrency = upload_concurrency
        self.part_size = part_size
        self._uploader: ThreadPoolExecutor | None = None
        # entry-offsets sidecars beside Pulsar-written pairs (offload/sidecar.py): read wherever they are,
        # written only where ``sidecar_permit`` allows (the workspace's own stores), never into a
        # transformed store (every object there is this project's: its index has checkpoints unless
        # checkpoint_interval = 0)
        self.sidecars = not isinstance(store, TransformedBlobStore)
        self.sidecar_writer = SidecarWriter(
            checkpoint_interval or C.DEFAULT_CHECKPOINT_INTERVAL, sidecar_permit, self._sidecar_metadata,
        ) if sidecar_permit is not None and self.sidecars else None

    # -- write --------------------------------------------------------------------------------

    def user_metadata(self, role: str, extra: Mapping[str, str] | None) -> dict[str, str]:
        md = {k.lower(): str(v) for k, v in (extra or {}).items()}
        md.update(
            {
                C.METADATA_FORMAT_VERSION_KEY: C.CURRENT_FORMAT_VERSION,
                C.METADATA_ROLE_KEY: role,
                C.METADATA_CLUSTER_NAME_KEY: self.cluster,
                C.METADATA_SOFTWARE_VERSION_KEY: __version__,
            }
        )
        if self.owner:
            md[C.METADATA_OWNER_KEY] = self.owner
        return md

    def offload(
        self,
        ledger: ReadHandle,
        uuid: uuidlib.UUID | str,
        extra_metadata: Mapping[str, str] | None = None,
        progress: ProgressFn | None = None,
    ) -> OffloadedObject:
        """Copy a sealed ledger into `{uuid}-ledger-{id}` + `-index`. Leaves nothing behind on failure."""
        uuid = str(uuid)
        lid = ledger.ledger_id
        if not ledger.is_closed:
            raise LedgerStateError(f"ledger {lid} is open: only sealed ledgers can be offloaded")
        if ledger.last_add_confirmed < 0:
            raise LedgerStateError(f"ledger {lid} has no entries: nothing to offload")
        frames = ledger if isinstance(ledger, FrameSource) else None
        sizes = frames.entry_sizes() if frames is not None else entry_sizes(ledger)
        ends = frame_ends(sizes)  # once for the blocks and the checkpoints
        plans = plan_blocks(sizes, self.max_block_size, ends)  # validates that every entry fits a block
        total = sum(p.block_size for p in plans)
        layout = _Layout(lid, ledger, frames, sizes, ends, plans, total,
                         data_key(self.prefix, uuid, lid), index_key(self.prefix, uuid, lid),
                         range_check_for(frames, ends))
        if self.before_write is not None:
            self.before_write()
        crcs = ChunkCrcWriter(self.checksum_chunk) if self.checksum_chunk else None
        index_job = self._write_data(layout, crcs, extra_metadata, progress)
        self._write_index(layout, index_job, crcs, extra_metadata)
        md = ledger.metadata
        return OffloadedObject(lid, uuid, layout.data_key, layout.index_key, total, len(plans), md.entries,
                               md.length)

    def _write_data(self, layout: _Layout, crcs: ChunkCrcWriter | None,
                    extra_metadata: Mapping[str, str] | None, progress: ProgressFn | None) -> Future[bytes]:
        """The data object as one multipart upload (block i = part i+1, or parts of equal size for a store
        that takes them concurrently). Returns the index prefix, built by the worker while the store
        completes the upload (e.g. its fsync). Any failure aborts the upload before it propagates."""
        dkey, total = layout.data_key, layout.total
        upload_id = self.store.initiate_multipart(dkey, self.user_metadata("data", extra_metadata))
        try:
            # One block of read-ahead: the next block is read (and CRC-checked) from the hot tier while
            # the current one uploads, into two buffers taken from a small pool and reused block after
            # block: memory stays at about two blocks whatever the ledger size, and no block pays for
            # freshly faulted-in memory.
            ledger, frames, plans = layout.ledger, layout.frames, layout.plans
            zero_copy = frames is not None and self.store.copies_file_slices
            part_size = 0 if zero_copy else self._part_size_for(total)
            if zero_copy or part_size:
                # the check reads a block's frames a window at a time into one small buffer: it stays in
                # the CPU's cache between the read and the CRCs, and a process's first block does not
                # fault in a whole block buffer (measured: 74 ms for a fresh 64 MiB buffer, 17 ms after)
                window = CHECK_WINDOW
                bufs = [self._pool.take(min(window, total))]
            else:
                window = 0
                bufs = [self._pool.take(min(self.max_block_size, total)) for _ in range(min(2, len(plans)))]
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"offload-{layout.ledger_id}") as pool:
                try:
                    if zero_copy and frames is not None:  # (zero_copy implies frames)
                        parts = self._upload_file_slices(pool, layout, frames, upload_id, bufs[0], window,
                                                         crcs, progress)
                    elif part_size:
                        parts = self._upload_streamed(pool, layout, upload_id, bufs[0], window, crcs,
                                                      part_size, progress)
                    else:
                        parts = self._upload_blocks(pool, layout, upload_id, bufs, crcs, progress)
                finally:
                    for b in bufs:
                        self._pool.give(b)
                if layout.ranges is not None:
                    layout.ranges.finish()  # every range was read and matched, before the upload completes
                # the worker builds the index while the store completes the upload (e.g. its fsync)
                index_job = pool.submit(self._index_prefix, ledger, plans, layout.sizes, layout.ends, total)
                self.store.complete_multipart(dkey, upload_id, parts)
        except BaseException:
            # any failure, KeyboardInterrupt included: abort so no part is billed or left behind
            quietly(f"abort upload {upload_id} of {dkey}", self.store.abort_multipart, dkey, upload_id)
            raise
        return index_job

    def _upload_file_slices(self, pool: ThreadPoolExecutor, layout: _Layout, frames: FrameSource,
                            upload_id: str, buf: mmap.mmap, window: int, crcs: ChunkCrcWriter | None,
                            progress: ProgressFn | None) -> list:
        """Block i as part i+1, its frames a slice of the hot-tier file for a store that copies file slices.
        The kernel copies a block's frames from the hot-tier file while the worker reads and CRC-checks
        the same frames: a block costs max(copy, check), not their sum. Every check passes before the
        upload completes, so a bad frame never commits."""
        dkey = layout.data_key
        parts = []
        done = 0
        for i, plan in enumerate(layout.plans):
            check = pool.submit(check_block, frames, plan, layout.ends, buf, window, layout.ranges, crcs)
            try:
                parts.append(self.store.upload_part(dkey, upload_id, i + 1, _block_pieces(frames, plan)))
            finally:
                check.result()  # its CRC error outranks the upload's error
            done += plan.block_size
            if progress is not None:
                progress(done, layout.total)
        return parts

    def _upload_blocks(self, pool: ThreadPoolExecutor, layout: _Layout, upload_id: str,
                       bufs: list[mmap.mmap], crcs: ChunkCrcWriter | None, progress: ProgressFn | None) -> list:
        """Block i as part i+1, built by the worker one block ahead of the upload, in two alternating
        buffers. Block bytes are fed to the chunk checksums inside the (single) worker, in block order."""
        plans = layout.plans
        parts = []
        done = 0
        pending = pool.submit(_block_bytes, layout, plans[0], bufs[0], crcs)
        for i, plan in enumerate(plans):
            block = pending.result()
            if i + 1 < len(plans):
                pending = pool.submit(_block_bytes, layout, plans[i + 1], bufs[(i + 1) % 2], crcs)
            parts.append(self.store.upload_part(layout.data_key, upload_id, i + 1, block))
            done += plan.block_size
            if isinstance(block, memoryview):
                block.release()
            if progress is not None:
                progress(done, layout.total)
        return parts

    def _write_index(self, layout: _Layout, index_job: Future[bytes], crcs: ChunkCrcWriter | None,
                     extra_metadata: Mapping[str, str] | None) -> None:
        """The index object, the commit point: the index prefix and, once every byte was hashed, the chunk
        checksums. Any failure deletes the data object before it propagates."""
        dkey, total = layout.data_key, layout.total
        try:
            index = index_job.result()
            index_md = self.user_metadata("index", extra_metadata)
            if crcs is not None:
                chunk_crcs = crcs.finish()
                if crcs.length != total:  # the bytes hashed are the bytes uploaded, or nothing is committed
                    raise FormatError(f"ledger {layout.ledger_id}: checksummed {crcs.length} bytes, uploaded {total}")
                index += encode_checksums(index, self.checksum_chunk, chunk_crcs)
                index_md[C.METADATA_CHECKSUMS_KEY] = f"crc32c/{self.checksum_chunk}"
            self.store.put(layout.index_key, index, index_md)
        except BaseException:
            quietly(f"delete {dkey} after failed index write", self.store.delete, [dkey])
            raise

    def _index_prefix(self, ledger: ReadHandle, plans: Sequence[BlockPlan], sizes: Sequence[int], ends: Sequence[int],
                      total: int) -> bytes:
        """The V1 index and its checkpoint section (the checksums follow once every byte is hashed)."""
        index = encode_index_v1(encode_ledger_metadata(_ledger_metadata(ledger)), total, index_entries_for(plans))
        return index + encode_checkpoints(checkpoints_for(plans, sizes, self.checkpoint_interval, ends))

    def _part_size_for(self, total: int) -> int:
        """Size of the parts a block is cut into for concurrent upload; 0: one part per block (a store
        that takes parts one at a time, or concurrency 1)."""
        if self.upload_concurrency <= 1 or not self.store.concurrent_parts:
            return 0
        # S3 allows 10,000 parts per upload: larger parts for (very) large ledgers
        return max(self.part_size, -(-total // (MAX_PART_NUMBER - 1)))

    def _upload_streamed(self, pool: ThreadPoolExecutor, layout: _Layout, upload_id: str, scratch: mmap.mmap,
                         window: int, crcs: ChunkCrcWriter | None, part_size: int,
                         progress: ProgressFn | None) -> list:
        """The object (its pieces in order, _object_pieces) as parts of the same size, at least ``part_size``
        bytes (the last: the rest), filled by the worker into a few reused part buffers and sent ``upload_concurrency`` at
        a time, like a transfer manager does with a file: memory stays at concurrency + 2 parts whatever
        the block size, and the first part goes up as soon as it is read, not after a whole block."""
        key, total = layout.data_key, layout.total
        if self._uploader is None:
            self._uploader = ThreadPoolExecutor(max_workers=self.upload_concurrency,
                                                thread_name_prefix="offload-parts")
        # as many parts as fit whole at part_size, evened out (each a little larger): a 32.1 MiB object
        # goes up as 4 parts, not 4 full ones and a tiny fifth that waits for a free connection
        n_parts = max(1, total // part_size)
        part_size = -(-total // n_parts)
        nbuf = min(self.upload_concurrency + 2, n_parts)
        free: queue.SimpleQueue = queue.SimpleQueue()
        bufs = [self._pool.take(min(part_size, total)) for _ in range(nbuf)]
        for b in bufs:
            free.put(b)
        ready: queue.SimpleQueue = queue.SimpleQueue()
        stop = threading.Event()
        filling = pool.submit(_fill_parts, layout, _object_pieces(layout, window), part_size, scratch, crcs, free,
                              ready, stop)
        futures: list[Future] = []
        failed: list[Future] = []
        done = 0
        try:
            while True:
                item = ready.get()
                if item is None:
                    break
                if isinstance(item, BaseException):
                    raise item
                number, buf, n = item
                fut = self._uploader.submit(_send_part, self.store, key, upload_id, number, buf, n, free)
                fut.add_done_callback(lambda f: f.exception() is not None and failed.append(f))
                futures.append(fut)
                if failed:  # a part failed: stop reading, the caller aborts the upload
                    failed[0].result()
                if progress is not None:
                    done = min(total, done + n)
                    progress(done, total)
            wait(futures)
            return [f.result() for f in futures]
        finally:
            stop.set()
            free.put(None)  # wakes the worker if it waits for a buffer
            with suppress(Exception):
                filling.result()
            wait(futures)  # every request has finished with its buffer before the buffers are reused
            for b in bufs:
                self._pool.give(b)

    # -- read ---------------------------------------------------------------------------------

    def read_offloaded(
        self, ledger_id: int, uuid: uuidlib.UUID | str, expect: ExpectedLedger | None = None
    ) -> OffloadedLedgerHandle:
        """Open an offloaded ledger. The index must be well formed, pass its checksum (this project's
        objects) and, given ``expect`` (the topic's LedgerInfo), describe exactly that ledger: else
        FormatError / CorruptObjectError, never a handle that reads the wrong data."""
        dkey, ikey = data_key(self.prefix, uuid, ledger_id), index_key(self.prefix, uuid, ledger_id)
        try:
            info = self.store.head(ikey)
            check_format_version(info.metadata, ikey)
            raw = self.store.get(ikey)
            data_info = self.store.head(dkey)
        except NoSuchObjectError as e:
            raise OffloadedLedgerNotFoundError(
                f"offloaded ledger {ledger_id} (uuid {uuid}) not found: {e}"
            ) from e
        check_format_version(data_info.metadata, dkey)
        index = parse_index(raw, ledger_id)
        if not isinstance(index, LedgerIndex):
            raise OffloadedLedgerNotFoundError(f"{ikey} is a multi-ledger (V2) index, not a ledger index")
        if index.data_object_length != data_info.size:
            raise CorruptObjectError(
                f"{dkey}: size {data_info.size} differs from the index's data object length "
                f"{index.data_object_length}"
            )
        trailer = index_trailer(index)
        if trailer.problem:
            raise CorruptObjectError(f"{ikey}: {trailer.problem}")
        if trailer.checksums is None and info.metadata.get(C.METADATA_CHECKSUMS_KEY):
            raise CorruptObjectError(f"{ikey}: its metadata declares checksums but the index has no checksum section")
        check_offloaded_index(index, ikey, ledger_id, expect, data_info.metadata.get(C.METADATA_MANAGED_LEDGER_NAME_KEY))
        sidecar = None
        if self.sidecars and not trailer.checkpoint_ids and _blocks_need_checkpoints(index):
            pair = PairIdentity(str(uuid), ledger_id, index.data_object_length, index.last_entry_id, crc32c(raw))
            sidecar = OffsetsSidecar(self.store, dkey, pair, index, data_info.metadata, self.sidecar_writer)
        h = OffloadedLedgerHandle(self.store, dkey, ledger_id, index, self.read_buffer, self.offset_cache,
                                  trailer=trailer, verify=self.verify_reads, sidecar=sidecar)
        h.index_bytes = len(raw)
        return h

    def _sidecar_metadata(self, data_metadata: Mapping[str, str], owner: str) -> dict[str, str]:
        """User metadata of a sidecar: this project's cluster and owner (reconciliation and the drain
        treat it as the workspace's), the data object's managed ledger; no Pulsar format version (it
        is not an object Pulsar reads)."""
        extra = {k: v for k, v in data_metadata.items() if k == C.METADATA_MANAGED_LEDGER_NAME_KEY}
        md = self.user_metadata(C.ROLE_OFFSETS, extra)
        md.pop(C.METADATA_FORMAT_VERSION_KEY, None)
        md[C.METADATA_OWNER_KEY] = owner
        return md

    def delete_offloaded(self, ledger_id: int, uuid: uuidlib.UUID | str) -> None:
        """Delete both objects and abort any unfinished upload of the attempt. Idempotent."""
        delete_pair(self.store, data_key(self.prefix, uuid, ledger_id), index_key(self.prefix, uuid, ledger_id))


def check_offloaded_index(
    index: LedgerIndex, ikey: str, ledger_id: int, expect: ExpectedLedger | None, data_owner: str | None = None
) -> None:
    """The index is well formed and describes ledger ``ledger_id`` (and, given ``expect``, its topic's
    entries, size and name): FormatError naming the index otherwise."""
    try:
        check_index_v1(index, index.data_object_length, check_length_field=False)
    except FormatError as e:
        raise FormatError(f"{ikey}: {e}") from None
    custom = index.metadata.custom_metadata
    named = custom.get(C.CUSTOM_LEDGER_ID_KEY)
    if named is not None and named != str(ledger_id).encode():
        raise FormatError(f"{ikey}: the index belongs to ledger {named.decode('utf-8', 'replace')}, not {ledger_id}")
    if expect is None:
        return
    problems = []
    if expect.entries is not None and index.last_entry_id + 1 != expect.entries:
        problems.append(f"{index.last_entry_id + 1} entries (the topic says {expect.entries})")
    if expect.size is not None and index.length != expect.size:
        problems.append(f"{index.length} bytes (the topic says {expect.size})")
    if expect.topic is not None:
        ml = custom.get(C.CUSTOM_MANAGED_LEDGER_KEY)
        if ml is not None and ml.decode("utf-8", "replace") != expect.topic:
            problems.append(f"managed ledger {ml.decode('utf-8', 'replace')!r} (the topic is {expect.topic!r})")
        if data_owner is not None and data_owner != expect.topic:
            problems.append(f"a data object of managed ledger {data_owner!r} (the topic is {expect.topic!r})")
    if problems:
        raise FormatError(f"{ikey}: offloaded copy of ledger {ledger_id} does not match the topic's metadata: it "
                          f"holds {'; '.join(problems)}")


def _blocks_need_checkpoints(index: LedgerIndex) -> bool:
    """Whether a walk from a block's start can be long: more entries than blocks (a block of one entry,
    e.g. of large entries, is read at once)."""
    return index.last_entry_id + 1 > 2 * len(index.entries)


def check_format_version(metadata: Mapping[str, str], key: str) -> None:
    v = metadata.get(C.METADATA_FORMAT_VERSION_KEY)
    if v != C.CURRENT_FORMAT_VERSION:
        raise UnsupportedVersionError(
            f"Invalid object version: {key} has format version {v!r}, expected {C.CURRENT_FORMAT_VERSION!r}"
        )


def entry_sizes(ledger: ReadHandle, last: int | None = None) -> Sequence[int]:
    """Entry sizes 0..last (default: the LAC) of a ledger: a FrameSource's own list, else read in batches."""
    if isinstance(ledger, FrameSource):
        return ledger.entry_sizes()
    end = ledger.last_add_confirmed if last is None else last
    out: list[int] = []
    step = 1000
    for first in range(0, end + 1, step):
        out.extend(len(e.data) for e in ledger.read(first, min(first + step - 1, end)))
    return out


@dataclass(frozen=True)
class _FrameRun:
    """Frames of entries ``first..last`` (``size`` bytes) of the hot ledger, read (and proven) straight into
    the part buffer that holds them (through a scratch window only when they straddle two parts)."""

    first: int
    last: int
    size: int


def _object_pieces(layout: _Layout, window: int) -> Iterator[Buffer | _FrameRun]:
    """The data object in order, block by block: header, frames (runs of whole entries of the hot ledger,
    or the block built from another read handle's entries), padding."""
    ledger, frames = layout.ledger, layout.frames
    for plan in layout.plans:
        if frames is None:
            yield build_block(plan, encode_frames(ledger.read(plan.first_entry, plan.last_entry)))
            continue
        yield block_header(plan.first_entry, plan.block_size)
        for first, last, n in frame_runs(plan, layout.ends, window):
            yield _FrameRun(first, last, n)
        yield padding(plan.block_size - C.BLOCK_HEADER_LENGTH - plan.frames_length)


class _Parts:
    """The part being filled by _fill_parts: buffers taken from ``free``, each full one handed to ``ready``
    as (part number, buffer, length)."""

    def __init__(self, part_size: int, free: queue.SimpleQueue, ready: queue.SimpleQueue,
                 stop: threading.Event) -> None:
        self.part_size, self.free, self.ready, self.stop = part_size, free, ready, stop
        self.buf: mmap.mmap | None = None
        self.fill = self.number = 0

    def room(self) -> int:
        """Bytes left in the current part, after taking a buffer when there is none (0: stopped)."""
        if self.buf is None:
            self.buf = self.free.get()
            if self.buf is None or self.stop.is_set():
                self.stop.set()
                return 0
        return self.part_size - self.fill

    def filled(self, n: int) -> None:
        """``n`` more bytes were written at ``fill``; a full part is handed over."""
        self.fill += n
        if self.fill == self.part_size:
            self.number += 1
            self.ready.put((self.number, self.buf, self.fill))
            self.buf, self.fill = None, 0

    def copy(self, piece: Buffer) -> None:
        mv = memoryview(piece).cast("B") if not isinstance(piece, bytes) else memoryview(piece)
        pos, n = 0, len(mv)
        while pos < n:
            room = self.room()
            if not room:
                return
            take = min(room, n - pos)
            self.buf[self.fill : self.fill + take] = mv[pos : pos + take]  # type: ignore[index]
            self.filled(take)
            pos += take
        mv.release()

    def finish(self) -> None:
        if self.fill:
            self.ready.put((self.number + 1, self.buf, self.fill))
        self.ready.put(None)


def _fill_parts(layout: _Layout, pieces: Iterator[Buffer | _FrameRun], part_size: int, scratch: mmap.mmap,
                crcs: ChunkCrcWriter | None, free: queue.SimpleQueue, ready: queue.SimpleQueue,
                stop: threading.Event) -> None:
    """Worker side of LedgerOffloader._upload_streamed: copy the object's pieces into part buffers taken
    from ``free`` (a run of hot frames is read into the part buffer itself when it fits), feed them to the
    chunk checksums in order, and hand each full buffer to ``ready`` as (part number, buffer, length); then
    None. An error is handed over instead (the uploading side raises it)."""
    try:
        parts = _Parts(part_size, free, ready, stop)
        for piece in pieces:
            if isinstance(piece, _FrameRun):
                room = parts.room()
                if not room:
                    return
                fits = piece.size <= room
                into = (memoryview(parts.buf)[parts.fill : parts.fill + piece.size] if fits  # type: ignore[arg-type]
                        else memoryview(scratch)[: piece.size] if piece.size <= len(scratch)
                        else memoryview(bytearray(piece.size)))
                with into:
                    read_checked(layout.frames, piece.first, piece.last, into, layout.ranges)  # type: ignore[arg-type]
                    if crcs is not None:
                        crcs.update(into)
                    if not fits:  # straddles two parts: copied across from the scratch window
                        parts.copy(into)
                if fits:
                    parts.filled(piece.size)
            else:
                if crcs is not None:
                    crcs.update(piece)
                parts.copy(piece)
            if stop.is_set():
                return
        parts.finish()
    except BaseException as e:  # noqa: BLE001 - handed to the uploading thread, which raises it
        ready.put(e)


def _send_part(store: BlobStore, key: str, upload_id: str, number: int, buf: mmap.mmap, n: int,
               free: queue.SimpleQueue):  # noqa: ANN202
    """Upload part ``number`` (the first n bytes of buf), then give the buffer back for the next part."""
    view = memoryview(buf)[:n]
    try:
        return store.upload_part(key, upload_id, number, view)
    finally:
        with suppress(BufferError):
            view.release()
        free.put(buf)


def _block_bytes(layout: _Layout, plan: BlockPlan, buf: mmap.mmap, crcs: ChunkCrcWriter | None) -> bytes | memoryview:
    frames = layout.frames
    if frames is None:  # any other ReadHandle (e.g. an offloaded ledger being repacked)
        block = build_block(plan, encode_frames(layout.ledger.read(plan.first_entry, plan.last_entry)))
        if crcs is not None:
            crcs.update(block)
        return block
    # hot tier: the frames are already in block format on disk; read them straight into the block
    # buffer (one copy from the page cache, no join) and write header and padding around them
    mv = memoryview(buf)[: plan.block_size]
    hl = C.BLOCK_HEADER_LENGTH
    with mv[hl : hl + plan.frames_length] as body:
        read_checked(frames, plan.first_entry, plan.last_entry, body, layout.ranges)
    mv[:hl] = block_header(plan.first_entry, plan.block_size)
    mv[hl + plan.frames_length :] = padding(plan.block_size - hl - plan.frames_length)
    if crcs is not None:
        crcs.update(mv)
    return mv


def _block_pieces(frames: FrameSource, plan: BlockPlan) -> list:
    """A block as pieces for a store that copies file slices: header, the frames as a slice of the
    (immutable) hot-tier file copied by the kernel, padding. On the machines measured, user-space writes
    into new files ran at a fifth of copy_file_range's speed."""
    hl = C.BLOCK_HEADER_LENGTH
    return [
        block_header(plan.first_entry, plan.block_size),
        frames.frames_slice(plan.first_entry, plan.last_entry),
        padding(plan.block_size - hl - plan.frames_length),
    ]


def _ledger_metadata(ledger: ReadHandle) -> LedgerMetadata:
    """The ledger metadata written into the index: the hot tier's, plus the ledger id (custom metadata
    Pulsar's reader ignores) so that an index copied under another ledger's key is recognised."""
    md = ledger.metadata
    return replace(md, custom_metadata={**md.custom_metadata, C.CUSTOM_LEDGER_ID_KEY: str(ledger.ledger_id).encode()})


def quietly(what: str, fn: Callable[..., object], *args: object) -> None:
    try:
        fn(*args)
    except Exception as e:  # the original error matters more; reconciliation finds leftovers
        log.warning("cleanup failed (%s): %s", what, e)

