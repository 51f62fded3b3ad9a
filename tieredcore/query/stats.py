"""Publish-time statistics of the parts of a topic, so a time-range query skips ledgers before any GET.

Entries of a ledger never change once written, so the smallest and largest publish time of entries
``first..last`` of a ledger, once seen, hold for good: a read of a whole part records them, and later
plans prune parts whose range lies outside the query's. A part without statistics is always read. Pulsar's
publish time is the producer's clock, so nothing else (the ledger's close time) bounds it safely.

Records: one per topic and bucket of BUCKET_LEDGERS ledger ids,
``/tiered/query-stats/<tenant>/<namespace>/<domain>/<topic>/<bucket>`` (JSON, compare-and-set), so no record
grows with the topic (ZooKeeper refuses records past 1 MB) and a write rewrites one bucket. Ledgers the
topic no longer has (trimmed) are dropped by the next plan that sees them (:func:`forget`). A record at the
topic's own path (the first layout, one record per topic) is still read.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping

from tieredcore.errors import NotFoundError, TieredError, VersionConflictError
from tieredcore.meta.managed_ledgers import topic_path
from tieredcore.meta.store import MetadataStore, write_refusal
from tieredcore.names import TopicName

log = logging.getLogger(__name__)

ROOT = "/tiered/query-stats"
VERSION = 1
MAX_ATTEMPTS = 20
BUCKET_LEDGERS = 1000  # ledger ids per record


def stats_path(topic: TopicName) -> str:
    return ROOT + topic_path(topic)[len("/managed-ledgers"):]


def part_key(ledger_id: int, first: int, last: int) -> str:
    return f"{ledger_id}:{first}:{last}"


def bucket_path(topic: TopicName, ledger_id: int) -> str:
    return f"{stats_path(topic)}/{ledger_id // BUCKET_LEDGERS:012d}"


def _parts(raw: bytes | None) -> dict[str, list[int]] | None:
    """A record's parts, None when it does not parse."""
    if raw is None:
        return {}
    try:
        parts = json.loads(raw)["parts"]
        return {k: [int(a), int(b), int(c)] for k, (a, b, c) in parts.items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def load(store: MetadataStore, topic: TopicName) -> dict[str, tuple[int, int, int]]:
    """part key -> (min publish time, max publish time, messages); empty when none were recorded; a record
    that does not parse counts as none (statistics are only ever an optimisation)."""
    base = stats_path(topic)
    out: dict[str, tuple[int, int, int]] = {}
    for path in [base, *(f"{base}/{c}" for c in store.children(base))]:
        v = store.get(path)
        parts = _parts(v.value if v is not None else None)
        if parts is None:
            log.warning("query statistics of %s at %s do not parse: ignored", topic, path)
            continue
        out.update({k: (a, b, c) for k, (a, b, c) in parts.items()})
    return out


def _ledger(key: str) -> int:
    return int(key.split(":", 1)[0])


def record(store: MetadataStore, topic: TopicName, found: Mapping[str, tuple[int, int, int]],
           live_ledgers: Iterable[int] | None = None) -> bool:
    """Add ``found`` to the topic's statistics (dropping, in the buckets written, ledgers no longer in
    ``live_ledgers`` when given). False when the store refuses the write (an attached cluster's paths, a
    read-only store) or keeps conflicting: statistics are a cache, a failure to keep them is logged, never
    raised."""
    if not found:
        return True
    live = None if live_ledgers is None else set(live_ledgers)
    by_bucket: dict[str, dict[str, list[int]]] = {}
    for k, x in found.items():
        by_bucket.setdefault(bucket_path(topic, _ledger(k)), {})[k] = list(x)
    ok = True
    for path, add in by_bucket.items():
        ok = _update(store, topic, path, lambda parts, add=add: {
            k: x for k, x in {**parts, **add}.items() if live is None or _ledger(k) in live}) and ok
    return ok


def forget(store: MetadataStore, topic: TopicName, live_ledgers: Iterable[int]) -> bool:
    """Drop the statistics of ledgers the topic no longer has (a record left empty is deleted)."""
    live = set(live_ledgers)
    base = stats_path(topic)
    ok = True
    for c in store.children(base):
        ok = _update(store, topic, f"{base}/{c}", lambda parts: {
            k: x for k, x in parts.items() if _ledger(k) in live}) and ok
    return ok


def _update(store: MetadataStore, topic: TopicName, path: str,
            change: Callable[[dict[str, list[int]]], dict[str, list[int]]]) -> bool:
    if write_refusal(store, path) is not None:
        return False
    for _ in range(MAX_ATTEMPTS):
        try:
            v = store.get(path)
            before = _parts(v.value if v is not None else None) or {}
            parts = change(before)
            if v is not None and parts == before:
                return True
            if not parts:
                if v is not None:
                    store.delete(path, v.version)
                return True
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
