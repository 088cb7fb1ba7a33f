"""`tools` and `tool_choice`: function calls for NPC actions.

Not built yet: a request that asks for tool calls is refused with a 400 naming the field, rather
than answered with free text the client would take for a reply. `tool_choice: "none"` (the
client lists tools but wants text) is honoured by ignoring the tools.
"""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.errors import InvalidArgument
from sidecar.service.openai_http.request_models import ChatMessage, Tool, ToolChoice


@dataclass(frozen=True)
class ToolSpec:
    json_schema: str


def tool_spec(tools: list[Tool] | None, choice: ToolChoice) -> ToolSpec | None:
    if not tools or choice == "none":
        return None
    raise InvalidArgument("tools (function calling) are not supported by this server yet; send tool_choice \"none\" or no tools")


def with_tool_instructions(conversation: list[tuple[str, str]], spec: ToolSpec) -> list[tuple[str, str]]:
    return conversation


def tool_result_message(message: ChatMessage) -> tuple[str, str]:
    raise InvalidArgument("role \"tool\" messages are not supported by this server yet")


def assistant_call_message(message: ChatMessage) -> tuple[str, str]:
    raise InvalidArgument("assistant messages with tool_calls are not supported by this server yet")
