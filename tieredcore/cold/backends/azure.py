"""Azure Blob Storage implementation of BlobStore (block blobs), on azure-storage-blob.

- Objects are block blobs; a multipart upload stages one block per part on the target blob and commits
  the block list at complete (blocks not in the list are discarded by Azure). A block id carries the
  upload id, the part number and a digest of the part, so a part list naming a block that was never
  staged (or a stale one) is rejected before anything is committed.
- In-progress uploads are recorded by marker blobs under ``.tiered/uploads/`` (tieredcore.cold.backends.cloud).
  Abort deletes the marker and, when no committed blob exists at the key, the staged blocks (commit an
  empty list if the blob is still missing, then delete exactly that version). Staged blocks of a key
  that already has a committed blob stay until its next commit or Azure's one-week clean-up; no object
  ever shows them.
- User metadata names must be C# identifiers on Azure: a key that is one (lower-cased, as every store
  returns keys) is stored as is, so Pulsar's ``s3managedledgeroffloaderformatversion``-style keys are read
  by any Azure client; any other key is stored hex-encoded behind ``tieredx_`` and decoded on read.
- Conditional create: Put Blob with If-None-Match: * (``upload_blob(overwrite=False)``).
- Listing fills pages across service pages (start_after has no server-side counterpart in the Blob API:
  keys up to it are skipped while listing); the continuation token names the service page and the last
  key returned.
- Deletion: blob batches of up to 256 keys; a missing key is fine.
- Requests: connect/read timeouts and ``max_attempts`` attempts in all, backing off 0.5 s doubling to 8 s.

Credentials come from the environment, never from URLs or command lines:
``AZURE_STORAGE_CONNECTION_STRING``, or ``AZURE_STORAGE_ACCOUNT`` with ``AZURE_STORAGE_KEY`` (Pulsar's name
``AZURE_STORAGE_ACCESS_KEY`` is read too) or with a shared access signature ``AZURE_STORAGE_SAS_TOKEN``
(it must allow read, write, delete and list on the container), and optionally
``AZURE_STORAGE_BLOB_ENDPOINT``. An ``endpoint=``
in the store URL (Azurite: ``http://127.0.0.1:10000/devstoreaccount1``) wins over both.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import os
import random
import re
from collections.abc import Mapping, Sequence
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import AzureError, HttpResponseError, ResourceExistsError, ResourceNotFoundError
from azure.storage.blob import BlobBlock, BlobServiceClient, ExponentialRetry

from tieredcore.cold.backends.cloud import (
    UPLOADS_PREFIX,
    UploadRecord,
    check_key,
    check_range,
    decode_token,
    encode_token,
    is_internal,
    marker_key,
    part_body,
    upload_record,
    uploads_listed,
)
from tieredcore.cold.blob import (
    CompletedPart,
    ListPage,
    MultipartUploadInfo,
    ObjectInfo,
    Pieces,
    check_part_number,
    check_parts,
    normalize_metadata,
)
from tieredcore.cold.client_settings import S3_CONNECT_TIMEOUT, S3_MAX_ATTEMPTS, S3_READ_TIMEOUT
from tieredcore.cold.drivers import DRIVER_AZURE, pulsar_properties
from tieredcore.cold.requests import counted
from tieredcore.errors import (
    BadRangeError,
    BlobStoreError,
    NoSuchObjectError,
    NoSuchUploadError,
    ObjectExistsError,
    TieredError,
    ValidationError,
)
from tieredcore.model import Buffer

ENV_CONNECTION_STRING = "AZURE_STORAGE_CONNECTION_STRING"
ENV_ACCOUNT = "AZURE_STORAGE_ACCOUNT"
ENV_KEY = "AZURE_STORAGE_KEY"
ENV_KEY_PULSAR = "AZURE_STORAGE_ACCESS_KEY"
ENV_ENDPOINT = "AZURE_STORAGE_BLOB_ENDPOINT"
ENV_SAS = "AZURE_STORAGE_SAS_TOKEN"
DELETE_BATCH = 256  # blob batch limit
MAX_PAGE = 5000  # List Blobs maxresults limit

_IDENT = re.compile(r"^[a-z_][a-z0-9_]*$")
_ENCODED = "tieredx_"


def encode_metadata(meta: Mapping[str, str]) -> dict[str, str]:
    """Azure-legal metadata names (see the module docstring); keys are already lower-cased."""
    return {(k if _IDENT.match(k) and not k.startswith(_ENCODED) else _ENCODED + k.encode().hex()): v
            for k, v in meta.items()}


def decode_metadata(meta: Mapping[str, str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in (meta or {}).items():
        k = k.lower()
        if k.startswith(_ENCODED):
            with contextlib.suppress(ValueError):  # not ours: keep the name as stored
                k = bytes.fromhex(k[len(_ENCODED):]).decode()
        out[k] = v
    return out


def _block_owner(upload_id: str, part_number: int) -> bytes:
    return bytes.fromhex(upload_id) + part_number.to_bytes(2, "big")


def _block_id(upload_id: str, part_number: int, body: bytes) -> str:
    # every block id of a blob must have the same length: 16 + 2 + 8 bytes, 36 base64 characters
    raw = _block_owner(upload_id, part_number) + hashlib.md5(body, usedforsecurity=False).digest()[:8]
    return base64.b64encode(raw).decode()


def _block_id_owner(block_id: str) -> bytes:
    """The upload id + part number a block id of ours starts with (b'' for anything else)."""
    try:
        return base64.b64decode(block_id, validate=True)[:18]
    except (binascii.Error, ValueError):
        return b""


def service_client(endpoint: str | None, env: Mapping[str, str] | None = None, **kwargs: Any) -> BlobServiceClient:
    """A BlobServiceClient with credentials from the environment (module docstring); ValidationError names
    the variables to set when none are there."""
    env = os.environ if env is None else env
    conn = env.get(ENV_CONNECTION_STRING)
    if conn:
        try:
            svc = BlobServiceClient.from_connection_string(conn, **kwargs)
        except ValueError as e:  # the message never contains the key
            raise ValidationError(f"{ENV_CONNECTION_STRING} is not a valid Azure Storage connection string: {e}") from None
        if endpoint:
            svc = BlobServiceClient(account_url=endpoint, credential=svc.credential, **kwargs)
        return svc
    account = env.get(ENV_ACCOUNT)
    key = env.get(ENV_KEY) or env.get(ENV_KEY_PULSAR)
    sas = env.get(ENV_SAS)
    if not account or not (key or sas):
        raise ValidationError(
            f"azure:// store: no credentials: set {ENV_CONNECTION_STRING}, or {ENV_ACCOUNT} and {ENV_KEY} (or "
            f"{ENV_SAS}; optionally {ENV_ENDPOINT}) in the environment"
        )
    url = endpoint or env.get(ENV_ENDPOINT) or f"https://{account}.blob.core.windows.net"
    credential: Any = {"account_name": account, "account_key": key} if key else sas.lstrip("?")
    return BlobServiceClient(account_url=url, credential=credential, **kwargs)


class _Backoff(ExponentialRetry):
    """The SDK's retry rules with shorter waits: 0.5 s doubling to 8 s, +-25 % jitter (its default waits
    15 s before the first retry; a batch job wants seconds and its own retries, as for S3)."""

    def get_backoff_time(self, settings: dict[str, Any]) -> float:
        return min(8.0, 0.5 * 2 ** max(0, settings["count"] - 1)) * random.uniform(0.75, 1.25)


@counted
class AzureBlobStore:
    """BlobStore on one Azure Blob container."""

    driver = DRIVER_AZURE
    copies_file_slices = False  # pieces are joined into one request body
    concurrent_parts = True  # staged blocks are independent until the block list is committed
    reads_ahead = False

    def __init__(
        self,
        container: str,
        *,
        endpoint: str | None = None,
        max_attempts: int = S3_MAX_ATTEMPTS,
        connect_timeout: float = S3_CONNECT_TIMEOUT,
        read_timeout: float = S3_READ_TIMEOUT,
        env: Mapping[str, str] | None = None,
        service: BlobServiceClient | None = None,
    ) -> None:
        if not container or not isinstance(container, str):
            raise ValidationError(f"Azure container name must be a non-empty str, got {container!r}")
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise ValidationError(f"max_attempts must be an int >= 1, got {max_attempts!r}")
        self.container = container
        self.endpoint = endpoint or None
        if service is None:
            retry = _Backoff(retry_total=max_attempts - 1)
            service = service_client(self.endpoint, env, connection_timeout=connect_timeout,
                                     read_timeout=read_timeout, retry_policy=retry)
        self.service = service
        self.client = service.get_container_client(container)

    def __repr__(self) -> str:
        return f"AzureBlobStore({self.container!r} at {self.client.url.rsplit('/', 1)[0]})"

    def driver_properties(self) -> dict[str, str]:
        # Pulsar's offload driver metadata: the driver, the container as "bucket", no region, the endpoint
        return pulsar_properties(DRIVER_AZURE, self.container, None, self.endpoint)

    # --- errors --------------------------------------------------------------------------------

    def _where(self, key: str | None) -> str:
        return f"azure://{self.container}/{key}" if key is not None else f"azure://{self.container}"

    def _error(self, exc: AzureError, op: str, key: str | None) -> TieredError:
        where = self._where(key)
        status = exc.status_code if isinstance(exc, HttpResponseError) else None  # None: no response
        # error_code is optional: azure-storage-blob sets it on the errors it raises from a service
        # response; azure-core's own errors (and an error without a response) have none
        code = str(getattr(exc, "error_code", "") or "")
        first_line = (str(exc.message or str(exc)).splitlines() or [""])[0][:300]
        text = f"{where}: {op} failed: {code or type(exc).__name__}" + (f" (HTTP {status})" if status else "") + (
            f": {first_line}" if first_line else "")
        if isinstance(exc, ResourceNotFoundError) and code != "ContainerNotFound":
            return NoSuchObjectError(f"no object {where}" if op in ("get", "get_range", "head") else text)
        if status == 416 or code == "InvalidRange":
            return BadRangeError(text)
        return BlobStoreError(text)

    def _blob(self, key: str) -> Any:
        return self.client.get_blob_client(key)

    # --- objects -------------------------------------------------------------------------------

    def put(self, key: str, data: Buffer, metadata: Mapping[str, str] | None = None, *,
            if_absent: bool = False) -> None:
        check_key(key, self._where(None))
        meta = encode_metadata(normalize_metadata(metadata))
        try:  # overwrite=False: Put Blob with If-None-Match: *
            self._blob(key).upload_blob(data if isinstance(data, bytes) else bytes(data),
                                        overwrite=not if_absent, metadata=meta)
        except ResourceExistsError as e:
            if if_absent:
                raise ObjectExistsError(f"object {self._where(key)} already exists") from e
            raise self._error(e, "put", key) from e
        except AzureError as e:
            if if_absent and isinstance(e, HttpResponseError) and e.status_code in (409, 412):
                raise ObjectExistsError(f"object {self._where(key)} already exists") from e
            raise self._error(e, "put", key) from e

    def get(self, key: str) -> bytes:
        try:
            return self._blob(key).download_blob().readall()
        except AzureError as e:
            raise self._error(e, "get", key) from e

    def get_range(self, key: str, start: int, end: int) -> bytes:
        check_range(start, end, self._where(key))
        try:
            data = self._blob(key).download_blob(offset=start, length=end - start + 1).readall()
        except AzureError as e:
            raise self._error(e, "get_range", key) from e
        if not data:  # Azure answers 416; Azurite an empty body: either way the start is past the end
            raise BadRangeError(f"range {start}-{end} of {self._where(key)} starts at or past its end")
        return data

    def head(self, key: str) -> ObjectInfo:
        try:
            p = self._blob(key).get_blob_properties()
        except AzureError as e:
            raise self._error(e, "head", key) from e
        return ObjectInfo(key=key, size=int(p.size), last_modified=p.last_modified.timestamp(),
                          metadata=decode_metadata(p.metadata))

    def list(self, prefix: str = "", token: str | None = None, page_size: int = 1000, *,
             start_after: str | None = None) -> ListPage:
        if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
            raise ValidationError(f"list: page_size must be a positive int, got {page_size!r}")
        marker, skip = decode_token(token) if token else (None, start_after)
        out: list[ObjectInfo] = []
        try:
            pages = self.client.list_blobs(name_starts_with=prefix or None,
                                           results_per_page=min(page_size, MAX_PAGE)).by_page(continuation_token=marker)
            for page in pages:
                items = list(page)
                for i, b in enumerate(items):
                    if (skip is not None and b.name <= skip) or is_internal(b.name):
                        continue
                    out.append(ObjectInfo(key=b.name, size=int(b.size), last_modified=b.last_modified.timestamp()))
                    if len(out) == page_size:
                        if i + 1 < len(items):  # resume within this service page, after the last key returned
                            return ListPage(out, encode_token(marker, b.name))
                        nxt = pages.continuation_token  # this service page is done: resume at the next one
                        return ListPage(out, encode_token(nxt, b.name) if nxt else None)
                marker = pages.continuation_token
                if not marker:
                    break
        except AzureError as e:
            raise self._error(e, "list", prefix) from e
        return ListPage(out, None)

    def delete(self, keys: Sequence[str]) -> None:
        if isinstance(keys, str):
            raise ValidationError("delete() takes a sequence of keys, not a single str")
        keys = list(dict.fromkeys(keys))  # a batch may not name a blob twice
        for k in keys:
            check_key(k, self._where(None))
        failed: list[str] = []
        for i in range(0, len(keys), DELETE_BATCH):
            batch = keys[i : i + DELETE_BATCH]
            try:
                responses = self.client.delete_blobs(*batch, delete_snapshots="include", raise_on_any_failure=False)
            except AzureError as e:
                raise BlobStoreError(str(self._error(e, f"delete of {len(batch)} key(s) from {batch[0]!r}", None))) from e
            for k, r in zip(batch, responses, strict=False):
                if r.status_code not in (200, 202, 404):
                    failed.append(f"{k!r} (HTTP {r.status_code}: {r.reason})")
        if failed:
            raise BlobStoreError(f"{self._where(None)}: could not delete {len(failed)} key(s): "
                                 + ", ".join(failed[:20]) + (" ..." if len(failed) > 20 else ""))

    # --- multipart -----------------------------------------------------------------------------

    def initiate_multipart(self, key: str, metadata: Mapping[str, str] | None = None) -> str:
        check_key(key, self._where(None))
        rec = UploadRecord.start(key, normalize_metadata(metadata))
        try:
            self._blob(marker_key(rec.upload_id)).upload_blob(b"", overwrite=False, metadata=rec.marker_metadata())
        except AzureError as e:
            raise self._error(e, "initiate_multipart", key) from e
        return rec.upload_id

    def _record(self, key: str, upload_id: str, op: str) -> UploadRecord:
        def marker_metadata() -> Mapping[str, str] | None:
            try:
                return self._blob(marker_key(upload_id)).get_blob_properties().metadata
            except ResourceNotFoundError:
                return None
            except AzureError as e:
                raise self._error(e, op, key) from e

        return upload_record(self._where(None), key, upload_id, op, marker_metadata)

    def upload_part(self, key: str, upload_id: str, part_number: int, data: Buffer | Pieces) -> CompletedPart:
        check_part_number(part_number, self._where(key))
        self._record(key, upload_id, "upload_part")
        body = part_body(data)
        block_id = _block_id(upload_id, part_number, body)
        try:
            self._blob(key).stage_block(block_id, body)
        except AzureError as e:
            raise self._error(e, "upload_part", key) from e
        return CompletedPart(part_number=part_number, etag=block_id, size=len(body))

    def complete_multipart(self, key: str, upload_id: str, parts: Sequence[CompletedPart]) -> None:
        check_parts(parts, self._where(key))
        rec = self._record(key, upload_id, "complete_multipart")
        blob = self._blob(key)
        try:
            _, uncommitted = blob.get_block_list("uncommitted")
        except ResourceNotFoundError:
            uncommitted = []
        except AzureError as e:
            raise self._error(e, "complete_multipart", key) from e
        staged = {b.id for b in uncommitted}
        for p in parts:
            if p.etag not in staged or _block_id_owner(p.etag) != _block_owner(upload_id, p.part_number):
                raise ValidationError(
                    f"complete_multipart of {self._where(key)}: part {p.part_number} (etag {p.etag!r}) is not a "
                    f"part staged by upload {upload_id!r}"
                )
        try:
            blob.commit_block_list([BlobBlock(block_id=p.etag) for p in parts],
                                   metadata=encode_metadata(rec.metadata))
        except AzureError as e:
            raise self._error(e, "complete_multipart", key) from e
        self._drop_marker(upload_id, key)

    def _drop_marker(self, upload_id: str, key: str) -> None:
        try:
            self._blob(marker_key(upload_id)).delete_blob()
        except ResourceNotFoundError:
            pass
        except AzureError as e:
            raise self._error(e, "remove upload marker", key) from e

    def abort_multipart(self, key: str, upload_id: str) -> None:
        try:
            self._record(key, upload_id, "abort_multipart")
        except NoSuchUploadError:
            return
        self._drop_staged_blocks(key)
        self._drop_marker(upload_id, key)

    def _drop_staged_blocks(self, key: str) -> None:
        """Remove the blocks staged at a key that has no committed blob (see the module docstring)."""
        blob = self._blob(key)
        try:
            blob.get_blob_properties()
            return  # a committed blob exists: never touch it
        except ResourceNotFoundError:
            pass
        except AzureError as e:
            raise self._error(e, "abort_multipart", key) from e
        try:  # commits nothing if a blob appeared meanwhile (If-None-Match: *)
            done = blob.commit_block_list([], match_condition=MatchConditions.IfMissing)
        except (ResourceExistsError, ResourceNotFoundError):
            return
        except HttpResponseError as e:
            if e.status_code in (409, 412):
                return
            raise self._error(e, "abort_multipart", key) from e
        except AzureError as e:
            raise self._error(e, "abort_multipart", key) from e
        try:  # exactly the empty version just committed
            blob.delete_blob(etag=done["etag"], match_condition=MatchConditions.IfNotModified)
        except (ResourceNotFoundError, ResourceExistsError):
            pass
        except HttpResponseError as e:
            if e.status_code != 412:
                raise self._error(e, "abort_multipart", key) from e
        except AzureError as e:
            raise self._error(e, "abort_multipart", key) from e

    def list_multipart_uploads(self, prefix: str = "") -> list[MultipartUploadInfo]:
        try:
            return uploads_listed(((b.name, b.metadata) for b in self.client.list_blobs(
                name_starts_with=UPLOADS_PREFIX, include=["metadata"])), prefix, self._where(None))
        except AzureError as e:
            raise self._error(e, "list_multipart_uploads", prefix) from e
