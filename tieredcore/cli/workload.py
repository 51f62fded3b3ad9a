"""Deterministic, verifiable workloads.

Entry number `seq` of a topic (its position in topic order) is a pure function of (seed, topic, seq) and
the workload's shape, all recorded in the topic record's properties. By default it is a Pulsar entry
(spec/07, :class:`MessageShape`): one message, or a batch of them, whose payloads (adding up to the
entry size) are slices of a seeded pool, with keys from a key space, properties, event times, sequence
ids, a compression codec and optionally broker entry metadata. A raw workload (``--raw``, and every topic
generated before messages) has opaque entries: a 16-byte header (seq, keyed tag) and a slice of the pool.
The pool holds random bytes (incompressible), or log-like lines with the ``text`` kind (compressible).
`verify` recomputes each entry and a SHA-256 over the whole topic, which `generate` stores in the topic
record's properties (and each ledger's first sequence number in the ledger's properties).
"""

from __future__ import annotations

import hashlib
import random
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from tieredcore.errors import ValidationError
from tieredcore.formats import compression
from tieredcore.formats.messages import BrokerEntryMetadata, OutMessage, encode_batch, encode_message

_POOL_SIZE = 8 * 1024 * 1024 + 4096
_HDR = struct.Struct(">QQ")
_GOLDEN = 0x9E3779B97F4A7C15
_MASK = (1 << 64) - 1

PROP_SEED = "tiered.workload.seed"
PROP_MIN = "tiered.workload.minSize"
PROP_MAX = "tiered.workload.maxSize"
PROP_COUNT = "tiered.workload.count"
PROP_SHA = "tiered.workload.sha256"
# on each LedgerInfo: the workload sequence number of the ledger's first entry, so a ledger can be
# verified on its own (after a retention trim the topic no longer starts at #0)
PROP_FIRST_SEQ = "tiered.workload.firstSeq"
# the payload kind when not random bytes ("text": log-like lines that compress, for zstd namespaces)
PROP_PAYLOAD = "tiered.workload.payload"
PAYLOAD_RANDOM, PAYLOAD_TEXT = "random", "text"
PAYLOADS = (PAYLOAD_RANDOM, PAYLOAD_TEXT)
# the shape of a Pulsar-message workload (absent: raw entries)
PROP_FORMAT = "tiered.workload.format"
FORMAT_PULSAR = "pulsar"
PROP_BATCH = "tiered.workload.batch"
PROP_CODECS = "tiered.workload.compression"
PROP_KEYS = "tiered.workload.keys"
PROP_PROPERTIES = "tiered.workload.properties"
PROP_BROKER_METADATA = "tiered.workload.brokerEntryMetadata"
PROP_PUBLISH_START = "tiered.workload.publishTime0"
PROP_PUBLISH_STEP = "tiered.workload.publishStep"
PRODUCER = "tiered-generate"
MAX_BATCH = 1000  # Pulsar's producer default batchingMaxMessages

_pools: dict[tuple[int, str], bytes] = {}


def _text_pool(rnd: random.Random) -> bytes:
    """Log-like lines over a small seeded vocabulary: compresses about 3:1 with zstd, like real logs."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = ["".join(rnd.choices(letters, k=rnd.randint(2, 9))) for _ in range(400)]
    vocab += [f"{rnd.randrange(10**6)}" for _ in range(100)] + ["INFO", "WARN", "DEBUG", "ERROR", "id=", "ms"]
    words = rnd.choices(vocab, k=_POOL_SIZE // 5)
    for i in range(0, len(words), 12):  # about a line per twelve words
        words[i] = "\n" + words[i]
    text = " ".join(words).encode()
    while len(text) < _POOL_SIZE:
        text += text[: _POOL_SIZE - len(text)]
    return text[:_POOL_SIZE]


def _pool(seed: int, kind: str = PAYLOAD_RANDOM) -> bytes:
    p = _pools.get((seed, kind))
    if p is None:
        rnd = random.Random(seed)
        p = _pools[(seed, kind)] = _text_pool(rnd) if kind == PAYLOAD_TEXT else rnd.randbytes(_POOL_SIZE)
    return p


def parse_size_range(text: str) -> tuple[int, int]:
    """'1024' or '100-4096' (bytes; K/M suffixes allowed)."""

    def one(s: str) -> int:
        s = s.strip().upper()
        mult = 1
        if s.endswith("K"):
            mult, s = 1024, s[:-1]
        elif s.endswith("M"):
            mult, s = 1024 * 1024, s[:-1]
        try:
            return int(s) * mult
        except ValueError as e:
            raise ValidationError(f"entry size {text!r}: expected bytes like 1024, 64K or 100-4096") from e

    lo, sep, hi = text.partition("-")
    a = one(lo)
    b = one(hi) if sep else a  # "100-" is malformed, not "100"
    if a < 0 or b < a:
        raise ValidationError(f"entry size range {text!r} is empty or negative")
    if b > 4 * 1024 * 1024:
        raise ValidationError(f"entry size {b} too large for the generator (max 4M)")
    return a, b


def parse_batch_range(text: str) -> tuple[int, int]:
    """'10' or '1-100': messages per entry; 0 is a message sent without batching."""
    lo, sep, hi = text.strip().partition("-")
    try:
        a = int(lo)
        b = int(hi) if sep else a
    except ValueError:
        raise ValidationError(f"--batch {text!r}: expected a count like 10 or a range like 1-100") from None
    if a < 0 or b < a or b > MAX_BATCH:
        raise ValidationError(f"--batch {text!r}: counts from 0 (no batching) to {MAX_BATCH}, low before high")
    return a, b


def parse_codecs(text: str) -> tuple[int, ...]:
    """'NONE', 'ZSTD', 'LZ4,ZLIB' (used entry by entry in turn) or 'mix' (all five in turn)."""
    if text.strip().lower() == "mix":
        return tuple(compression.NAMES)
    return tuple(compression.codec(part.strip()) for part in text.split(","))


@dataclass(frozen=True)
class MessageShape:
    """What the messages of a Pulsar workload look like; recorded in the topic record (``properties``)."""

    publish_start_ms: int  # entry #0's publish time; entry n's is start + n * step
    publish_step_ms: int = 1
    batch_min: int = 1  # messages per entry; 0 is a message sent without batching
    batch_max: int = 10
    codecs: tuple[int, ...] = (compression.NONE,)  # used entry by entry in turn
    keys: int = 100  # key space (0: no keys)
    properties: int = 2  # properties per message
    broker_entry_metadata: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.batch_min <= self.batch_max <= MAX_BATCH:
            raise ValidationError(f"batch sizes {self.batch_min}-{self.batch_max}: from 0 to {MAX_BATCH}")
        if not self.codecs or self.keys < 0 or self.properties < 0 or self.publish_step_ms < 0:
            raise ValidationError("a message shape needs a codec and no negative key space, properties or step")
        for c in self.codecs:
            compression.codec(c)

    def to_properties(self) -> dict[str, str]:
        return {PROP_FORMAT: FORMAT_PULSAR, PROP_BATCH: f"{self.batch_min}-{self.batch_max}",
                PROP_CODECS: ",".join(compression.name(c) for c in self.codecs), PROP_KEYS: str(self.keys),
                PROP_PROPERTIES: str(self.properties),
                PROP_BROKER_METADATA: str(self.broker_entry_metadata).lower(),
                PROP_PUBLISH_START: str(self.publish_start_ms), PROP_PUBLISH_STEP: str(self.publish_step_ms)}

    @classmethod
    def from_properties(cls, props: dict[str, str]) -> MessageShape | None:
        """The shape a topic record names; None for a raw workload."""
        if props.get(PROP_FORMAT) != FORMAT_PULSAR:
            return None
        lo, hi = parse_batch_range(props[PROP_BATCH])
        return cls(int(props[PROP_PUBLISH_START]), int(props[PROP_PUBLISH_STEP]), lo, hi,
                   parse_codecs(props[PROP_CODECS]), int(props[PROP_KEYS]), int(props[PROP_PROPERTIES]),
                   props[PROP_BROKER_METADATA] == "true")


@dataclass(frozen=True)
class PayloadGenerator:
    seed: int
    topic: str
    min_size: int
    max_size: int
    kind: str = PAYLOAD_RANDOM  # or PAYLOAD_TEXT
    messages: MessageShape | None = None  # None: raw entries

    def __post_init__(self) -> None:
        if self.kind not in PAYLOADS:
            raise ValidationError(f"payload kind {self.kind!r} is not one of {', '.join(PAYLOADS)}")

    @classmethod
    def from_properties(cls, props: dict[str, str], topic: str) -> PayloadGenerator:
        """The generator of a topic `tiered generate` wrote (its topic record's properties)."""
        return cls(int(props[PROP_SEED]), topic, int(props[PROP_MIN]), int(props[PROP_MAX]),
                   props.get(PROP_PAYLOAD, PAYLOAD_RANDOM), MessageShape.from_properties(props))

    @property
    def _key(self) -> int:
        return int.from_bytes(hashlib.blake2b(f"{self.seed}/{self.topic}".encode(), digest_size=8).digest(), "big")

    def size(self, seq: int) -> int:
        span = self.max_size - self.min_size + 1
        if span == 1:
            return self.min_size
        return self.min_size + (((seq + self._key) * _GOLDEN) & _MASK) % span

    def payloads(self, start: int, count: int) -> Iterator[bytes]:
        """Entries ``start..start+count-1`` of the workload (Pulsar entries, or raw ones)."""
        if self.messages is not None:
            return self._entries(start, count, self.messages)
        return self._raw(start, count)

    def _raw(self, start: int, count: int) -> Iterator[bytes]:
        pool, key = _pool(self.seed, self.kind), self._key
        lo, span = self.min_size, self.max_size - self.min_size + 1
        pack = _HDR.pack
        limit = _POOL_SIZE - 4096 - self.max_size
        for seq in range(start, start + count):
            mix = ((seq + key) * _GOLDEN) & _MASK
            n = lo if span == 1 else lo + mix % span
            head = pack(seq, mix)
            if n <= 16:
                yield head[:n]
            else:
                off = mix % limit if limit > 0 else 0
                yield head + pool[off : off + n - 16]

    def payload(self, seq: int) -> bytes:
        return next(self.payloads(seq, 1))

    def _entries(self, start: int, count: int, shape: MessageShape) -> Iterator[bytes]:
        """Pulsar entries: the entry size split over its messages; everything else drawn from ``mix``."""
        pool, key = _pool(self.seed, self.kind), self._key
        lo, span = self.min_size, self.max_size - self.min_size + 1
        limit = max(_POOL_SIZE - self.max_size, 1)
        per_entry = max(shape.batch_max, 1)  # sequence ids: entry n's messages from n * per_entry on
        codecs = shape.codecs
        for seq in range(start, start + count):
            mix = ((seq + key) * _GOLDEN) & _MASK
            size = lo if span == 1 else lo + mix % span
            n = shape.batch_min + (mix >> 20) % (shape.batch_max - shape.batch_min + 1)
            published = shape.publish_start_ms + seq * shape.publish_step_ms
            msgs = []
            for k in range(max(n, 1)):
                part = size // max(n, 1) + (k < size % max(n, 1))
                h = ((mix + k) * _GOLDEN) & _MASK
                off = h % limit
                props = [("workload.entry", str(seq)), ("workload.index", str(k))]
                props += [(f"p{i}", f"{(h >> (i % 48)) & 0xFFFF:04x}") for i in range(2, shape.properties)]
                msgs.append(OutMessage(
                    payload=pool[off : off + part], properties=props[: shape.properties],
                    key=f"key-{(h >> 8) % shape.keys}" if shape.keys else None,
                    event_time=max(published - (h >> 32) % 5000, 1)))
            broker = None
            if shape.broker_entry_metadata:  # as the broker's timestamp and index interceptors write it
                broker = BrokerEntryMetadata(broker_timestamp=published + (mix >> 40) % 7,
                                             index=seq * per_entry + len(msgs) - 1)
            codec = codecs[seq % len(codecs)]
            if n:
                yield encode_batch(msgs, producer=PRODUCER, sequence_id=seq * per_entry, publish_time=published,
                                   codec=codec, broker=broker)
            else:  # batching off: the message's own metadata
                yield encode_message(msgs[0], producer=PRODUCER, sequence_id=seq * per_entry,
                                     publish_time=published, codec=codec, broker=broker)


class Digest:
    """Order-sensitive digest of a topic's payloads."""

    def __init__(self) -> None:
        self._h = hashlib.sha256()
        self.count = 0

    def update_many(self, payloads: Iterable[bytes]) -> None:
        upd = self._h.update
        n = 0
        for p in payloads:
            upd(len(p).to_bytes(4, "big"))
            upd(p)
            n += 1
        self.count += n

    def hexdigest(self) -> str:
        return self._h.hexdigest()
