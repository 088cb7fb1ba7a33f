"""An NPC that talks the whole time beside a test's requests, and how long it ever waited for a
token: what "the other streams keep receiving tokens" means, measured."""

from __future__ import annotations

import statistics
import threading
import time

from support.daemons import RunningDaemon
from support.no_early_stop import grpc_eog_ids, grpc_sampling
from sidecar.api import pb


class Heartbeat:
    """An NPC that talks the whole time (its end tokens banned: each reply runs 64 tokens), and
    the arrival time of every chunk. `pause()` lets it finish its reply and wait until `resume()`:
    a test that measures gaps only in some windows need not decode through the rest (a core's worth)."""

    def __init__(self, daemon: RunningDaemon) -> None:
        with daemon.client(timeout_s=60) as c:
            self.eog = grpc_eog_ids(c)
        self._daemon = daemon
        self.replies: list[list[float]] = []
        self._stop = threading.Event()
        self._talking = threading.Event()
        self._talking.set()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        while not any(len(r) > 3 for r in list(self.replies)):
            time.sleep(0.02)

    def _run(self) -> None:
        request = pb.GenerateRequest(prompt="The smith said:", max_tokens=64,
                                     sampling=grpc_sampling(self.eog, temperature=0.8, seed=1))
        with self._daemon.client(timeout_s=120) as c:
            while not self._stop.is_set():
                self._talking.wait()
                if self._stop.is_set():
                    break
                arrivals: list[float] = []
                self.replies.append(arrivals)
                for chunk in c.generate(request):
                    if chunk.token_ids:
                        arrivals.append(time.monotonic())
                assert len(arrivals) > 0

    def longest_gap_ms(self, since: float, until: float) -> float:
        """The longest wait between two tokens of one reply that ends inside [since, until]."""
        gaps = [b - a for r in list(self.replies) for a, b in zip(r, r[1:]) if b >= since and a <= until]
        return max(gaps, default=0.0) * 1000.0

    def typical_gap_ms(self) -> float:
        gaps = [b - a for r in list(self.replies) for a, b in zip(r, r[1:])]
        return statistics.median(gaps) * 1000.0

    def pause(self) -> None:
        """Stop after the reply in flight (the next one waits for resume())."""
        self._talking.clear()

    def resume(self) -> None:
        """Talk again, and return once the new reply streams (so a gap measured next is a gap
        beside a live stream, not its start)."""
        if self._talking.is_set():
            return
        started = len(self.replies)
        self._talking.set()
        while not (len(self.replies) > started and len(self.replies[-1]) > 3):
            time.sleep(0.02)

    def stop(self) -> None:
        self._stop.set()
        self._talking.set()
        self._thread.join(120)
