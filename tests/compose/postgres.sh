#!/bin/bash
# PostgreSQL 15 from Debian's package for the compose test (docker-compose.test.yaml, service postgres):
# the database and user the compose file's Airflow URLs name (airflow/airflow@postgres/airflow), data
# on the postgres-db-volume, listening on 127.0.0.1:5432 (host networking), as the postgres user.
set -euo pipefail
BIN=/usr/lib/postgresql/15/bin
DATA=/var/lib/postgresql/data/pgdata
install -d -o postgres -g postgres /var/lib/postgresql/data /run/postgresql
if [ ! -s "$DATA/PG_VERSION" ]; then
    runuser -u postgres -- "$BIN/initdb" -D "$DATA" -U airflow --auth=trust -E UTF8 >/dev/null
    runuser -u postgres -- "$BIN/postgres" --single -D "$DATA" postgres <<<'CREATE DATABASE airflow;' >/dev/null
fi
exec runuser -u postgres -- "$BIN/postgres" -D "$DATA" -h 127.0.0.1 -p 5432 -k /run/postgresql \
    -c fsync=off -c max_connections=200
