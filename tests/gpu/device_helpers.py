"""The GPU-device test set: llama.cpp's real placement onto a GPU-type ggml device.

The device is ggml's RPC backend serving this machine's CPU from a second process on loopback
(sidecar.ggml_rpc): llama.cpp lists it as RPC0, type GPU, and weights, KV cache and compute
buffers placed there really live in the server's memory. What it cannot give is a GPU's speed, so
the planner is handed a described GPU (DEVICE_HARDWARE) in place of a measured profile: the
speeds are the stand-in, the placement and the buffers are real.

Without an RPC build of llama-cpp-python these tests skip, and say so; with
XLM_REQUIRE_GPU_DEVICE=1 (CI) they fail instead. The fixtures (rpc_device, smollm2_moe_path) are
in tests/conftest.py: one RPC server for the whole test process, which registers it once (a
conftest.py in this folder would shadow tests/conftest.py, which daemon tests import by name).
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from conftest import require_rpc  # noqa: F401 (re-exported for the device tests)

from sidecar.budget import Budget
from sidecar.engine import Engine, Finished, GenerationSpec, Prompt, SamplingConfig, TextDelta
from sidecar.executor import engine_config, load_plan_inputs
from sidecar.model_info.units import OUTPUT, sub_layers
from sidecar.service.budget_control import BudgetControl
from sidecar.service.state import DaemonState, StateHub
from sidecar.settings import Settings
from sidecar.errors import SidecarError

from sidecar.ggml_rpc import STAND_IN_GPU_HARDWARE

# A desktop-class GPU as the planner should see RPC0 (a stand-in for speed only). 8 GiB, far
# above every budget the tests grant, so the budget is what binds.
DEVICE_HARDWARE = STAND_IN_GPU_HARDWARE
GREEDY = SamplingConfig(temperature=0.0, repeat_penalty=1.0)
MIB = 1 << 20


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


def greedy_reply(engine: Engine, text: str, max_tokens: int = 32) -> tuple[list[int], list[int]]:
    """One greedy reply: the prompt's token ids as the engine built them, and the reply's."""
    from greedy_agreement import engine_prompt_tokens

    tokens: list[int] = []
    done = threading.Event()
    result: list[object] = []

    def sink(event: object) -> None:
        if isinstance(event, TextDelta):
            tokens.extend(event.token_ids)
        else:
            result.append(event)
            done.set()

    spec = GenerationSpec(prompt=Prompt(messages=(("user", text),)), sampling=GREEDY, max_tokens=max_tokens)
    prompt = engine_prompt_tokens(engine, spec)
    engine.submit(spec, sink)
    assert done.wait(300), "the engine never finished"
    if isinstance(result[0], SidecarError):
        raise result[0]
    assert isinstance(result[0], Finished)
    return prompt, tokens
