"""A recovery as a run (spark_jobs/recover.py, the `tiered_recover` DAG): the refusals a run checks before
it starts, and its report (per namespace the topics created or kept, from manifests or from index objects,
cold-only ledgers, orphans, damaged manifests; one detail row per topic). docs/recovery.md."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tieredcore.cold.blob import iter_objects
from tieredcore.errors import ValidationError
from tieredcore.formats.keys import parse_key, parse_topic_manifest_key
from tieredcore.lifecycle.recover import RecoverReport, check_store, nothing_to_recover
from tieredcore.names import TopicName
from tieredcore.offload.context import is_complete, is_offloaded
from tieredcore.reports import Totals, totals
from tieredcore.workspace import Workspace

__all__ = ["COUNTERS", "RecoverRunReport", "check_recoverable"]

COUNTERS = ("from_manifests", "from_index", "cold_only", "orphans", "damaged_manifests", "stale_manifests",
            "not_recoverable", "objects_listed")
DETAIL_SCHEMA = ("topic string, namespace string, action string, source string, sequence long, ledgers long, "
                 "offloaded long, from_index long, cold_only long, lost long")


def check_recoverable(ws: Workspace, merge: bool) -> None:
    """The refusals, before any work: ValidationError (one line) for a store recovery may not write into
    (records without ``merge``, an attached workspace) and for a bucket holding nothing of this format
    (the listing stops at the first object of it)."""
    check_store(ws, merge)
    loc = ws.config.store_location
    store = ws.open_location(loc)
    prefix, cluster = ws.offloader.prefix, ws.config.cluster
    for o in iter_objects(store, prefix):
        if parse_topic_manifest_key(o.key, prefix, cluster) is not None:
            return
        p = parse_key(o.key, prefix)
        if p is not None and p.is_index and not p.is_manifest:
            return
    raise ValidationError(nothing_to_recover(ws))


def _namespace(topic: str) -> str:
    return TopicName.parse(topic).namespace_name


@dataclass
class RecoverRunReport:
    """tieredcore.reports.JobReport of a recovery. A failure: something that could not be recovered (an
    object no record can name, an unreadable index object, a ledger with no copy)."""

    report: RecoverReport
    as_of_ms: int

    def _rows(self) -> list[dict[str, Any]]:
        out = []
        for t in self.report.topics:
            info = t.info
            off = sum(1 for li in info.ledgerInfo if is_offloaded(li) or is_complete(li))
            out.append({"topic": t.topic, "namespace": _namespace(t.topic), "action": t.action, "source": t.source,
                        "sequence": t.sequence, "ledgers": len(info.ledgerInfo), "offloaded": off,
                        "from_index": len(t.from_index), "cold_only": len(t.cold_only), "lost": len(t.lost),
                        "bytes": sum(li.size for li in info.ledgerInfo)})
        return out

    def counters(self) -> dict[str, int]:
        r = self.report
        return {"from_manifests": sum(t.source == "manifest" for t in r.topics),
                "from_index": sum(t.source == "index" for t in r.topics),
                "cold_only": sum(len(t.cold_only) for t in r.topics), "orphans": len(r.orphans),
                "damaged_manifests": len(r.damaged_manifests), "stale_manifests": len(r.stale_manifests),
                "not_recoverable": len(r.not_recoverable) + len(r.unreadable), "objects_listed": r.objects_listed}

    def totals(self) -> Totals:
        rows = self._rows()
        outcomes: dict[str, int] = {}
        nss: dict[str, dict[str, Any]] = {}
        for row in rows:
            outcomes[row["action"]] = outcomes.get(row["action"], 0) + 1
            ns = nss.setdefault(row["namespace"], {"ledgers": 0, "bytes": 0, "failures": 0, "outcomes": {},
                                                   "counters": {"from_manifests": 0, "from_index": 0,
                                                                "cold_only": 0}})
            ns["ledgers"] += row["ledgers"]
            ns["bytes"] += row["bytes"]
            ns["failures"] += 1 if row["lost"] else 0
            ns["outcomes"][row["action"]] = ns["outcomes"].get(row["action"], 0) + 1
            ns["counters"]["from_manifests" if row["source"] == "manifest" else "from_index"] += 1
            ns["counters"]["cold_only"] += row["cold_only"]
        failures = len(self.report.not_recoverable) + len(self.report.unreadable) + sum(1 for r in rows if r["lost"])
        return totals(topics=len(rows), ledgers=sum(r["ledgers"] for r in rows), bytes=sum(r["bytes"] for r in rows),
                      failures=failures, outcomes=outcomes, namespaces=dict(sorted(nss.items())),
                      counters=self.counters())

    def summary(self) -> dict[str, Any]:
        doc = self.report.as_dict()
        doc.update(as_of_ms=self.as_of_ms, dry_run=not self.report.applied, summary_line=self.report.summary())
        return doc

    def detail(self) -> tuple[list[tuple], str]:
        cols = [c.strip().split(" ")[0] for c in DETAIL_SCHEMA.split(",")]
        return [tuple(r[c] for c in cols) for r in self._rows()], DETAIL_SCHEMA

    def messages(self) -> list[str]:
        r = self.report
        out = [t.line() for t in r.topics]
        out += [f"damaged manifest (an older one or the index objects used): {x}" for x in r.damaged_manifests]
        out += [f"stale manifest (an older one or the index objects used): {x}" for x in r.stale_manifests]
        out += [f"orphan (reported, not deleted): {x}" for x in r.orphans]
        out += [f"fallback: {t}: no usable manifest, recovered from index objects" for t in r.fallback_topics]
        out += [f"deleted: {t}: its newest manifest is a tombstone, not recreated" for t in r.deleted_topics]
        out += [f"FAILED not recoverable: {x}" for x in r.not_recoverable]
        out += [f"FAILED unreadable: {x}" for x in r.unreadable]
        out += [f"DATA LOSS: {t.topic} ledger(s) {t.lost}: no copy left" for t in r.topics if t.lost]
        out.append(r.summary())
        return out
