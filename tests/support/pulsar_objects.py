"""Objects as Pulsar's blob-store offloader writes them, built here independently of this project's writer.

Sources (apache/pulsar, tiered-storage/jcloud/src/main/java/org/apache/bookkeeper/mledger/offload/jcloud/impl/):

- ``BlobStoreManagedLedgerOffloader.offload``: one multipart upload of the data object
  ``{uuid}-ledger-{id}``, block *i* is part *i + 1*, each block ``calculateBlockSize(maxBlockSize, …)``
  bytes; then the index ``{uuid}-ledger-{id}-index`` with one PUT. Both carry the offloader's user
  metadata plus ``s3managedledgeroffloaderformatversion = 1`` (``DataBlockUtils.addVersionInfo``); current
  brokers add ``role`` (``data`` / ``index``) and the ``extraMetadata`` the managed ledger passes
  (``ManagedLedgerName``): tests/support/pulsar_cluster.py writes those (:func:`write_data`, :func:`write_index`).
- ``BlockAwareSegmentInputStreamImpl``: a block is the 128-byte header (``DataBlockHeaderImpl``: magic
  ``0xFBDBABCB``, header length, block length, first entry id as longs, zeros), the entries as
  ``[int32 length][int64 entry id][payload]`` while the next one fits, then ``0xFEDCDEAD`` repeated;
  ``calculateBlockSize`` = min(maxBlockSize, 12 * (LAC - first + 1) + (ledger length - bytes written) + 128).
- ``OffloadIndexBlockImpl.toStream``: magic ``0xDE47DE47``, index length (int), data object length, data
  header length (longs), entry count, metadata length (ints), the ledger metadata, then per block
  ``[long firstEntryId][int partId][long offset]`` — and nothing after: no checkpoints, no checksums.
"""

from __future__ import annotations

import struct
import uuid as uuidlib
from collections.abc import Sequence
from dataclasses import dataclass

from tieredcore.formats.ledger_metadata import encode_ledger_metadata
from tieredcore.model import STATE_CLOSED, LedgerMetadata

DATA_MAGIC = 0xFBDBABCB
INDEX_MAGIC = 0xDE47DE47
HEADER = 128
PADDING = bytes.fromhex("fedcdead")
# the broker's offloader user metadata (LedgerOffloader's keys, lower-cased as S3 returns them)
BROKER_METADATA = {"s3managedledgeroffloadersoftwareversion": "3.0.0",
                   "s3managedledgeroffloadersoftwaregitsha": "0000000",
                   "pulsarclustername": "standalone"}


@dataclass(frozen=True)
class PulsarPair:
    uuid: str
    ledger_id: int
    data_key: str
    index_key: str
    data: bytes
    index: bytes
    blocks: int


def block_size(max_block: int, lac: int, first: int, ledger_length: int, written: int) -> int:
    return min(max_block, 12 * (lac - first + 1) + (ledger_length - written) + HEADER)


def build(payloads: Sequence[bytes], max_block: int = 64 * 1024 * 1024, *, ledger_id: int = 1,
          uuid: str | None = None, ctime: int = 0, custom: dict[str, bytes] | None = None) -> PulsarPair:
    """The data and index bytes Pulsar's offloader writes for a sealed ledger of ``payloads``."""
    u = uuid or str(uuidlib.uuid4())
    lac, length = len(payloads) - 1, sum(map(len, payloads))
    blocks: list[bytes] = []
    index_entries: list[tuple[int, int, int]] = []
    first = written = offset = 0
    while first <= lac:
        size = block_size(max_block, lac, first, length, written)
        body = bytearray(struct.pack(">Iqqq", DATA_MAGIC, HEADER, size, first) + bytes(HEADER - 28))
        e = first
        while e <= lac and len(body) + 12 + len(payloads[e]) <= size:
            body += struct.pack(">iq", len(payloads[e]), e) + payloads[e]
            written += len(payloads[e])
            e += 1
        if e == first:
            raise ValueError(f"entry {first} does not fit a block of {size} bytes")
        pad = size - len(body)
        body += (PADDING * (pad // 4 + 1))[:pad]
        index_entries.append((first, len(blocks) + 1, offset))
        blocks.append(bytes(body))
        offset += size
        first = e
    md = encode_ledger_metadata(LedgerMetadata(ledger_id, STATE_CLOSED, lac, length, ctime, dict(custom or {})))
    n = len(index_entries)
    head = struct.pack(">IIqqii", INDEX_MAGIC, 32 + len(md) + 20 * n, offset, HEADER, n, len(md))
    index = head + md + b"".join(struct.pack(">qiq", *x) for x in index_entries)
    return PulsarPair(u, ledger_id, f"{u}-ledger-{ledger_id}", f"{u}-ledger-{ledger_id}-index",
                      b"".join(blocks), index, len(blocks))


def write(store, pair: PulsarPair, prefix: str = "", metadata: dict[str, str] | None = None) -> None:
    """Upload the pair as the offloader does: the data object as one multipart upload (block i = part
    i + 1), then the index with one PUT; the broker's user metadata and the format version on both."""
    md = BROKER_METADATA if metadata is None else metadata
    write_data(store, pair, prefix, md)
    write_index(store, pair, prefix, md)


def write_data(store, pair: PulsarPair, prefix: str, metadata: dict[str, str]) -> None:
    """The data object alone: one multipart upload, block i = part i + 1, with ``metadata`` and the
    format version (what exists while the offloader has not written the index yet)."""
    md = {**metadata, "s3managedledgeroffloaderformatversion": "1"}
    dkey = prefix + pair.data_key
    upload = store.initiate_multipart(dkey, md)
    parts = []
    at = 0
    for i in range(pair.blocks):
        size = struct.unpack_from(">q", pair.data, at + 12)[0]
        parts.append(store.upload_part(dkey, upload, i + 1, pair.data[at:at + size]))
        at += size
    store.complete_multipart(dkey, upload, parts)


def write_index(store, pair: PulsarPair, prefix: str, metadata: dict[str, str]) -> None:
    """The index object: one PUT with ``metadata`` and the format version."""
    store.put(prefix + pair.index_key, pair.index, {**metadata, "s3managedledgeroffloaderformatversion": "1"})


# -- Pulsar messages inside the entries, and damage planted in them ------------------------------


def message_entries(count: int, payload_size: int = 200, *, batch_every: int = 3, seed: int = 0) -> list[bytes]:
    """``count`` entries as a broker stores them (tieredcore.formats.messages' encoders, which follow
    Pulsar's ``Commands.serializeMetadataAndPayload`` and its batch container: tests/formats/test_messages.py
    holds the vectors): every ``batch_every``-th entry a batch of three messages, the others single
    messages, each with a key and a property, payloads of ``payload_size`` bytes."""
    import random

    from tieredcore.formats.messages import OutMessage, encode_batch, encode_message

    rng = random.Random(seed)
    out = []
    for e in range(count):
        msgs = [OutMessage(rng.randbytes(payload_size), key=f"k{(e + i) % 7}", properties={"n": str(e)})
                for i in range(3 if e % batch_every == batch_every - 1 else 1)]
        kw = {"producer": "standalone-0-1", "sequence_id": 3 * e, "publish_time": 1_700_000_000_000 + e}
        out.append(encode_batch(msgs, **kw) if len(msgs) > 1 else encode_message(msgs[0], **kw))
    return out


def entry_span(data: bytes | bytearray, entry_id: int) -> tuple[int, int]:
    """(offset, length) of entry ``entry_id``'s payload in a V1 data object (the frames walked block by
    block, as ``BlockAwareSegmentInputStreamImpl`` lays them out)."""
    at = 0
    while at < len(data):
        magic, _, size, first = struct.unpack_from(">Iqqq", data, at)
        assert magic == DATA_MAGIC, f"no block header at {at}"
        pos = at + HEADER
        while pos + 12 <= at + size:
            n, eid = struct.unpack_from(">iq", data, pos)
            if n < 0 or eid < first:  # the padding (0xFEDCDEAD reads as a negative length)
                break
            if eid == entry_id:
                return pos + 12, n
            pos += 12 + n
        at += size
    raise KeyError(f"entry {entry_id} is not in the object")


def flip_payload_byte(data: bytearray, entry_id: int, back: int = 1) -> None:
    """Flip a bit of entry ``entry_id``'s last-but-``back - 1`` byte: inside a message's payload (or its
    compressed batch), so its CRC32C fails while every frame, block and index still holds."""
    start, n = entry_span(data, entry_id)
    data[start + n - back] ^= 0x10
