"""`tiered read`: entries across tiers, falling back to the other copy when one cannot be read; with
``--messages``, the Pulsar messages inside them (spec/07)."""


from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from typing import Any

from tieredcore.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    CommandGroup,
    Progress,
    err,
)
from tieredcore.clock import iso_ms
from tieredcore.errors import ValidationError
from tieredcore.formats import compression
from tieredcore.formats import constants as C
from tieredcore.formats.block import encode_frames
from tieredcore.formats.messages import BadEntry, Message, decode_entries
from tieredcore.model import EntryBatch, Position
from tieredcore.names import TopicName
from tieredcore.policy import READ_PRIORITIES, TIERED_FIRST
from tieredcore.topic.reader import TopicReader
from tieredcore.workspace import Workspace

COMMANDS = ("read",)
PREVIEW_BYTES = 32


def add_parser(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    s = sub.add_parser("read", parents=parents, help="read entries (or the Pulsar messages in them) across tiers")
    s.add_argument("topic")
    s.add_argument("--from", dest="start", help="first position LEDGER:ENTRY")
    s.add_argument("--to", dest="end", help="last position LEDGER:ENTRY (inclusive)")
    s.add_argument("--limit", type=int, help="at most this many entries (messages and bad entries with --messages)")
    s.add_argument("--show", choices=("size", "hex", "text"), default="size")
    s.add_argument("--messages", action="store_true",
                   help="decode each entry's Pulsar messages: position LEDGER:ENTRY[:BATCH-INDEX], publish time, "
                        "key, properties, payload size and a short preview; entries that are not Pulsar "
                        "messages or fail their CRC32C are reported with their position (exit 1)")
    s.add_argument("--compacted", action="store_true",
                   help="the compacted view (Pulsar's readCompacted): the topic's compacted ledger up to its "
                        "compaction horizon, then the entries after it; with --messages, messages a compaction "
                        "marked compacted_out are skipped, as Pulsar's consumer skips them")
    s.add_argument("--read-priority", choices=READ_PRIORITIES, default=TIERED_FIRST)


def run(args: argparse.Namespace, ws: Workspace, progress: Progress) -> dict[str, Any]:
    t = TopicName.parse(args.topic)
    start = Position.parse(args.start, '--from') if args.start else None
    end = Position.parse(args.end, '--to') if args.end else None
    if args.limit is not None and args.limit < 0:
        raise ValidationError(f"--limit {args.limit}: must be 0 or more")
    if start is not None and end is not None and start > end:
        raise ValidationError(f"--from {start} is after --to {end}")
    if args.messages and args.show != "size":
        raise ValidationError("--messages prints a preview of each payload: --show does not apply")
    if ws.attached and args.read_priority != TIERED_FIRST:
        raise ValidationError("an attached workspace reads what Pulsar's brokers offloaded, never BookKeeper: "
                              "--read-priority does not apply")
    # attached: ledgers only Pulsar's BookKeeper holds are skipped and named, never an error of ours
    reader = ws.reader(args.read_priority, skip_in_bookkeeper=ws.attached)
    try:
        res = _read_messages(reader, t, start, end, args) if args.messages else _read_entries(
            reader, t, start, end, args)
    finally:
        reader.close()
    for note in reader.fallback_notes:
        err(f"tiered read: {note}")
    for lid in reader.in_bookkeeper:
        err(f"tiered read: in BookKeeper (ledger {lid}): not offloaded; Pulsar's brokers serve its entries")
    out = {**res, "tier_reads": reader.tier_reads, "fallbacks": reader.fallbacks, "_printed": True}
    if ws.attached:
        out["in_bookkeeper"] = list(reader.in_bookkeeper)
    return out


def _read_entries(reader: TopicReader, t: TopicName, start: Position | None, end: Position | None,
                  args: argparse.Namespace) -> dict[str, Any]:
    out = []
    for n, (pos, data) in enumerate(_entries(reader, t, start, end, args.compacted)):
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
    return {"entries": out}


def _entries(reader: TopicReader, t: TopicName, start: Position | None, end: Position | None,
             compacted: bool) -> Iterator[tuple[Position, bytes]]:
    if not compacted:
        yield from reader.read(t, start, end)
        return
    for pos, data in reader.read_compacted(t, start):
        if end is not None and pos > end:
            return
        yield pos, data


def _compacted_batches(reader: TopicReader, t: TopicName, start: Position | None,
                       end: Position | None) -> Iterator[EntryBatch]:
    """The compacted view as one-entry batches (what decode_entries takes)."""
    for pos, data in _entries(reader, t, start, end, True):
        frames = encode_frames([(pos.entry_id, data)])
        yield EntryBatch(pos.ledger_id, pos.entry_id, frames, [C.ENTRY_HEADER_SIZE], [len(data)], 0, len(frames))


def preview(data: bytes | memoryview, limit: int = PREVIEW_BYTES) -> str:
    """The first bytes as printable ASCII, anything else escaped (\\n, \\xNN), '…' when cut short: safe on
    any terminal."""
    head = bytes(data[: limit])
    text = head.decode("latin-1").encode("unicode_escape").decode("ascii").replace('"', '\\"')
    return text + ("…" if len(data) > limit else "")


def message_row(m: Message) -> dict[str, Any]:
    """What `read --messages --json` prints of one message."""
    row: dict[str, Any] = {
        "position": str(m.id), "ledger": m.ledger_id, "entry": m.entry_id, "batch_index": m.batch_index,
        "publish_time": m.publish_time, "publish_time_iso": iso_ms(m.publish_time), "event_time": m.event_time,
        "key": m.key, "ordering_key": None if m.ordering_key is None else m.ordering_key.hex(),
        "properties": m.properties, "producer": m.producer_name, "sequence_id": m.sequence_id,
        "size": len(m.payload), "preview": preview(m.payload),
    }
    for flag in ("key_is_b64", "null_value", "null_key", "compacted_out", "encrypted"):
        if getattr(m, flag):
            row[flag] = True
    if m.encrypted or m.chunk is not None:
        row["compression"] = compression.name(m.compression)
    if m.chunk is not None:
        row["chunk"] = {"id": m.chunk[0], "chunks": m.chunk[1]}
    if m.broker is not None:
        row["broker_timestamp"], row["broker_index"] = m.broker_timestamp, m.broker_index
    return row


def _human(row: dict[str, Any]) -> str:
    flags = [f for f in ("encrypted", "null_value", "compacted_out") if row.get(f)]
    props = json.dumps(row["properties"], ensure_ascii=True, separators=(",", ":"))
    body = "(encrypted)" if row.get("encrypted") else "(null)" if row.get("null_value") else f'"{row["preview"]}"'
    key = "-" if row["key"] is None else json.dumps(row["key"], ensure_ascii=True)
    return "\t".join([row["position"], row["publish_time_iso"], f"key={key}", props, f"{row['size']} B", body]
                     + ([",".join(flags)] if flags else []))


def _read_messages(reader: TopicReader, t: TopicName, start: Position | None, end: Position | None,
                   args: argparse.Namespace) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    bad: list[BadEntry] = []
    entries = 0
    limit = args.limit
    batches = _compacted_batches(reader, t, start, end) if args.compacted else reader.read_batches(t, start, end)
    for batch in batches:
        if limit is not None and len(rows) + len(bad) >= limit:
            break
        found: list[BadEntry] = []
        msgs = decode_entries(batch, found)
        if args.compacted:
            msgs = [m for m in msgs if not m.compacted_out]
        entries += len(batch)
        # messages and bad entries in entry order
        events = sorted([((m.entry_id, m.batch_index), m) for m in msgs]
                        + [((b.position.entry_id, -2), b) for b in found], key=lambda e: e[0])
        for _, ev in events:
            if limit is not None and len(rows) + len(bad) >= limit:
                break
            if isinstance(ev, BadEntry):
                bad.append(ev)
                if not args.json:
                    print(f"{ev.position}\tBAD ENTRY\t{ev.reason}")
                continue
            row = message_row(ev)
            rows.append(row)
            if not args.json:
                print(_human(row))
    return {"messages": rows, "entries": entries,
            "bad_entries": [{"position": str(b.position), "reason": b.reason, "checksum_mismatch": b.checksum}
                            for b in bad],
            "_exit": EXIT_FAILED if bad else EXIT_OK}


GROUP = CommandGroup(COMMANDS, add_parser, run)
