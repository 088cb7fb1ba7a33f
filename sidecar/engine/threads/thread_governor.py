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
    the prediction (a machine busy from the start then looks normal, which costs nothing). Its time
    a token: a tier spans up to twice the tokens (17-32), and beside streams a prompt's slices grow
    within it as the budget learns their cost, so a 27-token slice measured against the fastest
    20-token one looked 1.7x slow and started a probe on a quiet machine."""

    best: dict[int, float] = field(default_factory=dict)  # tier -> fastest ms a token

    def predicted_ms(self, tier: int, n_tokens: int, planned: int, used: int, elapsed_ms: float,
                     shallow: bool = True) -> float:
        """The pass's time from a prompt's start (0: nothing known of its tier there yet). Only a
        shallow pass teaches it: a deep one's time holds its reading of the cache (DepthCost)."""
        per_token = elapsed_ms / max(n_tokens, 1)
        if used == planned and shallow:
            self.best[tier] = min(self.best.get(tier, per_token), per_token)
        return self.best.get(tier, 0.0) * n_tokens


# Passes whose tokens sit on average this shallow in their context are priced as the plan (or the
# fastest pass of their size) says; the cost of reading the cache is learned from deeper ones.
SHALLOW_DEPTH = 256
# Deep passes whose cost of reading the cache is kept, and the share of them below the estimate:
# a low quantile, so noise does not pull it down as the lowest would, and a busy spell shorter than
# three quarters of them does not raise it.
DEPTH_SAMPLES = 64
DEPTH_QUANTILE = 0.25


def is_deep(reads: float, n_tokens: int) -> bool:
    """Whether a pass's tokens sit past SHALLOW_DEPTH on average (`reads`: the sum of their
    positions, the cached tokens their attention reads)."""
    return reads / max(n_tokens, 1) >= SHALLOW_DEPTH


@dataclass
class DepthCost:
    """What a pass spends reading the KV cache, on this machine: milliseconds per cached token
    read, a pass reading, for each new token, every cached token before it (the sum of its tokens'
    positions). The plan prices passes from the start of a prompt; with flash attention off each
    token reads the whole cache before it, so beside a 3,000-token prompt a pass of three streams'
    tokens and a 16-token slice took 140 ms where the plan (and the fastest pass of that size, met
    near the start) said 60, and the governor took every such pass for a busy CPU: it probed one
    thread for 8 passes, three times in one prompt, each pass 1.6-1.8x as long, the longest gaps
    the other NPCs saw (bench/run.py prompt-gap, 2-core EPYC, quiet).

    Learned from passes at the planned threads whose tokens sit past SHALLOW_DEPTH on average: their
    time beyond the base prediction over the tokens they read. A CPU busy since before the first deep
    pass is not seen as busy deep in a context, as without a plan (PassBaseline) at any depth."""

    samples: list[float] = field(default_factory=list)

    def predicted_ms(self, base_ms: float, reads: float, n_tokens: int, planned: int, used: int,
                     elapsed_ms: float) -> float:
        """`base_ms` (the plan's or the baseline's, from a prompt's start) plus this pass's reads
        of the cache at the learned cost, learning from it first when it ran at the planned threads."""
        if base_ms <= 0:
            return 0.0  # nothing to compare with: the governor leaves the pass out
        deep = is_deep(reads, n_tokens)
        if deep and used == planned:
            self.samples = (self.samples + [max(0.0, elapsed_ms - base_ms) / reads])[-DEPTH_SAMPLES:]
        if not deep or not self.samples:
            return base_ms
        ordered = sorted(self.samples)
        return base_ms + ordered[int(DEPTH_QUANTILE * (len(ordered) - 1))] * reads
