"""A dead object store ends a run in seconds: every store a workspace opens is watched for answers.

A store that is down, or an endpoint that accepts connections and never answers, fails each request only
after its client's timeouts and retries (tieredcore.cold.client_settings: at most ~33 s per request). A run
of thousands of ledgers, records or objects would spend that on every one. :class:`StoreLiveness` remembers
when the store last answered; when requests have failed without any answer (a timeout, a refused or reset
connection) for ``dead_after`` seconds in a row, the store is declared dead for the rest of the run and
every later request fails at once with :class:`~tieredcore.errors.StoreUnavailableError`, which names the
store, how long it has been silent and the last error. Callers' failure budgets (tieredcore.cold.failures)
then mark the rest of the work ``aborted``.

An answer is anything the server said, errors included (404, 403, 503 SlowDown): a store that answers is
alive, and failing answers are the failure budget's business, not this guard's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from tieredcore.cold.location import StoreLocation
from tieredcore.cold.requests import OPERATION_KINDS
from tieredcore.errors import StoreUnavailableError, ValidationError

DEFAULT_STORE_DEAD_AFTER = 30.0  # seconds of requests failing without an answer before the store is dead
# exception classes (by name, anywhere in the chain of causes) that mean "no answer from the server": the
# standard library's, botocore's, urllib3's, requests', azure-core's
_NO_ANSWER_NAMES = frozenset({
    "TimeoutError", "ConnectionError", "ConnectionResetError", "ConnectionRefusedError", "ConnectionAbortedError",
    "BrokenPipeError", "EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "ConnectionClosedError",
    "ProxyConnectionError", "NewConnectionError", "ProtocolError", "ReadTimeout", "ConnectTimeout", "Timeout",
    "ServiceRequestError", "ServiceResponseError", "ServiceRequestTimeoutError", "ServiceResponseTimeoutError",
})
_GUARDED = tuple(OPERATION_KINDS)  # every operation that makes a request


def no_answer(exc: BaseException) -> bool:
    """Did this failure happen without an answer from the server (its cause chain says so)?"""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, StoreUnavailableError):
            return True
        if any(c.__name__ in _NO_ANSWER_NAMES for c in type(e).__mro__):
            return True
        cause = getattr(e, "cause", None)  # google-api-core's RetryError keeps its last error here
        todo.extend((e.__cause__, e.__context__, cause if isinstance(cause, BaseException) else None))
    return False


class StoreLiveness:
    """When one object store last answered, and whether it is dead for this run (thread-safe).

    Dead: requests have failed without an answer for ``dead_after`` seconds in a row, counted from the
    start of the first of them (or the last answer, if later). ``dead_after`` 0: never declared dead."""

    def __init__(self, label: str, dead_after: float = DEFAULT_STORE_DEAD_AFTER,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not dead_after >= 0:
            raise ValidationError(f"store_dead_after must be >= 0 seconds (0: never), got {dead_after!r}")
        self.label = label
        self.dead_after = dead_after
        self._clock = clock
        self._lock = threading.Lock()
        self._last_answer: float | None = None
        self._silent_since: float | None = None  # start of the current run of unanswered requests
        self._dead: str = ""  # the reason, once dead
        self.last_error = ""

    @property
    def dead(self) -> bool:
        return bool(self._dead)

    @property
    def reason(self) -> str:
        """Why the store is dead ('' while it is not)."""
        return self._dead

    def now(self) -> float:
        return self._clock()

    def check(self) -> None:
        """StoreUnavailableError at once when the store was declared dead."""
        if self._dead:
            raise StoreUnavailableError(self._dead)

    def answered(self) -> None:
        with self._lock:
            self._last_answer = self._clock()
            self._silent_since = None

    def unanswered(self, started: float, exc: BaseException) -> None:
        """A request that started at ``started`` failed without an answer."""
        with self._lock:
            now = self._clock()
            since = started if self._last_answer is None else max(started, self._last_answer)
            self._silent_since = since if self._silent_since is None else min(self._silent_since, since)
            self.last_error = f"{type(exc).__name__}: {exc}"[:300]
            silent = now - self._silent_since
            if self.dead_after > 0 and silent >= self.dead_after and not self._dead:
                self._dead = (f"object store {self.label} is not answering: no answer for {silent:.0f} s "
                              f"(store_dead_after {self.dead_after:g} s; last error: {self.last_error}); "
                              "giving up on it for this run")


class GuardedStore:
    """A BlobStore whose requests go through a :class:`StoreLiveness`: refused at once once the store is dead.
    Everything else (driver, flags, backend attributes) is the wrapped store's."""

    def __init__(self, inner: Any, liveness: StoreLiveness) -> None:
        self.inner = inner
        self.liveness = liveness

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"GuardedStore({self.inner!r})"

    def driver_properties(self) -> dict[str, str]:
        return self.inner.driver_properties()


def _guard(operation: str) -> Callable[..., Any]:
    def op(self: GuardedStore, *args: Any, **kwargs: Any) -> Any:
        live = self.liveness
        live.check()
        started = live.now()
        try:
            out = getattr(self.inner, operation)(*args, **kwargs)
        except ValidationError:
            raise  # refused before any request (bad arguments): says nothing about the store
        except Exception as e:
            if no_answer(e):
                live.unanswered(started, e)
                if live.dead and not isinstance(e, StoreUnavailableError):  # this failure made it dead
                    raise StoreUnavailableError(live.reason) from e
            else:
                live.answered()  # the server answered, with an error
            raise
        live.answered()
        return out

    op.__name__ = op.__qualname__ = operation
    return op


for _op in _GUARDED:
    setattr(GuardedStore, _op, _guard(_op))


def server_of(location: StoreLocation) -> tuple[str, str, str]:
    """What one liveness watches: one server and bucket (every prefix in it shares the answer)."""
    return (location.scheme, location.bucket, location.endpoint or "")


def describe(location: StoreLocation) -> str:
    return f"{location.scheme}://{location.bucket}" + (f" at {location.endpoint}" if location.endpoint else "")


def guarded(location: StoreLocation, store: Any, dead_after: float = DEFAULT_STORE_DEAD_AFTER,
            liveness: StoreLiveness | None = None) -> Any:
    """``store`` (opened from ``location``) behind a liveness guard; a filesystem store as it is (it answers
    or raises at once: nothing to time out)."""
    if location.scheme == "file":
        return store
    return GuardedStore(store, liveness or StoreLiveness(describe(location), dead_after))
