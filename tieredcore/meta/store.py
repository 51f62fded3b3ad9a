"""Metadata-store protocol: a versioned key/value tree with ZooKeeper's semantics.

Paths are ZooKeeper-style absolute paths ("/a/b"). Every record carries a version: 0 when created,
+1 on every update. Updates that must not lose a concurrent change use compare-and-set
(``put`` / ``delete`` with ``expected_version``). The embedded implementation is
:class:`tieredcore.meta.sqlite.SqliteMetadataStore`; a ZooKeeper (kazoo) implementation can
follow without changing callers:

=====================  ===============================================================
this protocol          kazoo
=====================  ===============================================================
``get``                ``get`` (NoNodeError -> None), version = ``ZnodeStat.version``
``create``             ``create(makepath=True)`` (NodeExistsError)
``put``                ``set(version=...)`` (BadVersionError / NoNodeError -> VersionConflictError)
``set``                ``set`` or ``create`` on NoNodeError
``delete``             ``delete(version=...)``
``children``           ``get_children`` (sorted)
``transaction``        ``transaction()`` / ``multi``: create / set_data / delete / check
=====================  ===============================================================

Errors: :class:`NodeExistsError` (create of an existing path), :class:`VersionConflictError`
(lost compare-and-set: nothing was written), :class:`NodeNotFoundError` (delete of a missing path),
:class:`ValidationError` (bad path), :class:`MetadataStoreError` (backend failure: the outcome is
unknown, the write may or may not have landed; callers must not assume either).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from tieredcore.errors import ValidationError
from tieredcore.names import CONTROL_CHARS

Buffer = bytes | bytearray | memoryview


@dataclass(frozen=True)
class Versioned:
    """A record's bytes and its version (0 after create, +1 per update)."""

    value: bytes
    version: int


# --- multi-op transaction operations (ZooKeeper multi) ----------------------------------------


@dataclass(frozen=True)
class CreateOp:
    """Create ``path`` at version 0; fails (NodeExistsError) if it exists."""

    path: str
    value: bytes


@dataclass(frozen=True)
class PutOp:
    """Compare-and-set ``path`` from ``expected_version``; fails (VersionConflictError) otherwise."""

    path: str
    value: bytes
    expected_version: int


@dataclass(frozen=True)
class DeleteOp:
    """Delete ``path`` (NodeNotFoundError if missing); compare-and-set when a version is given."""

    path: str
    expected_version: int | None = None


@dataclass(frozen=True)
class CheckOp:
    """Assert ``path`` exists at ``expected_version`` without changing it (VersionConflictError)."""

    path: str
    expected_version: int


Op = CreateOp | PutOp | DeleteOp | CheckOp


@runtime_checkable
class MetadataStore(Protocol):
    """Versioned records addressed by ZooKeeper-style absolute paths."""

    def get(self, path: str) -> Versioned | None:
        """The record at ``path``, or None when there is none."""
        ...

    def create(self, path: str, value: Buffer) -> int:
        """Create the record at version 0 and return 0; NodeExistsError if it exists.
        Ancestors need not exist (ZooKeeper implementations create them: makepath)."""
        ...

    def put(self, path: str, value: Buffer, expected_version: int) -> int:
        """Compare-and-set: replace the record if its version is ``expected_version``; return the
        new version (old + 1). VersionConflictError (nothing written) on mismatch or missing."""
        ...

    def set(self, path: str, value: Buffer) -> int:
        """Unconditional upsert (policies); returns the new version (0 when created)."""
        ...

    def delete(self, path: str, expected_version: int | None = None) -> None:
        """Delete the record; NodeNotFoundError if missing, VersionConflictError if
        ``expected_version`` is given and differs. Descendants are not touched."""
        ...

    def children(self, path: str) -> list[str]:
        """Sorted names of the immediate children of ``path``: every name ``c`` such that some
        record exists at ``path/c`` or below it. ``"/"`` lists the top level."""
        ...

    def transaction(self, ops: Sequence[Op]) -> list[int | None]:
        """Apply ``ops`` in order, all or nothing. Returns one result per op: the new version for
        CreateOp / PutOp, None for DeleteOp / CheckOp. The first failing op's error is raised
        (its message names the op's index) and no op is applied."""
        ...

    def close(self) -> None: ...


# --- paths ------------------------------------------------------------------------------------


def validate_path(path: object, *, allow_root: bool = False) -> str:
    """Return ``path`` if it is a valid absolute ZooKeeper-style path, else ValidationError.

    Rejected: non-strings, relative paths, trailing slash, empty components ("//"), "." or "..",
    NUL and other control characters, strings that are not valid UTF-8 (lone surrogates).
    ``"/"`` itself is accepted only with ``allow_root`` (reads / children, never writes).
    """
    if not isinstance(path, str):
        raise ValidationError(f"metadata path must be a str, got {type(path).__name__}")
    if path == "/":
        if allow_root:
            return path
        raise ValidationError("metadata path '/' (the root) cannot be written or deleted")
    if not path.startswith("/"):
        raise ValidationError(f"metadata path {path!r} is not absolute (must start with '/')")
    if path.endswith("/"):
        raise ValidationError(f"metadata path {path!r} ends with '/'")
    if CONTROL_CHARS.search(path) is not None:
        raise ValidationError(f"metadata path {path!r} contains a NUL or control character")
    try:
        path.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValidationError(f"metadata path {path!r} is not valid UTF-8: {e}") from None
    for comp in path[1:].split("/"):
        if comp == "":
            raise ValidationError(f"metadata path {path!r} has an empty component ('//')")
        if comp in (".", ".."):
            raise ValidationError(f"metadata path {path!r} has a relative component {comp!r}")
    return path


def parent_path(path: str) -> str:
    """Parent of a valid non-root path ("/a/b" -> "/a", "/a" -> "/")."""
    head = path.rsplit("/", 1)[0]
    return head or "/"


def join_path(*components: str) -> str:
    """``join_path("a", "b")`` -> "/a/b", validated (each component must be a single name)."""
    for comp in components:
        if not isinstance(comp, str) or "/" in comp:
            raise ValidationError(f"metadata path component {comp!r} must be a single name")
    return validate_path("/" + "/".join(components))


def write_refusal(store: object, path: str) -> str | None:
    """Why ``store`` refuses to write ``path`` (a ZooKeeper store attached to a Pulsar cluster refuses
    Pulsar's paths), or None. Stores without such a rule (SQLite) write every path."""
    refusal = getattr(store, "write_refusal", None)
    return refusal(path) if callable(refusal) else None


def check_version(v: object, what: str = "expected_version") -> int:
    """A record version given by a caller: an int >= 0 (bools refused), else ValidationError."""
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValidationError(f"{what} must be an int >= 0, got {v!r}")
    return v


def as_bytes(value: object, path: str) -> bytes:
    """Record values are bytes; bytearray / memoryview are copied."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise ValidationError(f"value for metadata path {path!r} must be bytes, got {type(value).__name__}")
