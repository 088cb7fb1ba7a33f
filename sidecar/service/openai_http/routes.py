"""The OpenAI-compatible API's routes, on Starlette, in front of the daemon's service core.

Every route but /health and /openapi.json needs the launch token as `Authorization: Bearer`
(the `api_key` of any OpenAI client). Bodies are read with a size limit before they are parsed,
then validated by the request models, translated to xlm.v1 requests and run by the same core as
gRPC and the WebSocket bridge. The API's routes are served under /v1 and without it, as
llama-server serves them: a client configured with either base URL works.
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
from starlette.routing import Mount, Route

from sidecar.api import pb
from sidecar.errors import NotFound
from sidecar.service import candidates, convert
from sidecar.service.auth import Authenticator
from sidecar.service.core import SidecarService
from sidecar.service.openai_http import memory_routes, model_routes, replies, session_routes, translate
from sidecar.service.openai_http.cors import CorsPolicy
from sidecar.service.openai_http.disconnect import ClientGone, EventStream, until_disconnected
from sidecar.service.openai_http.errors import HttpRefusal, InvalidBody, error_response, too_large, unauthenticated
from sidecar.service.openai_http.openapi import openapi_document
from sidecar.service.openai_http.request_models import ChatCompletionRequest, CompletionRequest, ImagePart
from sidecar.service.openai_http.validation import describe

SESSION_HEADER = "x-session-id"
CLAMPED_HEADER = "X-Max-Tokens-Clamped"
# The API's routes are mounted under each: OpenAI's base URL ends in /v1, llama-server's and
# some plugins' do not.
API_PREFIXES = ("/v1", "")
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
                 max_tokens_per_request: int, model_id: str | None = None, *, strict_model_names: bool = False,
                 cors: CorsPolicy | None = None) -> None:
        # Built when the daemon listens, before the model is loaded (the backend comes later):
        # the model's names come from its path, its own name once it is loaded.
        self.core = core
        self.authenticator = authenticator
        self.model_id = model_id or Path(model_path).stem
        self._path_names = {self.model_id} if model_id else {self.model_id, Path(model_path).name}
        self._max_tokens = max_tokens_per_request
        # One model is served: a request naming another ("gpt-3.5-turbo", a plugin's default) is
        # served by it, as llama-server and LM Studio do, unless --strict-model-names.
        self.strict_model_names = strict_model_names
        self.cors = cors or CorsPolicy()
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
        api = [
            Route("/models", self._guarded(self.models), methods=["GET"]),
            Route("/models/{model:path}", self._guarded(self.model), methods=["GET"]),
            Route("/chat/completions", self._guarded(self.chat), methods=["POST"]),
            Route("/completions", self._guarded(self.completions), methods=["POST"]),
            # Save games (session_routes.py); before the DELETE route, whose path takes any id.
            Route("/sessions/export", self._guarded(lambda r: session_routes.export_sessions(self.core, r)), methods=["POST"]),
            Route("/sessions/import", self._guarded(lambda r: session_routes.import_sessions(self.core, r)), methods=["POST"]),
            Route("/sessions/{session_id:path}", self._guarded(self.end_session), methods=["DELETE"]),
            # NPC memory (memory_routes.py).
            Route("/memories", self._guarded(lambda r: memory_routes.remember(self.core, r)), methods=["POST"]),
            Route("/memories", self._guarded(lambda r: memory_routes.listing(self.core, r)), methods=["GET"]),
            Route("/memories/search", self._guarded(lambda r: memory_routes.search(self.core, r)), methods=["POST"]),
            Route("/memories/forget", self._guarded(lambda r: memory_routes.forget(self.core, r)), methods=["POST"]),
            Route("/embeddings", self._guarded(self.embeddings), methods=["POST"]),
            # llama-server's: count tokens before sending, find a word's ids, read the context size.
            Route("/tokenize", self._guarded(self.tokenize), methods=["POST"]),
            Route("/detokenize", self._guarded(self.detokenize), methods=["POST"]),
            Route("/props", self._guarded(self.props), methods=["GET"]),
            Route("/responses", self._guarded(self.responses), methods=["POST"]),
        ]
        routes = [
            Route("/health", self.health, methods=["GET"]),
            Route("/openapi.json", self.openapi, methods=["GET"]),
            *(Mount(prefix, routes=api) for prefix in API_PREFIXES),
        ]
        app = Starlette(routes=routes, exception_handlers={HTTPException: self._http_exception})
        return self.cors.wrap(app)

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
            # Without a token any web page could drive the model through a local port: only the
            # pages of an origin named by --cors-origin may (cors.py).
            origin = request.headers.get("origin")
            if origin is not None and not self.cors.allows(origin):
                raise HttpRefusal(403, "browser origins are refused without a token, but for those --cors-origin names",
                                  "permission_error", "forbidden")
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
            raise InvalidBody(*describe(e, raw)) from None

    def _check_model(self, name: str | None, strict: bool) -> None:
        if strict and name and name not in self.model_names:
            raise NotFound(f"the model {name!r} is not served here; GET /v1/models lists {self.model_id!r}")

    def _stream(self, asked: translate.Asked) -> AsyncIterator[pb.GenerateChunk]:
        # Several prompts' choices come in OpenAI's order (prompt i's candidate j is i * n + j).
        streams = [self.core.generate(turn) for turn in asked.turns]
        return streams[0] if len(streams) == 1 else candidates.merged(streams, stride=asked.first.request.n or 1)

    async def _respond(self, request: Request, asked: translate.Asked, ids: replies.ReplyIds, stream: bool,
                       include_usage: bool) -> Response:
        chunks = self._stream(asked)
        turn = asked.first
        n = turn.request.n or 1
        asked_logprobs = turn.request.HasField("logprobs")
        session_id = turn.request.session_id
        # Echoed where a header can carry it: a `user` field may hold any text, a header only ASCII.
        headers = {"X-Session-Id": session_id} if session_id and session_id.isascii() and session_id.isprintable() else {}
        if asked.max_tokens_clamped is not None:
            headers[CLAMPED_HEADER] = str(asked.max_tokens_clamped)
        try:
            # Errors before the first token (bad arguments, no projector, a full queue) get their
            # own status; only after it must they travel inside a 200 stream.
            first = await until_disconnected(request.receive, anext(chunks))
            if stream:
                events = (replies.tool_events(ids, first, chunks, include_usage, n) if turn.reads_calls
                          else replies.events(ids, first, chunks, include_usage, asked_logprobs, n))
                return EventStream(events, source=chunks, headers=headers)
            choices = await until_disconnected(request.receive, replies.collect(first, chunks))
        except BaseException:
            await chunks.aclose()
            raise
        await chunks.aclose()
        if not ids.chat:
            body = replies.text_completion(ids, choices, asked_logprobs, n)
        else:
            messages = [replies.tool_message("".join(c.text), c.final) if turn.reads_calls else None
                        for c in choices]
            body = replies.chat_completion(ids, choices, messages, asked_logprobs, n)
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
        names = tuple(sorted(self.model_names)) if self.strict_model_names else None
        return JSONResponse(openapi_document(names, self._max_tokens_limit()))

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [self._model_object()]})

    async def model(self, request: Request) -> Response:
        # Only the served model's own names answer here: a client listing models sees one.
        self._check_model(request.path_params["model"] or "?", strict=True)
        return JSONResponse(self._model_object())

    def _model_object(self) -> dict:
        return {"id": self.model_id, "object": "model", "created": self.created, "owned_by": "xlm-sidecar"}

    async def chat(self, request: Request) -> Response:
        raw = await self._body(request)
        self._check_message_count(raw)
        body: ChatCompletionRequest = self._parse(ChatCompletionRequest, raw)
        self._check_text_size(raw, body)
        self._check_model(body.model, self.strict_model_names)
        session_id = translate.session_id_of(request.headers.get(SESSION_HEADER), body)
        asked = translate.chat_request(body, session_id, self._max_tokens_limit())
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        ids = replies.ReplyIds(self.model_id, chat=True)
        return await self._respond(request, asked, ids, bool(body.stream), include_usage)

    async def completions(self, request: Request) -> Response:
        raw = await self._body(request)
        if len(raw) > MAX_TEXT_BODY_BYTES:
            raise too_large(MAX_TEXT_BODY_BYTES, f"for JSON ({MAX_TEXT_BODY_BYTES})")
        body: CompletionRequest = self._parse(CompletionRequest, raw)
        self._check_model(body.model, self.strict_model_names)
        session_id = translate.session_id_of(request.headers.get(SESSION_HEADER), body)
        texts, token_prompts = translate.prompt_texts(body)
        prompts: list[str | list[int]] = [*texts, *token_prompts]
        if token_prompts and translate.completion_session(body, session_id, len(prompts)):
            # A session keeps text and matches a resent prompt on it (resent_turns.py).
            prompts = [(await self.core.detokenize(pb.DetokenizeRequest(tokens=token_prompts[0]))).text]
        asked = translate.completion_requests(body, session_id, self._max_tokens_limit(), prompts)
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        ids = replies.ReplyIds(self.model_id, chat=False)
        return await self._respond(request, asked, ids, bool(body.stream), include_usage)

    async def embeddings(self, request: Request) -> Response:
        body = self._parse(model_routes.EmbeddingRequest, await self._small_body(request))
        self._check_model(body.model, self.strict_model_names)
        # A client that leaves stops the call before its next slice (engine/model_calls.py).
        work = model_routes.embeddings(self.core, body, self.model_id)
        return JSONResponse(await until_disconnected(request.receive, work))

    async def tokenize(self, request: Request) -> Response:
        body = self._parse(model_routes.TokenizeRequest, await self._small_body(request))
        return JSONResponse(await model_routes.tokenize(self.core, body))

    async def detokenize(self, request: Request) -> Response:
        body = self._parse(model_routes.DetokenizeRequest, await self._small_body(request))
        return JSONResponse(await model_routes.detokenize(self.core, body))

    async def props(self, request: Request) -> Response:
        return JSONResponse(model_routes.props(self.core, self.model_id))

    async def responses(self, request: Request) -> Response:
        """Named, not a bare 404: a client trying the Responses API learns what to use instead."""
        raise HttpRefusal(501, "the Responses API is not served here: use POST /v1/chat/completions (with "
                          "X-Session-Id or `user` to keep an NPC's conversation)", "invalid_request_error", "not_implemented")

    async def _small_body(self, request: Request) -> bytes:
        """A body without images: the JSON limit, whatever the model."""
        raw = await self._body(request)
        if len(raw) > MAX_TEXT_BODY_BYTES:
            raise too_large(MAX_TEXT_BODY_BYTES, f"for JSON ({MAX_TEXT_BODY_BYTES})")
        return raw

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

