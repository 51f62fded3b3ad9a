"""The `tiered` command line, mostly in-process through ``tieredcore.cli.main``.

One workspace per test (embedded defaults: SQLite metadata, hot tier and filesystem object store
under tmp_path); topics come from `tiered generate`, so `verify` can check every payload.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.clihelp import snapshot
from tieredcore.cli.main import main
from tieredcore.cli.workload import PayloadGenerator
from tieredcore.config import CONFIG_FILE_NAME, ENV_CONFIG, ENV_OVERRIDES, Config
from tieredcore.formats.constants import BLOCK_HEADER_LENGTH, ENTRY_HEADER_SIZE
from tieredcore.names import TopicName

NS_A = "public/default"
NS_B = "acme/payments"
LEDGERS = 4  # sealed ledgers per topic (plus the open, empty newest one)
ENTRIES = 20  # entries per ledger
MIN_SIZE, MAX_SIZE = 16, 300
SEED = 7

TA0 = f"{NS_A}/topic-0000"
TA1 = f"{NS_A}/topic-0001"
TB0 = f"{NS_B}/topic-0000"
TB1 = f"{NS_B}/topic-0001"
ALL_TOPICS = [TB0, TB1, TA0, TA1]  # status / verify order: namespaces sorted, then topics

PATH_LIKE = ["a/../b/c", "public/default/../../x", "public/default/..", "../default/t", "public/./t"]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (*ENV_OVERRIDES, ENV_CONFIG):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TIERED_NO_PROGRESS", "1")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()  # drop anything printed before
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


class Cli:
    """`tiered --workspace WS ...` with captured output."""

    def __init__(self, root: Path, capsys: pytest.CaptureFixture[str]) -> None:
        self.root = root
        self.capsys = capsys

    def __call__(self, *argv: str) -> tuple[int, str, str]:
        return run(self.capsys, "--workspace", str(self.root), *argv)

    def json(self, *argv: str, expect: int = 0) -> dict:
        code, out, err = self("--json", *argv)
        assert code == expect, (code, out, err)
        assert "Traceback" not in err
        return json.loads(out)  # the whole of stdout is one JSON document

    def ok(self, *argv: str) -> str:
        code, out, err = self(*argv)
        assert code == 0, (code, out, err)
        return out

    def ledgers(self, topic: str) -> list[dict]:
        (row,) = self.json("status", topic, "--ledgers")["topics"]
        return row["ledger_detail"]

    def tiers(self, topic: str) -> list[str]:
        return [d["tier"] for d in self.ledgers(topic)]


@pytest.fixture
def ws_root(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    root = tmp_path / "ws"
    code, out, err = run(capsys, "init", str(root))
    assert code == 0, err
    return root


@pytest.fixture
def cli(ws_root: Path, capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli(ws_root, capsys)


@pytest.fixture
def gen(cli: Cli) -> Cli:
    """A workspace with 2 namespaces x 2 topics x 4 sealed ledgers x 20 opaque entries of 16..300 bytes
    (`--raw`: these tests check entry sizes and bytes; test_cli_messages.py covers generated messages)."""
    cli.ok("generate", "--namespace", NS_A, "--namespace", NS_B, "--topics", "2", "--ledgers", str(LEDGERS),
           "--entries", str(ENTRIES), "--entry-size", f"{MIN_SIZE}-{MAX_SIZE}", "--seed", str(SEED),
           "--end-time", "2026-01-01T00:00:00Z", "--raw")
    return cli


def generator(topic: str, seed: int = SEED, lo: int = MIN_SIZE, hi: int = MAX_SIZE) -> PayloadGenerator:
    return PayloadGenerator(seed, TopicName.parse(topic).managed_ledger_name, lo, hi)


# --- init ------------------------------------------------------------------------------------


def test_init_creates_config_and_directories(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "new"
    code, out, err = run(capsys, "--json", "init", str(root))
    assert code == 0, err
    res = json.loads(out)
    assert res["created"] is True
    assert res["workspace"] == str(root.resolve())
    assert Path(res["config"]) == root / CONFIG_FILE_NAME
    for d in ("hot", "cold", "reports"):
        assert (root / d).is_dir()
    assert (root / "metadata.db").is_file()
    assert Config.load(root / CONFIG_FILE_NAME, env={}) == Config.for_workspace(root)


def test_init_is_idempotent_and_force_rewrites(gen: Cli, capsys: pytest.CaptureFixture[str]) -> None:
    cfg_path = gen.root / CONFIG_FILE_NAME
    edited = cfg_path.read_text().replace('cluster = "standalone"', 'cluster = "edited"')
    assert 'cluster = "edited"' in edited
    cfg_path.write_text(edited)

    code, out, err = run(capsys, "--json", "init", str(gen.root))
    assert code == 0, err
    assert json.loads(out)["created"] is False
    assert cfg_path.read_text() == edited  # the configuration is kept as is
    assert len(gen.json("status")["topics"]) == 4  # and so is the data

    code, out, err = run(capsys, "--json", "init", str(gen.root), "--force")
    assert code == 0, err
    assert json.loads(out)["created"] is True
    assert Config.load(cfg_path, env={}) == Config.for_workspace(gen.root)
    assert len(gen.json("status")["topics"]) == 4  # --force rewrites the config only


def test_init_with_store_url(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, store = tmp_path / "ws", tmp_path / "elsewhere" / "objects"
    code, _, err = run(capsys, "init", str(root), "--store-url", f"file://{store}")
    assert code == 0, err
    assert store.is_dir()
    assert not (root / "cold").exists()
    assert Config.load(root / CONFIG_FILE_NAME, env={}).store_url == f"file://{store}"


def test_init_in_a_directory_with_url_special_characters(tmp_path: Path, capsys) -> None:
    root = tmp_path / "my ws %41 #1 ?x"
    code, _, err = run(capsys, "init", str(root))
    assert code == 0, err
    cli = Cli(root, capsys)
    cli.ok("generate", "--topics", "1", "--ledgers", "2", "--entries", "3")
    assert sorted(p.name for p in tmp_path.iterdir()) == [root.name]  # nothing written beside it
    assert any((root / "hot").iterdir())
    assert cli.json("verify")["verified"] == 1


def test_missing_configuration_is_a_usage_error(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "status")
    assert code == 2
    assert out == ""
    assert "TIERED_STORE_URL" in err and "Traceback" not in err
    code, _, err = run(capsys, "--workspace", str(tmp_path / "nope"), "status")
    assert code == 2
    assert "tiered init" in err


def test_config_found_through_env_and_flag(ws_root: Path, capsys, monkeypatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, "--config", str(ws_root / CONFIG_FILE_NAME), "status")
    assert code == 0, err
    monkeypatch.setenv(ENV_CONFIG, str(ws_root / CONFIG_FILE_NAME))
    code, out, err = run(capsys, "--json", "status")
    assert code == 0, err
    assert json.loads(out) == {"topics": []}


# --- generate --------------------------------------------------------------------------------


def test_generate_namespaces_topics_ledgers(gen: Cli) -> None:
    rows = gen.json("status")["topics"]
    assert [r["topic"] for r in rows] == [TopicName.parse(t).full for t in ALL_TOPICS]
    for r in rows:
        assert r["ledgers"] == LEDGERS + 1  # the newest stays open and empty
        assert r["open"] == 1
        assert r["entries"] == LEDGERS * ENTRIES
        assert r["hot_only"] == LEDGERS + 1 and r["both"] == 0 and r["offloaded_only"] == 0
    detail = gen.ledgers(TA0)
    assert [d["state"] for d in detail] == ["sealed"] * LEDGERS + ["open"]
    assert [d["entries"] for d in detail] == [ENTRIES] * LEDGERS + [0]
    g = generator(TA0)
    sizes = [len(p) for p in g.payloads(0, LEDGERS * ENTRIES)]
    assert [d["size"] for d in detail[:LEDGERS]] == [
        sum(sizes[i * ENTRIES : (i + 1) * ENTRIES]) for i in range(LEDGERS)
    ]
    assert all(MIN_SIZE <= s <= MAX_SIZE for s in sizes) and len(set(sizes)) > 1
    ids = [d["ledger"] for d in detail]
    assert ids == sorted(ids)


@pytest.mark.parametrize(("spec", "lo", "hi"), [("64", 64, 64), ("1-40", 1, 40), ("1K-2K", 1024, 2048)])
def test_generate_entry_sizes(cli: Cli, spec: str, lo: int, hi: int) -> None:
    res = cli.json("generate", "--topics", "1", "--ledgers", "2", "--entries", "30", "--entry-size", spec, "--raw")
    assert res["topics"] == 1 and res["entries"] == 60 and res["format"] == "raw"
    got = cli.json("read", f"{NS_A}/topic-0000")["entries"]
    sizes = [e["size"] for e in got]
    assert len(sizes) == 60
    assert all(lo <= s <= hi for s in sizes)
    assert sum(sizes) == res["bytes"]
    if lo == hi:
        assert set(sizes) == {lo}
    assert cli.json("verify")["verified"] == 1


def test_generate_refuses_existing_topics(gen: Cli) -> None:
    before = snapshot(gen.root)
    code, out, err = gen("generate", "--namespace", NS_B, "--topics", "3")
    assert code == 2
    assert out == ""
    assert "already exist" in err
    assert f"persistent://{TB0}" in err and "--prefix" in err
    assert snapshot(gen.root) == before
    res = gen.json("generate", "--namespace", NS_B, "--topics", "1", "--prefix", "other",
                   "--ledgers", "1", "--entries", "2")
    assert res["topics"] == 1
    assert len(gen.json("status", "--namespace", NS_B)["topics"]) == 3


@pytest.mark.parametrize(
    "args",
    [
        ["--entry-size", "abc"],
        ["--entry-size", "100-10"],
        ["--entry-size", "5M"],
        ["--topics", "0"],
        ["--entries", "-1"],
        ["--end-time", "yesterday"],
        ["--namespace", "public"],
        ["--namespace", "public/../x"],
        ["--prefix", "a/b"],
    ],
)
def test_generate_bad_arguments(cli: Cli, args: list[str]) -> None:
    before = snapshot(cli.root)
    code, out, err = cli("generate", *args)
    assert code == 2, err
    assert out == "" and "Traceback" not in err and err.startswith("tiered generate: ")
    assert snapshot(cli.root) == before


# --- offload ---------------------------------------------------------------------------------


def test_offload_keep_bytes_per_topic(gen: Cli) -> None:
    sizes = [d["size"] for d in gen.ledgers(TA0)]
    # the newest ledgers summing to exactly S are kept (at most S bytes hot); everything older goes
    res = gen.json("offload", TA0, "--keep-bytes", str(sizes[-2] + sizes[-3]))
    assert res["offloaded"] == 2 and res["failed"] == 0
    assert gen.tiers(TA0) == ["both", "both", "hot", "hot", "hot"]

    sizes = [d["size"] for d in gen.ledgers(TA1)]
    res = gen.json("offload", TA1, "--keep-bytes", str(sizes[-2] + sizes[-3] - 1))
    assert res["offloaded"] == 3
    assert [r["outcome"] for r in res["results"]] == ["offloaded"] * 3
    # bytes written: the data objects (one block each here: header + [len][entryId] frames)
    assert res["bytes"] == sum(sizes[:3]) + 3 * (BLOCK_HEADER_LENGTH + ENTRIES * ENTRY_HEADER_SIZE)
    assert gen.tiers(TA1) == ["both", "both", "both", "hot", "hot"]
    # the others are untouched
    assert gen.tiers(TB0) == ["hot"] * 5


def test_offload_keep_bytes_namespace(gen: Cli) -> None:
    # keep 0: the open ledger is empty, so every sealed ledger is offloaded (Pulsar's `offload -s 0`)
    res = gen.json("offload", "--namespace", NS_B, "--keep-bytes", "0")
    assert res["topics"] == 2 and res["offloaded"] == 2 * LEDGERS and res["failed"] == 0
    for t in (TB0, TB1):
        detail = gen.ledgers(t)
        assert [d["tier"] for d in detail] == ["both"] * LEDGERS + ["hot"]
        for d in detail[:LEDGERS]:
            assert d["uuid"] and d["offloaded_at"]
    for t in (TA0, TA1):
        assert gen.tiers(t) == ["hot"] * 5
    (row,) = gen.json("status", TB0)["topics"]
    assert row["both"] == LEDGERS and row["hot_only"] == 1
    # the hot copies stay until the deletion lag: every sealed byte is in both tiers
    assert row["offloaded_bytes"] > 0 and row["hot_bytes"] == row["offloaded_bytes"]
    # nothing left to do: a second run offloads nothing
    res = gen.json("offload", "--namespace", NS_B, "--keep-bytes", "0")
    assert res["offloaded"] == 0 and res["failed"] == 0


def test_offload_up_to(gen: Cli) -> None:
    ids = [d["ledger"] for d in gen.ledgers(TA0)]
    res = gen.json("offload", TA0, "--up-to", f"{ids[2]}:5")
    assert [r["ledger_id"] for r in res["results"]] == ids[:2]
    assert gen.tiers(TA0) == ["both", "both", "hot", "hot", "hot"]
    # up to the open ledger: every sealed ledger, never the open one; done ones are not redone
    res = gen.json("offload", TA0, "--up-to", f"{ids[-1] + 100}:0")
    assert [r["ledger_id"] for r in res["results"]] == ids[2:4]
    assert gen.tiers(TA0) == ["both"] * LEDGERS + ["hot"]
    assert gen.json("offload", TA0, "--up-to", f"{ids[-1]}:0")["ledgers"] == 0
    assert gen.tiers(TA1) == ["hot"] * 5
    # the trailing --json works as well as the global one
    code, out, err = gen("status", TA0, "--ledgers", "--json")
    assert code == 0, err
    assert [d["tier"] for d in json.loads(out)["topics"][0]["ledger_detail"]] == ["both"] * LEDGERS + ["hot"]
    assert gen.json("verify", TA0)["failed"] == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--up-to", "1:0"], "--up-to needs explicit topic"),
        (["--namespace", NS_A, "--up-to", "1:0"], "--up-to needs explicit topic"),
        ([TA0], "exactly one of"),
        ([TA0, "--up-to", "1:0", "--keep-bytes", "10"], "exactly one of"),
        ([TA0, "--up-to", "x:y"], "LEDGER:ENTRY"),
        ([TA0, "--keep-bytes", "-1"], "keep-bytes"),
        (["public/default/nope", "--keep-bytes", "0"], "persistent://public/default/nope"),
        ([TA0, "acme/none/t", "--keep-bytes", "0"], "persistent://acme/none/t"),
    ],
)
def test_offload_usage_errors(gen: Cli, args: list[str], message: str) -> None:
    before = snapshot(gen.root)
    code, out, err = gen("offload", *args)
    assert code == 2, err
    assert out == "" and "Traceback" not in err
    assert message in err
    assert snapshot(gen.root) == before


@pytest.mark.parametrize("name", PATH_LIKE)
@pytest.mark.parametrize(
    "command",
    [["offload", "{}", "--keep-bytes", "0"], ["offload", "{}", "--up-to", "9:0"], ["status", "{}"],
     ["read", "{}"], ["verify", "{}"]],
)
def test_path_like_topic_names_are_refused(gen: Cli, name: str, command: list[str]) -> None:
    before = snapshot(gen.root)
    code, out, err = gen(*[name if a == "{}" else a for a in command])
    assert code == 2, err
    assert out == "" and "Traceback" not in err
    assert f"tiered {command[0]}: " in err and name in err
    assert snapshot(gen.root) == before


def test_unknown_topic_in_read_status_verify(gen: Cli) -> None:
    for cmd in ("read", "status", "verify"):
        code, out, err = gen(cmd, "public/default/missing")
        assert code == 2, (cmd, err)
        assert out == ""
        assert "public/default/missing" in err and "Traceback" not in err


# --- read ------------------------------------------------------------------------------------


def test_read_range_limit_and_json(gen: Cli) -> None:
    ids = [d["ledger"] for d in gen.ledgers(TA0)]
    gen.ok("offload", TA0, "--up-to", f"{ids[2]}:0")  # ledgers 0 and 1 are read from the object store
    g = generator(TA0)

    def seq(position: str) -> int:
        lid, eid = map(int, position.split(":"))
        return ids.index(lid) * ENTRIES + eid

    res = gen.json("read", TA0, "--from", f"{ids[1]}:5", "--to", f"{ids[2]}:3", "--show", "hex")
    positions = [e["position"] for e in res["entries"]]
    assert positions == [f"{ids[1]}:{e}" for e in range(5, ENTRIES)] + [f"{ids[2]}:{e}" for e in range(4)]
    for e in res["entries"]:
        want = g.payload(seq(e["position"]))
        assert e["size"] == len(want)
        assert e["data"] == want[:64].hex()
    assert res["tier_reads"] == {"hot": 1, "offloaded": 1}

    res = gen.json("read", TA0, "--limit", "7")
    assert [e["position"] for e in res["entries"]] == [f"{ids[0]}:{e}" for e in range(7)]
    assert all("data" not in e for e in res["entries"])

    res = gen.json("read", TA0, "--from", f"{ids[3]}:18")
    assert [e["position"] for e in res["entries"]] == [f"{ids[3]}:18", f"{ids[3]}:19"]
    assert len(gen.json("read", TA0)["entries"]) == LEDGERS * ENTRIES

    # human output: one "position<TAB>size[<TAB>data]" line per entry
    out = gen.ok("read", TA0, "--from", f"{ids[0]}:2", "--limit", "3", "--show", "hex",
                 "--read-priority", "bookkeeper-first")
    lines = out.splitlines()
    assert len(lines) == 3
    for n, line in enumerate(lines):
        want = g.payload(2 + n)
        assert line.split("\t") == [f"{ids[0]}:{2 + n}", str(len(want)), want[:64].hex()]


# --- verify ----------------------------------------------------------------------------------


def test_verify_after_offload(gen: Cli) -> None:
    gen.ok("offload", "--namespace", NS_A, "--keep-bytes", "0")
    res = gen.json("verify")
    assert res["verified"] == 4 and res["failed"] == 0
    assert [r["topic"] for r in res["topics"]] == [TopicName.parse(t).full for t in ALL_TOPICS]
    assert all(r["ok"] and r["entries"] == LEDGERS * ENTRIES and r["reason"] == "" for r in res["topics"])
    assert res["tier_reads"]["offloaded"] == 2 * LEDGERS
    for prio in ("tiered-storage-first", "bookkeeper-first"):
        assert gen.json("verify", "--read-priority", prio, "--namespace", NS_A)["verified"] == 2
    out = gen.ok("verify", TA0)
    assert out.startswith(f"OK       persistent://{TA0} {LEDGERS * ENTRIES}")


def _data_object(root: Path, ledger: dict) -> Path:
    cold = root / "cold"
    found = [p for p in cold.iterdir() if p.is_file() and p.name.endswith(f"-ledger-{ledger['ledger']}")]
    assert len(found) == 1, found  # the data object (not its -index, not .tiered/ bookkeeping)
    assert found[0].name == f"{ledger['uuid']}-ledger-{ledger['ledger']}"
    return found[0]


def _flip(path: Path, offset: int) -> None:
    b = bytearray(path.read_bytes())
    b[offset] ^= 0x5A
    path.write_bytes(bytes(b))


def test_verify_detects_a_corrupted_offloaded_entry(gen: Cli) -> None:
    gen.ok("offload", TA0, TA1, "--keep-bytes", "0")
    first = gen.ledgers(TA0)[0]
    assert first["tier"] == "both"
    obj = _data_object(gen.root, first)
    data = obj.read_bytes()
    length, entry_id = struct.unpack_from(">iq", data, BLOCK_HEADER_LENGTH)
    assert entry_id == 0 and length == len(generator(TA0).payload(0))
    # last byte of entry 0's payload (after the 16-byte workload header)
    _flip(obj, BLOCK_HEADER_LENGTH + ENTRY_HEADER_SIZE + length - 1)

    # the offloaded copy fails its checksum; the hot copy still exists and is intact: every entry reads
    # back correctly from it, and verify says which copy is damaged (exit 1), never a silent pass
    res = gen.json("verify", expect=1)
    assert res["verified"] == 4 and res["failed"] == 0 and res["fallbacks"] == 1
    (note,) = res["damaged_copies"]
    assert f"{TA0.replace('/', '/', 1)}".split("/")[-1] in note and f"ledger {first['ledger']}" in note
    assert "CorruptObjectError" in note and "reading the hot copy" in note

    code, out, err = gen("verify", TA0)
    assert code == 1 and "DAMAGED COPY" in out and "Traceback" not in err
    assert gen.json("verify", TA0, "--read-priority", "bookkeeper-first")["verified"] == 1
    # without the hot copy, the damaged entry fails the read: never another entry, never a pass
    (gen.root / "hot" / f"{first['ledger']}.meta").unlink()
    res = gen.json("verify", TA0, expect=1)
    assert res["failed"] == 1 and f"ledger {first['ledger']}" in res["topics"][0]["reason"]


def test_corrupted_hot_ledger_fails_cleanly(gen: Cli) -> None:
    first = gen.ledgers(TB0)[0]
    assert first["tier"] == "hot"
    _flip(gen.root / "hot" / f"{first['ledger']}.log", 12 + 3)  # inside entry 0's payload
    expected = f"ledger {first['ledger']} entry 0"

    res = gen.json("verify", expect=1)
    rows = {r["topic"]: r for r in res["topics"]}
    bad = rows[f"persistent://{TB0}"]
    assert bad["ok"] is False
    assert "CorruptEntryError" in bad["reason"] and expected in bad["reason"]
    assert res["failed"] == 1 and res["verified"] == 3

    code, out, err = gen("verify", TB0)
    assert code == 1 and "Traceback" not in err
    assert "CorruptEntryError" in out and expected in out

    code, out, err = gen("read", TB0)
    assert code == 1 and out == ""
    assert err.startswith("tiered read: CorruptEntryError") and expected in err and "Traceback" not in err

    # the offloader refuses to copy corrupt data to the object store
    res = gen.json("offload", TB0, "--keep-bytes", "0", expect=1)
    assert res["failed"] == 1
    (failed,) = [r for r in res["results"] if r["ledger_id"] == first["ledger"]]
    assert failed["outcome"] != "offloaded" and "CRC32C" in failed["error"]
    assert gen.tiers(TB0)[0] == "hot"
    assert gen.tiers(TB0)[1:3] == ["both", "both"]  # one failure does not stop the others


# --- output ----------------------------------------------------------------------------------


def test_json_stdout_is_only_json_and_progress_goes_to_stderr(cli: Cli, monkeypatch) -> None:
    monkeypatch.delenv("TIERED_NO_PROGRESS")
    code, out, err = cli("--json", "generate", "--topics", "2", "--ledgers", "2", "--entries", "10")
    assert code == 0, err
    assert json.loads(out)["entries"] == 40
    assert "generate: 2/2 topics, 40 entries" in err
    code, out, err = cli("--json", "offload", "--keep-bytes", "0")
    assert code == 0, err
    res = json.loads(out)
    assert res["offloaded"] == 4
    assert f"offload: {TopicName.parse(TA0).managed_ledger_name} ledger " in err and ": offloaded " in err
    for argv in (["status", "--ledgers"], ["verify"], ["read", TA0, "--limit", "3"]):
        code, out, err = cli("--json", *argv)
        assert code == 0, err
        json.loads(out)


def test_human_output(gen: Cli) -> None:
    out = gen.ok("status", "--ledgers")
    assert out.splitlines()[0].split() == ["topic", "ledgers", "hot", "both", "cold", "hot", "bytes",
                                           "cold", "bytes", "objects"]
    assert out.count("    ledger ") == 4 * (LEDGERS + 1)
    out = gen.ok("offload", TA0, "--keep-bytes", "0")
    assert out.startswith(f"offloaded {LEDGERS} ledger(s) of 1 topic(s)")
    out = gen.ok("verify")
    assert out.splitlines()[-1].startswith("verified 4 topic(s), 0 failed")


# --- the installed console script ------------------------------------------------------------


def test_console_script_end_to_end(tmp_path: Path) -> None:
    exe = Path(sys.executable).parent / "tiered"
    assert exe.is_file()
    env = {k: v for k, v in os.environ.items() if k not in ENV_OVERRIDES and k != ENV_CONFIG}
    env["TIERED_NO_PROGRESS"] = "1"

    def tiered(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(exe), *argv], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=120, check=False)

    p = tiered("init", "ws")
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "ws" / CONFIG_FILE_NAME).is_file()
    p = tiered("--workspace", "ws", "generate", "--topics", "1", "--ledgers", "3", "--entries", "50",
               "--entry-size", "10-500")
    assert p.returncode == 0, p.stderr
    p = tiered("--workspace", "ws", "offload", "--keep-bytes", "0")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("offloaded 3 ledger(s)")
    p = tiered("--workspace", "ws", "--json", "verify")
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    assert res["verified"] == 1 and res["failed"] == 0
    assert res["tier_reads"] == {"hot": 1, "offloaded": 3}  # the open ledger is hot
    p = tiered("--workspace", "ws", "offload", "--up-to", "1:0")
    assert p.returncode == 2 and "--up-to needs explicit topic" in p.stderr


def test_status_by_namespace_totals_match_ledgers_and_objects(gen: Cli) -> None:
    gen.ok("offload", "--namespace", NS_A, "--keep-bytes", "0")
    res = gen.json("status", "--by-namespace", "--ledgers")
    per_ns: dict[str, dict[str, int]] = {}
    for row in res["topics"]:
        ns = TopicName.parse(row["topic"]).namespace_name
        agg = per_ns.setdefault(ns, {"both": 0, "hot_only": 0, "offloaded_bytes": 0})
        for d in row["ledger_detail"]:
            agg["both"] += d["tier"] == "both"
            agg["hot_only"] += d["tier"] == "hot"
            agg["offloaded_bytes"] += d["size"] if d["tier"] != "hot" else 0
    for ns, agg in per_ns.items():
        for k, v in agg.items():
            assert res["namespaces"][ns][k] == v, (ns, k)
    assert res["namespaces"][NS_A]["both"] > 0 and res["namespaces"][NS_B]["both"] == 0
    # two objects (data + index) per offloaded ledger
    assert res["store"]["objects"] == 2 * sum(a["both"] for a in res["namespaces"].values())
