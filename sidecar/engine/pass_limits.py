"""The frame guard's limits as the engine applies them to each pass: a thread cap, a cap on the
tokens one pass carries (a long prefill is split across passes), and a pause after each pass.

Set from the daemon's event loop (the guard), read on the engine thread between passes: the limits
are one frozen object swapped whole, so a pass sees either the old limits or the new ones."""

from __future__ import annotations

import time

from sidecar.guard.frame_guard import NO_LIMITS, PassLimits

# A pause never holds the engine longer than this: messages (cancels, new requests) wait behind it.
MAX_PAUSE_S = 0.1


class PassLimiter:
    def __init__(self) -> None:
        self.limits: PassLimits = NO_LIMITS
        self.last_pause_ms = 0.0

    def threads(self, threads: int) -> int:
        cap = self.limits.max_threads
        return max(1, min(threads, cap)) if cap else threads

    def batch(self, n_batch: int) -> int:
        cap = self.limits.max_pass_tokens
        return max(1, min(n_batch, cap)) if cap else n_batch

    def pause_after(self, elapsed_s: float) -> None:
        ratio = self.limits.pause_ratio
        pause = min(MAX_PAUSE_S, elapsed_s * ratio) if ratio > 0 else 0.0
        self.last_pause_ms = pause * 1000.0
        if pause:
            time.sleep(pause)
