"""The hot tier of a workspace attached to a Pulsar cluster: BookKeeper, which belongs to Pulsar's brokers.

The project neither reads nor writes it. :class:`BookKeeperTier` holds nothing: opening a ledger raises
:class:`InBookKeeperError` ("in BookKeeper (ledger N)"), which readers and the command line report as
such (the entry is there, served by Pulsar; not an error of the project); listing finds no ledger, so no
job ever takes a BookKeeper ledger for an orphan; creating, sealing or deleting one is refused with
:class:`PulsarReadOnlyError` before anything happens.
"""

from __future__ import annotations

from collections.abc import Mapping

from tieredcore.errors import InBookKeeperError, PulsarReadOnlyError
from tieredcore.hot.tier import HotLedger, LedgerWriter
from tieredcore.model import LedgerMetadata

#: the hot_url of an attached workspace (tieredcore.config)
BOOKKEEPER_URL = "bookkeeper:"


def in_bookkeeper(ledger_id: int) -> InBookKeeperError:
    return InBookKeeperError(f"in BookKeeper (ledger {ledger_id}): not offloaded; Pulsar's brokers serve it",
                             ledger_id=ledger_id)


class BookKeeperTier:
    """:class:`~tieredcore.hot.tier.HotTier` of an attached workspace: Pulsar's BookKeeper, never touched."""

    def _refuse(self, what: str) -> PulsarReadOnlyError:
        return PulsarReadOnlyError(f"refused to {what}: BookKeeper belongs to the Pulsar cluster's brokers (an "
                                   "attached workspace has no hot tier of its own)")

    def create_ledger(self, custom_metadata: Mapping[str, bytes | str] | None = None, *,
                      ctime_ms: int | None = None) -> LedgerWriter:
        raise self._refuse("create a ledger")

    def seal_ledger(self, ledger_id: int) -> LedgerMetadata:
        raise self._refuse(f"seal ledger {ledger_id}")

    def open_ledger(self, ledger_id: int) -> HotLedger:
        raise in_bookkeeper(ledger_id)

    def ledger_metadata(self, ledger_id: int) -> LedgerMetadata:
        raise in_bookkeeper(ledger_id)

    def exists(self, ledger_id: int) -> bool:
        """False: this tier holds no ledger (whether BookKeeper still has it is Pulsar's to say)."""
        return False

    def list_ledgers(self) -> list[int]:
        return []

    def delete_ledger(self, ledger_id: int) -> None:
        raise self._refuse(f"delete ledger {ledger_id}")

    def close(self) -> None:
        pass
