"""Throughput counters for the status RPC: totals, and rates over the last minute of work."""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass

WINDOW_S = 60.0


@dataclass(frozen=True)
class ThroughputSnapshot:
    tokens_generated: int
    prompt_tokens_processed: int
    decode_tokens_per_s: float
    prefill_tokens_per_s: float
    requests_served: int


class ThroughputStats:
    """Records (tokens, seconds) per phase; rates are tokens over busy seconds in the window, so idle
    time between requests does not dilute them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._decode: deque[tuple[float, int, float]] = deque()
        self._prefill: deque[tuple[float, int, float]] = deque()
        self.tokens_generated = 0
        self.prompt_tokens_processed = 0
        self.requests_served = 0
        # Generating sequences moved down into a gap (Engine._pack): a figure to watch, since
        # each move copies a conversation's cache.
        self.sequence_moves = 0

    def record_decode(self, tokens: int, seconds: float) -> None:
        with self._lock:
            self.tokens_generated += tokens
            self._decode.append((time.monotonic(), tokens, seconds))

    def record_prefill(self, tokens: int, seconds: float) -> None:
        with self._lock:
            self.prompt_tokens_processed += tokens
            self._prefill.append((time.monotonic(), tokens, seconds))

    def record_request(self) -> None:
        with self._lock:
            self.requests_served += 1

    def record_move(self) -> None:
        with self._lock:
            self.sequence_moves += 1

    @staticmethod
    def _rate(samples: deque[tuple[float, int, float]], now: float) -> float:
        while samples and now - samples[0][0] > WINDOW_S:
            samples.popleft()
        seconds = sum(s for _, _, s in samples)
        return sum(n for _, n, _ in samples) / seconds if seconds > 0 else 0.0

    def snapshot(self) -> ThroughputSnapshot:
        now = time.monotonic()
        with self._lock:
            return ThroughputSnapshot(
                tokens_generated=self.tokens_generated,
                prompt_tokens_processed=self.prompt_tokens_processed,
                decode_tokens_per_s=self._rate(self._decode, now),
                prefill_tokens_per_s=self._rate(self._prefill, now),
                requests_served=self.requests_served,
            )
