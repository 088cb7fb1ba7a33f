"""Sub-layer units: the pieces the planner places separately, with their per-token cost.

Per layer: attention (its norm, Q/K/V/output and Q/K norms), the dense FFN (norm, gate/up/down)
or, for a mixture of experts, the FFN norm, the router, the shared experts and the routed
experts as four units. Outside the layers: the token embedding and the output (final norm and
projection, which reuses the embedding matrix when the weights are tied).

Per-token figures count matrix products only (2 FLOPs per weight used); attention over the KV
cache depends on the context and is costed by the cost model from `sidecar.model_info.kv`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sidecar.model_info.model import ModelInfo, TensorInfo

ATTENTION = "attention"
FFN = "ffn"
MOE_ROUTER = "moe_router"
MOE_SHARED = "moe_shared"
MOE_EXPERTS = "moe_experts"
EMBEDDING = "embedding"
OUTPUT = "output"
NORM = "norm"
KINDS = (ATTENTION, FFN, MOE_ROUTER, MOE_SHARED, MOE_EXPERTS, EMBEDDING, OUTPUT, NORM)

# Name stems inside `blk.N.` (text) or `v.blk.N.` (vision), without `.weight` / `.bias`.
_STEM_KIND = (
    (re.compile(r"^ffn_(gate|up|down|gate_up)_(ch)?exps$"), MOE_EXPERTS),
    (re.compile(r"^(ffn_gate_inp|exp_probs_b)$"), MOE_ROUTER),
    (re.compile(r"^ffn_(gate|up|down|gate_inp)_shexp$"), MOE_SHARED),
    (re.compile(r"^(ffn_norm|post_ffw_norm|ffn_post_norm|ln2)$"), NORM),  # regrouped for dense layers
    (re.compile(r"^ffn_(gate|up|down)$"), FFN),
)


def experts_touched(n_expert: int, n_expert_used: int, tokens: int) -> float:
    """Expected distinct experts a pass of `tokens` tokens touches with a uniform router.

    Each token picks k of E experts, so an expert is missed by one token with probability
    1 - k/E and by all of them with (1 - k/E)^T.
    """
    if n_expert <= 0:
        return 0.0
    k = min(max(n_expert_used, 1), n_expert)
    return n_expert * (1.0 - (1.0 - k / n_expert) ** max(tokens, 0))


@dataclass(frozen=True)
class SubLayer:
    """One placeable unit.

    weight_bytes: what it occupies wherever it lives.
    weight_type: the type holding most of its matrix bytes.
    bytes_per_token / flops_per_token: weights read and matrix FLOPs for a single token
    (routed experts: only the `n_expert_used` a token picks).
    tied: the output unit reuses `token_embd.weight` (llama.cpp loads a second copy where
    the output lives).
    """

    name: str
    kind: str
    layer: int | None
    tensors: tuple[str, ...]
    weight_bytes: int
    weight_type: str
    bytes_per_token: float
    flops_per_token: float
    n_expert: int = 0
    n_expert_used: int = 0
    tied: bool = False
    # Its biggest tensor: what a streamed copy of it holds in VRAM at once (vram.py).
    largest_tensor_bytes: int = 0

    def experts_touched(self, tokens: int) -> float:
        """Expected distinct experts a pass of `tokens` tokens reads (0 for other units)."""
        return experts_touched(self.n_expert, self.n_expert_used, tokens) if self.kind == MOE_EXPERTS else 0.0

    def bytes_read(self, tokens: int) -> float:
        """Weight bytes a pass of `tokens` tokens reads once (batching shares the read).

        The embedding reads one row per token; routed experts the experts touched; everything
        else its whole weights.
        """
        if tokens <= 0:
            return 0.0
        if self.kind == EMBEDDING:
            return min(self.weight_bytes, self.bytes_per_token * tokens)
        if self.kind == MOE_EXPERTS:
            return self.weight_bytes * self.experts_touched(tokens) / self.n_expert
        return float(self.weight_bytes)

    def flops(self, tokens: int) -> float:
        """Matrix-product FLOPs for `tokens` tokens."""
        return self.flops_per_token * max(tokens, 0)

    def tokens_per_expert(self, tokens: int) -> float:
        """Tokens each touched expert multiplies on average: the batch its kernel really sees."""
        touched = self.experts_touched(tokens)
        return tokens * self.n_expert_used / touched if touched else float(tokens)


def _stem(tensor: TensorInfo) -> str:
    name = tensor.name
    name = re.sub(r"^(v\.)?blk\.\d+\.", "", name)
    return re.sub(r"\.(weight|bias|scale)$", "", name)


def layer_kind(stem: str, moe_layer: bool) -> str:
    """The unit a tensor stem inside a block belongs to; unknown stems stay with attention."""
    for pattern, kind in _STEM_KIND:
        if pattern.match(stem):
            if kind == NORM and not moe_layer:
                return FFN
            return kind
    if stem.startswith(("ffn_", "mlp")) and not moe_layer:
        return FFN
    return ATTENTION


def _global_kind(tensor: TensorInfo) -> str:
    name = tensor.name
    if name.startswith(("output", "mm.", "v.post_ln", "mm_")):
        return OUTPUT
    return EMBEDDING


def _dominant_type(tensors: list[TensorInfo]) -> str:
    matrices = [t for t in tensors if t.is_matrix] or tensors
    totals: dict[str, int] = {}
    for t in matrices:
        totals[t.ggml_type] = totals.get(t.ggml_type, 0) + t.n_bytes
    return max(totals, key=totals.__getitem__)


def _unit(name: str, kind: str, layer: int | None, tensors: list[TensorInfo], model: ModelInfo,
          tied: bool = False) -> SubLayer:
    weight_bytes = sum(t.n_bytes for t in tensors)
    largest = max((t.n_bytes for t in tensors), default=0)
    matrix_bytes = sum(t.n_bytes for t in tensors if t.is_matrix)
    matrix_params = sum(t.n_elements for t in tensors if t.is_matrix)
    if kind == EMBEDDING:
        # A lookup: one row of the embedding matrix per token, no multiply.
        rows = max((t.shape[1] for t in tensors if t.is_matrix), default=1)
        return SubLayer(name, kind, layer, tuple(t.name for t in tensors), weight_bytes,
                        _dominant_type(tensors), matrix_bytes / max(rows, 1), 0.0, largest_tensor_bytes=largest)
    if kind == MOE_EXPERTS:
        per_expert = model.n_expert_used / max(model.n_expert, 1)
        return SubLayer(name, kind, layer, tuple(t.name for t in tensors), weight_bytes,
                        _dominant_type(tensors), matrix_bytes * per_expert,
                        2.0 * matrix_params * per_expert, model.n_expert, model.n_expert_used,
                        largest_tensor_bytes=largest)
    small = weight_bytes - matrix_bytes  # norms and biases, read once per pass
    return SubLayer(name, kind, layer, tuple(t.name for t in tensors), weight_bytes,
                    _dominant_type(tensors), float(matrix_bytes + small), 2.0 * matrix_params, tied=tied,
                    largest_tensor_bytes=largest)


def sub_layers(model: ModelInfo) -> tuple[SubLayer, ...]:
    """The model's units in execution order: embedding, then per layer attention, norm, router,
    shared experts, routed experts (or the dense FFN), then the output.

    Every tensor belongs to exactly one unit, except a tied output, which names the embedding
    matrix again because llama.cpp keeps a second copy of it where the output runs.
    """
    per_layer: dict[int, dict[str, list[TensorInfo]]] = {}
    outside: dict[str, list[TensorInfo]] = {EMBEDDING: [], OUTPUT: []}
    moe_layers = {t.layer for t in model.tensors if t.layer is not None and "exps" in t.name}
    for t in model.tensors:
        if t.layer is None:
            outside[_global_kind(t)].append(t)
            continue
        kind = layer_kind(_stem(t), t.layer in moe_layers)
        per_layer.setdefault(t.layer, {}).setdefault(kind, []).append(t)

    prefix = "v.blk" if model.is_projector else "blk"
    units: list[SubLayer] = []
    if outside[EMBEDDING]:
        units.append(_unit("token_embd" if not model.is_projector else "v.embd", EMBEDDING, None,
                           outside[EMBEDDING], model))
    for layer in sorted(per_layer):
        groups = per_layer[layer]
        for kind in (ATTENTION, NORM, MOE_ROUTER, MOE_SHARED, MOE_EXPERTS, FFN):
            if groups.get(kind):
                units.append(_unit(f"{prefix}.{layer}.{kind}", kind, layer, groups[kind], model))
    output = list(outside[OUTPUT])
    tied = False
    if not model.is_projector and not model.has_output_tensor:
        embd = model.tensor("token_embd.weight")
        if embd is not None:
            output.append(embd)
            tied = True
    if output:
        units.append(_unit("output", OUTPUT, None, output, model, tied=tied))
    return tuple(units)
