"""A dead object store ends every command and job within the deadline (issue 28, item 1).

The store: the fault proxy in front of the session's moto server, switched to ``blackhole`` (requests read,
never answered: an endpoint that accepts connections and hangs) or stopped (its port refuses connections).
The workspace is built and partly offloaded while the store answers; then it dies. Each test asserts the
outcome (non-zero exit, the rest ``aborted``, one line naming the store and the cause) and that the command
ended: pytest-timeout's deadline (or a subprocess timeout) is the guard, no wall-clock figure is asserted.

Most tests shrink the client settings (1 s read timeout, 2 attempts, store_dead_after 2 s) to stay fast;
``test_default_settings_end_within_a_minute`` runs with every default, in a subprocess given 75 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest

from tests.support.faulty_s3_proxy import FaultyS3Proxy
from tests.support.workspaces import END_MS, build_workspace, offload, sealed
from tieredcore.cli import main as cli
from tieredcore.config import ENV_CONFIG, ENV_OVERRIDES, Config
from tieredcore.errors import TieredError
from tieredcore.lifecycle.runner import run_work
from tieredcore.lifecycle.scrub import plan_scrub
from tieredcore.lifecycle.sweep import plan_offload
from tieredcore.workspace import Workspace

NAMESPACE = "acme/dead"
REPO = Path(__file__).resolve().parents[1]
# small client settings for the fast tests: one request gives up within 2 x 1 s + backoff
FAST = "&read_timeout=1&connect_timeout=1&max_attempts=2"
FAST_DEAD_AFTER = "2"
pytestmark = pytest.mark.timeout(90)


@dataclass
class DeadStore:
    root: Path
    proxy: FaultyS3Proxy
    bucket: str
    base_url: str  # the store URL the workspace was built with (the recorded endpoint: the proxy)
    topics: list[str]

    def ws_args(self) -> list[str]:
        return ["--workspace", str(self.root), "--json"]

    def die(self, how: str = "blackhole") -> None:
        if how == "blackhole":
            self.proxy.blackhole = True
        else:
            self.proxy.stop()  # its port is closed: connections are refused


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (*ENV_OVERRIDES, ENV_CONFIG):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TIERED_NO_PROGRESS", "1")


def _build(tmp_path: Path, moto_endpoint: str, messages: bool = False, **overrides: str) -> Iterator[DeadStore]:
    bucket = f"dead-{uuid.uuid4().hex[:16]}"
    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    with FaultyS3Proxy(moto_endpoint, rate=0.0) as proxy:
        url = f"s3://{bucket}/p?endpoint={proxy.url}&region=us-east-1"
        root = tmp_path / "ws"
        cfg = build_workspace(root, [NAMESPACE], topics=2, ledgers=6, entries=20,
                              config_overrides={"store_url": url, "max_block_size": 5 * 1024 * 1024, **overrides},
                              messages=messages)
        with Workspace(Config.load(cfg, env={})) as ws:
            topics = sorted(t.full for t in ws.ml.list_topics(NAMESPACE))
            for t in topics:
                offload(ws, t, sealed(ws, t)[:2], as_of=END_MS)
        yield DeadStore(root, proxy, bucket, url, topics)


@pytest.fixture
def store(tmp_path: Path, moto_endpoint: str, clean_env: None) -> Iterator[DeadStore]:
    """Two topics of six sealed ledgers; the two oldest of each offloaded; the store still answering."""
    yield from _build(tmp_path, moto_endpoint)


@pytest.fixture
def message_store(tmp_path: Path, moto_endpoint: str, clean_env: None) -> Iterator[DeadStore]:
    """As ``store``, its entries Pulsar messages (what the export and the data source read)."""
    yield from _build(tmp_path, moto_endpoint, messages=True)


@pytest.fixture
def encrypted_store(tmp_path: Path, moto_endpoint: str, clean_env: None) -> Iterator[DeadStore]:
    """As ``store``, with a key ring <root>/keys named by the configuration."""
    yield from _build(tmp_path, moto_endpoint, key_ring=str(tmp_path / "ws" / "keys"))


def fast(monkeypatch: pytest.MonkeyPatch, s: DeadStore) -> None:
    """The same store (bucket, endpoint, prefix) with the fast client settings and store_dead_after."""
    monkeypatch.setenv("TIERED_STORE_URL", s.base_url + FAST)
    monkeypatch.setenv("TIERED_STORE_DEAD_AFTER", FAST_DEAD_AFTER)


def run(s: DeadStore, capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = cli.main([*s.ws_args(), *args])
    out, err = capsys.readouterr()
    return rc, out, err


def assert_names_the_dead_store(text: str, s: DeadStore) -> None:
    assert "not answering" in text and s.bucket in text, text[-3000:]



def results(out: str) -> dict:
    return json.loads(out)


# -- the commands, each against a store that accepts connections and never answers --------------------


def test_offload_ledger_mode_aborts_the_rest(store: DeadStore, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    fast(monkeypatch, store)
    store.die()
    rc, out, _ = run(store, capsys, "offload", "--namespace", NAMESPACE, "--keep-bytes", "0")
    res = results(out)
    assert rc == 1
    outcomes = [r["outcome"] for r in res["results"]]
    # 4 ledgers per topic not offloaded yet: the failure budget (5) is spent, the rest not attempted
    assert outcomes == ["failed"] * 5 + ["aborted"] * 3, outcomes
    assert res["offloaded"] == 0
    assert_names_the_dead_store(res["results"][-1]["error"], store)
    # the owner marker was asked for once (its GET never answered), not once per ledger
    assert store.proxy.blackholed == 2  # max_attempts=2 of that one GET


def test_offload_streaming(store: DeadStore, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    fast(monkeypatch, store)
    store.die()
    rc, out, _ = run(store, capsys, "offload", "--streaming", "--namespace", NAMESPACE)
    res = results(out)
    assert rc == 1 and res["segments"] == 0 and res["failed"] == len(res["results"]) > 0
    assert_names_the_dead_store(res["results"][-1]["error"], store)


def test_read_falls_back_to_hot_copies_and_names_the_store(store: DeadStore, monkeypatch: pytest.MonkeyPatch,
                                                             capsys) -> None:
    fast(monkeypatch, store)
    store.die()
    rc, out, err = run(store, capsys, "read", store.topics[0])
    # every entry still has its hot copy: the read completes from it, saying why it did not use the store
    assert rc == 0 and results(out)["fallbacks"] == 2, err
    assert_names_the_dead_store(err, store)


def test_read_of_an_offloaded_only_ledger_fails(store: DeadStore, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    with Workspace(Config.load(store.root / "tiered.toml", env={})) as ws:
        ledger = sealed(ws, store.topics[0])[0]
        ws.hot.delete_ledger(ledger)  # as the deletion-lag cleanup and the drain would: only the store has it
    fast(monkeypatch, store)
    store.die()
    rc, out, err = run(store, capsys, "read", store.topics[0])
    assert rc != 0
    assert_names_the_dead_store(err, store)


@pytest.mark.parametrize("args", [["verify"], ["verify", "--offloaded-only"]], ids=["verify", "offloaded-only"])
def test_verify(store: DeadStore, monkeypatch: pytest.MonkeyPatch, capsys, args: list[str]) -> None:
    fast(monkeypatch, store)
    store.die()
    rc, out, err = run(store, capsys, *args)
    assert rc == 1
    assert_names_the_dead_store(out, store)


@pytest.mark.parametrize("deep", [False, True], ids=["shallow", "deep"])
def test_scrub(store: DeadStore, monkeypatch: pytest.MonkeyPatch, capsys, deep: bool) -> None:
    fast(monkeypatch, store)
    store.die()
    rc, out, err = run(store, capsys, "scrub", *(["--deep"] if deep else []))
    assert rc == 1
    rows = results(out)["problems"]
    assert rows and all(r["outcome"] in ("failed", "aborted") for r in rows), rows
    assert_names_the_dead_store(rows[-1]["error"], store)


def test_reconcile(store: DeadStore, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    fast(monkeypatch, store)
    store.die()
    rc, out, err = run(store, capsys, "reconcile")
    res = results(out)
    assert rc == 1 and res["records_appended"] == 0
    assert_names_the_dead_store(" ".join(res["errors"]), store)


def test_status(store: DeadStore, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    fast(monkeypatch, store)
    store.die()
    rc, out, err = run(store, capsys, "status", "--by-namespace")
    assert rc == 1 and err.count("\n") == 1, err  # one line
    assert_names_the_dead_store(err, store)


def test_drain_aborts_the_rest_and_keeps_the_records(store: DeadStore, monkeypatch: pytest.MonkeyPatch,
                                                     capsys) -> None:
    # retention (no store request) records every sealed ledger for deletion: hot copies and offloaded copies
    assert cli.main(["--workspace", str(store.root), "policies", "set", NAMESPACE,
                     "--retention-time-minutes", "1"]) == 0
    rc, out, _ = run(store, capsys, "retention", "--as-of", "2030-01-01T00:00:00Z")
    assert rc == 0 and results(out)["ledgers"] == 12
    fast(monkeypatch, store)
    store.die()
    rc, out, err = run(store, capsys, "deletions", "drain", "--as-of", "2030-01-01T00:00:00Z")
    res = results(out)
    assert rc == 1
    # the hot copies go (no store needed); the 4 offloaded copies' records: not attempted, kept as they were
    assert res["deleted_hot"] == 12 and res["aborted"] == 4 and res["retrying"] == 0, res
    assert_names_the_dead_store(next(r["error"] for r in res["rows"] if r["outcome"] == "aborted"), store)
    with Workspace(Config.load(store.root / "tiered.toml", env={})) as ws:
        due = ws.deletion_log.due(as_of_ms=2_000_000_000_000)
        assert len(due) == 4 and all(e.record is not None and e.record.attempts == 0 for e in due)


def test_compact(store: DeadStore, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    assert cli.main(["--workspace", str(store.root), "policies", "set", NAMESPACE, "--compaction", "on"]) == 0
    fast(monkeypatch, store)
    store.die()
    rc, out, err = run(store, capsys, "compact", "--namespace", NAMESPACE)
    assert rc == 1, (out, err)
    assert_names_the_dead_store(out + err, store)


def test_init_with_a_dead_store(store: DeadStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    store.die()
    capsys.readouterr()
    rc = cli.main(["init", str(tmp_path / "new"), "--store-url", store.base_url + FAST])
    _, err = capsys.readouterr()
    # one request (the owner marker's GET) decides: one line naming the store and the cause
    assert rc != 0 and err.count("\n") == 1, err
    assert store.bucket in err and "Read timeout" in err, err
    assert not (tmp_path / "new").exists() or not (tmp_path / "new" / "tiered.toml").exists()


def test_keys_rotate(encrypted_store: DeadStore, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    s = encrypted_store
    assert run(s, capsys, "keys", "new", "k1", "--bits", "2048")[0] == 0
    with Workspace(Config.load(s.root / "tiered.toml", env={})) as ws:
        ws.policies.set_namespace(NAMESPACE, {"transform": "zstd+aes", "transform_chunk_size": 4096})
    rc, out, _ = run(s, capsys, "offload", s.topics[0], "--keep-bytes", "0")
    assert rc == 0 and results(out)["offloaded"] == 4
    assert run(s, capsys, "keys", "new", "k2", "--bits", "2048")[0] == 0
    fast(monkeypatch, s)
    s.die()
    rc, out, err = run(s, capsys, "keys", "rotate")
    res = results(out)
    assert rc == 1 and res["objects"] == 0 and len(res["errors"]) == 1, res
    assert_names_the_dead_store(res["errors"][0], s)


# -- the Spark jobs' units, run in-process as their tasks run them --------------------------------------


def test_spark_sweep_and_scrub_units(store: DeadStore, monkeypatch: pytest.MonkeyPatch) -> None:
    fast(monkeypatch, store)
    assert cli.main(["--workspace", str(store.root), "policies", "set", NAMESPACE,
                     "--offload-threshold-bytes", "0"]) == 0
    config = Config.load(store.root / "tiered.toml")  # with the fast settings from the environment
    with Workspace(config) as ws:
        offload_units = [w.as_dict() for w in plan_offload(ws, [NAMESPACE], END_MS + 60_000)]
        scrub_units = [w.as_dict() for w in plan_scrub(ws, [NAMESPACE], END_MS + 60_000)]
    store.die()
    rows = list(run_work(config, offload_units))  # one Spark task's share: every unit
    outcomes = [r["outcome"] for r in rows]
    assert outcomes == ["failed"] * 5 + ["aborted"] * 3, outcomes
    assert_names_the_dead_store(rows[-1]["error"], store)
    rows = list(run_work(config, scrub_units))
    assert rows and {r["outcome"] for r in rows} <= {"failed", "aborted"}, rows


def _drop_hot_copies(s: DeadStore) -> list[tuple[str, int]]:
    """The hot copies of the offloaded ledgers deleted, as the deletion-lag cleanup would: only the store
    has them. Returns (topic, ledger) of each."""
    out = []
    with Workspace(Config.load(s.root / "tiered.toml", env={})) as ws:
        for t in s.topics:
            for lid in sorted(_offloaded(ws, t)):
                ws.hot.delete_ledger(lid)
                out.append((t, lid))
    return out


def test_export(message_store: DeadStore, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """The Iceberg export of ledgers only the store holds: with the store dead it ends, exit 1, naming the
    store, and commits nothing; alive again, the rerun exports all of them."""
    s = message_store
    assert len(_drop_hot_copies(s)) == 4
    fast(monkeypatch, s)
    s.die()
    rc, out, err = run(s, capsys, "export", "--namespace", NAMESPACE)
    assert rc == 1, (out, err)
    assert_names_the_dead_store(out + err, s)
    assert sum(t["ledgers"] for t in json.loads(out)["tables"]) == 0
    s.proxy.blackhole = False
    rc, out, err = run(s, capsys, "export", "--namespace", NAMESPACE)
    assert rc == 0, (out, err)
    assert sum(t["ledgers"] for t in json.loads(out)["tables"]) == 4


def test_query_parts_of_offloaded_ledgers(message_store: DeadStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a Spark task of format("tiered") does (read_part): a ledger only the store holds is, with the
    store dead, an error naming the store (not a hang); ledgers with hot copies still read."""
    from tieredcore.names import TopicName
    from tieredcore.query.scan import plan_scan, read_part

    s = message_store
    cold = set(_drop_hot_copies(s))
    fast(monkeypatch, s)
    with Workspace(Config.load(s.root / "tiered.toml")) as ws:
        plan = plan_scan(ws, [TopicName.parse(t) for t in s.topics])
        s.die()
        parts = {(p.topic, p.ledger_id): p for p in plan.parts}
        assert cold <= set(parts) and len(parts) > len(cold)
        for key, p in parts.items():
            if key not in cold:
                assert sum(b.num_rows for b in read_part(ws, p, record_stats=False)) > 0
        with pytest.raises(TieredError) as e:
            for _ in read_part(ws, parts[min(cold)], record_stats=False):
                pass
    assert_names_the_dead_store(str(e.value), s)


@pytest.mark.parametrize("hot", [True, False], ids=["hot-copies", "store-only"])
def test_compact_topic(message_store: DeadStore, monkeypatch: pytest.MonkeyPatch, capsys, hot: bool) -> None:
    """Topic compaction with the store dead: with the hot copies there, the read succeeds and the compacted
    ledger's offload fails; with only the store holding the offloaded ledgers, the read fails. Either way
    it ends, exit 1, naming the store, and records nothing; alive again, the rerun compacts the topic."""
    from tieredcore.offload.compacted_state import compaction_state

    s = message_store
    if not hot:
        assert len(_drop_hot_copies(s)) == 4
    fast(monkeypatch, s)
    s.die()
    rc, out, err = run(s, capsys, "compact-topic", s.topics[0])
    assert rc == 1, (out, err)
    assert_names_the_dead_store(out + err, s)
    with Workspace(Config.load(s.root / "tiered.toml", env={})) as ws:
        assert compaction_state(ws.ml.get_topic(s.topics[0])[0]) is None
    s.proxy.blackhole = False
    rc, out, err = run(s, capsys, "compact-topic", s.topics[0])
    assert rc == 0, (out, err)
    res = results(out)
    assert res["outcome"] == "compacted" and res["keys_after"] > 0 and res["uuid"]
    with Workspace(Config.load(s.root / "tiered.toml", env={})) as ws:
        st = compaction_state(ws.ml.get_topic(s.topics[0])[0])
        assert st is not None and st.uuid == res["uuid"]


def _offloaded(ws: Workspace, topic: str) -> set[int]:
    from tieredcore.offload.context import is_offloaded

    return {li.ledgerId for li in ws.ml.get_topic(topic)[0].ledgerInfo if is_offloaded(li)}


# -- a store that refuses connections ----------------------------------------------------------------


def test_refused_connections_end_the_offload(store: DeadStore, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    fast(monkeypatch, store)
    store.die("refuse")
    rc, out, _ = run(store, capsys, "offload", "--namespace", NAMESPACE, "--keep-bytes", "0")
    res = results(out)
    assert rc == 1 and res["offloaded"] == 0
    outcomes = [r["outcome"] for r in res["results"]]
    assert outcomes == ["failed"] * 5 + ["aborted"] * 3, outcomes
    assert "not attempted" in res["results"][-1]["error"] and store.bucket in res["results"][-1]["error"]


# -- the defaults: a dead store ends a command within a minute -----------------------------------------


@pytest.mark.parametrize("how", ["blackhole", "refuse"])
def test_default_settings_end_within_a_minute(store: DeadStore, how: str) -> None:
    """No setting shrunk: the README's arithmetic (one request <= 33 s, the store dead after 30 s of
    silence, everything after that at once). The subprocess is given 75 s; it must have ended by then."""
    store.die(how)
    env = {k: v for k, v in os.environ.items() if k not in ENV_OVERRIDES and k != ENV_CONFIG}
    env.update(PYTHONPATH=str(REPO), TIERED_NO_PROGRESS="1")
    p = subprocess.run([sys.executable, "-m", "tieredcore.cli.main", "--workspace", str(store.root), "--json",
                        "offload", "--namespace", NAMESPACE, "--keep-bytes", "0"],
                       env=env, capture_output=True, text=True, timeout=75, cwd=REPO)
    assert p.returncode == 1, p.stderr[-2000:]
    res = json.loads(p.stdout)
    assert res["offloaded"] == 0 and [r["outcome"] for r in res["results"]][-1] == "aborted"
    if how == "blackhole":
        assert_names_the_dead_store(res["results"][-1]["error"], store)
