"""The suite's mutation check (scripts/mutants.py): every planted bug in the deletion paths is caught by
the tests named with it. Slow: each mutant runs its tests in a copy of the repository."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_every_planted_bug_in_the_deletion_paths_is_caught():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "mutants.py")], capture_output=True, text=True,
                       timeout=1700)
    lines = r.stdout.strip().splitlines()
    assert r.returncode == 0, r.stdout + r.stderr
    assert lines[-1].startswith("mutation score: ") and all(ln.lstrip().startswith("killed") for ln in lines[:-1])
    assert len(lines) >= 4  # the mutants are listed, not an empty run
