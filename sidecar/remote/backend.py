"""Remote mode: the daemon keeps its API to the game and forwards generation to an inference server
(vLLM, llama.cpp's server, anything speaking OpenAI's streaming chat and completion API).

RemoteBackend implements the backend contract (sidecar.backend.contract.Backend) as the local Engine
does, so gRPC, the WebSocket bridge, auth and status are the same code in both modes. It is no
LocalModel: no schedule, pass limits, model calls or save games here, and the service core answers
those itself (UNIMPLEMENTED, or a status without a schedule).

Each request runs as a task on the daemon's event loop: an HTTP stream read chunk by chunk, never a
thread blocked on a socket, and cancelling the task closes the connection, which stops the server's
generation too.

Conversations stay in the daemon: each session's messages (or raw text) are kept here and sent
whole every turn, since the server keeps no state between calls; servers cache the common prefix,
so a second turn costs them only its new tokens. Turns of one session run one after the other.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace

import httpx
import structlog

from sidecar.backend.load_report import LoadReport
from sidecar.backend.contract import BackendSnapshot, ModelFacts, RequestLimits, ServedLimits
from sidecar.backend.phase import EnginePhase
from sidecar.backend.requests import Finished, FinishReason, GenerationSpec, Job, Sink, TextDelta, Timings, Usage
from sidecar.backend.sessions import Session, SessionStore
from sidecar.backend.stats import ThroughputStats
from sidecar.backend.prompt_layout import new_turn
from sidecar.backend.resent_turns import remember_sent, resolve
from sidecar.backend.text_stream import TextStream
from sidecar.errors import FailedPrecondition, InvalidArgument, ResourceExhausted, SidecarError, Unavailable
from sidecar.remote import wire
from sidecar.remote.models import remote_model_facts, unknown_model_facts

log = structlog.get_logger("remote")

# Waiting for a server to accept the connection; past this it is down, and the game hears so soon.
CONNECT_TIMEOUT_S = 5.0
# Longest silence between two chunks: a long prompt on a busy server may take this long to read.
READ_TIMEOUT_S = 120.0
DISCOVERY_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class RemoteOptions:
    """How to reach the server and the limits the daemon still enforces itself."""

    url: str  # the OpenAI API's base, e.g. "http://10.0.0.5:8000/v1"
    model: str | None = None  # None: the first model the server lists
    api_key: str | None = None
    max_sessions: int = 64
    max_tokens_per_request: int = 2048
    max_queue: int = 256


@dataclass(eq=False)
class RemoteJob(Job):
    """A forwarded request. Cancelling it also cancels its task, which closes the HTTP stream."""

    __hash__ = object.__hash__  # each job is its own: the backend keeps the ones in flight in a set

    task: asyncio.Task | None = None
    loop: asyncio.AbstractEventLoop | None = None

    def cancel(self) -> None:
        super().cancel()
        if self.task is not None and self.loop is not None and not self.task.done():
            try:
                self.loop.call_soon_threadsafe(self.task.cancel)
            except RuntimeError:  # the loop is closed: the task is gone with it
                pass


@dataclass
class _Progress:
    """One request's reply so far, for the session, the counters and the Finished event."""

    reply: list[str] = field(default_factory=list)
    chunks: int = 0
    first_at: float | None = None
    last_at: float | None = None
    usage: wire.ChunkUsage | None = None
    timings: wire.ServerTimings | None = None
    reason: FinishReason = FinishReason.STOP


class RemoteBackend:
    """Create on the daemon's event loop with `await RemoteBackend.start(options)`; `submit` from that loop."""

    def __init__(self, options: RemoteOptions, facts: ModelFacts, context: int, client: httpx.AsyncClient) -> None:
        self.options = options
        self.facts = facts
        # The server decides what fits in a prompt; 0 where it did not say its context.
        self.served_limits = ServedLimits(max_sessions=options.max_sessions, context_per_session=context,
                                          max_prompt_tokens=0, max_tokens_per_request=options.max_tokens_per_request)
        self.phase = EnginePhase.READY
        self.sessions = SessionStore(options.max_sessions)
        self.stats = ThroughputStats()
        self._client = client
        self._loop = asyncio.get_running_loop()
        self._jobs: set[RemoteJob] = set()
        self._turns: dict[str, asyncio.Lock] = {}  # one turn at a time per session

    @classmethod
    async def start(cls, options: RemoteOptions) -> RemoteBackend:
        """Connect and learn the served model's name. A server that does not answer yet is not an
        error: the daemon serves anyway and each call says UNAVAILABLE until the server is up."""
        headers = {"Authorization": f"Bearer {options.api_key}"} if options.api_key else {}
        timeout = httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S, pool=None)
        client = httpx.AsyncClient(base_url=options.url.rstrip("/") + "/", headers=headers, timeout=timeout)
        facts, context = unknown_model_facts(options.url, options.model), 0
        try:
            response = await client.get("models", timeout=DISCOVERY_TIMEOUT_S)
            if response.status_code != 200:
                raise wire.error_for_status(response.status_code, wire.error_message(response.content))
            models = response.json()
            facts = remote_model_facts(options.url, models, options.model)
            context = _served_context(models, facts.name)
            if not facts.name:
                log.warning("the remote server does not list the model asked for", model=options.model)
        except (httpx.HTTPError, SidecarError, ValueError) as e:
            log.warning("the remote server does not answer yet; calls fail with UNAVAILABLE until it does",
                        url=options.url, error=_describe(e))
        if options.model is None and facts.name:
            options = replace(options, model=facts.name)
        return cls(options, facts, context, client)

    # -- what the service core calls (on the event loop) ------------------------------------------

    def submit(self, spec: GenerationSpec, sink: Sink) -> Job:
        """Start forwarding a request; events go to `sink` from the event loop, never blocking it.

        Raises Unavailable while closing, ResourceExhausted when too many requests are in flight
        or the session limit is reached, InvalidArgument for a max_tokens above the limit.
        """
        if self.phase is not EnginePhase.READY:
            raise Unavailable(f"the daemon is {self.phase.value}")
        if len(self._jobs) >= self.options.max_queue:
            raise ResourceExhausted(f"{self.options.max_queue} requests are already in flight; try again shortly")
        if getattr(spec, "asks_about_image", False):
            raise FailedPrecondition("image questions are not forwarded in remote mode; run a local vision model (--mmproj)")
        if spec.max_tokens > self.options.max_tokens_per_request:
            raise InvalidArgument(f"max_tokens {spec.max_tokens} is above the limit {self.options.max_tokens_per_request}")
        session = self.sessions.open(spec.session_id) if spec.session_id else None
        job = RemoteJob(spec=spec, sink=sink, loop=self._loop, resent=spec if spec.resends_history else None)
        self._jobs.add(job)
        job.task = self._loop.create_task(self._run(job, session), name=f"remote-{spec.request_id or id(job)}")
        return job

    @property
    def limits(self) -> RequestLimits:
        # The server's context decides what fits; it compiles schemas itself (see RequestLimits).
        return RequestLimits(max_prompt_tokens=None, max_tokens_per_request=self.options.max_tokens_per_request,
                             vision=False, compiles_grammar=False)

    def end_session(self, session_id: str) -> int:
        """Forget a session's conversation; returns the tokens it held. NotFound if unknown."""
        session = self.sessions.end(session_id)
        self._turns.pop(session_id, None)
        return session.tokens

    def snapshot(self) -> BackendSnapshot:
        return BackendSnapshot(
            phase=self.phase,
            model=self.facts,
            limits=self.served_limits,
            config=None,  # no schedule: the server's placement is its operator's
            throughput=self.stats.snapshot(),
            sessions=self.sessions.views(),
            requests_active=len(self._jobs),
            requests_queued=0,  # the server queues; the daemon forwards at once
            kv_tokens=0,
            kv_cache_bytes=0,
            last_reload_pause_ms=0.0,
            load_report=LoadReport(),
        )

    async def aclose(self) -> None:
        """Cancel what runs (each ends CANCELLED, its connection closed) and close the HTTP client."""
        if self.phase is EnginePhase.STOPPED:
            return
        self.phase = EnginePhase.DRAINING
        tasks = [job.task for job in self._jobs if job.task is not None]
        for job in list(self._jobs):
            job.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._client.aclose()
        self.phase = EnginePhase.STOPPED

    # -- one request --------------------------------------------------------------------------------

    async def _run(self, job: RemoteJob, session: Session | None) -> None:
        started = time.perf_counter()
        progress = _Progress()
        try:
            if session is None:
                await self._forward(job, None, progress)
            else:
                async with self._turns.setdefault(session.session_id, asyncio.Lock()):
                    await self._forward(job, session, progress)
        except asyncio.CancelledError:
            progress.reason = FinishReason.CANCELLED
        except SidecarError as e:
            job.sink(e)
            return
        except httpx.HTTPError as e:
            job.sink(Unavailable(f"the remote server at {self.options.url} failed: {_describe(e)}"))
            return
        except Exception as e:  # whatever a server sends, the game's call must end, never hang
            log.exception("forwarding failed", url=self.options.url)
            job.sink(Unavailable(f"the remote server at {self.options.url} sent a reply the daemon cannot read: {_describe(e)}"))
            return
        finally:
            self._jobs.discard(job)
        job.sink(self._finished(job, progress, started))

    async def _forward(self, job: RemoteJob, session: Session | None, progress: _Progress) -> None:
        """Send the turn and stream the reply to the job's sink; on the way out (done, cancelled,
        failed before any reply) the session learns what was said, as with the local engine."""
        if job.cancelled:
            raise asyncio.CancelledError
        # Decided here, holding the session's turn lock: no other turn of it can change it now.
        spec = job.spec = resolve(job.spec, session)
        conversation, path, body = self._request(spec, session)
        try:
            await self._stream(job, path, body, progress)
        except asyncio.CancelledError:
            self._remember(session, job, conversation if spec.prompt.is_chat else body["prompt"], progress)
            raise
        self._remember(session, job, conversation if spec.prompt.is_chat else body["prompt"], progress)

    def _remember(self, session: Session | None, job: RemoteJob, sent: list[tuple[str, str]] | str, p: _Progress) -> None:
        if session is None or self.sessions.get(session.session_id) is not session:
            return  # no session, or it was ended while this turn ran
        reply = "".join(p.reply)
        remember_sent(session, job.resent, reply)
        session.version += 1
        if job.spec.prompt.is_chat:
            session.messages = list(sent) + [("assistant", reply)]
        else:
            session.text = str(sent) + reply
        if p.usage is not None:
            session.tokens = p.usage.prompt_tokens + p.usage.completion_tokens
        else:
            session.tokens += p.chunks
        session.last_used = time.time()

    def _request(self, spec: GenerationSpec, session: Session | None) -> tuple[list[tuple[str, str]], str, dict]:
        """The whole conversation, the endpoint and the body to send (InvalidArgument when a session
        would switch between chat and raw prompts)."""
        if session is not None and spec.reset_session:
            session.restart()
        p = spec.prompt
        if session is not None and not session.is_empty and bool(session.messages) != p.is_chat:
            raise InvalidArgument("a session continues in the mode it started: chat messages or raw prompt")
        if p.is_chat:
            history = list(session.messages) if session else []
            conversation = history + new_turn(p, history)
            return conversation, "chat/completions", wire.chat_body(self.options.model, conversation, spec)
        if p.token_ids is not None:  # a one-off (convert.py): the ids go on as the API takes them
            return [], "completions", wire.completion_body(self.options.model, list(p.token_ids), spec)
        fresh = session is None or session.is_empty  # the shared context opens a conversation only
        prompt = (session.text if session else "") + (p.context if fresh else "") + (p.text or "")
        return [], "completions", wire.completion_body(self.options.model, prompt, spec)

    async def _stream(self, job: RemoteJob, path: str, body: dict, progress: _Progress) -> None:
        text = TextStream(job.spec.stop)
        finished = False
        async with self._client.stream("POST", path, json=body) as response:
            if response.status_code != 200:
                raise wire.error_for_status(response.status_code, wire.error_message(await response.aread()))
            async for line in response.aiter_lines():
                data = wire.parse_sse_line(line)
                if data is None:
                    continue
                if data == "[DONE]":
                    finished = True
                    break
                chunk = wire.parse_chunk(data)
                progress.usage = chunk.usage or progress.usage
                progress.timings = chunk.timings or progress.timings
                if chunk.text:
                    _emit(job, text.push(0, chunk.text.encode("utf-8")).text, progress)
                    if text.stopped:
                        # Ours to cut (see wire.chat_body); leaving the block closes the stream,
                        # which stops the server's generation.
                        progress.reason = FinishReason.STOP_STRING
                        return
                if chunk.finish_reason:
                    progress.reason = wire.finish_reason(chunk.finish_reason)
                    finished = True
                # Usage comes in a chunk after the finish reason: read on to the end.
        if not finished:
            # A server that fails after sending its headers (a prompt over its context, a crash)
            # may just end the body; that is no reply, not an empty one.
            raise Unavailable(f"the remote server at {self.options.url} ended the reply without finishing it")
        _emit(job, text.finish().text, progress, counts=False)

    def _finished(self, job: RemoteJob, p: _Progress, started: float) -> Finished:
        ended = time.perf_counter()
        completion = p.usage.completion_tokens if p.usage else p.chunks
        prompt = p.usage.prompt_tokens if p.usage else 0
        first = (p.first_at or ended) - started
        decode_s = (p.last_at or ended) - (p.first_at or ended)
        decode_rate = (completion - 1) / decode_s if completion > 1 and decode_s > 0 else 0.0
        prefill_rate = prompt / first if prompt and first > 0 else 0.0
        if p.timings is not None:  # the server measured without the network in between
            prefill_rate, decode_rate = p.timings.prefill_tokens_per_s, p.timings.decode_tokens_per_s
        if completion > 1 and decode_s > 0:
            self.stats.record_decode(completion - 1, decode_s)
        if prompt and first > 0:
            self.stats.record_prefill(prompt, first)
        self.stats.record_request()
        return Finished(
            reason=p.reason,
            usage=Usage(prompt, p.usage.cached_prompt_tokens if p.usage else 0, completion),
            timings=Timings(
                time_to_first_token_ms=first * 1000.0 if p.first_at else 0.0,
                prefill_tokens_per_s=prefill_rate,
                decode_tokens_per_s=decode_rate,
                total_ms=(ended - job.submitted_at) * 1000.0,
                queued_ms=(started - job.submitted_at) * 1000.0,
            ),
            session_id=job.spec.session_id,
        )


def _emit(job: RemoteJob, piece: str, p: _Progress, *, counts: bool = True) -> None:
    """Send text on; `counts` marks a server chunk, which servers send one per token: the count
    stands in for usage when a server does not report it."""
    now = time.perf_counter()
    if counts:
        p.chunks += 1
        p.first_at = p.first_at or now
        p.last_at = now
    if piece:
        p.reply.append(piece)
        job.sink(TextDelta(piece, ()))


def _served_context(models: object, name: str) -> int:
    """The context per request the server says it serves (llama.cpp's meta.n_ctx), else 0."""
    for entry in (models.get("data") if isinstance(models, dict) else None) or []:
        if isinstance(entry, dict) and entry.get("id") == name and isinstance(entry.get("meta"), dict):
            n_ctx = entry["meta"].get("n_ctx")
            return n_ctx if isinstance(n_ctx, int) and n_ctx > 0 else 0
    return 0


def _describe(error: BaseException) -> str:
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
