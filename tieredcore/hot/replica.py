"""The hot tier of a read replica (docs/recovery.md "Read replicas"): none. The replica serves what the source
cluster offloaded; its records list no ledger that only the source's hot tier holds. :class:`ReplicaHotTier`
holds nothing (opening a ledger: :class:`HotLedgerNotFoundError`, listing: none) and refuses creating,
sealing or deleting one with :class:`ReplicaReadOnlyError` before anything happens."""

from __future__ import annotations

from tieredcore.errors import HotLedgerNotFoundError, ReplicaReadOnlyError
from tieredcore.hot.empty import EmptyHotTier


class ReplicaHotTier(EmptyHotTier):
    def __init__(self, why: str) -> None:
        self.why = why

    def _refuse(self, what: str) -> ReplicaReadOnlyError:
        return ReplicaReadOnlyError(f"refused to {what}: {self.why}")

    def _absent(self, ledger_id: int) -> HotLedgerNotFoundError:
        return HotLedgerNotFoundError(f"ledger {ledger_id}: a read replica has no hot tier (only the source "
                                      "cluster's holds what it has not offloaded)")
