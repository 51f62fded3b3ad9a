"""Selection rules of docs/metadata.md (tieredcore.lifecycle.planner), including Pulsar's own test matrices."""

from __future__ import annotations

import pytest

from tieredcore.errors import ValidationError
from tieredcore.formats.proto import MLDataFormats_pb2 as pb
from tieredcore.lifecycle.planner import (
    deletion_lag_due,
    select_by_threshold,
    select_keep_bytes,
    select_prefix,
)
from tieredcore.model import Position

NOW = 1_700_000_000_000
LONG_MAX = 2**63 - 1


def ledger(lid, size, *, ts=NOW - 60_000, entries=None, complete=None, deleted=None, ctx_ts=None):
    li = pb.ManagedLedgerInfo.LedgerInfo(ledgerId=lid, size=size, timestamp=ts)
    li.entries = entries if entries is not None else (size // 10 if ts else 0)
    if complete is not None:
        li.offloadContext.uidMsb, li.offloadContext.uidLsb = 1, lid
        li.offloadContext.complete = complete
    if deleted is not None:
        li.offloadContext.bookkeeperDeleted = deleted
    if ctx_ts is not None:
        li.offloadContext.timestamp = ctx_ts
    return li


def open_ledger(lid, size=0):
    return pb.ManagedLedgerInfo.LedgerInfo(ledgerId=lid, size=size, entries=0, timestamp=0)


def topic(*ledgers):
    """Ledgers as they appear in a ManagedLedgerInfo (a protobuf repeated field)."""
    info = pb.ManagedLedgerInfo()
    info.ledgerInfo.extend(ledgers)
    return info.ledgerInfo


# --- select_prefix ---------------------------------------------------------------------------


def test_prefix_takes_sealed_ledgers_below_the_position_ledger():
    ls = topic(ledger(1, 100), ledger(2, 100), ledger(3, 100), open_ledger(4))
    assert select_prefix(ls, Position(3, 0)) == [1, 2]
    assert select_prefix(ls, Position(3, 99)) == [1, 2]  # the entry id does not matter
    assert select_prefix(ls, Position(2, 0)) == [1]
    assert select_prefix(ls, Position(1, 0)) == []
    assert select_prefix(ls, Position(0, 0)) == []


def test_prefix_never_takes_the_newest_ledger():
    ls = topic(ledger(1, 100), ledger(2, 100), open_ledger(3, 50))
    assert select_prefix(ls, Position(100, 0)) == [1, 2]
    # even when the newest one is sealed (a topic whose writer is gone)
    sealed_newest = topic(ledger(1, 100), ledger(2, 100), ledger(3, 100))
    assert select_prefix(sealed_newest, Position(100, 0)) == [1, 2]
    assert select_prefix(topic(ledger(1, 100)), Position(100, 0)) == []
    assert select_prefix(topic(), Position(100, 0)) == []


def test_prefix_skips_complete_and_empty_ledgers():
    ls = topic(
        ledger(1, 100, complete=True),
        ledger(2, 0),  # empty
        ledger(3, 100, complete=False),  # an unfinished attempt: offload again
        ledger(4, 100),
        open_ledger(5),
    )
    assert select_prefix(ls, Position(5, 0)) == [3, 4]


def test_prefix_skips_a_ledger_without_close_timestamp():
    ls = topic(ledger(1, 100), ledger(2, 100, ts=0), ledger(3, 100), open_ledger(4))
    assert select_prefix(ls, Position(4, 0)) == [1, 3]


def test_prefix_is_oldest_first_with_gaps_in_ids():
    ls = topic(ledger(7, 10), ledger(12, 10), ledger(40, 10), open_ledger(41))
    assert select_prefix(ls, Position(41, 0)) == [7, 12, 40]
    assert select_prefix(ls, Position(13, 0)) == [7, 12]


# --- select_keep_bytes -------------------------------------------------------------------------


KEEP_TOPIC = (ledger(1, 100), ledger(2, 200), ledger(3, 300), ledger(4, 400), open_ledger(5))


@pytest.mark.parametrize(
    "keep, expected",
    [
        # newest -> oldest running sum: 0 (open 5), 400 (4), 700 (3), 900 (2), 1000 (1); at the first
        # ledger over `keep`, offload up to (excluding) the ledger visited before it: the kept suffix is
        # the longest one of at most `keep` bytes
        (0, [1, 2, 3, 4]),
        (399, [1, 2, 3, 4]),
        (400, [1, 2, 3]),
        (699, [1, 2, 3]),
        (700, [1, 2]),
        (899, [1, 2]),
        (900, [1]),
        (999, [1]),
        (1000, []),  # equal to the total: never exceeded
        (10**12, []),  # larger than the total: nothing
    ],
)
def test_keep_bytes_walks_newest_to_oldest(keep, expected):
    assert select_keep_bytes(topic(*KEEP_TOPIC), keep) == expected


@pytest.mark.parametrize("keep, up_to", [(0, 2), (1000, 2), (5000, 1), (LONG_MAX, None)])
def test_keep_bytes_pulsar_find_first_ledger_within_threshold(keep, up_to):
    """Pulsar's CmdTopics test: ledgers 0 (1000 B), 1 (2000 B), 2 (3000 B, the newest)."""
    ls = topic(ledger(0, 1000), ledger(1, 2000), open_ledger(2, 3000))
    expected = [] if up_to is None else [lid for lid in (0, 1) if lid < up_to]
    assert select_keep_bytes(ls, keep) == expected


def test_keep_bytes_zero_with_an_empty_open_newest_ledger_offloads_every_sealed_ledger():
    ls = topic(ledger(1, 100), ledger(2, 100), ledger(3, 100), open_ledger(4))
    assert select_keep_bytes(ls, 0) == [1, 2, 3]
    # what `tiered generate` leaves: one sealed ledger and the empty open one
    assert select_keep_bytes(topic(ledger(1, 100), open_ledger(2)), 0) == [1]


def test_keep_bytes_counts_the_open_ledgers_size():
    ls = topic(ledger(1, 100), ledger(2, 100), open_ledger(3, 150))
    assert select_keep_bytes(ls, 0) == [1, 2]  # the open ledger alone exceeds 0
    assert select_keep_bytes(ls, 150) == [1, 2]  # 150 fits, 250 does not: ledger 2 goes
    assert select_keep_bytes(ls, 250) == [1]
    assert select_keep_bytes(ls, 350) == []


def test_keep_bytes_skips_complete_ledgers_but_counts_them():
    ls = topic(ledger(1, 100), ledger(2, 100, complete=True), ledger(3, 100), ledger(4, 100), open_ledger(5))
    # sums 0, 100, 200, 300 (ledger 2, complete, still counts): 200 > 150 at ledger 3 -> up to 4
    assert select_keep_bytes(ls, 150) == [1, 3]
    assert select_keep_bytes(ls, 250) == [1]  # 300 > 250 at ledger 2 -> up to 3; 2 is complete
    assert select_keep_bytes(ls, 0) == [1, 3, 4]


def test_keep_bytes_never_takes_the_newest_or_empty_ledgers():
    sealed_newest = topic(ledger(1, 100), ledger(2, 0), ledger(3, 100))
    assert select_keep_bytes(sealed_newest, 0) == [1]  # 3 is the newest, 2 is empty


@pytest.mark.parametrize("keep", [-1, -(2**40)])
def test_keep_bytes_negative_is_rejected(keep):
    with pytest.raises(ValidationError):
        select_keep_bytes(topic(*KEEP_TOPIC), keep)


def test_keep_bytes_of_an_empty_topic():
    assert select_keep_bytes(topic(), 0) == []
    assert select_keep_bytes(topic(open_ledger(1)), 0) == []


# --- select_by_threshold (automatic offload) -----------------------------------------------------


def pulsar_topic():
    """Pulsar's matrix topic: 3 ledgers of 10 entries x 10 bytes, the newest still open."""
    return topic(
        ledger(1, 100, entries=10, ts=NOW - 3_000),
        ledger(2, 100, entries=10, ts=NOW - 2_000),
        open_ledger(3, 100),
    )


@pytest.mark.parametrize(
    "threshold_bytes, threshold_seconds, offloaded",
    [
        (None, 0, 2),
        (100, None, 1),
        (-1, None, 0),
        (None, None, 0),
        (1, 1, 2),
        (100, LONG_MAX, 1),
    ],
)
def test_threshold_pulsar_matrix(threshold_bytes, threshold_seconds, offloaded):
    got = select_by_threshold(pulsar_topic(), threshold_bytes, threshold_seconds, NOW)
    assert got == [1, 2][:offloaded]


def test_threshold_disabled_values():
    assert select_by_threshold(pulsar_topic(), -1, -1, NOW) == []
    assert select_by_threshold(pulsar_topic(), None, -1, NOW) == []


def test_threshold_zero_offloads_every_sealed_ledger():
    assert select_by_threshold(pulsar_topic(), 0, None, NOW) == [1, 2]
    assert select_by_threshold(pulsar_topic(), 0, 0, NOW) == [1, 2]


def test_threshold_bytes_is_strictly_greater():
    ls = pulsar_topic()
    assert select_by_threshold(ls, 199, None, NOW) == [1]
    assert select_by_threshold(ls, 200, None, NOW) == []
    assert select_by_threshold(ls, 99, None, NOW) == [1, 2]


def test_threshold_seconds_is_inclusive():
    ls = pulsar_topic()  # ledger 1 closed 3 s ago, ledger 2 2 s ago
    assert select_by_threshold(ls, None, 2, NOW) == [1, 2]  # now - ts >= 2000
    assert select_by_threshold(ls, None, 3, NOW) == [1]
    assert select_by_threshold(ls, None, 4, NOW) == []
    assert select_by_threshold(ls, None, 3, NOW - 1) == []


def test_threshold_result_is_oldest_first():
    ls = topic(*(ledger(i, 100, ts=NOW - 100_000 + i) for i in range(1, 8)), open_ledger(8))
    assert select_by_threshold(ls, 0, None, NOW) == [1, 2, 3, 4, 5, 6, 7]
    assert select_by_threshold(ls, 250, None, NOW) == [1, 2, 3, 4, 5]  # sums 100, 200, 300, ...


def test_threshold_counts_complete_ledgers_but_does_not_choose_them():
    ls = topic(
        ledger(1, 100),
        ledger(2, 100),
        ledger(3, 100, complete=True),  # newest sealed: counted (sum 100), not chosen
        open_ledger(4, 100),  # skipped entirely
    )
    # ledger 2: sum 200 > 100 only because the complete ledger 3 counted
    assert select_by_threshold(ls, 100, None, NOW) == [1, 2]
    assert select_by_threshold(ls, 0, None, NOW) == [1, 2]
    assert select_by_threshold(ls, None, 0, NOW) == [1, 2]
    # an unfinished attempt (complete=false) is chosen again
    again = topic(ledger(1, 100, complete=False), ledger(2, 100), open_ledger(3))
    assert select_by_threshold(again, 0, None, NOW) == [1, 2]


def test_threshold_skips_ledgers_without_close_timestamp():
    ls = topic(ledger(1, 100), ledger(2, 100, ts=0), ledger(3, 100), open_ledger(4))
    # ledger 2 is not sealed: skipped and not counted (sums: 100 at 3, 200 at 1)
    assert select_by_threshold(ls, 150, None, NOW) == [1]
    assert select_by_threshold(ls, None, 0, NOW) == [1, 3]


def test_threshold_never_takes_the_newest_even_if_sealed():
    ls = topic(ledger(1, 100), ledger(2, 100))
    assert select_by_threshold(ls, 0, 0, NOW) == [1]


# --- deletion lag ------------------------------------------------------------------------------


def offloaded(ctx_ts=NOW - 1000, complete=True, deleted=False):
    return ledger(1, 100, complete=complete, deleted=deleted, ctx_ts=ctx_ts)


@pytest.mark.parametrize(
    "li, lag, due",
    [
        (offloaded(), None, False),
        (offloaded(), 500, True),
        (offloaded(), 2000, False),
        (offloaded(complete=False), 500, False),
        (offloaded(deleted=True), 500, False),
    ],
    ids=["lag-none", "lag-500", "lag-2000", "not-complete", "bookkeeper-deleted"],
)
def test_deletion_lag_pulsar_cases(li, lag, due):
    assert deletion_lag_due(li, lag, NOW) is due


def test_deletion_lag_boundary_is_strictly_greater():
    li = offloaded(ctx_ts=NOW - 1000)
    assert deletion_lag_due(li, 1000, NOW) is False
    assert deletion_lag_due(li, 999, NOW) is True
    assert deletion_lag_due(li, 1000, NOW + 1) is True
    assert deletion_lag_due(li, 0, NOW - 1000) is False
    assert deletion_lag_due(li, 0, NOW - 999) is True


def test_deletion_lag_without_offload_context():
    assert deletion_lag_due(ledger(1, 100), 0, NOW) is False
    assert deletion_lag_due(open_ledger(2), 0, NOW) is False
