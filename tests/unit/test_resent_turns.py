"""What of a resent conversation a session already holds (sidecar.backend.resent_turns), decided
by the backend from its own session. Pure: no model, no daemon. The engine-side timing of the
decision is tested with a real model in test_resent_turns_engine.py."""

from __future__ import annotations

import json

import pytest

from sidecar.backend.requests import IMAGE_MARKER, GenerationSpec, Prompt
from sidecar.backend.resent_turns import remember_sent, resolve
from sidecar.backend.sessions import Session
from sidecar.errors import InvalidArgument
from sidecar.vision.image_input import RgbImage


def resent(messages: list[tuple[str, str]], **fields) -> GenerationSpec:
    return GenerationSpec(prompt=Prompt(messages=tuple(messages)), session_id="brom", resends_history=True, **fields)


def session_with(messages: list[tuple[str, str]], sent: list[tuple[str, str]] | None = None) -> Session:
    return Session("brom", messages=list(messages), sent=sent)


def test_a_conversation_that_extends_the_history_sends_only_what_is_new() -> None:
    history = [("system", "You are Brom."), ("user", "Hi"), ("assistant", "Hello, traveller.")]
    spec = resolve(resent(history + [("user", "What is my name?")]), session_with(history))
    assert spec.prompt.messages == (("user", "What is my name?"),) and not spec.reset_session
    assert not spec.resends_history  # decided: the engine may admit it


def test_an_edited_or_repeated_history_restarts_the_session() -> None:
    history = [("user", "Hi"), ("assistant", "Hello, traveller.")]
    edited = [("user", "Hi"), ("assistant", "Hello!"), ("user", "Again")]
    spec = resolve(resent(edited), session_with(history))
    assert spec.prompt.messages == tuple(edited) and spec.reset_session
    assert resolve(resent(history), session_with(history)).reset_session  # nothing new to append


def test_what_the_client_sent_is_compared_not_the_laid_out_history() -> None:
    """The session's `messages` hold the tools' instructions inside the system message; the client
    resends its own system message. Matched against `sent`, the session continues."""
    laid_out = [("system", "You are a guard.\n\nYou can call these functions..."), ("user", "A thief!"), ("assistant", "Halt!")]
    sent = [("system", "You are a guard."), ("user", "A thief!"), ("assistant", "Halt!")]
    spec = resolve(resent(sent + [("user", "He runs.")]), session_with(laid_out, sent=sent))
    assert spec.prompt.messages == (("user", "He runs."),) and not spec.reset_session


def test_remember_sent_keeps_the_clients_view_of_a_resent_turn_only() -> None:
    session = session_with([])
    remember_sent(session, resent([("user", "Hi")]), "Hello.")
    assert session.sent == [("user", "Hi"), ("assistant", "Hello.")]
    remember_sent(session, None, "More.")  # a gRPC turn of new messages: no conversation to match
    assert session.sent is None


def test_a_tool_call_sent_back_in_canonical_json_continues_the_session() -> None:
    """The session holds the call as the model wrote it under its grammar; the client sends it back
    rebuilt from `tool_calls`. Same JSON, same call: only the tool's result is new."""
    from sidecar.service.openai_http.request_models import ChatMessage
    from sidecar.service.openai_http.tools import assistant_call_message

    held = '{ "name":"attack" ,"arguments": {"target" : "the thief"}}'
    history = [("system", "You are a guard."), ("user", "A thief!"), ("assistant", held)]
    sent_back = assistant_call_message(ChatMessage.model_validate({"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "attack", "arguments": '{"target": "the thief"}'}}]}))
    assert sent_back != history[2]
    result = ("user", "Result of attack: missed")
    spec = resolve(resent(history[:2] + [sent_back, result]), session_with(history))
    assert spec.prompt.messages == (result,) and not spec.reset_session
    other = ("assistant", json.dumps({"name": "attack", "arguments": {"target": "the baker"}}))
    assert resolve(resent(history[:2] + [other, result]), session_with(history)).reset_session


def test_words_under_tool_choice_auto_sent_back_as_words_continue_the_session() -> None:
    history = [("user", "Good evening."), ("assistant", '{"reply": "Evening, traveller."}')]
    spec = resolve(resent([("user", "Good evening."), ("assistant", "Evening, traveller."), ("user", "Any news?")]),
                   session_with(history))
    assert spec.prompt.messages == (("user", "Any news?"),) and not spec.reset_session
    assert resolve(resent([("user", "Good evening."), ("assistant", "Other words."), ("user", "Any news?")]),
                   session_with(history)).reset_session


def test_a_new_session_or_none_sends_everything() -> None:
    conversation = [("user", "Hi")]
    for session in (None, Session("new")):
        spec = resolve(resent(conversation), session)
        assert spec.prompt.messages == tuple(conversation) and not spec.reset_session


def test_raw_prompts_extend_the_session_text() -> None:
    session = Session("bard", text="Once upon a time")
    spec = GenerationSpec(prompt=Prompt(text="Once upon a time, a dragon"), session_id="bard", resends_history=True)
    assert (resolve(spec, session).prompt.text, resolve(spec, session).reset_session) == (", a dragon", False)
    other = GenerationSpec(prompt=Prompt(text="Long ago"), session_id="bard", resends_history=True)
    assert (resolve(other, session).prompt.text, resolve(other, session).reset_session) == ("Long ago", True)


def test_a_turn_not_resent_is_left_as_it_is() -> None:
    spec = GenerationSpec(prompt=Prompt(messages=(("user", "Hi"),)), session_id="brom")
    assert resolve(spec, session_with([("user", "Hi"), ("assistant", "Yo")])) is spec


IMAGE = RgbImage(2, 2, bytes(12), "png")


def test_the_last_image_is_asked_about_only_when_its_message_is_new() -> None:
    looked = [("user", f"{IMAGE_MARKER}\nWhat is this?"), ("assistant", "A tree.")]
    follow_up = resolve(resent(looked + [("user", "Is it tall?")], image=IMAGE), session_with(looked))
    assert follow_up.image is None and not follow_up.asks_about_image  # the session holds that image
    new = resolve(resent(looked + [("user", f"And this? {IMAGE_MARKER}")], image=IMAGE), session_with(looked))
    assert new.image is IMAGE and new.asks_about_image
    with pytest.raises(InvalidArgument, match="one new image"):  # a restart makes both images new
        resolve(resent(looked + [("user", f"And this? {IMAGE_MARKER}")], image=IMAGE), None)
