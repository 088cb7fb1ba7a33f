"""Plan search: per token tier, the best family, threads and op-offload threshold; per schedule,
the best residency, micro-batch and KV type, all by predicted time.

For every micro-batch (and KV type) the candidates of `candidates.py` are evaluated. A
candidate that may stream picks the op-offload threshold that maximises its objective: tiers
below it run host weights on the CPU, tiers at or above it stream them (llama.cpp switches per
op by batch size, so the streaming tiers are always the larger ones). Each tier takes the
fewest threads within `thread_slack` of its fastest. The objective is the geometric mean of
the tiers' tokens/s, so a 2x gain at any tier counts the same.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field

from sidecar.model_info.model import ModelInfo
from sidecar.model_info.units import SubLayer, sub_layers
from sidecar.planner.budget_fill import FillInputs, Residency
from sidecar.planner.candidates import NEVER, Candidate, candidates, execution, family
from sidecar.planner.cost_model import FiguresMemo, PassCost, PassShape, pass_cost
from sidecar.planner.hardware_model import HardwareModel
from sidecar.planner.options import PlanOptions
from sidecar.planner.schedule import DECODE, PREFILL


@dataclass(frozen=True)
class TokenTier:
    """A tier: passes of up to `max_tokens` new tokens in `phase` ("decode" or "prefill")."""

    max_tokens: int
    phase: str


@dataclass(frozen=True)
class TierChoice:
    """The best way found to run one tier under one candidate."""

    family: str
    threads: int
    seconds: float
    copy_bytes: float
    cpu_busy_seconds: float


@dataclass(frozen=True)
class CandidateResult:
    """A candidate evaluated: its threshold, per-tier choices and objective, plus for each tier
    the best time of each family it can offer (for runner-ups)."""

    candidate: Candidate
    threshold: int
    choices: tuple[TierChoice, ...]
    objective: float
    family_seconds: tuple[dict[str, float], ...]


def token_tiers(options: PlanOptions) -> tuple[TokenTier, ...]:
    """Decode tiers then prefill tiers, each ascending."""
    decode = tuple(TokenTier(t, DECODE) for t in sorted(set(options.decode_tiers)))
    return decode + tuple(TokenTier(t, PREFILL) for t in options.prefill())


def thread_options(hw: HardwareModel, cap: int) -> tuple[int, ...]:
    """Thread counts worth trying: 1, powers of two, the physical and logical core counts,
    and the cap itself, never above the cap (0 = no cap: the logical core count)."""
    limit = cap if cap > 0 else hw.cpu.logical_cores
    limit = max(1, min(limit, hw.cpu.logical_cores))
    counts = {1, limit, min(hw.cpu.physical_cores, limit)}
    t = 2
    while t < limit:
        counts.add(t)
        t *= 2
    return tuple(sorted(counts))


def tier_passes(tier: TokenTier, n_ubatch: int, decode_context: int) -> tuple[PassShape, ...]:
    """The micro-batch passes one pass of the tier is made of."""
    if tier.phase == DECODE:
        return (PassShape.decode(tier.max_tokens, decode_context),)
    return prompt_passes(tier.max_tokens, n_ubatch)


def prompt_passes(tokens: int, n_ubatch: int, offset: int = 0) -> tuple[PassShape, ...]:
    """A prompt of `tokens` tokens fed in micro-batches from `offset`; the last wants logits."""
    shapes = []
    for start in range(0, tokens, n_ubatch):
        n = min(n_ubatch, tokens - start)
        shapes.append(PassShape.prefill(n, offset + start, last=start + n >= tokens))
    return tuple(shapes)


def pass_tokens(tier: TokenTier, n_ubatch: int) -> int:
    """Tokens in the tier's largest micro-batch: what op offload compares with its threshold."""
    return tier.max_tokens if tier.phase == DECODE else min(tier.max_tokens, n_ubatch)


def fewest_threads(times: dict[int, float], slack: float) -> int:
    """The fewest threads whose time is within `slack` of the fastest."""
    best = min(times.values())
    return min(t for t, s in times.items() if s <= best * (1.0 + slack))


class Evaluator:
    """Predicts tier times for one model on one machine, memoising passes (not pure: a cache
    around the pure cost model, alive for one search, or across plans in a PlanMemo). `threads`,
    the counts a tier may choose from, is the one thing a search sets: every cache is keyed by
    the count it priced."""

    def __init__(self, model: ModelInfo, hw: HardwareModel, units: tuple[SubLayer, ...], options: PlanOptions,
                 kv_type: str, threads: tuple[int, ...]) -> None:
        self.model, self.hw, self.units, self.options = model, hw, units, options
        self.kv_type, self.threads = kv_type, threads
        self._figures = FiguresMemo()
        self._passes: dict[tuple, PassCost] = {}
        self._where: dict[tuple[Residency, bool, bool], tuple[str, ...]] = {}

    @property
    def placements_kept(self) -> int:
        return len(self._passes)

    def forget_placements(self) -> None:
        """Drop the priced placements (each new budget adds its own); the pass figures, one per
        pass shape whatever the budget, stay."""
        self._passes.clear()
        self._where.clear()

    def passes_cost(self, candidate: Candidate, shapes: tuple[PassShape, ...], threshold: int,
                    threads: int) -> tuple[float, float, float, bool]:
        """(seconds, copy bytes, CPU seconds busy during copies, streamed at all) of a sequence of passes."""
        residency = candidate.residency
        total = copy = busy = 0.0
        streamed = False
        for shape in shapes:
            # Where units run depends only on which of the pass's op sizes reach the threshold. The
            # residency (frozen) is its own key: equal residencies place units alike.
            where_key = (residency, shape.tokens >= threshold, shape.n_outputs >= threshold)
            where = self._where.get(where_key)
            if where is None:
                where = self._where[where_key] = execution(self.units, residency, shape, threshold)
            key = (where, residency.kv_layers, shape, threads)
            cost: PassCost | None = self._passes.get(key)
            if cost is None:
                cost = pass_cost(self.hw, self.model, self.units, where, residency.kv_layers, shape, threads,
                                 self.kv_type, self.options.executor, self._figures)
                self._passes[key] = cost
            total += cost.seconds
            copy += cost.copy_bytes
            busy += cost.cpu_busy_seconds
            streamed = streamed or cost.copy_bytes > 0
        return total, copy, busy, streamed

    def tier_choice(self, candidate: Candidate, tier: TokenTier, n_ubatch: int, decode_context: int,
                    threshold: int, threads: int | None = None) -> TierChoice:
        """The tier under this candidate and threshold: with `threads`, or the best thread count."""
        shapes = tier_passes(tier, n_ubatch, decode_context)
        counts = self.threads if threads is None else (threads,)
        results = {t: self.passes_cost(candidate, shapes, threshold, t) for t in counts}
        chosen = fewest_threads({t: r[0] for t, r in results.items()}, self.options.thread_slack)
        seconds, copy, busy, streamed = results[chosen]
        return TierChoice(family(candidate.residency, self.units, streamed), chosen, seconds, copy, busy)


def _objective(choices: tuple[TierChoice, ...], tiers: tuple[TokenTier, ...]) -> float:
    logs = [math.log(t.max_tokens / c.seconds) for t, c in zip(tiers, choices) if c.seconds > 0]
    return math.exp(sum(logs) / len(logs)) if logs else 0.0


def evaluate_candidate(ev: Evaluator, candidate: Candidate, tiers: tuple[TokenTier, ...], n_ubatch: int,
                       decode_context: int) -> CandidateResult:
    """The candidate's best threshold and per-tier choices."""
    if candidate.streaming:
        sizes = sorted({pass_tokens(t, n_ubatch) for t in tiers})
        # Stream everything, or everything above each tier size, or nothing.
        thresholds = [1] + [s + 1 for s in sizes[:-1]] + [NEVER]
    else:
        thresholds = [NEVER]
    best: tuple[float, int, tuple[TierChoice, ...]] | None = None
    per_threshold: dict[int, tuple[TierChoice, ...]] = {}
    for threshold in thresholds:
        choices = tuple(ev.tier_choice(candidate, t, n_ubatch, decode_context, threshold) for t in tiers)
        per_threshold[threshold] = choices
        score = _objective(choices, tiers)
        if best is None or score > best[0] * (1 + 1e-9):
            best = (score, threshold, choices)
    assert best is not None
    family_seconds: list[dict[str, float]] = []
    for i in range(len(tiers)):
        options: dict[str, float] = {}
        for choices in per_threshold.values():
            c = choices[i]
            options[c.family] = min(options.get(c.family, math.inf), c.seconds)
        family_seconds.append(options)
    return CandidateResult(candidate, best[1], best[2], best[0], tuple(family_seconds))


# Priced placements a PlanMemo keeps per KV type: every new budget adds its own (about 200 for a
# 30B MoE, 0.25 MB), and a game that lets the budget follow free VRAM for an evening sends many.
# Past this (about 10 MB) the placements start over; the pass figures, bounded, stay.
MAX_PLACEMENTS_KEPT = 16_384


@dataclass(eq=False)
class PlanMemo:
    """Passes priced by earlier plans of the same model on the same machine, for the next plan.

    A daemon plans again on every budget change (and the game may send several a second while it
    loads a level); the passes a plan prices do not depend on the budget, only which placements
    it tries does. Not pure: a cache around the pure cost model that whoever plans again keeps and
    hands in (executor.PlanInputs). It serves the model and machine it first saw and starts over
    when handed others (by identity: both are frozen and are replaced, not changed)."""

    model: ModelInfo | None = None
    hw: HardwareModel | None = None
    units: tuple[SubLayer, ...] = ()
    evaluators: dict[tuple, Evaluator] = field(default_factory=dict)
    # One plan at a time uses it (planning.plan holds it): a search sets its evaluators' threads.
    lock: threading.Lock = field(default_factory=threading.Lock)

    def evaluator(self, model: ModelInfo, hw: HardwareModel, options: PlanOptions, kv_type: str,
                  threads: tuple[int, ...]) -> Evaluator:
        if self.model is not model or self.hw is not hw:
            self.model, self.hw, self.units, self.evaluators = model, hw, sub_layers(model), {}
        key = (kv_type, options.executor)  # what the cached pass costs read of the options
        ev = self.evaluators.get(key)
        if ev is None:
            ev = self.evaluators[key] = Evaluator(model, hw, self.units, options, kv_type, threads)
        ev.options, ev.threads = options, threads  # thread_slack and the counts may differ per plan
        if ev.placements_kept > MAX_PLACEMENTS_KEPT:
            ev.forget_placements()
        return ev


@dataclass(frozen=True)
class Found:
    """The search's winner, its fill inputs, its rivals (same micro-batch and KV type) and the
    evaluator that priced them (reused for the time to first token)."""

    result: CandidateResult
    inputs: FillInputs
    others: tuple[CandidateResult, ...]
    evaluator: Evaluator


def _micro_batches(options: PlanOptions) -> tuple[int, ...]:
    floor = max(options.decode_tiers, default=1)
    chosen = tuple(u for u in sorted(set(options.micro_batches)) if floor <= u <= options.n_batch)
    return chosen or (max(floor, min(options.n_batch, 512)),)


def _flash_attention(options: PlanOptions, kv_type: str, gpu_attention: bool) -> bool:
    """Flash attention where attention can run on a GPU (no K.Q scores in VRAM, and faster there),
    and for a quantized cache (llama.cpp needs it for one). On the CPU it is off: llama.cpp's CPU
    kernel reads the whole cache once per query row, so passes slow down with depth far sooner
    (2-core Xeon, SmolLM2, 2,000 tokens deep: one token 31.5 ms with it, 16.5 without; 16 tokens
    374 against 83). Only a 512-token prompt chunk near the start is faster with it (1,387 ms
    against 1,641). Put back to on for a day because CI's grammar fuzz daemon died with it off;
    it died with it on as well, and the cause was a grammar (native/grammar_accept.py)."""
    if options.flash_attention is not None:
        return options.flash_attention
    return gpu_attention or kv_type != "F16"


def _kv_types(options: PlanOptions, gpu_budget: int) -> tuple[str, ...]:
    if options.kv_type.lower() != "auto":
        return (options.kv_type.upper(),)
    # A Q8_0 cache is half the size; worth trying only when it is VRAM that is short.
    return ("F16", "Q8_0") if gpu_budget > 0 else ("F16",)


def search(model: ModelInfo, hw: HardwareModel, gpu_budget: int, cap: int, ctx: int,
           options: PlanOptions, memo: PlanMemo | None = None) -> Found:
    """Evaluate every (KV type, micro-batch, candidate); return the best and its rivals. `memo`
    keeps the priced passes for the next plan of this model on this machine."""
    memo = memo if memo is not None else PlanMemo()
    tiers = token_tiers(options)
    threads = thread_options(hw, cap)
    decode_context = min(ctx, options.reference_context if options.reference_context is not None
                         else options.reference_prompt_tokens)
    n_outputs_max = max(options.decode_tiers, default=1)
    found: Found | None = None
    for kv_type in _kv_types(options, gpu_budget):
        flash = _flash_attention(options, kv_type, gpu_budget > 0 and hw.has_gpu)
        if kv_type != "F16" and not flash:
            continue
        ev = memo.evaluator(model, hw, options, kv_type, threads)
        for n_ubatch in _micro_batches(options):
            inputs = FillInputs(model, memo.units, ctx, kv_type, n_ubatch, n_outputs_max, flash)
            results = tuple(evaluate_candidate(ev, c, tiers, n_ubatch, decode_context)
                            for c in candidates(inputs, gpu_budget, hw.has_gpu))
            top = max(results, key=lambda r: (r.objective, -r.candidate.residency.vram_bytes))
            # Prefer the smaller micro-batch (less scratch) and F16 unless clearly better.
            if found is None or top.objective > found.result.objective * 1.005:
                found = Found(top, inputs, results, ev)
    assert found is not None
    return found
