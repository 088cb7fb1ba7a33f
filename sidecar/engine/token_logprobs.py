"""Token log probabilities for a request that asks for them (OpenAI's logprobs / top_logprobs).

They are the model's own distribution at the position, a log-softmax of the raw logits: before
temperature, top-k/p, penalties, logit bias or grammar, which shape how a token is chosen, not how
likely the model found it (llama-server reports the same by default). Computed only for requests
that ask: a softmax over a 50k vocabulary is about a tenth of a millisecond per token.
"""

from __future__ import annotations

from typing import Callable

import llama_cpp
import numpy as np

from sidecar.backend.requests import TokenChoice, TokenLogprob


def logprob_at(ctx_ptr: object, index: int, n_vocab: int, token: int, top_n: int,
               piece: Callable[[int], bytes]) -> TokenLogprob:
    """`token`'s log probability at batch position `index` of the last decode, and the `top_n`
    likeliest tokens there, likeliest first."""
    logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx_ptr, index), shape=(n_vocab,))
    top = logits.max()
    log_total = float(top) + float(np.log(np.exp(logits - top, dtype=np.float64).sum()))
    chosen = TokenChoice(token, piece(token), float(logits[token]) - log_total)
    if top_n <= 0:
        return TokenLogprob(chosen)
    best = np.argpartition(logits, -top_n)[-top_n:]
    best = best[np.argsort(-logits[best], kind="stable")]
    return TokenLogprob(chosen, tuple(TokenChoice(int(t), piece(int(t)), float(logits[t]) - log_total) for t in best))


def take(pending: list[TokenLogprob], n: int) -> tuple[TokenLogprob, ...]:
    """The entries of the next `n` tokens sent: the text stream holds tokens back (a partial
    character, a possible stop string) and sends them later, in order."""
    out = tuple(pending[:n])
    del pending[:n]
    return out
