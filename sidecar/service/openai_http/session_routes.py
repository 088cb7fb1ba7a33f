"""Save games over HTTP (an extension: OpenAI has no such routes), for games and tools that speak
only HTTP. The same archives as gRPC's ExportSessions and ImportSessions (session_saves.py).

    POST /v1/sessions/export   {"session_ids": [...], "include_kv": true}
        -> {"object": "sessions.export", "archive": "<base64>", "bytes": N, "sessions": [...]}
        or the archive's bytes as they are, with `Accept: application/octet-stream`
    POST /v1/sessions/import   the archive's bytes (Content-Type: application/octet-stream),
                               ?replace=true to overwrite sessions with the same ids;
                               or JSON {"archive": "<base64>", "replace": false}
        -> {"object": "sessions.import", "sessions": [{"session_id", "tokens", "kv_bytes",
            "restored": "kv" | "text", "reason"}]}

An archive with KV states is tens of megabytes: the body may be up to the archive limit (1 GiB),
read in pieces with a deadline as every other body is.
"""

from __future__ import annotations

import asyncio
import base64
import binascii

import pydantic
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from sidecar.api import pb
from sidecar.errors import InvalidArgument
from sidecar.service.core import SidecarService
from sidecar.service.openai_http.disconnect import ClientGone
from sidecar.service.openai_http.errors import HttpRefusal, InvalidBody, too_large

OCTET = "application/octet-stream"
# A large archive at loopback speed takes well under a second; a slow disk-backed client more.
ARCHIVE_BODY_TIMEOUT_S = 120.0
MAX_EXPORT_BODY = 1 << 20


class ExportBody(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    session_ids: list[str] = pydantic.Field(default_factory=list, max_length=4096)
    include_kv: bool = False


class ImportBody(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    archive: str
    replace: bool = False


def info_json(info: pb.SavedSessionInfo) -> dict:
    return {"session_id": info.session_id, "tokens": info.tokens, "kv_bytes": info.kv_bytes,
            "restored": info.restored, "reason": info.reason}


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(limit, "for a save-game archive")
    body = bytearray()
    try:
        async with asyncio.timeout(ARCHIVE_BODY_TIMEOUT_S):
            async for piece in request.stream():
                body += piece
                if len(body) > limit:
                    raise too_large(limit, "for a save-game archive")
    except TimeoutError:
        raise HttpRefusal(408, f"the request body did not arrive within {ARCHIVE_BODY_TIMEOUT_S:g} s",
                          "invalid_request_error", "request_timeout") from None
    except ClientDisconnect:
        raise ClientGone() from None
    return bytes(body)


async def export_sessions(core: SidecarService, request: Request) -> Response:
    raw = await read_body(request, MAX_EXPORT_BODY)
    try:
        body = ExportBody.model_validate_json(raw or b"{}", strict=True)
    except pydantic.ValidationError as e:
        raise InvalidBody(f"invalid export request: {e.errors()[0]['msg']}", ".".join(map(str, e.errors()[0]["loc"])) or None) from None
    archive, infos = await core.saves.export_bytes(body.session_ids, body.include_kv)
    if OCTET in request.headers.get("accept", ""):
        return Response(archive, media_type=OCTET, headers={"X-Sessions-Saved": str(len(infos))})
    return JSONResponse({"object": "sessions.export", "bytes": len(archive),
                         "archive": base64.b64encode(archive).decode("ascii"),
                         "sessions": [info_json(i) for i in infos]})


async def import_sessions(core: SidecarService, request: Request) -> Response:
    limit = core.saves.max_archive_bytes
    if request.headers.get("content-type", "").startswith(OCTET):
        archive = await read_body(request, limit)
        replace = request.query_params.get("replace", "false").lower() in ("1", "true", "yes")
    else:
        raw = await read_body(request, limit * 4 // 3 + 1024)
        try:
            body = ImportBody.model_validate_json(raw, strict=True)
        except pydantic.ValidationError as e:
            raise InvalidBody(f"invalid import request: {e.errors()[0]['msg']}", ".".join(map(str, e.errors()[0]["loc"])) or None) from None
        try:
            archive = base64.b64decode(body.archive, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidArgument("archive is not base64") from None
        replace = body.replace
    reply = await core.saves.import_bytes(archive, replace=replace)
    return JSONResponse({"object": "sessions.import", "bytes": len(archive),
                         "sessions": [info_json(i) for i in reply.sessions]})

