"""docker-compose.yaml started for real: a private dockerd, the project's images built on a Debian base
made with debootstrap (no registry is reachable), PostgreSQL / Redis / ZooKeeper from Debian packages and
moto's S3 server in place of MinIO (tests/compose/docker-compose.test.yaml, host networking: all traffic
on 127.0.0.1), then the offload sweep triggered through Airflow's API and its results checked from
outside (the bucket's objects against the formats) and inside (``tiered verify`` in the Airflow worker).
Finally ``docker-compose down -v`` must leave no container, network or volume.

Ports: the containers bind docker/topology.env's ports on 127.0.0.1 (5432, 6379, 2181, 9000, 7077, 8080)
plus 8090 (Spark master UI), 8081-8082 (worker UIs) and 8974 (the scheduler's health check). The other
tests (including tests/stack, STACK_PORTS=auto) take kernel-chosen ephemeral ports (32768 and up), which
never fall on these; the one that holds 5432 on purpose (tests/stack/test_stack_bad_input.py) shares a
lock with this test's stack from `up` to `down` (tests/support/topology_ports.py). The test fails naming
a port that is taken rather than racing for it.

Time: the first run builds the Debian base (debootstrap) and caches it (TIERED_COMPOSE_CACHE, default
~/.cache/tiered-compose); every run builds the project's images in a fresh daemon. The phases are printed.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import socket
import subprocess
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import pytest
import yaml

from tests.compose import harness
from tests.compose.harness import Compose, DockerError
from tests.stack.test_stack import Api
from tests.support.topology_ports import topology_ports
from tests.support.workspaces import build_workspace
from tieredcore.config import Config
from tieredcore.workspace import Workspace

pytestmark = [pytest.mark.compose, pytest.mark.slow]

NAMESPACE = "compose/demo"
TOPICS, LEDGERS, ENTRIES = 2, 2, 10
END = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
SWEEP_AT = END + dt.timedelta(minutes=15)
LONG_RUNNING = {"postgres", "redis", "zookeeper", "minio", "spark-master", "spark-worker", "airflow-apiserver",
                "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer", "airflow-worker"}
PORTS = (5432, 6379, 2181, 9000, 7077, 8080, 8090, 8081, 8082, 8974)
S3_USER, S3_PASSWORD = "minioadmin", "minioadmin"
UP_DEADLINE_S = 600
RUN_DEADLINE_S = 420


def port_taken(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def start_stack(compose: Compose, timings: dict[str, float], ports: ExitStack) -> None:
    """Build the images, `up -d`, wait for every health check and for airflow-init's success: what must
    hold before anything is triggered. A DockerError names what failed (the build's, compose's or the
    health check's output; a failed init's log)."""
    t = time.monotonic()
    # one service per image: the other Airflow services and the second Spark one use the same tags
    compose("build", "airflow-init", "spark-master", "minio", timeout=1800)
    timings["build images"] = round(time.monotonic() - t, 1)
    t = time.monotonic()
    ports.enter_context(topology_ports())  # held until the stack is down (the caller's ExitStack)
    taken = [p for p in PORTS if port_taken(p)]
    assert not taken, f"127.0.0.1 ports the compose stack binds are in use: {taken}"
    compose.up(time.monotonic() + UP_DEADLINE_S)
    compose.wait_healthy(LONG_RUNNING, time.monotonic() + UP_DEADLINE_S)
    init = [c for c in compose.containers() if c["Config"]["Labels"]["com.docker.compose.service"] == "airflow-init"]
    assert init and all(c["State"]["Status"] == "exited" and c["State"]["ExitCode"] == 0 for c in init), \
        [c["State"] for c in init]
    timings["up until healthy"] = round(time.monotonic() - t, 1)


def stop_stack(compose: Compose) -> dict[str, list[str]]:
    compose("down", "-v", "--remove-orphans", "--timeout", "20", timeout=300)
    return compose.leftovers()


@pytest.fixture(scope="module")
def docker():
    """A private dockerd with the cached base image imported; its set-up times."""
    timings: dict[str, float] = {}
    t = time.monotonic()
    with harness.daemon() as d:
        timings["dockerd"] = round(time.monotonic() - t, 1)
        t = time.monotonic()
        base, built = harness.base_image(d)
        timings["base image (debootstrap, cached for later runs)" if built else "base image (from cache)"] = \
            round(time.monotonic() - t, 1)
        yield d, base, timings


def compose_for(docker, project_dir: Path, name: str, **env: str) -> Compose:
    d, base, _ = docker
    return Compose(d, project_dir, name, {
        "TIERED_BASE_IMAGE": base, "TIERED_TEST_BASE": base, "TIERED_TEST_KEY": harness.base_key(),
        "TIERED_TEST_HOSTNAME": socket.gethostname(), "AIRFLOW_UID": "50000", "MINIO_ROOT_USER": S3_USER, "MINIO_ROOT_PASSWORD": S3_PASSWORD, **env})


@pytest.mark.timeout(3600)
def test_offload_sweep_on_the_compose_stack(docker, tmp_path, monkeypatch, capsys):
    d, base, timings = docker
    started = time.monotonic()
    password = uuid.uuid4().hex[:16]
    project = harness.copy_project(tmp_path / "project")
    compose = compose_for(docker, project, "tieredcompose", _AIRFLOW_WWW_USER_USERNAME="admin",
                          _AIRFLOW_WWW_USER_PASSWORD=password)
    ports = ExitStack()
    try:
        start_stack(compose, timings, ports)
        states = compose.wait_healthy(LONG_RUNNING, time.monotonic() + 60)
        assert sum(1 for n in states if "spark-worker" in n) == 2, states  # deploy.replicas

        # the workspace, written from the host into the stack's stores: ZooKeeper and moto on loopback,
        # the hot tier on the shared volume (owned by the containers' uid afterwards)
        t = time.monotonic()
        volume = json.loads(d.docker("volume", "inspect", "tieredcompose_tiered-data").stdout)[0]["Mountpoint"]
        for k, v in (("AWS_ACCESS_KEY_ID", S3_USER), ("AWS_SECRET_ACCESS_KEY", S3_PASSWORD),
                     ("AWS_DEFAULT_REGION", "us-east-1")):
            monkeypatch.setenv(k, v)
        overrides = {"metadata_url": "zk://127.0.0.1:2181/tiered-storage",
                     "store_url": "s3://tiered-offload/?endpoint=http://127.0.0.1:9000&region=us-east-1",
                     "hot_url": f"file://{volume}/hot", "reports_dir": f"{volume}/reports"}
        cfg_path = build_workspace(tmp_path / "ws", [NAMESPACE], topics=TOPICS, ledgers=LEDGERS, entries=ENTRIES,
                                   end=END.isoformat(), config_overrides=overrides, messages=True)
        config = Config.load(cfg_path, env={})
        with Workspace(config) as ws:
            ws.policies.set_namespace(NAMESPACE, {"offload_threshold_bytes": 0, "deletion_lag_ms": 30 * 60_000})
            topics = [t.full for t in ws.ml.list_topics(NAMESPACE)]
        assert len(topics) == TOPICS
        subprocess.run(["chown", "-R", "50000:0", volume], check=True)
        timings["workspace"] = round(time.monotonic() - t, 1)

        # the sweep, triggered through the API server; the Celery worker runs it, spark-submit goes to the cluster
        t = time.monotonic()
        deadline = time.monotonic() + RUN_DEADLINE_S
        api = Api("http://127.0.0.1:8080", password)
        api.wait_for_dag("tiered_offload_sweep", deadline)
        run = api.trigger("tiered_offload_sweep", SWEEP_AT, {})
        tis = api.wait(run, deadline, project / "logs")
        assert ("offload", "success") in {(ti["task_id"], ti["state"]) for ti in tis}, tis
        timings["sweep run"] = round(time.monotonic() - t, 1)

        # the master ran the sweep's application with executors on both workers
        master_log = compose.logs("spark-master")
        app = re.search(r"Registered app tiered-offload_sweep with ID (app-\S+)", master_log)
        assert app, master_log[-3000:]
        on = set(re.findall(rf"Launching executor {re.escape(app.group(1))}/\d+ on worker (worker-\S+)", master_log))
        master = json.loads(d.docker("exec", container_of(compose, "spark-master"), "curl", "-fsS",
                                     "http://127.0.0.1:8090/json/").stdout)
        workers = {w["id"] for w in master["workers"] if w["state"] == "ALIVE"}
        assert len(workers) == 2 and on == workers, (on, workers)
        assert app.group(1) in {a["id"] for a in master["completedapps"]}

        # the bucket: each sealed ledger as Pulsar's data and index objects, structurally valid
        check_bucket(config, topics)

        # tiered verify inside the Airflow worker (its own configuration: zk://zookeeper, s3 on minio). The
        # Airflow containers have no S3 credentials of their own (the DAGs hand the aws_default
        # connection's to the drivers), so the command gets them as a user would (docs/deploy.md)
        r = compose("exec", "-T", "-e", f"AWS_ACCESS_KEY_ID={S3_USER}", "-e", f"AWS_SECRET_ACCESS_KEY={S3_PASSWORD}",
                    "airflow-worker", "tiered", "--json", "verify", check=False, timeout=300)
        assert r.returncode == 0, f"tiered verify: exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        res = json.loads(r.stdout)
        rows = {row["topic"]: row for row in res["topics"]}
        assert set(rows) == set(topics) and all(row["ok"] is True for row in rows.values()), res
        assert res["failed"] == 0 and res["verified"] == TOPICS and not res["fallbacks"], res
    finally:
        t = time.monotonic()
        with ports:
            left = stop_stack(compose)
        timings["down -v"] = round(time.monotonic() - t, 1)
    assert left == {"containers": [], "networks": [], "volumes": []}, left
    timings["test total (without dockerd and base)"] = round(time.monotonic() - started, 1)
    with capsys.disabled():
        print(f"\ncompose test: {timings}")


def container_of(compose: Compose, service: str) -> str:
    ids = [c["Id"] for c in compose.containers(all_=False)
           if c["Config"]["Labels"]["com.docker.compose.service"] == service]
    assert ids, f"no running {service} container"
    return ids[0]


def check_bucket(config: Config, topics: list[str]) -> None:
    """Every sealed ledger offloaded: its data object and index under Pulsar's keys
    ({uuid}-ledger-{id}, -index), the index valid against the data object, every entry in it."""
    from tieredcore.cold.blob import iter_objects
    from tieredcore.formats.block import iter_data_object
    from tieredcore.formats.index import check_index_v1, parse_index_v1
    from tieredcore.formats.keys import is_topic_manifest_key
    from tieredcore.offload.context import context_uuid

    with Workspace(config) as ws:
        keys = {o.key for o in iter_objects(ws.store)
                if not o.key.startswith("tiered-owner.") and not is_topic_manifest_key(o.key, "")}
        expected = set()
        for t in topics:
            info, _ = ws.ml.get_topic(t)
            for li in info.ledgerInfo[:-1]:
                # offloaded; the hot copy stays until the namespace's deletion lag has passed (the lag
                # cleanup's job, not triggered here)
                assert li.offloadContext.complete and not li.offloadContext.bookkeeperDeleted, (t, li.ledgerId)
                data_key = f"{context_uuid(li)}-ledger-{li.ledgerId}"
                expected |= {data_key, f"{data_key}-index"}
                data = ws.store.get(data_key)
                index = parse_index_v1(ws.store.get(f"{data_key}-index"), li.ledgerId)
                check_index_v1(index, len(data), expected_last_entry_id=li.entries - 1)
                ids = [entry_id for entry_id, _ in iter_data_object(data, index)]
                assert ids == list(range(li.entries)) and li.entries == ENTRIES, (t, li.ledgerId, ids)
        assert keys == expected, keys ^ expected


@pytest.mark.timeout(1800)
def test_a_broken_entrypoint_fails_the_start(docker, tmp_path):
    """The helper the test relies on reports failure: the Airflow image with an entrypoint that exits 3
    (a temporary copy of the project) makes airflow-init fail, and start_stack says so."""
    project = harness.copy_project(tmp_path / "project")
    (project / "docker" / "airflow-entrypoint.sh").write_text("#!/bin/bash\necho 'broken entrypoint' >&2\nexit 3\n")
    compose = compose_for(docker, project, "tieredcomposebroken",
                          AIRFLOW_IMAGE_NAME="tiered-storage-airflow:broken-entrypoint")
    message = failed_start(compose)
    assert "airflow-init" in message and "broken entrypoint" in message, message


def failed_start(compose: Compose, while_up: Callable[[Compose], None] = lambda _c: None) -> str:
    """start_stack must fail: its DockerError's message, once ``while_up`` has looked at what the failed
    start left and ``down -v`` has removed all of it (asserted)."""
    ports = ExitStack()
    try:
        with pytest.raises(DockerError) as failed:
            start_stack(compose, {}, ports)
        while_up(compose)
    finally:
        with ports:
            left = stop_stack(compose)
    assert left == {"containers": [], "networks": [], "volumes": []}, left
    return str(failed.value)


@pytest.mark.timeout(1800)
def test_an_image_that_does_not_build_fails_the_start(docker, tmp_path):
    """A Spark image whose last build step fails (a temporary copy of the project): start_stack stops at
    the build, names the failing step's output, and nothing was started."""
    project = harness.copy_project(tmp_path / "project")
    dockerfile = project / "docker" / "spark.Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + "\nRUN echo 'broken build step' >&2; exit 7\n")
    compose = compose_for(docker, project, "tieredcomposenobuild",
                          SPARK_IMAGE_NAME="tiered-storage-spark:broken-build")

    def nothing_started(c: Compose) -> None:
        assert c.containers() == []

    message = failed_start(compose, nothing_started)
    assert " build " in message and "broken build step" in message, message


@pytest.mark.timeout(1800)
def test_a_failing_health_check_fails_the_start(docker, tmp_path):
    """Redis's health check made to fail (its resolved compose file edited in a temporary copy): the
    services depending on it never start and start_stack fails naming redis as unhealthy, with the
    check's output."""
    project = harness.copy_project(tmp_path / "project")
    compose = compose_for(docker, project, "tieredcomposeunhealthy")
    resolved = compose.resolved()
    config = yaml.safe_load(resolved.read_text())
    config["services"]["redis"]["healthcheck"] = {
        "test": ["CMD-SHELL", "echo 'redis check broken'; exit 1"],
        "interval": "2s", "timeout": "10s", "start_period": "0s", "retries": 2}
    resolved.write_text(yaml.safe_dump(config, sort_keys=False))

    def airflow_never_started(c: Compose) -> None:
        running = {x["Config"]["Labels"]["com.docker.compose.service"] for x in c.containers(all_=False)}
        assert not running & {"airflow-scheduler", "airflow-worker", "airflow-apiserver"}, running

    message = failed_start(compose, airflow_never_started)
    assert "redis" in message and "unhealthy" in message and "redis check broken" in message, message
