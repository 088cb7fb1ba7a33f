"""Per-request sampling: a llama.cpp sampler chain built from a frozen description."""

from __future__ import annotations

import math
import secrets

import llama_cpp

from sidecar.backend.sampling import BAN, SamplingConfig
from sidecar.errors import InvalidArgument


# Candidates the repetition penalty considers when the request disables top-k: the penalty only
# lowers logits, so tokens far below the top cannot win because of it.
PENALTY_TOP_K = 64


def logit_bias_sampler(n_vocab: int, biases: tuple[tuple[int, float], ...]) -> object:
    """llama.cpp's logit-bias sampler; a bias at SamplingConfig's BAN becomes -inf, a true ban."""
    entries = (llama_cpp.llama_logit_bias * len(biases))()
    for entry, (token, bias) in zip(entries, biases):
        if token >= n_vocab:
            raise InvalidArgument(f"logit_bias: token id {token} is not in the model's vocabulary of {n_vocab}")
        entry.token = token
        entry.bias = -math.inf if bias <= BAN else bias
    # llama.cpp copies the entries into the sampler, so the array may go when this returns.
    return llama_cpp.llama_sampler_init_logit_bias(n_vocab, len(biases), entries)


class SamplerChain:
    """Owns a llama_sampler chain; `sample` picks and accepts the next token from the last logits."""

    def __init__(self, vocab: object, n_vocab: int, config: SamplingConfig, grammar: str | None = None) -> None:
        self.ptr = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        try:
            self._build(vocab, n_vocab, config, grammar)
        except BaseException:
            self.close()
            raise

    def _add(self, sampler: object, what: str) -> None:
        if not sampler:
            raise InvalidArgument(f"could not create the {what} sampler")
        llama_cpp.llama_sampler_chain_add(self.ptr, sampler)

    def _build(self, vocab: object, n_vocab: int, config: SamplingConfig, grammar: str | None) -> None:
        # The grammar sees the whole vocabulary first: truncating before it could leave no token
        # that keeps the JSON valid. Then top-k, because the repetition penalty looks every
        # candidate up in a hash map: on a 50k vocabulary that is most of a millisecond per token,
        # on 40 candidates nothing (llama.cpp's own advice). The penalty only lowers logits, so
        # it can only reorder within the top k; then the other truncations, then temperature.
        if config.logit_bias:
            # First, so every later step (the grammar's masks, top-k, the distribution) sees the
            # biased logits, as OpenAI defines logit_bias.
            self._add(logit_bias_sampler(n_vocab, config.logit_bias), "logit bias")
        if grammar is not None:
            sampler = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode("utf-8"), b"root")
            if not sampler:
                raise InvalidArgument("the grammar could not be parsed by llama.cpp (GBNF with a `root` rule; "
                                      "see llama.cpp's grammars/README.md)")
            self._add(sampler, "grammar")
        penalize = config.repeat_last_n > 0 and (
            config.repeat_penalty != 1.0 or config.frequency_penalty != 0.0 or config.presence_penalty != 0.0
        )
        top_k = config.top_k or (PENALTY_TOP_K if penalize else 0)
        if top_k > 0 and (penalize or not config.greedy):
            self._add(llama_cpp.llama_sampler_init_top_k(top_k), "top-k")
        if penalize:
            self._add(
                llama_cpp.llama_sampler_init_penalties(
                    n_vocab, config.repeat_last_n, config.repeat_penalty, config.frequency_penalty, config.presence_penalty
                ),
                "repetition penalty",
            )
        if config.greedy:
            self._add(llama_cpp.llama_sampler_init_greedy(), "greedy")
            return
        if config.top_p < 1.0:
            self._add(llama_cpp.llama_sampler_init_top_p(config.top_p, 1), "top-p")
        if config.min_p > 0.0:
            self._add(llama_cpp.llama_sampler_init_min_p(config.min_p, 1), "min-p")
        self._add(llama_cpp.llama_sampler_init_temp(config.temperature), "temperature")
        seed = config.seed if config.seed is not None else secrets.randbits(31)
        self._add(llama_cpp.llama_sampler_init_dist(seed), "distribution")

    def sample(self, ctx: object, index: int = -1) -> int:
        """Choose the next token from the logits at `index` of the last decode, and record it."""
        return int(llama_cpp.llama_sampler_sample(self.ptr, ctx, index))

    def close(self) -> None:
        if self.ptr:
            llama_cpp.llama_sampler_free(self.ptr)
            self.ptr = None
