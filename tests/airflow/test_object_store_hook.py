"""TieredObjectStoreHook (plugins/tiered_hooks.py): the preflight check of the configured object store,
on a directory and on moto's S3 server; store URLs parsed by tieredcore's StoreLocation."""

from __future__ import annotations

import json
import os
import socket
import uuid
from pathlib import Path

import pytest


def _closed_port_endpoint() -> str:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def _bucket(moto_endpoint: str) -> str:
    import boto3

    name = f"hook-{uuid.uuid4().hex[:20]}"
    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1").create_bucket(Bucket=name)
    return name


def _aws_connection(monkeypatch: pytest.MonkeyPatch, endpoint: str) -> None:
    conn = {"conn_type": "aws", "login": "testing", "password": "testing",
            "extra": {"endpoint_url": endpoint, "region_name": "us-east-1"}}
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps(conn))


# -- file:// ------------------------------------------------------------------------------------------


def test_directory_exists_and_is_writable(tmp_path: Path) -> None:
    from tiered_airflow import TieredObjectStoreHook

    hook = TieredObjectStoreHook(f"{tmp_path.as_uri()}?prefix=offloaded")
    assert hook.location.scheme == "file" and hook.location.root == str(tmp_path)
    assert hook.check() == f"directory {tmp_path} exists and is writable"


def test_missing_directory(tmp_path: Path) -> None:
    from airflow.sdk.exceptions import AirflowFailException
    from tiered_airflow import TieredObjectStoreHook

    url = (tmp_path / "missing").as_uri()
    with pytest.raises(AirflowFailException, match=f"object store {url}: directory .*missing does not exist"):
        TieredObjectStoreHook(url).check()


def test_directory_not_writable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tiered_hooks
    from airflow.sdk.exceptions import AirflowFailException
    from tiered_airflow import TieredObjectStoreHook

    store = tmp_path / "ro"
    store.mkdir()
    store.chmod(0o500)
    if os.access(store, os.W_OK):  # root ignores the mode bits: answer as for any other user
        real_access = os.access
        monkeypatch.setattr(tiered_hooks.os, "access", lambda p, mode: False if Path(p) == store
                            else real_access(p, mode))
    try:
        with pytest.raises(AirflowFailException, match=f"directory {store} is not writable"):
            TieredObjectStoreHook(store.as_uri()).check()
    finally:
        store.chmod(0o700)


# -- s3:// (moto) -------------------------------------------------------------------------------------


def test_bucket_reachable_with_endpoint_in_url_and_no_connection(moto_endpoint: str) -> None:
    """No AWS connection: boto3's default chain (the session's dummy credentials)."""
    from tiered_airflow import TieredObjectStoreHook

    bucket = _bucket(moto_endpoint)
    result = TieredObjectStoreHook(f"s3://{bucket}/p/?endpoint={moto_endpoint}&region=us-east-1").check()
    assert result == f"bucket {bucket!r} at {moto_endpoint} (connection none: default AWS chain) is reachable"


def test_bucket_reachable_through_connection_endpoint(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from tiered_airflow import TieredObjectStoreHook

    bucket = _bucket(moto_endpoint)
    _aws_connection(monkeypatch, moto_endpoint)
    result = TieredObjectStoreHook(f"s3://{bucket}/p").check()
    assert result == f"bucket {bucket!r} at {moto_endpoint} (connection aws_default) is reachable"


def test_endpoint_in_url_wins_over_connection(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from tiered_airflow import TieredObjectStoreHook

    bucket = _bucket(moto_endpoint)
    _aws_connection(monkeypatch, _closed_port_endpoint())  # the connection's endpoint would fail
    result = TieredObjectStoreHook(f"s3://{bucket}/p?endpoint={moto_endpoint}").check()
    assert result == f"bucket {bucket!r} at {moto_endpoint} (connection aws_default) is reachable"


def test_missing_bucket(moto_endpoint: str) -> None:
    from airflow.sdk.exceptions import AirflowFailException
    from tiered_airflow import TieredObjectStoreHook

    url = f"s3://no-such-bucket-{uuid.uuid4().hex[:12]}/p?endpoint={moto_endpoint}"
    with pytest.raises(AirflowFailException, match=rf"at {moto_endpoint} \(connection none: default AWS chain\): "
                                                   "does not exist"):
        TieredObjectStoreHook(url).check()


def test_unreachable_endpoint(aws_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk.exceptions import AirflowFailException
    from tiered_airflow import TieredObjectStoreHook

    endpoint = _closed_port_endpoint()
    with pytest.raises(AirflowFailException, match=rf"bucket 'bucket-x' at {endpoint} .*is unreachable"):
        TieredObjectStoreHook(f"s3://bucket-x/p?endpoint={endpoint}", timeout=2).check()
    # no endpoint in the store URL: the connection's endpoint_url is used, and named
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps(
        {"conn_type": "aws", "login": "k", "password": "s", "extra": {"endpoint_url": endpoint}}))
    with pytest.raises(AirflowFailException, match=rf"at {endpoint} \(connection aws_default\) is unreachable"):
        TieredObjectStoreHook("s3://bucket-x/p", timeout=2).check()


@pytest.mark.parametrize(("url", "message"), [
    ("ftp://host/dir", "unsupported scheme 'ftp'"),
    ("s3://Bad_Bucket/p", "bad bucket name 'Bad_Bucket'"),
    ("s3://bucket-x/p?endpoint=ftp://host", "endpoint must be an http:// or https:// URL"),
    ("s3://bucket-x/p?colour=blue", "unknown parameter"),
    ("file://relative/dir", "expected file:///absolute/path"),
    ("s3://k:secret@bucket-x/p", "no user:password@ in store URLs"),
])
def test_bad_url_fails_clearly_without_lookups(url: str, message: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """StoreLocation's ValidationError as a non-retried failure, before any connection or store access."""
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowFailException
    from tiered_airflow import TieredObjectStoreHook

    def boom(*a, **k):
        raise AssertionError("looked up a connection for a bad URL")

    monkeypatch.setattr(BaseHook, "get_connection", classmethod(boom))
    hook = TieredObjectStoreHook(url)  # nothing is parsed or looked up before check()
    with pytest.raises(AirflowFailException, match=rf"^object store URL: .*{message}") as e:
        hook.check()
    assert "secret" not in str(e.value)
