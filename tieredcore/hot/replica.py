"""The hot tier of a read replica (docs/recovery.md "Read replicas"): none. The replica serves what the source
cluster offloaded; its records list no ledger that only the source's hot tier holds. :class:`ReplicaHotTier`
holds nothing (opening a ledger: :class:`HotLedgerNotFoundError`, listing: none) and refuses creating,
sealing or deleting one with :class:`ReplicaReadOnlyError` before anything happens."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tieredcore.errors import HotLedgerNotFoundError, ReplicaReadOnlyError
from tieredcore.model import LedgerMetadata


class ReplicaHotTier:
    def __init__(self, why: str) -> None:
        self.why = why

    def _refuse(self, what: str) -> ReplicaReadOnlyError:
        return ReplicaReadOnlyError(f"refused to {what}: {self.why}")

    def _absent(self, ledger_id: int) -> HotLedgerNotFoundError:
        return HotLedgerNotFoundError(f"ledger {ledger_id}: a read replica has no hot tier (only the source "
                                      "cluster's holds what it has not offloaded)")

    def create_ledger(self, custom_metadata: Mapping[str, bytes | str] | None = None, *,
                      ctime_ms: int | None = None) -> Any:
        raise self._refuse("create a ledger")

    def seal_ledger(self, ledger_id: int) -> LedgerMetadata:
        raise self._refuse(f"seal ledger {ledger_id}")

    def open_ledger(self, ledger_id: int) -> Any:
        raise self._absent(ledger_id)

    def ledger_metadata(self, ledger_id: int) -> LedgerMetadata:
        raise self._absent(ledger_id)

    def exists(self, ledger_id: int) -> bool:
        return False

    def list_ledgers(self) -> list[int]:
        return []

    def delete_ledger(self, ledger_id: int) -> None:
        raise self._refuse(f"delete ledger {ledger_id}")

    def close(self) -> None:
        pass
