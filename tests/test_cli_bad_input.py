"""Bad input to `tiered`: a one-line error on stderr, exit code 2, nothing changed or created; and OS
errors, broken pipes and unreadable configurations reported in one line instead of a traceback."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.support.clihelp import (
    NS,
    OTHER_NS,
    T0,
    Cli,
    _clean_env,  # noqa: F401  (autouse)
    assert_usage_error,
    generate,
    snapshot,
)
from tieredcore.config import CONFIG_FILE_NAME, ENV_CONFIG, ENV_OVERRIDES
from tieredcore.errors import MetadataStoreError
from tieredcore.meta.sqlite import SqliteMetadataStore
from tieredcore.model import INT64_MAX

TOO_BIG = str(INT64_MAX + 1)
HUGE = "9" * 5000


@pytest.fixture
def cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Cli:
    c = Cli(tmp_path / "ws", capsys)
    code, _, err = c("init", str(c.root), workspace=False)
    assert code == 0, err
    generate(c, NS, OTHER_NS, messages=False)  # the tests count ledger bytes
    # one policy-only namespace: known although it has no topics
    assert c("policies", "set", "acme/policy-only", "--offload-threshold-bytes", "1G")[0] == 0
    return c


def first_ledger(cli: Cli) -> int:
    return cli.ledgers(T0)[0]["ledger"]


# --- values beyond 64 bits, --up-to without an entry, read ranges ----------------------------------


@pytest.mark.parametrize(
    ("argv", "fragments"),
    [
        (["offload", T0, "--up-to", f"{TOO_BIG}:0"], ["--up-to", TOO_BIG, "64-bit"]),
        (["offload", T0, "--up-to", f"1:{HUGE}"], ["--up-to", "64-bit"]),
        (["offload", T0, "--up-to", "2"], ["--up-to '2': expected LEDGER:ENTRY"]),
        (["offload", T0, "--keep-bytes", "8589934592G"], ["--keep-bytes", "8589934592G", "64-bit"]),
        (["offload", T0, "--keep-bytes", TOO_BIG], ["--keep-bytes", TOO_BIG]),
        (["offload", T0, "--keep-bytes", "64Q"], ["--keep-bytes", "64Q"]),
        (["offload", T0, "--keep-bytes", "-1"], ["--keep-bytes", "-1"]),
        (["read", T0, "--from", f"{TOO_BIG}:0"], ["--from", "64-bit"]),
        (["read", T0, "--to", f"0:{TOO_BIG}"], ["--to", "64-bit"]),
        (["read", T0, "--limit", "-1"], ["--limit -1"]),
        (["generate", "--prefix", "x", "--end-time", TOO_BIG], ["--end-time", "64-bit"]),
        (["retention", "--as-of", TOO_BIG], ["--as-of", TOO_BIG, "64-bit"]),
        (["retention", "--as-of", HUGE], ["--as-of", "64-bit"]),
        (["retention", "--as-of", "10000-01-01T00:00:00Z"], ["--as-of", "ISO 8601"]),
        (["reconcile", "--as-of", TOO_BIG], ["--as-of", "64-bit"]),
        (["reconcile", "--grace", f"{INT64_MAX}s"], ["--grace", "64-bit"]),
        (["deletions", "drain", "--as-of", TOO_BIG], ["--as-of", "64-bit"]),
        (["deletions", "drain", "--retry-delay", f"{TOO_BIG}ms"], ["--retry-delay", "64-bit"]),
        (["topics", "delete", T0, "--yes", "--as-of", TOO_BIG], ["--as-of", "64-bit"]),
        (["policies", "set", NS, "--offload-threshold-bytes", "8589934592G"],
         ["--offload-threshold-bytes", "8589934592G", "64-bit"]),
        (["policies", "set", NS, "--max-block-size", HUGE], ["--max-block-size", "64-bit"]),
        (["policies", "set", NS, "--deletion-lag", "106751991167301d"], ["--deletion-lag", "106751991167301d"]),
        (["policies", "set", NS, "--offload-threshold-seconds", TOO_BIG], ["--offload-threshold-seconds", TOO_BIG]),
        (["policies", "set", NS, "--retention-size-mb", "lots"], ["--retention-size-mb", "lots"]),
    ],
)
def test_bad_values_exit_2_and_change_nothing(cli: Cli, argv: list[str], fragments: list[str]) -> None:
    before = snapshot(cli.root)
    assert_usage_error(cli(*argv), argv[0], *fragments)
    assert snapshot(cli.root) == before


def test_read_from_after_to(cli: Cli) -> None:
    lid = first_ledger(cli)
    assert_usage_error(cli("read", T0, "--from", f"{lid + 1}:0", "--to", f"{lid}:5"), "read",
                       f"--from {lid + 1}:0 is after --to {lid}:5")
    assert_usage_error(cli("read", T0, "--from", f"{lid}:6", "--to", f"{lid}:5"), "read", "is after")
    # the same position twice is one entry; --limit 0 reads nothing
    assert [e["position"] for e in cli.json("read", T0, "--from", f"{lid}:5", "--to", f"{lid}:5")["entries"]] == [
        f"{lid}:5"]
    assert cli.json("read", T0, "--limit", "0")["entries"] == []


def test_up_to_with_an_entry_part_still_works(cli: Cli) -> None:
    ids = [d["ledger"] for d in cli.ledgers(T0)]
    res = cli.json("offload", T0, "--up-to", f"{ids[2]}:0")
    assert [r["ledger_id"] for r in res["results"]] == ids[:2]


def test_keep_bytes_takes_sizes_like_the_readme(cli: Cli) -> None:
    res = cli.json("offload", "--namespace", NS, "--keep-bytes", "64M")  # README's example
    assert res["topics"] == 1 and res["ledgers"] == 0  # a few KiB per topic: all of it stays hot
    assert [d["tier"] for d in cli.ledgers(T0)] == ["hot"] * 5
    res = cli.json("offload", T0, "--keep-bytes", "5k")  # ledgers of ~3 KiB here
    detail = cli.ledgers(T0)
    hot = [d["size"] for d in detail if d["tier"] == "hot"]
    gone = [d["size"] for d in detail if d["tier"] == "both"]
    assert res["offloaded"] == len(gone) > 0 and len(hot) >= 2
    # the longest newest suffix of at most 5 KiB stays hot
    assert sum(hot) <= 5 * 1024 < sum(hot) + gone[-1]


# --- unknown namespaces ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [["status", "--namespace", "acme/nope"], ["offload", "--namespace", "acme/nope", "--keep-bytes", "0"],
     ["verify", "--namespace", "acme/nope"], ["retention", "--namespace", "acme/nope"],
     ["retention", "--namespace", NS, "--namespace", "acme/nope"]],
)
def test_unknown_namespace_is_bad_input(cli: Cli, argv: list[str]) -> None:
    before = snapshot(cli.root)
    assert_usage_error(cli(*argv), argv[0], "unknown namespace(s) acme/nope")
    assert snapshot(cli.root) == before


def test_namespace_with_policies_only_is_known(cli: Cli) -> None:
    for argv in (["status"], ["verify"], ["retention", "--dry-run"]):
        res = cli.json(*argv[:1], "--namespace", "acme/policy-only", *argv[1:])
        assert res["topics"] in ([], 0), res
    assert cli.json("offload", "--namespace", "acme/policy-only", "--keep-bytes", "0")["topics"] == 0


# --- policies set: store fields need a driver ------------------------------------------------------


@pytest.mark.parametrize("flag", ["--store-endpoint", "--store-bucket", "--store-root", "--store-prefix",
                                  "--store-region"])
def test_store_fields_without_driver_are_refused(cli: Cli, flag: str) -> None:
    before = snapshot(cli.root)
    assert_usage_error(cli("policies", "set", NS, flag, "x", "--deletion-lag", "1h"), "policies",
                       f"{flag} needs --store-driver")
    assert snapshot(cli.root) == before


def test_store_driver_and_default_store_together_are_refused(cli: Cli) -> None:
    assert_usage_error(cli("policies", "set", NS, "--store-driver", "filesystem", "--store-root", "/x",
                           "--default-store"), "policies", "not both")


# --- tracebacks instead of errors --------------------------------------------------------------


def test_non_utf8_configuration_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / CONFIG_FILE_NAME
    cfg.write_bytes(b'metadata_url = "sqlite:///\xff\xfe.db"\n')
    c = Cli(tmp_path, capsys)
    assert_usage_error(c("--config", str(cfg), "status", workspace=False), "status", str(cfg), "not UTF-8")
    assert sorted(p.name for p in tmp_path.iterdir()) == [CONFIG_FILE_NAME]


def test_init_on_a_regular_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "ws"
    f.write_text("not a workspace\n")
    c = Cli(tmp_path, capsys)
    assert_usage_error(c("init", str(f), workspace=False), "init", str(f), "not a directory")
    assert_usage_error(c("init", str(f / "below"), workspace=False), "init", str(f), "not a directory")
    assert f.read_text() == "not a workspace\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ws"]


def test_init_where_nothing_can_be_created(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    c = Cli(tmp_path, capsys)
    target = Path("/proc") / f"tiered-test-{uuid.uuid4().hex}" / "ws"
    assert_usage_error(c("init", str(target), workspace=False), "init", "cannot create workspace directory",
                       str(target))
    assert not target.parent.exists()


def test_init_rolls_back_when_a_later_directory_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The store directory cannot be made (under /proc, where root's access() check passes): the
    workspace directory made before it is removed again, and no configuration is written."""
    c = Cli(tmp_path, capsys)
    store = f"file:///proc/tiered-test-{uuid.uuid4().hex}/cold"
    assert_usage_error(c("init", str(tmp_path / "ws"), "--store-url", store, workspace=False), "init",
                       "cannot create object store directory")
    assert list(tmp_path.iterdir()) == []


def test_init_in_a_directory_that_is_not_writable(tmp_path: Path, capsys, monkeypatch) -> None:
    # root passes every permission check, so the check is exercised through os.access
    ro = tmp_path / "ro"
    ro.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if Path(p) == ro else real_access(p, mode, **kw))
    c = Cli(tmp_path, capsys)
    assert_usage_error(c("init", str(ro / "ws"), workspace=False), "init", f"directory {ro} is not writable")
    assert_usage_error(c("init", str(ro), workspace=False), "init", f"directory {ro} is not writable")
    assert list(ro.iterdir()) == []


def test_os_errors_are_one_line_not_a_traceback(cli: Cli) -> None:
    hot = cli.root / "hot"
    hot.rename(cli.root / "hot.moved")
    hot.write_text("")  # the hot tier path is now a regular file
    code, out, err = cli("read", T0)
    assert code == 1 and out == ""
    assert err.startswith("tiered read: FileExistsError: ") and err.count("\n") == 1 and str(hot) in err


def _tiered_exe() -> Path:
    exe = Path(sys.executable).parent / "tiered"
    assert exe.is_file()
    return exe


def test_output_into_a_closed_pipe_exits_quietly(cli: Cli) -> None:
    code, _, err = cli("generate", "--prefix", "big", "--topics", "1", "--ledgers", "1", "--entries", "1000",
                       "--entry-size", "100")
    assert code == 0, err
    env = {k: v for k, v in os.environ.items() if k not in ENV_OVERRIDES and k != ENV_CONFIG}
    env["TIERED_NO_PROGRESS"] = "1"
    # 1000 lines of 128 hex digits (~140 KB, more than a pipe holds): once `head` has its line and
    # exits, a later write is bound to hit the closed pipe
    for argv in (["read", f"{NS}/big-0000", "--show", "hex"], ["--json", "read", f"{NS}/big-0000", "--show", "hex"]):
        cmd = f"'{_tiered_exe()}' --workspace '{cli.root}' {' '.join(argv)} 2>err.txt | head -1"
        p = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=cli.root.parent, env=env,
                           capture_output=True, text=True, timeout=120, check=False)
        err = (cli.root.parent / "err.txt").read_text()
        assert p.stdout.count("\n") == 1, p.stdout
        assert err == "", err  # no traceback, no "Exception ignored ... BrokenPipeError"
        assert p.returncode == 1  # (pipefail) ours: output cut short, quietly


# --- the metadata store --------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [["status"], ["verify"], ["read", T0], ["policies", "list"],
                                  ["deletions", "stats"], ["offload", "--keep-bytes", "0"]])
def test_commands_refuse_a_missing_metadata_store(cli: Cli, argv: list[str]) -> None:
    db = cli.root / "metadata.db"
    moved = cli.root.parent / "elsewhere.db"
    db.rename(moved)
    for suffix in ("-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    assert_usage_error(cli(*argv), argv[0], f"no metadata store at {db}: run `tiered init`")
    assert not db.exists()
    moved.rename(db)
    assert cli(*argv)[0] == 0


def test_generate_may_start_the_metadata_store_of_an_env_only_config(tmp_path: Path, capsys, monkeypatch) -> None:
    """The compose stack (docs/deploy.md) has no tiered.toml and no `tiered init`: its first command is
    `tiered generate`, which creates the store it writes topics into; a reading command refuses."""
    db = tmp_path / "meta" / "m.db"
    (tmp_path / "meta").mkdir()
    monkeypatch.setenv("TIERED_METADATA_URL", f"sqlite:///{db}")
    monkeypatch.setenv("TIERED_HOT_URL", f"file://{tmp_path / 'hot'}")
    monkeypatch.setenv("TIERED_STORE_URL", f"file://{tmp_path / 'cold'}")
    monkeypatch.chdir(tmp_path)
    c = Cli(tmp_path, capsys)
    assert_usage_error(c("status", workspace=False), "status", f"no metadata store at {db}")
    assert not db.exists()
    code, _, err = c("generate", "--topics", "1", "--ledgers", "1", "--entries", "2", workspace=False)
    assert code == 0, err
    assert len(c.json("status", workspace=False)["topics"]) == 1


def test_init_creates_the_metadata_store_of_an_existing_config(cli: Cli) -> None:
    (cli.root / "metadata.db").unlink()
    # the store still names the lost metadata store as its owner: a new one is refused, nothing created
    code, _, err = cli("init", str(cli.root), workspace=False)
    assert code == 2 and "already used by cluster 'standalone' of another workspace" in err
    assert not (cli.root / "metadata.db").exists()
    # the operator decides the store's objects are not needed (here: none) and removes the marker
    (cli.root / "cold" / "tiered-owner.standalone").unlink()
    code, _, err = cli("init", str(cli.root), workspace=False)
    assert code == 0, err
    assert (cli.root / "metadata.db").is_file()
    assert cli.json("status")["topics"] == []


def test_metadata_open_error_names_the_path_and_why(tmp_path: Path) -> None:
    missing_dir = tmp_path / "nope" / "m.db"
    with pytest.raises(MetadataStoreError, match=f"directory {tmp_path / 'nope'} does not exist"):
        SqliteMetadataStore(missing_dir)
    (tmp_path / "adir.db").mkdir()
    with pytest.raises(MetadataStoreError, match="is a directory"):
        SqliteMetadataStore(tmp_path / "adir.db")
    (tmp_path / "afile").write_text("")
    with pytest.raises(MetadataStoreError, match=f"{tmp_path / 'afile'} is not a directory"):
        SqliteMetadataStore(tmp_path / "afile" / "m.db")


@pytest.mark.parametrize(
    ("denied", "why"),
    [("dir", "directory {d} is not writable (WAL mode needs m.db-wal and m.db-shm beside the file)"),
     ("file", "file {f} is not writable")],
)
def test_metadata_open_error_in_a_read_only_workspace(tmp_path: Path, monkeypatch, denied: str, why: str) -> None:
    """What a non-root user sees in a read-only workspace (root is never refused by the kernel, so
    SQLite's refusal and the permission bits are stood in for)."""
    d = tmp_path / "ro"
    d.mkdir()
    f = d / "m.db"
    SqliteMetadataStore(f).close()
    target = d if denied == "dir" else f
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: (
        False if Path(p) == target and mode & os.W_OK else real_access(p, mode, **kw)))

    def refuse(*a, **kw):
        raise sqlite3.OperationalError("unable to open database file")

    monkeypatch.setattr(sqlite3, "connect", refuse)
    with pytest.raises(MetadataStoreError) as e:
        SqliteMetadataStore(f)
    assert str(e.value) == (f"cannot open metadata store {f}: unable to open database file ("
                            + why.format(d=d, f=f) + ")")


# --- inputs that gave tracebacks, were silently accepted, or dumped the whole usage ----------------


@pytest.mark.parametrize(("value", "fragment"), [("nan", "must be a positive number of seconds"),
                                                 ("inf", "must be a positive number of seconds"),
                                                 ("-60", "must be a positive number of seconds"),
                                                 ("0", "must be a positive number of seconds"),
                                                 ("1e300", "would start before 1970")])
def test_generate_refuses_a_ledger_interval_that_is_not_a_forward_spacing(cli: Cli, value: str, fragment: str):
    """nan / inf were tracebacks, 1e300 an internal message, -60 made close times run backwards."""
    before = snapshot(cli.root)
    assert_usage_error(cli("generate", "--namespace", "acme/new", "--ledger-interval", value), "generate",
                       f"--ledger-interval {float(value):g}"[:22], fragment)
    assert snapshot(cli.root) == before


def test_init_refuses_an_empty_cluster_name(tmp_path: Path, capsys):
    """It used to become `standalone` silently."""
    c = Cli(tmp_path / "ws", capsys)
    assert_usage_error(c("init", str(c.root), "--cluster", "", workspace=False), "init", "--cluster ''")
    assert not c.root.exists()


@pytest.mark.parametrize("cmd", [["status"], ["topics", "delete", T0, "--yes"]])
def test_workspace_and_a_config_of_another_workspace_are_refused(cli: Cli, tmp_path: Path, capsys, cmd):
    """`--workspace A --config B/tiered.toml` used B and ignored A (for `topics delete` too: the wrong
    workspace's topic would go)."""
    other = Cli(tmp_path / "other", capsys)
    assert other("init", str(other.root), workspace=False)[0] == 0
    before, before_other = snapshot(cli.root), snapshot(other.root)
    assert_usage_error(cli("--config", str(other.root / CONFIG_FILE_NAME), *cmd), cmd[0],
                       f"--workspace {cli.root}", "name different workspaces")
    assert (snapshot(cli.root), snapshot(other.root)) == (before, before_other)
    # the same workspace named both ways is fine
    assert cli("--config", str(cli.root / CONFIG_FILE_NAME), "status")[0] == 0


@pytest.mark.parametrize(("argv", "cmd", "fragments"), [
    (["policies", "set", NS, "--deletion-lag", "-5h"], "policies set",
     ["--deletion-lag: expected one argument", "written --deletion-lag=VALUE", "`tiered policies set --help`"]),
    (["status", "--bogus"], "", ["unrecognized arguments: --bogus", "`tiered --help`"]),
    (["read", T0, "--show", "sideways"], "read", ["--show", "invalid choice", "`tiered read --help`"]),
    (["nosuchcommand"], "", ["invalid choice: 'nosuchcommand'"]),
])
def test_usage_errors_are_one_line_with_a_hint(cli: Cli, argv, cmd, fragments):
    """argparse printed its whole usage (dozens of lines) above the one that mattered."""
    with pytest.raises(SystemExit) as e:
        cli(*argv)
    assert e.value.code == 2
    out, err = cli.capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "usage:" not in err, err
    assert err.startswith(f"tiered {cmd}: " if cmd else "tiered: "), err
    for f in fragments:
        assert f in err, (f, err)


def test_a_negative_lag_written_with_equals_is_refused_in_one_line(cli: Cli):
    before = snapshot(cli.root)
    code, out, err = cli("policies", "set", NS, "--deletion-lag=-5h")
    assert code == 2 and err.count("\n") == 1 and "-5h" in err, err
    assert snapshot(cli.root) == before
