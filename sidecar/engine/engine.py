"""The engine: continuous batching of many conversations over one llama.cpp context.

One thread owns llama.cpp. Each loop turn it admits queued requests into free sequences, builds
one forward pass that carries every decoding sequence's next token plus prompt chunks of the
sequences still prefilling, picks the thread count of that pass's token tier, decodes, and lets
each sequence sample its own next token. Callers talk to it only through `submit` (thread-safe,
never blocks) and the sink they pass, which the engine calls between passes and which must not
block either.

Sessions keep an NPC's KV cache between turns in a sequence; when more sessions are live than the
context has sequences, the least recently used idle one is saved to host memory and restored on
its next turn. A reload (new placement after a budget change) saves every sequence the same way,
builds the new model and context, restores, and carries on: no stream notices but for a pause.

Parts of it live beside it: which sequence a request gets (slot_choice.py), keeping the replying
sequences on the lowest ids (packing.py), reloads (reload.py), the final report (finish_report.py),
and prompt prefixes shared across conversations (prefix_sharing.py, prefix_cache.py).
"""

from __future__ import annotations


import queue
import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import Callable

import llama_cpp
import structlog

from sidecar.backend.engine_config import EngineConfig
from sidecar.backend.load_report import parse_load_log
from sidecar.native.context import NativeContext
from sidecar.native.log_capture import install_native_log_filter
from sidecar.backend.contract import BackendSnapshot, RequestLimits
from sidecar.backend.phase import EnginePhase
from sidecar.engine.prompts.context_shift import shift_out_dropped
from sidecar.engine.image_encodes import ImageEncodes
from sidecar.engine.prompts.image_prompt import image_report, whole_images_prefix
from sidecar.engine.prefix.prefix_cache import PrefixCache
from sidecar.engine.prefix.prefix_sharing import PrefixSharing, shareable_tokens
from sidecar.engine.prompts.prompt_build import BuiltPrompt, build_prompt
from sidecar.engine.finish_report import cancelled_before_start, finished
from sidecar.engine.scheduling.packing import packing_moves, swap
from sidecar.engine.loading import context_for, load_model_and_context
from sidecar.engine.session_turn import remember_turn
from sidecar.engine.inbox import ImageReady, InboxMessage, Stop
from sidecar.engine.kv_demand import (SequencePool, ceiling_count, grown_count, park_beyond, resize, shrunk_count,
                                      swap_in)
from sidecar.engine.model_calls import ModelCall, ModelCalls
from sidecar.engine.reload import Reloading, ReloadRequest, release_freed_memory
from sidecar.engine.scheduling.resent_admission import check_not_ended, resolve_waiting, still_resolved
from sidecar.backend.requests import NO_VISION_MODEL, FinishReason, GenerationSpec, Job, Sink, TextDelta
from sidecar.engine.sampler_chain import SamplerChain
from sidecar.backend.sessions import Session, SessionStore
from sidecar.backend.prompt_layout import context_tokens
from sidecar.engine.scheduling.slot import ActiveRequest, Slot
from sidecar.engine.scheduling.slot_choice import choose_slot, common_prefix, evict
from sidecar.backend.stats import ThroughputStats
from sidecar.engine.scheduling.step import SequenceDemand, StepPlan, plan_step, threads_for
from sidecar.engine.pass_limits import PassLimiter
from sidecar.engine.threads.thread_governor_hook import GovernedThreads
from sidecar.guard.frame_guard import PassLimits
from sidecar.backend.text_stream import TextChunk, TextStream
from sidecar.engine.token_logprobs import logprob_at, take
from sidecar.errors import (
    EngineFailure,
    FailedPrecondition,
    InvalidArgument,
    ResourceExhausted,
    ShuttingDown,
    SidecarError,
    Unavailable,
)
from sidecar.vision.encoder import EncodedImage, VisionEncoder

log = structlog.get_logger("engine")

class Engine(Reloading):
    """Loads the model at construction (raises ModelLoadError) and serves until close()."""

    def __init__(self, config: EngineConfig) -> None:
        install_native_log_filter()
        self.phase = EnginePhase.LOADING
        self.config = config
        self.pool = SequencePool(config)
        self.model, self._ctx = load_model_and_context(config, self.pool.allocated)
        if not self.model.plain_kv and self.pool.allocated < config.n_seq:
            # Its saved sequences do not carry into another size (seq_state.py): all from the start.
            self._ctx.close()
            self._ctx = context_for(self.model, config, config.n_seq)
            self.pool.start = self.pool.allocated = config.n_seq
        self.load_report = parse_load_log(self.model.load_log + self._ctx.load_log)
        self.facts = self.model.facts()
        self._inbox: queue.Queue[InboxMessage] = queue.Queue()
        self._images = ImageEncodes(wake=lambda: self._inbox.put(ImageReady()))
        self.encoder = self._open_encoder(config)
        self._kv_bytes_per_token = self.model.kv_bytes_per_token_f16()
        self._slots = [Slot(seq) for seq in range(self.pool.allocated)]
        self.sessions = SessionStore(config.max_sessions, config.saved_sessions_bytes)
        self.sharing = PrefixSharing(PrefixCache(config.prefix_cache_bytes), self._kv_bytes_per_token)
        self.stats = ThroughputStats()
        self._waiting: deque[Job] = deque()
        self._closing = False
        self.last_reload_pause_ms = 0.0
        self._governor = GovernedThreads()
        self.pass_limiter = PassLimiter()  # the frame guard's (sidecar.guard)
        self.model_calls = ModelCalls(lambda: self.model, lambda: self._governor.threads(self.config, self.config.threads_prefill))
        self._thread = threading.Thread(target=self._run, name="xlm-engine", daemon=True)
        self.phase = EnginePhase.READY
        self._thread.start()

    def _open_encoder(self, config: EngineConfig) -> VisionEncoder | None:
        """The in-loop encoder of a GPU plan; a CPU encoder runs beside the loop (image_encodes.py)."""
        beside = config.vision is not None and not config.vision.use_gpu
        self._images.configure(config.vision if beside else None, config.model_path,
                              llama_cpp.llama_model_n_embd_inp(self.model.ptr))
        if config.vision is None or beside:
            return None
        try:
            return VisionEncoder(self.model.ptr, config.vision)
        except BaseException:
            self._ctx.close()
            self.model.close()
            raise

    # -- caller side (any thread) -----------------------------------------------------------------

    def submit(self, spec: GenerationSpec, sink: Sink) -> Job:
        """Queue a request. Events go to `sink` from the engine thread; it must not block.

        Raises Unavailable while draining, ResourceExhausted when the queue is full, and
        InvalidArgument for a max_tokens above the limit.
        """
        if self._closing or self.phase is EnginePhase.STOPPED:
            raise Unavailable(f"the engine is {self.phase.value}")
        if self._inbox.qsize() + len(self._waiting) >= self.config.max_queue:
            raise ResourceExhausted(f"{self.config.max_queue} requests are already waiting; try again shortly")
        if spec.max_tokens > self.config.max_tokens_per_request:
            raise InvalidArgument(f"max_tokens {spec.max_tokens} is above the limit {self.config.max_tokens_per_request}")
        job = Job(spec=spec, sink=sink, resent=spec if spec.resends_history else None)
        self._inbox.put(job)
        return job

    @property
    def limits(self) -> RequestLimits:
        return RequestLimits(
            max_prompt_tokens=self.config.max_prompt_tokens,
            max_tokens_per_request=self.config.max_tokens_per_request,
            vision=self.config.vision is not None,
            compiles_grammar=True,
            vocabulary=self.model.n_vocab,
            context_per_sequence=self._ctx.ctx_per_seq,
            model_calls=True,
        )

    def call_model(self, run: Callable[[ModelCalls], object]) -> Future:
        """Tokenize, detokenize or embed (model_calls.py) on the engine thread, between passes."""
        if self._closing or self.phase is EnginePhase.STOPPED:
            raise Unavailable(f"the engine is {self.phase.value}")
        call = ModelCall(run)
        self._inbox.put(call)
        return call.done

    def reload(self, config: EngineConfig, *, force: bool = False) -> Future:
        """Switch to a new configuration at the next step boundary, keeping every conversation.

        A change of threads only takes effect on the next pass; anything else (placement, context,
        batch sizes) rebuilds model and context around saved sequences. The future resolves to
        (reloaded, pause in milliseconds), or to the load error, and then the old configuration
        is back in force. `force` rebuilds even for a change of threads only."""
        done: Future = Future()
        if self._closing:
            done.set_exception(ShuttingDown("the engine is shutting down"))
            return done
        self._inbox.put(ReloadRequest(config, done, force))
        return done

    def set_pass_limits(self, limits: PassLimits) -> None:
        self.pass_limiter.limits = limits

    def _guarded(self, threads: int) -> int:
        # --no-adaptive-threads pins the threads (reproducible greedy text): the guard's cap too.
        return self.pass_limiter.threads(threads) if self.config.adaptive_threads else threads

    def end_session(self, session_id: str) -> int:
        """Forget a session's conversation; returns the tokens it held. NotFound if unknown.
        Its KV cells are dropped when the engine next reuses its sequence."""
        return self.sessions.end(session_id).tokens

    def snapshot(self) -> BackendSnapshot:
        kv_tokens = sum(len(s.cached) for s in self._slots)
        return BackendSnapshot(
            phase=self.phase,
            model=self.facts,
            config=self.config,
            throughput=self.stats.snapshot(),
            sessions=self.sessions.views(),
            requests_active=sum(1 for s in self._slots if s.busy),
            requests_queued=self._inbox.qsize() + len(self._waiting),
            kv_tokens=kv_tokens,
            kv_cache_bytes=kv_tokens * self._kv_bytes_per_token,
            last_reload_pause_ms=self.last_reload_pause_ms,
            load_report=self.load_report,
            vision=self.encoder.stats if self.encoder is not None else (
                self._images.stats if self._images.settings is not None else None),
            prefix_cache=self.sharing.cache.stats(),
            kv_held_bytes=self.pool.allocated * self._ctx.ctx_per_seq * self._kv_bytes_per_token,
            kv_sequences=self.pool.allocated,
            kv_sequences_max=self.config.n_seq,
            saved_sessions_bytes=sum(v.host_bytes for v in self.sessions.views()),
        )

    def close(self, timeout: float = 10.0) -> None:
        """Cancel what runs, refuse what waits, stop the thread and free llama.cpp memory."""
        if self.phase is EnginePhase.STOPPED:
            return
        self._closing = True
        self.phase = EnginePhase.DRAINING
        self._inbox.put(Stop())
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("engine thread did not stop in time; leaking its llama.cpp context")
            return
        if self.encoder is not None:
            self.encoder.close()
        self._images.close()
        self.model_calls.release()
        self.pool.settle()
        self._ctx.close()
        self.model.close()
        self.phase = EnginePhase.STOPPED

    # -- engine thread: the loop ------------------------------------------------------------------

    def _run(self) -> None:
        """The loop, one pass at a time: take in what arrived, admit waiting requests to free
        sequences (admission), compose the pass (schedule), run it (execute), then account for
        it: the tokens fed, the tokens sampled, the replies that ended (update)."""
        while True:
            message = self._next_message()
            if isinstance(message, Stop):
                break
            if isinstance(message, Job):
                self._waiting.append(message)
                continue  # gather everything that arrived before composing the next pass
            if isinstance(message, ReloadRequest):
                self._reload_if_wanted(message)
                continue
            if isinstance(message, ModelCall):
                message.execute(self.model_calls)
                continue
            self._admit()
            if any(s.busy for s in self._slots):
                self._pass_safely()
                self.pool.quiet_since = time.monotonic()
            elif not self._waiting:
                self._shrink_when_quiet()
        self._shutdown()

    def _next_message(self) -> InboxMessage | None:
        """The next message, None when there is none and a pass is due. Blocks only when there
        is nothing to run and nothing that could be admitted."""
        busy = any(s.busy for s in self._slots)
        # While an image encodes beside the loop, wake often enough to see its question cancelled.
        timeout = 0.05 if self._images.has_work(self._waiting) else self.pool.wait_s()
        try:
            return self._inbox.get(block=not busy and not self._waiting_admissible(), timeout=timeout)
        except queue.Empty:
            return None

    def _waiting_admissible(self) -> bool:
        return any(not self._images.pending(j) for j in self._waiting) and any(not s.busy for s in self._slots)

    def _shutdown(self) -> None:
        for slot in self._slots:
            if slot.active is not None:
                self._finish(slot, FinishReason.CANCELLED)
        while self._waiting:
            self._waiting.popleft().sink(ShuttingDown())
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, Job):
                item.sink(ShuttingDown())
            elif isinstance(item, (ReloadRequest, ModelCall)) and item.done.set_running_or_notify_cancel():
                item.done.set_exception(ShuttingDown())

    # -- admission ----------------------------------------------------------------------------------

    def _admit(self) -> None:
        """Bind waiting requests to free sequences, in arrival order; a request whose session is
        mid-turn elsewhere waits for that turn to end."""
        self._shrink_to_ceiling()
        for job, error in resolve_waiting(self._waiting, self._slots, self.sessions):
            job.sink(error)
        self._plan_sharing()
        self._images.poll(self._waiting, max(t for _, t in self.config.tier_threads), self.config.threads_decode,
                          decoding=any(s.busy for s in self._slots))
        still_waiting: deque[Job] = deque()
        encoding_sessions: set[str] = set()  # a session's later turns wait for its image's turn
        blocked = 0  # requests that wait only because every sequence is busy
        while self._waiting:
            job = self._waiting.popleft()
            if job.cancelled:
                job.sink(cancelled_before_start(job))
                continue
            if not still_resolved(job, self.sessions, self._images.pending):
                still_waiting.append(job)  # its session is mid-turn: decided when that turn ends
                continue
            if self._images.pending(job) or job.spec.session_id in encoding_sessions:
                if job.spec.session_id:
                    encoding_sessions.add(job.spec.session_id)
                still_waiting.append(job)
                continue
            if self.sharing.must_wait(job):
                still_waiting.append(job)  # another request is computing its prefix right now
                continue
            choice = choose_slot(job, self.pool.admissible(self._slots), self.sessions, self._one_off_prompt_tokens)
            if choice is None:
                still_waiting.append(job)
                blocked += all(s.busy for s in self._slots)
                continue
            slot = choice.slot
            if choice.evict:
                evict(slot, self._ctx, self.sessions)
            try:
                self._start(job, slot)
            except SidecarError as e:
                job.sink(e)
            except Exception as e:  # one bad request must not take the engine down
                log.exception("request failed to start", request_id=job.spec.request_id)
                job.sink(EngineFailure(f"internal error: {type(e).__name__}: {e}"))
        self._waiting = still_waiting
        grown = self.pool.grown_context()
        if grown is not None:
            self._swap_in(grown)
            self._admit()  # the new sequences are free: the waiting start now
            return
        grow = grown_count(self.pool.allocated, self.config.n_seq, sum(s.busy for s in self._slots), blocked)
        if grow is not None and self.config.grow_beside:
            self.pool.begin_growth(self.model, self.config, grow, lambda: self._inbox.put(ImageReady()))
        elif grow is not None:
            self._resize(grow)
            self._admit()

    def _swap_in(self, grown: NativeContext) -> None:
        t0 = time.perf_counter()
        before = self.pool.allocated
        self._slots = swap_in(self._ctx, grown, self._slots)
        self._ctx = grown
        self._record_resize(before, t0)

    def _resize(self, n: int) -> None:
        """Allocate `n` sequences in place of today's (kv_demand.py); every stream pauses for it."""
        t0 = time.perf_counter()
        before = self.pool.allocated
        self._ctx, self._slots = resize(self._ctx, self.model, self.config, self._slots, self.sessions, n)
        self._record_resize(before, t0)

    def _record_resize(self, before: int, t0: float) -> None:
        self.pool.allocated = len(self._slots)
        self.pool.resizes += 1
        self.pool.last_resize_ms = (time.perf_counter() - t0) * 1000.0
        if self.pool.allocated < before:
            release_freed_memory()
        log.info("kv sequences resized", sequences=self.pool.allocated, was=before, most=self.config.n_seq,
                 pause_ms=round(self.pool.last_resize_ms, 1))

    def _shrink_when_quiet(self) -> None:
        if self.pool.growing:
            return
        n = shrunk_count(self.pool.allocated, self.pool.start, time.monotonic() - self.pool.quiet_since)
        if n is not None:
            self._resize(n)

    def _shrink_to_ceiling(self) -> None:
        """A RAM budget lowered below the sequences allocated: those beyond the new ceiling go as
        soon as no reply streams in them (kv_demand.py); the busy ones first finish where they are."""
        if self.pool.allocated <= self.pool.ceiling:
            return
        park_beyond(self._slots, self.pool.ceiling, self._ctx, self.sessions)
        n = ceiling_count(self._slots, self.pool.ceiling)
        if n is not None:
            self._resize(n)

    def _one_off_prompt_tokens(self, job: Job) -> list[int] | None:
        """A one-off request's prompt tokens, kept on the job for _start; None if it cannot be
        built (_start reports why)."""
        if job.prompt_tokens is None:
            try:
                # Inside the try: text holding the image marker is refused here, and this runs
                # while choosing a sequence, where an exception would stop the engine thread.
                job.prompt_tokens = self._build(job.spec, None, []).tokens
            except SidecarError:
                return None
        return job.prompt_tokens

    def _plan_sharing(self) -> None:
        new = [j for j in self._waiting if j.share_cut is None]
        if not new:
            return
        known = [j.prompt_tokens for j in self._waiting if j.prompt_tokens]
        known += [s.active.prompt_tokens if s.active is not None else s.cached for s in self._slots]
        try:
            self.sharing.plan(
                new,
                known,
                lambda job: shareable_tokens(job, self.sessions, self._one_off_prompt_tokens),
                lambda prompt: context_tokens(self.model.render_chat, self.model.tokenize, prompt),
            )
        except Exception:  # sharing is an optimisation: never let it stop admission
            log.exception("planning shared prefixes failed")
            for job in new:
                job.share_cut = job.share_cut or 0

    def _build(self, spec: GenerationSpec, session: Session | None, images: list) -> BuiltPrompt:
        return build_prompt(self.model, spec, session, images, max_prompt_tokens=self.config.max_prompt_tokens,
                            n_ctx=self._ctx.ctx_per_seq)

    def _start(self, job: Job, slot: Slot) -> None:
        spec = job.spec
        check_not_ended(job, self.sessions)
        session = self.sessions.open(spec.session_id) if spec.session_id else None
        if session is not None and spec.reset_session:
            session.restart()
        new_image = self._encode_image(job, session)
        images = list(session.images if session is not None else []) + ([new_image] if new_image else [])
        if job.prompt_tokens is not None and session is None and not images:
            # Tokenized while choosing its sequence, with the same checks.
            built = BuiltPrompt(list(spec.prompt.messages or ()), spec.prompt.text or "", job.prompt_tokens, {})
        else:
            built = self._build(spec, session, images)
        conversation, prompt_text, tokens, spans = built.conversation, built.prompt_text, built.tokens, built.spans
        if slot.session_id != spec.session_id or not spec.session_id:
            self._bind(slot, session)
        if built.trim.dropped:
            shift_out_dropped(self._ctx, slot, built)
        common = whole_images_prefix(common_prefix(slot.cached, tokens), spans)
        if not self._ctx.truncate(slot.seq, common):
            self._ctx.clear(slot.seq)
            common = 0
        del slot.cached[common:]
        if not spans:
            common = self.sharing.reuse(self._ctx, slot, tokens, common, job.share_cut or 0, self._slots)
        sampler = SamplerChain(self.model.vocab, self.model.n_vocab, spec.sampling, spec.grammar)
        slot.active = ActiveRequest(
            job=job,
            prompt_tokens=tokens,
            cached_tokens=common,
            sampler=sampler,
            stream=TextStream(spec.stop),
            session=session,
            conversation=conversation,
            prompt_text=prompt_text,
            fed=common,
            image_spans=spans,
            new_image=new_image,
            built=built,
        )
        if not spans:
            self.sharing.produce(slot.active, tokens, job.share_cut or 0)
        if spec.asks_about_image:
            slot.active.image_report = image_report(new_image or images[-1], encoded_now=new_image is not None)

    def _encode_image(self, job: Job, session: Session | None) -> EncodedImage | None:
        """The request's image as embeddings: encoded beside the loop before admission (CPU), or
        now, with every other conversation paused (GPU: VLMOpt's no-overlap rule keeps the encoder's
        VRAM and the language phase's apart). Or check that a follow-up has an image to be about."""
        spec = job.spec
        if not spec.asks_about_image:
            return None
        if self._images.wants(job):
            return self._images.take(job)
        if self.encoder is None and self._images.settings is None:
            raise FailedPrecondition(NO_VISION_MODEL)
        if spec.image is None:
            if session is None or not session.images:
                raise InvalidArgument("no image: send one, or ask a follow-up in a session that has one")
            return None
        return self.encoder.encode(spec.image)

    def _bind(self, slot: Slot, session: Session | None) -> None:
        """Make `slot` hold `session`'s cache (restored from host memory if it was evicted), or
        keep its leftovers for a one-off request that may share a prefix with them."""
        if session is None:
            if slot.session_id is not None:
                self._ctx.clear(slot.seq)
                slot.cached = []
            slot.session_id = None
            return
        self._ctx.clear(slot.seq)
        slot.cached = []
        if session.saved_state is not None:
            self._ctx.restore(slot.seq, session.saved_state)
            slot.cached = list(session.saved_tokens)
            session.saved_state, session.saved_tokens = None, []
        slot.session_id = session.session_id
        session.seq = slot.seq

    # -- one forward pass ---------------------------------------------------------------------------

    def _pass_safely(self) -> None:
        try:
            self._step()
        except Exception as e:
            # A failed pass leaves the KV cache of everything in it uncertain: end those requests,
            # keep the engine. Their sequences are cleared so the next request starts clean.
            error = e if isinstance(e, SidecarError) else EngineFailure(f"internal error: {type(e).__name__}: {e}")
            if not isinstance(e, SidecarError):
                log.exception("forward pass failed")
            for slot in self._slots:
                if slot.active is not None:
                    self.sharing.abandon(slot.active)
                    slot.active.sampler.close()
                    slot.active.job.sink(error)
                    slot.active = None
                    self._ctx.clear(slot.seq)
                    slot.cached = []

    def _step(self) -> None:
        plan = self._schedule()
        if plan is None:
            return
        elapsed = self._execute(plan)
        self._update(plan, elapsed)

    def _schedule(self) -> StepPlan | None:
        """The next pass: replies cancelled end, sequences move down into gaps, images due are
        fed (a pass of their own), then every sequence's demand goes into one batch (plan_step).
        None when nothing is left to run."""
        for slot in self._slots:
            if slot.active is not None and slot.active.job.cancelled:
                self._finish(slot, FinishReason.CANCELLED)
        self._pack()
        for slot in self._slots:
            if slot.active is not None and slot.active.next_image_start() == slot.active.fed:
                self._feed_image(slot)
        demands = [self._demand(s) for s in self._slots if s.active is not None]
        return plan_step(demands, self.pass_limiter.batch(self.config.n_batch)) if demands else None

    def _execute(self, plan: StepPlan) -> float:
        """One forward pass on the threads the plan's tier, the governor and an image encode
        beside the loop leave it; its time in seconds."""
        planned = threads_for(plan.n_tokens, self.config.tier_threads)
        used = self._guarded(self._images.per_pass_threads(self._governor.threads(self.config, planned)))
        self._ctx.set_threads(used)
        t0 = time.perf_counter()
        self._ctx.decode(list(plan.entries))
        elapsed = time.perf_counter() - t0
        self._governor.record(self.config, plan.n_tokens, planned, used, elapsed * 1000.0)
        self.pass_limiter.pause_after(elapsed)
        return elapsed

    def _update(self, plan: StepPlan, elapsed: float) -> None:
        """What the pass fed is now in each sequence's cache; where a prompt ended or a token was
        decoded, the next token is sampled (which may end the reply)."""
        by_seq = {s.seq: s for s in self._slots}
        decode_tokens = prefill_tokens = 0
        for seq, n in plan.fed:
            slot, active = by_seq[seq], by_seq[seq].active
            if active.decoding:
                slot.cached.append(active.next_token)
                active.next_token = None
                decode_tokens += n
            else:
                slot.cached.extend(active.prompt_tokens[active.fed : active.fed + n])
                active.fed += n
                prefill_tokens += n
                self.sharing.after_pass(self._ctx, slot)
        if decode_tokens:
            self.stats.record_decode(decode_tokens, elapsed * decode_tokens / plan.n_tokens)
        if prefill_tokens:
            self.stats.record_prefill(prefill_tokens, elapsed * prefill_tokens / plan.n_tokens)
        now = time.perf_counter()
        for seq, index in plan.logits_at:
            self._sample(by_seq[seq], index, now)

    def _pack(self) -> None:
        """Move generating sequences down into the gaps below them (see packing.py)."""
        for low, high in packing_moves(self._slots):
            swap(self._ctx, self.sessions, low, high)
            self.stats.record_move()

    def _demand(self, slot: Slot) -> SequenceDemand:
        a = slot.active
        if a.decoding:
            return SequenceDemand(slot.seq, (a.next_token,), len(slot.cached), True)
        image_at = a.next_image_start()
        end = image_at if image_at is not None else len(a.prompt_tokens)
        if a.share_at is not None:
            end = min(end, a.share_at)  # others wait for exactly this prefix (prefix_sharing.py)
        # Text before an image (or a shared prefix) goes first; the pass then ends there, so no
        # logits are asked for (the plan samples only where a prompt ends).
        return SequenceDemand(slot.seq, tuple(a.prompt_tokens[a.fed : end]), len(slot.cached), False, end == len(a.prompt_tokens))

    def _feed_image(self, slot: Slot) -> None:
        """Decode an image's embeddings into the sequence: a pass of its own (a batch carries
        either tokens or embeddings, never both)."""
        a = slot.active
        image: EncodedImage = a.image_spans[a.fed]
        t0 = time.perf_counter()
        planned = threads_for(image.n_tokens, self.config.tier_threads)
        self._ctx.set_threads(self._guarded(self._images.per_pass_threads(self._governor.threads(self.config, planned))))
        self._ctx.decode_embeddings(slot.seq, len(slot.cached), image.embeddings, image.non_causal)
        slot.cached.extend([image.sentinel] * image.n_tokens)
        a.fed += image.n_tokens
        self.stats.record_prefill(image.n_tokens, time.perf_counter() - t0)

    def _sample(self, slot: Slot, index: int, now: float) -> None:
        a = slot.active
        if a.prefill_done_at is None:
            a.prefill_done_at = now
        token = a.sampler.sample(self._ctx.ptr, index)
        if a.first_token_at is None:
            a.first_token_at = time.perf_counter()
        if self.model.is_end_of_generation(token):
            self._finish(slot, FinishReason.STOP)
            return
        a.generated += 1
        if a.job.spec.logprobs is not None:
            a.pending_logprobs.append(logprob_at(self._ctx.ptr, index, self.model.n_vocab, token,
                                                 a.job.spec.logprobs, self.model.piece))
        self._send(a, a.stream.push(token, self.model.piece(token)))
        if a.stream.stopped:
            self._finish(slot, FinishReason.STOP_STRING)
        elif a.generated >= a.job.spec.max_tokens:
            self._finish(slot, FinishReason.LENGTH)
        elif len(slot.cached) >= self._ctx.ctx_per_seq:
            self._finish(slot, FinishReason.CONTEXT_FULL)
        else:
            a.next_token = token

    @staticmethod
    def _send(a: ActiveRequest, chunk: TextChunk) -> None:
        if chunk.text or chunk.token_ids:
            a.reply.append(chunk.text)
            a.job.sink(TextDelta(chunk.text, tuple(chunk.token_ids), take(a.pending_logprobs, len(chunk.token_ids))))

    def _finish(self, slot: Slot, reason: FinishReason) -> None:
        a = slot.active
        slot.active = None
        slot.last_used = time.perf_counter()
        self.sharing.abandon(a)
        a.sampler.close()
        if not a.stream.stopped:
            self._send(a, a.stream.finish())
        ended = time.perf_counter()
        if a.session is not None and self.sessions.get(a.session.session_id) is a.session:
            remember_turn(a.session, a, "".join(a.reply), slot.cached, self.model)
        self.stats.record_request()
        a.job.sink(finished(a, reason, ended))
