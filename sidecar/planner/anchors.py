"""The anchors to beat: what llama.cpp itself would place on the same budget, and its speed.

  -ngl N   N whole layers on the GPU (the output first, then layers from the last backwards),
           the best N that fits, as a user tuning by hand would find it.
  --fit    llama.cpp's automatic fit (common/fit.cpp), emulated: aim to leave a free margin
           (1 GiB by default) on the device; if everything fits, everything goes; else with the
           context fixed by the user, fill layers from the back; for a mixture of experts, first
           every layer's dense part (experts on the CPU), then whole layers from the back.
           (The real one also tries a partial extra layer; not emulated.)

Both run with llama.cpp's defaults: n_ubatch 512, n_batch 2048, F16 cache, flash attention on
a GPU, op offload from 32 tokens, and the physical core count of threads for every pass (held
under the game's cap). Their times come from the same cost model as ours.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sidecar.budget import Budget
from sidecar.model_info.model import ModelInfo
from sidecar.model_info.units import MOE_EXPERTS, OUTPUT, sub_layers
from sidecar.planner.budget_fill import FillInputs, Residency, make_residency, no_residency, whole_layers_residency
from sidecar.planner.candidates import NEVER, Candidate
from sidecar.planner.hardware_model import HardwareModel
from sidecar.planner.options import PlanOptions
from sidecar.planner.overrides import tensor_overrides
from sidecar.planner.search import Evaluator, TokenTier, token_tiers

LLAMA_UBATCH = 512
LLAMA_BATCH = 2048
LLAMA_OFFLOAD_MIN_BATCH = 32
FIT_MARGIN_BYTES = 1 << 30


@dataclass(frozen=True)
class AnchorTier:
    """One tier's predicted time under an anchor."""

    max_tokens: int
    phase: str
    predicted_ms_per_pass: float
    predicted_tokens_per_s: float


@dataclass(frozen=True)
class Anchor:
    """An anchor configuration and its predicted speed per tier."""

    name: str
    description: str
    n_gpu_layers: int
    tensor_overrides: tuple[tuple[str, str], ...]
    vram_bytes: int
    threads: int
    tiers: tuple[AnchorTier, ...]

    def objective(self) -> float:
        """Geometric mean tokens/s over the tiers (comparable with Schedule.objective)."""
        rates = [t.predicted_tokens_per_s for t in self.tiers if t.predicted_tokens_per_s > 0]
        return math.exp(sum(math.log(r) for r in rates) / len(rates)) if rates else 0.0


def llama_threads(hw: HardwareModel, cap: int) -> int:
    """llama.cpp's default thread count (physical cores), held under the game's cap."""
    return max(1, min(hw.cpu.physical_cores, cap) if cap > 0 else hw.cpu.physical_cores)


def _evaluate(name: str, description: str, residency: Residency, model: ModelInfo, hw: HardwareModel,
              tiers: tuple[TokenTier, ...], ev: Evaluator, threads: int, decode_context: int) -> Anchor:
    offload = residency.streaming
    candidate = Candidate(residency, offload)
    threshold = LLAMA_OFFLOAD_MIN_BATCH if offload else NEVER
    planned = []
    for tier in tiers:
        c = ev.tier_choice(candidate, tier, LLAMA_UBATCH, decode_context, threshold, threads)
        planned.append(AnchorTier(tier.max_tokens, tier.phase, c.seconds * 1e3, tier.max_tokens / c.seconds))
    return Anchor(name, description, residency.n_gpu_layers, tensor_overrides(model, ev.units, residency),
                  residency.vram_bytes, threads, tuple(planned))


def _fit_residency(inputs: FillInputs, target: int) -> Residency:
    model, units = inputs.model, inputs.units
    full = whole_layers_residency(inputs, model.n_layer + 1, streaming=False)
    if full.vram_bytes <= target:
        return full

    def best_n(build) -> int:
        n = 0
        for k in range(model.n_layer + 2):
            if build(k).vram_bytes > target:
                break
            n = k
        return n

    if not model.is_moe:
        return whole_layers_residency(inputs, best_n(lambda k: whole_layers_residency(inputs, k)))

    def dense_only(k: int, full_layers: int = 0) -> Residency:
        first = model.n_layer + 1 - k
        resident = {u.name for u in units if (u.kind == OUTPUT and k >= 1) or (
            u.layer is not None and u.layer >= first and (u.kind != MOE_EXPERTS or u.layer >= model.n_layer - full_layers))}
        kv = {i for i in range(first, model.n_layer)}
        return make_residency(inputs, f"--fit {k} layers", resident, kv, True, n_gpu_layers=k)

    k = best_n(dense_only)
    if k < model.n_layer + 1:
        return dense_only(k)
    f = 0
    for j in range(model.n_layer + 1):
        if dense_only(k, j).vram_bytes > target:
            break
        f = j
    return dense_only(k, f)


def anchors(model: ModelInfo, hw: HardwareModel, budget: Budget, ctx: int = 4096,
            options: PlanOptions = PlanOptions(), fit_margin: int = FIT_MARGIN_BYTES) -> tuple[Anchor, ...]:
    """The best whole-layer `-ngl` and the `--fit` emulation on this budget, with predicted times.

    Tiers are the ones `options` plans for. With no GPU or a budget too small for any GPU use,
    both anchors are CPU only.
    """
    units = sub_layers(model)
    tiers = token_tiers(options)
    threads = llama_threads(hw, budget.max_cpu_threads)
    decode_context = min(ctx, options.reference_context if options.reference_context is not None
                         else options.reference_prompt_tokens)
    has_gpu = hw.has_gpu
    gpu_budget = min(budget.vram_bytes, hw.gpu.vram_bytes) if has_gpu and hw.gpu else 0
    inputs = FillInputs(model, units, ctx, "F16", LLAMA_UBATCH, LLAMA_BATCH, has_gpu)
    ev = Evaluator(model, hw, units, options, "F16", (threads,))

    cpu = no_residency(inputs)
    best: Anchor | None = None
    if gpu_budget > 0:
        for n in range(model.n_layer + 2):
            residency = whole_layers_residency(inputs, n, streaming=n < model.n_layer + 1)
            if residency.vram_bytes > gpu_budget:
                continue
            anchor = _evaluate(f"-ngl {n}", f"{n} whole layers on the GPU (best that fits)", residency,
                               model, hw, tiers, ev, threads, decode_context)
            if best is None or anchor.objective() > best.objective():
                best = anchor
    if best is None:
        best = _evaluate("-ngl 0", "CPU only (no GPU plan fits)", cpu, model, hw, tiers, ev, threads, decode_context)

    target = gpu_budget - fit_margin
    if gpu_budget <= 0 or target <= 0:
        fit = _evaluate("--fit", f"CPU only (budget under the {fit_margin >> 20} MiB margin)", cpu, model, hw,
                        tiers, ev, threads, decode_context)
    else:
        residency = _fit_residency(inputs, target)
        if residency.vram_bytes > target:
            residency = cpu
        fit = _evaluate("--fit", f"{residency.label or 'fit'}: n_gpu_layers {residency.n_gpu_layers}, "
                        f"{fit_margin >> 20} MiB kept free", residency, model, hw, tiers, ev, threads, decode_context)
    return (best, fit)
