"""What a scan of a generated topic must return, from the generator alone (never from a tier), and rows of
Arrow batches in the same comparable form."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

import pyarrow as pa

from tieredcore.cli.common import properties_of
from tieredcore.cli.workload import PROP_FIRST_SEQ, PayloadGenerator
from tieredcore.formats.messages import OutMessage, decode_entry, encode_message
from tieredcore.names import TopicName
from tieredcore.topic.writer import TopicWriter
from tieredcore.workspace import Workspace

Row = tuple


def generated_entries(ws: Workspace, topic: str) -> dict[tuple[int, int], bytes]:
    """(ledger, entry) -> the entry the generator wrote there, for every entry the topic lists."""
    t = TopicName.parse(topic)
    info, _ = ws.ml.get_topic(t)
    gen = PayloadGenerator.from_properties(properties_of(info), t.managed_ledger_name)
    out = {}
    for li in info.ledgerInfo:
        props = {kv.key: kv.value for kv in li.properties}
        if PROP_FIRST_SEQ not in props:
            continue
        n = li.entries if li.HasField("entries") and li.timestamp > 0 else _open_entries(ws, li.ledgerId)
        for eid, data in enumerate(gen.payloads(int(props[PROP_FIRST_SEQ]), n)):
            out[(li.ledgerId, eid)] = data
    return out


def _open_entries(ws: Workspace, ledger_id: int) -> int:
    h = ws.hot.open_ledger(ledger_id)
    try:
        return h.last_add_confirmed + 1
    finally:
        h.close()


def expected_rows(ws: Workspace, topic: str) -> list[Row]:
    """One row per message, decoded from the generator's entries, in position order."""
    full = TopicName.parse(topic).full
    rows = []
    for (lid, eid), data in sorted(generated_entries(ws, topic).items()):
        for m in decode_entry(data, lid, eid):
            rows.append((full, lid, eid, m.batch_index, m.publish_time, m.event_time, m.key, m.ordering_key,
                         tuple(sorted(m.properties.items())), m.producer_name, m.sequence_id, bytes(m.payload)))
    return rows


def _ms(v: datetime | None) -> int | None:
    if v is None:
        return None
    return round(v.timestamp() * 1000)


def scanned_rows(batches: Iterable[pa.RecordBatch | dict]) -> list[Row]:
    """Rows of message batches (or of dicts such as Spark's Row.asDict()) in the form of expected_rows."""
    out = []
    for b in batches:
        for r in (b.to_pylist() if isinstance(b, pa.RecordBatch) else [b]):
            props = r["properties"]
            props = props.items() if isinstance(props, dict) else (props or [])
            out.append((r["topic"], r["ledger_id"], r["entry_id"], r["batch_index"], _ms(r["publish_time"]),
                        _ms(r["event_time"]), r["key"], None if r["ordering_key"] is None else bytes(r["ordering_key"]),
                        tuple(sorted(props)), r["producer_name"], r["sequence_id"], bytes(r["payload"])))
    return sorted(out, key=lambda x: (x[0], x[1], x[2], x[3]))


def damaged_topic(ws: Workspace, topic: str) -> list[bytes]:
    """A topic of six messages in one hot ledger, entry 3 with a flipped payload bit (its own CRC32C fails;
    the hot tier's frame checksum, computed over the damaged bytes, passes)."""
    entries = [encode_message(OutMessage(payload=f"m{i}".encode() * 10, key=f"k{i}"), producer="p", sequence_id=i,
                              publish_time=1_700_000_000_000 + i) for i in range(6)]
    bad = bytearray(entries[3])
    bad[-1] ^= 0x01  # a payload bit: the message's own CRC32C no longer matches
    entries[3] = bytes(bad)
    ws.ml.create_topic(topic)
    with TopicWriter(ws.ml, ws.hot, topic) as w:
        w.append_many(entries)
    return entries
