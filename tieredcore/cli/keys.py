"""`tiered keys new|activate|status|rotate|retire`: the key-encryption keys of the configuration's key ring
(docs/keys.md). ``status`` shows which key each encrypted object's data key is wrapped by; ``rotate``
re-wraps them under the active key (rewriting manifests only: safe to interrupt and rerun); ``retire``
takes a key off the ring, refused while any object still needs it."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from tieredcore.cli.common import CommandGroup
from tieredcore.cold.keyring import DEFAULT_RSA_BITS, MIN_RSA_BITS, KeyRing, check_key_id
from tieredcore.errors import ValidationError
from tieredcore.lifecycle.keys import RotationRow, key_status, retire, timed_rotation
from tieredcore.outcomes import Outcome
from tieredcore.workspace import Workspace

EXIT_OK, EXIT_FAILED = 0, 1
MAX_RSA_BITS = 8192  # larger keys take minutes to generate and slow every unwrap

COMMANDS = ("keys",)


def add_parser(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "keys", parents=parents, help="key-encryption keys of encrypted namespaces: new, activate, status, rotate, "
                                      "retire",
        description="Manage the RSA key-encryption keys (KEKs) of the configuration's key_ring, which wrap the "
                    "per-object data keys of encrypted namespaces (docs/keys.md). Rotation: `keys new ID` "
                    "(active at once), `keys rotate` (re-wraps every object's data key under the active key, "
                    "rewriting only manifests; safe to interrupt and rerun), `keys status` (nothing needs the "
                    "old key any more), `keys retire OLD`.",
    )
    ks = p.add_subparsers(dest="keys_cmd", required=True)
    n = ks.add_parser("new", parents=parents, help="generate a new RSA key on the ring (active unless --no-activate)")
    n.add_argument("id", help="key id: 1-64 characters of A-Z a-z 0-9 _ . -")
    n.add_argument("--no-activate", action="store_true", help="add the key without making it the active one")
    n.add_argument("--bits", help=f"RSA key size ({MIN_RSA_BITS}-{MAX_RSA_BITS}; default {DEFAULT_RSA_BITS})")
    a = ks.add_parser("activate", parents=parents, help="make a key of the ring the one new data keys are wrapped by")
    a.add_argument("id")
    ks.add_parser("status", parents=parents,
                  help="per key: active or not, how many objects need it (reads every manifest)")
    r = ks.add_parser("rotate", parents=parents,
                      help="re-wrap every encrypted object's data key under the active key (or --to)")
    r.add_argument("--to", help="re-wrap under this key of the ring instead of the active one")
    r.add_argument("--dry-run", action="store_true", help="check every object could be re-wrapped; write nothing")
    t = ks.add_parser("retire", parents=parents,
                      help="take a key off the ring (refused while any object needs it, and for the active key)")
    t.add_argument("id")


def _bits(text: str | None) -> int:
    if text is None:
        return DEFAULT_RSA_BITS
    t = text.strip()
    if not (t.isascii() and t.isdigit()) or not MIN_RSA_BITS <= int(t) <= MAX_RSA_BITS:
        raise ValidationError(f"--bits {text!r}: an integer from {MIN_RSA_BITS} to {MAX_RSA_BITS}")
    return int(t)


def _ring_path(ws: Workspace) -> str:
    if not ws.config.key_ring:
        raise ValidationError("no key ring configured: set key_ring in the configuration (an absolute directory; "
                              "`tiered keys new` creates it)")
    return ws.config.key_ring


def run(a: argparse.Namespace, ws: Workspace, progress: Any = None) -> dict[str, Any]:
    cmd = a.keys_cmd
    if cmd == "new":
        kek = check_key_id(a.id)
        bits = _bits(a.bits)
        before = ws.key_ring().active_id if _has_ring(ws) else None
        ring = KeyRing.add_key(_ring_path(ws), kek, activate=not a.no_activate, bits=bits)
        res = {"key_ring": str(ring.path), "created": kek, "bits": bits, "active": ring.active_id,
               "previous_active": before, "keys": sorted(ring.keys)}
        if before and ring.active_id != before:
            res["next"] = f"objects wrapped by {before} keep needing it: run `tiered keys rotate`"
        return res
    if cmd == "activate":
        ring = ws.key_ring()
        before = ring.active_id
        ring.activate(check_key_id(a.id))
        res = {"key_ring": str(ring.path), "active": ring.active_id, "previous_active": before}
        if before != ring.active_id:
            res["next"] = f"objects wrapped by {before} keep needing it: run `tiered keys rotate`"
        return res
    if cmd == "status":
        st = key_status(ws)
        res = st.as_dict()
        res["_exit"] = EXIT_FAILED if st.errors or st.unreadable.objects or st.missing else EXIT_OK
        return res
    if cmd == "retire":
        ring = ws.key_ring()
        path = retire(ws, a.id)
        return {"key_ring": str(ring.path), "retired": a.id, "file": str(path), "keys": sorted(ring.keys),
                "active": ring.active_id}
    return _rotate(a, ws, progress)


def _has_ring(ws: Workspace) -> bool:
    return bool(ws.config.key_ring) and (Path(ws.config.key_ring) / "active").exists()


def _rotate(a: argparse.Namespace, ws: Workspace, progress: Any) -> dict[str, Any]:
    counts: dict[str, int] = {}

    def step(i: int, n: int, row: RotationRow) -> None:
        counts[row.outcome] = counts.get(row.outcome, 0) + 1
        if progress is not None:
            progress(f"keys rotate: {i}/{n} object(s): " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())),
                     force=i == n)

    rep, seconds = timed_rotation(ws, a.to, a.dry_run, step)
    res: dict[str, Any] = {**rep.summary(), "seconds": seconds,
                           "_exit": EXIT_FAILED if rep.failures else EXIT_OK}
    return res


def print_human(cmd: str, res: dict[str, Any]) -> None:
    if "keys" in res and "objects" in res:  # status
        print(f"key ring {res['key_ring'] or '(none configured)'}: active key {res['active'] or '-'}")
        print(f"{'key':<24} {'active':>6} {'on ring':>8} {'objects':>9}")
        for k in res["keys"]:
            where = "yes" if k["on_ring"] else "RETIRED" if k["retired"] else "MISSING"
            print(f"{k['id']:<24} {'*' if k['active'] else '':>6} {where:>8} {k['objects']:>9}"
                  + (f"  e.g. {k['samples'][0]}" if k["samples"] else ""))
        print(f"{res['objects']} transformed object(s) in {len(res['locations'])} location(s): "
              f"{res['unencrypted']} unencrypted, {sum(k['objects'] for k in res['keys'])} encrypted"
              + (f"; {res['foreign']} of other clusters/workspaces (not counted)" if res["foreign"] else ""))
        for kek in res["missing_keys"]:
            print(f"MISSING KEY {kek}: objects need it and it is not on the ring; they cannot be read until its "
                  f"PEM file is restored")
        if res["unreadable"]:
            print(f"{res['unreadable']} manifest(s) cannot be read: " + "; ".join(res["unreadable_samples"]))
        for e in res["errors"]:
            print(f"ERROR {e}")
        stale = [k["id"] for k in res["keys"] if k["objects"] and not k["active"]]
        if stale:
            print(f"objects still need {', '.join(stale)}: `tiered keys rotate` re-wraps them under the active key")
        return
    if "outcomes" in res and "target" in res:  # rotate
        o = res["outcomes"]
        done = o.get(Outcome.WOULD_REWRAP if res["dry_run"] else Outcome.REWRAPPED, 0)
        print(f"keys rotate{' (dry run)' if res['dry_run'] else ''}: {res['objects']} object(s) -> key "
              f"{res['target']}: {'would re-wrap' if res['dry_run'] else 're-wrapped'} {done}, skipped "
              f"{o.get(Outcome.SKIPPED, 0)}, failed {len(res['failed'])} ({res['seconds']:.1f} s)")
        for loc, counts in res["locations"].items():
            print(f"  {loc}: " + (", ".join(f"{v} {k}" for k, v in counts.items()) or "no transformed objects"))
        for e in res["errors"]:
            print(f"ERROR {e}")
        for f in res["failed"]:
            print(f"FAILED {f}")
        if res["failed"] or res["errors"]:
            print("rerun `tiered keys rotate` once the cause is fixed: objects already re-wrapped are skipped")
        return
    for k, v in res.items():
        if not k.startswith("_"):
            print(f"{k}: {v}")


GROUP = CommandGroup(COMMANDS, add_parser, run, print_human)
