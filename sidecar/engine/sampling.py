"""Per-request sampling: a llama.cpp sampler chain built from a frozen description."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import llama_cpp

from sidecar.errors import InvalidArgument


@dataclass(frozen=True)
class SamplingConfig:
    """How the next token is chosen. Defaults suit NPC dialogue: varied but on topic.

    temperature 0 means greedy. seed None means a fresh random seed per request.
    """

    temperature: float = 0.7
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.1
    repeat_last_n: int = 64
    seed: int | None = None
    # OpenAI's frequency and presence penalties, over the repeat_last_n window; 0 is off.
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0

    def __post_init__(self) -> None:
        checks = [
            (0.0 <= self.temperature <= 10.0, "temperature must be between 0 and 10"),
            (0 <= self.top_k <= 1_000_000, "top_k must be 0 (off) or positive"),
            (0.0 < self.top_p <= 1.0, "top_p must be in (0, 1]"),
            (0.0 <= self.min_p < 1.0, "min_p must be in [0, 1)"),
            (0.0 < self.repeat_penalty <= 10.0, "repeat_penalty must be in (0, 10]"),
            (0 <= self.repeat_last_n <= 1 << 20, "repeat_last_n must be 0 or positive"),
            (self.seed is None or 0 <= self.seed < 2**32 - 1, "seed must fit in 32 bits (below 4294967295)"),
            (-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty must be between -2 and 2"),
            (-2.0 <= self.presence_penalty <= 2.0, "presence_penalty must be between -2 and 2"),
        ]
        for ok, message in checks:
            if not ok:
                raise InvalidArgument(message)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


# Candidates the repetition penalty considers when the request disables top-k: the penalty only
# lowers logits, so tokens far below the top cannot win because of it.
PENALTY_TOP_K = 64


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
        if grammar is not None:
            sampler = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode("utf-8"), b"root")
            if not sampler:
                raise InvalidArgument("the grammar derived from the JSON schema could not be parsed")
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


def json_schema_grammar(schema: str) -> str:
    """GBNF grammar text that only admits JSON valid under `schema`; InvalidArgument if it is not a schema."""
    import json

    from llama_cpp.llama_grammar import json_schema_to_gbnf

    try:
        json.loads(schema)
    except ValueError as e:
        raise InvalidArgument(f"json_schema is not valid JSON: {e}") from e
    try:
        return json_schema_to_gbnf(schema)
    except Exception as e:  # the converter raises bare Exceptions/KeyErrors on schemas it cannot express
        raise InvalidArgument(f"json_schema cannot be turned into a grammar: {e}") from e
