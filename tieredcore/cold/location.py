"""Where offloaded objects live (:class:`StoreLocation`): store URLs, the driver metadata Pulsar records in
every OffloadContext, and opening the store — one home for the conversions between them.

    file:///abs/dir[?prefix=p]                          filesystem object store
    s3://bucket[/prefix][?endpoint=http(s)://host[:port]&region=us-east-1&connect_timeout=5s
         &read_timeout=10s&max_attempts=3&retry_mode=adaptive]
    azure://container[/prefix][?endpoint=http(s)://host[:port][/account]&connect_timeout=5s
            &read_timeout=10s&max_attempts=3]        Azure Blob Storage (block blobs)
    gs://bucket[/prefix][?endpoint=http(s)://host[:port]&connect_timeout=5s&read_timeout=10s
         &max_attempts=3]                            Google Cloud Storage

Credentials never appear in URLs: S3 from the AWS credential chain, Azure from
AZURE_STORAGE_CONNECTION_STRING or AZURE_STORAGE_ACCOUNT + AZURE_STORAGE_KEY, GCS from
GOOGLE_APPLICATION_CREDENTIALS (or STORAGE_EMULATOR_HOST for an emulator); see tieredcore.cold.backends.azure/gcs.

Every URL is validated (:func:`parse_store_url`, no I/O) before anything is opened or created.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any
from urllib.parse import SplitResult, parse_qsl, quote, unquote, urlsplit

from tieredcore.cold.client_settings import (
    MAX_ATTEMPTS_LIMIT,
    S3_CONNECT_TIMEOUT,
    S3_MAX_ATTEMPTS,
    S3_READ_TIMEOUT,
    S3_RETRY_MODE,
    S3_RETRY_MODES,
)
from tieredcore.cold.drivers import DRIVER_FILESYSTEM, SCHEME_DRIVERS, pulsar_properties, resolve
from tieredcore.errors import ValidationError
from tieredcore.formats.keys import normalize_prefix
from tieredcore.formats.proto import MLDataFormats_pb2 as pb
from tieredcore.units import timeout_seconds

if TYPE_CHECKING:
    from tieredcore.cold.blob import BlobStore

# policies name a store by driver; "filesystem" (what earlier versions called the local store) stays accepted
DRIVER_SCHEMES = {**{d: s for s, d in SCHEME_DRIVERS.items()}, DRIVER_FILESYSTEM: "file"}
DEFAULT_REGION = "us-east-1"
# driver-metadata properties of chunked (transformed) objects; Pulsar ignores properties it does not know
CHUNKED_PROPERTY = "tieredChunked"
KEY_RING_PROPERTY = "tieredKeyRing"
TRANSFORM_PROPERTY = "tieredTransform"  # the transform objects were written with (zstd, aes, zstd+aes)


FILE_PARAMS = ("prefix",)
S3_PARAMS = ("endpoint", "region", "connect_timeout", "read_timeout", "max_attempts", "retry_mode")
CLOUD_PARAMS = ("endpoint", "connect_timeout", "read_timeout", "max_attempts")  # azure:// and gs://

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_CONTAINER = re.compile(r"^[a-z0-9](?:[a-z0-9]|-(?=[a-z0-9])){2,62}$")
_GCS_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")
# AWS regions (us-east-1, us-gov-west-1) and what S3-compatible servers call theirs (Ceph: "default")
_REGION = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
_HOSTNAME = re.compile(r"^[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*\.?$")
_INTEGER = re.compile(r"^[0-9]+$")
_USERINFO = re.compile(r"//[^/@?#&]*@")


def _is_ip_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False


def check_bucket_name(name: str, where: str = "policy") -> None:
    """S3 bucket naming rules: 3-63 chars of a-z 0-9 . -, alphanumeric ends, no '..', not an IP."""
    ok = bool(_BUCKET.match(name or "")) and ".." not in name and ".-" not in name and "-." not in name
    ok = ok and not _is_ip_address(name)
    if not ok:
        raise ValidationError(
            f"{where}: bad bucket name {name!r} (3-63 characters: lowercase letters, digits, '.', '-'; "
            "starting and ending with a letter or digit; not an IP address)"
        )


def check_container_name(name: str, where: str) -> None:
    """Azure container naming rules: 3-63 characters, lowercase letters, digits and single '-' between them."""
    if not _CONTAINER.match(name or ""):
        raise ValidationError(
            f"{where}: bad Azure container name {name!r} (3-63 characters: lowercase letters, digits and '-'; "
            "starting and ending with a letter or digit; no '--')"
        )


def check_gcs_bucket_name(name: str, where: str) -> None:
    """GCS bucket naming rules: 3-63 characters (222 with dots, 63 per dot-separated part) of a-z 0-9 - _ .,
    alphanumeric ends, not an IP address, not starting with 'goog' or containing 'google'."""
    ok = bool(_GCS_BUCKET.match(name or "")) and ".." not in name and all(
        0 < len(part) <= 63 for part in name.split(".")) and (len(name) <= 63 or "." in name)
    ok = ok and not name.startswith("goog") and "google" not in name and not _is_ip_address(name)
    if not ok:
        raise ValidationError(
            f"{where}: bad GCS bucket name {name!r} (3-63 characters, or up to 222 in dot-separated parts of at "
            "most 63: lowercase letters, digits, '-', '_', '.'; starting and ending with a letter or digit; not "
            "an IP address; not starting with 'goog' or containing 'google')"
        )


@dataclass(frozen=True)
class StoreLocation:
    """Where offloaded objects live: an object store and a key prefix, with the client settings used to
    reach it. One home for URL -> location (:meth:`from_url`), location -> URL (:meth:`url`), the driver
    metadata an OffloadContext records (:meth:`driver_metadata`, :meth:`from_driver_metadata`) and the
    opened store (:meth:`open`). The prefix is normalised ('' or ending with '/')."""

    scheme: str  # "file", "s3", "azure" or "gs"
    prefix: str = ""  # key prefix of offloaded objects: relative, no '..'
    root: str = ""  # file: the absolute directory objects live under
    bucket: str = ""  # s3, gs: the bucket; azure: the container
    # s3: an S3-compatible server (MinIO, Ceph, moto), None: AWS; azure: the account's blob endpoint (Azurite:
    # http://host:port/devstoreaccount1), None: from the environment; gs: an emulator or proxy, None: Google
    endpoint: str | None = None
    region: str | None = None
    connect_timeout: float = S3_CONNECT_TIMEOUT
    read_timeout: float = S3_READ_TIMEOUT
    max_attempts: int = S3_MAX_ATTEMPTS
    retry_mode: str = S3_RETRY_MODE
    # objects here are chunked and transformed (TransformedBlobStore): read through their manifests,
    # with the key ring at ``key_ring`` when encrypted. Recorded in driver metadata, not in URLs.
    chunked: bool = False
    key_ring: str = ""
    transform: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "prefix", normalize_prefix(self.prefix))

    # -- URLs ------------------------------------------------------------------------------------

    @classmethod
    def from_url(cls, url: str, what: str = "store_url") -> StoreLocation:
        return parse_store_url(url, what)

    def url(self) -> str:
        """The URL naming this location (client settings only where they differ from the defaults)."""
        if self.scheme == "file":
            return f"file://{quote(self.root)}" + (f"?prefix={quote(self.prefix)}" if self.prefix else "")
        params = [("endpoint", self.endpoint), ("region", self.region)]
        for name, default in (("connect_timeout", S3_CONNECT_TIMEOUT), ("read_timeout", S3_READ_TIMEOUT),
                              ("max_attempts", S3_MAX_ATTEMPTS), ("retry_mode", S3_RETRY_MODE)):
            value = getattr(self, name)
            if value != default:
                params.append((name, f"{value:g}" if isinstance(value, float) else str(value)))
        q = "&".join(f"{k}={v}" for k, v in params if v)
        return f"{self.scheme}://{self.bucket}/{quote(self.prefix)}" + (f"?{q}" if q else "")

    # -- OffloadContext driver metadata (docs/metadata.md: Pulsar records where each ledger went) ----------

    @property
    def driver(self) -> str:
        """OffloadDriverMetadata.name: Pulsar's ``aws-s3``, ``azureblob`` or ``google-cloud-storage`` driver, or
        this project's ``tiered-local`` (tieredcore.cold.drivers)."""
        return SCHEME_DRIVERS[self.scheme]

    def driver_properties(self) -> dict[str, str]:
        """As Pulsar's jclouds offloader records them (managedLedgerOffloadDriver, bucket — Azure: the
        container —, region, serviceEndpoint; '' for none), or ``root`` for the local store; then this
        project's own: ``prefix`` (objects under a prefix are invisible to brokers), chunked objects."""
        if self.scheme == "file":
            props = {"root": self.root}
        else:
            region = (self.region or DEFAULT_REGION) if self.scheme == "s3" else None
            props = pulsar_properties(self.driver, self.bucket, region, self.endpoint)
        if self.prefix:
            props["prefix"] = self.prefix
        if self.chunked:
            props[CHUNKED_PROPERTY] = "true"
            if self.key_ring:
                props[KEY_RING_PROPERTY] = self.key_ring
            if self.transform:
                props[TRANSFORM_PROPERTY] = self.transform
        return props

    def driver_metadata(self) -> pb.OffloadDriverMetadata:
        dm = pb.OffloadDriverMetadata(name=self.driver)
        for k, v in sorted(self.driver_properties().items()):
            dm.properties.add(key=k, value=v)
        return dm

    def driver_dict(self) -> dict[str, Any]:
        """The driver metadata as a deletion record carries it."""
        return {"name": self.driver, "properties": self.driver_properties()}

    @classmethod
    def from_driver_metadata(cls, dm: pb.OffloadDriverMetadata) -> StoreLocation:
        """The location an OffloadContext's driver metadata names (ValidationError: a driver or properties
        this build cannot open)."""
        props = {kv.key: kv.value for kv in dm.properties}
        try:
            scheme, fields = resolve(dm.name, props)
        except ValidationError as e:
            raise ValidationError(f"offloaded with {e}") from None
        loc = cls(scheme, prefix=props.get("prefix", ""), **fields)  # type: ignore[arg-type]
        loc = parse_store_url(loc.url(), f"driver metadata {dm.name}")  # as strict as a configured URL
        if props.get(CHUNKED_PROPERTY) == "true":
            loc = replace(loc, chunked=True, key_ring=props.get(KEY_RING_PROPERTY, ""),
                          transform=props.get(TRANSFORM_PROPERTY, ""))
        return loc

    @classmethod
    def of_store(cls, store: BlobStore, prefix: str = "") -> StoreLocation:
        """The location of an opened store (what its driver properties say) and a key prefix."""
        dm = pb.OffloadDriverMetadata(name=store.driver)
        for k, v in sorted(store.driver_properties().items()):
            dm.properties.add(key=k, value=str(v))
        return replace(cls.from_driver_metadata(dm), prefix=normalize_prefix(prefix))

    # -- identity and opening ----------------------------------------------------------------------

    @property
    def objects(self) -> tuple[str, str, str, str | None, str]:
        """What names the objects (not how the client reaches them): equal tuples, the same objects."""
        return (self.scheme, self.root, self.bucket, self.endpoint, self.prefix)

    def same_objects(self, other: StoreLocation) -> bool:
        return self.objects == other.objects

    @property
    def label(self) -> str:
        return f"{self.driver}:{self.root or self.bucket}/{self.prefix}"

    def open(self, fsync: bool = True, env: Mapping[str, str] | None = None) -> BlobStore:
        """The store (no I/O for file:// and s3://). ``env``: where azure:// and gs:// stores find their
        credentials (default os.environ)."""
        if self.scheme == "file":
            from tieredcore.cold.backends.fs import FilesystemBlobStore

            return FilesystemBlobStore(self.root, fsync=fsync)
        if self.scheme in ("azure", "gs"):
            _check_extra_installed(self.scheme)
        if self.scheme == "azure":
            from tieredcore.cold.backends.azure import AzureBlobStore

            return AzureBlobStore(self.bucket, endpoint=self.endpoint, max_attempts=self.max_attempts,
                                  connect_timeout=self.connect_timeout, read_timeout=self.read_timeout, env=env)
        if self.scheme == "gs":
            from tieredcore.cold.backends.gcs import GcsBlobStore

            return GcsBlobStore(self.bucket, endpoint=self.endpoint, max_attempts=self.max_attempts,
                                connect_timeout=self.connect_timeout, read_timeout=self.read_timeout, env=env)
        from tieredcore.cold.backends.s3 import S3BlobStore

        return S3BlobStore(self.bucket, endpoint_url=self.endpoint, region=self.region,
                           max_attempts=self.max_attempts, connect_timeout=self.connect_timeout,
                           read_timeout=self.read_timeout, retry_mode=self.retry_mode)


_EXTRAS = {"azure": ("azure.storage.blob", "azure"), "gs": ("google.cloud.storage", "gcs")}


def _check_extra_installed(scheme: str) -> None:
    """ValidationError naming the package extra when the client library of a store is not installed."""
    import importlib.util

    module, extra = _EXTRAS[scheme]
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        found = False
    if not found:
        raise ValidationError(f"{scheme}:// stores need the {module} client library: install the "
                              f"'{extra}' extra (pip install 'tiered-storage[{extra}]')")


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


def _check_endpoint(value: str, what: str, path_allowed: bool = False) -> str:
    shown = _redacted(value)
    try:
        e = urlsplit(value)
    except ValueError:  # e.g. http://[::zz]:9000
        raise ValidationError(f"{what}: endpoint {shown!r} has an invalid IPv6 address") from None
    if e.scheme not in ("http", "https") or not e.netloc:
        raise ValidationError(f"{what}: endpoint must be an http:// or https:// URL with a host, got {shown!r}")
    if e.username is not None or e.password is not None:
        raise ValidationError(
            f"{what}: endpoint {shown!r} must not contain credentials (they come from the environment)"
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
    if path_allowed:  # Azure: the account may be a path component (Azurite, private endpoints)
        if not re.match(r"^(/[a-z0-9]{3,24})?/?$", e.path) or e.query or e.fragment or "?" in value or "#" in value:
            raise ValidationError(
                f"{what}: endpoint {shown!r} must be scheme://host[:port][/account] (an account name of 3-24 "
                "lowercase letters and digits; no other path, query or fragment)"
            )
        return value.rstrip("/")
    if e.path not in ("", "/") or e.query or e.fragment or "?" in value or "#" in value:
        raise ValidationError(
            f"{what}: endpoint {shown!r} must be scheme://host[:port] only (no path, query or fragment)"
        )
    return value


def parse_store_url(url: str, what: str = "store_url") -> StoreLocation:
    """Validates a store URL and returns what it names; no I/O. ValidationError says what is wrong:

    - ``file:///absolute/dir[?prefix=p]``: not the filesystem root, no '..', no host but localhost;
    - ``s3://bucket[/prefix][?endpoint=http(s)://host[:port]&region=us-east-1&connect_timeout=5s
      &read_timeout=10s&max_attempts=3&retry_mode=adaptive]``: S3 bucket naming rules, known parameters
      only, each given once;
    - ``azure://container[/prefix][?endpoint=http(s)://host[:port][/account]&connect_timeout=..&read_timeout=..
      &max_attempts=..]``: Azure container naming rules;
    - ``gs://bucket[/prefix][?endpoint=http(s)://host[:port]&connect_timeout=..&read_timeout=..
      &max_attempts=..]``: GCS bucket naming rules.

    A prefix (path of an s3 URL, ``prefix`` of a file URL) must be relative and without '..'."""
    if not isinstance(url, str) or not url:
        raise ValidationError(f"{what}: expected a URL string, got {url!r}")
    try:
        u = urlsplit(url)
    except ValueError as e:  # unbalanced '[' or a bad IPv6 literal
        raise ValidationError(f"{what}: malformed URL {_redacted(url)!r}: {e}") from None
    if "@" in u.netloc:
        raise ValidationError(
            f"{what}: {_redacted(url)!r}: no user:password@ in store URLs (credentials come from the environment: "
            "the AWS credential chain, AZURE_STORAGE_*, GOOGLE_APPLICATION_CREDENTIALS)"
        )
    shown = _redacted(url)
    if u.fragment or "#" in url:
        raise ValidationError(f"{what}: unexpected '#' in {shown!r} (percent-encode it as %23)")
    if u.scheme == "file":
        return _file_location(u, shown, what)
    if u.scheme == "s3":
        return _s3_location(u, shown, what)
    if u.scheme in ("azure", "gs"):
        return _cloud_location(u, shown, what)
    raise ValidationError(
        f"{what}: unsupported scheme {u.scheme!r} in {shown!r} (supported: file://, s3://, azure://, gs://)"
    )


def _file_location(u: SplitResult, shown: str, what: str) -> StoreLocation:
    """``file:///absolute/dir[?prefix=p]`` (see parse_store_url)."""
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
    return StoreLocation("file", prefix=_check_prefix(q.get("prefix", ""), what), root=path)


def _s3_location(u: SplitResult, shown: str, what: str) -> StoreLocation:
    """``s3://bucket[/prefix][?endpoint=..&region=..&..]`` (see parse_store_url)."""
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
    out.update(_client_settings(q, what))
    if "retry_mode" in q:
        if q["retry_mode"] not in S3_RETRY_MODES:
            raise ValidationError(
                f"{what}: retry_mode must be one of {', '.join(S3_RETRY_MODES)}, got {q['retry_mode']!r}"
            )
        out["retry_mode"] = q["retry_mode"]
    return StoreLocation("s3", **out)


def _cloud_location(u: SplitResult, shown: str, what: str) -> StoreLocation:
    """``azure://container[/prefix][?..]`` or ``gs://bucket[/prefix][?..]`` (see parse_store_url)."""
    scheme = u.scheme
    example = "azure://container/prefix" if scheme == "azure" else "gs://bucket/prefix"
    q = _query(u.query, CLOUD_PARAMS, what, scheme)
    if not u.netloc:
        raise ValidationError(f"{what}: missing {'container' if scheme == 'azure' else 'bucket'} in {shown!r} "
                              f"(expected {example})")
    if scheme == "azure":
        check_container_name(u.netloc, what)
    else:
        check_gcs_bucket_name(u.netloc, what)
    path = u.path[1:] if u.path.startswith("/") else u.path
    out: dict[str, Any] = {"prefix": _check_prefix(unquote(path), what), "bucket": u.netloc}
    if "endpoint" in q:
        out["endpoint"] = _check_endpoint(q["endpoint"], what, path_allowed=scheme == "azure")
    out.update(_client_settings(q, what))
    return StoreLocation(scheme, **out)


def _client_settings(q: dict[str, str], what: str) -> dict[str, Any]:
    """connect_timeout, read_timeout and max_attempts of an object-store URL, validated."""
    out: dict[str, Any] = {}
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
    return out


def open_blob_store(url: str, fsync: bool = True) -> tuple[BlobStore, str]:
    """The object store a URL names and the key prefix offloaded objects go under."""
    loc = parse_store_url(url)
    return loc.open(fsync), loc.prefix
