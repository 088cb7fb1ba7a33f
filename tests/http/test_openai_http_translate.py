"""OpenAI request bodies -> xlm.v1 requests (what the core takes from every transport). Pure: no
model, no daemon. What a resent conversation keeps of its session is the backend's decision:
tests/unit/test_resent_turns.py."""

from __future__ import annotations

import json

import pytest

from sidecar.api import pb
from sidecar.backend.requests import IMAGE_MARKER
from sidecar.errors import InvalidArgument
from sidecar.service import convert
from sidecar.service.openai_http import translate
from sidecar.service.turn import Turn
from sidecar.service.openai_http.request_models import ChatCompletionRequest, CompletionRequest

PNG_1PX = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"


def chat(session_id: str = "", limit: int = 2048, **body) -> Turn:
    body.setdefault("messages", [{"role": "user", "content": "Hi"}])
    parsed = ChatCompletionRequest.model_validate_json(json.dumps(body), strict=True)
    asked = translate.chat_request(parsed, session_id, limit)
    assert len(asked.turns) == 1
    return asked.first


def test_the_whole_conversation_goes_to_the_core_every_turn() -> None:
    """The transport decides nothing about the session: the backend matches the conversation
    against its own history when it admits the turn."""
    turn = chat("brom", messages=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
                                  {"role": "developer", "content": [{"type": "text", "text": "Be kind."}]}])
    r = turn.request
    assert [(m.role, m.content) for m in r.messages.messages] == [("user", "Hi"), ("assistant", "Hello."), ("system", "Be kind.")]
    assert r.session_id == "brom" and not r.reset_session and turn.resends_history


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


def test_llama_servers_sampling_fields_are_honoured() -> None:
    # A client written for llama-server sends these; ignored, the reply would sample otherwise
    # than asked (repeat_penalty 1.1 where it asked 1.0).
    s = chat(top_k=12, min_p=0.2, repeat_penalty=1.0, repeat_last_n=32).request.sampling
    assert (s.top_k, round(s.min_p, 3), s.repeat_penalty, s.repeat_last_n) == (12, 0.2, 1.0, 32)
    assert chat(repeat_last_n=-1).request.sampling.repeat_last_n == convert.MAX_REPEAT_LAST_N
    unset = chat().request.sampling
    assert not any(unset.HasField(f) for f in ("top_k", "min_p", "repeat_penalty", "repeat_last_n"))
    for bad in ({"repeat_penalty": 0.0}, {"repeat_penalty": 11.0}, {"repeat_last_n": -2}, {"top_k": -1},
                {"min_p": 1.0}, {"repeat_penalty": "1.1"}):
        with pytest.raises(ValueError):
            chat(**bad)


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
    assert turn.image is not None and turn.image.encoded.startswith(b"\x89PNG")


@pytest.mark.parametrize("body, message", [
    ({"logit_bias": {"one": 3}}, "logit_bias keys are token ids"),
    ({"top_logprobs": 2}, "top_logprobs needs logprobs"),
    ({"json_schema": {"type": "object"}, "response_format": {"type": "json_object"}}, "not both"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}, "data: URL"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,@@"}}]}]}, "base64"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": IMAGE_MARKER}]}]}, "may not contain"),
    ({"messages": [{"role": "user", "content": "look: " + IMAGE_MARKER}]}, "may not contain"),
    ({"messages": [{"role": "user", "content": None}]}, "needs content"),
    ({"tools": [{"type": "function", "function": {"name": "attack"}}], "tool_choice":
      {"type": "function", "function": {"name": "flee"}}}, "not among the tools"),
    ({"tool_choice": "required"}, "no tools"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                                          "function": {"name": "a", "arguments": "{oops"}}]}]}, "JSON"),
])
def test_what_cannot_be_honoured_is_refused_by_name(body: dict, message: str) -> None:
    # Translated, or planned by the core as gRPC's request is (a tool_choice naming no tool).
    with pytest.raises(InvalidArgument, match=message):
        spec_of(chat(**body))


@pytest.mark.parametrize("body, message", [({"echo": True}, "echo"), ({"suffix": "x"}, "suffix"),
                                           ({"best_of": 2}, "best_of")])
def test_completion_fields_that_cannot_be_honoured_are_refused(body: dict, message: str) -> None:
    parsed = CompletionRequest.model_validate_json(json.dumps({"prompt": "Hi", **body}), strict=True)
    with pytest.raises(InvalidArgument, match=message):
        translate.completion_requests(parsed, "", 2048, ["Hi"])


def test_candidates_and_several_prompts_are_one_offs() -> None:
    assert chat(n=3).request.session_id == "" and chat(n=3).request.n == 3
    parsed = CompletionRequest.model_validate_json(json.dumps({"prompt": ["a", "b"]}), strict=True)
    turns = translate.completion_requests(parsed, "npc", 2048, ["a", "b"]).turns
    assert [t.request.prompt for t in turns] == ["a", "b"] and all(t.request.session_id == "" for t in turns)
    # One request's generations, which the engine admits in turn with other requests'.
    assert turns[0].group and turns[0].group == turns[1].group
    one = CompletionRequest.model_validate_json(json.dumps({"prompt": "a"}), strict=True)
    assert translate.completion_requests(one, "npc", 2048, ["a"]).first.request.session_id == "npc"
    assert translate.completion_requests(one, "npc", 2048, ["a"]).first.group == ""


def test_token_id_prompts_go_on_as_token_ids() -> None:
    parsed = CompletionRequest.model_validate_json(json.dumps({"prompt": [[5, 6], [7]]}), strict=True)
    texts, ids = translate.prompt_texts(parsed)
    turns = translate.completion_requests(parsed, "npc", 2048, [*texts, *ids]).turns
    assert [list(t.request.prompt_tokens.ids) for t in turns] == [[5, 6], [7]]
    assert all(t.request.WhichOneof("input") == "prompt_tokens" and not t.request.session_id for t in turns)
    assert convert.generation_spec_from_pb(turns[0].request, 2048).prompt.token_ids == (5, 6)


def test_tool_choice_none_ignores_the_tools() -> None:
    turn = chat(tools=[{"type": "function", "function": {"name": "attack"}}], tool_choice="none")
    assert turn.request.json_schema == ""


ATTACK = {"type": "function", "function": {"name": "attack", "description": "strike a target",
                                             "parameters": {"type": "object", "properties": {"target": {"type": "string"}},
                                                            "required": ["target"]}}}
FLEE = {"type": "function", "function": {"name": "flee", "parameters": {"type": "object", "properties": {}}}}


def spec_of(turn: Turn):
    """The spec the core makes of the turn's request, as it would for gRPC."""
    return convert.generation_spec_from_pb(turn.request, 2048)


def test_tools_go_as_grpc_tools_a_schema_of_calls_and_instructions_for_the_session() -> None:
    """As over gRPC: the instructions are the prompt's tool_instructions, which the backend tells
    a session once and again only when they change, so the conversation the client resends
    stays the one the session holds."""
    turn = chat(tools=[ATTACK, FLEE], tool_choice="required",
                messages=[{"role": "system", "content": "You are a guard."}, {"role": "user", "content": "A thief!"}])
    assert [t.name for t in turn.request.tools] == ["attack", "flee"] and turn.request.tool_choice == "required"
    assert json.loads(turn.request.tools[0].parameters_json_schema) == ATTACK["function"]["parameters"]
    assert [(m.role, m.content) for m in turn.request.messages.messages][0] == ("system", "You are a guard.")
    spec = spec_of(turn)
    schema = json.loads(spec.json_schema)
    assert [c["properties"]["name"]["const"] for c in schema["anyOf"]] == ["attack", "flee"]
    assert '"name": "attack", "description": "strike a target"' in spec.prompt.tool_instructions
    named = json.loads(spec_of(chat(tools=[ATTACK, FLEE], tool_choice={"type": "function", "function": {"name": "flee"}})).json_schema)
    assert named["properties"]["name"] == {"const": "flee"}
    auto_turn = chat(tools=[ATTACK])
    assert auto_turn.request.tool_choice == "auto"  # OpenAI's default with tools; xlm.v1's is "required"
    # Auto's reply is words unless it opens a call, which is held to the calls' schema; no JSON
    # schema goes to a remote server (words are no JSON), the grammar admits both here.
    assert auto_turn.reads_calls
    auto = spec_of(auto_turn)
    assert auto.json_schema == "" and "xlm-words" in auto.grammar


def test_only_the_last_image_travels_with_the_request() -> None:
    first = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + PNG_1PX}}
    turn = chat(messages=[{"role": "user", "content": [first]}, {"role": "assistant", "content": "A tree."},
                          {"role": "user", "content": [{"type": "text", "text": "And now?"}, first]}])
    assert [m.content.count(IMAGE_MARKER) for m in turn.request.messages.messages] == [1, 0, 1]
    assert turn.image is not None and turn.image.encoded.startswith(b"\x89PNG")
    assert isinstance(turn.request, pb.GenerateRequest)


def test_tool_results_and_earlier_calls_are_written_into_the_conversation() -> None:
    messages = [{"role": "user", "content": "A thief!"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "attack", "arguments": '{"target": "thief"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "The thief flees."}]
    sent = [(m.role, m.content) for m in chat(tools=[ATTACK], messages=messages).request.messages.messages]
    # The tools' instructions are not in the conversation (they go as the prompt's tool_instructions).
    assert sent[1] == ("assistant", '{"name": "attack", "arguments": {"target": "thief"}}')
    assert sent[2] == ("user", "Result of attack: The thief flees.")  # the name, looked up by the call id


def test_replies_held_to_the_tools_grammar_parse_into_calls_or_text() -> None:
    """HTTP's message from what the core read (final.tool_calls; tool_calls.finish_with_call runs
    on every transport's replies), never a second parse of the call."""
    from sidecar.service import tool_calls as core_calls
    from sidecar.service.openai_http.replies import tool_message

    def message(text: str) -> dict:
        final = pb.GenerationFinal(finish_reason=pb.FINISH_REASON_STOP)
        core_calls.finish_with_call(final, text, ("attack",))
        return tool_message(text, final)

    call = message('{"name": "attack", "arguments": {"target": "orc"}}')
    assert call["content"] is None and call["tool_calls"][0]["function"] == {"name": "attack", "arguments": '{"target": "orc"}'}
    assert message("Halt! Who goes there?") == {"role": "assistant", "content": "Halt! Who goes there?"}  # auto's words
    assert message('{"reply": "Halt!"}')["content"] == "Halt!"  # words as JSON, as they were before
    assert message('{"name": "att')["content"] == '{"name": "att'  # cut by max_tokens: text
    # No grammar held a remote server's reply: JSON naming an undeclared function is words.
    assert "tool_calls" not in message('{"name": "dance", "arguments": {}}')