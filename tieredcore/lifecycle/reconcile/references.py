"""References: every uuid the metadata store (topic records) or the deletion log names, and the hot
ledgers the deletion log already covers. Read after the listing (see the package docstring)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tieredcore.errors import NotFoundError, UnreadableRecordError
from tieredcore.formats.keys import UUID_PATTERN
from tieredcore.meta.deletion_log import TYPE_LEDGER, DeletionLog
from tieredcore.meta.managed_ledgers import ManagedLedgerStore
from tieredcore.meta.store import MetadataStore
from tieredcore.names import TopicName
from tieredcore.offload.compacted_state import compacted_uuids
from tieredcore.offload.context import add_referenced_uuids

_UUID_IN_TEXT = re.compile(UUID_PATTERN.encode())


def iter_topics(ml: ManagedLedgerStore,
                unreadable: list[UnreadableRecordError] | None = None) -> Iterator[tuple[TopicName, Any]]:
    """(topic, ManagedLedgerInfo) of every topic; topics deleted while listing are skipped, and so are
    topics whose record cannot be read (appended to ``unreadable`` when given: what they reference is
    unknown, see :func:`tieredcore.lifecycle.reconcile.run.plan_and_apply`)."""
    for ns in ml.list_namespaces():
        for t in ml.list_topics(ns):
            try:
                info, _ = ml.get_topic(t)
            except NotFoundError:
                continue
            except UnreadableRecordError as e:
                if unreadable is not None:
                    unreadable.append(e)
                continue
            yield t, info


def metadata_uuids(ml: ManagedLedgerStore, unreadable: list[UnreadableRecordError] | None = None) -> set[str]:
    """Every uuid any ledger references (tieredcore.offload.context.referenced_uuids): its
    OffloadContext (complete or not), offloadSegment entries, abandoned and replacement attempts, and
    the topic's compacted ledger. The
    records that cannot be read go to ``unreadable``: their references are missing from the set."""
    out: set[str] = set()
    for _t, info in iter_topics(ml, unreadable):
        out |= compacted_uuids(info)  # the topic's compacted ledger (topic compaction)
        for li in info.ledgerInfo:
            add_referenced_uuids(li, out)
    return out


@dataclass
class LogReferences:
    uuids: set[str] = field(default_factory=set)  # offloaded/segment records (and anything uuid-like in malformed ones)
    hot_ledgers: set[int] = field(default_factory=set)  # ledger records


def deletion_log_references(metadata: MetadataStore) -> LogReferences:
    """What the deletion log already covers: pending, retrying AND dead-letter records (scheduled, or
    waiting for an operator), never to be recorded again. Malformed records are scanned for anything
    that looks like a uuid, to err on the side of not recording twice."""
    dl = DeletionLog(metadata)
    refs = LogReferences()
    for e in [*dl.pending(), *dl.dead_letters()]:
        r = e.record
        if r is None:
            refs.uuids.update(m.decode() for m in _UUID_IN_TEXT.findall(e.raw))
            try:
                raw = json.loads(e.raw)
                inner = json.loads(raw["raw"]) if isinstance(raw, dict) and "raw" in raw else raw
                if isinstance(inner, dict) and inner.get("type") == TYPE_LEDGER and isinstance(inner.get("ledger_id"), int):
                    refs.hot_ledgers.add(inner["ledger_id"])
            except (ValueError, TypeError, KeyError):
                pass
            continue
        if r.type == TYPE_LEDGER:
            refs.hot_ledgers.add(r.ledger_id)
        elif r.uuid:
            refs.uuids.add(r.uuid)
    return refs


def referenced_uuids(ml: ManagedLedgerStore, metadata: MetadataStore,
                     unreadable: list[UnreadableRecordError] | None = None) -> set[str]:
    """Metadata references (:func:`metadata_uuids`), then the deletion log's uuids — in that order
    (see the package docstring). Unreadable topic records go to ``unreadable``."""
    out = metadata_uuids(ml, unreadable)
    out |= deletion_log_references(metadata).uuids
    return out
