"""VLMOpt: where the vision encoder runs, how large an image it may see, and what that costs.

Pure: a projector's ModelInfo, the hardware model, the budget and the language schedule's VRAM in;
a frozen VisionPlan out. The method (method.md, VLMOpt) makes three moves, all counted here:
1. vision weights stay in host memory and reach the GPU only while an image is encoded;
2. flash attention in the encoder, so a large screenshot's N^2 attention scores never materialise;
3. no overlap: encoding finishes and frees its memory before language decoding goes on, so the
   peak is the larger phase (language resident parts + encoder), not the sum of everything.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sidecar.budget import Budget
from sidecar.model_info.model import ModelInfo, VisionInfo
from sidecar.planner.cost_model import GPU_COMPUTE_EFFICIENCY
from sidecar.planner.hardware_model import GB, HardwareModel

# Projector types whose image token count follows the image's size (llama.cpp's clip preprocessing
# keeps the aspect ratio and caps the tokens with image_max_tokens). The others (gemma3, idefics3,
# llava ...) resize every image to their fixed `image_size`.
DYNAMIC_RESOLUTION = frozenset({
    "qwen2vl_merger", "qwen2.5vl_merger", "qwen3vl_merger", "pixtral", "lightonocr", "kimivl", "lfm2",
})
# llama.cpp's encoder activations besides attention scores, per patch and embedding width, in
# float32s: measured 121.25 MiB for a 4096-patch, 1152-wide SigLIP encoder with flash attention.
ACTIVATION_FLOATS_PER_PATCH_WIDTH = 6.75
# Fewest output tokens a dynamic-resolution projector is asked for before the encoder moves to the CPU.
MIN_IMAGE_TOKENS = 64

GPU_STREAMED = "gpu_streamed"  # VLMOpt: weights copied to VRAM for each image, freed after
GPU_RESIDENT = "gpu_resident"  # the usual way: encoder weights live in VRAM next to the language model
CPU = "cpu"


@dataclass(frozen=True)
class EncoderCost:
    """One image through the encoder at `patches` patches."""

    patches: int
    output_tokens: int
    weight_bytes: int
    activation_bytes: int  # everything but attention scores
    attention_score_bytes: int  # the N^2 scores of one layer, which only exist without flash attention
    flops: float

    def compute_bytes(self, flash_attention: bool) -> int:
        return self.activation_bytes + (0 if flash_attention else self.attention_score_bytes)

    def phase_bytes(self, flash_attention: bool) -> int:
        return self.weight_bytes + self.compute_bytes(flash_attention)


@dataclass(frozen=True)
class VisionPlan:
    """What the executor sets for the encoder and what the planner predicts for one image."""

    placement: str  # GPU_STREAMED, GPU_RESIDENT or CPU
    vlmopt: bool
    flash_attention: bool
    # Output-token cap passed to libmtmd (dynamic-resolution projectors); 0 = the projector's own.
    image_max_tokens: int
    # Longest side images are scaled to before encoding; 0 = no limit of ours.
    max_image_side: int
    dynamic_resolution: bool
    cost: EncoderCost  # at the largest image the plan allows
    language_phase_vram: int
    vision_phase_vram: int
    peak_vram: int
    predicted_encode_ms: float
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {
            "placement": self.placement, "vlmopt": self.vlmopt, "flash_attention": self.flash_attention,
            "image_max_tokens": self.image_max_tokens, "max_image_side": self.max_image_side,
            "dynamic_resolution": self.dynamic_resolution, "patches": self.cost.patches,
            "output_tokens": self.cost.output_tokens, "encoder_weight_bytes": self.cost.weight_bytes,
            "encoder_compute_bytes": self.cost.compute_bytes(self.flash_attention),
            "language_phase_vram": self.language_phase_vram, "vision_phase_vram": self.vision_phase_vram,
            "peak_vram": self.peak_vram, "predicted_encode_ms": round(self.predicted_encode_ms, 1),
            "notes": list(self.notes),
        }


def merge_factor(v: VisionInfo) -> int:
    """Patches merged into one output token, per side."""
    return max(1, v.scale_factor)


def encoder_cost(projector: ModelInfo, patches: int) -> EncoderCost:
    """Memory and work of encoding `patches` patches with this projector's encoder."""
    v = projector.vision
    if v is None:
        raise ValueError(f"{projector.name} is not a vision projector")
    weight_bytes = sum(t.n_bytes for t in projector.tensors)
    params = sum(t.n_elements for t in projector.tensors if t.is_matrix)
    activation = int(ACTIVATION_FLOATS_PER_PATCH_WIDTH * patches * v.n_embd * 4)
    scores = v.n_head * patches * patches * 4
    # Matrix products touch every weight once per patch; attention adds QK^T and AV per layer.
    flops = 2.0 * patches * params + 4.0 * v.n_layer * patches * patches * v.n_embd
    return EncoderCost(patches, patches // merge_factor(v) ** 2, weight_bytes, activation, scores, flops)


def patches_for_image(v: VisionInfo, width: int, height: int, max_output_tokens: int, dynamic: bool) -> int:
    """Encoder patches for a `width` x `height` image: the projector's fixed grid, or, for a
    dynamic-resolution projector, the image's own grid scaled down to `max_output_tokens`."""
    if not dynamic:
        return v.tokens_per_image
    p = max(1, v.patch_size) * merge_factor(v)  # one output token covers p x p pixels
    tokens = math.ceil(width / p) * math.ceil(height / p)
    if max_output_tokens and tokens > max_output_tokens:
        tokens = max_output_tokens
    return tokens * merge_factor(v) ** 2


def _encode_ms(cost: EncoderCost, hw: HardwareModel, placement: str, threads: int) -> float:
    if placement == CPU or hw.gpu is None:
        gflops = hw.cpu.gflops_per_core * max(1, threads)
        return cost.flops / (gflops * GB) * 1000.0
    # Encoder-sized matrix products reach the same share of the GPU's peak as the language model's.
    compute = cost.flops / (hw.gpu.tflops * 1e12 * GPU_COMPUTE_EFFICIENCY)
    copy = cost.weight_bytes / (hw.gpu.pcie_gbps * GB) if placement == GPU_STREAMED else 0.0
    return (compute + copy) * 1000.0


def plan_vision(
    projector: ModelInfo,
    hw: HardwareModel,
    budget: Budget,
    *,
    language_resident_vram: int,
    language_phase_vram: int,
    vlmopt: bool = True,
    largest_image: tuple[int, int] = (2560, 1440),
    threads: int = 0,
) -> VisionPlan:
    """Place the encoder inside the budget.

    language_resident_vram: VRAM the language schedule keeps while an image is encoded (weights,
    KV cache); language_phase_vram: all it uses while decoding (plus its scratch). `largest_image`
    is what the plan should afford (1440p by default: the largest screenshot a game sends).
    """
    v = projector.vision
    if v is None:
        raise ValueError(f"{projector.name} is not a vision projector")
    dynamic = v.projector_type in DYNAMIC_RESOLUTION
    threads = threads or hw.cpu.physical_cores
    notes: list[str] = []
    w, h = largest_image
    full = encoder_cost(projector, patches_for_image(v, w, h, 0, dynamic))
    # Flash attention never costs memory and saves the N^2 scores; llama.cpp has it on CPU and CUDA.
    flash = True
    budget_bytes = budget.vram_bytes if hw.gpu is not None else 0

    def fits(cost: EncoderCost) -> bool:
        if vlmopt:
            need = max(language_phase_vram, language_resident_vram + cost.phase_bytes(flash))
        else:
            need = language_phase_vram + cost.phase_bytes(flash)
        return need <= budget_bytes

    placement, cost, max_tokens = CPU, full, 0
    if budget_bytes > 0:
        if fits(full):
            placement = GPU_STREAMED if vlmopt else GPU_RESIDENT
        elif dynamic:
            # Halve the image's token count until the encoder fits; the response says it shrank.
            tokens = full.output_tokens
            while tokens // 2 >= MIN_IMAGE_TOKENS:
                tokens //= 2
                smaller = encoder_cost(projector, tokens * merge_factor(v) ** 2)
                if fits(smaller):
                    placement, cost, max_tokens = (GPU_STREAMED if vlmopt else GPU_RESIDENT), smaller, tokens
                    notes.append(f"a {w}x{h} image is scaled to {tokens} image tokens to fit the budget")
                    break
        if placement == CPU:
            notes.append("the encoder does not fit the VRAM budget beside the language model: it runs on the CPU")
    elif hw.gpu is None:
        notes.append("no GPU: the encoder runs on the CPU")
    else:
        notes.append("a VRAM budget of 0 keeps the encoder on the CPU")
    on_gpu = placement != CPU
    vision_vram = language_resident_vram + cost.phase_bytes(flash) if on_gpu else language_resident_vram
    if not on_gpu:
        peak = language_phase_vram
    elif vlmopt:
        peak = max(language_phase_vram, vision_vram)
    else:
        peak = language_phase_vram + cost.phase_bytes(flash)
    max_side = 0
    if dynamic and max_tokens:
        p = max(1, v.patch_size) * merge_factor(v)
        # The longer side of a max_tokens-token image with the largest image's aspect ratio.
        max_side = int(math.sqrt(max_tokens * max(w, h) / min(w, h))) * p
    elif not dynamic:
        # A fixed-grid encoder resizes everything to image_size; decoding a bigger image first is waste.
        max_side = 4 * v.image_size if v.image_size else 0
    return VisionPlan(
        placement=placement,
        vlmopt=vlmopt,
        flash_attention=flash,
        image_max_tokens=max_tokens,
        max_image_side=max_side,
        dynamic_resolution=dynamic,
        cost=cost,
        language_phase_vram=language_phase_vram,
        vision_phase_vram=vision_vram,
        peak_vram=peak,
        predicted_encode_ms=_encode_ms(cost, hw, placement, threads),
        notes=tuple(notes),
    )


__all__ = ["CPU", "DYNAMIC_RESOLUTION", "GPU_RESIDENT", "GPU_STREAMED", "EncoderCost", "VisionPlan",
           "encoder_cost", "patches_for_image", "plan_vision"]
