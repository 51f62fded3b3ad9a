"""Helpers of the CLI tests written for the bad-input fixes (test_cli_bad_input, test_cli_verify,
test_cli_offload_policy): one workspace per test through `tiered init` / `tiered generate`."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests.support.workspaces import END_ISO  # the newest sealed ledger closes here
from tieredcore.cli.main import main
from tieredcore.config import CONFIG_FILE_NAME, ENV_CONFIG, ENV_OVERRIDES, Config

NS = "public/default"
OTHER_NS = "acme/payments"
T0, T1, B0 = f"{NS}/topic-0000", f"{NS}/topic-0001", f"{OTHER_NS}/topic-0000"
LEDGERS, ENTRIES = 4, 20


class Cli:
    """`tiered --workspace ROOT ...` in-process with captured output."""

    def __init__(self, root: Path, capsys: pytest.CaptureFixture[str]) -> None:
        self.root = root
        self.capsys = capsys

    def __call__(self, *argv: str, workspace: bool = True) -> tuple[int, str, str]:
        self.capsys.readouterr()
        code = main([*(["--workspace", str(self.root)] if workspace else []), *argv])
        out, err = self.capsys.readouterr()
        return code, out, err

    def json(self, *argv: str, expect: int = 0, workspace: bool = True) -> dict:
        code, out, err = self("--json", *argv, workspace=workspace)
        assert code == expect, (code, out, err)
        assert "Traceback" not in err
        return json.loads(out)

    def ledgers(self, topic: str) -> list[dict]:
        (row,) = self.json("status", topic, "--ledgers")["topics"]
        return row["ledger_detail"]

    def config(self) -> Config:
        return Config.load(self.root / CONFIG_FILE_NAME, env={})


def generate(cli: Cli, *namespaces: str, topics: int = 1, messages: bool = True) -> None:
    """Pulsar messages (`generate`'s default) of 16..300 payload bytes per entry, or opaque entries of 16..300
    bytes when not `messages` (`--raw`: for tests that count ledger bytes)."""
    ns_args = [a for ns in namespaces for a in ("--namespace", ns)]
    code, _, err = cli("generate", *ns_args, "--topics", str(topics), "--ledgers", str(LEDGERS), "--entries",
                       str(ENTRIES), "--entry-size", "16-300", "--seed", "3", "--end-time", END_ISO,
                       *([] if messages else ["--raw"]))
    assert code == 0, err


def assert_usage_error(result: tuple[int, str, str], cmd: str, *fragments: str) -> None:
    """Exit 2, nothing on stdout, exactly one line on stderr naming the command and the bad input."""
    code, out, err = result
    assert code == 2, (code, out, err)
    assert out == ""
    assert err.startswith(f"tiered {cmd}: ") and err.endswith("\n") and err.count("\n") == 1, err
    for f in fragments:
        assert f in err, (f, err)


def snapshot(root: Path) -> dict[str, str]:
    """Every file under the workspace (content hash; the database by its records) and every metadata
    record: equal before and after means nothing was changed or created."""
    out: dict[str, str] = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_dir():
            out[rel] = "dir"
        elif p.name.startswith("metadata.db"):
            continue  # SQLite's own files change on every open (WAL); compared by records below
        elif p.is_file():
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    store = Config.load(root / CONFIG_FILE_NAME, env={}).open_metadata()
    try:
        todo = ["/"]
        while todo:
            path = todo.pop()
            got = store.get(path)
            if got is not None:
                out["meta:" + path] = f"{got.version}:{hashlib.sha256(bytes(got.value)).hexdigest()}"
            todo.extend(f"{path.rstrip('/')}/{c}" for c in store.children(path))
    finally:
        store.close()
    return out


def flip(path: Path, offset: int) -> None:
    b = bytearray(path.read_bytes())
    b[offset] ^= 0x5A
    path.write_bytes(bytes(b))


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI tests' configuration comes from their workspace only (import this fixture to use it)."""
    for var in (*ENV_OVERRIDES, ENV_CONFIG):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TIERED_NO_PROGRESS", "1")
