"""`tiered`: the operator's command line over a workspace (see README)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from tieredcore import cli_deletions, cli_policies, cli_scrub, cli_topics
from tieredcore.cli_policies import require_namespaces
from tieredcore.clock import now_ms, parse_time_ms
from tieredcore.config import CONFIG_FILE_NAME, Config
from tieredcore.errors import NotFoundError, TieredError, TopicNotFoundError, ValidationError
from tieredcore.lifecycle.sweep import policy_store
from tieredcore.model import INT64_MAX, Position
from tieredcore.names import NamespaceName, TopicName
from tieredcore.offload.context import context_uuid
from tieredcore.topic.reader import READ_PRIORITIES, TIERED_FIRST, TopicReader
from tieredcore.units import parse_keep_bytes
from tieredcore.workload import (
    PROP_COUNT,
    PROP_FIRST_SEQ,
    PROP_MAX,
    PROP_MIN,
    PROP_SEED,
    PROP_SHA,
    Digest,
    PayloadGenerator,
    parse_size_range,
)
from tieredcore.workspace import Workspace

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


# -- helpers ----------------------------------------------------------------------------------


def _err(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _mib(n: float) -> str:
    return f"{n / (1024 * 1024):,.1f} MiB"


def _props(info) -> dict[str, str]:
    return {kv.key: kv.value for kv in info.properties}


def _tier(li, is_last: bool) -> str:
    ctx = li.offloadContext if li.HasField("offloadContext") else None
    if ctx is not None and ctx.complete:
        return "offloaded" if ctx.bookkeeperDeleted else "both"
    return "hot"


def _select_topics(ws: Workspace, namespace: str | None, topics: Sequence[str] | None) -> list[TopicName]:
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
            _err(msg)


# -- commands ---------------------------------------------------------------------------------


def _missing_dirs(path: Path, what: str) -> list[Path]:
    """The directories mkdir(parents=True) would create for `path`, outermost first; refuses (nothing
    created yet) when an existing component is not a directory or the first one cannot be written."""
    missing: list[Path] = []
    p = path
    while not p.exists():
        if p.is_symlink():  # a dangling link: mkdir would fail on it anyway
            raise ValidationError(f"cannot create {what} {path}: {p} is a dangling symbolic link")
        missing.append(p)
        p = p.parent
    if not p.is_dir():
        raise ValidationError(f"cannot create {what} {path}: {p} exists and is not a directory")
    if missing and not os.access(p, os.W_OK | os.X_OK):
        raise ValidationError(f"cannot create {what} {path}: directory {p} is not writable")
    return missing[::-1]


def _make_dirs(dirs: list[tuple[Path, str]]) -> None:
    """Creates every directory or none: a failure (e.g. under /proc, where even root's access() check
    passes) removes the directories made so far, all still empty."""
    plans = [(path, what, _missing_dirs(path, what)) for path, what in dirs]  # check all before creating
    made: list[Path] = []
    for path, what, missing in plans:
        for d in missing:
            if d.is_dir():  # shared with an earlier directory of the list
                continue
            try:
                d.mkdir()
            except OSError as e:
                for m in reversed(made):
                    with contextlib.suppress(OSError):
                        m.rmdir()
                raise ValidationError(f"cannot create {what} {path}: {e.strerror or e} ({d})") from None
            made.append(d)


def cmd_init(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(args.dir or args.workspace or "workspace").resolve()
    cfg_path = root / CONFIG_FILE_NAME
    if root.exists() and not root.is_dir():
        raise ValidationError(f"{root} exists and is not a directory")
    created = not cfg_path.exists() or args.force
    if created:
        overrides: dict[str, Any] = {"store_url": args.store_url} if args.store_url else {}
        if args.cluster:
            overrides["cluster"] = args.cluster
        cfg = Config.for_workspace(root, **overrides)
    else:
        cfg = Config.load(cfg_path, env={})
    dirs = [(root, "workspace directory")]
    for url, what in ((cfg.hot_url, "hot tier directory"), (cfg.store_url, "object store directory")):
        u = urlparse(url)
        if u.scheme == "file":  # URLs are percent-encoded (a workspace path may hold ' ', '%', '#')
            dirs.append((Path(unquote(u.path)), what))
    if cfg.reports_dir:
        dirs.append((Path(cfg.reports_dir), "reports directory"))
    db = _sqlite_path(cfg)
    if db is not None:
        dirs.append((db.parent, "metadata store directory"))
    if created and root.is_dir() and not os.access(root, os.W_OK | os.X_OK):
        raise ValidationError(f"cannot write {cfg_path}: directory {root} is not writable")
    # a store whose owner marker names this cluster with another metadata store is refused before
    # anything is written (tieredcore.stores.ownership); a filesystem store not created yet has no marker
    if not _new_local_store(cfg):
        _check_store_unclaimed(cfg)
    _make_dirs(dirs)
    if created:
        cfg_path.write_text(cfg.to_toml())
    with Workspace(cfg) as ws:
        ws.claim(ws.store, ws.offloader.prefix)  # creates the database and its identity, claims the store
        identity = ws.identity
    return {"workspace": str(root), "config": str(cfg_path), "created": created, "cluster": cfg.cluster,
            "identity": identity, "metadata": cfg.metadata_url, "hot": cfg.hot_url, "store": cfg.store_url}


def _new_local_store(cfg: Config) -> bool:
    """A filesystem store whose directory does not exist yet (opening it would create it)."""
    u = urlparse(cfg.store_url)
    return u.scheme == "file" and not Path(unquote(u.path)).exists()


def _check_store_unclaimed(cfg: Config) -> None:
    """StoreOwnershipError when the store's marker for this cluster names another metadata store (an
    existing metadata store is read for its identity, a missing one is not created)."""
    from tieredcore.offload.keys import normalize_prefix
    from tieredcore.stores.ownership import StoreOwnershipError, read_identity, read_marker

    store, prefix = cfg.open_store()
    marker = read_marker(store, normalize_prefix(prefix), cfg.cluster)
    if marker is None:
        return
    u = urlparse(cfg.metadata_url)
    mine = None
    if u.scheme != "sqlite" or Path(unquote(u.path)).exists():
        meta = cfg.open_metadata()
        try:
            mine = read_identity(meta)
        finally:
            meta.close()
    if mine != marker.identity:
        raise StoreOwnershipError(
            f"{cfg.store_url} is already used by cluster {cfg.cluster!r} of another workspace (metadata store "
            f"{marker.metadata}, identity {marker.identity}). Two workspaces with the same cluster name must not "
            "share a store prefix: give this one another cluster name (--cluster NAME) or another store prefix.")


def cmd_generate(args: argparse.Namespace, ws: Workspace, progress: Progress) -> dict[str, Any]:
    from tieredcore.topic.writer import TopicWriter

    lo, hi = parse_size_range(args.entry_size)
    if args.topics <= 0 or args.ledgers <= 0 or args.entries <= 0:
        raise ValidationError("--topics, --ledgers and --entries must be positive")
    end_ms = parse_time_ms(args.end_time, '--end-time') if args.end_time else now_ms()
    interval = int(args.ledger_interval * 1000)
    namespaces = [NamespaceName.parse(n).name for n in args.namespace]
    topics = [TopicName.parse(f"{ns}/{args.prefix}-{i:04d}") for ns in namespaces for i in range(args.topics)]
    existing = [t.full for t in topics if ws.ml.exists(t)]
    if existing:
        raise ValidationError(f"topic(s) already exist: {', '.join(existing[:5])}; use another --prefix")
    total_bytes = total_entries = 0
    started = time.monotonic()
    for n, t in enumerate(topics, 1):
        gen = PayloadGenerator(args.seed, t.managed_ledger_name, lo, hi)
        # ledger i of N is closed at end - (N - i) * interval: a realistic age spread for policies
        clock = {"now": end_ms - args.ledgers * interval}
        digest = Digest()
        writer = TopicWriter(ws.ml, ws.hot, t, max_entries=args.entries, max_bytes=1 << 62,
                             clock_ms=lambda c=clock: c["now"])
        seq = 0
        for _ in range(args.ledgers):
            batch = list(gen.payloads(seq, args.entries))
            writer.append_many(batch)
            digest.update_many(batch)
            total_bytes += sum(map(len, batch))
            seq += args.entries
            clock["now"] += interval
            writer.rollover()
        writer.close(seal=False)  # the newest ledger stays open and empty, as on a live broker
        total_entries += seq

        def mark(info, gen=gen, digest=digest) -> bool:
            for k, v in ((PROP_SEED, gen.seed), (PROP_MIN, gen.min_size), (PROP_MAX, gen.max_size),
                         (PROP_COUNT, digest.count), (PROP_SHA, digest.hexdigest())):
                info.properties.add(key=k, value=str(v))
            first = 0
            for li in info.ledgerInfo:  # where each ledger starts in the workload (verify after a trim)
                li.properties.add(key=PROP_FIRST_SEQ, value=str(first))
                first += li.entries
            return True

        ws.ml.update_topic(t, mark)
        el = time.monotonic() - started
        progress(f"generate: {n}/{len(topics)} topics, {total_entries:,} entries, {_mib(total_bytes)} "
                 f"({total_bytes / max(el, 1e-9) / 2**20:,.1f} MiB/s)", force=n == len(topics))
    return {"topics": len(topics), "ledgers_per_topic": args.ledgers, "entries": total_entries,
            "bytes": total_bytes, "seconds": round(time.monotonic() - started, 3)}


def cmd_offload(args: argparse.Namespace, ws: Workspace, progress: Progress) -> dict[str, Any]:
    if (args.up_to is None) == (args.keep_bytes is None):
        raise ValidationError("give exactly one of --up-to LEDGER:ENTRY or --keep-bytes N")
    if args.up_to is not None and not args.topic:
        raise ValidationError("--up-to needs explicit topic names")
    up_to = Position.parse(args.up_to, "--up-to", require_entry=True) if args.up_to is not None else None
    keep = parse_keep_bytes(args.keep_bytes) if args.keep_bytes is not None else None
    topics = _select_topics(ws, args.namespace, args.topic)
    totals = {"bytes": 0}

    def on_progress(topic: str, lid: int, done: int, total: int) -> None:
        progress(f"offload: {topic} ledger {lid}: {_mib(done)} / {_mib(total)}")

    # each topic goes where its effective policy says (store, block size), as in the Spark sweep;
    # resolved for every topic before the first offload so a bad policy changes nothing
    ps = policy_store(ws)
    offloaders = [ws.topic_offloader(progress=on_progress, offloader=ws.offloader_for_policy(ps.for_topic(t)))
                  for t in topics]
    results = []
    started = time.monotonic()
    for t, tof in zip(topics, offloaders, strict=True):
        res = tof.offload_prefix(t, up_to) if up_to is not None else tof.offload_keep_bytes(t, keep or 0)
        for r in res:
            totals["bytes"] += r.bytes
            progress(f"offload: {r.topic} ledger {r.ledger_id}: {r.outcome} {_mib(r.bytes)} in {r.seconds:.2f}s"
                     + (f" — {r.error}" if r.error else ""), force=True)
        results.extend(res)
    el = time.monotonic() - started
    failed = [r for r in results if not r.ok]
    return {"topics": len(topics), "ledgers": len(results),
            "offloaded": sum(r.outcome == "offloaded" for r in results), "failed": len(failed),
            "bytes": totals["bytes"], "seconds": round(el, 3),
            "results": [r.as_dict() for r in results], "_exit": EXIT_FAILED if failed else EXIT_OK}


def cmd_status(args: argparse.Namespace, ws: Workspace, progress: Progress) -> dict[str, Any]:
    topics = _select_topics(ws, args.namespace, args.topic)
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


def cmd_read(args: argparse.Namespace, ws: Workspace, progress: Progress) -> dict[str, Any]:
    t = TopicName.parse(args.topic)
    start = Position.parse(args.start, '--from') if args.start else None
    end = Position.parse(args.end, '--to') if args.end else None
    if args.limit is not None and args.limit < 0:
        raise ValidationError(f"--limit {args.limit}: must be 0 or more")
    if start is not None and end is not None and start > end:
        raise ValidationError(f"--from {start} is after --to {end}")
    reader = ws.reader(args.read_priority)
    out = []
    try:
        for n, (pos, data) in enumerate(reader.read(t, start, end)):
            if args.limit is not None and n >= args.limit:
                break
            item = {"position": str(pos), "size": len(data)}
            if args.show == "hex":
                item["data"] = data[:64].hex()
            elif args.show == "text":
                item["data"] = data[:64].decode("utf-8", "replace")
            out.append(item)
            if not args.json:
                print(f"{pos}\t{len(data)}" + (f"\t{item['data']}" if "data" in item else ""))
    finally:
        reader.close()
    for note in reader.fallback_notes:
        _err(f"tiered read: {note}")
    return {"entries": out, "tier_reads": reader.tier_reads, "fallbacks": reader.fallbacks, "_printed": True}


def _verify_whole_topic(reader: TopicReader, t: TopicName, props: dict[str, str], gen: PayloadGenerator,
                        progress: Progress) -> tuple[dict[str, Any], int]:
    """Topics generated before per-ledger start sequence numbers were recorded: one pass over the
    topic against the payloads from #0 and the stored digest; the first unreadable entry ends it."""
    digest = Digest()
    expected_count = int(props[PROP_COUNT])
    mismatch = None
    chunk: list[bytes] = []
    nbytes = 0
    try:
        for seq, (pos, data) in enumerate(reader.read(t)):
            if seq < expected_count and data != gen.payload(seq) and mismatch is None:
                mismatch = f"entry {pos} (#{seq}) differs from the generated payload"
            chunk.append(data)
            nbytes += len(data)
            if len(chunk) >= 4096:
                digest.update_many(chunk)
                chunk = []
                progress(f"verify: {t.full}: {seq + 1:,} entries")
    except TieredError as e:
        # unreadable data (corrupt entry, missing object) fails this topic; the others are still
        # verified and the report (--json included) still printed
        digest.update_many(chunk)
        return ({"topic": t.full, "ok": False, "entries": digest.count, "reason": f"{type(e).__name__}: {e}",
                 "bad_ledgers": []}, nbytes)
    digest.update_many(chunk)
    ok = mismatch is None and digest.count == expected_count and digest.hexdigest() == props[PROP_SHA]
    reason = mismatch or ("" if digest.count == expected_count else
                          f"read {digest.count} entries, generated {expected_count}")
    if not reason and not ok:
        reason = "digest differs"
    return {"topic": t.full, "ok": ok, "entries": digest.count, "reason": reason, "bad_ledgers": []}, nbytes


def _verify_by_ledger(reader: TopicReader, t: TopicName, info, props: dict[str, str], gen: PayloadGenerator,
                      progress: Progress) -> tuple[dict[str, Any], int]:
    """Every remaining ledger on its own, entry by entry against the payloads from its recorded first
    sequence number, so one bad ledger neither hides the next nor stops the topic. The whole-topic
    count and digest apply only when nothing was trimmed (the oldest ledger still starts at #0)."""
    expected_count = int(props[PROP_COUNT])
    ledgers = list(info.ledgerInfo)
    first_seqs = [int(_props(li)[PROP_FIRST_SEQ]) for li in ledgers]
    trimmed = first_seqs[0] if ledgers else expected_count  # entries gone before the oldest remaining
    digest = Digest()
    bad: list[dict[str, Any]] = []
    nbytes = read = 0
    for li, first_seq in zip(ledgers, first_seqs, strict=True):
        reason = None
        got = 0
        chunk: list[bytes] = []
        wanted = gen.payloads(first_seq, INT64_MAX)  # lazy: as many as the ledger holds
        try:
            for pos, data in reader.read(t, Position(li.ledgerId, 0), Position(li.ledgerId, INT64_MAX)):
                seq = first_seq + got
                want = next(wanted)
                if reason is None and (seq >= expected_count or data != want):
                    reason = (f"entry {pos} (#{seq}) is beyond the {expected_count} generated entries"
                              if seq >= expected_count else f"entry {pos} (#{seq}) differs from the generated payload")
                got += 1
                nbytes += len(data)
                chunk.append(data)
                if len(chunk) >= 4096:
                    digest.update_many(chunk)
                    chunk = []
                    progress(f"verify: {t.full}: ledger {li.ledgerId}: {got:,} entries")
        except TieredError as e:  # unreadable (corrupt entry, missing object): this ledger only
            reason = reason or f"{type(e).__name__}: {e}"
        digest.update_many(chunk)
        read += got
        if reason is None and li.timestamp > 0 and got != li.entries:
            reason = f"read {got} entries, the topic record says {li.entries}"
        if reason is not None:
            bad.append({"ledger": li.ledgerId, "reason": reason})
    if bad:
        reason = f"{len(bad)} bad ledger(s): " + "; ".join(f"ledger {b['ledger']}: {b['reason']}" for b in bad)
    elif trimmed:
        reason = ""  # what remains is right; the topic digest covers entries that are gone
    elif digest.count != expected_count:
        reason = f"read {digest.count} entries, generated {expected_count}"
    elif digest.hexdigest() != props[PROP_SHA]:
        reason = "digest differs"
    else:
        reason = ""
    return ({"topic": t.full, "ok": not reason, "entries": read, "reason": reason, "bad_ledgers": bad,
             "trimmed_entries": trimmed}, nbytes)


def cmd_verify(args: argparse.Namespace, ws: Workspace, progress: Progress) -> dict[str, Any]:
    topics = _select_topics(ws, args.namespace, args.topic)
    reader = ws.reader(args.read_priority)
    rows = []
    started = time.monotonic()
    total_bytes = 0
    try:
        for t in topics:
            info, _ = ws.ml.get_topic(t)
            props = _props(info)
            if PROP_SHA not in props:
                rows.append({"topic": t.full, "ok": None, "reason": "not generated by `tiered generate`",
                             "bad_ledgers": []})
                continue
            gen = PayloadGenerator(int(props[PROP_SEED]), t.managed_ledger_name,
                                   int(props[PROP_MIN]), int(props[PROP_MAX]))
            noted = len(reader.fallback_notes)
            if info.ledgerInfo and all(PROP_FIRST_SEQ in _props(li) for li in info.ledgerInfo):
                row, n = _verify_by_ledger(reader, t, info, props, gen, progress)
            else:
                row, n = _verify_whole_topic(reader, t, props, gen, progress)
            # copies that could not be read (the entries came from the other copy, and were right)
            row["damaged_copies"] = reader.fallback_notes[noted:]
            rows.append(row)
            total_bytes += n
    finally:
        reader.close()
    el = time.monotonic() - started
    failures = sum(r["ok"] is False for r in rows)
    # every entry read correctly, but from the other copy: a copy is damaged (exit 1, say which)
    return {"topics": rows, "verified": sum(1 for r in rows if r["ok"]), "failed": failures,
            "bytes": total_bytes, "seconds": round(el, 3), "tier_reads": reader.tier_reads,
            "fallbacks": reader.fallbacks, "damaged_copies": reader.fallback_notes,
            "_exit": EXIT_FAILED if failures or reader.fallbacks else EXIT_OK}


# -- output -----------------------------------------------------------------------------------


def _print_human(cmd: str, res: dict[str, Any]) -> None:
    if res.get("_printed"):
        return
    if cmd == "policies" and "namespaces" in res:
        for r in res["namespaces"]:
            flags = "on " if r["offload_enabled"] else "off"
            fields = ", ".join(f"{k}={v}" for k, v in sorted(r["overrides"].items())) or "(defaults)"
            more = f"; {len(r['topic_overrides'])} topic override(s)" if r["topic_overrides"] else ""
            print(f"{r['namespace']:<28} offload {flags}  {fields}{more}")
        return
    if cmd == "policies":
        print(json.dumps(res, indent=2))
        return
    if cmd == "status" and "namespaces" in res:
        print(f"{'namespace':<28} {'topics':>6} {'ledgers':>7} {'hot':>5} {'both':>5} {'cold':>5} "
              f"{'hot MiB':>10} {'cold MiB':>10}")
        for ns, a in sorted(res["namespaces"].items()):
            print(f"{ns:<28} {a['topics']:>6} {a['ledgers']:>7} {a['hot_only']:>5} {a['both']:>5} "
                  f"{a['offloaded_only']:>5} {a['hot_bytes'] / 2**20:>10,.1f} {a['offloaded_bytes'] / 2**20:>10,.1f}")
        st = res["store"]
        print(f"object store {st['url']}: {st['objects']:,} objects, {st['bytes'] / 2**20:,.1f} MiB")
        return
    if cmd == "status":
        hdr = f"{'topic':<48} {'ledgers':>7} {'hot':>6} {'both':>5} {'cold':>5} {'hot bytes':>14} {'cold bytes':>14}"
        print(hdr)
        for r in res["topics"]:
            print(f"{r['topic']:<48} {r['ledgers']:>7} {r['hot_only']:>6} {r['both']:>5} {r['offloaded_only']:>5} "
                  f"{r['hot_bytes']:>14,} {r['offloaded_bytes']:>14,}")
            for d in r.get("ledger_detail", []):
                print(f"    ledger {d['ledger']:>8} {d['state']:<6} {d['tier']:<9} entries={d['entries']:<8} "
                      f"size={d['size']:<12,} uuid={d['uuid'] or '-'}")
        return
    if cmd == "verify":
        for r in res["topics"]:
            status = {True: "OK", False: "FAILED", None: "SKIPPED"}[r["ok"]]
            bad = r["bad_ledgers"]
            reason = f"{len(bad)} bad ledger(s)" if bad else r.get("reason", "")
            print(f"{status:<8} {r['topic']} {r.get('entries', '')} {reason}".rstrip())
            for b in bad:
                print(f"    ledger {b['ledger']}: {b['reason']}")
            for note in r.get("damaged_copies", []):
                print(f"    DAMAGED COPY: {note}")
        print(f"verified {res['verified']} topic(s), {res['failed']} failed, {_mib(res['bytes'])} "
              f"in {res['seconds']}s (ledgers read: {res['tier_reads']})")
        if res["fallbacks"]:
            print(f"{res['fallbacks']} ledger(s) were read from their other copy: see `tiered scrub --repair`")
        return
    if cmd == "offload":
        print(f"offloaded {res['offloaded']} ledger(s) of {res['topics']} topic(s), {_mib(res['bytes'])} "
              f"in {res['seconds']}s; {res['failed']} failed")
        return
    for k, v in res.items():
        if not k.startswith("_"):
            print(f"{k}: {v}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tiered", description="Tiered storage for segmented logs (Pulsar-compatible).")
    p.add_argument("--config", help=f"configuration file (default: $TIERED_CONFIG or ./{CONFIG_FILE_NAME})")
    p.add_argument("--workspace", help=f"workspace directory (its {CONFIG_FILE_NAME})")
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    # --json also after the command (`tiered status --json`); SUPPRESS keeps the global one's value
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="machine-readable output on stdout")
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("init", parents=[common], help="create a workspace with embedded defaults")
    s.add_argument("dir", nargs="?", help="workspace directory (default ./workspace)")
    s.add_argument("--store-url", help="object store URL instead of the embedded filesystem store")
    s.add_argument("--cluster", help="cluster name written on every object (default standalone); workspaces "
                                     "sharing a store need different names")
    s.add_argument("--force", action="store_true", help="rewrite an existing configuration")

    s = sub.add_parser("generate", parents=[common], help="write deterministic, verifiable topics")
    s.add_argument("--namespace", action="append", default=None, help="tenant/namespace (repeatable)")
    s.add_argument("--topics", type=int, default=2, help="topics per namespace")
    s.add_argument("--ledgers", type=int, default=5, help="sealed ledgers per topic")
    s.add_argument("--entries", type=int, default=1000, help="entries per ledger")
    s.add_argument("--entry-size", default="1024", help="bytes per entry, or a range like 100-4096")
    s.add_argument("--seed", type=int, default=1)
    s.add_argument("--prefix", default="topic", help="topic name prefix")
    s.add_argument("--ledger-interval", type=float, default=600.0, help="seconds between ledger closes")
    s.add_argument("--end-time", help="close time of the newest sealed ledger (ISO 8601; default now)")

    s = sub.add_parser("offload", parents=[common], help="offload sealed ledgers (prefix or keep-bytes)")
    s.add_argument("topic", nargs="*")
    s.add_argument("--namespace", help="every topic of this namespace")
    s.add_argument("--up-to", help="offload sealed ledgers before this position LEDGER:ENTRY")
    s.add_argument("--keep-bytes", metavar="SIZE",
                   help="keep at most SIZE bytes hot (e.g. 0, 1048576, 512K, 64M, 1G): like `topics offload -s`")

    s = sub.add_parser("status", parents=[common], help="per-topic (and per-ledger) tier table")
    s.add_argument("--by-namespace", action="store_true", help="totals per namespace and object-store totals")
    s.add_argument("topic", nargs="*")
    s.add_argument("--namespace")
    s.add_argument("--ledgers", action="store_true", help="one line per ledger")

    s = sub.add_parser("read", parents=[common], help="read entries across tiers")
    s.add_argument("topic")
    s.add_argument("--from", dest="start", help="first position LEDGER:ENTRY")
    s.add_argument("--to", dest="end", help="last position LEDGER:ENTRY (inclusive)")
    s.add_argument("--limit", type=int)
    s.add_argument("--show", choices=("size", "hex", "text"), default="size")
    s.add_argument("--read-priority", choices=READ_PRIORITIES, default=TIERED_FIRST)

    s = sub.add_parser("verify", parents=[common], help="read every entry and check it against the generator's digest")
    s.add_argument("topic", nargs="*")
    s.add_argument("--namespace")
    s.add_argument("--read-priority", choices=READ_PRIORITIES, default=TIERED_FIRST)

    cli_policies.add_parser(sub, [common])
    cli_topics.add_parser(sub, [common])
    cli_deletions.add_parser(sub, [common])
    cli_scrub.add_parser(sub, [common])
    return p


COMMANDS: dict[str, Callable[..., dict[str, Any]]] = {
    "generate": cmd_generate,
    "offload": cmd_offload,
    "status": cmd_status,
    "read": cmd_read,
    "verify": cmd_verify,
    "policies": lambda args, ws, progress: cli_policies.run(args, ws),
    "topics": lambda args, ws, progress: cli_topics.run(args, ws),
    **dict.fromkeys(cli_deletions.COMMANDS, lambda args, ws, progress: cli_deletions.run(args, ws)),
    "scrub": lambda args, ws, progress: cli_scrub.run(args, ws),
}


def _sqlite_path(cfg: Config) -> Path | None:
    """The database file of a sqlite:/// metadata URL (None for anything else: the store refuses it)."""
    u = urlparse(cfg.metadata_url)
    raw = unquote(u.path)
    if u.scheme != "sqlite" or not raw:
        return None
    return Path("/" + raw.lstrip("/")) if raw.startswith("/") else Path(raw)


def _require_metadata_store(cfg: Config) -> None:
    """A command reading or changing existing state on a missing metadata store has the wrong workspace
    (or a moved file): it must not be answered from an empty, freshly created database."""
    db = _sqlite_path(cfg)
    if db is not None and not db.exists():
        raise ValidationError(f"no metadata store at {db}: run `tiered init`")


def load_config(args: argparse.Namespace) -> Config:
    if args.config:
        return Config.load(args.config)
    if args.workspace:
        return Config.load(Path(args.workspace) / CONFIG_FILE_NAME)
    return Config.load()


def _is_usage_error(e: TieredError) -> bool:
    """Bad input (exit 2): invalid arguments, or a topic / id the user named that does not exist. A
    missing object or ledger met while reading is a failure of the data (exit 1)."""
    return isinstance(e, ValidationError) or type(e) in (NotFoundError, TopicNotFoundError)


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
            res = cmd_init(args)
        else:
            cfg = load_config(args)
            if args.cmd != "generate":  # writes topics: may start the store (docs/deploy.md, env-only config)
                _require_metadata_store(cfg)
            with Workspace(cfg) as ws:
                res = COMMANDS[args.cmd](args, ws, progress)
    except TieredError as e:
        if _is_usage_error(e):
            _err(f"tiered {args.cmd}: {e}")
            return EXIT_USAGE
        # data that cannot be read (no copy of a ledger, a damaged object) is a failure, not bad input
        _err(f"tiered {args.cmd}: {type(e).__name__}: {e}")
        return EXIT_FAILED
    except BrokenPipeError:
        raise
    except OSError as e:  # a file system or network failure is reported, never a traceback
        _err(f"tiered {args.cmd}: {type(e).__name__}: {e}")
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
