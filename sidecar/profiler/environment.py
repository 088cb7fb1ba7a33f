"""The other processes' load as the background profile sees it: a steady level, and bursts.

On a player's PC the game always runs: on two cores a game's main loop holds one core the whole
time. That is the machine's normal state, not a disturbance, so it cannot be waited out: a
profile that waits for an idle machine never lands. What can be told apart is the *environment*
(the load that is always there: the median of recent samples) from a *burst* (load above that
level: a level load, a shader compile, another program starting), which does pass.

The environment decides which thread counts a slice can measure truthfully. llama.cpp's CPU
threads meet at a barrier after every op; a thread that has to share its core with a process
that always wants it is starved, and at the profile's nice 19 beside a nice 0 game it gets about
1.5% of that core: a two-thread decode beside a busy loop on one of two cores then takes tens of
times as long (measured: one quick-profile step 5 s on a quiet machine, 278 s beside the loop).
Such a figure is known wrong before it is taken (the planner would cap it anyway, see
sidecar.planner.disturbed), so those thread counts are deferred instead: left out of the slice,
estimated by the planner from the fewer-thread figures, and measured when the machine is quiet.
The thread counts that fit the free cores are measured as on a quiet machine with fewer cores.
"""

from __future__ import annotations

import statistics
import time
from collections import deque

from sidecar.profiler.machine_load import OtherLoadMeter
from sidecar.profiler.quality import DISTURBED_CORES

# The environment is the median of the samples of this long: long enough that a burst of a few
# seconds does not become the level, short enough that a game starting up becomes it soon.
ENVIRONMENT_WINDOW_S = 10.0
# Load this far (cores) above the environment is a burst: a slice does not start in one, and a
# slice that saw one is thrown away and measured again (a bounded number of times).
BURST_CORES = 0.5
# A running slice checks the load this often (it is stopped within one probe decode of a burst).
BURST_CHECK_S = 0.5


def threads_that_fit(threads: tuple[int, ...], logical_cores: int, others_cores: float) -> tuple[int, ...]:
    """The thread counts a slice can measure beside `others_cores` of steady load: those that fit
    the free cores (with DISTURBED_CORES of slack: a shell's blip is not load). At least the
    smallest count, so a slice always measures something."""
    free = logical_cores - max(0.0, others_cores) + DISTURBED_CORES
    fit = tuple(t for t in threads if t <= free)
    return fit or tuple(sorted(threads))[:1]


class LoadHistory:
    """Recent samples of the cores other processes kept busy, and the level they make."""

    def __init__(self, window_s: float = ENVIRONMENT_WINDOW_S) -> None:
        self._window_s = window_s
        self._samples: deque[tuple[float, float]] = deque()

    def add(self, cores: float, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self._samples.append((now, cores))
        while self._samples and now - self._samples[0][0] > self._window_s:
            self._samples.popleft()

    def latest(self) -> float:
        return self._samples[-1][1] if self._samples else 0.0

    def level(self) -> float:
        """The steady load (cores): the median of the window (0 before any sample)."""
        return statistics.median(c for _, c in self._samples) if self._samples else 0.0

    def span_s(self) -> float:
        """Seconds the samples in the window cover."""
        return self._samples[-1][0] - self._samples[0][0] if len(self._samples) > 1 else 0.0

    def quiet(self) -> bool:
        return self.latest() < DISTURBED_CORES and self.level() < DISTURBED_CORES

    def in_burst(self) -> bool:
        """The latest sample is well above the level."""
        return self.latest() > self.level() + BURST_CORES


class BurstWatch:
    """Whether other processes went above `allowed_cores` since the last check (checked every
    BURST_CHECK_S while a slice runs; cheap in between)."""

    def __init__(self, logical_cores: int, allowed_cores: float) -> None:
        self._logical = max(1, logical_cores)
        self._allowed = allowed_cores
        self._meter = OtherLoadMeter()
        self._since = time.monotonic()
        self.burst = False

    def __call__(self) -> bool:
        now = time.monotonic()
        if self.burst:
            return True
        if now - self._since >= BURST_CHECK_S:
            cores = self._meter.share() * self._logical
            self._meter = OtherLoadMeter()
            self._since = now
            self.burst = cores > self._allowed
        return self.burst
