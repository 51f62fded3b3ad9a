"""Runs lifecycle work units (TopicWork dicts, one Spark partition's share) on an executor: each kind of
unit to its job (offload and deletion-lag cleanup, retention, scrub). Never raises for a failing ledger
or topic: failures are rows, so the other topics still run. With ``with_cache`` a partition ends with one
record of its chunk cache's counters (reads of transformed objects), which the job adds up
(:func:`split_cache_records`) into its run summary."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import asdict

from tieredcore.cold.requests import request_label
from tieredcore.config import Config
from tieredcore.errors import TieredError, ValidationError
from tieredcore.lifecycle.retention import trim_work
from tieredcore.lifecycle.scrub import scrub_work
from tieredcore.lifecycle.sweep import lag_cleanup_topic, offload_topic
from tieredcore.lifecycle.work import (
    KIND_LAG_CLEANUP,
    KIND_OFFLOAD,
    KIND_RETENTION,
    KIND_SCRUB,
    LedgerResult,
    TopicWork,
    unreadable_rows,
)
from tieredcore.names import TopicName
from tieredcore.outcomes import Outcome
from tieredcore.workspace import Workspace

CACHE_RECORD = "chunk_cache"  # the key of a partition's cache record (never a LedgerResult field)


def run_work(config: Config, units: Iterable[dict], *, with_cache: bool = False) -> Iterator[dict]:
    """Executes TopicWork dicts (a Spark partition); yields LedgerResult dicts. Never raises for a
    failing ledger or topic: failures are rows, so the other topics still run. ``with_cache``: then one
    ``{CACHE_RECORD: counters}`` record when the partition opened a chunk cache."""
    with Workspace(config) as ws:
        ps = ws.policies
        budget = ws.failure_budget()  # per Spark task: a failing store stops this task's remaining work
        for u in units:
            w = TopicWork(**u)
            t = TopicName.parse(w.topic)
            failed = unreadable_rows(w)  # planned for a record that could not be read: nothing to run
            if failed:
                yield from (asdict(r) for r in failed)
                continue
            try:
                with request_label(t.namespace_name):  # the run report's requests per namespace
                    pol = ps.for_topic(t)
                    if w.kind == KIND_OFFLOAD:
                        rows = offload_topic(ws, pol, t, w, budget)
                    elif w.kind == KIND_LAG_CLEANUP:
                        rows = lag_cleanup_topic(ws, pol, t, w, budget)
                    elif w.kind == KIND_RETENTION:
                        rows = trim_work(ws, pol, t, w)
                    elif w.kind == KIND_SCRUB:
                        rows = scrub_work(ws, pol, t, w, budget)
                    else:
                        raise ValidationError(f"unknown kind of work {w.kind!r}")
            except TieredError as e:  # the topic as a whole could not be processed
                rows = [LedgerResult(t.full, t.namespace_name, lid, w.kind, Outcome.FAILED,
                                     error=f"{type(e).__name__}: {e}") for lid in w.ledgers]
            for r in rows:
                yield asdict(r)
    cache = ws.opened_chunk_cache()  # read after close: its prefetches have ended
    if with_cache and cache is not None:
        yield {CACHE_RECORD: cache.stats.as_dict()}


def split_cache_records(records: Iterable[dict]) -> tuple[list[dict], dict[str, int]]:
    """(the LedgerResult rows, the partitions' chunk cache counters added up; {} when none read any
    transformed object)."""
    rows: list[dict] = []
    cache: dict[str, int] = {}
    for r in records:
        if CACHE_RECORD in r:
            for k, v in r[CACHE_RECORD].items():
                cache[k] = cache.get(k, 0) + int(v)
        else:
            rows.append(r)
    return rows, cache
