"""The roofline cost model and the hardware model it reads: interpolation over measured kernels,
roofline fallbacks, streaming, and building a HardwareModel from a spec (from a real profile:
profiler/test_profile_to_hardware.py, where the profile has the machine to itself)."""

from __future__ import annotations

import math

import pytest

from sidecar.model_info import MOE_EXPERTS, model_from_hf_config, sub_layers
from sidecar.planner.cost_model import (
    DOUBLE_BUFFERED,
    ON_CPU,
    ON_GPU,
    OP_OFFLOAD,
    FiguresMemo,
    STREAMED,
    PassShape,
    compute_seconds,
    copy_seconds,
    pass_cost,
    pass_figures,
)
from sidecar.planner.hardware_model import (
    KernelPoint,
    clean_series,
    cpu_only_box,
    desktop_16gb_pcie5x16,
    hardware_from_spec,
    laptop_4gb_pcie4x8,
    parse_pcie,
)
from sidecar.planner.measured import series_seconds

LLAMA_8B = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
            "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 128256}
QWEN3_30B_A3B = {"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
                 "moe_intermediate_size": 768, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
                 "num_hidden_layers": 48, "num_experts": 128, "num_experts_per_tok": 8, "vocab_size": 151936}


def point(batch: int, seconds: float, weight_bytes: float = 1e6, flops_per_token: float = 2e6) -> KernelPoint:
    return KernelPoint("ffn", "cpu", "small", "Q4_0", batch, 1, False, seconds, weight_bytes, flops_per_token * batch)


SERIES = tuple(point(b, s) for b, s in [(1, 1e-3), (4, 2e-3), (16, 4e-3), (64, 16e-3)])


@pytest.mark.parametrize(
    "batch, unit_bytes, unit_flops, expected",
    [
        (1, 1e6, 2e6, 1e-3),  # the probe itself, at a measured batch
        (16, 1e6, 32e6, 4e-3),
        (2, 1e6, 4e6, math.sqrt(1e-3 * 2e-3)),  # log-log halfway between 1 and 4
        (128, 1e6, 256e6, 32e-3),  # past the largest batch: linear in tokens
        (1, 2e6, 2e6, 2e-3),  # twice the bytes at a bandwidth-bound batch
        (1, 0.5e6, 8e6, 4e-3),  # four times the FLOPs: the FLOPs ratio wins
    ],
)
def test_series_seconds(batch, unit_bytes, unit_flops, expected):
    assert series_seconds(SERIES, batch, unit_bytes, unit_flops) == pytest.approx(expected)


@pytest.mark.parametrize(
    "seconds, expected",
    [
        ([1.0, 2.0, 4.0], [1.0, 2.0, 4.0]),  # already possible
        ([1.0, 0.5, 4.0], [1.0, 1.0, 4.0]),  # a bigger batch cannot be faster
        ([1.0, 9.0, 4.0], [1.0, 4.0, 4.0]),  # nor dearer per token than the smaller batch
    ],
)
def test_clean_series(seconds, expected):
    cleaned, changed = clean_series([point(b, s) for b, s in zip((1, 4, 16), seconds)])
    assert [p.seconds for p in cleaned] == pytest.approx(expected)
    assert changed == sum(a != b for a, b in zip(seconds, expected))


@pytest.fixture(scope="module")
def llama8():
    return model_from_hf_config(LLAMA_8B, "Q4_0")


@pytest.fixture(scope="module")
def qwen():
    return model_from_hf_config(QWEN3_30B_A3B, "Q4_K_M")


def test_decode_on_a_cpu_is_bandwidth_bound(llama8):
    hw = cpu_only_box()
    units = sub_layers(llama8)
    where = tuple(ON_CPU for _ in units)
    cost = pass_cost(hw, llama8, units, where, frozenset(), PassShape.decode(1, 0), threads=8)
    weights = sum(u.bytes_read(1) for u in units)
    assert cost.seconds == pytest.approx(weights / (hw.cpu.dram_gbps * 1e9), rel=0.1)
    assert cost.copy_bytes == 0 and cost.gpu_seconds == 0


def test_prefill_on_a_cpu_is_compute_bound_and_scales_with_threads(llama8):
    hw = cpu_only_box()
    units = sub_layers(llama8)
    where = tuple(ON_CPU for _ in units)
    one = pass_cost(hw, llama8, units, where, frozenset(), PassShape.prefill(512), threads=1)
    eight = pass_cost(hw, llama8, units, where, frozenset(), PassShape.prefill(512), threads=8)
    assert 6 < one.seconds / eight.seconds <= 8.5


@pytest.mark.parametrize("tokens", [1, 64, 512])
def test_streaming_costs_the_copy_and_double_buffering_hides_it(llama8, tokens):
    hw = laptop_4gb_pcie4x8()
    units = sub_layers(llama8)
    where = tuple(ON_CPU if u.kind == "embedding" else STREAMED for u in units)
    shape = PassShape.prefill(tokens)
    serial = pass_cost(hw, llama8, units, where, frozenset(range(32)), shape, 8, executor=OP_OFFLOAD)
    hidden = pass_cost(hw, llama8, units, where, frozenset(range(32)), shape, 8, executor=DOUBLE_BUFFERED)
    streamed = sum(u.bytes_read(1 if u.kind == "output" else tokens) for u in units if u.kind != "embedding")
    assert serial.copy_bytes == pytest.approx(streamed)
    assert serial.copy_seconds == pytest.approx(streamed / (hw.gpu.pcie_gbps * 1e9), rel=0.05)
    assert serial.exposed_copy_seconds == pytest.approx(serial.copy_seconds)
    assert hidden.seconds < serial.seconds
    assert hidden.exposed_copy_seconds >= max(0.0, serial.copy_seconds - serial.gpu_seconds) * 0.99
    assert serial.cpu_busy_seconds == pytest.approx(serial.copy_seconds)


def test_resident_beats_streamed_beats_nothing_for_decode(llama8):
    hw = desktop_16gb_pcie5x16()
    units = sub_layers(llama8)
    shape = PassShape.decode(1, 512)
    gpu = tuple(ON_CPU if u.kind == "embedding" else ON_GPU for u in units)
    streamed = tuple(ON_CPU if u.kind == "embedding" else STREAMED for u in units)
    resident = pass_cost(hw, llama8, units, gpu, frozenset(range(32)), shape, 16)
    copied = pass_cost(hw, llama8, units, streamed, frozenset(range(32)), shape, 16)
    assert resident.seconds < copied.seconds
    # A 1-token decode over PCIe is slower than the CPU reading its own RAM: why STATIC exists.
    cpu = pass_cost(hw, llama8, units, tuple(ON_CPU for _ in units), frozenset(), shape, 16)
    assert cpu.seconds < copied.seconds


@pytest.mark.parametrize("tokens, experts", [(1, 8), (4, 128 * (1 - (120 / 128) ** 4)), (512, 128)])
def test_only_touched_experts_are_copied(qwen, tokens, experts):
    hw = laptop_4gb_pcie4x8()
    unit = next(u for u in sub_layers(qwen) if u.kind == MOE_EXPERTS)
    per_expert = unit.weight_bytes / 128
    expected = experts * per_expert / (hw.gpu.pcie_gbps * 1e9)
    assert copy_seconds(hw, unit, PassShape.prefill(tokens)) == pytest.approx(expected, rel=0.01, abs=2e-5)


def test_busy_cpu_is_slower(qwen):
    hw = laptop_4gb_pcie4x8()
    unit = next(u for u in sub_layers(qwen) if u.kind == MOE_EXPERTS)
    idle = compute_seconds(hw, unit, ON_CPU, PassShape.decode(1, 0), 8)
    busy = compute_seconds(hw, unit, ON_CPU, PassShape.decode(1, 0), 8, busy=True)
    assert busy == pytest.approx(idle * hw.cpu.busy_slowdown)
    assert copy_seconds(hw, unit, PassShape.decode(1, 0), busy=True) > copy_seconds(hw, unit, PassShape.decode(1, 0))


def test_longer_context_costs_more(llama8):
    hw = cpu_only_box()
    units = sub_layers(llama8)
    where = tuple(ON_CPU for _ in units)
    short = pass_cost(hw, llama8, units, where, frozenset(), PassShape.decode(16, 128), 8)
    long = pass_cost(hw, llama8, units, where, frozenset(), PassShape.decode(16, 8192), 8)
    kv = 16 * 8192 * 32 * 8 * 128 * 2 * 2  # sequences x tokens x layers x kv heads x dim x (K, V) x F16
    assert long.seconds - short.seconds == pytest.approx(kv / 40e9, rel=0.3)



def test_a_pass_figures_memo_prices_every_placement_as_a_fresh_pass(llama8):
    # The search keeps each pass's placement-independent figures and re-sums them per placement;
    # what it predicts must not depend on what was priced before.
    hw = laptop_4gb_pcie4x8()
    units = sub_layers(llama8)
    memo = FiguresMemo()
    placements = [tuple(ON_CPU for _ in units), tuple(ON_CPU if u.kind == "embedding" else ON_GPU for u in units),
                  tuple(ON_CPU if u.kind == "embedding" else (STREAMED, ON_GPU, ON_CPU)[i % 3]
                        for i, u in enumerate(units))]
    for shape in (PassShape.decode(4, 512), PassShape.prefill(256, 1024, last=False)):
        for where in placements:
            for executor in (OP_OFFLOAD, DOUBLE_BUFFERED):
                for kv in (frozenset(), frozenset(range(0, 32, 2))):
                    fresh = pass_cost(hw, llama8, units, where, kv, shape, 8, "F16", executor)
                    assert pass_cost(hw, llama8, units, where, kv, shape, 8, "F16", executor, memo) == fresh
    # One entry per (shape, threads, KV type, contention), not per placement.
    assert len(memo.figures) == 2 * 2


def test_unit_costs_are_the_per_device_formulas(qwen):
    hw = laptop_4gb_pcie4x8()
    units = sub_layers(qwen)
    shape = PassShape.decode(4, 0)
    figures = pass_figures(hw, qwen, units, shape, 8, contention=True)
    assert len(figures.units) == len(units)
    experts = next(i for i, u in enumerate(units) if u.kind == MOE_EXPERTS)
    cost, unit = figures.units[experts], units[experts]
    assert cost.cpu_seconds == compute_seconds(hw, unit, ON_CPU, shape, 8)
    assert cost.cpu_contended_seconds == compute_seconds(hw, unit, ON_CPU, shape, 8, busy=True)
    assert cost.gpu_seconds == compute_seconds(hw, unit, ON_GPU, shape, 8)
    assert cost.copy_seconds == copy_seconds(hw, unit, shape)
    assert cost.copy_contended_seconds == copy_seconds(hw, unit, shape, busy=True)
    assert cost.copy_bytes == unit.bytes_read(4) and cost.has_rows
    # Without contention the busy figures are never read: they repeat the idle ones.
    calm = pass_figures(hw, qwen, units, shape, 8).units[experts]
    assert calm.cpu_contended_seconds == calm.cpu_seconds and calm.copy_contended_seconds == calm.copy_seconds
    # No GPU: nothing can run or be copied there.
    alone = pass_figures(cpu_only_box(), qwen, units, shape, 8).units[experts]
    assert math.isinf(alone.gpu_seconds) and math.isinf(alone.copy_seconds)

@pytest.mark.parametrize(
    "spec, error",
    [({"gpu": {"vram": "8G"}}, "mem_gbps"), ({"cpu": {"cores": "many"}}, None),
     ({"gpu": {"vram": "8G", "mem_gbps": 1, "tflops": 1, "pcie": "fast"}}, "PCIe")],
)
def test_bad_specs(spec, error):
    with pytest.raises(ValueError, match=error):
        hardware_from_spec(spec)


@pytest.mark.parametrize("text, expected", [("4.0x8", (4, 8)), ("gen5 x16", (5, 16)), ("3x4", (3, 4))])
def test_parse_pcie(text, expected):
    assert parse_pcie(text) == expected


def test_spec_pcie_and_defaults():
    hw = hardware_from_spec({"cpu": {"cores": 4}, "gpu": {"vram": "6G", "mem_gbps": 300, "tflops": 10,
                                                           "pcie": "4.0x16"}})
    assert hw.cpu.logical_cores == 4 and hw.gpu.vram_bytes == 6 << 30
    assert hw.gpu.pcie_gbps == pytest.approx(1.969 * 16 * 0.6)
    assert hw.gpu.pcie_busy_gbps < hw.gpu.pcie_gbps
