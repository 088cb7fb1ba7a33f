"""The anchors: llama.cpp's best whole-layer -ngl and its --fit, emulated on the same budget."""

from __future__ import annotations

import pytest

from sidecar.budget import Budget
from sidecar.model_info import model_from_hf_config, sub_layers
from sidecar.planner import anchors, cpu_only_box, desktop_16gb_pcie5x16, laptop_4gb_pcie4x8, plan
from sidecar.planner.anchors import FIT_MARGIN_BYTES, llama_threads
from sidecar.planner.overrides import resolve

GIB = 1 << 30
QWEN3_30B_A3B = {"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
                 "moe_intermediate_size": 768, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
                 "num_hidden_layers": 48, "num_experts": 128, "num_experts_per_tok": 8, "vocab_size": 151936}
LLAMA_8B = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
            "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 128256}
SMOLLM2 = {"model_type": "llama", "hidden_size": 576, "intermediate_size": 1536, "num_attention_heads": 9,
           "num_key_value_heads": 3, "num_hidden_layers": 30, "vocab_size": 49152, "tie_word_embeddings": True}


@pytest.fixture(scope="module")
def models():
    return {
        "qwen": model_from_hf_config(QWEN3_30B_A3B, "Q4_K_M"),
        "llama": model_from_hf_config(LLAMA_8B, "Q4_K_M"),
        "smollm2": model_from_hf_config(SMOLLM2, "Q4_1"),
    }


HW = {"laptop": laptop_4gb_pcie4x8, "desktop": desktop_16gb_pcie5x16}


@pytest.mark.parametrize(
    "hw, name, budget",
    [("laptop", "llama", 4 * GIB), ("desktop", "llama", 3 * GIB), ("laptop", "qwen", 2 * GIB),
     ("desktop", "qwen", 16 * GIB), ("desktop", "qwen", 8 * GIB)],
)
def test_anchors_fit_their_budget_and_we_are_not_slower(models, hw, name, budget):
    m = models[name]
    ngl, fit = anchors(m, HW[hw](), Budget(budget), ctx=4096)
    assert ngl.name.startswith("-ngl ") and ngl.vram_bytes <= budget
    assert fit.name == "--fit" and fit.vram_bytes <= budget - FIT_MARGIN_BYTES
    ours = plan(m, HW[hw](), Budget(budget), ctx=4096)
    assert ours.objective() >= 0.99 * max(ngl.objective(), fit.objective())
    # The anchors' overrides load what they claim.
    for a in (ngl, fit):
        placed = resolve(m, sub_layers(m), a.tensor_overrides, a.n_gpu_layers)
        assert sum(u.weight_bytes for u in sub_layers(m) if placed[u.name] == "GPU0") <= a.vram_bytes


def test_fit_keeps_everything_on_the_gpu_when_model_and_margin_fit(models):
    _, fit = anchors(models["smollm2"], laptop_4gb_pcie4x8(), Budget(4 * GIB), ctx=4096)
    assert fit.n_gpu_layers == 31 and fit.tensor_overrides == ()


def test_fit_puts_moe_experts_on_the_cpu_first(models):
    _, fit = anchors(models["qwen"], desktop_16gb_pcie5x16(), Budget(8 * GIB), ctx=4096)
    # Every layer's dense part is on the GPU; some layers' experts stay in RAM.
    assert fit.n_gpu_layers == 49
    assert any("exps" in pattern and device == "CPU" for pattern, device in fit.tensor_overrides)


@pytest.mark.parametrize("budget", [0, 512 << 20])
def test_small_budgets_leave_fit_on_the_cpu(models, budget):
    ngl, fit = anchors(models["llama"], laptop_4gb_pcie4x8(), Budget(budget), ctx=4096)
    assert fit.n_gpu_layers == 0 and fit.vram_bytes == 0
    if budget == 0:
        assert ngl.n_gpu_layers == 0


def test_cpu_only_machine(models):
    ngl, fit = anchors(models["llama"], cpu_only_box(), Budget(8 * GIB), ctx=4096)
    assert ngl.vram_bytes == fit.vram_bytes == 0
    assert [t.predicted_tokens_per_s for t in ngl.tiers] == [t.predicted_tokens_per_s for t in fit.tiers]


@pytest.mark.parametrize("cap, expected", [(0, 8), (4, 4), (32, 8)])
def test_llama_threads_respect_the_cap(cap, expected):
    assert llama_threads(laptop_4gb_pcie4x8(), cap) == expected
