"""Streaming-offload (PIP-76) test support: a topic whose segments span ledgers and whose ledgers span
segments, the streaming offloader the tests run, and the checks every test ends with.

The topic (:func:`build_topic`): ``tiered generate`` writes three sealed ledgers of 40 entries of
200-3000 bytes (about 64 KiB each); a TopicWriter then appends 30 more entries from the same generator
(continuing its sequence numbers) with rollover every 12 entries: two small sealed ledgers and the open
newest ledger holding 6 entries. Cut into segments of at most 64 KiB of 8 KiB blocks, the five segments
cross every ledger boundary but one, and the three big ledgers each lie in two segments.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support.workspaces import END_MS, build_workspace
from tieredcore.cli.workload import (
    PROP_COUNT,
    PROP_MAX,
    PROP_MIN,
    PROP_SEED,
    PROP_SHA,
    Digest,
    PayloadGenerator,
)
from tieredcore.cold.blob import iter_objects
from tieredcore.config import Config
from tieredcore.formats.keys import is_topic_manifest_key, parse_key
from tieredcore.lifecycle.drain import drain
from tieredcore.lifecycle.reconcile.run import reconcile
from tieredcore.names import TopicName
from tieredcore.offload.context import (
    covered_through,
    is_complete,
    is_sealed,
    segment_pieces,
    segment_refs,
)
from tieredcore.offload.ownership import is_marker_key
from tieredcore.offload.segments import SegmentOffloader
from tieredcore.offload.streaming import StreamingOffloader
from tieredcore.topic.writer import TopicWriter
from tieredcore.workspace import Workspace

NS = "t/a"
TOPIC = "persistent://t/a/topic-0000"
BLOCK_SIZE = 8192
MAX_SEGMENT = 64 * 1024
ROLLOVER_MS = 10 * 60 * 1000
GENERATED = 3 * 40  # entries `tiered generate` writes
APPENDED = 30  # entries the TopicWriter appends after them (12 + 12 sealed, 6 in the open ledger)
WRITER_MAX_ENTRIES = 12
DAY_MS = 24 * 3600 * 1000

Snapshot = dict[int, list[bytes]]  # ledger id -> its entries, in order


def build_topic(root: Path, store_url: str | None = None, *, appended: int = APPENDED) -> Path:
    """The topic of the module docstring; returns tiered.toml."""
    cfg = build_workspace(root, [NS], topics=1, ledgers=3, entries=40, entry_size="200-3000", store_url=store_url)
    with Workspace(Config.load(cfg, env={})) as ws:
        append_entries(ws, appended)
    return cfg


def generator(ws: Workspace, topic: str = TOPIC) -> PayloadGenerator:
    info, _ = ws.ml.get_topic(topic)
    p = {kv.key: kv.value for kv in info.properties}
    return PayloadGenerator(int(p[PROP_SEED]), TopicName.parse(topic).managed_ledger_name,
                            int(p[PROP_MIN]), int(p[PROP_MAX]))


def generated_digest(ws: Workspace, topic: str = TOPIC) -> tuple[int, str]:
    """(count, sha256) the generator recorded for the entries it wrote."""
    info, _ = ws.ml.get_topic(topic)
    p = {kv.key: kv.value for kv in info.properties}
    return int(p[PROP_COUNT]), p[PROP_SHA]


def expected_payloads(ws: Workspace, count: int, topic: str = TOPIC) -> list[bytes]:
    """Payloads #0..count-1 of the topic's generator: what the topic holds, in topic order."""
    return list(generator(ws, topic).payloads(0, count))


def append_entries(ws: Workspace, count: int, topic: str = TOPIC, clock_ms: Callable[[], int] | None = None,
                   max_entries: int = WRITER_MAX_ENTRIES) -> None:
    """Append the generator's next `count` payloads (a writer finding the newest ledger open seals it
    first, dropping it when empty); the newest ledger is left open with what it holds."""
    first = sum(len(v) for v in hot_snapshot(ws, topic).values())
    w = TopicWriter(ws.ml, ws.hot, topic, max_entries=max_entries, clock_ms=clock_ms or (lambda: END_MS + 1000))
    w.append_many(generator(ws, topic).payloads(first, count))
    w.close(seal=False)


def segment_offloader(ws: Workspace) -> SegmentOffloader:
    return SegmentOffloader(ws.offloader, block_size=BLOCK_SIZE, min_part_size=0)


def streaming(ws: Workspace, *, clock_ms: int | Callable[[], int] = END_MS + 5000, leases: bool = True,
              **kw: Any) -> StreamingOffloader:
    clock = clock_ms if callable(clock_ms) else (lambda: clock_ms)
    return StreamingOffloader(kw.pop("ml", ws.ml), ws.hot, kw.pop("segments", None) or segment_offloader(ws),
                              clock_ms=clock, deletion_log=ws.deletion_log,
                              leases=ws.leases if leases else None, **kw)


def offload_everything(so: StreamingOffloader, as_of_ms: int = END_MS + 5000, topic: str = TOPIC):
    """Every entry of the topic, its open ledger's included (the tail forced)."""
    return so.offload_topic(topic, max_segment_size=MAX_SEGMENT, rollover_ms=ROLLOVER_MS, as_of_ms=as_of_ms,
                            force_tail=True)


def hot_snapshot(ws: Workspace, topic: str = TOPIC) -> Snapshot:
    """Every entry of every ledger of the topic, read from the hot tier (open ledgers up to their last
    confirmed entry)."""
    info, _ = ws.ml.get_topic(topic)
    out: Snapshot = {}
    for li in info.ledgerInfo:
        with ws.hot.open_ledger(li.ledgerId) as h:
            lac = h.last_add_confirmed
            out[li.ledgerId] = [bytes(e.data) for e in h.read(0, lac)] if lac >= 0 else []
    return out


def store_keys(ws: Workspace) -> list[str]:
    """Every object key under the workspace's prefix but its owner marker and topic manifests."""
    prefix = ws.offloader.prefix
    return sorted(o.key for o in iter_objects(ws.store, prefix)
                  if not is_marker_key(o.key, prefix) and not is_topic_manifest_key(o.key, prefix))


def store_uploads(ws: Workspace) -> list[str]:
    return sorted(u.key for u in ws.store.list_multipart_uploads(ws.offloader.prefix))


def segment_keys_of(ws: Workspace, uuid: str) -> list[str]:
    """The keys of `uuid`'s objects present in the store."""
    seg = segment_offloader(ws)
    return [k for k in seg.keys(uuid) if k in set(store_keys(ws))]


def completed_segments(ws: Workspace, topic: str = TOPIC) -> dict[str, list[tuple[int, int, int]]]:
    """uuid -> the (ledger, first, last) pieces the topic's completed segments hold, in topic order."""
    info, _ = ws.ml.get_topic(topic)
    out: dict[str, list[tuple[int, int, int]]] = {}
    for li in info.ledgerInfo:
        for p in segment_pieces(li):
            out.setdefault(p.uuid, []).append((li.ledgerId, p.first, p.last))
    return out


def incomplete_segments(ws: Workspace, topic: str = TOPIC) -> dict[str, list[int]]:
    """uuid -> the ledgers an incomplete (assigned, in flight or abandoned) segment is recorded on."""
    info, _ = ws.ml.get_topic(topic)
    out: dict[str, list[int]] = {}
    for li in info.ledgerInfo:
        for r in segment_refs(li):
            if not r.complete:
                out.setdefault(r.uuid, []).append(li.ledgerId)
    return out


def drain_and_reconcile(ws: Workspace, as_of_ms: int) -> None:
    """Phase 2 until the log is empty, a reconciliation (grace 0) and a final drain: what an operator's
    scheduled jobs do after a crash. Nothing may fail or be dead-lettered, and reconciliation must find
    nothing the drain left behind. (Reconciliation does not yet record orphaned segment objects, see
    tieredcore/lifecycle/reconcile/orphans.py: assert_segments_clean lists the store itself.)"""
    for _ in range(3):
        rep = drain(ws, as_of_ms)
        assert (rep.retrying, rep.dead_lettered, rep.malformed, rep.refused_mismatch, rep.refused_foreign) == \
            (0, 0, 0, 0, 0), rep.rows
        if not ws.deletion_log.pending():
            break
        as_of_ms += DAY_MS
    # the drain alone left nothing for reconciliation to find (a dry run, no grace), then a real run
    dry = reconcile(ws, as_of_ms, grace_ms=0, dry_run=True)
    assert (dry.orphan_groups, dry.hot_orphans, dry.stale_uploads, dry.errors) == (0, 0, 0, []), dry.records
    rec = reconcile(ws, as_of_ms, grace_ms=0)
    assert rec.errors == [], rec.errors
    rep = drain(ws, as_of_ms)
    assert (rep.retrying, rep.dead_lettered) == (0, 0), rep.rows


def assert_segments_clean(ws: Workspace, before: Snapshot, topic: str = TOPIC, *,
                          v1: set[int] = frozenset(), hot_only: set[int] = frozenset()) -> None:
    """The end state after any crash or failure, once rerun and drained:

    - no incomplete ``offloadSegment`` entry remains; no uuid is recorded twice on a ledger and no two
      completed segments hold the same entry of a ledger;
    - every entry of every ledger lies in exactly one completed segment, but for the ledgers offloaded
      as V1 objects (``v1``: no segment) and those not offloaded (``hot_only``: no segment);
    - the store holds exactly the two objects of every completed segment and nothing else (no orphan, no
      unfinished multipart upload), and each segment's V2 index describes exactly the pieces the topic
      records for it;
    - every entry read back from the segments is byte-identical to the hot tier's copy taken before;
    - the deletion log is empty, nothing dead-lettered.
    """
    info, _ = ws.ml.get_topic(topic)
    assert [li.ledgerId for li in info.ledgerInfo] == list(before), "the topic's ledgers changed"
    assert incomplete_segments(ws, topic) == {}, "incomplete offloadSegment entries remain"
    seg = segment_offloader(ws)
    pieces: dict[str, list[tuple[int, int, int]]] = {}
    for li in info.ledgerInfo:
        refs = segment_refs(li)
        uuids = [r.uuid for r in refs]
        assert len(set(uuids)) == len(uuids), f"ledger {li.ledgerId}: a uuid recorded twice: {uuids}"
        ends = sorted(r.end_entry for r in refs)
        assert len(set(ends)) == len(ends), f"ledger {li.ledgerId}: two segments end at the same entry: {refs}"
        ps = segment_pieces(li)
        assert len(ps) == len(refs), f"ledger {li.ledgerId}: segments overlap: {refs}"
        for p in ps:
            pieces.setdefault(p.uuid, []).append((li.ledgerId, p.first, p.last))
        last = len(before[li.ledgerId]) - 1
        if li.ledgerId in v1:
            assert is_complete(li) and refs == [], f"ledger {li.ledgerId}: expected a V1 offload only"
        elif li.ledgerId in hot_only:
            assert not is_complete(li) and refs == [], f"ledger {li.ledgerId}: expected no offload"
        else:
            assert covered_through(li) == last, (f"ledger {li.ledgerId}: segments hold entries through "
                                                 f"{covered_through(li)}, the ledger holds 0..{last}")
        if ps:
            h = seg.open_ledger(li.ledgerId, ps, closed=is_sealed(li), topic=TopicName.parse(topic).managed_ledger_name)
            try:
                got = [bytes(e.data) for e in h.read(0, ps[-1].last)]
            finally:
                h.close()
            assert got == before[li.ledgerId][: ps[-1].last + 1], f"ledger {li.ledgerId} read from its segments"

    # the store: exactly the completed segments' objects (plus V1 objects of the v1 ledgers)
    keys = store_keys(ws)
    prefix = ws.offloader.prefix
    seen: dict[str, set[bool]] = {}
    for k in keys:
        pk = parse_key(k, prefix)
        assert pk is not None, f"foreign object {k}"
        if pk.is_segment:
            assert pk.uuid in pieces, f"orphaned segment object {k}"
            seen.setdefault(pk.uuid, set()).add(pk.is_index)
        else:
            assert pk.ledger_id in v1, f"unexpected ledger object {k}"
    assert {u: s for u, s in seen.items()} == {u: {False, True} for u in pieces}, "a segment misses an object"
    assert store_uploads(ws) == [], "unfinished multipart uploads remain"
    for u, ps in pieces.items():
        index, _checksums, _md = seg.open_index(u)
        assert [(lid, s.first_entry_id, s.last_entry_id) for lid, s in index.sections.items()] == ps, u

    st = ws.deletion_log.stats()
    assert (st["in_flight"], st["dead_letter"]) == (0, 0), [e.record for e in ws.deletion_log.pending()]
    assert ws.deletion_log.pending() == [] and ws.deletion_log.dead_letters() == []


def read_topic(ws: Workspace, topic: str = TOPIC, priority: str | None = None) -> tuple[list[bytes], dict]:
    """Every entry of the topic through the cross-tier reader, and its per-tier ledger counts."""
    r = ws.reader(priority) if priority else ws.reader()
    try:
        got = [bytes(d) for _pos, d in r.read(topic)]
        return got, dict(r.tier_reads)
    finally:
        r.close()


def digest_of(payloads: list[bytes]) -> str:
    d = Digest()
    d.update_many(payloads)
    return d.hexdigest()
