"""llama.cpp's test_tool_call, as scenarios against this daemon (the port and what it leaves out are
listed in test_llama_server_scenarios.py)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from support.llama_server_support import CODING, GREEDY, LIMIT
from support.llama_server_support import api  # noqa: F401 (a fixture)

pytestmark = pytest.mark.slow
TEST_TOOL = {"type": "function", "function": {"name": "test", "description": "", "parameters": {
    "type": "object", "properties": {"success": {"type": "boolean", "const": True}}, "required": ["success"]}}}
PYTHON_TOOL = {"type": "function", "function": {
    "name": "python", "description": "Runs code in an ipython interpreter and returns the result of the execution after 60 seconds.",
    "parameters": {"type": "object", "properties": {"code": {"type": "string", "description": "The code to run in the ipython interpreter."}},
                   "required": ["code"]}}}
CALCULATE = {"type": "function", "function": {
    "name": "calculate", "description": "A calculator function that computes values of arithmetic expressions in the Python syntax",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string", "description": "An arithmetic expression"}},
                   "required": ["expression"]}}}


# -- tool calls --------------------------------------------------------------------------------


def _gathered(stream) -> tuple[dict, str | None]:
    """A streamed chat reply as one message (tool call deltas put together by index)."""
    content, calls, finish = "", {}, None
    for chunk in stream:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for delta in choice.delta.tool_calls or ():
                call = calls.setdefault(delta.index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
                call["id"] = delta.id or call["id"]
                if delta.function is not None:
                    call["function"]["name"] += delta.function.name or ""
                    call["function"]["arguments"] += delta.function.arguments or ""
            finish = choice.finish_reason or finish
    return {"content": content or None, "tool_calls": [calls[i] for i in sorted(calls)] or None}, finish


def _reply(client: openai.OpenAI, stream: bool, **body) -> tuple[dict, str | None]:
    """(the assistant message as a dict, the finish reason), whole or gathered from the stream."""
    if stream:
        return _gathered(client.chat.completions.create(**body, stream=True))
    reply = client.chat.completions.create(**body)
    return reply.choices[0].message.model_dump(), reply.choices[0].finish_reason


@pytest.mark.parametrize("stream", [False, True], ids=["normal", "streamed"])
@pytest.mark.parametrize("tool, key", [(TEST_TOOL, "success"), (PYTHON_TOOL, "code")], ids=["test", "python"])
def test_required_tool_gives_one_call(client: openai.OpenAI, tool: dict, key: str, stream: bool) -> None:
    """test_tool_call::do_test_completion_with_required_tool_tiny: tool_choice "required" with
    parallel_tool_calls false is one call of the tool, no content, JSON arguments with the key."""
    message, finish = _reply(client, stream, model="x", messages=CODING, max_tokens=LIMIT, tools=[tool],
                             tool_choice="required", parallel_tool_calls=False, **GREEDY)
    if finish == "length" and tool is PYTHON_TOOL:
        # Its code is any string: one past max_tokens is cut, and a cut call is text, never a call.
        assert message["tool_calls"] is None and message["content"], message
        return
    assert finish == "tool_calls", (finish, message)
    calls = message["tool_calls"]
    assert calls and len(calls) == 1, message
    assert message["content"] in (None, ""), message
    assert calls[0]["function"]["name"] == tool["function"]["name"] and calls[0]["id"]
    arguments = calls[0]["function"]["arguments"]
    assert isinstance(arguments, str) and key in json.loads(arguments)
    if tool is TEST_TOOL:
        assert json.loads(arguments) == {"success": True}  # its schema's one value


@pytest.mark.parametrize("stream", [False, True], ids=["normal", "streamed"])
@pytest.mark.parametrize("tools, tool_choice", [(None, None), ([TEST_TOOL], None), ([PYTHON_TOOL], "none")],
                         ids=["no-tools", "auto", "none"])
def test_no_tool_call(client: openai.OpenAI, tools, tool_choice, stream: bool) -> None:
    """test_tool_call::test_completion_without_tool_call_fast: no tools, TEST_TOOL with no
    tool_choice (auto), or tool_choice "none". The auto case is the model's choice: under auto the
    reply is words unless the model opens a call (tests/transports/test_tool_choice_auto.py holds the grammar
    to that), and greedy SmolLM2 opens this one with a word, `{` about 0.3% likely (issue 36: it
    called `test` while auto's replies were all JSON)."""
    body = {"model": "x", "messages": [CODING[0], {"role": "user", "content": "say hello world with python"}], "max_tokens": 32}
    if tools is not None:
        body.update(tools=tools)
    if tool_choice is not None:
        body.update(tool_choice=tool_choice)
    if tools == [TEST_TOOL]:
        body.update(GREEDY)
    message, finish = _reply(client, stream, **body)
    assert message.get("tool_calls") is None and finish in ("stop", "length") and isinstance(message["content"], str)


def _calc_conversation(expressions: list[str], results: list[str]) -> list[dict]:
    calls = [{"id": f"call_{6789 + i}", "type": "function",
              "function": {"name": "calculate", "arguments": json.dumps({"expression": e})}} for i, e in enumerate(expressions)]
    return [{"role": "system", "content": "You are a tools-calling assistant. You express numerical values with at most two decimals."},
            {"role": "user", "content": "What's the y coordinate of a point on the unit sphere at angle 30 degrees?"},
            {"role": "assistant", "content": None, "tool_calls": calls},
            *({"role": "tool", "name": "calculate", "content": r, "tool_call_id": c["id"]} for c, r in zip(calls, results))]


@pytest.mark.parametrize("stream", [False, True], ids=["normal", "streamed"])
def test_earlier_calls_and_their_results_go_back(client: openai.OpenAI, raw: httpx.Client, stream: bool) -> None:
    """test_tool_call::do_test_calc_result: a conversation holding an earlier call and its result
    is taken, and the reply is words or a call of a declared tool (which, the model's choice); an
    assistant message with two calls keeps both, with both results."""
    one = _calc_conversation(["sin(30 * pi / 180)"], ["0.55644242476"])
    # The second expression is longer than a message's own framing: the bound below needs it.
    second = "cos(30 * pi / 180) * sqrt(1 - sin(30 * pi / 180) ** 2) / (1 + tan(15 * pi / 180))"
    two = _calc_conversation(["sin(30 * pi / 180)", second], ["0.55644242476", "0.86602540378"])
    for messages in (one, two):
        message, finish = _reply(client, stream, model="x", messages=messages, tools=[CALCULATE], max_tokens=128, **GREEDY)
        if message["tool_calls"]:
            assert finish == "tool_calls" and all(c["function"]["name"] == "calculate" for c in message["tool_calls"])
            assert all("expression" in json.loads(c["function"]["arguments"]) for c in message["tool_calls"])
        else:
            assert isinstance(message["content"], str) and finish in ("stop", "length")
        words, _ = _reply(client, stream, model="x", messages=messages, tools=[CALCULATE], tool_choice="none",
                          max_tokens=8, **GREEDY)
        assert words["tool_calls"] is None and isinstance(words["content"], str)

    def prompt_tokens(messages: list[dict]) -> int:
        return client.chat.completions.create(model="x", messages=messages, tools=[CALCULATE], tool_choice="none",
                                              max_tokens=1).usage.prompt_tokens

    def count(text: str) -> int:
        return len(raw.post("/tokenize", json={"content": text}).json()["tokens"])

    # The second call's expression and its result reached the model, besides all of the first's.
    assert prompt_tokens(two) >= prompt_tokens(one) + count(second) + count("0.86602540378")
