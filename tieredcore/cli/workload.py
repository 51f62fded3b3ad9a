"""Deterministic, verifiable workloads.

Payload number `seq` of a topic (its position in topic order) is a pure function of (seed, topic, seq):
a 16-byte header (seq, keyed tag) followed by a slice of a seeded pool: random bytes (incompressible),
or log-like lines with the ``text`` kind (compressible; the kind is recorded in the topic's properties).
`verify` recomputes each payload and a SHA-256 over the whole topic, which `generate` stores in the
topic record's properties (and each ledger's first sequence number in the ledger's properties).
"""

from __future__ import annotations

import hashlib
import random
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from tieredcore.errors import ValidationError

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


@dataclass(frozen=True)
class PayloadGenerator:
    seed: int
    topic: str
    min_size: int
    max_size: int
    kind: str = PAYLOAD_RANDOM  # or PAYLOAD_TEXT

    def __post_init__(self) -> None:
        if self.kind not in PAYLOADS:
            raise ValidationError(f"payload kind {self.kind!r} is not one of {', '.join(PAYLOADS)}")

    @classmethod
    def from_properties(cls, props: dict[str, str], topic: str) -> PayloadGenerator:
        """The generator of a topic `tiered generate` wrote (its topic record's properties)."""
        return cls(int(props[PROP_SEED]), topic, int(props[PROP_MIN]), int(props[PROP_MAX]),
                   props.get(PROP_PAYLOAD, PAYLOAD_RANDOM))

    @property
    def _key(self) -> int:
        return int.from_bytes(hashlib.blake2b(f"{self.seed}/{self.topic}".encode(), digest_size=8).digest(), "big")

    def size(self, seq: int) -> int:
        span = self.max_size - self.min_size + 1
        if span == 1:
            return self.min_size
        return self.min_size + (((seq + self._key) * _GOLDEN) & _MASK) % span

    def payloads(self, start: int, count: int) -> Iterator[bytes]:
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
