"""Length fields at extreme values must not make a decoder allocate: a few hundred bytes of input that
declare 2**31 entries, a 2 GiB metadata section, a 2**63-byte block, a 2 GiB uncompressed record or a
zstd frame of 4 GiB are refused (or decoded) within a small memory budget.

Python-level allocations are measured with tracemalloc (a bytes object of the declared size shows up
even when the kernel never backs its pages); a child process re-runs the in-memory cases under an
address-space limit, which also catches allocations inside C libraries.
"""

from __future__ import annotations

import contextlib
import os
import resource
import struct
import subprocess
import sys
import tracemalloc
import uuid as uuidlib
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest
import zstandard

from tieredcore.cold.backends.fs import FilesystemBlobStore
from tieredcore.errors import TieredError
from tieredcore.formats.block import block_header, decode_block, iter_data_object, scan_frames
from tieredcore.formats.index import IndexEntry, encode_index_v1, encode_index_v2, index_trailer, parse_index
from tieredcore.formats.ledger_metadata import decode_ledger_metadata
from tieredcore.formats.mlinfo import decode_managed_ledger_info
from tieredcore.formats.proto import MLDataFormats_pb2 as pb
from tieredcore.formats.trailer import parse_trailer
from tieredcore.hot.format import IDX_RECORD
from tieredcore.hot.local import LocalLedgerStore
from tieredcore.meta.deletion_log import DeletionRecord
from tieredcore.offload.cache import OffsetCache
from tieredcore.offload.offloader import LedgerOffloader
from tieredcore.offload.verify import verify_offloaded

from .strategies import HANG_TIMEOUT

pytestmark = pytest.mark.timeout(HANG_TIMEOUT)

BUDGET = 64 * 1024 * 1024
I32, I64 = 2**31 - 1, 2**63 - 1

_INFO = pb.ManagedLedgerInfo()
_INFO.ledgerInfo.add(ledgerId=1, entries=2, size=3)
_RAW = _INFO.SerializeToString()
_V1 = encode_index_v1(b"", 1000, [IndexEntry(0, 1, 0)])


def _framed(kind: int, declared: int, payload: bytes) -> bytes:
    meta = pb.ManagedLedgerInfoMetadata(compressionType=kind, uncompressedSize=declared).SerializeToString()
    return struct.pack(">hi", 0x4778, len(meta)) + meta + payload


def _zstd_declaring(content_size: int) -> bytes:
    """A small zstd frame whose header declares ``content_size`` bytes (4-byte size field)."""
    frame = bytearray(zstandard.ZstdCompressor(write_content_size=True).compress(bytes(70000)))
    assert frame[4] == 0xA0  # single segment, 4-byte Frame_Content_Size at bytes 5..8
    frame[5:9] = struct.pack("<I", content_size)
    return bytes(frame)


# 10 MiB of zeros in a few hundred bytes, no content size in the frame: a bomb within the declared size
_ZSTD_BOMB = zstandard.ZstdCompressor(write_content_size=False).compress(bytes(10 * 1024 * 1024))
assert len(_ZSTD_BOMB) < 1024

CASES: dict[str, Callable[[], object]] = {
    "v1 entries 2**31-1": lambda: parse_index(struct.pack(">Iiqqii", 0xDE47DE47, 0, 1, 128, I32, 0) + bytes(200)),
    "v1 metadata 2**31-1": lambda: parse_index(struct.pack(">Iiqqii", 0xDE47DE47, 0, 1, 128, 0, I32) + bytes(200)),
    "v2 entries 2**31-1": lambda: parse_index(encode_index_v2(9, [])[:24] + struct.pack(">qii", 1, I32, 0)),
    "v2 ledger info 2**31-1": lambda: parse_index(encode_index_v2(9, [])[:24] + struct.pack(">qii", 1, 0, I32)),
    "trailer checkpoints 2**31-1": lambda: parse_trailer(b"TSC1" + struct.pack(">i", I32) + bytes(64), 0, 5, 1000),
    "trailer checksums 2**31-1": lambda: parse_trailer(b"TSK1" + struct.pack(">ii", 1, I32) + bytes(64), 0, 5, I32),
    "trailer via index": lambda: index_trailer(parse_index(_V1 + b"TSK1" + struct.pack(">ii", 1, I32) + bytes(8))),
    "block length 2**63-1": lambda: decode_block(block_header(0, I64) + bytes(100)),
    "frame length 2**31-1": lambda: decode_block(block_header(0, 300) + struct.pack(">iq", I32, 0) + bytes(160)),
    "frames scan 2**31-1": lambda: scan_frames(struct.pack(">iq", I32, 0) + bytes(100), 0),
    "index offsets 2**63-1": lambda: list(iter_data_object(bytes(300), [IndexEntry(0, 1, I64)])),
    "ledger metadata field 2**62": lambda: decode_ledger_metadata(b"\x32" + b"\xff" * 8 + b"\x3f" + bytes(50), 1),
    "mlinfo zlib declared 2**31-1": lambda: decode_managed_ledger_info(_framed(2, I32, zlib.compress(_RAW))),
    "mlinfo zlib bomb": lambda: decode_managed_ledger_info(_framed(2, I32, zlib.compress(bytes(8 << 20), 9))),
    "mlinfo zstd declared 2**31-1": lambda: decode_managed_ledger_info(
        _framed(3, I32, zstandard.ZstdCompressor(write_content_size=False).compress(_RAW))),
    "mlinfo zstd frame 4 GiB": lambda: decode_managed_ledger_info(_framed(3, I32, _zstd_declaring(2**32 - 1))),
    "mlinfo zstd frame = declared": lambda: decode_managed_ledger_info(_framed(3, I32, _zstd_declaring(I32))),
    "mlinfo zstd frame 1 GiB": lambda: decode_managed_ledger_info(_framed(3, 2**30, _zstd_declaring(2**30))),
    "mlinfo zstd bomb": lambda: decode_managed_ledger_info(_framed(3, I32, _ZSTD_BOMB)),
    "mlinfo metaLen 2**31-1": lambda: decode_managed_ledger_info(struct.pack(">hi", 0x4778, I32) + bytes(100)),
    "deletion record 4300 digits": lambda: DeletionRecord.from_json(b'{"ledger_id": ' + b"9" * 4300 + b"}"),
}


def _peak(fn: Callable[[], object]) -> int:
    """Peak bytes allocated (tracemalloc) while ``fn`` runs; a TieredError is an accepted outcome."""
    tracemalloc.start()
    try:
        with contextlib.suppress(TieredError):
            fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("name", list(CASES))
def test_in_memory_decoders(name: str) -> None:
    peak = _peak(CASES[name])
    assert peak < BUDGET, f"{name}: {peak / 2**20:.0f} MiB allocated"


def test_under_an_address_space_limit() -> None:
    """The same cases in a child whose address space may grow by BUDGET only: an allocation of the
    declared size anywhere (zstd, zlib, protobuf, ...) fails there with MemoryError."""
    code = f"""
import resource, sys
sys.path.insert(0, {str(Path(__file__).parents[2])!r})
from tests.fuzz.test_memory_bounds import CASES
from tieredcore.errors import TieredError
with open("/proc/self/status") as f:
    vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (vm + {BUDGET}, resource.getrlimit(resource.RLIMIT_AS)[1]))
for name, fn in CASES.items():
    try:
        fn()
    except TieredError:
        pass
    except MemoryError:
        print("MemoryError in", name)
        raise
print("ok")
"""
    if not os.path.exists("/proc/self/status"):
        pytest.skip("needs /proc to size the address-space limit")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout + proc.stderr


def test_hot_index_record_lengths(tmp_path: Path) -> None:
    """An OPEN ledger (writer gone) whose first .idx record says 2**31-1 bytes: recovery only checks the
    tail, so the record survives; reading it must not allocate 2 GiB."""
    store = LocalLedgerStore(tmp_path)
    w = store.create_ledger({})
    w.append_many([b"a" * 10, b"b" * 10, b"c" * 10])
    w.release()
    store.close()
    idx = bytearray((tmp_path / "0.idx").read_bytes())
    idx[:16] = IDX_RECORD.pack(0, 0, I32)
    (tmp_path / "0.idx").write_bytes(idx)
    store = LocalLedgerStore(tmp_path)
    h = store.open_ledger(0)
    assert h.last_add_confirmed == 2
    for first, last in ((0, 0), (0, 2)):
        peak = _peak(lambda: h.read(first, last))  # noqa: B023 (called at once)
        assert peak < BUDGET, f"read({first}, {last}): {peak / 2**20:.0f} MiB allocated"
    store.close()


def test_offloaded_frame_length(tmp_path: Path) -> None:
    """A data object (no checksums) whose first frame claims 2**31-1 bytes: reading and verifying it
    raise within the budget."""
    hot = LocalLedgerStore(tmp_path / "hot")
    w = hot.create_ledger({})
    w.append_many([b"x" * 100] * 20)
    w.close()
    h = hot.open_ledger(0)
    store = FilesystemBlobStore(tmp_path / "cold")
    off = LedgerOffloader(store, "", max_block_size=1024, checksum_chunk=0, checkpoint_interval=0,
                          offset_cache=OffsetCache())
    u = uuidlib.UUID(int=3)
    obj = off.offload(h, u)
    data = bytearray(store.get(obj.data_key))
    data[128:132] = struct.pack(">i", I32)
    store.put(obj.data_key, bytes(data), store.head(obj.data_key).metadata)
    for fn in (lambda: off.read_offloaded(0, u).read(0, 19), lambda: verify_offloaded(off.read_offloaded(0, u)),
               lambda: verify_offloaded(off.read_offloaded(0, u), list(h.entry_crcs())),
               lambda: verify_offloaded(off.read_offloaded(0, u), h.entry_crcs(), expected_sizes=h.entry_sizes())):
        with pytest.raises(TieredError):
            fn()
        assert _peak(fn) < BUDGET
    hot.close()


def test_budget_is_meaningful() -> None:
    """The measurement sees a real allocation of the declared size (and resource is importable)."""
    assert _peak(lambda: bytes(BUDGET + 1)) > BUDGET  # calloc'ed: measured, never touched
    assert resource.getrlimit(resource.RLIMIT_AS)
