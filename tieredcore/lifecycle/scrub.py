"""Scrub and repair: find damaged or lost offloaded copies before a reader does, repair them from the hot
copy, and report loudly what cannot be repaired.

For every ledger of the chosen topics whose offload is complete, or with entries in completed PIP-76
segments (one unit each):

- **shallow** (every run): both objects exist (HEAD; a compressed or encrypted object's stored chunks too,
  with the size its manifest gives them), the index object is read and parsed, its checksum
  holds (this project's objects), its structure is sound, its data length is the data object's size, and
  it describes this ledger of this topic (entries, size, ledger id, topic name: the topic's LedgerInfo).
  A store that lost its objects (a bucket restored empty) is found here;
- **deep** (``--deep``; the DAG runs it weekly): the whole data object is read back (ranged GETs, bounded
  memory) and every block's structure and every chunk checksum checked; where the hot copy still exists,
  every frame is also compared with the CRC32C the hot tier recorded for it. In the same pass every
  Pulsar message's own CRC32C is checked in objects that carry no chunk checksums (Pulsar wrote them:
  without a hot copy the messages' CRCs are their only proof), or in every object with ``messages="all"``
  (tieredcore.offload.message_audit: a ledger whose entries are not messages — opaque entries — has its
  failing entries counted as *not messages*, never as damage). Rows count the entries checked, unchecked
  (old clients' messages carry no CRC), damaged and not messages; damaged ones are named by position.

A damaged copy whose hot copy still exists (even one marked for deletion but not drained yet) is
*repairable*: with ``repair`` it is replaced by a re-offload under a new uuid, verified against the hot
copy and swapped in by CAS; the damaged attempt goes to the deletion log
(:meth:`tieredcore.offload.managed.TopicOffloader.replace_offload`). Without a hot copy the damage is
**data loss**: reported (outcome ``unrecoverable``, the run fails and names the ledgers), never deleted.
So are damaged messages in a copy whose every frame matches the hot copy's CRCs: both copies hold the same
damaged bytes (damaged before the offload), and no repair can bring the messages back.

A ledger held by segments is checked the same way over its segments: shallow, every segment's index is
read and parsed and must hold exactly the entries the topic's metadata says (and, for a sealed ledger
fully held by segments, its size); deep, its blocks in each segment are read back
(:func:`tieredcore.offload.verify.verify_segments`), against the hot CRCs when the hot copy exists.
Segments are shared by several ledgers and are not repaired here: a damaged one is reported (damaged
while a hot copy exists, unrecoverable without one).

**Attached to a Pulsar cluster** (docs/pulsar.md, Scrub) the same checks run (the hot tier is Pulsar's
BookKeeper, never read: structure and every message's CRC32C, which are the only proof there), but
nothing can be repaired: BookKeeper may still hold a damaged ledger (the brokers delete it after their
offload deletion lag; ``bookkeeperDeleted`` says when they did) yet it is Pulsar's, and the project never
writes Pulsar's records or its bucket. A damaged copy's outcome is then ``unrepairable`` (not data loss,
which is not known here), its row's ``repair`` "impossible without BookKeeper"; ``repair`` is forced off
with one line saying why (:func:`repair_allowed`); nothing is replaced or deleted.

Outcomes per ledger: ok, damaged (found, not repaired: no ``repair``, or the repair did not land),
repaired, unrecoverable, unrepairable (attached), failed (the store failed: nothing could be decided),
skipped (no longer complete or listed), busy (another runner holds the topic's lease), aborted (the store
kept failing). Row ``bytes`` are the bytes read to check the ledger.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from tieredcore.cold.failures import StoreFailureBudget
from tieredcore.errors import (
    BlobStoreError,
    FormatError,
    NotFoundError,
    TieredError,
    UnreadableRecordError,
    ValidationError,
)
from tieredcore.formats.keys import INDEX_SUFFIX
from tieredcore.hot.tier import HotTier
from tieredcore.lifecycle.work import (
    KIND_SCRUB,
    REPAIR_FROM_HOT,
    REPAIR_NO_COPY,
    REPAIR_WITHOUT_BOOKKEEPER,
    LedgerResult,
    TopicWork,
    held_topic_rows,
    resolve_namespaces,
    unreadable_unit,
)
from tieredcore.meta.managed_ledgers import find_ledger
from tieredcore.meta.reasons import Reason
from tieredcore.names import TopicName
from tieredcore.offload.context import context_uuid, is_complete
from tieredcore.offload.copies import copy_uuids, has_offloaded_copy, open_offloaded
from tieredcore.offload.message_audit import DamagedMessagesError, MessageTally
from tieredcore.offload.reader import ExpectedLedger
from tieredcore.offload.verify import hot_frame_ranges, verify_offloaded
from tieredcore.outcomes import Outcome
from tieredcore.policy import OffloadPolicy
from tieredcore.workspace import Workspace

log = logging.getLogger(__name__)

DEEP_WEEKDAY = 6  # "auto": deep on Sundays (UTC) of the logical date, shallow on the other days
DEEP_MODES = ("auto", "always", "never")
# which objects a deep scrub checks the Pulsar messages of: those without chunk checksums, or all
MESSAGE_MODES = ("auto", "all")


def deep_for(mode: str, as_of_ms: int, weekday: int = DEEP_WEEKDAY) -> bool:
    """Whether a scrub as of ``as_of_ms`` reads whole objects: always, never, or (auto) once a week."""
    if mode == "always":
        return True
    if mode == "never":
        return False
    return dt.datetime.fromtimestamp(as_of_ms / 1000, dt.UTC).weekday() == weekday


def repair_allowed(ws: Workspace, repair: bool, *, announce: bool = True) -> tuple[bool, str | None]:
    """(repair, why it is off): on a workspace attached to a Pulsar cluster a repair asked for is forced
    off, with one line saying why (``announce``: logged as a warning, e.g. in the Spark driver's log; the
    CLI prints it on stderr itself)."""
    if not (repair and ws.attached):
        return repair, None
    cluster = ws.policies.brokers
    line = (f"scrub: repair off: attached to Pulsar cluster {cluster!r}: repair impossible without BookKeeper "
            "(damaged copies are reported, never replaced or deleted)")
    if announce:
        log.warning("%s", line)
    return False, line


def plan_scrub(
    ws: Workspace, namespaces: Iterable[str] | None, as_of_ms: int, *, topics: Iterable[str] | None = None,
    deep: bool = False, repair: bool = True, dry_run: bool = False, messages: str = "auto",
) -> list[TopicWork]:
    """Topics (named, or every topic of the namespaces: all by default) with complete offloads or
    completed segments. ``messages`` (MESSAGE_MODES): whose messages a deep scrub checks."""
    if messages not in MESSAGE_MODES:
        raise ValidationError(f"messages {messages!r}: one of {', '.join(MESSAGE_MODES)}")
    repair, _ = repair_allowed(ws, repair and not dry_run)
    if topics:
        names = [TopicName.parse(t) for t in topics]
    else:
        names = [t for ns in resolve_namespaces(ws.ml, ws.policies, namespaces, KIND_SCRUB) for t in ws.ml.list_topics(ns)]
    out = []
    for t in names:
        try:
            info, _ = ws.ml.get_topic(t)
        except NotFoundError:
            continue  # deleted since listing
        except UnreadableRecordError as e:  # fails this topic only (one failed row when run)
            out.append(unreadable_unit(e, KIND_SCRUB, as_of_ms, dry_run))
            continue
        ids = [li.ledgerId for li in info.ledgerInfo if has_offloaded_copy(li)]
        if ids:
            out.append(TopicWork(t.full, KIND_SCRUB, ids, as_of_ms, dry_run,
                                 options={"deep": deep, "repair": repair and not dry_run, "messages": messages}))
    return out


def scrub_work(ws: Workspace, pol: OffloadPolicy, t: TopicName, w: TopicWork,
               budget: StoreFailureBudget | None = None) -> list[LedgerResult]:
    """run_work's branch for KIND_SCRUB units. Repairs hold the topic's lease; checks do not need it."""
    deep = bool(w.options.get("deep"))
    repair = bool(w.options.get("repair")) and not w.dry_run and not ws.attached  # attached: never
    check = _Check(deep, True if w.options.get("messages") == "all" else None)
    check_only = TopicWork(w.topic, w.kind, w.ledgers, w.as_of_ms, dry_run=True, options=w.options)
    return held_topic_rows(ws.leases, t, w if repair else check_only, "scrub-repair", budget,
                           lambda lid, row: _scrub_one(ws, t, lid, w, row, check, repair))


@dataclass(frozen=True)
class _Check:
    """How a ledger's copy is checked: ``deep`` reads every byte; ``messages`` as verify_offloaded takes
    it (None: in objects without chunk checksums; True: in every object)."""

    deep: bool
    messages: bool | None


@dataclass(frozen=True)
class _Found:
    """What checking a copy found: the problem (None: intact), the error type of a store failure ('' for
    none), and whether the hot copy holds the same damage (damaged messages in frames that all match the
    hot copy's CRCs: no repair can help)."""

    problem: str | None
    failed: str = ""
    same_as_hot: bool = False


def _scrub_one(ws: Workspace, t: TopicName, lid: int, w: TopicWork, row: LedgerResult, check: _Check,
               repair: bool) -> str:
    info, _ = ws.ml.get_topic(t)
    li = find_ledger(info, lid)
    if li is None or not has_offloaded_copy(li):
        row.outcome = "skipped"  # trimmed or replaced since planned
        return ""
    if not is_complete(li):
        return _scrub_segments(ws, t, li, row, check, w, repair)
    uuid = context_uuid(li)
    assert uuid is not None
    row.uuid, row.entries = uuid, li.entries
    off = ws.offloader_for_driver(li.offloadContext.driverMetadata)

    def open_copy():
        h = off.read_offloaded(lid, uuid, ExpectedLedger.of(li, t.managed_ledger_name))
        row.bytes = h.index_bytes
        return h

    found = _check_copy(ws.hot, lid, row, check, open_copy, "the offloaded copy")
    if found.failed or found.problem is None:
        return found.failed
    problem = found.problem
    if ws.attached:
        _unrepairable(row, li, f"the offloaded copy {uuid}", problem)
        return ""
    if not ws.hot.exists(lid):
        row.outcome, row.repair = Outcome.UNRECOVERABLE, REPAIR_NO_COPY
        row.error = f"DATA LOSS: the offloaded copy {uuid} is damaged ({problem}) and there is no hot copy"
        return ""
    if found.same_as_hot:
        _beyond_repair(row, f"the offloaded copy {uuid}", problem)
        return ""
    row.repair = REPAIR_FROM_HOT
    if not repair:
        row.outcome = Outcome.DAMAGED
        row.error = f"{problem}; repairable from the hot copy (repair it: --repair)"
        return ""
    r = ws.topic_offloader(clock_ms=lambda: w.as_of_ms, offloader=off).replace_offload(
        t, lid, uuid, Reason.SCRUB_REPAIR)
    if r.outcome == Outcome.REPLACED:
        row.outcome, row.error = Outcome.REPAIRED, f"{problem}; replaced by {r.uuid}, verified against the hot copy"
    elif r.outcome == Outcome.NO_HOT_COPY:
        row.outcome, row.error = Outcome.UNRECOVERABLE, f"DATA LOSS: {problem}; {r.error}"
        row.repair = REPAIR_NO_COPY
    else:
        row.outcome, row.error = Outcome.DAMAGED, f"{problem}; repair {r.outcome}: {r.error}"
        return r.error_type
    return ""


def _unrepairable(row: LedgerResult, li, what: str, problem: str) -> None:
    """A damaged copy on a workspace attached to a Pulsar cluster: reported, nothing changed (module
    docstring); the row says what the brokers' record tells of the BookKeeper copy."""
    if li.offloadContext.bookkeeperDeleted:
        bk = "the brokers have deleted (or are deleting) its BookKeeper ledger (bookkeeperDeleted)"
    else:
        bk = (f"BookKeeper may still hold ledger {li.ledgerId} until the brokers' offload deletion lag passes, "
              "but this workspace cannot read BookKeeper")
    row.outcome, row.repair = Outcome.UNREPAIRABLE, REPAIR_WITHOUT_BOOKKEEPER
    row.error = f"{what} is damaged ({problem}); repair {REPAIR_WITHOUT_BOOKKEEPER}: {bk}; nothing was changed"


def _beyond_repair(row: LedgerResult, what: str, problem: str) -> None:
    row.outcome, row.repair = Outcome.UNRECOVERABLE, REPAIR_NO_COPY
    row.error = (f"DATA LOSS: {what} holds damaged messages ({problem}); every frame matches the hot copy, "
                 "which holds the same damaged bytes (damaged before the offload): no copy can repair them")


def _check_copy(hot: HotTier, lid: int, row: LedgerResult, check: _Check, open_copy: Callable[[], Any],
                what: str) -> _Found:
    """Open a ledger's object-store copy (``open_copy`` checks what opening it can) and, when deep, read
    it all back against the hot CRCs, checking its messages as ``check`` says (their counts go into the
    row). A store failure says nothing about the copy: the row is then marked failed; an intact copy ok."""
    try:
        h = open_copy()
        try:
            if not check.deep:  # shallow: the stored bytes behind manifests exist and have their size
                _check_stored(h)
            if check.deep:
                crcs, sizes, ranges = _hot_record(hot, lid)
                rep = verify_offloaded(h, crcs, expected_sizes=sizes, messages=check.messages, expected_ranges=ranges)
                row.bytes += rep.bytes_read
                row.blocks = rep.blocks
                _count_messages(row, rep.messages)
        finally:
            h.close()
    except BlobStoreError as e:
        row.outcome, row.error = "failed", f"could not check {what}: {e}"
        return _Found(None, type(e).__name__)
    except DamagedMessagesError as e:  # every other check passed: the messages are what is damaged
        if e.report is not None:
            row.bytes += e.report.bytes_read
            row.blocks = e.report.blocks
        _count_messages(row, e.tally)
        return _Found(f"{type(e).__name__}: {e}", same_as_hot=e.same_as_hot)
    except (FormatError, NotFoundError) as e:
        return _Found(f"{type(e).__name__}: {e}")
    row.outcome = Outcome.OK
    return _Found(None)


def _check_stored(h: Any) -> None:
    """Each object pair of a copy in a transformed store: its chunks exist and have the manifest's size
    (a HEAD each). Plain objects: opening the copy already compared the data object's size with the
    index."""
    for x in h.object_handles():
        check = getattr(x.store, "check_stored", None)
        if check is not None:
            check(x.key)
            check(x.key + INDEX_SUFFIX)


def _count_messages(row: LedgerResult, tally: MessageTally | None) -> None:
    if tally is not None:
        row.messages_checked, row.messages_unchecked = tally.checked, tally.unchecked
        row.messages_damaged, row.not_messages = tally.damaged, tally.not_messages
        row.damaged_at = ",".join(str(b.position) for b in tally.damaged_at)
        row.damage_reasons = "\n".join(
            b.reason.removeprefix(f"entry {b.position}: ").replace("\n", " ") for b in tally.damaged_at)


def _scrub_segments(ws: Workspace, t: TopicName, li, row: LedgerResult, check: _Check, w: TopicWork,
                    repair: bool) -> str:
    """A ledger whose object-store copy is its completed segments (all its entries, or a prefix). A
    damaged one is repaired (``repair``) by rewriting its segments, with every ledger sharing them, from
    the hot copies (tieredcore.lifecycle.compaction_run.repair_segments)."""
    lid = li.ledgerId
    uuids = copy_uuids(li)
    row.uuid = ",".join(uuids)

    def open_copy():
        h = open_offloaded(li, ws.offloader, t.managed_ledger_name, ws.offloader_for_driver)
        row.entries = h.last_add_confirmed + 1
        try:
            h.open_all()  # every index: exists, parses, holds what the topic's metadata says
        except BaseException:
            h.close()
            raise
        row.bytes = h.index_bytes
        return h

    found = _check_copy(ws.hot, lid, row, check, open_copy, "the segments")
    if found.failed or found.problem is None:
        return found.failed
    problem = found.problem
    if ws.attached:
        _unrepairable(row, li, f"the segments of ledger {lid}", problem)
        return ""
    if not ws.hot.exists(lid):
        row.outcome, row.repair = Outcome.UNRECOVERABLE, REPAIR_NO_COPY
        row.error = f"DATA LOSS: the segments of ledger {lid} are damaged ({problem}) and there is no hot copy"
        return ""
    if found.same_as_hot:
        _beyond_repair(row, f"the segments of ledger {lid}", problem)
        return ""
    row.repair = REPAIR_FROM_HOT
    if not repair:
        row.outcome = Outcome.DAMAGED
        row.error = f"{problem}; repairable from the hot copies (repair it: --repair)"
        return ""
    from tieredcore.lifecycle.compaction import repair_segments

    r = repair_segments(ws, ws.policies.for_topic(t), t, set(uuids), clock_ms=lambda: w.as_of_ms)
    if isinstance(r, str):  # nothing written: the hot copy of this ledger is intact and kept
        row.outcome, row.error = Outcome.DAMAGED, f"{problem}; not repaired: {r}; this ledger's hot copy is kept"
        return ""
    if r.outcome == Outcome.COMPACTED:
        row.outcome = Outcome.REPAIRED
        row.error = (f"{problem}; rewritten from the hot copies of ledger(s) {', '.join(map(str, r.ledgers))} "
                     f"as {', '.join(r.segments)}, verified")
        return ""
    row.outcome, row.error = Outcome.DAMAGED, f"{problem}; repair {r.outcome}: {r.error}"
    return r.error_type


def _hot_record(hot: HotTier, lid: int):
    """The hot copy's per-entry CRCs, payload sizes and frame ranges when it exists and is readable (else
    None, None, None: structure and chunk checksums only)."""
    try:
        h = hot.open_ledger(lid)
    except TieredError:
        return None, None, None
    try:
        return h.entry_crcs(), h.entry_sizes(), hot_frame_ranges(h)
    finally:
        h.close()
