"""The engine's side of the thread governor: which plan a pass is measured against, and a log line
when the thread cap moves. Engine thread only."""

from __future__ import annotations

import structlog

from sidecar.backend.engine_config import EngineConfig
from sidecar.engine.threads.thread_governor import DepthCost, PassBaseline, ThreadGovernor, is_deep, plan_pass_times, predicted_pass_ms

log = structlog.get_logger("engine")


def pass_size(n_tokens: int) -> int:
    """The power of two at or above `n_tokens`: passes of one size class, whose times compare."""
    return 1 << max(0, n_tokens - 1).bit_length()


class GovernedThreads:
    """Threads per pass: the plan's tier threads under the governor's cap. A new configuration
    (SetBudget, reload) starts a new governor, at the new plan's threads."""

    def __init__(self) -> None:
        self._config: EngineConfig | None = None
        self._governor = ThreadGovernor(max_threads=1)
        self._plan_times: tuple[tuple[int, float], ...] = ()
        self._baseline = PassBaseline()
        self._depth = DepthCost()

    def threads(self, config: EngineConfig, planned: int) -> int:
        """The threads for a pass the plan gives `planned`: capped while the CPU is busy, unless
        `config` pins them."""
        if not config.adaptive_threads:
            return planned
        if config is not self._config:
            # Before, the first pass of every configuration ran under the previous one's governor
            # (at first, a cap of one thread): the first prefill after a start or a reload.
            self._follow(config)
        return self._governor.threads(planned)

    def _follow(self, config: EngineConfig) -> None:
        self._config = config
        self._governor = ThreadGovernor(max_threads=max(t for _, t in config.tier_threads))
        self._plan_times = plan_pass_times(config.schedule)
        self._baseline = PassBaseline()
        self._depth = DepthCost()

    def record(self, config: EngineConfig, n_tokens: int, planned: int, used: int, elapsed_ms: float,
               reads: float = 0.0) -> None:
        """One pass: its tokens, threads and time, and `reads`, the sum of its tokens' positions
        (the cached tokens its attention reads: DepthCost)."""
        if not config.adaptive_threads:
            return  # pinned threads: nothing to govern, and no cap to announce
        if config is not self._config:
            self._follow(config)
        if self._plan_times:
            predicted = predicted_pass_ms(n_tokens, self._plan_times)
        else:
            # Without a plan, passes are compared with the fastest of their own size. Not by thread
            # tier: a plan-less config has one tier, and a 76-token prefill (420 ms) measured against
            # the 4-token decodes' best (24 ms) looked 17x slow; with it in the average, one thread
            # looked cheaper and the cap dropped on a quiet machine, halving 4-stream throughput.
            predicted = self._baseline.predicted_ms(pass_size(n_tokens), n_tokens, planned, used, elapsed_ms,
                                                     shallow=not is_deep(reads, n_tokens))
        predicted = self._depth.predicted_ms(predicted, reads, n_tokens, planned, used, elapsed_ms)
        decision = self._governor.record(planned, used, elapsed_ms, predicted)
        if decision.action in ("down", "up"):
            log.info("thread cap changed: passes ran far slower than planned (a busy CPU)" if decision.action == "down"
                     else "thread cap raised again: the CPU is quieter", cap=decision.cap, planned=planned,
                     pass_ms=round(elapsed_ms, 1), predicted_ms=round(predicted, 1))


