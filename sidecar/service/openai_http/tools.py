"""`tools` and `tool_choice` over HTTP: OpenAI's shapes around sidecar.service.tool_calls.

- "required" or a named function: the reply is a call of one of them;
- "auto" (the default with tools): a call, or words;
- "none" (or no tools): free text, the tools ignored.
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


def tool_spec(tools: list[Tool] | None, choice: ToolChoice) -> ToolSpec | None:
    if not tools or choice == "none":
        if isinstance(choice, NamedToolChoice) or choice == "required":
            raise InvalidArgument("tool_choice asks for a tool call but no tools are given")
        return None
    functions = [tool_calls.Function(t.function.name, t.function.description or "", t.function.parameters) for t in tools]
    name = choice.function.name if isinstance(choice, NamedToolChoice) else (choice or "auto")
    return tool_calls.plan(functions, name)


def pb_tools(tools: list[Tool]) -> list[pb.Tool]:
    """OpenAI's tools as xlm.v1 tools, which the core checks and plans as gRPC's."""
    return [pb.Tool(name=t.function.name, description=t.function.description or "",
                    parameters_json_schema=json.dumps(t.function.parameters) if t.function.parameters is not None else "")
            for t in tools]


def pb_tool_choice(choice: ToolChoice) -> str:
    """xlm.v1's tool_choice: "auto", "required", or the function's name (OpenAI's default with
    tools is "auto"; xlm.v1's is "required")."""
    return choice.function.name if isinstance(choice, NamedToolChoice) else (choice or "auto")


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
    read = tool_calls.read_reply(text)
    if read.name is None:
        return ToolReply(read.content, [])
    call = {"id": "call_" + secrets.token_hex(8), "type": "function",
            "function": {"name": read.name, "arguments": json.dumps(read.arguments)}}
    return ToolReply(None, [call])
