"""Function calls for NPC actions, for every transport: the grammar a reply is held to, the words
that tell the model about the functions, and the call read back from the reply.

The reply is JSON under a schema built from the functions' own schemas, through the same
json_schema grammar path as structured replies: {"name": <one declared function>, "arguments":
<fits its parameters>}, or with `auto` also {"reply": "<words>"}. So a call is always valid JSON
naming a declared function.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from sidecar.errors import InvalidArgument
from sidecar.service.schema_bounds import check_schema, parse_schema

MAX_TOOLS = 64
# OpenAI's rule for function names, for gRPC and the bridge as for HTTP.
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


@dataclass(frozen=True)
class Function:
    name: str
    description: str = ""
    parameters: dict[str, Any] | None = None


@dataclass(frozen=True)
class ToolPlan:
    json_schema: str
    instructions: str
    auto: bool  # the model may answer in words instead


@dataclass(frozen=True)
class ReadReply:
    content: str | None  # words (auto), or the text itself when it is no whole JSON (cut short)
    name: str | None = None
    arguments: dict | None = None


def plan(functions: list[Function], choice: str | None) -> ToolPlan:
    """choice: "auto", "required", or one function's name."""
    if len(functions) > MAX_TOOLS:
        raise InvalidArgument(f"at most {MAX_TOOLS} tools")
    for f in functions:  # one rule for every transport's tools
        if not TOOL_NAME.fullmatch(f.name):
            raise InvalidArgument(f"tool name {f.name!r} must be 1 to 64 letters, digits, '_' or '-' "
                                  "(it is written into the system message)")
        if f.parameters is not None:
            if f.parameters.get("type", "object") != "object" or not isinstance(f.parameters.get("properties", {}), dict):
                raise InvalidArgument(f"tool {f.name!r}: parameters must be an object schema (the call's "
                                      f"arguments are a JSON object), not {json.dumps(f.parameters)[:80]}")
            check_schema(f.parameters, f"tool {f.name!r} parameters")
    by_name = {f.name: f for f in functions}
    if len(by_name) != len(functions):
        raise InvalidArgument("tool names must be unique")
    chosen = functions
    if choice not in ("auto", "required"):
        if choice not in by_name:
            raise InvalidArgument(f"tool_choice names {choice!r}, which is not among the tools")
        chosen = [by_name[choice]]
    calls: list[dict] = [{
        "type": "object",
        "properties": {"name": {"const": f.name}, "arguments": f.parameters or {"type": "object"}},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    } for f in chosen]
    auto = choice == "auto"
    if auto:
        calls.append({"type": "object", "properties": {"reply": {"type": "string"}}, "required": ["reply"],
                      "additionalProperties": False})
    schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
    lines = ["You can call these functions. To call one, reply with JSON: "
             '{"name": "<function>", "arguments": {<its parameters>}}.']
    if auto:
        lines.append('To answer in words instead, reply with JSON: {"reply": "<your answer>"}.')
    for f in chosen:
        lines.append(f"- {f.name}: {f.description} Parameters: {json.dumps(f.parameters or {'type': 'object'})}")
    return ToolPlan(json.dumps(schema), "\n".join(lines), auto)


def read_reply(text: str) -> ReadReply:
    """A reply held to the plan's grammar. One cut short (max_tokens) is no whole JSON: it stays
    text, and the finish reason says why."""
    try:
        value = json.loads(text)
    except ValueError:
        return ReadReply(text)
    if isinstance(value, dict) and isinstance(value.get("name"), str):
        arguments = value.get("arguments", {})
        return ReadReply(None, value["name"], arguments if isinstance(arguments, dict) else {})
    if isinstance(value, dict) and isinstance(value.get("reply"), str):
        return ReadReply(value["reply"])
    return ReadReply(text)


# -- xlm.v1 (gRPC and the WebSocket bridge) -----------------------------------------------------


def plan_from_pb(request) -> ToolPlan | None:
    """The plan of a GenerateRequest's tools; None without tools or with tool_choice "none"."""
    choice = request.tool_choice or "required"
    if not request.tools or choice == "none":
        return None
    if request.WhichOneof("input") != "messages":
        raise InvalidArgument("tools need chat messages, not a raw prompt")
    functions = []
    for t in request.tools:
        parameters = parse_schema(t.parameters_json_schema, f"tool {t.name!r}: parameters_json_schema") \
            if t.parameters_json_schema else None
        if parameters is not None and not isinstance(parameters, dict):
            raise InvalidArgument(f"tool {t.name!r}: parameters_json_schema must be a JSON object")
        if not t.name:
            raise InvalidArgument("every tool needs a name")
        functions.append(Function(t.name, t.description, parameters))
    return plan(functions, choice)


def finish_with_call(final, text: str) -> None:
    """Set the final chunk's tool_call (and finish reason) when the reply is a call."""
    from sidecar.api import pb

    read = read_reply(text)
    if read.name is not None:
        final.tool_call.CopyFrom(pb.ToolCall(name=read.name, arguments_json=json.dumps(read.arguments)))
        final.finish_reason = pb.FINISH_REASON_TOOL_CALL
