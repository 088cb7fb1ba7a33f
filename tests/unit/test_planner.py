"""Plan search on synthetic hardware (a 4 GB PCIe 4.0 x8 laptop, a 16 GB PCIe 5.0 x16 desktop, a
CPU-only box): the schedules the method promises, within budget and thread cap."""

from __future__ import annotations

import pytest

from sidecar.budget import Budget
from sidecar.model_info import ATTENTION, MOE_EXPERTS, MOE_ROUTER, inspect_gguf, sub_layers
from sidecar.planner import (
    CPU_ONLY,
    DYNAMIC,
    FULL_GPU,
    GPU_STREAMING,
    STATIC,
    PlanError,
    PlanOptions,
    cpu_only_box,
    desktop_16gb_pcie5x16,
    laptop_4gb_pcie4x8,
)
from sidecar.planner import plan as fresh_plan
from sidecar.planner.overrides import resolve
from sidecar.planner.schedule import DECODE, GPU0, PREFILL
from sidecar.planner.search import PlanMemo, thread_options
from sidecar.testmodels import ensure_test_models
from support.hf_models import HARDWARE, model

GIB = 1 << 30
MIB = 1 << 20

_machines: dict = {}
_memos: dict = {}


def machine(name: str):
    """One machine object per preset, so plans of it share their priced passes (plan below)."""
    if name not in _machines:
        _machines[name] = HARDWARE[name]()
    return _machines[name]


def plan(m, hw, budget, ctx=4096, options=PlanOptions()):
    """The planner's plan with the passes kept per model and machine, as the daemon keeps them
    (PlanMemo): the fast tier's planner tests in half the time. That a kept memo changes no plan
    is test_a_kept_memo_plans_what_a_fresh_plan_does's, which plans from nothing."""
    return fresh_plan(m, hw, budget, ctx, options, _memos.setdefault((id(m), id(hw)), PlanMemo()))


def families(schedule, phase=None) -> set[str]:
    return {t.placement for t in schedule.tiers if phase is None or t.phase == phase}


@pytest.mark.parametrize("hw", sorted(HARDWARE))
@pytest.mark.parametrize("name", ["llama_8b", "smollm2"])
def test_budget_zero_means_cpu_only(hw, name):
    s = plan(model(name), machine(hw), Budget(0), ctx=4096)
    assert families(s) == {CPU_ONLY}
    assert s.vram_bytes == 0 and s.n_gpu_layers == 0 and not s.op_offload and not s.kv_on_gpu
    assert s.tensor_overrides == ()
    assert all(u.resident_on == "CPU" for u in s.units)


@pytest.mark.parametrize(
    "hw, name, budget",
    [("laptop", "smollm2", 4 * GIB), ("desktop", "smollm2", 2 * GIB), ("desktop", "llama_8b", 16 * GIB),
     ("laptop", "smollm2", 512 * MIB)],
)
def test_budget_larger_than_the_model_means_full_gpu_for_every_tier(hw, name, budget):
    s = plan(model(name), machine(hw), Budget(budget), ctx=4096)
    assert families(s) == {FULL_GPU}
    assert s.n_gpu_layers == model(name).n_layer + 1 and s.tensor_overrides == ()
    assert s.kv_on_gpu and not s.op_offload
    assert all(u.resident_on == GPU0 for u in s.units if u.kind != "embedding")


@pytest.mark.parametrize("hw", ["laptop", "desktop"])
def test_moe_far_larger_than_budget_pins_attention_and_streams_experts_for_prefill(hw):
    m = model("qwen3_30b_a3b")
    assert m.total_bytes > 8 * 2 * GIB
    s = plan(m, machine(hw), Budget(2 * GIB), ctx=4096)
    by_unit = {u.unit: u for u in s.units}
    units = sub_layers(m)
    # Attention (with its KV) and the routers are pinned...
    assert all(by_unit[u.name].resident_on == GPU0 for u in units if u.kind in (ATTENTION, MOE_ROUTER))
    assert s.kv_on_gpu
    # ...most experts are not; decode runs them on the CPU, prefill streams them.
    host_experts = [u for u in units if u.kind == MOE_EXPERTS and by_unit[u.name].resident_on == "CPU"]
    assert len(host_experts) > 40
    assert families(s, DECODE) == {STATIC}
    # Long prompts stream (on the laptop's x8 link a 512-token pass is a near tie with the CPU).
    assert {t.placement for t in s.tiers if t.phase == PREFILL and t.max_tokens >= 1024} == {DYNAMIC}
    assert s.op_offload and 64 < s.op_offload_min_batch <= 1024
    assert all(by_unit[u.name].small_tiers == "cpu" and by_unit[u.name].large_tiers == "streamed" for u in host_experts)
    # Each tier names the runner-up it beat.
    assert all(t.runner_up and t.runner_up_ms >= t.predicted_ms_per_pass for t in s.tiers)


@pytest.mark.parametrize("hw", ["laptop", "desktop"])
@pytest.mark.parametrize("name", ["qwen3_30b_a3b", "llama_8b"])
def test_more_budget_never_predicts_slower(hw, name):
    budgets = [0, 256 * MIB, 512 * MIB, 1 * GIB, 2 * GIB, 3 * GIB, 4 * GIB, 8 * GIB, 16 * GIB]
    box = machine(hw)
    previous = 0.0
    for b in (b for b in budgets if b <= box.gpu.vram_bytes):
        s = plan(model(name), box, Budget(b), ctx=4096)  # budget after budget, as a daemon plans
        # The objective (geometric mean of tokens/s over the tiers) never drops; a single tier
        # may trade a little speed for a larger gain elsewhere.
        assert s.objective() >= previous * 0.999, f"{b >> 20} MiB"
        previous = s.objective()


def test_a_kept_memo_plans_what_a_fresh_plan_does():
    """PlanMemo only saves time: a plan after others, with passes priced before, is the schedule a
    plan from nothing makes, whichever budgets came before it."""
    laptop, m, memo = laptop_4gb_pcie4x8(), model("qwen3_30b_a3b"), PlanMemo()
    fresh_plan(m, laptop, Budget(2 * GIB), ctx=4096, memo=memo)
    assert fresh_plan(m, laptop, Budget(512 * MIB), ctx=4096, memo=memo) == fresh_plan(m, laptop, Budget(512 * MIB), ctx=4096)
    # Another machine: the memo starts over rather than price passes for the wrong one.
    desktop = desktop_16gb_pcie5x16()
    assert fresh_plan(m, desktop, Budget(3 * GIB), ctx=4096, memo=memo) == fresh_plan(m, desktop, Budget(3 * GIB), ctx=4096)
    assert memo.hw is desktop


def test_a_kept_memo_stays_bounded(monkeypatch):
    """A budget following free VRAM all evening must not grow the memo without end: past the cap
    the priced placements start over, and the next plan keeps only its own."""
    import sidecar.planner.search as search

    monkeypatch.setattr(search, "MAX_PLACEMENTS_KEPT", 50)
    m, desktop, memo, alone = model("llama_8b"), desktop_16gb_pcie5x16(), PlanMemo(), PlanMemo()
    for b in (1 * GIB, 2 * GIB):
        fresh_plan(m, desktop, Budget(b), ctx=4096, memo=memo)
    fresh_plan(m, desktop, Budget(3 * GIB), ctx=4096, memo=memo)
    fresh_plan(m, desktop, Budget(3 * GIB), ctx=4096, memo=alone)
    kept = {k: e.placements_kept for k, e in memo.evaluators.items()}
    assert kept == {k: e.placements_kept for k, e in alone.evaluators.items()} and max(kept.values()) > 50


@pytest.mark.parametrize(
    "hw, name, budget",
    [("laptop", "qwen3_30b_a3b", 2 * GIB), ("laptop", "qwen3_30b_a3b", 700 * MIB), ("desktop", "qwen3_30b_a3b", 16 * GIB),
     ("laptop", "llama_8b", 4 * GIB), ("desktop", "llama_8b", 3 * GIB), ("laptop", "smollm2", 64 * MIB)],
)
def test_schedule_stays_within_budget_and_overrides_load_the_residency(hw, name, budget):
    m = model(name)
    s = plan(m, machine(hw), Budget(budget), ctx=4096)
    assert 0 < s.vram_bytes <= budget
    placed = resolve(m, sub_layers(m), s.tensor_overrides, s.n_gpu_layers)
    for u in s.units:
        assert placed[u.unit] == u.resident_on, u.unit


def test_too_small_a_budget_gives_the_cpu_plan_with_a_reason():
    s = plan(model("qwen3_30b_a3b"), laptop_4gb_pcie4x8(), Budget(16 * MIB), ctx=4096)
    assert families(s) == {CPU_ONLY} and s.vram_bytes == 0
    assert any("below the smallest GPU plan" in n for n in s.notes)


def test_partial_attention_streams_everything_for_large_tiers():
    # Not even every layer's attention fits: the large tiers stream all host weights.
    s = plan(model("llama_8b"), laptop_4gb_pcie4x8(), Budget(600 * MIB), ctx=4096)
    assert 0 < s.n_gpu_layers < model("llama_8b").n_layer + 1
    assert GPU_STREAMING in families(s, PREFILL)
    assert any("KV cache of" in n for n in s.notes)


@pytest.mark.parametrize("cap", [1, 2, 4, 6])
@pytest.mark.parametrize("hw", ["laptop", "desktop", "cpu_box"])
def test_plan_never_uses_more_threads_than_the_cap(hw, cap):
    s = plan(model("llama_8b"), machine(hw), Budget(2 * GIB, max_cpu_threads=cap), ctx=4096)
    assert max(t.threads for t in s.tiers) <= cap
    assert s.threads_decode <= cap and s.threads_prefill <= cap


def test_cpu_only_machine_still_decides_threads_and_batch_sizes():
    machine = cpu_only_box()
    options = PlanOptions(micro_batches=(64, 128, 256, 512))
    s = plan(model("llama_8b"), machine, Budget(8 * GIB), ctx=4096, options=options)
    assert families(s) == {CPU_ONLY}
    assert any("no GPU" in n for n in s.notes)
    assert s.micro_batch in options.micro_batches
    assert all(1 <= t.threads <= machine.cpu.logical_cores for t in s.tiers)
    # Prompts are compute-bound: every core helps.
    assert s.threads_prefill == machine.cpu.logical_cores
    assert s.predicted_ttft_ms > 0
    # Each tier takes the fewest threads within 2% of its fastest: the next smaller count tried
    # is slower than that.
    tried = thread_options(machine, 0)
    for tier in s.tiers:
        if tier.threads > 1:
            fewer = max(t for t in tried if t < tier.threads)
            capped = plan(model("llama_8b"), machine, Budget(0, max_cpu_threads=fewer), ctx=4096, options=options)
            slower = next(t for t in capped.tiers if (t.phase, t.max_tokens) == (tier.phase, tier.max_tokens))
            assert slower.predicted_ms_per_pass > tier.predicted_ms_per_pass * 1.02


@pytest.mark.parametrize("cap, expected", [(0, (1, 2, 4, 8, 16)), (6, (1, 2, 4, 6)), (1, (1,)), (64, (1, 2, 4, 8, 16))])
def test_thread_options(cap, expected):
    assert thread_options(laptop_4gb_pcie4x8(), cap) == expected


def test_tiers_and_predictions_are_consistent():
    s = plan(model("qwen3_30b_a3b"), desktop_16gb_pcie5x16(), Budget(4 * GIB), ctx=8192)
    assert [(t.phase, t.max_tokens) for t in s.tiers] == [
        (DECODE, 1), (DECODE, 4), (DECODE, 16), (DECODE, 64), (PREFILL, 512), (PREFILL, 1024), (PREFILL, 2048)]
    for t in s.tiers:
        assert t.predicted_tokens_per_s == pytest.approx(t.max_tokens / t.predicted_ms_per_pass * 1e3)
    assert s.tier_for(1).max_tokens == 1 and s.tier_for(5).max_tokens == 16 and s.tier_for(700).max_tokens == 1024
    assert s.tier_for(9999).max_tokens == 2048
    data = s.to_dict()
    assert data["vram_bytes"] == s.vram_bytes and isinstance(data["vram_bytes_by_component"], dict)
    assert {"weights.attention", "kv_cache", "compute_scratch"} <= set(data["vram_bytes_by_component"])


def test_schedule_is_frozen():
    s = plan(model("smollm2"), cpu_only_box(), Budget(0), ctx=2048)
    with pytest.raises(AttributeError):
        s.micro_batch = 1  # type: ignore[misc]


def test_projector_and_bad_context_are_refused(tmp_path):
    paths = ensure_test_models(tmp_path)
    with pytest.raises(PlanError, match="projector"):
        plan(inspect_gguf(paths["tiny_projector"]), laptop_4gb_pcie4x8(), Budget(GIB))
    with pytest.raises(PlanError, match="context"):
        plan(model("smollm2"), laptop_4gb_pcie4x8(), Budget(GIB), ctx=0)


def test_budget_above_the_gpu_is_capped():
    s = plan(model("qwen3_30b_a3b"), laptop_4gb_pcie4x8(), Budget(64 * GIB), ctx=4096)
    assert s.vram_bytes <= 4 * GIB
    assert any("capped" in n for n in s.notes)


@pytest.mark.parametrize("name", ["tiny_llama", "tiny_llama_moe", "tiny_qwen3moe"])
def test_real_gguf_test_models_plan(tmp_path, name):
    m = inspect_gguf(ensure_test_models(tmp_path)[name])
    for budget in (0, 1 * MIB, GIB):
        s = plan(m, laptop_4gb_pcie4x8(), Budget(budget), ctx=1024)
        assert s.vram_bytes <= budget
        assert all(t.predicted_ms_per_pass > 0 for t in s.tiers)
