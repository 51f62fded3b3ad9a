#!/usr/bin/env bash
# Entrypoint of the Airflow image (docker/airflow.Dockerfile), a small version of the official Airflow
# image's: optional one-time steps, then the command.
#
#   _AIRFLOW_DB_MIGRATE=true       `airflow db migrate` first
#   _AIRFLOW_WWW_USER_CREATE=true  the admin's password for the SimpleAuthManager:
#                                  {"$_AIRFLOW_WWW_USER_USERNAME": "$_AIRFLOW_WWW_USER_PASSWORD"} written to
#                                  $AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE (the user itself is
#                                  AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS)
#
# Commands: `bash ...`, `sh ...`, `python ...` and absolute paths run as they are; `airflow X` and `X` both
# run `airflow X` (compose's `command: api-server`, `celery worker`, ...).
set -euo pipefail

if [[ "${_AIRFLOW_DB_MIGRATE:-}" == true ]]; then
    airflow db migrate
fi
if [[ "${_AIRFLOW_WWW_USER_CREATE:-}" == true ]]; then
    : "${AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE:?the passwords file of the SimpleAuthManager}"
    mkdir -p "$(dirname "$AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE")"
    python - "$AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE" <<'PY'
import json, os, sys
user, password = os.environ["_AIRFLOW_WWW_USER_USERNAME"], os.environ["_AIRFLOW_WWW_USER_PASSWORD"]
with open(sys.argv[1], "w") as f:
    json.dump({user: password}, f)
PY
fi

case "${1:-}" in
    bash|sh|python|python3|/*) exec "$@" ;;
    airflow) shift ;;
esac
exec airflow "$@"
