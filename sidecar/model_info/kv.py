"""KV-cache sizes: bytes per token per layer, and the whole cache for a context size.

Each layer stores one key and one value vector per KV head per cached token. Sliding-window
layers keep only the window (plus one micro-batch) however long the context, as llama.cpp's
iSWA cache does, so a Gemma 3 cache is mostly its few global layers.
"""

from __future__ import annotations

from sidecar.model_info.ggml_types import bits_per_weight
from sidecar.model_info.model import ModelInfo

# llama.cpp allocates KV cells in multiples of 256.
KV_CELL_PAD = 256
KV_TYPES = ("F16", "BF16", "F32", "Q8_0", "Q5_1", "Q5_0", "Q4_1", "Q4_0", "IQ4_NL")


def _pad(n: int, to: int = KV_CELL_PAD) -> int:
    return -(-n // to) * to


def kv_bytes_per_token(model: ModelInfo, layer: int, kv_type: str = "F16") -> float:
    """Bytes one cached token costs in `layer` (keys plus values) for a KV type ("F16", "Q8_0", ...)."""
    if kv_type.upper() not in KV_TYPES:
        raise ValueError(f"KV type {kv_type!r} not one of {', '.join(KV_TYPES)}")
    if not 0 <= layer < model.n_layer:
        raise ValueError(f"layer {layer} outside 0..{model.n_layer - 1}")
    elements = model.n_head_kv * (model.head_dim_k + model.head_dim_v)
    return elements * bits_per_weight(kv_type) / 8.0


def kv_cells(model: ModelInfo, layer: int, ctx: int, n_ubatch: int = 512, n_seq: int = 1) -> int:
    """Cells `layer` allocates for a context of `ctx` tokens (sliding-window layers keep fewer)."""
    full = _pad(max(ctx, 1))
    if layer in model.swa_layers and model.sliding_window:
        return min(full, _pad(model.sliding_window * n_seq + n_ubatch))
    return full


def kv_layer_bytes(model: ModelInfo, layer: int, ctx: int, kv_type: str = "F16", n_ubatch: int = 512,
                   n_seq: int = 1) -> int:
    """Bytes of one layer's KV cache for `ctx` tokens."""
    return int(kv_cells(model, layer, ctx, n_ubatch, n_seq) * kv_bytes_per_token(model, layer, kv_type))


def kv_cache_bytes(model: ModelInfo, ctx: int, kv_type: str = "F16", layers: tuple[int, ...] | None = None,
                   n_ubatch: int = 512, n_seq: int = 1) -> int:
    """Bytes of the KV cache for `ctx` tokens over `layers` (default all)."""
    chosen = range(model.n_layer) if layers is None else layers
    return sum(kv_layer_bytes(model, i, ctx, kv_type, n_ubatch, n_seq) for i in chosen)


def kv_read_bytes(model: ModelInfo, layer: int, context: int, kv_type: str = "F16") -> float:
    """Bytes attention reads from `layer`'s cache for one token that sees `context` earlier tokens."""
    seen = context
    if layer in model.swa_layers and model.sliding_window:
        seen = min(context, model.sliding_window)
    return seen * kv_bytes_per_token(model, layer, kv_type)


def attention_flops(model: ModelInfo, layer: int, context: int) -> float:
    """FLOPs of scores and weighted sum for one token over `context` cached tokens (Q.K and P.V)."""
    seen = context
    if layer in model.swa_layers and model.sliding_window:
        seen = min(context, model.sliding_window)
    return 2.0 * model.n_head * (model.head_dim_k + model.head_dim_v) * seen
