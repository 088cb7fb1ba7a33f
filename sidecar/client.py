"""A small Python client for the daemon, for programs, tests and `xlm-sidecar chat`.

    from sidecar.client import SidecarClient
    with SidecarClient("127.0.0.1:50551") as client:
        for piece in client.chat("Who are you?", session_id="blacksmith"):
            print(piece, end="", flush=True)

Errors arrive as grpc.RpcError with the status codes documented in proto/xlm/v1/sidecar.proto.
Every call carries the daemon's token: `token=`, else XLM_SIDECAR_TOKEN, else the token file the
daemon wrote for that port or socket (`token_file=` to name another).

A call the daemon refuses with UNAVAILABLE before answering anything (it listens while it still
loads the model, and says when to try again) is retried by gRPC itself: see RETRY_POLICY.
"""

from __future__ import annotations

import collections
import json
import os
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sidecar.api import pb, rpc
from sidecar.service.auth import METADATA_KEY, bearer, find_token
from sidecar.settings import DEFAULT_HOST, DEFAULT_PORT, format_address

DEFAULT_ADDRESS = format_address(DEFAULT_HOST, DEFAULT_PORT)
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Sidecar"].full_name  # "xlm.v1.Sidecar"

# gRPC's own retries (gRFC A6), for the calls the daemon refuses while it still loads its model:
# UNAVAILABLE with a grpc-retry-pushback-ms trailer, which sets the wait before the next attempt
# (the backoff below then only spaces other UNAVAILABLEs, such as a daemon not listening yet; one
# shutting down sends -1, which ends the retries at once). A call is
# retried only while nothing of its answer has come (a Trailers-Only refusal: no headers, no
# message), so a reply is never generated twice; its deadline bounds every attempt and wait.
# gRPC clamps maxAttempts to 5, so with the daemon's 500 ms hint it covers a load of about 2 s;
# generate and ask_image wait out a longer one themselves (_stream). GetStatus and WatchState are
# answered while loading, and refused only by a daemon shutting down: not retried.
RETRIED_METHODS = ("Generate", "AskImage", "SetBudget", "EndSession")
RETRY_POLICY = {
    "maxAttempts": 5,
    "initialBackoff": "0.1s",
    "maxBackoff": "1s",
    "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE"],
}
SERVICE_CONFIG = {
    "methodConfig": [
        {"name": [{"service": SERVICE_NAME, "method": m} for m in RETRIED_METHODS], "retryPolicy": RETRY_POLICY}
    ]
}
CHANNEL_OPTIONS = (
    ("grpc.enable_retries", 1),
    ("grpc.service_config", json.dumps(SERVICE_CONFIG)),
    # A request larger than this is committed as soon as it is sent, so never retried by gRPC (the
    # default is 256 KiB: a screenshot is more); this covers an AskImage up to the daemon's default
    # --max-image-bytes (32 MiB). A limit, not an allocation: gRPC keeps the request it was given
    # until the call commits. Text requests are far smaller.
    ("grpc.per_rpc_retry_buffer_size", 40 << 20),
)
# How long generate and ask_image wait for a model still loading when the client has no timeout.
_LOAD_WAIT_S = 3600.0


@dataclass
class Reply:
    """A whole reply, gathered from a stream."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    final: pb.GenerationFinal | None = None
    # One per token, when the request asked for logprobs.
    logprobs: list[pb.TokenLogprob] = field(default_factory=list)

    def add(self, chunk: pb.GenerateChunk) -> None:
        self.text += chunk.text
        self.token_ids.extend(chunk.token_ids)
        self.logprobs.extend(chunk.logprobs)
        if chunk.HasField("final"):
            self.final = chunk.final


# Parts of an import larger than this (the daemon's default message limit is 8 MiB).
IMPORT_PART_BYTES = 4 << 20


@dataclass(frozen=True)
class SavedArchive:
    """What export_sessions returns: the bytes to keep, and what was saved of each session."""

    data: bytes
    sessions: list


class SidecarClient:
    """Blocking client over one gRPC channel. Thread-safe, as gRPC channels are."""

    def __init__(
        self,
        address: str = DEFAULT_ADDRESS,
        *,
        timeout_s: float | None = None,
        token: str | None = None,
        token_file: str | os.PathLike[str] | None = None,
    ) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self.token = token if token is not None else find_token(address, token_file)
        channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
        self._raw_channel = channel
        if self.token:
            channel = grpc.intercept_channel(channel, _TokenInterceptor(self.token))
        self._channel = channel
        self._stub = rpc.SidecarStub(self._channel)

    def __enter__(self) -> SidecarClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._raw_channel.close()

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Block until the daemon answers its health check as SERVING (it listens while it still
        loads the model: NOT_SERVING until then); grpc.RpcError or RuntimeError if not in time."""
        health = health_pb2_grpc.HealthStub(self._channel)
        deadline = time.monotonic() + timeout_s
        while True:
            left = max(deadline - time.monotonic(), 0.01)
            response = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=left, wait_for_ready=True)
            if response.status == health_pb2.HealthCheckResponse.SERVING:
                return
            if time.monotonic() >= deadline:
                raise RuntimeError(f"daemon at {self.address} is not serving (status {response.status})")
            time.sleep(min(0.1, left))

    def generate(self, request: pb.GenerateRequest) -> Iterator[pb.GenerateChunk]:
        """Stream the raw chunks of one generation. Closing the iterator early cancels the call.
        A call made while the daemon still loads its model is answered once it is loaded."""
        yield from self._stream(self._stub.Generate, request)

    def _stream(self, method, request) -> Iterator[pb.GenerateChunk]:
        # gRPC retries a refused call up to RETRY_POLICY's 5 attempts, as the daemon's hint says
        # (500 ms apart); a longer load (a large model: tens of seconds) outlasts them and the last
        # refusal, with its hint, comes here. Then this waits for health SERVING (the engine is
        # attached before) and calls once more, all within the one deadline. Health's Watch, not
        # wait_ready's wait_for_ready Check: if the daemon exits because its load failed, the watch
        # fails at once (UNAVAILABLE) instead of at the deadline.
        deadline = time.monotonic() + (self.timeout_s or _LOAD_WAIT_S)
        for last in (False, True):
            call = method(request, timeout=_left(deadline) if self.timeout_s else None)
            started = False
            try:
                for chunk in call:
                    started = True
                    yield chunk
                return
            except grpc.RpcError as e:
                if last or started or _pushback_ms(e) is None:
                    raise
                self._wait_serving(deadline)
            finally:
                call.cancel()

    def _wait_serving(self, deadline: float) -> None:
        """Return once health says SERVING; grpc.RpcError if the daemon goes away or the deadline passes."""
        watch = health_pb2_grpc.HealthStub(self._channel).Watch(
            health_pb2.HealthCheckRequest(service=""), timeout=_left(deadline)
        )
        try:
            for response in watch:
                if response.status == health_pb2.HealthCheckResponse.SERVING:
                    return
        finally:
            watch.cancel()

    def chat(
        self,
        text: str,
        *,
        session_id: str = "",
        system: str | None = None,
        max_tokens: int = 0,
        sampling: pb.SamplingParams | None = None,
        stop: Sequence[str] = (),
        json_schema: str = "",
        reply: Reply | None = None,
        context: str = "",
        memory: pb.MemoryOptions | None = None,
    ) -> Iterator[str]:
        """Say `text` as the user and yield the reply's text as it streams. Pass a Reply to also get
        token ids and the final usage and timings. `context` is the shared world context before
        the persona (`system`): NPCs given the same one share its computed prefix."""
        messages = ([pb.ChatMessage(role="system", content=system)] if system else []) + [
            pb.ChatMessage(role="user", content=text)
        ]
        request = pb.GenerateRequest(
            messages=pb.ChatMessages(messages=messages),
            max_tokens=max_tokens,
            sampling=sampling,
            stop=list(stop),
            json_schema=json_schema,
            session_id=session_id,
            context=context,
            memory=memory,
        )
        for chunk in self.generate(request):
            if reply is not None:
                reply.add(chunk)
            if chunk.text:
                yield chunk.text

    def ask_image_stream(self, request: pb.AskImageRequest) -> Iterator[pb.GenerateChunk]:
        """Stream the raw chunks of one image question. Closing the iterator early cancels the call."""
        yield from self._stream(self._stub.AskImage, request)

    def ask_image(
        self,
        question: str,
        *,
        image: bytes | pb.RawImage | None = None,
        session_id: str = "",
        max_tokens: int = 0,
        sampling: pb.SamplingParams | None = None,
        json_schema: str = "",
    ) -> Reply:
        """Ask about a screenshot: PNG/JPEG bytes, raw pixels (pb.RawImage), or None for a
        follow-up about the session's last image. Returns the whole answer; `final.image` says
        how the image was encoded."""
        if isinstance(image, pb.RawImage):
            source = pb.Image(raw=image)
        elif image is not None:
            source = pb.Image(encoded=image)
        else:
            source = None
        request = pb.AskImageRequest(
            image=source, question=question, session_id=session_id, max_tokens=max_tokens,
            sampling=sampling, json_schema=json_schema,
        )
        reply = Reply()
        for chunk in self.ask_image_stream(request):
            reply.add(chunk)
        return reply

    def complete(self, request: pb.GenerateRequest) -> Reply:
        """Run a generation to the end and return the whole reply."""
        reply = Reply()
        for chunk in self.generate(request):
            reply.add(chunk)
        return reply

    def candidates(self, request: pb.GenerateRequest, n: int) -> list[Reply]:
        """`n` candidate replies to one prompt (the player picks a line), computed side by side
        from one prefill of the prompt."""
        request = pb.GenerateRequest.FromString(request.SerializeToString())
        request.n = n
        replies = [Reply() for _ in range(n)]
        for chunk in self.generate(request):
            replies[chunk.index].add(chunk)
        return replies

    def embed(self, texts: list[str]) -> list[list[float]]:
        """Unit vectors for short texts (an NPC's memory: compare by dot product)."""
        response = self._stub.Embed(pb.EmbedRequest(input=texts), timeout=self.timeout_s)
        return [list(e.values) for e in response.embeddings]

    def tokenize(self, text: str, *, add_special: bool = False, parse_special: bool = False) -> list[int]:
        request = pb.TokenizeRequest(text=text, add_special=add_special, parse_special=parse_special)
        return list(self._stub.Tokenize(request, timeout=self.timeout_s).tokens)

    def detokenize(self, tokens: list[int]) -> str:
        return self._stub.Detokenize(pb.DetokenizeRequest(tokens=tokens), timeout=self.timeout_s).text

    def status(self) -> pb.Status:
        return self._stub.GetStatus(pb.GetStatusRequest(), timeout=self.timeout_s)

    def end_session(self, session_id: str) -> int:
        """Forget an NPC's conversation; returns the tokens freed."""
        return self._stub.EndSession(pb.EndSessionRequest(session_id=session_id), timeout=self.timeout_s).tokens_freed

    def set_budget(self, request: pb.SetBudgetRequest) -> pb.SetBudgetResponse:
        return self._stub.SetBudget(request, timeout=self.timeout_s)

    def export_sessions(self, session_ids: list[str] | None = None, *, include_kv: bool = False) -> SavedArchive:
        """Save games: the conversations of `session_ids` (every session when None) as bytes for
        the game's own save, with their KV caches when `include_kv`."""
        request = pb.ExportSessionsRequest(session_ids=session_ids or [], include_kv=include_kv, chunk_bytes=3 << 20)
        parts, last = [], None
        for chunk in self._stub.ExportSessions(request, timeout=self.timeout_s):
            parts.append(chunk.data)
            if chunk.last:
                last = chunk
        if last is None:
            raise RuntimeError("the export ended before its last chunk")
        return SavedArchive(b"".join(parts), list(last.sessions))

    def import_sessions(self, archive: bytes, *, replace: bool = False,
                        part_bytes: int = IMPORT_PART_BYTES) -> list[pb.SavedSessionInfo]:
        """Restore sessions from an archive export_sessions made; one SavedSessionInfo per
        session (`restored` "kv" or "text", and why). Archives larger than one message go in
        parts of `part_bytes`."""
        if len(archive) <= part_bytes:
            request = pb.ImportSessionsRequest(archive=archive, replace=replace)
            return list(self._stub.ImportSessions(request, timeout=self.timeout_s).sessions)
        upload = f"py-{os.getpid()}-{uuid.uuid4().hex[:16]}"
        view = memoryview(archive)
        for start in range(0, len(archive), part_bytes):
            more = start + part_bytes < len(archive)
            request = pb.ImportSessionsRequest(archive=bytes(view[start:start + part_bytes]), replace=replace,
                                               upload_id=upload, more=more)
            response = self._stub.ImportSessions(request, timeout=self.timeout_s)
        return list(response.sessions)

    def remember(self, texts: Sequence[str], *, scope: str = "", session_id: str = "",
                 tags: Sequence[str] = ()) -> list[pb.Memory]:
        """Seed memories (lore an NPC knows, what happened off-screen) into `scope`, or into the
        scope of `session_id`'s NPC."""
        request = pb.RememberRequest(scope=scope, session_id=session_id, texts=list(texts), tags=list(tags))
        return list(self._stub.Remember(request, timeout=self.timeout_s).memories)

    def recall(self, query: str, scopes: Sequence[str], *, k: int = 0,
               tags: Sequence[str] = ()) -> list[pb.RecalledMemory]:
        """The memories of `scopes` closest to `query`, best first, with their scores."""
        request = pb.RecallRequest(scopes=list(scopes), query=query, k=k, tags=list(tags))
        return list(self._stub.Recall(request, timeout=self.timeout_s).memories)

    def forget(self, *, ids: Sequence[int] = (), tags: Sequence[str] = (), scope: str = "") -> int:
        """Forget memories by id, by tags (within `scope`, or everywhere), or a whole scope."""
        request = pb.ForgetRequest(ids=list(ids), tags=list(tags), scope=scope)
        return self._stub.Forget(request, timeout=self.timeout_s).forgotten

    def list_memories(self, scope: str = "", *, tags: Sequence[str] = (), offset: int = 0,
                      limit: int = 0) -> pb.ListMemoriesResponse:
        request = pb.ListMemoriesRequest(scope=scope, tags=list(tags), offset=offset, limit=limit)
        return self._stub.ListMemories(request, timeout=self.timeout_s)

    def watch_state(self) -> Iterator[pb.StateEvent]:
        call = self._stub.WatchState(pb.WatchStateRequest())
        try:
            yield from call
        finally:
            call.cancel()


class _CallDetails(
    collections.namedtuple("_CallDetails", ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")),
    grpc.ClientCallDetails,
):
    pass


class _TokenInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Adds `authorization: Bearer <token>` to every call made on the channel."""

    def __init__(self, token: str) -> None:
        self._header = (METADATA_KEY, bearer(token))

    def _with_token(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        metadata = [*(details.metadata or ()), self._header]
        return _CallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready, details.compression
        )

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._with_token(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._with_token(client_call_details), request)


def _left(deadline: float) -> float:
    return max(deadline - time.monotonic(), 0.01)


def _pushback_ms(error: grpc.RpcError) -> int | None:
    """The daemon's retry hint (it is still starting), or None for any other failure."""
    if error.code() != grpc.StatusCode.UNAVAILABLE:
        return None
    for key, value in error.trailing_metadata() or ():
        if key == "grpc-retry-pushback-ms":
            try:
                ms = int(value)
            except ValueError:
                return None
            return ms if ms >= 0 else None  # -1: the daemon is shutting down, do not retry
    return None
