"""Load in stages: a placement whose measured VRAM exceeds the grant is planned again.

There is no GPU on these machines, so llama.cpp never reports VRAM here: the engine below is a
stand-in that reports CUDA buffers the way llama.cpp's load log does (a fake for the GPU only)."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path

from sidecar.budget import Budget
from sidecar.engine import EngineConfig
from sidecar.backend.load_report import LoadReport
from sidecar.service.budget_control import MAX_CORRECTIONS, MEASURED_MARGIN_BYTES, BudgetControl, corrected_budget
from sidecar.service.state import DaemonState, StateHub

MIB = 1 << 20


def test_corrected_budget_takes_the_overshoot_off() -> None:
    grant = Budget(vram_bytes=2048 * MIB, max_cpu_threads=4)
    assert corrected_budget(grant, grant, 2000 * MIB) is None  # fits
    assert corrected_budget(grant, grant, 2048 * MIB) is None  # exactly the grant
    # The grant is a hard limit: even one byte over is planned again.
    assert corrected_budget(grant, grant, 2048 * MIB + 1) is not None
    smaller = corrected_budget(grant, grant, 2400 * MIB)
    margin = MEASURED_MARGIN_BYTES + 2048 * MIB // 100
    assert smaller.vram_bytes == 2048 * MIB - 352 * MIB - margin and smaller.max_cpu_threads == 4
    assert corrected_budget(Budget(0), Budget(0), 10 * MIB) is None  # CPU only: nothing to fit


@dataclass
class GpuStandIn:
    """Reports llama.cpp-style CUDA buffers of `overshoot` times what the plan asked for."""

    overshoot: float
    config: EngineConfig = field(default_factory=lambda: EngineConfig(model_path=Path("m.gguf")))
    reloads: list[int] = field(default_factory=list)

    def snapshot(self):
        measured = int(self.config.planned_vram_bytes * self.overshoot)
        return type("Snap", (), {"load_report": LoadReport(model_bytes={"CUDA0": measured})})()

    def reload(self, config: EngineConfig, force: bool = False) -> Future:
        self.config = config
        self.reloads.append(config.planned_vram_bytes)
        done: Future = Future()
        done.set_result((True, 5.0))
        return done


def test_a_load_that_overshoots_is_planned_again_within_the_grant() -> None:
    engine = GpuStandIn(overshoot=1.25)
    plan = lambda b: replace(engine.config, planned_vram_bytes=b.vram_bytes)  # the plan fills its budget
    grant = Budget(vram_bytes=4096 * MIB)
    engine.config = plan(grant)

    async def run():
        control = BudgetControl(engine, grant, plan, StateHub(DaemonState("ready", grant, "initial")), lambda: None)
        return await control.fit_to_measured()

    assert asyncio.run(run())
    measured = engine.snapshot().load_report.vram_bytes()
    assert engine.reloads and measured <= grant.vram_bytes
    assert len(engine.reloads) <= MAX_CORRECTIONS + 1  # bounded, the CPU plan being the last resort


def test_a_placement_that_never_fits_ends_on_the_cpu_plan() -> None:
    engine = GpuStandIn(overshoot=3.0)  # every plan's buffers come out three times as large
    plan = lambda b: replace(engine.config, planned_vram_bytes=b.vram_bytes)
    grant = Budget(vram_bytes=64 * MIB)
    engine.config = plan(grant)

    async def run():
        control = BudgetControl(engine, grant, plan, StateHub(DaemonState("ready", grant, "initial")), lambda: None)
        return await control.fit_to_measured()

    assert asyncio.run(run())
    assert engine.reloads[-1] == 0 and engine.snapshot().load_report.vram_bytes() == 0
    assert len(engine.reloads) <= MAX_CORRECTIONS + 1


def test_a_load_that_fits_is_committed_as_is() -> None:
    engine = GpuStandIn(overshoot=1.0)
    grant = Budget(vram_bytes=4096 * MIB)
    engine.config = replace(engine.config, planned_vram_bytes=grant.vram_bytes)

    async def run():
        control = BudgetControl(engine, grant, lambda b: engine.config, StateHub(DaemonState("ready", grant, "initial")),
                                lambda: None)
        return await control.fit_to_measured()

    assert not asyncio.run(run()) and engine.reloads == []
