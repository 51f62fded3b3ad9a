"""The report of a reconciliation (a tieredcore.reports.JobReport): counters, orphans per namespace and
kind, samples, errors, timings, and one detail row per orphan object, hot ledger or stale upload."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from tieredcore import names
from tieredcore.lifecycle.reconcile.listing import ObjectRow
from tieredcore.lifecycle.reconcile.orphans import MAX_WITHHELD_LISTED, UNKNOWN_TOPIC, OrphanGroup
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


# why an object was left alone (ReconcileReport.withheld[*]["reason"])
WITHHELD_OTHER_CLUSTER = "other-cluster"  # its metadata names another cluster (or workspace, or none)
WITHHELD_YOUNG = "young"  # unreferenced, but within the grace period
WITHHELD_FOREIGN_KEY = "foreign-key"  # not an offload key ({uuid}-ledger-{id}[-index]): not Pulsar's
WITHHELD_UNREADABLE = "unreadable-topics"  # a topic record cannot be read: it may reference the uuid


def namespace_of(topic: str) -> str:
    return UNKNOWN_NAMESPACE if topic == UNKNOWN_TOPIC else names.namespace_of(topic)


def fmt_age(ms: int | None) -> str:
    """A duration for people: 9.0d, 5.0h, 30.0m, 12s."""
    if ms is None:
        return "-"
    s = ms // 1000
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= n:
            return f"{s / n:.1f}{unit}"
    return f"{s}s"


def orphan_why(g: OrphanGroup, age_ms: int, grace_ms: int) -> str:
    """Why a candidate object is an orphan, in one line (every condition the rule checks)."""
    what = ("segment uuid referenced by no ledger's offload segments" if g.is_segment else
            "uuid referenced by no ManagedLedgerInfo (complete or in-progress offload context, any ledger, any topic)")
    writer = f"written by cluster {g.writer!r}" if g.writer else "names no cluster"
    return f"{what} nor the deletion log; {writer}; age {fmt_age(age_ms)} > grace {fmt_age(grace_ms)}"


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
    # topic manifests older than their topic's newest manifests_keep, recorded for deletion now (a dry run:
    # how many there are; docs/recovery.md)
    manifests_superseded: int = 0
    oldest_orphan_age_ms: int | None = None
    attached: bool = False  # the workspace is attached to a Pulsar cluster (docs/pulsar.md)
    cluster: str = ""
    # every orphan object (appended, or to append in a dry run): key, size, age, why (ROW fields below)
    candidates: list[dict] = field(default_factory=list)
    # what was left alone and why (reason: WITHHELD_*): the first MAX_WITHHELD_LISTED, the rest counted
    withheld: list[dict] = field(default_factory=list)
    withheld_not_listed: int = 0
    # namespace -> {"groups": n, "objects": n, "bytes": n}: the orphan objects (not hot ledgers) per namespace
    orphans_by_namespace: dict[str, dict[str, int]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # what an operator must know about this run (one line each)
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

    def candidate(self, location: str, kind: str, g: OrphanGroup, key: str, topic: str) -> None:
        """One orphan object in ``candidates`` (and its namespace's orphan figures)."""
        age = self.as_of_ms - g.modified.get(key, 0)
        ns = namespace_of(topic)
        self.candidates.append({
            "key": key, "size": g.sizes.get(key, 0), "age_ms": age, "age": fmt_age(age), "uuid": g.uuid,
            "ledger_id": g.ledger_id, "topic": topic, "namespace": ns, "location": location, "kind": kind,
            "writer": g.writer, "why": orphan_why(g, age, self.grace_ms)})
        d = self.orphans_by_namespace.setdefault(ns, {"groups": 0, "objects": 0, "bytes": 0})
        d["objects"] += 1
        d["bytes"] += g.sizes.get(key, 0)
        d["groups"] += int(key == g.keys[0])

    def withhold(self, reason: str, key: str, size: int, modified_ms: int | None, why: str) -> None:
        if len(self.withheld) >= MAX_WITHHELD_LISTED:
            self.withheld_not_listed += 1
            return
        age = None if modified_ms is None else self.as_of_ms - modified_ms
        self.withheld.append({"key": key, "size": size, "age_ms": age, "age": fmt_age(age), "reason": reason,
                              "why": why})

    def withhold_group(self, reason: str, g: OrphanGroup, why: str) -> None:
        for k in g.keys:
            self.withhold(reason, k, g.sizes.get(k, 0), g.modified.get(k), why)

    def withhold_young(self, g: OrphanGroup) -> None:
        age = self.as_of_ms - g.newest_modified_ms
        self.withhold_group(WITHHELD_YOUNG, g, f"uuid unreferenced, but its group's newest object is {fmt_age(age)} "
                                               f"old, within the grace period {fmt_age(self.grace_ms)} (maybe an "
                                               "offload in flight or the brokers' own cleanup)")

    def withhold_foreign_key(self, r: ObjectRow) -> None:
        self.withhold(WITHHELD_FOREIGN_KEY, r.key, r.size, r.last_modified_ms,
                      "not an offloaded ledger's key ({uuid}-ledger-{id}[-index]): not Pulsar's, never touched")

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
