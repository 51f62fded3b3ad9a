"""Opens the stores a Config names and wires the layers together (one place, used by every entry point)."""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property

from tieredcore.config import Config
from tieredcore.offload.managed import TopicOffloader, now_ms
from tieredcore.offload.offloader import LedgerOffloader
from tieredcore.stores.blob import BlobStore
from tieredcore.stores.hot import LocalLedgerStore
from tieredcore.stores.managed_ledgers import ManagedLedgerStore
from tieredcore.stores.metadata import MetadataStore
from tieredcore.topic.reader import TIERED_FIRST, TopicReader


class Workspace:
    def __init__(self, config: Config) -> None:
        self.config = config

    @cached_property
    def metadata(self) -> MetadataStore:
        return self.config.open_metadata()

    @cached_property
    def ml(self) -> ManagedLedgerStore:
        return ManagedLedgerStore(self.metadata)

    @cached_property
    def hot(self) -> LocalLedgerStore:
        return self.config.open_hot()

    @cached_property
    def _store_and_prefix(self) -> tuple[BlobStore, str]:
        return self.config.open_store()

    @property
    def store(self) -> BlobStore:
        return self._store_and_prefix[0]

    @cached_property
    def offloader(self) -> LedgerOffloader:
        store, prefix = self._store_and_prefix
        return LedgerOffloader(
            store,
            prefix,
            max_block_size=self.config.max_block_size,
            read_buffer=self.config.read_buffer,
            cluster=self.config.cluster,
        )

    def topic_offloader(
        self,
        clock_ms: Callable[[], int] = now_ms,
        progress: Callable[[str, int, int, int], None] | None = None,
    ) -> TopicOffloader:
        return TopicOffloader(self.ml, self.hot, self.offloader, clock_ms=clock_ms, progress=progress)

    def reader(self, read_priority: str = TIERED_FIRST) -> TopicReader:
        return TopicReader(self.ml, self.hot, self.offloader, read_priority)

    def close(self) -> None:
        if "metadata" in self.__dict__:
            self.metadata.close()
        if "hot" in self.__dict__:
            self.hot.close()

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
