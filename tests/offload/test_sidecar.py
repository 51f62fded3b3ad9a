"""Entry-offsets sidecars beside Pulsar-written object pairs (tieredcore.offload.sidecar; docs/formats.md
"Entry offsets sidecar"): recorded by the first full read or verification, used by later random reads
(at most 2 GETs each, counted by the stores' request counting against moto's S3 server and the filesystem
store), ignored with a log line when missing, stale or damaged, never returning a wrong byte.

The Pulsar-written pairs are built by tests/support/pulsar_objects.py the way Pulsar's
BlobStoreManagedLedgerOffloader / BlockAwareSegmentInputStreamImpl / OffloadIndexBlockImpl write them: one
data object of blocks and the V1 index with no trailer."""

from __future__ import annotations

import logging
import random
import struct
import uuid as uuidlib
from pathlib import Path

import pytest

from tests.support import pulsar_objects
from tieredcore.cold.backends.fs import FilesystemBlobStore
from tieredcore.cold.requests import count_requests
from tieredcore.cold.transformed import TransformedBlobStore
from tieredcore.errors import BlobStoreError, NoSuchObjectError
from tieredcore.formats import constants as C
from tieredcore.formats.index import index_trailer
from tieredcore.formats.keys import offsets_key
from tieredcore.formats.offsets import PairIdentity, decode_offsets, encode_offsets
from tieredcore.formats.transform import TransformSpec
from tieredcore.hot.local import LocalLedgerStore
from tieredcore.offload.cache import OffsetCache
from tieredcore.offload.offloader import LedgerOffloader
from tieredcore.offload.sidecar import MAX_WRITE_FAILURES, Permit
from tieredcore.offload.verify import verify_offloaded

LID = 3
KIB = 1024
READ_BUFFER = 64 * KIB


def payload(i: int, size: int = KIB) -> bytes:
    head = f"<{i}>".encode()
    return (head * (size // len(head) + 1))[:size]


PAYLOADS = [payload(i, KIB - (i % 7) * 40) for i in range(2000)]  # ~2 MB in one block, sizes vary


def allow(_md) -> Permit:
    return Permit(owner="me")


def reader(store, **kw) -> LedgerOffloader:
    """A reading offloader with this project's defaults (8 KiB checkpoints) that may write sidecars."""
    opts = {"read_buffer": READ_BUFFER, "offset_cache": OffsetCache(), "sidecar_permit": allow, **kw}
    return LedgerOffloader(store, **opts)


def pulsar_pair(store, payloads=PAYLOADS, max_block: int = 64 * 1024 * 1024, ledger_id: int = LID):
    pair = pulsar_objects.build(payloads, max_block, ledger_id=ledger_id)
    pulsar_objects.write(store, pair)
    return pair


def full_read(h, step: int = 500) -> None:
    for first in range(0, h.last_add_confirmed + 1, step):
        got = h.read_batch(first, min(first + step - 1, h.last_add_confirmed))
        assert got.first_entry == first


def random_gets(h, payloads, n: int = 20, seed: int = 7) -> list[int]:
    """GETs of each of ``n`` random single-entry reads (the bytes checked)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        e = rng.randrange(len(payloads))
        with count_requests() as c:
            [got] = h.read(e, e)
        assert got.entry_id == e and bytes(got.data) == payloads[e]
        out.append(c.total()["GET"])
    return out


def test_the_support_writer_writes_what_pulsars_offloader_writes(tmp_path: Path) -> None:
    """The data object is byte for byte what this project's writer produces with its trailer off (which
    docs/formats.md documents as Pulsar's layout); the index is Pulsar's: no bytes after the entries."""
    hot = LocalLedgerStore(tmp_path / "hot")
    w = hot.create_ledger({"application": b"pulsar"})
    w.append_many(PAYLOADS[:700])
    w.close()
    store = FilesystemBlobStore(tmp_path / "cold")
    u = str(uuidlib.uuid4())
    LedgerOffloader(store, max_block_size=64 * KIB, checkpoint_interval=0, checksum_chunk=0).offload(
        hot.open_ledger(w.ledger_id), u)
    pair = pulsar_objects.build(PAYLOADS[:700], 64 * KIB, ledger_id=w.ledger_id, uuid=u)
    assert pair.blocks > 5 and store.get(pair.data_key) == pair.data
    mine = store.get(pair.index_key)
    assert mine[:8] != pair.index[:8]  # (the ledger metadata inside differs: this project names the ledger)
    assert mine[8:28] == pair.index[8:28] and mine[-20 * pair.blocks:] == pair.index[-20 * pair.blocks:]
    assert struct.unpack_from(">i", pair.index, 4)[0] == len(pair.index)  # no trailer


@pytest.mark.parametrize("blob_store", ["fs", "s3"], indirect=True)
def test_random_reads_after_a_full_read_take_at_most_two_gets(blob_store, caplog) -> None:
    caplog.set_level(logging.DEBUG, "tieredcore.offload.sidecar")
    pair = pulsar_pair(blob_store)
    off = reader(blob_store)
    h = off.read_offloaded(LID, pair.uuid)
    assert h.sidecar is not None
    with count_requests() as before:
        before_gets = random_gets(h, PAYLOADS)
    # no sidecar yet: the reads walk the 2 MB block (many GETs on a local store; on S3 the first read
    # fetches a whole stream window, here the whole object, which later reads find cached)
    assert max(before_gets) > 2 or h.bytes_fetched > len(pair.data) // 2
    assert "no entry-offsets sidecar" in caplog.text and before.total()["PUT"] == 0
    h.close()

    h = off.read_offloaded(LID, pair.uuid)
    full_read(h)  # the first full read records it, in the background
    h.sidecar.wait()
    assert h.sidecar.written
    info = blob_store.head(offsets_key("", pair.uuid, LID))
    assert info.metadata["role"] == "offsets" and info.metadata["tieredowner"] == "me"
    assert info.metadata["pulsarclustername"] == "standalone"
    assert C.METADATA_FORMAT_VERSION_KEY not in info.metadata  # not an object Pulsar reads
    assert blob_store.get(pair.data_key) == pair.data and blob_store.get(pair.index_key) == pair.index

    off = reader(blob_store)  # a new process: no offsets cached
    h = off.read_offloaded(LID, pair.uuid)
    fetched0 = h.bytes_fetched
    gets = random_gets(h, PAYLOADS)
    assert h.sidecar.requests == 1  # loaded once, by the first read
    gets[0] -= 1
    assert max(gets) <= 2, gets
    assert h.bytes_fetched - fetched0 < 20 * (3 * C.DEFAULT_CHECKPOINT_INTERVAL)


def test_a_deep_verification_records_the_checkpoints_the_offloader_writes(tmp_path: Path) -> None:
    """verify_offloaded (scrub, tiered verify) records the sidecar at once, walked or cut by the hot
    copy's sizes, and its checkpoints are exactly those of this project's own index trailer."""
    hot = LocalLedgerStore(tmp_path / "hot")
    w = hot.create_ledger({"application": b"pulsar"})
    w.append_many(PAYLOADS)
    w.close()
    hh = hot.open_ledger(w.ledger_id)
    own_store = FilesystemBlobStore(tmp_path / "own")
    LedgerOffloader(own_store, max_block_size=256 * KIB).offload(hh, "0badcafe-0000-4000-8000-000000000001")
    own = LedgerOffloader(own_store).read_offloaded(w.ledger_id, "0badcafe-0000-4000-8000-000000000001")
    trailer = index_trailer(own.index)
    want = list(zip(trailer.checkpoint_ids, trailer.checkpoint_offsets, strict=True))
    assert len(want) > 100

    for i, hot_args in enumerate(((None, None), (hh.entry_crcs(), hh.entry_sizes()))):
        store = FilesystemBlobStore(tmp_path / f"cold{i}")
        pair = pulsar_pair(store, PAYLOADS, 256 * KIB, ledger_id=w.ledger_id)
        h = reader(store).read_offloaded(w.ledger_id, pair.uuid)
        rep = verify_offloaded(h, hot_args[0], expected_sizes=hot_args[1])
        assert rep.entries == len(PAYLOADS) and h.sidecar.written and h.sidecar.pending is None
        got = decode_offsets(store.get(offsets_key("", pair.uuid, w.ledger_id)))
        assert list(zip(got.ids, got.offsets, strict=True)) == want
        assert got.identity.object_length == len(pair.data) and got.interval == C.DEFAULT_CHECKPOINT_INTERVAL


def _corrupt(store, pair) -> None:
    key = offsets_key("", pair.uuid, LID)
    raw = bytearray(store.get(key))
    raw[70] ^= 1
    store.put(key, bytes(raw))


def _stale(store, pair) -> None:
    other = PairIdentity(str(uuidlib.uuid4()), LID, len(pair.data), len(PAYLOADS) - 1, 0)
    store.put(offsets_key("", pair.uuid, LID), encode_offsets(other, 8192, [(100, 100 * 1036)]))


def _wrong_offsets(store, pair) -> None:
    """Well formed, this pair's identity, checksummed: but every checkpoint one byte off its frame."""
    key = offsets_key("", pair.uuid, LID)
    good = decode_offsets(store.get(key))
    store.put(key, encode_offsets(good.identity, good.interval, [(e, o + 1) for e, o in zip(good.ids, good.offsets,
                                                                                             strict=True)]))


@pytest.mark.parametrize(("spoil", "logged"), [
    (_corrupt, "fails its CRC32C"), (_stale, "is stale: it describes uuid"),
    (_wrong_offsets, "no frame of entry"), (lambda s, p: s.delete([offsets_key("", p.uuid, LID)]), ""),
])
def test_an_unusable_sidecar_is_ignored_and_reads_stay_right(fs_store, caplog, spoil, logged) -> None:
    pair = pulsar_pair(fs_store)
    h = reader(fs_store).read_offloaded(LID, pair.uuid)
    full_read(h)
    h.sidecar.wait()
    spoil(fs_store, pair)
    caplog.clear()
    h = reader(fs_store, sidecar_permit=None).read_offloaded(LID, pair.uuid)
    rng = random.Random(3)
    for e in [rng.randrange(len(PAYLOADS)) for _ in range(30)] + [0, len(PAYLOADS) - 1]:
        assert [bytes(x.data) for x in h.read(e, min(e + 2, len(PAYLOADS) - 1))] == PAYLOADS[e:e + 3]
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    if logged:
        assert any(logged in m for m in warnings), warnings
        assert h.sidecar.checkpoints() is None
    else:
        assert warnings == []


def test_nothing_is_written_without_a_permit(fs_store, caplog) -> None:
    caplog.set_level(logging.INFO, "tieredcore.offload.sidecar")
    pairs = [pulsar_pair(fs_store, ledger_id=lid) for lid in (1, 2)]
    refusals = []

    def refuse(md) -> Permit:
        refusals.append(md)
        return Permit(refusal="the store belongs to someone else")

    for off in (reader(fs_store, sidecar_permit=None), reader(fs_store, sidecar_permit=refuse)):
        with count_requests() as c:
            for p in pairs:
                h = off.read_offloaded(p.ledger_id, p.uuid)
                full_read(h)
                if h.sidecar.pending is not None:
                    h.sidecar.wait()
                assert not h.sidecar.written
        assert c.total()["PUT"] == 0
    assert len(refusals) == 2 and refusals[0]["pulsarclustername"] == "standalone"
    assert caplog.text.count("the store belongs to someone else") == 1  # once per reason
    assert sorted(o.key for o in fs_store.list().objects) == sorted(k for p in pairs for k in (p.data_key,
                                                                                               p.index_key))


def test_this_projects_own_objects_never_look_for_a_sidecar(fs_store, tmp_path: Path) -> None:
    hot = LocalLedgerStore(tmp_path / "hot")
    w = hot.create_ledger({"application": b"pulsar"})
    w.append_many(PAYLOADS)
    w.close()
    LedgerOffloader(fs_store).offload(hot.open_ledger(w.ledger_id), "0badcafe-0000-4000-8000-000000000002")
    h = reader(fs_store).read_offloaded(w.ledger_id, "0badcafe-0000-4000-8000-000000000002")
    assert h.sidecar is None
    with count_requests() as c:
        full_read(h)
        gets = random_gets(h, PAYLOADS)
    assert max(gets) <= 2 and c.total()["PUT"] == 0


def test_transformed_stores_get_no_sidecars(tmp_path: Path) -> None:
    """Every object there is this project's (Pulsar cannot write chunked objects): even one written without
    checkpoints is read as before, and nothing is written beside it."""
    store = TransformedBlobStore(FilesystemBlobStore(tmp_path / "cold"), TransformSpec("zstd"))
    hot = LocalLedgerStore(tmp_path / "hot")
    w = hot.create_ledger({"application": b"pulsar"})
    w.append_many(PAYLOADS)
    w.close()
    u = "0badcafe-0000-4000-8000-000000000003"
    LedgerOffloader(store, checkpoint_interval=0, checksum_chunk=0).offload(hot.open_ledger(w.ledger_id), u)
    off = reader(store)
    assert off.sidecar_writer is None
    h = off.read_offloaded(w.ledger_id, u)
    assert h.sidecar is None
    full_read(h)
    assert random_gets(h, PAYLOADS, 5)
    with pytest.raises(NoSuchObjectError):
        store.inner.head(offsets_key("", u, w.ledger_id))


class _ReadOnly:
    """A store whose writes are refused (a read-only credential)."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def put(self, key, data, metadata=None, *, if_absent=False):
        raise BlobStoreError(f"AccessDenied: PUT {key}")


def test_a_refused_write_never_fails_the_read(fs_store, caplog) -> None:
    pairs = [pulsar_pair(fs_store, ledger_id=lid) for lid in range(1, MAX_WRITE_FAILURES + 2)]
    off = reader(_ReadOnly(fs_store))
    for i, p in enumerate(pairs):
        h = off.read_offloaded(p.ledger_id, p.uuid)
        full_read(h)
        if h.sidecar.pending is not None:
            h.sidecar.wait()
        assert not h.sidecar.written
        assert h.sidecar.recording is False
        assert (off.sidecar_writer.failures, off.sidecar_writer.enabled) == (
            min(i + 1, MAX_WRITE_FAILURES), i + 1 < MAX_WRITE_FAILURES)
    assert "AccessDenied" in caplog.text and "no more sidecars are written by this process" in caplog.text


def test_only_a_whole_pass_records(fs_store) -> None:
    """Random reads in between are ignored; a pass that stops short writes nothing; the pass completed
    later by the same handle does."""
    pair = pulsar_pair(fs_store)
    h = reader(fs_store).read_offloaded(LID, pair.uuid)
    h.read_batch(0, 999)
    random_gets(h, PAYLOADS, 5)
    h.read_batch(1500, 1999)
    assert h.sidecar.pending is None and h.sidecar.recording
    h.read_batch(1000, 1499)  # not contiguous with the pass: ignored
    assert h.sidecar.pending is None
    h2 = reader(fs_store).read_offloaded(LID, pair.uuid)
    h2.read_batch(0, 1000)
    h2.read_batch(900, 1999)  # overlapping calls continue the pass
    h2.sidecar.wait()
    assert h2.sidecar.written


def test_deleting_the_pair_deletes_its_sidecar(fs_store) -> None:
    pair = pulsar_pair(fs_store)
    off = reader(fs_store)
    h = off.read_offloaded(LID, pair.uuid)
    full_read(h)
    h.sidecar.wait()
    assert len(fs_store.list().objects) == 3
    off.delete_offloaded(LID, pair.uuid)
    assert fs_store.list().objects == []


@pytest.mark.parametrize("delta", [-20, 4, 1000])
def test_an_index_length_field_pulsar_ignores_does_not_stop_a_read(tmp_path: Path, delta: int) -> None:
    """Pulsar's reader (OffloadIndexBlockImpl) ignores the index-length field's value; so does this
    reader's offloaded-index check (the parser's tolerance alone is tested in tests/fuzz): a pair whose
    field is off reads back and verifies. A planted bug that made the check strict again survived."""
    store = FilesystemBlobStore(tmp_path / "cold")
    pair = pulsar_objects.build(PAYLOADS[:300], 64 * KIB, ledger_id=LID)
    index = bytearray(pair.index)
    struct.pack_into(">i", index, 4, len(pair.index) + delta)
    pair = pulsar_objects.PulsarPair(**{**pair.__dict__, "index": bytes(index)})
    pulsar_objects.write(store, pair)
    h = LedgerOffloader(store, read_buffer=READ_BUFFER).read_offloaded(LID, pair.uuid)
    try:
        assert [bytes(e.data) for e in h.read(0, 299)] == PAYLOADS[:300]
        verify_offloaded(h, None, messages=False)
    finally:
        h.close()
