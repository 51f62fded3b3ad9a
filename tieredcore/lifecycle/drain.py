"""Phase 2 of two-phase deletion (docs/deletion.md): drain the deletion log.

For each due record, in this order:

1. **Malformed** (unreadable, missing essentials, unparsable topic) → dead-letter with the reason, never
   retried.
2. **Still in use**, checked against the *current* topic record (read once per topic per drain call; a
   ledger that left a topic never comes back, a replaced offload uuid never becomes current again and
   ``bookkeeperDeleted`` is never cleared, so "not in use" cannot turn into "in use" meanwhile):

   - ``ledger``: the topic exists, lists the ledger, and its hot copy is still the one the topic relies
     on, i.e. not (offloaded and ``bookkeeperDeleted``; offloaded: a complete V1 offload, or every entry
     in completed PIP-76 segments);
   - ``offloaded``: the topic exists, lists the ledger and the record's uuid is the ledger's current
     OffloadContext uuid (complete or in flight), or the record names the topic's compacted ledger and its
     uuid (topic compaction: docs/topic-compaction.md);
   - ``segment``: the topic exists and some ledger's offload segments name the uuid.

   In use → acknowledged, nothing deleted (counter ``still_in_use``). A topic record that cannot be read
   counts as in use — what it references is unknown, and deleting the only copy of data needs proof: the
   record stays in the log untouched (due again next drain) and the row is ``unreadable_topic``, a failure
   of the run naming the record's path and why it cannot be read. Cursor and schema ledgers are not
   tracked by this project's metadata, so their use cannot be checked while the topic exists: such
   records are dead-lettered for an operator instead of being deleted blindly.
3. **Ownership**: ``ledger`` records are checked against the hot ledger's custom metadata
   (``application`` / ``component`` / ``pulsar/managed-ledger``, plus ``pulsar/cursor`` or
   ``pulsar/schemaId``). Object records are checked against the ``managedledgername`` user metadata
   the offloader writes on its objects, when the object exists and carries it (a stricter reading of
   PIP-186: a forged ``offloaded`` record naming another topic's ledger id and uuid would otherwise pass
   the in-use check of the wrong topic). A mismatch → nothing deleted, acknowledged (``refused_mismatch``).
   Every existing object is also checked against this workspace's cluster and identity
   (tieredcore.offload.ownership): an object another cluster or another workspace of this cluster wrote
   (a shared bucket) is never deleted, whatever the record says → acknowledged (``refused_foreign``).
4. **Delete**, idempotently. Hot: ``delete_ledger``; a hot ledger that is already gone is a success
   (outcome ``already_deleted``: acknowledged, ``deleted_hot`` not incremented — nothing was deleted by
   this run). Objects: per object store (one store object per driver metadata), one listing of
   unfinished multipart uploads per key prefix, aborts of those belonging to the records' data keys,
   then **one** ``store.delete(keys)`` call holding every key of the batch (S3 splits it into
   DeleteObjects requests of 1000). A BlobStoreError that names keys fails only the records owning
   them; one that names none (or is truncated) fails the whole batch.
   Records of orphan reconciliation (reason ``orphan``) are checked once more right before their objects
   go (before any upload is aborted): the topic's ManagedLedgerInfo is read again from the metadata store
   (not the copy read in step 2), and for a record naming no topic (objects without ``managedledgername``)
   every topic's; a uuid referenced again (any ledger's offload context, complete or not, its segments,
   abandoned or replacement attempts) → nothing deleted, acknowledged as ``still_in_use`` with "referenced
   again" (counter ``referenced_again`` of the report); a record that cannot be read → kept
   (``unreadable_topic``). On a workspace attached to a Pulsar cluster this is what stands between a
   broker that re-referenced an object and its deletion.
5. Success → acknowledge (``deleted_hot`` / ``deleted_offloaded``). Failure → :meth:`DeletionLog.retry`
   (exponential backoff from ``delay_ms``; dead-letter once ``max_attempts`` is reached), counting
   ``delete_failures_hot`` / ``delete_failures_offloaded``.

Every log change is a CAS on the entry's version, so several drains may run over the same records: each
may delete (idempotent), only one acknowledgement lands; the others report ``lost_race``. Counters are
added by the change that landed only, so they count every record once.

Known window, inherent to the protocol: a record appended by phase 1 and drained before phase 1's
metadata update lands is acknowledged as "still in use"; the storage it named then leaks until orphan
reconciliation turns it into a fresh record.
"""

from __future__ import annotations

import logging
import uuid as uuidlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tieredcore.cold.blob import BlobStore
from tieredcore.cold.transformed import TransformedBlobStore
from tieredcore.errors import (
    BlobStoreError,
    HotLedgerNotFoundError,
    NoSuchObjectError,
    StoreUnavailableError,
    TopicNotFoundError,
    UnreadableRecordError,
    ValidationError,
)
from tieredcore.formats.keys import (
    data_key,
    group_keys,
    index_key,
    segment_data_key,
    segment_index_key,
    sidecar_of,
    topic_manifest_key,
    topic_manifests_prefix,
)
from tieredcore.lifecycle.drain_report import DETAIL_SCHEMA, OUTCOMES, DrainReport, DrainRow
from tieredcore.meta.deletion_log import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_RETRY_DELAY_MS,
    STATE_DEAD,
    STATE_RETRYING,
    TYPE_LEDGER,
    TYPE_MANIFEST,
    TYPE_OFFLOADED,
    TYPE_SEGMENT,
    DeletionLog,
    DeletionRecord,
    Entry,
)
from tieredcore.meta.managed_ledgers import find_ledger
from tieredcore.meta.reasons import Reason
from tieredcore.names import TopicName
from tieredcore.offload.compacted_state import compacted_uuids, names_compacted
from tieredcore.offload.context import (
    add_referenced_uuids,
    context_uuid,
    driver_dict,
    driver_metadata_from_dict,
    is_offloaded,
    segment_uuids,
)
from tieredcore.offload.offloader import LedgerOffloader
from tieredcore.offload.ownership import foreign_reason
from tieredcore.outcomes import Outcome
from tieredcore.workspace import Workspace

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_RETRY_DELAY_MS",
    "OUTCOMES",
    "DrainReport",
    "DrainRow",
    "DETAIL_SCHEMA",
    "drain",
    "driver_dict",
    "driver_metadata_from_dict",
    "failed_keys",
]


OWNER_METADATA_KEY = "managedledgername"  # user metadata the offloader writes on its objects
# tieredcore.lifecycle.reconcile.orphans.UNKNOWN_TOPIC: an orphan record whose objects named no topic
UNKNOWN_TOPIC = "__orphan__/unknown/persistent/unknown"


# -- helpers --------------------------------------------------------------------------------------


def failed_keys(error: BaseException, keys: Sequence[str]) -> set[str]:
    """The keys a batch-delete error names as failed; every key when it names none or is truncated.

    Both stores name failed keys as ``'<key>' (<reason>)``, at most 20 of them, then `` ...``; a
    BlobStoreError that carries its failed keys (``failed_keys``) is taken at its word instead."""
    explicit = error.failed_keys if isinstance(error, BlobStoreError) else None
    if explicit is not None:
        return set(explicit) & set(keys) or set(keys)
    msg = str(error)
    if msg.rstrip().endswith("..."):
        return set(keys)
    named = {k for k in keys if f"{k!r} (" in msg}
    return named or set(keys)


class _Refused(Exception):
    """Ownership check failed: delete nothing, acknowledge."""


class _Foreign(Exception):
    """The objects were written by another cluster or workspace: delete nothing, acknowledge."""


class _Unsupported(Exception):
    """Cannot decide safely: dead-letter for an operator."""


def _text(v: bytes | str | None) -> str | None:
    if v is None:
        return None
    return v.decode("utf-8", "replace") if isinstance(v, bytes | bytearray) else str(v)


def _hot_mismatch(rec: DeletionRecord, ml_name: str, custom: Mapping[str, bytes]) -> str | None:
    """Why the hot ledger's custom metadata does not match the record (None: it matches)."""
    if rec.component == "schema":
        expected = {"application": "pulsar", "component": "schema", "pulsar/schemaId": rec.schema_id}
        absent: tuple[str, ...] = ()
    else:
        expected = {"application": "pulsar", "component": "managed-ledger", "pulsar/managed-ledger": ml_name}
        if rec.component == "cursor":
            expected["pulsar/cursor"] = rec.cursor
            absent = ()
        else:
            absent = ("pulsar/cursor",)  # a cursor ledger is not the topic's data ledger
    problems = []
    for k, want in expected.items():
        got = _text(custom.get(k))
        if got != want:
            problems.append(f"{k}={got!r} (record: {want!r})")
    for k in absent:
        if k in custom:
            problems.append(f"{k}={_text(custom[k])!r} present")
    return "custom metadata mismatch: " + ", ".join(problems) if problems else None


def _in_use(rec: DeletionRecord, uuid: str, info) -> str | None:
    """Why the storage the record names is still in use by the topic record `info` (None: it is not;
    `info` None: the topic does not exist)."""
    if info is None or rec.type == TYPE_MANIFEST:
        return None  # a manifest is recorded only once newer ones superseded it: nothing reads it
    if rec.component != "managed-ledger":
        raise _Unsupported(f"topic exists and {rec.component} ledgers are not tracked here: "
                           "cannot check whether the ledger is still in use")
    if rec.type == TYPE_SEGMENT:
        if any(uuid in segment_uuids(li) for li in info.ledgerInfo):
            return f"segment {uuid} is still referenced by the topic"
        return None
    if rec.type != TYPE_LEDGER and names_compacted(info, rec.ledger_id, uuid):
        return f"uuid {uuid} is the topic's compacted ledger {rec.ledger_id}"
    li = find_ledger(info, rec.ledger_id)
    if li is None:
        return None
    if rec.type == TYPE_LEDGER:
        # complete: a V1 offload, or every entry in completed segments (PIP-76)
        if is_offloaded(li) and li.offloadContext.bookkeeperDeleted:
            return None
        return "ledger is listed and the topic still relies on its hot copy"
    if context_uuid(li) == uuid:
        state = "complete" if li.offloadContext.complete else "in flight"
        return f"uuid {uuid} is the ledger's current offload ({state})"
    return None


@dataclass
class _ObjectJob:
    entry: Entry
    row: DrainRow
    keys: list[str]
    data_key: str
    existed: bool


@dataclass
class _Batch:
    store: BlobStore
    prefixes: set[str] = field(default_factory=set)
    jobs: list[_ObjectJob] = field(default_factory=list)


class _Drain:
    def __init__(self, ws: Workspace, as_of_ms: int, delay_ms: int, max_attempts: int, dry_run: bool,
                 check_object_owner: bool) -> None:
        self.ws = ws
        self.log = DeletionLog(ws.metadata)
        self.as_of_ms = as_of_ms
        self.delay_ms = delay_ms
        self.max_attempts = max_attempts
        self.dry_run = dry_run
        self.check_object_owner = check_object_owner
        self.identity = ws.identity_if_any() or ""  # no identity yet: objects naming one are not ours
        self.report = DrainReport(as_of_ms, dry_run)
        self._topics: dict[str, Any] = {}
        self._unreadable: dict[str, UnreadableRecordError] = {}
        self._batches: dict[int, _Batch] = {}
        # consecutive object-store failures: once spent, the rest of the object records are not attempted
        self.budget = ws.failure_budget()

    # -- outcomes

    def _set(self, row: DrainRow, outcome: str, error: str = "") -> None:
        row.outcome = outcome
        if error:
            row.error = error[:2000]
        setattr(self.report, outcome, getattr(self.report, outcome) + 1)
        self.report.rows.append(row)

    def _ack(self, entry: Entry, row: DrainRow, outcome: str, note: str = "", **counters: int) -> None:
        if self.dry_run:
            self._set(row, Outcome.WOULD_DELETE if outcome == Outcome.DELETED else outcome, note)
            return
        if outcome == Outcome.STILL_IN_USE:
            counters["still_in_use"] = 1
        elif outcome == Outcome.REFUSED_MISMATCH:
            counters["refused_mismatch"] = 1
        elif outcome == Outcome.REFUSED_FOREIGN:
            counters["refused_foreign"] = 1
        if not self.log.ack(entry, **counters):
            self._set(row, Outcome.LOST_RACE, note)
            return
        self.report.acknowledged += 1
        for k in ("deleted_hot", "deleted_offloaded"):
            setattr(self.report, k, getattr(self.report, k) + counters.get(k, 0))
        self._set(row, outcome, note)

    def _dead(self, entry: Entry, row: DrainRow, outcome: str, reason: str) -> None:
        if self.dry_run:
            self._set(row, outcome, reason)
            return
        counters = {"malformed": 1} if outcome == Outcome.MALFORMED else {}
        moved = self.log.dead_letter(entry, reason, **counters)
        self._set(row, outcome if moved else Outcome.LOST_RACE, reason)

    def _fail(self, entry: Entry, row: DrainRow, error: str) -> None:
        if self.dry_run:
            self._set(row, Outcome.RETRYING, error)
            return
        counter = "delete_failures_hot" if row.type == TYPE_LEDGER else "delete_failures_offloaded"
        state = self.log.retry(entry, error, self.as_of_ms, delay_ms=self.delay_ms,
                               max_attempts=self.max_attempts, **{counter: 1})
        if state:
            setattr(self.report, counter, getattr(self.report, counter) + 1)
        outcome = {STATE_RETRYING: Outcome.RETRYING, STATE_DEAD: Outcome.DEAD_LETTERED}.get(state, Outcome.LOST_RACE)
        log.warning("deletion %s (%s ledger %s of %s): %s → %s", entry.id, row.type, row.ledger, row.topic,
                    error, outcome)
        self._set(row, outcome, error)

    # -- per entry

    def _topic_info(self, t: TopicName):
        """The topic's current record (None: no such topic), read once per drain; UnreadableRecordError
        (remembered too) when it cannot be decoded."""
        name = t.managed_ledger_name
        if name in self._unreadable:
            raise self._unreadable[name]
        if name not in self._topics:
            try:
                self._topics[name] = self.ws.ml.get_topic(t)[0]
            except TopicNotFoundError:
                self._topics[name] = None
            except UnreadableRecordError as e:
                self._unreadable[name] = e
                raise
        return self._topics[name]

    def process(self, entry: Entry) -> None:
        self.report.entries += 1
        rec = entry.record
        if rec is None:
            self._dead(entry, DrainRow(entry.id, "", -1, "", "", ""), Outcome.MALFORMED,
                       entry.error or "malformed record")
            return
        row = DrainRow(entry.id, rec.topic, rec.ledger_id, rec.type, rec.reason, "")
        try:
            t = TopicName.parse(rec.topic)
            uuid = str(uuidlib.UUID(rec.uuid)) if rec.type in (TYPE_OFFLOADED, TYPE_SEGMENT) else ""
        except (ValidationError, ValueError) as e:
            self._dead(entry, row, Outcome.MALFORMED, f"malformed record: {e}")
            return
        try:
            info = self._topic_info(t)
            why = _in_use(rec, uuid, info)
        except _Unsupported as e:
            self._dead(entry, row, Outcome.DEAD_LETTERED, str(e))
            return
        except UnreadableRecordError as e:  # in use as far as anyone can tell: keep the record as it is
            log.warning("deletion %s kept: %s", entry.id, e)
            self._set(row, Outcome.UNREADABLE_TOPIC, f"{e}: taken as still in use, nothing deleted, record kept")
            return
        except Exception as e:  # metadata store down: cannot decide now
            self._fail(entry, row, f"reading topic {t.managed_ledger_name}: {type(e).__name__}: {e}")
            return
        if why is not None:
            self._ack(entry, row, Outcome.STILL_IN_USE, why)
            return
        if rec.type == TYPE_LEDGER:
            self._hot(entry, row, rec, t)
        elif self.budget.exhausted:
            self._set(row, Outcome.ABORTED, self.budget.reason)
        else:
            self._plan_objects(entry, row, rec, t, uuid)

    def _hot(self, entry: Entry, row: DrainRow, rec: DeletionRecord, t: TopicName) -> None:
        try:
            meta = self.ws.hot.ledger_metadata(rec.ledger_id)
        except HotLedgerNotFoundError:
            self._ack(entry, row, Outcome.ALREADY_DELETED, "hot ledger does not exist")
            return
        except Exception as e:
            self._fail(entry, row, f"reading hot ledger metadata: {type(e).__name__}: {e}")
            return
        mismatch = _hot_mismatch(rec, t.managed_ledger_name, meta.custom_metadata)
        if mismatch is not None:
            log.warning("deletion %s refused: ledger %s: %s", entry.id, rec.ledger_id, mismatch)
            self._ack(entry, row, Outcome.REFUSED_MISMATCH, mismatch)
            return
        if self.dry_run:
            self._set(row, Outcome.WOULD_DELETE)
            return
        try:
            self.ws.hot.delete_ledger(rec.ledger_id)
        except Exception as e:
            self._fail(entry, row, f"deleting hot ledger: {type(e).__name__}: {e}")
            return
        self._ack(entry, row, Outcome.DELETED, deleted_hot=1)

    def _plan_objects(self, entry: Entry, row: DrainRow, rec: DeletionRecord, t: TopicName, uuid: str) -> None:
        try:
            off: LedgerOffloader = self.ws.offloader_for_driver(driver_metadata_from_dict(rec.driver))
        except ValidationError as e:  # a driver this build cannot open: retrying will not help
            self._dead(entry, row, Outcome.DEAD_LETTERED, f"cannot open the record's object store: {e}")
            return
        except Exception as e:
            self._fail(entry, row, f"opening the record's object store: {type(e).__name__}: {e}")
            return
        if rec.type == TYPE_MANIFEST:  # one object, in the store's plain form (docs/recovery.md)
            self._plan_manifest(entry, row, rec, t, off)
            return
        if rec.type == TYPE_OFFLOADED:
            dkey, ikey = data_key(off.prefix, uuid, rec.ledger_id), index_key(off.prefix, uuid, rec.ledger_id)
        else:  # a streaming segment's objects
            dkey, ikey = segment_data_key(off.prefix, uuid), segment_index_key(off.prefix, uuid)
        def owned() -> bool:
            existed = self._check_owner(off.store, (dkey, ikey), t.managed_ledger_name)
            side = sidecar_of(dkey)
            if not existed and side is not None:  # a sidecar that outlived its pair (reconciliation found it)
                existed = self._check_owner(off.store, (side,), t.managed_ledger_name)
            return existed

        existed = self._owner_checked(entry, row, owned)
        if existed is None:
            return
        batch = self._batches.setdefault(id(off.store), _Batch(off.store))
        batch.prefixes.add(off.prefix)
        # the whole group: a ledger pair's entry-offsets sidecar and the manifests of transformed (chunked)
        # objects go with them (absent keys are fine)
        batch.jobs.append(_ObjectJob(entry, row, group_keys(dkey, ikey), dkey, existed))

    def _owner_checked(self, entry: Entry, row: DrainRow, check: Callable[[], bool]) -> bool | None:
        """Whether the record's objects exist (``check``: the ownership check); None when the row is settled
        here instead: refused (foreign or mismatched), aborted (the store is dead: not an attempt of this
        record), failed, or a dry run's answer."""
        try:
            existed = check()
        except (_Foreign, _Refused) as e:
            log.warning("deletion %s refused: %s", entry.id, e)
            self._ack(entry, row, Outcome.REFUSED_FOREIGN if isinstance(e, _Foreign) else Outcome.REFUSED_MISMATCH,
                      str(e))
            return None
        except Exception as e:
            self.budget.record(type(e).__name__, str(e))
            if isinstance(e, StoreUnavailableError):
                self._set(row, Outcome.ABORTED, str(e))
            else:
                self._fail(entry, row, f"checking object ownership: {type(e).__name__}: {e}")
            return None
        self.budget.record("")
        if self.dry_run:
            self._set(row, Outcome.WOULD_DELETE if existed else Outcome.ALREADY_DELETED)
            return None
        return existed

    def _plan_manifest(self, entry: Entry, row: DrainRow, rec: DeletionRecord, t: TopicName,
                       off: LedgerOffloader) -> None:
        store = off.store.inner if isinstance(off.store, TransformedBlobStore) else off.store
        key = topic_manifest_key(off.prefix, self.ws.config.cluster, t.managed_ledger_name, rec.ledger_id)
        existed = self._owner_checked(entry, row, lambda: self._check_owner(store, (key,), t.managed_ledger_name))
        if existed is None:
            return
        batch = self._batches.setdefault(id(store), _Batch(store))
        batch.prefixes.add(topic_manifests_prefix(off.prefix, self.ws.config.cluster, t.managed_ledger_name))
        batch.jobs.append(_ObjectJob(entry, row, [key], key, existed))

    def _check_owner(self, store: BlobStore, keys: Iterable[str], ml_name: str) -> bool:
        """False when no object exists. Every existing object must be this cluster's and workspace's
        (else _Foreign) and, with ``check_object_owner``, name the record's topic (else _Refused)."""
        existed = False
        for k in keys:
            try:
                info = store.head(k)
            except NoSuchObjectError:
                continue
            existed = True
            why = foreign_reason(info.metadata, self.ws.config.cluster, self.identity)
            if why is not None:
                raise _Foreign(f"object {k} is not ours: {why}")
            owner = info.metadata.get(OWNER_METADATA_KEY)
            if self.check_object_owner and owner is not None and owner != ml_name:
                raise _Refused(f"object {k} belongs to {owner!r}, record names {ml_name!r}")
        return existed

    # -- per object store

    def run_batches(self) -> None:
        for batch in self._batches.values():
            self._run_batch(batch)
        self._batches.clear()

    def _recheck_orphans(self, jobs: list[_ObjectJob]) -> list[_ObjectJob]:
        """The jobs whose objects may go now: orphan records' uuids checked against the metadata store read
        again now, record by record (module docstring, step 4); the others are acknowledged or kept."""
        keep: list[_ObjectJob] = []
        every_topic: set[str] | None = None  # for records naming no topic: read once, right now
        for j in jobs:
            rec = j.entry.record
            if rec is None or rec.reason != Reason.ORPHAN:
                keep.append(j)
                continue
            uuid = str(uuidlib.UUID(rec.uuid))
            try:
                if rec.topic == UNKNOWN_TOPIC:
                    if every_topic is None:
                        every_topic = self._every_reference()
                    where = "a topic's ManagedLedgerInfo" if uuid in every_topic else None
                else:
                    t = TopicName.parse(rec.topic)
                    info = self.ws.ml.get_topic(t)[0]  # fresh: not the copy _topic_info keeps
                    refs: set[str] = compacted_uuids(info)
                    for li in info.ledgerInfo:
                        add_referenced_uuids(li, refs)
                    where = f"the ManagedLedgerInfo of {t.managed_ledger_name}" if uuid in refs else None
            except TopicNotFoundError:
                where = None
            except UnreadableRecordError as e:
                self._set(j.row, Outcome.UNREADABLE_TOPIC, f"{e}: re-read before deleting; taken as still in use, "
                                                           "nothing deleted, record kept")
                continue
            except Exception as e:
                self._fail(j.entry, j.row, f"re-reading topic records before deleting: {type(e).__name__}: {e}")
                continue
            if where is None:
                keep.append(j)
                continue
            self.report.referenced_again += 1
            log.warning("deletion %s skipped: uuid %s referenced again by %s", j.entry.id, uuid, where)
            self._ack(j.entry, j.row, Outcome.STILL_IN_USE, f"referenced again: uuid {uuid} by {where} (re-read "
                                                             "right before deleting); nothing deleted")
        return keep

    def _every_reference(self) -> set[str]:
        """Every uuid any topic's record references, read now (UnreadableRecordError if one cannot be read:
        it may reference the uuid)."""
        out: set[str] = set()
        ml = self.ws.ml
        for ns in ml.list_namespaces():
            for t in ml.list_topics(ns):
                try:
                    info = ml.get_topic(t)[0]
                except TopicNotFoundError:
                    continue
                out |= compacted_uuids(info)
                for li in info.ledgerInfo:
                    add_referenced_uuids(li, out)
        return out

    def _run_batch(self, batch: _Batch) -> None:
        store = batch.store
        batch.jobs = self._recheck_orphans(batch.jobs)
        if not batch.jobs:
            return
        by_data_key: dict[str, list[_ObjectJob]] = {}
        for j in batch.jobs:
            by_data_key.setdefault(j.data_key, []).append(j)
        failed: dict[int, str] = {}  # id(job) -> error
        try:
            # attached to a Pulsar cluster: the brokers' uploads are neither listed nor aborted (the bucket
            # grants list, get and delete only; docs/pulsar.md)
            uploads = [] if self.ws.attached else [u for p in sorted(batch.prefixes)
                                                   for u in store.list_multipart_uploads(p) if u.key in by_data_key]
        except Exception as e:
            for j in batch.jobs:
                if isinstance(e, StoreUnavailableError):  # dead: not an attempt of these records
                    self._set(j.row, Outcome.ABORTED, str(e))
                else:
                    self._fail(j.entry, j.row, f"listing multipart uploads: {type(e).__name__}: {e}")
            return
        aborted: set[str] = set()
        for up in uploads:
            try:
                store.abort_multipart(up.key, up.upload_id)
                aborted.add(up.key)
            except Exception as e:
                for j in by_data_key[up.key]:
                    failed[id(j)] = f"aborting upload {up.upload_id} of {up.key}: {type(e).__name__}: {e}"
        todo = [j for j in batch.jobs if id(j) not in failed]
        keys = list(dict.fromkeys(k for j in todo for k in j.keys))
        if keys:
            try:
                store.delete(keys)
            except BlobStoreError as e:
                bad = failed_keys(e, keys)
                for j in todo:
                    if bad.intersection(j.keys):
                        failed[id(j)] = f"deleting objects: {e}"
            except Exception as e:
                for j in todo:
                    failed[id(j)] = f"deleting objects: {type(e).__name__}: {e}"
        for j in batch.jobs:
            if id(j) in failed:
                self._fail(j.entry, j.row, failed[id(j)])
            elif j.existed or j.data_key in aborted:
                self._ack(j.entry, j.row, Outcome.DELETED, deleted_offloaded=1)
            else:
                self._ack(j.entry, j.row, Outcome.ALREADY_DELETED, "no object existed")


def drain(
    ws: Workspace,
    as_of_ms: int,
    *,
    entries: Iterable[Entry] | None = None,
    delay_ms: int = DEFAULT_RETRY_DELAY_MS,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    limit: int | None = None,
    dry_run: bool = False,
    check_object_owner: bool = True,
) -> DrainReport:
    """Process `entries` (a Spark partition's share), or every record due at `as_of_ms`, per docs/deletion.md
    phase 2. `dry_run` classifies (in use / mismatch / would delete) without deleting or changing the
    log. Returns the run's report (per-outcome counts, the counters it added, one row per record)."""
    if delay_ms < 0:
        raise ValidationError(f"delay_ms must be >= 0, got {delay_ms}")
    if max_attempts < 1:
        raise ValidationError(f"max_attempts must be >= 1, got {max_attempts}")
    if limit is not None and limit < 0:
        raise ValidationError(f"limit must be >= 0, got {limit}")
    d = _Drain(ws, as_of_ms, delay_ms, max_attempts, dry_run, check_object_owner)
    if entries is None:
        todo = d.log.due(as_of_ms, limit)
    else:
        todo = list(entries)
        if limit is not None:
            todo = todo[:limit]
    for e in todo:
        d.process(e)
    d.run_batches()
    r = d.report
    log.info("deletion drain as of %s%s: %s", as_of_ms, " (dry run)" if dry_run else "",
             {k: v for k, v in r.counts().items() if v})
    return r
