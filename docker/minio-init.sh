#!/bin/sh
# One-shot init of the stack's MinIO (docker-compose.yaml, service minio-init, image minio/mc):
# creates the offload bucket (idempotent) and keeps it private. Runs after minio is healthy.
set -eu
: "${MINIO_ENDPOINT:=http://minio:9000}"
: "${TIERED_BUCKET:=tiered-offload}"

tries=0
until mc alias set tiered "$MINIO_ENDPOINT" "$MINIO_ROOT_USER" "$MINIO_ROOT_PASSWORD" >/dev/null; do
    tries=$((tries + 1))
    if [ "$tries" -ge 30 ]; then
        echo "minio-init: $MINIO_ENDPOINT not reachable" >&2
        exit 1
    fi
    sleep 2
done
mc mb --ignore-existing "tiered/$TIERED_BUCKET"
mc anonymous set none "tiered/$TIERED_BUCKET"
echo "minio-init: bucket $TIERED_BUCKET ready at $MINIO_ENDPOINT"
