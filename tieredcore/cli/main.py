"""`tiered`: the operator's command line over a workspace (see README). One module per command group
(``tieredcore/cli/<group>.py``, whose ``GROUP`` is a ``CommandGroup``: its commands, parser, runner and
optional printer); this one parses, dispatches, prints and maps errors to exit codes: 0 ok, 1 failed, 2 bad
input (nothing changed)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tieredcore.cli import (
    compact,
    data,
    deletions,
    export,
    init,
    keys,
    offload,
    policies,
    read,
    recover,
    replica,
    scrub,
    topic_compaction,
    topics,
)
from tieredcore.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    CommandGroup,
    Progress,
    err,
    sqlite_path,
)
from tieredcore.config import CONFIG_FILE_NAME, Config
from tieredcore.errors import (
    InBookKeeperError,
    NotFoundError,
    PulsarReadOnlyError,
    ReplicaReadOnlyError,
    TieredError,
    TopicNotFoundError,
    ValidationError,
)
from tieredcore.usage import OneLineParser
from tieredcore.workspace import Workspace

GROUPS: tuple[CommandGroup, ...] = (data.GROUP, offload.GROUP, read.GROUP, policies.GROUP, topics.GROUP,
                                    deletions.GROUP, scrub.GROUP, compact.GROUP, topic_compaction.GROUP,
                                    keys.GROUP, export.GROUP, recover.GROUP,
                                    replica.GROUP)
COMMANDS: dict[str, CommandGroup] = {cmd: g for g in GROUPS for cmd in g.commands}


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="tiered", description="Tiered storage for segmented logs (Pulsar-compatible).")
    p.add_argument("--config", help=f"configuration file (default: $TIERED_CONFIG or ./{CONFIG_FILE_NAME})")
    p.add_argument("--workspace", help=f"workspace directory (its {CONFIG_FILE_NAME})")
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    # --json also after the command (`tiered status --json`); SUPPRESS keeps the global one's value
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="machine-readable output on stdout")
    sub = p.add_subparsers(dest="cmd", required=True)
    init.add_parser(sub, [common])
    for g in GROUPS:
        g.add_parser(sub, [common])
    return p


def load_config(args: argparse.Namespace) -> Config:
    if args.config and args.workspace:
        own = Path(args.workspace) / CONFIG_FILE_NAME
        if Path(args.config).resolve() != own.resolve():
            raise ValidationError(f"--workspace {args.workspace} and --config {args.config} name different "
                                  f"workspaces (the workspace's configuration is {own}); give one of them")
    if args.config:
        return Config.load(args.config)
    if args.workspace:
        return Config.load(Path(args.workspace) / CONFIG_FILE_NAME)
    return Config.load()


def _require_metadata_store(cfg: Config) -> None:
    """A command reading or changing existing state on a missing metadata store has the wrong workspace
    (or a moved file): it must not be answered from an empty, freshly created database."""
    db = sqlite_path(cfg)
    if db is not None and not db.exists():
        raise ValidationError(f"no metadata store at {db}: run `tiered init`")


def _is_usage_error(e: TieredError) -> bool:
    """Bad input (exit 2): invalid arguments, or a topic / id the user named that does not exist. A
    missing object or ledger met while reading is a failure of the data (exit 1)."""
    return isinstance(e, ValidationError) or type(e) in (NotFoundError, TopicNotFoundError)


# what an attached workspace refuses outright (Pulsar's brokers own it), with the reason
BROKERS_COMMANDS = {
    "generate": "writes topics and ledgers",
    "offload": "offloads (Pulsar's brokers do)",
    "topics": "deletes topics (`pulsar-admin topics delete`)",
    "compact-topic": "writes a compacted ledger (Pulsar's brokers compact topics: `pulsar-admin topics compact`)",
}


def refuse_on_attached(cmd: str, cfg: Config) -> None:
    """PulsarReadOnlyError for a command that would change what an attached cluster's brokers own."""
    why = BROKERS_COMMANDS.get(cmd)
    if why is not None and cfg.attached:
        raise PulsarReadOnlyError(f"refused: `tiered {cmd}` {why}; this workspace is attached to Pulsar cluster "
                                  f"{cfg.cluster!r}, whose topics, ledgers and objects are its brokers'")


# what a read replica serves: reads, and its own sync (every other command writes, or may: refused at once)
REPLICA_COMMANDS = {"read", "verify", "status", "replica-sync"}
REPLICA_SUBCOMMANDS = {"policies": ("policies_cmd", {"get", "list"}), "deletions": ("deletions_cmd", {"stats"})}


def refuse_on_replica(args: argparse.Namespace, cfg: Config) -> None:
    """ReplicaReadOnlyError for a command a read replica does not serve (one line: the replica, its source)."""
    if not cfg.replica or args.cmd in REPLICA_COMMANDS:
        return
    sub = REPLICA_SUBCOMMANDS.get(args.cmd)
    if sub is not None and getattr(args, sub[0], None) in sub[1]:
        return
    name = " ".join(x for x in (args.cmd, getattr(args, sub[0], None) if sub else None) if x)
    raise ReplicaReadOnlyError(f"refused: `tiered {name}` writes; this workspace is a read replica of "
                               f"{cfg.replica_of} (cluster {cfg.cluster!r}): it serves reads and changes only by "
                               "`tiered replica-sync`")


def _print_human(cmd: str, res: dict[str, Any]) -> None:
    if res.get("_printed"):
        return
    group = COMMANDS.get(cmd)
    if group is not None and group.print_human is not None:
        group.print_human(cmd, res)
        return
    for k, v in res.items():
        if not k.startswith("_"):
            print(f"{k}: {v}")


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # whoever read our output is gone (`tiered read ... | head -1`): stop quietly, and point stdout
        # at /dev/null so the interpreter's final flush does not fail a second time
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return EXIT_FAILED


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    if args.cmd == "generate" and not args.namespace:
        args.namespace = ["public/default"]
    progress = Progress(enabled=True)
    try:
        if args.cmd == "init":
            res = init.run(args)
        else:
            cfg = load_config(args)
            refuse_on_attached(args.cmd, cfg)
            refuse_on_replica(args, cfg)
            # generate writes topics: may start the store (docs/deploy.md, env-only config); recover rebuilds a
            # lost one
            if args.cmd not in ("generate", "recover"):
                _require_metadata_store(cfg)
            with Workspace(cfg) as ws:
                res = COMMANDS[args.cmd].run(args, ws, progress)
    except InBookKeeperError as e:  # Pulsar's BookKeeper holds it: said as it is, not as our error
        err(f"tiered {args.cmd}: {e}")
        return EXIT_FAILED
    except TieredError as e:
        if _is_usage_error(e):
            err(f"tiered {args.cmd}: {e}")
            return EXIT_USAGE
        # data that cannot be read (no copy of a ledger, a damaged object) is a failure, not bad input
        err(f"tiered {args.cmd}: {type(e).__name__}: {e}")
        return EXIT_FAILED
    except BrokenPipeError:
        raise
    except OSError as e:  # a file system or network failure is reported, never a traceback
        err(f"tiered {args.cmd}: {type(e).__name__}: {e}")
        return EXIT_FAILED
    code = res.pop("_exit", EXIT_OK)
    if args.json:
        res.pop("_printed", None)
        print(json.dumps(res, indent=2, default=str))
    else:
        _print_human(args.cmd, res)
    sys.stdout.flush()  # a closed pipe surfaces here, inside main, not at interpreter exit
    return code


if __name__ == "__main__":
    sys.exit(main())
