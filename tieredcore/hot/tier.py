"""The hot tier as the rest of the core sees it: the seams a second hot tier (a BookKeeper-backed one, a
test double) implements to stand in for the local ledger store (tieredcore.hot.local).

- :class:`HotTier`: create, seal, open, list and delete ledgers (TopicWriter, TopicReader,
  TopicOffloader, the deletion drain, reconciliation, scrub).
- :class:`HotLedger`: a ledger open for reading, with its metadata and the CRC32C of each entry's offload
  frame, against which an offloaded copy is proven before the hot copy is deleted.
- :class:`LedgerWriter`: the single writer of an open ledger.
- :class:`FrameSource`: the offloader's optional fast path: a ledger whose entries are already stored as
  offload frames (``[len][entryId][payload]``) can be copied into blocks without decoding them, and
  into a local object store without passing through Python (:class:`FileSlice`). Any other
  :class:`HotLedger` is offloaded through ``read()``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol, runtime_checkable

from tieredcore.formats.frame_ranges import FrameRanges
from tieredcore.model import Buffer, FileSlice, LedgerMetadata, LedgerView, ReadHandle


@runtime_checkable
class HotLedger(ReadHandle, Protocol):
    """A hot-tier ledger open for reading."""

    def entry_crcs(self) -> Sequence[int]:
        """CRC32C of each entry's offload frame (12-byte header + payload), entries 0..LAC."""
        ...

    def entry_sizes(self) -> Sequence[int]:
        """Payload sizes of entries 0..LAC (with the CRCs: what an offloaded copy is proven against)."""
        ...


@runtime_checkable
class FrameSource(HotLedger, Protocol):
    """A hot ledger stored as contiguous offload frames (the offloader's fast path)."""

    def read_frames_into(self, first: int, last: int, out: memoryview, verify: bool = True) -> int:
        """The frames of entries first..last, CRC-verified (``verify=False``: the caller checks their
        frame ranges instead), written into `out` (exactly their length)."""
        ...

    def frame_ranges(self, ends: Sequence[int] | None = None) -> FrameRanges | None:
        """CRC32C per ~1 MiB run of frames recorded at seal (None: check every frame's own CRC); ``ends``:
        cumulative frame ends of the ledger's sizes, when the caller has them."""
        ...

    def frames_slice(self, first: int, last: int) -> FileSlice:
        """Where those frames lie in a local file (sealed ledgers only; not verified: read them with
        read_frames_into first)."""
        ...


class LedgerWriter(LedgerView, Protocol):
    """The single writer of one open ledger."""

    def append_many(self, payloads: Iterable[Buffer]) -> int:
        """Append entries; returns the last entry id once all are durable."""
        ...

    def close(self) -> LedgerMetadata:
        """Seal the ledger at its last appended entry."""
        ...

    def release(self) -> None:
        """Give up writing without sealing (recovery seals it later)."""
        ...


class HotTier(Protocol):
    """What the core needs of a hot tier."""

    def create_ledger(
        self, custom_metadata: Mapping[str, bytes | str] | None = None, *, ctime_ms: int | None = None
    ) -> LedgerWriter: ...

    def seal_ledger(self, ledger_id: int) -> LedgerMetadata:
        """Seal an open ledger whose writer is gone (cutting a torn tail); idempotent."""
        ...

    def open_ledger(self, ledger_id: int) -> HotLedger:
        """HotLedgerNotFoundError when it does not exist."""
        ...

    def ledger_metadata(self, ledger_id: int) -> LedgerMetadata: ...

    def exists(self, ledger_id: int) -> bool: ...

    def list_ledgers(self) -> list[int]: ...

    def delete_ledger(self, ledger_id: int) -> None:
        """Idempotent: a ledger that does not exist is not an error."""
        ...

    def close(self) -> None: ...
