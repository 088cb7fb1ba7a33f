"""SetBudget in remote mode: accepted, and nothing to do.

A daemon that forwards generation holds no model, no KV cache and no VRAM, and spends next to no
CPU, so every budget the game grants is already kept: the call records it (status and WatchState
show it) and returns at once, reloaded = false. The game's code stays the same in both modes.
The server's own memory is its operator's to size (vLLM's --gpu-memory-utilization, llama.cpp's
-ngl / --fit), not the game's. A RAM budget (ram_size) is refused instead of recorded: it would
say the daemon keeps the conversations within it, and they live on the server.
"""

from __future__ import annotations

import structlog

from sidecar.budget import Budget
from sidecar.errors import Unimplemented
from sidecar.service.budget_control import BudgetChange
from sidecar.service.state import StateHub

log = structlog.get_logger("budget")


class RemoteBudget:
    """Stands where BudgetControl stands in local mode (`service.budget_control`)."""

    def __init__(self, budget: Budget, state: StateHub) -> None:
        self.budget = budget
        self._state = state

    async def set(self, vram_bytes: int, max_cpu_threads: int | None) -> BudgetChange:
        """Record the budget; None keeps the thread cap."""
        threads = self.budget.max_cpu_threads if max_cpu_threads is None else max_cpu_threads
        return self._record(Budget(vram_bytes=vram_bytes, max_cpu_threads=threads), "budget")

    async def follow_free_vram(self, reserve_bytes: int, max_cpu_threads: int | None) -> BudgetChange:
        """Automatic mode asks to use free VRAM minus a reserve; using none keeps any reserve, so
        the VRAM budget in force stays as it was."""
        threads = self.budget.max_cpu_threads if max_cpu_threads is None else max_cpu_threads
        return self._record(Budget(vram_bytes=self.budget.vram_bytes, max_cpu_threads=threads), "auto")

    def check(self, *, ram_bytes: int | None, auto_vram: bool) -> None:
        """What SetBudget checks before it applies any part (BudgetControl.check)."""
        if ram_bytes is not None:
            self._refuse_ram()

    async def set_ram(self, ram_bytes: int) -> BudgetChange:
        self._refuse_ram()

    def _refuse_ram(self) -> None:
        raise Unimplemented("a RAM budget applies to a model served here; in remote mode the conversations' memory "
                            "is the remote server's (size it there)")

    def close(self) -> None:
        pass

    def _record(self, budget: Budget, reason: str) -> BudgetChange:
        self.budget = budget
        log.info("budget recorded; generation runs on the remote server", budget=budget.describe())
        self._state.publish(budget=budget, reason=reason)
        return BudgetChange(budget, reloaded=False, pause_ms=0.0)
