"""Object keys of offloaded data, the one grammar every component writes and parses:

- a ledger offload (docs/formats.md, "Object keys"): ``{prefix}{uuid}-ledger-{id}`` (data) and
  ``{prefix}{uuid}-ledger-{id}-index``;
- a streaming segment (several ledgers in one object): ``{prefix}{uuid}`` and ``{prefix}{uuid}-index``;
- a transformed (chunked) object of either kind has a manifest beside it: ``<key>.manifest``
  (docs/formats.md "Chunked objects"), part of the same group;
- the entry-offsets sidecar of a ledger offload (docs/formats.md, "Entry offsets sidecar"):
  ``{prefix}{uuid}-ledger-{id}-offsets``, part of its pair's group. Pulsar never reads it: its key
  scanner (``DataBlockUtils.parseLedgerId``) finds no ledger id in it and skips it.

``uuid`` is a lowercase canonical UUID, ``id`` ASCII decimal digits; anything else under a prefix was not
written by an offloader (a foreign key).
"""

from __future__ import annotations

import re
import uuid as uuidlib
from dataclasses import dataclass

from tieredcore.errors import ValidationError

UUID_PATTERN = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
LEDGER_INFIX = "-ledger-"
INDEX_SUFFIX = "-index"
OFFSETS_SUFFIX = "-offsets"
MANIFEST_SUFFIX = ".manifest"
# groups: 1 uuid, 2 ledger id (None for a segment key), 3 "-index", 4 "-offsets" (after a ledger id only:
# the conditional), 5 ".manifest"; unmatched groups are None. ASCII digits only, matched with fullmatch
# (so a trailing newline makes a key foreign).
OBJECT_KEY = re.compile(
    rf"({UUID_PATTERN})(?:{LEDGER_INFIX}([0-9]+))?(?:({INDEX_SUFFIX})|(?(2)({OFFSETS_SUFFIX})|(?!)))?(\.manifest)?",
    re.ASCII)
_LEDGER_DATA_TAIL = re.compile(rf"{UUID_PATTERN}{LEDGER_INFIX}[0-9]+\Z", re.ASCII)


def normalize_prefix(prefix: str) -> str:
    """'' stays ''; 'a/b' becomes 'a/b/'. Keys keep Pulsar's suffix exactly."""
    prefix = prefix.strip()
    if not prefix:
        return ""
    if prefix.startswith("/") or ".." in prefix.split("/"):
        raise ValidationError(f"object key prefix {prefix!r} must be relative and must not contain '..'")
    return prefix if prefix.endswith("/") else prefix + "/"


def data_key(prefix: str, uuid: uuidlib.UUID | str, ledger_id: int) -> str:
    return f"{prefix}{uuid}{LEDGER_INFIX}{ledger_id}"


def index_key(prefix: str, uuid: uuidlib.UUID | str, ledger_id: int) -> str:
    return f"{data_key(prefix, uuid, ledger_id)}{INDEX_SUFFIX}"


def offsets_key(prefix: str, uuid: uuidlib.UUID | str, ledger_id: int) -> str:
    """The entry-offsets sidecar of a ledger offload's pair (docs/formats.md, "Entry offsets sidecar")."""
    return f"{data_key(prefix, uuid, ledger_id)}{OFFSETS_SUFFIX}"


def sidecar_of(data_key: str) -> str | None:
    """The sidecar key of a data key: a ledger offload's (``…-ledger-{id}``) has one, a segment's none."""
    m = _LEDGER_DATA_TAIL.search(data_key)
    return data_key + OFFSETS_SUFFIX if m is not None else None


def segment_data_key(prefix: str, uuid: uuidlib.UUID | str) -> str:
    return f"{prefix}{uuid}"


def segment_index_key(prefix: str, uuid: uuidlib.UUID | str) -> str:
    return f"{prefix}{uuid}{INDEX_SUFFIX}"


def with_manifests(keys: list[str] | tuple[str, ...]) -> list[str]:
    """Each key followed by the manifest a transformed object keeps beside it (what deleting an
    object pair must remove, whatever its form: deleting an absent key is fine)."""
    return [k2 for k in keys for k2 in (k + MANIFEST_SUFFIX, k)]


def group_keys(data_key: str, index_key: str) -> list[str]:
    """Every key of a data/index pair's object group, in deletion order: the sidecar (ledger pairs), the
    index, then the data object, each with its manifest. What deleting the group must remove (absent
    keys are fine); :func:`tieredcore.offload.transaction.delete_pair` and the deletion drain use it."""
    side = sidecar_of(data_key)
    return with_manifests([side, index_key, data_key] if side is not None else [index_key, data_key])


@dataclass(frozen=True)
class ParsedKey:
    uuid: str
    ledger_id: int | None  # None: a streaming segment's key
    is_index: bool
    is_manifest: bool = False
    is_offsets: bool = False  # the entry-offsets sidecar of a ledger pair

    @property
    def is_segment(self) -> bool:
        return self.ledger_id is None


def parse_key(key: str, prefix: str = "") -> ParsedKey | None:
    """The parts of an offloaded-data key (ledger or segment) under `prefix`, or None for a key no
    offloader wrote."""
    m = OBJECT_KEY.fullmatch(key, len(prefix)) if key.startswith(prefix) else None
    if m is None:
        return None
    return ParsedKey(m[1], int(m[2]) if m[2] is not None else None, m[3] is not None, m[5] is not None,
                     m[4] is not None)


def parse_ledger_key(key: str, prefix: str = "") -> ParsedKey | None:
    """Like parse_key, for ledger-offload keys only (segment keys give None)."""
    p = parse_key(key, prefix)
    return p if p is not None and p.ledger_id is not None else None


# -- topic manifests (docs/recovery.md) ----------------------------------------------------------------
# ``{prefix}tiered-topic-manifests/{cluster}/{tenant}/{namespace}/{domain}/{topic}/{sequence:020d}.topic-manifest``
# (per cluster: clusters sharing a bucket prefix may have topics of the same name). The directory starts with
# a letter past 'f', so no uuid listing of reconciliation holds one; Pulsar's key scanner finds no ledger id
# in it (the suffix is not digits) and skips it.
TOPIC_MANIFEST_DIR = "tiered-topic-manifests/"
TOPIC_MANIFEST_SUFFIX = ".topic-manifest"
_TOPIC_MANIFEST_TAIL = re.compile(r"(.+)/([0-9]{20})\.topic-manifest", re.ASCII)


# user metadata on a compacted ledger's objects (topic compaction): not one of the topic's own ledgers
COMPACTED_LEDGER_METADATA_KEY = "tieredcompactedledger"


def topic_manifests_prefix(prefix: str, cluster: str, managed_ledger_name: str = "") -> str:
    """Where a cluster's topic manifests live (``managed_ledger_name``: one topic's)."""
    return f"{prefix}{TOPIC_MANIFEST_DIR}{cluster}/" + (f"{managed_ledger_name}/" if managed_ledger_name else "")


def topic_manifest_key(prefix: str, cluster: str, managed_ledger_name: str, sequence: int) -> str:
    if not 0 <= sequence < 10**20:
        raise ValidationError(f"topic manifest sequence {sequence} out of range")
    return f"{topic_manifests_prefix(prefix, cluster, managed_ledger_name)}{sequence:020d}{TOPIC_MANIFEST_SUFFIX}"


def is_topic_manifest_key(key: str, prefix: str) -> bool:
    """A key under the location's topic-manifest directory (ours, never an orphan nor a ledger object)."""
    return key.startswith(prefix + TOPIC_MANIFEST_DIR)


def parse_topic_manifest_key(key: str, prefix: str, cluster: str) -> tuple[str, int] | None:
    """(managed-ledger name, sequence) of one of ``cluster``'s topic manifests, or None."""
    start = topic_manifests_prefix(prefix, cluster)
    if not key.startswith(start):
        return None
    m = _TOPIC_MANIFEST_TAIL.fullmatch(key, len(start))
    if m is None or m[1].count("/") != 3:
        return None
    return m[1], int(m[2])
