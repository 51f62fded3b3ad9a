"""Recovery of the metadata store from the bucket alone (`tiered recover`) against one plain listing of the
bucket plus reading the manifests (not a test).

The fixture: a workspace whose filesystem store holds REAL objects for a few topics (generated, offloaded
by the offloader: V1 pairs with their index objects and topic manifests; the manifests of half of them are
deleted, so those are recovered from their index objects) and REAL topic manifests (TTMF, checksummed) for
every other topic, each naming --ledgers offloaded ledgers (complete offload contexts on this store). The
ledger objects those manifests name are not written (a million files take long on a small disk): the
bench's store (``ListingFixtureStore``) lists them, in key order, merged with the real objects, page by
page like any store; every GET and HEAD goes to the real store. Recovery never reads a ledger object a
valid manifest names: it only checks the listing has it, so the figures are those of the real work.

Then --rounds times, alternating:

  baseline   iter_objects over the whole bucket + GET of every topic's newest manifest;
  dry run    the planning of `tiered recover`: the streamed listing (list_bucket) and plan_recovery
             (manifests read and checked, index objects read for the topics without one, the hot tier
             asked about every ledger);

and --apply-rounds times the whole `tiered recover --apply` path (refusal checks, listing, planning, the
marker, one create per topic) into a new empty SQLite store. Prints the medians, the ratios to the baseline
median (target: dry run and apply within 3x) and the process's peak RSS after each phase.

    .venv/bin/python bench/recover.py                       # 10,000 topics / 1,000,000 objects
    .venv/bin/python bench/recover.py --quick               # 200 topics / 10,000 objects (a smoke run)
    .venv/bin/python bench/recover.py --spark-rounds 3      # also the dry run with Spark executors reading

The fixture's real files are kept under --cache (default bench/.cache/) per size: a rerun measures at
once; --rebuild makes it anew, --no-cache builds into a temp directory removed afterwards.
"""

from __future__ import annotations

import argparse
import heapq
import json
import resource
import shutil
import statistics
import sys
import tempfile
import time
import uuid as uuidlib
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tieredcore.cli import main as cli  # noqa: E402
from tieredcore.cold.blob import ListPage, ObjectInfo, iter_objects  # noqa: E402
from tieredcore.config import Config  # noqa: E402
from tieredcore.formats.keys import (  # noqa: E402
    is_topic_manifest_key,
    topic_manifest_key,
    topic_manifests_prefix,
)
from tieredcore.formats.mlinfo import ManagedLedgerInfo  # noqa: E402
from tieredcore.formats.topic_manifest import TopicManifest, encode_topic_manifest, encode_view  # noqa: E402
from tieredcore.formats.uuids import uuid_to_msb_lsb  # noqa: E402
from tieredcore.lifecycle.recover import (  # noqa: E402
    apply_recovery,
    check_store,
    list_bucket,
    mark_existing,
    plan_recovery,
)
from tieredcore.workspace import Workspace  # noqa: E402

REAL_TOPICS, REAL_LEDGERS = 20, 4  # generated and offloaded for real; half lose their manifests
SYNTH_MTIME = 1_767_225_600.0  # 2026-01-01
DATA_SIZE = 1 << 20
SYNTH_BASE_LEDGER = 10_000_000


def synth_uuid(topic: int, ledger: int) -> str:
    # ascending with (topic, ledger): the synthetic keys come out in key order
    return str(uuidlib.UUID(int=(0x5 << 124) | (topic << 32) | ledger))


def synth_name(topic: int) -> str:
    return f"bench/ns{topic // 1000:03d}/persistent/topic-{topic:06d}"


def synth_ledger_id(topic: int, ledger: int, ledgers: int) -> int:
    return SYNTH_BASE_LEDGER + topic * ledgers + ledger


class ListingFixtureStore:
    """The real store, whose listing also shows the ledger objects the synthetic topics' manifests name
    (data and index object of each ledger), merged in key order; pages continue from the last key as the
    filesystem store's do. Everything else (GET, HEAD, ...) is the real store's."""

    def __init__(self, real: Any, topics: int, ledgers: int) -> None:
        self.real, self.topics, self.ledgers = real, topics, ledgers
        self._cursor: tuple[str, Iterator[ObjectInfo]] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def synthetic(self) -> Iterator[ObjectInfo]:
        for t in range(self.topics):
            for i in range(self.ledgers):
                u, lid = synth_uuid(t, i), synth_ledger_id(t, i, self.ledgers)
                key = f"{u}-ledger-{lid}"
                yield ObjectInfo(key, DATA_SIZE, SYNTH_MTIME)
                yield ObjectInfo(key + "-index", 512, SYNTH_MTIME)

    def _all(self, prefix: str) -> Iterator[ObjectInfo]:
        synth = (o for o in self.synthetic() if o.key.startswith(prefix))
        return heapq.merge(iter_objects(self.real, prefix), synth, key=lambda o: o.key)

    def list(self, prefix: str = "", token: str | None = None, page_size: int = 1000, *,
             start_after: str | None = None) -> ListPage:
        after = token or start_after
        if self._cursor is not None and after is not None and self._cursor[0] == after:
            it = self._cursor[1]
        else:
            it = self._all(prefix)
            if after is not None:
                it = (o for o in it if o.key > after)
        page: list[ObjectInfo] = []
        for o in it:
            page.append(o)
            if len(page) == page_size:
                break
        more = len(page) == page_size
        self._cursor = (page[-1].key, it) if more else None
        return ListPage(objects=page, next_token=page[-1].key if more else None)


def build(root: Path, topics: int, ledgers: int) -> dict[str, Any]:
    """The real part of the fixture: REAL_TOPICS offloaded topics (half without manifests) and the
    synthetic topics' manifests."""
    assert cli.main(["init", str(root)]) == 0
    real_topics = min(REAL_TOPICS, max(2, topics // 10))
    assert cli.main(["--workspace", str(root), "generate", "--topics", str(real_topics), "--ledgers",
                     str(REAL_LEDGERS + 1), "--entries", "10", "--entry-size", "100", "--raw",
                     "--namespace", "real/a"]) == 0
    cfg = Config.load(root / "tiered.toml", env={})
    with Workspace(cfg) as ws:
        names = []
        for t in ws.ml.list_topics("real/a"):
            info, _ = ws.ml.get_topic(t)
            res = ws.topic_offloader().offload_ledgers(t.full, [li.ledgerId for li in info.ledgerInfo[:-1]])
            assert all(r.outcome == "offloaded" for r in res), res
            names.append(t.managed_ledger_name)
        store, prefix, cluster = ws.manifests.store, ws.offloader.prefix, cfg.cluster
        gone = [o.key for o in iter_objects(store, topic_manifests_prefix(prefix, cluster))
                if any(f"/{n}/" in o.key for n in names[: len(names) // 2])]
        store.delete(gone)
        driver = cfg.store_location.driver_metadata()
        synth = topics - real_topics
        for t in range(synth):
            info = ManagedLedgerInfo()
            for i in range(ledgers):
                u = uuidlib.UUID(synth_uuid(t, i))
                li = info.ledgerInfo.add(ledgerId=synth_ledger_id(t, i, ledgers), entries=1000, size=DATA_SIZE,
                                         timestamp=int(SYNTH_MTIME * 1000))
                ctx = li.offloadContext
                ctx.uidMsb, ctx.uidLsb = uuid_to_msb_lsb(u)
                ctx.complete, ctx.timestamp, ctx.bookkeeperDeleted = True, int(SYNTH_MTIME * 1000), True
                ctx.driverMetadata.CopyFrom(driver)
            name = synth_name(t)
            m = TopicManifest(name, 1, int(SYNTH_MTIME * 1000), encode_view(info),
                              {"offload_threshold_bytes": 0} if t % 1000 == 0 else None, None)
            store.put(topic_manifest_key(prefix, cluster, name, 1), encode_topic_manifest(m))
    (root / "metadata.db").unlink()  # the metadata store is lost
    return {"real_topics": real_topics, "synthetic_topics": synth, "fallback_topics": real_topics // 2}


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--topics", type=int, default=10_000)
    ap.add_argument("--ledgers", type=int, default=50, help="ledgers per synthetic topic (2 objects each)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved baseline / dry-run rounds")
    ap.add_argument("--apply-rounds", type=int, default=3, help="recoveries applied into a new empty store")
    ap.add_argument("--spark-rounds", type=int, default=0,
                    help="dry runs with the manifest and index reads on Spark executors (local[2] session, "
                         "spark_jobs/recover.py's mapper; the session's start-up not timed)")
    ap.add_argument("--quick", action="store_true", help="200 topics x 25 ledgers, 3 rounds, 1 apply (smoke run)")
    ap.add_argument("--dir", help="scratch directory for --no-cache (default: a temp dir)")
    ap.add_argument("--cache", default=str(Path(__file__).parent / ".cache"), help="where fixtures are kept")
    ap.add_argument("--no-cache", action="store_true", help="build into a temp directory, removed afterwards")
    ap.add_argument("--rebuild", action="store_true", help="build the cached fixture anew")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.quick:
        a.topics, a.ledgers, a.rounds, a.apply_rounds = 200, 25, 3, 1
    if a.topics < 20 or a.ledgers < 1 or a.rounds < 1 or a.apply_rounds < 0 or a.spark_rounds < 0:
        ap.error("--topics >= 20, --ledgers >= 1, --rounds >= 1, --apply-rounds >= 0, --spark-rounds >= 0")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.no_cache:
        scratch = Path(tempfile.mkdtemp(prefix="bench-recover-", dir=a.dir))
    else:
        scratch = Path(a.cache) / f"recover-{a.topics}-{a.ledgers}"
    fixture = scratch / "fixture.json"  # written last: its absence means no (complete) fixture
    try:
        if not a.no_cache and fixture.is_file() and not a.rebuild:
            f, build_s, how = json.loads(fixture.read_text()), 0.0, f"reused {scratch} (--rebuild: anew)"
        else:
            shutil.rmtree(scratch, ignore_errors=True)
            scratch.mkdir(parents=True)
            f, build_s = timed(lambda: build(scratch / "ws", a.topics, a.ledgers))
            fixture.write_text(json.dumps(f))
            how = "built"
        cfg = Config.load(scratch / "ws" / "tiered.toml", env={})
        ws = Workspace(cfg)
        real = ws.open_location(cfg.store_location)
        fx = ListingFixtureStore(real, f["synthetic_topics"], a.ledgers)
        ws.open_location = lambda _loc: fx  # type: ignore[method-assign]  # the bench's store, for recovery
        prefix, cluster = ws.offloader.prefix, cfg.cluster
        n_objects = sum(1 for _ in iter_objects(fx))
        topics = f["real_topics"] + f["synthetic_topics"]
        print(f"{how}: {n_objects:,} objects listed, {topics:,} topics ({f['synthetic_topics']:,} with a manifest "
              f"over {a.ledgers} listed ledgers each, {f['real_topics']} real of which {f['fallback_topics']} "
              f"without manifests) in {build_s:.1f}s; peak RSS {peak_rss_mib():.0f} MiB", flush=True)

        def baseline() -> int:
            newest: dict[str, str] = {}
            n = 0
            for o in iter_objects(fx):
                n += 1
                if is_topic_manifest_key(o.key, prefix):
                    newest[o.key.rsplit("/", 1)[0]] = o.key  # keys in order: the last is the newest
            return n + sum(len(real.get(k)) > 0 for k in newest.values())

        def dry_run():
            listing = list_bucket(fx, prefix, cluster)
            return plan_recovery(ws, listing=listing)

        base_s, dry_s, rep = [], [], None
        for rnd in range(a.rounds):
            rep = None  # one recovery's plan in memory at a time (the peak RSS is one recovery's)
            _, b = timed(baseline)
            base_s.append(b)
            rep, d = timed(dry_run)
            dry_s.append(d)
            assert rep.objects_listed == n_objects and len(rep.topics) == topics, (rep.objects_listed, len(rep.topics))
            assert sum(t.source == "index" for t in rep.topics) == f["fallback_topics"]
            assert not rep.not_recoverable and not rep.unreadable and not rep.damaged_manifests
            print(f"  round {rnd + 1}: baseline {b:.3f}s, recover dry run {d:.3f}s (x{d / b:.2f})", flush=True)
        rss_dry = peak_rss_mib()

        apply_s = []
        for rnd in range(a.apply_rounds):
            target = scratch / f"apply-{rnd}.db"
            target.unlink(missing_ok=True)
            with Workspace(replace(cfg, metadata_url=f"sqlite:///{target}")) as aws:
                aws.open_location = lambda _loc: fx  # type: ignore[method-assign]

                def whole(w=aws):
                    used, marker = check_store(w, False)
                    r = plan_recovery(w, listing=list_bucket(fx, prefix, cluster))
                    mark_existing(w, r)
                    apply_recovery(w, r, used=used, marker=marker)
                    return r

                r, s = timed(whole)
                assert sum(t.action == "created" for t in r.topics) == topics
            target.unlink()
            apply_s.append(s)
            print(f"  apply {rnd + 1}: {s:.3f}s into an empty SQLite store (x{s / statistics.median(base_s):.2f} "
                  "the baseline median)", flush=True)
        spark_s = []
        if a.spark_rounds:
            from spark_jobs._jobkit import session
            from spark_jobs.recover import spark_mapper

            spark = session("bench-recover", replace(cfg, spark_master="local[2]"))
            try:
                mapper = spark_mapper(spark, cfg)
                for rnd in range(a.spark_rounds):
                    r, s = timed(lambda: plan_recovery(ws, listing=list_bucket(fx, prefix, cluster), mapper=mapper))
                    assert [t.line() for t in r.topics] == [t.line() for t in rep.topics]  # the same plan
                    spark_s.append(s)
                    print(f"  spark dry run {rnd + 1}: {s:.3f}s (x{s / statistics.median(base_s):.2f} the baseline "
                          "median)", flush=True)
            finally:
                spark.stop()
        ws.close()
        med_b, med_d = statistics.median(base_s), statistics.median(dry_s)
        out = {"objects": n_objects, "topics": topics, "ledgers_per_topic": a.ledgers, "rounds": a.rounds,
               "baseline_median_s": med_b, "dry_run_median_s": med_d, "dry_run_ratio": med_d / med_b,
               "apply_median_s": statistics.median(apply_s) if apply_s else None,
               "apply_ratio": statistics.median(apply_s) / med_b if apply_s else None,
               "spark_dry_run_median_s": statistics.median(spark_s) if spark_s else None,
               "spark_dry_run_ratio": statistics.median(spark_s) / med_b if spark_s else None,
               "peak_rss_mib_after_dry_runs": round(rss_dry), "peak_rss_mib": round(peak_rss_mib())}
        print(f"baseline (listing + {topics - f['fallback_topics']:,} manifest GETs): median {med_b:.3f}s; "
              f"recover dry run: median {med_d:.3f}s = x{out['dry_run_ratio']:.2f}"
              + (f"; recover --apply: median {out['apply_median_s']:.3f}s = x{out['apply_ratio']:.2f}" if apply_s
                 else "")
              + (f"; on Spark: median {out['spark_dry_run_median_s']:.3f}s = x{out['spark_dry_run_ratio']:.2f}"
                 if spark_s else "")
              + f" (target x3); peak RSS {out['peak_rss_mib_after_dry_runs']} MiB after the dry runs, "
                f"{out['peak_rss_mib']} MiB at the end")
        if a.json:
            print(json.dumps(out, indent=2))
    finally:
        if a.no_cache:
            shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
