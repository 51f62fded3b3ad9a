"""Key management over a workspace's transformed objects (docs/keys.md): which key-encryption key (KEK)
each encrypted object's data key is wrapped by, re-wrapping them under another key (rotation), and
retiring a key only when no object needs it any more.

Every transformed object ``<key>`` has its manifest ``<key>.manifest`` beside it (the commit point,
holding the wrapped data key); :func:`find_manifests` lists the manifests of every offload location of
the workspace (the locations orphan reconciliation covers: the configured store, every store a policy
names, every store a ledger's driver metadata names; each checked to be this workspace's). Objects are
per location, not per namespace: a location may hold several namespaces' objects, and a manifest does
not say which namespace wrote it, so rotation covers every location.

Rotation is safe to interrupt and to rerun: the chunks of an object are never rewritten, only its
manifest, replaced in one atomic put holding the same data key wrapped by the target key. Until it is
replaced the old manifest holds; both keys are on the ring, so every object reads either way, and a
rerun skips what is done (``rewrap`` is idempotent). Retiring refuses a key any object still needs.

One key ring: the configuration's ``key_ring``. Objects wrapped by a key that is not on it (another
ring's, or a lost one) are reported as needing a key the ring lacks, and fail to rotate (never skipped
silently). Objects another cluster or workspace wrote (``foreign``) are counted and left alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from tieredcore.cold.failures import StoreFailureBudget
from tieredcore.cold.keyring import KeyRing, check_key_id
from tieredcore.cold.transformed import TransformedBlobStore
from tieredcore.errors import NoSuchObjectError, NotFoundError, TieredError, ValidationError
from tieredcore.formats.keys import MANIFEST_SUFFIX, parse_key
from tieredcore.formats.manifest import Manifest
from tieredcore.formats.proto import MLDataFormats_pb2 as pb
from tieredcore.lifecycle.reconcile.listing import list_objects
from tieredcore.lifecycle.reconcile.run import owned_locations, store_locations
from tieredcore.offload.context import driver_metadata_from_dict
from tieredcore.offload.offloader import LedgerOffloader
from tieredcore.offload.ownership import foreign_reason
from tieredcore.outcomes import Outcome
from tieredcore.reports import Totals, totals
from tieredcore.workspace import Workspace

__all__ = [
    "DETAIL_SCHEMA",
    "KeyStatus",
    "Listing",
    "ManifestRef",
    "RotationReport",
    "find_manifests",
    "key_status",
    "retire",
    "rotate",
    "rotation_target",
]

FAILED_OUTCOMES = frozenset({Outcome.FAILED, Outcome.ABORTED})
SAMPLE_KEYS = 5
RETIRED_SUFFIX = ".pem.retired"  # what KeyRing.retire renames a key's PEM file to
# detail.parquet of a rotation run (Spark DDL): one row per object
DETAIL_SCHEMA = "location string, key string, outcome string, kek_from string, kek_to string, reason string"


# -- finding the manifests ------------------------------------------------------------------------


@dataclass(frozen=True)
class ManifestRef:
    """One transformed object: where it is (its location's driver dict, marked chunked, with the key
    ring: what an executor opens it with) and its logical key (the manifest is ``key + .manifest``)."""

    location: str  # label, for reports
    driver: dict[str, Any]
    key: str

    def as_tuple(self) -> tuple[str, dict[str, Any], str]:
        return (self.location, self.driver, self.key)


@dataclass
class Listing:
    refs: list[ManifestRef] = field(default_factory=list)
    locations: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # a location that could not be listed or checked


def find_manifests(ws: Workspace, *, page_size: int = 1000) -> Listing:
    """The manifests of every offload location of the workspace (skipping locations another workspace
    claimed: an error). Nothing is written (no location is claimed)."""
    out = Listing()
    ring_path = ws.config.key_ring
    for loc in owned_locations(ws, store_locations(ws, out.errors), out.errors, dry_run=True):
        where = replace(loc.where, chunked=True, key_ring=ring_path)
        out.locations.append(loc.label)
        try:
            found = [r.key[: -len(MANIFEST_SUFFIX)] for r in
                     list_objects(loc.store, loc.prefix, exclude_prefixes=loc.exclude_prefixes, page_size=page_size)
                     if _is_manifest(r.key, loc.prefix)]
        except TieredError as e:
            out.errors.append(f"{loc.label}: listing failed, location skipped: {e}")
            continue
        driver = where.driver_dict()
        out.refs += [ManifestRef(loc.label, driver, k) for k in found]
    return out


def _is_manifest(key: str, prefix: str) -> bool:
    p = parse_key(key, prefix) if key.endswith(MANIFEST_SUFFIX) else None
    return p is not None and p.is_manifest


def _store(offloader_for_driver: Callable[[pb.OffloadDriverMetadata], LedgerOffloader],
           stores: dict[str, TransformedBlobStore], ref: ManifestRef) -> TransformedBlobStore:
    """The ref's location's transformed store (manifests read and written through it), with the key
    ring; opened once per location."""
    got = stores.get(ref.location)
    if got is not None:
        return got
    driver = ref.driver
    store = offloader_for_driver(driver_metadata_from_dict(driver)).store
    if not isinstance(store, TransformedBlobStore):  # the driver dict is marked chunked: never happens
        raise ValidationError(f"{driver}: not opened as a location of transformed objects")
    stores[ref.location] = store
    return store


def _read_manifest(store: TransformedBlobStore, key: str) -> Manifest:
    mkey = key + MANIFEST_SUFFIX
    return Manifest.from_json(store.inner.get(mkey), mkey)


# -- status ---------------------------------------------------------------------------------------


@dataclass
class KekUse:
    objects: int = 0
    samples: list[str] = field(default_factory=list)

    def add(self, key: str) -> None:
        self.objects += 1
        if len(self.samples) < SAMPLE_KEYS:
            self.samples.append(key)


@dataclass
class KeyStatus:
    """Which key each of the workspace's encrypted objects needs, and the ring's keys."""

    ring: str  # the configured key ring ('' when none is configured)
    active: str | None
    ring_keys: list[str]
    retired_keys: list[str]  # ``<id>.pem.retired`` files on the ring (restorable by renaming them back)
    locations: list[str]
    objects: int = 0  # transformed objects of this workspace examined
    by_kek: dict[str, KekUse] = field(default_factory=dict)
    unencrypted: KekUse = field(default_factory=KekUse)  # chunked objects without encryption
    foreign: int = 0  # another cluster's or workspace's objects: not counted against any key
    unreadable: KekUse = field(default_factory=KekUse)  # manifests that cannot be read or parsed
    errors: list[str] = field(default_factory=list)

    def needing(self, kek_id: str) -> int:
        use = self.by_kek.get(kek_id)
        return use.objects if use else 0

    @property
    def missing(self) -> list[str]:
        """Keys objects need that are not on the ring (those objects cannot be read)."""
        return sorted(k for k in self.by_kek if k not in self.ring_keys)

    def key_rows(self) -> list[dict[str, Any]]:
        """One row per key id on the ring, retired, or needed by an object."""
        ids = sorted(set(self.ring_keys) | set(self.retired_keys) | set(self.by_kek))
        return [{"id": k, "active": k == self.active, "on_ring": k in self.ring_keys,
                 "retired": k in self.retired_keys and k not in self.ring_keys, "objects": self.needing(k),
                 "samples": list(self.by_kek[k].samples) if k in self.by_kek else []} for k in ids]

    def as_dict(self) -> dict[str, Any]:
        return {"key_ring": self.ring, "active": self.active, "keys": self.key_rows(), "locations": self.locations,
                "objects": self.objects, "unencrypted": self.unencrypted.objects,
                "unencrypted_samples": self.unencrypted.samples, "foreign": self.foreign,
                "unreadable": self.unreadable.objects, "unreadable_samples": self.unreadable.samples,
                "missing_keys": self.missing, "errors": self.errors}


def _ring_state(ws: Workspace) -> tuple[KeyRing | None, list[str]]:
    """The configured ring (None when none is configured) and the ids of its retired keys."""
    if not ws.config.key_ring:
        return None, []
    ring = ws.key_ring()
    retired = sorted(p.name[: -len(RETIRED_SUFFIX)] for p in Path(ring.path).glob("*" + RETIRED_SUFFIX))
    return ring, retired


def key_status(ws: Workspace, listing: Listing | None = None) -> KeyStatus:
    """Reads every manifest (one GET each; no data key is unwrapped): objects per KEK id, unencrypted
    and unreadable ones, and the ring's keys. Without a configured key ring the ring's part is empty."""
    ring, retired = _ring_state(ws)
    listing = listing if listing is not None else find_manifests(ws)
    st = KeyStatus(str(ring.path) if ring else "", ring.active_id if ring else None,
                   sorted(ring.keys) if ring else [], retired, list(listing.locations), errors=list(listing.errors))
    cluster, identity = ws.config.cluster, ws.identity_if_any() or ""
    stores: dict[str, TransformedBlobStore] = {}
    for ref in listing.refs:
        try:
            store = _store(ws.offloader_for_driver, stores, ref)
            m = _read_manifest(store, ref.key)
        except NoSuchObjectError:
            continue  # deleted since the listing
        except (TieredError, OSError) as e:
            st.unreadable.add(f"{ref.key}: {type(e).__name__}: {e}")
            continue
        if foreign_reason(m.metadata, cluster, identity) is not None:
            st.foreign += 1
            continue
        st.objects += 1
        if m.kek_id is None:
            st.unencrypted.add(ref.key)
        else:
            st.by_kek.setdefault(m.kek_id, KekUse()).add(ref.key)
    return st


# -- rotation -------------------------------------------------------------------------------------


@dataclass
class RotationRow:
    location: str
    key: str
    outcome: str
    kek_from: str | None = None
    kek_to: str | None = None
    reason: str = ""  # why skipped, or the error

    @property
    def failed(self) -> bool:
        return self.outcome in FAILED_OUTCOMES


def rotation_target(ws: Workspace, target: str | None = None) -> str:
    """The key to re-wrap under (default: the ring's active key), checked to be on the ring."""
    ring = ws.key_ring()
    if not target:
        return ring.active_id
    check_key_id(target)
    if target not in ring.keys:
        raise NotFoundError(f"key ring {ring.path}: no key {target} (keys: {', '.join(sorted(ring.keys))})")
    return target


def rotate(ws: Workspace, manifests: Iterable[ManifestRef], target: str | None = None, dry_run: bool = False,
           *, progress: Callable[[int, RotationRow], None] | None = None) -> list[RotationRow]:
    """Re-wrap each object's data key under ``target`` (default: the active key), rewriting only its
    manifest. One row per object: rewrapped (would_rewrap in a dry run, which unwraps to prove it could
    and writes nothing) / skipped (already under the target, not encrypted, another cluster's, deleted
    meanwhile) / failed (the error) / aborted (its store failed too often in a row: not attempted).
    Resumable: rerunning after an interruption re-wraps only what is left."""
    kek = rotation_target(ws, target)
    ring = ws.key_ring()
    cluster, identity = ws.config.cluster, ws.identity_if_any() or ""
    stores: dict[str, TransformedBlobStore] = {}
    budgets: dict[str, StoreFailureBudget] = {}
    rows: list[RotationRow] = []
    for ref in manifests:
        budget = budgets.setdefault(ref.location, ws.failure_budget())
        row = RotationRow(ref.location, ref.key, Outcome.FAILED, kek_to=kek)
        error_type = ""
        if budget.exhausted:
            row.outcome, row.reason = Outcome.ABORTED, budget.reason
        else:
            try:
                store = _store(ws.offloader_for_driver, stores, ref)
                _rotate_one(store, ring, ref.key, kek, dry_run, row, cluster, identity)
            except (TieredError, OSError) as e:
                row.outcome, row.reason, error_type = Outcome.FAILED, f"{type(e).__name__}: {e}", type(e).__name__
            budget.record(error_type, row.reason)
        rows.append(row)
        if progress is not None:
            progress(len(rows), row)
    return rows


def _rotate_one(store: TransformedBlobStore, ring: KeyRing, key: str, kek: str, dry_run: bool, row: RotationRow,
                cluster: str, identity: str) -> None:
    try:
        m = _read_manifest(store, key)
    except NoSuchObjectError:
        row.outcome, row.reason = Outcome.SKIPPED, "deleted meanwhile"
        return
    row.kek_from = m.kek_id
    why = foreign_reason(m.metadata, cluster, identity)
    if why is not None:
        row.outcome, row.reason = Outcome.SKIPPED, f"not ours: {why}"
    elif not m.encrypted:
        row.outcome, row.reason = Outcome.SKIPPED, "not encrypted"
    elif m.kek_id == kek:
        row.outcome, row.reason = Outcome.SKIPPED, f"already under {kek}"
    elif dry_run:
        ring.unwrap(m.data_key or "")  # KeyRingError: this object could not be rotated
        row.outcome = Outcome.WOULD_REWRAP
    elif store.rewrap(key, kek):
        row.outcome = Outcome.REWRAPPED
    else:  # another rotation got there first
        row.outcome, row.reason = Outcome.SKIPPED, f"already under {kek}"


# -- retiring -------------------------------------------------------------------------------------


def retire(ws: Workspace, kek_id: str, status: KeyStatus | None = None) -> Path:
    """Take ``kek_id`` off the configured ring (its PEM renamed ``<id>.pem.retired``), refused while any
    object of the workspace needs it, or while that cannot be established (a location that could not be
    listed, a manifest that cannot be read). Returns the retired file."""
    check_key_id(kek_id)
    ring = ws.key_ring()
    if kek_id not in ring.keys:
        raise NotFoundError(f"key ring {ring.path}: no key {kek_id} (keys: {', '.join(sorted(ring.keys))})")
    if kek_id == ring.active_id:
        raise ValidationError(f"key {kek_id} is the active key: `tiered keys activate` another key, "
                              f"`tiered keys rotate`, then retire it")
    st = status if status is not None else key_status(ws)
    n = st.needing(kek_id)
    if n:
        raise ValidationError(
            f"refused: key {kek_id} is still needed by {n} object(s) (e.g. {st.by_kek[kek_id].samples[0]}); "
            f"run `tiered keys rotate` to re-wrap their data keys under the active key {ring.active_id}, then "
            f"retire {kek_id}")
    if st.errors or st.unreadable.objects:
        raise ValidationError(
            f"refused: cannot tell whether key {kek_id} is still needed: {len(st.errors)} location(s) not "
            f"listed, {st.unreadable.objects} manifest(s) unreadable "
            f"({'; '.join((st.errors + st.unreadable.samples)[:3])}); see `tiered keys status`")
    return ring.retire(kek_id)


# -- the run report (CLI, Spark job, DAG summary) ---------------------------------------------------


@dataclass
class RotationReport:
    """A rotation run: counts per location, one detail row per object (a tieredcore.reports.JobReport)."""

    target: str
    dry_run: bool
    rows: list[dict[str, Any]]
    locations: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # locations that could not be listed

    @classmethod
    def of(cls, target: str, dry_run: bool, rows: Sequence[RotationRow | dict[str, Any]],
           listing: Listing) -> RotationReport:
        return cls(target, dry_run, [asdict(r) if isinstance(r, RotationRow) else dict(r) for r in rows],
                   list(listing.locations), list(listing.errors))

    def outcomes(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.rows:
            out[r["outcome"]] = out.get(r["outcome"], 0) + 1
        return dict(sorted(out.items()))

    def by_location(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {loc: {} for loc in self.locations}
        for r in self.rows:
            d = out.setdefault(r["location"], {})
            d[r["outcome"]] = d.get(r["outcome"], 0) + 1
        return {k: dict(sorted(v.items())) for k, v in sorted(out.items())}

    @property
    def failures(self) -> int:
        return sum(1 for r in self.rows if r["outcome"] in FAILED_OUTCOMES) + len(self.errors)

    def failed_rows(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["outcome"] in FAILED_OUTCOMES]

    def totals(self) -> Totals:
        return totals(ledgers=len(self.rows), failures=self.failures, outcomes=self.outcomes(),
                      counters={k: self.outcomes().get(k, 0) for k in (Outcome.REWRAPPED, Outcome.WOULD_REWRAP,
                                                                       Outcome.SKIPPED, Outcome.FAILED,
                                                                       Outcome.ABORTED)})

    def summary(self) -> dict[str, Any]:
        return {"target": self.target, "dry_run": self.dry_run, "objects": len(self.rows),
                "outcomes": self.outcomes(), "locations": self.by_location(), "errors": self.errors,
                "failed": [f"{r['key']}: {r['outcome']}: {r['reason']}" for r in self.failed_rows()]}

    def detail(self) -> tuple[list[tuple], str]:
        return [(r["location"], r["key"], r["outcome"], r["kek_from"], r["kek_to"], r["reason"])
                for r in self.rows], DETAIL_SCHEMA

    def messages(self) -> list[str]:
        verb = "would re-wrap" if self.dry_run else "re-wrapped"
        o = self.outcomes()
        n = o.get(Outcome.WOULD_REWRAP if self.dry_run else Outcome.REWRAPPED, 0)
        out = [f"{len(self.rows)} object(s) under key {self.target}: {verb} {n}, skipped {o.get(Outcome.SKIPPED, 0)}, "
               f"failed {o.get(Outcome.FAILED, 0) + o.get(Outcome.ABORTED, 0)}"]
        out += [f"{loc}: {counts}" for loc, counts in self.by_location().items()]
        out += self.errors
        out += [f"FAILED {r['key']}: {r['reason']}" for r in self.failed_rows()[:20]]
        return out


def timed_rotation(ws: Workspace, target: str | None, dry_run: bool,
                   progress: Callable[[int, int, RotationRow], None] | None = None) -> tuple[RotationReport, float]:
    """The whole rotation in one process (the CLI): list, rotate, report; and the seconds it took."""
    started = time.monotonic()
    kek = rotation_target(ws, target)  # bad input before anything is listed
    listing = find_manifests(ws)
    n = len(listing.refs)
    rows = rotate(ws, listing.refs, kek, dry_run,
                  progress=(lambda i, row: progress(i, n, row)) if progress is not None else None)
    return RotationReport.of(kek, dry_run, rows, listing), round(time.monotonic() - started, 3)
