"""`tiered scrub` on a workspace attached to a Pulsar cluster (tests/support/pulsar_cluster.py; the bucket on
moto's S3 server, and in the local store): structure and every message's CRC32C are checked, damage is
reported per namespace and position with "repair impossible without BookKeeper", --repair is forced off with
one line, and nothing is written: Pulsar's ZooKeeper paths and the bucket are byte-identical before and after.

The damaged message is the fixture's (a flipped payload byte at 2001:4 of acme/orders/audit); the structural
damage is planted here the way it would hit a Pulsar object: the block layout of
``BlockAwareSegmentInputStreamImpl`` and the index of ``OffloadIndexBlockImpl`` (apache/pulsar,
tiered-storage/jcloud/.../impl/), rebuilt independently in tests/support/pulsar_objects.py."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from tests.support import pulsar_objects
from tests.support.clihelp import Cli
from tests.support.pulsar_cluster import CODECS, LOCAL
from tieredcore.cold.blob import iter_objects

AUDIT = "persistent://acme/orders/audit"
PAYMENTS, CPU = "acme/orders/persistent/payments", "acme/metrics/persistent/cpu"
EVENTS0, EVENTS1 = "public/default/persistent/events-partition-0", "public/default/persistent/events-partition-1"
REPAIR_OFF = ("scrub: repair off: attached to Pulsar cluster 'pulsar-a': repair impossible without BookKeeper "
              "(damaged copies are reported, never replaced or deleted)")
# complete offloads of the fixture: payments 1001 and 1002, audit 2001, cpu 3001, events 4001 and 4101
COMPLETE = 6


def bucket(cluster) -> dict[str, tuple[int, bytes, dict]]:
    """Every object: size, bytes and user metadata (byte-identical means all three)."""
    st = cluster.store
    return {o.key: (o.size, st.get(o.key), dict(st.head(o.key).metadata)) for o in iter_objects(st, "")}


def attach(cli: Cli, cluster) -> None:
    default = ["--brokers-default"] if cluster.spec.driver == LOCAL else []
    cli.json("init", str(cli.root), "--pulsar-zk", cluster.pulsar_zk, "--store-url", cluster.store_url, *default,
             workspace=False)


def audit_damage(cluster) -> dict:
    """What the report must say of the fixture's damaged message (the reason checked apart)."""
    return {"topic": AUDIT, "ledger": 2001, "uuid": cluster.ledger("acme/orders/persistent/audit", 2001).uuid,
            "outcome": "unrepairable", "repair": "impossible without BookKeeper"}


@pytest.mark.parametrize(("codec", "driver"), [(c, "aws-s3") for c in CODECS] + [(None, LOCAL)])
def test_deep_scrub_reports_the_damaged_message_per_namespace_and_position(pulsar_cluster, tmp_path: Path, capsys,
                                                                          codec, driver):
    cluster = pulsar_cluster(codec=codec, driver=driver)
    cli = Cli(tmp_path / "ws", capsys)
    attach(cli, cluster)
    zk, objects = cluster.snapshot(), bucket(cluster)

    shallow = cli.json("scrub")  # objects exist, indexes parse and describe their ledgers: all sound
    assert shallow["outcomes"] == {"ok": COMPLETE} and shallow["attached"] == "pulsar-a"

    res = cli.json("scrub", "--deep", expect=1)
    assert res["outcomes"] == {"ok": COMPLETE - 1, "unrepairable": 1} and res["data_loss"] == []
    assert res["repair"] is False and res["repair_off"] is None  # not asked for: no line
    entries = COMPLETE * cluster.spec.entries
    assert res["messages"] == {"messages_checked": entries - 1, "messages_unchecked": 0, "messages_damaged": 1,
                               "not_messages": 0}
    (damage,) = res["namespaces"]["acme/orders"]["damage"]
    assert {k: damage[k] for k in audit_damage(cluster)} == audit_damage(cluster)
    (msg,) = damage["damaged_messages"]
    assert msg["position"] == "2001:4" and msg["reason"].startswith("CRC32C mismatch"), msg
    assert "the brokers have deleted (or are deleting) its BookKeeper ledger (bookkeeperDeleted)" in damage["problem"]
    assert all("damage" not in d for ns, d in res["namespaces"].items() if ns != "acme/orders")
    (problem,) = res["problems"]
    assert problem["outcome"] == "unrepairable" and problem["repair"] == "impossible without BookKeeper"

    code, out, err = cli("scrub", "--deep")
    assert code == 1 and "Traceback" not in err
    lines = [ln.strip() for ln in out.splitlines() if ln.strip().startswith("DAMAGED")]
    assert len(lines) == 1 and lines[0].startswith(
        f"DAMAGED acme/orders {AUDIT} 2001:4 CRC32C mismatch"), out
    assert lines[0].endswith(": repair impossible without BookKeeper"), lines
    assert f"UNREPAIRABLE {AUDIT} ledger 2001: " in out and "DATA LOSS" not in out
    assert cluster.snapshot() == zk and bucket(cluster) == objects


def test_repair_is_forced_off_with_one_line_and_nothing_changes(pulsar_cluster, tmp_path: Path, capsys):
    cluster = pulsar_cluster()
    cli = Cli(tmp_path / "ws", capsys)
    attach(cli, cluster)
    zk, objects = cluster.snapshot(), bucket(cluster)
    code, out, err = cli("--json", "scrub", "--deep", "--repair")
    assert code == 1
    assert [ln for ln in err.splitlines() if ln.strip()] == [f"tiered scrub: {REPAIR_OFF}"], err
    res = json.loads(out)
    assert res["repair"] is False and res["repair_off"] == REPAIR_OFF
    assert res["outcomes"] == {"ok": COMPLETE - 1, "unrepairable": 1}
    assert cluster.snapshot() == zk and bucket(cluster) == objects
    # the project's own records: no deletion was logged
    stats = cli.json("deletions", "stats")
    assert stats["in_flight"] == 0 and stats["counters"]["appended_offloaded"] == 0, stats


def _replace(cluster, key: str, data: bytes) -> None:
    st = cluster.store
    st.put(key, data, dict(st.head(key).metadata))


def _flip(cluster, key: str, at: int, mask: int = 0x01) -> None:
    data = bytearray(cluster.store.get(key))
    data[at] ^= mask
    _replace(cluster, key, bytes(data))


def plant_structural_damage(cluster) -> dict[tuple[str, int], str]:
    """One kind of damage per complete offload besides audit's: (managed ledger, ledger) -> what the report
    must name. Block i of a data object starts at i * MAX_BLOCK (every block but the last is full)."""
    def key(ml: str, lid: int) -> str:
        return f"{cluster.ledger(ml, lid).uuid}-ledger-{lid}"

    pad = cluster.store.get(key(PAYMENTS, 1002)).find(pulsar_objects.PADDING)
    assert pad > 0
    _flip(cluster, key(PAYMENTS, 1002), pad + 1)  # the padding after block 0's last entry
    _flip(cluster, key(PAYMENTS, 1001), 8 * 1024, 0xFF)  # block 1's header magic
    _flip(cluster, key(CPU, 3001), pulsar_objects.HEADER + 4 + 7)  # entry 0's frame says entry 1
    data = cluster.store.get(key(EVENTS0, 4001))
    _replace(cluster, key(EVENTS0, 4001), data[:-1])  # shorter than its index says
    cluster.store.delete([key(EVENTS1, 4101) + "-index"])  # lost index
    return {(PAYMENTS, 1002): "are not padding", (PAYMENTS, 1001): "magic 0x04dbabcb",
            (CPU, 3001): "holds entry 1, expected 0", (EVENTS0, 4001): str(len(data)),
            (EVENTS1, 4101): "NotFoundError"}


def test_structure_damage_is_reported_per_ledger_and_nothing_changes(pulsar_cluster, tmp_path: Path, capsys):
    """Header, block framing, padding, index against data, a lost object: each ledger unrepairable, named
    with its problem; which BookKeeper copy the brokers' record says is gone or may be left."""
    cluster = pulsar_cluster()
    cli = Cli(tmp_path / "ws", capsys)
    attach(cli, cluster)
    planted = plant_structural_damage(cluster)
    zk, objects = cluster.snapshot(), bucket(cluster)
    res = cli.json("scrub", "--deep", "--repair", expect=1)
    assert res["outcomes"] == {"unrepairable": COMPLETE}
    damage = {(d["topic"], d["ledger"]): d for ns in res["namespaces"].values() for d in ns.get("damage", ())}
    assert len(damage) == COMPLETE
    for (ml, lid), what in planted.items():
        t, ns, _, local = ml.split("/")
        d = damage[(f"persistent://{t}/{ns}/{local}", lid)]
        assert d["repair"] == "impossible without BookKeeper" and d["damaged_messages"] == [], d
        assert what in d["problem"], (what, d["problem"])
    assert "BookKeeper may still hold ledger 1002 until the brokers' offload deletion lag passes" in damage[
        ("persistent://acme/orders/payments", 1002)]["problem"]
    assert "bookkeeperDeleted" in damage[("persistent://acme/orders/payments", 1001)]["problem"]
    assert [m["position"] for m in damage[(AUDIT, 2001)]["damaged_messages"]] == ["2001:4"]

    shallow = cli.json("scrub", expect=1)  # the lost index and the short data object are found without reading data
    assert shallow["outcomes"] == {"ok": COMPLETE - 2, "unrepairable": 2}
    assert cluster.snapshot() == zk and bucket(cluster) == objects


def test_struct_offsets_follow_pulsars_block_header():
    """The offsets the planting uses: DataBlockHeaderImpl's magic (int) then header length, block length and
    first entry id (longs); a frame is [int length][long entry id]."""
    entries = [bytes([i]) * 50 for i in range(3)]
    pair = pulsar_objects.build(entries, ledger_id=9, uuid="00000000-0000-4000-8000-000000000000")
    magic, header, _, first = struct.unpack_from(">Iqqq", pair.data)
    assert (magic, header, first) == (pulsar_objects.DATA_MAGIC, pulsar_objects.HEADER, 0)
    assert struct.unpack_from(">iq", pair.data, pulsar_objects.HEADER) == (50, 0)
