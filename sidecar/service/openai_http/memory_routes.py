"""NPC memory over HTTP (an extension: OpenAI has no such routes), the same calls as gRPC's
Remember, Recall, Forget and ListMemories, with the proto's JSON field names:

    POST /v1/memories          {"scope": "smith/p1", "texts": ["..."], "tags": ["lore"]}
        -> {"object": "memories", "memories": [{"id": "1", "scope", "text", "tags", ...}]}
    POST /v1/memories/search   {"scopes": ["smith/p1", "village"], "query": "...", "k": 4}
        -> {"object": "memories.search", "memories": [{"memory": {...}, "score": 0.61}]}
    POST /v1/memories/forget   {"ids": ["3"]} or {"tags": ["quest"], "scope": "..."} or {"scope": "..."}
        -> {"object": "memories.forget", "forgotten": 1}
    GET  /v1/memories?scope=smith/p1&tag=lore&offset=0&limit=100
        -> {"object": "list", "memories": [...], "total": N}

A chat completion reads a session's memories by the extension field `memory` (the proto's
MemoryOptions: scope, read_scopes, max_tokens, k, tags, off).
"""

from __future__ import annotations

from google.protobuf import json_format
from google.protobuf.message import Message
from starlette.requests import Request
from starlette.responses import JSONResponse

from sidecar.api import pb
from sidecar.service.core import SidecarService
from sidecar.service.openai_http.errors import InvalidBody
from sidecar.service.openai_http.session_routes import read_body

MAX_MEMORY_BODY = 1 << 20


async def _body(request: Request, into: Message) -> Message:
    raw = await read_body(request, MAX_MEMORY_BODY)
    try:
        json_format.Parse(raw or b"{}", into)
    except json_format.ParseError as e:
        raise InvalidBody(f"invalid memory request: {e}", None) from None
    return into


def _json(message: Message, kind: str) -> JSONResponse:
    body = json_format.MessageToDict(message, preserving_proto_field_name=True)
    return JSONResponse({"object": kind, **body})


async def remember(core: SidecarService, request: Request) -> JSONResponse:
    reply = await core.memories.remember(await _body(request, pb.RememberRequest()))
    return _json(reply, "memories")


async def search(core: SidecarService, request: Request) -> JSONResponse:
    reply = await core.memories.recall_memories(await _body(request, pb.RecallRequest()))
    return _json(reply, "memories.search")


async def forget(core: SidecarService, request: Request) -> JSONResponse:
    reply = await core.memories.forget(await _body(request, pb.ForgetRequest()))
    return JSONResponse({"object": "memories.forget", "forgotten": reply.forgotten})


async def listing(core: SidecarService, request: Request) -> JSONResponse:
    q = request.query_params
    try:
        offset, limit = int(q.get("offset", "0")), int(q.get("limit", "0"))
    except ValueError:
        raise InvalidBody("offset and limit must be whole numbers", "offset") from None
    if offset < 0 or limit < 0:
        raise InvalidBody("offset and limit may not be negative", "offset")
    reply = await core.memories.list_memories(pb.ListMemoriesRequest(
        scope=q.get("scope", ""), tags=q.getlist("tag"), offset=min(offset, 1 << 31), limit=min(limit, 1 << 31)))
    body = json_format.MessageToDict(reply, preserving_proto_field_name=True)
    return JSONResponse({"object": "list", "memories": body.get("memories", []), "total": reply.total})
