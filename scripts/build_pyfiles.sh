#!/usr/bin/env bash
# Builds the --py-files zip for Spark clusters whose workers do not have the project installed:
# tieredcore/ and spark_jobs/ (Python files and the .proto sources, no __pycache__), reproducibly —
# entries sorted, every timestamp 1980-01-01 00:00:00, fixed permissions and compression level — so
# two builds of the same tree are byte-identical.
#
#   scripts/build_pyfiles.sh [OUTPUT]          (default: dist/tiered-pyfiles.zip; `make pyfiles`)
#
# Then point the DAGs at it: TIERED_PY_FILES=/path/to/tiered-pyfiles.zip (see docs/deploy.md).
# Needs only a Python 3 interpreter (the project's .venv when present).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-dist/tiered-pyfiles.zip}
PY=${PYTHON:-}
if [ -z "$PY" ]; then
    if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi

"$PY" - "$OUT" <<'EOF'
import os
import sys
import zipfile
from pathlib import Path

PACKAGES = ("tieredcore", "spark_jobs")
SUFFIXES = (".py", ".proto")
EPOCH = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip entry can carry

out = Path(sys.argv[1])
root = Path.cwd()
files: list[str] = []
dirs: set[str] = set()
for pkg in PACKAGES:
    if not (root / pkg).is_dir():
        sys.exit(f"build_pyfiles: {root / pkg} is missing")
    for dirpath, dirnames, filenames in os.walk(root / pkg):
        dirnames[:] = [d for d in dirnames if d != "__pycache__" and not d.startswith(".")]
        rel_dir = Path(dirpath).relative_to(root).as_posix()
        for name in filenames:
            if name.endswith(SUFFIXES):
                files.append(f"{rel_dir}/{name}")
                # explicit directory entries for every parent: zipimport finds namespace packages
                # (a directory without __init__.py, e.g. tieredcore/offload) only through them
                parts = rel_dir.split("/")
                dirs.update("/".join(parts[: i + 1]) + "/" for i in range(len(parts)))

out.parent.mkdir(parents=True, exist_ok=True)
tmp = out.with_name(out.name + ".tmp")
with zipfile.ZipFile(tmp, "w") as zf:
    for name in sorted(dirs | set(files)):
        info = zipfile.ZipInfo(name, date_time=EPOCH)
        info.create_system = 3  # unix, so external_attr's permission bits mean the same everywhere
        if name.endswith("/"):
            info.external_attr = (0o40755 << 16) | 0x10
            zf.writestr(info, b"")
        else:
            info.external_attr = 0o100644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, (root / name).read_bytes(), compresslevel=9)
tmp.replace(out)
print(f"build_pyfiles: {out} ({len(files)} files)")
EOF
