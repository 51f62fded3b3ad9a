"""End to end under S3 faults: offload sweep, deletion-lag cleanup, retention, drain and reconciliation
against moto's S3 server behind tests/support/faulty_s3_proxy.py, which delays, resets, or answers
500 InternalError / 503 SlowDown to a seeded ~10% of requests.

Jobs run in-process the way their Spark tasks do (plan, then ``run_work`` on the units); a run whose
rows report failures is rerun with the same logical time, as an Airflow task retry would, a bounded
number of times. Afterwards every retained entry must read back byte-identical through the cross-tier
reader, and a dry-run reconciliation must find nothing leaked.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import boto3
import pytest

from tests.support.faulty_s3_proxy import FAULT_KINDS, FaultyS3Proxy
from tests.support.workspaces import build_workspace
from tieredcore.cli import main as cli
from tieredcore.cli.workload import PROP_MAX, PROP_MIN, PROP_SEED, PayloadGenerator
from tieredcore.clock import now_ms
from tieredcore.cold.backends.s3 import S3BlobStore
from tieredcore.cold.liveness import GuardedStore
from tieredcore.config import ENV_CONFIG, ENV_OVERRIDES, Config
from tieredcore.lifecycle.drain import drain
from tieredcore.lifecycle.reconcile.run import reconcile
from tieredcore.lifecycle.retention import plan_retention
from tieredcore.lifecycle.runner import run_work
from tieredcore.lifecycle.sweep import plan_lag_cleanup, plan_offload
from tieredcore.lifecycle.work import LedgerResult, TopicWork
from tieredcore.names import TopicName
from tieredcore.offload.managed import context_uuid
from tieredcore.workspace import Workspace

NAMESPACE = "acme/faults"
TOPICS = 4
LEDGERS = 6  # sealed ledgers per topic (the newest, open one comes on top)
ENTRIES = 20
RETENTION_MINUTES = 25  # at the retention run (end + 3 min) the three oldest ledgers are past it
TRIMMED = 3
TASK_ATTEMPTS = 8  # runs of a job with the same logical time: the first one and seven retries
DRAIN_PASSES = 10  # the drain dead-letters a record after 10 failed attempts
RECONCILE_ATTEMPTS = 4
DAY_MS = 24 * 3600 * 1000
PROXY_SEED = 20261123

pytestmark = pytest.mark.timeout(600)


@pytest.fixture
def faulty_proxy(moto_endpoint: str) -> Iterator[FaultyS3Proxy]:
    """The proxy in front of the session's moto server, injecting faults into ~10% of requests."""
    with FaultyS3Proxy(moto_endpoint, seed=PROXY_SEED, rate=0.1) as proxy:
        yield proxy


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (*ENV_OVERRIDES, ENV_CONFIG):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TIERED_NO_PROGRESS", "1")


def build(tmp_path: Path, store_url: str, end_ms: int) -> Config:
    """`tiered init` on an S3 configuration, `tiered generate`, `tiered policies set`: as an operator."""
    root = tmp_path / "ws"
    end_iso = dt.datetime.fromtimestamp(end_ms / 1000, dt.UTC).isoformat()
    cfg_path = build_workspace(root, [NAMESPACE], topics=TOPICS, ledgers=LEDGERS, entries=ENTRIES,
                               entry_size="16-300", end=end_iso,
                               config_overrides={"store_url": store_url, "max_block_size": 5 * 1024 * 1024})
    ws_args = ["--workspace", str(root)]
    # offload every sealed ledger, hot copies deletable at once, the oldest ledgers past retention
    assert cli.main([*ws_args, "policies", "set", NAMESPACE, "--offload-threshold-bytes", "0",
                     "--deletion-lag", "0", "--retention-time-minutes", str(RETENTION_MINUTES)]) == 0
    return Config.load(cfg_path, env={})


def run_job(config: Config, name: str, plan: Callable[[], list[TopicWork]], log: list[str]) -> list[dict]:
    """Plan once, run the units; rerun them all (same logical time) while rows report failures."""
    work = plan()
    assert work, f"{name}: nothing planned"
    units = [w.as_dict() for w in work]
    for attempt in range(1, TASK_ATTEMPTS + 1):
        rows = list(run_work(config, units))
        failed = [r for r in rows if LedgerResult(**r).failed]
        outcomes: dict[str, int] = {}
        for r in rows:
            outcomes[r["outcome"]] = outcomes.get(r["outcome"], 0) + 1
        log.append(f"{name} attempt {attempt}: {outcomes}"
                   + "".join(f"\n    {r['topic']} ledger {r['ledger']}: {r['outcome']}: {r['error']}"
                             for r in failed))
        if not failed:
            return rows
    pytest.fail(f"{name}: rows still failing after {TASK_ATTEMPTS} attempts:\n" + "\n".join(log))


def drain_until_empty(ws: Workspace, as_of_ms: int, log: list[str]) -> int:
    """Drain passes, each a day of logical time after the previous one (past any retry backoff), until
    the deletion log is empty; the logical time reached."""
    for n in range(DRAIN_PASSES):
        rep = drain(ws, as_of_ms)
        log.append(f"drain pass {n + 1} as of {as_of_ms}: {({k: v for k, v in rep.counts().items() if v})}"
                   + "".join(f"\n    {r.type} {r.topic} {r.ledger}: {r.outcome}: {r.error}"
                             for r in rep.rows if r.outcome in ("retrying", "dead_lettered", "lost_race")))
        pending, dead = ws.deletion_log.pending(), ws.deletion_log.dead_letters()
        assert not dead, "dead-lettered deletions:\n" + "\n".join(log)
        if not pending:
            return as_of_ms
        as_of_ms += DAY_MS
    pytest.fail(f"deletion log not empty after {DRAIN_PASSES} drain passes:\n" + "\n".join(log))


def reconcile_until_clean(ws: Workspace, as_of_ms: int, log: list[str], dry_run: bool = False):
    """A reconciliation, rerun (as the daily DAG's task retry would) while a location could not be
    listed or an upload not aborted."""
    for n in range(RECONCILE_ATTEMPTS):
        rep = reconcile(ws, as_of_ms, grace_ms=0, dry_run=dry_run)
        log.append(f"reconcile{' (dry run)' if dry_run else ''} attempt {n + 1}: {rep.orphan_objects} orphan "
                   f"objects, {rep.hot_orphans} hot orphans, {rep.stale_uploads} stale uploads "
                   f"({rep.uploads_aborted} aborted), {rep.records_appended} records appended, errors {rep.errors}")
        if not rep.errors:
            return rep
    pytest.fail(f"reconcile still failing after {RECONCILE_ATTEMPTS} attempts:\n" + "\n".join(log))


# max_attempts=6: botocore's retries absorb nearly every fault (the configuration under test).
# max_attempts=1: every fault reaches the code as a BlobStoreError (readers, the lag cleanup's proof and
# the drain open the workspace's own store with its configured URL too), so the jobs' own retries, the
# offloader's cleanup and the drain have to make up for it. The final read-back and reconciliation check
# the result: with no client retries at all they run after the faults stop (a reader given one attempt
# per request fails on the first fault, as configured; the other variant reads through the faults).
@pytest.mark.parametrize("url_params", ["max_attempts=6&read_timeout=5", "max_attempts=1&read_timeout=5"],
                         ids=["client-retries", "no-client-retries"])
def test_lifecycle_survives_s3_faults(tmp_path: Path, moto_endpoint: str, faulty_proxy: FaultyS3Proxy,
                                      clean_env: None, url_params: str) -> None:
    bucket = f"faults-{uuid.uuid4().hex[:16]}"
    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    store_url = f"s3://{bucket}/p?endpoint={faulty_proxy.url}&region=us-east-1&{url_params}"
    attempts = int(url_params.split("&")[0].split("=")[1])
    end = now_ms() // 1000 * 1000  # ledgers close up to now: object ages and logical times agree
    config = build(tmp_path, store_url, end)
    log: list[str] = []

    with Workspace(config) as ws:
        assert isinstance(ws.store, GuardedStore) and isinstance(ws.store.inner, S3BlobStore)  # watched for answers
        assert ws.store.client.meta.config.retries["total_max_attempts"] == attempts
        topics = [t.full for t in ws.ml.list_topics(NAMESPACE)]
        assert len(topics) == TOPICS
        original = {t: [li.ledgerId for li in ws.ml.get_topic(t)[0].ledgerInfo] for t in topics}
        assert all(len(ids) == LEDGERS + 1 for ids in original.values())

        # 1. offload sweep, 2. deletion-lag cleanup (lag 0), 3. retention, each retried as Airflow would
        t_offload, t_lag, t_retention, t_drain = (end + m * 60_000 for m in (1, 2, 3, 4))
        rows = run_job(config, "offload", lambda: plan_offload(ws, [NAMESPACE], t_offload), log)
        assert {r["outcome"] for r in rows} <= {"offloaded", "skipped"}
        rows = run_job(config, "lag-cleanup", lambda: plan_lag_cleanup(ws, [NAMESPACE], t_lag), log)
        assert {r["outcome"] for r in rows} <= {"marked", "skipped"}
        rows = run_job(config, "retention", lambda: plan_retention(ws, [NAMESPACE], t_retention), log)
        assert sum(r["outcome"] == "trimmed" for r in rows) == TOPICS * TRIMMED

        # 4. drain what lag cleanup and retention recorded (hot copies, offloaded copies)
        drained_to = drain_until_empty(ws, t_drain, log)

        # 5. reconcile (grace 0) once every object is older than its logical time, drain what it found
        # (with no client retries, after the faults stop: the comment above; its listing of the topic
        # manifests is one more request every fault can end)
        if attempts == 1:
            faulty_proxy.rate = 0.0
        t_reconcile = max(now_ms(), drained_to) + 3600_000
        reconcile_until_clean(ws, t_reconcile, log)
        drain_until_empty(ws, t_reconcile, log)

        # every retained entry, read back through the cross-tier reader (from S3: the hot copies are gone)
        reader = ws.reader()
        try:
            for t in topics:
                info, _ = ws.ml.get_topic(t)
                kept = [li.ledgerId for li in info.ledgerInfo]
                assert kept == original[t][TRIMMED:]
                props = {kv.key: kv.value for kv in info.properties}
                name = TopicName.parse(t).managed_ledger_name
                gen = PayloadGenerator(int(props[PROP_SEED]), name, int(props[PROP_MIN]), int(props[PROP_MAX]))
                for li in info.ledgerInfo[:-1]:
                    assert li.offloadContext.complete and li.offloadContext.bookkeeperDeleted, (t, li.ledgerId)
                    assert context_uuid(li)
                seen = 0
                for pos, data in reader.read(TopicName.parse(t)):
                    seq = original[t].index(pos.ledger_id) * ENTRIES + pos.entry_id
                    assert data == gen.payload(seq), f"{t} {pos}: differs from the generated payload"
                    seen += 1
                assert seen == (LEDGERS - TRIMMED) * ENTRIES
            # sealed ledgers from S3; only the open, empty newest ledger of each topic from the hot tier
            assert reader.tier_reads == {"hot": TOPICS, "offloaded": TOPICS * (LEDGERS - TRIMMED)}
        finally:
            reader.close()

        # nothing leaked: no unreferenced object, hot ledger or multipart upload, however old
        final = reconcile_until_clean(ws, t_reconcile + DAY_MS, log, dry_run=True)
        assert (final.orphan_objects, final.hot_orphans, final.stale_uploads) == (0, 0, 0), "\n".join(log)
        assert final.young_unreferenced == 0 and final.foreign_keys == 0
        # data + index object of each retained ledger, nothing else
        assert final.objects_listed == 2 * TOPICS * (LEDGERS - TRIMMED)

    stats = faulty_proxy.stats()
    print("\n".join(log), f"\nproxy: {stats}")
    # the faults really happened, every kind of them
    assert set(faulty_proxy.faults) == set(FAULT_KINDS), stats
