"""Opens the stores a Config names and wires the layers together (one place, used by every entry point)."""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from urllib.parse import quote

from tieredcore.clock import now_ms
from tieredcore.config import Config, open_blob_store
from tieredcore.errors import ValidationError
from tieredcore.offload.keys import normalize_prefix
from tieredcore.offload.managed import TopicOffloader
from tieredcore.offload.offloader import LedgerOffloader
from tieredcore.stores.blob import BlobStore
from tieredcore.stores.deletion_log import DeletionLog
from tieredcore.stores.failures import StoreFailureBudget
from tieredcore.stores.hot import LocalLedgerStore
from tieredcore.stores.leases import TopicLeases
from tieredcore.stores.managed_ledgers import ManagedLedgerStore
from tieredcore.stores.metadata import MetadataStore
from tieredcore.stores.ownership import claim_store, ensure_identity, read_identity
from tieredcore.topic.reader import TIERED_FIRST, TopicReader


class Workspace:
    def __init__(self, config: Config) -> None:
        self.config = config
        self._offloaders: dict[tuple[str, int, int], LedgerOffloader] = {}

    @cached_property
    def metadata(self) -> MetadataStore:
        return self.config.open_metadata()

    @cached_property
    def ml(self) -> ManagedLedgerStore:
        return ManagedLedgerStore(self.metadata)

    @cached_property
    def deletion_log(self) -> DeletionLog:
        """Pending-deletion records of two-phase deletion (spec/05), in the metadata store."""
        return DeletionLog(self.metadata)

    @cached_property
    def leases(self) -> TopicLeases:
        """Per-topic leases (one runner offloads or repairs a topic at a time)."""
        return TopicLeases(self.metadata, ttl_ms=self.config.lease_ttl_ms)

    def failure_budget(self) -> StoreFailureBudget:
        """A fresh budget of consecutive object-store failures for one run (or one Spark task)."""
        return StoreFailureBudget(self.config.store_failure_limit)

    @cached_property
    def hot(self) -> LocalLedgerStore:
        return self.config.open_hot()

    @cached_property
    def _store_and_prefix(self) -> tuple[BlobStore, str]:
        return self.config.open_store()

    @property
    def store(self) -> BlobStore:
        return self._store_and_prefix[0]

    @cached_property
    def offloader(self) -> LedgerOffloader:
        store, prefix = self._store_and_prefix
        return self._new_offloader(store, prefix, self.config.max_block_size, self.config.read_buffer)

    @cached_property
    def identity(self) -> str:
        """The metadata store's identity (created on first use): the owner named in store markers and
        object metadata (tieredcore.stores.ownership)."""
        return ensure_identity(self.metadata)

    def identity_if_any(self) -> str | None:
        """The identity if the metadata store has one already (never creates it: for dry runs)."""
        if "identity" in self.__dict__:
            return self.__dict__["identity"]
        return read_identity(self.metadata)

    def claim(self, store: BlobStore, prefix: str) -> None:
        """Claim (store, prefix) for this workspace's cluster, or StoreOwnershipError."""
        claim_store(store, normalize_prefix(prefix), self.config.cluster, self.identity, self.config.metadata_url)

    def _new_offloader(self, store: BlobStore, prefix: str, max_block_size: int, read_buffer: int) -> LedgerOffloader:
        """An offloader with this workspace's settings. Before its first write it claims the store (once)
        and names this workspace as the owner of what it writes; nothing is read or written before that
        (a command that fails on bad input changes nothing)."""
        c = self.config
        off: LedgerOffloader

        def before_write() -> None:
            if not off.owner:
                self.claim(store, prefix)
                off.owner = self.identity

        off = LedgerOffloader(
            store, prefix, max_block_size=max_block_size, read_buffer=read_buffer, cluster=c.cluster,
            checkpoint_interval=c.checkpoint_interval, checksum_chunk=c.checksum_chunk, verify_reads=c.verify_reads,
            before_write=before_write,
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

    def _offloader_for_url(self, url: str, max_block_size: int, read_buffer: int) -> LedgerOffloader:
        k = (url, max_block_size, read_buffer)
        off = self._offloaders.get(k)
        if off is None:
            store, prefix = open_blob_store(url, fsync=self.config.store_fsync)
            off = self._offloaders[k] = self._new_offloader(store, prefix, max_block_size, read_buffer)
        return off

    def offloader_for_policy(self, policy) -> LedgerOffloader:
        """The offloader a namespace policy names (its own store, block and buffer sizes)."""
        url = policy.store.url() if policy.store is not None else self.config.store_url
        return self._offloader_for_url(url, policy.max_block_size, policy.read_buffer_size)

    def offloader_for_driver(self, driver_metadata) -> LedgerOffloader:
        """The offloader that can read objects described by an OffloadContext's driver metadata
        (Pulsar records where each ledger went; readers follow it, not the current policy)."""
        name = driver_metadata.name
        props = {kv.key: kv.value for kv in driver_metadata.properties}
        if not name:
            return self.offloader
        if name == "filesystem" and "root" in props:
            url = f"file://{quote(props['root'])}" + (f"?prefix={quote(props['prefix'])}" if props.get("prefix") else "")
        elif name == "aws-s3" and "bucket" in props:
            q = "&".join(f"{a}={props[b]}" for a, b in (("endpoint", "serviceEndpoint"), ("region", "region"))
                         if props.get(b))
            url = f"s3://{props['bucket']}/{props.get('prefix', '')}" + (f"?{q}" if q else "")
        else:
            raise ValidationError(f"offloaded with driver {name!r} and properties {sorted(props)}: cannot open")
        # the workspace's own store: open it with the configured URL, whose timeouts and retry budget the
        # driver metadata does not record
        if _same_location(url, self.config.store_url):
            url = self.config.store_url
        return self._offloader_for_url(url, self.config.max_block_size, self.config.read_buffer)

    def reader(self, read_priority: str = TIERED_FIRST) -> TopicReader:
        return TopicReader(self.ml, self.hot, self.offloader, read_priority,
                           offloader_for_driver=self.offloader_for_driver)

    def close(self) -> None:
        if "metadata" in self.__dict__:
            self.metadata.close()
        if "hot" in self.__dict__:
            self.hot.close()

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _same_location(a: str, b: str) -> bool:
    """Two store URLs naming the same objects (scheme, bucket or root, endpoint, prefix)."""
    from tieredcore.config import parse_store_url

    try:
        x, y = parse_store_url(a), parse_store_url(b)
    except ValidationError:
        return False
    return (x.scheme, x.root, x.bucket, x.endpoint, normalize_prefix(x.prefix)) == \
        (y.scheme, y.root, y.bucket, y.endpoint, normalize_prefix(y.prefix))
