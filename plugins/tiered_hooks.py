"""Hooks of the tiered-storage project (imported by ``tiered_airflow.py``; like it, listed in
``plugins/.airflowignore`` so the plugins manager does not load it a second time). No I/O at import time.

- ``TieredObjectStoreHook``: is the configured object store usable? (the DAGs' preflight check).
"""

from __future__ import annotations

import os
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook

if TYPE_CHECKING:
    from tieredcore.stores.location import StoreLocation


class TieredObjectStoreHook(BaseHook):
    """The object store a store URL names (``file:///dir`` or ``s3://bucket/prefix?endpoint=...``, parsed
    by tieredcore's ``StoreLocation``), reached the way the DAGs' tasks reach it.

    ``check()`` fails fast (AirflowFailException, a clear message, nothing retried) when the store is not
    usable: ``file://`` -> the directory exists and is writable; ``s3://`` -> ``head_bucket`` through the
    Amazon provider's S3Hook with the AWS connection ``aws_conn_id`` (its ``endpoint_url`` extra; an
    ``endpoint=`` in the store URL wins; no such connection -> boto3's default chain), short timeouts and
    one retry."""

    hook_name = "Tiered object store"

    def __init__(self, store_url: str, aws_conn_id: str | None = "aws_default", timeout: float = 5.0) -> None:
        super().__init__()
        self.store_url = store_url
        self.aws_conn_id = aws_conn_id
        self.timeout = timeout

    @cached_property
    def location(self) -> StoreLocation:
        """The parsed store URL (AirflowFailException: a URL tieredcore does not accept)."""
        from airflow.sdk.exceptions import AirflowFailException

        from tieredcore.errors import ValidationError
        from tieredcore.stores.location import StoreLocation

        try:
            return StoreLocation.from_url(self.store_url, "object store URL")
        except ValidationError as e:
            raise AirflowFailException(str(e)) from None

    @cached_property
    def connection_id(self) -> str | None:
        """``aws_conn_id`` when that connection exists, else None (boto3's default credential chain)."""
        from airflow.sdk.exceptions import AirflowNotFoundException

        if not self.aws_conn_id:
            return None
        try:
            self.get_connection(self.aws_conn_id)
        except AirflowNotFoundException:
            return None
        return self.aws_conn_id

    def get_conn(self) -> Any:
        """The boto3 S3 client of an ``s3://`` store: the URL's ``endpoint=`` (and ``region=``) if given,
        else the AWS connection's settings; connect/read timeouts of ``timeout`` seconds, 2 attempts."""
        from airflow.providers.amazon.aws.hooks.s3 import S3Hook

        loc = self.location
        if loc.scheme != "s3":
            raise ValueError(f"object store {self.store_url}: not an s3:// store")
        boto_config = {"connect_timeout": self.timeout, "read_timeout": self.timeout,
                       "retries": {"total_max_attempts": 2, "mode": "standard"}}
        s3 = S3Hook(aws_conn_id=self.connection_id, config=boto_config)
        if loc.endpoint:
            return s3.get_session(region_name=loc.region).client("s3", endpoint_url=loc.endpoint, config=s3.config)
        return s3.get_conn()

    def check(self) -> str:
        """What was found usable (for the task log); AirflowFailException says what is not."""
        if self.location.scheme == "file":
            return self._check_directory(Path(self.location.root))
        return self._check_bucket(self.location.bucket)

    def _check_directory(self, path: Path) -> str:
        from airflow.sdk.exceptions import AirflowFailException

        if not path.is_dir():
            raise AirflowFailException(f"object store {self.store_url}: directory {path} does not exist")
        if not os.access(path, os.W_OK | os.X_OK):
            raise AirflowFailException(f"object store {self.store_url}: directory {path} is not writable")
        return f"directory {path} exists and is writable"

    def _check_bucket(self, bucket: str) -> str:
        import botocore.exceptions
        from airflow.sdk.exceptions import AirflowFailException

        client = self.get_conn()
        endpoint = self.location.endpoint or client.meta.endpoint_url
        where = (f"bucket {bucket!r} at {endpoint} "
                 f"(connection {self.connection_id or 'none: default AWS chain'})")
        try:
            client.head_bucket(Bucket=bucket)
        except botocore.exceptions.ClientError as e:
            code = e.response.get("Error", {}).get("Code", "?")
            what = {"404": "does not exist", "NoSuchBucket": "does not exist", "403": "access denied"}.get(code, code)
            raise AirflowFailException(f"object store {self.store_url}: {where}: {what}") from None
        except (botocore.exceptions.BotoCoreError, OSError) as e:
            raise AirflowFailException(f"object store {self.store_url}: {where} is unreachable: {e}") from None
        return f"{where} is reachable"
