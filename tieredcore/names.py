"""Topic and namespace names (Pulsar v2 naming, persistent topics only).

Accepted topic forms::

    persistent://tenant/namespace/topic     (full name)
    tenant/namespace/topic                  (short name)
    tenant/namespace/persistent/topic       (managed-ledger name, as stored in the metadata store)

Names become metadata-store paths and object-store keys, so anything path-like or unusual is
rejected with a :class:`ValidationError` that says what is wrong: empty, "." or ".." components,
extra or leading slashes, backslashes, NUL / control characters, characters outside
``[A-Za-z0-9_.=:-]`` and ``%``, components longer than 255 characters, ``non-persistent://``.

Like Pulsar (``TopicName.getPersistenceNamingEncoding``), the managed-ledger name carries the
URL-encoded local name (Java ``URLEncoder``): characters other than ``[A-Za-z0-9_.-]`` become
``%XX`` (``a:b`` -> ``a%3Ab``, ``a%b`` -> ``a%25b``). For the usual ``[A-Za-z0-9_.-]`` names both
forms are identical. Parsing a managed-ledger name decodes it and validates the result again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tieredcore.errors import ValidationError

PERSISTENT = "persistent"
MAX_COMPONENT = 255

_ALLOWED = re.compile(r"[A-Za-z0-9_.=:%-]+")
_BAD_CHAR = re.compile(r"[^A-Za-z0-9_.=:%-]")
_URL_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789.-*_")
_PCT = re.compile(r"%([0-9A-Fa-f]{2})")
# C0 controls, DEL and C1 controls, refused in names and metadata paths (one search instead of a loop per
# character: names are parsed often)
CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _check_component(comp: str, what: str, name: str) -> None:
    if comp == "":
        raise ValidationError(f"{name!r}: empty {what}")
    if comp in (".", ".."):
        raise ValidationError(f"{name!r}: {what} {comp!r} is path-like")
    if len(comp) > MAX_COMPONENT:
        raise ValidationError(f"{name!r}: {what} is {len(comp)} characters long (at most {MAX_COMPONENT})")
    if not _ALLOWED.fullmatch(comp):
        bad = _BAD_CHAR.search(comp)
        ch = bad.group(0) if bad else "?"
        raise ValidationError(
            f"{name!r}: {what} {comp!r} contains {ch!r}; allowed characters are A-Z a-z 0-9 _ . = : - %"
        )


def _check_whole(s: object, kind: str) -> str:
    """Character checks on the raw string, giving a specific message before it is split."""
    if not isinstance(s, str):
        raise ValidationError(f"{kind} name must be a str, got {type(s).__name__}")
    if s == "":
        raise ValidationError(f"empty {kind} name")
    bad = CONTROL_CHARS.search(s)
    if bad is not None:
        o = ord(bad.group())
        what = "NUL" if o == 0 else f"control character U+{o:04X}"
        raise ValidationError(f"{kind} name {s!r} contains {what}")
    if "\\" in s:
        raise ValidationError(f"{kind} name {s!r} contains a backslash")
    return s


def _check_slashes(s: str, kind: str, name: str) -> None:
    """Slash checks on the part after any domain (``name`` is what the message shows)."""
    if s.startswith("/"):
        raise ValidationError(f"{kind} name {name!r} starts with '/'")
    if s.endswith("/"):
        raise ValidationError(f"{kind} name {name!r} ends with '/'")
    if "//" in s:
        raise ValidationError(f"{kind} name {name!r} has an empty component ('//')")


def encode_local_name(name: str) -> str:
    """Java ``URLEncoder.encode(name, UTF-8)``, as Pulsar's ``Codec.encode``."""
    out = []
    for ch in name:
        if ch in _URL_SAFE:
            out.append(ch)
        elif ch == " ":
            out.append("+")
        else:
            out.extend(f"%{b:02X}" for b in ch.encode("utf-8"))
    return "".join(out)


def decode_local_name(encoded: str, name: str) -> str:
    """Inverse of :func:`encode_local_name` (Java ``URLDecoder``); ValidationError when malformed."""
    if "%" not in encoded and "+" not in encoded:
        return encoded
    if encoded.count("%") != len(_PCT.findall(encoded)):
        raise ValidationError(f"{name!r}: malformed percent-encoding in {encoded!r}")
    parts = re.split(r"((?:%[0-9A-Fa-f]{2})+)", encoded.replace("+", " "))
    out = []
    for i, part in enumerate(parts):
        if i % 2 == 0:
            out.append(part)
        else:
            raw = bytes(int(h, 16) for h in _PCT.findall(part))
            try:
                out.append(raw.decode("utf-8"))
            except UnicodeDecodeError:
                raise ValidationError(f"{name!r}: percent-encoding is not UTF-8 in {encoded!r}") from None
    return "".join(out)


@dataclass(frozen=True, order=True)
class NamespaceName:
    """``tenant/namespace``."""

    tenant: str
    namespace: str

    def __post_init__(self) -> None:
        name = f"{self.tenant}/{self.namespace}"
        if not isinstance(self.tenant, str) or not isinstance(self.namespace, str):
            raise ValidationError(f"namespace components must be str, got {self.tenant!r}/{self.namespace!r}")
        _check_whole(name, "namespace")
        _check_component(self.tenant, "tenant", name)
        _check_component(self.namespace, "namespace", name)

    @classmethod
    def parse(cls, s: str | NamespaceName) -> NamespaceName:
        if isinstance(s, NamespaceName):
            return s
        _check_whole(s, "namespace")
        if "://" in s:
            raise ValidationError(f"namespace name {s!r} must be 'tenant/namespace', not a topic URL")
        _check_slashes(s, "namespace", s)
        parts = s.split("/")
        if len(parts) != 2:
            raise ValidationError(
                f"namespace name {s!r} must be 'tenant/namespace' (found {len(parts)} components)"
            )
        return cls(parts[0], parts[1])

    @property
    def name(self) -> str:
        return f"{self.tenant}/{self.namespace}"

    def topic(self, local_name: str) -> TopicName:
        return TopicName(self.tenant, self.namespace, local_name)

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True, order=True)
class TopicName:
    """A persistent topic ``persistent://tenant/namespace/local_name``."""

    tenant: str
    namespace: str
    local_name: str

    def __post_init__(self) -> None:
        for v in (self.tenant, self.namespace, self.local_name):
            if not isinstance(v, str):
                raise ValidationError(f"topic name components must be str, got {v!r}")
        name = f"{self.tenant}/{self.namespace}/{self.local_name}"
        _check_whole(name, "topic")
        _check_component(self.tenant, "tenant", name)
        _check_component(self.namespace, "namespace", name)
        _check_component(self.local_name, "topic", name)

    @classmethod
    def parse(cls, s: str | TopicName) -> TopicName:
        if isinstance(s, TopicName):
            return s
        _check_whole(s, "topic")
        if "://" in s:
            domain, rest = s.split("://", 1)
            if domain == "non-persistent":
                raise ValidationError(f"topic {s!r}: non-persistent topics have no managed ledger")
            if domain != PERSISTENT:
                raise ValidationError(f"topic {s!r}: unknown domain {domain!r} (only persistent://)")
            _check_slashes(rest, "topic", s)
            parts = rest.split("/")
            if len(parts) != 3:
                raise ValidationError(
                    f"topic {s!r} must be persistent://tenant/namespace/topic "
                    f"(found {len(parts)} components after the domain; '/' is not allowed in a name)"
                )
            return cls(*parts)
        _check_slashes(s, "topic", s)
        parts = s.split("/")
        if len(parts) == 3:
            return cls(*parts)
        if len(parts) == 4:
            tenant, namespace, domain, encoded = parts
            if domain == "non-persistent":
                raise ValidationError(f"topic {s!r}: non-persistent topics have no managed ledger")
            if domain != PERSISTENT:
                raise ValidationError(
                    f"topic {s!r}: a 4-component name must be tenant/namespace/persistent/topic"
                )
            _check_component(encoded, "topic", s)
            return cls(tenant, namespace, decode_local_name(encoded, s))
        raise ValidationError(
            f"topic {s!r} must be persistent://tenant/namespace/topic, tenant/namespace/topic or "
            f"tenant/namespace/persistent/topic (found {len(parts)} components)"
        )

    @property
    def namespace_name(self) -> str:
        """``tenant/namespace``."""
        return f"{self.tenant}/{self.namespace}"

    @property
    def namespace_obj(self) -> NamespaceName:
        return NamespaceName(self.tenant, self.namespace)

    @property
    def encoded_local_name(self) -> str:
        return encode_local_name(self.local_name)

    @property
    def managed_ledger_name(self) -> str:
        """``tenant/namespace/persistent/<encoded topic>`` (Pulsar's persistence naming)."""
        return f"{self.tenant}/{self.namespace}/{PERSISTENT}/{self.encoded_local_name}"

    @property
    def full(self) -> str:
        """``persistent://tenant/namespace/topic``."""
        return f"{PERSISTENT}://{self.tenant}/{self.namespace}/{self.local_name}"

    def __str__(self) -> str:
        return self.full


UNKNOWN_NAMESPACE = "(unknown)"  # reports: rows whose topic is not a topic name (malformed records)


def namespace_of(topic: str) -> str:
    """``tenant/namespace`` of a topic name, or UNKNOWN_NAMESPACE when it is not one."""
    try:
        return TopicName.parse(topic).namespace_name
    except ValidationError:
        return UNKNOWN_NAMESPACE


# Pulsar cluster names: letters, digits, '-', '_', '.'; the name goes into an object key
CLUSTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def check_cluster_name(name: object, what: str = "cluster") -> str:
    if not isinstance(name, str) or not CLUSTER_NAME.fullmatch(name):
        raise ValidationError(f"{what} {name!r}: 1-64 characters of A-Z a-z 0-9 . _ -, starting with a letter "
                              "or digit (it names the cluster in object metadata and keys)")
    return name
