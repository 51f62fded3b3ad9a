"""The whole-entry C reader (tieredcore/formats/cbatch.c ``columns``) on batches' SingleMessageMetadata,
against the Python reader it replaces (decode_columns read in Python, then message_batch).

The C reader parses SingleMessageMetadata's wire format itself; whatever it refuses (malformed, or beyond
what it reads: groups, a known field of an unexpected wire type, strings that are not UTF-8) the Python
reader reads again, so errors and edge cases stay the Python reader's. What matters is that the C reader
never accepts what upb refuses and never reads a field differently: a differential test over random
batches, random wire-format metadata and corrupted batches, plus exact vectors. Framing, MessageMetadata
and codecs: tests/query/test_native_rows.py.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.query.test_native_rows import TOPIC, read, same
from tests.support.wire import damage, ld, tag, varint, vi
from tieredcore.errors import MessageFormatError
from tieredcore.formats import compression
from tieredcore.formats import messages as m
from tieredcore.model import EntryBatch
from tieredcore.query import rows

cbatch = pytest.importorskip("tieredcore.formats.cbatch", reason="the C extension is not built")
ROOT = Path(__file__).resolve().parents[2]

U64 = 2**64 - 1


def entry_batch(entries: list[bytes], first: int = 0) -> EntryBatch:
    starts, pos = [], 0
    for e in entries:
        starts.append(pos)
        pos += len(e)
    return EntryBatch(ledger_id=7, first_entry=first, buf=b"".join(entries), starts=starts,
                      lengths=[len(e) for e in entries], frames_start=0, frames_end=pos)


def batch_entry(raw: bytes, count: int, seq: int = 100, event_time: int | None = None) -> bytes:
    """An entry (no checksum: corrupted payloads reach the batch reader) whose inflated batch is ``raw``."""
    meta = m.MessageMetadata(producer_name="p", sequence_id=seq, publish_time=1234,
                             num_messages_in_batch=count, uncompressed_size=len(raw))
    if event_time is not None:
        meta.event_time = event_time
    return m.frame_entry(meta, raw, checksum=False)


def framed(*smms: tuple[bytes, bytes]) -> bytes:
    """``[uint32 size][SingleMessageMetadata][payload]`` per (metadata bytes, payload)."""
    return b"".join(struct.pack(">I", len(s)) + s + p for s, p in smms)


def direct(raw: bytes, count: int, seq: int = 100, evt: int | None = None) -> tuple[int, list[dict]]:
    """cbatch.columns on one batch entry alone: its code (0: taken) and the rows it read."""
    batch = entry_batch([batch_entry(raw, count, seq, evt)])
    stop, code, _, n, bufs = cbatch.columns(batch.buf, batch.starts, batch.lengths, 0, True, compression.inflate)
    assert stop == (1 if code == 0 else 0)
    got = rows._native_batch(TOPIC, "hot", 7, 0, n, bufs).to_pylist() if n else []
    return code, got


def col(res: tuple, name: str) -> list:
    """One column of same()'s rows."""
    assert res[0] == "ok", res
    return [r[name] for r in res[1]]


# --- wire format, written by hand ----------------------------------------------------------------------


# --- exact vectors -------------------------------------------------------------------------------------


def test_the_c_reader_is_used_unless_turned_off() -> None:
    off = os.environ.get("TIERED_NO_C", "") not in ("", "0")
    assert rows.native_columns is (None if off else cbatch.columns)
    code = "from tieredcore.query import rows; print(rows.native_columns is None)"
    env = dict(os.environ, PYTHONPATH=str(ROOT), TIERED_NO_C="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "True"


def test_from_a_zip_the_python_reader_is_used(tmp_path: Path) -> None:
    """Spark executors import tieredcore from a --py-files zip, where extension modules cannot load."""
    archive = tmp_path / "deps.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for f in (ROOT / "tieredcore").rglob("*"):
            if f.suffix in (".py", ".so", ".proto"):
                z.write(f, f.relative_to(ROOT))
        assert any(n.endswith(".so") for n in z.namelist())  # the built module is in it, and still unused
    code = ("from tieredcore.formats import messages as m; from tieredcore.model import EntryBatch\n"
            "from tieredcore.query import rows\n"
            "e = m.encode_batch([m.OutMessage(b'x', key='k')] * 2, producer='p', sequence_id=1, publish_time=2)\n"
            "(b,) = rows.message_batches('t', 'hot', EntryBatch(1, 0, e, [0], [len(e)], 0, len(e)))\n"
            f"print(rows.native_columns is None, m.__file__.startswith({str(archive)!r}), "
            "b.column('key').to_pylist(), b.column('sequence_id').to_pylist())")
    env = {k: v for k, v in os.environ.items() if k != "TIERED_NO_C"}
    env["PYTHONPATH"] = str(archive)
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                         check=True)
    assert out.stdout.split() == ["True", "True", "['k',", "'k']", "[1,", "2]"]


def test_unknown_fields_of_every_wire_type_are_skipped() -> None:
    smm = (vi(3, 5) + vi(20, U64) + tag(21, 1) + b"12345678" + ld(22, b"\x00\xff junk")
           + tag(23, 5) + b"abcd" + ld(2, "clé".encode()) + vi(8, 9) + vi(5, 77) + ld(7, b"\x00ok")
           + ld(1, ld(1, b"k") + vi(9, 1) + ld(2, b"v")) + vi(2**20, 3))
    raw = framed((smm, b"hello"), (vi(3, 0) + vi(10, 1) + ld(2, b"gone"), b""))
    code, got = direct(raw, 2, seq=100, evt=55)
    assert code == 0
    assert [(r["batch_index"], r["sequence_id"], r["key"], r["ordering_key"], r["properties"], r["payload"])
            for r in got] == [(0, 9, "clé", b"\x00ok", [("k", "v")], b"hello"), (1, 101, None, None, [], b"")]
    assert [r["event_time"].timestamp() * 1000 for r in got] == [77, 55]
    res = same(entry_batch([batch_entry(raw, 2, seq=100, event_time=55)]))
    assert col(res, "key") == ["clé", None]


def test_key_values_lacking_key_or_value() -> None:
    """A batched message's KeyValue: key and value are required; upb does not check: "" for the missing
    one."""
    smm = vi(3, 0) + ld(1, ld(2, b"v")) + ld(1, ld(1, b"k")) + ld(1, b"") + ld(1, ld(1, b"a") + ld(1, b"b"))
    raw = framed((smm, b""))
    code, got = direct(raw, 1)
    # key "" twice: once, in its first place, with its last value
    assert code == 0 and got[0]["properties"] == [("", ""), ("k", ""), ("b", "")]
    same(entry_batch([batch_entry(raw, 1)]))


@pytest.mark.parametrize("n", [2, 5, 16, 17, 40])
def test_a_repeated_property_key_keeps_its_last_value(n: int) -> None:
    """As decode_columns' Python loop (Pulsar's getProperties): a key given twice once, in its first
    place, with its last value."""
    props = [(f"k{i % (n - 1)}", f"v{i}") for i in range(n)]  # the last repeats the first key
    distinct = [(f"k{i}", f"v{i}") for i in range(n)]
    smm = vi(3, 0) + b"".join(ld(1, ld(1, k.encode()) + ld(2, v.encode())) for k, v in props)
    smm2 = vi(3, 0) + b"".join(ld(1, ld(1, k.encode()) + ld(2, v.encode())) for k, v in distinct)
    raw = framed((smm, b""), (smm2, b""))
    code, got = direct(raw, 2)
    assert code == 0
    assert got[0]["properties"] == list(dict(props).items()) and got[1]["properties"] == distinct
    same(entry_batch([batch_entry(raw, 2)]))


def test_groups_are_left_to_the_python_reader() -> None:
    smm = vi(3, 1) + tag(24, 3) + vi(1, 5) + tag(25, 3) + tag(25, 4) + tag(24, 4) + ld(2, b"k")
    raw = framed((smm, b"x"))
    assert direct(raw, 1)[0] == cbatch.UNSUPPORTED
    res = same(entry_batch([batch_entry(raw, 1)]))
    assert col(res, "key") == ["k"]  # upb skips the group; so does the Python reader


def test_a_known_field_of_another_wire_type() -> None:
    raw = framed((vi(3, 1) + vi(2, 5), b"x"))  # partition_key as a varint: upb keeps it aside
    assert direct(raw, 1)[0] == cbatch.UNSUPPORTED
    assert col(same(entry_batch([batch_entry(raw, 1)])), "key") == [None]


def test_strings_that_are_not_utf8() -> None:
    """upb (proto2 strings: no UTF-8 check) parses them and hands out bytes, which no string column holds;
    the C reader leaves them to the Python reader, which calls the entry damaged, naming the field."""
    raw = framed((vi(3, 0) + ld(2, b"\xff\xfe") + ld(1, ld(1, b"\xc3(") + ld(2, b"v")), b""))
    assert direct(raw, 1)[0] == cbatch.UNSUPPORTED
    res = same(entry_batch([batch_entry(raw, 1)]))
    assert res[:3] == ("error", MessageFormatError,
                       "entry 7:0: not a Pulsar message: message 0 of the batch: partition_key is not UTF-8")
    raw = framed((vi(3, 0) + ld(1, ld(1, b"\xc3(") + ld(2, b"v")), b""))
    assert same(entry_batch([batch_entry(raw, 1)]))[2].endswith("message 0 of the batch: a property is not UTF-8")


def test_missing_payload_size() -> None:
    raw = framed((vi(3, 0), b""), (ld(2, b"k"), b""))
    assert direct(raw, 2)[0] == cbatch.NO_PAYLOAD_SIZE
    res = same(entry_batch([batch_entry(raw, 2)]))
    assert res[2] == ("entry 7:0: not a Pulsar message: message 1 of the batch: SingleMessageMetadata "
                      "lacks payload_size")


@pytest.mark.parametrize("smm", [
    vi(3, 1) + tag(8, 0) + b"\x80\x80",  # truncated varint
    vi(3, 1) + tag(8, 0) + b"\xff" * 10 + b"\x01",  # 11 bytes
    vi(3, 1) + ld(2, b"abc")[:-1],  # truncated string
    vi(3, 1) + b"\x00",  # field 0
    vi(3, 1) + tag(30, 7),  # wire type 7
    vi(3, 1) + tag(30, 1) + b"1234",  # truncated fixed64
    vi(3, 1) + ld(1, tag(1, 2) + b"\x05ab"),  # a KeyValue's string overruns the KeyValue
], ids=["truncated-varint", "long-varint", "truncated-string", "field-0", "wire-type-7", "fixed64",
        "kv-overrun"])
def test_metadata_that_does_not_parse(smm: bytes) -> None:
    raw = framed((smm, b"x"))
    assert direct(raw, 1)[0] == cbatch.PARSE
    res = same(entry_batch([batch_entry(raw, 1)]))
    assert res[0] == "error"
    assert res[2].startswith("entry 7:0: not a Pulsar message: message 0 of the batch: SingleMessageMetadata "
                             "does not parse: ")


def test_framing_errors() -> None:
    good = framed((vi(3, 1), b"x"))
    cases = {
        good + b"\x00\x00": (cbatch.TRUNCATED, "the batch ends before message 1 of 2"),
        good + b"\x00\x00\x00\x09" + vi(3, 1): (cbatch.META_OVERRUN,
                                                  "message 1 of the batch: its metadata overruns the batch"),
        good + framed((vi(3, 5), b"abc")): (cbatch.PAYLOAD_OVERRUN,
                                              "message 1 of the batch: its 5-byte payload overruns the batch"),
        good + framed((vi(3, 2**32 - 3), b"abc")): (cbatch.PAYLOAD_OVERRUN,
                                                      "message 1 of the batch: its -3-byte payload overruns"),
    }
    for raw, (code, text) in cases.items():
        assert direct(raw, 2)[0] == code
        res = same(entry_batch([batch_entry(raw, 2)]))
        assert res[0] == "error" and text in res[2]


def test_large_payloads_read_whole() -> None:
    big = bytes(range(256)) * 300  # 76,800 bytes
    raw = framed((vi(3, 3), b"abc"), (vi(3, len(big)), big), (vi(3, 65536), big[:65536]))
    code, got = direct(raw, 3)
    assert code == 0 and [r["payload"] for r in got] == [b"abc", big, big[:65536]]
    same(entry_batch([batch_entry(raw, 3)]))


def test_sequence_ids_wrap_past_2_64_as_javas_long() -> None:
    """A batch's sequence ids count on from the entry's (RawMessageImpl) in Java's long: U64 is -1, the next
    0."""
    raw = framed((vi(3, 0), b""), (vi(3, 0), b""))
    code, got = direct(raw, 2, seq=U64)
    assert code == 0 and [r["sequence_id"] for r in got] == [-1, 0]
    assert col(same(entry_batch([batch_entry(raw, 2, seq=U64)])), "sequence_id") == [-1, 0]


def test_bad_entries_are_collected_as_before() -> None:
    good = m.encode_batch([m.OutMessage(b"a", key="k", properties={"p": "1"}), m.OutMessage(b"b")],
                          producer="p", sequence_id=5, publish_time=9)
    broken = batch_entry(framed((vi(3, 1), b"x"), (vi(3, 9), b"y")), 2)
    batch = entry_batch([good, broken, good], first=10)
    for native in (True, False):
        kind, got, bad = read(batch, native, True)
        assert [r["entry_id"] for r in got] == [10, 10, 12, 12] and [r["payload"] for r in got] == [b"a", b"b"] * 2
        assert [r["properties"] for r in got] == [[("p", "1")], [], [("p", "1")], []]
        assert [(b.position.entry_id, b.reason, b.checksum) for b in bad] == [
            (11, "entry 7:11: not a Pulsar message: message 1 of the batch: its 9-byte payload overruns "
                 "the batch", False)]
    with pytest.raises(MessageFormatError, match="its 9-byte payload"):
        list(rows.message_batches(TOPIC, "hot", batch))


# --- differential, random ------------------------------------------------------------------------------

texts = st.text(max_size=8)
out_messages = st.builds(
    m.OutMessage,
    payload=st.binary(max_size=24),
    key=st.none() | texts,
    key_is_b64=st.booleans(),
    ordering_key=st.none() | st.binary(max_size=6),
    properties=st.lists(st.tuples(st.sampled_from(["a", "b", ""]) | texts, texts), max_size=4),  # repeats
    event_time=st.none() | st.integers(0, U64),
    sequence_id=st.none() | st.integers(0, U64),
    null_value=st.booleans(),
    null_key=st.booleans(),
    compacted_out=st.booleans(),
)


@settings(max_examples=150, deadline=None)
@given(batches=st.lists(st.tuples(st.lists(out_messages, min_size=1, max_size=5), st.integers(0, 2**63),
                                  st.none() | st.integers(0, U64)), min_size=1, max_size=3))
def test_random_batches(batches) -> None:
    entries = []
    for msgs, seq, evt in batches:
        e = m.encode_batch(msgs, producer="prod", sequence_id=seq, publish_time=42)
        if evt is not None:  # the entry's event time, for messages without their own
            f = m.parse_entry(e)
            f.metadata.event_time = evt
            e = m.frame_entry(f.metadata, bytes(f.payload))
        entries.append(e)
    res = same(entry_batch(entries))
    assert res[0] == "ok" and len(res[1]) == sum(len(b[0]) for b in batches)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(msgs=st.lists(out_messages, min_size=1, max_size=4), data=st.data())
def test_corrupted_batches(msgs, data) -> None:
    smms = [m.single_metadata(x, 100 + i) for i, x in enumerate(msgs)]
    raw = bytearray(m.batch_payload(zip(smms, (b"" if x.null_value else x.payload for x in msgs),
                                        strict=True)))
    damage(raw, data)
    count = data.draw(st.sampled_from([len(msgs), len(msgs) + 1, max(len(msgs) - 1, 1)]))
    same(entry_batch([batch_entry(bytes(raw), count)]))


# a SingleMessageMetadata of random fields, numbers and wire types (the known ones among them)
def _field(num: int, wt: int, value: int, blob: bytes, pad: int = 0) -> bytes:
    if wt == 0:  # pad: a varint in more bytes than it needs (upb reads it, up to 10 bytes)
        v = varint(value)
        if pad and len(v) + pad <= 10:
            v = bytes(b | 0x80 for b in v) + b"\x80" * (pad - 1) + b"\x00"
        return tag(num, 0) + v
    if wt == 1:
        return tag(num, 1) + blob.ljust(8, b"\0")[:8]
    if wt == 5:
        return tag(num, 5) + blob.ljust(4, b"\0")[:4]
    if wt == 2:
        return ld(num, blob)
    if wt == 3:
        return tag(num, 3) + blob + tag(num, 4)
    return tag(num, wt) + blob


utf8 = st.text(max_size=4).map(str.encode)
kv_blob = st.builds(lambda k, v, extra: ld(1, k) + extra + ld(2, v),
                    utf8 | st.binary(max_size=4), utf8, st.sampled_from([b"", vi(7, 3), b"\x08", ld(1, b"a")]))
values = st.integers(0, U64) | st.integers(0, 300) | st.sampled_from([2**31, 2**32 - 1, 2**63])
pads = st.sampled_from([0, 0, 0, 1, 3])
# known fields with their own wire type, unknown ones of the four plain wire types (what the C reader reads)
typed = st.builds(lambda nw, v, b, kv, pad: _field(nw[0], nw[1], v, kv if nw[0] == 1 else b, pad),
                  st.sampled_from([(1, 2), (2, 2), (3, 0), (4, 0), (5, 0), (6, 0), (7, 2), (8, 0), (9, 0), (10, 0)])
                  | st.tuples(st.integers(11, 2**29 - 1), st.sampled_from([0, 1, 2, 5])),
                  values, utf8 | st.binary(max_size=6), kv_blob, pads)
# anything: numbers, wire types, bytes
untyped = st.builds(_field, st.integers(1, 12) | st.integers(13, 2**29 - 1), st.integers(0, 7), values,
                    kv_blob | st.binary(max_size=10))
fields = st.lists(typed, max_size=6) | st.lists(typed | typed | untyped, max_size=6)


@settings(max_examples=400, deadline=None)
@given(smms=st.lists(st.tuples(fields, st.sampled_from([True, True, True, False]), st.binary(max_size=6)),
                     min_size=1, max_size=3))
def test_random_wire_format(smms) -> None:
    parts = []
    for fs, with_size, payload in smms:
        body = b"".join(fs) + (vi(3, len(payload)) if with_size else b"")
        parts.append((body, payload))
    same(entry_batch([batch_entry(framed(*parts), len(parts))]))
