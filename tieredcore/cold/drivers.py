"""Offload driver names and driver-metadata properties as Pulsar's offloaders record them in every
OffloadContext (``OffloadDriverMetadata{name, properties}``), and what each one means here.

What Pulsar writes (its sources, tiered-storage/):

- the jclouds offloader (jcloud/.../impl/BlobStoreManagedLedgerOffloader.java since Pulsar 2.6): ``name`` is
  the provider's driver (``JCloudBlobStoreProvider``: ``aws-s3``, ``google-cloud-storage``, ``azureblob``,
  ``aliyun-oss``, ``transient``); the properties are ``TieredStorageConfiguration.getOffloadDriverMetadata``:
  ``managedLedgerOffloadDriver`` (the provider constant's name, Java's ``Enum.toString``: ``AWS_S3``...),
  ``bucket``, ``region`` and ``serviceEndpoint``, each ``""`` when not configured. Brokers match driver
  names ignoring case.
- its predecessor (Pulsar 2.2 - 2.5): ``name`` as configured (``S3``, ``aws-s3`` or ``google-cloud-storage``,
  any case), properties ``bucket``, ``region`` and ``endpoint``.
- the filesystem offloader (file-system/.../FileSystemManagedLedgerOffloader.java): ``name`` ``filesystem``,
  one property ``storageBasePath``; it writes each ledger as a Hadoop MapFile, not the blob-store format.

This project's local filesystem store records ``tiered-local`` (``root``), a name no Pulsar offloader claims.
Earlier versions recorded ``filesystem`` with ``root``: such records still read, told apart from Pulsar's
filesystem offloader by their properties (``root`` and no ``storageBasePath``).
"""

from __future__ import annotations

from collections.abc import Mapping

from tieredcore.errors import ValidationError

DRIVER_LOCAL = "tiered-local"  # this project's local filesystem store
DRIVER_S3 = "aws-s3"
DRIVER_S3_LEGACY = "S3"  # Pulsar 2.2 - 2.5's name for the same S3 driver
DRIVER_GCS = "google-cloud-storage"
DRIVER_AZURE = "azureblob"
DRIVER_ALIYUN = "aliyun-oss"
DRIVER_TRANSIENT = "transient"
# Pulsar's Hadoop offloader; also what earlier versions of this project recorded for its local store
DRIVER_FILESYSTEM = "filesystem"

# property keys (TieredStorageConfiguration's spelling)
PULSAR_DRIVER_PROPERTY = "managedLedgerOffloadDriver"
BUCKET = "bucket"
REGION = "region"
ENDPOINT = "serviceEndpoint"
LEGACY_ENDPOINT = "endpoint"  # Pulsar 2.2 - 2.5
STORAGE_BASE_PATH = "storageBasePath"  # FileSystemManagedLedgerOffloader
ROOT = "root"  # this project's local store

# JCloudBlobStoreProvider's constants, by driver name: what managedLedgerOffloadDriver holds
PROVIDER_CONSTANTS = {DRIVER_S3: "AWS_S3", DRIVER_GCS: "GOOGLE_CLOUD_STORAGE", DRIVER_AZURE: "AZURE_BLOB",
                      DRIVER_ALIYUN: "ALIYUN_OSS", DRIVER_TRANSIENT: "TRANSIENT"}
# the store scheme each driver this build opens maps to (names compared ignoring case, as brokers do)
SCHEMES = {DRIVER_LOCAL: "file", DRIVER_S3: "s3", DRIVER_S3_LEGACY.lower(): "s3", DRIVER_GCS: "gs",
           DRIVER_AZURE: "azure"}
# what this project records for each store scheme
SCHEME_DRIVERS = {"file": DRIVER_LOCAL, "s3": DRIVER_S3, "azure": DRIVER_AZURE, "gs": DRIVER_GCS}
KNOWN = (DRIVER_LOCAL, DRIVER_S3, DRIVER_S3_LEGACY, DRIVER_GCS, DRIVER_AZURE, DRIVER_ALIYUN, DRIVER_TRANSIENT,
         DRIVER_FILESYSTEM)


def pulsar_properties(driver: str, bucket: str, region: str | None, endpoint: str | None) -> dict[str, str]:
    """The four properties Pulsar's jclouds offloader records for ``driver`` (its getOffloadDriverMetadata)."""
    return {PULSAR_DRIVER_PROPERTY: PROVIDER_CONSTANTS[driver], BUCKET: bucket, REGION: region or "",
            ENDPOINT: endpoint or ""}


def resolve(name: str, props: Mapping[str, str]) -> tuple[str, dict[str, str | None]]:
    """(store scheme, fields) of recorded driver metadata: ``root`` for file; ``bucket``, ``endpoint``
    (``serviceEndpoint``, else the older ``endpoint``) and, for S3, ``region`` for the others; ``""``
    read as absent. ValidationError saying why for a driver this build cannot read."""
    key = name.lower()
    if key == DRIVER_FILESYSTEM:
        if props.get(ROOT) and STORAGE_BASE_PATH not in props:  # recorded by an earlier version of this project
            return "file", {"root": props[ROOT]}
        raise ValidationError(
            f"driver {name!r} (storageBasePath={props.get(STORAGE_BASE_PATH)!r}) is Pulsar's filesystem offloader "
            "(FileSystemManagedLedgerOffloader), which writes each ledger as a Hadoop MapFile: not a blob-store "
            "offloader this project reads")
    if key == DRIVER_TRANSIENT:
        raise ValidationError(f"driver {name!r} is jclouds' in-memory store (Pulsar's tests): its objects lived in "
                              "one broker's memory, there is nothing to read")
    if key == DRIVER_ALIYUN:
        raise ValidationError(f"driver {name!r} (Aliyun OSS through the S3 API, virtual-hosted buckets only): this "
                              "build reaches S3-compatible endpoints path-style only, so it cannot open it")
    scheme = SCHEMES.get(key)
    if scheme is None:
        raise ValidationError(f"unknown offload driver {name!r} (known: {', '.join(KNOWN)})")
    if scheme == "file":
        if not props.get(ROOT):
            raise ValidationError(f"driver {name!r} without a {ROOT!r} property: cannot open")
        return scheme, {"root": props[ROOT]}
    if not props.get(BUCKET):
        raise ValidationError(f"driver {name!r} without a {BUCKET!r} property: cannot open")
    fields: dict[str, str | None] = {"bucket": props[BUCKET],
                                     "endpoint": props.get(ENDPOINT) or props.get(LEGACY_ENDPOINT) or None}
    if scheme == "s3":
        fields["region"] = props.get(REGION) or None
    return scheme, fields
