"""Exception hierarchy of tieredcore.

Every error a caller may want to handle differently has its own class; messages name the object
(ledger, key, topic, path) so an operator can act on them without a stack trace.
"""

from __future__ import annotations

from collections.abc import Iterable


class TieredError(Exception):
    """Base of every error raised deliberately by tieredcore."""


# --- bad input -------------------------------------------------------------------------------


class ValidationError(TieredError, ValueError):
    """Bad input from a user or caller (configuration, names, policies, arguments)."""


class BadRangeError(ValidationError):
    """A read range outside a ledger (first < 0, first > last, last > LAC)."""


# --- formats ---------------------------------------------------------------------------------


class FormatError(TieredError):
    """Bytes that do not follow the expected format."""


class InvalidMagicError(FormatError):
    """First bytes are not the magic word the reader expects."""


class TruncatedError(FormatError, EOFError):
    """The buffer ends before the structure it should hold."""


class UnsupportedVersionError(FormatError):
    """Object format-version user metadata missing or not one this reader understands."""


class UnreadableRecordError(FormatError):
    """A topic's metadata record (``ManagedLedgerInfo``) cannot be decoded. It fails that topic only:
    jobs report it with ``topic``, ``path`` and ``reason`` and go on with the other topics, and nothing
    its record might reference is ever treated as unreferenced (its references are unknown)."""

    def __init__(self, topic: str, path: str, reason: str) -> None:
        super().__init__(f"topic {topic}: its record {path} cannot be read: {reason}")
        self.topic = topic
        self.path = path
        self.reason = reason

    def __reduce__(self):  # pickled across processes (Spark) with its fields, not its message
        return (type(self), (self.topic, self.path, self.reason))


class CorruptObjectError(FormatError):
    """Offloaded bytes fail their checksum (or disagree with the topic's metadata); the message names
    the object and the byte range. Never returned to callers as data."""


class MessageFormatError(FormatError):
    """An entry that is not a Pulsar message (spec/07): bad framing, metadata that does not parse, a batch
    that overruns its payload. ``position`` is the entry's ``ledger:entry`` (a Position) when known."""

    def __init__(self, *args: object, position: object = None) -> None:
        super().__init__(*args)
        self.position = position


class MessageChecksumError(MessageFormatError):
    """A Pulsar message whose CRC32C does not match its bytes; never returned as data. ``stored`` and
    ``computed`` are the two checksums."""

    def __init__(self, *args: object, position: object = None, stored: int = 0, computed: int = 0) -> None:
        super().__init__(*args, position=position)
        self.stored, self.computed = stored, computed


# --- not found -------------------------------------------------------------------------------


class NotFoundError(TieredError, LookupError):
    """Something named does not exist."""


class NoSuchObjectError(NotFoundError):
    """Object-store key does not exist."""


class NoSuchUploadError(NotFoundError):
    """Multipart upload id unknown (completed, aborted or never created)."""


class OffloadedLedgerNotFoundError(NotFoundError):
    """An offloaded ledger (its index object) does not exist."""


class HotLedgerNotFoundError(NotFoundError):
    """Hot-tier ledger does not exist (never created or deleted)."""


class InBookKeeperError(HotLedgerNotFoundError):
    """A ledger of an attached Pulsar cluster that only its BookKeeper holds (not offloaded): the project
    has no hot tier there and never reads BookKeeper. Not an error of the project: readers and the
    command line report it as "in BookKeeper (ledger N)". ``ledger_id`` names the ledger."""

    def __init__(self, *args: object, ledger_id: int | None = None) -> None:
        super().__init__(*args)
        self.ledger_id = ledger_id

    def __reduce__(self):  # pickled across processes (Spark) with its ledger id
        return (_in_bookkeeper, (self.args, self.ledger_id))


def _in_bookkeeper(args: tuple, ledger_id: int | None) -> InBookKeeperError:
    return InBookKeeperError(*args, ledger_id=ledger_id)


class TopicNotFoundError(NotFoundError):
    """No managed-ledger record for the topic."""


class NodeNotFoundError(NotFoundError):
    """Metadata-store path does not exist."""


# --- state -----------------------------------------------------------------------------------


class LedgerStateError(TieredError):
    """Operation not allowed in the ledger's state (append to sealed, offload open or empty)."""


class StaleHandleError(LedgerStateError):
    """A hot-tier handle was used after its ledger was deleted."""


class CorruptEntryError(TieredError):
    """Stored entry bytes fail their checksum; never returned to callers."""


# --- stores ----------------------------------------------------------------------------------


class BlobStoreError(TieredError):
    """Object-store backend failure (network, permissions, server error).

    ``failed_keys``: the keys a batch delete failed on, when the raiser knows them exactly; None when
    it does not (the stores' messages name at most 20 failed keys as ``'<key>' (<reason>)``)."""

    def __init__(self, *args: object, failed_keys: Iterable[str] | None = None) -> None:
        super().__init__(*args)
        self.failed_keys: frozenset[str] | None = None if failed_keys is None else frozenset(failed_keys)


class StoreUnavailableError(BlobStoreError):
    """The object store has answered nothing for longer than the run's ``store_dead_after``: declared dead
    for the rest of the run, every later request fails at once (tieredcore.cold.liveness)."""


class ObjectExistsError(TieredError):
    """A create-if-absent write found the key already there (nothing was written)."""


class PulsarReadOnlyError(ValidationError):
    """A write refused because what it would change belongs to an attached Pulsar cluster: a znode under
    Pulsar's paths (``/managed-ledgers``, ``/admin``, ...), a BookKeeper ledger, an object in its bucket,
    its namespace policies. Raised before anything is written: nothing changed."""


class ReplicaReadOnlyError(ValidationError):
    """A write refused on a read replica (``tiered init --replica-of``): its bucket is another cluster's and
    its metadata store changes only by ``tiered replica-sync``. Raised before anything is written."""


class AttachError(ValidationError):
    """Attaching to a Pulsar cluster was refused (no Pulsar layout in that ZooKeeper, an unknown cluster
    name, a bucket its policies do not name): one line saying why; nothing was created or written."""


class StoreOwnershipError(ValidationError):
    """The object store (prefix) is claimed by another workspace with the same cluster name: sharing it
    would let each delete the other's data."""


class MetadataStoreError(TieredError):
    """Metadata-store failure whose outcome is unknown: the update may or may not have landed."""


class VersionConflictError(TieredError):
    """Compare-and-set lost: the record changed since it was read. The update did not land."""


class NodeExistsError(VersionConflictError):
    """create() of a path that already exists."""


class OffloadConflictError(TieredError):
    """An offload attempt lost its ledger (trimmed) or its uuid (replaced by another attempt)."""


class LeaseHeldError(TieredError):
    """Another runner holds the topic's lease (a concurrent sweep): skip the topic this time."""
