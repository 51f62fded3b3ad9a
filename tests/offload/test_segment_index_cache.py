"""The shared cache of parsed segment indexes holds what readers opted into, nothing else: a compaction
verifying hundreds of new segments (or a scrub) opens indexes fresh and must not leave each parsed
index (its sections and one CRC per 8 KiB chunk: about 1.5 MiB for a 256 MiB segment) in the cache,
or the process grows by up to the cache's 256 entries whatever its own memory bound."""

from __future__ import annotations

import uuid as uuidlib

import pytest

from tieredcore.cold.backends.fs import FilesystemBlobStore
from tieredcore.model import Entry
from tieredcore.offload.cache import SHARED_SEGMENT_INDEX_CACHE
from tieredcore.offload.offloader import LedgerOffloader
from tieredcore.offload.segments import SegmentOffloader, SegmentSource


class ListHandle:
    def __init__(self, ledger_id: int, payloads: list[bytes]) -> None:
        self.ledger_id = ledger_id
        self.payloads = payloads
        self.last_add_confirmed = len(payloads) - 1
        self.is_closed = True

    def read(self, first: int, last: int) -> list[Entry]:
        return [Entry(i, self.payloads[i]) for i in range(first, last + 1)]

    def close(self) -> None:
        pass


@pytest.fixture
def segment(tmp_path):
    off = LedgerOffloader(FilesystemBlobStore(tmp_path), "p", checksum_chunk=1000)
    segs = SegmentOffloader(off, block_size=2048, min_part_size=0)
    handles = [ListHandle(10 + i, [bytes([i, j]) * (40 + 30 * j) for j in range(4)]) for i in range(3)]
    u = str(uuidlib.uuid4())
    segs.write([SegmentSource(h, 0, h.last_add_confirmed) for h in handles], u)
    return segs, u, [(h.ledger_id, 0, h.last_add_confirmed) for h in handles]


def test_fresh_opens_leave_the_cache_alone(segment):
    segs, u, pieces = segment
    segs.open_pieces(u, pieces)  # compaction's verification
    segs.open_piece(u, *pieces[1])  # a single fresh open (scrub)
    hits, misses = SHARED_SEGMENT_INDEX_CACHE.hits, SHARED_SEGMENT_INDEX_CACHE.misses
    segs.open_piece(u, *pieces[0], cached_index=True)  # a reader: not cached by the fresh opens
    assert (SHARED_SEGMENT_INDEX_CACHE.hits, SHARED_SEGMENT_INDEX_CACHE.misses) == (hits, misses + 1)


def test_readers_share_a_cached_index(segment):
    segs, u, pieces = segment
    segs.open_piece(u, *pieces[0], cached_index=True)
    hits = SHARED_SEGMENT_INDEX_CACHE.hits
    h = segs.open_piece(u, *pieces[2], cached_index=True)
    assert SHARED_SEGMENT_INDEX_CACHE.hits == hits + 1
    assert [bytes(e.data) for e in h.read(0, 3)] == [bytes([2, j]) * (40 + 30 * j) for j in range(4)]
