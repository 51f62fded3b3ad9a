"""Reading a segment whose blocks are exactly full: no padding, so the frame after a block's last entry
is the next block's header, whose streaming magic (0x26A66D32) is positive, unlike V1's. The read handle
must take it for a block start (it did not: 'expected entry 8 at offset 1024, found entry 128')."""

from __future__ import annotations

import uuid as uuidlib

import pytest

from tieredcore.formats.constants import BLOCK_HEADER_LENGTH, ENTRY_HEADER_SIZE
from tieredcore.offload.context import SegmentPiece
from tieredcore.offload.segments import SegmentOffloader, SegmentSource


@pytest.mark.parametrize("extra", [0, 1, 11, 12])  # padding after each block's last frame
def test_reads_across_full_and_nearly_full_blocks(make_ws, extra):
    ws = make_ws(["t/a"], ledgers=2, entries=40, entry_size="100")
    info, _ = ws.ml.get_topic("t/a/topic-0000")
    lids = [li.ledgerId for li in info.ledgerInfo[:2]]
    frame = ENTRY_HEADER_SIZE + 100
    block = BLOCK_HEADER_LENGTH + 8 * frame + extra  # 8 frames per block (1024 bytes when extra = 0)
    segs = SegmentOffloader(ws.offloader, block_size=block, min_part_size=0)
    handles = [ws.hot.open_ledger(lid) for lid in lids]
    try:
        expected = {lid: [e.data for e in h.read(0, 39)] for lid, h in zip(lids, handles, strict=True)}
        uuid = str(uuidlib.uuid4())
        obj = segs.write([SegmentSource(h, 0, 39) for h in handles], uuid)
    finally:
        for h in handles:
            h.close()
    assert obj.blocks == 10 and obj.data_length == 10 * block
    for lid in lids:
        h = segs.open_ledger(lid, [SegmentPiece(uuid, 0, 39)], closed=True)
        try:
            assert [e.data for e in h.read(0, 39)] == expected[lid]
            for first, last in ((7, 8), (8, 8), (15, 17), (0, 0), (39, 39), (5, 33)):
                assert [e.data for e in h.read(first, last)] == expected[lid][first: last + 1], (first, last)
        finally:
            h.close()
