"""Structure of the scale-out stack (docker-compose.yaml, docker/*.Dockerfile).

What can be checked by reading the files: the official Airflow 3 layout, healthchecks, dependencies,
mounts, connection variables (resolved by the real Airflow providers), the tieredcore configuration the
containers get (loaded by tieredcore itself), pinned images, Dockerfiles consistent with pyproject.toml,
syntax Debian's docker-compose 1.29.2 parses, and one topology with scripts/stack.sh. tests/compose/
starts the stack for real with Docker.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
import yaml

from tieredcore.config import Config

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yaml"

AIRFLOW_SERVICES = {
    "airflow-apiserver": "api-server",
    "airflow-scheduler": "scheduler",
    "airflow-dag-processor": "dag-processor",
    "airflow-triggerer": "triggerer",
    "airflow-worker": "celery worker",
}
SPARK_SERVICES = ("spark-master", "spark-worker")
REQUIRED = {
    "postgres", "redis", *AIRFLOW_SERVICES, "airflow-init", "spark-master", "spark-worker", "zookeeper", "minio",
    "minio-init",
}
TOPOLOGY = ROOT / "docker" / "topology.env"
STACK = ROOT / "scripts" / "stack.sh"
ONE_SHOT = {"airflow-init", "minio-init"}
CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}

# -- compose interpolation (the subset compose defines: $$, $VAR, ${VAR}, ${VAR:-d}, ${VAR-d}, ${VAR:?e}) --

_VAR = re.compile(r"\$(?:(\$)|\{([A-Za-z_][A-Za-z0-9_]*)(?:(:-|-|:\?|\?)([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


def interpolate(value: Any, env: dict[str, str]) -> Any:
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match[str]) -> str:
        if m.group(1):
            return "$"
        name, op, arg = m.group(2) or m.group(5), m.group(3), m.group(4)
        val = env.get(name)
        if op == ":-":
            return val if val else arg
        if op == "-":
            return arg if val is None else val
        if op in (":?", "?"):
            if not val:
                raise AssertionError(f"${{{name}}} is required: {arg}")
            return val
        return val or ""

    return _VAR.sub(sub, value)


def load(env: dict[str, str] | None = None) -> dict[str, Any]:
    raw = yaml.safe_load(COMPOSE.read_text())  # resolves the x-* anchors and << merges
    return interpolate(raw, env or {})


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load()


@pytest.fixture(scope="module")
def services(compose) -> dict[str, dict[str, Any]]:
    return compose["services"]


@pytest.fixture(scope="module")
def project() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def pins(project: dict[str, Any]) -> dict[str, str]:
    out = {}
    deps = list(project["project"]["dependencies"])
    for extra in project["project"]["optional-dependencies"].values():
        deps += extra
    for d in deps:
        m = re.fullmatch(r"([A-Za-z0-9_.\-\[\]]+)==([^\s;]+)", d)
        if m:
            out[m.group(1).split("[")[0].lower()] = m.group(2)
    return out


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines (comments and blank lines skipped), as compose's env_file and stack.sh read them."""
    out = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, sep, value = line.partition("=")
            assert sep and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key), f"{path}: bad line {line!r}"
            out[key] = value
    return out


def env_of(service: dict[str, Any]) -> dict[str, str]:
    """The container's environment: its env_file(s) (those that exist), then `environment` over them."""
    out: dict[str, str] = {}
    for ef in service.get("env_file") or []:
        path = ROOT / (ef["path"] if isinstance(ef, dict) else ef)
        if path.is_file():
            out.update(read_env_file(path))
        else:
            assert isinstance(ef, dict) and ef.get("required") is False, f"env_file {path} is missing"
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(e.split("=", 1) for e in env)
    out.update({k: "" if v is None else str(v) for k, v in env.items()})
    return out


def mounts(service: dict[str, Any]) -> dict[str, str]:
    """target -> source for the service's short-syntax volumes."""
    out = {}
    for v in service.get("volumes") or []:
        assert isinstance(v, str), f"long-syntax volume not expected: {v}"
        parts = v.split(":")
        assert len(parts) in (2, 3), v
        out[parts[1]] = parts[0]
    return out


def is_long_running(name: str, svc: dict[str, Any], services: dict[str, Any]) -> bool:
    if svc.get("profiles"):  # started only on request (airflow-cli, flower)
        return False
    awaited_to_complete = any(
        (dep.get("depends_on") or {}).get(name, {}).get("condition") == "service_completed_successfully"
        for dep in services.values()
        if isinstance(dep.get("depends_on"), dict)
    )
    return not awaited_to_complete


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    logical, buf = [], ""
    for line in path.read_text().splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        logical.append(buf + line)
        buf = ""
    assert not buf, f"{path}: dangling continuation"
    out = []
    for stmt in logical:
        word, _, rest = stmt.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def dockerfile_of(svc: dict[str, Any]) -> Path:
    build = svc["build"]
    context = ROOT / build.get("context", ".")
    return context / build.get("dockerfile", "Dockerfile")


def image_ref_ok(ref: str) -> bool:
    """A reference with an explicit tag that is not `latest` (a digest pin is fine too)."""
    if "@sha256:" in ref:
        return True
    last = ref.rsplit("/", 1)[-1]
    return ":" in last and last.split(":", 1)[1] not in ("", "latest")


# -- services and the official Airflow 3 layout ---------------------------------------------------------


def test_required_services_present(services):
    assert set(services) >= REQUIRED, REQUIRED - set(services)


def test_airflow_services_follow_the_official_layout(services):
    images = {services[n]["image"] for n in [*AIRFLOW_SERVICES, "airflow-init"]}
    assert len(images) == 1, images
    for name, command in AIRFLOW_SERVICES.items():
        svc = services[name]
        assert svc["command"] == command, name
        env = env_of(svc)
        assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
        assert urlparse(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]).hostname == "postgres"
        assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql")
        assert urlparse(env["AIRFLOW__CELERY__BROKER_URL"]).hostname == "redis"
        assert urlparse(env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"]).netloc == "airflow-apiserver:8080"
        assert env["AIRFLOW__API_AUTH__JWT_SECRET"], "all components must share one JWT secret"
        # the SimpleAuthManager, as stack.sh (the image has no FAB provider)
        assert env["AIRFLOW__CORE__AUTH_MANAGER"].endswith(".SimpleAuthManager")
        assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"] == "airflow:admin"
        assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"].startswith("/opt/airflow/config/")
        assert svc["user"] == "50000:0"
    assert "8080:8080" in services["airflow-apiserver"]["ports"]
    init = services["airflow-init"]
    assert env_of(init)["_AIRFLOW_DB_MIGRATE"] == "true"
    assert env_of(init)["_AIRFLOW_WWW_USER_CREATE"] == "true"
    assert env_of(init)["_AIRFLOW_WWW_USER_USERNAME"] == "airflow"
    assert init["user"] == "0:0"
    script = "\n".join(init["command"])
    assert "/data/tiered" in script and "chown" in script  # the shared volume gets the Airflow uid
    assert "/entrypoint airflow version" in script  # the entrypoint's migrate and admin password steps
    # the pool every spark-submit task of the DAGs runs in (dags/tiered_common.py SPARK_POOL)
    # (name and slots: the container's TIERED_SPARK_POOL / _SLOTS, from docker/topology.env)
    assert '\nairflow pools set "${TIERED_SPARK_POOL:-spark}" "${TIERED_SPARK_POOL_SLOTS:-2}" ' in script
    assert (env_of(init)["TIERED_SPARK_POOL"], env_of(init)["TIERED_SPARK_POOL_SLOTS"]) == ("spark", "2")
    # the apiserver, scheduler, dag-processor, triggerer and worker wait for the init
    for name in AIRFLOW_SERVICES:
        deps = services[name]["depends_on"]
        assert deps["airflow-init"]["condition"] == "service_completed_successfully", name
        assert deps["postgres"]["condition"] == deps["redis"]["condition"] == "service_healthy", name


def test_long_running_services_have_healthchecks(services):
    long_running = {n for n, s in services.items() if is_long_running(n, s, services)}
    assert long_running >= {"postgres", "redis", *AIRFLOW_SERVICES, *SPARK_SERVICES, "minio"}
    assert not long_running & ONE_SHOT
    for name in sorted(long_running):
        hc = services[name].get("healthcheck")
        assert hc, f"{name}: no healthcheck"
        test = hc["test"]
        assert isinstance(test, list) and test[0] in ("CMD", "CMD-SHELL") and len(test) >= 2, name
        assert all(isinstance(t, str) and t for t in test), name
        assert not hc.get("disable"), name
        assert hc.get("interval") and hc.get("retries"), name
        assert services[name].get("restart") == "always", f"{name}: a long-running service restarts"
    for name in ONE_SHOT:
        assert services[name].get("restart") in (None, "no"), f"{name} is one-shot"


def test_depends_on_references_existing_services(services):
    for name, svc in services.items():
        deps = svc.get("depends_on") or {}
        assert isinstance(deps, dict), f"{name}: depends_on needs conditions"
        for target, spec in deps.items():
            assert target in services, f"{name} depends on unknown service {target}"
            assert target != name
            cond = spec["condition"]
            assert cond in CONDITIONS, (name, target, cond)
            if cond == "service_healthy":
                assert services[target].get("healthcheck"), f"{name} waits for {target} to be healthy"
            if cond == "service_completed_successfully":
                assert not is_long_running(target, services[target], services)
    # no cycles
    state: dict[str, int] = {}

    def visit(n: str, path: list[str]) -> None:
        if state.get(n) == 2:
            return
        assert state.get(n) != 1, f"dependency cycle: {' -> '.join([*path, n])}"
        state[n] = 1
        for t in services[n].get("depends_on") or {}:
            visit(t, [*path, n])
        state[n] = 2

    for n in services:
        visit(n, [])
    w = services["airflow-worker"]["depends_on"]
    assert w["spark-master"]["condition"] == "service_healthy"
    assert w["minio-init"]["condition"] == "service_completed_successfully"
    assert services["spark-worker"]["depends_on"]["spark-master"]["condition"] == "service_healthy"
    assert services["minio-init"]["depends_on"]["minio"]["condition"] == "service_healthy"


def test_named_volumes_declared_and_bind_sources_exist(compose, services):
    declared = set(compose.get("volumes") or {})
    for name, svc in services.items():
        for target, source in mounts(svc).items():
            assert PurePosixPath(target).is_absolute(), (name, target)
            if source.startswith((".", "/")):
                # ./logs and ./config are created by docker and airflow-init at first start
                if source not in ("./logs", "./config"):
                    assert (ROOT / source).exists(), f"{name}: bind source {source} missing"
            else:
                assert source in declared, f"{name}: volume {source} not declared"


# -- the project inside the containers ---------------------------------------------------------------------


def test_airflow_services_mount_dags_plugins_jobs_and_package(services):
    for name in [*AIRFLOW_SERVICES, "airflow-init"]:
        m = mounts(services[name])
        for d in ("dags", "plugins", "spark_jobs", "tieredcore"):
            assert m.get(f"/opt/airflow/{d}") == f"./{d}", f"{name}: ./{d} not mounted"
        env = env_of(services[name])
        # the mounted package is importable (and wins over the image's copy)
        assert "/opt/airflow" in env["PYTHONPATH"].split(":"), name
        assert env["TIERED_SPARK_JOBS_DIR"] == "/opt/airflow/spark_jobs"
        for job in ("offload_sweep.py", "deletion_lag_cleanup.py"):
            assert (ROOT / "spark_jobs" / job).is_file()


def test_spark_services_get_the_package_only_from_the_py_files_zip(services):
    """As on stack.sh's workers: no copy of the project on the Spark side (image, mounts, PYTHONPATH), so
    a broken --py-files zip fails the jobs instead of going unnoticed; its dependencies are installed."""
    for name in SPARK_SERVICES:
        svc = services[name]
        env = env_of(svc)
        assert "PYTHONPATH" not in env, name
        assert not {s for s in mounts(svc).values() if s in ("./tieredcore", "./spark_jobs")}, name
        instr = dockerfile_instructions(dockerfile_of(svc))
        copies = " ".join(a for i, a in instr if i == "COPY")
        assert "tieredcore" not in copies and "spark_jobs" not in copies
        runs = " ".join(" ".join(a.split()) for i, a in instr if i == "RUN")
        assert "-c constraints.txt -r pyproject.toml --extra spark" in runs  # the dependencies only
        assert "! /opt/tiered/bin/python -c 'import tieredcore'" in runs  # the build checks it
    # the Airflow side ships the zip it builds from its own copy
    assert env_of(services["airflow-worker"])["TIERED_PY_FILES"] == "/opt/tiered/tiered-pyfiles.zip"
    assert "build_pyfiles.sh /opt/tiered/tiered-pyfiles.zip" in dockerfile_of(services["airflow-worker"]).read_text()


def test_shared_volume_holds_hot_tier_and_reports(compose, services):
    """Drivers (Airflow worker) and executors (Spark worker) open the same hot tier (the metadata is in
    ZooKeeper, which both reach)."""
    worker_env = env_of(services["airflow-worker"])
    meta = urlparse(worker_env["TIERED_METADATA_URL"])
    assert (meta.scheme, meta.hostname, meta.port) == ("zk", "zookeeper", 2181)
    for name in ("airflow-worker", "spark-worker"):
        assert services[name]["depends_on"]["zookeeper"]["condition"] == "service_healthy", name
    paths = [  # file:///abs (tieredcore's form) -> /abs
        "/" + urlparse(worker_env["TIERED_HOT_URL"]).path.lstrip("/"),
        worker_env["TIERED_REPORTS_DIR"],
    ]
    for p in paths:
        for name in ("airflow-worker", "spark-worker", "spark-master", "airflow-init"):
            m = mounts(services[name])
            owners = [t for t in m if PurePosixPath(p).is_relative_to(t)]
            assert owners, f"{name}: {p} not on a mounted volume"
            assert m[owners[0]] in (compose.get("volumes") or {}), f"{name}: {p} must be on a named volume"
    assert mounts(services["airflow-worker"])["/data/tiered"] == mounts(services["spark-worker"])["/data/tiered"]
    # one uid writes the shared files from both sides
    assert services["spark-worker"]["user"] == services["airflow-worker"]["user"]
    for key in ("TIERED_METADATA_URL", "TIERED_HOT_URL", "TIERED_STORE_URL", "TIERED_REPORTS_DIR",
                "PYSPARK_PYTHON"):
        assert env_of(services["spark-worker"])[key] == worker_env[key], key


def test_tiered_configuration_loads(services, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no ./tiered.toml: the environment alone configures the containers
    env = env_of(services["airflow-worker"])
    assert "TIERED_CONFIG" not in env
    cfg = Config.load(env=env)
    assert cfg.spark_master == "spark://spark-master:7077"
    assert cfg.metadata_url == "zk://zookeeper:2181/tiered-storage"
    u = urlparse(cfg.store_url)
    q = {k: v[-1] for k, v in parse_qs(u.query).items()}
    assert u.scheme == "s3"
    assert u.netloc == env_of(services["minio-init"])["TIERED_BUCKET"] == "tiered-offload"
    endpoint = urlparse(q["endpoint"])
    assert (endpoint.hostname, endpoint.port) == ("minio", 9000)
    assert q["region"]
    assert cfg.max_block_size >= 5 * 1024 * 1024


def test_pyspark_python_exists_in_both_images(services):
    python = env_of(services["airflow-worker"])["PYSPARK_PYTHON"]
    assert python == env_of(services["spark-worker"])["PYSPARK_PYTHON"]
    for name in ("airflow-worker", "spark-worker"):
        text = dockerfile_of(services[name]).read_text()
        assert python in text, f"{dockerfile_of(services[name]).name} does not provide {python}"


# -- connections ---------------------------------------------------------------------------------------------


def connections(services) -> tuple[dict[str, Any], dict[str, Any]]:
    values = {(env_of(services[n])["AIRFLOW_CONN_SPARK_DEFAULT"], env_of(services[n])["AIRFLOW_CONN_AWS_DEFAULT"])
              for n in [*AIRFLOW_SERVICES, "airflow-init"]}
    assert len(values) == 1, "every Airflow service sees the same connections"
    spark, aws = values.pop()
    return json.loads(spark), json.loads(aws)


def test_connection_variables_are_well_formed(services):
    spark, aws = connections(services)
    assert spark["conn_type"] == "spark"
    assert f"{spark['host']}:{spark['port']}" == "spark://spark-master:7077"
    master_cmd = services["spark-master"]["command"]
    assert master_cmd[master_cmd.index("--port") + 1] == str(spark["port"])
    assert master_cmd[master_cmd.index("--host") + 1] == "spark-master"
    assert "spark://spark-master:7077" in shlex.split(services["spark-worker"]["command"][-1])

    assert aws["conn_type"] == "aws"
    endpoint = urlparse(aws["extra"]["endpoint_url"])
    assert (endpoint.scheme, endpoint.hostname, endpoint.port) == ("http", "minio", 9000)
    assert "9000:9000" in services["minio"]["ports"]
    minio_env = env_of(services["minio"])
    assert aws["login"] == minio_env["MINIO_ROOT_USER"] == "minioadmin"
    assert aws["password"] == minio_env["MINIO_ROOT_PASSWORD"]
    spark_env = env_of(services["spark-worker"])
    assert spark_env["AWS_ACCESS_KEY_ID"] == aws["login"]
    assert spark_env["AWS_SECRET_ACCESS_KEY"] == aws["password"]


def test_offloaded_objects_go_where_pulsar_brokers_look(services, tmp_path):
    """By default the stack writes Pulsar's own keys, {uuid}-ledger-{id} with no prefix (what
    BlobStoreManagedLedgerOffloader / DataBlockUtils.dataBlockOffloadKey name them), so the brokers of a
    Pulsar cluster sharing the bucket read them; TIERED_STORE_PREFIX moves them under a prefix (where no
    broker looks), compose and stack.sh alike."""
    from tieredcore.cold.location import parse_store_url
    from tieredcore.formats.keys import data_key, index_key

    uuid = "3f2504e0-4f89-41d3-9a0c-0305e82c3301"
    for url in (env_of(services["airflow-worker"])["TIERED_STORE_URL"], stack_env(tmp_path)["TIERED_STORE_URL"]):
        loc = parse_store_url(url)
        assert loc.prefix == ""
        assert (data_key(loc.prefix, uuid, 7), index_key(loc.prefix, uuid, 7)) == (
            f"{uuid}-ledger-7", f"{uuid}-ledger-7-index")
    prefixed = load({"TIERED_STORE_PREFIX": "offload"})["services"]
    assert parse_store_url(env_of(prefixed["airflow-worker"])["TIERED_STORE_URL"]).prefix == "offload/"


def test_credentials_come_from_the_environment():
    env = {"MINIO_ROOT_USER": "tiered", "MINIO_ROOT_PASSWORD": "s3cr3t/+=&x", "TIERED_BUCKET": "other-bucket"}
    svcs = load(env)["services"]
    _, aws = connections(svcs)
    assert (aws["login"], aws["password"]) == ("tiered", "s3cr3t/+=&x")
    assert env_of(svcs["minio"])["MINIO_ROOT_PASSWORD"] == "s3cr3t/+=&x"
    assert env_of(svcs["minio-init"])["TIERED_BUCKET"] == "other-bucket"
    assert urlparse(env_of(svcs["airflow-worker"])["TIERED_STORE_URL"]).netloc == "other-bucket"


def test_providers_resolve_the_connections(services, tmp_path):
    """The Spark and Amazon providers themselves read the variables (no metadata DB needed)."""
    env_vars = env_of(services["airflow-worker"])
    code = (
        "import json\n"
        "from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook\n"
        "from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook\n"
        "c = SparkSubmitHook(conn_id='spark_default')._connection\n"
        "a = AwsBaseHook(aws_conn_id='aws_default', client_type='s3').conn_config\n"
        "print(json.dumps({'master': c['master'], 'deploy_mode': c['deploy_mode'],\n"
        "                  'endpoint': a.get_service_endpoint_url('s3'), 'region': a.region_name,\n"
        "                  'key': a.aws_access_key_id}))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(
        AIRFLOW_HOME=str(tmp_path),
        AIRFLOW_CONN_SPARK_DEFAULT=env_vars["AIRFLOW_CONN_SPARK_DEFAULT"],
        AIRFLOW_CONN_AWS_DEFAULT=env_vars["AIRFLOW_CONN_AWS_DEFAULT"],
    )
    r = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got == {"master": "spark://spark-master:7077", "deploy_mode": "client",
                   "endpoint": "http://minio:9000", "region": "us-east-1", "key": "minioadmin"}


# -- images and Dockerfiles ------------------------------------------------------------------------------------


def test_images_are_pinned(services, project):
    version = project["project"]["version"]
    for name, svc in services.items():
        ref = svc.get("image")
        assert ref, f"{name}: no image"
        assert image_ref_ok(ref), f"{name}: image {ref!r} is not pinned"
        if "build" in svc:
            assert ref.endswith(f":{version}"), f"{name}: built image tagged {ref}, project is {version}"
            df = dockerfile_of(svc)
            assert df.is_file(), f"{name}: {df} missing"
            for instr, args in dockerfile_instructions(df):
                if instr == "FROM":
                    assert image_ref_ok(base_image(df, args.split()[0])), f"{df.name}: FROM {args}"
                if instr == "COPY" and "--from=" in args:
                    src = re.search(r"--from=(\S+)", args).group(1)
                    assert image_ref_ok(src), f"{df.name}: COPY --from={src}"
    assert services["minio"]["image"].split(":")[-1].startswith("RELEASE.")
    assert services["minio-init"]["image"].split("/")[-1].startswith("mc:RELEASE.")


def test_dockerfile_copy_sources_exist(services):
    for name in ("airflow-worker", "spark-worker"):
        df = dockerfile_of(services[name])
        context = ROOT / services[name]["build"].get("context", ".")
        for instr, args in dockerfile_instructions(df):
            if instr != "COPY" or "--from=" in args:
                continue
            sources = [a for a in args.split() if not a.startswith("--")][:-1]
            assert sources, args
            for s in sources:
                assert (context / s).exists(), f"{df.name}: COPY source {s} missing"


def base_image(df: Path, ref: str) -> str:
    """FROM's reference with ${ARG} replaced by the ARG's default (ARGs declared before the FROM)."""
    defaults = {}
    for instr, args in dockerfile_instructions(df):
        if instr == "FROM":
            break
        if instr == "ARG" and "=" in args:
            k, v = args.split("=", 1)
            defaults[k] = v
    return re.sub(r"\$\{(\w+)\}", lambda m: defaults[m.group(1)], ref)


SHARED_END = "# ---- end of the shared instructions"


def test_dockerfiles_share_their_base_and_first_layers(services):
    """The base image is a build argument (default: the official Python image users pull); both
    Dockerfiles start with the same instructions, so one JVM, one Python and one pyspark are built once
    and shared by both images (and the driver's and executors' versions agree by construction)."""
    airflow_df, spark_df = dockerfile_of(services["airflow-worker"]), dockerfile_of(services["spark-worker"])
    heads = []
    for df in (airflow_df, spark_df):
        text = df.read_text()
        assert SHARED_END in text, df
        head = text[:text.index(SHARED_END)]
        heads.append(head[head.index("ARG BASE_IMAGE="):])
        instr = dockerfile_instructions(df)
        assert instr[0] == ("ARG", "BASE_IMAGE=python:3.11-slim-bookworm"), instr[0]
        assert instr[1] == ("FROM", "${BASE_IMAGE}")
        assert len([i for i, _ in instr if i == "FROM"]) == 1
    assert heads[0] == heads[1], "the shared instructions differ"
    for name in ("airflow-worker", "spark-worker"):
        args = services[name]["build"]["args"]
        assert args["BASE_IMAGE"] == "python:3.11-slim-bookworm" and args["AIRFLOW_UID"] == "50000", name
    assert load({"TIERED_BASE_IMAGE": "local/bookworm:1"})["services"]["spark-master"]["build"]["args"][
        "BASE_IMAGE"] == "local/bookworm:1"


def test_compose_file_parses_with_both_implementations(tmp_path):
    """Only syntax Debian's docker-compose 1.29.2 (the Python implementation) and compose v2 both accept:
    no env_file `path:`/`required:` entries; `docker-compose config` itself parses the file."""
    raw = yaml.safe_load(COMPOSE.read_text())
    for name, svc in raw["services"].items():
        for ef in svc.get("env_file") or []:
            assert isinstance(ef, str), f"{name}: env_file entry {ef!r} (compose v2 only)"
    r = subprocess.run(["docker-compose", "-f", str(COMPOSE), "config", "--services"], capture_output=True,
                       text=True, timeout=120, cwd=tmp_path, env={k: v for k, v in os.environ.items()
                                                                  if not k.startswith("DOCKER_")})
    assert r.returncode == 0, r.stderr
    assert set(r.stdout.split()) == set(raw["services"])
    version = subprocess.run(["docker-compose", "version", "--short"], capture_output=True, text=True, timeout=60)
    assert version.stdout.strip() == "1.29.2", version


def test_airflow_dockerfile_pins_and_pyspark_fix(services, project):
    p = pins(project)
    airflow_v, pyspark_v = p["apache-airflow"], p["pyspark"]
    assert (airflow_v, pyspark_v) == ("3.3.2", "4.3.0")
    constraints = (ROOT / "constraints.txt").read_text().split()
    assert f"apache-airflow=={airflow_v}" in constraints and f"pyspark=={pyspark_v}" in constraints

    df = dockerfile_of(services["airflow-worker"])
    instr = dockerfile_instructions(df)
    froms = [a for i, a in instr if i == "FROM"]
    m = re.fullmatch(r"python:(3\.\d+)-slim-bookworm", base_image(df, froms[-1].split()[0]))
    assert m, froms
    minimum = re.search(r">=\s*3\.(\d+)", project["project"]["requires-python"]).group(1)
    assert int(m.group(1).split(".")[1]) >= int(minimum)
    assert f"sys.version_info[:2] == ({m.group(1).replace('.', ', ')})" in df.read_text()  # a Debian base too

    runs = [a for i, a in instr if i == "RUN"]
    install = [k for k, r in enumerate(runs) if "-c /opt/tiered/src/constraints.txt" in r]
    assert install, "the project is installed with its pinned constraints"
    cmds = [c.strip() for c in runs[install[0]].split(";")]
    main = next(k for k, c in enumerate(cmds) if "constraints.txt" in c and "pip install" in c)
    assert f'"apache-airflow=={airflow_v}"' in cmds[main] and "[spark,airflow,azure,gcs]" in cmds[main]
    fix = [k for k, c in enumerate(cmds) if "--reinstall" in c]
    assert fix and fix[0] > main, "docs/deploy.md: force-reinstall pyspark after the install that pulls pyspark-client"
    assert "--no-deps" in cmds[fix[0]] and f"pyspark=={pyspark_v}" in cmds[fix[0]]
    after = "; ".join(cmds[fix[0] + 1:])
    assert "pyspark.__version__" in after and f"'{pyspark_v}'" in after, "the build verifies the fix"
    assert not [r for r in runs if "uninstall" in r], "never uninstall pyspark-client (docs/deploy.md)"
    assert any(i == "RUN" and "jre" in a for i, a in instr), "spark-submit needs a JVM"


def test_spark_dockerfile_matches_driver_versions(services, project):
    p = pins(project)
    spark_df = dockerfile_of(services["spark-worker"])
    text = spark_df.read_text()
    # the cluster is pyspark's own distribution, the driver's version (the shared instructions install it)
    assert f'"pyspark=={p["pyspark"]}"' in text and f"version {p['pyspark']}" in text
    assert f"pyspark.__version__ == '{p['pyspark']}'" in text, "the build checks the distribution's version"
    assert "sys.version_info[:2] == (3, 11)" in text, "executors' Python minor version == the driver's"
    assert services["spark-master"]["image"] == services["spark-worker"]["image"]
    assert services["spark-worker"]["build"]["args"]["AIRFLOW_UID"] == "50000"


def test_minio_init_creates_the_bucket(services):
    init = services["minio-init"]
    script_mount = [s for t, s in mounts(init).items() if t.endswith(".sh")]
    assert script_mount, "init script mounted"
    script = (ROOT / script_mount[0]).read_text()
    assert "mc mb --ignore-existing" in script and "TIERED_BUCKET" in script
    assert init["entrypoint"][-1] in mounts(init)
    env = env_of(init)
    assert urlparse(env["MINIO_ENDPOINT"]).hostname == "minio"
    assert env["MINIO_ROOT_USER"] == env_of(services["minio"])["MINIO_ROOT_USER"]


# -- one topology: docker-compose.yaml and scripts/stack.sh ------------------------------------------------


def stack_env(tmp_path: Path) -> dict[str, str]:
    """`scripts/stack.sh env` with no stack up: the environment it gives the Airflow processes, with
    docker/topology.env's ports (secrets are chosen by `up`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TIERED_", "AIRFLOW", "STACK_"))}
    env.update(TIERED_STACK_DIR=str(tmp_path / "stack"), TIERED_VENV=str(Path(sys.prefix)))
    r = subprocess.run([str(STACK), "env"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "not up" in r.stderr  # it says these are the topology's defaults, not a running stack
    out = {}
    for line in r.stdout.splitlines():
        export, assignment = line.split(" ", 1)
        assert export == "export", line
        key, value = shlex.split(assignment)[0].split("=", 1)
        out[key] = value
    return out


def test_stack_sh_and_compose_describe_one_topology(services, tmp_path):
    topo = read_env_file(TOPOLOGY)
    stack = stack_env(tmp_path)
    comp = env_of(services["airflow-worker"])
    localhost = "127.0.0.1"

    # the parts: every long-running compose service has its stack.sh process (the triggerer aside: no
    # DAG defers), MinIO's role is moto's S3 server
    started = set(re.findall(r"^\s*start (\S+) ", STACK.read_text(), flags=re.M))
    started = {"spark-worker" if n.startswith('"spark-worker-') else n for n in started}
    assert started == {"postgres", "redis", "zookeeper", "s3", "spark-master", "spark-worker", "airflow-api-server",
                       "airflow-scheduler", "airflow-dag-processor", "airflow-celery-worker"}, started
    assert services["spark-worker"]["deploy"]["replicas"] == int(topo["TOPOLOGY_SPARK_WORKERS"])
    # the workers' cores and memory: topology.env's, read in the container (its env_file), as stack.sh
    worker = services["spark-worker"]
    worker_cmd = shlex.split(worker["command"][-1])
    assert worker["command"][:2] == ["/bin/sh", "-c"]
    assert worker_cmd[worker_cmd.index("--cores") + 1] == "${TOPOLOGY_SPARK_WORKER_CORES}"
    assert worker_cmd[worker_cmd.index("--memory") + 1] == "${TOPOLOGY_SPARK_WORKER_MEMORY}"
    assert env_of(worker)["TOPOLOGY_SPARK_WORKER_CORES"] == topo["TOPOLOGY_SPARK_WORKER_CORES"]
    assert env_of(worker)["TOPOLOGY_SPARK_WORKER_MEMORY"] == topo["TOPOLOGY_SPARK_WORKER_MEMORY"]
    stack_text = STACK.read_text()
    assert '--cores "$TOPOLOGY_SPARK_WORKER_CORES" --memory "$TOPOLOGY_SPARK_WORKER_MEMORY"' in stack_text

    # versions: the compose images are the Debian packages' / the venv's versions stack.sh checks
    assert services["postgres"]["image"] == f"postgres:{topo['TOPOLOGY_POSTGRES_VERSION']}"
    assert services["redis"]["image"].split(":")[1].split(".")[0] == topo["TOPOLOGY_REDIS_VERSION"]
    assert services["zookeeper"]["image"].split(":")[1].startswith(topo["TOPOLOGY_ZOOKEEPER_VERSION"] + ".")
    assert f'"pyspark=={topo["TOPOLOGY_SPARK_VERSION"]}"' in dockerfile_of(services["spark-worker"]).read_text()

    # Airflow's own settings: identical (the env_file gives them to compose)
    for key in ("AIRFLOW__CORE__EXECUTOR", "AIRFLOW__CELERY__WORKER_CONCURRENCY", "AIRFLOW__CORE__LOAD_EXAMPLES",
                "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION"):
        assert stack[key] == comp[key] == topo[key], key
    # database, result backend, broker: same driver, user, password, database; hosts differ, ports agree
    for key, port in (("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "POSTGRES"), ("AIRFLOW__CELERY__RESULT_BACKEND", "POSTGRES"),
                      ("AIRFLOW__CELERY__BROKER_URL", "REDIS")):
        a, b = urlparse(stack[key]), urlparse(comp[key])
        assert (a.scheme, a.path) == (b.scheme, b.path), key
        assert (a.username or "", a.password or "") == (b.username or "", b.password or ""), key
        assert a.hostname == localhost and a.port == int(topo[f"TOPOLOGY_{port}_PORT"]), key
        assert (b.port or {"POSTGRES": 5432, "REDIS": 6379}[port]) == int(topo[f"TOPOLOGY_{port}_PORT"]), key
    db = urlparse(stack["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
    assert (db.username, db.password, db.path) == (topo["TOPOLOGY_AIRFLOW_DB_USER"], topo["TOPOLOGY_AIRFLOW_DB_PASSWORD"],
                                                   "/" + topo["TOPOLOGY_AIRFLOW_DB_NAME"])
    assert urlparse(stack["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"]).port == int(topo["TOPOLOGY_AIRFLOW_API_PORT"])
    assert f"{topo['TOPOLOGY_AIRFLOW_API_PORT']}:8080" in services["airflow-apiserver"]["ports"]

    # the connections: the ids the DAGs use, the same fields; hosts differ
    common = (ROOT / "dags" / "tiered_common.py").read_text()
    assert f'SPARK_CONN_ID = "{topo["TOPOLOGY_SPARK_CONN_ID"]}"' in common
    assert f'AWS_CONN_ID = "{topo["TOPOLOGY_AWS_CONN_ID"]}"' in common
    conn_vars = {f"AIRFLOW_CONN_{topo[k].upper()}" for k in ("TOPOLOGY_SPARK_CONN_ID", "TOPOLOGY_AWS_CONN_ID")}
    assert {k for k in stack if k.startswith("AIRFLOW_CONN_")} == {k for k in comp if k.startswith("AIRFLOW_CONN_")} \
        == conn_vars
    spark_var = f"AIRFLOW_CONN_{topo['TOPOLOGY_SPARK_CONN_ID'].upper()}"
    aws_var = f"AIRFLOW_CONN_{topo['TOPOLOGY_AWS_CONN_ID'].upper()}"
    s_spark, c_spark = json.loads(stack[spark_var]), json.loads(comp[spark_var])
    assert s_spark["conn_type"] == c_spark["conn_type"] == "spark"
    assert s_spark["port"] == c_spark["port"] == int(topo["TOPOLOGY_SPARK_MASTER_PORT"])
    assert s_spark["extra"] == c_spark["extra"] == {"deploy-mode": topo["TOPOLOGY_SPARK_DEPLOY_MODE"]}
    assert s_spark["host"] == f"spark://{localhost}" and c_spark["host"] == "spark://spark-master"
    s_aws, c_aws = json.loads(stack[aws_var]), json.loads(comp[aws_var])
    assert s_aws["conn_type"] == c_aws["conn_type"] == "aws"
    assert s_aws["extra"]["region_name"] == c_aws["extra"]["region_name"] == topo["TOPOLOGY_S3_REGION"]
    assert urlparse(s_aws["extra"]["endpoint_url"]).port == urlparse(c_aws["extra"]["endpoint_url"]).port \
        == int(topo["TOPOLOGY_S3_PORT"])

    # tieredcore's configuration: the same variables, metadata in ZooKeeper under one root, one bucket
    tiered = {k for k in comp if k.startswith("TIERED_")}
    assert {k for k in stack if k.startswith("TIERED_") and not k.endswith("_SCHEDULE")} - {"TIERED_STACK_DIR"} == tiered
    s_meta, c_meta = urlparse(stack["TIERED_METADATA_URL"]), urlparse(comp["TIERED_METADATA_URL"])
    assert s_meta.scheme == c_meta.scheme == "zk" and s_meta.path == c_meta.path == topo["TOPOLOGY_ZK_ROOT"]
    assert s_meta.port == c_meta.port == int(topo["TOPOLOGY_ZOOKEEPER_PORT"])
    s_store, c_store = urlparse(stack["TIERED_STORE_URL"]), urlparse(comp["TIERED_STORE_URL"])
    assert (s_store.scheme, s_store.netloc, s_store.path) == (c_store.scheme, c_store.netloc, c_store.path) \
        == ("s3", topo["TOPOLOGY_BUCKET"], "/" + topo["TOPOLOGY_STORE_PREFIX"])
    assert parse_qs(s_store.query)["region"] == parse_qs(c_store.query)["region"] == [topo["TOPOLOGY_S3_REGION"]]
    assert urlparse(stack["TIERED_SPARK_MASTER"]).port == urlparse(comp["TIERED_SPARK_MASTER"]).port \
        == int(topo["TOPOLOGY_SPARK_MASTER_PORT"])
    assert stack["TIERED_PY_FILES"].endswith(".zip") and comp["TIERED_PY_FILES"].endswith(".zip")
    # the Airflow pool of the Spark tasks: the DAGs' default, created by compose's airflow-init and by `up`
    assert stack["TIERED_SPARK_POOL"] == comp["TIERED_SPARK_POOL"] == topo["TIERED_SPARK_POOL"]
    assert f'os.environ.get("TIERED_SPARK_POOL") or "{topo["TIERED_SPARK_POOL"]}"' in common
    assert "$${TIERED_SPARK_POOL" in COMPOSE.read_text() and 'pools set "$TIERED_SPARK_POOL"' in STACK.read_text()
    # one spark-defaults.conf for the jobs' JVMs: the stack's checkout copy, mounted into compose
    assert Path(stack["SPARK_CONF_DIR"]) == ROOT / "docker" / "spark-conf"
    assert mounts(services["airflow-worker"])[comp["SPARK_CONF_DIR"]] == "./docker/spark-conf"
    assert (ROOT / "docker" / "spark-conf" / "spark-defaults.conf").is_file()
    assert env_of(services["minio-init"])["TIERED_BUCKET"] == topo["TOPOLOGY_BUCKET"]


def test_stack_sh_attached_to_a_pulsar_cluster(tmp_path, monkeypatch):
    """PULSAR_ZK (Pulsar's metadataStoreUrl, either spelling), PULSAR_STORE_URL, PULSAR_CLUSTER and
    PULSAR_BROKERS_DEFAULT point the stack's configuration at a running cluster (docs/pulsar.md)."""
    from tieredcore.config import Config

    monkeypatch.setenv("PULSAR_STORE_URL", "s3://pulsar-offload?region=eu-west-1")
    monkeypatch.setenv("PULSAR_CLUSTER", "prod-1")
    monkeypatch.setenv("PULSAR_BROKERS_DEFAULT", "true")
    for zk, url in (("zk://zk1:2181,zk2:2181/pulsar", "zk://zk1:2181,zk2:2181/tiered-storage?chroot=/pulsar&attached=true"),
                    ("zk:zk1:2181", "zk://zk1:2181/tiered-storage?attached=true")):
        monkeypatch.setenv("PULSAR_ZK", zk)
        env = stack_env(tmp_path)
        cfg = Config.load(None, env={k: v for k, v in env.items() if k.startswith("TIERED_")})
        assert (cfg.metadata_url, cfg.hot_url, cfg.store_url) == (url, "bookkeeper:", "s3://pulsar-offload?region=eu-west-1")
        assert cfg.attached and cfg.cluster == "prod-1" and cfg.brokers_default
