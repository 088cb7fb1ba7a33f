"""KV that follows the crowd: sequences allocated as conversations need them, not for the worst
case at start-up.

Each sequence's KV stream is allocated and cleared (so resident) whole when the context is made:
16 sequences of 4096 cells held 1.5 GB of a player's RAM for a 98 MB model before any NPC spoke
(issue 27). So the engine starts with a few (EngineConfig.n_seq_start), grows to as many as the
conversations running and waiting at once want, up to n_seq, in one step, and shrinks back once
none has run for SHRINK_IDLE_S (the rules, pure, are scheduling/kv_sizing.py's).

Growing makes a new context on the same model (the weights stay) in a thread beside the loop,
then moves every cached sequence into it between two passes: the streams running meanwhile go on,
and pause only for the copy of their cells. Shrinking happens only when nothing runs, and in the
loop: the sessions whose sequences go are evicted to host memory first, as when more sessions than
sequences talk, and come back when they speak again.

A RAM budget set while the daemon runs (SetBudget.ram_size) moves the ceiling itself. Raising it
lets the next crowd grow further; lowering it below what is allocated gives back the sequences
beyond it as soon as no reply streams in them: the idle ones at once, the busy ones as their
replies end (a streaming reply is never cut for memory), and none is admitted past the ceiling
meanwhile.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

import structlog

from sidecar.backend.engine_config import EngineConfig
from sidecar.backend.sessions import SessionStore
from sidecar.engine.loading import context_for
from sidecar.engine.scheduling import kv_sizing
from sidecar.engine.scheduling.slot import Slot
from sidecar.engine.scheduling.slot_choice import evict
from sidecar.errors import SidecarError
from sidecar.native.context import NativeContext
from sidecar.native.model import NativeModel

log = structlog.get_logger("engine")

class SequencePool:
    """The engine's allocated sequences: how many, and since when nothing ran."""

    def __init__(self, config: EngineConfig) -> None:
        self.start = config.n_seq_start or config.n_seq
        self.allocated = self.start
        # The most sequences the KV may hold now (EngineConfig.n_seq); a RAM budget moves it.
        self.ceiling = config.n_seq
        self.quiet_since = time.monotonic()
        self.resizes = 0
        self.last_resize_ms = 0.0

        # A bigger context being made beside the loop: (its sequences, the thread, the result).
        self._growing: tuple[int, threading.Thread, list] | None = None

    def begin_growth(self, model: NativeModel, config: EngineConfig, n: int, wake: Callable[[], None]) -> None:
        """Make a context of `n` sequences in a thread of its own: allocating and clearing 1.5 GB
        of KV took 1.4 s on 2 cores, which the streams running meanwhile need not wait for (they
        decode on the old context; only the swap, a copy of the cached cells, pauses them)."""
        if self._growing is not None:
            return
        result: list = []

        def make() -> None:
            try:
                result.append(context_for(model, config, n))
            except BaseException as e:  # reported when it is taken (grown_context)
                result.append(e)
            wake()

        thread = threading.Thread(target=make, name="xlm-kv-grow", daemon=True)
        self._growing = (n, thread, result)
        thread.start()

    def grown_context(self) -> NativeContext | None:
        """The context begin_growth made, once it is there; None while it is being made (or if it
        could not be: the crowd then waits for sequences to free, as before)."""
        if self._growing is None or self._growing[1].is_alive():
            return None
        n, thread, result = self._growing
        self._growing = None
        made = result[0] if result else None
        if isinstance(made, BaseException):
            log.warning("could not grow the KV cache; keeping its size", sequences=n, error=str(made))
            return None
        return made

    @property
    def growing(self) -> bool:
        return self._growing is not None

    def state(self, grow_beside: bool) -> kv_sizing.PoolState:
        """What the sizing decisions (kv_sizing.py) read of the pool."""
        return kv_sizing.PoolState(
            allocated=self.allocated, ceiling=self.ceiling, start=self.start, growing=self.growing,
            grown_ready=self._growing is not None and not self._growing[1].is_alive(), grow_beside=grow_beside)

    def settle(self) -> None:
        """Before the model is freed (a reload, close): wait for a context being made on it, and
        free it unused."""
        if self._growing is None:
            return
        self._growing[1].join()
        made = self.grown_context()
        if made is not None:
            made.close()

    def take_ceiling(self, config: EngineConfig) -> None:
        """A new ceiling (and start) from a RAM budget change; a bigger context being made for the
        old ceiling is dropped (settle), as it may hold more than the new one allows."""
        if config.n_seq != self.ceiling:
            self.settle()
        self.ceiling = config.n_seq
        self.start = min(config.n_seq_start or config.n_seq, config.n_seq)

    def admissible(self, slots: list[Slot]) -> list[Slot]:
        """The slots a request may be given: those under the ceiling. The busy ones beyond it stay
        listed, so a session mid-turn there is still seen as mid-turn (one turn at a time)."""
        return slots if self.allocated <= self.ceiling else [s for s in slots if s.seq < self.ceiling or s.busy]

    def wait_s(self) -> float | None:
        """How long the loop may block for a message before a shrink falls due; None: forever."""
        if self.allocated > self.ceiling:
            return 0.05  # over a lowered RAM budget: give back what is idle without delay
        if self.allocated <= self.start:
            return None
        return max(kv_sizing.SHRINK_IDLE_S - (time.monotonic() - self.quiet_since), 0.05)


def park_beyond(slots: list[Slot], ceiling: int, ctx: NativeContext, sessions: SessionStore) -> None:
    """Move the caches of the idle sequences at or past the ceiling to host memory (as when more
    sessions talk than there are sequences), so none of them is admitted to, or is a session's
    home, while the busy ones around them finish."""
    for slot in slots[ceiling:]:
        if not slot.busy and (slot.cached or slot.session_id is not None):
            evict(slot, ctx, sessions)


def swap_in(ctx: NativeContext, new_ctx: NativeContext, slots: list[Slot]) -> list[Slot]:
    """Move every cached sequence of `ctx` into the bigger `new_ctx` (same ids) and close `ctx`;
    the slots for the new sequences."""
    for slot in slots:
        if slot.cached:
            new_ctx.restore(slot.seq, ctx.save(slot.seq))
    ctx.close()
    return slots + [Slot(seq) for seq in range(len(slots), new_ctx.n_seq)]


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
