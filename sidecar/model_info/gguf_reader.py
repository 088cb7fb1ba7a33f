"""ModelInfo from a GGUF file's header: metadata and tensor infos, never the weights.

gguf-py's GGUFReader memory-maps the file; reading names, types and shapes touches only the
header pages, so inspecting a 77 GB model costs milliseconds and no RAM.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any

from gguf import GGUFReader

from sidecar.model_info.ggml_types import type_name_of
from sidecar.model_info.gguf_header import read_header
from sidecar.model_info.model import ModelInfo, TensorInfo, VisionInfo

# Architectures whose sliding-window layers follow a fixed period: in every group of `n` layers
# the last one attends globally, the others over the window (llama.cpp's set_swa_pattern).
SWA_PERIOD = {"gemma2": 2, "gemma3": 6, "cohere2": 4}


class GgufReadError(ValueError):
    """The file is not a GGUF model llama.cpp could load (bad magic, missing keys)."""


def _fields(reader: GGUFReader) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for key, f in reader.fields.items():
        if key.startswith("tokenizer.ggml.") and key not in ("tokenizer.ggml.model",):
            # Vocabulary arrays are large and the planner needs only their length.
            if key == "tokenizer.ggml.tokens":
                values["__n_tokens"] = len(f.data)
            continue
        try:
            values[key] = f.contents()
        except (ValueError, TypeError, IndexError):
            continue
    return values


def _int(value: Any, default: int = 0) -> int:
    """An integer field; per-layer arrays (some archs vary widths by layer) give their maximum."""
    if value is None:
        return default
    if isinstance(value, (list, tuple)):
        return int(max(value)) if value else default
    return int(value)


def _tensors(reader: GGUFReader) -> tuple[TensorInfo, ...]:
    return tuple(
        TensorInfo(
            name=t.name,
            ggml_type=type_name_of(t.tensor_type),
            shape=tuple(int(d) for d in t.shape),
            n_bytes=int(t.n_bytes),
        )
        for t in reader.tensors
    )


def dominant_type(tensors: tuple[TensorInfo, ...]) -> str:
    """The weight type holding the most bytes among matrices (what people call the model's quant)."""
    totals: dict[str, int] = {}
    for t in tensors:
        if t.is_matrix:
            totals[t.ggml_type] = totals.get(t.ggml_type, 0) + t.n_bytes
    return max(totals, key=totals.__getitem__) if totals else "F32"


def swa_layers(arch: str, n_layer: int, window: int, pattern: Any = None) -> tuple[int, ...]:
    """Layers using sliding-window attention: from an explicit per-layer pattern, else the arch's period."""
    if not window:
        return ()
    if isinstance(pattern, (list, tuple)) and len(pattern) == n_layer:
        return tuple(i for i, is_swa in enumerate(pattern) if is_swa)
    period = SWA_PERIOD.get(arch)
    if period is None:
        return tuple(range(n_layer))
    return tuple(i for i in range(n_layer) if i % period < period - 1)


def _shape_of(tensors: tuple[TensorInfo, ...], suffix: str, axis: int) -> int:
    for t in tensors:
        if t.name.endswith(suffix) and len(t.shape) > axis:
            return t.shape[axis]
    return 0


def _vision_info(meta: dict[str, Any]) -> VisionInfo:
    def get(key: str, default: int = 0) -> int:
        return _int(meta.get(f"clip.vision.{key}"), default)

    return VisionInfo(
        projector_type=str(meta.get("clip.projector_type", "")),
        image_size=get("image_size"),
        patch_size=get("patch_size", 1),
        n_embd=get("embedding_length"),
        n_ff=get("feed_forward_length"),
        n_layer=get("block_count"),
        n_head=get("attention.head_count", 1),
        projection_dim=get("projection_dim"),
        scale_factor=get("projector.scale_factor", 1),
    )


def model_from_gguf_fields(name: str, meta: dict[str, Any], tensors: tuple[TensorInfo, ...], source: str) -> ModelInfo:
    """Assemble ModelInfo from already-read metadata and tensor infos (pure; used by tests too)."""
    arch = str(meta.get("general.architecture", ""))
    if not arch:
        raise GgufReadError(f"{source}: no general.architecture")
    display = str(meta.get("general.name") or name)
    if arch == "clip":
        return ModelInfo(
            name=display, arch=arch, source=source, file_type=dominant_type(tensors),
            n_layer=0, n_embd=0, n_ff=0, n_head=0, n_head_kv=0, head_dim_k=0, head_dim_v=0,
            n_vocab=0, n_ctx_train=0, tensors=tensors, vision=_vision_info(meta),
        )

    def get(key: str, default: int = 0) -> int:
        return _int(meta.get(f"{arch}.{key}"), default)

    n_layer = get("block_count")
    n_embd = get("embedding_length")
    n_head = get("attention.head_count")
    if not (n_layer and n_embd and n_head):
        raise GgufReadError(f"{source}: missing block_count, embedding_length or head_count for {arch}")
    n_head_kv = get("attention.head_count_kv", n_head)
    head_dim_k = get("attention.key_length", n_embd // n_head)
    head_dim_v = get("attention.value_length", head_dim_k)
    n_expert = get("expert_count")
    n_ff_expert = get("expert_feed_forward_length") or (
        _shape_of(tensors, "ffn_up_exps.weight", 1) if n_expert else 0
    )
    n_ff_shared = _shape_of(tensors, "ffn_up_shexp.weight", 1)
    n_vocab = get("vocab_size") or _int(meta.get("__n_tokens")) or _shape_of(tensors, "token_embd.weight", 1)
    window = get("attention.sliding_window")
    return ModelInfo(
        name=display,
        arch=arch,
        source=source,
        file_type=dominant_type(tensors),
        n_layer=n_layer,
        n_embd=n_embd,
        n_ff=get("feed_forward_length"),
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim_k=head_dim_k,
        head_dim_v=head_dim_v,
        n_vocab=n_vocab,
        n_ctx_train=get("context_length"),
        tensors=tensors,
        n_expert=n_expert,
        n_expert_used=get("expert_used_count"),
        n_expert_shared=get("expert_shared_count", 1 if n_ff_shared else 0),
        n_ff_expert=n_ff_expert,
        n_ff_shared=n_ff_shared,
        sliding_window=window,
        swa_layers=swa_layers(arch, n_layer, window, meta.get(f"{arch}.attention.sliding_window_pattern")),
    )


def inspect_gguf(path: str | os.PathLike[str]) -> ModelInfo:
    """Read a GGUF model or projector file's header into a ModelInfo; tensor data is not read.

    Raises FileNotFoundError when absent and GgufReadError when the file is not a usable GGUF.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(path)
    try:
        # Milliseconds instead of seconds for a model with a large vocabulary: this is in front of
        # the daemon's first reply. Anything it does not read falls back to gguf-py's reader.
        meta, tensors = read_header(path)
    except (ValueError, OSError, IndexError, KeyError, struct.error):
        try:
            reader = GGUFReader(path, "r")
        except (ValueError, OSError, IndexError) as exc:
            raise GgufReadError(f"{path}: not a GGUF file ({exc})") from exc
        meta, tensors = _fields(reader), _tensors(reader)
    return model_from_gguf_fields(path.stem, meta, tensors, f"gguf:{path}")
