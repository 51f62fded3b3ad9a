"""Namespace (and topic) offload policies: fields, validation, storage, resolution.

Stored as partial JSON objects (only the fields that were set) at Pulsar's namespace-policies path and
a topic-policies path; the effective policy of a topic is defaults < namespace < topic. Validation runs
on the merged result at set time, so a bad combination is refused before anything is stored.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from tieredcore.cold.location import DRIVER_SCHEMES, StoreLocation, check_bucket_name, parse_store_url
from tieredcore.errors import ValidationError
from tieredcore.formats.constants import (
    DEFAULT_MAX_BLOCK_SIZE,
    DEFAULT_READ_BUFFER_SIZE,
    STREAMING_MIN_BLOCK_SIZE,
)
from tieredcore.formats.transform import DEFAULT_CHUNK_SIZE, DEFAULT_LEVEL, TransformSpec
from tieredcore.meta.managed_ledgers import ManagedLedgerStore
from tieredcore.names import NamespaceName, TopicName

# where a topic reader reads a ledger held by both tiers (Pulsar's managedLedgerDataReadPriority)
TIERED_FIRST = "tiered-storage-first"
HOT_FIRST = "bookkeeper-first"
READ_PRIORITIES = (TIERED_FIRST, HOT_FIRST)
S3_MIN_PART = 5 * 1024 * 1024
DEFAULT_DELETION_LAG_MS = 4 * 3600 * 1000  # Pulsar's broker default
# a policy's store: this project's local store ("filesystem": its name before it recorded "tiered-local"), or
# Pulsar's blob-store drivers (tieredcore.cold.drivers)
DRIVERS = ("tiered-local", "filesystem", "aws-s3", "azureblob", "google-cloud-storage")
MODE_LEDGER = "ledger"  # one V1 object pair per sealed ledger (Pulsar's offloader)
MODE_STREAMING = "streaming"  # PIP-76: multi-ledger V2 segments cut by size or time, open ledger included
OFFLOAD_MODES = (MODE_LEDGER, MODE_STREAMING)
DEFAULT_MAX_SEGMENT_SIZE = 256 * 1024 * 1024
DEFAULT_MAX_SEGMENT_ROLLOVER_MS = 10 * 60 * 1000
# compaction (docs/compaction.md): runs of objects below the min size repacked into segments of the target size
DEFAULT_COMPACTION_MIN_OBJECT_SIZE = 8 * 1024 * 1024
DEFAULT_COMPACTION_TARGET_SIZE = 256 * 1024 * 1024
DEFAULT_COMPACTION_DELETE_DELAY_MS = 3600 * 1000


@dataclass(frozen=True)
class StoreSpec:
    """Where a namespace's ledgers are offloaded. None fields fall back to the workspace's store."""

    driver: str
    bucket: str = ""  # aws-s3, google-cloud-storage; azureblob: the container
    root: str = ""  # tiered-local (filesystem): absolute directory
    prefix: str = ""
    endpoint: str = ""  # S3-compatible endpoint (MinIO, Ceph, moto); Azure blob endpoint; GCS emulator
    region: str = ""  # aws-s3 only

    def validate(self, where: str) -> None:
        if self.driver not in DRIVERS:
            raise ValidationError(f"{where}: unknown offload driver {self.driver!r} (known: {', '.join(DRIVERS)})")
        if self.driver == "aws-s3":
            check_bucket_name(self.bucket, where)
        elif self.driver in ("azureblob", "google-cloud-storage"):
            if not self.bucket:
                raise ValidationError(f"{where}: the {self.driver} store needs a bucket (Azure: container) name")
            if self.region:
                raise ValidationError(f"{where}: region applies to aws-s3 stores only")
        elif not self.root.startswith("/"):
            raise ValidationError(f"{where}: a {self.driver} store needs an absolute root directory, got {self.root!r}")
        if self.prefix.startswith("/") or ".." in self.prefix.split("/"):
            raise ValidationError(f"{where}: key prefix {self.prefix!r} must be relative without '..'")
        parse_store_url(self.url(), f"{where}: store")  # endpoint, region: as strict as a configured store

    def location(self) -> StoreLocation:
        return StoreLocation(scheme=DRIVER_SCHEMES[self.driver], prefix=self.prefix, root=self.root,
                             bucket=self.bucket, endpoint=self.endpoint or None, region=self.region or None)

    def url(self) -> str:
        return self.location().url()


@dataclass(frozen=True)
class OffloadPolicy:
    # Pulsar: offload_threshold / offload_threshold_in_seconds; -1 disables
    offload_threshold_bytes: int = -1
    offload_threshold_seconds: int = -1
    # Pulsar: offload_deletion_lag_ms; -1 keeps hot copies forever
    deletion_lag_ms: int = DEFAULT_DELETION_LAG_MS
    # Pulsar: retention_time_in_minutes / retention_size_in_mb; -1 = unlimited
    retention_time_minutes: int = -1
    retention_size_mb: int = -1
    read_priority: str = TIERED_FIRST
    store: StoreSpec | None = None  # None: the workspace's configured object store
    max_block_size: int = DEFAULT_MAX_BLOCK_SIZE
    read_buffer_size: int = DEFAULT_READ_BUFFER_SIZE
    # PIP-76 streaming offload (docs/formats.md "Streaming segments")
    offload_mode: str = MODE_LEDGER
    max_segment_size: int = DEFAULT_MAX_SEGMENT_SIZE  # a segment is cut at this many data-object bytes
    max_segment_rollover_ms: int = DEFAULT_MAX_SEGMENT_ROLLOVER_MS  # a smaller tail is closed this long after its oldest entry
    streaming_block_size: int = STREAMING_MIN_BLOCK_SIZE  # blocks are padded to this (Pulsar: every block a part)
    # compaction: off unless enabled per namespace (or topic); old objects deleted after the delay
    compaction_enabled: bool = False
    compaction_min_object_size: int = DEFAULT_COMPACTION_MIN_OBJECT_SIZE
    compaction_target_size: int = DEFAULT_COMPACTION_TARGET_SIZE
    compaction_delete_delay_ms: int = DEFAULT_COMPACTION_DELETE_DELAY_MS
    # topic compaction (docs/topic-compaction.md, NOT the repacking above): Pulsar's namespace policy
    # compaction-threshold, bytes of a topic's backlog after its compaction horizon that trigger an automatic
    # compaction; -1 = off (Pulsar's 0/unset disables it; -1 here, as offload_threshold_bytes), 0 = any backlog
    topic_compaction_threshold_bytes: int = -1
    # chunked objects (docs/formats.md "Chunked objects"): none | zstd | aes | zstd+aes, per-chunk
    transform: str = "none"
    transform_chunk_size: int = DEFAULT_CHUNK_SIZE
    compression_level: int = DEFAULT_LEVEL
    key_ring: str = ""  # key-encryption keys for aes: a directory ('' = the configuration's key_ring)

    @property
    def transform_spec(self) -> TransformSpec:
        return TransformSpec(self.transform, self.transform_chunk_size, self.compression_level)

    @property
    def streaming(self) -> bool:
        return self.offload_mode == MODE_STREAMING

    @property
    def offload_enabled(self) -> bool:
        """The offload sweep offloads this namespace's (or topic's) data: streaming mode always (PIP-76:
        its segments are cut by size and rollover time, the thresholds do not apply), ledger mode when a
        threshold is set."""
        return self.streaming or self.offload_threshold_bytes >= 0 or self.offload_threshold_seconds >= 0

    @property
    def topic_compaction_enabled(self) -> bool:
        """Automatic topic compaction (the tiered_topic_compaction DAG) plans this namespace's topics."""
        return self.topic_compaction_threshold_bytes >= 0

    @property
    def deletion_lag(self) -> int | None:
        return None if self.deletion_lag_ms < 0 else self.deletion_lag_ms

    def validate(self, where: str = "policy", default_store_is_s3: bool = False,
                 default_key_ring: str = "") -> OffloadPolicy:
        for f in ("offload_threshold_bytes", "offload_threshold_seconds", "deletion_lag_ms",
                  "retention_time_minutes", "retention_size_mb", "topic_compaction_threshold_bytes"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < -1:
                raise ValidationError(f"{where}: {f} must be an integer >= -1, got {v!r}")
        rb = self.retention_size_mb * 1024 * 1024 if self.retention_size_mb >= 0 else -1
        if self.offload_threshold_bytes >= 0 and rb >= 0 and self.offload_threshold_bytes >= rb:
            raise ValidationError(
                f"{where}: offload threshold {self.offload_threshold_bytes} bytes must be below the retention "
                f"size {rb} bytes ({self.retention_size_mb} MB), or data is deleted before it is offloaded"
            )
        rs = self.retention_time_minutes * 60 if self.retention_time_minutes >= 0 else -1
        if self.offload_threshold_seconds >= 0 and rs >= 0 and self.offload_threshold_seconds >= rs:
            raise ValidationError(
                f"{where}: offload threshold {self.offload_threshold_seconds} s must be below the retention "
                f"time {rs} s ({self.retention_time_minutes} min), or data is deleted before it is offloaded"
            )
        if self.read_priority not in READ_PRIORITIES:
            raise ValidationError(
                f"{where}: read priority {self.read_priority!r} is not one of {', '.join(READ_PRIORITIES)}"
            )
        if self.store is not None:
            self.store.validate(where)
        s3 = self.store.driver == "aws-s3" if self.store is not None else default_store_is_s3
        min_block = S3_MIN_PART if s3 else 1024
        if not isinstance(self.max_block_size, int) or self.max_block_size < min_block:
            raise ValidationError(
                f"{where}: max block size {self.max_block_size} is below the minimum {min_block}"
                + (" (S3 parts must be at least 5 MiB)" if s3 else "")
            )
        if not isinstance(self.read_buffer_size, int) or self.read_buffer_size <= 0:
            raise ValidationError(f"{where}: read buffer size must be positive, got {self.read_buffer_size!r}")
        if self.offload_mode not in OFFLOAD_MODES:
            raise ValidationError(f"{where}: offload mode {self.offload_mode!r} is not one of {', '.join(OFFLOAD_MODES)}")
        if isinstance(self.streaming_block_size, bool) or not isinstance(self.streaming_block_size, int) \
                or self.streaming_block_size < min_block:
            raise ValidationError(
                f"{where}: streaming block size {self.streaming_block_size!r} is below the minimum {min_block}"
                + (" (S3 parts must be at least 5 MiB)" if s3 else "")
            )
        if isinstance(self.max_segment_size, bool) or not isinstance(self.max_segment_size, int) \
                or self.max_segment_size < self.streaming_block_size:
            raise ValidationError(
                f"{where}: max segment size {self.max_segment_size!r} must be at least the streaming block size "
                f"{self.streaming_block_size}"
            )
        if isinstance(self.max_segment_rollover_ms, bool) or not isinstance(self.max_segment_rollover_ms, int) \
                or self.max_segment_rollover_ms < 0:
            raise ValidationError(
                f"{where}: max segment rollover must be a non-negative duration, got {self.max_segment_rollover_ms!r}"
            )
        self.validate_compaction(where)
        try:
            spec = self.transform_spec
        except ValidationError as e:
            raise ValidationError(f"{where}: {e}") from None
        if self.key_ring and not str(self.key_ring).startswith("/"):
            raise ValidationError(f"{where}: key ring {self.key_ring!r} must be an absolute directory")
        if spec.encryption and not (self.key_ring or default_key_ring):
            raise ValidationError(f"{where}: transform {self.transform} encrypts and needs a key ring: set key_ring "
                                  "in the configuration (or the policy's key ring)")
        return self

    def validate_compaction(self, where: str = "policy") -> None:
        if not isinstance(self.compaction_enabled, bool):
            raise ValidationError(f"{where}: compaction must be true or false, got {self.compaction_enabled!r}")
        for f in ("compaction_min_object_size", "compaction_target_size", "compaction_delete_delay_ms"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < (0 if f.endswith("_ms") else 1):
                raise ValidationError(f"{where}: {f} must be a {'non-negative' if f.endswith('_ms') else 'positive'} "
                                      f"integer, got {v!r}")
        if self.compaction_min_object_size > self.compaction_target_size:
            raise ValidationError(
                f"{where}: compaction min object size {self.compaction_min_object_size} exceeds the target size "
                f"{self.compaction_target_size} (objects would be rewritten into objects no larger)")

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        if self.store is None:
            d["store"] = None
        return d


_FIELDS = {f.name for f in fields(OffloadPolicy)}
_STORE_FIELDS = {f.name for f in fields(StoreSpec)}


def _check_overrides(overrides: dict[str, Any], where: str) -> dict[str, Any]:
    unknown = set(overrides) - _FIELDS
    if unknown:
        raise ValidationError(f"{where}: unknown policy field(s) {', '.join(sorted(unknown))} "
                              f"(known: {', '.join(sorted(_FIELDS))})")
    store = overrides.get("store")
    if store is not None:
        if not isinstance(store, dict):
            raise ValidationError(f"{where}: store must be an object with driver, bucket/root, prefix...")
        bad = set(store) - _STORE_FIELDS
        if bad or "driver" not in store:
            raise ValidationError(f"{where}: store needs 'driver' and only {', '.join(sorted(_STORE_FIELDS))}")
    return overrides


def merge(base: OffloadPolicy, overrides: dict[str, Any] | None, where: str) -> OffloadPolicy:
    if not overrides:
        return base
    overrides = _check_overrides(dict(overrides), where)
    if "store" in overrides and overrides["store"] is not None:
        overrides["store"] = StoreSpec(**overrides["store"])
    return replace(base, **overrides)


@dataclass
class PolicyStore:
    """Policies in the metadata store; every set validates the merged effective policy first."""

    ml: ManagedLedgerStore
    defaults: OffloadPolicy = field(default_factory=OffloadPolicy)
    default_store_is_s3: bool = False
    default_key_ring: str = ""  # the configuration's key ring

    @property
    def brokers(self) -> str | None:
        """The Pulsar cluster whose brokers offload, clean up after the deletion lag and apply retention for
        these namespaces (an attached workspace: tieredcore.pulsar_policies), or None: this project does."""
        return None

    def namespace_overrides(self, namespace: str) -> dict[str, Any]:
        return self.ml.get_policies(namespace) or {}

    def topic_overrides(self, topic: str | TopicName) -> dict[str, Any]:
        return self.ml.get_topic_policies(topic) or {}

    def for_namespace(self, namespace: str) -> OffloadPolicy:
        ns = NamespaceName.parse(namespace).name
        return merge(self.defaults, self.namespace_overrides(ns), f"namespace {ns}")

    def for_topic(self, topic: str | TopicName) -> OffloadPolicy:
        t = TopicName.parse(topic)
        return merge(self.for_namespace(t.namespace_name), self.topic_overrides(t), f"topic {t.full}")

    def set_namespace(self, namespace: str, updates: dict[str, Any], replace_all: bool = False) -> OffloadPolicy:
        ns = NamespaceName.parse(namespace).name
        where = f"namespace {ns}"
        new = dict(updates) if replace_all else {**self.namespace_overrides(ns), **updates}
        new = {k: v for k, v in _check_overrides(new, where).items() if v is not None or k == "store"}
        effective = merge(self.defaults, new, where).validate(where, self.default_store_is_s3,
                                                                     self.default_key_ring)
        self.ml.set_policies(ns, new)
        return effective

    def set_topic(self, topic: str | TopicName, updates: dict[str, Any], replace_all: bool = False) -> OffloadPolicy:
        t = TopicName.parse(topic)
        where = f"topic {t.full}"
        new = dict(updates) if replace_all else {**self.topic_overrides(t), **updates}
        _check_overrides(new, where)
        effective = merge(self.for_namespace(t.namespace_name), new, where).validate(
            where, self.default_store_is_s3, self.default_key_ring)
        self.ml.set_topic_policies(t, new)
        return effective

    def namespaces_with_compaction(self) -> list[str]:
        """Namespaces whose effective policy enables compaction, or with a topic that enables it."""
        return self._namespaces_where(lambda p: p.compaction_enabled)

    def namespaces_with_topic_compaction(self) -> list[str]:
        """Namespaces whose effective policy sets a topic compaction threshold, or with a topic that does."""
        return self._namespaces_where(lambda p: p.topic_compaction_enabled)

    def namespaces_with_offload(self) -> list[str]:
        """Namespaces whose effective policy enables automatic offload, plus namespaces whose topics
        override it on (their topics are swept too)."""
        return self._namespaces_where(lambda p: p.offload_enabled)

    def _namespaces_where(self, enabled: Callable[[OffloadPolicy], bool]) -> list[str]:
        namespaces = set(self.ml.list_namespaces()) | set(self.ml.list_policy_namespaces())
        return sorted(ns for ns in namespaces if enabled(self.for_namespace(ns))
                      or any(enabled(self.for_topic(t)) for t in self.ml.list_topic_policy_topics(ns)))
