"""Workspaces for the Spark jobs and a spark-submit runner (real subprocesses, local[2])."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
SPARK_TIMEOUT_S = 300


def spark_env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env.update(
        PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        SPARK_LOCAL_IP="127.0.0.1",
        TIERED_NO_PROGRESS="1",
    )
    for var in [k for k in env if k.startswith("TIERED_") and k != "TIERED_NO_PROGRESS"]:
        del env[var]  # the configuration file alone decides
    env.update(extra or {})
    return env


def spark_cmd(job: str, *args: str) -> list[str]:
    # Spark's own lines at WARN, as the DAGs submit the jobs (spark_jobs/log4j2.properties)
    log4j = (REPO / "spark_jobs" / "log4j2.properties").as_uri()
    return [str(VENV_BIN / "spark-submit"), "--master", "local[2]", "--conf", "spark.ui.enabled=false",
            "--conf", f"spark.driver.extraJavaOptions=-Dlog4j2.configurationFile={log4j}",
            str(REPO / "spark_jobs" / f"{job}.py"), *args]


def spark_popen(job: str, *args: str, log: Path) -> subprocess.Popen:
    f = open(log, "wb")  # noqa: SIM115 - closed by the caller through finish()
    p = subprocess.Popen(spark_cmd(job, *args), cwd=REPO, env=spark_env(), stdout=f, stderr=subprocess.STDOUT,
                         stdin=subprocess.DEVNULL)
    p._log_file = f  # type: ignore[attr-defined]
    return p


def finish(p: subprocess.Popen, log: Path) -> tuple[int, str]:
    try:
        rc = p.wait(timeout=SPARK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        pytest.fail(f"spark-submit did not finish within {SPARK_TIMEOUT_S}s; log {log}")
    finally:
        p._log_file.close()  # type: ignore[attr-defined]
    return rc, log.read_text(errors="replace")


def spark_submit(job: str, *args: str, log: Path) -> tuple[int, str]:
    return finish(spark_popen(job, *args, log=log), log)


@pytest.fixture(autouse=True)
def _quiet_generate(monkeypatch):
    monkeypatch.setenv("TIERED_NO_PROGRESS", "1")
