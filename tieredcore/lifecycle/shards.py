"""Shards, not namespaces: the due work of many namespaces spread over a few Spark applications.

A plan task (the DAGs') plans every namespace with tieredcore's own planning on one Workspace
(e.g. :func:`tieredcore.lifecycle.sweep.plan_offload_due`), which gives one :class:`NamespaceDue` per
namespace: its units (topics) and their bytes, or the one line saying why nothing is due.
:func:`assign_shards` then puts the namespaces with work on at most ``n`` shards balanced by bytes, and
each shard becomes one ``spark-submit`` with the shard's namespaces as repeated ``--namespace`` options
(the job plans them again on its driver, on the same ``--as-of`` clock). A Spark application costs
seconds to start; the work of a thousand namespaces with one ledger each costs far less than a thousand
of them.

The assignment is greedy, largest first onto the lightest shard (ties: fewer units, then the lower shard
index; namespaces of equal weight in name order), so it is deterministic, every shard gets at least one
namespace, and the heaviest shard exceeds the lightest by at most the heaviest namespace's bytes.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tieredcore.config import check_spark_shards
from tieredcore.errors import ValidationError

LABEL_WIDTH = 40  # a shard's label lists its namespaces up to this many characters, else "first +N more"


@dataclass(frozen=True)
class NamespaceDue:
    """One namespace's due work as its planning found it: ``units`` (topics with work), their ``bytes``,
    and, when nothing is due, ``reason``: tieredcore's one line why."""

    namespace: str
    units: int
    bytes: int
    reason: str = ""

    @property
    def due(self) -> bool:
        return self.units > 0

    @classmethod
    def idle(cls, namespace: str, reason: str) -> NamespaceDue:
        return cls(namespace, 0, 0, reason)


@dataclass(frozen=True)
class Shard:
    """The namespaces one Spark application plans and runs (name order), with their bytes and units."""

    namespaces: tuple[str, ...]
    bytes: int
    units: int

    def as_dict(self) -> dict:
        """The plan task's XCom ``shards`` element."""
        return {"namespaces": list(self.namespaces), "bytes": self.bytes, "units": self.units}

    @property
    def label(self) -> str:
        return shard_label(self.namespaces)


def shard_label(namespaces: Sequence[str]) -> str:
    """A mapped task's label: the namespaces, comma separated, when they fit in LABEL_WIDTH characters,
    else the first one and how many more (``acme/audit +3 more``). The DAGs render the same rule in
    Jinja (dags/tiered_spark.py SHARD_LABEL_TEMPLATE)."""
    if not namespaces:
        return ""
    joined = ", ".join(namespaces)
    if len(joined) <= LABEL_WIDTH:
        return joined
    return f"{namespaces[0]} +{len(namespaces) - 1} more"


def assign_shards(due: Iterable[NamespaceDue], n: int) -> list[Shard]:
    """The namespaces with work due on ``min(n, their number)`` shards, balanced by bytes: largest first
    (then more units, then name) onto the shard with the fewest bytes (then units, then index). No shard
    is empty; no namespace with work is left out; [] when nothing is due anywhere."""
    n = check_spark_shards(n, "number of shards")
    work = [d for d in due if d.due]
    names = [d.namespace for d in work]
    if len(set(names)) != len(names):
        dup = sorted({x for x in names if names.count(x) > 1})
        raise ValidationError(f"shard planning: namespace(s) planned twice: {', '.join(dup)}")
    if any(d.bytes < 0 or d.units < 0 for d in work):
        raise ValidationError("shard planning: negative bytes or units")
    k = min(n, len(work))
    if k == 0:
        return []
    heap = [(0, 0, i) for i in range(k)]  # (bytes, units, shard index): the lightest on top
    members: list[list[NamespaceDue]] = [[] for _ in range(k)]
    for d in sorted(work, key=lambda d: (-d.bytes, -d.units, d.namespace)):
        b, u, i = heapq.heappop(heap)
        members[i].append(d)
        heapq.heappush(heap, (b + d.bytes, u + d.units, i))
    return [Shard(tuple(sorted(d.namespace for d in m)), sum(d.bytes for d in m), sum(d.units for d in m))
            for m in members]


def nothing_due(due: Iterable[NamespaceDue]) -> list[dict[str, str]]:
    """The plan task's XCom ``nothing_due``: each namespace without work and its planning's reason."""
    return [{"namespace": d.namespace, "reason": d.reason or "nothing due"} for d in due if not d.due]
