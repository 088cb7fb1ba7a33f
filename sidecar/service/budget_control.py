"""Budget updates from the game: re-plan, then switch the engine to the new schedule.

The game grants VRAM and CPU threads and may take them back at any moment (a new scene, a higher
quality preset). Each update is planned (a pure function of the budget) and handed to the engine,
which switches at a step boundary: threads at once, placement by a reload that keeps every
conversation. The game's call returns once the new budget is in force, so when it shrinks the
budget it knows the memory is free by the time the call returns.

A RAM budget (SetBudget.ram_size) is sized by the launch rule (ram_budget.py) and needs no plan:
the engine takes the new ceiling of sequences and the caches' bounds between two passes. Its shares
then ride on every later plan, so a VRAM change does not bring back the launch's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from sidecar.budget import Budget, format_size
from sidecar.backend.contract import LocalModel
from sidecar.backend.engine_config import EngineConfig
from sidecar.backend.engine_config import same_placement
from sidecar.errors import FailedPrecondition, InvalidArgument, Unimplemented
from sidecar.service.ram_budget import MemoryShares, RamRule
from sidecar.service.state import StateHub

log = structlog.get_logger("budget")

# A budget for the planner -> what the engine should run with. The optional second argument pins
# the micro-batch (n_ubatch) the planner may choose; None lets it search.
PlanFn = Callable[..., EngineConfig]
# Free VRAM in bytes on the GPU we use, or None without a GPU (NVML absent, no device).
GpuFreeFn = Callable[[], int | None]

AUTO_POLL_S = 2.0
NO_GPU_FOR_AUTO = "automatic VRAM budget needs an NVIDIA GPU with NVML; this machine has none"
# Follow free VRAM only when it moved by more than this: NVML's figure jitters, and each change
# may cost a reload.
AUTO_HYSTERESIS_BYTES = 128 << 20
# After a load, llama.cpp's own buffers may exceed what the plan predicted (allocator padding,
# backend scratch the cost model does not know). The game's grant is a hard limit: on any
# overshoot the budget handed to the planner shrinks by it, plus this margin for what the next
# load pads again, and the engine reloads; after MAX_CORRECTIONS the CPU plan is the last resort.
# (A slack of 32 MiB here once let a 24 MiB grant end at 30 MiB on the device.)
MEASURED_MARGIN_BYTES = 1 << 20
MAX_CORRECTIONS = 3


def corrected_budget(granted: Budget, planned_for: Budget, measured_vram: int) -> Budget | None:
    """The budget to plan with next when the load measured more VRAM than `granted`, or None.

    `planned_for` is the budget the current placement was planned with (smaller than `granted`
    after an earlier correction): each correction takes the overshoot off it again."""
    overshoot = measured_vram - granted.vram_bytes
    if granted.vram_bytes == 0 or overshoot <= 0:
        return None
    margin = MEASURED_MARGIN_BYTES + granted.vram_bytes // 100
    return Budget(vram_bytes=max(planned_for.vram_bytes - overshoot - margin, 0),
                  max_cpu_threads=planned_for.max_cpu_threads)


@dataclass(frozen=True)
class BudgetChange:
    """What an update did: the budget in force, whether the model was reloaded, the pause."""

    budget: Budget
    reloaded: bool
    pause_ms: float


class BudgetControl:
    """Owns the budget in force. Used from the daemon's event loop only."""

    def __init__(self, engine: LocalModel, budget: Budget, plan: PlanFn, state: StateHub, gpu_free: GpuFreeFn,
                 *, ram_bytes: int = 0, ram_rule: RamRule | None = None,
                 on_ram_shares: Callable[[MemoryShares], None] = lambda shares: None) -> None:
        self.engine = engine
        self._on_ram_shares = on_ram_shares  # what else a RAM budget sizes (NPC memory's store)
        self.budget = budget
        # The RAM budget in force (0: none): --ram-budget until SetBudget.ram_size changes it.
        self.ram_bytes = ram_bytes
        self._ram_rule = ram_rule
        # None until a RAM budget is set at runtime: plans then carry the launch's shares as they are.
        self._shares: MemoryShares | None = None
        self._plan = plan
        self._state = state
        self._gpu_free = gpu_free
        self._lock = asyncio.Lock()  # one update at a time, in the order they came
        self._auto_task: asyncio.Task | None = None
        self._auto_reserve = 0

    @property
    def auto_reserve_bytes(self) -> int | None:
        """The reserve automatic mode keeps for the game; None while the VRAM budget is fixed."""
        return self._auto_reserve if self._auto_task is not None else None

    def check(self, *, ram_bytes: int | None, auto_vram: bool) -> None:
        """Raise what an update with these parts would be refused for, before any part is applied:
        SetBudget is all or nothing, so a RAM budget must not change when the VRAM part of the
        same call is then refused."""
        if ram_bytes is not None:
            if self._ram_rule is None:
                raise Unimplemented("this daemon was started without RAM budget control")
            self._ram_rule.shares(ram_bytes)  # InvalidArgument, saying what the model needs
        if auto_vram and self._gpu_free() is None:
            raise FailedPrecondition(NO_GPU_FOR_AUTO)

    async def set(self, vram_bytes: int, max_cpu_threads: int | None) -> BudgetChange:
        """Put a fixed budget in force (ends automatic mode). None keeps the thread cap."""
        self._stop_auto()
        return await self._apply(vram_bytes, max_cpu_threads, reason="budget")

    async def follow_free_vram(self, reserve_bytes: int, max_cpu_threads: int | None) -> BudgetChange:
        """Automatic mode: the budget follows the GPU's free memory minus `reserve_bytes`."""
        free = self._gpu_free()
        if free is None:
            raise FailedPrecondition(NO_GPU_FOR_AUTO)
        self._stop_auto()
        self._auto_reserve = reserve_bytes
        change = await self._apply(self._auto_target(free), max_cpu_threads, reason="auto")
        self._auto_task = asyncio.create_task(self._follow())
        return change

    async def replan(self, reason: str) -> BudgetChange:
        """Plan the budget in force again (the plan function's inputs changed: a measured machine
        profile landed) and switch as a budget change does; automatic mode carries on."""
        return await self._apply(self.budget.vram_bytes, None, reason=reason)

    async def set_ram(self, ram_bytes: int) -> BudgetChange:
        """Put a RAM budget in force (0 removes it): fewer or more sequences, smaller or larger
        caches. InvalidArgument, with what the model needs, changes nothing. Lowering it with
        conversations streaming cuts none: the sequences they are in go as their replies end."""
        if self._ram_rule is None:
            raise Unimplemented("this daemon was started without RAM budget control")
        shares = self._ram_rule.shares(ram_bytes)  # InvalidArgument before anything changes
        async with self._lock:
            started = time.perf_counter()
            config = shares.apply(self.engine.config)
            reloaded, pause_ms = await asyncio.wrap_future(self.engine.reload(config))
            self._shares, self.ram_bytes = shares, ram_bytes
            self._on_ram_shares(shares)
            log.info(
                "ram budget in force",
                ram_budget=format_size(ram_bytes) if ram_bytes else "none",
                sequences_max=config.n_seq,
                prefix_cache=format_size(config.prefix_cache_bytes),
                saved_sessions=format_size(config.saved_sessions_bytes) if ram_bytes else "no cap",
                pause_ms=round(pause_ms, 1),
                took_ms=round((time.perf_counter() - started) * 1000, 1),
            )
            self._state.publish(budget=self.budget, reason="ram budget")
            return BudgetChange(self.budget, reloaded, pause_ms)

    def close(self) -> None:
        self._stop_auto()

    def _auto_target(self, free: int) -> int:
        # What we hold ourselves counts as available to us: free memory excludes it.
        ours = self.engine.snapshot().load_report.vram_bytes()
        return max(free + ours - self._auto_reserve, 0)

    async def _follow(self) -> None:
        while True:
            await asyncio.sleep(AUTO_POLL_S)
            free = self._gpu_free()
            if free is None:
                continue
            target = self._auto_target(free)
            if abs(target - self.budget.vram_bytes) > AUTO_HYSTERESIS_BYTES:
                await self._apply(target, None, reason="auto")

    async def fit_to_measured(self) -> bool:
        """At start-up, after the first load: re-plan if llama.cpp took more VRAM than granted."""
        async with self._lock:
            reloaded, _ = await self._fit_to_measured(self.budget)
            return reloaded

    async def _fit_to_measured(self, granted: Budget) -> tuple[bool, float]:
        """Load in stages: the plan fits, the engine allocates, and only a placement whose measured
        buffers fit the grant is committed; otherwise plan again with the overshoot taken off."""
        planned_for, reloaded, pause_ms = granted, False, 0.0
        for attempt in range(MAX_CORRECTIONS + 1):
            measured = self.engine.snapshot().load_report.vram_bytes()
            smaller = corrected_budget(granted, planned_for, measured)
            if smaller is None:
                break
            if attempt == MAX_CORRECTIONS or smaller.vram_bytes == planned_for.vram_bytes:
                smaller = Budget(0, planned_for.max_cpu_threads)  # nothing smaller fits: the CPU plan
            log.warning("llama.cpp took more VRAM than planned; planning again with less",
                        granted=granted.vram_bytes, measured=measured, planned=self.engine.config.planned_vram_bytes,
                        next_budget=smaller.vram_bytes)
            config = self._with_ram(await asyncio.to_thread(self._plan, smaller))
            done, ms = await asyncio.wrap_future(self.engine.reload(config))
            planned_for, reloaded, pause_ms = smaller, reloaded or done, pause_ms + ms
        return reloaded, pause_ms

    async def _config_for(self, budget: Budget, *, keep_micro_batch: bool) -> EngineConfig:
        """The plan for `budget`. When it moves nothing but the micro-batch, the micro-batch in
        force is kept: a thread cap changes which n_ubatch prices best (one thread favours a
        smaller one), and a new n_ubatch alone means a new context, so a reload that pauses every
        stream for a second or two to win a few percent of prefill. A measured profile landing
        ("profile") is new knowledge of the machine and may change it."""
        # Planning searches every tier's placements: off the event loop, or every stream stalls.
        config = self._with_ram(await asyncio.to_thread(self._plan, budget))
        current = self.engine.config
        in_force = getattr(current.schedule, "micro_batch", None)
        if not keep_micro_batch or in_force is None or same_placement(current, config, memory=False):
            return config
        kept = self._with_ram(await asyncio.to_thread(self._plan, budget, in_force))
        return kept if same_placement(current, kept, memory=False) else config

    def _with_ram(self, config: EngineConfig) -> EngineConfig:
        # The plan knows the launch's RAM budget only: a runtime one replaces its shares.
        return config if self._shares is None else self._shares.apply(config)

    def _stop_auto(self) -> None:
        if self._auto_task is not None:
            self._auto_task.cancel()
            self._auto_task = None

    async def _apply(self, vram_bytes: int, max_cpu_threads: int | None, *, reason: str) -> BudgetChange:
        async with self._lock:
            threads = self.budget.max_cpu_threads if max_cpu_threads is None else max_cpu_threads
            budget = Budget(vram_bytes=vram_bytes, max_cpu_threads=threads)
            started = time.perf_counter()
            config = await self._config_for(budget, keep_micro_batch=reason != "profile")
            reloaded, pause_ms = await asyncio.wrap_future(self.engine.reload(config))
            if reloaded:
                _, extra_ms = await self._fit_to_measured(budget)
                pause_ms += extra_ms
            self.budget = budget
            log.info(
                "budget in force",
                budget=budget.describe(),
                reloaded=reloaded,
                pause_ms=round(pause_ms, 1),
                took_ms=round((time.perf_counter() - started) * 1000, 1),
            )
            self._state.publish(budget=budget, reason=reason)
            return BudgetChange(budget, reloaded, pause_ms)


def check_thread_cap(value: int) -> int:
    if not 0 <= value <= 4096:
        raise InvalidArgument("max_cpu_threads must be between 0 (no cap) and 4096")
    return value
