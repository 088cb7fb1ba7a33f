"""Which free sequence a one-off request takes (slot_choice.preference): pure, no llama.cpp.

The slots' `cached` lists stand for what each sequence's KV holds; a request's prompt tokens come
from a table, as the engine's tokenizer would give them."""

from __future__ import annotations

import pytest

from sidecar.backend.requests import GenerationSpec, Job, Prompt
from sidecar.backend.sessions import SessionStore
from sidecar.engine.scheduling.slot import Slot
from sidecar.engine.scheduling.slot_choice import choose_slot

pytestmark = pytest.mark.fast

SYSTEM = list(range(100, 128))  # a 28-token system prompt the game's requests share
TOOLS_3 = SYSTEM + list(range(200, 221))  # a tool call among 3 tools
TOOLS_2 = SYSTEM + list(range(300, 317))  # the same NPC, 2 tools
REPLY = list(range(900, 940))


def _job(name: str) -> Job:
    return Job(spec=GenerationSpec(prompt=Prompt(messages=(("user", name),)), request_id=name), sink=lambda e: None)


def _choose(slots: list[Slot], prompt: list[int]) -> int:
    choice = choose_slot(_job("r"), slots, SessionStore(max_sessions=8, max_saved_bytes=1 << 20), lambda job: prompt)
    assert choice is not None and not choice.evict
    return choice.slot.seq


def test_a_prompt_sharing_only_a_beginning_takes_an_empty_sequence_and_keeps_the_other_prompt() -> None:
    slots = [Slot(0, cached=TOOLS_3 + REPLY, last_used=1.0), Slot(1), Slot(2)]
    assert _choose(slots, TOOLS_2) == 1


def test_a_repeated_prompt_returns_to_the_sequence_that_holds_it() -> None:
    slots = [Slot(0, cached=TOOLS_3 + REPLY, last_used=1.0), Slot(1, cached=TOOLS_2 + REPLY, last_used=2.0), Slot(2)]
    assert _choose(slots, TOOLS_2) == 1
    assert _choose(slots, TOOLS_3) == 0


def test_a_prompt_that_continues_a_sequence_s_cache_goes_there() -> None:
    """A conversation resent whole: its last prompt and reply, then a new line."""
    slots = [Slot(0), Slot(1, cached=TOOLS_3 + REPLY, last_used=1.0)]
    assert _choose(slots, TOOLS_3 + REPLY + [7, 8, 9]) == 1


def test_with_no_empty_sequence_the_longest_shared_beginning_then_the_oldest_is_overwritten() -> None:
    other = list(range(500, 540))
    slots = [Slot(0, cached=other, last_used=1.0), Slot(1, cached=TOOLS_3 + REPLY, last_used=3.0),
             Slot(2, cached=SYSTEM[:10] + other, last_used=2.0)]
    assert _choose(slots, TOOLS_2) == 1
    slots[1].cached = other[::-1]
    assert _choose(slots, TOOLS_2) == 2  # 10 shared tokens beat none
    slots[2].cached = other[::-2]
    assert _choose(slots, TOOLS_2) == 0  # nothing shared anywhere: the least recently used


def test_empty_sequences_fill_from_the_lowest_id() -> None:
    assert _choose([Slot(0, cached=TOOLS_3, last_used=1.0), Slot(1), Slot(2)], [1, 2, 3]) == 1
