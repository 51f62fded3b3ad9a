"""The key rotation Spark job: bad input in-process (no Spark), then one real spark-submit (slow) over two
locations (the workspace's filesystem store, an S3 bucket on moto) where two objects need a key taken
off the ring: those fail (exit 1), every other encrypted object is re-wrapped, unencrypted ones are
skipped; once the key is back, a rerun finishes the job."""

from __future__ import annotations

import json
import shutil

import pyarrow.parquet as pq
import pytest

from spark_jobs import _jobkit, rotate_keys
from spark_jobs._jobkit import SUMMARY_PREFIX
from tests.support.workspaces import END_ISO, END_MS, build_workspace
from tieredcore.cold.keyring import KeyRing
from tieredcore.config import Config
from tieredcore.lifecycle.keys import find_manifests, key_status, retire, rotate
from tieredcore.lifecycle.runner import run_work
from tieredcore.lifecycle.sweep import plan_offload
from tieredcore.lifecycle.work import LedgerResult
from tieredcore.names import TopicName
from tieredcore.offload.copies import open_offloaded
from tieredcore.workspace import Workspace

from .conftest import spark_submit

ENC, S3_ENC, ZSTD = "t/a", "t/b", "t/c"
LEDGERS = 2


@pytest.fixture(scope="module")
def key_pool(tmp_path_factory):
    d = tmp_path_factory.mktemp("pool")
    for k in ("k0", "k1", "k2"):
        KeyRing.add_key(d, k, bits=2048)
    return d


def ring_of(path, pool, ids, active):
    path.mkdir(mode=0o700)
    for k in ids:
        shutil.copy(pool / f"{k}.pem", path / f"{k}.pem")
    (path / "active").write_text(active + "\n")
    return path


@pytest.fixture
def no_spark(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("a Spark session was requested for bad input")

    monkeypatch.setattr(_jobkit, "session", boom)
    monkeypatch.setattr(_jobkit, "exit_with_parent", lambda: None)


@pytest.mark.parametrize(
    "args,message",
    [
        (["--as-of", "garbage"], "--as-of 'garbage'"),
        (["--as-of", END_ISO, "--namespace", "t/a"], "--namespace is not supported by key rotation"),
        (["--as-of", END_ISO, "--to", "nope"], "no key nope"),
        (["--as-of", END_ISO, "--to", "bad:id"], "key id 'bad:id'"),
    ],
)
def test_bad_input_exits_2_without_spark(no_spark, tmp_path, key_pool, capsys, args, message):
    ring = ring_of(tmp_path / "ring", key_pool, ["k1"], "k1")
    cfg = build_workspace(tmp_path / "ws", ["t/a"], ledgers=1, config_overrides={"key_ring": str(ring)})
    assert rotate_keys.main(["--config", str(cfg), *args]) == 2
    assert message in capsys.readouterr().err


def test_without_a_key_ring_exits_2_without_spark(no_spark, tmp_path, capsys):
    cfg = build_workspace(tmp_path / "ws", ["t/a"], ledgers=1)
    assert rotate_keys.main(["--config", str(cfg), "--as-of", END_ISO]) == 2
    assert "no key ring configured" in capsys.readouterr().err


def read_back(ws: Workspace, ns: str) -> list[bytes]:
    topic = f"persistent://{ns}/topic-0000"
    info, _ = ws.ml.get_topic(topic)
    out = []
    for li in info.ledgerInfo[:-1]:
        h = open_offloaded(li, ws.offloader, TopicName.parse(topic).managed_ledger_name, ws.offloader_for_driver)
        try:
            out += [bytes(e.data) for e in h.read(0, li.entries - 1)]
        finally:
            h.close()
    return out


@pytest.mark.slow
def test_rotate_keys_with_spark(tmp_path, key_pool, s3_store, moto_endpoint):
    ring = ring_of(tmp_path / "ring", key_pool, ["k0", "k1"], "k1")
    cfg = build_workspace(tmp_path / "ws", [ENC, S3_ENC, ZSTD], ledgers=LEDGERS, entries=40, entry_size="20-2000",
                          config_overrides={"key_ring": str(ring)})
    config = Config.load(str(cfg), env={})
    reports = tmp_path / "reports"
    with Workspace(config) as ws:
        ps = ws.policies
        ps.set_namespace(ENC, {"offload_threshold_bytes": 0, "transform": "zstd+aes", "transform_chunk_size": 4096})
        ps.set_namespace(S3_ENC, {"offload_threshold_bytes": 0, "transform": "aes", "transform_chunk_size": 4096,
                                  "store": {"driver": "aws-s3", "bucket": s3_store.bucket, "prefix": "b/",
                                            "endpoint": moto_endpoint}})
        ps.set_namespace(ZSTD, {"offload_threshold_bytes": 0, "transform": "zstd", "transform_chunk_size": 4096})
        res = [LedgerResult(**r) for r in run_work(config, [w.as_dict() for w in plan_offload(ws, None, END_MS)])]
        assert len(res) == 3 * LEDGERS and {r.outcome for r in res} == {"offloaded"}, res
        entries = {ns: read_back(ws, ns) for ns in (ENC, S3_ENC)}
        listing = find_manifests(ws)
        assert len(listing.locations) == 2 and len(listing.refs) == 3 * 2 * LEDGERS
        s3_label = next(loc for loc in listing.locations if "b/" in loc and s3_store.bucket in loc)
        fs_label = next(loc for loc in listing.locations if loc != s3_label)
        # two of the bucket's objects are wrapped by k0, which is then taken off the ring by hand
        stray = [r for r in listing.refs if r.location == s3_label][:2]
        assert {r.outcome for r in rotate(ws, stray, "k0")} == {"rewrapped"}
    (ring / "k0.pem").rename(ring / "k0.pem.retired")
    shutil.copy(key_pool / "k2.pem", ring / "k2.pem")
    (ring / "active").write_text("k2\n")

    rc, log = spark_submit("rotate_keys", "--config", str(cfg), "--as-of", END_ISO, "--run-id", "r1",
                           "--report-dir", str(reports), log=tmp_path / "rotate.log")
    assert rc == 1, log
    summary = json.loads((reports / "rotate_keys" / "r1" / "rotate_keys" / "summary.json").read_text())
    n_enc = 2 * LEDGERS  # objects per namespace (data + index per ledger)
    assert summary["target"] == "k2" and summary["dry_run"] is False
    assert summary["outcomes"] == {"failed": 2, "rewrapped": 2 * n_enc - 2, "skipped": n_enc}
    assert summary["locations"] == {fs_label: {"rewrapped": n_enc, "skipped": n_enc},
                                    s3_label: {"failed": 2, "rewrapped": n_enc - 2}}
    assert sorted(f.split(":")[0] for f in summary["failed"]) == sorted(r.key for r in stray)
    assert all("wrapped by key k0, which is not on key ring" in f for f in summary["failed"])
    assert summary["totals"]["failures"] == 2 and summary["totals"]["ledgers"] == 3 * n_enc
    logged = json.loads(next(x for x in log.splitlines() if x.startswith(SUMMARY_PREFIX))[len(SUMMARY_PREFIX):])
    assert logged["outcomes"] == summary["outcomes"]
    detail = pq.read_table(reports / "rotate_keys" / "r1" / "rotate_keys" / "detail.parquet").to_pylist()
    assert len(detail) == 3 * n_enc
    assert {(d["kek_from"], d["kek_to"], d["outcome"]) for d in detail} == {
        ("k1", "k2", "rewrapped"), (None, "k2", "skipped"), ("k0", "k2", "failed")}

    # the key restored: a rerun (here in-process) re-wraps only what is left; then k0 and k1 retire
    (ring / "k0.pem.retired").rename(ring / "k0.pem")
    with Workspace(config) as ws:
        rows = rotate(ws, find_manifests(ws).refs)
        assert sorted(r.key for r in rows if r.outcome == "rewrapped") == sorted(r.key for r in stray)
        st = key_status(ws)
        assert st.needing("k2") == 2 * n_enc and st.needing("k0") == st.needing("k1") == 0
        retire(ws, "k0")
        retire(ws, "k1")
    with Workspace(config) as ws:
        assert {ns: read_back(ws, ns) for ns in (ENC, S3_ENC)} == entries
