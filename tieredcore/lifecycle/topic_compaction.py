"""Topic compaction in one process (docs/topic-compaction.md, "How it runs"): the latest value per key of a
topic across every tier, written as a compacted ledger offloaded as a V1 object, recorded with one
compare-and-set.

The pieces are the ones a Spark job distributes: :func:`phase_one` is a pure map over entries (what each
entry contributes), :func:`latest_per_key` the reduce, :func:`phase_two` a pure map over the same entries
given the reduced map; :func:`compaction_source` is the entries both phases read (the previous compacted
ledger's, then the topic's after the previous horizon, up to this run's horizon).

Steps, each either fully applied or not at all (``on_step`` is called after each, by name):

1. ``ledger-created``: a ledger of the hot tier (a new id from the same id space as the topic's ledgers,
   as Pulsar creates its compacted ledger in BookKeeper) receives phase two's entries and is sealed;
2. ``offloaded``: it is offloaded as a V1 object pair by the offload writer (the project's checksums);
3. ``scratch-deleted``: its hot copy, recorded nowhere, is deleted (a crash before leaves a hot ledger
   no topic lists: reconciliation finds it);
4. ``recorded``: one compare-and-set on the topic record replaces the compaction state (the previous
   compacted ledger's objects are appended to the deletion log first, by the transaction's cover step),
   only if the state is still the one this run started from. Before it lands the new objects are
   referenced by nothing: orphans reconciliation finds; after it, the previous objects are pending
   deletions the drain deletes once nothing names them.
"""

from __future__ import annotations

import time
import uuid as uuidlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from tieredcore.clock import now_ms
from tieredcore.errors import TieredError
from tieredcore.formats.compacted import (
    RETAIN_NULL_KEY_DEFAULT,
    CompactionItem,
    compacted_ledger_entry,
    compaction_items,
    latest_per_key,
    parse_compacted_ledger_entry,
    rewrite_entry,
)
from tieredcore.formats.keys import COMPACTED_LEDGER_METADATA_KEY
from tieredcore.formats.messages import MessageId
from tieredcore.meta.deletion_log import TYPE_OFFLOADED
from tieredcore.meta.reasons import Reason
from tieredcore.model import Position
from tieredcore.names import TopicName
from tieredcore.offload.compacted_state import CompactionState, compaction_state, set_compaction_state
from tieredcore.offload.context import driver_dict, driver_metadata_from_dict
from tieredcore.offload.offloader import LedgerOffloader
from tieredcore.offload.transaction import Applied, ObjectGroup, Refusal, TopicTransaction, Uncovered
from tieredcore.topic.reader import TopicReader
from tieredcore.topic.writer import ledger_custom_metadata
from tieredcore.workspace import Workspace

__all__ = [
    "CompactionPlan",
    "CompactionResult",
    "NothingToCompact",
    "TopicCompactionError",
    "compact_topic",
    "compaction_source",
    "last_position",
    "offloader_for_state",
    "partition_of",
    "phase_one",
    "phase_two",
    "plan_compaction",
    "record_compaction",
    "write_compacted",
]

APPEND_BATCH = 1000  # compacted entries per append to the hot tier (one durable write each)
Source = Iterable[tuple[int, int, bytes]]  # (ledger id, entry id, entry) in position order


class TopicCompactionError(TieredError):
    """The topic cannot be compacted (no messages, a lost race): one line, nothing written."""


class NothingToCompact(TopicCompactionError):
    """No message at all, or none after the compaction horizon: a rerun's normal outcome, not a failure."""


@dataclass
class CompactionResult:
    """One run: the horizon, the compacted ledger (id, object uuid; "" when it holds nothing), the state it
    replaced, messages phase one saw, keys retained, entries and bytes written, the steps done."""

    topic: str
    horizon: Position
    ledger_id: int
    uuid: str
    previous: CompactionState | None
    messages_read: int = 0
    bytes_read: int = 0  # the source's entries (the previous compacted ledger's, then the new ones)
    keys_seen: int = 0  # distinct keys of the messages read (tombstoned keys included)
    keys: int = 0  # keys retained
    entries_written: int = 0
    bytes_written: int = 0
    seconds: float = 0.0
    steps: list[str] = field(default_factory=list)


# -- the pure parts ----------------------------------------------------------------------------------


def phase_one(source: Source, verify: bool = True) -> Iterator[CompactionItem]:
    """What every entry contributes to the key map (a map over entries)."""
    for lid, eid, data in source:
        yield from compaction_items(data, lid, eid, verify)


def phase_two(source: Source, latest: Mapping[str, MessageId], partition: int = -1,
              retain_null_key: bool = RETAIN_NULL_KEY_DEFAULT, verify: bool = True) -> Iterator[bytes]:
    """The compacted ledger's entries, in position order (a map over entries given the key map)."""
    for lid, eid, data in source:
        out = rewrite_entry(data, lid, eid, latest, retain_null_key, verify)
        if out is not None:
            yield compacted_ledger_entry(out, lid, eid, partition)


def partition_of(topic: TopicName) -> int:
    """The partition index MessageIdData carries: ``<topic>-partition-<i>``'s i, else -1."""
    base, sep, index = topic.local_name.rpartition("-partition-")
    return int(index) if sep and base and index.isdigit() else -1


def last_position(reader: TopicReader, topic: TopicName) -> Position | None:
    """The topic's last confirmed position (its newest ledger holding an entry), None without any."""
    info, _ = reader.ml.get_topic(topic)
    for li in reversed(info.ledgerInfo):
        if li.timestamp > 0 and li.HasField("entries"):
            if li.entries > 0:
                return Position(li.ledgerId, li.entries - 1)
            continue
        _tier, h = reader.open_ledger(topic, li.ledgerId)
        if h.last_add_confirmed >= 0:
            return Position(li.ledgerId, h.last_add_confirmed)
    return None


def compacted_entries(offloader: LedgerOffloader, state: CompactionState) -> Iterator[tuple[int, int, bytes]]:
    """A compacted ledger's entries as ``(original ledger id, original entry id, entry)``."""
    if state.empty:
        return
    h = offloader.read_offloaded(state.ledger_id, state.uuid)
    try:
        lac = h.last_add_confirmed
        first = 0
        while first <= lac:
            last = min(first + 999, lac)
            for e in h.read(first, last):
                lid, eid, _part, entry = parse_compacted_ledger_entry(e.data)
                yield lid, eid, bytes(entry)
            first = last + 1
    finally:
        h.close()


def compaction_source(reader: TopicReader, offloader_for: Callable[[CompactionState], LedgerOffloader],
                      topic: TopicName, previous: CompactionState | None, horizon: Position) -> Source:
    """The entries both phases read: the previous compacted ledger's, then the topic's after its horizon
    (from the start without one), up to ``horizon``."""
    start = None
    if previous is not None:
        yield from compacted_entries(offloader_for(previous), previous)
        start = Position(previous.horizon.ledger_id, previous.horizon.entry_id + 1)
    for pos, data in reader.read(topic, start, horizon):
        yield pos.ledger_id, pos.entry_id, data


# -- the run -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CompactionPlan:
    """What a run of one topic starts from: the state it replaces (None: never compacted), the horizon (the
    topic's last confirmed position now) and the offloader the compacted ledger goes through."""

    topic: TopicName
    previous: CompactionState | None
    horizon: Position
    offloader: LedgerOffloader


def plan_compaction(ws: Workspace, reader: TopicReader, t: TopicName,
                    offloader: LedgerOffloader | None = None) -> CompactionPlan:
    """The run's start (TopicNotFoundError for an unknown topic; NothingToCompact when there is nothing
    to compact: no messages, or none after the previous horizon)."""
    ws.ml.require_writable(t)
    info, _ = ws.ml.get_topic(t)
    previous = compaction_state(info)
    horizon = last_position(reader, t)
    if horizon is None:
        raise NothingToCompact(f"topic {t.full} has no messages: nothing to compact")
    if previous is not None and horizon <= previous.horizon:
        raise NothingToCompact(f"topic {t.full} has no messages after its compaction horizon "
                                   f"{previous.horizon}: nothing to compact")
    # the compacted ledger goes where the topic's effective policy sends its offloads
    off = offloader if offloader is not None else ws.offloader_for_policy(ws.policies.for_topic(t))
    return CompactionPlan(t, previous, horizon, off)


def offloader_for_state(ws: Workspace, s: CompactionState) -> LedgerOffloader:
    """The offloader that reads a compacted ledger's objects (the driver recorded with it)."""
    return ws.offloader_for_driver(driver_metadata_from_dict(s.driver)) if s.driver else ws.offloader


def compact_topic(ws: Workspace, topic: str | TopicName, *, offloader: LedgerOffloader | None = None,
                  retain_null_key: bool = RETAIN_NULL_KEY_DEFAULT, clock_ms: Callable[[], int] = now_ms,
                  uuid_factory: Callable[[], uuidlib.UUID] = uuidlib.uuid4,
                  on_step: Callable[[str], None] | None = None) -> CompactionResult:
    """Compact ``topic`` up to its last confirmed position (module docstring), writing the compacted
    ledger with ``offloader`` (default: the one the topic's effective policy names). Raises TopicNotFoundError
    for an unknown topic and TopicCompactionError when there is nothing to compact or the state changed
    meanwhile; nothing is recorded then (and nothing is left behind but what reconciliation finds)."""
    started = time.monotonic()
    t = topic if isinstance(topic, TopicName) else TopicName.parse(topic)
    reader = ws.reader()
    try:
        plan = plan_compaction(ws, reader, t, offloader)

        def source() -> Source:
            return compaction_source(reader, lambda s: offloader_for_state(ws, s), t, plan.previous, plan.horizon)

        items = 0
        read = 0
        keys: set[str] = set()

        def counted() -> Iterator[CompactionItem]:
            nonlocal items, read
            for lid, eid, data in source():
                read += len(data)
                for it in compaction_items(data, lid, eid):
                    items += 1
                    if it.key is not None:
                        keys.add(it.key)
                    yield it

        latest = latest_per_key(counted())
        res = CompactionResult(t.managed_ledger_name, plan.horizon, -1, "", plan.previous, messages_read=items,
                               bytes_read=read, keys_seen=len(keys), keys=len(latest))
        keys.clear()
        write_compacted(ws, plan, phase_two(source(), latest, partition_of(t), retain_null_key), res,
                        clock_ms=clock_ms, uuid_factory=uuid_factory, on_step=on_step)
        res.seconds = time.monotonic() - started
        return res
    finally:
        reader.close()


def write_compacted(ws: Workspace, plan: CompactionPlan, entries: Iterable[bytes], res: CompactionResult, *,
                    clock_ms: Callable[[], int] = now_ms, uuid_factory: Callable[[], uuidlib.UUID] = uuidlib.uuid4,
                    on_step: Callable[[str], None] | None = None) -> None:
    """Steps 1-4 (module docstring) for the compacted ledger's ``entries`` (phase two's output, in position
    order, each framed by :func:`compacted_ledger_entry`); fills ``res``'s ledger, uuid, entries, bytes
    and steps. TopicCompactionError when the state changed since ``plan`` (nothing recorded)."""
    t = plan.topic

    def step(what: str) -> None:
        res.steps.append(what)
        if on_step is not None:
            on_step(what)

    # 1. the compacted ledger, in the hot tier
    scratch = ws.hot.create_ledger(ledger_custom_metadata(t))
    res.ledger_id = scratch.ledger_id
    try:
        pending: list[bytes] = []
        for e in entries:
            pending.append(e)
            res.entries_written += 1
            res.bytes_written += len(e)
            if len(pending) >= APPEND_BATCH:
                scratch.append_many(pending)
                pending = []
        if pending:
            scratch.append_many(pending)
    finally:
        scratch.close()
    step("ledger-created")
    # 2. its V1 object pair
    if res.entries_written:
        new_uuid = str(uuid_factory())
        h = ws.hot.open_ledger(res.ledger_id)
        try:
            # tieredcompactedledger: recovery from index objects alone must not take it for one of the topic's
            # ledgers (docs/recovery.md); Pulsar ignores unknown user metadata
            plan.offloader.offload(h, new_uuid, {"managedledgername": t.managed_ledger_name,
                                                 COMPACTED_LEDGER_METADATA_KEY: "true"})
        finally:
            h.close()
        res.uuid = new_uuid
    step("offloaded")
    # 3. the hot copy goes: nothing names it
    ws.hot.delete_ledger(res.ledger_id)
    step("scratch-deleted")
    # 4. the record
    driver = driver_dict(plan.offloader.location.driver_metadata())
    record_compaction(ws, t, plan.previous, CompactionState(res.ledger_id, plan.horizon, res.uuid, driver),
                      clock_ms, delete_delay_ms=ws.policies.for_topic(t).compaction_delete_delay_ms)
    step("recorded")


def record_compaction(ws: Workspace, t: TopicName, previous: CompactionState | None, new: CompactionState,
            clock_ms: Callable[[], int], delete_delay_ms: int = 0) -> None:
    """Step 4: one compare-and-set replaces ``previous`` by ``new`` (the previous compacted ledger's objects
    into the deletion log first, due ``delete_delay_ms`` later: compacted reads that opened them before the
    switch finish; the namespace's delete delay, one hour by default, where Pulsar deletes at once); a lost
    race gives ``new``'s objects to the deletion log and raises TopicCompactionError."""
    txn = TopicTransaction(ws.ml, ws.deletion_log, t, clock_ms=clock_ms)
    old = [] if previous is None or previous.empty else [
        ObjectGroup(previous.ledger_id, TYPE_OFFLOADED, previous.uuid, previous.driver)]

    def switch(info) -> bool:
        current = compaction_state(info)
        if current != previous:
            raise Refusal(f"the compaction state changed meanwhile (now {current}, this run started from "
                          f"{previous})")
        missing = [g for g in old if g.key not in txn.covered]
        if missing:
            now = clock_ms()
            raise Uncovered([g.record(txn.name, Reason.TOPIC_COMPACTION, now, now + delete_delay_ms)
                             for g in missing])
        set_compaction_state(info, new)
        return True

    ours = [] if new.empty else [ObjectGroup(new.ledger_id, TYPE_OFFLOADED, new.uuid, new.driver)]
    step = txn.cover_and_cas(switch, "recording the compacted ledger")
    if not isinstance(step, Applied):
        txn.give_back(ours, Reason.TOPIC_COMPACTION_CONFLICT)
        raise TopicCompactionError(f"{t.full}: {step.reason}; the new compacted ledger {new.ledger_id} "
                                   "was recorded for deletion")

