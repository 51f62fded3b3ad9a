"""`tiered verify --offloaded-only` for topics `tiered generate` did not write (a Pulsar cluster's, on an
attached workspace): every entry of every ledger's object-store copy, read from there only, must be a
Pulsar message (or a batch) whose CRC32C matches (spec/07); entries only BookKeeper (or this project's hot
tier) holds are counted, not read. A bad entry is named by its position; one bad ledger does not stop the
others."""

from __future__ import annotations

from typing import Any

from tieredcore.cli.common import Progress
from tieredcore.errors import TieredError
from tieredcore.formats.messages import BadEntry, decode_entries
from tieredcore.model import ReadHandle
from tieredcore.names import TopicName
from tieredcore.offload.context import is_sealed
from tieredcore.offload.copies import has_offloaded_copy, open_offloaded
from tieredcore.workspace import Workspace

BATCH_ENTRIES = 1000
MAX_BAD_ENTRIES = 100  # per topic, in the report (all are counted)


def _check_copy(h: ReadHandle, bad: list[BadEntry]) -> tuple[int, int, int]:
    """(entries, messages, payload bytes) of the copy's entries 0..LAC; bad entries appended to ``bad``."""
    entries = messages = nbytes = 0
    last = h.last_add_confirmed
    e = 0
    while e <= last:
        batch = h.read_batch(e, min(e + BATCH_ENTRIES - 1, last))
        messages += len(decode_entries(batch, bad))
        entries += len(batch)
        nbytes += batch.payload_bytes
        e += len(batch)
    return entries, messages, nbytes


def verify_messages(ws: Workspace, t: TopicName, info, progress: Progress) -> tuple[dict[str, Any], int]:
    """The row of one topic (the keys of the generated topics' rows, plus messages, bad entries and the
    ledgers held in the hot tier / BookKeeper only) and the payload bytes read."""
    bad_ledgers: list[dict[str, Any]] = []
    bad_entries: list[dict[str, Any]] = []
    hot_only: list[int] = []
    nbytes = entries = messages = offloaded = hot_entries = bad_count = 0
    for li in info.ledgerInfo:
        if not has_offloaded_copy(li):
            hot_only.append(li.ledgerId)
            hot_entries += li.entries if is_sealed(li) and li.HasField("entries") else 0
            continue
        offloaded += 1
        bad: list[BadEntry] = []
        try:
            h = open_offloaded(li, ws.offloader, t.managed_ledger_name, ws.offloader_for_driver)
            try:
                n, m, b = _check_copy(h, bad)
            finally:
                h.close()
        except TieredError as e:  # the copy cannot be read: this ledger only
            bad_ledgers.append({"ledger": li.ledgerId, "reason": f"{type(e).__name__}: {e}"})
            continue
        entries, messages, nbytes = entries + n, messages + m, nbytes + b
        if is_sealed(li) and li.HasField("entries") and n < li.entries and not li.offloadContext.complete:
            hot_entries += li.entries - n  # a prefix in segments: the rest is in the hot tier
        if bad:
            bad_count += len(bad)
            bad_ledgers.append({"ledger": li.ledgerId, "reason": f"{len(bad)} bad entr{'y' if len(bad) == 1 else 'ies'}"
                                f", first {bad[0].position}: {bad[0].reason}"})
            bad_entries += [{"position": str(x.position), "reason": x.reason, "checksum_mismatch": x.checksum}
                            for x in bad[: max(0, MAX_BAD_ENTRIES - len(bad_entries))]]
        progress(f"verify: {t.full}: ledger {li.ledgerId}: {n:,} offloaded entries")
    reason = (f"{len(bad_ledgers)} bad ledger(s): " + "; ".join(f"ledger {b['ledger']}: {b['reason']}"
                                                             for b in bad_ledgers)) if bad_ledgers else ""
    return ({"topic": t.full, "ok": not bad_ledgers, "entries": entries, "messages": messages, "reason": reason,
             "bad_ledgers": bad_ledgers, "bad_entries": bad_entries, "bad_entry_count": bad_count,
             "offloaded_ledgers": offloaded, "hot_only_entries": hot_entries, "hot_only_ledgers": hot_only,
             "checked": "pulsar-messages"}, nbytes)
