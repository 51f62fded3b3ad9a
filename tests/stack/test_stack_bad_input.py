"""scripts/stack.sh refuses what it cannot run, before starting anything, naming the setting."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.topology_ports import topology_ports

pytestmark = pytest.mark.stack

REPO = Path(__file__).resolve().parents[2]
STACK = REPO / "scripts" / "stack.sh"


def run(cmd: str, tmp_path: Path, **extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TIERED_", "STACK_", "AIRFLOW"))}
    env.update(TIERED_STACK_DIR=str(tmp_path / "stack"), TIERED_VENV=str(Path(sys.prefix)))
    env.update(extra)
    return subprocess.run([str(STACK), cmd], env=env, capture_output=True, text=True, timeout=60)


def test_missing_virtualenv_is_named(tmp_path):
    r = run("up", tmp_path, TIERED_VENV=str(tmp_path / "no-venv"))
    assert r.returncode != 0
    assert f"no virtualenv at {tmp_path / 'no-venv'}" in r.stderr
    assert not (tmp_path / "stack" / "pids").exists()


def test_a_taken_topology_port_is_named_and_nothing_starts(tmp_path):
    # the compose test's stack binds the same port (tests/support/topology_ports.py): one at a time
    with topology_ports(), socket.socket() as s:
        try:  # the topology's PostgreSQL port: hold it (or something else already does)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", 5432))
            s.listen()
        except OSError:
            pass
        r = run("up", tmp_path)
    assert r.returncode != 0
    assert "port 5432 (POSTGRES, docker/topology.env) is in use; STACK_PORTS=auto picks free ones" in r.stderr
    assert not list((tmp_path / "stack").glob("pids/*.pid"))
    assert not (tmp_path / "stack" / "stack.env").exists()  # `env` does not take it for a running stack


def test_unknown_command_and_status_without_a_stack(tmp_path):
    r = run("start", tmp_path)
    assert r.returncode == 2 and "usage: scripts/stack.sh up|down|status|env" in r.stderr
    r = run("status", tmp_path)
    assert r.returncode != 0 and "nothing recorded" in r.stdout
    assert run("down", tmp_path).returncode == 0  # nothing to stop is not an error
