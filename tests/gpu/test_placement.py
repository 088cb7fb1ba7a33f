"""Every sub-layer lands where the plan says, on a GPU-type device, within the budget.

Real llama.cpp loads onto RPC0 (see conftest): where each tensor went is read from llama.cpp's
own load report (layer assignments, overrides, per-buffer sizes), never from the plan itself.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.budget import Budget
from sidecar.executor import load_plan_inputs
from sidecar.settings import Settings

from device_helpers import DEVICE_HARDWARE, MIB, greedy_tokens, load_within, measured_placement

# From nothing on the device to everything on it; SmolLM2 is 98 MB of weights.
BUDGETS = (0, 24 * MIB, 48 * MIB, 96 * MIB, 4096 * MIB)
QUESTION = "Name the three primary colours."


def settings_for(model: Path) -> Settings:
    # One thread: the RPC server computes on the same two cores.
    return Settings(model=model, ctx=512, parallel=2, threads=1, hardware=DEVICE_HARDWARE)


@pytest.fixture(scope="module", params=["smollm2", "smollm2_moe"])
def model_path(request: pytest.FixtureRequest, smollm2_path: Path) -> Path:
    return smollm2_path if request.param == "smollm2" else request.getfixturevalue("smollm2_moe_path")


@pytest.fixture(scope="module")
def cpu_reference(model_path: Path, rpc_device: str) -> list[int]:
    engine = load_within(settings_for(model_path), Budget(0))
    try:
        assert engine.config.device == rpc_device and engine.load_report.vram_bytes() == 0
        return greedy_tokens(engine, QUESTION)
    finally:
        engine.close()


@pytest.mark.slow
@pytest.mark.parametrize("budget", BUDGETS, ids=lambda b: f"{b // MIB}MiB")
def test_every_sub_layer_sits_where_the_plan_says(model_path: Path, budget: int, rpc_device: str,
                                                  cpu_reference: list[int]) -> None:
    settings = settings_for(model_path)
    engine = load_within(settings, Budget(budget))
    try:
        schedule, report = engine.config.schedule, engine.load_report
        model = load_plan_inputs(settings).model
        planned = {u.unit: u.resident_on for u in schedule.units}
        measured = measured_placement(engine, model)
        wrong = {name: (planned[name], measured[name]) for name in planned if planned[name] != measured[name]}
        assert not wrong, f"placed against the plan (planned, measured): {wrong}"

        on_device = report.device_bytes(rpc_device)
        assert on_device <= budget, f"{on_device / MIB:.1f} MiB on {rpc_device} against a {budget / MIB:.0f} MiB budget"
        if budget:
            assert report.model_bytes, "llama.cpp reported no buffers"

        attention_on_device = {u.layer for u in schedule.units if u.kind == "attention" and u.resident_on == "GPU0"}
        kv_on_device = {layer for layer, dev in report.kv_layer_devices.items() if dev == rpc_device}
        assert kv_on_device == (attention_on_device if schedule.kv_on_gpu else set())
        assert bool(report.kv_bytes.get(_buffer_name(report, rpc_device))) == bool(kv_on_device)

        assert greedy_tokens(engine, QUESTION) == cpu_reference, "greedy tokens differ from the CPU-only run"
    finally:
        engine.close()


def _buffer_name(report, device: str) -> str:
    from sidecar.engine.load_report import buffer_device

    return next((b for b in report.kv_bytes if buffer_device(b) == device), "")
