"""VRAM a placement occupies, by component: weights by unit kind, KV cache, compute scratch.

The compute buffer is estimated the way llama.cpp reserves it: the logits rows of the largest
micro-batch (n_vocab x min(n_ubatch, n_outputs_max) floats, exact) where the output runs, plus
the widest layer's activations for a micro-batch, times the method's 1.5 safety margin; and,
when host weights stream in, room for the largest weight tensor copied at once (each offloaded
weight gets its own split, so one copy is alive at a time).
"""

from __future__ import annotations

from collections.abc import Iterable

from sidecar.model_info.kv import kv_layer_bytes
from sidecar.model_info.model import ModelInfo
from sidecar.model_info.units import EMBEDDING, OUTPUT, SubLayer

# The method sizes each candidate from its graph and adds half again for safety.
SCRATCH_MARGIN = 1.5
# Without flash attention the K.Q scores of a micro-batch over the whole cache are materialised.
SCORE_BYTES = 4


def activation_floats_per_token(model: ModelInfo) -> int:
    """F32 values a token keeps alive in the widest part of a layer (two residual-wide rows,
    the query, and the FFN's intermediate rows: for experts, those of every expert it uses)."""
    if model.is_moe:
        ffn = model.n_expert_used * model.n_ff_expert + model.n_ff_shared
    else:
        ffn = model.n_ff
    return 2 * model.n_embd + model.n_head * model.head_dim_k + 2 * ffn


def scratch_bytes(model: ModelInfo, n_ubatch: int, ctx: int, output_on_gpu: bool, flash_attention: bool,
                  n_outputs_max: int, margin: float = SCRATCH_MARGIN) -> int:
    """The GPU compute buffer for micro-batches of `n_ubatch` tokens (without stream slots)."""
    activations = n_ubatch * activation_floats_per_token(model) * 4
    if not flash_attention:
        activations += model.n_head * n_ubatch * ctx * SCORE_BYTES
    logits = model.n_vocab * min(n_ubatch, max(n_outputs_max, 1)) * 4 if output_on_gpu else 0
    return int(activations * margin) + logits


def largest_tensor_bytes(units: Iterable[SubLayer]) -> int:
    """The biggest single weight tensor among `units`: what one streamed copy needs in VRAM."""
    return max((u.largest_tensor_bytes for u in units), default=0)


def vram_by_component(
    model: ModelInfo,
    units: tuple[SubLayer, ...],
    resident: frozenset[str],
    kv_layers: frozenset[int],
    ctx: int,
    kv_type: str,
    n_ubatch: int,
    n_outputs_max: int,
    flash_attention: bool,
    streaming: bool,
    n_seq: int = 1,
) -> tuple[tuple[str, int], ...]:
    """(component, bytes) pairs for a placement; components with zero bytes are left out.

    `resident`: names of the units whose weights live in VRAM. `kv_layers`: layers whose KV
    cache does. Nothing at all is on the GPU when both are empty and nothing streams.
    """
    parts: dict[str, int] = {}
    for u in units:
        if u.name in resident:
            key = f"weights.{u.kind}"
            parts[key] = parts.get(key, 0) + u.weight_bytes
    # A layer's cache size depends only on whether it slides (kv.py): one of each kind, counted.
    sliding = kv_layers & frozenset(model.swa_layers)
    full = kv_layers - sliding
    kv = sum(len(kind) * kv_layer_bytes(model, min(kind), ctx, kv_type, n_ubatch, n_seq) for kind in (full, sliding) if kind)
    if kv:
        parts["kv_cache"] = kv
    uses_gpu = bool(resident or kv_layers or streaming)
    if uses_gpu:
        output_on_gpu = any(u.kind == OUTPUT and u.name in resident for u in units)
        parts["compute_scratch"] = scratch_bytes(model, n_ubatch, ctx, output_on_gpu, flash_attention, n_outputs_max)
    if streaming:
        host = [u for u in units if u.name not in resident and u.kind != EMBEDDING]
        slot = largest_tensor_bytes(host)
        # Routed experts are copied whole-tensor-sized even when only some experts move.
        if slot:
            parts["stream_slot"] = slot
    return tuple(sorted(parts.items()))


def total_vram(components: tuple[tuple[str, int], ...]) -> int:
    """Sum of a component list."""
    return sum(b for _, b in components)


__all__ = ["SCRATCH_MARGIN", "activation_floats_per_token", "largest_tensor_bytes",
           "scratch_bytes", "total_vram", "vram_by_component"]
