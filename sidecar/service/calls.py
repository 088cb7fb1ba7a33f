"""The one table of xlm.v1.Sidecar's calls, which both transports (gRPC and the WebSocket bridge)
serve: message types and streaming from the proto's descriptor, and which core coroutine runs each.

A new RPC in the proto fails at import until it gets a line in `_INVOKE`, so neither transport
can silently lack it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from google.protobuf.message import Message

from sidecar.api import pb
from sidecar.service.caller import Caller
from sidecar.service.core import SidecarService
from sidecar.service.turn import Turn

SERVICE = pb.DESCRIPTOR.services_by_name["Sidecar"]

# What each call does, in the service core, given its request and who called (caller.py). Streaming
# calls return an async iterator of responses, unary ones an awaitable response.
Invoke = Callable[[SidecarService, Message, Caller], AsyncIterator[Message] | Awaitable[Message]]
_INVOKE: dict[str, Invoke] = {
    "Generate": lambda core, request, caller: core.generate(Turn(request)),
    "AskImage": lambda core, request, caller: core.ask_image(request),
    "SetBudget": lambda core, request, caller: core.set_budget(request),
    "WatchState": lambda core, request, caller: core.watch_state(),
    "GetStatus": lambda core, request, caller: core.get_status(),
    "EndSession": lambda core, request, caller: core.end_session(request),
    "Embed": lambda core, request, caller: core.embed(request),
    "Tokenize": lambda core, request, caller: core.tokenize(request),
    "Detokenize": lambda core, request, caller: core.detokenize(request),
    "ReportFrames": lambda core, request, caller: core.report_frames(request, caller),
    "ExportSessions": lambda core, request, caller: core.saves.export_sessions(request),
    "ImportSessions": lambda core, request, caller: core.saves.import_sessions(request),
    "Remember": lambda core, request, caller: core.memories.remember(request),
    "Recall": lambda core, request, caller: core.memories.recall_memories(request),
    "Forget": lambda core, request, caller: core.memories.forget(request),
    "ListMemories": lambda core, request, caller: core.memories.list_memories(request),
}


@dataclass(frozen=True)
class Call:
    """One RPC: its name as the proto spells it ("Generate"), message types and shape."""

    name: str
    request_type: type[Message]
    response_type: type[Message]
    streaming: bool
    invoke: Invoke


def _calls() -> dict[str, Call]:
    calls = {}
    for method in SERVICE.methods:
        if method.client_streaming:
            raise TypeError(f"{method.name}: client-streaming calls are not served by the transports")
        if method.name not in _INVOKE:
            raise TypeError(f"{method.name} is declared in the proto but has no entry in sidecar.service.calls")
        calls[method.name] = Call(
            name=method.name,
            request_type=getattr(pb, method.input_type.name),
            response_type=getattr(pb, method.output_type.name),
            streaming=method.server_streaming,
            invoke=_INVOKE[method.name],
        )
    return calls


CALLS: dict[str, Call] = _calls()
