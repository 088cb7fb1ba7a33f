"""KV that follows the crowd: sequences allocated as conversations need them, not for the worst
case at start-up.

Each sequence's KV stream is allocated and cleared (so resident) whole when the context is made:
16 sequences of 4096 cells held 1.5 GB of a player's RAM for a 98 MB model before any NPC spoke
(issue 27). So the engine starts with a few (EngineConfig.n_seq_start), grows to as many as the
conversations running and waiting at once want, up to n_seq, in one step, and shrinks back once
none has run for SHRINK_IDLE_S.

Growing or shrinking makes a new context on the same model (the weights stay) and restores every
sequence's saved state, as a reload does: every stream pauses for it, once per crowd (measured by
bench/run.py village and batch). Shrinking happens only when nothing runs: the sessions whose
sequences go are evicted to host memory first, as when more sessions than sequences talk, and
come back when they speak again.
"""

from __future__ import annotations

import time

import structlog

from sidecar.backend.engine_config import EngineConfig
from sidecar.backend.sessions import SessionStore
from sidecar.engine.loading import context_for
from sidecar.engine.scheduling.slot import Slot
from sidecar.engine.scheduling.slot_choice import evict
from sidecar.errors import SidecarError
from sidecar.native.context import NativeContext
from sidecar.native.model import NativeModel

log = structlog.get_logger("engine")

# Quiet this long (nothing running or waiting) and the sequences beyond the start are given back.
SHRINK_IDLE_S = 30.0


def grown_count(allocated: int, ceiling: int, busy: int, waiting: int) -> int | None:
    """Sequences to grow to when every allocated one is busy and requests wait: enough for all of
    them at once, rounded up to a power of two (a crowd arriving in waves resizes once or twice,
    not once per NPC), at most `ceiling`. None: no growth."""
    if waiting <= 0 or busy < allocated or allocated >= ceiling:
        return None
    want = busy + waiting
    n = allocated
    while n < want:
        n *= 2
    return min(n, ceiling)


def shrunk_count(allocated: int, start: int, quiet_s: float) -> int | None:
    """Sequences to shrink to after `quiet_s` with nothing running; None: stay."""
    return start if allocated > start and quiet_s >= SHRINK_IDLE_S else None


class SequencePool:
    """The engine's allocated sequences: how many, and since when nothing ran."""

    def __init__(self, config: EngineConfig) -> None:
        self.start = config.n_seq_start or config.n_seq
        self.allocated = self.start
        self.quiet_since = time.monotonic()
        self.resizes = 0
        self.last_resize_ms = 0.0

    def ceiling(self, config: EngineConfig) -> int:
        return config.n_seq

    def wait_s(self) -> float | None:
        """How long the loop may block for a message before a shrink falls due; None: forever."""
        if self.allocated <= self.start:
            return None
        return max(SHRINK_IDLE_S - (time.monotonic() - self.quiet_since), 0.05)


def resize(ctx: NativeContext, model: NativeModel, config: EngineConfig, slots: list[Slot], sessions: SessionStore,
           n: int) -> tuple[NativeContext, list[Slot]]:
    """A context of `n` sequences in place of `ctx`, every kept sequence's cache restored; the
    sequences beyond `n` must be idle, and their sessions are evicted to host memory first. When
    the new context cannot be made (host memory), one of the old size is made again instead."""
    for slot in slots[n:]:
        assert slot.active is None, "only idle sequences are given back"
        evict(slot, ctx, sessions)
    saved = {s.seq: ctx.save(s.seq) for s in slots[:n] if s.cached}
    ctx.close()
    try:
        new_ctx = context_for(model, config, n)
    except SidecarError as e:
        log.warning("could not resize the KV cache; keeping its size", sequences=n, error=str(e))
        n = len(slots)
        new_ctx = context_for(model, config, n)
    for seq, state in saved.items():
        new_ctx.restore(seq, state)
    return new_ctx, slots[:n] + [Slot(seq) for seq in range(len(slots), n)]
