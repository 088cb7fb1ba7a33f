"""The OpenAI-compatible API's routes, on Starlette, in front of the daemon's service core.

Every route but /health and /openapi.json needs the launch token as `Authorization: Bearer`
(the `api_key` of any OpenAI client). Bodies are read with a size limit before they are parsed,
then validated by the request models, translated to xlm.v1 requests and run by the same core as
gRPC and the WebSocket bridge.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pydantic
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sidecar.api import pb
from sidecar.errors import InvalidArgument, NotFound
from sidecar.service import convert
from sidecar.service.auth import Authenticator
from sidecar.service.core import SidecarService
from sidecar.service.openai_http import replies, translate
from sidecar.service.openai_http.disconnect import ClientGone, EventStream, until_disconnected
from sidecar.service.openai_http.errors import HttpRefusal, error_response, too_large, unauthenticated
from sidecar.service.openai_http.openapi import openapi_document
from sidecar.service.openai_http.request_models import ChatCompletionRequest, CompletionRequest, ImagePart

SESSION_HEADER = "x-session-id"
# JSON bodies without images: a conversation of 1 MiB is far beyond any context this daemon
# serves, and bounds what one request can make the daemon parse.
MAX_TEXT_BODY_BYTES = 1 << 20
# Bodies at least this large have their messages counted before validation (_check_message_count).
MESSAGE_COUNT_CHECK_BYTES = 64 << 10
# Time a request body has to arrive whole (the largest image at loopback speed takes milliseconds).
BODY_TIMEOUT_S = 30.0


def image_allowance(max_image_bytes: int) -> int:
    """Extra body room for one image in a data: URL (base64 grows it by a third)."""
    return (max_image_bytes + 2) // 3 * 4 + 64


class OpenAIApi:
    def __init__(self, core: SidecarService, authenticator: Authenticator, model_path: Path,
                 max_tokens_per_request: int, model_id: str | None = None) -> None:
        # Built when the daemon listens, before the model is loaded (the backend comes later):
        # the model's names come from its path, its own name once it is loaded.
        self.core = core
        self.authenticator = authenticator
        self.model_id = model_id or Path(model_path).stem
        self._path_names = {self.model_id} if model_id else {self.model_id, Path(model_path).name}
        self._max_tokens = max_tokens_per_request
        self.created = int(time.time())

    @property
    def model_names(self) -> set[str]:
        backend = self.core.backend
        return self._path_names | ({backend.facts.name} if backend is not None else set())

    @property
    def body_limit(self) -> int:
        vision = self.core.backend is not None and self.core.backend.limits.vision
        return MAX_TEXT_BODY_BYTES + (image_allowance(self.core.info.max_image_bytes) if vision else 0)

    def app(self) -> Starlette:
        routes = [
            Route("/health", self.health, methods=["GET"]),
            Route("/openapi.json", self.openapi, methods=["GET"]),
            Route("/v1/models", self._guarded(self.models), methods=["GET"]),
            Route("/v1/models/{model:path}", self._guarded(self.model), methods=["GET"]),
            Route("/v1/chat/completions", self._guarded(self.chat), methods=["POST"]),
            Route("/v1/completions", self._guarded(self.completions), methods=["POST"]),
            Route("/v1/sessions/{session_id:path}", self._guarded(self.end_session), methods=["DELETE"]),
        ]
        return Starlette(routes=routes, exception_handlers={HTTPException: self._http_exception})

    # -- plumbing ---------------------------------------------------------------------------------

    def _guarded(self, endpoint: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        """Token first, then the endpoint; typed errors become OpenAI error objects."""

        async def guarded(request: Request) -> Response:
            try:
                self._authorize(request)
                self.core.ready_backend()  # UNAVAILABLE (503, with Retry-After) until loaded
                return await endpoint(request)
            except ClientGone:
                return Response(status_code=499)  # nobody is there to read it
            except Exception as e:
                return error_response(e)

        return guarded

    def _authorize(self, request: Request) -> None:
        if not self.authenticator.required:
            # Without a token any web page could drive the model through a local port.
            if request.headers.get("origin") is not None:
                raise HttpRefusal(403, "browser origins are refused without a token", "permission_error", "forbidden")
            return
        if not self.authenticator.accepts_header(request.headers.get("authorization")):
            raise unauthenticated()

    async def _http_exception(self, request: Request, exc: HTTPException) -> Response:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        message = f"no route {request.method} {request.url.path}" if exc.status_code in (404, 405) else exc.detail
        return error_response(HttpRefusal(exc.status_code, message, kind, "not_found" if exc.status_code == 404 else "bad_request"))

    async def _body(self, request: Request) -> bytes:
        limit = self.body_limit
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise too_large(limit, self._limit_name())
        body = bytearray()
        try:
            # A body never finished held its connection for as long as the client liked (330 s
            # and counting, issue 29): it has BODY_TIMEOUT_S to arrive whole.
            async with asyncio.timeout(BODY_TIMEOUT_S):
                async for piece in request.stream():
                    body += piece
                    if len(body) > limit:
                        raise too_large(limit, self._limit_name())
        except TimeoutError:
            raise HttpRefusal(408, f"the request body did not arrive within {BODY_TIMEOUT_S:g} s",
                              "invalid_request_error", "request_timeout") from None
        except ClientDisconnect:
            raise ClientGone() from None  # abandoned mid-body: nobody to answer, nothing to log
        return bytes(body)

    def _limit_name(self) -> str:
        if not self.core.limits.vision:
            return f"for JSON ({MAX_TEXT_BODY_BYTES})"
        return f"for JSON ({MAX_TEXT_BODY_BYTES}) and one image (--max-image-bytes)"

    def _parse(self, model: type[pydantic.BaseModel], raw: bytes):
        try:
            return model.model_validate_json(raw, strict=True)
        except pydantic.ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "body"
            raise InvalidArgument(f"{where}: {first['msg']}" + (f" ({e.error_count()} problems)" if e.error_count() > 1 else "")) from None

    def _check_model(self, name: str | None) -> None:
        if name and name not in self.model_names:
            raise NotFound(f"the model {name!r} is not served here; GET /v1/models lists {self.model_id!r}")

    def _stream(self, turn: translate.Turn) -> AsyncIterator[pb.GenerateChunk]:
        # The whole conversation, every turn, as OpenAI clients send it: the backend decides what
        # its session already holds (resent_turns.py), never this transport.
        return self.core.generate(turn.request, image=turn.image, resends_history=True)

    async def _respond(self, request: Request, turn: translate.Turn, ids: replies.ReplyIds, stream: bool,
                       include_usage: bool, session_id: str) -> Response:
        chunks = self._stream(turn)
        # Echoed where a header can carry it: a `user` field may hold any text, a header only ASCII.
        headers = {"X-Session-Id": session_id} if session_id and session_id.isascii() and session_id.isprintable() else {}
        try:
            # Errors before the first token (bad arguments, no projector, a full queue) get their
            # own status; only after it must they travel inside a 200 stream.
            first = await until_disconnected(request.receive, anext(chunks))
            if stream:
                events = (replies.tool_events(ids, first, chunks, include_usage, turn.tools) if turn.tools is not None
                          else replies.events(ids, first, chunks, include_usage))
                return EventStream(events, source=chunks, headers=headers)
            text, final = await until_disconnected(request.receive, replies.collect(first, chunks))
        except BaseException:
            await chunks.aclose()
            raise
        await chunks.aclose()
        if not ids.chat:
            body = replies.text_completion(ids, text, final)
        else:
            message = replies.tool_message(text, turn.tools) if turn.tools is not None else None
            body = replies.chat_completion(ids, text, final, message)
        return JSONResponse(body, headers=headers)

    # -- endpoints --------------------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        """As gRPC's health: serving only once the model is in (a plugin that polls /health then
        gets no 503 on its first request), not while starting, loading or draining."""
        if self.core.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        if self.core.backend is None:
            return JSONResponse({"status": "loading", "phase": self.core.state.current.phase}, status_code=503,
                                headers={"Retry-After": "1"})
        return JSONResponse({"status": "ok"})

    async def openapi(self, request: Request) -> Response:
        return JSONResponse(openapi_document(tuple(sorted(self.model_names)), self._max_tokens_limit()))

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [self._model_object()]})

    async def model(self, request: Request) -> Response:
        self._check_model(request.path_params["model"] or "?")
        return JSONResponse(self._model_object())

    def _model_object(self) -> dict:
        return {"id": self.model_id, "object": "model", "created": self.created, "owned_by": "xlm-sidecar"}

    async def chat(self, request: Request) -> Response:
        raw = await self._body(request)
        self._check_message_count(raw)
        body: ChatCompletionRequest = self._parse(ChatCompletionRequest, raw)
        self._check_text_size(raw, body)
        self._check_model(body.model)
        session_id = translate.session_id_of(request.headers.get(SESSION_HEADER), body)
        turn = translate.chat_request(body, session_id, self._max_tokens_limit())
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        ids = replies.ReplyIds(self.model_id, chat=True)
        return await self._respond(request, turn, ids, bool(body.stream), include_usage, session_id)

    async def completions(self, request: Request) -> Response:
        raw = await self._body(request)
        if len(raw) > MAX_TEXT_BODY_BYTES:
            raise too_large(MAX_TEXT_BODY_BYTES, f"for JSON ({MAX_TEXT_BODY_BYTES})")
        body: CompletionRequest = self._parse(CompletionRequest, raw)
        self._check_model(body.model)
        session_id = translate.session_id_of(request.headers.get(SESSION_HEADER), body)
        turn = translate.completion_request(body, session_id, self._max_tokens_limit())
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        ids = replies.ReplyIds(self.model_id, chat=False)
        return await self._respond(request, turn, ids, bool(body.stream), include_usage, session_id)

    async def end_session(self, request: Request) -> Response:
        session_id = request.path_params["session_id"]
        reply = await self.core.end_session(pb.EndSessionRequest(session_id=session_id))
        return JSONResponse({"id": session_id, "object": "session.deleted", "deleted": True,
                             "tokens_freed": reply.tokens_freed})

    def _max_tokens_limit(self) -> int:
        return self._max_tokens

    def _check_message_count(self, raw: bytes) -> None:
        """The rule of convert.check_request_size for the message count, before the body is
        validated: validating and translating 25,000 messages held the event loop (and every
        other stream) for over a second. A plain parse of the JSON is a few milliseconds."""
        # Bodies past the JSON limit carry an image, whose base64 a second parse would only repeat;
        # their messages are counted after validation, by convert, as every request's are.
        if not MESSAGE_COUNT_CHECK_BYTES <= len(raw) <= MAX_TEXT_BODY_BYTES:
            return
        try:
            messages = json.loads(raw).get("messages")
        except (ValueError, RecursionError, AttributeError):
            return  # the validation below says what is wrong
        if isinstance(messages, list):
            convert.check_message_count(len(messages), self.core.limits.max_prompt_tokens)

    @staticmethod
    def _check_text_size(raw: bytes, body: ChatCompletionRequest) -> None:
        """A body may exceed the JSON limit only by the images it carries."""
        if len(raw) <= MAX_TEXT_BODY_BYTES:
            return
        images = sum(len(part.image_url.url) for m in body.messages if isinstance(m.content, list)
                     for part in m.content if isinstance(part, ImagePart))
        if len(raw) - images > MAX_TEXT_BODY_BYTES:
            raise too_large(MAX_TEXT_BODY_BYTES, f"for JSON ({MAX_TEXT_BODY_BYTES}) besides images")

