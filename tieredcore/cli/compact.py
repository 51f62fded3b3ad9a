"""`tiered compact`: repack runs of small offloaded objects into large segments (docs/compaction.md), in
this process. A real run only touches topics whose policy enables compaction; a dry run looks at any
topic and changes nothing, so an operator can see what enabling it would save."""

from __future__ import annotations

import argparse
from typing import Any

from tieredcore.cli.common import EXIT_FAILED, EXIT_OK, CommandGroup, Progress, mib, require_namespaces
from tieredcore.clock import iso_ms, now_ms, parse_time_ms
from tieredcore.errors import ValidationError
from tieredcore.lifecycle.compaction_run import CompactionReport, plan_topics, run_topics
from tieredcore.lifecycle.compaction_settings import PRICE_OPTIONS, parse_prices, parse_thresholds
from tieredcore.names import TopicName
from tieredcore.offload.compaction import OK_OUTCOMES
from tieredcore.outcomes import Outcome
from tieredcore.workspace import Workspace

COMMANDS = ("compact",)


def add_parser(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    s = sub.add_parser(
        "compact", parents=parents,
        help="repack runs of small offloaded objects into large segments (--dry-run: the plan and its cost)",
        description="Per topic, runs of consecutive offloaded objects smaller than the policy's compaction min "
                    "object size are rewritten into segments of up to its target size, verified, and switched "
                    "in one compare-and-set; the old objects go to the deletion log, due after the delete "
                    "delay. Reads never change. A real run compacts the topics whose policy enables "
                    "compaction (`tiered policies set NS --compaction on`); --dry-run plans any topic and "
                    "changes nothing. Exit status: 0 ok; 1 when a batch failed or lost its switch to a "
                    "concurrent change (retried next run); 2 on bad input or when nothing named has "
                    "compaction enabled (nothing changed).")
    s.add_argument("topic", nargs="*", help="topics to compact (default: every topic of --namespace)")
    s.add_argument("--namespace", action="append",
                   help="tenant/namespace (repeatable; default: every namespace with compaction enabled, "
                        "or every namespace in a dry run)")
    s.add_argument("--dry-run", action="store_true",
                   help="print the plan (objects and bytes before → after, estimated cost change); change nothing")
    s.add_argument("--min-object-size", metavar="SIZE",
                   help="override the policy: objects below this are small (e.g. 8M)")
    s.add_argument("--target-size", metavar="SIZE", help="override the policy: new segments of up to this (e.g. 256M)")
    s.add_argument("--delete-delay", metavar="DURATION",
                   help="override the policy: old objects are deleted this long after the switch (e.g. 1h)")
    for opt in PRICE_OPTIONS:
        s.add_argument(opt.flag, dest=opt.field, metavar="N", help=opt.help)
    s.add_argument("--as-of", help="the run's logical time (ISO 8601 or epoch ms; default now): recorded "
                                   "timestamps and when the old objects become due for deletion")


def run(a: argparse.Namespace, ws: Workspace, progress: Progress | None = None) -> dict[str, Any]:
    # everything the operator typed is checked before anything is read or written
    as_of = parse_time_ms(a.as_of, "--as-of") if a.as_of else now_ms()
    th = parse_thresholds(a.min_object_size, a.target_size, a.delete_delay)
    cost = parse_prices(vars(a))
    if a.topic and a.namespace:
        raise ValidationError("give topic names or --namespace, not both")
    namespaces = require_namespaces(ws, a.namespace) if a.namespace else None
    ps = ws.policies
    if a.dry_run and not a.topic and namespaces is None:
        namespaces = ws.ml.list_namespaces()  # what would compaction save anywhere?
    candidates, notes = plan_topics(ws, namespaces, a.topic or None, require_enabled=False)
    candidates = list(dict.fromkeys(candidates))  # a topic named twice (in any spelling) is compacted once
    enabled = {t: ps.for_topic(t).compaction_enabled for t in candidates}
    if a.dry_run:
        topics = candidates
    else:
        topics = [t for t in candidates if enabled[t]]
        off = [t for t in candidates if not enabled[t]]
        if not topics and (off or (not a.topic and namespaces is None)):
            raise ValidationError(_nothing_enabled(off))
        notes += [f"{TopicName.parse(t).full}: compaction is off in its policy (skipped)" for t in off]
    # the overrides against every chosen topic's policy (e.g. a min size above its target): bad input
    for t in topics:
        th.apply(ps.for_topic(t), f"topic {TopicName.parse(t).full} with the overrides")

    def on_progress(topic: str, done: int, total: int) -> None:
        if progress is not None:
            progress(f"compact: {topic}: {mib(done)} / {mib(total)}")

    rows = list(run_topics(ws.config, topics, as_of_ms=as_of, dry_run=a.dry_run, thresholds=th,
                           progress=on_progress))
    report = CompactionReport(as_of, a.dry_run, rows, topics=topics, notes=notes, cost=cost,
                              thresholds=th.as_dict())
    failed = [r for r in rows if r["outcome"] not in OK_OUTCOMES]
    summary = report.summary()
    off_ns = sorted({TopicName.parse(t).namespace_name for t in topics if not enabled[t]})
    return {**summary, "as_of": iso_ms(as_of), "compaction_off": off_ns, "topics": _per_topic(topics, rows),
            "rows": rows, "_exit": EXIT_FAILED if failed else EXIT_OK}


def _nothing_enabled(off: list[str]) -> str:
    if not off:
        return ("no namespace has compaction enabled: enable it with `tiered policies set NAMESPACE "
                "--compaction on` (see what it would save first: `tiered compact --dry-run`)")
    nss = sorted({TopicName.parse(t).namespace_name for t in off})
    return (f"compaction is off in the policy of {len(off)} topic(s) of {', '.join(nss)}: enable it with "
            + "; ".join(f"`tiered policies set {ns} --compaction on`" for ns in nss)
            + " (see what it would save first: rerun with --dry-run)")


def _per_topic(topics: list[str], rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per topic examined: batches compacted (or planned), objects and bytes before → after, problems."""
    out: dict[str, dict[str, Any]] = {}
    for t in topics:
        out[TopicName.parse(t).full] = {"batches": 0, "ledgers": 0, "objects_before": 0, "objects_after": 0,
                                        "bytes_before": 0, "bytes_after": 0, "outcomes": {}}
    for r in rows:
        d = out.setdefault(TopicName.parse(r["topic"]).full, {
            "batches": 0, "ledgers": 0, "objects_before": 0, "objects_after": 0, "bytes_before": 0,
            "bytes_after": 0, "outcomes": {}})
        d["outcomes"][r["outcome"]] = d["outcomes"].get(r["outcome"], 0) + 1
        if r["outcome"] in (Outcome.COMPACTED, Outcome.WOULD_COMPACT):
            d["batches"] += 1
            d["ledgers"] += len(r["ledgers"])
            for k in ("objects_before", "objects_after", "bytes_before", "bytes_after"):
                d[k] += r[k]
    return out


def _usd(v: float) -> str:
    """Signed dollars; fractions of a cent shown (a small namespace's change is that small)."""
    if v == 0:
        return "$0"
    sign = "-" if v < 0 else "+"
    return f"{sign}${abs(v):,.2f}" if abs(v) >= 1 else f"{sign}${abs(v):.6f}"


def print_human(cmd: str, res: dict[str, Any]) -> None:
    dry = res["dry_run"]
    est = " (estimated)" if dry else ""
    print(f"compaction{' dry run (nothing changed)' if dry else ''} as of {res['as_of']}: "
          f"{len(res['topics'])} topic(s) in {len(res['namespaces'])} namespace(s)")
    for n in res["notes"]:
        print(f"  note: {n}")
    off = set(res["compaction_off"])
    by_ns: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for t, d in res["topics"].items():
        by_ns.setdefault(TopicName.parse(t).namespace_name, []).append((t, d))
    for ns, v in res["namespaces"].items():
        verb = "planned" if dry else "compacted"
        flag = " [compaction off in its policy: what enabling it would do]" if ns in off else ""
        print(f"{ns}: {v['topics']} topic(s), {v['batches']} batch(es) {verb}, objects {v['objects_before']} → "
              f"{v['objects_after']}, {mib(v['bytes_before'])} → {mib(v['bytes_after'])}{est}; monthly cost "
              f"{_usd(v['cost']['total_month'])}, one-time {_usd(v['cost']['one_time'])}{flag}")
        for t, d in by_ns.get(ns, []):
            # busy (another runner holds the lease), failed, conflict...: named after the counts
            other = {k: n for k, n in d["outcomes"].items() if k not in (Outcome.COMPACTED, Outcome.WOULD_COMPACT)}
            more = f" ({', '.join(f'{n} {k}' for k, n in sorted(other.items()))})" if other else ""
            if not d["batches"] and not other:
                print(f"  {t}: nothing to compact")
                continue
            print(f"  {t}: {d['batches']} batch(es) of {d['ledgers']} ledger(s): objects {d['objects_before']} → "
                  f"{d['objects_after']}, {mib(d['bytes_before'])} → {mib(d['bytes_after'])}{est}{more}")
    c = res["cost"]
    p = res["prices"]
    print(f"objects {res['objects_before']} → {res['objects_after']}, {mib(res['bytes_before'])} → "
          f"{mib(res['bytes_after'])}{est}")
    print(f"monthly cost change {_usd(c['total_month'])} (storage {_usd(c['storage_month'])}, listings "
          f"{_usd(c['listing_month'])}); one-time cost {_usd(c['one_time'])} (prices: ${p['gb_month']}/GB-month, "
          f"${p['put_per_1000']}/1k PUT, ${p['get_per_1000']}/1k GET, {p['listings_per_month']} listings/month)")
    for f in res["failed"]:
        print(f"FAILED {f}")
    if res["failed"]:
        print("failed or conflicting topics are retried next run")


GROUP = CommandGroup(COMMANDS, add_parser, run, print_human)
