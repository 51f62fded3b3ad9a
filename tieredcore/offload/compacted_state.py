"""A topic's compaction state (docs/topic-compaction.md, "How it runs"), kept in its topic record.

Pulsar keeps it on the ``__compaction`` cursor: the cursor's mark-delete position is the horizon and its
property ``CompactedTopicLedger`` the compacted ledger's id. This project does not model cursor records
(``ManagedCursorInfo``), so the same two facts, plus where the compacted ledger's V1 object lies, are
properties of the topic's ``ManagedLedgerInfo`` (one record: one compare-and-set changes them all):

====================================================  ==================================================
``__compaction.CompactedTopicLedger``                 the compacted ledger's id
``__compaction.markDeletePosition``                   the horizon, ``ledger:entry``
``__compaction.uuid``                                 its V1 object pair's uuid ("" when it holds no entry)
``__compaction.driver``                               the store it lies in: driver metadata as JSON
====================================================  ==================================================
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tieredcore.errors import FormatError, ValidationError
from tieredcore.formats.compacted import COMPACTED_TOPIC_LEDGER_PROPERTY, COMPACTION_SUBSCRIPTION
from tieredcore.formats.mlinfo import ManagedLedgerInfo
from tieredcore.model import Position

PREFIX = COMPACTION_SUBSCRIPTION + "."
LEDGER_KEY = PREFIX + COMPACTED_TOPIC_LEDGER_PROPERTY
HORIZON_KEY = PREFIX + "markDeletePosition"
UUID_KEY = PREFIX + "uuid"
DRIVER_KEY = PREFIX + "driver"
KEYS = (LEDGER_KEY, HORIZON_KEY, UUID_KEY, DRIVER_KEY)


@dataclass(frozen=True)
class CompactionState:
    """The compacted ledger (its id, its object pair's uuid, the store's driver metadata) and the horizon:
    the last position it accounts for."""

    ledger_id: int
    horizon: Position
    uuid: str
    driver: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def empty(self) -> bool:
        """No entry was retained: the compacted ledger has no object."""
        return not self.uuid


def compaction_state(info: ManagedLedgerInfo) -> CompactionState | None:
    """The topic's compaction state, None when it was never compacted; FormatError when the properties are
    there but do not parse."""
    props = {kv.key: kv.value for kv in info.properties if kv.key.startswith(PREFIX)}
    if LEDGER_KEY not in props:
        return None
    try:
        ledger_id = int(props[LEDGER_KEY])
        horizon = Position.parse(props[HORIZON_KEY], "compaction horizon", require_entry=True)
        driver = json.loads(props.get(DRIVER_KEY) or "{}")
    except (KeyError, ValueError, ValidationError) as e:
        raise FormatError(f"compaction state in the topic record does not parse: {e}") from None
    if not isinstance(driver, dict):
        raise FormatError("compaction state: its driver metadata is not a JSON object")
    return CompactionState(ledger_id, horizon, props.get(UUID_KEY, ""), driver)


def set_compaction_state(info: ManagedLedgerInfo, state: CompactionState) -> None:
    """Replace the topic's compaction state in ``info`` (in place: a mutation's work)."""
    keep = [kv for kv in info.properties if kv.key not in KEYS]
    del info.properties[:]
    info.properties.extend(keep)
    values = {LEDGER_KEY: str(state.ledger_id),
              HORIZON_KEY: f"{state.horizon.ledger_id}:{state.horizon.entry_id}",
              UUID_KEY: state.uuid,
              DRIVER_KEY: json.dumps(state.driver, sort_keys=True, separators=(",", ":"))}
    for k in KEYS:
        info.properties.add(key=k, value=values[k])


def compacted_uuids(info: ManagedLedgerInfo) -> set[str]:
    """The uuid of the compacted ledger's objects the record keeps alive (reconciliation, the drain)."""
    for kv in info.properties:
        if kv.key == UUID_KEY and kv.value:
            return {kv.value}
    return set()


def names_compacted(info: ManagedLedgerInfo, ledger_id: int, uuid: str) -> bool:
    """Is ``ledger_id`` / ``uuid`` the topic's current compacted ledger?"""
    props = {kv.key: kv.value for kv in info.properties if kv.key in (LEDGER_KEY, UUID_KEY)}
    return bool(uuid) and props.get(UUID_KEY) == uuid and props.get(LEDGER_KEY) == str(ledger_id)
