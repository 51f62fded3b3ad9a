"""Who owns what in a shared object store: never touch what another cluster wrote.

Sharing a bucket between clusters is normal in Pulsar deployments, and every offloaded object carries
the writer's cluster name (``pulsarclustername`` user metadata, docs/formats.md). That is not enough on its
own: two workspaces with the *same* cluster name (``standalone`` is everyone's default) would take each
other's objects for their own orphans. So:

- Every metadata store has an **identity**: a random id created once, at ``/tiered/identity``.
- Every (object store, key prefix, cluster) a workspace writes to carries an **owner marker**, the
  object ``<prefix>tiered-owner.<cluster>`` naming that identity. :func:`claim_store` creates it
  (create-if-absent: two claimants cannot both win) or checks it, and refuses a store claimed by
  another metadata store with a :class:`StoreOwnershipError` that says what to do. ``tiered init``, every
  offload and every reconciliation claim their stores first.
- Objects this project writes also carry the identity (``tieredowner`` user metadata). Reconciliation
  and the deletion drain check every object before recording or deleting it (:func:`foreign_reason`):
  another cluster's name, or another identity, means "not ours", counted and left alone.

The marker is an ordinary object outside the offload key grammar: listings show it, reconciliation
never flags it, nothing deletes it.
"""

from __future__ import annotations

import json
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Mapping
from contextlib import suppress
from dataclasses import dataclass

from tieredcore import __version__
from tieredcore.clock import iso_ms
from tieredcore.cold.blob import BlobStore
from tieredcore.errors import (
    BlobStoreError,
    NodeExistsError,
    NoSuchObjectError,
    ObjectExistsError,
    StoreOwnershipError,
)
from tieredcore.formats.constants import METADATA_CLUSTER_NAME_KEY, METADATA_OWNER_KEY
from tieredcore.meta.store import MetadataStore
from tieredcore.names import check_cluster_name
from tieredcore.offload.sidecar import Permit

IDENTITY_PATH = "/tiered/identity"
MARKER_PREFIX = "tiered-owner."
# -- the metadata store's identity ------------------------------------------------------------------


def read_identity(meta: MetadataStore) -> str | None:
    got = meta.get(IDENTITY_PATH)
    if got is None:
        return None
    try:
        rec = json.loads(got.value)
        ident = rec["id"] if isinstance(rec, dict) else None
    except (ValueError, KeyError, RecursionError):
        ident = None
    if not isinstance(ident, str) or not ident:
        raise StoreOwnershipError(f"metadata store: {IDENTITY_PATH} is unreadable ({got.value[:80]!r}); "
                                  "restore it from a backup: objects written by this workspace name it")
    return ident


def new_identity() -> str:
    return uuidlib.uuid4().hex


def ensure_identity(meta: MetadataStore, proposed: str | None = None) -> str:
    """The metadata store's identity, created on first use (``proposed`` or a fresh one)."""
    ident = read_identity(meta)
    if ident is not None:
        return ident
    body = json.dumps({"id": proposed or new_identity(), "created_ms": int(time.time() * 1000)}).encode()
    with suppress(NodeExistsError):  # another process created it first: use theirs
        meta.create(IDENTITY_PATH, body)
    ident = read_identity(meta)
    assert ident is not None
    return ident


# -- the store's owner marker -----------------------------------------------------------------------


def marker_key(prefix: str, cluster: str) -> str:
    return f"{prefix}{MARKER_PREFIX}{check_cluster_name(cluster)}"


def is_marker_key(key: str, prefix: str) -> bool:
    return key.startswith(prefix + MARKER_PREFIX) and "/" not in key[len(prefix):]


@dataclass(frozen=True)
class Marker:
    cluster: str
    identity: str
    metadata: str  # where the owner's metadata store is (for the operator reading an error)
    claimed_ms: int


def read_marker(store: BlobStore, prefix: str, cluster: str) -> Marker | None:
    key = marker_key(prefix, cluster)
    try:
        raw = store.get(key)
    except NoSuchObjectError:
        return None
    try:
        rec = json.loads(raw)
        m = Marker(str(rec["cluster"]), str(rec["identity"]), str(rec.get("metadata", "?")),
                   int(rec.get("claimed_ms", 0)))
    except (ValueError, KeyError, TypeError, RecursionError):
        raise StoreOwnershipError(f"{_where(store, prefix)}: owner marker {key} is unreadable; an operator must "
                                  "check which workspace owns this store before anything deletes there") from None
    return m


def claim_store(store: BlobStore, prefix: str, cluster: str, identity: str, metadata_url: str = "") -> Marker:
    """Create or check the owner marker of (store, prefix, cluster): StoreOwnershipError when another
    metadata store already claimed it."""
    key = marker_key(prefix, cluster)
    m = read_marker(store, prefix, cluster)
    if m is None:
        mine = Marker(cluster, identity, metadata_url, int(time.time() * 1000))
        body = json.dumps({"cluster": cluster, "identity": identity, "metadata": metadata_url,
                           "claimed_ms": mine.claimed_ms, "software": __version__}, indent=1).encode()
        try:
            store.put(key, body, {"role": "owner"}, if_absent=True)
            return mine
        except ObjectExistsError:
            m = read_marker(store, prefix, cluster)  # claimed concurrently: check whose it is
            assert m is not None
    if m.identity != identity:
        raise StoreOwnershipError(
            f"{_where(store, prefix)} is already used by cluster {cluster!r} of another workspace (metadata "
            f"store {m.metadata}, identity {m.identity}, claimed {iso_ms(m.claimed_ms)}). Two workspaces with the "
            f"same cluster name must not share a store prefix: each would take the other's objects for "
            f"orphans. Give this workspace another cluster name (`tiered init --cluster NAME`) or another "
            f"store prefix.")
    return m


# -- per-object checks --------------------------------------------------------------------------------


def foreign_reason(metadata: Mapping[str, str], cluster: str, identity: str) -> str | None:
    """Why an object with this user metadata is not ours to record or delete (None: it is ours).
    Ours: written for our cluster name and, when it names a workspace identity, ours. Objects Pulsar
    wrote carry the cluster name only; within a prefix our marker claims, they are this cluster's."""
    writer = metadata.get(METADATA_CLUSTER_NAME_KEY)
    if writer is None:
        return "it names no cluster (not written by this project or Pulsar)"
    if writer != cluster:
        return f"written by cluster {writer!r}"
    owner = metadata.get(METADATA_OWNER_KEY)
    if owner is not None and owner != identity:
        return f"written by another workspace of cluster {cluster!r} (identity {owner})"
    return None


def _where(store: BlobStore, prefix: str) -> str:
    props = store.driver_properties()
    where = props.get("bucket") or props.get("root") or "?"
    return f"object store {store.driver}:{where}/{prefix}"



# -- writing beside objects the workspace reads --------------------------------------------------------


class SidecarPermission:
    """Whether this workspace may write an entry-offsets sidecar beside a data object of (store, prefix)
    (tieredcore.offload.sidecar): only where its own marker already claims the store, and only beside
    objects of its cluster that no other workspace owns. Reading never claims a store: a bucket this
    workspace never wrote to (an attached Pulsar cluster's, a read-only replica) gets no sidecars. The
    marker is read once (a positive answer is kept; a missing one is asked again after an offload of
    this process claimed the store)."""

    def __init__(self, store: BlobStore, prefix: str, cluster: str, identity: Callable[[], str | None]) -> None:
        self.store = store
        self.prefix = prefix
        self.cluster = cluster
        self.identity = identity
        self._owner = ""  # the identity the marker was found to name
        self._lock = threading.Lock()

    def __call__(self, metadata: Mapping[str, str]) -> Permit:
        ident = self.identity()
        if not ident:
            return Permit(refusal="this workspace never claimed a store (its metadata store has no identity)")
        with self._lock:
            if self._owner != ident:
                try:
                    m = read_marker(self.store, self.prefix, self.cluster)
                except (StoreOwnershipError, BlobStoreError) as e:
                    return Permit(refusal=f"the store's owner marker could not be read: {e}")
                if m is None:
                    return Permit(refusal=f"{_where(self.store, self.prefix)} is not claimed by this workspace "
                                          "(it never offloaded there): nothing is written into it")
                if m.identity != ident:
                    return Permit(refusal=f"{_where(self.store, self.prefix)} is claimed by another workspace")
                self._owner = ident
        why = foreign_reason(metadata, self.cluster, ident)
        if why is not None:
            return Permit(refusal=f"the data object is not this workspace's: {why}")
        return Permit(owner=ident)
