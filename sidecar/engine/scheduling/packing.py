"""Keeping the replying sequences on consecutive ids.

Without a unified KV cache llama.cpp puts only consecutive sequence ids into one micro-batch
(llama_batch_allocr::split_equal, sequential: each id one more than the last, from any first one),
so every gap between them costs one more pass over the weights per step. SmolLM2, 16 streams, 2
cores: 376 tokens/s packed, 277 with one gap, 170 spread over 64 sequences. A move copies the used
cells, once per gap, where a gap costs every step.

Idle sequences below or above the run are no gap, and the run is closed where the cells to copy
are fewest: a move costs what the sequences hold. It used to pack onto ids 0..n-1 whatever they
held: when the NPC on sequence 0 finished its line beside a 2,000-token prompt on sequence 3, the
prompt's 44 MB of KV was copied down into 0, a 100 ms stall between two passes for the two other
NPCs still talking (bench/run.py prompt-gap: the longest gap of the evening, at each reply's end).
"""

from __future__ import annotations

from sidecar.native.context import NativeContext
from sidecar.backend.sessions import SessionStore
from sidecar.engine.scheduling.slot import Slot


def packing_moves(slots: list[Slot], ceiling: int | None = None) -> list[tuple[Slot, Slot]]:
    """(idle slot inside, generating slot outside) pairs whose exchange leaves the generating
    sequences on consecutive ids: of the windows of that many ids, the one whose moves copy the
    fewest cached tokens (the lowest on a tie). Under a `ceiling` (a RAM budget lowered below the
    sequences allocated) the run goes below it where it fits, so the sequences above can be given
    back without waiting for the replies there to end. Pure: the slots are listed by id."""
    busy = [s.seq for s in slots if s.busy]
    if not busy:
        return []
    n_active = len(busy)
    limit = ceiling if ceiling is not None and n_active <= ceiling < len(slots) else len(slots)
    if busy[-1] - busy[0] + 1 == n_active and busy[-1] < limit:
        return []  # already a run (every pass asks: the common case, found without the search)
    best: tuple[int, list[Slot], list[Slot]] | None = None  # (tokens to copy, gaps, movers)
    for start in range(limit - n_active + 1):
        gaps = [s for s in slots[start:start + n_active] if not s.busy]
        movers = [s for s in slots if s.busy and not start <= s.seq < start + n_active]
        cost = sum(len(s.cached) for s in gaps + movers)
        if best is None or cost < best[0]:
            best = (cost, gaps, movers)
    assert best is not None  # n_active <= limit: at least one window
    return list(zip(best[1], best[2]))


def swap(ctx: NativeContext, sessions: SessionStore, low: Slot, high: Slot) -> None:
    """Exchange an idle slot's cache and a generating one's. What the idle slot held moves up
    rather than out: an idle session's turns, or a one-off prompt the next request may share."""
    moving = ctx.save(high.seq) if high.cached else None
    parked = ctx.save(low.seq) if low.cached else None
    ctx.clear(low.seq)
    ctx.clear(high.seq)
    if moving is not None:
        ctx.restore(low.seq, moving)
    if parked is not None:
        ctx.restore(high.seq, parked)
    low.cached, high.cached = high.cached, low.cached
    low.session_id, high.session_id = high.session_id, low.session_id
    low.active, high.active = high.active, low.active
    low.last_used, high.last_used = high.last_used, low.last_used
    for slot in (low, high):
        session = sessions.get(slot.session_id) if slot.session_id else None
        if session is not None:
            session.seq = slot.seq
