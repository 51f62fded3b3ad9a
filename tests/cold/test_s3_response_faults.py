"""Faults after the server answered, which botocore does not retry: a GET body cut off (short read, or a
reset mid-body) and a HEAD answer without Content-Length. The S3 store retries the whole request within
its attempt budget (tieredcore/cold/backends/s3.py); a fault that persists is a BlobStoreError naming
the key, never a KeyError or a botocore exception. Against moto's S3 server behind the fault proxy."""

from __future__ import annotations

import uuid

import boto3
import pytest

from tests.support.faulty_s3_proxy import (
    DROP_LENGTH,
    RESET_BODY,
    RESPONSE_FAULT_KINDS,
    TRUNCATE,
    FaultyS3Proxy,
)
from tieredcore.cold.backends.s3 import S3BlobStore
from tieredcore.errors import BlobStoreError

DATA = bytes(range(256)) * 64  # 16 KiB


@pytest.fixture
def bucket(moto_endpoint: str) -> str:
    name = f"resp-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1").create_bucket(Bucket=name)
    S3BlobStore(name, endpoint_url=moto_endpoint, region="us-east-1").put("k", DATA)
    return name


def store(proxy: FaultyS3Proxy, bucket: str, attempts: int = 4) -> S3BlobStore:
    return S3BlobStore(bucket, endpoint_url=proxy.url, region="us-east-1", max_attempts=attempts,
                       read_timeout=5, connect_timeout=2)


def on(method: str):
    return lambda m, _t: m == method


@pytest.mark.parametrize("fault", [TRUNCATE, RESET_BODY])
def test_a_cut_off_body_is_read_again(moto_endpoint: str, bucket: str, fault: str) -> None:
    with FaultyS3Proxy(moto_endpoint, rate=0.0) as proxy:
        s = store(proxy, bucket)
        proxy.inject(on("GET"), fault)
        assert s.get("k") == DATA
        proxy.inject(on("GET"), fault)
        assert s.get_range("k", 100, 8291) == DATA[100:8292]
        assert proxy.faults[fault] == 2
        assert [f for m, _t, f in proxy.events if m == "GET"] == [fault, "", fault, ""]


def test_a_head_without_content_length_is_asked_again(moto_endpoint: str, bucket: str) -> None:
    with FaultyS3Proxy(moto_endpoint, rate=0.0) as proxy:
        s = store(proxy, bucket)
        proxy.inject(on("HEAD"), DROP_LENGTH)
        assert s.head("k").size == len(DATA)
        assert [f for m, _t, f in proxy.events if m == "HEAD"] == [DROP_LENGTH, ""]


@pytest.mark.parametrize(("fault", "method", "call", "said"), [
    (TRUNCATE, "GET", lambda s: s.get("k"), "the response body was cut off 3 time(s)"),
    (RESET_BODY, "GET", lambda s: s.get_range("k", 0, 999), "the response body was cut off 3 time(s)"),
    (DROP_LENGTH, "HEAD", lambda s: s.head("k"), "head: the response has no Content-Length header"),
])
def test_a_fault_that_persists_is_an_error_naming_the_key(moto_endpoint: str, bucket: str, fault, method, call,
                                                          said) -> None:
    with FaultyS3Proxy(moto_endpoint, rate=1.0, kinds=(fault,)) as proxy:
        s = store(proxy, bucket, attempts=3)
        with pytest.raises(BlobStoreError) as e:
            call(s)
        assert f"s3://{bucket}/k" in str(e.value) and said in str(e.value), str(e.value)
        assert [m for m, _t, f in proxy.events if f == fault] == [method] * 3  # the budget, not more


def test_random_response_faults_ride_through(moto_endpoint: str, bucket: str) -> None:
    """A third of the requests answered with a response fault: every read still returns the bytes."""
    with FaultyS3Proxy(moto_endpoint, seed=7, rate=0.33, kinds=RESPONSE_FAULT_KINDS) as proxy:
        s = store(proxy, bucket, attempts=6)
        for i in range(30):
            assert s.get_range("k", i * 100, i * 100 + 499) == DATA[i * 100:i * 100 + 500]
            assert s.head("k").size == len(DATA)
        assert set(proxy.faults) == set(RESPONSE_FAULT_KINDS)
