"""The report of a reconciliation (a tieredcore.reports.JobReport): counters, orphans per namespace and
kind, samples, errors, timings, and one detail row per orphan object, hot ledger or stale upload."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from tieredcore import names
from tieredcore.lifecycle.reconcile.orphans import UNKNOWN_TOPIC
from tieredcore.names import UNKNOWN_NAMESPACE
from tieredcore.reports import Totals, totals

KIND_OFFLOADED = "offloaded"  # object-store copy of one offload attempt (uuid, ledger id)
KIND_SEGMENT = "segment"  # a streaming segment's objects (uuid)
KIND_LEDGER = "ledger"  # hot-tier ledger
KIND_UPLOAD = "upload"  # incomplete multipart upload
MAX_SAMPLE_KEYS = 10
# the report's counters a run summary shows as its outcomes
OUTCOME_COUNTERS = ("orphan_groups", "orphan_segments", "orphan_objects", "hot_orphans", "records_appended", "stale_uploads",
                    "uploads_aborted", "foreign_keys", "foreign_cluster_groups", "young_unreferenced",
                    "young_hot_ledgers", "withheld_groups", "withheld_hot_ledgers")
# the report's detail.parquet (Spark DDL): one row per orphan object, hot ledger or stale upload
DETAIL_SCHEMA = ("location string, kind string, key string, size long, last_modified_ms long, uuid string, "
                 "ledger_id long, topic string, namespace string")


def namespace_of(topic: str) -> str:
    return UNKNOWN_NAMESPACE if topic == UNKNOWN_TOPIC else names.namespace_of(topic)


@dataclass
class ReconcileReport:
    as_of_ms: int
    grace_ms: int
    dry_run: bool
    locations: list[str] = field(default_factory=list)
    objects_listed: int = 0
    bytes_listed: int = 0
    referenced_uuids: int = 0
    referenced_objects: int = 0
    orphan_groups: int = 0  # = offloaded + segment records (appended, or to append in a dry run)
    orphan_segments: int = 0  # of which streaming segments (segment records)
    orphan_objects: int = 0
    orphan_bytes: int = 0
    hot_ledgers: int = 0
    hot_orphans: int = 0
    hot_orphan_bytes: int = 0
    stale_uploads: int = 0
    uploads_aborted: int = 0
    young_uploads: int = 0
    foreign_uploads: int = 0
    foreign_keys: int = 0
    foreign_bytes: int = 0
    # unreferenced groups written by another cluster or workspace sharing the store: never recorded
    foreign_cluster_groups: int = 0
    foreign_cluster_objects: int = 0
    foreign_cluster_bytes: int = 0
    foreign_cluster_samples: list[str] = field(default_factory=list)
    segment_keys: int = 0
    foreign_hot_ledgers: int = 0
    young_unreferenced: int = 0  # objects
    young_hot_ledgers: int = 0
    scheduled_hot_ledgers: int = 0
    # topics whose record cannot be read: what they reference is unknown, so no unreferenced object of
    # their namespace (nor any naming no topic) and no hot ledger naming them is recorded this run
    unreadable_topics: list[str] = field(default_factory=list)
    withheld_groups: int = 0  # unreferenced, old enough, but maybe an unreadable record's: left alone
    withheld_objects: int = 0
    withheld_bytes: int = 0
    withheld_hot_ledgers: int = 0
    oldest_orphan_age_ms: int | None = None
    sample_keys: list[str] = field(default_factory=list)
    # namespace -> kind (offloaded | segment | ledger | upload) -> {"count": records/uploads, "objects": n,
    # "bytes": n}
    by_namespace: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)
    records_appended: int = 0
    records: list[dict] = field(default_factory=list)  # the records (appended, or planned in a dry run)
    errors: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)  # seconds per phase
    # one row per orphan object / hot ledger / stale upload (DETAIL_SCHEMA); not in as_dict()
    detail_rows: list[tuple] = field(default_factory=list, repr=False)

    def add(self, namespace: str, kind: str, count: int, objects: int, nbytes: int) -> None:
        d = self.by_namespace.setdefault(namespace, {}).setdefault(kind, {"count": 0, "objects": 0, "bytes": 0})
        d["count"] += count
        d["objects"] += objects
        d["bytes"] += nbytes

    def sample(self, key: str) -> None:
        if len(self.sample_keys) < MAX_SAMPLE_KEYS:
            self.sample_keys.append(key)

    def as_dict(self) -> dict:
        d = asdict(self)
        del d["detail_rows"]
        return d

    # -- tieredcore.reports.JobReport ---------------------------------------------------------------

    def totals(self) -> Totals:
        """ledgers = orphan records (object groups and hot ledgers), bytes = their bytes, failures = the
        run's errors (a listing, an append, an abort)."""
        namespaces: dict[str, dict[str, Any]] = {}
        for ns, kinds in self.by_namespace.items():
            acc = namespaces.setdefault(ns, {"ledgers": 0, "bytes": 0, "failures": 0, "outcomes": {}})
            for kind, d in kinds.items():
                if kind != KIND_UPLOAD:
                    acc["ledgers"] += d["count"]
                acc["bytes"] += d["bytes"]
                acc["outcomes"][kind] = d["count"]
        for topic in self.unreadable_topics:  # each is one of the run's errors too
            acc = namespaces.setdefault(namespace_of(topic), {"ledgers": 0, "bytes": 0, "failures": 0, "outcomes": {}})
            acc["failures"] += 1
        return totals(
            ledgers=self.orphan_groups + self.hot_orphans, bytes=self.orphan_bytes + self.hot_orphan_bytes,
            failures=len(self.errors), namespaces=namespaces,
            outcomes={k: getattr(self, k) for k in OUTCOME_COUNTERS if getattr(self, k)},
        )

    def summary(self) -> dict[str, Any]:
        return self.as_dict()

    def detail(self) -> tuple[list[tuple], str]:
        return self.detail_rows, DETAIL_SCHEMA

    def messages(self) -> list[str]:
        return [f"ERROR {e}" for e in self.errors]
