"""`tiered generate` and `tiered verify`: deterministic, verifiable topics and their check, ledger by
ledger, from wherever each ledger lives."""


from __future__ import annotations

import argparse
import math
import time
from typing import Any

from tieredcore.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    CommandGroup,
    Progress,
    mib,
    properties_of,
    select_topics,
)
from tieredcore.cli.verify_messages import verify_messages
from tieredcore.cli.workload import (
    PAYLOAD_RANDOM,
    PAYLOADS,
    PROP_COUNT,
    PROP_FIRST_SEQ,
    PROP_MAX,
    PROP_MIN,
    PROP_PAYLOAD,
    PROP_SEED,
    PROP_SHA,
    Digest,
    MessageShape,
    PayloadGenerator,
    parse_batch_range,
    parse_codecs,
    parse_size_range,
)
from tieredcore.clock import now_ms, parse_time_ms
from tieredcore.errors import HotLedgerNotFoundError, TieredError, ValidationError
from tieredcore.model import INT64_MAX, Position, ReadHandle
from tieredcore.names import NamespaceName, TopicName
from tieredcore.offload.context import (
    is_sealed,
)
from tieredcore.offload.copies import has_offloaded_copy, open_offloaded
from tieredcore.policy import READ_PRIORITIES, TIERED_FIRST
from tieredcore.topic.reader import TopicReader
from tieredcore.workspace import Workspace

COMMANDS = ("generate", "verify")


def add_parser(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    s = sub.add_parser("generate", parents=parents, help="write deterministic, verifiable topics")
    s.add_argument("--namespace", action="append", default=None, help="tenant/namespace (repeatable)")
    s.add_argument("--topics", type=int, default=2, help="topics per namespace")
    s.add_argument("--ledgers", type=int, default=5, help="sealed ledgers per topic")
    s.add_argument("--entries", type=int, default=1000, help="entries per ledger")
    s.add_argument("--entry-size", default="1024",
                   help="payload bytes per entry (its messages' payloads together), or a range like 100-4096")
    s.add_argument("--seed", type=int, default=1)
    s.add_argument("--payload", choices=PAYLOADS, default=PAYLOAD_RANDOM,
                   help="random bytes (incompressible), or text: log-like lines that compress (zstd namespaces)")
    s.add_argument("--raw", action="store_true",
                   help="opaque entries (no Pulsar message framing), as topics generated before messages")
    s.add_argument("--batch", default=None,
                   help="messages per entry, a count or a range like 1-100; 0: sent without batching "
                        "(default 1-10)")
    s.add_argument("--compression", default=None,
                   help="codec of each entry's payload: NONE (default, as Pulsar's producers), LZ4, ZLIB, ZSTD, "
                        "SNAPPY, a comma list used entry by entry in turn, or mix (all five in turn)")
    s.add_argument("--keys", type=int, default=None, help="key space: keys key-0..key-N-1 (default 100; 0: no keys)")
    s.add_argument("--properties", type=int, default=None, help="properties per message (default 2)")
    s.add_argument("--broker-entry-metadata", action="store_true", default=None,
                   help="precede each entry with broker entry metadata (timestamp and index), as brokers with "
                        "entry-metadata interceptors write it")
    s.add_argument("--prefix", default="topic", help="topic name prefix")
    s.add_argument("--ledger-interval", type=float, default=600.0, help="seconds between ledger closes")
    s.add_argument("--end-time", help="close time of the newest sealed ledger (ISO 8601; default now)")
    s.add_argument("--open-entries", type=int, default=0,
                   help="entries written to the newest ledger, which stays open (default 0: empty, as after a "
                        "rollover); they are written at --end-time")

    s = sub.add_parser("verify", parents=parents, help="read every entry and check it against the generator's digest")
    s.add_argument("topic", nargs="*")
    s.add_argument("--namespace")
    s.add_argument("--read-priority", choices=READ_PRIORITIES, default=TIERED_FIRST)
    s.add_argument("--offloaded-only", action="store_true",
                   help="read every ledger from its object-store copy only (V1 objects, streaming segments) and "
                        "check each entry it holds; entries only in the hot tier are counted, not read")


def run(args: argparse.Namespace, ws: Workspace, progress: Progress) -> dict[str, Any]:
    if args.cmd == "generate":
        return cmd_generate(args, ws, progress)
    return cmd_verify(args, ws, progress)


_MESSAGE_FLAGS = {"batch": "--batch", "compression": "--compression", "keys": "--keys",
                  "properties": "--properties", "broker_entry_metadata": "--broker-entry-metadata"}


def _message_shape(args: argparse.Namespace, start_ms: int, interval_ms: int) -> MessageShape | None:
    """The messages `generate` writes (None with --raw): publish times spread evenly over each ledger."""
    given = [flag for attr, flag in _MESSAGE_FLAGS.items() if getattr(args, attr) is not None]
    if args.raw:
        if given:
            raise ValidationError(f"--raw writes opaque entries: {', '.join(given)} apply to messages only")
        return None
    lo, hi = parse_batch_range(args.batch or "1-10")
    for flag, v in (("--keys", args.keys), ("--properties", args.properties)):
        if v is not None and v < 0:
            raise ValidationError(f"{flag} {v}: must be 0 or more")
    return MessageShape(start_ms, max(interval_ms // args.entries, 0), lo, hi,
                        parse_codecs(args.compression or "NONE"),
                        100 if args.keys is None else args.keys, 2 if args.properties is None else args.properties,
                        bool(args.broker_entry_metadata))


def _ledger_interval_ms(seconds: float, ledgers: int, end_ms: int) -> int:
    """--ledger-interval in ms: positive and finite, and the oldest ledger's close time not before 1970
    (close times run forwards, ledger by ledger)."""
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValidationError(f"--ledger-interval {seconds}: must be a positive number of seconds")
    if seconds * 1000 * ledgers > end_ms:
        raise ValidationError(f"--ledger-interval {seconds:g}: {ledgers} ledger(s) that far apart would start "
                              f"before 1970 (end time {end_ms} ms); give a smaller interval or fewer ledgers")
    return max(int(seconds * 1000), 1)


def cmd_generate(args: argparse.Namespace, ws: Workspace, progress: Progress) -> dict[str, Any]:
    from tieredcore.topic.writer import TopicWriter

    lo, hi = parse_size_range(args.entry_size)
    if args.topics <= 0 or args.ledgers <= 0 or args.entries <= 0:
        raise ValidationError("--topics, --ledgers and --entries must be positive")
    if args.open_entries < 0:
        raise ValidationError(f"--open-entries {args.open_entries}: must be 0 or more")
    end_ms = parse_time_ms(args.end_time, '--end-time') if args.end_time else now_ms()
    interval = _ledger_interval_ms(args.ledger_interval, args.ledgers, end_ms)
    shape = _message_shape(args, end_ms - args.ledgers * interval, interval)
    namespaces = [NamespaceName.parse(n).name for n in args.namespace]
    topics = [TopicName.parse(f"{ns}/{args.prefix}-{i:04d}") for ns in namespaces for i in range(args.topics)]
    existing = [t.full for t in topics if ws.ml.exists(t)]
    if existing:
        raise ValidationError(f"topic(s) already exist: {', '.join(existing[:5])}; use another --prefix")
    total_bytes = total_entries = 0
    started = time.monotonic()
    for n, t in enumerate(topics, 1):
        gen = PayloadGenerator(args.seed, t.managed_ledger_name, lo, hi, args.payload, shape)
        # ledger i of N is closed at end - (N - i) * interval: a realistic age spread for policies
        clock = {"now": end_ms - args.ledgers * interval}
        digest = Digest()
        writer = TopicWriter(ws.ml, ws.hot, t, max_entries=max(args.entries, args.open_entries), max_bytes=1 << 62,
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
        if args.open_entries:  # entries of the ledger a live broker is writing (streaming offload takes them)
            batch = list(gen.payloads(seq, args.open_entries))
            writer.append_many(batch)
            digest.update_many(batch)
            total_bytes += sum(map(len, batch))
            seq += args.open_entries
        writer.close(seal=False)  # the newest ledger stays open, as on a live broker
        total_entries += seq

        def mark(info, gen=gen, digest=digest) -> bool:
            for k, v in ((PROP_SEED, gen.seed), (PROP_MIN, gen.min_size), (PROP_MAX, gen.max_size),
                         (PROP_COUNT, digest.count), (PROP_SHA, digest.hexdigest())):
                info.properties.add(key=k, value=str(v))
            if gen.kind != PAYLOAD_RANDOM:  # absent: random (topics generated before payload kinds)
                info.properties.add(key=PROP_PAYLOAD, value=gen.kind)
            if gen.messages is not None:  # absent: raw entries (--raw, topics generated before messages)
                for k, v in gen.messages.to_properties().items():
                    info.properties.add(key=k, value=v)
            first = 0
            for li in info.ledgerInfo:  # where each ledger starts in the workload (verify after a trim)
                li.properties.add(key=PROP_FIRST_SEQ, value=str(first))
                first += li.entries
            return True

        ws.ml.update_topic(t, mark)
        el = time.monotonic() - started
        progress(f"generate: {n}/{len(topics)} topics, {total_entries:,} entries, {mib(total_bytes)} "
                 f"({total_bytes / max(el, 1e-9) / 2**20:,.1f} MiB/s)", force=n == len(topics))
    return {"topics": len(topics), "ledgers_per_topic": args.ledgers, "open_entries_per_topic": args.open_entries,
            "entries": total_entries, "format": "raw" if shape is None else "pulsar messages",
            "bytes": total_bytes, "seconds": round(time.monotonic() - started, 3)}


def _verify_whole_topic(reader: TopicReader, t: TopicName, props: dict[str, str], gen: PayloadGenerator,
                        progress: Progress) -> tuple[dict[str, Any], int]:
    """Topics generated before per-ledger start sequence numbers were recorded: one pass over the
    topic against the payloads from #0 and the stored digest; the first unreadable entry ends it."""
    digest = Digest()
    expected_count = int(props[PROP_COUNT])
    mismatch = None
    chunk: list[bytes] = []
    nbytes = 0
    seq = 0
    try:
        for batch in reader.read_batches(t):
            payloads = batch.payloads()
            if mismatch is None:
                for i, data in enumerate(payloads):
                    if seq + i < expected_count and data != gen.payload(seq + i):
                        mismatch = (f"entry {Position(batch.ledger_id, batch.first_entry + i)} (#{seq + i}) "
                                    "differs from the generated payload")
                        break
            chunk += payloads
            nbytes += batch.payload_bytes
            seq += len(payloads)
            if len(chunk) >= 4096:
                digest.update_many(chunk)
                chunk = []
                progress(f"verify: {t.full}: {seq:,} entries")
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
    first_seqs = [int(properties_of(li)[PROP_FIRST_SEQ]) for li in ledgers]
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
            for batch in reader.read_batches(t, Position(li.ledgerId, 0), Position(li.ledgerId, INT64_MAX)):
                payloads = batch.payloads()
                for i, data in enumerate(payloads):
                    seq = first_seq + got + i
                    want = next(wanted)
                    if reason is None and (seq >= expected_count or data != want):
                        pos = Position(li.ledgerId, batch.first_entry + i)
                        reason = (f"entry {pos} (#{seq}) is beyond the {expected_count} generated entries"
                                  if seq >= expected_count else f"entry {pos} (#{seq}) differs from the generated payload")
                got += len(payloads)
                nbytes += batch.payload_bytes
                chunk += payloads
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


def open_offloaded_copy(ws: Workspace, t: TopicName, li) -> ReadHandle | None:
    """A read handle on the ledger's object-store copy alone (tieredcore.offload.copies): its complete
    V1 object, else the completed segments holding its entries from 0 on, each in the store its driver
    metadata names; None when no entry of it is in the object store."""
    if not has_offloaded_copy(li):
        return None
    return open_offloaded(li, ws.offloader, t.managed_ledger_name, ws.offloader_for_driver)


def _hot_last_entry(ws: Workspace, li) -> int | None:
    if is_sealed(li) and li.HasField("entries"):
        return li.entries - 1
    try:
        h = ws.hot.open_ledger(li.ledgerId)
    except HotLedgerNotFoundError:
        return None
    try:
        return h.last_add_confirmed
    finally:
        h.close()


def _verify_offloaded_copies(ws: Workspace, t: TopicName, info, props: dict[str, str], gen: PayloadGenerator,
                             progress: Progress) -> tuple[dict[str, Any], int]:
    """`verify --offloaded-only`: every entry the object store holds of each ledger, read from there only
    (V1 objects and streaming segments) and compared with the payload generated for it; entries only the
    hot tier holds are counted (``hot_only_entries``). One bad ledger does not stop the others."""
    expected_count = int(props[PROP_COUNT])
    bad: list[dict[str, Any]] = []
    nbytes = read = hot_only = offloaded_ledgers = 0
    for li in info.ledgerInfo:
        first_seq = int(properties_of(li)[PROP_FIRST_SEQ])
        got, reason = 0, None
        h = None
        try:
            h = open_offloaded_copy(ws, t, li)
            last = -1 if h is None else h.last_add_confirmed
            if h is not None:
                offloaded_ledgers += 1
            e = 0
            while e <= last:
                hi = min(e + 999, last)
                batch = h.read_batch(e, hi)  # type: ignore[union-attr]
                for entry_id, data in enumerate(batch.payloads(), start=e):
                    seq = first_seq + entry_id
                    if reason is None and (seq >= expected_count or data != gen.payload(seq)):
                        reason = (f"entry {li.ledgerId}:{entry_id} (#{seq}) of the offloaded copy "
                                  + ("is beyond the generated entries" if seq >= expected_count
                                     else "differs from the generated payload"))
                got += len(batch)
                nbytes += batch.payload_bytes
                e = hi + 1
                progress(f"verify: {t.full}: ledger {li.ledgerId}: {got:,} offloaded entries")
        except TieredError as ex:  # unreadable offloaded copy: this ledger only
            reason = reason or f"{type(ex).__name__}: {ex}"
            last = got - 1
        finally:
            if h is not None:
                h.close()
        read += got
        hot_last = _hot_last_entry(ws, li)
        if hot_last is not None and hot_last > last:
            hot_only += hot_last - max(last, -1)
        if reason is not None:
            bad.append({"ledger": li.ledgerId, "reason": reason})
    reason = (f"{len(bad)} bad ledger(s): " + "; ".join(f"ledger {b['ledger']}: {b['reason']}" for b in bad)
              if bad else "")
    return ({"topic": t.full, "ok": not bad, "entries": read, "reason": reason, "bad_ledgers": bad,
             "offloaded_ledgers": offloaded_ledgers, "hot_only_entries": hot_only}, nbytes)


def cmd_verify(args: argparse.Namespace, ws: Workspace, progress: Progress) -> dict[str, Any]:
    if ws.attached and not getattr(args, "offloaded_only", False):
        raise ValidationError("an attached workspace verifies what Pulsar's brokers offloaded, never BookKeeper: "
                              "use `tiered verify --offloaded-only`")
    topics = select_topics(ws, args.namespace, args.topic)
    if getattr(args, "offloaded_only", False):
        return _cmd_verify_offloaded(args, ws, topics, progress)
    reader = ws.reader(args.read_priority)
    rows = []
    started = time.monotonic()
    total_bytes = 0
    try:
        for t in topics:
            info, _ = ws.ml.get_topic(t)
            props = properties_of(info)
            if PROP_SHA not in props:
                rows.append({"topic": t.full, "ok": None, "reason": "not generated by `tiered generate`",
                             "bad_ledgers": []})
                continue
            gen = PayloadGenerator.from_properties(props, t.managed_ledger_name)
            noted = len(reader.fallback_notes)
            if info.ledgerInfo and all(PROP_FIRST_SEQ in properties_of(li) for li in info.ledgerInfo):
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


def _cmd_verify_offloaded(args: argparse.Namespace, ws: Workspace, topics: list[TopicName],
                         progress: Progress) -> dict[str, Any]:
    if args.read_priority != TIERED_FIRST:
        raise ValidationError("--offloaded-only reads the object-store copies only: --read-priority does not apply")
    rows = []
    started = time.monotonic()
    total_bytes = 0
    for t in topics:
        info, _ = ws.ml.get_topic(t)
        props = properties_of(info)
        if PROP_SHA not in props:  # not generated here (a Pulsar cluster's): its messages and their CRC32C
            row, n = verify_messages(ws, t, info, progress)
            rows.append(row)
            total_bytes += n
            continue
        if not all(PROP_FIRST_SEQ in properties_of(li) for li in info.ledgerInfo):
            rows.append({"topic": t.full, "ok": None, "bad_ledgers": [],
                         "reason": "generated before per-ledger sequence numbers were recorded: verify it whole"})
            continue
        gen = PayloadGenerator.from_properties(props, t.managed_ledger_name)
        row, n = _verify_offloaded_copies(ws, t, info, props, gen, progress)
        rows.append(row)
        total_bytes += n
    failures = sum(r["ok"] is False for r in rows)
    return {"topics": rows, "offloaded_only": True, "verified": sum(1 for r in rows if r["ok"]),
            "failed": failures, "bytes": total_bytes, "seconds": round(time.monotonic() - started, 3),
            "entries": sum(r.get("entries", 0) for r in rows),
            "hot_only_entries": sum(r.get("hot_only_entries", 0) for r in rows),
            "hot_tier": "BookKeeper" if ws.attached else "the hot tier",
            "_exit": EXIT_FAILED if failures else EXIT_OK}


def print_human(cmd: str, res: dict[str, Any]) -> None:
    if cmd == "generate":
        for k, v in res.items():
            print(f"{k}: {v}")
        return
    for r in res["topics"]:
        status = {True: "OK", False: "FAILED", None: "SKIPPED"}[r["ok"]]
        bad = r["bad_ledgers"]
        reason = f"{len(bad)} bad ledger(s)" if bad else r.get("reason", "")
        tier = "entries in BookKeeper" if res.get("hot_tier") == "BookKeeper" else "hot-only entries"
        where = (f" from {r['offloaded_ledgers']} offloaded ledger(s), {r['hot_only_entries']:,} {tier}"
                 if "offloaded_ledgers" in r else "")
        if "messages" in r:
            where = f" ({r['messages']:,} messages){where}"
        print(f"{status:<8} {r['topic']} {r.get('entries', '')}{where} {reason}".rstrip())
        for b in bad:
            print(f"    ledger {b['ledger']}: {b['reason']}")
        for b in r.get("bad_entries", []):
            print(f"    BAD ENTRY {b['position']}: {b['reason']}")
        for note in r.get("damaged_copies", []):
            print(f"    DAMAGED COPY: {note}")
    if res.get("offloaded_only"):
        print(f"verified the object-store copies of {res['verified']} topic(s), {res['failed']} failed: "
              f"{res['entries']:,} entries, {mib(res['bytes'])} in {res['seconds']}s; "
              f"{res['hot_only_entries']:,} entries are in {res.get('hot_tier', 'the hot tier')} only")
        return
    print(f"verified {res['verified']} topic(s), {res['failed']} failed, {mib(res['bytes'])} "
          f"in {res['seconds']}s (ledgers read: {res['tier_reads']})")
    if res["fallbacks"]:
        print(f"{res['fallbacks']} ledger(s) were read from their other copy: see `tiered scrub --repair`")


GROUP = CommandGroup(COMMANDS, add_parser, run, print_human)
