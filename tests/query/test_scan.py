"""tieredcore.query.scan without Spark: every tier and object kind reads back as the generator's messages,
plans prune by publish time (counted in GETs), damaged entries never become rows, bad options fail in
one line. The Spark data source over the same functions: tests/query/test_datasource.py."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.query import damaged_topic, expected_rows, generated_entries, scanned_rows
from tests.support.workspaces import build_workspace, offload, sealed, stream
from tieredcore.cli import main as cli
from tieredcore.cold.keyring import KeyRing
from tieredcore.cold.requests import count_requests
from tieredcore.config import Config
from tieredcore.errors import MessageFormatError, ValidationError
from tieredcore.formats.compacted import compaction_items
from tieredcore.names import TopicName
from tieredcore.query import rows, stats
from tieredcore.query.scan import (
    Range,
    ReadCounters,
    ScanFilter,
    add_condition,
    parse_time,
    plan_scan,
    read_part,
    resolve_topics,
)
from tieredcore.workspace import Workspace

NS = "acme/orders"
T0, T1 = f"persistent://{NS}/topic-0000", f"persistent://{NS}/topic-0001"


def scan(ws: Workspace, topics: list[str], filt: ScanFilter | None = None, **kw):
    filt = filt or ScanFilter()
    plan = plan_scan(ws, [TopicName.parse(t) for t in topics], filt, **({"part_bytes": kw.pop("part_bytes")}
                                                                        if "part_bytes" in kw else {}))
    batches = [b for p in plan.parts for b in read_part(ws, p, filt=filt, **kw)]
    return plan, batches


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> Workspace:
    """Two topics: T0 with two V1-offloaded ledgers and the rest hot (an open ledger holding entries), T1
    streamed into PIP-76 segments (its open ledger's entries too)."""
    cfg = build_workspace(tmp_path_factory.mktemp("mixed"), [NS], topics=2, ledgers=4, entries=30,
                          entry_size="64-700", open_entries=9, messages=True)
    ws = Workspace(Config.load(cfg, env={}))
    offload(ws, T0, sealed(ws, T0)[:2])
    stream(ws, T1)
    yield ws
    ws.close()


def test_every_tier_reads_back_as_the_generators_messages(mixed):
    plan, batches = scan(mixed, [T0, T1])
    assert scanned_rows(batches) == sorted(expected_rows(mixed, T0) + expected_rows(mixed, T1),
                                           key=lambda r: (r[0], r[1], r[2], r[3]))
    tiers = {(r["topic"], r["ledger_id"], r["tier"]) for b in batches for r in b.select(["topic", "ledger_id", "tier"]).to_pylist()}
    ids0 = sealed(mixed, T0)
    assert {(lid, t) for topic, lid, t in tiers if topic == T0} == \
        {(ids0[0], "offloaded"), (ids0[1], "offloaded"), (ids0[2], "hot"), (ids0[3], "hot"), (ids0[3] + 1, "hot")}
    assert {t for topic, _, t in tiers if topic == T1} >= {"segments"}
    assert plan.in_bookkeeper == [] and plan.pruned == 0


def test_raw_entries_are_the_generators_entries(mixed):
    _, batches = scan(mixed, [T0], raw=True)
    got = {(r["ledger_id"], r["entry_id"]): r["entry"] for b in batches for r in b.to_pylist()}
    assert got == generated_entries(mixed, T0)


def test_keys_rows_are_what_topic_compaction_sees_of_every_tier(mixed):
    """entries=keys: one row per message as compaction_items sees the generator's entries, from every tier
    (V1 objects, hot ledgers, PIP-76 segments and the open ledger)."""
    for topic in (T0, T1):
        _, batches = scan(mixed, [topic], keys=True)
        assert all(b.schema == rows.KEY_SCHEMA for b in batches)
        got = [(r["ledger_id"], r["entry_id"], r["batch_index"], r["key"], r["size"])
               for b in batches for r in b.to_pylist()]
        want = [(lid, eid, it.position.batch_index, it.key, it.size)
                for (lid, eid), data in sorted(generated_entries(mixed, topic).items())
                for it in compaction_items(data, lid, eid)]
        assert got == want and len(want) > 100
        assert {r["tier"] for b in batches for r in b.to_pylist()} >= ({"offloaded", "hot"} if topic == T0 else {"segments"})


def test_damaged_entries_in_keys_rows_fail_or_are_counted_and_skipped(tmp_path):
    cfg = build_workspace(tmp_path / "ws", [NS], ledgers=1, entries=1, messages=True)
    topic = f"persistent://{NS}/damaged"
    with Workspace(Config.load(cfg, env={})) as ws:
        damaged_topic(ws, topic)
        (part,) = plan_scan(ws, [TopicName.parse(topic)]).parts
        with pytest.raises(MessageFormatError) as e:
            list(read_part(ws, part, keys=True))
        assert f"{topic}: damaged entry" in str(e.value) and f"{part.ledger_id}:3" in str(e.value)
        c = ReadCounters()
        got = [r for b in read_part(ws, part, keys=True, on_damage="skip", counters=c) for r in b.to_pylist()]
        assert sorted({r["entry_id"] for r in got}) == [0, 1, 2, 4, 5]
        assert [str(b.position) for b in c.damaged] == [f"{part.ledger_id}:3"] and c.damaged[0].checksum


def test_large_ledgers_are_split_into_entry_ranges(mixed):
    plan, batches = scan(mixed, [T0], part_bytes=4096)
    ids = sealed(mixed, T0)
    per_ledger = [p for p in plan.parts if p.ledger_id == ids[0]]
    assert len(per_ledger) > 1
    assert [(p.first, p.last) for p in per_ledger][0][0] == 0 and per_ledger[-1].last == 29
    assert all(a.last + 1 == b.first for a, b in zip(per_ledger, per_ledger[1:], strict=False))
    assert scanned_rows(batches) == expected_rows(mixed, T0)


@pytest.mark.parametrize("transform", ["zstd", "zstd+aes"])
def test_transformed_objects_read_back(tmp_path, transform):
    ring = tmp_path / "ring"
    KeyRing.add_key(ring, "k1", bits=2048)
    root = tmp_path / "ws"
    root.mkdir()
    (root / "tiered.toml").write_text(Config.for_workspace(root, key_ring=str(ring)).to_toml())
    cfg = build_workspace(root, [NS], ledgers=3, entries=25, entry_size="200-2000", messages=True)
    base = ["--workspace", str(root)]
    assert cli.main([*base, "policies", "set", NS, "--transform", transform, "--transform-chunk-size", "16K"]) == 0
    assert cli.main([*base, "offload", "--namespace", NS, "--keep-bytes", "0"]) == 0
    with Workspace(Config.load(cfg, env={})) as ws:
        _, batches = scan(ws, [T0])
        assert scanned_rows(batches) == expected_rows(ws, T0)
        assert {r["tier"] for b in batches for r in b.select(["tier"]).to_pylist()} == {"offloaded"}


def test_publish_time_statistics_prune_ledgers_before_any_get(tmp_path):
    cfg = build_workspace(tmp_path / "ws", [NS], ledgers=6, entries=40, entry_size="300", messages=True)
    with Workspace(Config.load(cfg, env={})) as ws:
        ids = sealed(ws, T0)
        offload(ws, T0, ids)
        t = TopicName.parse(T0)
        assert stats.load(ws.metadata, t) == {}
        with count_requests() as full:
            _, batches = scan(ws, [T0])
        rows = scanned_rows(batches)
        recorded = stats.load(ws.metadata, t)
        assert {k.split(":")[0] for k in recorded} == {str(i) for i in ids}  # the open ledger is empty
        # publish times of the third ledger: a query inside them plans that ledger alone
        third = [r[4] for r in rows if r[1] == ids[2]]
        lo, hi = min(third), max(third)
        assert recorded[f"{ids[2]}:0:39"] == (lo, hi, len(third))
        f = add_condition(ScanFilter(), "publish_time", ">=", datetime.fromtimestamp(lo / 1000, UTC))
        f = add_condition(f, "publish_time", "<=", datetime.fromtimestamp(hi / 1000, UTC))
        with count_requests() as pruned:
            plan, batches = scan(ws, [T0], f)
        assert [p.ledger_id for p in plan.parts] == [ids[2]] and plan.pruned == len(ids) - 1
        assert scanned_rows(batches) == [r for r in rows if lo <= r[4] <= hi]
        with count_requests() as one:
            list(read_part(ws, plan.parts[0], record_stats=False))
        assert 0 < pruned.total()["GET"] == one.total()["GET"] < full.total()["GET"] / 3
        # a query outside every ledger reads nothing at all
        f = add_condition(ScanFilter(), "publish_time", ">", datetime.fromtimestamp(max(r[4] for r in rows) / 1000, UTC))
        with count_requests() as none:
            plan, batches = scan(ws, [T0], f)
        assert plan.parts == [] and batches == [] and none.total()["GET"] == 0


def test_ledger_and_entry_ranges_prune_and_narrow(mixed):
    ids = sealed(mixed, T0)
    f = add_condition(add_condition(ScanFilter(), "ledger_id", "=", ids[1]), "entry_id", "<", 5)
    plan, batches = scan(mixed, [T0, T1], f)
    assert {(p.topic, p.ledger_id) for p in plan.parts} == {(T0, ids[1])} | {
        (T1, li.ledgerId) for li in mixed.ml.get_topic(T1)[0].ledgerInfo if li.ledgerId == ids[1]}
    assert {r[2] for r in scanned_rows(batches)} == set(range(5))
    f = add_condition(ScanFilter(), "topic", "in", (T1, "persistent://x/y/nope"))
    plan, _ = scan(mixed, [T0, T1], f)
    assert {p.topic for p in plan.parts} == {T1}


def test_damaged_entries_fail_the_read_or_are_counted_and_skipped(tmp_path):
    cfg = build_workspace(tmp_path / "ws", [NS], ledgers=1, entries=1, messages=True)
    topic = f"persistent://{NS}/damaged"
    with Workspace(Config.load(cfg, env={})) as ws:
        damaged_topic(ws, topic)
        (part,) = plan_scan(ws, [TopicName.parse(topic)]).parts
        with pytest.raises(MessageFormatError) as e:
            list(read_part(ws, part))
        assert f"{topic}: damaged entry" in str(e.value) and f"{part.ledger_id}:3" in str(e.value)
        assert "onDamage=skip" in str(e.value)
        c = ReadCounters()
        got = [r for b in read_part(ws, part, on_damage="skip", counters=c) for r in b.to_pylist()]
        assert [r["entry_id"] for r in got] == [0, 1, 2, 4, 5]
        assert [str(b.position) for b in c.damaged] == [f"{part.ledger_id}:3"] and c.damaged[0].checksum
        # statistics come only from parts read whole and sound
        assert stats.load(ws.metadata, TopicName.parse(topic)) == {}


def test_bad_options_fail_in_one_line(mixed):
    for topic, ns, text in [(None, None, "name exactly one"), (T0, NS, "name exactly one"),
                            (f"persistent://{NS}/nope", None, f"topic persistent://{NS}/nope does not exist"),
                            (None, "acme/none", "namespace acme/none has no topics"),
                            ("persistent://bad", None, "")]:
        with pytest.raises(ValidationError) as e:
            resolve_topics(mixed.ml, topic, ns)
        assert text in str(e.value) and "\n" not in str(e.value)
    for bad in ("yesterday", "2026-13-01", ""):
        with pytest.raises(ValidationError, match="neither epoch milliseconds nor an ISO 8601 time"):
            parse_time(bad, "option publishTimeFrom")
    assert parse_time("2026-01-01T00:00:00Z", "x") == parse_time("2026-01-01T00:00:00", "x") == 1_767_225_600_000
    assert parse_time("1767225600000", "x") == 1_767_225_600_000
    with pytest.raises(ValidationError, match="option onDamage must be one of fail, skip, got 'ignore'"):
        list(read_part(mixed, plan_scan(mixed, [TopicName.parse(T0)]).parts[0], on_damage="ignore"))


# -- publish-time bounds are exact: a row is pruned only when Spark's own comparison rejects it ----------

_ms = st.integers(0, 4_000_000_000_000)
_us = st.integers(0, 4_000_000_000_000_000)
_OPS = {"=": lambda a, b: a == b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
        "<": lambda a, b: a < b, "<=": lambda a, b: a <= b}


@settings(max_examples=300, deadline=None)
@given(ms=_ms, us=_us, op=st.sampled_from(sorted(_OPS)), aware=st.booleans())
def test_publish_time_bounds_match_sparks_comparison(ms, us, op, aware):
    value = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=us)
    if not aware:
        value = value.replace(tzinfo=None)  # naive literals are UTC instants
    f = add_condition(ScanFilter(), "publish_time", op, value)
    assert f is not None
    assert f.publish.overlaps(ms, ms) == _OPS[op](ms * 1000, us)


@settings(max_examples=200, deadline=None)
@given(v=st.integers(-5, 60), x=st.integers(0, 60), op=st.sampled_from(sorted(_OPS)), col=st.sampled_from(["ledger_id", "entry_id"]))
def test_ledger_and_entry_bounds_match_the_comparison(v, x, op, col):
    f = add_condition(ScanFilter(), col, op, v)
    r = f.ledgers if col == "ledger_id" else f.entries
    assert r.overlaps(x, x) == _OPS[op](x, v)


def test_conditions_that_cannot_prune_are_left_to_spark():
    assert add_condition(ScanFilter(), "payload", "=", b"x") is None
    assert add_condition(ScanFilter(), "ledger_id", "=", "7") is None
    assert add_condition(ScanFilter(), "publish_time", ">", "soon") is None
    assert Range(5, 4).empty and not Range(5, 4).overlaps(0, 10)


def test_statistics_that_do_not_parse_are_ignored(mixed, tmp_path: Path):
    t = TopicName.parse(f"persistent://{NS}/stats-probe")
    path = stats.bucket_path(t, 1)
    mixed.metadata.create(path, b"{not json")
    mixed.metadata.create(stats.bucket_path(t, 5000), json.dumps({"version": 1, "parts": {"5000:0:1": "x"}}).encode())
    try:
        assert stats.load(mixed.metadata, t) == {}
        assert stats.record(mixed.metadata, t, {"1:0:1": (1, 2, 3)}, live_ledgers=[1])
        assert stats.load(mixed.metadata, t) == {"1:0:1": (1, 2, 3)}
    finally:
        for p in (path, stats.bucket_path(t, 5000)):
            mixed.metadata.delete(p)


def test_statistics_are_kept_per_bucket_of_ledgers_and_trimmed_ledgers_are_forgotten(tmp_path: Path):
    """A record per BUCKET_LEDGERS ledger ids (no record grows with the topic); the first layout's record
    per topic still read; a plan drops the statistics of ledgers the topic no longer has."""
    cfg = build_workspace(tmp_path / "ws", [NS], ledgers=3, entries=5, messages=True)
    with Workspace(Config.load(cfg, env={})) as ws:
        _buckets_and_forgetting(ws)


def _buckets_and_forgetting(mixed: Workspace) -> None:
    t = TopicName.parse(T0)
    live = [li.ledgerId for li in mixed.ml.get_topic(t)[0].ledgerInfo]
    gone = [max(live) + stats.BUCKET_LEDGERS * 3, 0 if 0 not in live else max(live) + 1]
    store = mixed.metadata
    legacy = stats.stats_path(t)
    store.create(legacy, json.dumps({"version": 1, "parts": {f"{live[0]}:0:0": [7, 8, 1]}}).encode())
    try:
        found = {f"{lid}:0:1": (lid, lid + 1, 2) for lid in [*live, *gone]}
        assert stats.record(store, t, found)
        buckets = store.children(legacy)
        assert buckets == sorted({stats.bucket_path(t, lid).rsplit("/", 1)[1] for lid in [*live, *gone]})
        assert len(buckets) >= 2
        assert stats.load(store, t) == {**found, f"{live[0]}:0:0": (7, 8, 1)}
        # a bounded plan sees the trimmed ledgers' statistics and drops them
        f = add_condition(ScanFilter(), "publish_time", ">=", datetime.fromtimestamp(0, UTC))
        plan_scan(mixed, [t], f)
        left = stats.load(store, t)
        assert {int(k.split(":")[0]) for k in left} == set(live)
        assert stats.bucket_path(t, gone[0]).rsplit("/", 1)[1] not in store.children(legacy)  # emptied: deleted
    finally:
        for c in store.children(legacy):
            store.delete(f"{legacy}/{c}")
        store.delete(legacy)


# -- an attached Pulsar cluster: the ledgers its brokers offloaded, read from the bucket alone ----------------


def test_an_attached_clusters_offloaded_ledgers_are_rows(pulsar_cluster, tmp_path):
    from tests.support.pulsar_cluster import LOCAL
    from tieredcore.attach import attached_config, check_attach
    from tieredcore.formats.messages import decode_entry

    cluster = pulsar_cluster(driver=LOCAL)
    cfg, _ = check_attach(attached_config(tmp_path / "ws", cluster.pulsar_zk, cluster.store_url, None),
                          cluster_given=False, brokers_default=True)
    damaged = None
    with Workspace(cfg) as ws:
        for name, tp in cluster.topics.items():
            if not tp.ledgers or tp.empty_record:
                continue
            t = TopicName.parse(tp.full)
            plan = plan_scan(ws, [t])
            offloaded = [li for li in tp.ledgers if li.state in ("offloaded-deleted", "offloaded")]
            assert [p.ledger_id for p in plan.parts] == [li.ledger_id for li in offloaded], name
            assert plan.in_bookkeeper == [f"{tp.full} {li.ledger_id}" for li in tp.ledgers
                                          if li.state in ("offloading", "bookkeeper", "open")], name
            want = sorted((tp.full, li.ledger_id, e, m.batch_index, bytes(m.payload))
                          for li in offloaded for e, data in enumerate(li.entries) if e != li.damaged_entry
                          for m in decode_entry(data, li.ledger_id, e))
            c = ReadCounters()
            got = sorted((r["topic"], r["ledger_id"], r["entry_id"], r["batch_index"], r["payload"])
                         for p in plan.parts for b in read_part(ws, p, on_damage="skip", counters=c)
                         for r in b.to_pylist())
            bad = [li for li in offloaded if li.damaged_entry is not None]
            if bad:
                damaged = (plan, bad[0])
                assert [str(d.position) for d in c.damaged] == [f"{bad[0].ledger_id}:{bad[0].damaged_entry}"]
            assert got == want, name
        assert damaged is not None, "the fixture plants one damaged message"
        plan, li = damaged
        with pytest.raises(MessageFormatError, match=f"{li.ledger_id}:{li.damaged_entry}"):
            for p in plan.parts:
                list(read_part(ws, p))


def test_times_no_timestamp_holds_are_null_and_never_prune(tmp_path):
    """A producer's uint64 publish or event time past what a µs timestamp holds (year 294,247): null in the
    row (Spark's TimestampType has no such value), the part gets no statistics (so it is never pruned)."""
    from tieredcore.formats.messages import OutMessage, encode_message
    from tieredcore.topic.writer import TopicWriter

    cfg = build_workspace(tmp_path / "ws", [NS], ledgers=1, entries=1, messages=True)
    topic = f"persistent://{NS}/far-future"
    with Workspace(Config.load(cfg, env={})) as ws:
        ws.ml.create_topic(topic)
        with TopicWriter(ws.ml, ws.hot, topic) as w:
            w.append_many([encode_message(OutMessage(b"a", event_time=2**64 - 1), producer="p", sequence_id=0,
                                          publish_time=1_700_000_000_000),
                           encode_message(OutMessage(b"b"), producer="p", sequence_id=1, publish_time=2**63 + 5)])
        (part,) = plan_scan(ws, [TopicName.parse(topic)]).parts
        rows = [r for b in read_part(ws, part) for r in b.to_pylist()]
        assert [(r["payload"], r["event_time"], r["publish_time"] is None) for r in rows] == \
            [(b"a", None, False), (b"b", None, True)]
        assert stats.load(ws.metadata, TopicName.parse(topic)) == {}


def test_small_parts_are_packed_into_tasks():
    from tieredcore.query.scan import PACK_MIN, ScanPart, pack_parts, pack_target

    mib = 1024 * 1024
    parts = [ScanPart(T0, i, 0, 9, s) for i, s in enumerate([3 * mib, 3 * mib, 3 * mib, 20 * mib, 1 * mib, 9 * mib])]
    assert pack_target(sum(p.size for p in parts), 128 * mib, tasks=8) == PACK_MIN  # 39 MiB / 8 < 8 MiB
    assert pack_target(400 * mib, 128 * mib, tasks=4) == 100 * mib
    assert pack_target(10 * 1024 * mib, 128 * mib, tasks=4) == 128 * mib  # never above the part size
    assert pack_target(400 * mib, 4096, tasks=4) == 4096  # a small part size packs nothing larger
    groups = pack_parts(parts, 8 * mib)
    assert [[p.ledger_id for p in g] for g in groups] == [[0, 1], [2], [3], [4], [5]]
    assert [p for g in groups for p in g] == parts  # every part once, in plan order
