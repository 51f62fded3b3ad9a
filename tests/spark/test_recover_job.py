"""spark_jobs/recover.py: bad input exits 2 before Spark starts; over a bucket with plain, compacted and
streaming topics, a damaged manifest and a topic whose manifests are all gone (recovered from its index
objects), a real spark-submit plans exactly what `tiered recover` plans in one process, and --apply writes
the same records."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from spark_jobs import recover as recover_job
from tests.support.workspaces import build_workspace, offload, sealed, stream
from tieredcore.cold.blob import iter_objects
from tieredcore.config import Config
from tieredcore.formats.keys import is_topic_manifest_key
from tieredcore.lifecycle.recover import recover
from tieredcore.lifecycle.topic_compaction import compact_topic
from tieredcore.workspace import Workspace

from .conftest import spark_submit
from .test_jobs import no_spark  # noqa: F401  (fixture)

A0, A1, A2 = "persistent://t/a/topic-0000", "persistent://t/a/topic-0001", "persistent://t/a/topic-0002"
S0 = "persistent://t/s/topic-0000"
AS_OF = "2026-03-01T12:00:00Z"


def bucket(root: Path) -> Path:
    cfg = build_workspace(root, ["t/a", "t/s"], topics=3, ledgers=3, entries=10, messages=True)
    with Workspace(Config.load(cfg, env={})) as ws:
        ws.policies.set_namespace("t/a", {"offload_threshold_bytes": 0, "retention_time_minutes": 10_000})
        offload(ws, A0, sealed(ws, A0))
        compact_topic(ws, A0)
        offload(ws, A1, sealed(ws, A1))
        offload(ws, A2, sealed(ws, A2))
        stream(ws, S0, max_segment_size=1500)
        store = ws.manifests.store
        keys = [o.key for o in iter_objects(store) if is_topic_manifest_key(o.key, "")]
    a1 = sorted(k for k in keys if "/topic-0001/" in k)
    store.put(a1[-1], b"not a manifest")  # A1: its newest manifest damaged (an older one is used)
    store.delete([k for k in keys if "/topic-0002/" in k])  # A2: every manifest gone (from its index objects)
    os.remove(root / "metadata.db")
    return cfg


def records(cfg: Path) -> dict[str, bytes]:
    with Workspace(Config.load(cfg, env={})) as ws:
        out = {t.full: ws.ml.get_topic(t)[0].SerializeToString(deterministic=True)
               for ns in ws.ml.list_namespaces() for t in ws.ml.list_topics(ns)}
        out.update({f"policy {ns}": json.dumps(ws.ml.get_policies(ns), sort_keys=True).encode()
                    for ns in ws.ml.list_policy_namespaces()})
        return out


def test_bad_input_exits_2_with_nothing_started(no_spark, tmp_path: Path, capsys) -> None:  # noqa: F811
    cfg = build_workspace(tmp_path / "ws", ["t/x"], ledgers=1)  # nothing offloaded: nothing to recover
    rc = recover_job.main(["--config", str(cfg), "--as-of", AS_OF, "--report-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert rc == 2 and "not empty" in err, err  # its store has topics
    os.remove(tmp_path / "ws" / "metadata.db")
    rc = recover_job.main(["--config", str(cfg), "--as-of", AS_OF, "--report-dir", str(tmp_path / "r"), "--apply"])
    err = capsys.readouterr().err
    assert rc == 2 and "nothing to recover" in err and not (tmp_path / "r").exists(), err


@pytest.mark.slow
def test_spark_recovery_equals_the_one_process_recovery(tmp_path: Path) -> None:
    cfg = bucket(tmp_path / "ws")
    db = tmp_path / "ws" / "metadata.db"
    with Workspace(Config.load(cfg, env={})) as ws:
        local = recover(ws).as_dict()  # the dry run in this process
    assert {t["topic"]: t["source"] for t in local["topics"]} == {
        "t/a/persistent/topic-0000": "manifest", "t/a/persistent/topic-0001": "manifest",
        "t/a/persistent/topic-0002": "index", "t/s/persistent/topic-0000": "manifest"}
    assert len(local["damaged_manifests"]) == 1 and local["fallback_topics"] == []
    assert not db.exists()

    common = ["--config", str(cfg), "--as-of", AS_OF]
    rc, out = spark_submit("recover", *common, "--run-id", "dry", log=tmp_path / "dry.log")
    assert rc == 0, out
    dry = json.loads((tmp_path / "ws" / "reports" / "recover" / "dry" / "recover" / "summary.json").read_text())
    for k in ("topics", "damaged_manifests", "stale_manifests", "orphans", "not_recoverable", "unreadable",
              "fallback_topics", "deleted_topics", "objects_listed", "manifests", "identity"):
        assert dry[k] == local[k], k
    assert dry["applied"] is False and dry["totals"]["counters"]["from_index"] == 1
    assert records(cfg) == {}

    rc, out = spark_submit("recover", *common, "--apply", "--run-id", "apply", log=tmp_path / "apply.log")
    assert rc == 0, out
    applied = json.loads((tmp_path / "ws" / "reports" / "recover" / "apply" / "recover" / "summary.json").read_text())
    assert [t["action"] for t in applied["topics"]] == ["created"] * 4
    assert applied["totals"]["outcomes"] == {"created": 4} and "created 4 topic(s)" in out
    by_spark = records(cfg)
    os.remove(db)
    with Workspace(Config.load(cfg, env={})) as ws:
        recover(ws, apply=True)
    assert records(cfg) == by_spark and len(by_spark) == 5  # 4 topics, t/a's policy
