"""Filling a VRAM budget in the method's order, and the fixed residencies plans compare against.

Order (method.md, "Plan"): attention with its KV cache for every layer first (from the last
layer back, as llama.cpp assigns layers to the GPU), then the FFN norms, routers and shared
experts (small, and read by every token), then the output projection, then as many whole
layers' remaining FFN weights as still fit, found by binary search. Every step counts the
compute scratch the placement needs, and the stream slot when host weights may stream in.
"""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.model_info.model import ModelInfo
from sidecar.model_info.units import ATTENTION, EMBEDDING, MOE_ROUTER, MOE_SHARED, NORM, OUTPUT, SubLayer
from sidecar.planner.vram import total_vram, vram_by_component


@dataclass(frozen=True)
class FillInputs:
    """What every residency of one plan shares: model, units, context and micro-batch settings."""

    model: ModelInfo
    units: tuple[SubLayer, ...]
    ctx: int
    kv_type: str
    n_ubatch: int
    n_outputs_max: int
    flash_attention: bool
    n_seq: int = 1


@dataclass(frozen=True)
class Residency:
    """Which units' weights live in VRAM (a load-time decision), which layers' KV cache does,
    and the n_gpu_layers llama.cpp needs for it (layers at or above n_layer + 1 - n are
    GPU layers; the output counts as the first)."""

    label: str
    resident: frozenset[str]
    kv_layers: frozenset[int]
    n_gpu_layers: int
    streaming: bool
    vram: tuple[tuple[str, int], ...]

    @property
    def vram_bytes(self) -> int:
        return total_vram(self.vram)

    @property
    def uses_gpu(self) -> bool:
        return bool(self.resident or self.kv_layers or self.streaming)


def _n_gpu_layers(model: ModelInfo, kv_layers: frozenset[int]) -> int:
    if not kv_layers:
        return 0
    first = min(kv_layers)
    # GPU layers are a suffix: the first one and everything after it, plus the output slot.
    return model.n_layer - first + 1


def make_residency(inputs: FillInputs, label: str, resident: set[str] | frozenset[str],
                   kv_layers: set[int] | frozenset[int], streaming: bool, n_gpu_layers: int | None = None) -> Residency:
    """A Residency with its VRAM by component computed (n_gpu_layers derived from the KV layers
    unless given)."""
    resident, kv_layers = frozenset(resident), frozenset(kv_layers)
    vram = vram_by_component(inputs.model, inputs.units, resident, kv_layers, inputs.ctx, inputs.kv_type,
                             inputs.n_ubatch, inputs.n_outputs_max, inputs.flash_attention, streaming, inputs.n_seq)
    ngl = _n_gpu_layers(inputs.model, kv_layers) if n_gpu_layers is None else n_gpu_layers
    return Residency(label, resident, kv_layers, ngl, streaming, vram)


def no_residency(inputs: FillInputs, streaming: bool = False) -> Residency:
    """Nothing in VRAM (CPU only, or pure streaming when `streaming`)."""
    return make_residency(inputs, "none", set(), set(), streaming)


def full_residency(inputs: FillInputs) -> Residency:
    """Every unit in VRAM (the token embedding stays on the host, as llama.cpp keeps it)."""
    resident = {u.name for u in inputs.units if u.kind != EMBEDDING}
    return make_residency(inputs, "full", resident, set(range(inputs.model.n_layer)), False)


def whole_layers_residency(inputs: FillInputs, n_gpu_layers: int, streaming: bool = True) -> Residency:
    """What llama.cpp's `-ngl N` places: the output, then the last N - 1 layers whole."""
    model = inputs.model
    n = max(0, min(n_gpu_layers, model.n_layer + 1))
    first = model.n_layer + 1 - n
    resident = {u.name for u in inputs.units
                if (u.layer is not None and u.layer >= first) or (u.kind == OUTPUT and n >= 1)}
    kv = {i for i in range(model.n_layer) if i >= first}
    return make_residency(inputs, f"-ngl {n}", resident, kv, streaming, n_gpu_layers=n)


def fill_attention_first(inputs: FillInputs, budget: int, streaming: bool) -> Residency | None:
    """The method's fill within `budget` bytes; None when not even one layer's attention fits."""
    model, units = inputs.model, inputs.units
    resident: set[str] = set()
    kv: set[int] = set()

    def fits(extra: set[str], extra_kv: frozenset[int] = frozenset()) -> bool:
        r = make_residency(inputs, "", resident | extra, kv | extra_kv, streaming)
        return r.vram_bytes <= budget

    attention = sorted((u for u in units if u.kind == ATTENTION), key=lambda u: -(u.layer or 0))
    for u in attention:
        if not fits({u.name}, frozenset({u.layer})):  # type: ignore[arg-type]
            break
        resident.add(u.name)
        kv.add(u.layer)  # type: ignore[arg-type]
    if not resident:
        return None
    if len(kv) < model.n_layer:
        return make_residency(inputs, f"attention {len(kv)}/{model.n_layer} layers", resident, kv, streaming)

    small = [u for u in units if u.kind in (NORM, MOE_ROUTER, MOE_SHARED)]
    if fits({u.name for u in small}):
        resident |= {u.name for u in small}
    else:
        for u in sorted(small, key=lambda u: -(u.layer or 0)):
            if fits({u.name}):
                resident.add(u.name)
        return make_residency(inputs, "attention + some norms/routers", resident, kv, streaming)

    output = [u for u in units if u.kind == OUTPUT]
    if output and fits({output[0].name}):
        resident.add(output[0].name)

    rest_by_layer = {i: {u.name for u in units if u.layer == i and u.name not in resident}
                     for i in range(model.n_layer)}

    def layers_from_back(k: int) -> set[str]:
        return set().union(*(rest_by_layer[i] for i in range(model.n_layer - k, model.n_layer))) if k else set()

    lo, hi = 0, model.n_layer  # lo always fits; find the largest k that does
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(layers_from_back(mid)):
            lo = mid
        else:
            hi = mid - 1
    resident |= layers_from_back(lo)
    label = "attention first" + (f" + {lo} whole layers" if lo else "")
    return make_residency(inputs, label, resident, kv, streaming)
