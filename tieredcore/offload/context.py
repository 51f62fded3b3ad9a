"""What a ledger's ``LedgerInfo`` says about its offloaded copies: the one place that decodes it.

A ``LedgerInfo`` (docs/metadata.md, ``MLDataFormats``) references object-store data through:

- its ``OffloadContext`` uuid (``uidMsb``/``uidLsb``): the current attempt, complete or in flight;
- ``OffloadContext.offloadSegment`` uuids (PIP-76 streaming segments);
- ``properties`` this project writes (Pulsar ignores them):
  ``tiered.abandonedOffload.<uuid>`` (legacy: attempts replaced before the deletion log existed) and
  ``tiered.replacementOffload.<uuid>`` (a replacement copy being written by a repair: the complete
  copy stays current until the replacement is verified and swapped in).

Every reader of these (offload, reader, drain, retention, reconciliation, scrub) goes through here, so
a reference added later (segments, compaction) is honoured everywhere at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tieredcore.errors import ValidationError
from tieredcore.formats.mlinfo import LedgerInfo
from tieredcore.formats.proto import MLDataFormats_pb2 as pb

__all__ = [
    "ABANDONED_PREFIX",
    "SegmentPiece",
    "SegmentRef",
    "covered_through",
    "covering_offloaded_ms",
    "held_by_segments",
    "incomplete_segment_uuids",
    "is_offloaded",
    "segment_drivers",
    "segment_pieces",
    "segment_refs",
    "REPLACEMENT_PREFIX",
    "LedgerInfo",
    "abandoned_uuids",
    "context_driver",
    "context_uuid",
    "driver_dict",
    "driver_metadata_from_dict",
    "is_complete",
    "is_sealed",
    "referenced_uuids",
    "add_referenced_uuids",
    "replacement_uuids",
    "segment_uuids",
    "uuid_from_halves",
]

ABANDONED_PREFIX = "tiered.abandonedOffload."
REPLACEMENT_PREFIX = "tiered.replacementOffload."

_M64 = (1 << 64) - 1


def uuid_from_halves(msb: int, lsb: int) -> str:
    """The canonical uuid string of Java's (mostSigBits, leastSigBits), signed or unsigned halves.
    No UUID object: reconciliation calls this once per ledger of every topic."""
    h = "%032x" % (((msb & _M64) << 64) | (lsb & _M64))
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def context_uuid(li: LedgerInfo) -> str | None:
    """The uuid recorded in the ledger's OffloadContext (complete or in flight), if any."""
    if not li.HasField("offloadContext"):
        return None
    ctx = li.offloadContext
    if not (ctx.HasField("uidMsb") or ctx.HasField("uidLsb")):
        return None
    return uuid_from_halves(ctx.uidMsb, ctx.uidLsb)


def is_complete(li: LedgerInfo) -> bool:
    return li.HasField("offloadContext") and li.offloadContext.complete


def _prefixed(li: LedgerInfo, prefix: str) -> list[str]:
    return [kv.key[len(prefix) :] for kv in li.properties if kv.key.startswith(prefix)]


def abandoned_uuids(li: LedgerInfo) -> list[str]:
    return _prefixed(li, ABANDONED_PREFIX)


def replacement_uuids(li: LedgerInfo) -> list[str]:
    return _prefixed(li, REPLACEMENT_PREFIX)


def segment_uuids(li: LedgerInfo) -> list[str]:
    if not li.HasField("offloadContext"):
        return []
    return [uuid_from_halves(s.uidMsb, s.uidLsb) for s in li.offloadContext.offloadSegment
            if s.HasField("uidMsb") or s.HasField("uidLsb")]


@dataclass(frozen=True)
class SegmentRef:
    """One ``OffloadContext.offloadSegment`` entry of a ledger: a segment holding some of its entries
    (up to ``end_entry``); ``complete`` false = assigned, its upload in flight or abandoned."""

    uuid: str
    complete: bool
    end_entry: int
    assigned_ms: int
    offloaded_ms: int


@dataclass(frozen=True)
class SegmentPiece:
    """Entries ``first..last`` of a ledger lie in segment ``uuid``."""

    uuid: str
    first: int
    last: int


def add_segment(li: LedgerInfo, halves: tuple[int, int], end_entry: int, driver: pb.OffloadDriverMetadata,
                assigned_ms: int, offloaded_ms: int | None = None) -> None:
    """Append an ``offloadSegment`` entry naming the segment ``halves`` (uuid msb, lsb) for the ledger's
    entries up to ``end_entry``: assigned (incomplete), or complete when ``offloaded_ms`` is given."""
    s = li.offloadContext.offloadSegment.add()
    s.uidMsb, s.uidLsb = halves
    s.complete = offloaded_ms is not None
    s.assignedTimestamp = assigned_ms
    if offloaded_ms is not None:
        s.offloadedTimestamp = offloaded_ms
    s.endEntryId = end_entry
    s.driverMetadata.CopyFrom(driver)


def segment_refs(li: LedgerInfo) -> list[SegmentRef]:
    if not li.HasField("offloadContext"):
        return []
    return [SegmentRef(uuid_from_halves(s.uidMsb, s.uidLsb), s.complete, s.endEntryId, s.assignedTimestamp,
                       s.offloadedTimestamp)
            for s in li.offloadContext.offloadSegment if s.HasField("uidMsb") or s.HasField("uidLsb")]


def segment_pieces(li: LedgerInfo) -> list[SegmentPiece]:
    """The completed segments holding the ledger's entries from 0 on, contiguous, in entry order (a
    gap ends the list: entries after it are not readable from segments)."""
    done = sorted((r for r in segment_refs(li) if r.complete), key=lambda r: r.end_entry)
    out: list[SegmentPiece] = []
    nxt = 0
    for r in done:
        if r.end_entry < nxt:
            continue  # covered already (a duplicate would be a bug; never read twice)
        out.append(SegmentPiece(r.uuid, nxt, r.end_entry))
        nxt = r.end_entry + 1
    return out


def covered_through(li: LedgerInfo) -> int:
    """The last entry id readable from completed segments (-1: none)."""
    pieces = segment_pieces(li)
    return pieces[-1].last if pieces else -1


def incomplete_segment_uuids(li: LedgerInfo) -> list[str]:
    return [r.uuid for r in segment_refs(li) if not r.complete]


def is_sealed(li: LedgerInfo) -> bool:
    return li.timestamp > 0


def is_offloaded(li: LedgerInfo) -> bool:
    """The ledger has a complete object-store copy: its V1 offload is complete, or it is sealed and
    completed segments hold every entry of it (PIP-76)."""
    if is_complete(li):
        return True
    return is_sealed(li) and li.HasField("entries") and li.entries > 0 and covered_through(li) >= li.entries - 1


def held_by_segments(li: LedgerInfo) -> bool:
    """Offloaded (:func:`is_offloaded`) through its segments only: no complete V1 copy."""
    return not is_complete(li) and is_offloaded(li)


def covering_offloaded_ms(li: LedgerInfo) -> int:
    """When the last of the completed segments holding the ledger's entries (:func:`segment_pieces`)
    completed: the latest ``offloadedTimestamp`` among them (0: none)."""
    pieces = {p.uuid for p in segment_pieces(li)}
    return max((r.offloaded_ms for r in segment_refs(li) if r.complete and r.uuid in pieces), default=0)


def segment_drivers(li: LedgerInfo) -> dict[str, pb.OffloadDriverMetadata]:
    """uuid -> a copy of the driver metadata recorded with that ``offloadSegment`` entry (entries
    without any are left out: the caller falls back to its default store)."""
    out: dict[str, pb.OffloadDriverMetadata] = {}
    if not li.HasField("offloadContext"):
        return out
    for s in li.offloadContext.offloadSegment:
        if (s.HasField("uidMsb") or s.HasField("uidLsb")) and s.HasField("driverMetadata"):
            dm = pb.OffloadDriverMetadata()
            dm.CopyFrom(s.driverMetadata)
            out.setdefault(uuid_from_halves(s.uidMsb, s.uidLsb), dm)
    return out


def referenced_uuids(li: LedgerInfo) -> set[str]:
    """Every uuid whose objects this LedgerInfo keeps alive (reconciliation's reference set)."""
    out: set[str] = set()
    add_referenced_uuids(li, out)
    return out


def add_referenced_uuids(li: LedgerInfo, out: set[str]) -> None:
    """:func:`referenced_uuids` added to ``out`` (reconciliation runs this once per ledger of every
    topic: one set for all, fields read once)."""
    if li.HasField("offloadContext"):
        ctx = li.offloadContext
        if ctx.HasField("uidMsb") or ctx.HasField("uidLsb"):
            out.add(uuid_from_halves(ctx.uidMsb, ctx.uidLsb))
        if ctx.offloadSegment:
            out.update(segment_uuids(li))
    if li.properties:
        out.update(abandoned_uuids(li))
        out.update(replacement_uuids(li))


def drop_properties(li: LedgerInfo, prefix: str, uuids: set[str] | None = None) -> None:
    """Remove ``prefix<uuid>`` properties (all of them, or those of ``uuids``) in place."""
    keep = [kv for kv in li.properties
            if not (kv.key.startswith(prefix) and (uuids is None or kv.key[len(prefix):] in uuids))]
    if len(keep) != len(li.properties):
        del li.properties[:]
        li.properties.extend(keep)


# -- driver metadata ------------------------------------------------------------------------------


def context_driver(li: LedgerInfo) -> pb.OffloadDriverMetadata | None:
    """A copy of the OffloadContext's driver metadata, or None when none is recorded."""
    if not li.HasField("offloadContext") or not li.offloadContext.HasField("driverMetadata"):
        return None
    dm = pb.OffloadDriverMetadata()
    dm.CopyFrom(li.offloadContext.driverMetadata)
    return dm


def driver_dict(dm: pb.OffloadDriverMetadata) -> dict[str, Any]:
    """OffloadDriverMetadata → the dict a deletion record carries."""
    return {"name": dm.name, "properties": {kv.key: kv.value for kv in dm.properties}}


def driver_metadata_from_dict(driver: Mapping[str, Any]) -> pb.OffloadDriverMetadata:
    """``{"name": ..., "properties": {k: v} | [{"key": k, "value": v}, ...]}`` → OffloadDriverMetadata."""
    if not isinstance(driver, Mapping):
        raise ValidationError(f"driver metadata must be a mapping, got {type(driver).__name__}")
    dm = pb.OffloadDriverMetadata(name=str(driver.get("name") or ""))
    props = driver.get("properties") or {}
    if isinstance(props, Mapping):
        items = [(str(k), str(v)) for k, v in props.items()]
    elif isinstance(props, list) and all(isinstance(p, Mapping) and "key" in p for p in props):
        items = [(str(p["key"]), str(p.get("value", ""))) for p in props]
    else:
        raise ValidationError(f"driver properties {props!r}: expected a mapping or a list of key/value")
    for k, v in sorted(items):
        dm.properties.add(key=k, value=v)
    return dm
