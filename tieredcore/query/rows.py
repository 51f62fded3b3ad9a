"""Arrow rows of a topic: one per message (Pulsar's view of an entry, spec/07) or one per entry (raw).

The columns are fixed (docs/query.md). Columns are built from whole batches: a payload column is one
buffer and an offsets array (no object per row beyond what the protobuf decoder makes anyway).
Timestamps are microseconds in UTC, which is what Spark's TimestampType holds.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tieredcore.errors import MessageChecksumError, MessageFormatError
from tieredcore.formats import compression
from tieredcore.formats.messages import NATIVE_LIMIT, BadEntry, MessageColumns, decode_columns, native_columns
from tieredcore.model import Buffer, EntryBatch, Position

TS = pa.timestamp("us", tz="UTC")
PROPS = pa.map_(pa.string(), pa.string())

MESSAGE_SCHEMA = pa.schema([
    pa.field("topic", pa.string()),
    pa.field("ledger_id", pa.int64()),
    pa.field("entry_id", pa.int64()),
    pa.field("batch_index", pa.int32()),  # -1: the entry is not a batch
    pa.field("publish_time", TS),
    pa.field("event_time", TS),
    pa.field("key", pa.string()),
    pa.field("ordering_key", pa.binary()),
    pa.field("properties", PROPS),
    pa.field("producer_name", pa.string()),
    pa.field("sequence_id", pa.int64()),
    pa.field("payload", pa.binary()),
    pa.field("tier", pa.string()),
])

ENTRY_SCHEMA = pa.schema([
    pa.field("topic", pa.string()),
    pa.field("ledger_id", pa.int64()),
    pa.field("entry_id", pa.int64()),
    pa.field("entry", pa.binary()),
    pa.field("tier", pa.string()),
])


def spark_ddl(raw: bool = False, keys: bool = False) -> str:
    """The schema as Spark DDL (what the data source declares)."""
    if keys:
        return ("topic STRING, ledger_id BIGINT, entry_id BIGINT, batch_index INT, key STRING, size BIGINT, "
                "tier STRING")
    if raw:
        return "topic STRING, ledger_id BIGINT, entry_id BIGINT, entry BINARY, tier STRING"
    return ("topic STRING, ledger_id BIGINT, entry_id BIGINT, batch_index INT, publish_time TIMESTAMP, "
            "event_time TIMESTAMP, key STRING, ordering_key BINARY, properties MAP<STRING, STRING>, "
            "producer_name STRING, sequence_id BIGINT, payload BINARY, tier STRING")


def _binary(pieces: Sequence, n: int) -> pa.Array:
    """A binary column of ``pieces`` (bytes-like, none null) as one data buffer and an offsets array."""
    lengths = np.fromiter(map(len, pieces), dtype=np.int64, count=n)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] >= 2**31:  # past 32-bit offsets (a batch of huge entries): Arrow's own conversion says so
        return pa.array(list(map(bytes, pieces)), pa.binary())
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets.astype(np.int32)),
                                                  pa.py_buffer(b"".join(pieces))])


def _const(text: str, n: int) -> pa.Array:
    return pa.repeat(pa.scalar(text, pa.string()), n)


_MS_LIMIT = (2**63 - 1) // 1000  # the largest millisecond count a microsecond timestamp holds


def _ms_to_us(values: Sequence[int | None], n: int, nullable: bool = True) -> pa.Array:
    """Epoch milliseconds as timestamps (µs). A time no timestamp can hold (a producer's uint64 beyond year
    294,247) is null: Spark's TimestampType has no value for it."""
    try:
        return pc.multiply_checked(pa.array(values, pa.int64()), 1000).cast(TS)
    except (pa.ArrowInvalid, OverflowError):
        return pa.array([v * 1000 if v is not None and -_MS_LIMIT <= v <= _MS_LIMIT else None for v in values],
                        pa.int64()).cast(TS)


def message_batch(topic: str, tier: str, ledger_id: int, c: MessageColumns) -> pa.RecordBatch:
    """The rows of the messages ``c`` (decoded from entries of one ledger)."""
    n = len(c)
    cols = [
        _const(topic, n),
        pa.array(np.full(n, ledger_id, np.int64)),
        pa.array(np.array(c.entry_ids, np.int64)),
        pa.array(np.array(c.batch_index, np.int32)),
        _ms_to_us(c.publish_time, n, False),
        _ms_to_us(c.event_time, n, True),
        pa.array(c.key, pa.string()),
        pa.array(c.ordering_key, pa.binary()),
        pa.MapArray.from_arrays(pa.array(c.prop_offsets, pa.int32()), pa.array(c.prop_keys, pa.string()),
                                pa.array(c.prop_values, pa.string())),
        pa.array(c.producer_name, pa.string()),
        pa.array([(v + 2**63) % 2**64 - 2**63 for v in c.sequence_id]  # Java's long, as the C reader
                 if c.sequence_id and max(c.sequence_id) >= 2**63 else c.sequence_id, pa.int64()),
        _binary(c.payload, n),
        _const(tier, n),
    ]
    return pa.RecordBatch.from_arrays(cols, schema=MESSAGE_SCHEMA)


def _bitmap(valid: bytearray, n: int) -> tuple[pa.Buffer | None, int]:
    """A validity bitmap from one byte per value (1: valid), and the null count (no bitmap: no nulls)."""
    v = np.frombuffer(valid, np.uint8)
    nulls = n - int(np.count_nonzero(v))
    return (pa.py_buffer(np.packbits(v, bitorder="little")) if nulls else None), nulls


def _native_batch(topic: str, tier: str, ledger_id: int, first_entry: int, n: int, b: tuple) -> pa.RecordBatch:
    """The rows of what tieredcore/formats/cbatch.c's columns() read (its buffers, in its order)."""
    (eid, bidx, pub, pubv, evt, evtv, koff, kdata, kv, ooff, odata, ov, poff, pdata, seq, yoff, ydata,
     moff, mkoff, mkdata, mvoff, mvdata) = b
    buf = pa.py_buffer

    def nullable(typ: pa.DataType, values: bytearray, valid: bytearray, offsets: bytearray | None = None) -> pa.Array:
        bitmap, nulls = _bitmap(valid, n)
        bufs = [bitmap, buf(offsets), buf(values)] if offsets is not None else [bitmap, buf(values)]
        return pa.Array.from_buffers(typ, n, bufs, null_count=nulls)

    entry_ids = np.frombuffer(eid, np.int64)
    if first_entry:
        entry_ids = entry_ids + first_entry  # C counts entries from the batch's first
    m = len(mkoff) // 4 - 1
    cols = [
        _const(topic, n),
        pa.array(np.full(n, ledger_id, np.int64)),
        pa.array(entry_ids),
        pa.Array.from_buffers(pa.int32(), n, [None, buf(bidx)]),
        nullable(TS, pub, pubv),
        nullable(TS, evt, evtv),
        nullable(pa.string(), kdata, kv, koff),
        nullable(pa.binary(), odata, ov, ooff),
        pa.MapArray.from_arrays(pa.Array.from_buffers(pa.int32(), n + 1, [None, buf(moff)]),
                                pa.Array.from_buffers(pa.string(), m, [None, buf(mkoff), buf(mkdata)]),
                                pa.Array.from_buffers(pa.string(), m, [None, buf(mvoff), buf(mvdata)])),
        pa.Array.from_buffers(pa.string(), n, [None, buf(poff), buf(pdata)]),
        pa.Array.from_buffers(pa.int64(), n, [None, buf(seq)]),
        pa.Array.from_buffers(pa.binary(), n, [None, buf(yoff), buf(ydata)]),
        _const(tier, n),
    ]
    return pa.RecordBatch.from_arrays(cols, schema=MESSAGE_SCHEMA)


def message_batches(topic: str, tier: str, batch: EntryBatch, bad: list[BadEntry] | None = None,
                    verify: bool = True) -> Iterator[pa.RecordBatch]:
    """The rows of the messages of ``batch``'s entries, in position order: what :func:`message_batch` of
    :func:`decode_columns` makes (the same rows, errors and ``bad`` handling). Entries are read in C when
    tieredcore/formats/cbatch.c is built; an entry it does not take (damaged, or outside the common case) is
    read by decode_columns, the reference."""
    lid, n = batch.ledger_id, len(batch)
    if native_columns is None:
        c = decode_columns(batch, bad, verify)
        if len(c):
            yield message_batch(topic, tier, lid, c)
        return
    i = 0
    while i < n:
        stop, code, _reason, count, bufs = native_columns(batch.buf, batch.starts, batch.lengths, i, verify,
                                                          compression.inflate)
        if count:
            yield _native_batch(topic, tier, lid, batch.first_entry, count, bufs)
        if stop >= n:
            return
        if code == NATIVE_LIMIT:
            i = stop
            continue
        one = EntryBatch(lid, batch.first_entry + stop, batch.buf, batch.starts[stop : stop + 1],
                         batch.lengths[stop : stop + 1], 0, 0)
        c = decode_columns(one, bad, verify)
        if len(c):
            yield message_batch(topic, tier, lid, c)
        i = stop + 1


def entry_batch(topic: str, tier: str, batch: EntryBatch) -> pa.RecordBatch:
    """One row per entry of ``batch`` (its bytes as stored)."""
    n = len(batch)
    buf = memoryview(batch.buf)
    pieces = [buf[s : s + k] for s, k in zip(batch.starts, batch.lengths, strict=True)]
    cols = [
        _const(topic, n),
        pa.array(np.full(n, batch.ledger_id, np.int64)),
        pa.array(np.arange(batch.first_entry, batch.first_entry + n, dtype=np.int64)),
        _binary(pieces, n),
        _const(tier, n),
    ]
    return pa.RecordBatch.from_arrays(cols, schema=ENTRY_SCHEMA)



ITEM_SCHEMA = pa.schema([
    pa.field("key", pa.string()),
    pa.field("ledger_id", pa.int64()),
    pa.field("entry_id", pa.int64()),
    pa.field("batch_index", pa.int32()),
    pa.field("size", pa.int64()),
])

# entries=keys: one row per message as topic compaction sees it (tieredcore.formats.compacted.compaction_items)
KEY_SCHEMA = pa.schema([
    pa.field("topic", pa.string()),
    pa.field("ledger_id", pa.int64()),
    pa.field("entry_id", pa.int64()),
    pa.field("batch_index", pa.int32()),  # -1: the entry taken whole
    pa.field("key", pa.string()),
    pa.field("size", pa.int64()),  # 0 or less: a tombstone
    pa.field("tier", pa.string()),
])


def _python_items(buf: Buffer, starts: Sequence[int], lengths: Sequence[int], lids: np.ndarray, eids: np.ndarray,
                  rows: range, verify: bool, bad: list[BadEntry] | None) -> pa.RecordBatch:
    """compaction_items (the reference) over ``rows`` of the entries, as one batch of ITEM_SCHEMA; with
    ``bad``, an entry it refuses is recorded there instead of raised."""
    from tieredcore.formats.compacted import compaction_items

    mv = memoryview(buf)
    keys, out_l, out_e, bidx, sizes = [], [], [], [], []
    for r in rows:
        lid, eid = int(lids[r]), int(eids[r])
        try:
            items = compaction_items(mv[starts[r] : starts[r] + lengths[r]], lid, eid, verify)
        except MessageFormatError as ex:
            if bad is None:
                raise
            bad.append(BadEntry(Position(lid, eid), str(ex), isinstance(ex, MessageChecksumError)))
            continue
        for it in items:
            keys.append(it.key)
            out_l.append(lid)
            out_e.append(eid)
            bidx.append(it.position.batch_index)
            sizes.append(it.size)
    return pa.RecordBatch.from_arrays([pa.array(keys, pa.string()), pa.array(out_l, pa.int64()),
                                       pa.array(out_e, pa.int64()), pa.array(bidx, pa.int32()),
                                       pa.array(sizes, pa.int64())], schema=ITEM_SCHEMA)


def _item_batches(buf: Buffer, starts: list[int], lengths: list[int], lids: np.ndarray, eids: np.ndarray,
                  verify: bool, bad: list[BadEntry] | None = None) -> Iterator[pa.RecordBatch]:
    """Topic compaction's phase one over the entries ``buf[starts[i] : starts[i] + lengths[i]]`` at positions
    ``(lids[i], eids[i])``: every entry's compaction items (tieredcore.formats.compacted.compaction_items:
    key, position, size) as batches of ITEM_SCHEMA, in the entries' order. Read in C (cbatch.c ``columns``
    in items mode) when it is built; an entry it declines goes to compaction_items, the reference, which
    raises the exact error (or, with ``bad``, has it recorded and the entry skipped) or reads it."""
    n = len(starts)
    if native_columns is None:
        if n:
            yield _python_items(buf, starts, lengths, lids, eids, range(n), verify, bad)
        return
    i = 0
    while i < n:
        stop, code, _reason, count, b = native_columns(buf, starts, lengths, i, verify, compression.inflate, True)
        if count:
            idx = np.frombuffer(b[0], np.int64)
            bitmap, nulls = _bitmap(b[8], count)
            yield pa.RecordBatch.from_arrays([
                pa.Array.from_buffers(pa.string(), count, [bitmap, pa.py_buffer(b[6]), pa.py_buffer(b[7])],
                                      null_count=nulls),
                pa.array(lids[idx]), pa.array(eids[idx]),
                pa.Array.from_buffers(pa.int32(), count, [None, pa.py_buffer(b[1])]),
                pa.Array.from_buffers(pa.int64(), count, [None, pa.py_buffer(b[14])]),
            ], schema=ITEM_SCHEMA)
        if stop >= n:
            return
        if code == NATIVE_LIMIT:
            i = stop
            continue
        one = _python_items(buf, starts, lengths, lids, eids, range(stop, stop + 1), verify, bad)
        if one.num_rows:
            yield one
        i = stop + 1


def compaction_item_batches(ledger_ids: pa.Array, entry_ids: pa.Array, entries: pa.Array,
                            verify: bool = True) -> Iterator[pa.RecordBatch]:
    """:func:`_item_batches` over raw entries as Arrow columns (three of equal length, no nulls: what the
    data source's ``entries=raw`` rows hold)."""
    n = len(entries)
    if n == 0:
        return
    if entries.null_count:
        raise ValueError("compaction items: a raw entry is null")
    wide = pa.types.is_large_binary(entries.type)
    _, off_buf, data = entries.buffers()
    offsets = np.frombuffer(off_buf, np.int64 if wide else np.int32)[entries.offset : entries.offset + n + 1]
    starts = offsets[:-1].astype(np.int64).tolist()
    lengths = np.diff(offsets).astype(np.int64).tolist()
    yield from _item_batches(data if data is not None else b"", starts, lengths,
                             ledger_ids.to_numpy(zero_copy_only=False), entry_ids.to_numpy(zero_copy_only=False),
                             verify)


def key_batches(topic: str, tier: str, batch: EntryBatch, bad: list[BadEntry] | None = None, verify: bool = True,
                lids: np.ndarray | None = None, eids: np.ndarray | None = None) -> Iterator[pa.RecordBatch]:
    """The ``entries=keys`` rows (KEY_SCHEMA) of ``batch``'s entries: each message as topic compaction sees
    it (:func:`_item_batches`), at the batch's positions or at ``lids``/``eids`` (a compacted ledger's
    entries stand for other positions)."""
    n = len(batch)
    if lids is None or eids is None:
        lids = np.full(n, batch.ledger_id, np.int64)
        eids = np.arange(batch.first_entry, batch.first_entry + n, dtype=np.int64)
    for b in _item_batches(batch.buf, list(batch.starts), list(batch.lengths), lids, eids, verify, bad):
        k = b.num_rows
        yield pa.RecordBatch.from_arrays([_const(topic, k), b.column(1), b.column(2), b.column(3), b.column(0),
                                          b.column(4), _const(tier, k)], schema=KEY_SCHEMA)
