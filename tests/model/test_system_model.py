"""A model-based test of the whole system (issue 28, item 7): a Hypothesis state machine whose rules are
the workflows, run in-process through the core library's entry points the Spark jobs and the CLI call
(plan_* + run_work, drain, reconcile, plan_scrub with repair, compaction, key rotation, topic deletion,
streaming offload, appends through TopicWriter), on a logical clock that only moves forward.

Three namespaces: ``t/a`` (ledger mode, lag 0, retention 2 h, compaction), ``t/z`` (ledger mode, zstd+aes
with a two-key ring, lag 30 min, no retention, compaction), ``t/s`` (streaming, zstd, lag 0, retention
3 h). Any workflow step may carry a fault: the Nth store or metadata call of the operation raises a
store error, or the process "dies" there (SimulatedCrash; its leases are then taken over, as for a dead
local holder); the same operation is then rerun without fault, as a task retry would.

After every step the model is checked: each topic lists exactly the ledgers the model expects (what was
appended, minus what retention and topic deletion removed), every entry reads back byte-identical
through the cross-tier reader with no fallback to another copy (a copy a record references is never
damaged), deleted topics are gone, no object is referenced twice in a way docs/deletion.md forbids.
Each schedule ends with a reconciliation (grace 0, a month ahead) and drains: then the deletion log is
empty, every object in the store belongs to a copy a record references (the owner marker aside), no
multipart upload is left, the hot tier holds exactly the ledgers whose hot copies are not deleted, and
every entry still reads back.

Sizes: ``TIERED_MODEL_EXAMPLES`` schedules (default: 150 in the slow CI test, 20 in the quick one) of
``TIERED_MODEL_STEPS`` steps (default 20); ``make soak`` runs 10,000 with a printed seed (reproduce one
with ``--hypothesis-seed``). A failure prints the shrunk schedule: one line per step with its arguments.
"""

from __future__ import annotations

import os
import random
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from tests.support.model_system import (
    KINDS,
    TARGETS,
    WHEN,
    Fault,
    FaultyBlobStore,
    FaultyMetadataStore,
    Injector,
    SimulatedCrash,
    double_references,
    drop_leases,
    uuid_of,
)
from tieredcore.cli import main as cli
from tieredcore.clock import now_ms
from tieredcore.cold import keyring
from tieredcore.cold.blob import iter_objects
from tieredcore.cold.keyring import KeyRing
from tieredcore.cold.location import StoreLocation
from tieredcore.config import CONFIG_FILE_NAME, ENV_CONFIG, ENV_OVERRIDES, Config
from tieredcore.errors import TieredError, TopicNotFoundError
from tieredcore.lifecycle.compaction_run import plan_topics, run_topics
from tieredcore.lifecycle.drain import drain
from tieredcore.lifecycle.keys import find_manifests, rotate
from tieredcore.lifecycle.reconcile.run import reconcile
from tieredcore.lifecycle.retention import delete_topic, plan_retention
from tieredcore.lifecycle.runner import run_work
from tieredcore.lifecycle.scrub import plan_scrub
from tieredcore.lifecycle.sweep import plan_lag_cleanup, plan_offload
from tieredcore.model import Position
from tieredcore.names import TopicName
from tieredcore.offload.copies import copy_uuids
from tieredcore.topic.writer import TopicWriter
from tieredcore.workspace import Workspace

MINUTE = 60_000
DAY = 24 * 60 * MINUTE
NS_PLAIN, NS_CRYPT, NS_STREAM = "t/a", "t/z", "t/s"
POLICIES = {
    NS_PLAIN: ["--offload-threshold-bytes", "0", "--deletion-lag", "0", "--retention-time-minutes", "120",
               "--compaction", "on", "--compaction-min-object-size", "64K", "--compaction-target-size", "256K",
               "--compaction-delete-delay", "30m"],
    NS_CRYPT: ["--offload-threshold-bytes", "0", "--deletion-lag", "30m", "--transform", "zstd+aes",
               "--transform-chunk-size", "4K", "--compaction", "on", "--compaction-min-object-size", "64K",
               "--compaction-target-size", "256K", "--compaction-delete-delay", "0"],
    NS_STREAM: ["--offload-threshold-bytes", "0", "--offload-mode", "streaming", "--max-segment-size", "4K", "--streaming-block-size", "1K",
                "--max-segment-rollover", "10m", "--deletion-lag", "0", "--retention-time-minutes", "180",
                "--transform", "zstd", "--transform-chunk-size", "4K"],
}
RETENTION_MS = {NS_PLAIN: 120 * MINUTE, NS_CRYPT: None, NS_STREAM: 180 * MINUTE}
TOPICS = ("persistent://t/a/x", "persistent://t/a/y", "persistent://t/z/x", "persistent://t/s/x")
KEKS = ("k1", "k2")
# outcomes a run without an injected fault must never report (nothing is damaged or left undone)
BAD_OUTCOMES = {"failed", "unknown", "damaged", "repaired", "unrecoverable", "no-hot-copy", "verify-failed",
                "aborted", "dead_lettered", "refused_mismatch", "refused_foreign", "malformed", "unreadable_topic"}
# ... and outcomes no run may report, fault or not (a fault is a failure, never a wrong judgement)
NEVER = {"damaged", "repaired", "unrecoverable", "no-hot-copy", "verify-failed", "refused_mismatch",
         "refused_foreign", "malformed", "dead_lettered"}

PROGRESS = 100 if "TIERED_MODEL_EXAMPLES" in os.environ else 0

faults = st.one_of(
    st.none(),
    st.builds(Fault, st.sampled_from(KINDS), st.sampled_from(TARGETS), st.integers(1, 25), st.sampled_from(WHEN)),
)


# -- the workspace every schedule starts from -------------------------------------------------------


@dataclass(frozen=True)
class Template:
    root: Path  # where each schedule's workspace lives (always the same path: its config names it)
    copy: Path  # the pristine workspace, copied to root before each schedule

    def fresh(self) -> Config:
        shutil.rmtree(self.root, ignore_errors=True)
        shutil.copytree(self.copy, self.root)
        return Config.load(self.root / CONFIG_FILE_NAME, env={})


def build_template(base: Path) -> Template:
    """`tiered init`, a key ring of two keys (k1 active), the namespaces' policies (`tiered policies set`)."""
    root = base / "ws"
    root.mkdir(parents=True)
    ring = root / "keys"
    cfg = Config.for_workspace(root, store_fsync=False, key_ring=str(ring))
    (root / CONFIG_FILE_NAME).write_text(cfg.to_toml())
    assert cli.main(["init", str(root)]) == 0
    KeyRing.add_key(ring, KEKS[0], bits=2048)
    KeyRing.add_key(ring, KEKS[1], activate=False, bits=2048)
    for ns, args in POLICIES.items():
        assert cli.main(["--workspace", str(root), "policies", "set", ns, *args]) == 0
    copy = base / "template"
    shutil.copytree(root, copy)
    return Template(root, copy)


# -- the model --------------------------------------------------------------------------------------


@dataclass
class Ledger:
    lid: int
    entries: list[bytes]
    closed_at: int | None = None  # logical time it was sealed; None while open


@dataclass
class TopicModel:
    ledgers: list[Ledger] = field(default_factory=list)

    def expected(self) -> list[tuple[Position, bytes]]:
        return [(Position(led.lid, i), e) for led in self.ledgers for i, e in enumerate(led.entries)]

    def retention_trim(self, retention_ms: int | None, as_of: int) -> list[int]:
        """Pulsar's time-based trim (no cursors): oldest first, sealed ledgers but the newest, while
        older than the retention time."""
        if retention_ms is None:
            return []
        out = []
        for i, led in enumerate(self.ledgers):
            if i == len(self.ledgers) - 1 or led.closed_at is None or not as_of - led.closed_at > retention_ms:
                break
            out.append(led.lid)
        return out


def payloads(sizes: list[int], seed: int) -> list[bytes]:
    r = random.Random(seed)
    return [r.randbytes(n) for n in sizes]


class SystemModel(RuleBasedStateMachine):
    template: Template
    injector: Injector
    stats: Counter[str]  # what the schedules did (printed by the tests: faults fired, outcomes seen)

    def __init__(self) -> None:
        super().__init__()
        self.config = self.template.fresh()
        self.clock = now_ms()  # objects' modification times are wall-clock times: start there
        self.topics: dict[str, TopicModel] = {}
        self.active_kek = KEKS[0]
        self.stats["schedules"] += 1
        if PROGRESS and self.stats["schedules"] % PROGRESS == 0:  # the soak's progress (pytest -s)
            print(f"model: {self.stats['schedules']} schedules started, {time.strftime('%H:%M:%S')}", flush=True)

    # -- running an operation, with and then without its fault --------------------------------------

    def ws(self) -> Workspace:
        return Workspace(self.config)

    def perform(self, what: str, fault: Fault | None, op: Callable[[], Any]) -> Any:
        """``op`` with the fault armed (a store error or a crash at its call), then rerun without it (a
        task retry; after a crash, the dead process's leases are taken over). The rerun's result."""
        self.stats[f"{what}: runs"] += 1
        if fault is not None:
            self.injector.arm(fault)
            try:
                first = op()
                self.check_outcomes(what, first, faulty=True)
                note(f"  {what}: {self.injector.fired or 'the fault did not fire'}")
                self.stats[f"{what}: {fault.kind} {'fired' if self.injector.fired else 'not reached'}"] += 1
            except SimulatedCrash as c:
                note(f"  {what}: crashed: {c}")
                self.stats[f"{what}: crash fired"] += 1
                with self.ws() as ws:
                    drop_leases(ws.metadata)
            except TieredError as e:
                self.stats[f"{what}: fault raised {type(e).__name__}"] += 1
                note(f"  {what}: failed ({type(e).__name__}: {e}) after {self.injector.fired}")
            finally:
                self.injector.disarm()
        result = op()
        self.check_outcomes(what, result, faulty=False)
        for r in result or ():
            o = r["outcome"] if isinstance(r, dict) else getattr(r, "outcome", None)
            if o is not None:
                self.stats[f"{what}: {o}"] += 1
        return result

    def check_outcomes(self, what: str, rows: Any, faulty: bool) -> None:
        outcomes = [r["outcome"] if isinstance(r, dict) else getattr(r, "outcome", None) for r in rows or ()]
        bad = [r for r, o in zip(rows or (), outcomes, strict=True) if o in (NEVER if faulty else BAD_OUTCOMES)]
        assert not bad, f"{what}{' (with a fault)' if faulty else ''}: {bad}"

    def run_units(self, plan: Callable[[Workspace], list]) -> Callable[[], list[dict]]:
        def op() -> list[dict]:
            with self.ws() as ws:
                units = [w.as_dict() for w in plan(ws)]
            return list(run_work(self.config, units))
        return op

    # -- rules ----------------------------------------------------------------------------------

    @rule(minutes=st.sampled_from([1, 10, 31, 61, 125, 200, 24 * 60]))
    def advance_clock(self, minutes: int) -> None:
        self.clock += minutes * MINUTE

    @initialize(ledgers=st.lists(st.integers(1, 6), min_size=len(TOPICS), max_size=len(TOPICS)),
                seed=st.integers(0, 1000))
    def start(self, ledgers: list[int], seed: int) -> None:
        """Every topic starts with a few sealed ledgers, ten minutes apart (then the clock is where the
        last one closed)."""
        for i, (topic, n) in enumerate(zip(TOPICS, ledgers, strict=True)):
            for k in range(n):
                self.write(topic, [(seed * 7 + 31 * k + j * 101) % 500 for j in range(1 + (seed + k) % 4)],
                            seed + 10 * i + k, True)
                self.clock += 10 * MINUTE

    @rule(topic=st.sampled_from(TOPICS), sizes=st.lists(st.integers(0, 700), min_size=1, max_size=4),
          seed=st.integers(0, 1000), seal=st.booleans())
    def append(self, topic: str, sizes: list[int], seed: int, seal: bool) -> None:
        self.write(topic, sizes, seed, seal)

    @rule(topic=st.sampled_from(TOPICS), ledgers=st.integers(1, 3), seed=st.integers(0, 1000))
    def append_ledgers(self, topic: str, ledgers: int, seed: int) -> None:
        """Several sealed ledgers of 1..4 entries, one minute apart."""
        for k in range(ledgers):
            self.write(topic, [(seed + 97 * k + 13 * j) % 700 for j in range(1 + (seed + k) % 4)], seed + k, True)
            self.clock += MINUTE

    def write(self, topic: str, sizes: list[int], seed: int, seal: bool) -> None:
        data = payloads(sizes, seed)
        m = self.topics.setdefault(topic, TopicModel())
        with self.ws() as ws:
            w = TopicWriter(ws.ml, ws.hot, topic, clock_ms=lambda: self.clock)
            if m.ledgers and m.ledgers[-1].closed_at is None:
                m.ledgers[-1].closed_at = self.clock  # a writer seals the ledger its predecessor left open
            positions = w.append_many(data)
            w.close(seal=seal)
        lid = positions[0].ledger_id
        assert positions == [Position(lid, i) for i in range(len(data))]
        m.ledgers.append(Ledger(lid, data, self.clock if seal else None))

    @rule(fault=faults)
    def offload(self, fault: Fault | None) -> None:
        """The offload sweep: ledger mode for t/a and t/z, streaming (segments) for t/s."""
        self.perform("offload", fault, self.run_units(lambda ws: plan_offload(ws, None, self.clock)))

    @rule(fault=faults)
    def lag_cleanup(self, fault: Fault | None) -> None:
        self.perform("lag cleanup", fault, self.run_units(lambda ws: plan_lag_cleanup(ws, None, self.clock)))

    @rule(fault=faults)
    def retention(self, fault: Fault | None) -> None:
        expected = {t: m.retention_trim(RETENTION_MS[TopicName.parse(t).namespace_name], self.clock)
                    for t, m in self.topics.items()}
        self.perform("retention", fault, self.run_units(lambda ws: plan_retention(ws, None, self.clock)))
        for t, gone in expected.items():
            m = self.topics[t]
            m.ledgers = [led for led in m.ledgers if led.lid not in gone]

    @rule(fault=faults)
    def drain(self, fault: Fault | None) -> None:
        def op() -> list:
            with self.ws() as ws:
                return drain(ws, self.clock).rows
        self.perform("drain", fault, op)

    @rule(fault=faults, grace_ms=st.sampled_from([0, 6 * 3600_000]))
    def reconcile(self, fault: Fault | None, grace_ms: int) -> None:
        def op() -> list:
            with self.ws() as ws:
                rep = reconcile(ws, self.clock, grace_ms=grace_ms)
            return [{"outcome": "failed", "error": e} for e in rep.errors]
        self.perform("reconcile", fault, op)

    @rule(fault=faults, deep=st.booleans())
    def scrub(self, fault: Fault | None, deep: bool) -> None:
        self.perform("scrub", fault,
                     self.run_units(lambda ws: plan_scrub(ws, None, self.clock, deep=deep, repair=True)))

    @rule(fault=faults)
    def compaction(self, fault: Fault | None) -> None:
        def op() -> list[dict]:
            with self.ws() as ws:
                topics, _ = plan_topics(ws)
            return list(run_topics(self.config, topics, as_of_ms=self.clock, dry_run=False))
        self.perform("compaction", fault, op)

    @rule(fault=faults)
    def rotate_keys(self, fault: Fault | None) -> None:
        """`keys activate` the other key, then `keys rotate`: every data key re-wrapped under it."""
        self.active_kek = KEKS[1] if self.active_kek == KEKS[0] else KEKS[0]
        KeyRing.load(self.config.key_ring).activate(self.active_kek)

        def op() -> list:
            with self.ws() as ws:
                listing = find_manifests(ws)
                rows = rotate(ws, listing.refs)
            return rows + [{"outcome": "failed", "error": e} for e in listing.errors]
        self.perform("key rotation", fault, op)

    @precondition(lambda self: bool(self.topics))
    @rule(data=st.data(), fault=faults)
    def delete_topic(self, data: st.DataObject, fault: Fault | None) -> None:
        topic = data.draw(st.sampled_from(sorted(self.topics)), label="topic")

        runs: list[int] = []

        def op() -> list:
            runs.append(1)
            with self.ws() as ws:
                try:
                    delete_topic(ws, topic, self.clock)
                except TopicNotFoundError:  # the faulty run's deletion landed
                    assert len(runs) > 1, f"{topic} vanished before its deletion"
            return []
        self.perform("topic deletion", fault, op)
        del self.topics[topic]

    # -- invariants -----------------------------------------------------------------------------

    @invariant()
    def entries_read_back(self) -> None:
        with self.ws() as ws:
            self.check_topics(ws)

    def check_topics(self, ws: Workspace) -> None:
        infos = {}
        for t in TOPICS:
            m = self.topics.get(t)
            if m is None:
                with pytest.raises(TopicNotFoundError):
                    ws.ml.get_topic(t)
                continue
            info, _ = ws.ml.get_topic(t)
            infos[t] = info
            assert [li.ledgerId for li in info.ledgerInfo] == [led.lid for led in m.ledgers], t
            reader = ws.reader()
            try:
                got = list(reader.read(t))
                assert reader.fallbacks == 0, (t, reader.fallback_notes)
            finally:
                reader.close()
            want = m.expected()
            assert [p for p, _ in got] == [p for p, _ in want], t
            for (p, data), (_, expected) in zip(got, want, strict=True):
                assert bytes(data) == expected, f"{t} {p}: read back differs"
        assert not double_references(infos), double_references(infos)

    def teardown(self) -> None:
        try:
            if self.topics or self.clock:
                self.final_check()
        finally:
            self.injector.disarm()

    def final_check(self) -> None:
        """Reconcile a month ahead with no grace, drain until the deletion log is empty: nothing left."""
        far = max(self.clock, now_ms()) + 30 * DAY
        with self.ws() as ws:
            rep = reconcile(ws, far, grace_ms=0)
            assert not rep.errors, rep.errors
            for n in range(5):
                rows = drain(ws, far + n * DAY).rows
                self.check_outcomes("final drain", rows, faulty=False)
                if not ws.deletion_log.pending():
                    break
            assert not ws.deletion_log.pending() and not ws.deletion_log.dead_letters()
            self.check_topics(ws)
            referenced: set[str] = set()
            hot_kept: set[int] = set()
            for t in self.topics:
                for li in ws.ml.get_topic(t)[0].ledgerInfo:
                    referenced.update(copy_uuids(li))
                    if not li.offloadContext.bookkeeperDeleted:
                        hot_kept.add(li.ledgerId)
            store, prefix = ws.store, self.config.store_location.prefix
            listed = [o.key for o in iter_objects(store, prefix)]
            manifests = [k for k in listed if k.startswith(prefix + "tiered-topic-manifests/")]
            left = [k for k in listed if uuid_of(k) not in referenced and k not in manifests
                    and not k.rsplit("/", 1)[-1].startswith("tiered-owner.")]
            assert not left, f"orphan objects after reconcile + drain: {left}"
            # superseded topic manifests went through the deletion log: at most manifests_keep per topic stay
            per_topic: dict[str, int] = {}
            for k in manifests:
                per_topic[k.rsplit("/", 1)[0]] = per_topic.get(k.rsplit("/", 1)[0], 0) + 1
            assert all(n <= ws.config.manifests_keep for n in per_topic.values()), per_topic
            assert not store.list_multipart_uploads(prefix), store.list_multipart_uploads(prefix)
            assert set(ws.hot.list_ledgers()) == hot_kept


# -- the tests --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Template:
    return build_template(tmp_path_factory.mktemp("model"))


@pytest.fixture
def machine(template: Template, monkeypatch: pytest.MonkeyPatch) -> Iterator[type[SystemModel]]:
    """The state machine class, with every store and metadata store the process opens made faulty."""
    for var in (*ENV_OVERRIDES, ENV_CONFIG):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TIERED_NO_PROGRESS", "1")
    injector = Injector()
    open_store, open_meta = StoreLocation.open, Config.open_metadata
    monkeypatch.setattr(StoreLocation, "open", lambda self, *a, **kw: FaultyBlobStore(open_store(self, *a, **kw), injector))
    monkeypatch.setattr(Config, "open_metadata", lambda self: FaultyMetadataStore(open_meta(self), injector))
    # RSA key validation takes ~50 ms a key and every workspace loads its ring again: parse each PEM
    # once (the ring's files, permissions and active key are still read every time)
    parsed: dict[bytes, Any] = {}
    parse = keyring.serialization.load_pem_private_key

    def load_pem(data: bytes, password: bytes | None = None) -> Any:
        if data not in parsed:
            parsed[data] = parse(data, password=password)
        return parsed[data]
    monkeypatch.setattr(keyring.serialization, "load_pem_private_key", load_pem)
    cls = type("SystemModelRun", (SystemModel,), {"template": template, "injector": injector, "stats": Counter()})
    started = time.monotonic()
    yield cls
    print(f"\nmodel: {cls.stats['schedules']} schedules in {time.monotonic() - started:.0f} s")
    for k, v in sorted(cls.stats.items()):
        print(f"  {k}: {v}")


def _settings(examples: int) -> settings:
    soak = "TIERED_MODEL_EXAMPLES" in os.environ
    return settings(
        max_examples=int(os.environ.get("TIERED_MODEL_EXAMPLES", examples)),
        stateful_step_count=int(os.environ.get("TIERED_MODEL_STEPS", 20)),
        deadline=None, database=None, print_blob=True,
        derandomize=not soak,  # CI: the same schedules every run; the soak: a seed of its own (printed)
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )


def test_system_model_quick(machine: type[SystemModel]) -> None:
    """Twenty schedules: the edit loop's taste of the model (the slow test runs 300)."""
    run_state_machine_as_test(machine, settings=_settings(20))


@pytest.mark.slow
def test_system_model(machine: type[SystemModel]) -> None:
    run_state_machine_as_test(machine, settings=_settings(150))
