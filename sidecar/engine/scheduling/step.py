"""Compose one forward pass from what each active sequence needs. Pure: no llama.cpp here."""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.native.context import BatchEntry


@dataclass(frozen=True)
class SequenceDemand:
    """What one active sequence wants from the next forward pass.

    tokens: tokens not yet in its KV cache (while decoding, the sampled token and any a grammar
    forced after it; the rest of the prompt while prefilling). start_pos: the position of tokens[0].
    """

    seq: int
    tokens: tuple[int, ...]
    start_pos: int
    decoding: bool
    # False when the prompt goes on past these tokens (an image follows): no logits at their end.
    ends_prompt: bool = True
    # The prompt tokens this request prefills in all (those its sequence did not hold at the start),
    # of which `tokens` is what is left: whether a prompt is short enough to go whole is a property
    # of the prompt, not of its remainder.
    prefill_tokens: int = 0


@dataclass(frozen=True)
class StepPlan:
    """A forward pass: its entries, how many tokens each sequence feeds, and where the logits
    each sequence will sample from sit in the batch."""

    entries: tuple[BatchEntry, ...]
    fed: tuple[tuple[int, int], ...]
    logits_at: tuple[tuple[int, int], ...]

    @property
    def n_tokens(self) -> int:
        return len(self.entries)


def plan_step(demands: list[SequenceDemand], n_batch: int, prompt_beside_replies: int | None = None,
              whole_below: int = 0) -> StepPlan:
    """Fill one pass of at most `n_batch` tokens: every decoding sequence's token first (a player
    waiting mid-sentence notices a stall more than a slower start), then prompt chunks in the
    order given, the last one cut to fit. When the pass carries a reply's token, the prompts of
    more than `whole_below` tokens share `prompt_beside_replies` tokens between them, and shorter
    ones go whole (prompt_budget.py). A long prompt stays long to its last slice: its last
    `whole_below` tokens at once, thousands of tokens deep, cost the streams one pass of ~6 (800-960
    ms where they were 140 ms: bench/run.py prompt-gap, 2-core EPYC). A prompt chunk asks for logits only when it ends the prompt,
    since only then is there a next token to sample.

    The entries go out ordered by sequence id. Without a unified KV cache llama.cpp puts into one
    micro-batch only a run of consecutive sequence ids, met in batch order: with decode tokens
    first, a prompt chunk of sequence 5 between decoding sequences 4 and 6 would break the run
    and cost a second pass over the weights."""
    chosen: dict[int, tuple[SequenceDemand, int]] = {}
    used = 0
    for d in (d for d in demands if d.decoding):
        if used >= n_batch:
            break
        chosen[d.seq] = (d, 1)
        used += 1
    # Forced tokens after a sampled one (jump-forward) next: they are a reply's, mid-sentence.
    for d in (d for d in demands if d.decoding and d.seq in chosen and len(d.tokens) > 1):
        extra = min(n_batch - used, len(d.tokens) - 1)
        if extra <= 0:
            break
        chosen[d.seq] = (d, 1 + extra)
        used += extra
    sliced = prompt_beside_replies is not None and bool(chosen)
    long_room = prompt_beside_replies if prompt_beside_replies is not None and sliced else n_batch
    for d in (d for d in demands if not d.decoding):
        if used >= n_batch:
            break
        long = sliced and max(len(d.tokens), d.prefill_tokens) > whole_below
        take = min(n_batch - used, len(d.tokens), long_room if long else n_batch)
        if take <= 0:
            continue  # a long prompt past the budget: a short one after it may still go
        chosen[d.seq] = (d, take)
        used += take
        long_room -= take if long else 0
    entries: list[BatchEntry] = []
    fed: list[tuple[int, int]] = []
    logits_at: list[tuple[int, int]] = []
    for seq in sorted(chosen):
        d, take = chosen[seq]
        ends_prompt = take == len(d.tokens) and (d.decoding or d.ends_prompt)
        for i in range(take):
            last = ends_prompt and i == take - 1
            if last:
                logits_at.append((d.seq, len(entries)))
            entries.append(BatchEntry(d.tokens[i], d.start_pos + i, d.seq, last))
        fed.append((d.seq, take))
    return StepPlan(tuple(entries), tuple(fed), tuple(logits_at))


def threads_for(n_tokens: int, tier_threads: tuple[tuple[int, int], ...]) -> int:
    """Threads of the smallest tier that holds `n_tokens` ((max_tokens, threads) pairs, ascending);
    the largest tier's for anything bigger."""
    for max_tokens, threads in tier_threads:
        if n_tokens <= max_tokens:
            return threads
    return tier_threads[-1][1]
