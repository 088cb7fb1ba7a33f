"""A thread cap on an unchanged placement never costs a reload (issue 24).

On an AVX-512 machine a CPU-only SetBudget(max_cpu_threads=1) reloaded the model (1.8 s without
a token for every NPC): with one thread, its measured profile priced a smaller micro-batch
(n_ubatch) best, and a new n_ubatch means a new context. Now a re-plan that moves nothing but the
micro-batch keeps the one in force. The planner's own choice is real; what stands in here is its
pricing (which n_ubatch wins at which cap depends on a machine's measured kernels) and the
engine's reload, which records instead of loading.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from sidecar.budget import Budget
from sidecar.engine import EngineConfig
from sidecar.backend.load_report import LoadReport
from sidecar.backend.engine_config import same_placement
from sidecar.service.budget_control import BudgetControl
from sidecar.service.state import DaemonState, StateHub

GPU_LAYERS = 30


def planned(budget: Budget, micro_batch: int | None = None, *, gpu: bool = False) -> EngineConfig:
    """A plan as an AVX-512 profile priced it: at one thread n_ubatch 256 is a little faster than
    512. On a machine with a GPU (`gpu`) a VRAM budget puts layers on it; without one it is unused."""
    threads = budget.max_cpu_threads or 2
    n_ubatch = micro_batch or (256 if threads == 1 else 512)
    return EngineConfig(model_path=Path("m.gguf"), n_ubatch=n_ubatch, threads_decode=threads, threads_prefill=threads,
                        tier_threads=((1, threads), (512, threads)),
                        n_gpu_layers=GPU_LAYERS if gpu and budget.vram_bytes else 0,
                        schedule=SimpleNamespace(micro_batch=n_ubatch))


@dataclass
class EngineStandIn:
    """Switches the way Engine.reload does: nothing to rebuild when only threads differ."""

    config: EngineConfig
    reloads: list[EngineConfig] = field(default_factory=list)

    def snapshot(self):
        return SimpleNamespace(load_report=LoadReport())

    def reload(self, config: EngineConfig, force: bool = False) -> Future:
        done: Future = Future()
        rebuilt = force or not same_placement(self.config, config)
        if rebuilt:
            self.reloads.append(config)
        self.config = config
        done.set_result((rebuilt, 1800.0 if rebuilt else 0.0))
        return done


def control_for(engine: EngineStandIn, budget: Budget, gpu: bool = False) -> BudgetControl:
    plan = (lambda b, micro_batch=None: planned(b, micro_batch, gpu=True)) if gpu else planned
    return BudgetControl(engine, budget, plan, StateHub(DaemonState("ready", budget, "initial")), lambda: None)


def test_a_thread_cap_on_a_cpu_plan_keeps_the_micro_batch_and_never_reloads() -> None:
    engine = EngineStandIn(planned(Budget(0)))

    async def run():
        control = control_for(engine, Budget(0))
        return [await control.set(2 << 30, 1), await control.set(0, 0)]

    capped, uncapped = asyncio.run(run())
    assert not capped.reloaded and not uncapped.reloaded and engine.reloads == []
    assert engine.config.n_ubatch == 512
    # The cap itself is in force: every tier ran at one thread while it held.
    assert capped.budget.max_cpu_threads == 1


def test_the_cap_binds_every_tier_while_the_micro_batch_stays() -> None:
    engine = EngineStandIn(planned(Budget(0)))
    asyncio.run(control_for(engine, Budget(0)).set(0, 1))
    assert {t for _, t in engine.config.tier_threads} == {1} and engine.config.threads_decode == 1
    assert engine.config.n_ubatch == 512 and engine.reloads == []


def test_a_budget_that_moves_the_placement_takes_the_new_plan_whole() -> None:
    engine = EngineStandIn(planned(Budget(0)))
    change = asyncio.run(control_for(engine, Budget(0), gpu=True).set(4 << 30, 1))
    assert change.reloaded and engine.config.n_gpu_layers == GPU_LAYERS
    assert engine.config.n_ubatch == 256, "a reload happens anyway: the micro-batch that prices best comes with it"


def test_a_landed_profile_may_change_the_micro_batch() -> None:
    engine = EngineStandIn(planned(Budget(0, 1), micro_batch=512))

    async def run():
        control = control_for(engine, Budget(0, 1))
        return await control.replan("profile")

    assert asyncio.run(run()).reloaded and engine.config.n_ubatch == 256

