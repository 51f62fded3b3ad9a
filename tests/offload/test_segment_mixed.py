"""A topic with a mixed history, end to end: its two oldest ledgers offloaded as V1 objects (ledger mode)
whose hot copies the deletion-lag cleanup then removed, the next ones offloaded by the streaming offload
as segments (spanning ledgers), the newest (open, holding entries) still only in the hot tier. Read back
through the topic reader and compared with the generator's payloads and digest, and the segments read
directly; once on the filesystem store and once on S3 (moto). On S3 a segment's object pair is also
parsed here, independently of tieredcore's codecs, against Pulsar's streaming layout (PIP-76:
StreamingDataBlockHeaderImpl, StreamingOffloadIndexBlockImpl).
"""

from __future__ import annotations

import struct
import uuid as uuidlib
from collections.abc import Iterator

import boto3
import pytest

from tests.support.segments import (
    GENERATED,
    MAX_SEGMENT,
    NS,
    ROLLOVER_MS,
    TOPIC,
    assert_segments_clean,
    build_topic,
    completed_segments,
    digest_of,
    drain_and_reconcile,
    expected_payloads,
    generated_digest,
    hot_snapshot,
    read_topic,
    segment_offloader,
    streaming,
)
from tests.support.workspaces import END_MS, offload
from tieredcore.clock import now_ms
from tieredcore.config import ENV_CONFIG, ENV_OVERRIDES, Config
from tieredcore.formats.proto import MLDataFormats_pb2 as pb
from tieredcore.lifecycle.drain import drain
from tieredcore.lifecycle.runner import run_work
from tieredcore.lifecycle.sweep import plan_lag_cleanup
from tieredcore.model import Position
from tieredcore.outcomes import Outcome
from tieredcore.topic.reader import TIER_HOT, TIER_OFFLOADED
from tieredcore.workspace import Workspace

TOTAL = 150
DAY_MS = 24 * 3600 * 1000


@pytest.fixture
def env_clean(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (*ENV_OVERRIDES, ENV_CONFIG):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TIERED_NO_PROGRESS", "1")


@pytest.fixture
def bucket(moto_endpoint: str) -> str:
    name = f"mixed-{uuidlib.uuid4().hex[:20]}"
    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1").create_bucket(Bucket=name)
    return name


@pytest.fixture(params=["fs", "s3"])
def mixed(request, tmp_path, env_clean) -> Iterator[tuple[Workspace, dict[int, list[bytes]], dict]]:
    """(workspace, the hot tier's entries per ledger before anything was offloaded, what was done)."""
    url = None
    if request.param == "s3":
        moto = request.getfixturevalue("moto_endpoint")
        url = f"s3://{request.getfixturevalue('bucket')}/p?endpoint={moto}&region=us-east-1"
    with Workspace(Config.load(build_topic(tmp_path / "ws", store_url=url), env={})) as ws:
        before = hot_snapshot(ws)
        lids = list(before)
        v1, open_lid = lids[:2], lids[-1]
        offload(ws, TOPIC, v1, END_MS)
        # deletion lag 0: the V1 ledgers' hot copies go (phase 1 + the drain)
        ps = ws.policies
        ps.set_namespace(NS, {"deletion_lag_ms": 0})
        rows = list(run_work(ws.config, [w.as_dict() for w in plan_lag_cleanup(ws, None, END_MS + 1)]))
        assert sorted((r["ledger"], r["outcome"]) for r in rows) == [(lid, "marked") for lid in v1], rows
        ps.set_namespace(NS, {"deletion_lag_ms": -1})
        assert drain(ws, END_MS + 1).deleted == 2
        assert not set(v1) & set(ws.hot.list_ledgers())
        # the streaming offload of everything after them up to the last sealed ledger's last entry, in
        # segments of 32 KiB (the three ledgers left, ~86 KiB, make at least three)
        last_sealed = lids[-2]
        res = streaming(ws).offload_topic(TOPIC, max_segment_size=MAX_SEGMENT // 2, rollover_ms=ROLLOVER_MS,
                                          as_of_ms=END_MS + 5000, force_tail=True,
                                          upto=Position(last_sealed, len(before[last_sealed]) - 1))
        assert res and [r.outcome for r in res] == [Outcome.OFFLOADED] * len(res), res
        yield ws, before, {"v1": set(v1), "open": open_lid, "results": res, "store": request.param}


def test_mixed_history_reads_back_identical(mixed):
    ws, before, done = mixed
    lids = list(before)
    segs = completed_segments(ws)
    assert len(segs) == len(done["results"]) >= 3
    assert any(len(p) >= 2 for p in segs.values()), "a segment spans ledgers"
    assert any(sum(lid == x[0] for p in segs.values() for x in p) >= 2 for lid in lids), "a ledger spans segments"

    # every entry through the topic reader, against the generator
    got, tiers = read_topic(ws)
    assert got == [e for lid in lids for e in before[lid]]
    assert got == expected_payloads(ws, TOTAL)
    count, sha = generated_digest(ws)
    assert count == GENERATED and digest_of(got[:count]) == sha
    assert digest_of(got) == digest_of(expected_payloads(ws, TOTAL))
    assert tiers[TIER_OFFLOADED] >= len(done["v1"])  # their hot copies are gone
    assert sum(tiers.values()) == len(lids)

    # the segments themselves hold every entry of the streamed ledgers; nothing else in the store
    later = max(now_ms(), END_MS) + DAY_MS
    drain_and_reconcile(ws, later)
    assert_segments_clean(ws, {lid: before[lid] for lid in lids}, v1=done["v1"], hot_only={done["open"]})


def test_reader_reads_segment_offloaded_ledgers_from_the_store(mixed):
    """tiered-storage-first: a sealed ledger whose entries all lie in completed segments has a complete
    object-store copy (context.is_offloaded) and is read from it; only the open ledger from the hot tier."""
    ws, before, done = mixed
    got, tiers = read_topic(ws)
    assert got == [e for v in before.values() for e in v]
    assert tiers == {TIER_HOT: 1, TIER_OFFLOADED: len(before) - 1}


# -- the S3 objects, parsed by hand ---------------------------------------------------------------

BLOCK_MAGIC = 0x26A66D32
INDEX_MAGIC = 0x3D1FB0BC
PADDING = bytes.fromhex("FEDCDEAD")


def parse_blocks(data: bytes) -> list[dict]:
    """Pulsar's streaming data blocks: [magic:int][headerLen:long][blockLen:long][firstEntryId:long]
    [ledgerId:long], zeros to headerLen, frames [len:int][entryId:long][payload], padding FE DC DE AD."""
    out, pos = [], 0
    while pos < len(data):
        magic, hlen, blen, first, lid = struct.unpack_from(">Iqqqq", data, pos)
        assert (magic, hlen) == (BLOCK_MAGIC, 128), f"block at {pos}: magic {magic:#x}, header length {hlen}"
        assert data[pos + 36: pos + 128] == bytes(92), f"block at {pos}: header padding not zero"
        assert 128 < blen <= len(data) - pos
        end, f = pos + blen, pos + 128
        entries: list[tuple[int, bytes]] = []
        while f + 12 <= end:
            n, eid = struct.unpack_from(">iq", data, f)
            if n < 0:
                break
            assert eid == first + len(entries), f"block at {pos}: entry {eid} after {first + len(entries) - 1}"
            entries.append((eid, data[f + 12: f + 12 + n]))
            f += 12 + n
        pad = data[f:end]
        assert pad == (PADDING * (len(pad) // 4 + 1))[: len(pad)], f"block at {pos}: padding"
        out.append({"offset": pos, "length": blen, "ledger": lid, "first": first, "entries": entries})
        pos = end
    assert pos == len(data)
    return out


def parse_index_v2(raw: bytes) -> tuple[int, dict[int, tuple[pb.ManagedLedgerInfo.LedgerInfo, list]]]:
    """[magic:int][indexLen:int][dataObjectLen:long][dataHeaderLen:long], then per ledger [ledgerId:long]
    [entryCount:int][metaLen:int][LedgerInfo][entryCount × (entryId:long, partId:int, offset:long)]."""
    magic, ilen, dlen, hlen = struct.unpack_from(">Iiqq", raw, 0)
    assert (magic, hlen) == (INDEX_MAGIC, 128)
    assert ilen == len(raw), "Pulsar reads sections until the stream ends: no trailing bytes"
    pos, sections = 24, {}
    while pos < len(raw):
        lid, n, mlen = struct.unpack_from(">qii", raw, pos)
        pos += 16
        li = pb.ManagedLedgerInfo.LedgerInfo()
        li.ParseFromString(raw[pos: pos + mlen])
        pos += mlen
        entries = [struct.unpack_from(">qiq", raw, pos + 20 * i) for i in range(n)]
        pos += 20 * n
        assert li.ledgerId == lid and lid not in sections
        sections[lid] = (li, entries)
    return dlen, sections


@pytest.mark.parametrize("mixed", ["s3"], indirect=True)
def test_a_segment_object_pair_on_s3_has_pulsars_v2_layout(mixed, moto_endpoint):
    ws, before, done = mixed
    segs = completed_segments(ws)
    uuid, pieces = next((u, p) for u, p in segs.items() if len(p) >= 2)  # one spanning two ledgers
    dkey, ikey = segment_offloader(ws).keys(uuid)
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    bucket = ws.store.bucket
    data_obj = s3.get_object(Bucket=bucket, Key=dkey)
    data = data_obj["Body"].read()
    raw = s3.get_object(Bucket=bucket, Key=ikey)["Body"].read()

    dlen, sections = parse_index_v2(raw)
    assert dlen == len(data)
    assert [(lid, entries[0][0], li.entries - 1) for lid, (li, entries) in sections.items()] == pieces
    blocks = parse_blocks(data)
    by_offset = {b["offset"]: b for b in blocks}
    # every index entry points at a block header of its ledger starting at its entry; the blocks, in
    # index order, are every block of the object
    listed = []
    for lid, (li, entries) in sections.items():
        for eid, part, off in entries:
            b = by_offset[off]
            assert (b["ledger"], b["first"]) == (lid, eid)
            listed.append((off, part))
        # the LedgerInfo says what a reader of the ledger needs: entries (last id + 1), size through there
        got = [p for b in blocks if b["ledger"] == lid for _e, p in b["entries"]]
        first = entries[0][0]
        assert got == before[lid][first: li.entries]
        assert li.size == sum(len(p) for p in before[lid][: li.entries])
    assert [off for off, _p in sorted(listed)] == [b["offset"] for b in blocks]
    parts = [p for _o, p in sorted(listed)]
    assert parts == sorted(parts) and parts[0] == 1 and len(set(parts)) == parts[-1]
    # a multipart object of as many parts as the index names
    assert data_obj["ETag"].strip('"').endswith(f"-{parts[-1]}")
