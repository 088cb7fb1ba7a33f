"""What of a resent conversation a session already holds, decided by the backend that owns it.

OpenAI clients send the whole conversation every turn; gRPC callers send only the new messages.
A resent turn (GenerationSpec.resends_history) is resolved against the session when the backend
admits it, on the thread that owns the session, so the decision can never be stale:

- the conversation begins with what the session was sent before and answered (the client's own
  messages, the replies exactly as the daemon gave them): only the messages after that go on, and
  only they are computed;
- it does not (the client edited or cut the history, or started over): the session restarts from
  this conversation, and the tokens it shares with the cached ones up to the first difference are
  still reused from the KV cache (the engine keeps a session's sequence and matches prefixes).

What the session holds is compared as the client sent it (`Session.sent`), not as it was laid out
for the model: tools and the shared context go into the system message there, so a turn whose
tools changed still continues its session, and the new tools are told in a system message of
their own (prompt_layout.new_turn). Raw prompts work the same on text.
"""

from __future__ import annotations

import json
from dataclasses import replace

from sidecar.backend.requests import IMAGE_MARKER, GenerationSpec
from sidecar.backend.sessions import Session
from sidecar.errors import InvalidArgument

Message = tuple[str, str]


def resolve(spec: GenerationSpec, session: Session | None) -> GenerationSpec:
    """The turn to run: `spec` with only what `session` does not hold, or restarting it. Raises
    InvalidArgument when more than one image would be new."""
    if not spec.resends_history:
        return spec
    if spec.prompt.is_chat:
        new, reset = _chat_turn(session, list(spec.prompt.messages or ()))
        return _with_new_image(replace(spec, prompt=replace(spec.prompt, messages=tuple(new)), reset_session=reset,
                                       resends_history=False))
    if spec.prompt.token_ids is not None:  # one-off: no session holds any of it
        return replace(spec, resends_history=False)
    text, reset = _prompt_turn(session, spec.prompt.text or "")
    return replace(spec, prompt=replace(spec.prompt, text=text), reset_session=reset, resends_history=False)


def _chat_turn(session: Session | None, conversation: list[Message]) -> tuple[list[Message], bool]:
    if session is None:
        return conversation, False
    held = session.sent if session.sent is not None else session.messages
    if not held:
        return conversation, not session.is_empty
    n = len(held)
    if len(conversation) > n and all(_same_message(a, b) for a, b in zip(conversation[:n], held)):
        return conversation[n:], False
    return conversation, True


def _prompt_turn(session: Session | None, prompt: str) -> tuple[str, bool]:
    if session is None or session.is_empty:
        return prompt, False
    if session.text and len(prompt) > len(session.text) and prompt.startswith(session.text):
        return prompt[len(session.text):], False
    return prompt, True


def _with_new_image(spec: GenerationSpec) -> GenerationSpec:
    """The transport hands over the conversation's last image; it is asked about only when its
    message is new. Earlier images stay with the session."""
    markers = sum(content.count(IMAGE_MARKER) for _, content in spec.prompt.messages or ())
    if markers > 1:
        raise InvalidArgument(
            "at most one new image per request: send earlier images in a session (X-Session-Id) so they are kept"
        )
    if markers == 0:
        return replace(spec, image=None, asks_about_image=False)
    if spec.image is None:  # the marker stands for an image the transport did not decode
        raise InvalidArgument("the conversation's new image is missing")
    return replace(spec, asks_about_image=True)


def _same_message(sent: Message, held: Message) -> bool:
    """The message the session holds, as the client sends it back. An assistant's tool call comes
    back rebuilt from `tool_calls` (canonical JSON), while the session holds the text the model
    wrote under its grammar, whose spacing is the model's: the same call when the JSON is the
    same. Without this, every tool turn of an NPC restarted its session."""
    if tuple(sent) == tuple(held):
        return True
    if sent[0] != "assistant" or held[0] != "assistant":
        return False
    try:
        written = json.loads(held[1])
    except ValueError:
        return False
    # Under tool_choice "auto" the model's words were JSON, {"reply": "<words>"} (a session held
    # from before issue 36, or a remote server's reply), which the client received, and sends
    # back, as the words alone. Now they are plain words, the same text either way.
    if isinstance(written, dict) and set(written) == {"reply"} and written["reply"] == sent[1]:
        return True
    try:
        return json.loads(sent[1]) == written
    except ValueError:
        return False


def remember_sent(session: Session, spec_as_sent: GenerationSpec | None, reply: str) -> None:
    """After a turn: what the client will send back next time, if it resends its conversation."""
    if spec_as_sent is None or not spec_as_sent.prompt.is_chat:
        session.sent = None  # a turn of new messages only: the client keeps no conversation to resend
        return
    session.sent = list(spec_as_sent.prompt.messages or ()) + [("assistant", reply)]

