"""What a turn recalls and how it is told: pure, data in and out.

Turns that leave a session's context become memories, one per user turn with the reply it got.
Before a turn, the best memories of the scopes the session reads are told to the model in one
system message, as many as fit the session's memory token budget, best first.
"""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.backend.prompt_layout import RECALLED
from sidecar.backend.requests import IMAGE_MARKER

# How a memory of a dropped turn reads (the model sees it again in the recalled block).
PLAYER = "The player said: "
REPLY = "You answered: "
# A reply longer than this is cut in its memory: the player's words carry what is remembered,
# and a long reply would spend the whole memory budget on one turn.
MAX_REPLY_CHARS = 120
# A dropped turn's image is not kept (its pixels left with its KV); its marker must not be either:
# told again in a recalled block, it would stand for an image the turn does not carry, and the turn
# would be refused.
IMAGE_IN_MEMORY = "(an image)"
# Memories scoring below this are not told, whatever room is left: an unrelated memory in the
# prompt costs tokens and invites the model to bring it up. (Cosine of all-MiniLM-L6-v2; the
# word vectors' scale is similar: unrelated lines score about 0.0-0.15 on both.)
MIN_SCORE = 0.2
# Nor are those scoring more than this below the best one found: behind a clear match, the rest
# are chatter that shares a word or two with the question. Measured on bench/run.py memory's
# evening (20 paraphrased questions, best 4 of 140 memories, all-MiniLM-L6-v2): where the planted
# fact was not the best match it scored at most 0.069 below it, while a clear match (0.4-0.78)
# stood 0.1-0.47 above the rest. With 0.1 a question told 1.35 memories instead of 2.2 (within
# the 128-token block at --ctx 1024), the same facts among them: the block, which is prefill every
# NPC in the batch waits behind, shrinks by a third.
MAX_GAP_FROM_BEST = 0.1
# Bytes per token assumed to keep the block within its budget without tokenizing on this thread
# (English BPE averages about 4). The block may run a little over; the context trim still has the
# last word on what fits.
BYTES_PER_TOKEN = 4


@dataclass(frozen=True)
class TurnMemory:
    text: str
    turn: int  # the session's user turn it was (1 = the first)
    # What it is found by: the player's own words. The reply is told with them, but a small
    # model's reply blurs the vector away from what the player said and will ask about again
    # (bench/run.py memory: 17 of 20 facts found with replies in the vector).
    said: str = ""


def turn_memories(messages: tuple[tuple[str, str], ...], first_turn: int) -> list[TurnMemory]:
    """One memory per user turn of `messages` (dropped history), with the replies that followed;
    system messages (tool lists told mid-conversation) are not memories."""
    found: list[TurnMemory] = []
    lines: list[str] = []
    said = ""
    turn = first_turn - 1
    for role, content in messages:
        content = content.replace(IMAGE_MARKER, IMAGE_IN_MEMORY)
        if role == "user":
            if lines:
                found.append(TurnMemory("\n".join(lines), max(turn, first_turn), said))
            turn += 1
            said = content.strip()
            lines = [PLAYER + said]
        elif role == "assistant":
            reply = content.strip()
            if len(reply) > MAX_REPLY_CHARS:
                reply = reply[:MAX_REPLY_CHARS].rsplit(" ", 1)[0] + " ..."
            lines.append(REPLY + reply)
    if lines:
        found.append(TurnMemory("\n".join(lines), max(turn, first_turn), said))
    return found


def estimated_tokens(text: str) -> int:
    return len(text.encode("utf-8")) // BYTES_PER_TOKEN + 2


def choose(found: list[tuple[object, float, str]], budget_tokens: int, min_score: float = MIN_SCORE,
           max_gap: float = MAX_GAP_FROM_BEST) -> list[tuple[int, str]]:
    """(index into `found`, the text told) of the memories told, from `found` ((memory, score,
    text), best first): scoring at least `min_score` and no more than `max_gap` below the best,
    each text once (a player who greets every NPC alike leaves many memories that read the same),
    while the block stays within `budget_tokens`.

    Every memory that fits is told before any is told whole: a turn's memory goes in first as the
    player's words alone (what they ask about again), then, best first and while the budget
    allows, with the reply it got. At --ctx 1024 (a 128-token block) bench/run.py memory's evening
    found two planted facts ranked third and fourth behind memories of about 40 tokens each, and
    told whole the block had no room for them."""
    picked: dict[int, str] = {}
    told: set[str] = set()
    used = estimated_tokens(RECALLED)
    floor = max(min_score, found[0][1] - max_gap) if found else min_score
    for i, (_, score, text) in enumerate(found):
        if score < floor:
            break
        first = player_words(text) or text
        if text in told or first in told:
            continue
        cost = estimated_tokens(first)
        if used + cost <= budget_tokens:  # else a shorter one further down may fit
            picked[i] = first
            told.update((text, first))
            used += cost
    for i, first in picked.items():
        whole = found[i][2]
        more = estimated_tokens(whole) - estimated_tokens(first)
        if whole != first and used + more <= budget_tokens:
            picked[i] = whole
            used += more
    return list(picked.items())  # in `found`'s order, as picked


def player_words(text: str) -> str | None:
    """A dropped turn's memory without the reply it got (None for any other memory)."""
    said, _, reply = text.partition("\n")
    return said if said.startswith(PLAYER) and reply.startswith(REPLY) else None
