"""Growing and shrinking the engine's KV cache with the crowd, on the engine thread.

The decisions (how many sequences, when) are kv_demand.py's; these functions apply them to the
engine's context and slots: more sequences when requests wait only because every one is busy,
fewer after a quiet spell, and none past a RAM budget's ceiling. They take the engine whole, since
a resize replaces its context and its slots together.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import structlog

from sidecar.engine.kv_demand import ceiling_count, grown_count, park_beyond, resize, shrunk_count, swap_in
from sidecar.engine.memory_trim import release_freed_memory
from sidecar.native.context import NativeContext

if TYPE_CHECKING:  # the engine imports this module
    from sidecar.engine.engine import Engine

log = structlog.get_logger("engine")


def grow_for(engine: Engine, blocked: int) -> bool:
    """More sequences when `blocked` requests wait only because every one is busy: a bigger
    context made beside the loop and swapped in once ready, or a resize in place. True when
    new sequences are free now."""
    pool = engine.pool
    grown = pool.grown_context()
    if grown is not None:
        _swap_in(engine, grown)
        return True
    grow = grown_count(pool.allocated, engine.config.n_seq, sum(s.busy for s in engine.slots), blocked)
    if grow is not None and engine.config.grow_beside:
        pool.begin_growth(engine.model, engine.config, grow, engine.wake)
    elif grow is not None:
        _resize(engine, grow)
        return True
    return False


def shrink_when_quiet(engine: Engine) -> None:
    pool = engine.pool
    if pool.growing:
        return
    n = shrunk_count(pool.allocated, pool.start, time.monotonic() - pool.quiet_since)
    if n is not None:
        _resize(engine, n)


def shrink_to_ceiling(engine: Engine) -> None:
    """A RAM budget lowered below the sequences allocated: those beyond the new ceiling go as
    soon as no reply streams in them (kv_demand.py); the busy ones first finish where they are."""
    pool = engine.pool
    if pool.allocated <= pool.ceiling:
        return
    park_beyond(engine.slots, pool.ceiling, engine.ctx, engine.sessions)
    n = ceiling_count(engine.slots, pool.ceiling)
    if n is not None:
        _resize(engine, n)


def _swap_in(engine: Engine, grown: NativeContext) -> None:
    t0 = time.perf_counter()
    before = engine.pool.allocated
    engine.slots = swap_in(engine.ctx, grown, engine.slots)
    engine.ctx = grown
    _record_resize(engine, before, t0)


def _resize(engine: Engine, n: int) -> None:
    """Allocate `n` sequences in place of today's (kv_demand.py); every stream pauses for it."""
    t0 = time.perf_counter()
    before = engine.pool.allocated
    engine.ctx, engine.slots = resize(engine.ctx, engine.model, engine.config, engine.slots, engine.sessions, n)
    _record_resize(engine, before, t0)


def _record_resize(engine: Engine, before: int, t0: float) -> None:
    pool = engine.pool
    pool.allocated = len(engine.slots)
    pool.resizes += 1
    pool.last_resize_ms = (time.perf_counter() - t0) * 1000.0
    if pool.allocated < before:
        release_freed_memory()
    log.info("kv sequences resized", sequences=pool.allocated, was=before, most=engine.config.n_seq,
             pause_ms=round(pool.last_resize_ms, 1))
