"""An object store opened read-only: a read replica's view of another cluster's bucket (docs/recovery.md
"Read replicas"). Listing and reading pass through; every write (PUT, DELETE, multipart) is refused with
:class:`ReplicaReadOnlyError` before a request is sent."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tieredcore.cold.blob import Buffer, CompletedPart, ListPage, MultipartUploadInfo, ObjectInfo
from tieredcore.errors import ReplicaReadOnlyError


class ReadOnlyBlobStore:
    def __init__(self, inner: Any, why: str) -> None:
        self.inner_store = inner
        self.why = why

    def _refuse(self, what: str, key: str) -> ReplicaReadOnlyError:
        return ReplicaReadOnlyError(f"refused to {what} {key}: {self.why}")

    def __getattr__(self, name: str) -> Any:  # driver, liveness, settings of the wrapped store
        return getattr(self.inner_store, name)

    def driver_properties(self) -> dict[str, str]:
        return self.inner_store.driver_properties()

    def get(self, key: str) -> bytes:
        return self.inner_store.get(key)

    def get_range(self, key: str, start: int, end: int) -> bytes:
        return self.inner_store.get_range(key, start, end)

    def head(self, key: str) -> ObjectInfo:
        return self.inner_store.head(key)

    def list(self, prefix: str = "", token: str | None = None, page_size: int = 1000, **kw: Any) -> ListPage:
        return self.inner_store.list(prefix, token, page_size, **kw)

    def list_multipart_uploads(self, prefix: str = "") -> list[MultipartUploadInfo]:
        return self.inner_store.list_multipart_uploads(prefix)

    def put(self, key: str, data: Buffer, metadata: Mapping[str, str] | None = None, **kw: Any) -> Any:
        raise self._refuse("write", key)

    def delete(self, keys: Sequence[str]) -> None:
        raise self._refuse("delete", ", ".join(list(keys)[:3]) + (" ..." if len(keys) > 3 else ""))

    def initiate_multipart(self, key: str, metadata: Mapping[str, str] | None = None) -> str:
        raise self._refuse("start a multipart upload of", key)

    def upload_part(self, key: str, upload_id: str, part_number: int, data: Any) -> CompletedPart:
        raise self._refuse("upload a part of", key)

    def complete_multipart(self, key: str, upload_id: str, parts: Sequence[CompletedPart]) -> None:
        raise self._refuse("complete a multipart upload of", key)

    def abort_multipart(self, key: str, upload_id: str) -> None:
        raise self._refuse("abort a multipart upload of", key)
