"""Orphan reconciliation (docs/deletion.md, "Orphan reconciliation"): find what leaked in both tiers and hand it
to two-phase deletion. Nothing here deletes an object or a ledger; orphans become pending-deletion
records (reason ``orphan``) that the phase-2 drain deletes with all its checks. The only direct action
is aborting incomplete multipart uploads older than the grace period.

The pieces are separate so that a Spark job can run them per key prefix:

- ``listing``: :func:`listing_prefixes` / :func:`list_objects` / :func:`list_rest`: the offload prefix
  split into 16 disjoint listings (first hex digit of the uuid) plus one "rest" listing of every other
  key under the prefix (foreign keys), paginated; together they list every key exactly once.
- ``references``: :func:`referenced_uuids`: every uuid the metadata store or the deletion log names.
- ``orphans``: :func:`find_object_orphans`: the anti-join (pure; the Spark job does the same as a
  DataFrame join); :func:`find_hot_orphans`, :func:`abort_stale_uploads`, and the HEAD of an orphan
  group's objects (its topic, its owner).
- ``report``: :class:`ReconcileReport`, what a run found and did.
- ``run``: the locations, the records planned and appended (:func:`plan_and_apply`, shared with the
  Spark job), and :func:`reconcile` wiring it all together.

Attached to a Pulsar cluster (docs/pulsar.md): no owner marker is read or written (the brokers write none),
the default grace period is ATTACHED_DEFAULT_GRACE_MS (a week), a run only plans unless asked to apply
(:func:`resolve_dry_run`), one unreadable topic record withholds every orphan, and multipart uploads are
neither listed nor aborted (the bucket grants list, get and delete only). The report lists every candidate object (key, size, age, why) and what was withheld and why.

Ownership (tieredcore.offload.ownership): every location is claimed (or checked, in a dry run) before it is
listed, and a store whose owner marker names another metadata store for this cluster is skipped with an
error. Every orphan candidate is HEADed (candidates are few) and never recorded when its metadata names
another cluster or another workspace: those are counted (``foreign_cluster_*``) and left alone. Owner
markers are not listed.

Streaming segments (PIP-76, ``{uuid}`` / ``{uuid}-index``) are one group per uuid: referenced while any
ledger names the uuid in its ``offloadSegment`` entries (assigned or complete) or the deletion log has it;
an unreferenced one older than the grace period becomes a ``segment`` record; their unfinished multipart
uploads are aborted like a ledger offload's. (The Spark job anti-joins ledger keys only.)

Ordering makes a run safe against concurrent writers without any lock: objects are listed first, then
the topic records are read, then the deletion log. An offload records its uuid before writing any
object, so an object seen by the listing has its uuid in the later metadata read unless the attempt
was really abandoned; a phase-1 producer appends its record before changing the topic record, so a
reference that disappeared from the metadata read is in the (later) deletion-log read. Objects younger
than the grace period are never flagged whatever the metadata says.
"""

from tieredcore.lifecycle.reconcile.listing import (
    ObjectRow,
    list_objects,
    list_rest,
    listing_prefixes,
    parse_row,
)
from tieredcore.lifecycle.reconcile.orphans import (
    ATTACHED_DEFAULT_GRACE_MS,
    DEFAULT_GRACE_MS,
    HOT_NOT_LISTED,
    HOT_TOPIC_MISSING,
    ObjectOrphans,
    abort_stale_uploads,
    find_hot_orphans,
    find_object_orphans,
    managed_ledger_of,
)
from tieredcore.lifecycle.reconcile.references import referenced_uuids
from tieredcore.lifecycle.reconcile.report import (
    KIND_LEDGER,
    KIND_OFFLOADED,
    KIND_SEGMENT,
    KIND_UPLOAD,
    ReconcileReport,
)
from tieredcore.lifecycle.reconcile.run import (
    owned_locations,
    plan_and_apply,
    plan_object_records,
    reconcile,
    resolve_dry_run,
    store_locations,
)

__all__ = [
    "ATTACHED_DEFAULT_GRACE_MS",
    "DEFAULT_GRACE_MS",
    "HOT_NOT_LISTED",
    "HOT_TOPIC_MISSING",
    "KIND_LEDGER",
    "KIND_OFFLOADED",
    "KIND_SEGMENT",
    "KIND_UPLOAD",
    "ObjectOrphans",
    "ObjectRow",
    "ReconcileReport",
    "abort_stale_uploads",
    "find_hot_orphans",
    "find_object_orphans",
    "list_objects",
    "list_rest",
    "listing_prefixes",
    "managed_ledger_of",
    "owned_locations",
    "parse_row",
    "plan_and_apply",
    "plan_object_records",
    "reconcile",
    "referenced_uuids",
    "resolve_dry_run",
    "store_locations",
]
