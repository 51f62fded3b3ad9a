"""A metadata store that refuses every write: a read replica's (docs/recovery.md "Read replicas"). Its records
change only through ``writable`` (the store it wraps), which `tiered replica-sync` alone uses; every other
writer (a command, a job, a hook) meets :class:`ReplicaReadOnlyError` before anything is written."""

from __future__ import annotations

from collections.abc import Sequence

from tieredcore.errors import ReplicaReadOnlyError
from tieredcore.meta.store import Buffer, MetadataStore, Op, Versioned


class ReadOnlyMetadataStore:
    """``inner`` for reads; every write refused with ``why`` (also through ``write_refusal``, which
    :class:`~tieredcore.meta.managed_ledgers.ManagedLedgerStore` asks before a topic changes)."""

    def __init__(self, inner: MetadataStore, why: str) -> None:
        self.writable = inner
        self.why = why

    def write_refusal(self, path: str) -> str | None:
        return self.why

    def _refuse(self, path: str) -> ReplicaReadOnlyError:
        return ReplicaReadOnlyError(f"refused to write {path}: {self.why}")

    def get(self, path: str) -> Versioned | None:
        return self.writable.get(path)

    def children(self, path: str) -> list[str]:
        return self.writable.children(path)

    def create(self, path: str, value: Buffer) -> int:
        raise self._refuse(path)

    def put(self, path: str, value: Buffer, expected_version: int) -> int:
        raise self._refuse(path)

    def set(self, path: str, value: Buffer) -> int:
        raise self._refuse(path)

    def delete(self, path: str, expected_version: int | None = None) -> None:
        raise self._refuse(path)

    def transaction(self, ops: Sequence[Op]) -> list[int | None]:
        raise self._refuse(ops[0].path if ops else "/")

    def close(self) -> None:
        self.writable.close()
