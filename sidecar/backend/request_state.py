"""Where a request is between submit and its final chunk: one explicit state, set by whoever
moves it on, and shown in the status RPC.

Before this, a request's state was implied by five predicates spread over the engine (queued in
the prompt thread, in the waiting deque, its image pending, another request computing its prefix,
its session mid-turn, bound to a sequence, `next_tokens` non-empty). A game developer asking "why
does the blacksmith not answer" had a count of active and queued requests; now status lists each
request with the reason it waits. llama.cpp's server keeps an explicit slot state and vLLM's
scheduler a request status for the same reason.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class RequestState(enum.Enum):
    # Rendered and tokenized on the prompt thread (engine/prompts/prompt_prep.py).
    PREPARING = "preparing"
    # With the engine, not yet in a sequence, and why:
    WAITING_FOR_SEQUENCE = "waiting_for_sequence"  # every sequence busy (the KV may grow for it)
    WAITING_FOR_TURN = "waiting_for_turn"  # its session's previous turn is still replying
    WAITING_FOR_IMAGE = "waiting_for_image"  # its image encodes beside the loop (or an earlier one of its session)
    WAITING_FOR_PREFIX = "waiting_for_prefix"  # another request computes the prompt prefix it shares
    # In a sequence:
    PREFILLING = "prefilling"  # its prompt (and images) going into the KV cache
    DECODING = "decoding"  # replying, a token (or a jump-forward run) per pass
    FINISHED = "finished"  # its final chunk or error has been sent

    @property
    def waiting(self) -> bool:
        return self.name.startswith("WAITING")


@dataclass(frozen=True)
class RequestView:
    """One request as the status RPC shows it; built on the engine thread between two passes."""

    request_id: str
    session_id: str
    state: RequestState
    prompt_tokens: int  # 0 while unknown (before it is tokenized)
    prompt_tokens_done: int  # in the KV cache, reused from a cache or computed
    tokens_generated: int
    age_ms: float  # since submit
