"""A hot tier that holds nothing and refuses every change: the base of a workspace's hot tier when another
party owns the hot copies (an attached Pulsar cluster's BookKeeper, a read replica's source cluster).
Subclasses say why a change is refused and what opening a ledger raises."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

from tieredcore.errors import TieredError
from tieredcore.model import LedgerMetadata


class EmptyHotTier(ABC):
    @abstractmethod
    def _refuse(self, what: str) -> TieredError:
        """The error for a change of this tier (``what``: e.g. "create a ledger")."""

    @abstractmethod
    def _absent(self, ledger_id: int) -> TieredError:
        """The error for opening a ledger this tier does not hold."""

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
        """False: this tier holds no ledger (whether the owner's tier still has it is the owner's to say)."""
        return False

    def list_ledgers(self) -> list[int]:
        return []

    def delete_ledger(self, ledger_id: int) -> None:
        raise self._refuse(f"delete ledger {ledger_id}")

    def close(self) -> None:
        """Nothing to release: this tier opens nothing."""
        return None
