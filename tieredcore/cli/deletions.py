"""Operator commands of two-phase deletion (PIP-186, docs/deletion.md):

    tiered deletions stats                      in-flight estimate, dead letters, PIP-186 counters
    tiered deletions dlq list|requeue|drop      the dead-letter list
    tiered deletions drain                      phase 2 in this process (small workspaces)
    tiered reconcile                            find orphans in both tiers, append their records
    tiered retention                            phase 1 of retention (trim per policy)

Bad input (unknown ids, missing --yes, bad times / durations) exits 2 and changes nothing.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from tieredcore.cli.common import CommandGroup, require_namespaces
from tieredcore.clock import now_ms, parse_time_ms
from tieredcore.errors import NotFoundError, TieredError, ValidationError
from tieredcore.lifecycle.drain import drain
from tieredcore.lifecycle.reconcile.orphans import ATTACHED_DEFAULT_GRACE_MS, DEFAULT_GRACE_MS
from tieredcore.lifecycle.reconcile.report import ReconcileReport
from tieredcore.lifecycle.reconcile.run import reconcile, resolve_dry_run
from tieredcore.lifecycle.retention import plan_retention, trim_topic
from tieredcore.meta.deletion_log import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_RETRY_DELAY_MS,
    DeletionLog,
    Entry,
)
from tieredcore.outcomes import Outcome
from tieredcore.units import non_negative_duration_ms
from tieredcore.workspace import Workspace

EXIT_OK, EXIT_FAILED = 0, 1
COMMANDS = ("deletions", "reconcile", "retention")
_AS_OF_HELP = "logical time (ISO 8601 or epoch ms; default now)"


# -- parser -----------------------------------------------------------------------------------


def add_parser(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("deletions", parents=parents, help="the deletion log: stats, dead letters, drain")
    ds = p.add_subparsers(dest="deletions_cmd", required=True)
    ds.add_parser("stats", parents=parents,
                  help="in-flight estimate (pending + retrying), dead-letter count, PIP-186 counters")

    q = ds.add_parser("dlq", parents=parents, help="dead-letter list: list | requeue | drop")
    qs = q.add_subparsers(dest="dlq_cmd", required=True)
    qs.add_parser("list", parents=parents, help="one line per dead letter")
    r = qs.add_parser("requeue", parents=parents, help="move dead letters back to pending (fresh attempt count)")
    r.add_argument("ids", nargs="*", metavar="ID")
    r.add_argument("--all", action="store_true", help="every (well-formed) dead letter")
    r.add_argument("--as-of", help=f"when they become due: {_AS_OF_HELP}")
    d = qs.add_parser("drop", parents=parents,
                      help="forget dead letters (their storage was dealt with by hand); requires --yes")
    d.add_argument("ids", nargs="*", metavar="ID")
    d.add_argument("--all", action="store_true", help="every dead letter")
    d.add_argument("--yes", action="store_true", help="really drop (required)")

    dr = ds.add_parser(
        "drain", parents=parents,
        help="phase 2 in this process: delete the storage of due records and acknowledge them "
             "(small workspaces; the Spark job for big ones)",
        description="Process every record due at --as-of. Exit status: 0, also when records are retrying "
                    "or still in use; 1 if this run moved records to the dead-letter list (attempt limit "
                    "reached, unsupported or malformed records): see `tiered deletions dlq list`; 2 on bad "
                    "input. A dry run changes nothing and exits 0.",
    )
    dr.add_argument("--as-of", help=_AS_OF_HELP)
    dr.add_argument("--dry-run", action="store_true", help="classify (would delete / in use / mismatch) only")
    dr.add_argument("--max-attempts", type=int, default=DEFAULT_MAX_ATTEMPTS,
                    help=f"dead-letter after this many failed attempts (default {DEFAULT_MAX_ATTEMPTS})")
    dr.add_argument("--retry-delay", default=f"{DEFAULT_RETRY_DELAY_MS}ms",
                    help="first back-off after a failure, doubling each time (e.g. 10m; default 10m)")

    rc = sub.add_parser(
        "reconcile", parents=parents,
        help="find orphaned storage in both tiers and append deletion records for it",
        description="List every object-store location and the hot tier, anti-join with the topic records "
                    "and the deletion log, and append one record per orphan older than --grace (the drain "
                    "deletes them). The report lists every candidate (key, size, age, why) and what was "
                    "left alone and why. On a workspace attached to a Pulsar cluster (tiered init "
                    "--pulsar-zk) it only plans unless --apply. Exit status: 0; 1 if a location, a topic "
                    "record or an append failed (see errors); 2 on bad input.",
    )
    rc.add_argument("--as-of", help=_AS_OF_HELP)
    rc.add_argument("--grace", default=None,
                    help="ignore storage younger than this (default 1h: in-flight offloads; attached to a Pulsar "
                         "cluster 7d: well above the brokers' offload deletion lag, managedLedgerOffloadDeletionLagMs "
                         "4h by default, above the longest offload and the brokers' own cleanup retries, and "
                         "time for an operator to notice a broker that lost metadata)")
    rc.add_argument("--dry-run", action="store_true", help="report, append and abort nothing")
    rc.add_argument("--apply", action="store_true",
                    help="append the deletion records (attached to a Pulsar cluster a run only plans without "
                         "it; elsewhere the default)")

    rt = sub.add_parser(
        "retention", parents=parents,
        help="trim ledgers past retention (phase 1: records appended, topics updated)",
        description="Per effective policy, append deletion records for ledgers past retention and remove "
                    "them from their topics. Storage goes with the next `tiered deletions drain`. Exit "
                    "status: 0; 1 if a topic failed; 2 on bad input.",
    )
    rt.add_argument("--namespace", action="append", help="tenant/namespace (repeatable; default all)")
    rt.add_argument("--as-of", help=_AS_OF_HELP)
    rt.add_argument("--dry-run", action="store_true", help="list the ledgers that would go, change nothing")


# -- helpers ----------------------------------------------------------------------------------


def _as_of(a: argparse.Namespace) -> int:
    return parse_time_ms(a.as_of, "--as-of") if a.as_of else now_ms()


def _age(ms: int | None) -> str:
    if ms is None:
        return "-"
    s = ms // 1000
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= n:
            return f"{s / n:.1f}{unit}"
    return f"{s}s"


def _dead_row(e: Entry) -> dict[str, Any]:
    if e.record is None:  # malformed: dead_letter() kept the raw bytes in a small JSON wrapper
        try:
            body = json.loads(e.raw)
        except ValueError:
            body = {}
        body = body if isinstance(body, dict) else {}
        return {"id": e.id, "topic": "", "ledger": None, "type": "", "reason": "", "attempts": None,
                "dead_reason": str(body.get("dead_reason") or e.error), "malformed": True}
    r = e.record
    return {"id": e.id, "topic": r.topic, "ledger": r.ledger_id, "type": r.type, "reason": r.reason,
            "attempts": r.attempts, "dead_reason": r.dead_reason, "malformed": False}


def _select_ids(a: argparse.Namespace, known: dict[str, Entry], verb: str) -> list[str]:
    if a.all and a.ids:
        raise ValidationError(f"dlq {verb}: give IDs or --all, not both")
    if not a.all and not a.ids:
        raise ValidationError(f"dlq {verb}: give at least one ID, or --all")
    if a.all:
        return sorted(known)
    missing = [i for i in a.ids if i not in known]
    if missing:
        raise NotFoundError(f"dlq {verb}: not in the dead-letter list: {', '.join(missing)}")
    return list(dict.fromkeys(a.ids))


# -- commands ---------------------------------------------------------------------------------


def _stats(a: argparse.Namespace, dlog: DeletionLog) -> dict[str, Any]:
    res = dlog.stats()
    if not a.json:
        c = res["counters"]
        print(f"in flight {res['in_flight']} (pending {res['pending']}, retrying {res['retrying']}); "
              f"dead letters {res['dead_letter']}")
        print("counters: " + ", ".join(f"{k}={v}" for k, v in c.items()))
        res["_printed"] = True
    return res


def _dlq(a: argparse.Namespace, dlog: DeletionLog) -> dict[str, Any]:
    entries = {e.id: e for e in dlog.dead_letters()}
    if a.dlq_cmd == "list":
        rows = [_dead_row(e) for e in sorted(entries.values(), key=lambda e: e.id)]
        res: dict[str, Any] = {"dead_letters": rows, "count": len(rows)}
        if not a.json:
            for r in rows:
                what = ("(malformed)" if r["malformed"] else
                        f"{r['topic']} ledger {r['ledger']} {r['type']} {r['reason']} attempts={r['attempts']}")
                print(f"{r['id']}  {what}  {r['dead_reason']}")
            print(f"{len(rows)} dead letter(s)")
            res["_printed"] = True
        return res
    if a.dlq_cmd == "requeue":
        ids = _select_ids(a, entries, "requeue")
        malformed = [i for i in ids if entries[i].record is None]
        if malformed and not a.all:
            raise ValidationError(f"dlq requeue: malformed records cannot be requeued (only dropped): "
                                  f"{', '.join(malformed)}")
        ids = [i for i in ids if entries[i].record is not None]
        as_of = _as_of(a)
        moved = dlog.requeue(ids, as_of)
        res = {"requeued": moved, "skipped_malformed": malformed, "lost_race": sorted(set(ids) - set(moved))}
        if not a.json:
            print(f"requeued {len(moved)} dead letter(s)"
                  + (f"; {len(malformed)} malformed left (drop them)" if malformed else "")
                  + ("; run `tiered deletions drain`" if moved else ""))
            res["_printed"] = True
        return res
    # drop
    ids = _select_ids(a, entries, "drop")
    if not a.yes:
        raise ValidationError(f"dlq drop: refusing to forget {len(ids)} dead letter(s) without --yes "
                              "(their storage is then never deleted by the drain)")
    dropped = dlog.drop(ids)
    res = {"dropped": dropped}
    if not a.json:
        print(f"dropped {len(dropped)} dead letter(s)")
        res["_printed"] = True
    return res


def _drain(a: argparse.Namespace, ws: Workspace) -> dict[str, Any]:
    as_of = _as_of(a)
    delay = non_negative_duration_ms(a.retry_delay, "--retry-delay")
    if a.max_attempts < 1:
        raise ValidationError(f"--max-attempts must be >= 1, got {a.max_attempts}")
    rep = drain(ws, as_of, delay_ms=delay, max_attempts=a.max_attempts, dry_run=a.dry_run)
    res = rep.as_dict()
    dead = 0 if a.dry_run else rep.dead_lettered + rep.malformed
    res["stats"] = DeletionLog(ws.metadata).stats()
    res["_exit"] = EXIT_FAILED if rep.failed() else EXIT_OK  # dead ones, or kept for an unreadable topic record
    if not a.json:
        counts = ", ".join(f"{v} {k}" for k, v in rep.counts().items() if v) or "nothing due"
        print(f"drain as of {as_of}{' (dry run)' if a.dry_run else ''}: {rep.entries} record(s): {counts}")
        for r in rep.rows:
            if r.outcome in (Outcome.DEAD_LETTERED, Outcome.MALFORMED, Outcome.RETRYING, Outcome.REFUSED_MISMATCH,
                             Outcome.REFUSED_FOREIGN, Outcome.UNREADABLE_TOPIC):
                print(f"  {r.outcome:<16} {r.id} {r.topic} ledger {r.ledger} {r.type}: {r.error}")
        s = res["stats"]
        print(f"now in flight {s['in_flight']} (retrying {s['retrying']}), dead letters {s['dead_letter']}")
        if dead:
            print("records were dead-lettered: see `tiered deletions dlq list`")
        res["_printed"] = True
    return res


def _reconcile(a: argparse.Namespace, ws: Workspace) -> dict[str, Any]:
    as_of = _as_of(a)
    dry_run = resolve_dry_run(ws.attached, a.dry_run, a.apply)
    default = ATTACHED_DEFAULT_GRACE_MS if ws.attached else DEFAULT_GRACE_MS
    grace = non_negative_duration_ms(a.grace, "--grace") if a.grace is not None else default
    rep = reconcile(ws, as_of, grace, dry_run=dry_run)
    res = rep.as_dict()
    res["_exit"] = EXIT_FAILED if rep.errors else EXIT_OK
    if not a.json:
        _print_reconcile(rep, as_of, grace)
        res["_printed"] = True
    return res


def _print_reconcile(rep: ReconcileReport, as_of: int, grace: int) -> None:
    dry_run = rep.dry_run
    verb = "would append" if dry_run else "appended"
    n = rep.orphan_groups + rep.hot_orphans
    print(f"reconcile as of {as_of} (grace {_age(grace)}){' (dry run)' if dry_run else ''}: "
          f"{rep.objects_listed:,} objects listed in {len(rep.locations)} location(s), "
          f"{rep.hot_ledgers:,} hot ledgers")
    for ns, kinds in sorted(rep.by_namespace.items()):
        for kind, d in sorted(kinds.items()):
            print(f"  {ns:<28} {kind:<10} {d['count']:>6} orphan(s) {d['objects']:>7} object(s) "
                  f"{d['bytes']:>14,} bytes")
    print(f"orphans: {rep.orphan_groups} offloaded group(s) ({rep.orphan_objects} objects, "
          f"{rep.orphan_bytes:,} bytes), {rep.hot_orphans} hot ledger(s) ({rep.hot_orphan_bytes:,} bytes), "
          f"{rep.stale_uploads} stale upload(s); oldest {_age(rep.oldest_orphan_age_ms)}")
    for c in rep.candidates:
        print(f"  orphan   {c['key']}  {c['size']:,} bytes  age {c['age']}: {c['why']}")
    for w in rep.withheld:
        print(f"  withheld {w['key']}  {w['size']:,} bytes  age {w['age']} ({w['reason']}): {w['why']}")
    if rep.withheld_not_listed:
        print(f"  withheld {rep.withheld_not_listed:,} more object(s) not listed")
    print(f"{verb} {n if dry_run else rep.records_appended} deletion record(s)"
          + ("; run `tiered deletions drain`" if rep.records_appended else ""))
    if rep.manifests_superseded:
        print(f"{'would record' if dry_run else 'recorded'} {rep.manifests_superseded} superseded topic "
              "manifest(s) for deletion (docs/recovery.md)")
    for note in rep.notes:
        print(f"note: {note}")
    for e in rep.errors:
        print(f"  error: {e}")


def _retention(a: argparse.Namespace, ws: Workspace) -> dict[str, Any]:
    as_of = _as_of(a)
    namespaces = require_namespaces(ws, a.namespace) if a.namespace else None
    work = plan_retention(ws, namespaces, as_of, dry_run=a.dry_run)
    rows: list[dict[str, Any]] = []
    failed = 0
    for w in work:
        try:
            results = trim_topic(ws, w.topic, as_of, dry_run=a.dry_run, ledgers=w.ledgers)
        except TieredError as e:
            failed += 1
            rows.append({"topic": w.topic, "ledger": None, "outcome": "failed",
                         "error": f"{type(e).__name__}: {e}", "bytes": 0, "entries": 0})
            continue
        rows.extend({"topic": r.topic, "ledger": r.ledger, "outcome": r.outcome, "error": r.error,
                     "bytes": r.bytes, "entries": r.entries} for r in results)
    done = Outcome.PLANNED if a.dry_run else Outcome.TRIMMED
    gone = [r for r in rows if r["outcome"] == done]
    res: dict[str, Any] = {
        "as_of_ms": as_of, "dry_run": a.dry_run, "topics": len(work), "ledgers": len(gone),
        "bytes": sum(r["bytes"] for r in gone), "entries": sum(r["entries"] for r in gone), "failed": failed,
        "rows": rows, "next": "" if a.dry_run or not gone else "tiered deletions drain",
        "_exit": EXIT_FAILED if failed else EXIT_OK,
    }
    if not a.json:
        verb = "would trim" if a.dry_run else "trimmed"
        print(f"retention as of {as_of}: {verb} {len(gone)} ledger(s) ({res['entries']:,} entries, "
              f"{res['bytes']:,} bytes) of {len(work)} topic(s); {failed} failed")
        for r in rows:
            if r["outcome"] != done:
                print(f"  {r['outcome']:<8} {r['topic']} ledger {r['ledger']}: {r['error']}")
        if gone and not a.dry_run:
            print("storage is deleted by phase 2: run `tiered deletions drain`")
        res["_printed"] = True
    return res


def run(a: argparse.Namespace, ws: Workspace, progress: Any = None) -> dict[str, Any]:
    if a.cmd == "reconcile":
        return _reconcile(a, ws)
    if a.cmd == "retention":
        return _retention(a, ws)
    dlog = DeletionLog(ws.metadata)
    if a.deletions_cmd == "stats":
        return _stats(a, dlog)
    if a.deletions_cmd == "dlq":
        return _dlq(a, dlog)
    return _drain(a, ws)


GROUP = CommandGroup(COMMANDS, add_parser, run)
