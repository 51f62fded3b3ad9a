"""Opens the stores a Config names and wires the layers together (one place, used by every entry point)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import cached_property
from pathlib import Path

from tieredcore.clock import now_ms
from tieredcore.cold.blob import BlobStore
from tieredcore.cold.chunk_cache import ChunkCache, open_chunk_cache
from tieredcore.cold.failures import StoreFailureBudget
from tieredcore.cold.keyring import KeyRing
from tieredcore.cold.liveness import StoreLiveness, describe, guarded, server_of
from tieredcore.cold.location import StoreLocation
from tieredcore.cold.read_only import ReadOnlyBlobStore
from tieredcore.cold.transformed import TransformedBlobStore
from tieredcore.config import Config
from tieredcore.errors import (
    BlobStoreError,
    PulsarReadOnlyError,
    ReplicaReadOnlyError,
    StoreOwnershipError,
    ValidationError,
)
from tieredcore.formats.keys import normalize_prefix
from tieredcore.formats.proto import MLDataFormats_pb2 as pb
from tieredcore.formats.transform import TransformSpec
from tieredcore.hot.replica import ReplicaHotTier
from tieredcore.hot.tier import HotTier
from tieredcore.meta.deletion_log import DeletionLog
from tieredcore.meta.leases import TopicLeases
from tieredcore.meta.managed_ledgers import ManagedLedgerStore
from tieredcore.meta.pulsar import PulsarRecords
from tieredcore.meta.read_only import ReadOnlyMetadataStore
from tieredcore.meta.store import MetadataStore
from tieredcore.names import TopicName
from tieredcore.offload.managed import TopicOffloader
from tieredcore.offload.manifests import TopicManifests, offloaded_state
from tieredcore.offload.offloader import LedgerOffloader
from tieredcore.offload.ownership import SidecarPermission, claim_store, ensure_identity, read_identity
from tieredcore.offload.segments import SegmentOffloader
from tieredcore.offload.streaming import StreamingOffloader
from tieredcore.policy import TIERED_FIRST, OffloadPolicy, PolicyStore
from tieredcore.pulsar_policies import PulsarPolicyStore
from tieredcore.topic.reader import TopicReader


class Workspace:
    def __init__(self, config: Config) -> None:
        self.config = config
        self._offloaders: dict[tuple, LedgerOffloader] = {}
        self._key_rings: dict[str, KeyRing] = {}
        # one liveness per store server this workspace (this run) talks to: a dead store is dead everywhere
        self._liveness: dict[tuple[str, str, str], StoreLiveness] = {}
        # claims of (store, prefix) already made by this run: the marker answer, or the error it failed with
        self._claims: dict[tuple, BaseException | None] = {}

    @cached_property
    def metadata(self) -> MetadataStore:
        store = self.config.open_metadata()
        if self.replica:  # written by `tiered replica-sync` only, through its ``writable`` store
            return ReadOnlyMetadataStore(store, self.replica_refusal())
        return store

    @property
    def replica(self) -> bool:
        """A read replica of another cluster's bucket (docs/recovery.md "Read replicas"): the bucket is
        opened read-only (every store this workspace opens refuses writes) and the metadata store refuses
        every write but the sync's."""
        return self.config.replica

    def replica_refusal(self) -> str:
        """The one line a replica answers every write with."""
        return (f"this workspace is a read replica of {self.config.replica_of} (cluster "
                f"{self.config.cluster!r}); it never writes there and its records change only by "
                "`tiered replica-sync`")

    @cached_property
    def ml(self) -> ManagedLedgerStore:
        ml = ManagedLedgerStore(self.metadata)
        if not self.attached and not self.replica:  # an attached cluster's or a replica's bucket: never written
            # every committed change of a topic's offloaded state writes its topic manifest (docs/recovery.md)
            ml.after_offloaded_change = lambda t, info, version: self.manifests.after_commit(t, info, version)
            ml.offloaded_state = offloaded_state
        return ml

    @cached_property
    def manifests(self) -> TopicManifests:
        """Topic manifests, in the configured store's plain form under its prefix (docs/recovery.md)."""
        loc = self.config.store_location
        store = self.open_location(loc)
        prefix = normalize_prefix(loc.prefix)

        def policies(t: TopicName) -> tuple[dict | None, dict | None]:
            return self.ml.get_policies(t.namespace_name), self.ml.get_topic_policies(t)

        return TopicManifests(store, prefix, deletion_log=self.deletion_log, keep=self.config.manifests_keep,
                              cluster=self.config.cluster, identity=lambda: self.identity, policies=policies,
                              clock_ms=now_ms, driver=loc.driver_dict(), before_write=lambda: self.claim(store, prefix))

    @property
    def attached(self) -> bool:
        """Attached to a Pulsar cluster (docs/pulsar.md): its ZooKeeper, BookKeeper and namespace policies are
        read-only (the metadata store, the hot tier and the policies below refuse writes), its bucket is
        never written (only reconciliation's apply deletes from it)."""
        return self.config.attached

    @cached_property
    def pulsar(self) -> PulsarRecords:
        """The attached cluster's administrative records (clusters, tenants, namespace policies as Pulsar
        wrote them, partitioned topics); ValidationError on a workspace that is not attached."""
        if not self.attached:
            raise ValidationError("this workspace is not attached to a Pulsar cluster (tiered init --pulsar-zk)")
        return PulsarRecords(self.metadata)

    @cached_property
    def policies(self) -> PolicyStore:
        """Namespace and topic policies, over the configuration's defaults (the cluster default under
        namespace and topic policies); attached: Pulsar's namespace policies, mapped and read-only."""
        c = self.config
        defaults = OffloadPolicy(max_block_size=c.max_block_size, read_buffer_size=c.read_buffer)
        if self.attached:
            return PulsarPolicyStore(self.ml, defaults=defaults, default_store_is_s3=c.store_url.startswith("s3://"),
                                     default_key_ring=c.key_ring, cluster=c.cluster)
        return PolicyStore(self.ml, defaults=defaults, default_store_is_s3=c.store_url.startswith("s3://"),
                           default_key_ring=c.key_ring)

    @cached_property
    def deletion_log(self) -> DeletionLog:
        """Pending-deletion records of two-phase deletion (docs/deletion.md), in the metadata store."""
        return DeletionLog(self.metadata)

    @cached_property
    def leases(self) -> TopicLeases:
        """Per-topic leases (one runner offloads or repairs a topic at a time)."""
        return TopicLeases(self.metadata, ttl_ms=self.config.lease_ttl_ms)

    def failure_budget(self) -> StoreFailureBudget:
        """A fresh budget of consecutive object-store failures for one run (or one Spark task)."""
        return StoreFailureBudget(self.config.store_failure_limit)

    @cached_property
    def hot(self) -> HotTier:
        if self.replica:  # none: the source's hot tier is not reachable, and nothing is written here
            return ReplicaHotTier(self.replica_refusal())
        return self.config.open_hot()

    @property
    def store(self) -> BlobStore:
        """The configured object store (its offloader's)."""
        return self.offloader.store

    @cached_property
    def offloader(self) -> LedgerOffloader:
        """The offloader of the configured store (and of ledgers recorded without driver metadata)."""
        return self.offloader_at(self.config.store_location)

    @cached_property
    def identity(self) -> str:
        """The metadata store's identity (created on first use): the owner named in store markers and
        object metadata (tieredcore.offload.ownership)."""
        return ensure_identity(self.metadata)

    def identity_if_any(self) -> str | None:
        """The identity if the metadata store has one already (never creates it: for dry runs)."""
        if "identity" in self.__dict__:
            return self.__dict__["identity"]
        return read_identity(self.metadata)

    def refuse_bucket_writes(self, what: str) -> None:
        """PulsarReadOnlyError on an attached workspace (ReplicaReadOnlyError on a read replica): nothing is
        ever written to the cluster's bucket."""
        if self.replica:
            raise ReplicaReadOnlyError(f"refused to {what}: {self.replica_refusal()}")
        if self.attached:
            raise PulsarReadOnlyError(
                f"refused to {what}: the bucket {self.config.store_url} is Pulsar cluster {self.config.cluster!r}'s; "
                "an attached workspace writes no object there (its brokers offload)")

    def claim(self, store: BlobStore, prefix: str) -> None:
        """Claim (store, prefix) for this workspace's cluster, or StoreOwnershipError (attached:
        PulsarReadOnlyError, no marker is written to the cluster's bucket). Once per run: a claim that
        failed on the store fails again at once (every ledger of a run against a dead store would otherwise
        repeat the marker's GET with its timeouts and retries)."""
        self.refuse_bucket_writes("write the store's owner marker")
        key = (store.driver, tuple(sorted(store.driver_properties().items())), normalize_prefix(prefix))
        if key in self._claims:
            failed = self._claims[key]
            if failed is None:
                return
            live = getattr(store, "liveness", None)
            if isinstance(live, StoreLiveness):
                live.check()  # dead since: say that rather than the old error
            raise type(failed)(*failed.args)
        try:
            claim_store(store, key[2], self.config.cluster, self.identity, self.config.metadata_url)
        except (BlobStoreError, StoreOwnershipError) as e:
            self._claims[key] = e
            raise
        self._claims[key] = None

    def open_location(self, location: StoreLocation) -> BlobStore:
        """The store at ``location``, opened for this run: watched for answers (tieredcore.cold.liveness),
        with one liveness per store server shared by every store of it this workspace opens; on a read
        replica, whatever store it opens (the followed bucket or one a record names) refuses writes."""
        store = self._open_location(location)
        if self.replica:
            return ReadOnlyBlobStore(store, self.replica_refusal())
        return store

    def _open_location(self, location: StoreLocation) -> BlobStore:
        store = location.open(self.config.store_fsync)
        if location.scheme == "file":
            return store
        live = self._liveness.get(server_of(location))
        if live is None:
            live = self._liveness[server_of(location)] = StoreLiveness(describe(location),
                                                                        self.config.store_dead_after)
        return guarded(location, store, liveness=live)

    def _new_offloader(self, store: BlobStore, prefix: str, max_block_size: int, read_buffer: int) -> LedgerOffloader:
        """An offloader with this workspace's settings. Before its first write it claims the store (once)
        and names this workspace as the owner of what it writes; nothing is read or written before that
        (a command that fails on bad input changes nothing)."""
        c = self.config
        off: LedgerOffloader

        def before_write() -> None:
            self.refuse_bucket_writes("write an object")
            if not off.owner:
                # the owner marker is a plain object, also where objects are transformed
                self.claim(store.inner if isinstance(store, TransformedBlobStore) else store, prefix)
                off.owner = self.identity

        plain = store.inner if isinstance(store, TransformedBlobStore) else store
        # entry-offsets sidecars only where this workspace's marker already claims the store
        permit = SidecarPermission(plain, normalize_prefix(prefix), c.cluster, self.identity_if_any)
        off = LedgerOffloader(
            store, prefix, max_block_size=max_block_size, read_buffer=read_buffer, cluster=c.cluster,
            checkpoint_interval=c.checkpoint_interval, checksum_chunk=c.checksum_chunk, verify_reads=c.verify_reads,
            before_write=before_write, upload_concurrency=c.upload_concurrency, part_size=c.upload_part_size,
            sidecar_permit=permit,
        )
        return off

    def topic_offloader(
        self,
        clock_ms: Callable[[], int] = now_ms,
        progress: Callable[[str, int, int, int], None] | None = None,
        offloader: LedgerOffloader | None = None,
    ) -> TopicOffloader:
        return TopicOffloader(self.ml, self.hot, offloader or self.offloader, clock_ms=clock_ms, progress=progress,
                              deletion_log=self.deletion_log, leases=self.leases)

    def streaming_offloader(
        self,
        policy: OffloadPolicy,
        clock_ms: Callable[[], int] = now_ms,
        progress: Callable[[str, int, int, int], None] | None = None,
    ) -> StreamingOffloader:
        """PIP-76 streaming offload into the store a namespace policy names, with its streaming block
        size (segment size and rollover are arguments of each offload_topic call)."""
        segments = SegmentOffloader(self.offloader_for_policy(policy), block_size=policy.streaming_block_size)
        return StreamingOffloader(self.ml, self.hot, segments, clock_ms=clock_ms, deletion_log=self.deletion_log,
                                  leases=self.leases, progress=progress)

    @cached_property
    def chunk_cache(self) -> ChunkCache | None:
        """The cache of decoded chunks every transformed store of this workspace shares."""
        c = self.config
        return open_chunk_cache(c.chunk_cache, c.chunk_cache_size, ttl_s=c.chunk_cache_ttl_ms / 1000,
                                prefetch=c.chunk_cache_prefetch)

    def opened_chunk_cache(self) -> ChunkCache | None:
        """The chunk cache if something of this workspace opened it (a transformed store), else None
        (never opens one: a disk cache wipes its directory when it opens)."""
        return self.__dict__.get("chunk_cache")

    def key_ring(self, path: str = "") -> KeyRing:
        """The key ring at ``path`` (default: the configuration's), loaded once per workspace."""
        p = path or self.config.key_ring
        if not p:
            raise ValidationError("no key ring configured: set key_ring in the configuration "
                                  "(create one with `tiered keys new`)")
        ring = self._key_rings.get(p)
        if ring is None:
            ring = self._key_rings[p] = KeyRing.load(p)
        return ring

    def offloader_at(self, location: StoreLocation, max_block_size: int | None = None,
                     read_buffer: int | None = None, transform: TransformSpec | None = None,
                     key_ring: str = "") -> LedgerOffloader:
        """The (cached) offloader of a location, with the workspace's or the given block and buffer sizes.
        ``transform`` (active): objects written are chunked and transformed (key ring ``key_ring`` or the
        configuration's when it encrypts); a ``chunked`` location (from driver metadata) is read through
        manifests, with its recorded key ring (or the configuration's) when there is one."""
        active = transform if transform is not None and transform.active else None
        k = (location, max_block_size or self.config.max_block_size, read_buffer or self.config.read_buffer,
             active, key_ring)
        off = self._offloaders.get(k)
        if off is None:
            store = self.open_location(location)
            if active is not None or location.chunked:
                ring = None
                ring_path = key_ring or location.key_ring or self.config.key_ring
                if active is not None and active.encryption or ring_path and Path(ring_path).is_dir():
                    ring = self.key_ring(ring_path)
                store = TransformedBlobStore(store, active or TransformSpec("none"), ring, prefix=location.prefix,
                                             chunk_cache=self.chunk_cache)
            off = self._offloaders[k] = self._new_offloader(store, location.prefix, k[1], k[2])
        return off

    def offloader_for_policy(self, policy: OffloadPolicy) -> LedgerOffloader:
        """The offloader a namespace policy names (its own store, block and buffer sizes, transform)."""
        loc = policy.store.location() if policy.store is not None else self.config.store_location
        spec = policy.transform_spec
        return self.offloader_at(loc, policy.max_block_size, policy.read_buffer_size, spec,
                                 policy.key_ring if spec.encryption else "")

    def offloader_for_driver(self, driver_metadata: pb.OffloadDriverMetadata) -> LedgerOffloader:
        """The offloader that can read objects described by an OffloadContext's driver metadata
        (Pulsar records where each ledger went; readers follow it, not the current policy)."""
        if not driver_metadata.name:
            return self.offloader
        loc = StoreLocation.from_driver_metadata(driver_metadata)
        if loc.same_objects(self.config.store_location):
            # the workspace's own store: opened with the configured URL, whose client settings (timeouts,
            # retry budget) driver metadata does not record
            loc = replace(self.config.store_location, chunked=loc.chunked, key_ring=loc.key_ring,
                          transform=loc.transform)
        return self.offloader_at(loc)

    def reader(self, read_priority: str = TIERED_FIRST, *, skip_in_bookkeeper: bool = False) -> TopicReader:
        """A cross-tier reader; ``skip_in_bookkeeper`` (attached workspaces): ledgers only Pulsar's BookKeeper
        holds are skipped and listed (``TopicReader.in_bookkeeper``) instead of ending the read."""
        return TopicReader(self.ml, self.hot, self.offloader, read_priority,
                           offloader_for_driver=self.offloader_for_driver, skip_in_bookkeeper=skip_in_bookkeeper)

    def close(self) -> None:
        if "metadata" in self.__dict__:
            self.metadata.close()
        if "hot" in self.__dict__:
            self.hot.close()
        if self.__dict__.get("chunk_cache") is not None:
            self.chunk_cache.close()

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

