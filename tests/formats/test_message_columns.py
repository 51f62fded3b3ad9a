"""decode_columns (the scan's decoder) returns exactly what decode_entries returns, read through Message's
properties: the same messages, fields, errors and bad entries, for any entries (hypothesis)."""

from __future__ import annotations

import struct
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.formats.test_messages import entry_batch, out_messages
from tieredcore.formats import compression
from tieredcore.formats import messages as m


def as_columns(msgs: list[m.Message]) -> list[tuple]:
    return [(g.entry_id, g.batch_index, g.publish_time, g.event_time, g.key, g.ordering_key,
             tuple(g.properties.items()), g.producer_name, g.sequence_id, bytes(g.payload)) for g in msgs]


def columns_rows(c: m.MessageColumns) -> list[tuple]:
    o = c.prop_offsets
    return [(c.entry_ids[i], c.batch_index[i], c.publish_time[i], c.event_time[i], c.key[i], c.ordering_key[i],
             tuple(zip(c.prop_keys[o[i]:o[i + 1]], c.prop_values[o[i]:o[i + 1]], strict=True)),
             c.producer_name[i], c.sequence_id[i], bytes(c.payload[i])) for i in range(len(c))]


entries = st.tuples(st.lists(out_messages, min_size=1, max_size=5), st.booleans(),
                    st.sampled_from(sorted(compression.NAMES)), st.integers(0, 2**40), st.integers(0, 2**50),
                    st.none() | st.integers(0, 400))  # where to flip a byte (None: a sound entry)


def build(spec) -> bytes:
    msgs, batched, codec, seq, published, flip = spec
    kw = dict(producer="p", sequence_id=seq, publish_time=published, codec=codec)
    e = bytearray(m.encode_batch(msgs, **kw) if batched else m.encode_message(msgs[0], **kw))
    if flip is not None:
        e[2 + flip % (len(e) - 2)] ^= 0x41
    return bytes(e)


def _not_text(g: m.Message) -> bool:
    """A string field upb handed back as bytes (not UTF-8): decode_entries passes it on, decode_columns,
    whose string columns cannot hold it, calls the entry damaged."""
    return (isinstance(g.key, bytes) or isinstance(g.producer_name, bytes)
            or any(isinstance(x, bytes) for kv in g.properties.items() for x in kv))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(specs=st.lists(entries, min_size=1, max_size=6), verify=st.booleans())
def test_columns_equal_the_messages(tmp_path_factory, specs, verify):
    batch = entry_batch(tmp_path_factory.mktemp("c"), [build(s) for s in specs])
    bad_a: list[m.BadEntry] = []
    bad_b: list[m.BadEntry] = []
    msgs = m.decode_entries(batch, bad_a, verify)
    not_text = sorted({g.entry_id for g in msgs if _not_text(g)})
    assert columns_rows(m.decode_columns(batch, bad_b, verify)) == as_columns(
        [g for g in msgs if g.entry_id not in not_text])
    assert [b for b in bad_b if b.position.entry_id not in not_text] == bad_a
    assert [b.position.entry_id for b in bad_b if b.reason.endswith("is not UTF-8")] == not_text
    try:
        want: list | Exception = as_columns(m.decode_entries(batch, verify=verify))
    except m.MessageFormatError as e:
        want = e
    try:
        got: list | Exception = columns_rows(m.decode_columns(batch, verify=verify))
    except m.MessageFormatError as e:
        got = e
    first_bad = min([*not_text, *([want.position.entry_id] if isinstance(want, Exception) else [])], default=None)
    if first_bad is not None and first_bad in not_text:
        assert isinstance(got, m.MessageFormatError) and got.position.entry_id == first_bad
        assert str(got).endswith("is not UTF-8")
    elif isinstance(want, Exception):
        assert type(got) is type(want) and str(got) == str(want)
    else:
        assert got == want


def test_a_repeated_property_key_keeps_its_last_value(tmp_path: Path):
    smm = m.SingleMessageMetadata(payload_size=2)
    for k, v in (("a", "1"), ("b", "2"), ("a", "3")):
        smm.properties.add(key=k, value=v)
    s = smm.SerializeToString()
    meta = m.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1, num_messages_in_batch=1)
    md = meta.SerializeToString()
    body = struct.pack(">i", len(md)) + md + struct.pack(">i", len(s)) + s + b"xy"
    batch = entry_batch(tmp_path, [body])
    (row,) = columns_rows(m.decode_columns(batch))
    assert row[6] == (("a", "3"), ("b", "2")) == tuple(m.decode_entries(batch)[0].properties.items())


def test_singles_without_their_own_sequence_id_or_event_time_take_the_entrys(tmp_path: Path):
    """Older clients leave them out of SingleMessageMetadata (RawMessageImpl falls back to the entry's)."""
    smms = [m.SingleMessageMetadata(payload_size=1), m.SingleMessageMetadata(payload_size=1, event_time=9,
                                                                             sequence_id=70)]
    body = b"".join(struct.pack(">i", len(s := x.SerializeToString())) + s + b"z" for x in smms)
    meta = m.MessageMetadata(producer_name="p", sequence_id=40, publish_time=1, event_time=5, num_messages_in_batch=2)
    md = meta.SerializeToString()
    batch = entry_batch(tmp_path, [struct.pack(">i", len(md)) + md + body])
    rows = columns_rows(m.decode_columns(batch))
    assert rows == as_columns(m.decode_entries(batch))
    assert [(r[3], r[8]) for r in rows] == [(5, 40), (9, 70)]
