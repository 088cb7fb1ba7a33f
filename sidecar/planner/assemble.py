"""Turning the search's winner into the Schedule the executor applies: tier plans with their
runner-ups, unit placements, llama.cpp settings, notes, and the time to first token."""

from __future__ import annotations

import math

from sidecar.budget import Budget
from sidecar.model_info.model import ModelInfo
from sidecar.planner.hardware_model import GIB, HardwareModel
from sidecar.planner.options import PlanOptions
from sidecar.planner.overrides import tensor_overrides
from sidecar.planner.schedule import CPU, DECODE, GPU0, PREFILL, Schedule, TierPlan, UnitPlacement
from sidecar.planner.search import Found, prompt_passes, token_tiers


def runner_up(found: Found, index: int, chosen: str) -> tuple[str, float]:
    """The best other family for tier `index` among every candidate evaluated with the winner's
    micro-batch and KV type, and its predicted ms ("" and 0 when there is none)."""
    options: dict[str, float] = {}
    for r in found.others:
        for fam, seconds in r.family_seconds[index].items():
            options[fam] = min(options.get(fam, math.inf), seconds)
    rivals = {f: s for f, s in options.items() if f != chosen}
    if not rivals:
        return "", 0.0
    fam = min(rivals, key=rivals.__getitem__)
    return fam, rivals[fam] * 1e3


def build_schedule(model: ModelInfo, hw: HardwareModel, budget: Budget, ctx: int, options: PlanOptions,
                   found: Found, notes: list[str]) -> Schedule:
    """Turn the search's winner into the Schedule the executor applies."""
    best, inputs, ev = found.result, found.inputs, found.evaluator
    residency = best.candidate.residency
    units = inputs.units
    tiers = token_tiers(options)
    plans = []
    for i, (tier, choice) in enumerate(zip(tiers, best.choices)):
        runner, runner_ms = runner_up(found, i, choice.family)
        plans.append(TierPlan(
            max_tokens=tier.max_tokens, phase=tier.phase, placement=choice.family, threads=choice.threads,
            predicted_ms_per_pass=choice.seconds * 1e3, predicted_tokens_per_s=tier.max_tokens / choice.seconds,
            runner_up=runner, runner_up_ms=runner_ms, copy_bytes_per_pass=choice.copy_bytes,
            cpu_busy_ms=choice.cpu_busy_seconds * 1e3,
        ))
    streaming_tiers = [t for t, c in zip(tiers, best.choices) if c.copy_bytes > 0]
    op_offload = bool(streaming_tiers)
    threshold = best.threshold if op_offload else 0
    prompt = min(options.reference_prompt_tokens, ctx)
    prompt_tier = next((p for p in plans if p.phase == PREFILL and p.max_tokens >= min(prompt, options.n_batch)),
                       plans[-1])
    ttft, _, _, _ = ev.passes_cost(best.candidate, prompt_passes(prompt, inputs.n_ubatch),
                                   best.threshold, prompt_tier.threads)
    decode_plans = [p for p in plans if p.phase == DECODE]
    placements = tuple(
        UnitPlacement(
            unit=u.name, kind=u.kind, layer=u.layer, weight_bytes=u.weight_bytes,
            resident_on=GPU0 if u.name in residency.resident else CPU,
            small_tiers="gpu" if u.name in residency.resident else "cpu",
            large_tiers="gpu" if u.name in residency.resident else (
                "streamed" if op_offload and u.kind != "embedding" else "cpu"),
        )
        for u in units
    )
    if 0 < len(residency.kv_layers) < model.n_layer:
        notes.append(f"KV cache of {len(residency.kv_layers)} of {model.n_layer} layers in VRAM, the rest in RAM")
    if op_offload:
        notes.append(f"op offload from {threshold} tokens: set GGML_OP_OFFLOAD_MIN_BATCH={threshold} before "
                     "the GPU backend loads (read once per process)")
    host_bytes = sum(u.weight_bytes for u in units if u.name not in residency.resident)
    if host_bytes > hw.cpu.ram_bytes:
        notes.append(f"host-resident weights ({host_bytes / GIB:.1f} GiB) exceed RAM: pages will be "
                     "read from disk (mmap), far slower than predicted")
    notes += list(model.notes)
    return Schedule(
        model=model.name, hardware=hw.name, budget_bytes=budget.vram_bytes, max_cpu_threads=budget.max_cpu_threads,
        ctx=ctx, tiers=tuple(plans), units=placements, residency=best.candidate.label,
        tensor_overrides=tensor_overrides(model, units, residency), n_gpu_layers=residency.n_gpu_layers,
        op_offload=op_offload, op_offload_min_batch=threshold,
        threads_decode=(decode_plans[0] if decode_plans else plans[0]).threads,
        # llama.cpp uses n_threads_batch for every pass of more than one token (batched decode
        # too): the most any such tier wants. Each tier's own count is in its TierPlan, for an
        # executor that sets threads per pass.
        threads_prefill=max((p.threads for p in plans if p.max_tokens > 1), default=plans[0].threads),
        micro_batch=inputs.n_ubatch, n_batch=max(options.n_batch, inputs.n_ubatch),
        n_outputs_max=inputs.n_outputs_max, kv_type=inputs.kv_type, kv_on_gpu=bool(residency.kv_layers),
        flash_attention=inputs.flash_attention, kv_unified=False, vram_bytes_by_component=residency.vram,
        predicted_ttft_ms=ttft * 1e3, reference_prompt_tokens=prompt, notes=tuple(notes),
    )
