"""The layout of a turn's messages (sidecar.backend.prompt_layout.new_turn): pure, no model."""

from __future__ import annotations

from sidecar.backend.prompt_layout import new_turn
from sidecar.backend.requests import Prompt

TOOLS = "You can call these functions: attack, flee."


def test_a_new_conversation_opens_with_context_persona_then_tools() -> None:
    p = Prompt(messages=(("system", "You are a guard."), ("user", "Hi")), context="The town of Ash.",
               tool_instructions=TOOLS)
    assert new_turn(p, []) == [("system", f"The town of Ash.\n\nYou are a guard.\n\n{TOOLS}"), ("user", "Hi")]
    bare = Prompt(messages=(("user", "Hi"),), tool_instructions=TOOLS)
    assert new_turn(bare, []) == [("system", TOOLS), ("user", "Hi")]


def test_later_turns_add_the_tools_only_when_they_change() -> None:
    history = [("system", f"You are a guard.\n\n{TOOLS}"), ("user", "Hi"), ("assistant", '{"name": "flee"}')]
    same = Prompt(messages=(("user", "Again"),), context="ignored after the first turn", tool_instructions=TOOLS)
    assert new_turn(same, history) == [("user", "Again")]
    other = Prompt(messages=(("user", "Again"),), tool_instructions="You can call: raise_alarm.")
    assert new_turn(other, history) == [("system", "You can call: raise_alarm."), ("user", "Again")]
    assert new_turn(Prompt(messages=(("user", "Bye"),)), history) == [("user", "Bye")]
