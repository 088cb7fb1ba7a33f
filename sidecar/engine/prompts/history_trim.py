"""Which turns of a long-lived NPC's history to drop when the conversation no longer fits.

An NPC the player talks to for an evening outgrows any context. The system prompt and persona
(the leading system messages) always stay, and so does the new turn; the oldest turns after them
go, whole (a user message with the replies that followed it), until the rest fits. It drops down
to `TRIM_TO` of the room rather than just under it: without a cache shift every drop recomputes
what follows the persona, and dropping a margin makes that happen every few turns, not every turn.

Pure: token counts come in; the engine renders and tokenizes.
"""

from __future__ import annotations

from dataclasses import dataclass

# Fraction of the room a trimmed history is cut to.
TRIM_TO = 0.75


@dataclass(frozen=True)
class Trim:
    """Drop messages [start, stop) of the conversation; `turns` user turns go with them."""

    start: int
    stop: int
    turns: int

    @property
    def dropped(self) -> int:
        return self.stop - self.start


NO_TRIM = Trim(0, 0, 0)


def persona_end(messages: list[tuple[str, str]]) -> int:
    """Index of the first message after the leading system messages."""
    n = 0
    while n < len(messages) and messages[n][0] == "system":
        n += 1
    return n


def plan_trim(messages: list[tuple[str, str]], costs: list[int], first_new: int, total: int, room: int) -> Trim:
    """The turns to drop so that about `total` tokens (the whole prompt; `costs` per message,
    template text included) come down to TRIM_TO of `room`. Only history (before `first_new`)
    after the persona is dropped, from its oldest whole turn on; a turn starts at a user message.
    Returns NO_TRIM when the prompt fits."""
    if total <= room:
        return NO_TRIM
    start = persona_end(messages[:first_new])
    target = int(room * TRIM_TO)
    stop = start
    turns = 0
    freed = 0
    while stop < first_new and total - freed > target:
        # One whole turn: its user message and everything up to the next user message.
        end = stop + 1
        while end < first_new and messages[end][0] != "user":
            end += 1
        freed += sum(costs[stop:end])
        turns += sum(1 for role, _ in messages[stop:end] if role == "user") or 1
        stop = end
    return Trim(start, stop, turns) if stop > start else NO_TRIM
