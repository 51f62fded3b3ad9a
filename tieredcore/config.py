"""One configuration object for every entry point (CLI, Spark jobs, DAGs).

Loaded from a TOML file (``tiered.toml``) and overridden by environment variables. Stores are named by
URL-like strings:

    metadata  sqlite:///abs/path/meta.db
    hot       file:///abs/path/hot
    store     file:///abs/path/cold            (filesystem object store)
              s3://bucket/prefix?endpoint=http://127.0.0.1:9000&region=us-east-1

Store URLs are checked by :func:`parse_store_url` when a Config is built, so every entry point refuses a
bad one before anything is created; :func:`open_blob_store` is the only place that opens one.
"""

from __future__ import annotations

import ipaddress
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, quote, unquote, urlparse, urlsplit

from tieredcore.errors import ValidationError
from tieredcore.formats.constants import (
    DEFAULT_CHECKPOINT_INTERVAL,
    DEFAULT_CHECKSUM_CHUNK,
    DEFAULT_MAX_BLOCK_SIZE,
    DEFAULT_READ_BUFFER_SIZE,
)
from tieredcore.units import timeout_seconds

if TYPE_CHECKING:
    from tieredcore.stores.blob import BlobStore
    from tieredcore.stores.hot import LocalLedgerStore
    from tieredcore.stores.metadata import MetadataStore

CONFIG_FILE_NAME = "tiered.toml"
ENV_CONFIG = "TIERED_CONFIG"
# environment variable -> Config field
ENV_OVERRIDES = {
    "TIERED_METADATA_URL": "metadata_url",
    "TIERED_HOT_URL": "hot_url",
    "TIERED_STORE_URL": "store_url",
    "TIERED_CLUSTER": "cluster",
    "TIERED_REPORTS_DIR": "reports_dir",
    "TIERED_SPARK_MASTER": "spark_master",
    "TIERED_MAX_BLOCK_SIZE": "max_block_size",
    "TIERED_READ_BUFFER": "read_buffer",
    "TIERED_CHECKPOINT_INTERVAL": "checkpoint_interval",
    "TIERED_CHECKSUM_CHUNK": "checksum_chunk",
    "TIERED_VERIFY_READS": "verify_reads",
    "TIERED_STORE_FAILURE_LIMIT": "store_failure_limit",
    "TIERED_LEASE_TTL_MS": "lease_ttl_ms",
}


@dataclass(frozen=True)
class Config:
    metadata_url: str
    hot_url: str
    store_url: str
    cluster: str = "standalone"
    reports_dir: str = ""
    spark_master: str = "local[*]"
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
    # how long a runner's per-topic lease lasts without renewal (a crashed holder's lease then expires)
    lease_ttl_ms: int = 15 * 60 * 1000
    # fsync of cold-tier objects before they become visible (off only for throwaway benchmarks)
    store_fsync: bool = True
    hot_fsync: bool = False

    def __post_init__(self) -> None:
        for name in ("metadata_url", "hot_url", "store_url"):
            if not getattr(self, name):
                raise ValidationError(f"configuration: {name} is empty")
        from tieredcore.stores.ownership import check_cluster_name

        check_cluster_name(self.cluster, "configuration: cluster")
        store = parse_store_url(self.store_url)  # a bad URL fails here, before anything is created
        if self.max_block_size < 5 * 1024 * 1024 and store.scheme == "s3":
            raise ValidationError(
                f"configuration: max_block_size {self.max_block_size} is below S3's 5 MiB minimum part size"
            )
        if self.read_buffer <= 0:
            raise ValidationError("configuration: read_buffer must be positive")
        if self.checkpoint_interval < 0:
            raise ValidationError("configuration: checkpoint_interval must be >= 0 (0: none)")
        if self.store_failure_limit < 0:
            raise ValidationError("configuration: store_failure_limit must be >= 0 (0: never stop)")
        if self.lease_ttl_ms <= 0:
            raise ValidationError("configuration: lease_ttl_ms must be positive")
        if self.checksum_chunk < 0 or 0 < self.checksum_chunk < 512:
            raise ValidationError("configuration: checksum_chunk must be 0 (none) or at least 512 bytes")

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
            elif isinstance(v, int):
                lines.append(f"{k} = {v}")
            else:
                lines.append(f'{k} = "{_toml_escape(str(v))}"')
        return "\n".join(lines) + "\n"

    # -- opening stores -----------------------------------------------------------------------

    def open_metadata(self) -> MetadataStore:
        return open_metadata_store(self.metadata_url)

    def open_hot(self) -> LocalLedgerStore:
        from tieredcore.stores.hot import LocalLedgerStore

        return LocalLedgerStore(_file_path(self.hot_url, "hot_url"), fsync=self.hot_fsync)

    def open_store(self) -> tuple[BlobStore, str]:
        """The object store and the key prefix offloaded objects go under."""
        return open_blob_store(self.store_url, fsync=self.store_fsync)


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
        v = out[f.name]
        want = {"str": str, "int": int, "bool": bool}.get(f.type if isinstance(f.type, str) else f.type.__name__)
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


def open_metadata_store(url: str) -> MetadataStore:
    u = urlparse(url)
    if u.scheme == "sqlite":
        from tieredcore.stores.sqlite_meta import SqliteMetadataStore

        return SqliteMetadataStore(unquote(u.path))
    raise ValidationError(f"metadata_url: unsupported scheme {u.scheme!r} in {url!r} (supported: sqlite:///path)")


# -- store URLs ---------------------------------------------------------------------------------

# S3 client defaults for a batch job: fail within seconds and let the job's own retry (the next task
# attempt, the next sweep) take over, instead of botocore's 60 s timeouts and legacy retries.
S3_CONNECT_TIMEOUT = 5.0  # seconds
S3_READ_TIMEOUT = 30.0  # seconds without a byte from the server
S3_MAX_ATTEMPTS = 4  # total attempts per request, the first one included
S3_RETRY_MODE = "adaptive"  # botocore: standard backoff plus client-side rate limiting on throttling
S3_RETRY_MODES = ("standard", "adaptive")
MAX_ATTEMPTS_LIMIT = 20

FILE_PARAMS = ("prefix",)
S3_PARAMS = ("endpoint", "region", "connect_timeout", "read_timeout", "max_attempts", "retry_mode")

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
# AWS regions (us-east-1, us-gov-west-1) and what S3-compatible servers call theirs (Ceph: "default")
_REGION = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
_HOSTNAME = re.compile(r"^[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*\.?$")
_INTEGER = re.compile(r"^[0-9]+$")
_USERINFO = re.compile(r"//[^/@?#&]*@")


def check_bucket_name(name: str, where: str = "policy") -> None:
    """S3 bucket naming rules: 3-63 chars of a-z 0-9 . -, alphanumeric ends, no '..', not an IP."""
    ok = bool(_BUCKET.match(name or "")) and ".." not in name and ".-" not in name and "-." not in name
    if ok:
        try:
            ipaddress.ip_address(name)
            ok = False
        except ValueError:
            pass
    if not ok:
        raise ValidationError(
            f"{where}: bad bucket name {name!r} (3-63 characters: lowercase letters, digits, '.', '-'; "
            "starting and ending with a letter or digit; not an IP address)"
        )


@dataclass(frozen=True)
class StoreURL:
    """A validated store URL (:func:`parse_store_url`); :func:`open_blob_store` opens exactly this."""

    scheme: str  # "file" or "s3"
    prefix: str = ""  # key prefix of offloaded objects: relative, no '..'
    root: str = ""  # file: the absolute directory objects live under
    bucket: str = ""  # s3
    endpoint: str | None = None  # s3: an S3-compatible server (MinIO, Ceph, moto); None: AWS
    region: str | None = None
    connect_timeout: float = S3_CONNECT_TIMEOUT
    read_timeout: float = S3_READ_TIMEOUT
    max_attempts: int = S3_MAX_ATTEMPTS
    retry_mode: str = S3_RETRY_MODE


def _check_prefix(prefix: str, what: str) -> str:
    if prefix.startswith("/") or ".." in prefix.split("/"):
        raise ValidationError(f"{what}: key prefix {prefix!r} must be relative, without '..'")
    if "\x00" in prefix:
        raise ValidationError(f"{what}: key prefix contains a NUL character")
    return prefix


def _query(query: str, known: tuple[str, ...], what: str, scheme: str) -> dict[str, str]:
    """The URL's parameters; every one known and given once."""
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=True) if query else []
    except ValueError:
        raise ValidationError(f"{what}: malformed query {_redacted(query)!r} (expected name=value&...)") from None
    out: dict[str, str] = {}
    for k, v in pairs:
        if k in out:
            raise ValidationError(f"{what}: parameter {k!r} given more than once")
        out[k] = v
    unknown = sorted(set(out) - set(known))
    if unknown:
        raise ValidationError(
            f"{what}: unknown parameter(s) {', '.join(unknown)} for {scheme}:// URLs (known: {', '.join(known)})"
        )
    return out


def _redacted(text: str) -> str:
    """A URL for an error message, without any user:password@ in it (outer URL or endpoint)."""
    return _USERINFO.sub("//***@", text)


def _check_endpoint(value: str, what: str) -> str:
    shown = _redacted(value)
    try:
        e = urlsplit(value)
    except ValueError:  # e.g. http://[::zz]:9000
        raise ValidationError(f"{what}: endpoint {shown!r} has an invalid IPv6 address") from None
    if e.scheme not in ("http", "https") or not e.netloc:
        raise ValidationError(f"{what}: endpoint must be an http:// or https:// URL with a host, got {shown!r}")
    if e.username is not None or e.password is not None:
        raise ValidationError(
            f"{what}: endpoint {shown!r} must not contain credentials (they come from the AWS credential chain)"
        )
    host = e.hostname or ""
    if ":" in host:  # an IPv6 literal
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValidationError(f"{what}: endpoint {shown!r} has an invalid IPv6 address") from None
    elif not _HOSTNAME.match(host):
        raise ValidationError(f"{what}: endpoint {shown!r} has an invalid host name {host!r}")
    try:
        port = e.port
    except ValueError:
        port = 0
    if port == 0 or (port is None and e.netloc.endswith(":")):
        raise ValidationError(f"{what}: endpoint {shown!r}: the port must be a number from 1 to 65535")
    if e.path not in ("", "/") or e.query or e.fragment or "?" in value or "#" in value:
        raise ValidationError(
            f"{what}: endpoint {shown!r} must be scheme://host[:port] only (no path, query or fragment)"
        )
    return value


def parse_store_url(url: str, what: str = "store_url") -> StoreURL:
    """Validates a store URL and returns what it names; no I/O. ValidationError says what is wrong:

    - ``file:///absolute/dir[?prefix=p]``: not the filesystem root, no '..', no host but localhost;
    - ``s3://bucket[/prefix][?endpoint=http(s)://host[:port]&region=us-east-1&connect_timeout=5s
      &read_timeout=30s&max_attempts=4&retry_mode=adaptive]``: S3 bucket naming rules, known parameters
      only, each given once.

    A prefix (path of an s3 URL, ``prefix`` of a file URL) must be relative and without '..'."""
    if not isinstance(url, str) or not url:
        raise ValidationError(f"{what}: expected a URL string, got {url!r}")
    try:
        u = urlsplit(url)
    except ValueError as e:  # unbalanced '[' or a bad IPv6 literal
        raise ValidationError(f"{what}: malformed URL {_redacted(url)!r}: {e}") from None
    if "@" in u.netloc:
        raise ValidationError(
            f"{what}: {_redacted(url)!r}: no user:password@ in store URLs (S3 credentials come from the AWS "
            "credential chain)"
        )
    shown = _redacted(url)
    if u.fragment or "#" in url:
        raise ValidationError(f"{what}: unexpected '#' in {shown!r} (percent-encode it as %23)")
    if u.scheme == "file":
        q = _query(u.query, FILE_PARAMS, what, "file")
        if u.netloc not in ("", "localhost"):
            # file://cold/x would silently mean "directory /x on host cold", or a relative path
            raise ValidationError(
                f"{what}: expected file:///absolute/path, got {shown!r} ({u.netloc!r} is read as a host name)"
            )
        path = unquote(u.path)
        if not path.startswith("/"):
            raise ValidationError(f"{what}: expected file:///absolute/path, got {shown!r}")
        if "\x00" in path:
            raise ValidationError(f"{what}: path contains a NUL character")
        if ".." in path.split("/"):
            raise ValidationError(f"{what}: path {path!r} must not contain '..'")
        if not path.strip("/"):
            raise ValidationError(f"{what}: {shown!r} is the filesystem root; name a directory for the objects")
        return StoreURL("file", prefix=_check_prefix(q.get("prefix", ""), what), root=path)
    if u.scheme == "s3":
        q = _query(u.query, S3_PARAMS, what, "s3")
        if not u.netloc:
            raise ValidationError(f"{what}: missing bucket in {shown!r} (expected s3://bucket/prefix)")
        check_bucket_name(u.netloc, what)
        path = u.path[1:] if u.path.startswith("/") else u.path
        out: dict[str, Any] = {"prefix": _check_prefix(unquote(path), what), "bucket": u.netloc}
        if "endpoint" in q:
            out["endpoint"] = _check_endpoint(q["endpoint"], what)
        if "region" in q:
            if not _REGION.match(q["region"]):
                raise ValidationError(f"{what}: region must be lowercase letters, digits and '-' (e.g. us-east-1), "
                                      f"got {q['region']!r}")
            out["region"] = q["region"]
        for name in ("connect_timeout", "read_timeout"):
            if name in q:
                out[name] = timeout_seconds(q[name], f"{what}: {name}")
        if "max_attempts" in q:
            v = q["max_attempts"]
            if not _INTEGER.match(v) or not 1 <= int(v) <= MAX_ATTEMPTS_LIMIT:
                raise ValidationError(
                    f"{what}: max_attempts must be an integer from 1 to {MAX_ATTEMPTS_LIMIT} "
                    f"(total attempts, the first included), got {v!r}"
                )
            out["max_attempts"] = int(v)
        if "retry_mode" in q:
            if q["retry_mode"] not in S3_RETRY_MODES:
                raise ValidationError(
                    f"{what}: retry_mode must be one of {', '.join(S3_RETRY_MODES)}, got {q['retry_mode']!r}"
                )
            out["retry_mode"] = q["retry_mode"]
        return StoreURL("s3", **out)
    raise ValidationError(f"{what}: unsupported scheme {u.scheme!r} in {shown!r} (supported: file://, s3://)")


def open_blob_store(url: str, fsync: bool = True) -> tuple[BlobStore, str]:
    """The object store a URL names and the key prefix offloaded objects go under."""
    spec = parse_store_url(url)
    if spec.scheme == "file":
        from tieredcore.stores.fs import FilesystemBlobStore

        return FilesystemBlobStore(spec.root, fsync=fsync), spec.prefix
    from tieredcore.stores.s3 import S3BlobStore

    store = S3BlobStore(
        spec.bucket,
        endpoint_url=spec.endpoint,
        region=spec.region,
        max_attempts=spec.max_attempts,
        connect_timeout=spec.connect_timeout,
        read_timeout=spec.read_timeout,
        retry_mode=spec.retry_mode,
    )
    return store, spec.prefix
