"""The service core: every RPC's behaviour, independent of the transport that carries it.

Transports (gRPC, the WebSocket bridge, the OpenAI-compatible HTTP API) only decode requests,
call these coroutines and encode what comes back; typed errors raised here become status codes at
their edge.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import psutil
import structlog

from sidecar.api import pb
from sidecar.budget import Budget, parse_size
from sidecar.backend.contract import Backend, RequestLimits, local_model
from sidecar.backend.requests import NO_VISION_MODEL, Finished, GenerationSpec, TextDelta
from sidecar.backend.sampling import BAN
from sidecar.guard.frame_guard import GuardSettings
from sidecar.guard.guard_task import FrameGuard
from sidecar.errors import FailedPrecondition, ResourceExhausted, ShuttingDown, SidecarError, Unimplemented
from sidecar.service import candidates, convert, token_controls, tool_calls
from sidecar.service.budget_control import BudgetControl, check_thread_cap
from sidecar.service.caller import Caller
from sidecar.service.collector import StreamCollector
from sidecar.service.grammar_checks import GrammarChecks
from sidecar.service.request_checks import check_session_id
from sidecar.service.memories import Memories, MemorySettings, SessionMemory, added_event, stamp
from sidecar.service.session_saves import SessionSaves
from sidecar.service.turn import Turn, image_turn, turn_spec
from sidecar.service.readiness import not_ready, profile_to_pb, starting_status
from sidecar.service.state import DaemonState, StateHub

log = structlog.get_logger("service")

# What Tokenize, Detokenize and Embed answer where the model runs on another server (remote mode).
MODEL_ELSEWHERE = ("remote mode forwards generations only; tokenize, detokenize and embeddings are "
                   "the remote server's own (call its API directly)")


@dataclass(frozen=True)
class ServiceInfo:
    version: str
    listen_addresses: tuple[str, ...]
    max_message_bytes: int
    # Least time between two text chunks of one stream; 0 sends every token as it comes.
    stream_interval_s: float = 0.033
    max_image_bytes: int = 32 << 20
    # --ram-budget, reported in status (0: none).
    ram_budget_bytes: int = 0
    # What any RAM budget sets aside for the vision worker (local/crowd.py; 0: no projector).
    vision_reserved_bytes: int = 0
    # The game's process (--parent-pid, else the daemon's parent): only its frame reports count.
    game_pid: int | None = None


class SidecarService:
    """One per daemon. Must be created and used on the daemon's event loop."""

    def __init__(self, backend: Backend | None, budget: Budget, info: ServiceInfo) -> None:
        # None while the daemon listens but has not loaded its model: see attach_backend.
        self.backend = backend
        self.budget = budget
        self.info = info
        self.started = time.monotonic()
        phase = "ready" if backend is not None else "starting"
        self.state = StateHub(DaemonState(phase=phase, budget=budget, reason="initial"))
        # Set by the daemon once the backend exists; None answers SetBudget with UNIMPLEMENTED.
        self.budget_control: BudgetControl | None = None
        self.draining = False
        # Replaced by the daemon's own once it serves a model here (local/serve.py); until then, and
        # in remote mode, reports are checked and answered, and nothing is applied.
        self.grammar_checks = GrammarChecks()
        self.frame_guard = FrameGuard(GuardSettings(), enabled=False, game_pid=info.game_pid, apply=lambda limits: None)
        self.saves = SessionSaves(self)  # ExportSessions, ImportSessions (save games)
        # NPC memory; off until the daemon gives it its settings (remote mode keeps it off).
        self.memories = Memories(MemorySettings(enabled=False))
        self._process = psutil.Process()
        # Backend jobs of the streams in flight, so a shutdown can end each with a final chunk.
        self._jobs: dict[int, object] = {}  # id(job) -> job (jobs are not hashable)
        self._idle = asyncio.Event()
        self._idle.set()

    def attach_backend(self, backend: Backend) -> None:
        """The model is loaded: calls that need the backend are taken from now on."""
        self.backend = backend

    def ready_backend(self) -> Backend:
        """The backend; UNAVAILABLE with a retry hint (every transport passes it on) until loaded,
        and while shutting down."""
        self._refuse_while_draining()
        if self.backend is None:
            raise not_ready(self.state.current.phase)
        return self.backend

    @property
    def limits(self) -> RequestLimits:
        return self.ready_backend().limits

    async def generate(self, turn: Turn) -> AsyncIterator[pb.GenerateChunk]:
        """Stream a generation: every transport's one way in, with the turn it built (turn.py).
        Stopping iteration early (client gone) cancels the backend job."""
        request = turn.request
        n = token_controls.candidates(request)
        spec = await self.spec_for(turn)
        remembers = self.memories.session_memory(request, spec)
        spec, used = await self.memories.for_turn(remembers, spec, self.limits.context_per_sequence)
        names = tuple(t.name for t in request.tools)
        replies: dict[int, list[str]] = {}
        chunks = self._stream(spec, remembers, used) if n == 1 else candidates.fan_out(spec, n, self._stream)
        try:
            async for chunk in chunks:
                if turn.reads_calls:  # each reply is read as a call once whole
                    reply = replies.setdefault(chunk.index, [])
                    if chunk.HasField("final"):
                        tool_calls.finish_with_call(chunk.final, "".join(reply), names)
                    else:
                        reply.append(chunk.text)
                yield chunk
        finally:
            await chunks.aclose()

    async def embed(self, request: pb.EmbedRequest) -> pb.EmbedResponse:
        """Embeddings of short texts, on the engine thread between passes (model_calls.py)."""
        texts = list(request.input)
        vectors, tokens = await self.call_model(lambda m: m.embed(texts))
        return pb.EmbedResponse(embeddings=[pb.Embedding(values=v) for v in vectors], prompt_tokens=tokens)

    async def tokenize(self, request: pb.TokenizeRequest) -> pb.TokenizeResponse:
        text, special, parse = request.text, request.add_special, request.parse_special
        return pb.TokenizeResponse(tokens=await self.call_model(lambda m: m.tokenize(text, special, parse)))

    async def detokenize(self, request: pb.DetokenizeRequest) -> pb.DetokenizeResponse:
        tokens = list(request.tokens)
        return pb.DetokenizeResponse(text=await self.call_model(lambda m: m.detokenize(tokens)))

    async def report_frames(self, request: pb.FrameReport, caller: Caller) -> pb.FrameGuardState:
        """The game's frame report; PERMISSION_DENIED from any other client (guard/game_clients.py)."""
        self._refuse_while_draining()
        return await self.frame_guard.report(request, caller)

    async def call_model(self, run):
        """`run` on the loaded model (ModelOps), between the engine's passes; UNIMPLEMENTED where
        the model is loaded elsewhere."""
        model = local_model(self.ready_backend())
        if model is None:
            raise Unimplemented(MODEL_ELSEWHERE)
        return await asyncio.wrap_future(model.call_model(run))

    async def spec_for(self, turn: Turn) -> GenerationSpec:
        """A turn checked and converted as every transport's must be: its size, then every field
        by the one rule of convert, then its image; all off the event loop."""
        limits = self.limits
        if turn.needs_vision and not limits.vision:  # before the bytes are looked at
            raise FailedPrecondition(NO_VISION_MODEL)
        # The transports admit messages up to the largest image; the turn itself (its image
        # aside) keeps to --max-message-bytes, with the code gRPC itself gives an oversized message.
        size = turn.request.ByteSize()
        if size > self.info.max_message_bytes:
            raise ResourceExhausted(f"the request is {size} bytes; the limit is {self.info.max_message_bytes} (--max-message-bytes)")
        # In a worker thread: a JSON schema's grammar, a long prompt's checks or a large PNG's
        # decoding must not hold up the event loop, which streams every other conversation.
        spec = await asyncio.to_thread(turn_spec, turn, limits, self.info.max_image_bytes)
        await self._check_grammar(spec, limits)
        return spec

    async def _check_grammar(self, spec: GenerationSpec, limits: RequestLimits) -> None:
        """A grammar runs on the engine thread only once tried in the checker's process
        (grammar_checks.py): INVALID_ARGUMENT for one no token can start, or too costly to run."""
        if spec.grammar is None or not limits.compiles_grammar:
            return  # a remote server compiles and checks its own
        model = local_model(self.ready_backend())
        if model is None:  # compiled here needs the model file here
            return
        banned = tuple(token for token, bias in spec.sampling.logit_bias if bias <= BAN)
        await asyncio.to_thread(self.grammar_checks.check, model.config.model_path, spec.grammar, banned)

    async def ask_image(self, request: pb.AskImageRequest) -> AsyncIterator[pb.GenerateChunk]:
        """Answer a question about a screenshot (or, in a session, about its last one): the chat
        turn it amounts to, by generate's one path."""
        if not self.limits.vision:  # before the question or image is even looked at
            raise FailedPrecondition(NO_VISION_MODEL)
        async for chunk in self.generate(image_turn(request)):
            yield chunk

    async def _stream(self, spec, remembers: SessionMemory | None = None, used: list | None = None) -> AsyncIterator[pb.GenerateChunk]:
        collector = StreamCollector(asyncio.get_running_loop())
        job = self.backend.submit(spec, collector.put)
        self._jobs[id(job)] = job
        self._idle.clear()
        log.debug("generate", request_id=spec.request_id, session_id=spec.session_id)
        try:
            while True:
                text: list[str] = []
                tokens: list[int] = []
                logprobs: list = []
                end = None
                for event in await collector.next_batch():
                    if isinstance(event, TextDelta):
                        text.append(event.text)
                        tokens.extend(event.token_ids)
                        logprobs.extend(event.logprobs)
                    else:
                        end = event
                        break
                if text or tokens:
                    yield pb.GenerateChunk(text="".join(text), token_ids=tokens,
                                           logprobs=[convert.logprob_to_pb(e) for e in logprobs])
                    if end is None and self.info.stream_interval_s > 0:
                        # Tokens of the next interval gather in the collector without waking us:
                        # one chunk per frame is all a game can show, and each wake-up steals
                        # CPU from decoding on a machine whose cores are all busy.
                        await collector.pause(self.info.stream_interval_s)
                if isinstance(end, Finished):
                    added = await self.memories.keep_dropped(remembers, end)
                    chunk = convert.chunk_from_finished(end)
                    stamp(chunk.final, end.memories_told, used or [], added)
                    if added:  # the "context full" signal, for a game watching the daemon
                        self.state.publish(reason="context_full",
                                           memories_added=added_event(end.session_id, remembers.scope, added))
                    yield chunk
                    return
                if isinstance(end, SidecarError):
                    raise end
        finally:
            job.cancel()  # a no-op when the job already finished
            self._jobs.pop(id(job), None)
            if not self._jobs:
                self._idle.set()

    async def set_budget(self, request: pb.SetBudgetRequest) -> pb.SetBudgetResponse:
        self._refuse_while_draining()
        control = self.budget_control
        threads = check_thread_cap(request.max_cpu_threads) if request.HasField("max_cpu_threads") else None
        which = request.WhichOneof("vram")
        vram = None
        if which == "vram_size":
            vram = parse_size(request.vram_size)  # INVALID_ARGUMENT before anything else
        elif which == "vram_bytes":
            vram = Budget(vram_bytes=request.vram_bytes).vram_bytes  # out of range: the same
        ram = parse_size(request.ram_size) if request.HasField("ram_size") else None
        backend = self.ready_backend()
        if control is None:
            raise Unimplemented("this daemon was started without budget control")
        # All or nothing: whatever would refuse one part (a RAM budget too small for the model,
        # automatic VRAM without a GPU) refuses the call before any part is applied.
        control.check(ram_bytes=ram, auto_vram=which == "auto_reserve_bytes")
        # Shielded: a game that asked for its VRAM back and then dropped the call (a scene load
        # with a deadline) still gets it back, and the budget we report stays the one in force.
        # The RAM budget goes first, so a VRAM re-plan carries the new RAM shares.
        reloaded, pause_ms = False, 0.0
        if ram is not None:
            change = await asyncio.shield(control.set_ram(ram))
            reloaded, pause_ms = change.reloaded, change.pause_ms
        if ram is None or which is not None or threads is not None:
            if which == "auto_reserve_bytes":
                update = control.follow_free_vram(request.auto_reserve_bytes, threads)
            elif which in ("vram_size", "vram_bytes"):
                update = control.set(vram, threads)
            else:  # only the thread cap changes
                update = control.set(control.budget.vram_bytes, threads)
            change = await asyncio.shield(update)
            reloaded, pause_ms = reloaded or change.reloaded, pause_ms + change.pause_ms
        self.budget = change.budget
        return pb.SetBudgetResponse(
            budget=self._budget_pb(change.budget),
            schedule=_schedule_pb(backend),
            reloaded=reloaded,
            pause_ms=pause_ms,
        )

    @property
    def ram_budget_bytes(self) -> int:
        """The RAM budget in force: --ram-budget until SetBudget.ram_size changes it (0: none)."""
        # Before the model is loaded there is no control yet; remote mode's holds no RAM budget.
        return getattr(self.budget_control, "ram_bytes", self.info.ram_budget_bytes)

    @property
    def _auto_reserve_bytes(self) -> int | None:
        # None before the model is loaded, in remote mode, and while the VRAM budget is fixed.
        return getattr(self.budget_control, "auto_reserve_bytes", None)

    def _budget_pb(self, budget: Budget) -> pb.Budget:
        return convert.budget_to_pb(budget, ram_bytes=self.ram_budget_bytes, auto_reserve_bytes=self._auto_reserve_bytes)

    def _refuse_while_draining(self) -> None:
        if self.draining:
            raise ShuttingDown()

    async def watch_state(self) -> AsyncIterator[pb.StateEvent]:
        self._refuse_while_draining()
        async for state in self.state.watch():
            yield pb.StateEvent(
                unix_ms=convert.now_unix_ms(),
                phase=convert.phase_to_pb(state.phase),
                budget=self._budget_pb(state.budget),
                schedule=_schedule_pb(self.backend),
                reason=state.reason,
                profile=profile_to_pb(state.profile),
                memories_added=state.memories_added if state.reason == "context_full" else None,
            )

    async def get_status(self) -> pb.Status:
        self._refuse_while_draining()
        if self.backend is None:
            return starting_status(
                phase=self.state.current.phase, budget=self.budget, version=self.info.version,
                uptime_s=time.monotonic() - self.started, host_resident_bytes=self._process.memory_info().rss,
                listen_addresses=list(self.info.listen_addresses), max_message_bytes=self.info.max_message_bytes,
                max_image_bytes=self.info.max_image_bytes, profile=self.state.current.profile,
                ram_budget_bytes=self.ram_budget_bytes,
            )
        status = convert.status_to_pb(
            self.backend.snapshot(),
            budget=self.budget,
            version=self.info.version,
            uptime_s=time.monotonic() - self.started,
            host_resident_bytes=self._process.memory_info().rss,
            listen_addresses=list(self.info.listen_addresses),
            max_message_bytes=self.info.max_message_bytes,
            max_image_bytes=self.info.max_image_bytes,
            ram_budget_bytes=self.ram_budget_bytes,
            vision_reserved_bytes=self.info.vision_reserved_bytes if self.ram_budget_bytes else 0,
            auto_reserve_bytes=self._auto_reserve_bytes,
        )
        if self.state.current.profile is not None:
            status.profile.CopyFrom(profile_to_pb(self.state.current.profile))
        status.frame_guard.CopyFrom(self.frame_guard.to_pb())
        status.saves.CopyFrom(self.saves.activity_pb())
        status.memories.CopyFrom(self.memories.status_pb())
        return status

    async def end_session(self, request: pb.EndSessionRequest) -> pb.EndSessionResponse:
        backend = self.ready_backend()
        check_session_id(request.session_id)
        freed = backend.end_session(request.session_id)
        self.memories.end_session(request.session_id)
        return pb.EndSessionResponse(tokens_freed=freed)

    def begin_drain(self) -> None:
        """Refuse new work; in-flight streams carry on until the transport's grace period ends."""
        self.draining = True
        self.state.publish(phase="draining", reason="shutdown")
        self.state.close()

    async def streams_done(self, timeout_s: float, hurry: asyncio.Event | None = None) -> bool:
        """Wait until no generation stream is in flight, for at most timeout_s or until `hurry` is
        set; True when none is left."""
        if self._idle.is_set() or timeout_s <= 0:
            return self._idle.is_set()
        waiters = [asyncio.ensure_future(self._idle.wait())]
        if hurry is not None:
            waiters.append(asyncio.ensure_future(hurry.wait()))
        await asyncio.wait(waiters, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        for w in waiters:
            w.cancel()
        return self._idle.is_set()

    def cancel_streams(self) -> int:
        """End every stream in flight the way the proto says shutdown does: the backend stops each
        at its next step and sends its final chunk (FINISH_REASON_CANCELLED, with usage), so the
        transports can still deliver it and a terminal frame. Returns how many were cancelled."""
        jobs = list(self._jobs.values())
        for job in jobs:
            job.cancel()
        return len(jobs)


def _schedule_pb(backend: Backend | None) -> pb.Schedule | None:
    """The schedule in force; None (left unset) before the model is loaded, and where it runs on
    another server, whose placement is its operator's."""
    model = local_model(backend) if backend is not None else None
    return convert.schedule_to_pb(model.config) if model is not None else None
