"""Google Cloud Storage implementation of BlobStore, on google-cloud-storage.

- Multipart: each part is uploaded as an object of its own under ``.tiered/parts/<upload_id>/``; complete
  checks every named part (present, the MD5 the part's etag recorded) and composes them into the target
  (compose takes up to 32 sources, so more parts are composed in rounds of intermediate objects), with
  source-generation preconditions so exactly the checked parts are used; the part objects are deleted
  afterwards. In-progress uploads are marker objects under ``.tiered/uploads/`` (tieredcore.cold.backends.cloud).
- Conditional create: ``ifGenerationMatch=0``; a precondition failure is ObjectExistsError.
- Ranged reads: a range starting past the end is BadRangeError whether the server answers 416 (GCS) or
  an empty body (emulators).
- Listing: server pages (``pageSize``/``pageToken``) with ``startOffset`` for start_after; the token this
  store hands out carries start_after too, so every request of one listing sends the same parameters.
  Keys equal to start_after and the reserved area are filtered out client-side.
- Deletion: one request per key (a few in parallel); a missing key is fine.

Credentials come from the environment: ``TIERED_GCS_KEYFILE_JSON`` (a service-account key itself, as the
Airflow plugin hands over a connection's ``keyfile_dict``), ``GOOGLE_APPLICATION_CREDENTIALS`` or any other
Application Default Credentials, ``STORAGE_EMULATOR_HOST`` for an emulator (anonymous unless a key is
given); the project from ``GOOGLE_CLOUD_PROJECT`` (or the key). An ``endpoint=`` in the store URL wins over ``STORAGE_EMULATOR_HOST``.
Requests use connect/read timeouts; a request failing with an error google-cloud-storage deems retryable
is retried up to ``max_attempts`` attempts in all (and within ``max_attempts`` x (connect + read timeout)
seconds), not at all with ``max_attempts=1``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from google.api_core import exceptions as gexc
from google.auth.exceptions import DefaultCredentialsError, GoogleAuthError
from google.cloud import storage
from google.cloud.storage.retry import DEFAULT_RETRY

from tieredcore.cold.backends.cloud import (
    INTERNAL_PREFIX,
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
from tieredcore.cold.drivers import DRIVER_GCS, pulsar_properties
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

ENV_EMULATOR = "STORAGE_EMULATOR_HOST"
ENV_CREDENTIALS = "GOOGLE_APPLICATION_CREDENTIALS"
ENV_PROJECT = "GOOGLE_CLOUD_PROJECT"
ENV_KEYFILE_JSON = "TIERED_GCS_KEYFILE_JSON"  # a service-account key itself (the Airflow connection's keyfile_dict)
PARTS_PREFIX = INTERNAL_PREFIX + "parts/"
COMPOSE_MAX = 32  # sources per compose request
DELETE_THREADS = 8
_CONTENT_TYPE = "application/octet-stream"


def _key_credentials(env: Mapping[str, str]) -> tuple[Any, str | None]:
    """Service-account credentials and their project from TIERED_GCS_KEYFILE_JSON or a service-account
    GOOGLE_APPLICATION_CREDENTIALS file; (None, None) leaves the choice to Application Default Credentials
    (other key types, gcloud's user login, the metadata server)."""
    from google.oauth2 import service_account

    source = ENV_KEYFILE_JSON
    if env.get(ENV_KEYFILE_JSON):
        try:
            info = json.loads(env[ENV_KEYFILE_JSON])
        except ValueError:
            raise ValidationError(f"{ENV_KEYFILE_JSON} is not a JSON service-account key") from None
        if not isinstance(info, dict) or info.get("type") != "service_account":
            raise ValidationError(f"{ENV_KEYFILE_JSON}: only a service-account key (\"type\": \"service_account\") "
                                  "can be given this way")
    elif env.get(ENV_CREDENTIALS):
        source = f"{ENV_CREDENTIALS}={env[ENV_CREDENTIALS]!r}"
        try:
            with open(env[ENV_CREDENTIALS], encoding="utf-8") as f:
                info = json.load(f)
        except OSError as e:
            raise ValidationError(f"{source}: cannot read the key file ({e.strerror})") from None
        except ValueError:
            raise ValidationError(f"{source} is not a JSON key file") from None
        if not isinstance(info, dict) or info.get("type") != "service_account":
            return None, None
    else:
        return None, None
    try:
        return service_account.Credentials.from_service_account_info(info), info.get("project_id") or None
    except (ValueError, KeyError) as e:  # the message names a missing field, never the key itself
        raise ValidationError(f"{source}: not a usable service-account key ({type(e).__name__}: "
                              f"{str(e)[:120]})") from None


def gcs_client(endpoint: str | None, env: Mapping[str, str] | None = None) -> storage.Client:
    """A storage.Client with credentials from the environment (module docstring); ValidationError says
    what to set when there are none."""
    env = os.environ if env is None else env
    creds, key_project = _key_credentials(env)
    project = env.get(ENV_PROJECT) or env.get("GCLOUD_PROJECT") or key_project
    api_endpoint = endpoint or env.get(ENV_EMULATOR)
    try:
        if api_endpoint:
            if not api_endpoint.startswith(("http://", "https://")):
                api_endpoint = "http://" + api_endpoint  # STORAGE_EMULATOR_HOST may be host:port
            if creds is None:  # an emulator: anonymous
                from google.auth.credentials import AnonymousCredentials

                creds = AnonymousCredentials()
            return storage.Client(project=project or "tiered-storage", credentials=creds,
                                  client_options={"api_endpoint": api_endpoint})
        return storage.Client(project=project, credentials=creds)
    except (DefaultCredentialsError, GoogleAuthError) as e:
        raise ValidationError(
            f"gs:// store: no usable Google credentials ({e}): set {ENV_CREDENTIALS} to a service-account key "
            f"file (and {ENV_PROJECT}), or {ENV_EMULATOR} for an emulator"
        ) from None


def _md5_b64(hex_digest: str) -> str:
    return base64.b64encode(bytes.fromhex(hex_digest)).decode()


@counted
class GcsBlobStore:
    """BlobStore on one GCS bucket."""

    driver = DRIVER_GCS
    copies_file_slices = False  # pieces are joined into one request body
    # parts are objects of their own, composed at completion; one at a time (the client's HTTP session
    # is not documented as safe to share between threads)
    concurrent_parts = False
    reads_ahead = False

    def __init__(
        self,
        bucket: str,
        *,
        endpoint: str | None = None,
        max_attempts: int = S3_MAX_ATTEMPTS,
        connect_timeout: float = S3_CONNECT_TIMEOUT,
        read_timeout: float = S3_READ_TIMEOUT,
        env: Mapping[str, str] | None = None,
        client: storage.Client | None = None,
    ) -> None:
        if not bucket or not isinstance(bucket, str):
            raise ValidationError(f"GCS bucket name must be a non-empty str, got {bucket!r}")
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise ValidationError(f"max_attempts must be an int >= 1, got {max_attempts!r}")
        self.bucket_name = bucket
        self.endpoint = endpoint or None
        self.client = client if client is not None else gcs_client(self.endpoint, env)
        self.bucket = self.client.bucket(bucket)
        self._timeout = (connect_timeout, read_timeout)
        self.max_attempts = max_attempts
        self._deadline = max_attempts * (connect_timeout + read_timeout)

    @property
    def _retry(self) -> Any:
        """A retry policy for one call: google-cloud-storage's choice of retryable errors, at most
        ``max_attempts`` attempts in all (google-api-core counts time, not attempts), backing off 0.2 s
        doubling to 5 s; None (no retry) with one attempt."""
        if self.max_attempts <= 1:
            return None
        left = self.max_attempts - 1
        retryable = DEFAULT_RETRY._predicate  # the library's own list of retryable errors

        def predicate(exc: Exception) -> bool:
            nonlocal left
            if left <= 0 or not retryable(exc):
                return False
            left -= 1
            return True

        return DEFAULT_RETRY.with_predicate(predicate).with_delay(initial=0.2, maximum=5.0, multiplier=2.0) \
            .with_timeout(self._deadline)

    def __repr__(self) -> str:
        return f"GcsBlobStore({self.bucket_name!r})"

    def driver_properties(self) -> dict[str, str]:
        return pulsar_properties(DRIVER_GCS, self.bucket_name, None, self.endpoint)

    # --- errors --------------------------------------------------------------------------------

    def _where(self, key: str | None) -> str:
        return f"gs://{self.bucket_name}/{key}" if key is not None else f"gs://{self.bucket_name}"

    def _error(self, exc: gexc.GoogleAPIError | GoogleAuthError, op: str, key: str | None) -> TieredError:
        where = self._where(key)
        # a call error has an HTTP status (None when it maps to none) and the service's message, a
        # RetryError a message; other api-core and google-auth errors only their str()
        status = exc.code if isinstance(exc, gexc.GoogleAPICallError) else None
        said = exc.message if isinstance(exc, gexc.GoogleAPICallError | gexc.RetryError) else ""
        message = (str(said or exc).splitlines() or [""])[0][:300]
        text = f"{where}: {op} failed: {type(exc).__name__}" + (f" (HTTP {status})" if status else "") + (
            f": {message}" if message else "")
        if isinstance(exc, gexc.NotFound):
            return NoSuchObjectError(f"no object {where}" if op in ("get", "get_range", "head") else text)
        if isinstance(exc, gexc.RequestRangeNotSatisfiable):
            return BadRangeError(text)
        return BlobStoreError(text)

    def _kw(self) -> dict[str, Any]:
        return {"timeout": self._timeout, "retry": self._retry}

    # --- objects -------------------------------------------------------------------------------

    def _upload(self, name: str, data: bytes, metadata: Mapping[str, str] | None, *, if_absent: bool) -> Any:
        blob = self.bucket.blob(name)
        blob.metadata = dict(metadata) if metadata else None
        blob.upload_from_string(data, content_type=_CONTENT_TYPE, if_generation_match=0 if if_absent else None,
                                **self._kw())
        return blob

    def put(self, key: str, data: Buffer, metadata: Mapping[str, str] | None = None, *,
            if_absent: bool = False) -> None:
        check_key(key, self._where(None))
        meta = normalize_metadata(metadata)
        try:
            self._upload(key, bytes(data) if not isinstance(data, bytes) else data, meta, if_absent=if_absent)
        except gexc.PreconditionFailed as e:
            raise ObjectExistsError(f"object {self._where(key)} already exists") from e
        except (gexc.GoogleAPIError, GoogleAuthError) as e:
            raise self._error(e, "put", key) from e

    def get(self, key: str) -> bytes:
        try:
            return self.bucket.blob(key).download_as_bytes(**self._kw())
        except (gexc.GoogleAPIError, GoogleAuthError) as e:
            raise self._error(e, "get", key) from e

    def get_range(self, key: str, start: int, end: int) -> bytes:
        check_range(start, end, self._where(key))
        try:
            data = self.bucket.blob(key).download_as_bytes(start=start, end=end, checksum=None, **self._kw())
        except (gexc.GoogleAPIError, GoogleAuthError) as e:
            raise self._error(e, "get_range", key) from e
        if not data:  # a range inside the object has at least one byte
            raise BadRangeError(f"range {start}-{end} of {self._where(key)} starts at or past its end")
        return data

    def head(self, key: str) -> ObjectInfo:
        try:
            blob = self.bucket.get_blob(key, **self._kw())
        except (gexc.GoogleAPIError, GoogleAuthError) as e:
            raise self._error(e, "head", key) from e
        if blob is None:
            raise NoSuchObjectError(f"no object {self._where(key)}")
        return ObjectInfo(key=key, size=int(blob.size or 0), last_modified=blob.updated.timestamp(),
                          metadata={k.lower(): v for k, v in (blob.metadata or {}).items()})

    def list(self, prefix: str = "", token: str | None = None, page_size: int = 1000, *,
             start_after: str | None = None) -> ListPage:
        if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
            raise ValidationError(f"list: page_size must be a positive int, got {page_size!r}")
        page_token, after = decode_token(token) if token else (None, start_after)
        # GCS's startOffset is inclusive: a first page from `after` asks one name more (`after` itself may
        # come back and is dropped), so the page still holds page_size names after it
        restart = page_token is None and bool(after)
        try:
            it = self.client.list_blobs(self.bucket, prefix=prefix or None, page_size=page_size + restart,
                                        page_token=page_token, start_offset=after or None, **self._kw())
            page = next(it.pages, None)
            items = list(page) if page is not None else []
            next_page = it.next_page_token
        except (gexc.GoogleAPIError, GoogleAuthError) as e:
            raise self._error(e, "list", prefix) from e
        objects = [ObjectInfo(key=b.name, size=int(b.size or 0), last_modified=b.updated.timestamp())
                   for b in items
                   if not is_internal(b.name) and (after is None or b.name > after)
                   and b.name.startswith(prefix)]
        objects.sort(key=lambda o: o.key.encode())  # the service's order (UTF-8 bytes)
        if len(objects) > page_size:  # `after` was not a name (or the server ignored maxResults): the
            # next page starts from this page's last name, which then comes back first and is dropped
            objects = objects[:page_size]
            return ListPage(objects, encode_token(None, objects[-1].key))
        return ListPage(objects, encode_token(next_page, after) if next_page else None)

    def _delete_quietly(self, name: str) -> str | None:
        """Deletes one object; a missing one is fine. Returns what failed, else None."""
        try:
            self.bucket.blob(name).delete(**self._kw())
        except gexc.NotFound:
            pass
        except (gexc.GoogleAPIError, GoogleAuthError) as e:
            return f"{name!r} ({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''})"
        return None

    def _delete_names(self, names: Sequence[str]) -> list[str]:
        if len(names) <= 1:
            return [f for f in map(self._delete_quietly, names) if f]
        with ThreadPoolExecutor(min(DELETE_THREADS, len(names))) as pool:
            return [f for f in pool.map(self._delete_quietly, names) if f]

    def delete(self, keys: Sequence[str]) -> None:
        if isinstance(keys, str):
            raise ValidationError("delete() takes a sequence of keys, not a single str")
        keys = list(dict.fromkeys(keys))
        for k in keys:
            check_key(k, self._where(None))
        failed = self._delete_names(keys)
        if failed:
            raise BlobStoreError(f"{self._where(None)}: could not delete {len(failed)} key(s): "
                                 + ", ".join(failed[:20]) + (" ..." if len(failed) > 20 else ""))

    # --- multipart -----------------------------------------------------------------------------

    @staticmethod
    def _part_name(upload_id: str, part_number: int) -> str:
        return f"{PARTS_PREFIX}{upload_id}/{part_number:05d}"

    def initiate_multipart(self, key: str, metadata: Mapping[str, str] | None = None) -> str:
        check_key(key, self._where(None))
        rec = UploadRecord.start(key, normalize_metadata(metadata))
        try:
            self._upload(marker_key(rec.upload_id), b"", rec.marker_metadata(), if_absent=True)
        except (gexc.GoogleAPIError, GoogleAuthError) as e:
            raise self._error(e, "initiate_multipart", key) from e
        return rec.upload_id

    def _record(self, key: str, upload_id: str, op: str) -> UploadRecord:
        def marker_metadata() -> Mapping[str, str] | None:
            try:
                blob = self.bucket.get_blob(marker_key(upload_id), **self._kw())
            except (gexc.GoogleAPIError, GoogleAuthError) as e:
                raise self._error(e, op, key) from e
            return None if blob is None else (blob.metadata or {})

        return upload_record(self._where(None), key, upload_id, op, marker_metadata)

    def upload_part(self, key: str, upload_id: str, part_number: int, data: Buffer | Pieces) -> CompletedPart:
        check_part_number(part_number, self._where(key))
        self._record(key, upload_id, "upload_part")
        body = part_body(data)
        try:
            self._upload(self._part_name(upload_id, part_number), body, None, if_absent=False)
        except (gexc.GoogleAPIError, GoogleAuthError) as e:
            raise self._error(e, "upload_part", key) from e
        return CompletedPart(part_number=part_number, etag=hashlib.md5(body, usedforsecurity=False).hexdigest(),
                             size=len(body))

    def _checked_parts(self, key: str, upload_id: str, parts: Sequence[CompletedPart]) -> list[Any]:
        """The part objects named by ``parts``, each present with the MD5 its etag recorded."""
        out = []
        for p in parts:
            name = self._part_name(upload_id, p.part_number)
            try:
                blob = self.bucket.get_blob(name, **self._kw())
            except (gexc.GoogleAPIError, GoogleAuthError) as e:
                raise self._error(e, "complete_multipart", key) from e
            try:
                expected = _md5_b64(p.etag.strip('"'))
            except ValueError:
                expected = None
            if blob is None or expected is None or (blob.md5_hash and blob.md5_hash != expected):
                raise ValidationError(
                    f"complete_multipart of {self._where(key)}: part {p.part_number} (etag {p.etag!r}) is not a "
                    f"part uploaded by upload {upload_id!r}"
                )
            out.append(blob)
        return out

    def _compose(self, name: str, sources: list[Any], metadata: Mapping[str, str] | None) -> Any:
        dest = self.bucket.blob(name)
        dest.content_type = _CONTENT_TYPE
        dest.metadata = dict(metadata) if metadata else None
        dest.compose(sources, if_source_generation_match=[s.generation for s in sources], **self._kw())
        return dest

    def complete_multipart(self, key: str, upload_id: str, parts: Sequence[CompletedPart]) -> None:
        check_parts(parts, self._where(key))
        rec = self._record(key, upload_id, "complete_multipart")
        sources = self._checked_parts(key, upload_id, parts)
        try:
            level = 0
            while len(sources) > COMPOSE_MAX:  # compose rounds: 32 sources per request
                level += 1
                sources = [
                    self._compose(f"{PARTS_PREFIX}{upload_id}/c{level}-{i:05d}", sources[i : i + COMPOSE_MAX], None)
                    for i in range(0, len(sources), COMPOSE_MAX)
                ]
                for s in sources:
                    if s.generation is None:  # the next round's precondition names it
                        s.reload(**self._kw())
            self._compose(key, sources, rec.metadata)
        except gexc.PreconditionFailed as e:
            raise ValidationError(f"complete_multipart of {self._where(key)}: a part changed while it was "
                                  f"being composed ({e})") from e
        except (gexc.GoogleAPIError, GoogleAuthError) as e:
            raise self._error(e, "complete_multipart", key) from e
        self._drop_upload(key, upload_id)

    def _drop_upload(self, key: str, upload_id: str) -> None:
        """Part objects first, the marker last (a failure leaves the upload listed, to be aborted again)."""
        try:
            names = [b.name for b in self.client.list_blobs(self.bucket, prefix=f"{PARTS_PREFIX}{upload_id}/",
                                                            **self._kw())]
        except (gexc.GoogleAPIError, GoogleAuthError) as e:
            raise self._error(e, "remove upload parts", key) from e
        failed = self._delete_names(names)
        if failed:
            raise BlobStoreError(f"{self._where(key)}: could not remove parts of upload {upload_id}: "
                                 + ", ".join(failed[:5]))
        failed = self._delete_names([marker_key(upload_id)])
        if failed:
            raise BlobStoreError(f"{self._where(key)}: could not remove upload marker {failed[0]}")

    def abort_multipart(self, key: str, upload_id: str) -> None:
        try:
            self._record(key, upload_id, "abort_multipart")
        except NoSuchUploadError:
            return
        self._drop_upload(key, upload_id)

    def list_multipart_uploads(self, prefix: str = "") -> list[MultipartUploadInfo]:
        try:
            return uploads_listed(((b.name, b.metadata) for b in self.client.list_blobs(
                self.bucket, prefix=UPLOADS_PREFIX, **self._kw())), prefix, self._where(None))
        except (gexc.GoogleAPIError, GoogleAuthError) as e:
            raise self._error(e, "list_multipart_uploads", prefix) from e
