"""The entry-offsets sidecar of one V1 object pair: read once per handle, recorded once per pair
(:mod:`tieredcore.formats.offsets`; docs/formats.md, "Entry offsets sidecar").

A handle on a pair whose index has no checkpoints (Pulsar wrote it) gets an :class:`OffsetsSidecar`:

- **reading**: the first random read that would walk a block from its start loads the sidecar (one
  GET) and then seeks like a read of this project's own objects. A sidecar that is missing, does not
  decode, or describes another pair is ignored with a log line, and the read walks the block as before;
  so is one whose checkpoint does not hold the expected frame (:meth:`OffsetsSidecar.discard`).
- **recording**: a full pass over the entries (a catch-up read from entry 0, or a deep verification)
  feeds each entry's size; when every entry was seen, the checkpoints are computed and written beside
  the pair, after a GET shows no usable sidecar is there yet. Readers write from a background thread
  (a catch-up read never waits for it); verification writes at once. Writing needs a
  :class:`SidecarWriter`: the offloader gives one only where its workspace may write
  (:class:`tieredcore.offload.ownership.SidecarPermission`); a refusal is logged once per reason.
"""

from __future__ import annotations

import logging
import os
import threading
from array import array
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from tieredcore.cold.blob import BlobStore
from tieredcore.errors import NoSuchObjectError
from tieredcore.formats.constants import BLOCK_HEADER_LENGTH, ENTRY_HEADER_SIZE
from tieredcore.formats.index import LedgerIndex
from tieredcore.formats.keys import OFFSETS_SUFFIX
from tieredcore.formats.offsets import (
    EntryOffsets,
    PairIdentity,
    SidecarError,
    block_checkpoints,
    decode_offsets,
    encode_offsets,
    stale_reason,
)

log = logging.getLogger(__name__)

#: entries of a pair recorded at most (their sizes are held until the pass ends: 4 bytes an entry)
MAX_RECORDED_ENTRIES = 16 * 1024 * 1024
#: failed sidecar writes after which a writer stops trying in this process (a read-only bucket)
MAX_WRITE_FAILURES = 3

_pool: ThreadPoolExecutor | None = None
_pool_pid = 0
_pool_lock = threading.Lock()


def _writer_pool() -> ThreadPoolExecutor:
    """The process's sidecar-writing thread (made again in a forked child, whose copy has no threads)."""
    global _pool, _pool_pid
    with _pool_lock:
        if _pool is None or _pool_pid != os.getpid():
            _pool = ThreadPoolExecutor(1, thread_name_prefix="offsets-sidecar")
            _pool_pid = os.getpid()
        return _pool


def flush_writes() -> None:
    """Until every sidecar write queued so far by this process is done (tests, benchmarks, a command
    that reports what it recorded)."""
    _writer_pool().submit(lambda: None).result()


@dataclass(frozen=True)
class Permit:
    """Whether a sidecar may be written beside a data object: the owner identity to name, or why not."""

    owner: str = ""
    refusal: str = ""


@dataclass
class SidecarWriter:
    """How one offloader writes sidecars: its checkpoint interval, who may write (given the data object's
    user metadata) and the sidecar's user metadata (given the data object's and the owner)."""

    interval: int
    permit: Callable[[Mapping[str, str]], Permit]
    metadata: Callable[[Mapping[str, str], str], dict[str, str]]
    failures: int = 0
    _refusals: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def enabled(self) -> bool:
        return self.failures < MAX_WRITE_FAILURES

    def note_refusal(self, key: str, reason: str) -> None:
        with self._lock:
            first = reason not in self._refusals
            self._refusals.add(reason)
        if first:  # once per reason: an attached bucket would otherwise log it for every ledger read
            log.info("entry offsets not recorded beside %s (nor beside other objects, for the same reason): %s",
                     key, reason)

    def note_failure(self, key: str, error: BaseException) -> None:
        with self._lock:
            self.failures += 1
            stop = self.failures == MAX_WRITE_FAILURES
        log.warning("writing the entry-offsets sidecar %s failed: %s: %s%s", key, type(error).__name__, error,
                    "; no more sidecars are written by this process" if stop else "")


class OffsetsSidecar:
    """The sidecar of one pair, as one read handle sees it (see the module docstring)."""

    def __init__(self, store: BlobStore, data_key: str, pair: PairIdentity, index: LedgerIndex,
                 data_metadata: Mapping[str, str], writer: SidecarWriter | None = None) -> None:
        self.store = store
        self.key = data_key + OFFSETS_SUFFIX
        self.pair = pair
        self.index = index
        self.data_metadata = dict(data_metadata)
        self.writer = writer
        self.requests = 0  # GETs and PUTs of the sidecar made by this handle
        self.written = False
        self.pending: Future | None = None  # a background write
        self._lock = threading.Lock()
        self._loaded = False
        self._cps: tuple[list[int], list[int]] | None = None
        n = pair.last_entry_id + 1
        self._sizes: array | None = array("i") if writer is not None and n <= MAX_RECORDED_ENTRIES else None

    # -- reading ------------------------------------------------------------------------------

    def checkpoints(self) -> tuple[list[int], list[int]] | None:
        """``(entry ids, frame offsets)`` of a usable sidecar, loaded on first call, or None."""
        with self._lock:
            if not self._loaded:
                self._loaded = True
                self._cps = self._load()
                if self._cps is not None:
                    self._sizes = None  # nothing left to record
            return self._cps

    def _load(self) -> tuple[list[int], list[int]] | None:
        try:
            self.requests += 1
            raw = self.store.get(self.key)
        except NoSuchObjectError:
            log.debug("no entry-offsets sidecar %s: random reads walk their block", self.key)
            return None
        except Exception as e:  # a sidecar is an optimisation: a store failure here never fails the read
            log.warning("entry-offsets sidecar %s could not be read, ignored: %s: %s", self.key, type(e).__name__, e)
            return None
        try:
            got = decode_offsets(raw, self.key)
            why = stale_reason(got, self.pair, self.index)
            if why is not None:
                raise SidecarError(f"{self.key} is stale: {why}")
        except SidecarError as e:
            log.warning("entry-offsets sidecar ignored: %s", e)
            return None
        return got.ids, got.offsets

    def discard(self, reason: str) -> None:
        """Stop using the loaded checkpoints (one did not hold its frame): reads walk blocks again."""
        log.warning("entry-offsets sidecar %s ignored: %s", self.key, reason)
        with self._lock:
            self._cps = None

    # -- recording ----------------------------------------------------------------------------

    @property
    def recording(self) -> bool:
        """Whether entry sizes are still wanted (a writer, no usable sidecar known, the pass not over)."""
        return self._sizes is not None and self.writer is not None and self.writer.enabled

    def feed(self, first: int, sizes: Sequence[int]) -> bool:
        """Payload sizes of entries ``first``.. as a pass walked them. Sizes continuing the pass are kept
        (others are ignored: a random read). True once the pass has every entry: call :meth:`finish`."""
        with self._lock:
            rec = self._sizes
            if rec is None:
                return False
            have = len(rec)
            if not first <= have < first + len(sizes):
                return False
            rec.extend(sizes[have - first:] if have > first else sizes)
            return len(rec) == self.pair.last_entry_id + 1

    def finish(self, background: bool) -> None:
        """Write the sidecar of the pass just completed (in the background, or now)."""
        with self._lock:
            sizes, self._sizes = self._sizes, None
        if sizes is None or len(sizes) != self.pair.last_entry_id + 1:
            return
        if background:
            self.pending = _writer_pool().submit(self._write, sizes)
        else:
            self._write(sizes)

    def wait(self) -> None:
        """Until a background write is done (tests, benchmarks)."""
        if self.pending is not None:
            self.pending.result()

    def _write(self, sizes: array) -> None:
        writer = self.writer
        assert writer is not None
        try:
            cps = self._checkpoints_of(sizes, writer.interval)
            if not cps:
                return  # blocks too small to need checkpoints
            permit = writer.permit(self.data_metadata)
            if permit.refusal:
                writer.note_refusal(self.key, permit.refusal)
                return
            if self.checkpoints() is not None:
                return  # another pass or process wrote it already
            body = encode_offsets(self.pair, writer.interval, cps)
            self.requests += 1
            self.store.put(self.key, body, writer.metadata(self.data_metadata, permit.owner))
            self.written = True
            with self._lock:
                self._cps = ([c[0] for c in cps], [c[1] for c in cps])
        except Exception as e:  # recording is an optimisation: never fails the read that triggered it
            writer.note_failure(self.key, e)

    def _checkpoints_of(self, sizes: array, interval: int) -> list[tuple[int, int]]:
        """Checkpoints of every block, checked to fit their blocks (else none: a pass that saw other
        frames than the index describes records nothing)."""
        blocks = self.index.entries
        out: list[tuple[int, int]] = []
        for i, b in enumerate(blocks):
            stop = blocks[i + 1].first_entry_id if i + 1 < len(blocks) else len(sizes)
            end = blocks[i + 1].offset if i + 1 < len(blocks) else self.pair.object_length
            part = sizes[b.first_entry_id:stop]
            start = b.offset + BLOCK_HEADER_LENGTH
            if start + sum(part) + ENTRY_HEADER_SIZE * len(part) > end:
                log.warning("%s: entries %d..%d do not fit their block: no sidecar recorded", self.key,
                            b.first_entry_id, stop - 1)
                return []
            out += block_checkpoints(start, b.first_entry_id, part, interval)
        return out


def load_offsets(store: BlobStore, key: str) -> EntryOffsets:
    """A sidecar decoded (tools and tests): NoSuchObjectError, or SidecarError when it does not decode."""
    return decode_offsets(store.get(key), key)
