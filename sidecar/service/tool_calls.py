"""Function calls for NPC actions, for every transport: the grammar a reply is held to, the words
that tell the model about the functions, and the call read back from the reply.

A call is JSON under a schema built from the functions' own schemas, through the same
json_schema grammar path as structured replies: an object whose "name" is one declared function
and whose "arguments" fit its parameters; with several calls allowed (parallel_tool_calls) also an
array of 1 to MAX_PARALLEL_CALLS call objects. So a call is always valid JSON naming a declared
function. With `auto` the reply is words unless it opens with a call's `{` (or `[`): words are the
model's own plain text, and only a reply that starts a call is held to the call grammar, as
llama-server's lazy grammars do (call_or_words_grammar).
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
# Calls one reply may hold when several are allowed: OpenAI sets no number; a handful is what an
# NPC does in one beat, and the grammar stays small.
MAX_PARALLEL_CALLS = 8
# A function declared without parameters takes none (OpenAI: "omitting parameters defines a
# function with an empty parameter list"), so its arguments are {}. Any object, as they were,
# let a model that picked such a function write one until max_tokens (SmolLM2 put another
# function's parameters into it), and the call came back as cut text.
NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}

@dataclass(frozen=True)
class Function:
    name: str
    description: str = ""
    parameters: dict[str, Any] | None = None


@dataclass(frozen=True)
class ToolPlan:
    json_schema: str  # what a call must fit (with `auto`, the reply may be words instead)
    instructions: str
    auto: bool  # the model may answer in words instead
    parallel: bool = False  # the reply may be an array of calls
    names: tuple[str, ...] = ()  # the functions a call may name


@dataclass(frozen=True)
class Call:
    name: str
    arguments: dict


@dataclass(frozen=True)
class ReadReply:
    content: str | None  # words (auto), or the text itself when it is no whole JSON (cut short)
    calls: tuple[Call, ...] = ()


def plan(functions: list[Function], choice: str | None, parallel: bool = False) -> ToolPlan:
    """choice: "auto", "required", or one function's name. `parallel` also admits an array of
    calls (not with a named function: that is one call of it)."""
    parallel = parallel and choice in ("auto", "required")
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
        "properties": {"name": {"const": f.name}, "arguments": f.parameters or NO_PARAMETERS},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    } for f in chosen]
    if parallel:
        one = calls[0] if len(calls) == 1 else {"anyOf": list(calls)}
        calls.append({"type": "array", "items": one, "minItems": 1, "maxItems": MAX_PARALLEL_CALLS})
    auto = choice == "auto"
    schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
    return ToolPlan(json.dumps(schema), _instructions(chosen, auto, parallel), auto, parallel,
                    tuple(f.name for f in chosen))


def _instructions(chosen: list[Function], auto: bool, parallel: bool) -> str:
    # The functions as a JSON list, as llama.cpp's template polyfill shows them: SmolLM2 named the
    # function that fits more often than from a line per function (bench/tool_choice.py's tool
    # prompts under "required", greedy and 6 seeds: 30 of 42 calls, against 21). The shapes are
    # told in words, never as a template with placeholders: small models copied
    # {"reply": "<your answer>"} as their answer (issue 28).
    listed = [{"name": f.name, "description": f.description, "parameters": f.parameters or NO_PARAMETERS}
              for f in chosen]
    lines = ["You have access to the following functions:", json.dumps(listed, ensure_ascii=False), ""]
    shape = ('a JSON object of two keys, "name", the function\'s name, and "arguments", an object of its '
             "parameters")
    if auto:
        lines.append(f"When the user asks for something one of them does, call it: reply with only {shape}.")
    else:
        lines.append(f"To call one, reply with {shape}.")
    if parallel:
        lines[-1] += (" To call several at once, reply with a JSON array of such objects "
                      f"(at most {MAX_PARALLEL_CALLS}).")
    if auto:
        # Words are the usual reply: before, auto's grammar made every reply JSON, {"name": ...} or
        # {"reply": ...}, and the instructions told the call first; SmolLM2 then opened nearly
        # every reply with "name", calling a function for "Hello, who are you?" (issue 36).
        lines[-1] += " Otherwise answer in words."
    return "\n".join(lines)


def call_or_words_grammar(call_grammar: str, parallel: bool) -> str:
    """tool_choice "auto": `call_grammar` (GBNF of the calls, from the plan's json_schema) for a
    reply that opens with a call's `{` (or, with parallel calls, `[`), plain words otherwise.

    Held to JSON throughout, every auto reply had to pick a key first, "name" or "reply", and a
    small model picked "name" for anything; as plain text it answers as it would without tools,
    and calls when it opens one itself (llama-server's lazy grammar, triggered by the call's start)."""
    lines = call_grammar.split("\n")
    roots = [i for i, line in enumerate(lines) if line.startswith("root ::=")]
    if len(roots) != 1:
        raise ValueError("the calls' grammar has no single root rule")
    lines[roots[0]] = "xlm-call ::=" + lines[roots[0]][len("root ::="):]
    opens = "{[" if parallel else "{"
    lines += ["root ::= [ \\t\\n]* (xlm-call | xlm-words)",
              f"xlm-words ::= [^{opens} \\t\\n] .*"]
    return "\n".join(lines)


def read_reply(text: str, names: tuple[str, ...] | None = None) -> ReadReply:
    """A reply under the plan: one call, an array of calls, or words. One cut short (max_tokens)
    is no whole JSON: it stays text, and the finish reason says why. `names`: the declared
    functions, where no grammar held the reply (a remote server's): JSON naming any other is words."""
    try:
        value = json.loads(text)
    except ValueError:
        return ReadReply(text)
    # Auto's words as JSON: what replies were before plain words (a session's history, a remote
    # server told the old way).
    if isinstance(value, dict) and isinstance(value.get("reply"), str) and "name" not in value:
        return ReadReply(value["reply"])
    items = value if isinstance(value, list) else [value]
    calls = tuple(Call(v["name"], v["arguments"] if isinstance(v.get("arguments"), dict) else {})
                  for v in items if isinstance(v, dict) and isinstance(v.get("name"), str)
                  and (names is None or v["name"] in names))
    if calls and len(calls) == len(items):
        return ReadReply(None, calls)
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
    return plan(functions, choice, request.parallel_tool_calls)


def finish_with_call(final, text: str, names: tuple[str, ...] | None = None) -> None:
    """Set the final chunk's calls (and finish reason) when the reply is one or several of the
    functions `names` (read_reply). Every transport reads the calls from here."""
    from sidecar.api import pb

    read = read_reply(text, names)
    if read.calls:
        calls = [pb.ToolCall(name=c.name, arguments_json=json.dumps(c.arguments)) for c in read.calls]
        final.tool_call.CopyFrom(calls[0])  # what a client written before parallel calls reads
        final.tool_calls.extend(calls)
        final.finish_reason = pb.FINISH_REASON_TOOL_CALL
