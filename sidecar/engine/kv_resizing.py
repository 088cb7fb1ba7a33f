"""Growing and shrinking the engine's KV cache with the crowd, on the engine thread.

The decisions (how many sequences, when) are kv_demand.py's; this part of Engine (a mixin, like
Reloading) applies them to the engine's context and slots: more sequences when requests wait only
because every one is busy, fewer after a quiet spell, and none past a RAM budget's ceiling.
"""

from __future__ import annotations

import time

import structlog

from sidecar.engine.inbox import ImageReady
from sidecar.engine.kv_demand import ceiling_count, grown_count, park_beyond, resize, shrunk_count, swap_in
from sidecar.engine.reload import release_freed_memory
from sidecar.native.context import NativeContext

log = structlog.get_logger("engine")


class KvResizing:
    """Engine's KV resizes; only the engine thread calls these."""

    def _grow_for(self, blocked: int) -> bool:
        """More sequences when `blocked` requests wait only because every one is busy: a bigger
        context made beside the loop and swapped in once ready, or a resize in place. True when
        new sequences are free now."""
        grown = self.pool.grown_context()
        if grown is not None:
            self._swap_in(grown)
            return True
        grow = grown_count(self.pool.allocated, self.config.n_seq, sum(s.busy for s in self._slots), blocked)
        if grow is not None and self.config.grow_beside:
            self.pool.begin_growth(self.model, self.config, grow, lambda: self._inbox.put(ImageReady()))
        elif grow is not None:
            self._resize(grow)
            return True
        return False

    def _swap_in(self, grown: NativeContext) -> None:
        t0 = time.perf_counter()
        before = self.pool.allocated
        self._slots = swap_in(self._ctx, grown, self._slots)
        self._ctx = grown
        self._record_resize(before, t0)

    def _resize(self, n: int) -> None:
        """Allocate `n` sequences in place of today's (kv_demand.py); every stream pauses for it."""
        t0 = time.perf_counter()
        before = self.pool.allocated
        self._ctx, self._slots = resize(self._ctx, self.model, self.config, self._slots, self.sessions, n)
        self._record_resize(before, t0)

    def _record_resize(self, before: int, t0: float) -> None:
        self.pool.allocated = len(self._slots)
        self.pool.resizes += 1
        self.pool.last_resize_ms = (time.perf_counter() - t0) * 1000.0
        if self.pool.allocated < before:
            release_freed_memory()
        log.info("kv sequences resized", sequences=self.pool.allocated, was=before, most=self.config.n_seq,
                 pause_ms=round(self.pool.last_resize_ms, 1))

    def _shrink_when_quiet(self) -> None:
        if self.pool.growing:
            return
        n = shrunk_count(self.pool.allocated, self.pool.start, time.monotonic() - self.pool.quiet_since)
        if n is not None:
            self._resize(n)

    def _shrink_to_ceiling(self) -> None:
        """A RAM budget lowered below the sequences allocated: those beyond the new ceiling go as
        soon as no reply streams in them (kv_demand.py); the busy ones first finish where they are."""
        if self.pool.allocated <= self.pool.ceiling:
            return
        park_beyond(self._slots, self.pool.ceiling, self._ctx, self.sessions)
        n = ceiling_count(self._slots, self.pool.ceiling)
        if n is not None:
            self._resize(n)
