"""Typed access to topic records and namespace policies, in Pulsar's metadata layout.

=========================================================  =====================================
``/managed-ledgers/<tenant>/<namespace>/persistent/<t>``   ``ManagedLedgerInfo`` (docs/metadata.md bytes)
``/admin/policies/<tenant>/<namespace>``                   namespace policies (JSON object)
=========================================================  =====================================

``<t>`` is the URL-encoded local name, as in Pulsar (see :mod:`tieredcore.names`).
Every topic update is a compare-and-set; :meth:`ManagedLedgerStore.update_topic` wraps the
read / mutate / CAS loop that every workflow uses.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Sequence

from tieredcore.errors import (
    FormatError,
    NodeNotFoundError,
    PulsarReadOnlyError,
    TopicNotFoundError,
    UnreadableRecordError,
    ValidationError,
    VersionConflictError,
)
from tieredcore.formats.mlinfo import (
    LedgerInfo,
    ManagedLedgerInfo,
    decode_managed_ledger_info,
    encode_managed_ledger_info,
)
from tieredcore.meta.store import CreateOp, MetadataStore, write_refusal
from tieredcore.names import PERSISTENT, NamespaceName, TopicName

log = logging.getLogger(__name__)

MANAGED_LEDGERS_ROOT = "/managed-ledgers"
POLICIES_ROOT = "/admin/policies"
TOPIC_POLICIES_ROOT = "/admin/topic-policies"

TopicLike = TopicName | str
NamespaceLike = NamespaceName | str


def topic_path(topic: TopicLike) -> str:
    """``/managed-ledgers/<tenant>/<namespace>/persistent/<encoded topic>``."""
    return f"{MANAGED_LEDGERS_ROOT}/{TopicName.parse(topic).managed_ledger_name}"


def policies_path(namespace: NamespaceLike) -> str:
    """``/admin/policies/<tenant>/<namespace>``."""
    return f"{POLICIES_ROOT}/{NamespaceName.parse(namespace).name}"


def topic_policies_path(topic: TopicLike) -> str:
    """``/admin/topic-policies/<tenant>/<namespace>/<encoded topic>``."""
    t = TopicName.parse(topic)
    return f"{TOPIC_POLICIES_ROOT}/{t.namespace_name}/{t.encoded_local_name}"


def find_ledger(info: ManagedLedgerInfo, ledger_id: int) -> LedgerInfo | None:
    """The topic's LedgerInfo for ``ledger_id`` (a live reference into ``info``), or None."""
    for li in info.ledgerInfo:
        if li.ledgerId == ledger_id:
            return li
    return None


class ManagedLedgerStore:
    """Topic records and namespace policies on top of any :class:`MetadataStore`.

    ``compression``: how records are written (None = plain protobuf, as Pulsar by default; "LZ4", "ZLIB",
    "ZSTD", "SNAPPY"), and ``compression_threshold``: only a record whose plain form is larger than this
    many bytes is compressed — Pulsar's ``MetaStoreImpl.compressLedgerInfo`` with its
    ``MetadataCompressionConfig`` (the managed-ledger library's default is 0: always; brokers configure
    ``managedLedgerInfoCompressionThresholdInBytes``, 16 KiB by default). Any form is read whatever
    these say. A record that cannot be decoded raises :class:`UnreadableRecordError` (topic, path, reason).
    """

    def __init__(self, store: MetadataStore, compression: str | None = None, compression_threshold: int = 0) -> None:
        if not isinstance(compression_threshold, int) or isinstance(compression_threshold, bool) \
                or compression_threshold < 0:
            raise ValidationError(f"compression_threshold must be a number of bytes >= 0, got {compression_threshold!r}")
        self.store = store
        self.compression = compression
        self.compression_threshold = compression_threshold
        encode_managed_ledger_info(ManagedLedgerInfo(), compression)  # validate the option now
        # Called by the protocol's compare-and-set step (tieredcore.offload.transaction) after a commit that
        # changed a topic's offloaded state, with (topic, info as stored, version): the workspace wires the
        # topic-manifest writer here (docs/recovery.md). None: no manifests.
        self.after_offloaded_change: Callable[[TopicName, ManagedLedgerInfo, int], None] | None = None
        # what the offloaded state of a record is, for comparing before and after a change (set with the hook)
        self.offloaded_state: Callable[[ManagedLedgerInfo], bytes] | None = None

    # --- topics ----------------------------------------------------------------------------

    def _encode(self, info: ManagedLedgerInfo) -> bytes:
        if self.compression is not None and info.ByteSize() <= self.compression_threshold:
            return encode_managed_ledger_info(info)  # at or below the threshold: plain, as Pulsar writes it
        return encode_managed_ledger_info(info, self.compression)

    @staticmethod
    def _decode(topic: TopicName, data: bytes) -> ManagedLedgerInfo:
        try:
            return decode_managed_ledger_info(data)
        except FormatError as e:
            raise UnreadableRecordError(topic.full, topic_path(topic), str(e)) from None

    def get_topic(self, topic: TopicLike) -> tuple[ManagedLedgerInfo, int]:
        """The topic's record and its version; TopicNotFoundError when there is none."""
        t = TopicName.parse(topic)
        got = self.store.get(topic_path(t))
        if got is None:
            raise TopicNotFoundError(f"topic {t.full} not found (no managed-ledger record)")
        return self._decode(t, got.value), got.version

    def exists(self, topic: TopicLike) -> bool:
        return self.store.get(topic_path(topic)) is not None

    @property
    def read_only(self) -> bool:
        """Are topic records read-only here (a store attached to a Pulsar cluster: its brokers own them)?"""
        return write_refusal(self.store, MANAGED_LEDGERS_ROOT) is not None

    def require_writable(self, topic: TopicLike) -> None:
        """PulsarReadOnlyError when the topic's record belongs to an attached Pulsar cluster: every change
        of a topic (and whatever it would record for deletion first) is refused before it starts."""
        path = topic_path(topic)
        why = write_refusal(self.store, path)
        if why is not None:
            raise PulsarReadOnlyError(why)

    def create_topic(self, topic: TopicLike, info: ManagedLedgerInfo | None = None) -> int:
        """Create the record (version 0); NodeExistsError if the topic exists."""
        t = TopicName.parse(topic)
        return self.store.create(
            topic_path(t), self._encode(info if info is not None else ManagedLedgerInfo())
        )

    def create_topics(self, items: Sequence[tuple[TopicLike, ManagedLedgerInfo]]) -> None:
        """Create several records (version 0) in one transaction: all or none; NodeExistsError (nothing
        created) if one of the topics exists."""
        self.store.transaction([CreateOp(topic_path(TopicName.parse(t)), self._encode(info)) for t, info in items])

    def put_topic(self, topic: TopicLike, info: ManagedLedgerInfo, expected_version: int) -> int:
        """Compare-and-set the record; returns the new version. VersionConflictError if the record
        changed (or vanished) since ``expected_version`` was read."""
        return self.store.put(topic_path(topic), self._encode(info), expected_version)

    def update_topic(
        self,
        topic: TopicLike,
        mutate: Callable[[ManagedLedgerInfo], bool | None],
        max_attempts: int = 20,
    ) -> tuple[ManagedLedgerInfo, int]:
        """Read, ``mutate(info)`` in place, compare-and-set; retry from a fresh read when the record
        changed meanwhile. ``mutate`` may run several times and must decide from the info it is
        given. If it returns False nothing is written and the record as read is returned.

        Returns the info as stored and its version. Raises TopicNotFoundError if the topic is
        missing (or deleted meanwhile), VersionConflictError after ``max_attempts`` lost races;
        MetadataStoreError propagates unchanged (outcome unknown: do not clean up after it);
        exceptions raised by ``mutate`` propagate with nothing written.
        """
        if max_attempts < 1:
            raise ValidationError(f"max_attempts must be >= 1, got {max_attempts}")
        t = TopicName.parse(topic)
        path = topic_path(t)
        last: VersionConflictError | None = None
        for attempt in range(max_attempts):
            if attempt:
                # jittered backoff so that contending writers spread out
                time.sleep(random.uniform(0, min(0.05, 0.0005 * (2**attempt))))
            got = self.store.get(path)
            if got is None:
                raise TopicNotFoundError(f"topic {t.full} not found (no managed-ledger record)")
            work = self._decode(t, got.value)
            if mutate(work) is False:
                return self._decode(t, got.value), got.version
            data = self._encode(work)
            try:
                version = self.store.put(path, data, got.version)
            except VersionConflictError as e:
                last = e
                continue
            return work, version
        raise VersionConflictError(
            f"topic {t.full}: gave up after {max_attempts} compare-and-set attempts ({last})"
        )

    def delete_topic(self, topic: TopicLike, expected_version: int | None = None) -> None:
        """Delete the record (CAS when ``expected_version`` is given); TopicNotFoundError if absent."""
        t = TopicName.parse(topic)
        try:
            self.store.delete(topic_path(t), expected_version)
        except NodeNotFoundError:
            raise TopicNotFoundError(f"topic {t.full} not found (no managed-ledger record)") from None

    # --- listing ---------------------------------------------------------------------------

    def list_namespaces(self) -> list[str]:
        """Sorted ``tenant/namespace`` names that have persistent topics or policies."""
        found: set[str] = set()
        for tenant in self.store.children(MANAGED_LEDGERS_ROOT):
            for ns in self.store.children(f"{MANAGED_LEDGERS_ROOT}/{tenant}"):
                if PERSISTENT in self.store.children(f"{MANAGED_LEDGERS_ROOT}/{tenant}/{ns}"):
                    self._add_namespace(found, tenant, ns)
        for tenant in self.store.children(POLICIES_ROOT):
            for ns in self.store.children(f"{POLICIES_ROOT}/{tenant}"):
                if self.store.get(f"{POLICIES_ROOT}/{tenant}/{ns}") is not None:
                    self._add_namespace(found, tenant, ns)
        return sorted(found)

    @staticmethod
    def _add_namespace(found: set[str], tenant: str, ns: str) -> None:
        try:
            found.add(NamespaceName(tenant, ns).name)
        except ValidationError as e:
            log.warning("ignoring metadata entry with an invalid namespace name: %s", e)

    def list_topics(self, namespace: NamespaceLike) -> list[TopicName]:
        """Topics under the namespace's ``persistent`` node, sorted by metadata name. A name may
        disappear before it is read: get_topic then raises TopicNotFoundError."""
        ns = NamespaceName.parse(namespace)
        out: list[TopicName] = []
        for child in self.store.children(f"{MANAGED_LEDGERS_ROOT}/{ns.name}/{PERSISTENT}"):
            try:
                out.append(TopicName.parse(f"{ns.name}/{PERSISTENT}/{child}"))
            except ValidationError as e:
                log.warning("ignoring metadata entry with an invalid topic name: %s", e)
        return out

    # --- policies --------------------------------------------------------------------------

    def _get_json(self, path: str, what: str) -> dict | None:
        got = self.store.get(path)
        if got is None:
            return None
        try:
            value = json.loads(got.value)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise FormatError(f"{what}: policies are not valid JSON: {e}") from None
        if not isinstance(value, dict):
            raise FormatError(f"{what}: policies are a JSON {type(value).__name__}, not an object")
        return value

    def _set_json(self, path: str, what: str, policies: dict) -> int:
        if not isinstance(policies, dict):
            raise ValidationError(f"{what}: policies must be a dict, got {type(policies).__name__}")
        try:
            data = json.dumps(policies, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
        except (TypeError, ValueError) as e:
            raise ValidationError(f"{what}: policies are not JSON-serialisable: {e}") from None
        return self.store.set(path, data)

    def _delete_json(self, path: str) -> bool:
        try:
            self.store.delete(path)
            return True
        except NodeNotFoundError:
            return False

    def get_policies(self, namespace: NamespaceLike) -> dict | None:
        """The namespace's policies (a JSON object), or None when none are stored."""
        ns = NamespaceName.parse(namespace)
        return self._get_json(policies_path(ns), f"namespace {ns.name}")

    def set_policies(self, namespace: NamespaceLike, policies: dict) -> int:
        """Store the namespace's policies (unconditional upsert); returns the new version."""
        ns = NamespaceName.parse(namespace)
        return self._set_json(policies_path(ns), f"namespace {ns.name}", policies)

    def delete_policies(self, namespace: NamespaceLike) -> bool:
        return self._delete_json(policies_path(NamespaceName.parse(namespace)))

    def get_topic_policies(self, topic: TopicLike) -> dict | None:
        """Topic-level overrides (a JSON object), or None."""
        t = TopicName.parse(topic)
        return self._get_json(topic_policies_path(t), f"topic {t.full}")

    def set_topic_policies(self, topic: TopicLike, policies: dict) -> int:
        t = TopicName.parse(topic)
        return self._set_json(topic_policies_path(t), f"topic {t.full}", policies)

    def delete_topic_policies(self, topic: TopicLike) -> bool:
        return self._delete_json(topic_policies_path(TopicName.parse(topic)))

    def list_topic_policy_topics(self, namespace: NamespaceLike) -> list[TopicName]:
        """Topics of the namespace that have topic-level policy overrides."""
        ns = NamespaceName.parse(namespace)
        out = []
        for enc in self.store.children(f"{TOPIC_POLICIES_ROOT}/{ns.name}"):
            try:
                out.append(TopicName.parse(f"{ns.name}/{PERSISTENT}/{enc}"))
            except ValidationError as e:
                log.warning("ignoring topic policies with an invalid topic name: %s", e)
        return out

    def list_policy_namespaces(self) -> list[str]:
        """Namespaces that have a policies record."""
        out = []
        for tenant in self.store.children(POLICIES_ROOT):
            for ns in self.store.children(f"{POLICIES_ROOT}/{tenant}"):
                if self.store.get(f"{POLICIES_ROOT}/{tenant}/{ns}") is not None:
                    out.append(f"{tenant}/{ns}")
        return sorted(out)
