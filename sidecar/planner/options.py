"""Knobs of a plan search that are not the model, the hardware or the budget."""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.planner.cost_model import OP_OFFLOAD, ExecutorModel

DECODE_TIERS = (1, 4, 16, 64)
MICRO_BATCHES = (64, 128, 256, 512, 1024, 2048)


@dataclass(frozen=True)
class PlanOptions:
    """How to plan.

    decode_tiers: passes of one new token per sequence for this many sequences.
    prefill_tiers: prompt passes; None means 512, 1024, ... up to n_batch.
    n_batch: most tokens one llama_decode call takes (prompts are fed in such pieces).
    micro_batches: n_ubatch values to try; the search keeps the best that fits.
    kv_type: "auto" (F16, or Q8_0 when that lets attention stay pinned) or a KV type name.
    flash_attention: None lets the planner decide (on: needed for a quantized cache, and it
      keeps the scratch small).
    reference_prompt_tokens: the prompt whose time to first token the schedule reports.
    reference_context: tokens already cached when a decode tier runs (None: the reference prompt).
    executor: what the executor can overlap (llama.cpp op offload: nothing).
    thread_slack: a tier takes the fewest threads predicted within this share of the fastest,
      leaving cores to the game.
    """

    decode_tiers: tuple[int, ...] = DECODE_TIERS
    prefill_tiers: tuple[int, ...] | None = None
    n_batch: int = 2048
    micro_batches: tuple[int, ...] = MICRO_BATCHES
    kv_type: str = "auto"
    flash_attention: bool | None = None
    reference_prompt_tokens: int = 1024
    reference_context: int | None = None
    executor: ExecutorModel = OP_OFFLOAD
    thread_slack: float = 0.02

    def prefill(self) -> tuple[int, ...]:
        """The prefill tiers: given, or 512, 1024, ... up to n_batch."""
        if self.prefill_tiers is not None:
            return tuple(sorted(self.prefill_tiers))
        tiers, t = [], 512
        while t <= self.n_batch:
            tiers.append(t)
            t *= 2
        return tuple(tiers) or (self.n_batch,)
