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

from sidecar.api import pb
from sidecar.errors import InvalidArgument
from sidecar.service import tool_calls
from sidecar.service.openai_http.request_models import ChatMessage, NamedToolChoice, Tool, ToolChoice

def reads_calls(tools: list[Tool] | None, choice: ToolChoice) -> bool:
    """Whether the reply is read for calls: tools given and not tool_choice "none". The core plans
    them from the xlm.v1 request (pb_tools), as gRPC's, and reads the reply's calls into the final
    chunk; a choice that asks for a call without tools is an error here."""
    if not tools or choice == "none":
        if isinstance(choice, NamedToolChoice) or choice == "required":
            raise InvalidArgument("tool_choice asks for a tool call but no tools are given")
        return False
    return True


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


def openai_calls(final: pb.GenerationFinal) -> list[dict]:
    """The calls the core read from the reply (final.tool_calls), in OpenAI's shape."""
    return [{"id": "call_" + secrets.token_hex(8), "type": "function",
             "function": {"name": c.name, "arguments": c.arguments_json}} for c in final.tool_calls]


def words(text: str) -> str | None:
    """A reply the core read no call from: its words (tool_calls.read_reply: unwrapped where they
    came as JSON, as replies once did). No name counts here: the calls are the core's."""
    return tool_calls.read_reply(text, names=()).content
