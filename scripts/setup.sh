#!/usr/bin/env bash
# Creates .venv with every pinned dependency and the project installed (editable).
# Idempotent: a second run only checks. Needs python3.11+ with venv and a JDK 17 for Spark;
# installs the JDK from Debian when missing and running as root.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

if ! command -v java >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "setup: installing a JDK for Spark (openjdk-17-jre-headless)"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless >/dev/null
    else
        echo "setup: Spark needs Java 17 on PATH; install a JDK and rerun" >&2
        exit 1
    fi
fi

if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv"
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check uv==0.13.8
echo "setup: installing pinned dependencies (constraints.txt)"
.venv/bin/uv pip install -q --python .venv/bin/python -c constraints.txt -e '.[spark,airflow,dev]'
# (docs/deploy.md, "pyspark files") the Spark provider pulls pyspark-client, whose pyspark/ files overwrite pyspark's. Put
# pyspark's own files back (never uninstall pyspark-client: that deletes them) and check.
if [ "$(.venv/bin/python -c 'import pyspark; print(pyspark.__version__)')" != "4.3.0" ]; then
    echo "setup: restoring pyspark 4.3.0 files overwritten by pyspark-client"
    .venv/bin/uv pip install -q --python .venv/bin/python --reinstall --no-deps pyspark==4.3.0
fi
v=$(.venv/bin/python -c 'import pyspark; print(pyspark.__version__)')
[ "$v" = "4.3.0" ] || { echo "setup: pyspark reports $v, expected 4.3.0" >&2; exit 1; }
echo "setup: ok ($(.venv/bin/python --version), pyspark $v)"
