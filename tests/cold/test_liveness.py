"""The liveness guard (tieredcore.cold.liveness): when a store is declared dead, what counts as an answer.

The guard's arithmetic runs on an injected clock; what an answer is, on real stores (moto's S3 server
answering, a port nothing listens on refusing)."""

from __future__ import annotations

import socket
import uuid

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError

from tieredcore.cold.backends.s3 import S3BlobStore
from tieredcore.cold.failures import StoreFailureBudget
from tieredcore.cold.liveness import GuardedStore, StoreLiveness, guarded, no_answer
from tieredcore.cold.location import StoreLocation
from tieredcore.config import Config
from tieredcore.errors import (
    BlobStoreError,
    NoSuchObjectError,
    StoreUnavailableError,
    ValidationError,
)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def timeout_error() -> BlobStoreError:
    try:
        try:
            raise ReadTimeoutError(endpoint_url="http://127.0.0.1:9/b/k")
        except ReadTimeoutError as e:
            raise BlobStoreError("s3://b/k: get failed: ReadTimeoutError") from e
    except BlobStoreError as e:
        return e


def test_dead_after_requests_fail_unanswered_for_dead_after_seconds() -> None:
    clock = Clock()
    live = StoreLiveness("s3://b", dead_after=30, clock=clock)
    live.unanswered(clock.t, timeout_error())  # an instant failure: not yet
    clock.t += 29
    live.unanswered(clock.t - 10, timeout_error())  # silent since the first one: 29 s
    assert not live.dead
    live.check()
    clock.t += 1
    live.unanswered(clock.t - 10, timeout_error())
    assert live.dead
    with pytest.raises(StoreUnavailableError, match=r"s3://b is not answering: no answer for 30 s .*ReadTimeout"):
        live.check()


def test_an_answer_restarts_the_count_and_zero_never_declares_dead() -> None:
    clock = Clock()
    live = StoreLiveness("s3://b", dead_after=30, clock=clock)
    live.unanswered(clock.t, timeout_error())
    clock.t += 20
    live.answered()
    clock.t += 25
    live.unanswered(clock.t - 25, timeout_error())  # started before the answer: silent 25 s only
    assert not live.dead
    never = StoreLiveness("s3://b", dead_after=0, clock=clock)
    never.unanswered(clock.t - 3600, timeout_error())
    assert not never.dead
    with pytest.raises(ValidationError, match="store_dead_after"):
        StoreLiveness("s3://b", dead_after=-1)


def test_what_is_no_answer() -> None:
    assert no_answer(timeout_error())
    assert no_answer(EndpointConnectionError(endpoint_url="http://127.0.0.1:9"))
    assert no_answer(ConnectionRefusedError())
    answered = ClientError({"Error": {"Code": "SlowDown"}, "ResponseMetadata": {"HTTPStatusCode": 503}}, "GetObject")
    assert not no_answer(answered)
    assert not no_answer(NoSuchObjectError("no object s3://b/k"))


def test_the_failure_budget_counts_a_dead_store() -> None:
    budget = StoreFailureBudget(2)
    budget.record(StoreUnavailableError.__name__, "dead")
    budget.record(StoreUnavailableError.__name__, "dead")
    assert budget.exhausted


def test_a_store_that_answers_stays_alive(moto_endpoint: str) -> None:
    bucket = f"live-{uuid.uuid4().hex[:16]}"
    inner = S3BlobStore(bucket, endpoint_url=moto_endpoint, region="us-east-1", max_attempts=1)
    inner.client.create_bucket(Bucket=bucket)
    clock = Clock()
    live = StoreLiveness("s3://" + bucket, dead_after=5, clock=clock)
    store = GuardedStore(inner, live)
    store.put("k", b"v")
    assert store.get("k") == b"v" and store.driver == inner.driver and store.bucket == bucket
    live.unanswered(clock.t, timeout_error())
    clock.t += 10
    with pytest.raises(NoSuchObjectError):  # an error answer is an answer
        store.get("missing")
    assert not live.dead and live._silent_since is None
    with pytest.raises(ValidationError):  # refused before any request: says nothing
        store.delete("k")


def test_a_refusing_port_is_declared_dead_then_fails_at_once() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: connections are refused
    loc = StoreLocation.from_url(f"s3://bkt/p?endpoint=http://127.0.0.1:{port}&max_attempts=1&connect_timeout=1")
    store = guarded(loc, loc.open(), dead_after=0.001)
    with pytest.raises(StoreUnavailableError, match=f"s3://bkt at http://127.0.0.1:{port} is not answering") as e:
        store.head("k")
    assert isinstance(e.value.__cause__, BlobStoreError)  # the request's own error, kept as the cause
    with pytest.raises(StoreUnavailableError):
        store.list("p/")  # no request made: the inner store is not called
    assert guarded(StoreLocation.from_url("file:///tmp/x"), "fs-store") == "fs-store"  # nothing to time out


def test_store_dead_after_setting() -> None:
    base = Config.for_workspace("/tmp/w")
    assert base.store_dead_after == 30.0
    assert Config.load(None, env={"TIERED_METADATA_URL": base.metadata_url, "TIERED_HOT_URL": base.hot_url,
                                  "TIERED_STORE_URL": base.store_url,
                                  "TIERED_STORE_DEAD_AFTER": "2.5"}).store_dead_after == 2.5
    for bad in (-1.0, float("nan"), 3601.0):
        with pytest.raises(ValidationError, match="store_dead_after"):
            Config.for_workspace("/tmp/w", store_dead_after=bad)
