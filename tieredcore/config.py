"""One configuration object for every entry point (CLI, Spark jobs, DAGs).

Loaded from a TOML file (``tiered.toml``) and overridden by environment variables. Stores are named by
URL-like strings:

    metadata  sqlite:///abs/path/meta.db
              zk://host:port[,host:port]/root[?chroot=/path]   (ZooKeeper, Pulsar's layout: docs/metadata.md)
              zk://host:port/root?chroot=/pulsar&attached=true (a Pulsar cluster's ZooKeeper, read-only:
                                                                docs/pulsar.md; with hot = bookkeeper:)
    hot       file:///abs/path/hot
              bookkeeper:                      (attached: the cluster's BookKeeper, never read or written)
    store     file:///abs/path/cold            (filesystem object store)
              s3://bucket/prefix?endpoint=http://127.0.0.1:9000&region=us-east-1
              azure://container/prefix                 (Azure Blob; credentials: AZURE_STORAGE_*)
              gs://bucket/prefix                       (GCS; credentials: Application Default Credentials)

Store URLs are checked (tieredcore.cold.location.parse_store_url) when a Config is built, so every
entry point refuses a bad one before anything is created.
"""

from __future__ import annotations

import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote, urlparse

from tieredcore.cold.liveness import DEFAULT_STORE_DEAD_AFTER, guarded
from tieredcore.cold.location import StoreLocation, parse_store_url
from tieredcore.errors import ValidationError
from tieredcore.formats.constants import (
    DEFAULT_CHECKPOINT_INTERVAL,
    DEFAULT_CHECKSUM_CHUNK,
    DEFAULT_MAX_BLOCK_SIZE,
    DEFAULT_READ_BUFFER_SIZE,
    DEFAULT_UPLOAD_CONCURRENCY,
    DEFAULT_UPLOAD_PART_SIZE,
    MIN_UPLOAD_PART_SIZE,
)
from tieredcore.hot.bookkeeper import BOOKKEEPER_URL
from tieredcore.names import check_cluster_name

if TYPE_CHECKING:
    from tieredcore.cold.blob import BlobStore
    from tieredcore.hot.tier import HotTier
    from tieredcore.meta.store import MetadataStore

CONFIG_FILE_NAME = "tiered.toml"
ENV_CONFIG = "TIERED_CONFIG"
DEFAULT_SPARK_SHARDS = 2  # the `spark` pool's slots as scripts/airflow-init.sh and docker-compose create it
MAX_SPARK_SHARDS = 1024  # more Spark applications than this per run is a configuration mistake


def check_spark_shards(value: object, what: str = "spark_shards") -> int:
    """A number of shards (Spark applications per run): an integer 1..MAX_SPARK_SHARDS, else a clear error."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(f"{what} must be a whole number of Spark applications (1..{MAX_SPARK_SHARDS}), "
                              f"got {value!r}")
    if not 1 <= value <= MAX_SPARK_SHARDS:
        raise ValidationError(f"{what} must be 1..{MAX_SPARK_SHARDS} Spark applications per run, got {value}")
    return value
# environment variable -> Config field
ENV_OVERRIDES = {
    "TIERED_METADATA_URL": "metadata_url",
    "TIERED_HOT_URL": "hot_url",
    "TIERED_STORE_URL": "store_url",
    "TIERED_CLUSTER": "cluster",
    "TIERED_REPORTS_DIR": "reports_dir",
    "TIERED_SPARK_MASTER": "spark_master",
    "TIERED_SPARK_SHARDS": "spark_shards",
    "TIERED_MAX_BLOCK_SIZE": "max_block_size",
    "TIERED_READ_BUFFER": "read_buffer",
    "TIERED_CHECKPOINT_INTERVAL": "checkpoint_interval",
    "TIERED_CHECKSUM_CHUNK": "checksum_chunk",
    "TIERED_VERIFY_READS": "verify_reads",
    "TIERED_STORE_FAILURE_LIMIT": "store_failure_limit",
    "TIERED_STORE_DEAD_AFTER": "store_dead_after",
    "TIERED_LEASE_TTL_MS": "lease_ttl_ms",
    "TIERED_KEY_RING": "key_ring",
    "TIERED_CHUNK_CACHE": "chunk_cache",
    "TIERED_CHUNK_CACHE_SIZE": "chunk_cache_size",
    "TIERED_CHUNK_CACHE_PREFETCH": "chunk_cache_prefetch",
    "TIERED_CHUNK_CACHE_TTL_MS": "chunk_cache_ttl_ms",
    "TIERED_UPLOAD_CONCURRENCY": "upload_concurrency",
    "TIERED_UPLOAD_PART_SIZE": "upload_part_size",
    "TIERED_PRICE_STORAGE_GB_MONTH": "price_storage_gb_month",
    "TIERED_PRICE_GET_1000": "price_get_per_1000",
    "TIERED_PRICE_PUT_1000": "price_put_per_1000",
    "TIERED_PRICE_LIST_1000": "price_list_per_1000",
    "TIERED_PRICE_DELETE_1000": "price_delete_per_1000",
    "TIERED_BROKERS_DEFAULT": "brokers_default",
    "TIERED_MANIFESTS_KEEP": "manifests_keep",
    "TIERED_REPLICA_OF": "replica_of",
    "TIERED_EXPORT_CATALOG_URL": "export_catalog_url",
    "TIERED_EXPORT_WAREHOUSE": "export_warehouse",
}
PRICE_FIELDS = ("price_storage_gb_month", "price_get_per_1000", "price_put_per_1000", "price_list_per_1000",
                "price_delete_per_1000")


@dataclass(frozen=True)
class Config:
    metadata_url: str
    hot_url: str
    store_url: str
    cluster: str = "standalone"
    reports_dir: str = ""
    spark_master: str = "local[*]"
    # at most this many Spark applications (shards) per run of a per-namespace DAG (offload sweep,
    # compaction): namespaces with work are spread over them by bytes (tieredcore.lifecycle.shards);
    # default 2, the slots of the `spark` pool scripts/airflow-init.sh and docker-compose create
    spark_shards: int = DEFAULT_SPARK_SHARDS
    max_block_size: int = DEFAULT_MAX_BLOCK_SIZE
    read_buffer: int = DEFAULT_READ_BUFFER_SIZE
    # exact entry offsets every N data bytes in the index trailer (docs/formats.md); 0 writes an index
    # with nothing after Pulsar's fields
    checkpoint_interval: int = DEFAULT_CHECKPOINT_INTERVAL
    # a CRC32C per chunk of every data object and one over the index, in the index trailer
    # (docs/formats.md); 0 writes none (objects then verify only by structure, like Pulsar's)
    checksum_chunk: int = DEFAULT_CHECKSUM_CHUNK
    # reads check every chunk they fetch against its checksum (off only to measure the cost)
    verify_reads: bool = True
    # a run stops after this many consecutive object-store failures (the rest: "aborted"); 0 never stops
    store_failure_limit: int = 5
    # an object store whose requests have failed without any answer (timeouts, refused or reset connections)
    # for this many seconds in a row is dead for the rest of the run: every later request fails at once
    # (tieredcore.cold.liveness); 0 never declares it dead
    store_dead_after: float = DEFAULT_STORE_DEAD_AFTER
    # how long a runner's per-topic lease lasts without renewal (a crashed holder's lease then expires)
    lease_ttl_ms: int = 15 * 60 * 1000
    # fsync of cold-tier objects before they become visible (off only for throwaway benchmarks)
    store_fsync: bool = True
    hot_fsync: bool = False
    # directory of RSA key-encryption keys (PEM) for namespaces whose transform encrypts (docs/formats.md
    # "Chunked objects"); '' = none configured
    key_ring: str = ""
    # decoded chunks of transformed objects: none | memory | disk:/abs/dir (plaintext on disk!), bounded
    # by bytes, entries expire this long after their last access; prefetch: bytes read ahead per access
    chunk_cache: str = "memory"
    chunk_cache_size: int = 256 * 1024 * 1024
    chunk_cache_prefetch: int = 8 * 1024 * 1024
    chunk_cache_ttl_ms: int = 10 * 60 * 1000
    # offloads to a remote store (S3) cut blocks into parts of about upload_part_size bytes and send
    # upload_concurrency of them at once (1: one part per block, one at a time)
    upload_concurrency: int = DEFAULT_UPLOAD_CONCURRENCY
    upload_part_size: int = DEFAULT_UPLOAD_PART_SIZE
    # object-store prices (USD) for the cost estimate of the "Tiered storage" view: storage per GiB-month,
    # requests per 1,000 (defaults: S3 Standard, us-east-1 list prices; HEAD is billed as a GET)
    price_storage_gb_month: float = 0.023
    price_get_per_1000: float = 0.0004
    price_put_per_1000: float = 0.005
    price_list_per_1000: float = 0.005
    price_delete_per_1000: float = 0.0
    # attached to a Pulsar cluster: the operator stated that store_url is its brokers' default offload bucket
    # (broker.conf, which ZooKeeper does not hold): namespaces whose policies name no bucket offload there
    brokers_default: bool = False
    # the Iceberg export's catalog (an SQLAlchemy URL: sqlite:///..., postgresql+psycopg2://...) and warehouse
    # (file://... or an object store URL pyiceberg can write); empty: SQLite and a warehouse directory in the
    # workspace, <workspace>/iceberg/ (tieredcore.lifecycle.export, docs/export.md)
    export_catalog_url: str = ""
    export_warehouse: str = ""
    # topic manifests (docs/recovery.md): the newest this many per topic stay in the store, older ones go
    # through the deletion log
    manifests_keep: int = 3
    # a read replica (docs/recovery.md "Read replicas"): the store URL of another cluster's bucket whose topic
    # manifests (of cluster ``cluster``) `tiered replica-sync` follows; store_url is the same URL. Every write
    # is refused: to that bucket, and to the metadata store except by the sync
    replica_of: str = ""

    def __post_init__(self) -> None:
        for name in ("metadata_url", "hot_url", "store_url"):
            if not getattr(self, name):
                raise ValidationError(f"configuration: {name} is empty")
        check_metadata_url(self.metadata_url)
        check_cluster_name(self.cluster, "configuration: cluster")
        if self.attached != (self.hot_url == BOOKKEEPER_URL):
            raise ValidationError(
                f"configuration: hot_url {BOOKKEEPER_URL!r} (Pulsar's BookKeeper) goes with a metadata_url attached "
                f"to a Pulsar cluster (zk://...?attached=true) and only with one; got hot_url {self.hot_url!r}, "
                f"metadata_url {self.metadata_url!r}")
        if self.brokers_default and not self.attached:
            raise ValidationError("configuration: brokers_default applies to a workspace attached to a Pulsar cluster")
        store = parse_store_url(self.store_url)  # a bad URL fails here, before anything is created
        if self.replica_of:
            if self.attached:
                raise ValidationError("configuration: replica_of (a read replica) and an attached metadata_url "
                                      "(a Pulsar cluster's ZooKeeper) exclude each other")
            if not parse_store_url(self.replica_of, "replica_of").same_objects(store):
                raise ValidationError(f"configuration: a read replica reads the bucket it follows: store_url "
                                      f"{self.store_url!r} must be replica_of {self.replica_of!r}")
        if self.max_block_size < 5 * 1024 * 1024 and store.scheme == "s3":
            raise ValidationError(
                f"configuration: max_block_size {self.max_block_size} is below S3's 5 MiB minimum part size"
            )
        check_spark_shards(self.spark_shards, "configuration: spark_shards")
        if self.read_buffer <= 0:
            raise ValidationError("configuration: read_buffer must be positive")
        if not 1 <= self.upload_concurrency <= 64:
            raise ValidationError(f"configuration: upload_concurrency must be 1..64, got {self.upload_concurrency}")
        if self.upload_part_size < MIN_UPLOAD_PART_SIZE:
            raise ValidationError(
                f"configuration: upload_part_size {self.upload_part_size} is below S3's 5 MiB minimum part size"
            )
        if self.checkpoint_interval < 0:
            raise ValidationError("configuration: checkpoint_interval must be >= 0 (0: none)")
        if self.store_failure_limit < 0:
            raise ValidationError("configuration: store_failure_limit must be >= 0 (0: never stop)")
        if not (math.isfinite(self.store_dead_after) and 0 <= self.store_dead_after <= 3600):
            raise ValidationError(f"configuration: store_dead_after must be 0 (never) to 3600 seconds, "
                                  f"got {self.store_dead_after!r}")
        if isinstance(self.manifests_keep, bool) or not isinstance(self.manifests_keep, int) \
                or self.manifests_keep < 1:
            raise ValidationError(f"configuration: manifests_keep must be >= 1, got {self.manifests_keep!r}")
        if self.lease_ttl_ms <= 0:
            raise ValidationError("configuration: lease_ttl_ms must be positive")
        if self.checksum_chunk < 0 or 0 < self.checksum_chunk < 512:
            raise ValidationError("configuration: checksum_chunk must be 0 (none) or at least 512 bytes")
        if self.chunk_cache not in ("none", "memory") and not self.chunk_cache.startswith("disk:/"):
            raise ValidationError(f"configuration: chunk_cache {self.chunk_cache!r}: none, memory or disk:/abs/dir")
        if self.chunk_cache_size <= 0 or self.chunk_cache_prefetch < 0 or self.chunk_cache_ttl_ms <= 0:
            raise ValidationError("configuration: chunk_cache_size and chunk_cache_ttl_ms must be positive, "
                                  "chunk_cache_prefetch non-negative")
        for name in PRICE_FIELDS:
            v = getattr(self, name)
            if not math.isfinite(v) or v < 0:
                raise ValidationError(f"configuration: {name} must be a non-negative number of USD, got {v!r}")
        if self.key_ring and not self.key_ring.startswith("/"):
            raise ValidationError(f"configuration: key_ring {self.key_ring!r} must be an absolute directory")

    # -- loading ------------------------------------------------------------------------------

    @classmethod
    def for_workspace(cls, root: str | Path, **overrides: Any) -> Config:
        """Embedded defaults: everything under one directory, no services."""
        root = Path(root).resolve()
        # percent-encoded: a directory name with '%', '#', '?' or spaces must survive urlparse/unquote
        base = cls(
            metadata_url=f"sqlite:///{quote(str(root / 'metadata.db'))}",
            hot_url=f"file://{quote(str(root / 'hot'))}",
            store_url=f"file://{quote(str(root / 'cold'))}",
            reports_dir=str(root / "reports"),
        )
        return replace(base, **overrides)

    @classmethod
    def load(cls, path: str | Path | None = None, env: Mapping[str, str] | None = None) -> Config:
        """From `path`, else $TIERED_CONFIG, else ./tiered.toml; environment variables win."""
        env = os.environ if env is None else env
        if path is None:
            path = env.get(ENV_CONFIG) or (CONFIG_FILE_NAME if Path(CONFIG_FILE_NAME).exists() else None)
        values: dict[str, Any] = {}
        if path is not None:
            p = Path(path)
            if not p.is_file():
                raise ValidationError(f"configuration file {p} does not exist (run `tiered init` first?)")
            try:
                raw = tomllib.loads(p.read_text(encoding="utf-8"))
            except UnicodeDecodeError as e:  # TOML is UTF-8: a binary or Latin-1 file is not a configuration
                raise ValidationError(
                    f"configuration file {p}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start})"
                ) from None
            except tomllib.TOMLDecodeError as e:
                raise ValidationError(f"configuration file {p}: {e}") from e
            values.update(_flatten(raw, p))
        for var, name in ENV_OVERRIDES.items():
            if env.get(var):
                values[name] = env[var]
        missing = [n for n in ("metadata_url", "hot_url", "store_url") if n not in values]
        if missing:
            raise ValidationError(
                f"configuration incomplete: {', '.join(missing)} not set (config file or "
                f"{', '.join(k for k, v in ENV_OVERRIDES.items() if v in missing)})"
            )
        return cls(**_coerce(values))

    def to_toml(self) -> str:
        lines = ["# tiered storage configuration (see README: Configuration)"]
        for k, v in asdict(self).items():
            if isinstance(v, bool):
                lines.append(f"{k} = {'true' if v else 'false'}")
            elif isinstance(v, int | float):
                lines.append(f"{k} = {v}")
            else:
                lines.append(f'{k} = "{_toml_escape(str(v))}"')
        return "\n".join(lines) + "\n"

    # -- opening stores -----------------------------------------------------------------------

    def open_metadata(self) -> MetadataStore:
        return open_metadata_store(self.metadata_url)

    def open_hot(self) -> HotTier:
        """The local ledger store, or (attached) the BookKeeper stand-in that holds nothing."""
        if self.hot_url == BOOKKEEPER_URL:
            from tieredcore.hot.bookkeeper import BookKeeperTier

            return BookKeeperTier()
        from tieredcore.hot.local import LocalLedgerStore

        return LocalLedgerStore(_file_path(self.hot_url, "hot_url"), fsync=self.hot_fsync)

    @property
    def attached(self) -> bool:
        """Is this workspace attached to a Pulsar cluster (its ZooKeeper read-only, its BookKeeper not ours)?"""
        return is_attached_url(self.metadata_url)

    @property
    def replica(self) -> bool:
        """Is this workspace a read replica of another cluster's bucket (``replica_of``)?"""
        return bool(self.replica_of)

    def open_store(self) -> tuple[BlobStore, str]:
        """The object store (watched for answers: tieredcore.cold.liveness) and the key prefix offloaded
        objects go under."""
        loc = self.store_location
        return guarded(loc, loc.open(self.store_fsync), self.store_dead_after), loc.prefix

    @property
    def store_location(self) -> StoreLocation:
        return parse_store_url(self.store_url)


def _toml_escape(s: str) -> str:
    """Body of a TOML basic string: backslash, quote and control characters escaped."""
    out = []
    for ch in s:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    return "".join(out)


def _flatten(raw: dict[str, Any], path: Path) -> dict[str, Any]:
    known = {f.name for f in fields(Config)}
    out: dict[str, Any] = {}
    for k, v in raw.items():
        if k not in known:
            raise ValidationError(f"configuration file {path}: unknown key {k!r} (known: {', '.join(sorted(known))})")
        out[k] = v
    return out


def _coerce(values: dict[str, Any]) -> dict[str, Any]:
    out = dict(values)
    for f in fields(Config):
        if f.name not in out:
            continue
        v = out[f.name]
        if f.type in ("int", int) and isinstance(v, str):
            try:
                out[f.name] = int(v)
            except ValueError as e:
                raise ValidationError(f"configuration: {f.name} must be an integer, got {v!r}") from e
        elif f.type in ("bool", bool) and isinstance(v, str):
            out[f.name] = v.strip().lower() in ("1", "true", "yes", "on")
        elif f.type in ("float", float) and isinstance(v, str | int) and not isinstance(v, bool):
            try:
                out[f.name] = float(v)
            except ValueError as e:
                raise ValidationError(f"configuration: {f.name} must be a number, got {v!r}") from e
        v = out[f.name]
        want = {"str": str, "int": int, "bool": bool, "float": float}.get(f.type if isinstance(f.type, str) else f.type.__name__)
        if want is not None and (not isinstance(v, want) or (want is int and isinstance(v, bool))):
            raise ValidationError(f"configuration: {f.name} must be {f.type}, got {type(v).__name__} {v!r}")
    return out


def _file_path(url: str, what: str) -> Path:
    u = urlparse(url)
    if u.scheme == "file":
        if u.netloc not in ("", "localhost") or not u.path.startswith("/") or u.query or u.fragment:
            raise ValidationError(f"{what}: expected file:///absolute/path, got {url!r}")
        return Path(unquote(u.path))
    if u.scheme == "" and url:
        return Path(url)
    raise ValidationError(f"{what}: expected file:///path, got {url!r}")


def check_metadata_url(url: str) -> None:
    """ValidationError for a metadata URL that cannot name a store (nothing is opened)."""
    u = urlparse(url)
    if u.scheme == "sqlite":
        if not unquote(u.path) or u.netloc:
            raise ValidationError(f"metadata_url: expected sqlite:///absolute/path.db, got {url!r}")
    elif u.scheme == "zk":
        from tieredcore.meta.zookeeper import ZkLocation

        ZkLocation.parse(url)
    else:
        raise ValidationError(
            f"metadata_url: unsupported scheme {u.scheme!r} in {url!r} (supported: sqlite:///path, zk://host:port/root)"
        )


def is_attached_url(url: str) -> bool:
    """Does a (valid) metadata URL name a Pulsar cluster's ZooKeeper, attached read-only?"""
    if urlparse(url).scheme != "zk":
        return False
    from tieredcore.meta.zookeeper import ZkLocation

    return ZkLocation.parse(url).attached


def open_metadata_store(url: str) -> MetadataStore:
    u = urlparse(url)
    if u.scheme == "sqlite":
        from tieredcore.meta.sqlite import SqliteMetadataStore

        return SqliteMetadataStore(unquote(u.path))
    if u.scheme == "zk":
        from tieredcore.meta.zookeeper import ZkMetadataStore

        return ZkMetadataStore(url)
    raise ValidationError(
        f"metadata_url: unsupported scheme {u.scheme!r} in {url!r} (supported: sqlite:///path, zk://host:port/root)"
    )
