#!/usr/bin/env bash
# Creates .venv with every pinned dependency and the project installed (editable).
# Idempotent: a second run only checks. Needs python3.11+ with venv and a JDK 17 for Spark;
# installs the JDK from Debian when missing and running as root.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

# Debian packages for Spark (a JDK) and for the real servers the tests and scripts/stack.sh start on
# loopback: ZooKeeper (metadata), Redis (Celery broker), PostgreSQL (Airflow's database), Chromium
# (browser tests). Installed when missing and running as root; otherwise named and required.
DEB_PKGS="openjdk-17-jre-headless zookeeper redis-server postgresql chromium"
missing=""
for p in $DEB_PKGS; do
    dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
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
.venv/bin/uv pip install -q --python .venv/bin/python -c constraints.txt -e '.[spark,airflow,azure,gcs,dev]'
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
if [ ! -x .tools/azurite/node_modules/.bin/azurite-blob ] || \
   [ "$(node -p "require('./.tools/azurite/node_modules/azurite/package.json').version" 2>/dev/null)" != "$AZURITE_VERSION" ]; then
    command -v npm >/dev/null 2>&1 || { echo "setup: npm (Node.js 20) is needed for Azurite" >&2; exit 1; }
    echo "setup: installing azurite@$AZURITE_VERSION into .tools/azurite"
    npm install --silent --no-audit --no-fund --prefix .tools/azurite "azurite@$AZURITE_VERSION"
fi
echo "setup: ok ($(.venv/bin/python --version), pyspark $v)"
