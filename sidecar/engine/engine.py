"""The engine: one llama.cpp context, driven by one thread, serving queued generation requests.

The loop per request is assemble prompt -> reuse the KV prefix already computed -> prefill the
rest in chunks -> sample, stream, decode one token at a time. Requests run one after another on
sequence 0; continuous batching across sequences replaces this loop in a later issue, behind the
same submit/sink interface.

Everything that touches llama.cpp happens on the engine thread, so the C context never sees two
callers at once. Callers talk to it through `submit` (thread-safe, never blocks) and receive events
through their sink.
"""

from __future__ import annotations

import enum
import queue
import threading
import time
from dataclasses import dataclass

import llama_cpp
import structlog

from sidecar.engine.config import EngineConfig
from sidecar.engine.native_log import install_native_log_filter
from sidecar.engine.native_model import ModelFacts, NativeModel
from sidecar.engine.requests import (
    Finished,
    FinishReason,
    GenerationSpec,
    Job,
    Sink,
    TextDelta,
    Timings,
    Usage,
)
from sidecar.engine.sampling import SamplerChain
from sidecar.engine.sessions import Session, SessionStore
from sidecar.engine.stats import ThroughputSnapshot, ThroughputStats
from sidecar.engine.text_stream import TextStream
from sidecar.errors import EngineFailure, InvalidArgument, ModelLoadError, ResourceExhausted, SidecarError, Unavailable

log = structlog.get_logger("engine")

SEQ = 0  # the one sequence this engine uses


class EnginePhase(enum.Enum):
    LOADING = "loading"
    READY = "ready"
    DRAINING = "draining"
    STOPPED = "stopped"


@dataclass(frozen=True)
class EngineSnapshot:
    """A consistent view of the engine for the status RPC."""

    phase: EnginePhase
    model: ModelFacts
    config: EngineConfig
    throughput: ThroughputSnapshot
    sessions: list[Session]
    requests_active: int
    requests_queued: int
    kv_tokens: int
    kv_cache_bytes: int


class Engine:
    """Loads the model at construction (raises ModelLoadError) and serves until close()."""

    def __init__(self, config: EngineConfig) -> None:
        install_native_log_filter()
        self.config = config
        self.phase = EnginePhase.LOADING
        self.model = NativeModel(config.model_path, n_gpu_layers=config.n_gpu_layers)
        self.facts = self.model.facts()
        self._ctx = self._create_context()
        self._batch = llama_cpp.llama_batch_init(config.n_batch, 0, 1)
        self._kv_tokens: list[int] = []  # exactly the tokens held in the KV cache for SEQ
        self._kv_bytes_per_token = self._kv_bytes_per_token_f16()
        self.sessions = SessionStore(config.max_sessions)
        self.stats = ThroughputStats()
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._active: Job | None = None
        self._thread = threading.Thread(target=self._run, name="xlm-engine", daemon=True)
        self.phase = EnginePhase.READY
        self._thread.start()

    def _kv_bytes_per_token_f16(self) -> int:
        # K and V, every layer, one f16 vector of n_head_kv * head_dim each: what the cache holds.
        m = self.model.ptr
        head_dim = llama_cpp.llama_model_n_embd(m) // max(llama_cpp.llama_model_n_head(m), 1)
        return 2 * llama_cpp.llama_model_n_layer(m) * llama_cpp.llama_model_n_head_kv(m) * head_dim * 2

    def _create_context(self) -> object:
        c = self.config
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = c.n_ctx
        params.n_batch = c.n_batch
        params.n_ubatch = c.n_batch
        params.n_seq_max = 1
        params.n_threads = c.threads_decode
        params.n_threads_batch = c.threads_prefill
        params.no_perf = True
        params.flash_attn_type = {
            None: llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO,
            True: llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
            False: llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED,
        }[c.flash_attention]
        ctx = llama_cpp.llama_init_from_model(self.model.ptr, params)
        if not ctx:
            self.model.close()
            raise ModelLoadError(f"llama.cpp could not create a context of {c.n_ctx} tokens for this model")
        return ctx

    # -- caller side (any thread) -----------------------------------------------------------------

    def submit(self, spec: GenerationSpec, sink: Sink) -> Job:
        """Queue a request. Events go to `sink` from the engine thread; it must not block.

        Raises Unavailable while draining and ResourceExhausted when the queue is full.
        """
        if self.phase is not EnginePhase.READY:
            raise Unavailable(f"the engine is {self.phase.value}")
        if self._queue.qsize() >= self.config.max_queue:
            raise ResourceExhausted(f"{self.config.max_queue} requests are already waiting; try again shortly")
        if spec.max_tokens > self.config.max_tokens_per_request:
            raise InvalidArgument(f"max_tokens {spec.max_tokens} is above the limit {self.config.max_tokens_per_request}")
        job = Job(spec=spec, sink=sink)
        self._queue.put(job)
        return job

    def end_session(self, session_id: str) -> int:
        """Forget a session's conversation; returns the tokens it held. NotFound if unknown."""
        return self.sessions.end(session_id)

    def snapshot(self) -> EngineSnapshot:
        n_kv = len(self._kv_tokens)
        return EngineSnapshot(
            phase=self.phase,
            model=self.facts,
            config=self.config,
            throughput=self.stats.snapshot(),
            sessions=self.sessions.snapshot(),
            requests_active=1 if self._active is not None else 0,
            requests_queued=self._queue.qsize(),
            kv_tokens=n_kv,
            kv_cache_bytes=n_kv * self._kv_bytes_per_token,
        )

    def close(self, timeout: float = 10.0) -> None:
        """Cancel what is running, refuse what is queued, stop the thread and free llama.cpp memory."""
        if self.phase is EnginePhase.STOPPED:
            return
        self.phase = EnginePhase.DRAINING
        if self._active is not None:
            self._active.cancel()
        self._queue.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("engine thread did not stop in time; leaking its llama.cpp context")
            return
        llama_cpp.llama_batch_free(self._batch)
        llama_cpp.llama_free(self._ctx)
        self._ctx = None
        self.model.close()
        self.phase = EnginePhase.STOPPED

    # -- engine thread ----------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                break
            if self.phase is not EnginePhase.READY:
                job.sink(Unavailable("the daemon is shutting down"))
                continue
            self._active = job
            try:
                self._serve(job)
            except SidecarError as e:
                job.sink(e)
            except Exception as e:  # never let one request take the engine thread down
                log.exception("request failed", request_id=job.spec.request_id)
                job.sink(EngineFailure(f"internal error: {type(e).__name__}: {e}"))
            finally:
                self._active = None
        # Refuse whatever is still queued so no caller waits forever.
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.sink(Unavailable("the daemon is shutting down"))

    def _serve(self, job: Job) -> None:
        spec = job.spec
        started = time.perf_counter()
        if job.cancelled:
            job.sink(self._finished(job, FinishReason.CANCELLED, 0, 0, 0, started, None, started))
            return
        session = self.sessions.open(spec.session_id) if spec.session_id else None
        if session is not None and spec.reset_session:
            session.messages.clear()
            session.text = ""
        conversation, prompt_text = self._assemble(spec, session)
        tokens = self.model.tokenize(prompt_text, add_bos=True, parse_special=True)
        if len(tokens) > self.config.max_prompt_tokens:
            raise InvalidArgument(
                f"the prompt is {len(tokens)} tokens; the limit is {self.config.max_prompt_tokens} (--max-prompt-tokens)"
            )

        cached = self._prefill(tokens)
        prefill_done = time.perf_counter()
        if len(tokens) - cached > 0:
            self.stats.record_prefill(len(tokens) - cached, prefill_done - started)

        sampler = SamplerChain(self.model.vocab, self.model.n_vocab, spec.sampling, spec.grammar)
        try:
            reason, generated, reply, first_token_at = self._generate(job, sampler)
        finally:
            sampler.close()
        ended = time.perf_counter()
        if first_token_at is not None and generated > 1:
            self.stats.record_decode(generated - 1, ended - first_token_at)
        self.stats.record_request()
        if session is not None:
            self._remember(session, spec, conversation, prompt_text, reply)
        job.sink(self._finished(job, reason, len(tokens), cached, generated, started, first_token_at, ended, prefill_done))

    def _assemble(self, spec: GenerationSpec, session: Session | None) -> tuple[list[tuple[str, str]], str]:
        """The conversation (for chat) and the full prompt text, session history included."""
        p = spec.prompt
        if session is not None and not session.is_empty and bool(session.messages) != p.is_chat:
            raise InvalidArgument("a session continues in the mode it started: chat messages or raw prompt")
        if p.is_chat:
            conversation = (session.messages if session else []) + list(p.messages or ())
            return conversation, self.model.render_chat(conversation)
        return [], (session.text if session else "") + (p.text or "")

    def _remember(self, session: Session, spec: GenerationSpec, conversation: list[tuple[str, str]], prompt_text: str, reply: str) -> None:
        if spec.prompt.is_chat:
            session.messages = conversation + [("assistant", reply)]
        else:
            session.text = prompt_text + reply
        session.tokens = len(self._kv_tokens)
        session.last_used = time.time()

    def _prefill(self, tokens: list[int]) -> int:
        """Bring the KV cache to `tokens`, reusing the longest prefix already there. Returns how many
        prompt tokens were reused. The last prompt token is always decoded again so its logits exist."""
        common = 0
        limit = min(len(tokens) - 1, len(self._kv_tokens))
        while common < limit and tokens[common] == self._kv_tokens[common]:
            common += 1
        mem = llama_cpp.llama_get_memory(self._ctx)
        if not llama_cpp.llama_memory_seq_rm(mem, SEQ, common, -1):
            llama_cpp.llama_memory_clear(mem, True)
            common = 0
        self._kv_tokens = self._kv_tokens[:common]
        for start in range(common, len(tokens), self.config.n_batch):
            chunk = tokens[start : start + self.config.n_batch]
            self._decode(chunk, start, logits_last=start + len(chunk) == len(tokens))
        return common

    def _decode(self, chunk: list[int], pos: int, *, logits_last: bool) -> None:
        b = self._batch
        for i, token in enumerate(chunk):
            b.token[i] = token
            b.pos[i] = pos + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = SEQ
            b.logits[i] = 0
        if logits_last:
            b.logits[len(chunk) - 1] = 1
        b.n_tokens = len(chunk)
        rc = llama_cpp.llama_decode(self._ctx, b)
        if rc != 0:
            # 1 means no KV slot was found: the context is full. Anything else is llama.cpp failing.
            if rc == 1:
                raise ResourceExhausted("the context is full")
            raise EngineFailure(f"llama_decode returned {rc}")
        self._kv_tokens.extend(chunk)

    def _generate(self, job: Job, sampler: SamplerChain) -> tuple[FinishReason, int, str, float | None]:
        """Sample and stream until a finish condition. Returns (reason, tokens generated, reply text,
        time of the first token)."""
        spec = job.spec
        stream = TextStream(spec.stop)
        reply: list[str] = []
        generated = 0
        first_token_at: float | None = None
        reason = FinishReason.LENGTH
        while generated < spec.max_tokens:
            if job.cancelled:
                reason = FinishReason.CANCELLED
                break
            token = sampler.sample(self._ctx)
            if first_token_at is None:
                first_token_at = time.perf_counter()
            if self.model.is_end_of_generation(token):
                reason = FinishReason.STOP
                break
            generated += 1
            chunk = stream.push(token, self.model.piece(token))
            if chunk.text or chunk.token_ids:
                reply.append(chunk.text)
                job.sink(TextDelta(chunk.text, tuple(chunk.token_ids)))
            if stream.stopped:
                reason = FinishReason.STOP_STRING
                break
            if len(self._kv_tokens) >= self.config.n_ctx:
                reason = FinishReason.CONTEXT_FULL
                break
            if generated < spec.max_tokens:
                self._decode([token], len(self._kv_tokens), logits_last=True)
        if not stream.stopped:
            tail = stream.finish()
            if tail.text or tail.token_ids:
                reply.append(tail.text)
                job.sink(TextDelta(tail.text, tuple(tail.token_ids)))
        return reason, generated, "".join(reply), first_token_at

    @staticmethod
    def _finished(
        job: Job,
        reason: FinishReason,
        prompt_tokens: int,
        cached: int,
        generated: int,
        started: float,
        first_token_at: float | None,
        ended: float,
        prefill_done: float | None = None,
    ) -> Finished:
        prefill_s = (prefill_done - started) if prefill_done is not None else 0.0
        decode_s = (ended - first_token_at) if first_token_at is not None else 0.0
        return Finished(
            reason=reason,
            usage=Usage(prompt_tokens=prompt_tokens, cached_prompt_tokens=cached, completion_tokens=generated),
            timings=Timings(
                time_to_first_token_ms=((first_token_at or ended) - job.submitted_at) * 1000.0,
                prefill_tokens_per_s=(prompt_tokens - cached) / prefill_s if prefill_s > 0 else 0.0,
                decode_tokens_per_s=(generated - 1) / decode_s if generated > 1 and decode_s > 0 else 0.0,
                total_ms=(ended - job.submitted_at) * 1000.0,
                queued_ms=(started - job.submitted_at) * 1000.0,
            ),
            session_id=job.spec.session_id,
        )
