"""Publish-time statistics of the parts of a topic, so a time-range query skips ledgers before any GET.

Entries of a ledger never change once written, so the smallest and largest publish time of entries
``first..last`` of a ledger, once seen, hold for good: a read of a whole part records them (one record per
topic, ``/tiered/query-stats/<tenant>/<namespace>/<domain>/<topic>``, JSON, compare-and-set), and later
plans prune parts whose range lies outside the query's. A part without statistics is always read. Pulsar's
publish time is the producer's clock, so nothing else (the ledger's close time) bounds it safely.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping

from tieredcore.errors import NotFoundError, TieredError, VersionConflictError
from tieredcore.meta.managed_ledgers import topic_path
from tieredcore.meta.store import MetadataStore, write_refusal
from tieredcore.names import TopicName

log = logging.getLogger(__name__)

ROOT = "/tiered/query-stats"
VERSION = 1
MAX_ATTEMPTS = 20


def stats_path(topic: TopicName) -> str:
    return ROOT + topic_path(topic)[len("/managed-ledgers"):]


def part_key(ledger_id: int, first: int, last: int) -> str:
    return f"{ledger_id}:{first}:{last}"


def load(store: MetadataStore, topic: TopicName) -> dict[str, tuple[int, int, int]]:
    """part key -> (min publish time, max publish time, messages); empty when none were recorded or the
    record does not parse (statistics are only ever an optimisation)."""
    v = store.get(stats_path(topic))
    if v is None:
        return {}
    try:
        doc = json.loads(v.value)
        return {k: (int(a), int(b), int(c)) for k, (a, b, c) in doc["parts"].items()}
    except (ValueError, KeyError, TypeError) as e:
        log.warning("query statistics of %s do not parse (%s): ignored", topic, e)
        return {}


def record(store: MetadataStore, topic: TopicName, found: Mapping[str, tuple[int, int, int]],
           live_ledgers: Iterable[int] | None = None) -> bool:
    """Add ``found`` to the topic's statistics (dropping ledgers no longer in ``live_ledgers`` when given).
    False when the store refuses the write (an attached cluster's paths, a read-only store) or keeps
    conflicting: statistics are a cache, a failure to keep them is logged, never raised."""
    if not found:
        return True
    path = stats_path(topic)
    if write_refusal(store, path) is not None:
        return False
    live = None if live_ledgers is None else {str(x) for x in live_ledgers}
    for _ in range(MAX_ATTEMPTS):
        try:
            v = store.get(path)
            parts: dict[str, list[int]] = {}
            if v is not None:
                try:
                    parts = dict(json.loads(v.value)["parts"])
                except (ValueError, KeyError, TypeError):
                    parts = {}
            parts.update({k: list(x) for k, x in found.items()})
            if live is not None:
                parts = {k: x for k, x in parts.items() if k.split(":", 1)[0] in live}
            data = json.dumps({"version": VERSION, "parts": parts}, separators=(",", ":")).encode()
            if v is None:
                store.create(path, data)
            else:
                store.put(path, data, v.version)
            return True
        except VersionConflictError:
            continue
        except (NotFoundError, TieredError) as e:
            log.warning("query statistics of %s not recorded: %s", topic, e)
            return False
    log.warning("query statistics of %s not recorded: %d conflicting writers", topic, MAX_ATTEMPTS)
    return False
