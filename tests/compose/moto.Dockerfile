# moto's S3 server in place of MinIO for the compose test (docker-compose.test.yaml, services minio and
# minio-init), on the test's Debian base image (no registry here), pinned like the project's dev extra.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
RUN python3 -m venv /opt/moto \
    && /opt/moto/bin/pip install --no-cache-dir --disable-pip-version-check "moto[server]==5.2.5" \
    && /opt/moto/bin/python -c "import moto, boto3"
