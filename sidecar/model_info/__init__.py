"""Model inspection without loading weights: GGUF headers or Hugging Face configs -> ModelInfo,
grouped into placeable sub-layer units with per-token costs, plus KV-cache sizes.

    inspect_gguf(path) -> ModelInfo
    model_from_hf_config(config: dict, weight_type: str, name=None) -> ModelInfo
    projector_from_hf_config(config: dict, weight_type="F16", name=None) -> ModelInfo
    sub_layers(model) -> tuple[SubLayer, ...]
    kv_cache_bytes(model, ctx, kv_type="F16", layers=None, n_ubatch=512, n_seq=1) -> int
"""

from sidecar.model_info.gguf_reader import GgufReadError, inspect_gguf
from sidecar.model_info.hf_config import model_from_hf_config, projector_from_hf_config
from sidecar.model_info.kv import kv_bytes_per_token, kv_cache_bytes, kv_layer_bytes
from sidecar.model_info.model import ModelInfo, TensorInfo, VisionInfo
from sidecar.model_info.units import (
    ATTENTION,
    EMBEDDING,
    FFN,
    KINDS,
    MOE_EXPERTS,
    MOE_ROUTER,
    MOE_SHARED,
    NORM,
    OUTPUT,
    SubLayer,
    experts_touched,
    sub_layers,
)

__all__ = [
    "ATTENTION",
    "EMBEDDING",
    "FFN",
    "KINDS",
    "MOE_EXPERTS",
    "MOE_ROUTER",
    "MOE_SHARED",
    "NORM",
    "OUTPUT",
    "GgufReadError",
    "ModelInfo",
    "SubLayer",
    "TensorInfo",
    "VisionInfo",
    "experts_touched",
    "inspect_gguf",
    "kv_bytes_per_token",
    "kv_cache_bytes",
    "kv_layer_bytes",
    "model_from_hf_config",
    "projector_from_hf_config",
    "sub_layers",
]
