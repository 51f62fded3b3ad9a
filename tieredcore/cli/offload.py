"""`tiered offload` (a prefix, or keep at most N bytes hot; or, with ``--streaming``, PIP-76 segments of
every entry not yet offloaded) and `tiered status` (what lives in which tier, segments included)."""


from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from tieredcore.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    Progress,
    mib,
    select_topics,
)
from tieredcore.clock import now_ms, parse_time_ms
from tieredcore.cold.location import StoreLocation
from tieredcore.errors import HotLedgerNotFoundError, NotFoundError, TieredError, ValidationError
from tieredcore.formats.keys import INDEX_SUFFIX, LEDGER_INFIX, MANIFEST_SUFFIX, normalize_prefix
from tieredcore.formats.manifest import Manifest
from tieredcore.formats.proto import MLDataFormats_pb2 as pb
from tieredcore.hot.tier import FrameSource
from tieredcore.lifecycle.planner import ManualOffload
from tieredcore.lifecycle.sweep import plan_streaming, stream_topic
from tieredcore.lifecycle.work import LedgerResult
from tieredcore.names import TopicName
from tieredcore.offload.context import (
    context_uuid,
    covered_through,
    incomplete_segment_uuids,
    is_complete,
    is_offloaded,
    is_sealed,
    segment_drivers,
    segment_pieces,
    segment_refs,
)
from tieredcore.offload.copies import copy_uuids
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


def _tier(li, is_last: bool) -> str:
    """hot / both / offloaded; a ledger's object-store copy is its V1 object or, once sealed, the
    streaming segments holding all its entries."""
    if is_offloaded(li):
        return "offloaded" if li.offloadContext.bookkeeperDeleted else "both"
    return "hot"


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


def _segment_status(ws: Workspace, info, row: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """Per topic: completed segments (count), the payload bytes they hold, the ledgers they cover and the
    ledgers only partly in them; per ledger (for --ledgers): its segments and how far they reach.
    A partly streamed ledger's hot copy gives its last confirmed entry and entry sizes."""
    uuids: set[str] = set()
    in_flight: set[str] = set()
    per_ledger: dict[int, dict[str, Any]] = {}
    row.update(segments=0, segment_bytes=0, segment_ledgers=0, partially_streamed=[], segments_in_flight=0)
    for i, li in enumerate(info.ledgerInfo):
        in_flight.update(incomplete_segment_uuids(li))
        pieces = segment_pieces(li)
        if not pieces:
            continue
        uuids.update(p.uuid for p in pieces)
        row["segment_ledgers"] += 1
        through = covered_through(li)
        per_ledger[li.ledgerId] = {"segments": [p.uuid for p in pieces], "streamed_through": through}
        if is_sealed(li) and li.HasField("entries") and through >= li.entries - 1:
            row["segment_bytes"] += li.size
            continue
        is_open = i == len(info.ledgerInfo) - 1 and not is_sealed(li)
        last, nbytes = (li.entries - 1 if li.HasField("entries") else None), None
        try:
            h = ws.hot.open_ledger(li.ledgerId)
        except HotLedgerNotFoundError:
            h = None
        if h is not None:
            try:
                last = h.last_add_confirmed if is_open or last is None else last
                if isinstance(h, FrameSource):
                    nbytes = sum(h.entry_sizes()[: through + 1])
            finally:
                h.close()
        row["segment_bytes"] += nbytes or 0
        row["partially_streamed"].append({"ledger": li.ledgerId, "open": is_open, "streamed_through": through,
                                          "last_entry": last})
    row["segments"] = len(uuids)
    row["segments_in_flight"] = len(in_flight - uuids)
    return per_ledger


def _offloaded_at(li) -> int:
    """When the ledger's object-store copy was complete: its V1 offload, or its last segment."""
    if is_complete(li):
        return li.offloadContext.timestamp
    return max((r.offloaded_ms for r in segment_refs(li) if r.complete), default=0)


def cmd_status(args: argparse.Namespace, ws: Workspace, progress: Progress) -> dict[str, Any]:
    topics = select_topics(ws, args.namespace, args.topic)
    rows = []
    for t in topics:
        info, version = ws.ml.get_topic(t)
        row = {"topic": t.full, "version": version, "ledgers": len(info.ledgerInfo),
               "hot_bytes": 0, "offloaded_bytes": 0, "hot_only": 0, "both": 0, "offloaded_only": 0,
               "open": 0, "entries": 0, "ledger_detail": []}
        per_ledger = _segment_status(ws, info, row)
        # object-store objects holding the topic's data (data + index per V1 copy or segment): what compaction shrinks
        row["objects"] = 2 * len({u for li in info.ledgerInfo for u in copy_uuids(li)})
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
                    "offloaded_at": _offloaded_at(li) if tier != "hot" else None,
                    "segments": per_ledger.get(li.ledgerId, {}).get("segments", []),
                    "streamed_through": per_ledger.get(li.ledgerId, {}).get("streamed_through", -1),
                })
        if not args.ledgers:
            del row["ledger_detail"]
        rows.append(row)
    res: dict[str, Any] = {"topics": rows}
    if args.by_namespace:
        res["namespaces"] = _by_namespace(rows)
        res["store"] = _store_totals(ws)
    if args.cache:
        res["cache"] = cache_status(ws, topics)
    return res


# -- status --cache -----------------------------------------------------------------------------


def _disk_cache_usage(root: Path) -> dict[str, Any]:
    """Bytes and entries in a disk cache's directory now (the files of whichever process uses it)."""
    n = size = 0
    if root.is_dir():
        for p in root.iterdir():
            if p.suffix != ".tmp" and p.is_file():
                n += 1
                size += p.stat().st_size
    return {"directory": str(root), "exists": root.is_dir(), "bytes": size, "entries": n}


def _copies(li) -> list[tuple[pb.OffloadDriverMetadata | None, list[str]]]:
    """(driver metadata, uuids) of the ledger's object-store copy: its V1 uuid, or its segments."""
    if is_complete(li):
        uuid = context_uuid(li)
        dm = li.offloadContext.driverMetadata if li.offloadContext.HasField("driverMetadata") else None
        return [(dm, [f"{uuid}{LEDGER_INFIX}{li.ledgerId}"])] if uuid else []
    drivers = segment_drivers(li)
    return [(drivers.get(p.uuid), [p.uuid]) for p in segment_pieces(li)]


def transformed_bytes(ws: Workspace, topics: list[TopicName]) -> tuple[dict[str, dict[str, int]], list[str]]:
    """Per namespace: the transformed (chunked) objects of its topics' object-store copies, their logical
    bytes (the manifests' ``size``) and what the store holds for them (chunks + manifest). Manifests are
    read from the plain store: no key is unwrapped and no chunk cache is opened (opening a disk cache
    wipes its directory). Objects shared by several ledgers (segments) count once."""
    stores: dict[tuple, tuple[Any, str] | None] = {}
    seen: set[tuple] = set()
    out: dict[str, dict[str, int]] = {}
    errors: list[str] = []
    for t in topics:
        info, _ = ws.ml.get_topic(t)
        agg = out.setdefault(t.namespace_name, {"objects": 0, "logical_bytes": 0, "stored_bytes": 0,
                                                "compressed": 0, "encrypted": 0})
        for li in info.ledgerInfo:
            for dm, names in _copies(li):
                try:
                    loc = StoreLocation.from_driver_metadata(dm) if dm is not None and dm.name else None
                except ValidationError as e:
                    errors.append(f"{t.full} ledger {li.ledgerId}: {e}")
                    continue
                if loc is None or not loc.chunked:
                    continue  # untransformed: stored as it is
                if loc.same_objects(ws.config.store_location):  # the configured client settings
                    loc = ws.config.store_location
                opened = stores.get(loc.objects)
                if opened is None:
                    opened = stores[loc.objects] = (loc.open(ws.config.store_fsync), normalize_prefix(loc.prefix))
                store, prefix = opened
                for name in names:
                    for key in (prefix + name, prefix + name + INDEX_SUFFIX):
                        if (loc.objects, key) in seen:
                            continue
                        seen.add((loc.objects, key))
                        mkey = key + MANIFEST_SUFFIX
                        try:
                            raw = store.get(mkey)
                            m = Manifest.from_json(raw, mkey)
                        except TieredError as e:
                            errors.append(f"{t.full} ledger {li.ledgerId}: {type(e).__name__}: {e}")
                            continue
                        agg["objects"] += 1
                        agg["logical_bytes"] += m.size
                        agg["stored_bytes"] += m.index.transformed_size + len(raw)
                        agg["compressed"] += m.compression != "none"
                        agg["encrypted"] += m.encrypted
    return {ns: a for ns, a in out.items() if a["objects"]}, errors


def _last_runs(reports_dir: str) -> list[dict[str, Any]]:
    """The chunk cache counters of each job's newest run report that has them."""
    root = Path(reports_dir) if reports_dir else None
    if root is None or not root.is_dir():
        return []
    out = []
    for job in sorted(p for p in root.iterdir() if p.is_dir()):
        summaries = sorted(job.glob("*/summary.json"), key=lambda p: p.stat().st_mtime, reverse=True)
        for sp in summaries:
            try:
                doc = json.loads(sp.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(doc, dict) and doc.get("cache"):
                out.append({"job": job.name, "run_id": doc.get("run_id", sp.parent.name), "cache": doc["cache"]})
                break
    return out


def cache_status(ws: Workspace, topics: list[TopicName]) -> dict[str, Any]:
    c = ws.config
    kind = "disk" if c.chunk_cache.startswith("disk:") else c.chunk_cache
    configured: dict[str, Any] = {"chunk_cache": c.chunk_cache, "kind": kind, "max_bytes": c.chunk_cache_size,
                                  "prefetch_bytes": c.chunk_cache_prefetch, "ttl_ms": c.chunk_cache_ttl_ms}
    if kind == "disk":  # looked at before anything could open (and wipe) it
        configured.update(_disk_cache_usage(Path(c.chunk_cache[len("disk:"):])))
    namespaces, errors = transformed_bytes(ws, topics)
    # this process's cache: a memory cache is cheap to open; a disk cache only if this command opened it
    opened = ws.opened_chunk_cache()
    process = opened.describe() if opened is not None else ws.chunk_cache.describe() if kind == "memory" else None
    return {"configured": configured, "process": process, "last_runs": _last_runs(c.reports_dir),
            "namespaces": namespaces, "errors": errors}


def _by_namespace(rows: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    keys = ("ledgers", "hot_only", "both", "offloaded_only", "hot_bytes", "offloaded_bytes", "entries", "segments",
            "segment_bytes", "objects")
    for r in rows:
        ns = TopicName.parse(r["topic"]).namespace_name
        agg = out.setdefault(ns, {"topics": 0, **dict.fromkeys(keys, 0)})
        agg["topics"] += 1
        for k in keys:
            agg[k] += r[k]
    return out


def _store_totals(ws: Workspace) -> dict[str, Any]:
    """Objects under the workspace store's offload prefix (what an operator's bill is made of), but the
    owner markers (tieredcore.offload.ownership)."""
    from tieredcore.cold.blob import iter_objects
    from tieredcore.offload.ownership import is_marker_key

    n = size = 0
    prefix = ws.offloader.prefix
    for o in iter_objects(ws.store, prefix):
        if is_marker_key(o.key, prefix):
            continue
        n += 1
        size += o.size
    return {"url": ws.config.store_url, "objects": n, "bytes": size}


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
    if "namespaces" in res:
        _print_by_namespace(res)
    else:
        _print_topics(res)
    if "cache" in res:
        print_cache(res["cache"])


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
    print(f"{'namespace':<28} {'topics':>6} {'ledgers':>7} {'hot':>5} {'both':>5} {'cold':>5} "
          f"{'hot MiB':>10} {'cold MiB':>10} {'segments':>8} {'seg MiB':>8} {'objects':>8}")
    for ns, a in sorted(res["namespaces"].items()):
        print(f"{ns:<28} {a['topics']:>6} {a['ledgers']:>7} {a['hot_only']:>5} {a['both']:>5} "
              f"{a['offloaded_only']:>5} {a['hot_bytes'] / 2**20:>10,.1f} {a['offloaded_bytes'] / 2**20:>10,.1f} "
              f"{a['segments']:>8} {a['segment_bytes'] / 2**20:>8,.1f} {a['objects']:>8,}")
    st = res["store"]
    print(f"object store {st['url']}: {st['objects']:,} objects, {st['bytes'] / 2**20:,.1f} MiB")


def _print_topics(res: dict[str, Any]) -> None:
    hdr = (f"{'topic':<48} {'ledgers':>7} {'hot':>6} {'both':>5} {'cold':>5} {'hot bytes':>14} {'cold bytes':>14} "
           f"{'objects':>8}")
    print(hdr)
    for r in res["topics"]:
        print(f"{r['topic']:<48} {r['ledgers']:>7} {r['hot_only']:>6} {r['both']:>5} {r['offloaded_only']:>5} "
              f"{r['hot_bytes']:>14,} {r['offloaded_bytes']:>14,} {r['objects']:>8,}")
        if r["segments"] or r["segments_in_flight"]:
            print(f"    segments: {r['segments']} holding {r['segment_bytes']:,} bytes of {r['segment_ledgers']} "
                  f"ledger(s)" + (f"; {r['segments_in_flight']} in flight or abandoned" if r["segments_in_flight"] else ""))
            if r["partially_streamed"]:
                print("    partially streamed: " + "; ".join(_partial_text(p) for p in r["partially_streamed"]))
        for d in r.get("ledger_detail", []):
            seg = (f" segments={len(d['segments'])} through={d['streamed_through']}" if d["segments"] else "")
            print(f"    ledger {d['ledger']:>8} {d['state']:<6} {d['tier']:<9} entries={d['entries']:<8} "
                  f"size={d['size']:<12,} uuid={d['uuid'] or '-'}{seg}")
