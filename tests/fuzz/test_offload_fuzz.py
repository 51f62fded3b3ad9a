"""Fuzzing of the offloaded read path over damaged data objects: ``read_offloaded`` +
``OffloadedLedgerHandle.read`` and the streaming verifier ``verify_offloaded``.

A real offload (LedgerOffloader on a FilesystemBlobStore, from a sealed hot ledger) has its data object
replaced by random bytes or a mutation of the original, of the same length or another one; the index
stays valid. With chunk checksums (this project's objects) a read returns exactly the entries written or
raises a TieredError; without them (Pulsar's objects) it returns or raises a TieredError. Verification
against the hot tier's CRCs raises a TieredError whenever a byte differs, with or without checksums.
"""

from __future__ import annotations

import random
import uuid as uuidlib
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from hypothesis import event, example, given
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

from tieredcore.cold.backends.fs import FilesystemBlobStore
from tieredcore.errors import CorruptObjectError, TieredError
from tieredcore.formats.block import block_header, encode_frames
from tieredcore.formats.constants import BLOCK_HEADER_LENGTH
from tieredcore.formats.index import encode_index_v1, parse_index_v1
from tieredcore.formats.keys import data_key, index_key
from tieredcore.hot.local import LocalLedgerStore
from tieredcore.offload.cache import OffsetCache
from tieredcore.offload.offloader import LedgerOffloader
from tieredcore.offload.verify import verify_offloaded

from .strategies import FUZZ_IO, HANG_TIMEOUT, mutated, outcome

pytestmark = pytest.mark.timeout(HANG_TIMEOUT)

UUID = uuidlib.UUID("0badcafe-0000-4000-8000-00000000f022")
PAYLOADS = [bytes([i % 251]) * (i * 37 % 300) for i in range(40)]  # ~6 KB, zero-length entries included
OPTIONS = {"max_block_size": 1024, "read_buffer": 1024}


@dataclass
class Offloaded:
    store: FilesystemBlobStore
    ledger_id: int
    prefix: str
    options: dict
    data: bytes  # the data object as written
    hot_crcs: list[int]

    @property
    def key(self) -> str:
        return data_key(self.prefix, str(UUID), self.ledger_id)

    def offloader(self) -> LedgerOffloader:
        # a fresh offset cache each time: offsets learnt from one fuzzed object must not steer the next
        return LedgerOffloader(self.store, self.prefix, offset_cache=OffsetCache(), **self.options)

    def replace_data(self, data: bytes) -> None:
        self.store.put(self.key, data, self.store.head(self.key).metadata)


@pytest.fixture(scope="module")
def offloads(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Offloaded]]:
    root = tmp_path_factory.mktemp("offload-fuzz")
    hot = LocalLedgerStore(root / "hot")
    w = hot.create_ledger({"application": "pulsar"})
    w.append_many(PAYLOADS)
    w.close()
    h = hot.open_ledger(w.ledger_id)
    store = FilesystemBlobStore(root / "cold")
    out = {}
    for name, extra in (("checksums", {"checksum_chunk": 512, "checkpoint_interval": 256}),
                        ("pulsar", {"checksum_chunk": 0, "checkpoint_interval": 0})):
        options = {**OPTIONS, **extra}
        off = LedgerOffloader(store, name, offset_cache=OffsetCache(), **options)
        off.offload(h, UUID)
        o = Offloaded(store, w.ledger_id, off.prefix, options, b"", list(h.entry_crcs()))
        o.data = store.get(o.key)
        out[name] = o
    h.close()
    hot.close()
    yield out
    for o in out.values():
        o.replace_data(o.data)


@st.composite
def damaged(draw: st.DrawFn, original: bytes) -> bytes:
    """Random bytes of the same length or another one, or a mutation (length kept or not)."""
    n = len(original)
    kind = draw(st.sampled_from(("random", "random-other-length", "mutated", "mutated-block-fields",
                                 "mutated-same-length")))
    if kind.startswith("random"):  # seeded: thousands of drawn bytes would make hypothesis crawl
        size = n if kind == "random" else draw(st.integers(0, n + 64))
        return random.Random(draw(st.integers(0, 2**32))).randbytes(size)
    fields = [(o + f, w) for o in range(0, n, OPTIONS["max_block_size"])
              for f, w in ((4, 8), (12, 8), (20, 8), (BLOCK_HEADER_LENGTH, 4), (BLOCK_HEADER_LENGTH + 4, 8))]
    if kind == "mutated":
        return draw(mutated(original))
    return draw(mutated(original, fields, keep_length=True))


def _event(what: str) -> None:
    if currently_in_test_context():  # outcome statistics (pytest --hypothesis-show-statistics)
        event(what)


def _check(o: Offloaded, data: bytes, *, exact: bool) -> None:
    """Open, read (everything, runs of seven, single entries) and verify. With ``exact`` (checksums)
    a read that returns gives the entries written; whatever the object, verification against the hot
    CRCs passes only when the object is the one written."""
    o.replace_data(data)
    off = o.offloader()
    h = outcome(off.read_offloaded, o.ledger_id, UUID)
    _event(f"open: {type(h).__name__}")
    if isinstance(h, TieredError):
        return
    lac = h.last_add_confirmed
    assert lac == len(PAYLOADS) - 1  # the index is intact
    for first, last in [(0, lac), *((i, min(i + 6, lac)) for i in range(0, lac + 1, 7)), (lac, lac), (3, 3)]:
        got = outcome(h.read, first, last)
        _event(f"read: {type(got).__name__}")
        if exact and not isinstance(got, TieredError):
            assert [(e.entry_id, e.data) for e in got] == list(enumerate(PAYLOADS))[first : last + 1]
    report = outcome(verify_offloaded, o.offloader().read_offloaded(o.ledger_id, UUID), o.hot_crcs)
    _event(f"verify: {type(report).__name__}")
    if data != o.data:
        assert isinstance(report, TieredError), "verification against the hot copy passed a damaged object"
    else:
        assert not isinstance(report, TieredError) and report.entries == len(PAYLOADS)
    outcome(verify_offloaded, o.offloader().read_offloaded(o.ledger_id, UUID))
    if exact and data != o.data:
        assert isinstance(outcome(verify_offloaded, o.offloader().read_offloaded(o.ledger_id, UUID)), TieredError)


@FUZZ_IO
@given(st.data())
def test_reader_and_verifier_with_checksums(offloads: dict[str, Offloaded], data: st.DataObject) -> None:
    o = offloads["checksums"]
    _check(o, data.draw(damaged(o.data)), exact=True)


@FUZZ_IO
@given(st.data())
@example(None)
def test_reader_and_verifier_without_checksums(offloads: dict[str, Offloaded], data: st.DataObject | None) -> None:
    o = offloads["pulsar"]
    _check(o, o.data if data is None else data.draw(damaged(o.data)), exact=False)


@FUZZ_IO
@given(st.sampled_from(("checksums", "pulsar")), st.data())
def test_reader_over_damaged_index(offloads: dict[str, Offloaded], which: str, data: st.DataObject) -> None:
    """The index object damaged instead (the data intact): opening refuses it or gives a handle whose
    reads and verification return or raise a TieredError. A checksummed index cannot change unnoticed
    (bytes appended after its checksum section are ignored), so its reads are exact."""
    o = offloads[which]
    ikey = index_key(o.prefix, str(UUID), o.ledger_id)
    original = o.store.get(ikey)
    header_fields = [(4, 4), (8, 8), (16, 8), (24, 4), (28, 4)]
    damaged_index = data.draw(mutated(original, header_fields, keep_length=data.draw(st.booleans())))
    try:
        o.store.put(ikey, damaged_index, o.store.head(ikey).metadata)
        h = outcome(o.offloader().read_offloaded, o.ledger_id, UUID)
        _event(f"open: {type(h).__name__}")
        if isinstance(h, TieredError):
            return
        lac = h.last_add_confirmed
        for first, last in ((0, lac), (0, 0), (lac, lac), (5, 9)):
            got = outcome(h.read, first, last)
            _event(f"read: {type(got).__name__}")
            if which == "checksums" and not isinstance(got, TieredError):
                assert [(e.entry_id, e.data) for e in got] == list(enumerate(PAYLOADS))[first : last + 1]
        outcome(verify_offloaded, o.offloader().read_offloaded(o.ledger_id, UUID), o.hot_crcs)
        outcome(verify_offloaded, o.offloader().read_offloaded(o.ledger_id, UUID))
    finally:
        o.store.put(ikey, original, o.store.head(ikey).metadata)


def test_fixture_offloads_are_sound(offloads: dict[str, Offloaded]) -> None:
    """The originals read back and verify (a guard against fuzzing objects that were never valid)."""
    for o in offloads.values():
        _check(o, o.data, exact=True)
        assert len(o.data) > 4 * OPTIONS["max_block_size"]  # several blocks, with padding


def test_frame_beyond_the_last_entry(offloads: dict[str, Offloaded]) -> None:
    """A (Pulsar-format) object whose last block has room after the last entry, holding one more frame:
    the index passes every check, and verification against the hot CRCs looked that frame's CRC up past
    the end of the hot copy's list (IndexError)."""
    o = offloads["pulsar"]
    ikey = index_key(o.prefix, str(UUID), o.ledger_id)
    index_bytes, index = o.store.get(ikey), parse_index_v1(o.store.get(ikey), o.ledger_id)
    last = index.entries[-1]
    extra = encode_frames([(len(PAYLOADS), b"one too many")])
    size = len(o.data) - last.offset + len(extra)
    data = o.data[: last.offset] + block_header(last.first_entry_id, size) + o.data[last.offset + 128 :] + extra
    try:
        o.store.put(ikey, encode_index_v1(index.metadata_bytes, len(data), index.entries), o.store.head(ikey).metadata)
        o.replace_data(data)
        h = o.offloader().read_offloaded(o.ledger_id, UUID)  # a valid index: opens
        assert [e.data for e in h.read(0, len(PAYLOADS) - 1)] == PAYLOADS
        with pytest.raises(CorruptObjectError, match="the index ends at entry"):
            verify_offloaded(h, o.hot_crcs)
        with pytest.raises(CorruptObjectError, match="not padding"):  # frames cut by the hot sizes
            verify_offloaded(o.offloader().read_offloaded(o.ledger_id, UUID), o.hot_crcs,
                             expected_sizes=list(map(len, PAYLOADS)))
        with pytest.raises(CorruptObjectError, match="the index ends at entry"):
            verify_offloaded(o.offloader().read_offloaded(o.ledger_id, UUID))
    finally:
        o.store.put(ikey, index_bytes, o.store.head(ikey).metadata)
        o.replace_data(o.data)
