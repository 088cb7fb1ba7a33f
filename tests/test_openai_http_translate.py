"""OpenAI request bodies -> xlm.v1 requests, and what of a resent conversation a session already
holds. Pure: no model, no daemon."""

from __future__ import annotations

import json

import pytest

from sidecar.engine.requests import IMAGE_MARKER
from sidecar.engine.sessions import SessionStore
from sidecar.errors import InvalidArgument
from sidecar.service.openai_http import translate
from sidecar.service.openai_http.request_models import ChatCompletionRequest, CompletionRequest
from sidecar.service.openai_http.session_turn import PromptTurn, chat_turn, prompt_turn

PNG_1PX = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"


def chat(sessions: SessionStore | None = None, session_id: str = "", limit: int = 2048, **body) -> translate.Turn:
    body.setdefault("messages", [{"role": "user", "content": "Hi"}])
    parsed = ChatCompletionRequest.model_validate_json(json.dumps(body), strict=True)
    return translate.chat_request(parsed, session_id, sessions or SessionStore(8), limit)


def store_with(session_id: str, messages: list[tuple[str, str]]) -> SessionStore:
    store = SessionStore(8)
    store.open(session_id).messages = list(messages)
    return store


def test_a_conversation_that_extends_the_history_sends_only_what_is_new() -> None:
    history = [("system", "You are Brom."), ("user", "Hi"), ("assistant", "Hello, traveller.")]
    store = store_with("brom", history)
    turn = chat_turn(store, "brom", history + [("user", "What is my name?")])
    assert turn.messages == (("user", "What is my name?"),) and turn.skipped == 3 and not turn.reset


def test_an_edited_or_repeated_history_restarts_the_session() -> None:
    history = [("user", "Hi"), ("assistant", "Hello, traveller.")]
    store = store_with("brom", history)
    edited = [("user", "Hi"), ("assistant", "Hello!"), ("user", "Again")]
    assert chat_turn(store, "brom", edited) == chat_turn(store, "brom", edited)
    turn = chat_turn(store, "brom", edited)
    assert turn.messages == tuple(edited) and turn.reset
    assert chat_turn(store, "brom", history).reset  # the same history again: nothing new to append


def test_a_tool_call_sent_back_in_canonical_json_continues_the_session() -> None:
    """The session holds the call as the model wrote it under its grammar; the client sends it back
    rebuilt from `tool_calls`. Same JSON, same call: only the tool's result is new."""
    from sidecar.service.openai_http.request_models import ChatMessage
    from sidecar.service.openai_http.tools import assistant_call_message

    held = '{ "name":"attack" ,"arguments": {"target" : "the thief"}}'
    history = [("system", "You are a guard."), ("user", "A thief!"), ("assistant", held)]
    store = store_with("guard", history)
    sent_back = assistant_call_message(ChatMessage.model_validate({"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "attack", "arguments": '{"target": "the thief"}'}}]}))
    assert sent_back != history[2]
    result = ("user", "Result of attack: missed")
    turn = chat_turn(store, "guard", history[:2] + [sent_back, result])
    assert turn.messages == (result,) and turn.skipped == 3 and not turn.reset
    # Another call, or another argument, is another history.
    other = ("assistant", '{"name": "attack", "arguments": {"target": "the baker"}}')
    assert chat_turn(store, "guard", history[:2] + [other, result]).reset


def test_a_new_session_or_none_sends_everything() -> None:
    conversation = [("user", "Hi")]
    assert chat_turn(SessionStore(8), "new", conversation) == chat_turn(SessionStore(8), "", conversation)
    assert not chat_turn(SessionStore(8), "new", conversation).reset


def test_raw_prompts_extend_the_session_text() -> None:
    store = SessionStore(8)
    store.open("bard").text = "Once upon a time"
    assert prompt_turn(store, "bard", "Once upon a time, a dragon") == PromptTurn(", a dragon", False)
    assert prompt_turn(store, "bard", "Long ago") == PromptTurn("Long ago", True)


def test_the_session_turn_reaches_the_request() -> None:
    store = store_with("brom", [("user", "Hi"), ("assistant", "Hello.")])
    turn = chat(store, "brom", messages=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
                                          {"role": "developer", "content": [{"type": "text", "text": "Be kind."}]}])
    r = turn.request
    assert [(m.role, m.content) for m in r.messages.messages] == [("system", "Be kind.")]
    assert r.session_id == "brom" and not r.reset_session


def test_sampling_stop_and_max_tokens_map_onto_the_request() -> None:
    r = chat(temperature=0.5, top_p=0.9, seed=7, stop="END", frequency_penalty=0.5, presence_penalty=-0.5).request
    s = r.sampling
    assert (round(s.temperature, 3), round(s.top_p, 3), s.seed) == (0.5, 0.9, 7)
    assert (s.frequency_penalty, s.presence_penalty) == (0.5, -0.5)
    assert list(r.stop) == ["END"] and r.max_tokens == 256
    assert chat(limit=8).request.max_tokens == 8  # never above --max-tokens-per-request
    assert chat(max_tokens=5, max_completion_tokens=9).request.max_tokens == 9
    greedy = chat(top_p=0.0).request.sampling
    assert greedy.HasField("temperature") and greedy.temperature == 0.0 and not greedy.HasField("top_p")


def test_response_formats_become_the_json_schema_of_the_grpc_path() -> None:
    assert json.loads(chat(response_format={"type": "json_object"}).request.json_schema) == {"type": "object"}
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    assert json.loads(chat(response_format=fmt).request.json_schema) == schema
    assert chat(response_format={"type": "text"}).request.json_schema == ""


def test_an_image_part_becomes_the_marker_and_the_image_bytes() -> None:
    content = [{"type": "text", "text": "What is this?"},
               {"type": "image_url", "image_url": {"url": "data:image/png;base64," + PNG_1PX}}]
    turn = chat(messages=[{"role": "user", "content": content}])
    assert turn.request.messages.messages[0].content == f"What is this?\n{IMAGE_MARKER}"
    assert turn.image is not None and turn.image.startswith(b"\x89PNG")


@pytest.mark.parametrize("body, message", [
    ({"n": 2}, "n must be 1"),
    ({"logit_bias": {"1": 3}}, "logit_bias"),
    ({"logprobs": True}, "logprobs"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}, "data: URL"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,@@"}}]}]}, "base64"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + PNG_1PX}},
                                                {"type": "image_url", "image_url": {"url": "data:image/png;base64," + PNG_1PX}}]}]},
     "one new image"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": IMAGE_MARKER}]}]}, "may not contain"),
    ({"messages": [{"role": "user", "content": None}]}, "needs content"),
    ({"tools": [{"type": "function", "function": {"name": "attack"}}], "tool_choice":
      {"type": "function", "function": {"name": "flee"}}}, "not among the tools"),
    ({"tool_choice": "required"}, "no tools"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                                          "function": {"name": "a", "arguments": "{oops"}}]}]}, "JSON"),
])
def test_what_cannot_be_honoured_is_refused_by_name(body: dict, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        chat(**body)


@pytest.mark.parametrize("body, message", [({"echo": True}, "echo"), ({"suffix": "x"}, "suffix"),
                                           ({"best_of": 2}, "best_of"), ({"logprobs": 2}, "logprobs")])
def test_completion_fields_that_cannot_be_honoured_are_refused(body: dict, message: str) -> None:
    parsed = CompletionRequest.model_validate_json(json.dumps({"prompt": "Hi", **body}), strict=True)
    with pytest.raises(InvalidArgument, match=message):
        translate.completion_request(parsed, "", SessionStore(8), 2048)


def test_tool_choice_none_ignores_the_tools() -> None:
    turn = chat(tools=[{"type": "function", "function": {"name": "attack"}}], tool_choice="none")
    assert turn.request.json_schema == ""


ATTACK = {"type": "function", "function": {"name": "attack", "description": "strike a target",
                                             "parameters": {"type": "object", "properties": {"target": {"type": "string"}},
                                                            "required": ["target"]}}}
FLEE = {"type": "function", "function": {"name": "flee", "parameters": {"type": "object", "properties": {}}}}


def test_tools_become_a_schema_of_calls_and_instructions_in_the_system_message() -> None:
    turn = chat(tools=[ATTACK, FLEE], tool_choice="required",
                messages=[{"role": "system", "content": "You are a guard."}, {"role": "user", "content": "A thief!"}])
    schema = json.loads(turn.request.json_schema)
    assert [c["properties"]["name"]["const"] for c in schema["anyOf"]] == ["attack", "flee"]
    system = turn.request.messages.messages[0]
    assert system.role == "system" and system.content.startswith("You are a guard.") and "attack: strike a target" in system.content
    named = json.loads(chat(tools=[ATTACK, FLEE], tool_choice={"type": "function", "function": {"name": "flee"}}).request.json_schema)
    assert named["properties"]["name"] == {"const": "flee"}
    auto = json.loads(chat(tools=[ATTACK]).request.json_schema)
    assert [sorted(c["properties"]) for c in auto["anyOf"]] == [["arguments", "name"], ["reply"]]


def test_tool_results_and_earlier_calls_are_written_into_the_conversation() -> None:
    messages = [{"role": "user", "content": "A thief!"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "attack", "arguments": '{"target": "thief"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "The thief flees."}]
    sent = [(m.role, m.content) for m in chat(tools=[ATTACK], messages=messages).request.messages.messages]
    assert sent[2] == ("assistant", '{"name": "attack", "arguments": {"target": "thief"}}')
    assert sent[3] == ("user", "Result of call_1: The thief flees.")


def test_replies_held_to_the_tools_grammar_parse_into_calls_or_text() -> None:
    from sidecar.service.openai_http.tools import parse_reply, tool_spec
    from sidecar.service.openai_http.request_models import Tool

    spec = tool_spec([Tool.model_validate(ATTACK)], "auto")
    call = parse_reply('{"name": "attack", "arguments": {"target": "orc"}}', spec)
    assert call.content is None and call.calls[0]["function"] == {"name": "attack", "arguments": '{"target": "orc"}'}
    assert parse_reply('{"reply": "Halt!"}', spec).content == "Halt!"
    assert parse_reply('{"name": "att', spec).content == '{"name": "att'  # cut by max_tokens: text
