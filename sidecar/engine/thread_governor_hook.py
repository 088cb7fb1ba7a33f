"""The engine's side of the thread governor: which plan a pass is measured against, and a log line
when the thread cap moves. Engine thread only."""

from __future__ import annotations

import structlog

from sidecar.engine.config import EngineConfig
from sidecar.engine.thread_governor import PassBaseline, ThreadGovernor, plan_pass_times, predicted_pass_ms

log = structlog.get_logger("engine")


class GovernedThreads:
    """Threads per pass: the plan's tier threads under the governor's cap. A new configuration
    (SetBudget, reload) starts a new governor, at the new plan's threads."""

    def __init__(self) -> None:
        self._config: EngineConfig | None = None
        self._governor = ThreadGovernor(max_threads=1)
        self._plan_times: tuple[tuple[int, float], ...] = ()
        self._baseline = PassBaseline()

    def threads(self, config: EngineConfig, planned: int) -> int:
        """The threads for a pass the plan gives `planned`: capped while the CPU is busy, unless
        `config` pins them."""
        return self._governor.threads(planned) if config.adaptive_threads else planned

    def _follow(self, config: EngineConfig) -> None:
        self._config = config
        self._governor = ThreadGovernor(max_threads=max(t for _, t in config.tier_threads))
        self._plan_times = plan_pass_times(config.schedule)
        self._baseline = PassBaseline()

    def record(self, config: EngineConfig, n_tokens: int, planned: int, used: int, elapsed_ms: float) -> None:
        if config is not self._config:
            self._follow(config)
            return
        if self._plan_times:
            predicted = predicted_pass_ms(n_tokens, self._plan_times)
        else:
            tier = next((m for m, _ in config.tier_threads if n_tokens <= m), config.tier_threads[-1][0])
            predicted = self._baseline.predicted_ms(tier, planned, used, elapsed_ms)
        decision = self._governor.record(planned, used, elapsed_ms, predicted)
        if decision.action in ("down", "up"):
            log.info("thread cap changed: passes ran far slower than planned (a busy CPU)" if decision.action == "down"
                     else "thread cap raised again: the CPU is quieter", cap=decision.cap, planned=planned,
                     pass_ms=round(elapsed_ms, 1), predicted_ms=round(predicted, 1))


