"""Fewer threads when the CPU is busy: notice passes far slower than planned, step down, probe back up.

The plan gives each token tier a thread count measured on a quiet machine. Beside a game the cores
are often busy, and llama.cpp's threads then wait for each other at every barrier: with 2 threads
on 2 busy cores a pass took 15-20x its planned time, where 1 thread ran close to plan (issue 17:
4-5 against 64-96 tokens/s). So the engine reports each pass here, and the governor caps threads:

- a pass is *slow* when it took `slow_ratio` times what the plan predicts at the threads it ran
  with (the plan's time at its own thread count, scaled up linearly for fewer threads);
- `slow_passes` slow passes in a row at the cap step the cap down by one;
- after `probe_after` passes at a lowered cap, `probe_passes` passes run one thread higher; the
  higher count is kept only if those passes cost clearly less (`keep_gain`) than the ones before,
  otherwise the cap stays and the next probe waits twice as long (up to `max_probe_after`), so a
  machine that stays busy is not disturbed every few seconds.

Costs are compared as measured time over the plan's time at the planned threads, so passes of
different sizes compare. Pure: no clock, no llama.cpp; the engine feeds it what it measured.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median


@dataclass(frozen=True)
class GovernorSettings:
    slow_ratio: float = 3.0
    slow_passes: int = 6
    probe_after: int = 400
    max_probe_after: int = 6400
    probe_passes: int = 24
    keep_gain: float = 0.85
    window: int = 24  # recent passes at the cap, compared against a probe


@dataclass(frozen=True)
class Decision:
    """What the governor did with the last pass: "" (nothing), "down", "probe", "keep" or "revert"."""

    action: str
    cap: int


@dataclass
class ThreadGovernor:
    """Caps the plan's thread counts. `threads(planned)` before a pass, `record(...)` after it."""

    max_threads: int
    settings: GovernorSettings = field(default_factory=GovernorSettings)
    cap: int = 0
    _slow_run: int = 0
    _since_change: int = 0
    _probe_after: int = 0
    _probing: int = 0  # passes left in a probe (at cap + 1)
    _recent: list[float] = field(default_factory=list)
    _probe_costs: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.cap = self.cap or self.max_threads
        self._probe_after = self._probe_after or self.settings.probe_after

    def threads(self, planned: int) -> int:
        """Threads for a pass the plan gives `planned` threads."""
        limit = self.cap + 1 if self._probing else self.cap
        return max(1, min(planned, limit))

    def record(self, planned: int, used: int, elapsed_ms: float, predicted_ms: float) -> Decision:
        """Account one pass: the plan's threads and predicted time for it, the threads it ran
        with and how long it took."""
        if predicted_ms <= 0 or elapsed_ms <= 0:
            return Decision("", self.cap)
        cost = elapsed_ms / predicted_ms  # 1.0: as planned, at the planned threads
        expected = planned / used if used < planned else 1.0
        if self._probing:
            return self._record_probe(cost)
        self._recent = (self._recent + [cost])[-self.settings.window:]
        self._since_change += 1
        if cost > self.settings.slow_ratio * expected and used == self.cap and self.cap > 1:
            self._slow_run += 1
            if self._slow_run >= self.settings.slow_passes:
                return self._step_down()
        else:
            self._slow_run = 0
        if self.cap < self.max_threads and self._since_change >= self._probe_after:
            self._probing = self.settings.probe_passes
            self._probe_costs = []
            return Decision("probe", self.cap)
        return Decision("", self.cap)

    def _step_down(self) -> Decision:
        self.cap -= 1
        self._slow_run = 0
        self._since_change = 0
        self._recent = []
        self._probe_after = self.settings.probe_after
        return Decision("down", self.cap)

    def _record_probe(self, cost: float) -> Decision:
        self._probe_costs.append(cost)
        self._probing -= 1
        if self._probing > 0:
            return Decision("", self.cap)
        before = median(self._recent) if self._recent else float("inf")
        self._since_change = 0
        self._slow_run = 0
        if median(self._probe_costs) < self.settings.keep_gain * before:
            self.cap += 1
            self._recent = list(self._probe_costs[-self.settings.window:])
            self._probe_after = self.settings.probe_after
            return Decision("keep", self.cap)
        self._probe_after = min(self._probe_after * 2, self.settings.max_probe_after)
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
