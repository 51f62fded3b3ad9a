# Spark image of the scale-out stack (docker-compose.yaml): the official Apache Spark image with the
# project installed for the executors. Built from the repository root:
#
#   docker build -f docker/spark.Dockerfile -t tiered-storage-spark:0.1.0 .
#
# Versions that must agree with the Airflow image (docker/airflow.Dockerfile), where the driver runs:
# - Spark 4.3.0 = pyspark 4.3.0 (pyproject.toml): a standalone cluster runs executors on its own jars,
#   and driver and executors of different Spark versions do not interoperate;
# - Python 3.11: PySpark refuses executors whose Python minor version differs from the driver's. The
#   apache/spark images are Ubuntu 22.04 based (python3 = 3.10), so Python 3.11 comes from uv.
FROM apache/spark:4.3.0-scala2.13-java17-ubuntu

# uv, pinned like the project's setup (scripts/setup.sh: uv==0.13.8)
COPY --from=ghcr.io/astral-sh/uv:0.13.8 /uv /usr/local/bin/uv

USER root
# The stack runs Spark with the same uid as Airflow (AIRFLOW_UID, group 0) so both write the shared
# metadata/hot-tier volume; give that uid a passwd entry (Hadoop's user lookup needs one) and the
# directories Spark writes to.
ARG AIRFLOW_UID=50000
ENV UV_PYTHON_INSTALL_DIR=/opt/python \
    UV_NO_CACHE=1 \
    SPARK_WORKER_DIR=/opt/tiered/work \
    PYSPARK_PYTHON=/opt/tiered/bin/python \
    PATH=/opt/spark/bin:/opt/tiered/bin:$PATH
RUN set -eux; \
    grep -q '^Spark 4.3.0 ' /opt/spark/RELEASE; \
    getent passwd "${AIRFLOW_UID}" >/dev/null \
        || useradd --uid "${AIRFLOW_UID}" --gid 0 --home-dir /opt/tiered/home --no-create-home --shell /bin/bash tiered; \
    uv python install 3.11; \
    uv venv --python 3.11 /opt/tiered; \
    mkdir -p /opt/tiered/home /opt/tiered/work /opt/tiered/src; \
    chown "${AIRFLOW_UID}:0" /opt/tiered/home /opt/tiered/work; \
    chmod 0775 /opt/tiered/home /opt/tiered/work

# The project and its Python dependencies, every version from constraints.txt. pyspark itself is not
# installed: executors use the distribution's ($SPARK_HOME/python/lib/pyspark.zip, the same 4.3.0).
# No Airflow provider here, hence no pyspark-client and no need for the pyspark fix (docs/deploy.md, "pyspark files").
COPY pyproject.toml constraints.txt README.md /opt/tiered/src/
COPY tieredcore /opt/tiered/src/tieredcore
COPY spark_jobs /opt/tiered/src/spark_jobs
RUN set -eux; \
    cd /opt/tiered/src; \
    uv pip install --python /opt/tiered/bin/python -c constraints.txt . "pandas<3" pyarrow; \
    rm -rf build *.egg-info; \
    PYTHONPATH="$(ls /opt/spark/python/lib/py4j-*.zip):/opt/spark/python/lib/pyspark.zip" \
        /opt/tiered/bin/python -c "import sys, pyspark, tieredcore.offload.offloader, spark_jobs._jobkit; \
assert sys.version_info[:2] == (3, 11), sys.version; \
assert pyspark.__version__ == '4.3.0', pyspark.__version__"

WORKDIR /opt/tiered/work
USER ${AIRFLOW_UID}:0
