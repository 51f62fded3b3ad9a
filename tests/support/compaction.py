"""Compaction test support (tieredcore/lifecycle/compaction.py): the topics compacted, the compactors
that compact them, and the checks every test ends with.

Topics (all one topic, ``TOPIC`` of namespace ``t/a``):

- :func:`v1_topic`: twelve sealed ledgers of 20 entries of 100-3000 bytes (about 32 KiB each), each
  offloaded as a V1 object pair (ledger mode), and the open newest ledger holding 5 entries (hot only);
- :func:`segment_topic`: the streaming topic of tests/support/segments.py (three ~64 KiB ledgers, two
  small ones, the open one holding 6 entries), streamed into segments of at most 32 KiB: segments span
  ledgers (0|1, 2|4, 4|5) and ledgers span segments; the open ledger's entries in a segment of their own;
- :func:`mixed_topic`: the same topic, its two oldest ledgers offloaded as V1 objects whose hot copies
  the deletion-lag cleanup then deleted (only the old objects hold them), the next ones streamed into
  segments up to the last sealed ledger, the open ledger in the hot tier only.

The compaction clock is ``AS_OF``; old objects are due for deletion ``DELAY`` later.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from tests.support.segments import (
    DAY_MS,
    NS,
    ROLLOVER_MS,
    TOPIC,
    Snapshot,
    build_topic,
    completed_segments,
    hot_snapshot,
    incomplete_segments,
    store_keys,
    store_uploads,
    streaming,
)
from tests.support.v2_checker import check_v2_segment
from tests.support.workspaces import END_MS, build_workspace, offload, sealed, stream
from tieredcore.clock import now_ms
from tieredcore.config import Config
from tieredcore.formats.keys import data_key, index_key, segment_data_key, segment_index_key
from tieredcore.lifecycle.compaction import compactor_for
from tieredcore.lifecycle.compaction_run import Thresholds
from tieredcore.lifecycle.drain import drain
from tieredcore.lifecycle.runner import run_work
from tieredcore.lifecycle.sweep import plan_lag_cleanup
from tieredcore.meta.deletion_log import TYPE_OFFLOADED, TYPE_SEGMENT
from tieredcore.model import Position
from tieredcore.names import TopicName
from tieredcore.offload.compaction import Compactor
from tieredcore.offload.context import context_uuid, is_complete, is_sealed, segment_pieces, segment_refs
from tieredcore.offload.copies import open_offloaded
from tieredcore.offload.segments import SegmentOffloader
from tieredcore.workspace import Workspace

HOUR = 3600 * 1000
DELAY = HOUR  # the policy's default compaction delete delay
AS_OF = END_MS + DAY_MS  # the compaction's logical clock
# past the delay, and past the wall clock (reconciliation's grace compares object times with it)
LATER = max(now_ms(), AS_OF + DELAY) + DAY_MS
ML = TopicName.parse(TOPIC).managed_ledger_name
KiB = 1024


# -- topics ---------------------------------------------------------------------------------------


def v1_topic(root: Path, store_url: str | None = None) -> Path:
    cfg = build_workspace(root, [NS], ledgers=12, entries=20, entry_size="100-3000", open_entries=5,
                          store_url=store_url)
    with Workspace(Config.load(cfg, env={})) as ws:
        offload(ws, TOPIC, sealed(ws, TOPIC), END_MS)
    return cfg


def segment_topic(root: Path, store_url: str | None = None) -> Path:
    cfg = build_topic(root, store_url)
    with Workspace(Config.load(cfg, env={})) as ws:
        stream(ws, TOPIC, max_segment_size=32 * KiB, as_of=END_MS + 5000)
    return cfg


def mixed_topic(root: Path, store_url: str | None = None) -> tuple[Path, Snapshot]:
    """The mixed topic and the hot tier's entries taken before the V1 ledgers' hot copies went."""
    cfg = build_topic(root, store_url)
    with Workspace(Config.load(cfg, env={})) as ws:
        before = hot_snapshot(ws)
        lids = list(before)
        v1 = lids[:2]
        offload(ws, TOPIC, v1, END_MS)
        ps = ws.policies
        ps.set_namespace(NS, {"deletion_lag_ms": 0})
        rows = list(run_work(ws.config, [w.as_dict() for w in plan_lag_cleanup(ws, None, END_MS + 1)]))
        assert sorted((r["ledger"], r["outcome"]) for r in rows) == [(lid, "marked") for lid in v1], rows
        ps.set_namespace(NS, {"deletion_lag_ms": -1})
        assert drain(ws, END_MS + 1).deleted == 2
        assert not set(v1) & set(ws.hot.list_ledgers())
        last_sealed = lids[-2]
        res = streaming(ws).offload_topic(TOPIC, max_segment_size=32 * KiB, rollover_ms=ROLLOVER_MS,
                                          as_of_ms=END_MS + 5000, force_tail=True,
                                          upto=Position(last_sealed, len(before[last_sealed]) - 1))
        assert res and all(r.outcome == "offloaded" for r in res), res
    return cfg, before


# -- compactors -----------------------------------------------------------------------------------


def compactor(ws: Workspace, *, min_object_size: int, target_size: int, delay_ms: int = DELAY,
              clock_ms: int | Callable[[], int] = AS_OF, on_step: Callable[[str, str], None] | None = None,
              block_size: int | None = None, min_part_size: int = 0, leases: Any = True,
              open_copy: Callable | None = None) -> Compactor:
    """A compactor of the topic's namespace policy with these thresholds: the run's own
    (:func:`compactor_for`: 4 MiB blocks, parts of the store's minimum size) unless ``block_size`` is
    given (then parts of ``min_part_size``). ``leases``: True (the workspace's), None or another
    TopicLeases."""
    pol = Thresholds(min_object_size, target_size, delay_ms).apply(ws.policies.for_topic(TOPIC), "test")
    clock = clock_ms if callable(clock_ms) else (lambda: clock_ms)
    c = compactor_for(ws, pol, clock_ms=clock, on_step=on_step)
    if block_size is not None:
        c.segments = SegmentOffloader(ws.offloader_for_policy(pol), block_size=block_size,
                                      min_part_size=min_part_size)
    if leases is not True:
        c.leases = leases
    if open_copy is not None:
        c.open_copy = open_copy
    return c


# -- what the topic record says -------------------------------------------------------------------


def copies(ws: Workspace, topic: str = TOPIC) -> dict[int, list[tuple[str, str, int, int]]]:
    """ledger -> the (type, uuid, first, last) pieces of its offloaded copy: one V1 object pair (type
    ``offloaded``), or segments (type ``segment``); the deletion-record type of each object pair."""
    info, _ = ws.ml.get_topic(topic)
    out: dict[int, list[tuple[str, str, int, int]]] = {}
    for li in info.ledgerInfo:
        if is_complete(li):
            out[li.ledgerId] = [(TYPE_OFFLOADED, context_uuid(li), 0, li.entries - 1)]
        elif segment_pieces(li):
            out[li.ledgerId] = [(TYPE_SEGMENT, p.uuid, p.first, p.last) for p in segment_pieces(li)]
    return out


def units_of(cps: Mapping[int, list[tuple[str, str, int, int]]], ledgers: Iterable[int]) -> dict[str, str]:
    """uuid -> deletion-record type of the object pairs holding ``ledgers`` in ``cps`` (:func:`copies`)."""
    return {u: typ for lid in ledgers for typ, u, _f, _l in cps[lid]}


def pending(ws: Workspace) -> list[tuple[str, str, str, int]]:
    """(type, reason, uuid, next attempt) of every record in the deletion log, sorted."""
    return sorted((e.record.type, e.record.reason, e.record.uuid, e.record.next_attempt_ms)
                  for e in ws.deletion_log.pending())


# -- reading back ---------------------------------------------------------------------------------


def cut_points(*layouts: Mapping[int, list[tuple[str, str, int, int]]]) -> dict[int, set[int]]:
    """ledger -> every entry at an object boundary in any of the layouts (first and last entry of
    every piece)."""
    out: dict[int, set[int]] = {}
    for cps in layouts:
        for lid, pieces in cps.items():
            for _typ, _u, f, last in pieces:
                out.setdefault(lid, set()).update((f, last))
    return out


def read_everything(ws: Workspace, before: Snapshot, cuts: Mapping[int, set[int]], topic: str = TOPIC) -> None:
    """Every entry of every offloaded ledger through open_offloaded (the copy itself, no fallback) and
    through the topic reader (which must read it from the object store, no fallback), whole and at every
    cut: single entries at each boundary and ranges spanning it, within a ledger and across ledgers;
    byte-identical to ``before``."""
    info, _ = ws.ml.get_topic(topic)
    lids = [li.ledgerId for li in info.ledgerInfo]
    assert lids == list(before), "the topic's ledgers changed"
    r = ws.reader()
    try:
        for li in info.ledgerInfo:
            want = before[li.ledgerId]
            if li.ledgerId not in cuts:
                continue
            last = len(want) - 1
            h = open_offloaded(li, ws.offloader, ML, ws.offloader_for_driver)
            try:
                assert [bytes(e.data) for e in h.read(0, last)] == want, f"ledger {li.ledgerId}"
                for c in sorted(cuts[li.ledgerId]):
                    for a, b in ((c, c), (max(0, c - 1), min(last, c + 1)), (max(0, c - 2), c), (c, min(last, c + 3))):
                        assert [bytes(e.data) for e in h.read(a, b)] == want[a: b + 1], (li.ledgerId, a, b)
                        got = [bytes(e.data) for e in r.read_ledger(topic, li.ledgerId, a, b)]
                        assert got == want[a: b + 1], (li.ledgerId, a, b)
            finally:
                h.close()
        # across ledger boundaries: the last entries of one ledger through the first ones of the next
        for prev, nxt in zip(lids, lids[1:], strict=False):
            if prev not in cuts or nxt not in cuts or not before[prev] or not before[nxt]:
                continue
            start = Position(prev, max(0, len(before[prev]) - 2))
            end = Position(nxt, min(1, len(before[nxt]) - 1))
            got = [bytes(d) for _p, d in r.read(topic, start, end)]
            assert got == before[prev][start.entry_id:] + before[nxt][: end.entry_id + 1], (prev, nxt)
        # the whole topic
        assert [bytes(d) for _p, d in r.read(topic)] == [e for v in before.values() for e in v]
        assert r.fallbacks == 0, r.fallback_notes
    finally:
        r.close()


def check_new_segments(ws: Workspace, uuids: Iterable[str], before: Snapshot) -> None:
    """Each new segment passes the independent V2 layout checker (no block size: a ledger's last block is
    unpadded) and holds exactly the entries of the hot snapshot its index names."""
    seg = SegmentOffloader(ws.offloader)
    store = ws.store
    for u in uuids:
        dkey, ikey = seg.keys(u)
        found = check_v2_segment(store.get(dkey), store.get(ikey), store.head(dkey).metadata,
                                 store.head(ikey).metadata)
        for lid, entries in found.items():
            first = entries[0][0]
            assert [bytes(p) for _e, p in entries] == before[lid][first: first + len(entries)], (u, lid)
        assert completed_segments(ws).get(u) == [(lid, e[0][0], e[-1][0]) for lid, e in found.items()], u


def no_incomplete(ws: Workspace) -> None:
    assert incomplete_segments(ws) == {}


def assert_single_copies(ws: Workspace, before: Snapshot, topic: str = TOPIC) -> None:
    """The topic record as any run must leave it: no incomplete segment entry; on each ledger no uuid
    recorded twice and no entry in two completed segments; an offloaded ledger held either by its V1
    object pair or by completed segments covering every entry, never by both; every completed segment's
    index holding the pieces the record names (and sections only of ledgers retention removed since)."""
    info, _ = ws.ml.get_topic(topic)
    no_incomplete(ws)
    seg = SegmentOffloader(ws.offloader)
    pieces: dict[str, list[tuple[int, int, int]]] = {}
    for li in info.ledgerInfo:
        refs = segment_refs(li)
        uuids = [r.uuid for r in refs]
        assert len(set(uuids)) == len(uuids), f"ledger {li.ledgerId}: a uuid recorded twice: {uuids}"
        ps = segment_pieces(li)
        assert len(ps) == len(refs), f"ledger {li.ledgerId}: segments overlap: {refs}"
        if is_complete(li):
            assert refs == [], f"ledger {li.ledgerId}: a V1 copy and segments"
        elif ps and is_sealed(li):
            assert ps[-1].last == li.entries - 1, f"ledger {li.ledgerId}: segments hold 0..{ps[-1].last}"
        for p in ps:
            pieces.setdefault(p.uuid, []).append((li.ledgerId, p.first, p.last))
        assert li.ledgerId in before
    listed = {li.ledgerId for li in info.ledgerInfo}
    for u, ps in pieces.items():
        index, _c, _md = seg.open_index(u)
        sections = [(lid, s.first_entry_id, s.last_entry_id) for lid, s in index.sections.items()]
        assert [x for x in sections if x[0] in listed] == ps, u


def assert_clean(ws: Workspace, before: Snapshot, topic: str = TOPIC) -> None:
    """:func:`assert_single_copies`, and: the store holds exactly the objects the topic record references
    (each V1 copy's pair, each completed segment's pair: no orphan, no unfinished upload), the deletion
    log is empty, and every entry reads back byte-identical (:func:`read_everything`)."""
    assert_single_copies(ws, before, topic)
    prefix = ws.offloader.prefix
    want: set[str] = set()
    layout = copies(ws, topic)
    for lid, ps in layout.items():
        for typ, u, _f, _l in ps:
            want |= ({data_key(prefix, u, lid), index_key(prefix, u, lid)} if typ == TYPE_OFFLOADED
                     else {segment_data_key(prefix, u), segment_index_key(prefix, u)})
    assert set(store_keys(ws)) == want
    assert store_uploads(ws) == []
    assert ws.deletion_log.pending() == [] and ws.deletion_log.dead_letters() == []
    read_everything(ws, before, cut_points(layout), topic)
