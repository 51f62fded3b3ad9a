#!/usr/bin/env bash
# Prepares the Airflow of a workspace (run after `. scripts/airflow-env.sh WORKSPACE`; `make demo` does):
# migrates its database, creates the `spark` pool every SparkSubmitOperator of the DAGs runs in
# (TIERED_SPARK_POOL_SLOTS slots, default 2: at most that many spark-submits at once, so the quick Python
# tasks always find a slot), and the `spark_default` and `aws_default` connections, which then appear
# under Admin -> Connections. Existing connections are kept (edit them in the UI); the pool's slots are
# set again. An AIRFLOW_CONN_SPARK_DEFAULT / AIRFLOW_CONN_AWS_DEFAULT environment variable still wins
# over these (Airflow looks at the environment first): scripts that bring their own servers set those.
set -euo pipefail
: "${AIRFLOW_HOME:?source scripts/airflow-env.sh first}"
slots=${TIERED_SPARK_POOL_SLOTS:-2}
[[ "$slots" =~ ^[1-9][0-9]*$ ]] || { echo "airflow-init: TIERED_SPARK_POOL_SLOTS=$slots: a positive integer" >&2; exit 2; }
pool=${TIERED_SPARK_POOL:-spark}

airflow db migrate >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/pools.json" <<JSON
{"$pool": {"slots": $slots, "description": "spark-submit tasks of the tiered-storage DAGs", "include_deferred": false}}
JSON
airflow pools import "$tmp/pools.json" >/dev/null
# local[2] Spark and the default AWS credential chain (the demo's object store is a directory; point
# aws_default at S3 or MinIO with a login, password and an endpoint_url extra)
cat > "$tmp/connections.json" <<JSON
{
  "spark_default": {"conn_type": "spark", "host": "local[2]", "description": "Spark for the tiered-storage jobs"},
  "aws_default": {"conn_type": "aws", "extra": {"region_name": "us-east-1"},
                  "description": "object store credentials of the tiered-storage jobs (S3 stores)"}
}
JSON
out=$(airflow connections import "$tmp/connections.json" 2>&1) || { echo "$out" >&2; exit 1; }
echo "airflow-init: pool $pool ($slots slots), connections spark_default, aws_default ($AIRFLOW_HOME)"
