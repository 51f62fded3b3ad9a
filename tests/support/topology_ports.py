"""One holder at a time of docker/topology.env's fixed loopback ports (5432, 6379, 2181, 9000, 7077, 8080):
the compose test's stack binds them (tests/compose, host networking) and one stack.sh test holds 5432
to see `up` refuse it (tests/stack/test_stack_bad_input.py). Every other test takes ephemeral ports.
An exclusive lock on a file in the machine's temp directory, held across pytest-xdist workers."""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK = Path(os.environ.get("TIERED_TOPOLOGY_PORTS_LOCK") or Path(tempfile.gettempdir()) / "tiered-topology-ports.lock")


@contextmanager
def topology_ports() -> Iterator[None]:
    """Blocks until no other test holds the topology's ports."""
    with open(LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
