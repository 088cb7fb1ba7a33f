"""Which sequences move so the replying ones sit on consecutive ids (packing.py): pure, slots in,
moves out."""

from __future__ import annotations

import pytest

from sidecar.engine.scheduling.packing import packing_moves
from sidecar.engine.scheduling.slot import Slot

pytestmark = pytest.mark.fast


def slots(busy: dict[int, int], n: int = 4, idle_cached: int = 0) -> list[Slot]:
    """`n` slots; those in `busy` reply and hold that many cached tokens, the others `idle_cached`."""
    return [Slot(seq, cached=[7] * busy.get(seq, idle_cached), active=object() if seq in busy else None)  # type: ignore[arg-type]
            for seq in range(n)]


def moves(pairs) -> list[tuple[int, int]]:
    return [(idle.seq, busy.seq) for idle, busy in pairs]


def test_a_run_of_replying_sequences_is_left_where_it_is_wherever_it_starts() -> None:
    assert moves(packing_moves(slots({0: 50, 1: 50, 2: 50}))) == []
    # The NPC on sequence 0 finished its line beside a 2,000-token prompt on 3: before, the prompt's
    # cells were copied down into 0, a 100 ms stall for the two NPCs still talking.
    assert moves(packing_moves(slots({1: 140, 2: 140, 3: 2000}))) == []
    assert moves(packing_moves(slots({}))) == []


def test_a_gap_between_them_is_closed_by_moving_the_fewest_cells() -> None:
    assert moves(packing_moves(slots({0: 2000, 2: 140, 3: 140}))) == [(1, 3)]
    assert moves(packing_moves(slots({0: 140, 1: 140, 3: 2000}))) == [(2, 0)]
    # An idle sequence's own cells move too (a session's turns, parked above): they count.
    assert moves(packing_moves(slots({0: 100, 3: 100}, idle_cached=500))) == [(1, 3)]


def test_sixteen_streams_with_one_ended_close_the_gap_once() -> None:
    crowd = {seq: 300 for seq in range(16) if seq != 5}
    crowd[15] = 900
    assert moves(packing_moves(slots(crowd, n=16))) == [(5, 0)]
    assert moves(packing_moves(slots({seq: 300 for seq in range(16) if seq != 5}, n=16))) == [(5, 15)]


def test_under_a_lowered_ceiling_the_run_moves_below_it_so_the_rest_can_be_given_back() -> None:
    # A RAM budget now allows 2 of 4 sequences: the two replies on 2 and 3 move into 0 and 1.
    assert moves(packing_moves(slots({2: 100, 3: 100}), ceiling=2)) == [(0, 2), (1, 3)]
    assert moves(packing_moves(slots({0: 100, 1: 100}), ceiling=2)) == []
    # More replies than the ceiling holds: they stay a run where they are, and finish there.
    assert moves(packing_moves(slots({1: 100, 2: 100, 3: 100}), ceiling=2)) == []
    assert moves(packing_moves(slots({2: 100, 3: 100}), ceiling=4)) == []
