"""Fixtures of the crash tests."""

from __future__ import annotations

import uuid as uuidlib

import pytest


@pytest.fixture(params=["fs", "s3"])
def store_url(request) -> str | None:
    """The object store the crashed processes write to: the filesystem store, or a fresh bucket on moto's
    S3 server (whose multipart uploads and listings the drain and reconciliation then work through)."""
    if request.param == "fs":
        return None
    import boto3

    endpoint = request.getfixturevalue("moto_endpoint")
    bucket = f"crash-{uuidlib.uuid4().hex[:16]}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    return f"s3://{bucket}?endpoint={endpoint}&region=us-east-1"
