"""Is a greedy reply what the model says? Checked against llama.cpp's own CPU path, with a tolerance.

llama.cpp promises the same tokens only for the same device, thread count, batch layout and CPU
kernels. A reply computed anywhere else (another device, a reload half-way through, a batch of
eight, a CPU with AVX-512 whose kernels repack the weights) may pick another token where two
candidates are within rounding of each other, and from there the two texts part for good. So a
test that compares token streams across any of those fails on some machines and not others.

What does hold: each token of a greedy reply was the top choice of *some* rounding of the model,
given the tokens before it. So we feed the reply's own tokens back through a plain CPU-only
llama.cpp (llama_cpp.Llama, teacher forcing, one pass) and, at every position, measure how far
the chosen token's logit is below the best one. Rounding puts it at or within a fraction of a
logit of the top; a wrong placement, garbage weights or a lost or swapped KV cache puts tokens
many logits below it. Because the reference follows the reply's own path, one near-tie flip
costs one position, not the rest of the text.

A reply sampled with tokens banned (no_early_stop.py bans the end-of-generation tokens so that a
reply runs its whole length) is scored with the same ban: `banned` ids get the -inf the sampler
gave them (logit_bias -100 is a true ban), so the best logit is the best the reply could choose.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# Measured on the tests' replies (SmolLM2-135M Q4_1; RPC0 and CPU; the native build and the
# second one of scripts/test-other-kernels): an honest reply's worst gap was 0.02-0.08 logits with
# an F16 cache and up to 0.40 across reloads onto a Q8_0 cache, with 91-100% of positions on the
# reference's top token. Wrong weights (two layers' ffn_down swapped) gave 3.0-3.1, swapped KV
# caches 6.6. The tolerance sits between, with room for CPUs whose kernels round otherwise again.
MAX_GAP = 1.5
MIN_TOP1_SHARE = 0.8


@dataclass(frozen=True)
class Agreement:
    """How a reply scores under the CPU reference: `gaps[i]` is the best logit minus the logit of
    reply token i (0 where the reply chose the reference's top token)."""

    gaps: tuple[float, ...]

    @property
    def positions(self) -> int:
        return len(self.gaps)

    @property
    def top1_share(self) -> float:
        return sum(g <= 0.0 for g in self.gaps) / max(len(self.gaps), 1)

    @property
    def worst_gap(self) -> float:
        return max(self.gaps, default=0.0)

    def holds(self, max_gap: float = MAX_GAP, min_top1_share: float = MIN_TOP1_SHARE) -> bool:
        return self.worst_gap <= max_gap and self.top1_share >= min_top1_share

    def describe(self) -> str:
        return (f"{self.positions} positions, top-1 agreement {self.top1_share:.0%}, worst gap "
                f"{self.worst_gap:.3f} logits (tolerance {MAX_GAP}, at least {MIN_TOP1_SHARE:.0%})")


class CpuReference:
    """A plain llama.cpp model on the CPU (no placement of ours, one thread) that scores replies."""

    def __init__(self, model_path: Path, n_ctx: int = 1024) -> None:
        import llama_cpp

        self._llm = llama_cpp.Llama(model_path=str(model_path), n_gpu_layers=0, n_ctx=n_ctx, n_batch=n_ctx,
                                    n_threads=1, n_threads_batch=1, logits_all=True, verbose=False)

    def close(self) -> None:
        self._llm.close()

    def __enter__(self) -> "CpuReference":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def tokenize_raw(self, text: str) -> list[int]:
        """A raw prompt's tokens, as the engine tokenizes one (BOS as the model wants, specials parsed)."""
        return self._llm.tokenize(text.encode(), add_bos=True, special=True)

    def score(self, prompt: list[int], reply: list[int], banned: Sequence[int] = ()) -> Agreement:
        assert prompt and reply, "nothing to score"
        self._llm.reset()
        self._llm.eval(list(prompt) + list(reply))
        logits = np.array(self._llm.scores[len(prompt) - 1: len(prompt) + len(reply) - 1], dtype=np.float64)
        if len(banned):
            logits[:, np.asarray(banned)] = -np.inf  # as the reply's logit-bias sampler had them
        chosen = logits[np.arange(len(reply)), np.asarray(reply)]
        return Agreement(tuple(float(g) for g in logits.max(axis=1) - chosen))


def assert_greedy_agrees(reference: CpuReference, prompt: list[int], reply: list[int], what: str,
                         min_positions: int = 8, banned: Sequence[int] = ()) -> Agreement:
    agreement = reference.score(prompt, reply, banned)
    assert agreement.positions >= min_positions, f"{what}: only {agreement.positions} tokens to compare"
    assert agreement.holds(), f"{what} is not what the model says: {agreement.describe()}"
    return agreement


def engine_prompt_tokens(engine, spec) -> list[int]:
    """The token ids a one-off request's prompt becomes in `engine` (as the engine builds it:
    chat template, specials, BOS). Call it while the engine is idle or from its own thread's view
    of an unchanging model; tokenizing only reads the vocabulary."""
    from sidecar.engine.prompts.prompt_build import build_prompt

    return build_prompt(engine.model, spec, None, [], max_prompt_tokens=1 << 20, n_ctx=engine.config.n_ctx).tokens


def chat_prompt_tokens(model_path: Path, messages: tuple[tuple[str, str], ...]) -> list[int]:
    """The token ids a one-off chat request becomes in the daemon: its own template rendering
    and tokenizer (sidecar.engine.prompts.prompt_build) on the model file, no context, no tools."""
    from sidecar.engine import GenerationSpec, Prompt
    from sidecar.native.model import NativeModel
    from sidecar.engine.prompts.prompt_build import build_prompt

    model = NativeModel(model_path)
    try:
        spec = GenerationSpec(prompt=Prompt(messages=messages))
        return build_prompt(model, spec, None, [], max_prompt_tokens=1 << 20, n_ctx=1 << 20).tokens
    finally:
        model.close()
