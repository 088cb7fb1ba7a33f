"""`tools` and `tool_choice` over HTTP: OpenAI's shapes around sidecar.service.tool_calls.

- "required" or a named function: the reply is a call of one of them;
- "auto" (the default with tools): a call, or words;
- "none" (or no tools): free text, the tools ignored;
- `parallel_tool_calls: true` (only when set: one call is what small models do well): the reply
  may also be several calls at once.
Calls come back as OpenAI `tool_calls` with finish_reason "tool_calls"; `role: "tool"` results and
the assistant's earlier calls are written back into the conversation as text the model reads.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass

from sidecar.api import pb
from sidecar.errors import InvalidArgument
from sidecar.service import tool_calls
from sidecar.service.openai_http.request_models import ChatMessage, NamedToolChoice, Tool, ToolChoice

ToolSpec = tool_calls.ToolPlan


def tool_spec(tools: list[Tool] | None, choice: ToolChoice, parallel: bool = False) -> ToolSpec | None:
    if not tools or choice == "none":
        if isinstance(choice, NamedToolChoice) or choice == "required":
            raise InvalidArgument("tool_choice asks for a tool call but no tools are given")
        return None
    functions = [tool_calls.Function(t.function.name, t.function.description or "", t.function.parameters) for t in tools]
    name = choice.function.name if isinstance(choice, NamedToolChoice) else (choice or "auto")
    return tool_calls.plan(functions, name, parallel)


def pb_tools(tools: list[Tool]) -> list[pb.Tool]:
    """OpenAI's tools as xlm.v1 tools, which the core checks and plans as gRPC's."""
    return [pb.Tool(name=t.function.name, description=t.function.description or "",
                    parameters_json_schema=json.dumps(t.function.parameters) if t.function.parameters is not None else "")
            for t in tools]


def pb_tool_choice(choice: ToolChoice) -> str:
    """xlm.v1's tool_choice: "auto", "required", or the function's name (OpenAI's default with
    tools is "auto"; xlm.v1's is "required")."""
    return choice.function.name if isinstance(choice, NamedToolChoice) else (choice or "auto")


def tool_result_message(message: ChatMessage, call_names: dict[str, str]) -> tuple[str, str]:
    """A tool's result as the user message gRPC clients send ("Result of <name>: ..."). OpenAI's
    tool messages name their call by id only; the function's name is the model's handle on it,
    so it is looked up among the earlier calls (`call_names`, id -> name)."""
    content = message.content if isinstance(message.content, str) else json.dumps(
        [p.model_dump() for p in message.content or []])
    who = message.name or call_names.get(message.tool_call_id or "") or message.tool_call_id or "the function"
    return "user", f"Result of {who}: {content}"


def assistant_call_message(message: ChatMessage) -> tuple[str, str]:
    """The assistant's earlier calls as the JSON it was asked to write: one call as its object,
    several as an array of them (what a parallel_tool_calls reply is)."""
    calls = []
    for call in message.tool_calls:
        try:
            arguments = json.loads(call.function.arguments)
        except ValueError:
            raise InvalidArgument("tool_calls arguments must be JSON text") from None
        calls.append({"name": call.function.name, "arguments": arguments})
    return "assistant", json.dumps(calls[0] if len(calls) == 1 else calls)


@dataclass(frozen=True)
class ToolReply:
    content: str | None
    calls: list[dict]


def parse_reply(text: str, spec: ToolSpec) -> ToolReply:
    read = tool_calls.read_reply(text, spec.names)
    calls = [{"id": "call_" + secrets.token_hex(8), "type": "function",
              "function": {"name": c.name, "arguments": json.dumps(c.arguments)}} for c in read.calls]
    return ToolReply(None if calls else read.content, calls)
