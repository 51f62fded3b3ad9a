"""The compose test's override (tests/compose/docker-compose.test.yaml), read: every service of the users'
file runs with host networking and resolves the others' names to loopback, so no test traffic leaves
127.0.0.1; the services that cannot be pulled run on the test's base image; the users' file keeps its
own network."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_every_service_on_host_networking_and_loopback():
    users = yaml.safe_load((ROOT / "docker-compose.yaml").read_text())["services"]
    override = yaml.safe_load((ROOT / "tests" / "compose" / "docker-compose.test.yaml").read_text())["services"]
    assert set(override) == set(users)
    for name, svc in override.items():
        assert svc["network_mode"] == "host", name
        hosts = dict(h.rsplit(":", 1) for h in svc["extra_hosts"])
        assert set(hosts.values()) == {"127.0.0.1"}, name
        assert {"postgres", "redis", "zookeeper", "minio", "spark-master", "airflow-apiserver"} <= set(hosts), name
    for name in ("postgres", "redis", "zookeeper"):
        assert override[name]["image"].startswith("${TIERED_TEST_BASE"), name
    assert "moto_server" in override["minio"]["entrypoint"][0]
    assert "-H" in override["minio"]["entrypoint"] and "127.0.0.1" in override["minio"]["entrypoint"]
    assert not any("network_mode" in svc for svc in users.values())
