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
