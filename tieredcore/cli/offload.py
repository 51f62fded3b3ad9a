"""`tiered offload` (a prefix, or keep at most N bytes hot; or, with ``--streaming``, PIP-76 segments of
every entry not yet offloaded) and `tiered status` (what lives in which tier, segments included)."""


from __future__ import annotations

import argparse
import time
from typing import Any

from tieredcore.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    CommandGroup,
    Progress,
    mib,
    select_topics,
)
from tieredcore.clock import now_ms, parse_time_ms
from tieredcore.errors import NotFoundError, ValidationError
from tieredcore.lifecycle.planner import ManualOffload
from tieredcore.lifecycle.replica import lag
from tieredcore.lifecycle.status import topic_status
from tieredcore.lifecycle.sweep import plan_streaming, stream_topic
from tieredcore.lifecycle.work import LedgerResult
from tieredcore.workspace import Workspace

COMMANDS = ("offload", "status")


def add_parser(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    s = sub.add_parser("offload", parents=parents, help="offload sealed ledgers (prefix or keep-bytes)")
    s.add_argument("topic", nargs="*")
    s.add_argument("--namespace", help="every topic of this namespace")
    s.add_argument("--up-to", help="offload sealed ledgers before this position LEDGER:ENTRY")
    s.add_argument("--keep-bytes", metavar="SIZE",
                   help="keep at most SIZE bytes hot (e.g. 0, 1048576, 512K, 64M, 1G): like `topics offload -s`")
    s.add_argument("--streaming", action="store_true",
                   help="PIP-76 streaming offload: every entry not yet in the object store, the open ledger's up to "
                        "its last confirmed entry, as segments of the policy's segment and block size; the last, "
                        "smaller segment is closed now (see --respect-rollover)")
    s.add_argument("--respect-rollover", action="store_true",
                   help="with --streaming: keep the last, smaller segment back until its rollover time has passed "
                        "(the sweep's rule) instead of closing it now")
    s.add_argument("--as-of", help="the offload's logical time (ISO 8601 or epoch ms; default now): its recorded "
                                   "timestamps, and the rollover clock of --respect-rollover")

    s = sub.add_parser("status", parents=parents, help="per-topic (and per-ledger) tier table")
    s.add_argument("--by-namespace", action="store_true", help="totals per namespace and object-store totals")
    s.add_argument("topic", nargs="*")
    s.add_argument("--namespace")
    s.add_argument("--ledgers", action="store_true", help="one line per ledger")
    s.add_argument("--cache", action="store_true",
                   help="the chunk cache of transformed objects (configuration, this process's counters, the last "
                        "runs' counters) and, per namespace, stored vs logical bytes of transformed objects (reads "
                        "their manifests)")


def run(args: argparse.Namespace, ws: Workspace, progress: Progress) -> dict[str, Any]:
    if args.cmd == "offload":
        return cmd_offload(args, ws, progress)
    return cmd_status(args, ws, progress)


def cmd_offload(args: argparse.Namespace, ws: Workspace, progress: Progress) -> dict[str, Any]:
    as_of = parse_time_ms(args.as_of, "--as-of") if args.as_of else None
    if args.streaming:
        return cmd_offload_streaming(args, ws, progress, now_ms() if as_of is None else as_of)
    if args.respect_rollover:
        raise ValidationError("--respect-rollover goes with --streaming")
    manual = ManualOffload.parse(args.up_to, args.keep_bytes)
    if manual.up_to is not None and not args.topic:
        raise ValidationError("--up-to needs explicit topic names")
    topics = select_topics(ws, args.namespace, args.topic)
    totals = {"bytes": 0}

    def on_progress(topic: str, lid: int, done: int, total: int) -> None:
        progress(f"offload: {topic} ledger {lid}: {mib(done)} / {mib(total)}")

    # each topic goes where its effective policy says (store, block size), as in the Spark sweep;
    # resolved for every topic before the first offload so a bad policy changes nothing
    ps = ws.policies
    clock = {} if as_of is None else {"clock_ms": lambda: as_of}
    offloaders = [ws.topic_offloader(progress=on_progress, offloader=ws.offloader_for_policy(ps.for_topic(t)),
                                     **clock)
                  for t in topics]
    results = []
    started = time.monotonic()
    budget = ws.failure_budget()  # one for the whole run: a failing store stops it, the rest "aborted"
    for t, tof in zip(topics, offloaders, strict=True):
        res = tof.offload_ledgers(t, manual.select(ws.ml.get_topic(t)[0].ledgerInfo), budget)
        for r in res:
            totals["bytes"] += r.bytes
            progress(f"offload: {r.topic} ledger {r.ledger_id}: {r.outcome} {mib(r.bytes)} in {r.seconds:.2f}s"
                     + (f" — {r.error}" if r.error else ""), force=True)
        results.extend(res)
    el = time.monotonic() - started
    failed = [r for r in results if not r.ok]
    return {"topics": len(topics), "ledgers": len(results),
            "offloaded": sum(r.outcome == "offloaded" for r in results), "failed": len(failed),
            "bytes": totals["bytes"], "seconds": round(el, 3),
            "results": [r.as_dict() for r in results], "_exit": EXIT_FAILED if failed else EXIT_OK}


# what a streaming offload (`--streaming`) reports: segments that did not land fail the command
STREAMING_FAILED = ("failed", "conflict", "unknown", "aborted")


def cmd_offload_streaming(args: argparse.Namespace, ws: Workspace, progress: Progress, as_of: int) -> dict[str, Any]:
    """Every selected topic's entries not yet offloaded, as segments (the sweep's streaming unit,
    tieredcore.lifecycle.sweep.stream_topic) under the topic's lease; the tail closed now unless
    --respect-rollover."""
    if args.up_to is not None or args.keep_bytes is not None:
        raise ValidationError("--streaming offloads every entry up to the last confirmed one; --up-to and "
                              "--keep-bytes select sealed ledgers of a ledger-mode offload")
    if not args.topic and not args.namespace:
        raise ValidationError("--streaming: name the topics, or a --namespace")
    if args.topic and args.namespace:
        raise ValidationError("give topic names or --namespace, not both")
    topics = select_topics(ws, args.namespace, args.topic)
    ps = ws.policies
    policies = [ps.for_topic(t) for t in topics]  # all resolved first: a bad policy changes nothing

    def on_progress(topic: str, lid: int, done: int, total: int) -> None:
        progress(f"offload: {topic} segment from ledger {lid}: {mib(done)} / {mib(total)}")

    budget = ws.failure_budget()
    rows: list[LedgerResult] = []
    started = time.monotonic()
    for t, pol in zip(topics, policies, strict=True):
        try:
            info, _ = ws.ml.get_topic(t)
        except NotFoundError:
            continue  # deleted meanwhile
        w = plan_streaming(ws.hot, t, info, as_of, force_tail=not args.respect_rollover)
        if w is None:
            continue  # every entry is in the object store already
        for r in stream_topic(ws, pol, t, w, budget, progress=on_progress):
            progress(f"offload: {r.topic} {r.what}: {r.outcome} {mib(r.bytes)} in {r.seconds:.2f}s"
                     + (f" — {r.error}" if r.error else ""), force=True)
            rows.append(r)
    done = [r for r in rows if r.outcome == "offloaded"]
    failed = [r for r in rows if r.outcome in STREAMING_FAILED]
    return {"mode": "streaming", "as_of_ms": as_of, "topics": len(topics), "segments": len(done),
            "held": sum(r.outcome == "held" for r in rows), "busy": sum(r.outcome == "busy" for r in rows),
            "failed": len(failed), "bytes": sum(r.bytes for r in done), "entries": sum(r.entries for r in done),
            "seconds": round(time.monotonic() - started, 3), "results": [r.__dict__ for r in rows],
            "_exit": EXIT_FAILED if failed else EXIT_OK}


def cmd_status(args: argparse.Namespace, ws: Workspace, progress: Progress) -> dict[str, Any]:
    topics = select_topics(ws, args.namespace, args.topic)
    report = topic_status(ws, topics, ledgers=args.ledgers, by_namespace=args.by_namespace, cache=args.cache)
    res = report.as_dict()
    if ws.attached:  # the "hot" tier is the cluster's BookKeeper: what is there, not read here
        res["attached"] = {"cluster": ws.config.cluster, "hot_tier": "BookKeeper"}
    if ws.replica:  # how far behind the bucket's manifests its records are
        rl = lag(ws)
        res["replica"] = {**rl.as_dict(), "line": rl.line()}
    # a topic whose record cannot be read fails the command (exit 1); every other topic is still shown
    return {**res, "_exit": EXIT_FAILED if report.unreadable else EXIT_OK}


def _partial_text(p: dict[str, Any]) -> str:
    if p["open"] and p["streamed_through"] == p["last_entry"]:
        return f"{p['ledger']} (open) through its last confirmed entry {p['last_entry']}"
    last = "?" if p["last_entry"] is None else p["last_entry"]
    return f"{p['ledger']}{' (open)' if p['open'] else ''} through entry {p['streamed_through']} of {last}"


def print_human(cmd: str, res: dict[str, Any]) -> None:
    if cmd == "offload":
        if res.get("mode") == "streaming":
            print(f"offloaded {res['segments']} segment(s) of {res['topics']} topic(s), {res['entries']:,} entries, "
                  f"{mib(res['bytes'])} in {res['seconds']}s; {res['held']} held until their rollover, "
                  f"{res['busy']} busy, {res['failed']} failed")
            for r in res["results"]:
                if r["outcome"] in STREAMING_FAILED:
                    print(f"FAILED {r['topic']} segment {r['uuid'] or '-'} [{r['covers']}]: {r['outcome']}: "
                          f"{r['error']}")
            return
        print(f"offloaded {res['offloaded']} ledger(s) of {res['topics']} topic(s), {mib(res['bytes'])} "
              f"in {res['seconds']}s; {res['failed']} failed")
        return
    if res.get("attached"):
        print(f"attached to Pulsar cluster {res['attached']['cluster']!r}: 'bk' is what only its BookKeeper holds "
              "(not offloaded; Pulsar's brokers serve it)")
    if res.get("replica"):
        print(res["replica"]["line"])
        for t in res["replica"]["topics"]:
            if t["behind"]:
                print(f"  {t['topic']}: synced #{t['seen']}, bucket #{t['newest']} ({t['behind']} behind, "
                      f"oldest unseen {t['unseen_age_ms'] // 1000}s old)")
    if "namespaces" in res:
        _print_by_namespace(res)
    else:
        _print_topics(res)
    if "cache" in res:
        print_cache(res["cache"])
    for r in res["topics"]:
        if r.get("error"):
            print(f"ERROR {r['topic']}: its record cannot be read: {r['error']}")


def _counters_text(d: dict[str, Any]) -> str:
    return (f"{d.get('hits', 0):,} hits, {d.get('misses', 0):,} misses, {d.get('loads', 0):,} loads (GETs), "
            f"{d.get('evictions', 0):,} evictions, {d.get('expirations', 0):,} expirations, "
            f"{d.get('prefetched', 0):,} chunks prefetched, {d.get('load_failures', 0):,} failed loads")


def print_cache(c: dict[str, Any]) -> None:
    cf = c["configured"]
    print(f"chunk cache: {cf['chunk_cache']}" + ("" if cf["kind"] == "none" else
          f", at most {mib(cf['max_bytes'])}, prefetch {mib(cf['prefetch_bytes'])}, entries expire "
          f"{cf['ttl_ms'] / 1000:g} s after their last access"))
    if cf["kind"] == "disk":
        print(f"  directory {cf['directory']}: " + (f"{cf['entries']:,} entries, {mib(cf['bytes'])} (plaintext)"
                                                    if cf["exists"] else "not created yet"))
    p = c["process"]
    if p is not None:
        print(f"  this process: {p['entries']:,} entries, {mib(p['bytes'])}; {_counters_text(p)}")
    for r in c["last_runs"]:
        print(f"  last {r['job']} run {r['run_id']}: {_counters_text(r['cache'])}")
    if c["namespaces"]:
        print(f"{'transformed objects':<28} {'objects':>8} {'logical MiB':>12} {'stored MiB':>11} {'stored':>7} "
              f"{'compressed':>10} {'encrypted':>9}")
        for ns, a in sorted(c["namespaces"].items()):
            ratio = a["stored_bytes"] / a["logical_bytes"] if a["logical_bytes"] else 0.0
            print(f"{ns:<28} {a['objects']:>8,} {a['logical_bytes'] / 2**20:>12,.1f} "
                  f"{a['stored_bytes'] / 2**20:>11,.1f} {ratio:>7.1%} {a['compressed']:>10,} {a['encrypted']:>9,}")
    for e in c["errors"]:
        print(f"ERROR {e}")


def _print_by_namespace(res: dict[str, Any]) -> None:
    hot = "bk" if res.get("attached") else "hot"
    print(f"{'namespace':<28} {'topics':>6} {'ledgers':>7} {hot:>5} {'both':>5} {'cold':>5} "
          f"{hot + ' MiB':>10} {'cold MiB':>10} {'segments':>8} {'seg MiB':>8} {'objects':>8}")
    for ns, a in sorted(res["namespaces"].items()):
        print(f"{ns:<28} {a['topics']:>6} {a['ledgers']:>7} {a['hot_only']:>5} {a['both']:>5} "
              f"{a['offloaded_only']:>5} {a['hot_bytes'] / 2**20:>10,.1f} {a['offloaded_bytes'] / 2**20:>10,.1f} "
              f"{a['segments']:>8} {a['segment_bytes'] / 2**20:>8,.1f} {a['objects']:>8,}"
              + (f"  ({a['unreadable']} unreadable)" if a.get("unreadable") else ""))
    st = res["store"]
    print(f"object store {st['url']}: {st['objects']:,} objects, {st['bytes'] / 2**20:,.1f} MiB")


def _print_topics(res: dict[str, Any]) -> None:
    hot = "bk" if res.get("attached") else "hot"
    hdr = (f"{'topic':<48} {'ledgers':>7} {hot:>6} {'both':>5} {'cold':>5} {hot + ' bytes':>14} {'cold bytes':>14} "
           f"{'objects':>8}")
    print(hdr)
    for r in res["topics"]:
        if r.get("error"):
            print(f"{r['topic']:<48} {'unreadable record (see below)':>30}")
            continue
        print(f"{r['topic']:<48} {r['ledgers']:>7} {r['hot_only']:>6} {r['both']:>5} {r['offloaded_only']:>5} "
              f"{r['hot_bytes']:>14,} {r['offloaded_bytes']:>14,} {r['objects']:>8,}")
        if r["segments"] or r["segments_in_flight"]:
            print(f"    segments: {r['segments']} holding {r['segment_bytes']:,} bytes of {r['segment_ledgers']} "
                  f"ledger(s)" + (f"; {r['segments_in_flight']} in flight or abandoned" if r["segments_in_flight"] else ""))
            if r["partially_streamed"]:
                print("    partially streamed: " + "; ".join(_partial_text(p) for p in r["partially_streamed"]))
        for d in r.get("ledger_detail", []):
            seg = (f" segments={len(d['segments'])} through={d['streamed_through']}" if d["segments"] else "")
            if d["uuid"] and d["tier"] == "hot" and not d["segments"]:
                seg += " (offload not complete)"
            tier = "bookkeeper" if res.get("attached") and d["tier"] == "hot" else d["tier"]
            print(f"    ledger {d['ledger']:>8} {d['state']:<6} {tier:<9} entries={d['entries']:<8} "
                  f"size={d['size']:<12,} uuid={d['uuid'] or '-'}{seg}")


GROUP = CommandGroup(COMMANDS, add_parser, run, print_human)
