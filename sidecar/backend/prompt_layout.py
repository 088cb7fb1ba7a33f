"""How a request's prompt is laid out: the session's history, then the new turn, with the shared
world context (GenerateRequest.context) opening a conversation.

The context opens the system message (build_prompt puts it there), before the NPC's own persona,
so every NPC given the same context renders to the same text, hence the same tokens, up to the end
of it: the prefix the engine computes once and copies (prefix_sharing.py). A raw prompt simply
starts with it. On a session's later turns the history already holds it.

Tool instructions (what functions the reply may call) end the first system message of a new
conversation. A session's later turns that give the same tools add nothing: the history already
tells them, and telling them again every turn would grow an evening's conversation by the whole
function list per line the player types. Tools that changed are told in a system message before
the new turn.
"""

from __future__ import annotations

from typing import Callable

from sidecar.backend.chat_segments import Tokenize, raw_segments, render_segments, tokenize_segments
from sidecar.backend.requests import Prompt

# Between the shared context and the NPC's own system text.
SEPARATOR = "\n\n"

# Bumped whenever a change here, in chat_segments or in how the engine renders and tokenizes a
# conversation makes the same messages become other tokens: a saved KV state (save games) is
# restored only under the layout it was computed with (save_fingerprint.py).
PROMPT_LAYOUT_VERSION = 1

RenderChat = Callable[[list[tuple[str, str]]], str]


def _in_system_message(text: str, messages: list[tuple[str, str]], first: bool) -> list[tuple[str, str]]:
    """`messages` with `text` at the start (`first`) or the end of their system message (one is
    added if none)."""
    if not text:
        return messages
    if messages and messages[0][0] == "system":
        own = messages[0][1]
        joined = (text + SEPARATOR + own if first else own + SEPARATOR + text) if own else text
        return [("system", joined)] + messages[1:]
    return [("system", text)] + messages


def with_context(context: str, messages: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """`messages` with `context` at the start of their system message (one is added if none)."""
    return _in_system_message(context, messages, first=True)


def with_tool_instructions(instructions: str, messages: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """`messages` with `instructions` at the end of their system message (one is added if none)."""
    return _in_system_message(instructions, messages, first=False)


# How recalled memories open their message, and each one's line in it.
RECALLED = "Things you remember from earlier conversations:"


def memory_line(text: str) -> str:
    return "- " + text.replace("\n", " / ")


def untold(memories: tuple[str, ...], history: list[tuple[str, str]]) -> tuple[int, ...]:
    """Indices of `memories` that no recalled-memories message of `history` holds yet: a memory
    told on an earlier turn is still in the conversation (and its KV cache) until that turn
    leaves the context, and is not told twice."""
    held = "\n".join(content for role, content in history if role == "system" and content.startswith(RECALLED))
    return tuple(i for i, text in enumerate(memories) if memory_line(text) not in held)


def recalled_message(memories: tuple[str, ...], history: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The system message telling the memories the conversation does not hold yet ([] if none)."""
    lines = [memory_line(memories[i]) for i in untold(memories, history)]
    return [("system", RECALLED + "\n" + "\n".join(lines))] if lines else []


def new_turn(prompt: Prompt, history: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The messages `prompt` adds after a conversation's `history` ([] for a new one): the
    recalled memories it does not hold yet, when there are any, just before the turn's own
    messages. They stay in the history with the turn (cached; dropped with it)."""
    messages = list(prompt.messages or ())
    recalled = recalled_message(prompt.memories, history)
    if not history:
        opening = with_tool_instructions(prompt.tool_instructions, with_context(prompt.context, messages))
        # A new conversation opens with its system message (world, persona, tools): the
        # memories follow it, so that prefix stays the one every NPC of the world shares.
        system = 1 if opening and opening[0][0] == "system" else 0
        return opening[:system] + recalled + opening[system:]
    if prompt.tool_instructions and not any(
            role == "system" and prompt.tool_instructions in content for role, content in history):
        return [("system", prompt.tool_instructions)] + recalled + messages
    return recalled + messages


def context_tokens(render_chat: RenderChat, tokenize: Tokenize, prompt: Prompt) -> list[int]:
    """The tokens of the prompt with nothing but its context, tokenized as build_prompt does (the
    context is message content: plain text). Compared with the whole prompt's, they tell where the
    shared part ends: a tokenizer may merge across the seam, so the shared part is what the two
    have alike, not the context's own length."""
    if not prompt.context:
        return []
    segments = render_segments(render_chat, [("system", prompt.context)]) if prompt.is_chat else raw_segments(prompt.context)
    return tokenize_segments(tokenize, segments).tokens
