"""Tools on the gRPC API (GenerateRequest.tools, the call in the final chunk), on the real SmolLM2."""

from __future__ import annotations

import json

import grpc
import jsonschema
import pytest

from sidecar.api import pb

pytestmark = pytest.mark.slow
ATTACK = {"type": "object", "additionalProperties": False, "required": ["target"],
          "properties": {"target": {"type": "string", "maxLength": 30}}}
TOOLS = [pb.Tool(name="attack", description="attack a target", parameters_json_schema=json.dumps(ATTACK)),
         pb.Tool(name="flee", description="run away")]


def request(**kwargs) -> pb.GenerateRequest:
    messages = [pb.ChatMessage(role="system", content="You are a town guard."),
                pb.ChatMessage(role="user", content="A thief runs past you!")]
    kwargs.setdefault("max_tokens", 60)
    return pb.GenerateRequest(messages=pb.ChatMessages(messages=messages), tools=TOOLS,
                              sampling=pb.SamplingParams(temperature=0.0), **kwargs)


def test_a_call_of_a_declared_tool_comes_in_the_final_chunk(client) -> None:
    final = client.complete(request()).final
    assert final.finish_reason == pb.FINISH_REASON_TOOL_CALL
    assert final.tool_call.name in ("attack", "flee")
    arguments = json.loads(final.tool_call.arguments_json)
    if final.tool_call.name == "attack":
        jsonschema.validate(arguments, ATTACK)
    named = client.complete(request(tool_choice="attack")).final
    assert named.tool_call.name == "attack"
    jsonschema.validate(json.loads(named.tool_call.arguments_json), ATTACK)


def test_tool_choice_none_is_free_text_and_tools_need_messages(client) -> None:
    reply = client.complete(request(tool_choice="none", max_tokens=12))
    assert not reply.final.HasField("tool_call") and reply.final.finish_reason != pb.FINISH_REASON_TOOL_CALL
    with pytest.raises(grpc.RpcError) as e:
        client.complete(pb.GenerateRequest(prompt="Hi", tools=TOOLS, max_tokens=4))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as e:
        client.complete(request(tool_choice="dance"))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "dance" in e.value.details()
