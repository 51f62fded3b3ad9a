"""Workspaces built the way an operator builds them: `tiered init` + `tiered generate`."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from tieredcore.cli import main as cli
from tieredcore.config import CONFIG_FILE_NAME, Config
from tieredcore.workspace import Workspace

END_ISO = "2026-01-01T00:00:00Z"
END_MS = int(dt.datetime(2026, 1, 1, tzinfo=dt.UTC).timestamp() * 1000)
INTERVAL_S = 600
INTERVAL_MS = INTERVAL_S * 1000


def build_workspace(
    root: Path,
    namespaces: list[str],
    *,
    topics: int = 1,
    ledgers: int = 4,
    entries: int = 10,
    entry_size: str = "100",
    config_overrides: dict | None = None,
) -> Config:
    """Sealed ledger i of N closes at END_MS - (N - 1 - i) * INTERVAL_MS; the newest ledger is open."""
    if config_overrides:
        root.mkdir(parents=True, exist_ok=True)
        (root / CONFIG_FILE_NAME).write_text(Config.for_workspace(root, **config_overrides).to_toml())
    assert cli.main(["init", str(root)]) == 0
    args = ["--workspace", str(root), "generate", "--topics", str(topics), "--ledgers", str(ledgers),
            "--entries", str(entries), "--entry-size", entry_size, "--end-time", END_ISO,
            "--ledger-interval", str(INTERVAL_S)]
    for ns in namespaces:
        args += ["--namespace", ns]
    assert cli.main(args) == 0
    return Config.load(root / CONFIG_FILE_NAME, env={})


@pytest.fixture
def make_ws(tmp_path, monkeypatch):
    """make_ws(namespaces, **kw) -> open Workspace (closed at teardown)."""
    monkeypatch.setenv("TIERED_NO_PROGRESS", "1")
    opened: list[Workspace] = []
    n = [0]

    def make(namespaces=("t/a",), **kw) -> Workspace:
        n[0] += 1
        cfg = build_workspace(tmp_path / f"ws{n[0]}", list(namespaces), **kw)
        ws = Workspace(cfg)
        opened.append(ws)
        return ws

    yield make
    for ws in opened:
        ws.close()
