# Airflow image of the scale-out stack (docker-compose.yaml): the official Airflow 3 image plus the
# project (tieredcore, spark_jobs) installed with the project's pinned constraints, a JVM for
# spark-submit, and the pyspark-client fix (docs/deploy.md, "pyspark files"). Built from the repository root:
#
#   docker build -f docker/airflow.Dockerfile -t tiered-storage-airflow:0.1.0 .
#
# The Python minor version (3.11) must match the Spark image's (docker/spark.Dockerfile): PySpark
# refuses executors whose Python differs from the driver's.
FROM apache/airflow:3.3.2-python3.11

USER root
# spark-submit is pyspark's launcher and needs a JVM (Spark 4.x runs on Java 17 or 21; Debian's
# default-jre-headless is one of them). The man1 directory: openjdk's postinst fails without it on
# slim Debian images.
RUN set -eux; \
    mkdir -p /usr/share/man/man1; \
    apt-get update; \
    apt-get install -y --no-install-recommends default-jre-headless procps; \
    apt-get clean; \
    rm -rf /var/lib/apt/lists/*; \
    java -version
# Sources for the install (the compose file mounts the live tieredcore/ and spark_jobs/ over
# /opt/airflow/ at run time; PYTHONPATH=/opt/airflow makes the mounted copy win).
COPY --chown=airflow:0 pyproject.toml constraints.txt README.md /opt/tiered/src/
COPY --chown=airflow:0 tieredcore /opt/tiered/src/tieredcore
COPY --chown=airflow:0 spark_jobs /opt/tiered/src/spark_jobs
COPY --chown=airflow:0 scripts/build_pyfiles.sh /opt/tiered/src/scripts/build_pyfiles.sh
RUN mkdir -p /opt/tiered/bin && chown -R airflow:0 /opt/tiered

USER airflow
# 1. the project with its Airflow and Spark extras, every version from constraints.txt (apache-airflow
#    stays 3.3.2: the image's own version). pyspark is an sdist (~456 MB): build its wheel once.
# 2. (docs/deploy.md, "pyspark files") the Spark provider pulls pyspark-client, whose pyspark/ files overwrite pyspark 4.3.0's
#    (`import pyspark` then reports 4.2.0 against 4.3.0 jars, and pip check does not notice). Put
#    pyspark's own files back; never uninstall pyspark-client (that deletes them).
# 3. fail the build if the fix did not hold or the image's own providers no longer import.
RUN set -eux; \
    pip wheel --no-cache-dir --no-deps -w /tmp/wheels "pyspark==4.3.0"; \
    pip install --no-cache-dir --find-links /tmp/wheels -c /opt/tiered/src/constraints.txt \
        "apache-airflow==3.3.2" "/opt/tiered/src[spark,airflow,azure,gcs]"; \
    pip install --no-cache-dir --force-reinstall --no-deps --no-index --find-links /tmp/wheels "pyspark==4.3.0"; \
    rm -rf /tmp/wheels /opt/tiered/src/build /opt/tiered/src/*.egg-info; \
    python -c "import pyspark, sys; v = pyspark.__version__; sys.exit(None if v == '4.3.0' else f'pyspark reports {v}, expected 4.3.0')"; \
    python -c "import airflow.providers.apache.spark, airflow.providers.amazon, airflow.providers.celery, airflow.providers.fab, airflow.providers.postgres"; \
    python -c "import tieredcore.offload.offloader, spark_jobs.offload_sweep"; \
    command -v spark-submit

# The same interpreter path exists in the Spark image (where it is the executors' venv): the DAGs pass
# PYSPARK_PYTHON to Spark as spark.pyspark.python, which executors on the cluster must be able to run.
RUN printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v python)" > /opt/tiered/bin/python \
    && chmod 0755 /opt/tiered/bin/python \
    && /opt/tiered/bin/python -c "import tieredcore"
# The --py-files zip, for Spark clusters whose workers lack the package (set TIERED_PY_FILES to it).
RUN bash /opt/tiered/src/scripts/build_pyfiles.sh /opt/tiered/tiered-pyfiles.zip

ENV PYSPARK_PYTHON=/opt/tiered/bin/python
