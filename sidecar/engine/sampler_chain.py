"""Per-request sampling: a llama.cpp sampler chain built from a frozen description."""

from __future__ import annotations

import math
import secrets
import time

import llama_cpp
import numpy as np

from sidecar.backend.sampling import BAN, MAX_LOGIT_BIAS_ENTRIES, SamplingConfig
from sidecar.errors import InvalidArgument, ResourceExhausted
from sidecar.native import grammar_accept
from sidecar.native.model import token_piece
from sidecar.native.token_candidates import TokenCandidates


# Candidates the repetition penalty considers when the request disables top-k: the penalty only
# lowers logits, so tokens far below the top cannot win because of it.
PENALTY_TOP_K = 64
# CPU time one token's grammar work (apply and accept) may take before the request is ended: the
# pass waits for it, so every other NPC's next token waits too. A tool call's JSON grammar costs up
# to about 20 ms a token on a 50k vocabulary (2-core Xeon); the checker (grammar_probe.py) refuses
# a grammar past 100 ms on its first tokens, and one that grows costlier later is stopped here.
GRAMMAR_TOKEN_LIMIT_MS = 150.0
# Tokens of highest logit the grammar is asked about before the whole vocabulary (sample).
SHORTLIST = 256


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
    """Owns a llama_sampler chain (and a request's grammar beside it); `sample` picks and accepts
    the next token from the last logits."""

    def __init__(self, vocab: object, n_vocab: int, config: SamplingConfig, grammar: str | None = None) -> None:
        self.ptr = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        self.grammar = None
        self.vocab = vocab
        # What the grammar names by token id: where llama.cpp's apply and accept can disagree.
        self.refs = grammar_accept.TokenRefs.of(grammar) if grammar is not None else grammar_accept.NO_REFS
        # Grammar requests sample step by step (token_candidates.py): a grammar can leave no token.
        self._candidates = TokenCandidates(n_vocab) if grammar is not None else None
        self._one = TokenCandidates(1) if grammar is not None else None
        self._shortlist = TokenCandidates(SHORTLIST + MAX_LOGIT_BIAS_ENTRIES) if grammar is not None else None
        # What the shortlist must hold to choose exactly as the whole vocabulary would (sample).
        self._needed = 0
        self._bias: np.ndarray | None = None
        self._boosted = np.zeros(0, dtype=np.int64)
        self.generated = 0
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
        # Top-k before the repetition penalty, because the penalty looks every candidate up in a
        # hash map: on a 50k vocabulary that is most of a millisecond per token, on 40 candidates
        # nothing (llama.cpp's own advice). The penalty only lowers logits, so it can only reorder
        # within the top k; then the other truncations, then temperature. The grammar stands
        # outside the chain (sample: it masks the whole vocabulary only when it must).
        if config.logit_bias:
            # First, so every later step (top-k, the distribution) sees the biased logits, as
            # OpenAI defines logit_bias.
            self._add(logit_bias_sampler(n_vocab, config.logit_bias), "logit bias")
        if grammar is not None:
            self.grammar = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode("utf-8"), b"root")
            if not self.grammar:
                raise InvalidArgument("the grammar could not be parsed by llama.cpp (GBNF with a `root` rule; "
                                      "see llama.cpp's grammars/README.md)")
        penalize = config.repeat_last_n > 0 and (
            config.repeat_penalty != 1.0 or config.frequency_penalty != 0.0 or config.presence_penalty != 0.0
        )
        top_k = config.top_k or (PENALTY_TOP_K if penalize else 0)
        if grammar is not None:
            self._plan_shortlist(n_vocab, config, top_k if top_k > 0 and (penalize or not config.greedy) else 0)
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
        """Choose the next token from the logits at `index` of the last decode, and record it.
        With a grammar: InvalidArgument when it (with the banned tokens) leaves no token, and
        ResourceExhausted when its work on one token passes GRAMMAR_TOKEN_LIMIT_MS."""
        if self.grammar is None:
            return int(llama_cpp.llama_sampler_sample(self.ptr, ctx, index))
        candidates = self._candidates
        started = time.thread_time()
        candidates.fill_from_logits(ctx, index)
        candidates.apply(self.ptr)
        token = candidates.selected_token()
        if token is None or not self.allows(token):
            # Masking all 50k tokens costs the grammar up to ~20 ms a token; asking it about the
            # one token the chain chose costs microseconds, so the mask is made only when that
            # token breaks the grammar (llama.cpp's common sampler does the same). Under greedy
            # the choice is the same; sampling, a token the grammar allows is kept at its
            # unmasked probability, as in llama-server.
            token = self._sample_shortlist(ctx, index)
            if token is None:  # the shortlist cannot decide: the grammar masks every token
                candidates.fill_from_logits(ctx, index)
                candidates.apply(self.grammar)
                candidates.apply(self.ptr)
                token = candidates.selected_token()
            if token is not None and self.accept_throws(token):
                piece = token_piece(self.vocab, token, True)
                raise InvalidArgument(
                    f"the grammar allows token {token} ({piece!r}) after {self.generated} tokens of the "
                    f"reply, but llama.cpp cannot accept it there: a token reference (<[id]>) matched part-way "
                    f"through a token, after characters. Put token references where a token starts")
        if token is None:
            raise InvalidArgument(f"the grammar, with the request's logit_bias, leaves no token this model can write "
                                  f"after {self.generated} tokens of the reply")
        self.accept(token)
        self.charge_grammar_work(started)
        return token

    def charge_grammar_work(self, started: float) -> None:
        """ResourceExhausted when the grammar's work since `started` (time.thread_time()) passed
        GRAMMAR_TOKEN_LIMIT_MS: a token's sampling, or the jump after it (jump_forward.py clones
        the grammar and asks it about every byte: a cost that grows with its stacks as well)."""
        spent_ms = (time.thread_time() - started) * 1000.0
        if spent_ms > GRAMMAR_TOKEN_LIMIT_MS:
            raise ResourceExhausted(f"the grammar's work on one token took {spent_ms:.0f} ms of CPU, more than its "
                                    f"share ({GRAMMAR_TOKEN_LIMIT_MS:.0f} ms, which every other conversation waits "
                                    f"for): simplify the grammar or schema (nested repetitions multiply its work)")

    def _plan_shortlist(self, n_vocab: int, config: SamplingConfig, top_k: int) -> None:
        # Greedy needs the best token the grammar allows (checked on the choice itself); sampling
        # with top-k, the k best it allows. Without top-k every allowed token counts: no shortlist.
        self._greedy = config.greedy
        self._needed = 1 if config.greedy else top_k
        if config.logit_bias:
            self._bias = np.zeros(n_vocab, dtype=np.float32)
            for token, bias in config.logit_bias:
                self._bias[token] = -np.inf if bias <= BAN else bias
            # A token raised by a bias may outrank the shortlist: always asked about.
            self._boosted = np.array(sorted(t for t, b in config.logit_bias if b > 0), dtype=np.int64)

    def _sample_shortlist(self, ctx: object, index: int) -> int | None:
        """The chain's choice among the SHORTLIST tokens of highest logit that the grammar allows,
        or None when that could differ from masking the whole vocabulary. Masking 50k tokens costs
        the grammar about 7 ms on a 2-core Xeon, asking about 256 a few dozen microseconds, and in
        a compact JSON reply the model's own first choice breaks the grammar on most tokens.

        Exact: every token outside the shortlist has a logit below its lowest (a bias cannot lift
        one: raised tokens are added, and penalties only lower). Greedy: when the chosen token's
        final logit is at or above that line, no outside token could have beaten it. Sampling:
        when `_needed` (top-k) allowed tokens are at or above it, they are the whole vocabulary's
        k best allowed, all the chain keeps."""
        if self._needed <= 0:
            return None
        logits = self._candidates.logits(ctx, index)
        top = np.argpartition(logits, -SHORTLIST)[-SHORTLIST:]
        line = logits[top].min()
        ids = np.union1d(top, self._boosted) if self._boosted.size else top
        shortlist = self._shortlist
        shortlist.fill_some(ids, logits[ids])
        shortlist.apply(self.grammar)
        allowed = shortlist.allowed_ids()
        if not self._greedy:
            ranked = logits[allowed] + (self._bias[allowed] if self._bias is not None else 0.0)
            if np.count_nonzero(ranked >= line) < self._needed:
                return None
        elif allowed.size == 0:
            return None
        shortlist.apply(self.ptr)
        token = shortlist.selected_token()
        if self._greedy and (token is None or shortlist.selected_logit() < line):
            return None
        return token

    def allows(self, token: int) -> bool:
        """Whether the grammar accepts `token` next (always, without one) and no logit_bias bans
        it: a forced token is the request's too, and a game that bans a token never gets it, jumped
        or sampled (the sampler then says the grammar needs a banned token)."""
        if self.grammar is None:
            return True
        if self._bias is not None and self._bias[token] == -np.inf:
            return False
        self._one.fill_ids(np.array([token], dtype=np.int32))
        self._one.apply(self.grammar)
        return self._one.allowed_ids().size == 1 and not self.accept_throws(token)

    def accept_throws(self, token: int) -> bool:
        """Whether accepting `token` would throw inside llama.cpp (grammar_accept.py): checked only
        for the tokens where its apply and accept can disagree."""
        return (self.grammar is not None and self.refs.present
                and self.refs.could_disagree(token, token_piece(self.vocab, token, True))
                and grammar_accept.accept_throws(self.grammar, token))

    def accept(self, token: int) -> None:
        """Record `token` as the reply's next: the grammar advances, the penalties count it."""
        self.accept_forced(token)
        llama_cpp.llama_sampler_accept(self.ptr, token)

    def accept_forced(self, token: int) -> None:
        """Record `token` as the reply's next where the grammar forced it (jump_forward.py): the
        grammar advances, the penalties do not count it. A penalty is there to keep the model from
        repeating its own choices; forced text is no choice, and in the tokenizer's split its
        structure (`","`, `":"`) repeats token for token, so counted it penalized the model's own
        `","` that ends a value: under greedy at 1.1 a value ran on to its maxLength
        ("wolves_in_the_forest_of_", 24 characters) where the model would have closed it."""
        if self.grammar is not None:
            llama_cpp.llama_sampler_accept(self.grammar, token)
        self.generated += 1

    def close(self) -> None:
        if self.ptr:
            llama_cpp.llama_sampler_free(self.ptr)
            self.ptr = None
        if self.grammar:
            llama_cpp.llama_sampler_free(self.grammar)
            self.grammar = None
