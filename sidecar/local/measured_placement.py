"""Loading as the daemon does and reading back where llama.cpp put each sub-layer: what the GPU
tests and the placement benchmark compare with the plan."""

from __future__ import annotations

import asyncio

from sidecar.budget import Budget
from sidecar.engine import Engine
from sidecar.local.executor import engine_config, load_plan_inputs
from sidecar.model_info.units import OUTPUT, sub_layers
from sidecar.service.budget_control import BudgetControl
from sidecar.service.state import DaemonState, StateHub
from sidecar.settings import Settings


def load_within(settings: Settings, budget: Budget) -> Engine:
    """Load as the daemon does: plan, load, and re-plan while the measured buffers exceed the grant."""
    inputs = load_plan_inputs(settings)
    engine = Engine(engine_config(settings, budget, inputs))
    control = BudgetControl(engine, budget, lambda b: engine_config(settings, b, inputs),
                            StateHub(DaemonState(phase="ready", budget=budget, reason="initial")), lambda: None)
    asyncio.run(control.fit_to_measured())
    return engine


def measured_placement(engine: Engine, model) -> dict[str, str]:
    """unit name -> "GPU0" when llama.cpp put all of its tensors on the device, else "CPU"."""
    report, device = engine.load_report, engine.config.device
    where = {}
    for unit in sub_layers(model):
        devices = {report.tensor_device(t, model.n_layer, output=unit.kind == OUTPUT) for t in unit.tensors}
        where[unit.name] = "GPU0" if devices == {device} else "CPU"
    return where
