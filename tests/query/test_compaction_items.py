"""Topic compaction's phase one in C (tieredcore/formats/cbatch.c ``columns`` in items mode, through
tieredcore.query.rows.compaction_item_batches) against the reference, tieredcore.formats.compacted.
compaction_items (Pulsar's PublishingOrderCompactor / RawBatchConverter.extractMessageCompactionData, as
tests/lifecycle/test_topic_compaction.py pins it): the same items, or the same error, for random entries,
random SingleMessageMetadata wire format, markers, encrypted and chunked entries, and damaged entries."""

from __future__ import annotations

from array import array

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.formats.test_cbatch import batch_entry, fields, framed
from tests.formats.test_cbatch import out_messages as batch_messages
from tests.query.test_native_rows import entries as random_entries
from tests.support.wire import damage, vi
from tieredcore.errors import MessageFormatError
from tieredcore.formats import compacted, compression
from tieredcore.formats import messages as m
from tieredcore.formats.compacted import compaction_items
from tieredcore.query import rows

cbatch = pytest.importorskip("tieredcore.formats.cbatch", reason="the C extension is not built")
LEDGER = 11


def reference(es: list[bytes], first: int) -> tuple:
    """compaction_items entry by entry: the rows of ITEM_SCHEMA, or the error."""
    out = []
    try:
        for i, e in enumerate(es):
            out += [{"key": it.key, "ledger_id": LEDGER, "entry_id": first + i,
                     "batch_index": it.position.batch_index, "size": it.size}
                    for it in compaction_items(e, LEDGER, first + i)]
    except MessageFormatError as ex:
        return ("error", str(ex))
    return ("ok", out)


def native(es: list[bytes], first: int, large: bool = False, sliced: bool = False) -> tuple:
    """compaction_item_batches over the entries as the data source's raw rows hold them."""
    typ = pa.large_binary() if large else pa.binary()
    col = pa.array([b"x", *es] if sliced else es, typ)
    if sliced:  # an Arrow slice: its offsets start past the buffer's first
        col = col.slice(1)
    n = len(es)
    try:
        out = list(rows.compaction_item_batches(pa.array([LEDGER] * n, pa.int64()),
                                                pa.array(range(first, first + n), pa.int64()), col))
    except MessageFormatError as ex:
        return ("error", str(ex))
    for b in out:
        assert b.schema == rows.ITEM_SCHEMA
        b.validate(full=True)
    return ("ok", pa.Table.from_batches(out, rows.ITEM_SCHEMA).to_pylist())


def same(es: list[bytes], first: int = 0) -> tuple:
    ref = reference(es, first)
    assert native(es, first) == ref
    return ref


def test_a_batch_a_single_message_a_marker_and_placeholders() -> None:
    batch = m.encode_batch([m.OutMessage(b"v1", key="a"), m.OutMessage(b"", key="b"), m.OutMessage(b"v3"),
                            m.OutMessage(b"", key="c", compacted_out=True), m.OutMessage(b"v5", key="a")],
                           producer="p", sequence_id=1, publish_time=2)
    single = m.encode_message(m.OutMessage(b"value", key="s"), producer="p", sequence_id=9, publish_time=2,
                              codec=compression.ZLIB)
    marker = m.MessageMetadata(producer_name="p", sequence_id=1, publish_time=2, marker_type=20)
    res = same([batch, single, m.frame_entry(marker, b"")], first=5)
    assert res == ("ok", [
        {"key": "a", "ledger_id": LEDGER, "entry_id": 5, "batch_index": 0, "size": 2},
        {"key": "b", "ledger_id": LEDGER, "entry_id": 5, "batch_index": 1, "size": 0},
        {"key": None, "ledger_id": LEDGER, "entry_id": 5, "batch_index": 2, "size": 2},
        {"key": "a", "ledger_id": LEDGER, "entry_id": 5, "batch_index": 4, "size": 2},
        # a single message: its uncompressed_size, not the deflated payload's length
        {"key": "s", "ledger_id": LEDGER, "entry_id": 6, "batch_index": -1, "size": 5},
    ])


def test_a_null_partition_key_still_has_its_stored_key() -> None:
    """compaction_key reads partition_key as stored; the C reader's message rows null it, its items do not."""
    e = m.encode_batch([m.OutMessage(b"v", key="k", null_key=True)], producer="p", sequence_id=1, publish_time=2)
    assert [r["key"] for r in same([e])[1]] == [m.parse_entry(e).metadata.partition_key or
                                                 compaction_items(e, LEDGER, 0)[0].key]


def test_encrypted_and_chunked_entries_are_the_references() -> None:
    enc = m.parse_entry(m.encode_batch([m.OutMessage(b"v", key="k")], producer="p", sequence_id=1, publish_time=2))
    enc.metadata.encryption_keys.add(key="kek", value=b"x")
    chunk = m.MessageMetadata(producer_name="p", sequence_id=1, publish_time=2, partition_key="c",
                              num_chunks_from_msg=3, chunk_id=0, uncompressed_size=9)
    res = same([m.frame_entry(enc.metadata, bytes(enc.payload)), m.frame_entry(chunk, b"abc")])
    assert [(r["key"], r["batch_index"]) for r in res[1]] == [("k", -1), ("c", -1)]


def test_declined_entries_between_taken_ones_and_arrow_layouts() -> None:
    ok = m.encode_batch([m.OutMessage(b"v", key=f"k{i}") for i in range(3)], producer="p", sequence_id=1,
                        publish_time=2)
    bad_utf8 = m.frame_entry(m.MessageMetadata(producer_name="p", sequence_id=1, publish_time=2), b"x")
    es = [ok, bad_utf8, ok]
    ref = same(es, 3)
    for large in (False, True):
        for sliced in (False, True):
            assert native(es, 3, large, sliced) == ref


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(es=st.lists(random_entries(), min_size=1, max_size=4), first=st.integers(0, 2**40))
def test_random_entries(es, first) -> None:
    assert same(es, first)[0] == "ok"


@settings(max_examples=150, deadline=None)
@given(batches=st.lists(st.lists(batch_messages, min_size=1, max_size=5), min_size=1, max_size=3),
       codec=st.sampled_from([compression.NONE, compression.LZ4, compression.ZLIB, compression.ZSTD]))
def test_random_batches_with_placeholders(batches, codec) -> None:
    es = [m.encode_batch(msgs, producer="p", sequence_id=7, publish_time=42, codec=codec) for msgs in batches]
    assert same(es)[0] == "ok"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(es=st.lists(random_entries(), min_size=1, max_size=3), data=st.data())
def test_damaged_entries(es, data) -> None:
    k = data.draw(st.integers(0, len(es) - 1))
    raw = bytearray(es[k])
    damage(raw, data, 3)
    es[k] = bytes(raw)
    same(es)


@settings(max_examples=300, deadline=None)
@given(smms=st.lists(st.tuples(fields, st.sampled_from([True, True, True, False]), st.binary(max_size=6)),
                     min_size=1, max_size=3))
def test_random_wire_format(smms) -> None:
    parts = []
    for fs, with_size, payload in smms:
        body = b"".join(fs) + (vi(3, len(payload)) if with_size else b"")
        parts.append((body, payload))
    same([batch_entry(framed(*parts), len(parts))])


def test_without_the_c_reader_the_reference_reads(monkeypatch) -> None:
    e = m.encode_batch([m.OutMessage(b"v", key="k")], producer="p", sequence_id=1, publish_time=2)
    monkeypatch.setattr(rows, "native_columns", None)
    assert native([e], 0) == reference([e], 0)


# --- phase two: rewrite_entry_at (C rebatch) against rewrite_entry (the reference) ----------------------


def rewrites(e: bytes, eid: int, data: st.DataObject, retain_null_key: bool) -> None:
    """A map phase one could have built over this entry (each key at one of its positions, or absent), then
    both rewrites, with and without the C loop: the same bytes, or the same error."""
    try:
        items = compaction_items(e, LEDGER, eid)
    except MessageFormatError:
        items = []
    by_key: dict[str, list] = {}
    for it in items:
        if it.key is not None and it.size > 0:
            by_key.setdefault(it.key, []).append(it.position)
    latest = {k: data.draw(st.sampled_from(ps)) for k, ps in by_key.items() if data.draw(st.booleans())}
    at = sorted(p.batch_index for p in latest.values())
    kept = array("i", at).tobytes() if at else None

    def run(fn, *args):
        try:
            return ("ok", fn(e, LEDGER, eid, *args, retain_null_key))
        except (MessageFormatError, ValueError) as ex:
            return ("error", type(ex), str(ex))

    ref = run(compacted.rewrite_entry, latest)
    assert run(compacted.rewrite_entry_at, kept) == ref
    saved = compacted._rebatch_c
    compacted._rebatch_c = None
    try:
        assert run(compacted.rewrite_entry_at, kept) == ref
    finally:
        compacted._rebatch_c = saved


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(msgs=st.lists(batch_messages, min_size=1, max_size=6),
       codec=st.sampled_from([compression.NONE, compression.LZ4, compression.ZLIB, compression.ZSTD]),
       retain_null_key=st.booleans(), data=st.data())
def test_rewrites_of_random_batches(msgs, codec, retain_null_key, data) -> None:
    e = m.encode_batch(msgs, producer="p", sequence_id=7, publish_time=42, codec=codec)
    rewrites(e, 3, data, retain_null_key)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(e=random_entries(), retain_null_key=st.booleans(), damaged=st.booleans(), data=st.data())
def test_rewrites_of_random_and_damaged_entries(e, retain_null_key, damaged, data) -> None:
    if damaged:
        raw = bytearray(e)
        damage(raw, data, 3)
        e = bytes(raw)
    rewrites(e, 0, data, retain_null_key)


@settings(max_examples=300, deadline=None)
@given(smms=st.lists(st.tuples(fields, st.sampled_from([True, True, True, False]), st.binary(max_size=6)),
                     min_size=1, max_size=3), retain_null_key=st.booleans(), data=st.data())
def test_rewrites_of_random_wire_format(smms, retain_null_key, data) -> None:
    """Metadata the C loop copies only when upb would write the same bytes (else Python rewrites it)."""
    parts = []
    for fs, with_size, payload in smms:
        body = b"".join(fs) + (vi(3, len(payload)) if with_size else b"")
        parts.append((body, payload))
    rewrites(batch_entry(framed(*parts), len(parts)), 0, data, retain_null_key)


def test_the_c_loop_takes_what_producers_write() -> None:
    """Batches as encode_batch writes them (the producer's field order) are rewritten in C: the Python loop
    is not called."""
    e = m.encode_batch([m.OutMessage(b"v", key="a", properties=[("x", "1")], event_time=5, ordering_key=b"o"),
                        m.OutMessage(b"w", key="b"), m.OutMessage(b"")], producer="p", sequence_id=7,
                       publish_time=42)
    meta = m.parse_entry(e).metadata
    raw = bytes(m.parse_entry(e).payload)
    code, body, n = cbatch.rebatch(raw, meta.num_messages_in_batch, array("i", [1]).tobytes(), True)
    assert (code, n) == (0, 2)
    assert compacted.rewrite_entry_at(e, 1, 2, array("i", [1]).tobytes(), True) == compacted.rewrite_entry(
        e, 1, 2, {"b": m.MessageId(1, 2, 1)}, True)
