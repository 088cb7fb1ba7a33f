"""Growing and shrinking the engine's KV cache with the crowd, on the engine thread.

What to do is decided as data (scheduling/kv_sizing.py: the pool's state and the crowd in, an
operation out); these functions ask at the loop's three points and perform the answer on the
engine's context and slots: more sequences when requests wait only because every one is busy,
fewer after a quiet spell, and none past a RAM budget's ceiling. They take the engine whole, since
a resize replaces its context and its slots together.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import structlog

from sidecar.engine.kv_demand import park_beyond, resize, swap_in
from sidecar.engine.memory_trim import release_freed_memory
from sidecar.engine.scheduling.kv_sizing import GrowBeside, KvSizing, ParkBeyond, Resize, SwapInGrown, after_admission, to_ceiling, when_quiet

if TYPE_CHECKING:  # the engine imports this module
    from sidecar.engine.engine import Engine

log = structlog.get_logger("engine")


def grow_for(engine: Engine, blocked: int) -> bool:
    """More sequences when `blocked` requests wait only because every one is busy: a bigger
    context made beside the loop and swapped in once ready, or a resize in place. True when
    new sequences are free now."""
    busy = sum(s.busy for s in engine.slots)
    operation = after_admission(engine.pool.state(engine.config.grow_beside), busy, blocked)
    return operation is not None and perform(engine, operation)


def shrink_when_quiet(engine: Engine) -> None:
    pool = engine.pool
    operation = when_quiet(pool.state(engine.config.grow_beside), time.monotonic() - pool.quiet_since)
    if operation is not None:
        perform(engine, operation)


def shrink_to_ceiling(engine: Engine) -> None:
    """A RAM budget lowered below the sequences allocated: those beyond the new ceiling go as
    soon as no reply streams in them; the busy ones first finish where they are."""
    for operation in to_ceiling(engine.pool.state(engine.config.grow_beside), engine.slots):
        perform(engine, operation)


def perform(engine: Engine, operation: KvSizing) -> bool:
    """Do what kv_sizing decided; True when the engine has new free sequences now."""
    if isinstance(operation, SwapInGrown):
        grown = engine.pool.grown_context()
        if grown is None:  # it could not be made (logged): the crowd waits for sequences to free
            return False
        t0 = time.perf_counter()
        before = engine.pool.allocated
        engine.slots = swap_in(engine.ctx, grown, engine.slots)
        engine.ctx = grown
        _record_resize(engine, before, t0)
        return True
    if isinstance(operation, GrowBeside):
        engine.pool.begin_growth(engine.model, engine.config, operation.sequences, engine.wake)
        return False
    if isinstance(operation, ParkBeyond):
        park_beyond(engine.slots, operation.ceiling, engine.ctx, engine.sessions)
        return False
    assert isinstance(operation, Resize)
    t0 = time.perf_counter()
    before = engine.pool.allocated
    engine.ctx, engine.slots = resize(engine.ctx, engine.model, engine.config, engine.slots, engine.sessions,
                                      operation.sequences)
    _record_resize(engine, before, t0)
    return engine.pool.allocated > before


def _record_resize(engine: Engine, before: int, t0: float) -> None:
    pool = engine.pool
    pool.allocated = len(engine.slots)
    pool.resizes += 1
    pool.last_resize_ms = (time.perf_counter() - t0) * 1000.0
    if pool.allocated < before:
        release_freed_memory()
    log.info("kv sequences resized", sequences=pool.allocated, was=before, most=engine.config.n_seq,
             pause_ms=round(pool.last_resize_ms, 1))
