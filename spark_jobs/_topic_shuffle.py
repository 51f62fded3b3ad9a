"""Topic compaction on Spark (docs/topic-compaction.md, "How it runs"): one topic's phase one and two
distributed, the compacted ledger written by the driver.

PROVISIONAL: runs tieredcore.lifecycle.topic_compaction.compact_topic on the driver; the shuffle by key
replaces this body (same signature, same result)."""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Callable
from typing import Any

from tieredcore.config import Config
from tieredcore.formats.compacted import RETAIN_NULL_KEY_DEFAULT
from tieredcore.lifecycle.topic_compaction import CompactionResult, compact_topic
from tieredcore.names import TopicName
from tieredcore.workspace import Workspace


def compact_on_spark(spark: Any, config: Config, topic: str | TopicName, *, as_of_ms: int,
                     retain_null_key: bool = RETAIN_NULL_KEY_DEFAULT,
                     uuid_factory: Callable[[], uuidlib.UUID] = uuidlib.uuid4,
                     on_step: Callable[[str], None] | None = None) -> CompactionResult:
    """Compact ``topic`` (TopicNotFoundError, TopicCompactionError as compact_topic); deletion-log records are
    stamped with ``as_of_ms`` (the run's logical time)."""
    with Workspace(config) as ws:
        return compact_topic(ws, topic, retain_null_key=retain_null_key, clock_ms=lambda: as_of_ms,
                             uuid_factory=uuid_factory, on_step=on_step)
