"""Arrow rows of a topic: one per message (Pulsar's view of an entry, spec/07) or one per entry (raw).

The columns are fixed (docs/query.md). Columns are built from whole batches: a payload column is one
buffer and an offsets array (no object per row beyond what the protobuf decoder makes anyway).
Timestamps are microseconds in UTC, which is what Spark's TimestampType holds.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from tieredcore.formats.messages import MessageColumns
from tieredcore.model import EntryBatch

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


def spark_ddl(raw: bool = False) -> str:
    """The schema as Spark DDL (what the data source declares)."""
    if raw:
        return "topic STRING, ledger_id BIGINT, entry_id BIGINT, entry BINARY, tier STRING"
    return ("topic STRING, ledger_id BIGINT, entry_id BIGINT, batch_index INT, publish_time TIMESTAMP, "
            "event_time TIMESTAMP, key STRING, ordering_key BINARY, properties MAP<STRING, STRING>, "
            "producer_name STRING, sequence_id BIGINT, payload BINARY, tier STRING")


def _binary(pieces: Sequence, n: int) -> pa.Array:
    """A binary column of ``pieces`` (bytes-like; None for null) as one data buffer and an offsets array."""
    lengths = np.fromiter((0 if p is None else len(p) for p in pieces), dtype=np.int64, count=n)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] >= 2**31:
        return pa.array([None if p is None else bytes(p) for p in pieces], pa.large_binary()).cast(pa.binary())
    data = b"".join(p for p in pieces if p is not None)
    nulls = [i for i, p in enumerate(pieces) if p is None]
    validity = None
    if nulls:
        mask = np.ones(n, dtype=bool)
        mask[nulls] = False
        validity = pa.array(mask).buffers()[1]
    return pa.Array.from_buffers(pa.binary(), n, [validity, pa.py_buffer(offsets.astype(np.int32)),
                                                  pa.py_buffer(data)], null_count=len(nulls))


def _const(text: str, n: int) -> pa.Array:
    return pa.repeat(pa.scalar(text, pa.string()), n)


def _ms_to_us(values: Sequence[int | None], n: int, nullable: bool) -> pa.Array:
    if not nullable:
        a = np.fromiter(values, dtype=np.int64, count=n) * 1000
        return pa.array(a, TS)
    return pa.array([None if v is None else v * 1000 for v in values], TS)


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
        pa.array(c.sequence_id, pa.int64()),
        _binary(c.payload, n),
        _const(tier, n),
    ]
    return pa.RecordBatch.from_arrays(cols, schema=MESSAGE_SCHEMA)


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
