"""`tiered topics delete`: delete a topic and, through two-phase deletion, its storage in both tiers."""

from __future__ import annotations

import argparse
from typing import Any

from tieredcore.cli.common import CommandGroup
from tieredcore.clock import now_ms, parse_time_ms
from tieredcore.errors import TopicNotFoundError, ValidationError
from tieredcore.lifecycle.retention import delete_topic
from tieredcore.names import TopicName
from tieredcore.offload.deletion import object_groups
from tieredcore.workspace import Workspace

COMMANDS = ("topics",)


def add_parser(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("topics", parents=parents, help="topic administration")
    ts = p.add_subparsers(dest="topics_cmd", required=True)
    d = ts.add_parser(
        "delete", parents=parents,
        help="delete a topic: deletion records for all its ledgers in both tiers, then its metadata",
    )
    d.add_argument("topic", help="persistent://tenant/namespace/topic or tenant/namespace/topic")
    d.add_argument("--yes", action="store_true", help="really delete (required)")
    d.add_argument("--dry-run", action="store_true", help="count the records that would be appended, change nothing")
    d.add_argument("--as-of", help="logical time of the records (ISO 8601 or epoch ms; default now)")


def run(a: argparse.Namespace, ws: Workspace, progress: Any = None) -> dict[str, Any]:
    if a.topics_cmd != "delete":  # argparse only offers delete
        raise ValidationError(f"unknown topics command {a.topics_cmd!r}")
    t = TopicName.parse(a.topic)
    as_of = parse_time_ms(a.as_of, "--as-of") if a.as_of else now_ms()
    if not a.yes and not a.dry_run:
        try:
            info, _ = ws.ml.get_topic(t)
        except TopicNotFoundError:
            raise TopicNotFoundError(f"topic {t.full} does not exist") from None
        groups = sum(len(object_groups(li)) for li in info.ledgerInfo)
        raise ValidationError(
            f"refusing to delete {t.full} ({len(info.ledgerInfo)} ledger(s), {groups} storage object group(s) "
            "in both tiers) without --yes; --dry-run shows what would be recorded"
        )
    try:
        res = delete_topic(ws, t, as_of, dry_run=a.dry_run).as_dict()
    except TopicNotFoundError:
        raise TopicNotFoundError(f"topic {t.full} does not exist") from None
    res["as_of_ms"] = as_of
    if not a.json:
        recs = ", ".join(f"{v} {k}" for k, v in res["records"].items() if v) or "none"
        if a.dry_run:
            print(f"would delete {t.full}: {res['ledgers']} ledger(s); deletion records: {recs}")
        else:
            print(f"deleted {t.full}: {res['ledgers']} ledger(s); deletion records appended: {recs}"
                  + ("; topic policies removed" if res["policies_deleted"] else "")
                  + " (storage is removed by the deletion drain)")
        res["_printed"] = True
    return res


GROUP = CommandGroup(COMMANDS, add_parser, run)
