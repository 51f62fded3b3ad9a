"""`tiered scrub`: check every offloaded copy (and, with --deep, every byte of it and the Pulsar messages
of objects without chunk checksums: --messages all for every object); --repair replaces a damaged copy
from the hot copy. Without --repair nothing is changed (repairs are a dry run by default). Attached to a
Pulsar cluster nothing can be repaired: --repair is forced off with one line on stderr, damaged copies are
reported per namespace and position, "repair impossible without BookKeeper" (docs/pulsar.md, Scrub)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from typing import Any

from tieredcore.cli.common import CommandGroup, require_namespaces
from tieredcore.clock import now_ms, parse_time_ms
from tieredcore.errors import NotFoundError
from tieredcore.lifecycle.runner import run_work
from tieredcore.lifecycle.scrub import MESSAGE_MODES, plan_scrub, repair_allowed
from tieredcore.lifecycle.work import MESSAGE_COUNTERS, LedgerResult, RunSummary, damage_entry
from tieredcore.names import TopicName
from tieredcore.outcomes import Outcome
from tieredcore.reports import damage_text
from tieredcore.workspace import Workspace

EXIT_OK, EXIT_FAILED = 0, 1


COMMANDS = ("scrub",)


def add_parser(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    s = sub.add_parser(
        "scrub", parents=parents,
        help="check offloaded copies (objects exist, sizes, index, checksums); --repair fixes damaged ones",
        description="Check every complete offload of the chosen topics: both objects exist, sizes match, the "
                    "index parses, passes its checksum and describes its ledger; with --deep every byte is "
                    "read back against the chunk checksums and, where the hot copy exists, its CRCs, and every Pulsar "
                    "message's CRC32C is checked in objects without chunk checksums (Pulsar-written; "
                    "--messages all: in every object); entries that are not messages are counted, never "
                    "reported as damage. "
                    "A damaged copy whose hot copy exists is repairable: --repair replaces it (a verified "
                    "re-offload, the damaged one goes to the deletion log). Without a hot copy it is DATA "
                    "LOSS: reported, never deleted. On a workspace attached to a Pulsar cluster nothing can be "
                    "repaired (BookKeeper is Pulsar's): damaged copies are reported per namespace and position "
                    "as 'repair impossible without BookKeeper', --repair is forced off with one line. Exit "
                    "status: 0 when every copy is ok (or was repaired); 1 when damage remains or data is lost; "
                    "2 on bad input.",
    )
    s.add_argument("topic", nargs="*", help="topics to scrub (default: every topic of --namespace, or all)")
    s.add_argument("--namespace", action="append", help="tenant/namespace (repeatable; default all)")
    s.add_argument("--deep", action="store_true", help="read every byte back (slow: a full GET per ledger)")
    s.add_argument("--messages", choices=MESSAGE_MODES, default="auto",
                   help="whose Pulsar messages a deep scrub checks (CRC32C): auto = objects without chunk "
                        "checksums (Pulsar-written), all = every object (a second witness; costs about as "
                        "much again for small entries: bench/scrub_messages.py)")
    s.add_argument("--repair", action="store_true", help="replace damaged copies from the hot copy")
    s.add_argument("--as-of", help="logical time of the repairs (ISO 8601 or epoch ms; default now)")


def run(a: argparse.Namespace, ws: Workspace, progress: Any = None) -> dict[str, Any]:
    as_of = parse_time_ms(a.as_of, "--as-of") if a.as_of else now_ms()
    namespaces = require_namespaces(ws, a.namespace) if a.namespace else None
    topics = [TopicName.parse(t) for t in a.topic] if a.topic else None
    for t in topics or ():
        if not ws.ml.exists(t):
            raise NotFoundError(f"topic {t.full} does not exist")
    repair, repair_off = repair_allowed(ws, a.repair, announce=False)  # attached: off, one line on stderr
    if repair_off:
        print(f"tiered scrub: {repair_off}", file=sys.stderr)
    work = plan_scrub(ws, namespaces, as_of, topics=[t.full for t in topics] if topics else None,
                      deep=a.deep, repair=repair, messages=a.messages)
    rows = [LedgerResult(**r) for r in run_work(ws.config, [w.as_dict() for w in work])]
    summary = RunSummary.of("scrub", "cli", as_of, not repair, [asdict(r) for r in rows], 0.0)
    problems = [r for r in rows if r.outcome not in ("ok", "repaired", "skipped", "busy")]
    res: dict[str, Any] = {
        "as_of_ms": as_of, "deep": a.deep, "repair": repair, "repair_off": repair_off,
        "attached": ws.policies.brokers if ws.attached else None, "topics": len(work), "ledgers": len(rows),
        "bytes_read": summary.bytes, "outcomes": summary.outcomes, "namespaces": summary.namespaces,
        "data_loss": summary.data_loss, "messages": summary.messages,
        "problems": [{"topic": r.topic, "ledger": r.ledger, "outcome": r.outcome, "error": r.error,
                      "repair": r.repair} for r in problems],
        "_exit": EXIT_FAILED if problems else EXIT_OK,
    }
    if not a.json:
        _print(a, rows, work, summary, repair)
        res["_printed"] = True
    return res


def _print(a: argparse.Namespace, rows: list[LedgerResult], work: list, summary: RunSummary,
           repair: bool) -> None:
    """The text report: per namespace, then one line per damaged message or ledger."""
    print(f"scrub ({'deep' if a.deep else 'shallow'}{', repairing' if repair else ''}): {len(rows)} "
          f"offloaded ledger(s) of {len(work)} topic(s), {summary.bytes:,} bytes read")
    print(f"{'namespace':<28} {'units':>6} {'bytes read':>14} {'ok':>5} {'damaged':>8} {'repaired':>9} "
          f"{'lost':>5} {'msgs checked':>13} {'unchecked':>10} {'msgs damaged':>13} {'not msgs':>9}")
    for ns, d in sorted(summary.namespaces.items()):
        o = d["outcomes"]
        c = d.get("counters") or {}
        msgs = " ".join(f"{c[k]:>{w},}" if c else f"{'-':>{w}}" for k, w in zip(MESSAGE_COUNTERS, (13, 10, 13, 9),
                                                                                 strict=True))
        damaged = o.get(Outcome.DAMAGED, 0) + o.get(Outcome.UNREPAIRABLE, 0)
        print(f"{ns:<28} {d['ledgers']:>6} {d['bytes']:>14,} {o.get('ok', 0):>5} "
              f"{damaged:>8} {o.get('repaired', 0):>9} {o.get(Outcome.UNRECOVERABLE, 0):>5} "
              f"{msgs}")
    if a.deep:
        print("messages: entries whose Pulsar CRC32C was checked (a batch is one entry), "
              + ("in every object" if a.messages == "all" else
                 "in objects without chunk checksums only (--messages all: every object)") + "; '-': none checked")
    for r in rows:
        if r.outcome == Outcome.UNREPAIRABLE:
            for line in damage_text(r.namespace, damage_entry(r)):
                print(f"  {line}")
        elif r.outcome not in ("ok", "skipped"):
            print(f"  {r.outcome.upper():<13} {r.topic} ledger {r.ledger}: {r.error}")
    for what in summary.data_loss:
        print(f"DATA LOSS: {what}: no intact copy of it is left (see its row above)")
    if any(r.outcome == Outcome.DAMAGED for r in rows) and not repair:
        print("damaged copies can be repaired from their hot copies: rerun with --repair")
    for r in rows:
        if r.outcome == Outcome.UNREPAIRABLE:
            print(f"UNREPAIRABLE {r.topic} ledger {r.ledger}: {r.error}")


GROUP = CommandGroup(COMMANDS, add_parser, run)
