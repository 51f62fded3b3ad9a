"""Every Spark job checks its reports location after planning (which only reads) and before Spark starts:
an unwritable --report-dir is exit 2 with one line naming it, no session, nothing changed. Before, a drain
deleted everything due and then crashed writing its report (exit 1: retried, no trace of what it did)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from spark_jobs import (
    compact_segments,
    compact_topics,
    deletion_drain,
    deletion_lag_cleanup,
    export_tables,
    offload_sweep,
    reconcile_orphans,
    recover,
    retention_sweep,
    rotate_keys,
    scrub,
)
from tests.support.workspaces import END_ISO, build_workspace, offload, sealed
from tieredcore.cold.blob import iter_objects
from tieredcore.cold.keyring import KeyRing
from tieredcore.config import Config
from tieredcore.workspace import Workspace

from .test_jobs import no_spark  # noqa: F401  (fixture)

JOBS = {"offload_sweep": offload_sweep, "deletion_lag_cleanup": deletion_lag_cleanup,
        "retention_sweep": retention_sweep, "scrub": scrub, "compact_segments": compact_segments,
        "deletion_drain": deletion_drain, "reconcile_orphans": reconcile_orphans, "rotate_keys": rotate_keys,
        "export_tables": export_tables, "compact_topics": compact_topics,
        # recovery into this store (it has records) with --merge --apply: it would add nothing, but plans
        "recover": SimpleNamespace(main=lambda argv: recover.main([*argv, "--merge", "--apply"]))}


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Offloaded ledgers and a key ring: work each job would do (or change) if it ran."""
    root = tmp_path_factory.mktemp("reports")
    ring = root / "ring"
    ring.mkdir(mode=0o700)
    KeyRing.add_key(ring, "k1", bits=2048)
    (ring / "active").write_text("k1\n")  # key rotation plans only with a ring
    cfg = build_workspace(root / "ws", ["t/a"], ledgers=3, config_overrides={"key_ring": str(ring)})
    with Workspace(Config.load(cfg, env={})) as ws:
        for t in ws.ml.list_topics("t/a"):
            offload(ws, t.full, sealed(ws, t.full))
    return cfg


def state(cfg: Path) -> tuple:
    with Workspace(Config.load(cfg, env={})) as ws:
        records = {t.full: ws.ml.get_topic(t)[0].SerializeToString() for t in ws.ml.list_topics("t/a")}
        return records, sorted((o.key, o.size) for o in iter_objects(ws.store)), len(ws.deletion_log.pending())


@pytest.mark.parametrize("job", JOBS)
def test_unwritable_report_location_exits_2_before_spark(no_spark, workspace: Path, tmp_path: Path, capsys, job):  # noqa: F811
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    before = state(workspace)
    rc = JOBS[job].main(["--config", str(workspace), "--as-of", END_ISO, "--report-dir", str(blocker / "reports")])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert f"reports location {blocker / 'reports'} is not writable" in err and "nothing was started" in err, err
    assert "Traceback" not in err
    assert state(workspace) == before
