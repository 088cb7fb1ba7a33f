"""A real-text mixture-of-experts model built from SmolLM2-135M-Instruct.

No installable package ships a small MoE, but one can be made from a dense model: every expert
is a copy of the layer's dense FFN. Quantization is row-wise, so the quantized bytes of one FFN
stacked n times are a valid 3-D expert tensor of the same type.

llama.cpp's llama-arch MoE takes a softmax over the router logits, keeps the top k and divides
the kept weights by their sum, so with identical experts the mixture is the dense FFN times
(w1 + ... + wk), which is 1 only up to a rounding error. That error is tiny, but the next matmul
re-quantizes activations to 8 bits, and a 1-ulp change can flip a rounding step; over 30 layers
the logits then move by up to about 1, enough to change a greedy pick where the top two tokens
are close. Hence two router styles:

- "grouped" (default): experts come in groups of k that share one router row, so every token
  picks a whole group with exactly equal weights (1 or 1/2 for k = 1 or 2, exact in binary).
  Routing still varies per token and per layer across n_expert / k groups. For a quantized
  source such as SmolLM2's Q4_1, where the CPU runs dense and expert matmuls through the same
  dot-product kernel, the logits are then bit-identical to the dense model's. (For f32/f16
  sources the dense matmul may take a different GEMM, so they agree only to rounding.)
- "independent": every expert has its own random row, like a trained MoE. The text stays
  coherent but drifts from the dense model's after a dozen or so greedy tokens.
"""

from __future__ import annotations

import os
import re
from functools import partial
from pathlib import Path
from typing import Literal

import numpy as np
from gguf import MODEL_TENSOR, GGUFReader, GGUFValueType, GGUFWriter, ReaderField, ReaderTensor

from sidecar.model_info.default_model import smollm2_path
from sidecar.errors import ModelLoadError

from .gguf_out import PlannedTensor, tensor_name, write_gguf
from .weights import random_matrix


RouterStyle = Literal["grouped", "independent"]

_DENSE_FFN = re.compile(r"^blk\.(\d+)\.ffn_(gate|up|down)\.weight$")
_EXPERT_KIND = {"gate": MODEL_TENSOR.FFN_GATE_EXP, "up": MODEL_TENSOR.FFN_UP_EXP,
                "down": MODEL_TENSOR.FFN_DOWN_EXP}


def smollm2_source_path() -> Path:
    """Path of the SmolLM2-135M-Instruct gguf the MoE is made from (not whatever the default model
    becomes). Raises FileNotFoundError when the package or file is missing."""
    try:
        return smollm2_path()
    except ModelLoadError as e:
        raise FileNotFoundError(str(e)) from e


def _raw_value(field: ReaderField):
    """A metadata value as the writer takes it, strings kept as the original bytes."""
    main = field.types[0]
    if main == GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]])
    if main == GGUFValueType.ARRAY and field.types[-1] == GGUFValueType.STRING:
        return [bytes(field.parts[i]) for i in field.data]
    return field.contents()


def _copy_metadata(reader: GGUFReader, n_expert: int, n_expert_used: int, writer: GGUFWriter) -> None:
    for key, field in reader.fields.items():
        # GGUF.* are the reader's view of the file header; the writer makes its own, and it
        # has already written general.architecture.
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        if key == "general.alignment":
            writer.add_custom_alignment(int(field.contents()))
            continue
        sub_type = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(key, _raw_value(field), field.types[0], sub_type)
    writer.add_expert_count(n_expert)
    writer.add_expert_used_count(n_expert_used)


def _raw_bytes(tensor: ReaderTensor) -> np.ndarray:
    """The tensor's stored bytes, shaped (rows..., bytes per row)."""
    data = tensor.data
    if data.dtype != np.uint8:
        data = data.view(np.uint8).reshape(*data.shape[:-1], -1)
    return data


def _copied(tensor: ReaderTensor) -> PlannedTensor:
    data = _raw_bytes(tensor)
    return PlannedTensor(tensor.name, data.shape, np.dtype(np.uint8), lambda: data,
                         raw_dtype=tensor.tensor_type)


def _experts(tensor: ReaderTensor, kind: str, layer: int, n_expert: int) -> PlannedTensor:
    data = _raw_bytes(tensor)
    return PlannedTensor(
        tensor_name(_EXPERT_KIND[kind], layer), (n_expert, *data.shape), np.dtype(np.uint8),
        lambda: np.stack([data] * n_expert), raw_dtype=tensor.tensor_type,
    )


def _router_weights(seed: int, name: str, n_expert: int, group: int, n_embd: int) -> np.ndarray:
    rows = random_matrix(seed, name, (n_expert // group, n_embd), np.dtype(np.float32))
    return np.repeat(rows, group, axis=0)


def _router(seed: int, layer: int, n_expert: int, group: int, n_embd: int) -> PlannedTensor:
    name = tensor_name(MODEL_TENSOR.FFN_GATE_INP, layer)
    return PlannedTensor(name, (n_expert, n_embd), np.dtype(np.float32),
                         partial(_router_weights, seed, name, n_expert, group, n_embd))


def write_smollm2_moe(
    path: str | os.PathLike[str],
    *,
    n_expert: int = 4,
    n_expert_used: int = 2,
    seed: int = 0,
    source: str | os.PathLike[str] | None = None,
    router: RouterStyle = "grouped",
) -> Path:
    """Write SmolLM2 (or another dense llama-arch gguf, `source`) as an MoE; return the path.

    Every tensor and metadata key is copied; each layer's ffn_gate/ffn_up/ffn_down becomes
    ffn_{gate,up,down}_exps holding `n_expert` copies of the original bytes (same quantization
    type), plus a random f32 router `ffn_gate_inp`; `{arch}.expert_count` / `expert_used_count`
    are set. With `router="grouped"` (needs n_expert divisible by n_expert_used),
    n_expert_used of 1 or 2 and a quantized source (SmolLM2 is Q4_1), logits are
    bit-identical to the dense model's; otherwise they match up to rounding (see the module
    docstring). About 250 MB and 2-3 s for SmolLM2 with 4 experts. Raises ValueError for a
    source that is already an MoE or has no dense FFN. Same inputs give a byte-identical file.
    """
    if not 0 < n_expert_used <= n_expert:
        raise ValueError("need 0 < n_expert_used <= n_expert")
    if router == "grouped":
        if n_expert % n_expert_used:
            raise ValueError("a grouped router needs n_expert divisible by n_expert_used")
        group = n_expert_used
    elif router == "independent":
        group = 1
    else:
        raise ValueError(f"router must be 'grouped' or 'independent', got {router!r}")

    source = Path(source) if source is not None else smollm2_source_path()
    reader = GGUFReader(source)
    arch = str(reader.fields["general.architecture"].contents())
    n_embd = int(reader.fields[f"{arch}.embedding_length"].contents())

    if f"{arch}.expert_count" in reader.fields:
        raise ValueError(f"{source} is already a mixture of experts")

    plan: list[PlannedTensor] = []
    routed: set[int] = set()
    converted = 0
    for tensor in reader.tensors:
        match = _DENSE_FFN.match(tensor.name)
        if match is None:
            plan.append(_copied(tensor))
            continue
        layer, kind = int(match.group(1)), match.group(2)
        if layer not in routed:
            plan.append(_router(seed, layer, n_expert, group, n_embd))
            routed.add(layer)
        plan.append(_experts(tensor, kind, layer, n_expert))
        converted += 1
    if not converted:
        raise ValueError(f"{source}: no dense ffn_gate/ffn_up/ffn_down tensors to convert")
    return write_gguf(path, arch, partial(_copy_metadata, reader, n_expert, n_expert_used), plan)
