# Source this to point Airflow at the project's DAGs and a workspace (default ./workspace):
#     . scripts/airflow-env.sh [WORKSPACE]
# then once `scripts/airflow-init.sh` (database, the `spark` pool, the spark_default / aws_default
# connections; `make demo` runs it), then `airflow dags test tiered_offload_sweep 2026-01-01T00:00:00+00:00`,
# or `airflow standalone` to see the DAGs in the UI on http://127.0.0.1:8080 (password in
# $AIRFLOW_HOME/simple_auth_manager_passwords.json.generated).
# The connections live in the workspace's Airflow database (Admin -> Connections), not in AIRFLOW_CONN_*
# variables; a script that sets its own AIRFLOW_CONN_SPARK_DEFAULT still overrides them.
_repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
_ws=$(realpath -m "${1:-$_repo/workspace}")
export PATH="$_repo/.venv/bin:$PATH"
export TIERED_CONFIG="$_ws/tiered.toml"
export AIRFLOW_HOME="$_ws/airflow"
export AIRFLOW__CORE__DAGS_FOLDER="$_repo/dags"
export AIRFLOW__CORE__PLUGINS_FOLDER="$_repo/plugins"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__CORE__PARALLELISM=4
export AIRFLOW__API__HOST=127.0.0.1
export PYSPARK_PYTHON="$_repo/.venv/bin/python"
export SPARK_LOCAL_IP=127.0.0.1
unset _repo _ws
