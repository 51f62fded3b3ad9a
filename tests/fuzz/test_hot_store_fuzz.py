"""Fuzzing of the hot tier's on-disk decoders: ``.idx`` records, ``.meta`` ledger metadata and the
``.log`` frames they point to, through a real LocalLedgerStore directory.

A store holding one sealed and one OPEN ledger (writer gone) is copied for every example and one of
its files replaced by random bytes or a mutation of the original. Opening the store (which recovers the
OPEN ledger), reading metadata, opening, reading every entry, recovering and sealing must each return or
raise a TieredError; every entry that is returned must be the one written under that id.
"""

from __future__ import annotations

import array
import shutil
import struct
import tempfile
from pathlib import Path

import crc32c
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tieredcore.errors import TieredError
from tieredcore.formats.proto.DataFormats_pb2 import LedgerMetadataFormat
from tieredcore.hot.format import IDX_RECORD, decode_index, decode_metadata, encode_index
from tieredcore.hot.handle import LocalLedgerHandle
from tieredcore.hot.local import LocalLedgerStore

from .strategies import EXTREMES, FUZZ, FUZZ_IO, HANG_TIMEOUT, fuzz_input, outcome

pytestmark = pytest.mark.timeout(HANG_TIMEOUT)

CUSTOM = {"application": "pulsar", "pulsar/managed-ledger": "public/default/persistent/t"}
# equal lengths side by side, so that a swapped or shifted index record still has a matching length
WRITTEN = {
    0: [b"a" * 10, b"b" * 10, b"c" * 10, b"", b"d" * 5, b"e" * 5, b"f" * 33, b"g" * 10],
    1: [b"h" * 7, b"i" * 7, b"", b"j" * 20, b"k" * 7],
}
SEALED, OPEN = 0, 1
KINDS = ("idx", "log", "meta")


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hot-template")
    store = LocalLedgerStore(root)
    for lid, payloads in WRITTEN.items():
        w = store.create_ledger(CUSTOM)
        assert w.ledger_id == lid
        w.append_many(payloads)
        if lid == SEALED:
            w.close()
        else:
            w.release()  # stays OPEN, its writer gone: recovered on the next open
    store.close()
    return root


def _original(template: Path, lid: int, kind: str) -> bytes:
    return (template / f"{lid}.{kind}").read_bytes()


def _record_fields(n: int) -> list[tuple[int, int]]:
    return [(16 * k + off, w) for k in range(n) for off, w in ((0, 8), (8, 4), (12, 4))]


@st.composite
def idx_records(draw: st.DrawFn, base: bytes) -> bytes:
    """Record-level damage of an .idx: records swapped, dropped, duplicated or moved."""
    recs = [base[i : i + 16] for i in range(0, len(base), 16)]
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(("swap", "drop", "dup", "move")))
        i, j = draw(st.integers(0, len(recs) - 1)), draw(st.integers(0, len(recs) - 1))
        if op == "swap":
            recs[i], recs[j] = recs[j], recs[i]
        elif op == "drop" and len(recs) > 1:
            del recs[i]
        elif op == "dup":
            recs.insert(j, recs[i])
        elif op == "move":
            recs.insert(j, recs.pop(i))
    return b"".join(recs)


def _meta_with(**fields: int) -> bytes:
    m = LedgerMetadataFormat(quorumSize=1, ensembleSize=1, length=0, state=LedgerMetadataFormat.CLOSED)
    for k, v in fields.items():
        setattr(m, k, v)
    return m.SerializePartialToString()


@st.composite
def damaged_file(draw: st.DrawFn, template: Path) -> tuple[int, str, bytes]:
    """(ledger id, file kind, new contents) for one file of the template store."""
    lid = draw(st.sampled_from((SEALED, OPEN)))
    kind = draw(st.sampled_from(KINDS))
    base = _original(template, lid, kind)
    options = [fuzz_input(base, _record_fields(len(base) // 16) if kind == "idx" else (), max_size=300)]
    if kind == "idx":
        options.append(idx_records(base))
    if kind == "meta":
        ints = st.sampled_from(EXTREMES).map(lambda v: ((v + 2**63) % 2**64) - 2**63)
        options.append(st.builds(lambda s, last, length: _meta_with(state=s, lastEntryId=last, length=length),
                                 st.sampled_from((1, 2, 3)), ints, ints))
    return lid, kind, draw(st.one_of(options))


def _read_everything(h: LocalLedgerHandle) -> None:
    """Every entry alone and the whole ledger at once: each a TieredError or exactly what was written."""
    written = WRITTEN[h.ledger_id]
    lac = h.last_add_confirmed
    assert lac < len(written), f"ledger {h.ledger_id}: LAC {lac} beyond the {len(written)} entries written"
    ranges = [(i, i) for i in range(lac + 1)] + ([(0, lac)] if lac >= 0 else [])
    for first, last in ranges:
        got = outcome(h.read, first, last)
        if not isinstance(got, TieredError):
            assert [(e.entry_id, e.data) for e in got] == list(enumerate(written))[first : last + 1]
        frames = outcome(h.read_frames, first, last)
        if not isinstance(frames, TieredError):
            assert frames == b"".join(struct.pack(">iq", len(written[i]), i) + written[i]
                                      for i in range(first, last + 1))
    outcome(h.frame_offset, lac + 1)
    h.entry_sizes()


def _exercise(root: Path) -> None:
    store = outcome(LocalLedgerStore, root)
    if isinstance(store, TieredError):
        return
    try:
        outcome(store.list_ledgers)
        for lid in WRITTEN:
            outcome(store.ledger_metadata, lid)
            for step in (None, store.recover_ledger, store.seal_ledger):
                if step is not None:
                    outcome(step, lid)
                h = outcome(store.open_ledger, lid)
                if not isinstance(h, TieredError):
                    with h:
                        _read_everything(h)
    finally:
        store.close()


@FUZZ_IO
@given(st.data())
def test_store_over_damaged_files(template: Path, data: st.DataObject) -> None:
    lid, kind, contents = data.draw(damaged_file(template))
    with tempfile.TemporaryDirectory(prefix="hot-fuzz-") as d:
        root = Path(d) / "hot"
        shutil.copytree(template, root)
        (root / f"{lid}.{kind}").write_bytes(contents)
        _exercise(root)


def _idx_with(lid: int, edit: dict[int, bytes | int]) -> bytes:
    """The template's .idx of ``lid`` with records replaced: by another record's index (a copy) or bytes."""
    base = {SEALED: _SEALED_IDX, OPEN: _OPEN_IDX}[lid]
    recs = [base[i : i + 16] for i in range(0, len(base), 16)]
    for k, v in edit.items():
        recs[k] = recs[v] if isinstance(v, int) else v
    return b"".join(recs)


def _records(payloads: list[bytes]) -> bytes:
    """The .idx the writer produces for ``payloads`` (offset, CRC32C of the frame, length)."""
    out, off = [], 0
    for i, p in enumerate(payloads):
        out.append(IDX_RECORD.pack(off, crc32c.crc32c(struct.pack(">iq", len(p), i) + p), len(p)))
        off += 12 + len(p)
    return b"".join(out)


_SEALED_IDX, _OPEN_IDX = _records(WRITTEN[SEALED]), _records(WRITTEN[OPEN])


@pytest.mark.parametrize(
    "lid, kind, contents",
    [
        # record 1 a copy of record 0 (same length): read(1, 1) returned entry 0's payload as entry 1
        (SEALED, "idx", _idx_with(SEALED, {1: 0})),
        (SEALED, "idx", _idx_with(SEALED, {1: 2, 2: 1})),
        (OPEN, "idx", _idx_with(OPEN, {0: 1})),
        # a length of 2**31 - 1 in a record that recovery does not look at: read(0, 0) allocated 2 GiB
        # (measured in test_memory_bounds.py)
        (OPEN, "idx", _idx_with(OPEN, {0: IDX_RECORD.pack(0, 0, 2**31 - 1)})),
        (SEALED, "idx", _idx_with(SEALED, {0: IDX_RECORD.pack(0, 0, 2**31 - 1), 1: IDX_RECORD.pack(0, 0, -(2**31))})),
        # a CLOSED ledger whose metadata says lastEntryId -5: the .idx read size went negative (OSError
        # EINVAL; OverflowError at -2**63)
        (SEALED, "meta", _meta_with(lastEntryId=-5)),
        (SEALED, "meta", _meta_with(lastEntryId=-(2**63))),
        (SEALED, "meta", _meta_with(lastEntryId=2**63 - 1, length=2**63 - 1)),
        (OPEN, "meta", _meta_with(state=1, lastEntryId=-(2**63))),
    ],
)
def test_store_regressions(template: Path, lid: int, kind: str, contents: bytes) -> None:
    with tempfile.TemporaryDirectory(prefix="hot-fuzz-") as d:
        root = Path(d) / "hot"
        shutil.copytree(template, root)
        (root / f"{lid}.{kind}").write_bytes(contents)
        _exercise(root)


@FUZZ
@given(st.binary(max_size=400))
def test_decode_index(buf: bytes) -> None:
    offsets, crcs, lens = decode_index(buf)
    n = len(buf) // 16
    assert len(offsets) == len(crcs) == len(lens) == n
    assert [tuple(r) for r in zip(offsets, crcs, lens, strict=True)] == [
        IDX_RECORD.unpack_from(buf, 16 * k) for k in range(n)
    ]


@FUZZ
@given(st.lists(st.tuples(st.integers(0, 2**63 - 1), st.integers(0, 2**32 - 1), st.integers(0, 2**31 - 1)),
                max_size=40))
def test_encode_index(records: list[tuple[int, int, int]]) -> None:
    """The writer's bulk encoding (payload lengths are never negative) is the record struct, on both sides
    of the 4 GiB offset switch."""
    offsets = [r[0] for r in records]
    crcs = array.array("I", [r[1] for r in records])
    lens = array.array("i", [r[2] for r in records])
    want = b"".join(IDX_RECORD.pack(*r) for r in records)
    assert encode_index(offsets, crcs, lens, 1 << 32).tobytes() == want
    if all(o < 1 << 32 for o in offsets):
        assert encode_index(offsets, crcs, lens, (1 << 32) - 1).tobytes() == want
    assert decode_index(want) == (array.array("q", offsets), crcs, lens)


@FUZZ
@given(fuzz_input(_meta_with(lastEntryId=3, length=10, ctime=5), max_size=200))
@example(_meta_with(lastEntryId=3, length=10) + b"Z\x05\n\x01\xff\x12\x00")  # custom key not UTF-8
def test_decode_metadata(buf: bytes) -> None:
    md = outcome(decode_metadata, 4, buf)
    if not isinstance(md, TieredError):
        assert md.ledger_id == 4 and all(type(k) is str for k in md.custom_metadata)
        if not md.is_closed:
            assert md.last_entry_id == -1 and md.length == 0


def test_template_is_as_written(template: Path) -> None:
    """The files the fuzz tests start from are what they assume (a guard against fuzzing nothing)."""
    for lid, payloads in WRITTEN.items():
        assert _original(template, lid, "idx") == _records(payloads)
        assert _original(template, lid, "log") == b"".join(struct.pack(">iq", len(p), i) + p
                                                           for i, p in enumerate(payloads))
