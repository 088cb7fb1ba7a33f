"""How the next token is chosen, as a request describes it: plain data, checked on creation.
The llama.cpp sampler chain built from it is the engine's (sidecar.engine.sampler_chain)."""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.errors import InvalidArgument

# OpenAI's range for a logit bias; at -100 a token is banned outright (the sampler sees -inf), as
# OpenAI documents it ("should result in a ban") and llama-server does for `false`.
MAX_LOGIT_BIAS = 100.0
BAN = -100.0
# More entries than any word list a game bans; each is a hash-map insert in the sampler, per request.
MAX_LOGIT_BIAS_ENTRIES = 1024


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
    # (token id, bias) pairs added to the logits before anything else looks at them; token ids are
    # checked against the model's vocabulary where it is known (the engine, at admission).
    logit_bias: tuple[tuple[int, float], ...] = ()

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
        if len(self.logit_bias) > MAX_LOGIT_BIAS_ENTRIES:
            raise InvalidArgument(f"logit_bias has {len(self.logit_bias)} entries; at most {MAX_LOGIT_BIAS_ENTRIES}")
        for token, bias in self.logit_bias:
            if token < 0:
                raise InvalidArgument(f"logit_bias: token id {token} is negative")
            if not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:  # NaN fails this too
                raise InvalidArgument(f"logit_bias for token {token} is {bias}; biases are between -100 and 100")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
