"""Fewer threads when the CPU is busy: notice passes far slower than planned, try fewer, probe back up.

The plan gives each token tier a thread count measured on a quiet machine. Beside a game the cores
are often busy, and llama.cpp's threads then wait for each other at every barrier: with 2 threads
on 2 cores of which one is busy, SmolLM2's 4-stream passes took 3.3x their planned time where one
thread took 1.6x (issue 17 measured up to 15x on another machine). So the engine reports each pass
here, and the governor caps the threads:

- the last `window` passes at the cap are *suspect* when on average they took `suspect_ratio`
  times what the plan predicts at the threads they ran with (the plan's time at its own thread
  count, scaled up linearly for fewer threads), and *hopeless* past `hopeless_ratio`. An average,
  not a median: on a busy machine most passes run near plan and a few stall for 5-10x as long
  (a descheduled thread), and it is the stalls that cost the throughput;
- hopeless passes step the cap down at once; suspect ones start a probe: `probe_passes` passes
  one thread lower;
- after `probe_after` passes at a lowered cap, a probe runs one thread higher;
- a probe's thread count is kept only if its passes cost clearly less (`keep_gain`) than the ones
  before it; otherwise the next probe that way waits twice as long (up to `max_probe_after`), so a
  machine that stays busy (or a plan that is just a little off) is not disturbed every second.

Costs are compared as measured time over the plan's time at the planned threads, so passes of
different sizes compare. Pure: no clock, no llama.cpp; the engine feeds it what it measured.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import fmean


@dataclass(frozen=True)
class GovernorSettings:
    suspect_ratio: float = 1.5
    hopeless_ratio: float = 6.0
    window: int = 8  # recent passes at the cap, averaged, and compared against a probe
    down_after: int = 8  # passes at a cap before a probe down may start
    probe_after: int = 400  # passes at a lowered cap before a probe up
    max_probe_after: int = 6400
    probe_passes: int = 8
    keep_gain: float = 0.85


@dataclass(frozen=True)
class Decision:
    """What the governor did with the last pass: "" (nothing), "down", "up", "probe" or "revert"."""

    action: str
    cap: int


@dataclass
class ThreadGovernor:
    """Caps the plan's thread counts. `threads(planned)` before a pass, `record(...)` after it."""

    max_threads: int
    settings: GovernorSettings = field(default_factory=GovernorSettings)
    cap: int = 0
    _since_change: int = 0
    _wait: dict[int, int] = field(default_factory=dict)  # direction -> passes before probing it
    _probe: int = 0  # direction of the probe running: -1, +1, or 0
    _probe_left: int = 0
    _recent: list[float] = field(default_factory=list)
    _probe_costs: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.cap = self.cap or self.max_threads
        self._wait = {-1: self.settings.down_after, 1: self.settings.probe_after}

    def threads(self, planned: int) -> int:
        """Threads for a pass the plan gives `planned` threads."""
        return max(1, min(planned, self.cap + self._probe))

    def record(self, planned: int, used: int, elapsed_ms: float, predicted_ms: float) -> Decision:
        """Account one pass: the plan's threads and predicted time for it, the threads it ran
        with and how long it took."""
        if predicted_ms <= 0 or elapsed_ms <= 0:
            return Decision("", self.cap)
        cost = elapsed_ms / predicted_ms  # 1.0: as planned, at the planned threads
        if self._probe:
            return self._record_probe(cost)
        self._recent = (self._recent + [cost])[-self.settings.window:]
        self._since_change += 1
        expected = planned / used if used < planned else 1.0
        if used == self.cap and self.cap > 1 and len(self._recent) >= self.settings.window:
            mean = fmean(self._recent)
            if mean > self.settings.hopeless_ratio * expected:
                self._changed(-1)
                return Decision("down", self.cap)
            if mean > self.settings.suspect_ratio * expected and self._since_change >= self._wait[-1]:
                return self._start_probe(-1)
        if self.cap < self.max_threads and self._since_change >= self._wait[1]:
            return self._start_probe(1)
        return Decision("", self.cap)

    def _start_probe(self, direction: int) -> Decision:
        self._probe, self._probe_left, self._probe_costs = direction, self.settings.probe_passes, []
        return Decision("probe", self.cap)

    def _changed(self, direction: int) -> None:
        self.cap += direction
        self._since_change = 0
        self._recent = []
        self._wait = {-1: self.settings.down_after, 1: self.settings.probe_after}

    def _record_probe(self, cost: float) -> Decision:
        self._probe_costs.append(cost)
        self._probe_left -= 1
        if self._probe_left > 0:
            return Decision("", self.cap)
        direction, self._probe = self._probe, 0
        before = fmean(self._recent) if self._recent else float("inf")
        if fmean(self._probe_costs) < self.settings.keep_gain * before:
            self._changed(direction)
            self._recent = list(self._probe_costs[-self.settings.window:])
            return Decision("down" if direction < 0 else "up", self.cap)
        self._since_change = 0
        self._wait[direction] = min(self._wait[direction] * 2, self.settings.max_probe_after)
        return Decision("revert", self.cap)


def predicted_pass_ms(n_tokens: int, tiers: tuple[tuple[int, float], ...]) -> float:
    """The plan's time for a pass of `n_tokens`: between two tiers' (max_tokens, ms) points
    linearly, flat below the first; 0 without tiers."""
    if not tiers:
        return 0.0
    points = sorted(tiers)
    if n_tokens <= points[0][0]:
        return points[0][1]
    for (n0, ms0), (n1, ms1) in zip(points, points[1:]):
        if n_tokens <= n1:
            return ms0 + (ms1 - ms0) * (n_tokens - n0) / (n1 - n0)
    n_last, ms_last = points[-1]
    return ms_last * n_tokens / n_last


def plan_pass_times(schedule: object | None) -> tuple[tuple[int, float], ...]:
    """(max_tokens, predicted ms per pass) of each tier of a planner Schedule; () without one."""
    tiers = getattr(schedule, "tiers", ()) or ()
    return tuple(sorted((t.max_tokens, t.predicted_ms_per_pass) for t in tiers if t.predicted_ms_per_pass > 0))


@dataclass
class PassBaseline:
    """Without a plan: the fastest pass seen per token tier at the planned threads stands in for
    the prediction (a machine busy from the start then looks normal, which costs nothing)."""

    best: dict[int, float] = field(default_factory=dict)

    def predicted_ms(self, tier: int, planned: int, used: int, elapsed_ms: float) -> float:
        if used == planned:
            self.best[tier] = min(self.best.get(tier, elapsed_ms), elapsed_ms)
        return self.best.get(tier, 0.0)
