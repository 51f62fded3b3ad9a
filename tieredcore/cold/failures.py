"""Stop a run that keeps failing on its object store instead of trying every remaining ledger.

A store that is down (or an endpoint that accepts connections and never answers) fails every request
only after its timeouts and retries; a sweep of thousands of ledgers would spend hours proving the same
thing. After ``limit`` consecutive store failures the budget is spent: callers mark the rest of their
work ``aborted`` with one clear reason, and the run exits non-zero. Any success resets the count.
"""

from __future__ import annotations

from tieredcore.errors import (
    BlobStoreError,
    NoSuchUploadError,
    StoreOwnershipError,
    StoreUnavailableError,
    ValidationError,
)

DEFAULT_STORE_FAILURE_LIMIT = 5
# exception class names that mean "the object store is failing", not "this ledger is bad"
STORE_ERROR_TYPES = frozenset(c.__name__ for c in (BlobStoreError, NoSuchUploadError, StoreOwnershipError,
                                                                StoreUnavailableError))


class StoreFailureBudget:
    def __init__(self, limit: int = DEFAULT_STORE_FAILURE_LIMIT) -> None:
        if limit < 0:
            raise ValidationError(f"store failure limit must be >= 0 (0: never stop), got {limit}")
        self.limit = limit
        self.consecutive = 0
        self.last_error = ""

    @property
    def exhausted(self) -> bool:
        return self.limit > 0 and self.consecutive >= self.limit

    @property
    def reason(self) -> str:
        return (f"not attempted: the object store failed {self.consecutive} times in a row "
                f"(last: {self.last_error})")

    def record(self, error_type: str, error: str = "") -> None:
        """One unit of work finished: ``error_type`` is the exception class name ('' = success)."""
        if error_type in STORE_ERROR_TYPES:
            self.consecutive += 1
            self.last_error = error[:500]
        elif not error_type:
            self.consecutive = 0
