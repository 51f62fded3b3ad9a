"""The managed-ledger offload protocol (spec/02): crash-safe, one topic record CAS at each step.

1. CAS a fresh uuid into the ledger's OffloadContext (complete=false) before any object is written;
   an older uuid there is an abandoned attempt: it is remembered in the ledger's properties and its
   objects are cleaned up.
2. Write data then index objects.
3. CAS complete=true only if our uuid is still there; otherwise it is a conflict and our own objects
   are deleted. A metadata-store error (outcome unknown) deletes nothing: the update may have landed.
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
from tieredcore.formats.uuids import msb_lsb_to_uuid, uuid_to_msb_lsb
from tieredcore.lifecycle.planner import select_keep_bytes, select_prefix
from tieredcore.model import Position
from tieredcore.offload.offloader import LedgerOffloader
from tieredcore.stores.hot import LocalLedgerStore
from tieredcore.stores.managed_ledgers import ManagedLedgerStore, find_ledger
from tieredcore.topics import TopicName

log = logging.getLogger(__name__)

# LedgerInfo.properties key prefix remembering attempts whose objects were not yet confirmed removed
ABANDONED_PREFIX = "tiered.abandonedOffload."

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


def context_uuid(li) -> str | None:
    """The uuid recorded in a LedgerInfo's OffloadContext, if any."""
    if not li.HasField("offloadContext"):
        return None
    ctx = li.offloadContext
    if not (ctx.HasField("uidMsb") or ctx.HasField("uidLsb")):
        return None
    return str(msb_lsb_to_uuid(ctx.uidMsb, ctx.uidLsb))


def abandoned_uuids(li) -> list[str]:
    return [kv.key[len(ABANDONED_PREFIX) :] for kv in li.properties if kv.key.startswith(ABANDONED_PREFIX)]


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
    ) -> None:
        self.ml = ml
        self.hot = hot
        self.offloader = offloader
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

        # step 1: record our uuid before writing anything
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
            # every attempt whose objects are not confirmed gone: the one we replace, plus any earlier
            # one whose cleanup failed (still recorded); all are cleaned up below
            pending = abandoned_uuids(li)
            old = context_uuid(li)
            if old is not None and old not in pending:
                li.properties.add(key=ABANDONED_PREFIX + old, value=str(self.clock_ms()))
                pending.append(old)
            state["abandoned"] = pending
            ctx.uidMsb, ctx.uidLsb = msb, lsb
            ctx.complete = False
            ctx.ClearField("timestamp")
            ctx.driverMetadata.CopyFrom(self._driver_metadata())
            return True

        try:
            self.ml.update_topic(t, begin)
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
        cleaned = self._cleanup_abandoned(ledger_id, state["abandoned"])

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
            cleaned_keys = {ABANDONED_PREFIX + u for u in cleaned}
            keep = [kv for kv in li.properties if kv.key not in cleaned_keys]
            if len(keep) != len(li.properties):
                del li.properties[:]
                li.properties.extend(keep)
            return True

        try:
            self.ml.update_topic(t, complete)
        except MetadataStoreError as e:
            # the update may have landed: deleting our objects could lose the only offloaded copy
            res.outcome, res.error = OUTCOME_UNKNOWN, f"completing offload, outcome unknown: {e}"
            return self._finish(res, started)
        except TieredError as e:
            res.error = f"completing offload: {e}"
            self._delete_own(t, ledger_id, new_uuid)
            return self._finish(res, started)
        if "conflict" in state:
            res.outcome, res.error = OUTCOME_CONFLICT, state["conflict"]
            self._delete_own(t, ledger_id, new_uuid)
            return self._finish(res, started)
        res.outcome = OUTCOME_OFFLOADED
        return self._finish(res, started)

    def _cleanup_abandoned(self, ledger_id: int, uuids: Iterable[str]) -> set[str]:
        done = set()
        for u in uuids:
            try:
                self.offloader.delete_offloaded(ledger_id, u)
                done.add(u)
            except TieredError as e:
                log.warning("ledger %s: could not remove abandoned attempt %s yet: %s", ledger_id, u, e)
        return done

    def _delete_own(self, topic: TopicName, ledger_id: int, uuid: str) -> None:
        try:
            self.offloader.delete_offloaded(ledger_id, uuid)
        except TieredError as e:
            log.warning("ledger %s: could not delete conflicted attempt %s: %s", ledger_id, uuid, e)
            # the attempt that replaced ours may already have recorded (and dropped) our uuid: record
            # it again so that the leftovers stay discoverable
            self._remember_abandoned(topic, ledger_id, uuid)

    def _remember_abandoned(self, topic: TopicName, ledger_id: int, uuid: str) -> None:
        key = ABANDONED_PREFIX + uuid

        def mutate(info) -> bool:
            li = find_ledger(info, ledger_id)
            if li is None or any(kv.key == key for kv in li.properties):
                return False
            li.properties.add(key=key, value=str(self.clock_ms()))
            return True

        try:
            self.ml.update_topic(topic, mutate)
        except TieredError as e:
            log.warning("ledger %s: could not record abandoned attempt %s: %s", ledger_id, uuid, e)

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
