"""Listing an offload location: the offload prefix split into 16 disjoint listings (first hex digit of
the uuid) plus one "rest" listing of every other key under the prefix (foreign keys), paginated;
together they list every key exactly once. Keys are parsed with tieredcore.formats.keys."""

from __future__ import annotations

import gc
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import NamedTuple

from tieredcore.cold.blob import BlobStore, ObjectInfo, iter_objects
from tieredcore.errors import ValidationError
from tieredcore.formats.keys import OBJECT_KEY, TOPIC_MANIFEST_DIR, is_topic_manifest_key, normalize_prefix
from tieredcore.offload.ownership import MARKER_PREFIX, is_marker_key

HEX_DIGITS = "0123456789abcdef"
# Highest code point: UTF-8 never has a byte above 0xF4, so p + c + this sorts after nearly every key
# starting with p + c (the rest listing still filters, so a key sorting after it is not listed twice)
_MAX_CHAR = "\U0010ffff"


class ObjectRow(NamedTuple):
    """One listed object. `uuid`/`ledger_id`/`is_index` are None for keys this project did not write
    (foreign); a streaming-segment key (`{uuid}[-index]`, docs/formats.md) has a uuid but no ledger id."""

    key: str
    size: int
    last_modified_ms: int
    uuid: str | None
    ledger_id: int | None
    is_index: bool | None


_new_row = tuple.__new__  # ObjectRow(...) without the NamedTuple constructor's call overhead


def parse_row(info: ObjectInfo, prefix: str) -> ObjectRow:
    """Key parsing of one listed object relative to the offload prefix (the grammar of
    tieredcore.formats.keys, matched without building an intermediate object: this runs once per
    object)."""
    key = info.key
    m = OBJECT_KEY.fullmatch(key, len(prefix)) if key.startswith(prefix) else None
    lm = int(info.last_modified * 1000)
    if m is None:
        return _new_row(ObjectRow, (key, info.size, lm, None, None, None))
    uuid, lid, index = m.group(1, 2, 3)
    return _new_row(ObjectRow, (key, info.size, lm, uuid, int(lid) if lid is not None else None, index is not None))


@contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a listing is held in memory: a million rows (tuples of
    strings and ints, which cannot form cycles) set off collections that walk the whole growing heap again
    and again, about a quarter of the listing's time at 1,000,000 objects."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def listing_prefixes(prefix: str) -> list[str]:
    """The offload prefix extended by each possible first character of a uuid ('0'..'f'): 16 disjoint
    listings. Every other key under the prefix is listed by :func:`list_rest`."""
    p = normalize_prefix(prefix)
    return [p + c for c in HEX_DIGITS]


def excluded(key: str, exclude_prefixes: Sequence[str]) -> bool:
    return any(key.startswith(x) for x in exclude_prefixes)


def list_objects(
    store: BlobStore,
    prefix: str,
    listing_prefix: str | None = None,
    *,
    exclude_prefixes: Sequence[str] = (),
    page_size: int = 1000,
) -> Iterator[ObjectRow]:
    """Rows of every object under `listing_prefix` (default: the offload prefix itself; else one of
    :func:`listing_prefixes`), keys parsed relative to the offload `prefix`, following pagination.
    Keys under `exclude_prefixes` (other offload locations nested in this one) are skipped."""
    p = normalize_prefix(prefix)
    lp = p if listing_prefix is None else listing_prefix
    if not lp.startswith(p):
        raise ValidationError(f"listing prefix {lp!r} is not under the offload prefix {p!r}")
    # owner markers and topic manifests (ours, never orphans) start with a letter past 'f': no uuid listing
    # holds one
    markers = lp == p or lp[len(p):len(p) + 1] not in HEX_DIGITS
    # parse_row inlined, names bound locally: this loop runs once per object of the store
    match, plen, new_row, row_type = OBJECT_KEY.fullmatch, len(p), _new_row, ObjectRow
    marker_start = p + MARKER_PREFIX
    manifest_start = p + TOPIC_MANIFEST_DIR
    for info in iter_objects(store, lp, page_size):
        key = info.key
        if (exclude_prefixes and excluded(key, exclude_prefixes)) or (
                markers and (key.startswith(marker_start) and is_marker_key(key, p)
                             or key.startswith(manifest_start))):
            continue  # a nested location's keys; owner markers and topic manifests (ours, never orphans)
        m = match(key, plen) if key.startswith(p) else None
        if m is None:
            yield new_row(row_type, (key, info.size, int(info.last_modified * 1000), None, None, None))
        else:
            uuid, lid, index = m.group(1, 2, 3)
            yield new_row(row_type, (key, info.size, int(info.last_modified * 1000), uuid,
                                     int(lid) if lid is not None else None, index is not None))


def _is_rest(key: str, plen: int) -> bool:
    return len(key) == plen or key[plen] not in HEX_DIGITS


def list_rest(
    store: BlobStore, prefix: str, *, exclude_prefixes: Sequence[str] = (), page_size: int = 1000
) -> Iterator[ObjectRow]:
    """Rows of the keys under the offload prefix whose next character is not a lowercase hex digit
    (or that equal the prefix): the complement of :func:`listing_prefixes`. Only the three key ranges
    around the hex digits are read (< '0', ':'..'`', > 'f'), each from its start (``start_after``)."""
    p = normalize_prefix(prefix)
    plen = len(p)

    def emit(infos: Iterable[ObjectInfo]) -> Iterator[ObjectRow]:
        for info in infos:
            if _is_rest(info.key, plen) and not (exclude_prefixes and excluded(info.key, exclude_prefixes)) \
                    and not is_marker_key(info.key, p) and not is_topic_manifest_key(info.key, p):
                # the location's owner marker and topic manifests are ours, not foreign
                yield parse_row(info, p)

    # (start after, stop at the first key whose next character is >= this)
    ranges: list[tuple[str | None, str | None]] = [(None, "0"), (p + "9" + _MAX_CHAR, "a"), (p + "f" + _MAX_CHAR, None)]
    for after, stop in ranges:
        it = iter_objects(store, p, page_size, start_after=after)

        def until(infos: Iterator[ObjectInfo], stop: str | None = stop) -> Iterator[ObjectInfo]:
            for info in infos:
                if stop is not None and len(info.key) > plen and info.key[plen] >= stop:
                    return
                yield info

        yield from emit(until(it))
