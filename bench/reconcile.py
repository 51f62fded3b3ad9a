"""Orphan reconciliation against simply listing the same store once (not a test).

Builds a workspace whose filesystem object store holds --objects objects with real offloaded-ledger
key names (`{uuid}-ledger-{id}` + `-index`, small bodies written straight into the store's layout),
topic records in SQLite that reference all but --orphan-rate of the uuids (ManagedLedgerInfo records
with complete OffloadContexts, created in one metadata transaction), user metadata naming the topic on
the orphans' index objects, and a few foreign keys. Then, --rounds times, alternating:

  baseline   list the store once with iter_objects (nothing else),
  reconcile  the whole dry-run reconcile(): locations, listing + key parsing, hot tier, references,
             anti-join, planning (a head() per orphan group for its topic), multipart uploads;

and once each phase on its own: listing into ObjectRows (also split over the 16 listing_prefixes +
the rest listing, as the Spark tasks do), referenced_uuids, find_object_orphans, planning. Prints
rows/s per phase and the ratio of the whole reconcile to the baseline (best and median of the rounds).
The store directory's mtime is set a few seconds back after filling, so that every listing (baseline
and reconcile alike) may use the store's directory cache, as on a store nobody writes at that moment.

    .venv/bin/python bench/reconcile.py                   # 100,000 objects, ~1% orphans
    .venv/bin/python bench/reconcile.py --objects 1000000

The fixture (store, topic records) is built once per --objects/--orphan-rate and kept under --cache
(default bench/.cache/): a rerun measures again at once (the dry run changes nothing); --rebuild makes it
anew, --no-cache builds into a temp directory removed afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tieredcore.cold.blob import iter_objects  # noqa: E402
from tieredcore.config import Config  # noqa: E402
from tieredcore.formats.mlinfo import ManagedLedgerInfo, encode_managed_ledger_info  # noqa: E402
from tieredcore.formats.uuids import uuid_to_msb_lsb  # noqa: E402
from tieredcore.lifecycle.reconcile.listing import list_objects, list_rest, listing_prefixes  # noqa: E402
from tieredcore.lifecycle.reconcile.orphans import DEFAULT_GRACE_MS, find_object_orphans  # noqa: E402
from tieredcore.lifecycle.reconcile.references import referenced_uuids  # noqa: E402
from tieredcore.lifecycle.reconcile.run import plan_object_records, reconcile, store_locations  # noqa: E402
from tieredcore.meta.managed_ledgers import topic_path  # noqa: E402
from tieredcore.meta.store import CreateOp  # noqa: E402
from tieredcore.workspace import Workspace  # noqa: E402

LEDGERS_PER_TOPIC = 100
FOREIGN_KEYS = 5


def _write(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def build(root: Path, objects: int, orphan_rate: float, as_of_ms: int) -> tuple[Workspace, int]:
    """Returns the workspace and the number of orphan ledgers (groups) seeded."""
    cfg = Config.for_workspace(root)
    for d in ("cold", "hot"):
        (root / d).mkdir(parents=True, exist_ok=True)
    ws = Workspace(cfg)
    store = ws.store
    cold = str(store.root)
    ledgers = objects // 2
    every = max(1, round(1 / orphan_rate)) if orphan_rate > 0 else 0
    data_body, index_body = b"d" * 64, b"i" * 32
    topics: dict[str, ManagedLedgerInfo] = {}
    orphans = 0
    meta_dir = os.path.join(cold, ".tiered", "meta")
    ts = as_of_ms - 3 * DEFAULT_GRACE_MS
    for i in range(ledgers):
        lid = 1000 + i
        u = uuid.uuid4()
        topic = f"bench/ns{i // (LEDGERS_PER_TOPIC * 50)}/persistent/topic-{i // LEDGERS_PER_TOPIC:05d}"
        dk = f"{u}-ledger-{lid}"
        _write(os.path.join(cold, dk), data_body)
        _write(os.path.join(cold, dk + "-index"), index_body)
        info = topics.get(topic)
        if info is None:
            info = topics[topic] = ManagedLedgerInfo()
        if every and i % every == every - 1:
            # an orphan: its ledger left the topic without a completed deletion; the objects remain
            orphans += 1
            for k in (dk, dk + "-index"):  # what the offloader writes: the topic and the cluster
                _write(os.path.join(meta_dir, k), json.dumps(
                    {"metadata": {"managedledgername": topic, "pulsarclustername": ws.config.cluster}}).encode())
            continue
        li = info.ledgerInfo.add(ledgerId=lid, entries=10, size=640, timestamp=ts)
        msb, lsb = uuid_to_msb_lsb(u)
        ctx = li.offloadContext
        ctx.uidMsb, ctx.uidLsb, ctx.complete, ctx.timestamp = msb, lsb, True, ts
        ctx.driverMetadata.name = "tiered-local"  # what the local store records (tieredcore.cold.drivers)
        ctx.driverMetadata.properties.add(key="root", value=cold)
    for j in range(FOREIGN_KEYS):
        _write(os.path.join(cold, f"zz-foreign-{j}.txt"), b"not ours")
    ops = [CreateOp(topic_path(t), encode_managed_ledger_info(info)) for t, info in topics.items()]
    for k in range(0, len(ops), 1000):
        ws.metadata.transaction(ops[k : k + 1000])
    past = time.time() - 10
    os.utime(cold, (past, past))
    return ws, orphans


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--objects", type=int, default=100_000, help="objects in the store (2 per ledger)")
    ap.add_argument("--orphan-rate", type=float, default=0.01, help="fraction of ledgers whose uuid is unreferenced")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", help="scratch directory for --no-cache (default: a temp dir next to this script)")
    ap.add_argument("--cache", default=str(Path(__file__).parent / ".cache"), help="where fixtures are kept")
    ap.add_argument("--no-cache", action="store_true", help="build into a temp directory, removed afterwards")
    ap.add_argument("--rebuild", action="store_true", help="build the cached fixture anew")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.objects < 2 or not 0 <= a.orphan_rate < 1 or a.rounds < 1:
        ap.error("--objects >= 2, 0 <= --orphan-rate < 1, --rounds >= 1")
    if a.no_cache:
        scratch = Path(tempfile.mkdtemp(prefix="bench-reconcile-", dir=a.dir or Path(__file__).parent))
    else:
        scratch = Path(a.cache) / f"reconcile-{a.objects}-{a.orphan_rate:g}"
    fixture = scratch / "fixture.json"  # written last: its absence means no (complete) fixture
    grace = DEFAULT_GRACE_MS
    try:
        if not a.no_cache and fixture.is_file() and not a.rebuild:
            f = json.loads(fixture.read_text())
            as_of, seeded, build_s = f["as_of_ms"], f["orphan_groups"], 0.0
            ws = Workspace(Config.for_workspace(scratch / "ws"))
            how = f"reused the fixture in {scratch} (--rebuild to build it anew):"
        else:
            shutil.rmtree(scratch, ignore_errors=True)
            scratch.mkdir(parents=True)
            # objects are 2 grace periods old at this clock, however much later the cached fixture is used
            as_of = int(time.time() * 1000) + 2 * DEFAULT_GRACE_MS
            (ws, seeded), build_s = timed(lambda: build(scratch / "ws", a.objects, a.orphan_rate, as_of))
            if not a.no_cache:
                fixture.write_text(json.dumps({"as_of_ms": as_of, "orphan_groups": seeded}))
            how = "built"
        store = ws.store
        n_objects = sum(1 for _ in iter_objects(store))  # warm-up (and fills the directory cache)
        print(f"{how} {n_objects:,} objects ({seeded:,} orphan ledgers, {FOREIGN_KEYS} foreign keys) and "
              f"{len(ws.ml.list_namespaces())} namespaces of topic records in {build_s:.1f}s", flush=True)

        # each phase once, on its own
        rows, list_s = timed(lambda: list(list_objects(store, "")))
        split, split_s = timed(lambda: [r for p in listing_prefixes("") for r in list_objects(store, "", p)]
                               + list(list_rest(store, "")))
        assert sorted(split) == sorted(rows)
        refs, refs_s = timed(lambda: referenced_uuids(ws.ml, ws.metadata))
        found, join_s = timed(lambda: find_object_orphans(rows, refs, as_of, grace))
        assert len(found.groups) == seeded and found.foreign_keys == FOREIGN_KEYS, (len(found.groups), seeded)
        loc = store_locations(ws)[0]
        (pairs, skipped), plan_s = timed(
            lambda: plan_object_records(loc, found, as_of, ws.config.cluster, ws.identity_if_any() or ""))
        assert not skipped and all(r.topic.startswith("bench/") for _, r in pairs), skipped[:3]

        base_s, whole_s = [], []
        rep = None
        for rnd in range(a.rounds):
            _, b = timed(lambda: sum(1 for _ in iter_objects(store)))
            base_s.append(b)
            rep, w = timed(lambda: reconcile(ws, as_of, grace, dry_run=True))
            whole_s.append(w)
            assert rep.orphan_groups == seeded and rep.objects_listed == n_objects and not rep.errors
            print(f"  round {rnd + 1}: baseline listing {b:.3f}s, reconcile (dry run) {w:.3f}s (x{w / b:.2f})",
                  flush=True)
        ws.close()
        r = {
            "objects": n_objects, "orphan_groups": seeded, "referenced_uuids": len(refs), "rounds": a.rounds,
            "baseline_list_s": min(base_s), "baseline_rows_per_s": n_objects / min(base_s),
            "list_rows_s": list_s, "list_rows_per_s": n_objects / list_s,
            "split_list_s": split_s, "split_list_rows_per_s": n_objects / split_s,
            "references_s": refs_s, "references_per_s": len(refs) / refs_s,
            "anti_join_s": join_s, "anti_join_rows_per_s": n_objects / join_s,
            "planning_s": plan_s, "planning_groups_per_s": seeded / plan_s if plan_s else None,
            "reconcile_s": min(whole_s), "reconcile_timings": rep.timings if rep else {},
            "ratio_best": min(whole_s) / min(base_s),
            "ratio_median": statistics.median(whole_s) / statistics.median(base_s),
        }
        print(f"baseline: iter_objects over {n_objects:,} objects {r['baseline_list_s']:.3f}s "
              f"({r['baseline_rows_per_s']:,.0f} rows/s)")
        print(f"listing into rows (parse keys)     {list_s:7.3f}s  {r['list_rows_per_s']:>12,.0f} rows/s")
        print(f"  split: 16 prefixes + rest        {split_s:7.3f}s  {r['split_list_rows_per_s']:>12,.0f} rows/s")
        print(f"references (topic records + log)   {refs_s:7.3f}s  {r['references_per_s']:>12,.0f} uuids/s")
        print(f"anti-join                          {join_s:7.3f}s  {r['anti_join_rows_per_s']:>12,.0f} rows/s")
        print(f"planning ({seeded} groups, head each)  {plan_s:7.3f}s  {r['planning_groups_per_s']:>12,.0f} groups/s")
        print(f"whole reconcile, dry run: {r['reconcile_s']:.3f}s best of {a.rounds} = x{r['ratio_best']:.2f} "
              f"the baseline listing (median x{r['ratio_median']:.2f}); phases {r['reconcile_timings']}")
        if a.json:
            print(json.dumps(r, indent=2))
    finally:
        if a.no_cache:
            shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
