"""VLMOpt in the planner: encoder memory and time, placement, image token budget (pure, no I/O)."""

from __future__ import annotations

import pytest

from sidecar.budget import Budget, parse_size
from sidecar.model_info.model import ModelInfo, TensorInfo, VisionInfo
from sidecar.planner import cpu_only_box, desktop_16gb_pcie5x16, laptop_4gb_pcie4x8
from sidecar.planner.vision import CPU, GPU_RESIDENT, GPU_STREAMED, encoder_cost, patches_for_image, plan_vision

GIB = 1 << 30


def siglip(projector_type: str = "gemma3", scale: int = 4) -> ModelInfo:
    """A SigLIP-So400m-shaped projector header: 27 blocks, 1152 wide, patch 14, 896 px."""
    d, ff, layers = 1152, 4304, 27
    tensors = []
    for i in range(layers):
        for name, shape in (("attn_qkv", (d, 3 * d)), ("attn_out", (d, d)), ("ffn_up", (d, ff)), ("ffn_down", (ff, d))):
            tensors.append(TensorInfo(f"v.blk.{i}.{name}.weight", "F16", shape, shape[0] * shape[1] * 2))
    vision = VisionInfo(projector_type, 896, 14, d, ff, layers, 16, 2560, scale)
    return ModelInfo(name="siglip", arch="clip", source="test", file_type="F16", n_layer=0, n_embd=0, n_ff=0,
                     n_head=0, n_head_kv=0, head_dim_k=0, head_dim_v=0, n_vocab=0, n_ctx_train=0,
                     tensors=tuple(tensors), vision=vision)


def test_flash_attention_removes_the_quadratic_scores() -> None:
    cost = encoder_cost(siglip(), 4096)
    assert cost.weight_bytes == pytest.approx(0.8 * GIB, rel=0.1)
    # 16 heads x 4096^2 float32 scores: exactly what llama.cpp's compute buffer grew by (1132 vs 121 MiB).
    assert cost.compute_bytes(False) - cost.compute_bytes(True) == 16 * 4096 * 4096 * 4
    assert cost.compute_bytes(True) == pytest.approx(121.25 * (1 << 20), rel=0.05)


def test_vlmopt_peak_is_the_larger_phase_not_the_sum() -> None:
    kw = dict(language_resident_vram=int(1.5 * GIB), language_phase_vram=int(2.5 * GIB))
    hw = laptop_4gb_pcie4x8()
    with_opt = plan_vision(siglip(), hw, Budget(parse_size("3G")), vlmopt=True, **kw)
    without = plan_vision(siglip(), hw, Budget(parse_size("4G")), vlmopt=False, **kw)
    phase = with_opt.cost.phase_bytes(True)
    assert with_opt.placement == GPU_STREAMED
    assert with_opt.peak_vram == max(int(2.5 * GIB), int(1.5 * GIB) + phase) <= parse_size("3G")
    assert without.placement == GPU_RESIDENT and without.peak_vram == int(2.5 * GIB) + phase > parse_size("3G")
    # At 3 GB the same encoder only fits with VLMOpt; without it, it falls back to the CPU.
    squeezed = plan_vision(siglip(), hw, Budget(parse_size("3G")), vlmopt=False, **kw)
    assert squeezed.placement == CPU and "CPU" in squeezed.notes[0]
    # Streaming the weights costs a copy per image, counted in the prediction.
    assert with_opt.predicted_encode_ms > without.predicted_encode_ms


def test_dynamic_resolution_images_shrink_to_fit_the_budget() -> None:
    qwen = siglip("qwen2.5vl_merger", scale=2)
    hw = desktop_16gb_pcie5x16()
    roomy = plan_vision(qwen, hw, Budget(16 * GIB), language_resident_vram=GIB, language_phase_vram=2 * GIB)
    assert roomy.image_max_tokens == 0 and roomy.cost.patches == patches_for_image(qwen.vision, 2560, 1440, 0, True)
    tight = plan_vision(qwen, hw, Budget(int(2.3 * GIB)), language_resident_vram=GIB, language_phase_vram=2 * GIB)
    assert tight.placement == GPU_STREAMED
    assert 0 < tight.image_max_tokens < roomy.cost.output_tokens
    assert tight.vision_phase_vram <= 2.3 * GIB and tight.max_image_side > 0
    assert any("scaled" in note for note in tight.notes)


def test_fixed_grid_projectors_cost_the_same_at_any_resolution() -> None:
    v = siglip().vision
    assert {patches_for_image(v, w, h, 0, False) for w, h in ((854, 480), (1920, 1080), (2560, 1440))} == {4096}


def test_no_gpu_or_no_budget_keeps_the_encoder_on_the_cpu() -> None:
    for hw, budget in ((cpu_only_box(), Budget(8 * GIB)), (laptop_4gb_pcie4x8(), Budget(0))):
        p = plan_vision(siglip(), hw, budget, language_resident_vram=0, language_phase_vram=0)
        assert p.placement == CPU and p.peak_vram == 0 and p.flash_attention
        assert p.predicted_encode_ms > 0
