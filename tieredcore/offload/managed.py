"""The managed-ledger offload protocol (docs/metadata.md): crash-safe, one topic record CAS at each step.

1. CAS a fresh uuid into the ledger's OffloadContext (complete=false) before any object is written.
   An older uuid there is an abandoned attempt: an ``offloaded`` pending-deletion record (reason
   ``offload-cleanup``) is durably appended to the deletion log **before** the CAS that replaces it
   (two-phase deletion, docs/deletion.md); the drain deletes its objects later. Abandoned attempts remembered
   in the ledger's properties (``ABANDONED_PREFIX``, written by earlier versions) get records too and
   their properties are dropped by the same CAS. If the CAS loses a race the record is harmless: the
   drain sees the uuid still current and acknowledges it without deleting anything.
2. Write data then index objects.
3. CAS complete=true only if our uuid is still there; otherwise it is a conflict and an ``offloaded``
   record for our own uuid (reason ``offload-conflict``) is appended instead of deleting directly. A
   metadata-store error (outcome unknown) deletes nothing and appends nothing: the update may have
   landed.

Replacing a damaged complete copy (:meth:`TopicOffloader.replace_offload`, used by the deletion-lag
cleanup and the scrub) never leaves a moment without a complete copy referenced: the replacement's uuid
is recorded as a ``tiered.replacementOffload.<uuid>`` property first (reconciliation and retention honour
it), its objects are written from the hot copy and verified against the hot tier's per-entry CRCs, then
the damaged uuid's record is appended and one CAS makes the replacement current.
"""

from __future__ import annotations

import logging
import time
import uuid as uuidlib
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

from tieredcore.clock import now_ms
from tieredcore.cold.failures import StoreFailureBudget
from tieredcore.errors import (
    HotLedgerNotFoundError,
    LeaseHeldError,
    OffloadConflictError,
    StaleHandleError,
    TieredError,
)
from tieredcore.formats.mlinfo import LedgerInfo
from tieredcore.formats.proto import MLDataFormats_pb2 as pb
from tieredcore.formats.uuids import uuid_to_msb_lsb
from tieredcore.hot.tier import HotTier
from tieredcore.meta.deletion_log import TYPE_OFFLOADED, DeletionLog
from tieredcore.meta.leases import TopicLeases
from tieredcore.meta.managed_ledgers import ManagedLedgerStore, find_ledger
from tieredcore.meta.reasons import Reason
from tieredcore.names import TopicName
from tieredcore.offload.context import (
    ABANDONED_PREFIX,
    REPLACEMENT_PREFIX,
    abandoned_uuids,
    context_driver,
    context_uuid,
    driver_dict,
    drop_properties,
    is_complete,
    is_offloaded,
    replacement_uuids,
)
from tieredcore.offload.offloader import LedgerOffloader
from tieredcore.offload.reader import ExpectedLedger
from tieredcore.offload.transaction import (
    ObjectGroup,
    Refusal,
    Refused,
    TopicTransaction,
    Uncovered,
    settle,
)
from tieredcore.offload.verify import hot_frame_ranges, verify_offloaded
from tieredcore.outcomes import Outcome

log = logging.getLogger(__name__)

# ABANDONED_PREFIX (tieredcore.offload.context): legacy LedgerInfo properties remembering attempts whose
# objects were not yet confirmed removed. No longer written (the deletion log's durable records replace
# them); still read (retention, reconciliation) and cleaned (the next offload attempt appends records and
# drops the properties).
__all__ = ["ABANDONED_PREFIX", "TopicOffloader", "abandoned_uuids", "context_uuid"]

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
    error_type: str = ""  # class name of the exception behind `error` (e.g. BlobStoreError)

    @property
    def ok(self) -> bool:
        return self.outcome in (Outcome.OFFLOADED, Outcome.SKIPPED, Outcome.REPLACED, Outcome.BUSY)

    def as_dict(self) -> dict:
        return asdict(self)


class TopicOffloader:
    """Runs the protocol for the ledgers of one or more topics over one hot tier and one object store."""

    def __init__(
        self,
        ml: ManagedLedgerStore,
        hot: HotTier,
        offloader: LedgerOffloader,
        *,
        clock_ms: Callable[[], int] = now_ms,
        uuid_factory: Callable[[], uuidlib.UUID] = uuidlib.uuid4,
        progress: Callable[[str, int, int, int], None] | None = None,
        deletion_log: DeletionLog | None = None,
        leases: TopicLeases | None = None,
    ) -> None:
        self.ml = ml
        self.hot = hot
        self.offloader = offloader
        # pending-deletion records of replaced / conflicted attempts (phase 1 of docs/deletion.md); the log
        # lives in the same metadata store as the topic records
        self.deletion_log = deletion_log if deletion_log is not None else DeletionLog(ml.store)
        self.clock_ms = clock_ms
        self.uuid_factory = uuid_factory
        self.progress = progress  # (topic, ledger id, bytes done, bytes total)
        self.leases = leases  # per-topic leases: one runner offloads a topic at a time

    def _driver_metadata(self) -> pb.OffloadDriverMetadata:
        return self.offloader.location.driver_metadata()

    def _transaction(self, t: TopicName) -> TopicTransaction:
        return TopicTransaction(self.ml, self.deletion_log, t, clock_ms=self.clock_ms)

    def _attempt(self, ledger_id: int, uuid: str, driver: pb.OffloadDriverMetadata | None = None) -> ObjectGroup:
        """One offload attempt's object pair; its driver is the attempt's own driver metadata when known,
        else this offloader's (attempts of one ledger go to the namespace's store)."""
        dm = driver if driver is not None and driver.name else self._driver_metadata()
        return ObjectGroup(ledger_id, TYPE_OFFLOADED, uuid, driver_dict(dm))

    # -- one ledger ---------------------------------------------------------------------------

    def offload_ledger(self, topic: str | TopicName, ledger_id: int) -> LedgerOffloadResult:
        t = topic if isinstance(topic, TopicName) else TopicName.parse(topic)
        started = time.monotonic()
        res = LedgerOffloadResult(t.managed_ledger_name, ledger_id, Outcome.FAILED)
        new_uuid = str(self.uuid_factory())
        txn = self._transaction(t)
        # step 1: record our uuid before writing anything; every attempt it replaces is covered first
        step = txn.begin(self._assign(txn, ledger_id, new_uuid), "recording offload attempt")
        if not settle(res, step):
            return self._finish(res, started)
        if not step.changed:  # complete, or every entry in completed segments (PIP-76)
            res.outcome, res.uuid = Outcome.SKIPPED, context_uuid(find_ledger(step.info, ledger_id))
            return self._finish(res, started)
        res.uuid = new_uuid

        # step 2: write the objects (the offloader leaves nothing behind when it fails)
        if not self._write(res, ledger_id, new_uuid):
            return self._finish(res, started)

        # step 3: complete only if our uuid is still the ledger's
        def complete(info) -> bool:
            li = find_ledger(info, ledger_id)
            if li is None:
                raise Refusal(f"ledger {ledger_id} left topic {t.managed_ledger_name} during the offload")
            if context_uuid(li) != new_uuid:
                raise Refusal(f"another offload attempt ({context_uuid(li)}) replaced ours")
            li.offloadContext.complete = True
            li.offloadContext.timestamp = self.clock_ms()
            return True

        step = txn.commit(complete, "completing offload", lambda: self._give_back(txn, ledger_id, new_uuid))
        settle(res, step, Outcome.OFFLOADED)
        return self._finish(res, started)

    def _assign(self, txn: TopicTransaction, ledger_id: int, new_uuid: str) -> Callable[[LedgerInfo], bool]:
        """Step 1's mutation: our uuid in the ledger's OffloadContext (complete=false). Every attempt it
        replaces (the uuid there, plus legacy abandoned properties) must be covered by a durable record
        first; nothing to do (False) when the ledger is offloaded already."""
        msb, lsb = uuid_to_msb_lsb(uuidlib.UUID(new_uuid))
        name = txn.name

        def assign(info) -> bool:
            li = find_ledger(info, ledger_id)
            if li is None:
                raise Refusal(f"ledger {ledger_id} is not in topic {name} (trimmed?)")
            if li.ledgerId == info.ledgerInfo[-1].ledgerId or li.timestamp <= 0:
                raise Refusal(f"ledger {ledger_id} of {name} is the open ledger")
            if is_offloaded(li):
                return False
            replaced = [self._attempt(ledger_id, u, context_driver(li)) for u in dict.fromkeys(
                [u for u in (context_uuid(li),) if u is not None] + abandoned_uuids(li))]
            missing = [g for g in replaced if g.key not in txn.covered]
            if missing:
                raise Uncovered([g.record(name, Reason.OFFLOAD_CLEANUP, self.clock_ms()) for g in missing])
            if abandoned_uuids(li):  # legacy: the records now stand for them
                drop_properties(li, ABANDONED_PREFIX)
            ctx = li.offloadContext
            ctx.uidMsb, ctx.uidLsb = msb, lsb
            ctx.complete = False
            ctx.ClearField("timestamp")
            ctx.driverMetadata.CopyFrom(self._driver_metadata())
            return True

        return assign

    def _write(self, res: LedgerOffloadResult, ledger_id: int, new_uuid: str) -> bool:
        """Step 2: the ledger's objects from its hot copy; False (``res`` says why) when they could not be
        written."""
        try:
            handle = self.hot.open_ledger(ledger_id)
        except (HotLedgerNotFoundError, StaleHandleError) as e:
            res.outcome, res.error = Outcome.CONFLICT, f"hot-tier ledger gone: {e}"
            return False
        except TieredError as e:  # a corrupt .meta / .idx fails this ledger; the others go on
            res.error, res.error_type = f"the hot copy cannot be read: {type(e).__name__}: {e}", type(e).__name__
            return False
        try:
            cb = None
            if self.progress is not None:
                cb = lambda done, total: self.progress(res.topic, ledger_id, done, total)  # noqa: E731
            obj = self.offloader.offload(handle, new_uuid, {"managedledgername": res.topic}, progress=cb)
        except Exception as e:
            res.error, res.error_type = f"{type(e).__name__}: {e}", type(e).__name__
            return False
        finally:
            handle.close()
        res.bytes, res.blocks, res.entries = obj.data_length, obj.blocks, obj.entries
        return True

    def _give_back(self, txn: TopicTransaction, ledger_id: int, uuid: str) -> None:
        """Our attempt lost: its objects become a pending deletion (if our uuid is somehow still current
        the drain sees it in use)."""
        txn.give_back([self._attempt(ledger_id, uuid)], Reason.OFFLOAD_CONFLICT)

    # -- replacing a damaged copy -----------------------------------------------------------

    def replace_offload(self, topic: str | TopicName, ledger_id: int, damaged_uuid: str,
                        reason: Reason = Reason.REPAIR) -> LedgerOffloadResult:
        """Replace the ledger's complete offloaded copy ``damaged_uuid`` by a new one written from the hot
        copy and verified against the hot tier's CRCs (see the module docstring). Outcomes: replaced;
        no-hot-copy (nothing written: the caller reports the damaged copy as unrecoverable); conflict
        (the ledger or its offload changed meanwhile); failed / unknown as for an offload. Never deletes
        the damaged copy unless the verified replacement is made current in the same step."""
        t = topic if isinstance(topic, TopicName) else TopicName.parse(topic)
        name = t.managed_ledger_name
        started = time.monotonic()
        res = LedgerOffloadResult(name, ledger_id, Outcome.FAILED)
        new_uuid = str(self.uuid_factory())
        prop = REPLACEMENT_PREFIX + new_uuid
        txn = self._transaction(t)

        def current(info) -> LedgerInfo:
            li = find_ledger(info, ledger_id)
            if li is None:
                raise Refusal(f"ledger {ledger_id} is not in topic {name} (trimmed?)")
            if context_uuid(li) != damaged_uuid or not is_complete(li):
                raise Refusal(f"the offload of ledger {ledger_id} changed meanwhile (now {context_uuid(li)})")
            return li

        def begin(info) -> bool:
            current(info).properties.add(key=prop, value=str(self.clock_ms()))
            return True

        step = txn.begin(begin, "recording the replacement")
        if not settle(res, step):
            return self._finish(res, started)
        res.uuid = new_uuid
        li = find_ledger(step.info, ledger_id)
        damaged = self._attempt(ledger_id, damaged_uuid, context_driver(li))
        if not self._write_replacement(res, txn, ExpectedLedger.of(li, name), new_uuid, prop):
            return self._finish(res, started)

        # the damaged copy's record first (harmless if the swap loses: the drain sees it still in use)
        try:
            txn.record([damaged.record(name, reason, self.clock_ms())])
        except TieredError as e:
            res.error = f"recording the damaged copy for deletion: {e}"
            self._give_back(txn, ledger_id, new_uuid)
            self._forget_replacement(txn, ledger_id, prop)
            return self._finish(res, started)

        def swap(info) -> bool:
            li = current(info)
            if new_uuid not in replacement_uuids(li):
                raise Refusal(f"the replacement {new_uuid} of ledger {ledger_id} is no longer recorded")
            ctx = li.offloadContext
            ctx.uidMsb, ctx.uidLsb = uuid_to_msb_lsb(uuidlib.UUID(new_uuid))
            ctx.complete = True
            ctx.timestamp = self.clock_ms()
            ctx.driverMetadata.CopyFrom(self._driver_metadata())
            drop_properties(li, REPLACEMENT_PREFIX, {new_uuid})
            return True

        step = txn.commit(swap, "swapping in the replacement", lambda: self._give_back(txn, ledger_id, new_uuid))
        if not settle(res, step, Outcome.REPLACED) and isinstance(step, Refused):
            self._forget_replacement(txn, ledger_id, prop)
        return self._finish(res, started)

    def _write_replacement(self, res: LedgerOffloadResult, txn: TopicTransaction, expect: ExpectedLedger,
                           new_uuid: str, prop: str) -> bool:
        """The replacement's objects written from the hot copy and verified against the hot CRCs; False
        (``res`` says why, our objects given back, the property dropped) when that fails."""
        ledger_id = res.ledger_id
        try:
            handle = self.hot.open_ledger(ledger_id)
        except TieredError as e:
            res.outcome = Outcome.NO_HOT_COPY
            res.error = (f"no hot copy to replace it from: {e}" if isinstance(e, HotLedgerNotFoundError)
                         else f"the hot copy cannot be read: {type(e).__name__}: {e}")
            self._forget_replacement(txn, ledger_id, prop)
            return False
        try:
            try:
                obj = self.offloader.offload(handle, new_uuid, {"managedledgername": res.topic})
            except Exception as e:  # nothing left behind by the offloader
                res.error, res.error_type = f"writing the replacement: {type(e).__name__}: {e}", type(e).__name__
                self._forget_replacement(txn, ledger_id, prop)
                return False
            res.bytes, res.blocks, res.entries = obj.data_length, obj.blocks, obj.entries
            try:
                new = self.offloader.read_offloaded(ledger_id, new_uuid, expect)
                try:
                    # byte for byte the hot copy's: its messages are what the hot copy holds (no second witness)
                    verify_offloaded(new, handle.entry_crcs(), expected_sizes=handle.entry_sizes(), messages=False,
                                     expected_ranges=hot_frame_ranges(handle))
                finally:
                    new.close()
            except TieredError as e:
                res.error, res.error_type = f"the replacement does not verify: {type(e).__name__}: {e}", type(e).__name__
                self._give_back(txn, ledger_id, new_uuid)
                self._forget_replacement(txn, ledger_id, prop)
                return False
        finally:
            handle.close()
        return True

    def _forget_replacement(self, txn: TopicTransaction, ledger_id: int, prop: str) -> None:
        """Drop a replacement's property (its objects, if any, are already in the deletion log)."""
        def drop(info) -> bool:
            li = find_ledger(info, ledger_id)
            if li is None or all(kv.key != prop for kv in li.properties):
                return False
            drop_properties(li, REPLACEMENT_PREFIX, {prop[len(REPLACEMENT_PREFIX):]})
            return True

        try:
            txn.cas(drop)
        except TieredError as e:  # a stale property only keeps reconciliation from flagging its objects
            log.warning("ledger %s: could not drop %s: %s", ledger_id, prop, e)

    @staticmethod
    def _finish(res: LedgerOffloadResult, started: float) -> LedgerOffloadResult:
        res.seconds = round(time.monotonic() - started, 6)
        log_fn = log.info if res.ok else log.warning
        log_fn("offload %s ledger %s: %s%s", res.topic, res.ledger_id, res.outcome,
               f" ({res.error})" if res.error else "")
        return res

    # -- several ledgers ----------------------------------------------------------------------

    def offload_ledgers(self, topic: str | TopicName, ledger_ids: Iterable[int],
                        budget: StoreFailureBudget | None = None) -> list[LedgerOffloadResult]:
        """Oldest first, one at a time; one failure does not stop the others, unless the object store
        keeps failing (``budget`` spent: the rest are ``aborted``). With leases, the topic's lease is held
        for the whole loop; a topic leased by another runner is skipped (every ledger ``busy``)."""
        t = topic if isinstance(topic, TopicName) else TopicName.parse(topic)
        ids = sorted(ledger_ids)
        if not ids:
            return []
        if self.leases is None:
            return [self._offload_budgeted(t, lid, budget) for lid in ids]
        out: list[LedgerOffloadResult] = []
        try:
            with self.leases.hold(t, "offload") as held:
                for lid in ids:
                    out.append(self._offload_budgeted(t, lid, budget))
                    if len(out) < len(ids):
                        held.renew()
        except LeaseHeldError as e:  # held by another runner (or lost meanwhile): the rest waits for later
            out += [LedgerOffloadResult(t.managed_ledger_name, lid, Outcome.BUSY, error=str(e))
                    for lid in ids[len(out):]]
        return out

    def _offload_budgeted(self, t: TopicName, ledger_id: int, budget: StoreFailureBudget | None) -> LedgerOffloadResult:
        if budget is not None and budget.exhausted:
            return LedgerOffloadResult(t.managed_ledger_name, ledger_id, Outcome.ABORTED, error=budget.reason)
        r = self.offload_ledger(t, ledger_id)
        if budget is not None:
            budget.record(r.error_type if not r.ok else "", r.error or "")
        return r


def raise_for(results: Iterable[LedgerOffloadResult]) -> None:
    bad = [r for r in results if not r.ok]
    if bad:
        raise OffloadConflictError("; ".join(f"ledger {r.ledger_id}: {r.outcome}: {r.error}" for r in bad))
