"""Phase one's packed positions (spark_jobs/_topic_shuffle.py ``pack``/``unpack``, no Spark): every position
a run can read round-trips, and the decimal order is the position order (ledger, entry, batch index) with
"holds a value" last, so Spark's max of the decimal is the latest item."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_jobs._topic_shuffle import LEDGER_BITS_MAX, entry_bits, group_of, pack, unpack
from tieredcore.lifecycle.topic_compaction import TopicCompactionError
from tieredcore.model import Position


@st.composite
def positions(draw):
    ledger_bits = draw(st.integers(1, LEDGER_BITS_MAX))
    horizon = draw(st.integers(1 << (ledger_bits - 1), (1 << ledger_bits) - 1))
    e = entry_bits(Position(horizon, 0))
    n = draw(st.integers(1, 40))
    lids = draw(st.lists(st.integers(0, horizon) | st.sampled_from([0, horizon]), min_size=n, max_size=n))
    eids = draw(st.lists(st.integers(0, min((1 << e) - 1, 2**63 - 1)) | st.sampled_from([0, (1 << min(e, 63)) - 1]),
                         min_size=n, max_size=n))
    bis = draw(st.lists(st.integers(-1, 2**31 - 1), min_size=n, max_size=n))
    sizes = draw(st.lists(st.integers(-3, 2**31), min_size=n, max_size=n))
    return e, np.array(lids, np.int64), np.array(eids, np.int64), np.array(bis, np.int32), np.array(sizes, np.int64)


@settings(max_examples=300, deadline=None)
@given(positions())
def test_packed_positions_round_trip_in_position_order(p) -> None:
    e, lids, eids, bis, sizes = p
    packed = pack(lids, eids, bis, sizes, e)
    got = unpack(packed, e)
    assert [x.tolist() for x in got] == [lids.tolist(), eids.tolist(), bis.tolist(), (sizes > 0).tolist()]
    values = [v.as_py() for v in packed]
    assert all(0 <= int(v) < 10**38 for v in values)
    by_position = sorted(range(len(values)), key=lambda i: (lids[i], eids[i], bis[i], sizes[i] > 0))
    assert [values[i] for i in by_position] == sorted(values)
    sliced = packed.slice(1)
    assert [x.tolist() for x in unpack(sliced, e)] == [x[1:].tolist() for x in got]


def test_packing_refuses_what_it_cannot_hold() -> None:
    assert entry_bits(Position(1, 0)) == 63 and entry_bits(Position(2**53 - 1, 0)) == 40
    with pytest.raises(TopicCompactionError, match="compact this topic in one process"):
        entry_bits(Position(2**53, 0))
    with pytest.raises(ValueError, match="entry ids below 2\\*\\*40"):
        pack(np.array([1]), np.array([2**40]), np.array([0], np.int32), np.array([1]), 40)


def test_groups_of_positions() -> None:
    starts = [(3, 0), (3, 50), (5, 0), (9, 7)]
    lids = np.array([3, 3, 3, 4, 5, 9, 9, 12])
    eids = np.array([0, 49, 50, 999, 0, 6, 7, 0])
    assert group_of(starts, lids, eids).to_pylist() == [0, 0, 1, 1, 2, 2, 3, 3]
    with pytest.raises(RuntimeError, match="before the first group"):
        group_of(starts, np.array([2]), np.array([5]))
