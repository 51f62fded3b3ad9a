"""The hot tier's frame ranges (<id>.rng: CRC32C per ~1 MiB of frames, written at seal) in use: the
offloader and the deletion-lag cleanup's proof check them instead of every frame's CRC, name the entry
that differs, fall back to every frame when a ledger has none, and leave nothing behind on failure."""

from __future__ import annotations

import logging
import os
import struct
import uuid as uuidlib
from itertools import accumulate
from pathlib import Path

import crc32c
import pytest

from tieredcore.cold.backends.fs import FilesystemBlobStore
from tieredcore.cold.transformed import TransformedBlobStore
from tieredcore.errors import CorruptEntryError, CorruptObjectError
from tieredcore.formats.frame_ranges import FrameRanges, decode_frame_ranges, encode_frame_ranges
from tieredcore.formats.transform import TransformSpec
from tieredcore.hot.local import LocalLedgerStore
from tieredcore.offload.cache import OffsetCache
from tieredcore.offload.offloader import LedgerOffloader
from tieredcore.offload.verify import hot_frame_ranges, verify_offloaded

UUID = uuidlib.UUID("0badcafe-0000-4000-8000-0000000f00d5")
N = 3000  # ~3 MiB of ~1 KiB entries: four ranges of ~1 MiB


def payload(i: int) -> bytes:
    head = f"<{i}>".encode()
    return (head * 200)[: 900 + i % 250]


def sealed(hot: LocalLedgerStore, n: int = N, singles: int = 5) -> int:
    """A ledger written the way producers do: appends in bulk and a few one at a time."""
    w = hot.create_ledger({"application": b"test"})
    w.append_many(payload(i) for i in range(n - singles))
    for i in range(n - singles, n):
        w.append(payload(i))
    w.close()
    return w.ledger_id


def rng_path(tmp_path: Path, lid: int) -> Path:
    return tmp_path / "hot" / f"{lid}.rng"


def flip_log_byte(tmp_path: Path, lid: int, entry: int, within: int = 40) -> None:
    """Flip a payload byte of ``entry`` in the hot tier's .log (bit rot under a sealed ledger)."""
    ends = list(accumulate((12 + len(payload(i)) for i in range(N)), initial=0))
    path = tmp_path / "hot" / f"{lid}.log"
    data = bytearray(path.read_bytes())
    data[ends[entry] + 12 + within] ^= 0x20
    path.write_bytes(bytes(data))


def leftovers(store) -> list:  # noqa: ANN001
    return [*(o.key for o in store.list("").objects), *store.list_multipart_uploads("")]


@pytest.fixture(params=["fs-kernel-copy", "s3-parts", "transformed-blocks"])
def cold(request: pytest.FixtureRequest, tmp_path: Path):
    """One store per way the offloader reads hot frames: file slices copied by the kernel while the
    frames are checked (fs), parts filled from checked windows (S3 on moto), whole blocks (transformed)."""
    if request.param == "fs-kernel-copy":
        return FilesystemBlobStore(tmp_path / "cold")
    if request.param == "s3-parts":
        return request.getfixturevalue("s3_store")
    return TransformedBlobStore(FilesystemBlobStore(tmp_path / "cold"), TransformSpec("zstd"))


def offloader(store, **kw) -> LedgerOffloader:  # noqa: ANN001
    opts = {"max_block_size": 1 << 20, "offset_cache": OffsetCache(), "part_size": 5 << 20, **kw}
    return LedgerOffloader(store, **opts)


def test_seal_writes_ranges_that_describe_the_log(tmp_path: Path) -> None:
    hot = LocalLedgerStore(tmp_path / "hot")
    lid = sealed(hot)
    h = hot.open_ledger(lid)
    r = h.frame_ranges()
    assert r is not None and len(r) >= 3 and r.range_bytes == 1 << 20
    log = (tmp_path / "hot" / f"{lid}.log").read_bytes()
    bounds = [*r.offsets, len(log)]
    assert [crc32c.crc32c(log[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)] == list(r.crcs)
    assert all(h.frame_offset(f) == o for f, o in zip(r.firsts, r.offsets, strict=True))
    hot.delete_ledger(lid)
    assert not rng_path(tmp_path, lid).exists()


def test_an_orphaned_ranges_file_is_swept(tmp_path: Path) -> None:
    hot = LocalLedgerStore(tmp_path / "hot")
    lid = sealed(hot, n=10)
    (tmp_path / "hot" / f"{lid}.meta").unlink()  # a crash in the middle of a delete
    assert hot.list_ledgers() == []
    assert not rng_path(tmp_path, lid).exists() and not (tmp_path / "hot" / f"{lid}.log").exists()


@pytest.mark.parametrize("why", ["recovered", "damaged", "index-does-not-add-up"])
def test_without_usable_ranges_every_frame_is_checked(tmp_path: Path, why: str,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    hot = LocalLedgerStore(tmp_path / "hot")
    if why == "recovered":  # the writer went away; recovery seals it: no ranges were written
        w = hot.create_ledger({})
        w.append_many(payload(i) for i in range(N))
        w.release()
        lid = w.ledger_id
        hot.seal_ledger(lid)
        assert not rng_path(tmp_path, lid).exists()
    else:
        lid = sealed(hot)
        if why == "damaged":
            p = rng_path(tmp_path, lid)
            p.write_bytes(p.read_bytes()[:-3])
        else:  # entry 7's record says 1 byte longer, entry 8's 1 shorter: the sum is right, an offset not
            idx = tmp_path / "hot" / f"{lid}.idx"
            raw = bytearray(idx.read_bytes())
            for e, d in ((7, 1), (8, -1)):
                off, crc, n = struct.unpack_from(">qIi", raw, 16 * e)
                struct.pack_into(">qIi", raw, 16 * e, off, crc, n + d)
            idx.write_bytes(bytes(raw))
    h = hot.open_ledger(lid)
    with caplog.at_level(logging.WARNING):
        assert h.frame_ranges() is None
    if why == "damaged":
        assert "frame ranges ignored" in caplog.text
    store = FilesystemBlobStore(tmp_path / "cold")
    if why == "index-does-not-add-up":  # every frame checked on its own: the bad record is named
        with pytest.raises(CorruptEntryError, match="entry 7"):
            offloader(store).offload(h, UUID)
        assert leftovers(store) == []
        return
    obj = offloader(store).offload(h, UUID)
    rep = verify_offloaded(offloader(store).read_offloaded(lid, UUID), h.entry_crcs(),
                           expected_sizes=h.entry_sizes(), expected_ranges=hot_frame_ranges(h))
    assert rep.entries == obj.entries == N


@pytest.mark.parametrize("entry", [0, 1234, N - 1])
def test_offload_names_the_entry_whose_bytes_rotted(tmp_path: Path, cold, entry: int) -> None:
    hot = LocalLedgerStore(tmp_path / "hot")
    lid = sealed(hot)
    flip_log_byte(tmp_path, lid, entry)
    h = hot.open_ledger(lid)
    assert h.frame_ranges() is not None  # the range check is what finds it
    with pytest.raises(CorruptEntryError, match=rf"ledger {lid} entry {entry}: CRC32C mismatch"):
        offloader(cold).offload(h, UUID)
    assert leftovers(cold) == []


def test_ranges_that_disagree_with_intact_frames_fail_the_offload(tmp_path: Path, cold) -> None:
    """Each frame matches its own CRC but a range does not (the .rng rewritten with a wrong value and a
    right file checksum): the offload names the range and writes nothing."""
    hot = LocalLedgerStore(tmp_path / "hot")
    lid = sealed(hot)
    p = rng_path(tmp_path, lid)
    h0 = hot.open_ledger(lid)
    r = decode_frame_ranges(p.read_bytes(), N, h0.frame_offset(N))
    r.crcs[1] ^= 0x10
    p.write_bytes(encode_frame_ranges(r))
    h = hot.open_ledger(lid)
    with pytest.raises(CorruptEntryError, match=rf"entries {r.firsts[1]}\.\.{r.firsts[2] - 1} .* not the "
                                                rf"{r.crcs[1]:08x} recorded for them at seal"):
        offloader(cold).offload(h, UUID)
    assert leftovers(cold) == []


def test_offload_with_ranges_writes_the_same_objects(tmp_path: Path) -> None:
    """Checking ranges instead of frames changes nothing in what is written."""
    hot = LocalLedgerStore(tmp_path / "hot")
    lid = sealed(hot)
    with_ranges = FilesystemBlobStore(tmp_path / "a")
    offloader(with_ranges).offload(hot.open_ledger(lid), UUID)
    os.unlink(rng_path(tmp_path, lid))
    h = hot.open_ledger(lid)
    assert h.frame_ranges() is None
    without = FilesystemBlobStore(tmp_path / "b")
    obj = offloader(without).offload(h, UUID)
    for key in (obj.data_key, obj.index_key):
        assert with_ranges.get(key) == without.get(key)


@pytest.mark.parametrize("entry", [0, 1500, N - 1])
def test_the_proof_names_the_entry_that_differs_from_the_hot_copy(tmp_path: Path, entry: int) -> None:
    """A copy without chunk checksums (so only the comparison with the hot copy can see it) whose frame
    of ``entry`` differs: the range check names that entry and its bytes, as the per-frame check does."""
    hot = LocalLedgerStore(tmp_path / "hot")
    lid = sealed(hot)
    store = FilesystemBlobStore(tmp_path / "cold")
    off = offloader(store, checksum_chunk=0)
    obj = off.offload(hot.open_ledger(lid), UUID)
    h = hot.open_ledger(lid)
    ranges = hot_frame_ranges(h)
    assert ranges is not None
    assert verify_offloaded(off.read_offloaded(lid, UUID), h.entry_crcs(), expected_sizes=h.entry_sizes(),
                            expected_ranges=ranges, window=256 << 10).entries == N
    data = bytearray(store.get(obj.data_key))
    per_frame = None
    # find the entry's frame by its header, flip a payload byte
    at = data.find(struct.pack(">iq", len(payload(entry)), entry))
    data[at + 12 + 7] ^= 1
    store.put(obj.data_key, bytes(data), store.head(obj.data_key).metadata)
    messages = []
    for rng in (ranges, None):
        with pytest.raises(CorruptObjectError, match=rf"entry {entry} at bytes (\d+)-(\d+) differs from the "
                                                     r"hot copy") as ei:
            verify_offloaded(off.read_offloaded(lid, UUID), h.entry_crcs(), expected_sizes=h.entry_sizes(),
                             expected_ranges=rng, window=256 << 10)
        messages.append(str(ei.value))
        per_frame = ei.value
    assert messages[0] == messages[1] and f"bytes {at}-{at + 12 + len(payload(entry)) - 1}" in str(per_frame)


def test_the_proof_names_a_range_when_every_frame_matches(tmp_path: Path) -> None:
    hot = LocalLedgerStore(tmp_path / "hot")
    lid = sealed(hot)
    store = FilesystemBlobStore(tmp_path / "cold")
    off = offloader(store)
    off.offload(hot.open_ledger(lid), UUID)
    h = hot.open_ledger(lid)
    r = hot_frame_ranges(h)
    assert r is not None
    wrong = FrameRanges(r.range_bytes, r.entries, r.end, r.firsts, r.offsets, r.crcs[:])
    wrong.crcs[1] ^= 4
    with pytest.raises(CorruptObjectError, match=rf"entries {r.firsts[1]}\.\.{r.firsts[2] - 1} differ from the hot "
                                                 r"copy .* each frame matches its own CRC"):
        verify_offloaded(off.read_offloaded(lid, UUID), h.entry_crcs(), expected_sizes=h.entry_sizes(),
                         expected_ranges=wrong)


@pytest.mark.parametrize("window", [512 << 10, 4096 + 7])
def test_parts_filled_from_frame_runs_hold_the_same_object(tmp_path: Path, s3_store, monkeypatch,
                                                           window: int) -> None:
    """Parts cut at 5 MiB from runs of whole entries read straight into the part buffers (through a scratch
    window where a run straddles two parts): the S3 object is byte for byte the filesystem store's."""
    import tieredcore.offload.offloader as offloader_mod

    monkeypatch.setattr(offloader_mod, "CHECK_WINDOW", window)
    hot = LocalLedgerStore(tmp_path / "hot")
    w = hot.create_ledger({})
    w.append_many(payload(i) * 3 for i in range(4000))  # ~12 MiB: three parts
    w.close()
    fs = FilesystemBlobStore(tmp_path / "cold")
    want = offloader(fs, max_block_size=4 << 20).offload(hot.open_ledger(w.ledger_id), UUID)
    got = offloader(s3_store, max_block_size=4 << 20).offload(hot.open_ledger(w.ledger_id), UUID)
    assert got == want
    for key in (want.data_key, want.index_key):
        assert s3_store.get(key) == fs.get(key)
