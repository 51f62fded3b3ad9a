# Spark image of the scale-out stack (docker-compose.yaml): a Spark 4.3.0 standalone cluster (pyspark's
# own distribution: bin/spark-class and the jars) on a Python 3.11 venv with the project's dependencies
# for the executors. Built from the repository root:
#
#   docker build -f docker/spark.Dockerfile -t tiered-storage-spark:0.1.0 .
#   docker build --build-arg BASE_IMAGE=my-debian-bookworm:local ...   # no registry (docs/deploy.md)
#
# BASE_IMAGE: any Debian bookworm image with Python 3.11 (default: the official python image; a bare
# debootstrap'ed bookworm works too, tests/compose builds on one). Versions that must agree with the
# Airflow image (docker/airflow.Dockerfile), where the driver runs: Spark 4.3.0 = pyspark 4.3.0 (driver
# and executors of different Spark versions do not interoperate) and Python 3.11 (PySpark refuses
# executors whose Python minor version differs from the driver's) -- both images start with the same
# instructions, so they are the same by construction.
# ---- shared with docker/spark.Dockerfile / docker/airflow.Dockerfile: these first instructions are
# ---- identical in both files, so Docker builds them once and both images share the layers
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}
USER root
ENV LANG=C.UTF-8 \
    DEBIAN_FRONTEND=noninteractive \
    UV_NO_CACHE=1 \
    PYSPARK_PYTHON=/opt/tiered/bin/python \
    SPARK_HOME=/opt/spark \
    PATH=/opt/tiered/bin:$PATH
# A JVM for Spark (Spark 4.x runs on Java 17), curl/procps for health checks, and a Python 3.11 venv:
# the official image's python3 or, on a bare Debian bookworm base (tests/compose), Debian's python3 +
# python3-venv (bookworm's python3 is 3.11). The man1 directory: openjdk's postinst fails without it on
# slim Debian images.
RUN set -eux; \
    mkdir -p /usr/share/man/man1; \
    apt-get update; \
    apt-get install -y --no-install-recommends openjdk-17-jre-headless procps curl ca-certificates; \
    if ! python3 -c 'import ensurepip' 2>/dev/null; then apt-get install -y --no-install-recommends python3-venv; fi; \
    apt-get clean; \
    rm -rf /var/lib/apt/lists/*; \
    java -version; \
    python3 -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version'
# the Airflow uid (compose runs Airflow and Spark as AIRFLOW_UID:0, so both write the shared volume)
ARG AIRFLOW_UID=50000
# The venv both images run (/opt/tiered/bin/python: the DAGs hand it to Spark as spark.pyspark.python),
# pinned uv for the installs, and pyspark 4.3.0 (an sdist: its wheel is built once, kept in /opt/wheels
# for the Airflow image's pyspark fix). $SPARK_HOME is pyspark's own directory (bin/spark-class, jars).
RUN set -eux; \
    getent passwd "${AIRFLOW_UID}" >/dev/null \
        || useradd --uid "${AIRFLOW_UID}" --gid 0 --home-dir /opt/airflow --create-home --shell /bin/bash airflow; \
    python3 -m venv /opt/tiered; \
    /opt/tiered/bin/pip install --no-cache-dir --disable-pip-version-check uv==0.13.8 wheel==0.45.1; \
    /opt/tiered/bin/pip wheel --no-cache-dir --no-deps -w /opt/wheels "pyspark==4.3.0"; \
    /opt/tiered/bin/uv pip install --python /opt/tiered/bin/python --find-links /opt/wheels "pyspark==4.3.0"; \
    ln -s "$(/opt/tiered/bin/python -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')" /opt/spark; \
    /opt/spark/bin/spark-class org.apache.spark.deploy.SparkSubmit --version 2>&1 | grep -q 'version 4.3.0'
# The project's Python dependencies (not the project: see each image below), every version from
# constraints.txt.
COPY pyproject.toml constraints.txt README.md /opt/tiered/src/
RUN set -eux; \
    cd /opt/tiered/src; \
    uv pip install --python /opt/tiered/bin/python --find-links /opt/wheels -c constraints.txt \
        -r pyproject.toml --extra spark
# ---- end of the shared instructions

# The project itself is NOT installed here: executors get it only from the --py-files zip the DAGs
# ship (TIERED_PY_FILES, built into the Airflow image), as on scripts/stack.sh's workers -- a broken zip
# fails the jobs instead of going unnoticed behind a worker's own copy.
RUN set -eux; \
    ! /opt/tiered/bin/python -c 'import tieredcore' 2>/dev/null; \
    /opt/tiered/bin/python -c "import sys, pyspark, boto3, kazoo, pyarrow; \
assert sys.version_info[:2] == (3, 11), sys.version; \
assert pyspark.__version__ == '4.3.0', pyspark.__version__"; \
    mkdir -p /opt/tiered/home /opt/tiered/work; \
    chown "${AIRFLOW_UID}:0" /opt/tiered/home /opt/tiered/work; \
    chmod 0775 /opt/tiered/home /opt/tiered/work

ENV SPARK_WORKER_DIR=/opt/tiered/work
WORKDIR /opt/tiered/work
USER ${AIRFLOW_UID}:0
