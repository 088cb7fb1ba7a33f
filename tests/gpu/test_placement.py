"""Every sub-layer lands where the plan says, on a GPU-type device, within the budget.

Real llama.cpp loads onto RPC0 (see conftest): where each tensor went is read from llama.cpp's
own load report (layer assignments, overrides, per-buffer sizes), never from the plan itself.
The reply computed on that placement must be what the model says: greedy tokens within rounding
of a plain CPU llama.cpp's choice at every position (greedy_agreement.py). Not the CPU run's exact
tokens: RPC0 computes with the server's plain kernels, while CPU-resident weights may use repacked
SIMD kernels that round otherwise (on AVX-512 the two runs part at token 19).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.budget import Budget
from sidecar.local.executor import load_plan_inputs
from sidecar.settings import Settings

from support.device_helpers import DEVICE_HARDWARE, MIB, greedy_reply, load_within, measured_placement
from support.greedy_agreement import CpuReference, assert_greedy_agrees
from support.no_early_stop import engine_eog_ids

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
def cpu_reference(model_path: Path) -> Iterator[CpuReference]:
    with CpuReference(model_path) as reference:
        yield reference


@pytest.mark.slow
@pytest.mark.parametrize("budget", BUDGETS, ids=lambda b: f"{b // MIB}MiB")
def test_every_sub_layer_sits_where_the_plan_says(model_path: Path, budget: int, rpc_device: str,
                                                  cpu_reference: CpuReference) -> None:
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
        # The cache llama.cpp allocated is of the plan's type (a plan's Q8_0 once went unapplied).
        assert (report.kv_k_type, report.kv_v_type) == (schedule.kv_type, schedule.kv_type)

        # The end-of-generation tokens banned (and in the reference): 32 tokens to compare, surely.
        eog = engine_eog_ids(engine)
        prompt, reply = greedy_reply(engine, QUESTION, banned=eog)
        agreement = assert_greedy_agrees(cpu_reference, prompt, reply, f"the reply at {budget // MIB} MiB", banned=eog)
        print(f"{model_path.name} at {budget // MIB} MiB: {agreement.describe()}")
    finally:
        engine.close()


def _buffer_name(report, device: str) -> str:
    from sidecar.backend.load_report import buffer_device

    return next((b for b in report.kv_bytes if buffer_device(b) == device), "")


def _ffn_down_swapped(source: Path, out: Path, layers: tuple[int, int]) -> Path:
    """A copy of `source` with two layers' ffn_down swapped: a real model's weights, two in the
    wrong place, as a placement or loading bug would leave them."""
    import shutil

    import numpy as np
    from gguf import GGUFReader

    shutil.copyfile(source, out)
    tensors = {t.name: t for t in GGUFReader(source).tensors}
    a, b = (tensors[f"blk.{i}.ffn_down.weight"] for i in layers)
    assert (a.tensor_type, a.n_bytes) == (b.tensor_type, b.n_bytes), "the two must be alike to swap"
    data = np.memmap(out, mode="r+")
    first = data[a.data_offset:a.data_offset + a.n_bytes].copy()
    data[a.data_offset:a.data_offset + a.n_bytes] = data[b.data_offset:b.data_offset + b.n_bytes]
    data[b.data_offset:b.data_offset + b.n_bytes] = first
    data.flush()
    return out


SWAPPED_LAYERS = (4, 20)


@pytest.mark.slow
def test_the_agreement_check_catches_wrong_weights_on_the_device(smollm2_path: Path, rpc_device: str,
                                                                 tmp_path: Path) -> None:
    """The mutation the check above must catch: every tensor sits where the plan says, but the
    device's weights are wrong. Against the true model's CPU reference the reply fails; against
    the wrong file's own reference it holds, so it is the weights that are caught, not the device."""
    wrong = _ffn_down_swapped(smollm2_path, tmp_path / "swapped.gguf", SWAPPED_LAYERS)
    engine = load_within(settings_for(wrong), Budget(4096 * MIB))
    try:
        assert engine.load_report.device_bytes(rpc_device) > 90 * MIB
        eog = engine_eog_ids(engine)  # banned (and in both references): a whole reply to score
        prompt, reply = greedy_reply(engine, QUESTION, banned=eog)
    finally:
        engine.close()
    with CpuReference(smollm2_path) as true_model:
        caught = true_model.score(prompt, reply, eog)
    with CpuReference(wrong) as same_weights:
        honest = same_weights.score(prompt, reply, eog)
    print(f"wrong weights against the true model: {caught.describe()}; against their own file: {honest.describe()}")
    assert not caught.holds(), f"wrong weights passed the agreement check: {caught.describe()}"
    assert honest.holds(), f"the check failed a faithful run of the same weights: {honest.describe()}"
