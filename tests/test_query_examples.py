"""docs/query_examples.py and scripts/demo_queries.py run end to end on small workspaces (Spark local[2])."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYTHONPATH=str(ROOT), TIERED_NO_PROGRESS="1")
    return subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def _tiered(*argv: str, cwd: Path) -> None:
    p = _run("-m", "tieredcore.cli.main", *argv, cwd=cwd)
    assert p.returncode == 0, p.stderr


@pytest.mark.slow
def test_query_examples_prints_five_results(tmp_path):
    p = _run(str(ROOT / "docs" / "query_examples.py"), cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    out = p.stdout
    for n in range(1, 6):
        assert f"== result {n}:" in out
    m = re.search(r"planned parts (\d+), pruned parts (\d+) .*object-store GETs (\d+); rows (\d+) \(read_part: (\d+)\)",
                  out)
    assert m, out
    planned, pruned, gets, rows, read_rows = map(int, m.groups())
    assert planned == 1 and pruned >= 10 and gets > 0 and rows == read_rows > 0  # one ledger of 20 read
    assert "'hot'" in out.split("== result 1:")[1].split("== result 2:")[0]  # across tiers: hot rows too
    assert "property" in out.split("== result 5:")[1]


@pytest.mark.slow
def test_demo_queries_on_a_small_workspace(tmp_path):
    ws = tmp_path / "ws"
    _tiered("init", str(ws), cwd=tmp_path)
    _tiered("generate", "--namespace", "acme/audit", "--topics", "2", "--ledgers", "8", "--entries", "200",
            "--entry-size", "16-256", "--batch", "0", "--keys", "20", "--ledger-interval", "300", cwd=ws)
    _tiered("offload", "--namespace", "acme/audit", "--keep-bytes", "64K", cwd=ws)
    _tiered("export", "--namespace", "acme/audit", cwd=ws)
    p = _run(str(ROOT / "scripts" / "demo_queries.py"), str(ws), "--iceberg", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    out = p.stdout
    assert "-- 1. messages per key per hour, per tier" in out and "groups; messages per tier:" in out
    m = re.search(r"plan: (\d+) part\(s\) planned .*, (\d+) pruned", out)
    assert m and int(m.group(1)) == 1 and int(m.group(2)) == 7
    assert re.search(r"read_part over the planned parts: [\d,]+ rows, [1-9]\d* object-store GET", out)
    assert "-- 3. the latest message per key" in out and "20 keys" in out
    m = re.search(r"-- 4\. the Iceberg table acme_audit\.topic_0000 .*\n(?:.*\n)*?  ([\d,]+) rows; the Iceberg snapshot says ([\d,]+)", out)
    assert m and m.group(1) == m.group(2) and int(m.group(1).replace(",", "")) > 0, out


def test_demo_queries_refuses_a_directory_without_a_workspace(tmp_path):
    p = _run(str(ROOT / "scripts" / "demo_queries.py"), str(tmp_path), cwd=tmp_path)
    assert p.returncode == 2 and "no tiered.toml in" in p.stderr
