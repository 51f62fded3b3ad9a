"""The hot tier of a workspace attached to a Pulsar cluster: BookKeeper, which belongs to Pulsar's brokers.

The project neither reads nor writes it. :class:`BookKeeperTier` holds nothing: opening a ledger raises
:class:`InBookKeeperError` ("in BookKeeper (ledger N)"), which readers and the command line report as
such (the entry is there, served by Pulsar; not an error of the project); listing finds no ledger, so no
job ever takes a BookKeeper ledger for an orphan; creating, sealing or deleting one is refused with
:class:`PulsarReadOnlyError` before anything happens.
"""

from __future__ import annotations

from tieredcore.errors import InBookKeeperError, PulsarReadOnlyError
from tieredcore.hot.empty import EmptyHotTier

#: the hot_url of an attached workspace (tieredcore.config)
BOOKKEEPER_URL = "bookkeeper:"


def in_bookkeeper(ledger_id: int) -> InBookKeeperError:
    return InBookKeeperError(f"in BookKeeper (ledger {ledger_id}): not offloaded; Pulsar's brokers serve it",
                             ledger_id=ledger_id)


class BookKeeperTier(EmptyHotTier):
    """:class:`~tieredcore.hot.tier.HotTier` of an attached workspace: Pulsar's BookKeeper, never touched."""

    def _refuse(self, what: str) -> PulsarReadOnlyError:
        return PulsarReadOnlyError(f"refused to {what}: BookKeeper belongs to the Pulsar cluster's brokers (an "
                                   "attached workspace has no hot tier of its own)")

    def _absent(self, ledger_id: int) -> InBookKeeperError:
        return in_bookkeeper(ledger_id)
