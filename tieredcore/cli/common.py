"""What every `tiered` command group shares: what a group is, exit codes, stderr messages, progress, topic
selection."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from tieredcore.config import Config
from tieredcore.errors import NotFoundError
from tieredcore.names import NamespaceName, TopicName
from tieredcore.workspace import Workspace

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2



@dataclass(frozen=True)
class CommandGroup:
    """A group of `tiered` commands (one module under ``tieredcore/cli``): its command names, how it adds
    their parsers, how it runs one over a workspace (a result dict: ``_exit`` the exit code, ``_printed``
    when it printed its human output itself) and, if it has one, its printer of a result for people
    (without one: ``key: value`` lines)."""

    commands: tuple[str, ...]
    add_parser: Callable[[argparse._SubParsersAction, list[argparse.ArgumentParser]], None]
    run: Callable[[argparse.Namespace, Workspace, Progress], dict[str, Any]]
    print_human: Callable[[str, dict[str, Any]], None] | None = None


def err(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def mib(n: float) -> str:
    return f"{n / (1024 * 1024):,.1f} MiB"


def properties_of(info) -> dict[str, str]:
    return {kv.key: kv.value for kv in info.properties}


def require_namespaces(ws: Workspace, names: Iterable[str]) -> list[str]:
    """Parsed namespace names, all known (with topics or policies): a typo must not read as "0 topics"."""
    parsed = [NamespaceName.parse(n).name for n in names]
    known = set(ws.ml.list_namespaces()) | set(ws.ml.list_policy_namespaces())
    unknown = [n for n in dict.fromkeys(parsed) if n not in known]
    if unknown:
        raise NotFoundError(f"unknown namespace(s) {', '.join(unknown)}: no topics and no policies")
    return parsed


def select_topics(ws: Workspace, namespace: str | None, topics: Sequence[str] | None) -> list[TopicName]:
    if topics:
        out = [TopicName.parse(t) for t in topics]
        for t in out:
            if not ws.ml.exists(t):
                raise NotFoundError(f"topic {t.full} does not exist")
        return out
    namespaces = require_namespaces(ws, [namespace]) if namespace else ws.ml.list_namespaces()
    return [t for ns in namespaces for t in ws.ml.list_topics(ns)]


class Progress:
    """Progress on stderr, at most a line per second (never in --json mode's stdout)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled and not os.environ.get("TIERED_NO_PROGRESS")
        self._last = 0.0

    def __call__(self, msg: str, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if force or now - self._last >= 1.0:
            self._last = now
            err(msg)


def sqlite_path(cfg: Config) -> Path | None:
    """The database file of a sqlite:/// metadata URL (None for anything else: the store refuses it)."""
    u = urlparse(cfg.metadata_url)
    raw = unquote(u.path)
    if u.scheme != "sqlite" or not raw:
        return None
    return Path("/" + raw.lstrip("/")) if raw.startswith("/") else Path(raw)
