"""Object keys of offloaded ledgers (spec/01): `{prefix}{uuid}-ledger-{id}` and `...-index`."""

from __future__ import annotations

import re
import uuid as uuidlib
from dataclasses import dataclass

from tieredcore.errors import ValidationError

_LEDGER_KEY = re.compile(
    r"(?P<uuid>[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})-ledger-(?P<id>[0-9]+)(?P<index>-index)?"
)


def normalize_prefix(prefix: str) -> str:
    """'' stays ''; 'a/b' becomes 'a/b/'. Keys keep Pulsar's suffix exactly."""
    prefix = prefix.strip()
    if not prefix:
        return ""
    if prefix.startswith("/") or ".." in prefix.split("/"):
        raise ValidationError(f"object key prefix {prefix!r} must be relative and must not contain '..'")
    return prefix if prefix.endswith("/") else prefix + "/"


def data_key(prefix: str, uuid: uuidlib.UUID | str, ledger_id: int) -> str:
    return f"{prefix}{uuid}-ledger-{ledger_id}"


def index_key(prefix: str, uuid: uuidlib.UUID | str, ledger_id: int) -> str:
    return f"{data_key(prefix, uuid, ledger_id)}-index"


@dataclass(frozen=True)
class ParsedKey:
    uuid: str
    ledger_id: int
    is_index: bool


def parse_ledger_key(key: str, prefix: str = "") -> ParsedKey | None:
    """The uuid / ledger id of an offloaded-ledger key, or None for keys this format did not write."""
    if not key.startswith(prefix):
        return None
    m = _LEDGER_KEY.fullmatch(key[len(prefix) :])
    if m is None:
        return None
    return ParsedKey(m["uuid"], int(m["id"]), m["index"] is not None)
