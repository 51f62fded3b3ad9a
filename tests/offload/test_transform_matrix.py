"""The end-to-end matrix of chunked objects (issue 11) on the filesystem store: every transform (none, zstd,
aes, zstd+aes) × chunk size (an odd 5003 bytes, 1 MiB, 4 MiB) × chunk cache (none, memory, disk) × read
pattern (sequential catch-up through the topic reader, random single entries, ranges across chunk and
block borders, the last partial chunk), every byte compared with the hot copy.

One workspace per transform (module-scoped): text-like (compressible) topics, one per chunk size, each
with two sealed ledgers offloaded by the sweep; ledgers big enough for several chunks of their topic's
size (the 4 MiB topic's data objects hold more than two chunks), blocks small enough for several blocks.
Each test opens its own Workspace over the same objects with another cache configuration. Raw byte
ranges of the logical data objects are compared with the object rebuilt from the hot entries (V1 block
framing: header, frames, padding), so a wrong byte anywhere in a chunk is caught, not only in entries.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from tests.support.workspaces import END_ISO, END_MS
from tieredcore.cli import main as cli
from tieredcore.cold.keyring import KeyRing
from tieredcore.cold.transformed import TransformedBlobStore
from tieredcore.config import CONFIG_FILE_NAME, Config
from tieredcore.formats.block import block_header, encode_consecutive_frames, padding
from tieredcore.formats.constants import BLOCK_HEADER_LENGTH, ENTRY_HEADER_SIZE
from tieredcore.formats.index import LedgerIndex
from tieredcore.lifecycle.runner import run_work
from tieredcore.lifecycle.sweep import plan_offload
from tieredcore.lifecycle.work import LedgerResult
from tieredcore.names import TopicName
from tieredcore.offload.copies import open_offloaded
from tieredcore.offload.reader import OffloadedLedgerHandle
from tieredcore.workspace import Workspace

NS = "m/x"
MIB = 1024 * 1024
TRANSFORMS = ("none", "zstd", "aes", "zstd+aes")
CACHES = ("none", "memory", "disk")
PATTERNS = ("sequential", "random", "borders", "last-chunk")


@dataclass(frozen=True)
class Shape:
    """A topic of the matrix: its chunk size, block size and generated ledgers."""

    chunk_size: int
    block_size: int
    entries: int
    entry_size: str


# every data object holds several chunks and several blocks of its topic (checked when built)
SHAPES = {
    "odd-5003": Shape(5003, 256 * 1024, 40, "1K-64K"),
    "1MiB": Shape(MIB, 1 * MIB, 20, "64K-320K"),
    "4MiB": Shape(4 * MIB, 2 * MIB, 24, "128K-704K"),
}


@dataclass
class Built:
    transform: str
    config: Config
    hot: dict[str, dict[int, list[bytes]]]  # topic -> ledger -> payloads (the hot copy)


def _topic(shape: str) -> str:
    return f"persistent://{NS}/{shape.replace('-', '')}-0000"


@pytest.fixture(scope="module")
def ring_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("matrix-keys") / "ring"
    KeyRing.add_key(d, "kek-1", bits=2048)
    return d


@pytest.fixture(scope="module", params=TRANSFORMS)
def built(request, tmp_path_factory, ring_dir) -> Built:
    transform = request.param
    root = tmp_path_factory.mktemp(f"matrix-{transform.replace('+', '-')}")
    cfg_path = root / CONFIG_FILE_NAME
    cfg_path.write_text(Config.for_workspace(root, key_ring=str(ring_dir)).to_toml())
    mp = pytest.MonkeyPatch()
    mp.setenv("TIERED_NO_PROGRESS", "1")
    try:
        assert cli.main(["init", str(root)]) == 0
        for name, s in SHAPES.items():
            assert cli.main(["--workspace", str(root), "generate", "--namespace", NS, "--prefix", name.replace("-", ""),
                             "--topics", "1", "--ledgers", "2", "--entries", str(s.entries), "--entry-size",
                             s.entry_size, "--payload", "text", "--end-time", END_ISO]) == 0
    finally:
        mp.undo()
    config = Config.load(cfg_path, env={})
    with Workspace(config) as ws:
        ps = ws.policies
        ps.set_namespace(NS, {"offload_threshold_bytes": 0, "transform": transform})
        for name, s in SHAPES.items():
            ps.set_topic(_topic(name), {"transform_chunk_size": s.chunk_size, "max_block_size": s.block_size})
        res = [LedgerResult(**r) for r in run_work(config, [w.as_dict() for w in plan_offload(ws, None, END_MS)])]
        assert len(res) == 2 * len(SHAPES) and {r.outcome for r in res} == {"offloaded"}, res
        hot = {}
        for name, s in SHAPES.items():
            t = _topic(name)
            hot[t] = {}
            for li in ws.ml.get_topic(t)[0].ledgerInfo[:-1]:
                with ws.hot.open_ledger(li.ledgerId) as h:
                    hot[t][li.ledgerId] = [bytes(e.data) for e in h.read(0, h.last_add_confirmed)]
                h = _handle(ws, t, li.ledgerId)
                assert len(h.index.entries) >= 3, "several blocks per data object"
                if transform == "none":
                    assert not isinstance(h.store, TransformedBlobStore)
                    continue
                m = h.store.open(h.key).manifest  # the policy's transform, chunk size, with several chunks
                assert (m.compression == "zstd") == transform.startswith("zstd")
                assert m.encrypted == transform.endswith("aes") and m.index.chunk_size == s.chunk_size
                assert m.index.count >= 3 and m.index.chunk(m.index.count - 1).original_size < s.chunk_size
    return Built(transform, config, hot)


def _handle(ws: Workspace, topic: str, ledger_id: int) -> OffloadedLedgerHandle:
    info, _ = ws.ml.get_topic(topic)
    li = next(li for li in info.ledgerInfo if li.ledgerId == ledger_id)
    h = open_offloaded(li, ws.offloader, TopicName.parse(topic).managed_ledger_name, ws.offloader_for_driver)
    assert isinstance(h, OffloadedLedgerHandle)
    return h


def _logical_object(index: LedgerIndex, payloads: list[bytes]) -> bytes:
    """The V1 data object of these entries with the index's blocks (what the transform must give back)."""
    out = bytearray()
    for i, (ie, size) in enumerate(zip(index.entries, index.block_sizes(), strict=True)):
        last = index.entries[i + 1].first_entry_id - 1 if i + 1 < len(index.entries) else len(payloads) - 1
        frames = encode_consecutive_frames(ie.first_entry_id, payloads[ie.first_entry_id: last + 1])
        assert len(out) == ie.offset
        out += block_header(ie.first_entry_id, size) + frames + padding(size - BLOCK_HEADER_LENGTH - len(frames))
    assert len(out) == index.data_object_length
    return bytes(out)


def _frame_starts(index: LedgerIndex, payloads: list[bytes]) -> list[int]:
    """The data-object offset of every entry's frame."""
    starts = []
    for i, ie in enumerate(index.entries):
        last = index.entries[i + 1].first_entry_id - 1 if i + 1 < len(index.entries) else len(payloads) - 1
        pos = ie.offset + BLOCK_HEADER_LENGTH
        for e in range(ie.first_entry_id, last + 1):
            starts.append(pos)
            pos += ENTRY_HEADER_SIZE + len(payloads[e])
    return starts


def _entry_at(starts: list[int], offset: int) -> int:
    """The entry whose frame holds ``offset`` (or, in padding or a block header, the next entry)."""
    e = max(i for i, s in enumerate(starts) if s <= offset) if offset >= starts[0] else 0
    return e


def _read(h: OffloadedLedgerHandle, first: int, last: int) -> list[bytes]:
    return [bytes(e.data) for e in h.read(first, last)]


def _cache_spec(cache: str, tmp_path: Path) -> str:
    return f"disk:{tmp_path / 'chunk-cache'}" if cache == "disk" else cache


# -- the read patterns (each compares with the hot copy) -------------------------------------------


def _sequential(ws: Workspace, topic: str, want: dict[int, list[bytes]], chunk: int) -> None:
    r = ws.reader()
    try:
        got = [bytes(d) for _p, d in r.read(topic)]
        assert r.fallbacks == 0 and r.tier_reads["offloaded"] == len(want)  # no hot copy stood in
    finally:
        r.close()
    assert got == [p for lid in sorted(want) for p in want[lid]]


def _random(ws: Workspace, topic: str, want: dict[int, list[bytes]], chunk: int) -> None:
    rnd = random.Random(f"{topic}/{chunk}")
    picks = {lid: rnd.sample(range(len(p)), 8) for lid, p in want.items()}
    for lid, ids in picks.items():
        h = _handle(ws, topic, lid)
        for e in ids:
            assert _read(h, e, e) == [want[lid][e]]
        h.close()
    cache = ws.opened_chunk_cache()
    if cache is None:
        return
    # warm: the same entries through new handles are served from the cache (no chunk is missed)
    cache.wait_prefetch()
    before = cache.stats.misses
    for lid, ids in picks.items():
        h = _handle(ws, topic, lid)
        for e in ids:
            assert _read(h, e, e) == [want[lid][e]]
    assert cache.stats.misses == before


def _borders(ws: Workspace, topic: str, want: dict[int, list[bytes]], chunk: int) -> None:
    for lid, payloads in want.items():
        h = _handle(ws, topic, lid)
        idx = h.index
        logical = _logical_object(idx, payloads)
        starts = _frame_starts(idx, payloads)
        # entries across every block border (the previous block's padding and the next header between)
        for ie in idx.entries[1:]:
            f = ie.first_entry_id
            assert _read(h, f - 1, f) == payloads[f - 1: f + 1]
            assert _read(h, f - 2, min(f + 1, len(payloads) - 1)) == payloads[f - 2: f + 2]
        # entries and raw bytes across chunk borders (at most 24 of them, spread over the object)
        borders = list(range(chunk, len(logical), chunk))
        step = max(1, len(borders) // 24)
        for x in borders[::step]:
            e = _entry_at(starts, x)
            lo, hi = max(0, e - 1), min(len(payloads) - 1, e + 1)
            assert _read(h, lo, hi) == payloads[lo: hi + 1]
            for a, b in ((x - 1, x), (x - 7, x + 6), (x - chunk - 1, x + chunk + 1), (x, x + 2 * chunk)):
                a, b = max(0, a), min(len(logical) - 1, b)
                assert h.store.get_range(h.key, a, b) == logical[a: b + 1], (a, b)
        # raw bytes across block borders
        for ie in idx.entries[1:]:
            a, b = ie.offset - 13, ie.offset + BLOCK_HEADER_LENGTH + 13
            assert h.store.get_range(h.key, a, b) == logical[a: b + 1]
        h.close()


def _last_chunk(ws: Workspace, topic: str, want: dict[int, list[bytes]], chunk: int) -> None:
    for lid, payloads in want.items():
        h = _handle(ws, topic, lid)
        n = len(payloads)
        assert _read(h, n - 1, n - 1) == [payloads[-1]]
        assert _read(h, n - 3, n - 1) == payloads[-3:]
        logical = _logical_object(h.index, payloads)
        size = len(logical)
        last_start = (size - 1) // chunk * chunk  # the last chunk: partial (checked when built)
        assert h.store.head(h.key).size == size
        for a, b in ((size - 1, size - 1), (size - 5, size - 1), (last_start, size - 1), (last_start - 3, size - 1),
                     (last_start - 3, last_start + 2), (size - 1, size + 100)):
            assert h.store.get_range(h.key, a, b) == logical[a: min(b, size - 1) + 1], (a, b)
        assert h.store.get(h.key) == logical
        h.close()


READS = {"sequential": _sequential, "random": _random, "borders": _borders, "last-chunk": _last_chunk}


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("shape", list(SHAPES))
def test_reads_are_byte_identical_to_the_hot_copy(built: Built, shape, cache, pattern, tmp_path):
    config = replace(built.config, chunk_cache=_cache_spec(cache, tmp_path))
    topic = _topic(shape)
    with Workspace(config) as ws:
        READS[pattern](ws, topic, built.hot[topic], SHAPES[shape].chunk_size)
        opened = ws.opened_chunk_cache()
        if built.transform == "none" or cache == "none":
            assert opened is None  # untransformed objects never open a cache; "none" configures none
            return
        opened.wait_prefetch()
        st = opened.stats
        assert opened.kind == cache and st.misses > 0 and st.loads > 0 and st.load_failures == 0
        if pattern == "sequential":  # catch-up reads ahead: chunks loaded before the reader asked
            assert st.prefetched > 0 and st.hits > 0
        if cache == "disk":
            assert len(list((tmp_path / "chunk-cache").iterdir())) == len(opened) > 0
