#!/usr/bin/env bash
# Installs what a purpose needs, no more (idempotent: a second run only checks):
#
#   scripts/setup.sh demo     .venv with every pinned dependency and the project (editable), a JDK for Spark:
#                             all `make demo` uses (SQLite, a local hot tier, a filesystem store, local[2])
#   scripts/setup.sh test     demo's, plus the real servers the tests start on loopback: ZooKeeper, Redis,
#                             PostgreSQL, Chromium (browser tests) from Debian, Azurite from npm (`make test`)
#   scripts/setup.sh stack    demo's, plus what scripts/stack.sh runs: ZooKeeper, Redis, PostgreSQL
#   scripts/setup.sh          the same as `test` (everything)
#
# --dry-run (or SETUP_DRY_RUN=1) prints what would be installed and installs nothing.
# Debian packages are installed when missing and running as root; otherwise they are named and required.
# Needs python3.11+ with venv; `test` needs Node.js 20 with npm (Azurite).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DRY=${SETUP_DRY_RUN:-0}
MODE=test
for arg in "$@"; do
    case "$arg" in
        demo|test|stack) MODE=$arg ;;
        --dry-run) DRY=1 ;;
        *) echo "usage: scripts/setup.sh [demo|test|stack] [--dry-run]" >&2; exit 2 ;;
    esac
done

# Debian packages by need: a JDK for Spark (every mode); the servers tests and stack.sh start on loopback
DEMO_DEBS="openjdk-17-jre-headless"
STACK_DEBS="zookeeper redis-server postgresql"
# docker.io, docker-compose, debootstrap: tests/compose starts docker-compose.yaml on a private dockerd
TEST_DEBS="zookeeper redis-server postgresql chromium docker.io docker-compose debootstrap"
# Python extras (pyproject.toml): dev (pytest, moto's S3 server, Playwright...) for the tests and the stack's S3
case "$MODE" in
    demo) DEB_PKGS=$DEMO_DEBS; EXTRAS=spark,airflow,azure,gcs; AZURITE=0 ;;
    stack) DEB_PKGS="$DEMO_DEBS $STACK_DEBS"; EXTRAS=spark,airflow,azure,gcs,dev; AZURITE=0 ;;
    test) DEB_PKGS="$DEMO_DEBS $TEST_DEBS"; EXTRAS=spark,airflow,azure,gcs,dev; AZURITE=1 ;;
esac
echo "setup ($MODE): Debian packages: $DEB_PKGS; Python: .venv with .[$EXTRAS] from constraints.txt$(
    [ "$AZURITE" = 1 ] && echo "; Azurite (npm)" || true)"

missing=""
for p in $DEB_PKGS; do
    dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
if [ "$DRY" = 1 ]; then
    echo "setup: dry run: missing Debian packages:${missing:- none}; nothing installed"
    exit 0
fi
if [ -n "$missing" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "setup: installing Debian packages:$missing"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
    else
        echo "setup: missing Debian packages:$missing (install them, e.g. sudo apt-get install$missing, and rerun)" >&2
        exit 1
    fi
fi

if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv"
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check uv==0.13.8
echo "setup: installing pinned dependencies (constraints.txt)"
.venv/bin/uv pip install -q --python .venv/bin/python -c constraints.txt -e ".[$EXTRAS]"
# (docs/deploy.md, "pyspark files") the Spark provider pulls pyspark-client, whose pyspark/ files overwrite pyspark's. Put
# pyspark's own files back (never uninstall pyspark-client: that deletes them) and check.
if [ "$(.venv/bin/python -c 'import pyspark; print(pyspark.__version__)')" != "4.3.0" ]; then
    echo "setup: restoring pyspark 4.3.0 files overwritten by pyspark-client"
    .venv/bin/uv pip install -q --python .venv/bin/python --reinstall --no-deps pyspark==4.3.0
fi
v=$(.venv/bin/python -c 'import pyspark; print(pyspark.__version__)')
[ "$v" = "4.3.0" ] || { echo "setup: pyspark reports $v, expected 4.3.0" >&2; exit 1; }
# Azurite (Azure Blob's emulator) from npm, pinned (3.35 is the last release for Node 20), project-local.
AZURITE_VERSION=3.35.0
if [ "$AZURITE" = 1 ] && { [ ! -x .tools/azurite/node_modules/.bin/azurite-blob ] || \
   [ "$(node -p "require('./.tools/azurite/node_modules/azurite/package.json').version" 2>/dev/null)" != "$AZURITE_VERSION" ]; }; then
    command -v npm >/dev/null 2>&1 || { echo "setup: npm (Node.js 20) is needed for Azurite (the tests' Azure emulator)" >&2; exit 1; }
    echo "setup: installing azurite@$AZURITE_VERSION into .tools/azurite"
    npm install --silent --no-audit --no-fund --prefix .tools/azurite "azurite@$AZURITE_VERSION"
fi
echo "setup ($MODE): ok ($(.venv/bin/python --version), pyspark $v)"
