"""`tiered offload` sends each topic where its effective policy says (object store, block size), as the
Spark sweep does, instead of always to the workspace's store with the workspace's block size."""

from __future__ import annotations

from pathlib import Path

from tests.support.clihelp import (
    B0,
    LEDGERS,
    NS,
    OTHER_NS,
    T0,
    Cli,
    _clean_env,  # noqa: F401  (autouse)
    generate,
)
from tieredcore.formats.index import parse_index_v1

BLOCK = 1024  # the filesystem store's minimum; ledgers here are ~3 KiB, so several blocks each


def objects(root: Path) -> list[Path]:
    """The offloaded objects under a filesystem store's root (not its owner marker)."""
    return sorted(p for p in root.iterdir() if p.is_file() and not p.name.startswith("tiered-owner.")) \
        if root.is_dir() else []


def test_offload_follows_the_namespace_policy_store_and_block_size(tmp_path: Path, capsys) -> None:
    cli = Cli(tmp_path / "ws", capsys)
    assert cli("init", str(cli.root), workspace=False)[0] == 0
    generate(cli, NS, OTHER_NS, messages=False)  # the tests count ledger bytes
    other = tmp_path / "other-store"
    code, _, err = cli("policies", "set", NS, "--store-driver", "filesystem", "--store-root", str(other),
                       "--max-block-size", "1K")
    assert code == 0, err

    res = cli.json("offload", "--keep-bytes", "0")
    assert res["failed"] == 0 and res["offloaded"] == 2 * LEDGERS
    blocks = {(r["topic"], r["ledger_id"]): r["blocks"] for r in res["results"]}

    # public/default: every data object and index under the policy's root, in blocks of at most 1 KiB
    detail = cli.ledgers(T0)[:LEDGERS]
    names = {p.name for p in objects(other)}
    assert names == {f"{d['uuid']}-ledger-{d['ledger']}{s}" for d in detail for s in ("", "-index")}
    for d in detail:
        index = parse_index_v1((other / f"{d['uuid']}-ledger-{d['ledger']}-index").read_bytes(), d["ledger"])
        sizes = index.block_sizes()
        assert len(sizes) > 1 and max(sizes) <= BLOCK, sizes
        assert blocks[("public/default/persistent/topic-0000", d["ledger"])] == len(sizes)
    assert not any(d["uuid"] in p.name for d in detail for p in objects(cli.root / "cold"))

    # acme/payments has no policy: the workspace's store and block size (64 MiB: one block per ledger)
    other_detail = cli.ledgers(B0)[:LEDGERS]
    cold = {p.name for p in objects(cli.root / "cold")}
    assert {f"{d['uuid']}-ledger-{d['ledger']}" for d in other_detail} <= cold
    assert all(blocks[("acme/payments/persistent/topic-0000", d["ledger"])] == 1 for d in other_detail)

    # and everything reads back from where it went
    assert cli.json("verify")["verified"] == 2
