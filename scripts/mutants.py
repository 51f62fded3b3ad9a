"""Planted bugs in the paths that delete or release data, each expected to be caught by the tests named
with it: a small mutation check of the suite (`make mutants`; tests/test_mutants.py runs it).

Each mutant replaces one exact piece of source text (it must occur exactly once: a mutant whose text
moved is reported as stale, never silently skipped) in a copy of the repository, runs its tests there,
and is *killed* when they fail. The score is killed / all; a surviving mutant is a deletion path the
suite does not guard. Prints one line per mutant and the score; exit 0 only when every mutant is killed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


MUTANTS = (
    Mutant("lag cleanup: no comparison with the hot copy for ledger-mode (V1) copies",
           "tieredcore/lifecycle/sweep.py",
           "verify_offloaded(h, hot.entry_crcs() if hot is not None else None,",
           "verify_offloaded(h, hot.entry_crcs() if hot is not None and not v1 else None,",
           ("tests/lifecycle/test_scrub_messages.py",)),
    Mutant("offloaded-index check: strict about the index-length field Pulsar's reader ignores",
           "tieredcore/offload/offloader.py",
           "check_index_v1(index, index.data_object_length, check_length_field=False)",
           "check_index_v1(index, index.data_object_length, check_length_field=True)",
           ("tests/offload/test_sidecar.py",)),
    Mutant("lag cleanup: a copy that fails its proof still releases the hot copy",
           "tieredcore/lifecycle/sweep.py",
           "    failed = _prove(ws, t, li, w, row)\n    if failed is not None:\n        return failed\n",
           "    failed = _prove(ws, t, li, w, row)\n",
           ("tests/lifecycle/test_scrub_messages.py", "tests/lifecycle/test_sweep.py")),
    Mutant("reconciliation: the owner of a group checked only when it has an index object",
           "tieredcore/lifecycle/reconcile/orphans.py",
           "    for key in sorted(group.keys, key=lambda k: not k.endswith(INDEX_SUFFIX)):\n",
           "    for key in sorted(group.keys, key=lambda k: not k.endswith(INDEX_SUFFIX)):\n"
           "        if not any(k.endswith(INDEX_SUFFIX) for k in group.keys):\n"
           "            return GroupOwner(topic, None)  # taken as ours unchecked\n",
           ("tests/lifecycle/test_reconcile.py",)),
    Mutant("drain: an orphan record deleted without re-reading the topic's record",
           "tieredcore/lifecycle/drain.py",
           "            if where is None:\n                keep.append(j)\n                continue\n",
           "            if True:\n                keep.append(j)\n                continue\n",
           ("tests/attach/test_attached_reconcile.py",)),
)


def copy_tree(dest: Path) -> None:
    """The repository's tracked and new files (not ignored ones: no venv, no workspaces)."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for f in filter(None, files):
        src = ROOT / f
        if src.is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / f)


def run(m: Mutant, work: Path, timeout: float) -> str:
    target = work / m.path
    original = target.read_text()
    if original.count(m.old) != 1:
        return "stale"  # the source moved on: the mutant must be updated, not skipped
    target.write_text(original.replace(m.old, m.new))
    try:
        env = {**os.environ, "PYTHONPATH": str(work), "PYTHONDONTWRITEBYTECODE": "1"}
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m", "not slow",
                            *m.tests], cwd=work, env=env, capture_output=True, text=True, timeout=timeout)
        return "killed" if r.returncode == 1 else ("survived" if r.returncode == 0 else f"error (exit {r.returncode})")
    except subprocess.TimeoutExpired:
        return "killed (timeout)"
    finally:
        target.write_text(original)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--timeout", type=float, default=600, help="seconds per mutant's tests")
    ap.add_argument("-k", dest="only", help="only mutants whose name contains this")
    args = ap.parse_args(argv)
    chosen = [m for m in MUTANTS if not args.only or args.only in m.name]
    killed = 0
    with tempfile.TemporaryDirectory(prefix="tiered-mutants-") as d:
        work = Path(d)
        copy_tree(work)
        for m in chosen:
            started = time.monotonic()
            outcome = run(m, work, args.timeout)
            killed += outcome.startswith("killed")
            print(f"{outcome:>16}  {m.name}  ({time.monotonic() - started:.1f} s)", flush=True)
    print(f"mutation score: {killed}/{len(chosen)} killed")
    return 0 if killed == len(chosen) else 1


if __name__ == "__main__":
    sys.exit(main())
