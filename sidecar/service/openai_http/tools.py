"""`tools` and `tool_choice`: function calls for NPC actions, over HTTP.

The reply is held to a grammar built from the declared functions' JSON schemas (through the same
json_schema path as gRPC's), so a call is always valid JSON naming one declared function with
arguments that fit its schema:
- "required" or a named function: the reply is {"name": ..., "arguments": {...}} for one of them;
- "auto": the reply is that, or {"reply": "text"} when the model answers in words;
- "none" (or no tools): free text, the tools ignored.
The functions are described to the model in the system message. Calls come back as OpenAI
`tool_calls` with finish_reason "tool_calls"; `role: "tool"` results and the assistant's earlier
calls are written back into the conversation as text the model reads.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass

from sidecar.errors import InvalidArgument
from sidecar.service.openai_http.request_models import ChatMessage, NamedToolChoice, Tool, ToolChoice

MAX_TOOLS = 64


@dataclass(frozen=True)
class ToolSpec:
    json_schema: str
    instructions: str
    auto: bool  # the model may answer in words instead


def tool_spec(tools: list[Tool] | None, choice: ToolChoice) -> ToolSpec | None:
    if not tools or choice == "none":
        if isinstance(choice, NamedToolChoice) or choice == "required":
            raise InvalidArgument("tool_choice asks for a tool call but no tools are given")
        return None
    if len(tools) > MAX_TOOLS:
        raise InvalidArgument(f"at most {MAX_TOOLS} tools")
    functions = {t.function.name: t.function for t in tools}
    if len(functions) != len(tools):
        raise InvalidArgument("tool function names must be unique")
    chosen = list(functions.values())
    if isinstance(choice, NamedToolChoice):
        if choice.function.name not in functions:
            raise InvalidArgument(f"tool_choice names {choice.function.name!r}, which is not among the tools")
        chosen = [functions[choice.function.name]]
    calls = [{
        "type": "object",
        "properties": {"name": {"const": f.name}, "arguments": f.parameters or {"type": "object"}},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    } for f in chosen]
    auto = choice in (None, "auto")
    if auto:
        calls.append({"type": "object", "properties": {"reply": {"type": "string"}}, "required": ["reply"],
                      "additionalProperties": False})
    schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
    lines = ["You can call these functions. To call one, reply with JSON: "
             '{"name": "<function>", "arguments": {<its parameters>}}.']
    if auto:
        lines.append('To answer in words instead, reply with JSON: {"reply": "<your answer>"}.')
    for f in chosen:
        lines.append(f"- {f.name}: {f.description or ''} Parameters: {json.dumps(f.parameters or {'type': 'object'})}")
    return ToolSpec(json.dumps(schema), "\n".join(lines), auto)


def with_tool_instructions(conversation: list[tuple[str, str]], spec: ToolSpec) -> list[tuple[str, str]]:
    """The functions described in the system message (a new one first when there is none)."""
    if conversation and conversation[0][0] == "system":
        return [("system", f"{conversation[0][1]}\n\n{spec.instructions}")] + conversation[1:]
    return [("system", spec.instructions)] + conversation


def tool_result_message(message: ChatMessage) -> tuple[str, str]:
    content = message.content if isinstance(message.content, str) else json.dumps(
        [p.model_dump() for p in message.content or []])
    who = message.name or message.tool_call_id or "the function"
    return "user", f"Result of {who}: {content}"


def assistant_call_message(message: ChatMessage) -> tuple[str, str]:
    """The assistant's earlier call as the JSON it would have written."""
    call = message.tool_calls[0].function
    try:
        arguments = json.loads(call.arguments)
    except ValueError:
        raise InvalidArgument("tool_calls arguments must be JSON text") from None
    return "assistant", json.dumps({"name": call.name, "arguments": arguments})


@dataclass(frozen=True)
class ToolReply:
    content: str | None
    calls: list[dict]


def parse_reply(text: str, spec: ToolSpec) -> ToolReply:
    """The grammar-held reply as OpenAI's message fields. A reply cut short (max_tokens) is not
    whole JSON: it comes back as text, with finish_reason "length" telling why."""
    try:
        value = json.loads(text)
    except ValueError:
        return ToolReply(text, [])
    if isinstance(value, dict) and "name" in value:
        call = {"id": "call_" + secrets.token_hex(8), "type": "function",
                "function": {"name": value["name"], "arguments": json.dumps(value.get("arguments", {}))}}
        return ToolReply(None, [call])
    if isinstance(value, dict) and isinstance(value.get("reply"), str):
        return ToolReply(value["reply"], [])
    return ToolReply(text, [])
