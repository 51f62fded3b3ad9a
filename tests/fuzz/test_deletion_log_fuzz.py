"""Fuzzing of the deletion log's stored records (JSON in the metadata store) through a real
SqliteMetadataStore: ``DeletionRecord.from_json`` + ``validate``, ``pending()``, ``due()``,
``dead_letters()``, ``stats()`` / ``counters()``, and the state changes a drain makes with what it read.

Any stored bytes must give a record, an entry marked malformed, or a TieredError: never a RecursionError
(deep nesting), OverflowError (1e999 where an int belongs), UnicodeDecodeError, TypeError, ...
"""

from __future__ import annotations

import json
import uuid as uuidlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tieredcore.errors import TieredError
from tieredcore.meta.deletion_log import DEAD, PENDING, STATS, DeletionLog, DeletionRecord
from tieredcore.meta.sqlite import SqliteMetadataStore

from .strategies import FUZZ, FUZZ_IO, HANG_TIMEOUT, mutated, outcome

pytestmark = pytest.mark.timeout(HANG_TIMEOUT)

VALID = DeletionRecord(
    topic="t/ns/persistent/topic", ledger_id=5, type="offloaded", reason="retention", created_ms=1000,
    uuid=str(uuidlib.UUID(int=7)), driver={"name": "filesystem", "properties": {"root": "/x"}},
)
VALID_JSON = VALID.to_json()
STATS_JSON = json.dumps({"consumed": 3, "acknowledged": 2}).encode()
# a valid record whose driver properties nest 600 deep: json.loads copes, code recursing over it does not
DEEP_DRIVER = VALID_JSON.replace(b'"properties"', b'"deep":' + b'{"a":' * 600 + b"1" + b"}" * 600 + b',"properties"')

# JSON values, including the awkward ones: huge and non-finite numbers, lone surrogates, nesting
_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True),
    st.text(max_size=20), st.sampled_from(["", "ledger", "offloaded", "segment", "\ud800", "t/ns/persistent/x"]),
)
_values = st.recursive(_scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c,
                                                                                     max_size=3), max_leaves=12)


def _nested(depth: int, kind: str = "[") -> str:
    """JSON nested ``depth`` deep: lists, or objects ``{"a": {"a": ... 1}}``."""
    if kind == "[":
        return "[" * depth + "]" * depth
    return '{"a":' * depth + "1" + "}" * depth


@st.composite
def record_bytes(draw: st.DrawFn) -> bytes:
    """Stored bytes of a record: random, a byte mutation of a valid one, a valid one with fields replaced
    by arbitrary JSON values, or text crafted to hit a parser limit."""
    kind = draw(st.sampled_from(("random", "mutated", "fields", "crafted")))
    if kind == "random":
        return draw(st.binary(max_size=300))
    if kind == "mutated":
        return draw(mutated(VALID_JSON))
    if kind == "fields":
        raw = json.loads(VALID_JSON)
        for name in draw(st.lists(st.sampled_from(sorted(raw) + ["extra"]), max_size=4)):
            if draw(st.booleans()):
                raw[name] = draw(_values)
            else:
                raw.pop(name, None)
        return json.dumps(raw).encode(draw(st.sampled_from(("utf-8", "utf-16", "utf-32"))), "surrogatepass")
    depth = draw(st.sampled_from((50, 400, 900, 5000, 100_000)))
    field = draw(st.sampled_from(("driver", "topic", "ledger_id", "attempts")))
    raw = json.loads(VALID_JSON)
    text = json.dumps(raw)
    return draw(st.sampled_from((
        _nested(depth).encode(),
        text.replace(f'"{field}": ', f'"{field}": {_nested(depth, "{")}, "x{field}": ', 1).encode(),
        text.replace('"created_ms": 1000', '"created_ms": ' + "9" * 5000).encode(),
        text.replace('"created_ms": 1000', '"created_ms": 1e999').encode(),
        text.replace('"attempts": 0', '"attempts": NaN').encode(),
        b"\xff\xfe" + text.encode("utf-16-le")[:-1],
        text.encode("latin-1", "replace").replace(b"retention", b"r\xe9tention"),
    )))


@pytest.fixture(scope="module")
def meta(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SqliteMetadataStore]:
    store = SqliteMetadataStore(Path(tmp_path_factory.mktemp("dlog")) / "meta.db")
    yield store
    store.close()


def _clear(store: SqliteMetadataStore) -> None:
    for base in (PENDING, DEAD):
        for child in store.children(base):
            store.delete(f"{base}/{child}")
    if store.get(STATS) is not None:
        store.delete(STATS)


def _check_entries(entries: list) -> None:
    for e in entries:
        if e.record is not None:
            assert e.record.validate() is None
            r = e.record
            assert all(type(v) is str for v in (r.topic, r.type, r.reason, r.component))
            assert DeletionRecord.from_json(r.to_json()).to_json() == r.to_json()  # (NaN != NaN)
        else:
            assert e.error and isinstance(e.raw, bytes)


@FUZZ
@given(record_bytes())
@example(b"[" * 100_000 + b"]" * 100_000)  # RecursionError out of json.loads
@example(b'{"topic": 1}')  # TypeError: required fields missing
@example(b"\xff\xfe\x00")  # UnicodeDecodeError (UTF-16 detected)
def test_from_json(buf: bytes) -> None:
    rec = outcome(DeletionRecord.from_json, buf)
    if not isinstance(rec, TieredError):
        outcome(rec.validate)


@FUZZ_IO
@given(record_bytes(), record_bytes(), st.one_of(record_bytes(), st.just(STATS_JSON), mutated(STATS_JSON)))
@example(VALID_JSON, VALID_JSON, STATS_JSON)
@example(VALID_JSON, b"{}", b'{"consumed": 1e999}')  # OverflowError out of counters()
@example(DEEP_DRIVER, b"{}", STATS_JSON)  # parsed, then RecursionError in a drain's retry (asdict)
def test_stored_records(meta: SqliteMetadataStore, pending: bytes, dead: bytes, stats: bytes) -> None:
    _clear(meta)
    meta.create(f"{PENDING}/r1", pending)
    meta.create(f"{PENDING}/r2", VALID_JSON)
    meta.create(f"{DEAD}/d1", dead)
    meta.create(STATS, stats)
    log = DeletionLog(meta)
    for got in (outcome(log.pending), outcome(log.due, 2**63), outcome(log.dead_letters)):
        if not isinstance(got, TieredError):
            _check_entries(got)
    outcome(log.stats)
    counters = outcome(log.counters)
    if not isinstance(counters, TieredError):
        assert all(type(v) is int for v in counters.values())
    # what a drain does with the entries it read: each state change lands or reports a lost race
    entries = outcome(log.pending)
    if isinstance(entries, TieredError):
        return
    for e in entries:
        if e.record is None:
            outcome(log.dead_letter, e, "malformed")
        else:
            outcome(log.retry, e, "boom", 5000)
    dead_letters = outcome(log.dead_letters)
    for e in [] if isinstance(dead_letters, TieredError) else dead_letters:
        outcome(log.requeue, [e.id])
