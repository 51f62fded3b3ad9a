"""Hooks of the tiered-storage project (imported by ``tiered_airflow.py``; like it, listed in
``plugins/.airflowignore`` so the plugins manager does not load it a second time). No I/O at import time.

- ``TieredObjectStoreHook``: is the configured object store usable? (the DAGs' preflight check).
- ``azure_environment`` / ``gcs_environment``: the Azure Blob (``wasb``) and Google Cloud connections as the
  environment variables tieredcore's azure:// and gs:// stores read (tieredcore.cold.backends.azure / .gcs). The
  connections' fields are read directly: neither the Microsoft Azure nor the Google provider is needed.
"""

from __future__ import annotations

import json
import os
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook

if TYPE_CHECKING:
    from tieredcore.cold.location import StoreLocation

WASB_CONN_ID = "wasb_default"
GCP_CONN_ID = "google_cloud_default"


def _connection(conn_id: str | None) -> Any:
    """The Airflow connection, or None when there is none of that id."""
    if not conn_id:
        return None
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        return BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return None


def _extra(conn: Any, name: str, conn_type: str) -> str:
    """An extra field, under its plain name or the older ``extra__<type>__<name>`` one."""
    extra = conn.extra_dejson or {}
    value = extra.get(name) or extra.get(f"extra__{conn_type}__{name}")
    return value if isinstance(value, str) else ("" if value is None else str(value))


def _masked(*secrets: str) -> None:
    from airflow.sdk.log import mask_secret

    for secret in secrets:
        if secret:
            mask_secret(secret)  # any log line that would show it shows *** instead


def azure_environment(wasb_conn_id: str | None = WASB_CONN_ID) -> dict[str, str]:
    """Environment for an azure:// store from the Azure Blob Storage connection (conn type ``wasb``):
    the extra ``connection_string`` -> ``AZURE_STORAGE_CONNECTION_STRING``; else the login (account name)
    and password (account key; or the extra ``shared_access_key``) -> ``AZURE_STORAGE_ACCOUNT`` and
    ``AZURE_STORAGE_KEY``, the extra ``sas_token`` -> ``AZURE_STORAGE_SAS_TOKEN``, and the host when it is an
    http(s) URL (the account's blob endpoint, Azurite's ``http://host:port/devstoreaccount1``) ->
    ``AZURE_STORAGE_BLOB_ENDPOINT``. No connection -> {}."""
    conn = _connection(wasb_conn_id)
    if conn is None:
        return {}
    conn_string = _extra(conn, "connection_string", "wasb")
    if conn_string:
        _masked(conn_string)
        return {"AZURE_STORAGE_CONNECTION_STRING": conn_string}
    env: dict[str, str] = {}
    key = conn.password or _extra(conn, "shared_access_key", "wasb")
    if conn.login:
        env["AZURE_STORAGE_ACCOUNT"] = conn.login
    if key:
        _masked(key)
        env["AZURE_STORAGE_KEY"] = key
    sas = _extra(conn, "sas_token", "wasb")
    if sas:
        _masked(sas)
        env["AZURE_STORAGE_SAS_TOKEN"] = sas
    host = conn.host or ""
    if host.startswith(("http://", "https://")):
        env["AZURE_STORAGE_BLOB_ENDPOINT"] = host.rstrip("/")
    return env


def gcs_environment(gcp_conn_id: str | None = GCP_CONN_ID) -> dict[str, str]:
    """Environment for a gs:// store from the Google Cloud connection (conn type ``google_cloud_platform``):
    the extra ``key_path`` -> ``GOOGLE_APPLICATION_CREDENTIALS``, ``keyfile_dict`` (the key itself) ->
    ``TIERED_GCS_KEYFILE_JSON`` (masked; never written to disk), ``project`` -> ``GOOGLE_CLOUD_PROJECT``.
    Neither key -> Application Default Credentials of the worker. No connection -> {}."""
    conn = _connection(gcp_conn_id)
    if conn is None:
        return {}
    kind = "google_cloud_platform"
    env: dict[str, str] = {}
    key_path = _extra(conn, "key_path", kind)
    keyfile = (conn.extra_dejson or {}).get("keyfile_dict") or (conn.extra_dejson or {}).get(
        f"extra__{kind}__keyfile_dict")
    if key_path:
        env["GOOGLE_APPLICATION_CREDENTIALS"] = key_path
    elif keyfile:
        text = keyfile if isinstance(keyfile, str) else json.dumps(keyfile)
        _masked(text)
        env["TIERED_GCS_KEYFILE_JSON"] = text
    project = _extra(conn, "project", kind)
    if project:
        env["GOOGLE_CLOUD_PROJECT"] = project
    return env


def cloud_environment(wasb_conn_id: str | None = WASB_CONN_ID, gcp_conn_id: str | None = GCP_CONN_ID
                      ) -> dict[str, str]:
    return {**azure_environment(wasb_conn_id), **gcs_environment(gcp_conn_id)}


class TieredObjectStoreHook(BaseHook):
    """The object store a store URL names (``file:///dir`` or ``s3://bucket/prefix?endpoint=...``, parsed
    by tieredcore's ``StoreLocation``), reached the way the DAGs' tasks reach it.

    ``check()`` fails fast (AirflowFailException, a clear message, nothing retried) when the store is not
    usable: ``file://`` -> the directory exists and is writable; ``s3://`` -> ``head_bucket`` through the
    Amazon provider's S3Hook with the AWS connection ``aws_conn_id`` (its ``endpoint_url`` extra; an
    ``endpoint=`` in the store URL wins; no such connection -> boto3's default chain), short timeouts and
    one retry; ``azure://`` and ``gs://`` -> one listing of the container/bucket through tieredcore's store,
    with the connections ``wasb_conn_id`` / ``gcp_conn_id`` as environment (as the Spark jobs get them)."""

    hook_name = "Tiered object store"

    def __init__(self, store_url: str, aws_conn_id: str | None = "aws_default", timeout: float = 5.0, *,
                 wasb_conn_id: str | None = WASB_CONN_ID, gcp_conn_id: str | None = GCP_CONN_ID) -> None:
        super().__init__()
        self.store_url = store_url
        self.aws_conn_id = aws_conn_id
        self.wasb_conn_id = wasb_conn_id
        self.gcp_conn_id = gcp_conn_id
        self.timeout = timeout

    @cached_property
    def location(self) -> StoreLocation:
        """The parsed store URL (AirflowFailException: a URL tieredcore does not accept)."""
        from airflow.sdk.exceptions import AirflowFailException

        from tieredcore.cold.location import StoreLocation
        from tieredcore.errors import ValidationError

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
        if self.location.scheme in ("azure", "gs"):
            return self._check_cloud_store()
        return self._check_bucket(self.location.bucket)

    def _check_cloud_store(self) -> str:
        """One listing of at most one key under the prefix, with short timeouts and no retry."""
        from dataclasses import replace

        from airflow.sdk.exceptions import AirflowFailException

        from tieredcore.errors import TieredError

        loc = replace(self.location, connect_timeout=self.timeout, read_timeout=self.timeout, max_attempts=1)
        conn_id = self.wasb_conn_id if loc.scheme == "azure" else self.gcp_conn_id
        conn_env = azure_environment(conn_id) if loc.scheme == "azure" else gcs_environment(conn_id)
        what = "container" if loc.scheme == "azure" else "bucket"
        where = f"{what} {loc.bucket!r} (connection {conn_id if conn_env else 'none: the environment'})"
        try:
            loc.open(env={**os.environ, **conn_env}).list(loc.prefix, page_size=1)
        except TieredError as e:
            raise AirflowFailException(f"object store {self.store_url}: {where}: {e}") from None
        return f"{where} is reachable"

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
