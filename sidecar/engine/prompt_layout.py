"""How a request's prompt is laid out: the session's history, then the new turn, with the shared
world context (GenerateRequest.context) opening a conversation.

The context opens the system message (build_prompt puts it there), before the NPC's own persona, so every NPC given the same
context renders to the same text, hence the same tokens, up to the end of it: the prefix the
engine computes once and copies (prefix_sharing.py). A raw prompt simply starts with it. On a
session's later turns the history already holds it.
"""

from __future__ import annotations

from typing import Callable

from sidecar.engine.chat_segments import Tokenize, raw_segments, render_segments, tokenize_segments
from sidecar.engine.requests import Prompt

# Between the shared context and the NPC's own system text.
SEPARATOR = "\n\n"

RenderChat = Callable[[list[tuple[str, str]]], str]


def with_context(context: str, messages: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """`messages` with `context` at the start of their system message (one is added if none)."""
    if not context:
        return messages
    if messages and messages[0][0] == "system":
        own = messages[0][1]
        return [("system", context + SEPARATOR + own if own else context)] + messages[1:]
    return [("system", context)] + messages


def context_tokens(render_chat: RenderChat, tokenize: Tokenize, prompt: Prompt) -> list[int]:
    """The tokens of the prompt with nothing but its context, tokenized as build_prompt does (the
    context is message content: plain text). Compared with the whole prompt's, they tell where the
    shared part ends: a tokenizer may merge across the seam, so the shared part is what the two
    have alike, not the context's own length."""
    if not prompt.context:
        return []
    segments = render_segments(render_chat, [("system", prompt.context)]) if prompt.is_chat else raw_segments(prompt.context)
    return tokenize_segments(tokenize, segments).tokens
