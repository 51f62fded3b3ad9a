"""spark_jobs/compact_topics.py: bad input in-process (exit 2, nothing started); real spark-submit runs
(slow) over a namespace of keyed topics whose policy sets a compaction threshold: a dry run that plans the
topic above it and changes nothing, a real run that compacts it, then a manual run naming both topics
(the compacted one has nothing to compact, the other is compacted whatever its backlog).

spark-submit invocations in this module: 3."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from spark_jobs import compact_topics
from tieredcore.cli import main as cli
from tieredcore.config import Config
from tieredcore.lifecycle.topic_compaction_run import DETAIL_SCHEMA, backlog_bytes
from tieredcore.offload.compacted_state import compaction_state
from tieredcore.workspace import Workspace

from .conftest import spark_submit
from .test_jobs import no_spark  # noqa: F401  (fixture)

NS = "acme/keys"
T0, T1 = f"persistent://{NS}/topic-0000", f"persistent://{NS}/topic-0001"
KEYS = 12
AS_OF = "2026-03-02T00:00:00Z"
DETAIL_COLUMNS = [c.strip().split()[0] for c in DETAIL_SCHEMA.split(",")]


def keyed(root: Path) -> Path:
    assert cli.main(["init", str(root)]) == 0
    assert cli.main(["--workspace", str(root), "generate", "--namespace", NS, "--topics", "2", "--ledgers", "3",
                     "--entries", "40", "--entry-size", "100-600", "--keys", str(KEYS),
                     "--end-time", "2026-03-01T12:00:00Z"]) == 0
    return root / "tiered.toml"


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return keyed(tmp_path_factory.mktemp("tc") / "ws")


def records(cfg: Path) -> dict[str, bytes]:
    with Workspace(Config.load(cfg, env={})) as ws:
        return {t.full: ws.ml.get_topic(t)[0].SerializeToString() for t in ws.ml.list_topics(NS)}


@pytest.mark.parametrize("extra,message", [
    (["--threshold", "garbage"], "--threshold: size 'garbage'"),
    (["--threshold", "-1"], "--threshold '-1': must be a size between 0"),
    (["--topic", f"{NS}/nope"], f"topic persistent://{NS}/nope does not exist"),
    (["--topic", T0, "--namespace", NS], "--namespace and --topic exclude each other"),
    (["--topic", T0, "--threshold", "1M"], "--threshold applies to --namespace plans"),
    (["--namespace", "nope"], "namespace name 'nope'"),
])
def test_bad_input_exits_2_with_nothing_started(no_spark, shared: Path, tmp_path: Path, capsys,  # noqa: F811
                                                extra, message) -> None:
    before = records(shared)
    rc = compact_topics.main(["--config", str(shared), "--as-of", AS_OF, "--report-dir", str(tmp_path / "r"), *extra])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("ERROR compact_topics: ") and message in err, err
    assert not (tmp_path / "r").exists() and records(shared) == before


def report(cfg: Path, run_id: str) -> tuple[dict, list[dict]]:
    out = cfg.parent / "reports" / "compact_topics" / run_id / "compact_topics"
    detail = pq.read_table(out / "detail.parquet")
    assert detail.column_names == DETAIL_COLUMNS
    return json.loads((out / "summary.json").read_text()), detail.to_pylist()


@pytest.mark.slow
def test_threshold_plan_dry_run_real_run_then_manual_topics(tmp_path: Path) -> None:
    cfg = keyed(tmp_path / "ws")
    config = Config.load(cfg, env={})
    with Workspace(config) as ws:
        b0, b1 = backlog_bytes(ws, T0), backlog_bytes(ws, T1)
        assert b0 != b1
        ws.policies.set_namespace(NS, {"topic_compaction_threshold_bytes": (b0 + b1) // 2})
    (big, big_backlog), (small, _) = sorted(((T0, b0), (T1, b1)), key=lambda x: -x[1])
    common = ["--config", str(cfg), "--as-of", AS_OF]

    # 1. dry run: the topic above the threshold planned, nothing written
    before = records(cfg)
    rc, out = spark_submit("compact_topics", *common, "--dry-run", "--run-id", "dry", log=tmp_path / "dry.log")
    assert rc == 0, out
    s, detail = report(cfg, "dry")
    assert [(r["topic"], r["outcome"], r["backlog"]) for r in detail] == [(big, "planned", big_backlog)]
    assert s["dry_run"] is True and s["totals"]["failures"] == 0
    assert s["notes"] == [f"namespace {NS}: 1 topic(s) with a backlog below the threshold"]
    assert records(cfg) == before

    # 2. real run: that topic compacted, the other left alone
    rc, out = spark_submit("compact_topics", *common, "--run-id", "real", log=tmp_path / "real.log")
    assert rc == 0, out
    s, (row,) = report(cfg, "real")
    with Workspace(config) as ws:
        st = compaction_state(ws.ml.get_topic(big)[0])
        assert compaction_state(ws.ml.get_topic(small)[0]) is None
    assert (row["topic"], row["outcome"], row["new_ledger"], row["uuid"], row["previous_ledger"]) == \
        (big, "compacted", st.ledger_id, st.uuid, -1)
    assert row["horizon"] == f"{st.horizon.ledger_id}:{st.horizon.entry_id}"
    assert (row["keys_before"], row["keys_after"]) == (KEYS, KEYS) and 0 < row["bytes_after"] < row["bytes_before"]
    ns = s["namespaces"][NS]
    assert (ns["topics"], ns["compacted"], ns["nothing"], ns["conflicts"], ns["failed"]) == (1, 1, 0, 0, 0)
    c = s["totals"]["namespaces"][NS]["counters"]
    assert c == {k: row[k] for k in ("keys_before", "keys_after", "bytes_before", "bytes_after", "messages")}
    assert f"{big}: compacted up to {row['horizon']}" in out and f"keys {KEYS} → {KEYS}" in out

    # 3. a manual run naming both: the compacted one has nothing to compact (exit 0), the other is compacted
    rc, out = spark_submit("compact_topics", *common, "--topic", T0, "--topic", T1, "--retain-null-key",
                           "--run-id", "manual", log=tmp_path / "manual.log")
    assert rc == 0, out
    s, detail = report(cfg, "manual")
    assert {r["topic"]: r["outcome"] for r in detail} == {big: "nothing", small: "compacted"}
    assert s["retain_null_key"] is True and s["totals"]["outcomes"] == {"nothing": 1, "compacted": 1}
    assert s["namespaces"][NS]["nothing"] == 1 and s["namespaces"][NS]["compacted"] == 1
    with Workspace(config) as ws:
        assert compaction_state(ws.ml.get_topic(big)[0]) == st
        assert compaction_state(ws.ml.get_topic(small)[0]) is not None
