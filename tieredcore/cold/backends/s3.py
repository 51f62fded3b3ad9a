"""S3 implementation of BlobStore (AWS S3 or any S3-compatible server), on boto3.

Errors are mapped onto tieredcore.errors: NoSuchKey/404 -> NoSuchObjectError, NoSuchUpload ->
NoSuchUploadError, InvalidRange/416 -> BadRangeError, rejected part lists at complete ->
ValidationError, anything else -> BlobStoreError naming the bucket, key, operation and S3 error code
(never credentials).

moto's server answers an unknown multipart upload id on UploadPart/CompleteMultipartUpload with a bare
HTTP 500 (S3: 404 NoSuchUpload). Such a bare 500 (no S3 error code in the body) on those two
operations is not retried; the store then asks ListParts whether the upload exists and raises
NoSuchUploadError when it does not. Real S3 500s carry an error code ("InternalError") and are retried
as usual.

Timeouts and the retry budget default to seconds, not botocore's 60 s x 5 (see tieredcore.config: a
batch job should fail a request quickly and leave the rest to its own retries): connect and read
timeouts, total attempts per request (the first one included) and botocore's retry mode ("adaptive"
adds client-side rate limiting when the server throttles, e.g. 503 SlowDown).
"""

from __future__ import annotations

import io
import random
import time
from collections.abc import Mapping, Sequence
from typing import Any

import boto3
from botocore.awsrequest import AWSResponse
from botocore.client import BaseClient
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    IncompleteReadError,
    ReadTimeoutError,
    ResponseStreamingError,
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
    read_piece,
)
from tieredcore.cold.client_settings import (
    S3_CONNECT_TIMEOUT,
    S3_MAX_ATTEMPTS,
    S3_READ_TIMEOUT,
    S3_RETRY_MODE,
    S3_RETRY_MODES,
)
from tieredcore.cold.drivers import DRIVER_S3, pulsar_properties
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

DELETE_BATCH = 1000  # DeleteObjects limit
_NOT_FOUND_CODES = {"NoSuchKey", "404", "NotFound"}
_BAD_PARTS_CODES = {"InvalidPart", "InvalidPartOrder", "EntityTooSmall", "MalformedXML"}
_BARE_500_OPS = ("UploadPart", "CompleteMultipartUpload")


def _body(data: Buffer) -> bytes | bytearray:
    """boto3 takes bytes, bytearray or a file; a memoryview must be copied."""
    if isinstance(data, bytes | bytearray):
        return data
    mv = memoryview(data)
    return mv.tobytes()


class _ViewBody(io.RawIOBase):
    """A read-only, seekable file over a buffer: botocore streams (and re-reads on a retry) a request
    body from it, where bytes would first copy the block's slice (parts sent concurrently would each hold
    a copy: tens of MiB of peak memory)."""

    def __init__(self, data: Buffer) -> None:
        self._mv = memoryview(data).cast("B")
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        n = min(len(b), len(self._mv) - self._pos)
        b[:n] = self._mv[self._pos : self._pos + n]
        self._pos += n
        return n

    def read(self, size: int = -1) -> memoryview:  # type: ignore[override]
        """A view of the next ``size`` bytes, not a copy: the request hashes, checksums and sends them as
        they are (RawIOBase.read would copy each block twice; 8 MiB parts go out in 16 KiB blocks)."""
        end = len(self._mv) if size is None or size < 0 else min(len(self._mv), self._pos + size)
        view = self._mv[self._pos : end]
        self._pos = max(self._pos, end)
        return view

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._mv)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def __len__(self) -> int:
        return len(self._mv)

    def close(self) -> None:
        self._mv.release()
        super().close()


def _is_bare_500(response: Any) -> bool:
    """A 500 without an S3 error code: moto's answer to an unknown upload id."""
    if not response:
        return False
    http, parsed = response
    if not isinstance(http, AWSResponse) or http.status_code != 500:
        return False
    code = str((parsed or {}).get("Error", {}).get("Code", ""))
    return code in ("", "500")


def _no_retry_on_bare_500(response: Any = None, **_: Any) -> bool | None:
    return False if _is_bare_500(response) else None


# a response whose body broke off: retried as a whole request (botocore retries only before the body)
_BODY_ERRORS = (ResponseStreamingError, IncompleteReadError, ReadTimeoutError, ConnectionClosedError)


def _backoff(attempt: int) -> float:
    return min(0.2 * 2 ** (attempt - 1), 5.0) * random.uniform(0.75, 1.25)


@counted
class S3BlobStore:
    """BlobStore on one S3 bucket."""

    driver = DRIVER_S3

    def __init__(
        self,
        bucket: str,
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
        session_token: str | None = None,
        max_attempts: int = S3_MAX_ATTEMPTS,
        connect_timeout: float = S3_CONNECT_TIMEOUT,
        read_timeout: float = S3_READ_TIMEOUT,
        retry_mode: str = S3_RETRY_MODE,
        client: BaseClient | None = None,
    ) -> None:
        if not bucket or not isinstance(bucket, str):
            raise ValidationError(f"S3 bucket name must be a non-empty str, got {bucket!r}")
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise ValidationError(f"max_attempts must be an int >= 1, got {max_attempts!r}")
        for name, v in (("connect_timeout", connect_timeout), ("read_timeout", read_timeout)):
            if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0:
                raise ValidationError(f"{name} must be a positive number of seconds, got {v!r}")
        if retry_mode not in S3_RETRY_MODES:
            raise ValidationError(f"retry_mode must be one of {', '.join(S3_RETRY_MODES)}, got {retry_mode!r}")
        self.bucket = bucket
        self.endpoint_url = endpoint_url or None
        self.max_attempts = max_attempts
        if client is None:
            config_kwargs: dict[str, Any] = {
                "connect_timeout": connect_timeout,
                "read_timeout": read_timeout,
                # total attempts, the first one included (botocore's "max_attempts" counts retries only)
                "retries": {"total_max_attempts": max_attempts, "mode": retry_mode},
            }
            if self.endpoint_url:
                config_kwargs["s3"] = {"addressing_style": "path"}
            session = boto3.session.Session(
                aws_access_key_id=access_key,
                aws_secret_access_key=secret_key,
                aws_session_token=session_token,
                region_name=region,
            )
            client = session.client("s3", endpoint_url=self.endpoint_url, config=Config(**config_kwargs))
        self.client = client
        self.region = region or client.meta.region_name or "us-east-1"  # None: the client has no region
        for op in _BARE_500_OPS:
            client.meta.events.register_first(
                f"needs-retry.s3.{op}", _no_retry_on_bare_500, unique_id=f"tieredcore-bare-500-{op}"
            )

    def __repr__(self) -> str:
        where = f" at {self.endpoint_url}" if self.endpoint_url else ""
        return f"S3BlobStore({self.bucket!r}{where})"

    def driver_properties(self) -> dict[str, str]:
        return pulsar_properties(DRIVER_S3, self.bucket, self.region, self.endpoint_url)

    # --- errors --------------------------------------------------------------------------------

    def _where(self, key: str | None) -> str:
        return f"s3://{self.bucket}/{key}" if key is not None else f"s3://{self.bucket}"

    def _error(self, exc: Exception, op: str, key: str | None) -> TieredError:
        where = self._where(key)
        if isinstance(exc, ClientError):
            err = exc.response.get("Error", {}) or {}
            code = str(err.get("Code", "") or "")
            status = (exc.response.get("ResponseMetadata", {}) or {}).get("HTTPStatusCode")
            message = str(err.get("Message", "") or "")[:300]
            text = f"{where}: {op} failed: {code or 'error'} (HTTP {status})" + (
                f": {message}" if message else ""
            )
            if code in _NOT_FOUND_CODES or (status == 404 and code not in ("NoSuchBucket", "NoSuchUpload")):
                return NoSuchObjectError(f"no object {where}" if op in ("get", "get_range", "head") else text)
            if code == "NoSuchUpload":
                return NoSuchUploadError(text)
            if code == "InvalidRange" or status == 416:
                return BadRangeError(text)
            return BlobStoreError(text)
        detail = str(exc)[:300]
        return BlobStoreError(f"{where}: {op} failed: {type(exc).__name__}: {detail}")

    def _call(self, op: str, key: str | None, fn: Any, **kwargs: Any) -> Any:
        try:
            return fn(Bucket=self.bucket, **kwargs)
        except (ClientError, BotoCoreError) as e:
            raise self._error(e, op, key) from e

    def _upload_missing(self, key: str, upload_id: str) -> bool:
        """True when ListParts says the upload does not exist (used to decode moto's bare 500)."""
        try:
            self.client.list_parts(Bucket=self.bucket, Key=key, UploadId=upload_id, MaxParts=1)
        except ClientError as e:
            return e.response.get("Error", {}).get("Code") == "NoSuchUpload"
        except BotoCoreError:
            return False
        return False

    def _multipart_error(self, exc: Exception, op: str, key: str, upload_id: str) -> TieredError:
        if isinstance(exc, ClientError):
            code = str(exc.response.get("Error", {}).get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status == 500 and code in ("", "500") and self._upload_missing(key, upload_id):
                return NoSuchUploadError(f"{self._where(key)}: {op}: no multipart upload {upload_id!r}")
            if code in _BAD_PARTS_CODES:
                mapped = self._error(exc, op, key)
                return ValidationError(str(mapped))
        return self._error(exc, op, key)

    # --- objects -------------------------------------------------------------------------------

    def put(self, key: str, data: Buffer, metadata: Mapping[str, str] | None = None, *,
            if_absent: bool = False) -> None:
        meta = normalize_metadata(metadata)
        if not if_absent:
            self._call("put", key, self.client.put_object, Key=key, Body=_body(data), Metadata=meta)
            return
        try:  # S3 conditional write: If-None-Match: * (412 when the key exists)
            self.client.put_object(Bucket=self.bucket, Key=key, Body=_body(data), Metadata=meta, IfNoneMatch="*")
        except ClientError as e:
            code = str(e.response.get("Error", {}).get("Code", ""))
            status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412):
                raise ObjectExistsError(f"object {self._where(key)} already exists") from e
            raise self._error(e, "put", key) from e
        except BotoCoreError as e:
            raise self._error(e, "put", key) from e

    def get(self, key: str) -> bytes:
        return self._get_body("get", key)[1]

    def _get_body(self, op: str, key: str, **kwargs: Any) -> tuple[dict, bytes]:
        """GET and read the body. botocore retries a request that fails before its body, never a body
        cut off (a reset or a short read mid-body): that is retried here, the whole request again, with
        the same attempt budget and a jittered backoff (0.2 s doubling)."""
        for attempt in range(1, self.max_attempts + 1):
            resp = self._call(op, key, self.client.get_object, Key=key, **kwargs)
            body = resp["Body"]
            try:
                return resp, body.read()
            except _BODY_ERRORS as e:
                if attempt == self.max_attempts:
                    raise BlobStoreError(f"{self._where(key)}: {op}: the response body was cut off "
                                         f"{self.max_attempts} time(s) (last: {type(e).__name__}: {e})") from e
            except (ClientError, BotoCoreError) as e:
                raise self._error(e, op, key) from e
            finally:
                body.close()
            time.sleep(_backoff(attempt))
        raise AssertionError("unreachable")

    def get_range(self, key: str, start: int, end: int) -> bytes:
        if start < 0 or end < start:
            raise BadRangeError(f"bad range {start}-{end} for {self._where(key)}")
        resp, data = self._get_body("get_range", key, Range=f"bytes={start}-{end}")
        if resp.get("ResponseMetadata", {}).get("HTTPStatusCode") == 200 and not resp.get("ContentRange"):
            # a server that ignored the Range header sent the whole object
            if start >= len(data):
                raise BadRangeError(
                    f"range {start}-{end} of {self._where(key)} starts past its end ({len(data)} bytes)"
                )
            data = data[start : end + 1]
        return data

    def head(self, key: str) -> ObjectInfo:
        for attempt in range(1, self.max_attempts + 1):
            resp = self._call("head", key, self.client.head_object, Key=key)
            size, modified = resp.get("ContentLength"), resp.get("LastModified")
            if size is not None and modified is not None:
                return ObjectInfo(key=key, size=int(size), last_modified=modified.timestamp(),
                                  metadata={k.lower(): v for k, v in (resp.get("Metadata") or {}).items()})
            if attempt < self.max_attempts:  # a proxy that dropped a header: ask again
                time.sleep(_backoff(attempt))
        missing = " and ".join(h for h, v in (("Content-Length", size), ("Last-Modified", modified)) if v is None)
        raise BlobStoreError(f"{self._where(key)}: head: the response has no {missing} header "
                             f"({self.max_attempts} attempt(s)): not an S3-conforming answer")

    def list(self, prefix: str = "", token: str | None = None, page_size: int = 1000, *,
             start_after: str | None = None) -> ListPage:
        if not isinstance(page_size, int) or page_size < 1:
            raise ValidationError(f"list: page_size must be a positive int, got {page_size!r}")
        kwargs: dict[str, Any] = {"Prefix": prefix, "MaxKeys": page_size}
        if token:
            kwargs["ContinuationToken"] = token
        elif start_after:
            kwargs["StartAfter"] = start_after
        resp = self._call("list", prefix, self.client.list_objects_v2, **kwargs)
        objects = [
            ObjectInfo(key=o["Key"], size=int(o["Size"]), last_modified=o["LastModified"].timestamp())
            for o in resp.get("Contents", [])
        ]
        next_token = resp.get("NextContinuationToken") if resp.get("IsTruncated") else None
        return ListPage(objects=objects, next_token=next_token or None)

    def delete(self, keys: Sequence[str]) -> None:
        if isinstance(keys, str):
            raise ValidationError("delete() takes a sequence of keys, not a single str")
        keys = list(keys)
        failed: list[str] = []
        for i in range(0, len(keys), DELETE_BATCH):
            batch = keys[i : i + DELETE_BATCH]
            try:
                resp = self.client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True}
                )
            except (ClientError, BotoCoreError) as e:
                mapped = self._error(e, f"delete of {len(batch)} key(s) starting at {batch[0]!r}", None)
                raise BlobStoreError(str(mapped)) from e
            for err in resp.get("Errors", []) or []:
                if err.get("Code") == "NoSuchKey":
                    continue
                failed.append(f"{err.get('Key')!r} ({err.get('Code')}: {err.get('Message', '')})")
        if failed:
            raise BlobStoreError(
                f"s3://{self.bucket}: could not delete {len(failed)} key(s): "
                + ", ".join(failed[:20])
                + (" ..." if len(failed) > 20 else "")
            )

    # --- multipart -----------------------------------------------------------------------------

    def initiate_multipart(self, key: str, metadata: Mapping[str, str] | None = None) -> str:
        meta = normalize_metadata(metadata)
        # CRC32 per part, checked by the store on receipt, and a composite checksum of the object; the
        # completion names each part's (moto completed 32 MiB objects in 68-72 ms instead of 93-108)
        resp = self._call(
            "initiate_multipart", key, self.client.create_multipart_upload, Key=key, Metadata=meta,
            ChecksumAlgorithm="CRC32",
        )
        return resp["UploadId"]

    copies_file_slices = False  # pieces are joined into one request body
    concurrent_parts = True  # boto3 clients are thread-safe; parts may be uploaded in any order
    reads_ahead = False

    def upload_part(self, key: str, upload_id: str, part_number: int, data: Buffer | Pieces) -> CompletedPart:
        check_part_number(part_number, self._where(key))
        if not isinstance(data, bytes | bytearray | memoryview):
            data = b"".join(memoryview(read_piece(p)) for p in data)
        body = data if isinstance(data, bytes | bytearray) else _ViewBody(data)
        size = len(body)
        try:
            resp = self.client.upload_part(
                Bucket=self.bucket, Key=key, UploadId=upload_id, PartNumber=part_number, Body=body,
                ChecksumAlgorithm="CRC32",
            )
        except (ClientError, BotoCoreError) as e:
            raise self._multipart_error(e, "upload_part", key, upload_id) from e
        finally:
            if isinstance(body, _ViewBody):
                body.close()  # no view of the caller's (pooled) buffer outlives the request
        return CompletedPart(part_number=part_number, etag=resp["ETag"], size=size,
                             checksum_crc32=resp.get("ChecksumCRC32"))

    def complete_multipart(self, key: str, upload_id: str, parts: Sequence[CompletedPart]) -> None:
        check_parts(parts, self._where(key))
        try:
            self.client.complete_multipart_upload(
                Bucket=self.bucket,
                Key=key,
                UploadId=upload_id,
                MultipartUpload={"Parts": [
                    {"PartNumber": p.part_number, "ETag": p.etag,
                     **({"ChecksumCRC32": p.checksum_crc32} if p.checksum_crc32 else {})}
                    for p in parts]},
            )
        except (ClientError, BotoCoreError) as e:
            raise self._multipart_error(e, "complete_multipart", key, upload_id) from e

    def abort_multipart(self, key: str, upload_id: str) -> None:
        try:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
        except ClientError as e:
            code = str(e.response.get("Error", {}).get("Code", ""))
            status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code == "NoSuchUpload" or (status == 404 and code != "NoSuchBucket"):
                return
            raise self._error(e, "abort_multipart", key) from e
        except BotoCoreError as e:
            raise self._error(e, "abort_multipart", key) from e

    def list_multipart_uploads(self, prefix: str = "") -> list[MultipartUploadInfo]:
        out: list[MultipartUploadInfo] = []
        try:
            for page in self.client.get_paginator("list_multipart_uploads").paginate(
                Bucket=self.bucket, Prefix=prefix
            ):
                for u in page.get("Uploads", []) or []:
                    out.append(
                        MultipartUploadInfo(
                            key=u["Key"], upload_id=u["UploadId"], initiated=u["Initiated"].timestamp()
                        )
                    )
        except (ClientError, BotoCoreError) as e:
            raise self._error(e, "list_multipart_uploads", prefix) from e
        return out
