"""A ledger's object-store copy, whichever form it has: the one place that opens it from a ``LedgerInfo``.

- a complete V1 offload (``OffloadContext`` uuid, ``complete``): its ``{uuid}-ledger-{id}`` objects, in
  the store its driver metadata names, checked against the LedgerInfo (:class:`ExpectedLedger`);
- otherwise the completed PIP-76 segments holding its entries from 0 on (:func:`segment_pieces`), each
  in the store its own ``offloadSegment`` driver metadata names: all its entries when the ledger is
  sealed and fully covered (:func:`is_offloaded`), else the covered prefix (e.g. the open ledger
  streamed up to some entry).

The topic reader, the deletion-lag cleanup and the scrub open copies through :func:`open_offloaded`,
and :func:`tieredcore.offload.verify.verify_offloaded` proves either form.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from tieredcore.errors import FormatError, OffloadedLedgerNotFoundError
from tieredcore.formats.mlinfo import LedgerInfo
from tieredcore.formats.proto import MLDataFormats_pb2 as pb
from tieredcore.model import ReadHandle
from tieredcore.offload.context import (
    context_uuid,
    is_complete,
    is_offloaded,
    segment_drivers,
    segment_pieces,
)
from tieredcore.offload.offloader import LedgerOffloader
from tieredcore.offload.reader import ExpectedLedger, OffloadedLedgerHandle
from tieredcore.offload.segments import SegmentLedgerHandle, SegmentOffloader

__all__ = ["CopyHandle", "OffloadedCopy", "copy_key", "copy_uuids", "has_offloaded_copy", "open_offloaded"]

OffloaderFor = Callable[[pb.OffloadDriverMetadata], LedgerOffloader]
OffloadedCopy = OffloadedLedgerHandle | SegmentLedgerHandle


class CopyHandle(ReadHandle, Protocol):
    """What a read handle on a ledger's object-store copy offers, whichever form the copy has (a V1 object
    pair, or the ledger's pieces of one or more segments)."""

    @property
    def requests(self) -> int:
        """Ranged GETs issued so far."""
        ...

    @property
    def bytes_fetched(self) -> int:
        ...

    @property
    def index_bytes(self) -> int:
        """Bytes of the index objects read so far."""
        ...

    def object_handles(self) -> list[OffloadedLedgerHandle]:
        """A handle per object pair the copy is read from (each with its store, data key and index)."""
        ...


def has_offloaded_copy(li: LedgerInfo) -> bool:
    """Some entries of the ledger can be read from the object store (a complete V1 copy, or at least
    one completed segment holding its first entries)."""
    return is_complete(li) or bool(segment_pieces(li))


def copy_uuids(li: LedgerInfo) -> list[str]:
    """The uuids of the copy :func:`open_offloaded` opens: the V1 uuid, or the segments in entry order."""
    if is_complete(li):
        u = context_uuid(li)
        return [u] if u is not None else []
    return [p.uuid for p in segment_pieces(li)]


def copy_key(li: LedgerInfo) -> str | tuple[str, ...]:
    """What identifies the copy :func:`open_offloaded` would open now (a cache key: it changes when a
    replacement or a new segment changes the copy): the V1 uuid, or the segments and what they hold."""
    if is_complete(li):
        return context_uuid(li) or ""
    return ("sealed" if is_offloaded(li) else "prefix", *(f"{p.uuid}:{p.last}" for p in segment_pieces(li)))


def open_offloaded(li: LedgerInfo, offloader: LedgerOffloader, topic: str | None = None,
                   offloader_for_driver: OffloaderFor | None = None, *, cached_index: bool = False) -> OffloadedCopy:
    """A read handle on the ledger's object-store copy (see the module docstring). ``offloader``: the
    store of copies recorded without driver metadata; ``offloader_for_driver``: the store a recorded
    driver metadata names (follow it: objects stay where they were written). ``topic``: the managed
    ledger name the objects must belong to. OffloadedLedgerNotFoundError when the ledger has no
    object-store copy; FormatError when its segments do not add up to what the LedgerInfo says.
    ``cached_index``: segment indexes parsed moments ago will do (readers of many ledgers of one
    compacted segment); checks of the store as it is now leave it off."""

    def store_of(has: bool, dm: pb.OffloadDriverMetadata | None) -> LedgerOffloader:
        if has and dm is not None and offloader_for_driver is not None:
            return offloader_for_driver(dm)
        return offloader

    if is_complete(li):
        uuid = context_uuid(li)
        if uuid is None:
            raise OffloadedLedgerNotFoundError(f"ledger {li.ledgerId}: complete offload without a uuid")
        off = store_of(li.offloadContext.HasField("driverMetadata"), li.offloadContext.driverMetadata)
        return off.read_offloaded(li.ledgerId, uuid, ExpectedLedger.of(li, topic))
    pieces = segment_pieces(li)
    if not pieces:
        raise OffloadedLedgerNotFoundError(f"ledger {li.ledgerId} has no complete offloaded copy and no completed "
                                           "segment")
    closed = is_offloaded(li)
    if closed and pieces[-1].last != li.entries - 1:
        raise FormatError(f"ledger {li.ledgerId}: its segments hold entries 0..{pieces[-1].last}, the topic's "
                          f"metadata lists {li.entries}")
    drivers = segment_drivers(li)
    by_store: dict[int, SegmentOffloader] = {}
    stores: dict[str, SegmentOffloader] = {}
    for p in pieces:
        off = store_of(p.uuid in drivers, drivers.get(p.uuid))
        seg = by_store.get(id(off))
        if seg is None:
            seg = by_store[id(off)] = SegmentOffloader(off)
        stores[p.uuid] = seg
    first = stores[pieces[0].uuid]
    others = {u: s for u, s in stores.items() if s is not first}
    size = li.size if closed and li.HasField("size") else None
    return first.open_ledger(li.ledgerId, pieces, closed=closed, size=size, topic=topic, stores=others or None,
                             cached_index=cached_index)
