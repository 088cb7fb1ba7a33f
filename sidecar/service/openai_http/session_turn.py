"""What of a resent conversation a session already holds.

OpenAI clients send the whole conversation every turn. With a session (X-Session-Id or `user`),
the daemon keeps the NPC's conversation and its KV cache, and gRPC callers send only the new
messages. Over HTTP the client sends everything, and this decides what is new:

- the conversation begins with the session's history (the previous turns, the assistant's replies
  exactly as the daemon gave them): only the messages after it are sent on, and only they are
  computed;
- it does not (the client edited or cut the history, or started over): the session restarts from
  this conversation, and the tokens it shares with the cached ones up to the first difference are
  still reused from the KV cache (the engine keeps a session's sequence and matches prefixes).

Raw prompts (/v1/completions) work the same on text: a prompt that extends the session's text
sends the rest on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from sidecar.engine.sessions import SessionStore

Message = tuple[str, str]


@dataclass(frozen=True)
class ChatTurn:
    messages: tuple[Message, ...]  # what to send on
    skipped: int  # messages of the conversation the session already holds
    reset: bool  # the session restarts from `messages`


@dataclass(frozen=True)
class PromptTurn:
    text: str
    reset: bool


def chat_turn(sessions: SessionStore, session_id: str, conversation: list[Message]) -> ChatTurn:
    session = sessions.get(session_id) if session_id else None
    # The engine replaces the list when a turn ends (never edits it in place): a consistent copy.
    history = list(session.messages) if session is not None else []
    if not history:
        return ChatTurn(tuple(conversation), 0, reset=bool(session_id and session is not None and session.text))
    n = len(history)
    if len(conversation) > n and all(_same_message(a, b) for a, b in zip(conversation[:n], history)):
        return ChatTurn(tuple(conversation[n:]), n, reset=False)
    return ChatTurn(tuple(conversation), 0, reset=True)


def _same_message(sent: Message, held: Message) -> bool:
    """The message the session holds, as the client sends it back. An assistant's tool call comes
    back rebuilt from `tool_calls` (tools.assistant_call_message: canonical JSON), while the session
    holds the text the model wrote under its grammar, whose spacing is the model's: the same call
    when the JSON is the same. Without this, every tool turn of an NPC restarted its session."""
    if tuple(sent) == tuple(held):
        return True
    if sent[0] != "assistant" or held[0] != "assistant":
        return False
    try:
        return json.loads(sent[1]) == json.loads(held[1])
    except ValueError:
        return False


def prompt_turn(sessions: SessionStore, session_id: str, prompt: str) -> PromptTurn:
    session = sessions.get(session_id) if session_id else None
    if session is None or session.is_empty:
        return PromptTurn(prompt, reset=False)
    if session.text and len(prompt) > len(session.text) and prompt.startswith(session.text):
        return PromptTurn(prompt[len(session.text):], reset=False)
    return PromptTurn(prompt, reset=True)
