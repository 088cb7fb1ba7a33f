"""How many prompt tokens a pass may carry beside replies being streamed.

A pass that carries one decoding NPC's next token also carries prompt chunks of the requests
still prefilling, and every NPC mid-sentence waits for the whole pass. Filled to n_batch that was
a stall: with a 2,723-token prompt arriving beside three streams (bench/run.py prompt-gap, 2-core
Xeon, frame guard off), each 512-token pass took 1.4-2.3 s and the streams stood still for as
long. So while any reply is being streamed, the chunks of long prompts are held to what fits a
pass time target (Sarathi-Serve's "stall-free batching": chunked prefill sized by the decode
latency one will accept); prompts of up to WHOLE_PROMPT_TOKENS go whole, and a pass with no reply
in it still takes n_batch, since nobody waits mid-sentence.

The target is the larger of 100 ms and twice a decode-only pass, for each streaming reply; where
more requests wait for their first token than replies stream, it grows in proportion: (streaming +
waiting) / streaming. A player waits for a first word as much as for a next one: when a village of
16 NPCs with a long uncached world speaks at once and the first has begun its reply, the other 15
prompts are not held to that one reply's pace. A pass costs a fixed part, which grows with how deep
into its context the prompt is (each chunk reads the KV before it again), plus a part per token.
Measured on a 2-core Xeon (SmolLM2-135M) 2,000 tokens deep, flash attention off: 16 tokens 83 ms,
512 tokens 2.8 s, so small slices there cost up to twice a big chunk's time a token (bench/run.py
prompt-gap: the 2,723-token prompt served in 20 s instead of 10.7, while the three streams kept 5-7
tokens/s where they stopped for 2.3 s at each of its passes). Twice a decode-only pass keeps slices
worth their fixed cost where decoding alone is slow.

The running estimate of a prompt token's cost is the pass's time beyond a decode-only pass over
its prompt tokens, fixed part included: sized from it, the slice settles where the pass takes the
target (s = room / ((a + b s) / s) holds at a + b s = room).

Pure: the engine reports each pass's tokens and time, and asks for the budget.
"""

from __future__ import annotations

from dataclasses import dataclass

TARGET_FLOOR_MS = 100.0
# A slice is never smaller than this (a prompt must always move on, however slow the machine).
# Near a prompt's start the budget's slices are far bigger; deep into it a token's cost is mostly
# its reading of the cache before it, and a floor of 16 held passes 2,700 tokens deep beside three
# streams at 200-230 ms, twice the target: the longest gaps those NPCs saw (bench/run.py
# prompt-gap, 2-core EPYC). At 8 such a pass takes about 120 ms, and the prompt is served as fast
# (22.5 against 23.9 s), its passes' fixed part being small there.
MIN_SLICE = 8
# Before anything is measured: a slice this size costs ~100 ms on a slow 2-core CPU and a few ms on
# a GPU, and the first pass with prompt tokens measures the real cost.
FIRST_SLICE = 32
# A prompt this short goes whole even beside replies: a new turn, a recalled memory, a villager's
# persona and line. Sliced, a crowd's short prompts took so many passes that the first NPCs'
# 8-token replies ended before the last NPC's first token (tests/engine/test_crowd.py); whole, one costs
# the streams at most ~0.4 s once on a slow 2-core CPU. The budget is for what would stall them
# for seconds, pass after pass.
WHOLE_PROMPT_TOKENS = 128
# A pass with fewer prompt tokens than this says little about their cost (noise, the fixed part).
MEASURE_MIN_PROMPT_TOKENS = 8
SMOOTHING = 0.25  # the share of a new measurement in the running estimate


@dataclass
class PromptBudget:
    """Running estimates of a decode-only pass's time and each prompt token's cost beyond it."""

    decode_pass_ms: float | None = None
    prompt_token_ms: float | None = None

    def record(self, decode_tokens: int, prompt_tokens: int, elapsed_ms: float) -> None:
        """One pass's make-up and time."""
        if prompt_tokens == 0:
            if decode_tokens:
                self.decode_pass_ms = _smooth(self.decode_pass_ms, elapsed_ms)
            return
        if prompt_tokens < MEASURE_MIN_PROMPT_TOKENS:
            return
        beside = self.decode_pass_ms if decode_tokens and self.decode_pass_ms is not None else 0.0
        per_token = max(0.001, (elapsed_ms - beside) / prompt_tokens)
        if self.prompt_token_ms is not None and per_token > self.prompt_token_ms:
            # A dearer token is believed at once: deep into a long prompt each pass costs more
            # than the last (its fixed part reads the whole cache before it), and the running
            # estimate, 4 passes behind, held every slice there 10-20% over the target.
            self.prompt_token_ms = per_token
        else:
            self.prompt_token_ms = _smooth(self.prompt_token_ms, per_token)

    def target_ms(self, streaming: int = 1, waiting: int = 0) -> float:
        """A pass's time for `streaming` replies beside `waiting` prompts (module docstring)."""
        one = max(TARGET_FLOOR_MS, 2.0 * (self.decode_pass_ms or 0.0))
        return one * max(1.0, (streaming + waiting) / max(streaming, 1))

    def tokens_beside_replies(self, n_batch: int, streaming: int = 1, waiting: int = 0) -> int:
        """The most prompt tokens a pass that carries `streaming` replies may add for `waiting`
        prompts."""
        if self.prompt_token_ms is None:
            return min(n_batch, FIRST_SLICE)
        room_ms = self.target_ms(streaming, waiting) - (self.decode_pass_ms or 0.0)
        return max(MIN_SLICE, min(n_batch, int(room_ms / self.prompt_token_ms)))


def _smooth(old: float | None, new: float) -> float:
    return new if old is None else old + SMOOTHING * (new - old)
