# Airflow image of the scale-out stack (docker-compose.yaml): Airflow 3.3.2 with the Spark, Amazon and
# Celery providers and the project (tieredcore, spark_jobs) in a Python 3.11 venv, every version from the
# project's constraints.txt, a JVM for spark-submit, the pyspark-client fix (docs/deploy.md, "pyspark
# files") and an entrypoint like the official Airflow image's (docker/airflow-entrypoint.sh). Built from
# the repository root:
#
#   docker build -f docker/airflow.Dockerfile -t tiered-storage-airflow:0.1.0 .
#   docker build --build-arg BASE_IMAGE=my-debian-bookworm:local ...   # no registry (docs/deploy.md)
#
# BASE_IMAGE: any Debian bookworm image with Python 3.11 (default: the official python image). The
# first instructions are docker/spark.Dockerfile's (one JVM, one Python, one pyspark in both images).
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

# The project and Airflow (the compose file mounts the live tieredcore/ and spark_jobs/ over
# /opt/airflow/ at run time; PYTHONPATH=/opt/airflow makes the mounted copy win).
# 1. the project with its Airflow and Spark extras, every version from constraints.txt, and the redis
#    client (Celery's Redis broker transport imports it; the official Airflow image ships it too).
# 2. (docs/deploy.md, "pyspark files") the Spark provider pulls pyspark-client, whose pyspark/ files
#    overwrite pyspark 4.3.0's (`import pyspark` then reports 4.2.0 against 4.3.0 jars, and pip check does
#    not notice). Put pyspark's own files back; never uninstall pyspark-client (that deletes them).
# 3. fail the build if the fix did not hold or the providers no longer import.
# --python-version 3.11.5: constraints.txt pins soupsieve 4.1.2 (bs4 <- redshift-connector <- the Amazon
# provider, not used by the project), which declares Python >= 3.11.5; Debian bookworm's python3 is 3.11.2
# (a debootstrap'ed base, docs/deploy.md). The official python:3.11 image is newer and unaffected. The
# one dependency whose markers differ between the two (redis needs async-timeout below Python 3.11.3,
# checked over every installed package's Requires-Dist) is installed explicitly.
COPY tieredcore /opt/tiered/src/tieredcore
COPY spark_jobs /opt/tiered/src/spark_jobs
COPY scripts/build_pyfiles.sh /opt/tiered/src/scripts/build_pyfiles.sh
RUN set -eux; \
    uv pip install --python /opt/tiered/bin/python --python-version 3.11.5 --find-links /opt/wheels \
        -c /opt/tiered/src/constraints.txt "apache-airflow==3.3.2" redis async-timeout==5.0.1 \
        "/opt/tiered/src[spark,airflow,azure,gcs]"; \
    uv pip install --python /opt/tiered/bin/python --reinstall --no-deps --no-index --find-links /opt/wheels "pyspark==4.3.0"; \
    rm -rf /opt/tiered/src/build /opt/tiered/src/*.egg-info; \
    python -c "import pyspark, sys; v = pyspark.__version__; sys.exit(None if v == '4.3.0' else f'pyspark reports {v}, expected 4.3.0')"; \
    python -c "import airflow.providers.apache.spark, airflow.providers.amazon, airflow.providers.celery, airflow.providers.standard, redis, kombu.transport.redis"; \
    python -c "import tieredcore.offload.offloader, spark_jobs.offload_sweep"; \
    command -v spark-submit
# The --py-files zip the DAGs ship to the Spark executors (TIERED_PY_FILES): the Spark image has no copy
# of the project, so every job's executors run exactly the driver's code.
RUN PYTHON=/opt/tiered/bin/python bash /opt/tiered/src/scripts/build_pyfiles.sh /opt/tiered/tiered-pyfiles.zip

# Like the official image: AIRFLOW_HOME=/opt/airflow owned by the Airflow uid, /entrypoint runs
# `airflow <command>` (bash/python commands as they are) after the optional _AIRFLOW_DB_MIGRATE and
# _AIRFLOW_WWW_USER_CREATE steps.
COPY docker/airflow-entrypoint.sh /entrypoint
RUN set -eux; \
    chmod 0755 /entrypoint; \
    mkdir -p /opt/airflow/dags /opt/airflow/logs /opt/airflow/config /opt/airflow/plugins; \
    chown -R "${AIRFLOW_UID}:0" /opt/airflow; \
    chmod -R g+w /opt/airflow
ENV AIRFLOW_HOME=/opt/airflow
WORKDIR /opt/airflow
USER ${AIRFLOW_UID}:0
ENTRYPOINT ["/entrypoint"]
CMD ["--help"]
