"""Which sequence a new request goes to, and freeing one an idle session holds.

The choice is pure (slots, sessions, the request's prompt tokens in; a slot out); only `evict`
touches the KV cache (KvCells), to move a session's cache to host memory when every free sequence
is taken.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import structlog

from sidecar.backend.requests import Job
from sidecar.backend.sessions import SessionStore
from sidecar.engine.scheduling.slot import Slot

log = structlog.get_logger("engine")

# The prompt tokens of a one-off request (tokenized on first ask), or None when it cannot be
# tokenized here (starting it reports why).
PromptTokens = Callable[[Job], "list[int] | None"]


class KvCells(Protocol):
    """What choosing a sequence may do to the KV cache (NativeContext does it in llama.cpp): an
    evicted session's cells saved to host memory, then cleared."""

    def save(self, seq: int) -> bytes: ...

    def clear(self, seq: int) -> None: ...


@dataclass(frozen=True)
class SlotChoice:
    """The sequence for a request; `evict` when an idle session's cache must leave it first."""

    slot: Slot
    evict: bool = False


def choose_slot(job: Job, slots: list[Slot], sessions: SessionStore, prompt_tokens: PromptTokens) -> SlotChoice | None:
    """The sequence for `job`, or None while it must wait (no free sequence, or its session is
    mid-turn elsewhere: one turn at a time per NPC)."""
    if session_mid_turn(job, slots):
        return None
    sid = job.spec.session_id
    free = [s for s in slots if not s.busy]
    if not free:
        return None
    if sid:
        home = next((s for s in free if s.session_id == sid), None)
        if home is not None:
            return SlotChoice(home)
    # Prefer a sequence no live session needs, then the least recently used session's.
    unowned = [s for s in free if s.session_id is None or sessions.get(s.session_id) is None]
    if unowned:
        return SlotChoice(max(unowned, key=lambda s: preference(s, job, prompt_tokens)))
    return SlotChoice(min(free, key=lambda s: s.last_used), evict=True)


def session_mid_turn(job: Job, slots: list[Slot]) -> bool:
    """Whether an earlier turn of `job`'s session is replying in a sequence now."""
    sid = job.spec.session_id
    return bool(sid) and any(s.busy and s.session_id == sid for s in slots)


def preference(slot: Slot, job: Job, prompt_tokens: PromptTokens) -> tuple:
    """How well a free sequence suits a one-off request. First a sequence whose cache the prompt
    repeats or continues (the longest such): nothing held there is lost. Then an empty one, the
    lowest id first so replies stay packed (see packing.py). Last a sequence the prompt shares only
    a beginning with, the longest share first, then the least recently used: taking it overwrites
    a prompt another request may send again. Three one-off requests that shared a 28-token system
    prompt used to take turns in one sequence, each one's 17 own tokens computed anew every time
    (a tool call of 45 tokens: 230 ms against 188), while seven sequences stood empty. A long
    shared beginning is not lost by going to an empty sequence: prefix sharing copies it from the
    one that holds it (prefix_sharing.py)."""
    if not slot.cached:
        return (1, 0, -slot.seq)
    reuse = reusable_prefix(slot, job, prompt_tokens)
    tokens = prompt_tokens(job) if reuse else None
    whole = tokens is not None and (reuse >= len(tokens) - 1 or reuse >= len(slot.cached))
    return (2 if whole else 0, reuse, -slot.last_used)


def reusable_prefix(slot: Slot, job: Job, prompt_tokens: PromptTokens) -> int:
    """Tokens of a one-off request's prompt that `slot` already holds: NPCs sharing a system
    prompt, or a game repeating a request, land where their prefix is cached."""
    if slot.session_id is not None or not slot.cached or job.spec.session_id or job.spec.asks_about_image:
        return 0
    tokens = prompt_tokens(job)
    if tokens is None:
        return 0
    return common_prefix(slot.cached, tokens)


def common_prefix(cached: list[int], tokens: list[int]) -> int:
    """Tokens of `tokens` already in the cache, leaving at least the last one to decode again
    (its logits are what the first new token is sampled from)."""
    limit = min(len(tokens) - 1, len(cached))
    n = 0
    while n < limit and cached[n] == tokens[n]:
        n += 1
    return n


def evict(slot: Slot, ctx: KvCells, sessions: SessionStore) -> None:
    """Move the sequence's session to host memory and free the sequence."""
    session = sessions.get(slot.session_id) if slot.session_id else None
    if session is not None and slot.cached:
        session.saved_state = ctx.save(slot.seq)
        session.saved_tokens = list(slot.cached)
        log.debug("session evicted", session_id=session.session_id, tokens=len(slot.cached), bytes=len(session.saved_state))
        sessions.keep_saved_within()
    if session is not None:
        session.seq = None
    ctx.clear(slot.seq)
    slot.cached = []
    slot.session_id = None
