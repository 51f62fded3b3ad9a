"""The managed-ledger offload protocol (spec/02): crash-safe, one topic record CAS at each step.

1. CAS a fresh uuid into the ledger's OffloadContext (complete=false) before any object is written.
   An older uuid there is an abandoned attempt: an ``offloaded`` pending-deletion record (reason
   ``offload-cleanup``) is durably appended to the deletion log **before** the CAS that replaces it
   (two-phase deletion, spec/05); the drain deletes its objects later. Abandoned attempts remembered
   in the ledger's properties (``ABANDONED_PREFIX``, written by earlier versions) get records too and
   their properties are dropped by the same CAS. If the CAS loses a race the record is harmless: the
   drain sees the uuid still current and acknowledges it without deleting anything.
2. Write data then index objects.
3. CAS complete=true only if our uuid is still there; otherwise it is a conflict and an ``offloaded``
   record for our own uuid (reason ``offload-conflict``) is appended instead of deleting directly. A
   metadata-store error (outcome unknown) deletes nothing and appends nothing: the update may have
   landed.
"""

from __future__ import annotations

import logging
import time
import uuid as uuidlib
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

from tieredcore.clock import now_ms
from tieredcore.errors import (
    LedgerNotFoundError,
    MetadataStoreError,
    OffloadConflictError,
    StaleHandleError,
    TieredError,
)
from tieredcore.formats.proto import MLDataFormats_pb2 as pb
from tieredcore.formats.uuids import uuid_to_msb_lsb
from tieredcore.lifecycle.deletion_log import TYPE_OFFLOADED, DeletionLog, DeletionRecord
from tieredcore.lifecycle.planner import select_keep_bytes, select_prefix
from tieredcore.model import Position
from tieredcore.offload.context import (
    ABANDONED_PREFIX,
    abandoned_uuids,
    context_driver,
    context_uuid,
    driver_dict,
)
from tieredcore.offload.offloader import LedgerOffloader
from tieredcore.stores.hot import LocalLedgerStore
from tieredcore.stores.managed_ledgers import ManagedLedgerStore, find_ledger
from tieredcore.topics import TopicName

log = logging.getLogger(__name__)

# ABANDONED_PREFIX (tieredcore.offload.context): legacy LedgerInfo properties remembering attempts whose
# objects were not yet confirmed removed. No longer written (the deletion log's durable records replace
# them); still read (retention, reconciliation) and cleaned (the next offload attempt appends records and
# drops the properties).
__all__ = ["ABANDONED_PREFIX", "TopicOffloader", "abandoned_uuids", "context_uuid"]

REASON_OFFLOAD_CLEANUP = "offload-cleanup"  # an earlier attempt's uuid, replaced by a new attempt
REASON_OFFLOAD_CONFLICT = "offload-conflict"  # our own attempt lost (replaced, or the ledger left)
MAX_ROUNDS = 10  # append / CAS rounds of step 1 before giving up on a ledger that keeps changing

OUTCOME_OFFLOADED = "offloaded"
OUTCOME_SKIPPED = "skipped"  # already complete
OUTCOME_CONFLICT = "conflict"  # trimmed meanwhile or another attempt took over
OUTCOME_FAILED = "failed"
OUTCOME_UNKNOWN = "unknown"  # metadata store error at completion: may have landed


@dataclass
class LedgerOffloadResult:
    topic: str
    ledger_id: int
    outcome: str
    uuid: str | None = None
    bytes: int = 0
    blocks: int = 0
    entries: int = 0
    seconds: float = 0.0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.outcome in (OUTCOME_OFFLOADED, OUTCOME_SKIPPED)

    def as_dict(self) -> dict:
        return asdict(self)


class TopicOffloader:
    """Runs the protocol for the ledgers of one or more topics over one hot tier and one object store."""

    def __init__(
        self,
        ml: ManagedLedgerStore,
        hot: LocalLedgerStore,
        offloader: LedgerOffloader,
        *,
        clock_ms: Callable[[], int] = now_ms,
        uuid_factory: Callable[[], uuidlib.UUID] = uuidlib.uuid4,
        progress: Callable[[str, int, int, int], None] | None = None,
        deletion_log: DeletionLog | None = None,
    ) -> None:
        self.ml = ml
        self.hot = hot
        self.offloader = offloader
        # pending-deletion records of replaced / conflicted attempts (phase 1 of spec/05); the log
        # lives in the same metadata store as the topic records
        self.deletion_log = deletion_log if deletion_log is not None else DeletionLog(ml.store)
        self.clock_ms = clock_ms
        self.uuid_factory = uuid_factory
        self.progress = progress  # (topic, ledger id, bytes done, bytes total)

    def _driver_metadata(self) -> pb.OffloadDriverMetadata:
        dm = pb.OffloadDriverMetadata(name=self.offloader.store.driver)
        props = dict(self.offloader.store.driver_properties())
        if self.offloader.prefix:
            props["prefix"] = self.offloader.prefix
        for k in sorted(props):
            dm.properties.add(key=k, value=str(props[k]))
        return dm

    # -- one ledger ---------------------------------------------------------------------------

    def offload_ledger(self, topic: str | TopicName, ledger_id: int) -> LedgerOffloadResult:
        t = topic if isinstance(topic, TopicName) else TopicName.parse(topic)
        name = t.managed_ledger_name
        started = time.monotonic()
        res = LedgerOffloadResult(name, ledger_id, OUTCOME_FAILED)
        new_uuid = str(self.uuid_factory())
        msb, lsb = uuid_to_msb_lsb(uuidlib.UUID(new_uuid))
        state: dict = {}

        # step 1: record our uuid before writing anything. Every attempt it replaces (the uuid there, plus
        # legacy abandoned properties) must be covered by a durable record first: when the CAS finds one
        # not covered yet, it changes nothing, the record is appended and the CAS is tried again.
        covered: set[str] = set()

        def begin(info) -> bool:
            state.clear()
            li = find_ledger(info, ledger_id)
            if li is None:
                state["conflict"] = f"ledger {ledger_id} is not in topic {name} (trimmed?)"
                return False
            if li.ledgerId == info.ledgerInfo[-1].ledgerId or li.timestamp <= 0:
                state["conflict"] = f"ledger {ledger_id} of {name} is the open ledger"
                return False
            ctx = li.offloadContext
            if ctx.complete:
                state["skipped"] = context_uuid(li)
                return False
            replaced = list(dict.fromkeys(
                [u for u in (context_uuid(li),) if u is not None] + abandoned_uuids(li)))
            missing = [u for u in replaced if u not in covered]
            if missing:
                state["uncovered"] = (missing, context_driver(li))
                return False
            if abandoned_uuids(li):  # legacy: the records now stand for them
                keep = [kv for kv in li.properties if not kv.key.startswith(ABANDONED_PREFIX)]
                del li.properties[:]
                li.properties.extend(keep)
            ctx.uidMsb, ctx.uidLsb = msb, lsb
            ctx.complete = False
            ctx.ClearField("timestamp")
            ctx.driverMetadata.CopyFrom(self._driver_metadata())
            return True

        try:
            for _round in range(MAX_ROUNDS):
                self.ml.update_topic(t, begin)
                if "uncovered" not in state:
                    break
                missing, dm = state["uncovered"]
                self._append(name, ledger_id, missing, REASON_OFFLOAD_CLEANUP, dm)
                covered.update(missing)
            else:
                raise OffloadConflictError(f"ledger {ledger_id} of {name}: offload attempts kept replacing "
                                           f"each other over {MAX_ROUNDS} rounds")
        except TieredError as e:
            res.error = f"recording offload attempt: {e}"
            return self._finish(res, started)
        if "conflict" in state:
            res.outcome, res.error = OUTCOME_CONFLICT, state["conflict"]
            return self._finish(res, started)
        if "skipped" in state:
            res.outcome, res.uuid = OUTCOME_SKIPPED, state["skipped"]
            return self._finish(res, started)
        res.uuid = new_uuid

        # step 2: write the objects (the offloader leaves nothing behind when it fails)
        try:
            handle = self.hot.open_ledger(ledger_id)
        except (LedgerNotFoundError, StaleHandleError) as e:
            res.outcome, res.error = OUTCOME_CONFLICT, f"hot-tier ledger gone: {e}"
            return self._finish(res, started)
        try:
            cb = None
            if self.progress is not None:
                cb = lambda done, total: self.progress(name, ledger_id, done, total)  # noqa: E731
            obj = self.offloader.offload(handle, new_uuid, {"managedledgername": name}, progress=cb)
        except Exception as e:
            res.error = f"{type(e).__name__}: {e}"
            return self._finish(res, started)
        finally:
            handle.close()
        res.bytes, res.blocks, res.entries = obj.data_length, obj.blocks, obj.entries

        # step 3: complete only if our uuid is still the ledger's
        def complete(info) -> bool:
            state.pop("conflict", None)
            li = find_ledger(info, ledger_id)
            if li is None:
                state["conflict"] = f"ledger {ledger_id} left topic {name} during the offload"
                return False
            if context_uuid(li) != new_uuid:
                state["conflict"] = f"another offload attempt ({context_uuid(li)}) replaced ours"
                return False
            li.offloadContext.complete = True
            li.offloadContext.timestamp = self.clock_ms()
            return True

        try:
            self.ml.update_topic(t, complete)
        except MetadataStoreError as e:
            # the update may have landed: deleting our objects could lose the only offloaded copy
            res.outcome, res.error = OUTCOME_UNKNOWN, f"completing offload, outcome unknown: {e}"
            return self._finish(res, started)
        except TieredError as e:
            # the completion did not land (topic gone, CAS gave up): our objects go through the log; if
            # our uuid is somehow still current the drain sees it in use and deletes nothing
            res.error = f"completing offload: {e}"
            self._discard_own(name, ledger_id, new_uuid)
            return self._finish(res, started)
        if "conflict" in state:
            res.outcome, res.error = OUTCOME_CONFLICT, state["conflict"]
            self._discard_own(name, ledger_id, new_uuid)
            return self._finish(res, started)
        res.outcome = OUTCOME_OFFLOADED
        return self._finish(res, started)

    def _append(self, name: str, ledger_id: int, uuids: Iterable[str], reason: str,
                driver_metadata: pb.OffloadDriverMetadata | None = None) -> None:
        """Durably append one ``offloaded`` record per uuid (all or none). The driver is the attempt's
        own driver metadata when known, else this offloader's (attempts of one ledger go to the
        namespace's store)."""
        dm = driver_metadata if driver_metadata is not None and driver_metadata.name else self._driver_metadata()
        now = self.clock_ms()
        self.deletion_log.append([
            DeletionRecord(topic=name, ledger_id=ledger_id, type=TYPE_OFFLOADED, reason=reason, created_ms=now,
                           uuid=u, driver=driver_dict(dm))
            for u in uuids
        ])

    def _discard_own(self, name: str, ledger_id: int, uuid: str) -> None:
        """Our attempt lost: its objects become a pending deletion (never a direct delete)."""
        try:
            self._append(name, ledger_id, [uuid], REASON_OFFLOAD_CONFLICT)
        except TieredError as e:
            # nothing references the uuid any more: orphan reconciliation finds the objects later
            log.warning("ledger %s: could not record conflicted attempt %s for deletion: %s", ledger_id, uuid, e)

    @staticmethod
    def _finish(res: LedgerOffloadResult, started: float) -> LedgerOffloadResult:
        res.seconds = round(time.monotonic() - started, 6)
        log_fn = log.info if res.ok else log.warning
        log_fn("offload %s ledger %s: %s%s", res.topic, res.ledger_id, res.outcome,
               f" ({res.error})" if res.error else "")
        return res

    # -- several ledgers ----------------------------------------------------------------------

    def offload_ledgers(self, topic: str | TopicName, ledger_ids: Iterable[int]) -> list[LedgerOffloadResult]:
        """Oldest first, one at a time; one failure does not stop the others."""
        return [self.offload_ledger(topic, lid) for lid in sorted(ledger_ids)]

    def offload_prefix(self, topic: str | TopicName, position: Position) -> list[LedgerOffloadResult]:
        t = topic if isinstance(topic, TopicName) else TopicName.parse(topic)
        info, _ = self.ml.get_topic(t)
        return self.offload_ledgers(t, select_prefix(info.ledgerInfo, position))

    def offload_keep_bytes(self, topic: str | TopicName, keep_bytes: int) -> list[LedgerOffloadResult]:
        t = topic if isinstance(topic, TopicName) else TopicName.parse(topic)
        info, _ = self.ml.get_topic(t)
        return self.offload_ledgers(t, select_keep_bytes(info.ledgerInfo, keep_bytes))


def raise_for(results: Iterable[LedgerOffloadResult]) -> None:
    bad = [r for r in results if not r.ok]
    if bad:
        raise OffloadConflictError("; ".join(f"ledger {r.ledger_id}: {r.outcome}: {r.error}" for r in bad))
