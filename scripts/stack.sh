#!/usr/bin/env bash
# The scale-out topology of docker-compose.yaml without Docker, on loopback, from Debian packages
# (postgresql 15, redis-server, zookeeper, openjdk-17) and the project's .venv (`scripts/setup.sh stack`
# installs them):
#
#   PostgreSQL (Airflow's database and Celery result backend), Redis (Celery broker), Airflow
#   api-server + scheduler + dag-processor + one Celery worker (CeleryExecutor), a Spark standalone
#   master and TOPOLOGY_SPARK_WORKERS workers, ZooKeeper (the metadata store: zk://), moto's S3 server
#   (the object store, with the bucket created).
#
#   scripts/stack.sh up       start everything (waits until each part answers); prints where things are
#   scripts/stack.sh down     stop exactly what `up` started (recorded process groups), newest first
#   scripts/stack.sh status   every recorded process: pid, alive or not, port, log
#   scripts/stack.sh env      the environment that uses the stack (`eval "$(scripts/stack.sh env)"`):
#                             TIERED_* configuration, the Airflow processes' settings and connections
#
# Versions, ports, ids and names: docker/topology.env (docker-compose.yaml reads the same file).
# Settings from the environment:
#   TIERED_STACK_DIR   state directory: pids, logs, data (default <checkout>/.stack)
#   TIERED_VENV        the virtualenv (default <checkout>/.venv)
#   STACK_PORTS=auto   free loopback ports instead of topology.env's (tests; several stacks at once)
#   TIERED_*_SCHEDULE  passed to the Airflow processes (e.g. `none` to trigger the DAGs by hand)
#   PULSAR_ZK          attach to a running Pulsar cluster instead (docs/pulsar.md): its ZooKeeper,
#                      zk://HOST:PORT[/chroot]; with PULSAR_STORE_URL (its bucket), PULSAR_CLUSTER and
#                      PULSAR_BROKERS_DEFAULT=true when the bucket is the brokers' default (broker.conf)
#
# The Spark workers have no project checkout on their Python path: executors run the venv's python
# with -S (no site hooks, so not the editable install's finder either) and only its site-packages on
# PYTHONPATH; the project reaches them in the reproducible --py-files zip (scripts/build_pyfiles.sh),
# which the DAGs ship (TIERED_PY_FILES).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TOPOLOGY="$REPO/docker/topology.env"
STACK_DIR=$(realpath -m "${TIERED_STACK_DIR:-$REPO/.stack}")
VENV=$(realpath -m "${TIERED_VENV:-$REPO/.venv}")
PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
ZK_CP=/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar
PIDS="$STACK_DIR/pids"
LOGS="$STACK_DIR/logs"
STATE="$STACK_DIR/stack.env"  # ports and secrets chosen by `up`

die() { echo "stack: $*" >&2; exit 1; }

load_topology() {
    [ -f "$TOPOLOGY" ] || die "$TOPOLOGY is missing"
    local line key
    while IFS= read -r line || [ -n "$line" ]; do
        case "$line" in ''|'#'*) continue ;; esac
        key=${line%%=*}
        [[ "$key" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || die "$TOPOLOGY: bad line: $line"
        export "$key=${line#*=}"
    done < "$TOPOLOGY"
}

free_port() {
    "$VENV/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

port_free() {  # true when nothing listens on 127.0.0.1:$1
    ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# -- the environment the stack gives its processes and prints for its users ----------------------------

airflow_env() {  # KEY=VALUE lines: what every Airflow process gets (after `. $STATE`)
    local db="$TOPOLOGY_AIRFLOW_DB_USER:$TOPOLOGY_AIRFLOW_DB_PASSWORD@127.0.0.1:$POSTGRES_PORT/$TOPOLOGY_AIRFLOW_DB_NAME"
    local spark_conn="AIRFLOW_CONN_$(echo "$TOPOLOGY_SPARK_CONN_ID" | tr '[:lower:]' '[:upper:]')"
    local aws_conn="AIRFLOW_CONN_$(echo "$TOPOLOGY_AWS_CONN_ID" | tr '[:lower:]' '[:upper:]')"
    cat <<EOF
PATH=$VENV/bin:$PATH
HOME=${HOME:-/root}
LANG=C.UTF-8
PYTHONPATH=$REPO
AIRFLOW_HOME=$STACK_DIR/airflow
AIRFLOW__CORE__DAGS_FOLDER=$REPO/dags
AIRFLOW__CORE__PLUGINS_FOLDER=$REPO/plugins
AIRFLOW__CORE__EXECUTOR=$AIRFLOW__CORE__EXECUTOR
AIRFLOW__CORE__LOAD_EXAMPLES=$AIRFLOW__CORE__LOAD_EXAMPLES
AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION=$AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION
AIRFLOW__CORE__PARALLELISM=8
AIRFLOW__CORE__EXECUTION_API_SERVER_URL=http://127.0.0.1:$AIRFLOW_API_PORT/execution/
AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS=admin:admin
AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE=$STACK_DIR/airflow/passwords.json
AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=postgresql+psycopg2://$db
AIRFLOW__CELERY__RESULT_BACKEND=db+postgresql+psycopg2://$db
AIRFLOW__CELERY__BROKER_URL=redis://127.0.0.1:$REDIS_PORT/$TOPOLOGY_REDIS_DB
AIRFLOW__CELERY__WORKER_CONCURRENCY=$AIRFLOW__CELERY__WORKER_CONCURRENCY
AIRFLOW__API__HOST=127.0.0.1
AIRFLOW__API__PORT=$AIRFLOW_API_PORT
AIRFLOW__API__WORKERS=1
AIRFLOW__API__BASE_URL=http://127.0.0.1:$AIRFLOW_API_PORT
AIRFLOW__API_AUTH__JWT_SECRET=$JWT_SECRET
AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK=false
$spark_conn={"conn_type": "spark", "host": "spark://127.0.0.1", "port": $SPARK_MASTER_PORT, "extra": {"deploy-mode": "$TOPOLOGY_SPARK_DEPLOY_MODE"}}
$aws_conn={"conn_type": "aws", "login": "$S3_ACCESS_KEY", "password": "$S3_SECRET_KEY", "extra": {"endpoint_url": "http://127.0.0.1:$S3_PORT", "region_name": "$TOPOLOGY_S3_REGION"}}
PYSPARK_PYTHON=$STACK_DIR/bin/spark-python
SPARK_LOCAL_IP=127.0.0.1
SPARK_CONF_DIR=$REPO/docker/spark-conf
TIERED_PY_FILES=$STACK_DIR/tiered-pyfiles.zip
TIERED_SPARK_POOL=$TIERED_SPARK_POOL
TIERED_SPARK_POOL_SLOTS=$TIERED_SPARK_POOL_SLOTS
TIERED_SPARK_JOBS_DIR=$REPO/spark_jobs
EOF
    tiered_env
    local var
    for var in $(compgen -e | grep -E '^TIERED_[A-Z_]+_SCHEDULE$' || true); do
        echo "$var=${!var}"
    done
}

tiered_env() {  # the tieredcore configuration every part shares (tieredcore/config.py, TIERED_*)
    if [ -n "${PULSAR_ZK:-}" ]; then
        pulsar_env
    else
        cat <<EOF
TIERED_METADATA_URL=zk://127.0.0.1:$ZOOKEEPER_PORT$TOPOLOGY_ZK_ROOT
TIERED_STORE_URL=s3://$TOPOLOGY_BUCKET/$TOPOLOGY_STORE_PREFIX?endpoint=http://127.0.0.1:$S3_PORT&region=$TOPOLOGY_S3_REGION
TIERED_HOT_URL=file://$STACK_DIR/data/hot
EOF
    fi
    # the Iceberg export's catalog (docs/export.md): pyiceberg's SQL catalog in the stack's PostgreSQL (its
    # own tables beside Airflow's), the warehouse on the stack's disk, which every part of it shares
    cat <<EOF
TIERED_REPORTS_DIR=$STACK_DIR/data/reports
TIERED_SPARK_MASTER=spark://127.0.0.1:$SPARK_MASTER_PORT
TIERED_EXPORT_CATALOG_URL=postgresql+psycopg2://$TOPOLOGY_AIRFLOW_DB_USER:$TOPOLOGY_AIRFLOW_DB_PASSWORD@127.0.0.1:$POSTGRES_PORT/$TOPOLOGY_AIRFLOW_DB_NAME
TIERED_EXPORT_WAREHOUSE=file://$STACK_DIR/data/iceberg
EOF
}

pulsar_env() {  # attached to a running Pulsar cluster (docs/pulsar.md): PULSAR_ZK, PULSAR_STORE_URL, ...
    local hosts=${PULSAR_ZK#zk://} chroot=""
    hosts=${hosts#zk:}  # Pulsar's own zk:HOST:PORT/chroot spelling too
    case $hosts in */*) chroot=/${hosts#*/}; hosts=${hosts%%/*} ;; esac
    [ "$chroot" = "/" ] && chroot=""
    cat <<EOF
TIERED_METADATA_URL=zk://$hosts/tiered-storage?${chroot:+chroot=$chroot&}attached=true
TIERED_STORE_URL=${PULSAR_STORE_URL:-}
TIERED_HOT_URL=bookkeeper:
TIERED_CLUSTER=${PULSAR_CLUSTER:-standalone}
TIERED_BROKERS_DEFAULT=${PULSAR_BROKERS_DEFAULT:-false}
EOF
}

spark_worker_env() {  # what the Spark daemons (and so the executors) get: no PYTHONPATH, no checkout
    cat <<EOF
PATH=$VENV/bin:/usr/bin:/bin
HOME=${HOME:-/root}
SPARK_LOCAL_IP=127.0.0.1
SPARK_HOME=$SITE/pyspark
PYSPARK_PYTHON=$STACK_DIR/bin/spark-python
AWS_ACCESS_KEY_ID=$S3_ACCESS_KEY
AWS_SECRET_ACCESS_KEY=$S3_SECRET_KEY
AWS_DEFAULT_REGION=$TOPOLOGY_S3_REGION
AWS_ENDPOINT_URL_S3=http://127.0.0.1:$S3_PORT
EOF
}

# -- processes ---------------------------------------------------------------------------------------

# start NAME PORT ENVFILE CMD...: in its own session (so its process group holds its children), its
# output in logs/NAME.log, its pid (= process group id) in pids/NAME.pid. ENVFILE '-' keeps this env.
start() {
    local name=$1 port=$2 envfile=$3
    shift 3
    if [ "$envfile" = "-" ]; then
        setsid "$@" >"$LOGS/$name.log" 2>&1 </dev/null &
    else
        local -a envs=()
        mapfile -t envs <"$envfile"
        setsid env -i "${envs[@]}" "$@" >"$LOGS/$name.log" 2>&1 </dev/null &
    fi
    echo "$! $port" >"$PIDS/$name.pid"
}

alive() { kill -0 "$1" 2>/dev/null; }

# wait_for NAME SECONDS CHECK...: until CHECK succeeds; fails naming the part and its log's tail
wait_for() {
    local name=$1 timeout=$2
    shift 2
    local pid deadline=$((SECONDS + timeout))
    pid=$(cut -d' ' -f1 "$PIDS/$name.pid" 2>/dev/null || true)
    until "$@" >/dev/null 2>&1; do
        if [ -n "$pid" ] && ! alive "$pid"; then
            echo "stack: $name exited; the end of $LOGS/$name.log:" >&2
            tail -n 30 "$LOGS/$name.log" >&2 || true
            return 1
        fi
        if [ "$SECONDS" -ge "$deadline" ]; then
            echo "stack: $name not ready within ${timeout}s; the end of $LOGS/$name.log:" >&2
            tail -n 30 "$LOGS/$name.log" >&2 || true
            return 1
        fi
        sleep 0.3
    done
}

zk_ok() { [ "$(exec 3<>"/dev/tcp/127.0.0.1/$ZOOKEEPER_PORT"; printf ruok >&3; head -c 4 <&3)" = imok ]; }
http_ok() { curl -fsS -o /dev/null --max-time 2 "$1"; }
log_has() { grep -q -- "$2" "$LOGS/$1.log"; }
workers_registered() { [ "$(grep -c 'Registering worker' "$LOGS/spark-master.log")" -ge "$TOPOLOGY_SPARK_WORKERS" ]; }

# the process group of every recorded pid plus any descendant that left it; newest part first
stop_all() {
    [ -d "$PIDS" ] || return 0
    local -a names=() pids=()
    local f
    for f in $(ls -t "$PIDS"/*.pid 2>/dev/null); do
        names+=("$(basename "$f" .pid)")
        pids+=("$(cut -d' ' -f1 "$f")")
    done
    [ "${#pids[@]}" -gt 0 ] || return 0
    local -a all=()
    local p
    for p in "${pids[@]}"; do
        all+=($(tree_of "$p"))
    done
    for p in "${pids[@]}"; do kill -TERM -- "-$p" 2>/dev/null || true; done
    for p in "${all[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    local deadline=$((SECONDS + 20))
    while [ "$SECONDS" -lt "$deadline" ]; do
        local left=0
        for p in "${all[@]}"; do alive "$p" && left=1; done
        [ "$left" = 0 ] && break
        sleep 0.2
    done
    for p in "${pids[@]}"; do kill -KILL -- "-$p" 2>/dev/null || true; done
    for p in "${all[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
    for f in "${names[@]}"; do
        echo "stack: stopped $f"
        rm -f "$PIDS/$f.pid"
    done
}

tree_of() {  # the pid, its process group's members and all its descendants
    local root=$1
    ps -e -o pid=,ppid=,pgid= | awk -v root="$root" '
        { pid[NR] = $1; ppid[NR] = $2; pgid[NR] = $3 }
        END {
            keep[root] = 1
            for (i = 1; i <= NR; i++) if (pgid[i] == root) keep[pid[i]] = 1
            do { changed = 0
                 for (i = 1; i <= NR; i++) if ((ppid[i] in keep) && !(pid[i] in keep)) { keep[pid[i]] = 1; changed = 1 }
            } while (changed)
            for (p in keep) print p
        }'
}

# -- commands ----------------------------------------------------------------------------------------

choose_ports() {
    local name var
    for name in POSTGRES REDIS ZOOKEEPER S3 SPARK_MASTER AIRFLOW_API; do
        var="TOPOLOGY_${name}_PORT"
        if [ "${STACK_PORTS:-}" = auto ]; then
            echo "${name}_PORT=$(free_port)"
        else
            if ! port_free "${!var}"; then
                echo "stack: port ${!var} ($name, docker/topology.env) is in use; STACK_PORTS=auto picks free ones" >&2
                return 1
            fi
            echo "${name}_PORT=${!var}"
        fi
    done
    echo "JWT_SECRET=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')"
    echo "S3_ACCESS_KEY=tiered"
    echo "S3_SECRET_KEY=$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')"
}

check_installed() {
    [ -x "$VENV/bin/python" ] || die "no virtualenv at $VENV (run scripts/setup.sh stack, or set TIERED_VENV)"
    [ -x "$PG_BIN/initdb" ] || die "PostgreSQL $TOPOLOGY_POSTGRES_VERSION is not installed ($PG_BIN/initdb): apt-get install postgresql"
    "$PG_BIN/postgres" --version | grep -q " $TOPOLOGY_POSTGRES_VERSION\." \
        || die "PostgreSQL $("$PG_BIN/postgres" --version) is not version $TOPOLOGY_POSTGRES_VERSION (docker/topology.env)"
    command -v redis-server >/dev/null || die "redis-server is not installed: apt-get install redis-server"
    redis-server --version | grep -q "v=$TOPOLOGY_REDIS_VERSION\." \
        || die "$(redis-server --version) is not Redis $TOPOLOGY_REDIS_VERSION (docker/topology.env)"
    ls /usr/share/java/zookeeper-"$TOPOLOGY_ZOOKEEPER_VERSION".*.jar >/dev/null 2>&1 \
        || die "ZooKeeper $TOPOLOGY_ZOOKEEPER_VERSION is not installed (/usr/share/java/zookeeper-$TOPOLOGY_ZOOKEEPER_VERSION.*.jar): apt-get install zookeeper"
    command -v java >/dev/null || die "java is not installed: apt-get install openjdk-17-jre-headless"
    SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    local v
    v=$(PYTHONPATH= "$VENV/bin/python" -S -c 'import sys; sys.path.append(sys.argv[1]); import pyspark; print(pyspark.__version__)' "$SITE")
    [ "$v" = "$TOPOLOGY_SPARK_VERSION" ] || die "pyspark $v in $VENV is not Spark $TOPOLOGY_SPARK_VERSION (docker/topology.env)"
}

pg_as_owner() {  # run a PostgreSQL program as the data directory's owner (initdb refuses root)
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

cmd_up() {
    load_topology
    if [ -d "$PIDS" ] && ls "$PIDS"/*.pid >/dev/null 2>&1; then
        die "a stack is already recorded in $STACK_DIR (scripts/stack.sh status / down)"
    fi
    check_installed
    mkdir -p "$PIDS" "$LOGS" "$STACK_DIR/bin" "$STACK_DIR/data/hot" "$STACK_DIR/data/reports" "$STACK_DIR/airflow"
    choose_ports >"$STATE" || { rm -f "$STATE"; exit 1; }
    printf 'SITE=%s\nVENV=%s\n' "$SITE" "$VENV" >>"$STATE"
    # shellcheck disable=SC1090
    . "$STATE"
    UP_DONE=0
    trap 'if [ "$UP_DONE" = 0 ]; then echo "stack: up failed; stopping what was started" >&2; cmd_down >&2; fi' EXIT

    # executors' python: the venv's interpreter without site hooks (no editable install, no checkout)
    cat >"$STACK_DIR/bin/spark-python" <<EOF
#!/bin/sh
# the venv's python for Spark (stack.sh): -S skips site hooks (the editable install's path finder),
# site-packages come in through PYTHONPATH; the project only from the --py-files zip
PYTHONPATH="\${PYTHONPATH:+\$PYTHONPATH:}$SITE"
export PYTHONPATH
exec "$VENV/bin/python" -S "\$@"
EOF
    chmod +x "$STACK_DIR/bin/spark-python"
    PYTHON="$VENV/bin/python" "$REPO/scripts/build_pyfiles.sh" "$STACK_DIR/tiered-pyfiles.zip" >/dev/null

    # PostgreSQL: initdb and the server as the postgres user when root (data in a directory it owns)
    local pgdata="$STACK_DIR/postgres"
    if [ "$(id -u)" = 0 ]; then
        # the state directory may sit under a private parent (e.g. pytest's tmp): give postgres its own
        pgdata=$(mktemp -d /tmp/tiered-stack-pg.XXXXXX)
        chown postgres: "$pgdata"
        ln -sfn "$pgdata" "$STACK_DIR/postgres"
    fi
    pg_as_owner "$PG_BIN/initdb" -D "$pgdata" -U "$TOPOLOGY_AIRFLOW_DB_USER" --auth=trust -E UTF8 \
        >"$LOGS/initdb.log" 2>&1 || { cat "$LOGS/initdb.log" >&2; die "initdb failed"; }
    local runas=()
    [ "$(id -u)" = 0 ] && runas=(runuser -u postgres --)
    start postgres "$POSTGRES_PORT" - "${runas[@]}" "$PG_BIN/postgres" -D "$pgdata" -h 127.0.0.1 \
        -p "$POSTGRES_PORT" -k "$pgdata" -c fsync=off -c max_connections=200

    start redis "$REDIS_PORT" - redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --save '' \
        --appendonly no --dir "$STACK_DIR"

    mkdir -p "$STACK_DIR/zookeeper/data"
    cat >"$STACK_DIR/zookeeper/zoo.cfg" <<EOF
dataDir=$STACK_DIR/zookeeper/data
clientPort=$ZOOKEEPER_PORT
clientPortAddress=127.0.0.1
tickTime=500
maxSessionTimeout=60000
admin.enableServer=false
4lw.commands.whitelist=*
maxClientCnxns=200
EOF
    start zookeeper "$ZOOKEEPER_PORT" - java -Xmx256m -Dzookeeper.admin.enableServer=false -cp "$ZK_CP" \
        org.apache.zookeeper.server.ZooKeeperServerMain "$STACK_DIR/zookeeper/zoo.cfg"

    start s3 "$S3_PORT" - "$VENV/bin/moto_server" -H 127.0.0.1 -p "$S3_PORT"

    spark_worker_env >"$STACK_DIR/spark.env"
    # the daemons are long-lived but idle: small heaps, the serial collector
    printf 'SPARK_DAEMON_MEMORY=256m\nSPARK_DAEMON_JAVA_OPTS=-XX:+UseSerialGC\n' >>"$STACK_DIR/spark.env"
    local master_ui worker_ui i
    master_ui=$(free_port)
    start spark-master "$SPARK_MASTER_PORT" "$STACK_DIR/spark.env" "$VENV/bin/spark-class" \
        org.apache.spark.deploy.master.Master --host 127.0.0.1 --port "$SPARK_MASTER_PORT" --webui-port "$master_ui"
    for i in $(seq 1 "$TOPOLOGY_SPARK_WORKERS"); do
        mkdir -p "$STACK_DIR/spark/worker-$i"
        worker_ui=$(free_port)
        start "spark-worker-$i" "" "$STACK_DIR/spark.env" "$VENV/bin/spark-class" \
            org.apache.spark.deploy.worker.Worker "spark://127.0.0.1:$SPARK_MASTER_PORT" --host 127.0.0.1 \
            --cores "$TOPOLOGY_SPARK_WORKER_CORES" --memory "$TOPOLOGY_SPARK_WORKER_MEMORY" \
            --webui-port "$worker_ui" --work-dir "$STACK_DIR/spark/worker-$i"
    done

    # Airflow: the database first (migrate), then its four processes
    wait_for postgres 60 "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$POSTGRES_PORT"
    pg_as_owner "$PG_BIN/createdb" -h 127.0.0.1 -p "$POSTGRES_PORT" -U "$TOPOLOGY_AIRFLOW_DB_USER" \
        "$TOPOLOGY_AIRFLOW_DB_NAME" 2>/dev/null || true  # initdb -U airflow made a database of that name
    airflow_env >"$STACK_DIR/airflow.env"
    local password
    password=$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')
    echo "{\"admin\": \"$password\"}" >"$STACK_DIR/airflow/passwords.json"
    local -a afenv=()
    mapfile -t afenv <"$STACK_DIR/airflow.env"
    (cd "$STACK_DIR" && env -i "${afenv[@]}" "$VENV/bin/airflow" db migrate) >"$LOGS/airflow-migrate.log" 2>&1 \
        || { tail -n 30 "$LOGS/airflow-migrate.log" >&2; die "airflow db migrate failed (log $LOGS/airflow-migrate.log)"; }
    start airflow-api-server "$AIRFLOW_API_PORT" "$STACK_DIR/airflow.env" "$VENV/bin/airflow" api-server
    start airflow-scheduler "" "$STACK_DIR/airflow.env" "$VENV/bin/airflow" scheduler
    start airflow-dag-processor "" "$STACK_DIR/airflow.env" "$VENV/bin/airflow" dag-processor
    start airflow-celery-worker "" "$STACK_DIR/airflow.env" "$VENV/bin/airflow" celery worker \
        --concurrency "$AIRFLOW__CELERY__WORKER_CONCURRENCY"
    # the pool every spark-submit task of the DAGs runs in (as compose's airflow-init creates it)
    (cd "$STACK_DIR" && env -i "${afenv[@]}" "$VENV/bin/airflow" pools set "$TIERED_SPARK_POOL" \
        "${TIERED_SPARK_POOL_SLOTS}" "spark-submit tasks of the tiered-storage DAGs") >"$LOGS/airflow-pool.log" 2>&1 \
        || { tail -n 30 "$LOGS/airflow-pool.log" >&2; die "creating the Airflow pool $TIERED_SPARK_POOL failed"; }

    wait_for redis 30 redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping
    wait_for zookeeper 30 zk_ok
    wait_for s3 30 http_ok "http://127.0.0.1:$S3_PORT/"
    env AWS_ACCESS_KEY_ID="$S3_ACCESS_KEY" AWS_SECRET_ACCESS_KEY="$S3_SECRET_KEY" "$VENV/bin/python" -c '
import sys, boto3
boto3.client("s3", endpoint_url=sys.argv[1], region_name=sys.argv[2]).create_bucket(Bucket=sys.argv[3])
' "http://127.0.0.1:$S3_PORT" "$TOPOLOGY_S3_REGION" "$TOPOLOGY_BUCKET"
    wait_for spark-master 60 log_has spark-master "I have been elected leader"
    wait_for spark-master 90 workers_registered
    wait_for airflow-api-server 120 http_ok "http://127.0.0.1:$AIRFLOW_API_PORT/api/v2/monitor/health"
    wait_for airflow-scheduler 120 log_has airflow-scheduler "Starting the scheduler"
    wait_for airflow-dag-processor 120 log_has airflow-dag-processor "DagFileProcessorManager\|Processing files"
    wait_for airflow-celery-worker 120 log_has airflow-celery-worker "ready\."
    UP_DONE=1
    echo "stack: up in $STACK_DIR (logs in $LOGS)"
    echo "stack: Airflow http://127.0.0.1:$AIRFLOW_API_PORT (admin / $password), Spark spark://127.0.0.1:$SPARK_MASTER_PORT (UI http://127.0.0.1:$master_ui)"
    echo "stack: eval \"\$(scripts/stack.sh env)\" to use it"
}

cmd_down() {
    stop_all
    local pg
    if [ -L "$STACK_DIR/postgres" ]; then  # the data directory up made for the postgres user (root)
        pg=$(readlink "$STACK_DIR/postgres")
        case "$pg" in /tmp/tiered-stack-pg.*) rm -rf "$pg" ;; esac
        rm -f "$STACK_DIR/postgres"
    fi
    rm -f "$STATE"
}

cmd_status() {
    [ -d "$PIDS" ] && ls "$PIDS"/*.pid >/dev/null 2>&1 || { echo "stack: nothing recorded in $STACK_DIR"; return 3; }
    local f name pid port down=0
    printf '%-24s %-8s %-8s %-6s %s\n' PART PID STATE PORT LOG
    for f in "$PIDS"/*.pid; do
        name=$(basename "$f" .pid)
        read -r pid port <"$f" || true
        if alive "$pid"; then state=running; else state=stopped; down=1; fi
        printf '%-24s %-8s %-8s %-6s %s\n' "$name" "$pid" "$state" "${port:--}" "$LOGS/$name.log"
    done
    return "$down"
}

cmd_env() {
    load_topology
    if [ -f "$STATE" ]; then
        # shellcheck disable=SC1090
        . "$STATE"
    else  # what `up` would give (tests/test_compose.py compares it with docker-compose.yaml)
        echo "stack: not up in $STACK_DIR: docker/topology.env's ports; secrets are chosen by up" >&2
        local name var
        for name in POSTGRES REDIS ZOOKEEPER S3 SPARK_MASTER AIRFLOW_API; do
            var="TOPOLOGY_${name}_PORT"
            printf -v "${name}_PORT" '%s' "${!var}"
        done
        JWT_SECRET=chosen-by-up S3_ACCESS_KEY=tiered S3_SECRET_KEY=chosen-by-up
    fi
    local line
    while IFS= read -r line; do
        printf 'export %s=%q\n' "${line%%=*}" "${line#*=}"
    done < <(airflow_env)
    # the S3 server's credentials for the user's own clients (Airflow gets them through its connection)
    printf 'export %s=%q\n' AIRFLOW_API_URL "http://127.0.0.1:$AIRFLOW_API_PORT" TIERED_STACK_DIR "$STACK_DIR" \
        AWS_ACCESS_KEY_ID "$S3_ACCESS_KEY" AWS_SECRET_ACCESS_KEY "$S3_SECRET_KEY" AWS_DEFAULT_REGION "$TOPOLOGY_S3_REGION"
}

case "${1:-}" in
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    env) cmd_env ;;
    *) echo "usage: scripts/stack.sh up|down|status|env" >&2; exit 2 ;;
esac
