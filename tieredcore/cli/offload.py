"""`tiered offload` (a prefix, or keep at most N bytes hot) and `tiered status` (what lives in which tier)."""


from __future__ import annotations

import argparse
import time
from typing import Any

from tieredcore.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    Progress,
    mib,
    select_topics,
)
from tieredcore.errors import ValidationError
from tieredcore.lifecycle.planner import ManualOffload
from tieredcore.lifecycle.work import policy_store
from tieredcore.names import TopicName
from tieredcore.offload.context import context_uuid
from tieredcore.workspace import Workspace

COMMANDS = ("offload", "status")


def add_parser(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    s = sub.add_parser("offload", parents=parents, help="offload sealed ledgers (prefix or keep-bytes)")
    s.add_argument("topic", nargs="*")
    s.add_argument("--namespace", help="every topic of this namespace")
    s.add_argument("--up-to", help="offload sealed ledgers before this position LEDGER:ENTRY")
    s.add_argument("--keep-bytes", metavar="SIZE",
                   help="keep at most SIZE bytes hot (e.g. 0, 1048576, 512K, 64M, 1G): like `topics offload -s`")

    s = sub.add_parser("status", parents=parents, help="per-topic (and per-ledger) tier table")
    s.add_argument("--by-namespace", action="store_true", help="totals per namespace and object-store totals")
    s.add_argument("topic", nargs="*")
    s.add_argument("--namespace")
    s.add_argument("--ledgers", action="store_true", help="one line per ledger")


def run(args: argparse.Namespace, ws: Workspace, progress: Progress) -> dict[str, Any]:
    if args.cmd == "offload":
        return cmd_offload(args, ws, progress)
    return cmd_status(args, ws, progress)


def _tier(li, is_last: bool) -> str:
    ctx = li.offloadContext if li.HasField("offloadContext") else None
    if ctx is not None and ctx.complete:
        return "offloaded" if ctx.bookkeeperDeleted else "both"
    return "hot"


def cmd_offload(args: argparse.Namespace, ws: Workspace, progress: Progress) -> dict[str, Any]:
    manual = ManualOffload.parse(args.up_to, args.keep_bytes)
    if manual.up_to is not None and not args.topic:
        raise ValidationError("--up-to needs explicit topic names")
    topics = select_topics(ws, args.namespace, args.topic)
    totals = {"bytes": 0}

    def on_progress(topic: str, lid: int, done: int, total: int) -> None:
        progress(f"offload: {topic} ledger {lid}: {mib(done)} / {mib(total)}")

    # each topic goes where its effective policy says (store, block size), as in the Spark sweep;
    # resolved for every topic before the first offload so a bad policy changes nothing
    ps = policy_store(ws)
    offloaders = [ws.topic_offloader(progress=on_progress, offloader=ws.offloader_for_policy(ps.for_topic(t)))
                  for t in topics]
    results = []
    started = time.monotonic()
    for t, tof in zip(topics, offloaders, strict=True):
        res = tof.offload_ledgers(t, manual.select(ws.ml.get_topic(t)[0].ledgerInfo))
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


def cmd_status(args: argparse.Namespace, ws: Workspace, progress: Progress) -> dict[str, Any]:
    topics = select_topics(ws, args.namespace, args.topic)
    rows = []
    for t in topics:
        info, version = ws.ml.get_topic(t)
        row = {"topic": t.full, "version": version, "ledgers": len(info.ledgerInfo),
               "hot_bytes": 0, "offloaded_bytes": 0, "hot_only": 0, "both": 0, "offloaded_only": 0,
               "open": 0, "entries": 0, "ledger_detail": []}
        for i, li in enumerate(info.ledgerInfo):
            is_last = i == len(info.ledgerInfo) - 1
            tier = _tier(li, is_last)
            is_open = li.timestamp <= 0
            row["open"] += is_open
            row["entries"] += li.entries
            row[{"hot": "hot_only", "both": "both", "offloaded": "offloaded_only"}[tier]] += 1
            if tier in ("hot", "both"):
                row["hot_bytes"] += li.size
            if tier in ("both", "offloaded"):
                row["offloaded_bytes"] += li.size
            if args.ledgers:
                row["ledger_detail"].append({
                    "ledger": li.ledgerId, "entries": li.entries, "size": li.size,
                    "state": "open" if is_open else "sealed", "tier": tier,
                    "uuid": context_uuid(li),
                    "offloaded_at": li.offloadContext.timestamp if tier != "hot" else None,
                })
        if not args.ledgers:
            del row["ledger_detail"]
        rows.append(row)
    res: dict[str, Any] = {"topics": rows}
    if args.by_namespace:
        res["namespaces"] = _by_namespace(rows)
        res["store"] = _store_totals(ws)
    return res


def _by_namespace(rows: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    keys = ("ledgers", "hot_only", "both", "offloaded_only", "hot_bytes", "offloaded_bytes", "entries")
    for r in rows:
        ns = TopicName.parse(r["topic"]).namespace_name
        agg = out.setdefault(ns, {"topics": 0, **dict.fromkeys(keys, 0)})
        agg["topics"] += 1
        for k in keys:
            agg[k] += r[k]
    return out


def _store_totals(ws: Workspace) -> dict[str, Any]:
    """Objects under the workspace store's offload prefix (what an operator's bill is made of), but the
    owner markers (tieredcore.stores.ownership)."""
    from tieredcore.stores.blob import iter_objects
    from tieredcore.stores.ownership import is_marker_key

    n = size = 0
    prefix = ws.offloader.prefix
    for o in iter_objects(ws.store, prefix):
        if is_marker_key(o.key, prefix):
            continue
        n += 1
        size += o.size
    return {"url": ws.config.store_url, "objects": n, "bytes": size}


def print_human(cmd: str, res: dict[str, Any]) -> None:
    if cmd == "offload":
        print(f"offloaded {res['offloaded']} ledger(s) of {res['topics']} topic(s), {mib(res['bytes'])} "
              f"in {res['seconds']}s; {res['failed']} failed")
        return
    if "namespaces" in res:
        print(f"{'namespace':<28} {'topics':>6} {'ledgers':>7} {'hot':>5} {'both':>5} {'cold':>5} "
              f"{'hot MiB':>10} {'cold MiB':>10}")
        for ns, a in sorted(res["namespaces"].items()):
            print(f"{ns:<28} {a['topics']:>6} {a['ledgers']:>7} {a['hot_only']:>5} {a['both']:>5} "
                  f"{a['offloaded_only']:>5} {a['hot_bytes'] / 2**20:>10,.1f} {a['offloaded_bytes'] / 2**20:>10,.1f}")
        st = res["store"]
        print(f"object store {st['url']}: {st['objects']:,} objects, {st['bytes'] / 2**20:,.1f} MiB")
        return
    hdr = f"{'topic':<48} {'ledgers':>7} {'hot':>6} {'both':>5} {'cold':>5} {'hot bytes':>14} {'cold bytes':>14}"
    print(hdr)
    for r in res["topics"]:
        print(f"{r['topic']:<48} {r['ledgers']:>7} {r['hot_only']:>6} {r['both']:>5} {r['offloaded_only']:>5} "
              f"{r['hot_bytes']:>14,} {r['offloaded_bytes']:>14,}")
        for d in r.get("ledger_detail", []):
            print(f"    ledger {d['ledger']:>8} {d['state']:<6} {d['tier']:<9} entries={d['entries']:<8} "
                  f"size={d['size']:<12,} uuid={d['uuid'] or '-'}")
