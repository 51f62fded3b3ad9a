"""Topic writer: appends to the newest hot-tier ledger and rolls over by entries, bytes or age.

Order of operations (crash-safe): a new ledger is created in the hot tier, then added to the topic
record (open: timestamp 0). A rollover seals the hot ledger, then records entries/size/timestamp in the
topic record. A writer that finds the newest listed ledger still open (its predecessor died) seals it
with whatever the hot tier recovered before starting a new one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from tieredcore.clock import now_ms
from tieredcore.errors import HotLedgerNotFoundError, TopicNotFoundError, ValidationError
from tieredcore.formats.proto import MLDataFormats_pb2 as pb
from tieredcore.hot.tier import HotTier, LedgerWriter
from tieredcore.meta.managed_ledgers import ManagedLedgerStore, find_ledger
from tieredcore.model import Position
from tieredcore.names import TopicName


def ledger_custom_metadata(topic: TopicName) -> dict[str, bytes]:
    """Custom metadata of a managed-ledger ledger (docs/metadata.md); two-phase deletion checks it."""
    return {
        "application": b"pulsar",
        "component": b"managed-ledger",
        "pulsar/managed-ledger": topic.managed_ledger_name.encode(),
    }


class TopicWriter:
    def __init__(
        self,
        ml: ManagedLedgerStore,
        hot: HotTier,
        topic: str | TopicName,
        *,
        max_entries: int = 50_000,
        max_bytes: int = 256 * 1024 * 1024,
        max_age_ms: int | None = None,
        clock_ms: Callable[[], int] = now_ms,
    ) -> None:
        if max_entries <= 0 or max_bytes <= 0:
            raise ValidationError("rollover limits must be positive")
        self.ml = ml
        self.hot = hot
        self.topic = topic if isinstance(topic, TopicName) else TopicName.parse(topic)
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.max_age_ms = max_age_ms
        self.clock_ms = clock_ms
        self._ledger: LedgerWriter | None = None
        self._opened_at = 0
        self._open()

    # -- lifecycle ----------------------------------------------------------------------------

    def _open(self) -> None:
        try:
            info, _ = self.ml.get_topic(self.topic)
        except TopicNotFoundError:
            self.ml.create_topic(self.topic)
            info, _ = self.ml.get_topic(self.topic)
        if info.ledgerInfo and info.ledgerInfo[-1].timestamp <= 0:
            self._seal_recorded(info.ledgerInfo[-1].ledgerId)
        self._new_ledger()

    def _seal_recorded(self, ledger_id: int) -> None:
        """Seal a ledger a dead writer left open and record what the hot tier recovered."""
        try:
            md = self.hot.seal_ledger(ledger_id)  # cuts a torn tail, then seals
            lac, length = md.last_entry_id, md.length
        except HotLedgerNotFoundError:
            lac, length = -1, 0
        self._record_close(ledger_id, lac + 1, length)

    def _record_close(self, ledger_id: int, entries: int, size: int) -> None:
        ts = self.clock_ms()

        def mutate(info) -> bool:
            li = find_ledger(info, ledger_id)
            if li is None:
                return False
            if entries == 0 and li.ledgerId == info.ledgerInfo[-1].ledgerId:
                # an empty ledger carries nothing: drop it rather than keep an empty sealed ledger
                del info.ledgerInfo[-1]
                return True
            li.entries, li.size, li.timestamp = entries, size, max(ts, 1)
            return True

        self.ml.update_topic(self.topic, mutate)
        if entries == 0:
            self.hot.delete_ledger(ledger_id)

    def _new_ledger(self) -> None:
        led = self.hot.create_ledger(ledger_custom_metadata(self.topic), ctime_ms=self.clock_ms())

        def mutate(info) -> bool:
            info.ledgerInfo.append(pb.ManagedLedgerInfo.LedgerInfo(ledgerId=led.ledger_id, timestamp=0))
            return True

        self.ml.update_topic(self.topic, mutate)
        self._ledger = led
        self._opened_at = self.clock_ms()

    def rollover(self) -> None:
        led = self._ledger
        if led is None:
            raise ValidationError(f"writer of {self.topic} is closed")
        if led.last_add_confirmed < 0:
            return
        md = led.close()
        self._ledger = None
        self._record_close(led.ledger_id, md.entries, md.length)
        self._new_ledger()

    def close(self, seal: bool = True) -> None:
        """Stop writing. seal=True closes the current ledger (empty ones are dropped); seal=False
        leaves it open, as a live broker would have it."""
        led = self._ledger
        if led is None:
            return
        self._ledger = None
        if seal:
            md = led.close()
            self._record_close(led.ledger_id, md.entries, md.length)
        else:
            led.release()

    def __enter__(self) -> TopicWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- appends ------------------------------------------------------------------------------

    @property
    def current_ledger_id(self) -> int:
        if self._ledger is None:
            raise ValidationError(f"writer of {self.topic} is closed")
        return self._ledger.ledger_id

    def _full(self) -> bool:
        led = self._ledger
        assert led is not None
        if led.last_add_confirmed + 1 >= self.max_entries or led.length >= self.max_bytes:
            return True
        return self.max_age_ms is not None and self.clock_ms() - self._opened_at >= self.max_age_ms

    def append(self, data: bytes) -> Position:
        return self.append_many([data])[-1]

    def append_many(self, payloads: Iterable[bytes]) -> list[Position]:
        """Append in order; rolls over whenever a limit is reached. Bulk: one write per ledger chunk."""
        out: list[Position] = []
        batch: list[bytes] = []
        for p in payloads:
            batch.append(p)
            if len(batch) >= 4096:
                out.extend(self._append_batch(batch))
                batch = []
        if batch:
            out.extend(self._append_batch(batch))
        return out

    def _append_batch(self, batch: Sequence[bytes]) -> list[Position]:
        out: list[Position] = []
        i = 0
        while i < len(batch):
            if self._ledger is None:
                raise ValidationError(f"writer of {self.topic} is closed")
            if self._full():
                self.rollover()
            led = self._ledger
            room_entries = self.max_entries - (led.last_add_confirmed + 1)
            room_bytes = self.max_bytes - led.length
            j, size = i, 0
            while j < len(batch) and j - i < room_entries and (j == i or size + len(batch[j]) <= room_bytes):
                size += len(batch[j])
                j += 1
            first = led.last_add_confirmed + 1
            last = led.append_many(batch[i:j])
            out.extend(Position(led.ledger_id, e) for e in range(first, last + 1))
            i = j
        return out
