"""ModelInfo from a Hugging Face config.json and a weight type, with no GGUF at all.

Tensor names and shapes are the ones llama.cpp's converter writes for that architecture; bytes
come from ggml's block sizes. A llama.cpp "mix" name (Q4_K_M, Q5_K_M, ...) is modelled the way
llama-quantize assigns types: norms, biases and routers stay F32, the output projection goes
to Q6_K, and a "_M" mix gives attn_v and ffn_down Q6_K on its "more bits" layers. The result is
within a few percent of the real file; exact only for plain types ("Q4_0", "Q8_0", "F16").
"""

from __future__ import annotations

import math
from typing import Any

from sidecar.model_info.ggml_types import block_layout, known_type, tensor_bytes
from sidecar.model_info.gguf_reader import SWA_PERIOD, dominant_type
from sidecar.model_info.model import ModelInfo, TensorInfo, VisionInfo

# Hugging Face model_type -> llama.cpp architecture. Mixtral converts to llama with experts.
ARCH_BY_MODEL_TYPE = {
    "llama": "llama",
    "mistral": "llama",
    "mixtral": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "qwen2_moe": "qwen2moe",
    "qwen3_moe": "qwen3moe",
    "gemma3": "gemma3",
    "gemma3_text": "gemma3",
    "gemma2": "gemma2",
    "phi3": "phi3",
}
_QK_NORM_ARCHS = {"qwen3", "qwen3moe", "gemma3"}
_QKV_BIAS_ARCHS = {"qwen2", "qwen2moe"}
_SANDWICH_NORM_ARCHS = {"gemma2", "gemma3"}
# Ftype mixes: llama.cpp name -> main type.
MIX_MAIN_TYPE = {
    "Q2_K": "Q2_K", "Q2_K_S": "Q2_K", "Q3_K_S": "Q3_K", "Q3_K_M": "Q3_K", "Q3_K_L": "Q3_K",
    "Q4_K_S": "Q4_K", "Q4_K_M": "Q4_K", "Q5_K_S": "Q5_K", "Q5_K_M": "Q5_K", "Q6_K": "Q6_K",
    "IQ4_XS": "IQ4_XS", "IQ4_NL": "IQ4_NL",
}
# When a row is not a whole number of blocks, llama-quantize falls back to a 32-wide type.
_FALLBACK = {"Q2_K": "Q4_0", "Q3_K": "Q4_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0",
             "IQ4_XS": "IQ4_NL"}


def _use_more_bits(layer: int, n_layer: int) -> bool:
    # llama-quantize spends more bits on the first and last eighth of layers and every third between.
    return layer < n_layer // 8 or layer >= 7 * n_layer // 8 or (layer - n_layer // 8) % 3 == 2


class WeightTypes:
    """Which ggml type each tensor gets for a requested weight type or mix name."""

    def __init__(self, weight_type: str) -> None:
        name = weight_type.upper()
        self.mix = name.endswith("_M") or name.endswith("_L")
        main = MIX_MAIN_TYPE.get(name, name)
        if not known_type(main):
            raise ValueError(f"unknown weight type {weight_type!r}: give a ggml type (Q4_0, Q4_K, Q8_0, "
                             f"F16, ...) or a llama.cpp mix (Q4_K_M, Q5_K_S, ...)")
        self.main = main
        self.name = name

    def _fit(self, type_name: str, ne0: int) -> str:
        block, _ = block_layout(type_name)
        if ne0 % block == 0:
            return type_name
        fallback = _FALLBACK.get(type_name, "F16")
        return fallback if ne0 % block_layout(fallback)[0] == 0 else "F16"

    def for_tensor(self, stem: str, shape: tuple[int, ...], layer: int | None, n_layer: int) -> str:
        """The type of tensor `stem` (name without blk.N. and .weight) of `shape`."""
        if len(shape) == 1 or stem.startswith("ffn_gate_inp"):
            return "F32"
        if self.main in ("F16", "BF16", "F32"):
            return self.main
        chosen = self.main
        if stem == "output" and self.main not in ("Q8_0",):
            chosen = "Q6_K"
        elif self.mix and layer is not None and stem.startswith(("attn_v", "ffn_down")) \
                and _use_more_bits(layer, n_layer):
            chosen = "Q6_K"
        return self._fit(chosen, shape[0])


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    # Multimodal configs (Gemma3ForConditionalGeneration) nest the language model.
    text = config.get("text_config")
    if isinstance(text, dict):
        merged = {**text}
        merged.setdefault("model_type", config.get("model_type", ""))
        if merged["model_type"] == "gemma3" or config.get("model_type") == "gemma3":
            merged["model_type"] = "gemma3"
        for key in ("tie_word_embeddings", "vocab_size"):
            if key not in merged and key in config:
                merged[key] = config[key]
        return merged
    return config


def _req(cfg: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    if default is not None:
        return default
    raise ValueError(f"config.json lacks {' / '.join(keys)}")


def _swa(arch: str, cfg: dict[str, Any], n_layer: int) -> tuple[int, tuple[int, ...]]:
    window = int(cfg.get("sliding_window") or 0)
    if not window or arch not in SWA_PERIOD:
        return 0, ()
    layer_types = cfg.get("layer_types")
    if isinstance(layer_types, list) and len(layer_types) == n_layer:
        return window, tuple(i for i, t in enumerate(layer_types) if "sliding" in str(t))
    period = int(cfg.get("sliding_window_pattern") or SWA_PERIOD[arch])
    return window, tuple(i for i in range(n_layer) if i % period < period - 1)


def model_from_hf_config(config: dict[str, Any], weight_type: str, name: str | None = None) -> ModelInfo:
    """The ModelInfo llama.cpp would see after converting and quantizing this model to `weight_type`.

    `config` is a parsed config.json; `weight_type` a ggml type or llama.cpp mix name. Raises
    ValueError for an unknown type or when the config lacks the sizes needed.
    """
    cfg = _text_config(config)
    model_type = str(cfg.get("model_type", "")).lower()
    arch = ARCH_BY_MODEL_TYPE.get(model_type, "llama")
    notes = () if model_type in ARCH_BY_MODEL_TYPE else (
        f"model_type {model_type!r} not known: sized as a llama-style transformer",)
    types = WeightTypes(weight_type)

    n_layer = int(_req(cfg, "num_hidden_layers", "n_layer"))
    n_embd = int(_req(cfg, "hidden_size", "n_embd"))
    n_head = int(_req(cfg, "num_attention_heads", "n_head"))
    n_head_kv = int(cfg.get("num_key_value_heads") or n_head)
    head_dim = int(cfg.get("head_dim") or n_embd // n_head)
    n_vocab = int(_req(cfg, "vocab_size"))
    n_ff = int(cfg.get("intermediate_size") or 4 * n_embd)
    n_expert = int(cfg.get("num_experts") or cfg.get("num_local_experts") or 0)
    n_expert_used = int(cfg.get("num_experts_per_tok") or 0) if n_expert else 0
    n_ff_expert = int(cfg.get("moe_intermediate_size") or n_ff) if n_expert else 0
    n_ff_shared = int(cfg.get("shared_expert_intermediate_size") or 0) if n_expert else 0
    tied = bool(cfg.get("tie_word_embeddings", arch in ("gemma2", "gemma3")))
    dense_layers = set(cfg.get("mlp_only_layers") or [])
    sparse_step = int(cfg.get("decoder_sparse_step") or 1)

    tensors: list[TensorInfo] = []

    def add(name: str, shape: tuple[int, ...], layer: int | None = None, as_stem: str | None = None) -> None:
        stem = name.rsplit(".", 1)[0]
        stem = as_stem or (stem.split(".", 2)[2] if stem.startswith("blk.") else stem)
        type_name = types.for_tensor(stem, shape, layer, n_layer)
        count = math.prod(shape)
        tensors.append(TensorInfo(name, type_name, shape, tensor_bytes(type_name, count)))

    q, kv = n_head * head_dim, n_head_kv * head_dim
    # With tied weights the embedding is also the output projection, and quantizes like one.
    add("token_embd.weight", (n_embd, n_vocab), as_stem="output" if tied else None)
    for i in range(n_layer):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", (n_embd,), i)
        add(p + "attn_q.weight", (n_embd, q), i)
        add(p + "attn_k.weight", (n_embd, kv), i)
        add(p + "attn_v.weight", (n_embd, kv), i)
        add(p + "attn_output.weight", (q, n_embd), i)
        if arch in _QKV_BIAS_ARCHS:
            add(p + "attn_q.bias", (q,), i)
            add(p + "attn_k.bias", (kv,), i)
            add(p + "attn_v.bias", (kv,), i)
        if arch in _QK_NORM_ARCHS:
            add(p + "attn_q_norm.weight", (head_dim,), i)
            add(p + "attn_k_norm.weight", (head_dim,), i)
        if arch in _SANDWICH_NORM_ARCHS:
            add(p + "post_attention_norm.weight", (n_embd,), i)
        add(p + "ffn_norm.weight", (n_embd,), i)
        sparse = n_expert and i not in dense_layers and (i + 1) % sparse_step == 0
        if sparse:
            add(p + "ffn_gate_inp.weight", (n_embd, n_expert), i)
            add(p + "ffn_gate_exps.weight", (n_embd, n_ff_expert, n_expert), i)
            add(p + "ffn_up_exps.weight", (n_embd, n_ff_expert, n_expert), i)
            add(p + "ffn_down_exps.weight", (n_ff_expert, n_embd, n_expert), i)
            if n_ff_shared:
                add(p + "ffn_gate_inp_shexp.weight", (n_embd,), i)
                add(p + "ffn_gate_shexp.weight", (n_embd, n_ff_shared), i)
                add(p + "ffn_up_shexp.weight", (n_embd, n_ff_shared), i)
                add(p + "ffn_down_shexp.weight", (n_ff_shared, n_embd), i)
        else:
            add(p + "ffn_gate.weight", (n_embd, n_ff), i)
            add(p + "ffn_up.weight", (n_embd, n_ff), i)
            add(p + "ffn_down.weight", (n_ff, n_embd), i)
        if arch in _SANDWICH_NORM_ARCHS:
            add(p + "post_ffw_norm.weight", (n_embd,), i)
    add("output_norm.weight", (n_embd,))
    if not tied:
        add("output.weight", (n_embd, n_vocab))

    window, swa = _swa(arch, cfg, n_layer)
    frozen = tuple(tensors)
    return ModelInfo(
        name=name or str(cfg.get("_name_or_path") or config.get("_name_or_path") or model_type or arch),
        arch=arch,
        source=f"hf_config:{types.name}",
        file_type=dominant_type(frozen),
        n_layer=n_layer, n_embd=n_embd, n_ff=n_ff, n_head=n_head, n_head_kv=n_head_kv,
        head_dim_k=head_dim, head_dim_v=head_dim, n_vocab=n_vocab,
        n_ctx_train=int(cfg.get("max_position_embeddings") or 0),
        tensors=frozen,
        n_expert=n_expert, n_expert_used=n_expert_used,
        n_expert_shared=1 if n_ff_shared else 0, n_ff_expert=n_ff_expert, n_ff_shared=n_ff_shared,
        sliding_window=window, swa_layers=swa, notes=notes,
    )


def projector_from_hf_config(config: dict[str, Any], weight_type: str = "F16", name: str | None = None) -> ModelInfo:
    """The vision projector (mmproj) llama.cpp's converter writes for a Gemma 3-style vision_config.

    Raises ValueError when the config has no vision_config.
    """
    vision = config.get("vision_config")
    if not isinstance(vision, dict):
        raise ValueError("config.json has no vision_config")
    types = WeightTypes(weight_type)
    n_embd = int(_req(vision, "hidden_size"))
    n_ff = int(_req(vision, "intermediate_size"))
    n_layer = int(_req(vision, "num_hidden_layers"))
    n_head = int(_req(vision, "num_attention_heads"))
    image, patch = int(_req(vision, "image_size")), int(_req(vision, "patch_size"))
    text_embd = int(_req(_text_config(config), "hidden_size"))
    patches = (image // patch) ** 2
    tokens_out = int(config.get("mm_tokens_per_image") or patches)
    scale = max(1, round(math.sqrt(patches / max(tokens_out, 1))))
    tensors: list[TensorInfo] = []

    def add(tensor_name: str, shape: tuple[int, ...]) -> None:
        stem = tensor_name.rsplit(".", 1)[0]
        type_name = "F32" if len(shape) == 1 else (types.main if shape[0] % block_layout(types.main)[0] == 0 else "F16")
        tensors.append(TensorInfo(tensor_name, type_name, shape, tensor_bytes(type_name, math.prod(shape))))
        del stem

    add("v.patch_embd.weight", (patch, patch, 3, n_embd))
    add("v.patch_embd.bias", (n_embd,))
    add("v.position_embd.weight", (n_embd, patches))
    for i in range(n_layer):
        p = f"v.blk.{i}."
        for ln in ("ln1", "ln2"):
            add(p + ln + ".weight", (n_embd,))
            add(p + ln + ".bias", (n_embd,))
        for proj in ("attn_q", "attn_k", "attn_v", "attn_out"):
            add(p + proj + ".weight", (n_embd, n_embd))
            add(p + proj + ".bias", (n_embd,))
        add(p + "ffn_up.weight", (n_embd, n_ff))
        add(p + "ffn_up.bias", (n_ff,))
        add(p + "ffn_down.weight", (n_ff, n_embd))
        add(p + "ffn_down.bias", (n_embd,))
    add("v.post_ln.weight", (n_embd,))
    add("v.post_ln.bias", (n_embd,))
    add("mm.soft_emb_norm.weight", (n_embd,))
    add("mm.input_projection.weight", (text_embd, n_embd))
    frozen = tuple(tensors)
    return ModelInfo(
        name=name or str(config.get("_name_or_path") or "vision projector"),
        arch="clip", source=f"hf_config:{types.name}", file_type=dominant_type(frozen),
        n_layer=0, n_embd=0, n_ff=0, n_head=0, n_head_kv=0, head_dim_k=0, head_dim_v=0,
        n_vocab=0, n_ctx_train=0, tensors=frozen,
        vision=VisionInfo(projector_type="gemma3", image_size=image, patch_size=patch, n_embd=n_embd,
                          n_ff=n_ff, n_layer=n_layer, n_head=n_head, projection_dim=text_embd,
                          scale_factor=scale),
    )
