"""Object-store request counting: how many GET / PUT / LIST / DELETE requests a run made (what an
object-store bill charges for besides storage).

The filesystem and S3 stores are decorated with :func:`counted`: every call of a store operation records
one request of its kind (a batch delete one per 1,000 keys, as S3's DeleteObjects takes) in every
counter opened with :func:`count_requests` in this process. A run (a Spark task, a job's driver) opens
one around its work; :func:`request_label` attributes what is counted inside it to a namespace.
Requests of threads started inside a labelled block (read-ahead) count unlabelled ("")."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

REQUEST_KINDS = ("GET", "PUT", "LIST", "DELETE")
# store operation -> the request kind it is billed as (S3: HEAD as GET; multipart initiate, parts and
# complete as PUT/POST; abort as DELETE)
OPERATION_KINDS = {
    "get": "GET", "get_range": "GET", "head": "GET",
    "put": "PUT", "initiate_multipart": "PUT", "upload_part": "PUT", "complete_multipart": "PUT",
    "list": "LIST", "list_multipart_uploads": "LIST",
    "delete": "DELETE", "abort_multipart": "DELETE",
}
DELETE_BATCH = 1000  # keys per DeleteObjects request
UNLABELLED = ""

_label: contextvars.ContextVar[str] = contextvars.ContextVar("tiered_request_label", default=UNLABELLED)
_active: list[RequestCounts] = []
_active_lock = threading.Lock()

T = TypeVar("T")


class RequestCounts:
    """Requests per label (a namespace, or "") and kind; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, dict[str, int]] = {}

    def add(self, label: str, kind: str, n: int = 1) -> None:
        with self._lock:
            per = self._counts.setdefault(label, dict.fromkeys(REQUEST_KINDS, 0))
            per[kind] = per.get(kind, 0) + n

    def merge(self, other: Mapping[str, Mapping[str, int]]) -> None:
        """Adds counts in :meth:`as_dict`'s shape (e.g. another process's)."""
        for label, kinds in other.items():
            for kind, n in kinds.items():
                if n:
                    self.add(label, kind, int(n))

    def as_dict(self) -> dict[str, dict[str, int]]:
        with self._lock:
            return {label: dict(kinds) for label, kinds in self._counts.items()}

    def total(self) -> dict[str, int]:
        return sum_kinds(self.as_dict().values())


def sum_kinds(parts: Any) -> dict[str, int]:
    """The per-kind sum of several ``{kind: n}`` dicts."""
    out = dict.fromkeys(REQUEST_KINDS, 0)
    for kinds in parts:
        for kind, n in kinds.items():
            out[kind] = out.get(kind, 0) + int(n)
    return out


def request_document(counts: Mapping[str, Mapping[str, int]]) -> dict[str, Any]:
    """What a run report records under ``requests``: the total per kind and, per namespace, what was
    attributed to it (the rest, e.g. listings of the whole store, only in the total)."""
    return {"total": sum_kinds(counts.values()),
            "namespaces": {ns: dict(kinds) for ns, kinds in sorted(counts.items()) if ns != UNLABELLED}}


@contextlib.contextmanager
def count_requests() -> Iterator[RequestCounts]:
    """Counts every store request this process makes until the block ends (nested blocks each count)."""
    counts = RequestCounts()
    with _active_lock:
        _active.append(counts)
    try:
        yield counts
    finally:
        with _active_lock:
            _active.remove(counts)


@contextlib.contextmanager
def request_label(label: str) -> Iterator[None]:
    """Requests made in this block (this thread) are attributed to ``label`` (a namespace)."""
    token = _label.set(label)
    try:
        yield
    finally:
        _label.reset(token)


def record(kind: str, n: int = 1) -> None:
    if n <= 0 or not _active:
        return
    label = _label.get()
    with _active_lock:
        targets = list(_active)
    for c in targets:
        c.add(label, kind, n)


def _requests_of(operation: str, args: tuple, kwargs: dict) -> int:
    if operation == "delete":
        keys = args[0] if args else kwargs.get("keys", ())
        n = len(keys) if not isinstance(keys, str) else 1
        return -(-n // DELETE_BATCH)
    return 1


def counted(cls: type[T]) -> type[T]:
    """Class decorator: each store operation of ``cls`` records its request (before it is made: a
    failed request is billed too)."""
    for operation, kind in OPERATION_KINDS.items():
        fn: Callable | None = cls.__dict__.get(operation)
        if fn is None:
            continue

        def wrap(fn: Callable = fn, operation: str = operation, kind: str = kind) -> Callable:
            @functools.wraps(fn)
            def op(self, *args, **kwargs):
                record(kind, _requests_of(operation, args, kwargs))
                return fn(self, *args, **kwargs)
            return op

        setattr(cls, operation, wrap())
    return cls


class RequestCountsParam:
    """A Spark AccumulatorParam (duck-typed: this module does not import Spark) adding up
    :meth:`RequestCounts.as_dict` documents from a run's tasks."""

    def zero(self, value: dict) -> dict:
        return {}

    def addInPlace(self, a: dict, b: dict) -> dict:  # noqa: N802 (Spark's name)
        for label, kinds in b.items():
            per = a.setdefault(label, {})
            for kind, n in kinds.items():
                per[kind] = per.get(kind, 0) + int(n)
        return a


def counting_partition(accumulator: Any, fn: Callable[[Iterator], Iterator]) -> Callable[[Iterator], Iterator]:
    """A Spark partition function that runs ``fn`` counting its store requests and adds them to
    ``accumulator`` (a :class:`RequestCountsParam` accumulator) when the partition is done."""

    def run(it: Iterator) -> Iterator:
        with count_requests() as counts:
            yield from fn(it)
        accumulator.add(counts.as_dict())

    return run
