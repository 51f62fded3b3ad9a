"""`tiered keys`: a key ring created and rotated through the CLI (new, status, rotate, retire), retiring
refused while objects need the key, a rotation that fails exits 1, and bad input exits 2 changing
nothing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support.clihelp import (
    NS,
    T0,
    Cli,
    _clean_env,  # noqa: F401  (autouse)
    assert_usage_error,
    generate,
    snapshot,
)
from tieredcore.cold.blob import iter_objects
from tieredcore.cold.keyring import KeyRing
from tieredcore.config import CONFIG_FILE_NAME, Config
from tieredcore.formats.keys import MANIFEST_SUFFIX
from tieredcore.formats.manifest import Manifest
from tieredcore.workspace import Workspace

BITS = "2048"  # the smallest allowed: quick to generate


@pytest.fixture(scope="module")
def key_pool(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("pool")
    KeyRing.add_key(d, "k1", bits=2048)
    return d


def workspace(tmp_path: Path, capsys, *, key_ring: bool = True) -> Cli:
    """A workspace whose configuration names the key ring <root>/keys (not created yet)."""
    c = Cli(tmp_path / "ws", capsys)
    c.root.mkdir()
    overrides = {"key_ring": str(c.root / "keys")} if key_ring else {}
    (c.root / CONFIG_FILE_NAME).write_text(Config.for_workspace(c.root, **overrides).to_toml())
    code, _, err = c("init", str(c.root), workspace=False)
    assert code == 0, err
    generate(c, NS)
    return c


def encrypt(cli: Cli) -> None:
    with Workspace(cli.config()) as ws:
        ws.policies.set_namespace(NS, {"transform": "zstd+aes", "transform_chunk_size": 4096})


def manifests(cli: Cli) -> dict[str, bytes]:
    with Workspace(cli.config()) as ws:
        return {o.key: ws.store.get(o.key) for o in iter_objects(ws.store) if o.key.endswith(MANIFEST_SUFFIX)}


def test_create_rotate_retire(tmp_path, capsys):
    cli = workspace(tmp_path, capsys)
    ring = cli.root / "keys"
    assert_usage_error(cli("keys", "status"), "keys", "no such directory", "tiered keys new")
    res = cli.json("keys", "new", "k1", "--bits", BITS)
    assert res["created"] == "k1" and res["active"] == "k1" and res["previous_active"] is None
    assert (ring / "k1.pem").stat().st_mode & 0o077 == 0
    encrypt(cli)
    off = cli.json("offload", T0, "--keep-bytes", "0")
    assert off["offloaded"] > 0 and off["failed"] == 0
    n = 2 * off["offloaded"]  # data and index objects, each with its manifest

    st = cli.json("keys", "status")
    assert [(k["id"], k["active"], k["objects"]) for k in st["keys"]] == [("k1", True, n)]
    assert st["objects"] == n and st["unencrypted"] == 0 and st["errors"] == []

    res = cli.json("keys", "new", "k2", "--bits", BITS)
    assert res["active"] == "k2" and res["previous_active"] == "k1" and "tiered keys rotate" in res["next"]
    code, out, err = cli("keys", "status")
    assert code == 0 and "k1" in out and "objects still need k1" in out, out
    line = next(x for x in out.splitlines() if x.startswith("k1 "))
    assert line.split()[1:4] == ["yes", str(n), "e.g."]  # not active, on the ring, needed by n objects

    before = snapshot(cli.root)
    assert_usage_error(cli("keys", "retire", "k1"), "keys", f"still needed by {n} object(s)", "tiered keys rotate")
    assert_usage_error(cli("keys", "retire", "k2"), "keys", "k2 is the active key")
    assert snapshot(cli.root) == before

    dry = cli.json("keys", "rotate", "--dry-run")
    assert dry["outcomes"] == {"would_rewrap": n} and dry["dry_run"] is True and dry["target"] == "k2"
    assert snapshot(cli.root) == before

    old = manifests(cli)
    code, out, err = cli("keys", "rotate")
    assert code == 0, err
    assert f"re-wrapped {n}, skipped 0, failed 0" in out
    new = manifests(cli)
    assert new.keys() == old.keys() and all(new[k] != old[k] for k in old)
    assert {Manifest.from_json(v, k).kek_id for k, v in new.items()} == {"k2"}
    again = cli.json("keys", "rotate")
    assert again["outcomes"] == {"skipped": n}

    res = cli.json("keys", "retire", "k1")
    assert res["retired"] == "k1" and res["keys"] == ["k2"] and Path(res["file"]).name == "k1.pem.retired"
    st = cli.json("keys", "status")
    assert [(k["id"], k["on_ring"], k["retired"], k["objects"]) for k in st["keys"]] == [
        ("k1", False, True, 0), ("k2", True, False, n)]
    assert cli("verify")[0] == 0
    assert_usage_error(cli("keys", "activate", "k1"), "keys", "no key k1")


def test_failed_rotation_exits_1_and_status_flags_it(tmp_path, capsys, key_pool):
    cli = workspace(tmp_path, capsys)
    shutil.copytree(key_pool, cli.root / "keys")
    encrypt(cli)
    assert cli.json("offload", T0, "--keep-bytes", "0")["failed"] == 0
    assert cli.json("keys", "new", "k2", "--bits", BITS)["active"] == "k2"
    bad = sorted(manifests(cli))[0]
    with Workspace(cli.config()) as ws:
        ws.store.put(bad, b"garbage", ws.store.head(bad).metadata)
    code, out, err = cli("keys", "rotate")
    assert code == 1, (out, err)
    assert f"FAILED {bad.removesuffix(MANIFEST_SUFFIX)}: failed: FormatError" in out
    assert "rerun `tiered keys rotate`" in out
    res = cli.json("keys", "status", expect=1)
    assert res["unreadable"] == 1 and res["keys"][0]["objects"] == 0
    assert_usage_error(cli("keys", "retire", "k1"), "keys", "cannot tell whether key k1 is still needed",
                       "1 manifest(s) unreadable")


@pytest.mark.parametrize(
    ("argv", "fragments"),
    [
        (["keys", "new", "bad:id"], ["key id 'bad:id'", "never ':'"]),
        (["keys", "new", "k2", "--bits", "1024"], ["--bits '1024'", "2048 to 8192"]),
        (["keys", "new", "k2", "--bits", "lots"], ["--bits 'lots'"]),
        (["keys", "new", "k1", "--bits", BITS], ["key k1 exists already"]),
        (["keys", "activate", "nope"], ["no key nope"]),
        (["keys", "activate", "../x"], ["key id '../x'"]),
        (["keys", "rotate", "--to", "nope"], ["no key nope", "keys: k1"]),
        (["keys", "rotate", "--to", "a b"], ["key id 'a b'"]),
        (["keys", "retire", "nope"], ["no key nope"]),
        (["keys", "retire", "k1"], ["k1 is the active key"]),
    ],
)
def test_bad_input_exits_2_and_changes_nothing(tmp_path, capsys, key_pool, argv, fragments):
    cli = workspace(tmp_path, capsys)
    shutil.copytree(key_pool, cli.root / "keys")
    before = snapshot(cli.root)
    assert_usage_error(cli(*argv), "keys", *fragments)
    assert snapshot(cli.root) == before


def test_without_a_configured_key_ring(tmp_path, capsys):
    cli = workspace(tmp_path, capsys, key_ring=False)
    before = snapshot(cli.root)
    assert_usage_error(cli("keys", "new", "k1"), "keys", "no key ring configured", "key_ring")
    assert_usage_error(cli("keys", "rotate"), "keys", "no key ring configured")
    assert snapshot(cli.root) == before
    st = cli.json("keys", "status")  # nothing encrypted, nothing to manage: still answers
    assert st["key_ring"] == "" and st["keys"] == [] and st["objects"] == 0
