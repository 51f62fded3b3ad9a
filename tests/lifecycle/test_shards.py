"""Shards, not namespaces (tieredcore.lifecycle.shards): the namespaces with work spread over at most N
Spark applications by bytes, and each namespace's planning saying why nothing is due."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.workspaces import END_MS
from tieredcore.config import DEFAULT_SPARK_SHARDS, MAX_SPARK_SHARDS, Config
from tieredcore.errors import ValidationError
from tieredcore.lifecycle.compaction_run import plan_compaction_due
from tieredcore.lifecycle.runner import run_work
from tieredcore.lifecycle.shards import (
    NamespaceDue,
    Shard,
    assign_shards,
    nothing_due,
    shard_label,
)
from tieredcore.lifecycle.sweep import plan_offload, plan_offload_due


def due(name: str, size: int, units: int = 1) -> NamespaceDue:
    return NamespaceDue(name, units, size)


# -- assignment -------------------------------------------------------------------------------------


def test_largest_first_onto_the_lightest_shard() -> None:
    shards = assign_shards([due("a/a", 10), due("b/b", 7), due("c/c", 5), due("d/d", 4), due("e/e", 1)], 2)
    # 10 -> s0; 7 -> s1; 5 -> s1 (12); 4 -> s0 (14); 1 -> s1 (13)
    assert shards == [Shard(("a/a", "d/d"), 14, 2), Shard(("b/b", "c/c", "e/e"), 13, 3)]


def test_shards_capped_by_namespaces_with_work_and_idle_ones_left_out() -> None:
    plan = [due("a/a", 3), NamespaceDue.idle("b/b", "no topics"), due("c/c", 0, units=2)]
    shards = assign_shards(plan, 8)
    assert [s.namespaces for s in shards] == [("a/a",), ("c/c",)]
    assert nothing_due(plan) == [{"namespace": "b/b", "reason": "no topics"}]
    assert assign_shards([NamespaceDue.idle("b/b", "no topics")], 2) == []
    assert assign_shards([], 2) == []


def test_equal_bytes_balance_by_units_then_name() -> None:
    shards = assign_shards([due(f"t/n{i}", 0) for i in range(5)], 2)
    assert shards == [Shard(("t/n0", "t/n2", "t/n4"), 0, 3), Shard(("t/n1", "t/n3"), 0, 2)]


@pytest.mark.parametrize("n", [0, -1, MAX_SPARK_SHARDS + 1, True, 1.5, "2", None])
def test_bad_numbers_of_shards_refused(n) -> None:
    with pytest.raises(ValidationError, match="number of shards must be"):
        assign_shards([due("a/a", 1)], n)


def test_a_namespace_planned_twice_is_refused() -> None:
    with pytest.raises(ValidationError, match="planned twice: a/a"):
        assign_shards([due("a/a", 1), due("a/a", 2)], 2)


names = st.from_regex(r"[a-c]{1,3}/[a-z0-9]{1,6}", fullmatch=True)
plans = st.dictionaries(names, st.tuples(st.integers(0, 10**9), st.integers(0, 20)), max_size=60)


@given(plans, st.integers(1, 12))
def test_assignment_properties(plan: dict[str, tuple[int, int]], n: int) -> None:
    work = [NamespaceDue(ns, units, size) for ns, (size, units) in plan.items()]
    shards = assign_shards(work, n)
    with_work = sorted(d.namespace for d in work if d.due)
    # every namespace with work in exactly one shard, none other; no shard empty; at most n of them
    assert sorted(ns for s in shards for ns in s.namespaces) == with_work
    assert len(shards) == min(n, len(with_work))
    assert all(s.namespaces and list(s.namespaces) == sorted(s.namespaces) for s in shards)
    sizes = {d.namespace: d for d in work}
    for s in shards:
        assert s.bytes == sum(sizes[ns].bytes for ns in s.namespaces)
        assert s.units == sum(sizes[ns].units for ns in s.namespaces)
    # balance: the heaviest shard exceeds the lightest by at most the heaviest namespace
    if shards:
        heaviest = max(d.bytes for d in work if d.due)
        assert max(s.bytes for s in shards) - min(s.bytes for s in shards) <= heaviest
    # deterministic, whatever order the planning listed the namespaces in
    assert assign_shards(list(reversed(work)), n) == shards


# -- labels -----------------------------------------------------------------------------------------


def test_labels_list_short_shards_and_count_long_ones() -> None:
    assert shard_label(["acme/audit"]) == "acme/audit"
    assert shard_label(["acme/audit", "acme/orders"]) == "acme/audit, acme/orders"
    many = ["acme/audit", "acme/orders", "acme/payments", "acme/refunds"]
    assert shard_label(many) == "acme/audit +3 more"
    assert Shard(tuple(many), 1, 4).label == "acme/audit +3 more"


# -- the planners: units, bytes, and why nothing is due ---------------------------------------------


def test_offload_due_per_namespace_with_reasons(make_ws) -> None:
    ws = make_ws(["t/due", "t/high", "t/off", "t/two"], topics=2, ledgers=3)
    ws.policies.set_namespace("t/due", {"offload_threshold_bytes": 0})
    ws.policies.set_namespace("t/high", {"offload_threshold_bytes": 2**40})
    ws.policies.set_namespace("t/two", {"offload_threshold_bytes": 0})
    plan = {d.namespace: d for d in plan_offload_due(ws, ["t/due", "t/high", "t/off", "t/two", "t/none"], END_MS)}
    units = plan_offload(ws, ["t/due"], END_MS)
    sizes = {li.ledgerId: li.size for w in units for li in ws.ml.get_topic(w.topic)[0].ledgerInfo}
    assert plan["t/due"] == NamespaceDue("t/due", 2, sum(sizes[i] for w in units for i in w.ledgers))
    assert plan["t/due"].bytes > 0
    high = plan["t/high"].reason
    assert not plan["t/high"].due and "no sealed ledger due by the policy in 2 topic(s)" in high
    assert f"threshold {2**40} bytes hot" in high and f"{plan['t/due'].bytes} bytes of sealed ledgers hot" in high
    assert plan["t/off"] == NamespaceDue.idle("t/off", "offload is off in the policy of its 2 topic(s)")
    assert plan["t/none"] == NamespaceDue.idle("t/none", "no topics")
    # max_topics is per namespace: each namespace keeps its own first topic
    assert [w.topic for w in plan_offload(ws, ["t/due", "t/two"], END_MS, max_topics=1)] == [
        "persistent://t/due/topic-0000", "persistent://t/two/topic-0000"]
    assert plan_offload_due(ws, ["t/due"], END_MS, max_topics=1)[0].units == 1


def test_offloaded_namespace_says_nothing_is_left(make_ws) -> None:
    ws = make_ws(["t/due"], topics=1, ledgers=2)
    ws.policies.set_namespace("t/due", {"offload_threshold_bytes": 0})
    rows = list(run_work(ws.config, [w.as_dict() for w in plan_offload(ws, None, END_MS)]))
    assert {r["outcome"] for r in rows} == {"offloaded"}
    (again,) = plan_offload_due(ws, None, END_MS)
    assert not again.due and "threshold 0 bytes hot" in again.reason and "0 bytes of sealed ledgers hot" in again.reason


def test_compaction_due_weighs_offloaded_bytes(make_ws) -> None:
    ws = make_ws(["t/on", "t/off"], topics=2, ledgers=2)
    for ns in ("t/on", "t/off"):
        ws.policies.set_namespace(ns, {"offload_threshold_bytes": 0})
    ws.policies.set_namespace("t/on", {"offload_threshold_bytes": 0, "compaction_enabled": True})
    plan = {d.namespace: d for d in plan_compaction_due(ws, ["t/on"])}
    assert plan["t/on"] == NamespaceDue("t/on", 2, 0)  # nothing offloaded yet: topics, no bytes
    rows = list(run_work(ws.config, [w.as_dict() for w in plan_offload(ws, None, END_MS)]))
    assert {r["outcome"] for r in rows} == {"offloaded"}
    plan = {d.namespace: d for d in plan_compaction_due(ws, ["t/on", "t/off", "t/none"])}
    # the offloaded ledgers' sizes: 2 topics x 2 sealed ledgers x 10 entries of 100 bytes
    assert plan["t/on"] == NamespaceDue("t/on", 2, 2 * 2 * 10 * 100)
    assert plan["t/off"] == NamespaceDue.idle("t/off", "compaction is off in the policy of its 2 topic(s)")
    assert plan["t/none"] == NamespaceDue.idle("t/none", "no topics")
    # a dry run may look at topics whose compaction is off (what would enabling it save?)
    dry = {d.namespace: d for d in plan_compaction_due(ws, ["t/off"], require_enabled=False)}
    assert dry["t/off"] == NamespaceDue("t/off", 2, 2 * 2 * 10 * 100)


# -- the setting ------------------------------------------------------------------------------------


def test_spark_shards_setting(tmp_path) -> None:
    cfg = Config.for_workspace(tmp_path)
    assert cfg.spark_shards == DEFAULT_SPARK_SHARDS == 2
    path = tmp_path / "tiered.toml"
    path.write_text(cfg.to_toml())
    assert Config.load(path, env={"TIERED_SPARK_SHARDS": "6"}).spark_shards == 6
    for bad, why in (("0", "spark_shards must be 1..1024 Spark applications per run, got 0"),
                     ("lots", "spark_shards must be an integer, got 'lots'"),
                     ("4096", "got 4096")):
        with pytest.raises(ValidationError, match=why):
            Config.load(path, env={"TIERED_SPARK_SHARDS": bad})
