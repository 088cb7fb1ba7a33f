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

Parts of it live beside it: admission (admission.py) and which sequence a request gets
(slot_choice.py), the KV growing and shrinking with the crowd (kv_resizing.py, kv_demand.py),
keeping the replying sequences on the lowest ids (packing.py), reloads (reload.py), the final
report (finish_report.py), and prompt prefixes shared across conversations (prefix_sharing.py,
prefix_cache.py).
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import Callable, cast

import llama_cpp
import structlog

from sidecar.backend.engine_config import EngineConfig
from sidecar.backend.load_report import parse_load_log
from sidecar.native.log_capture import install_native_log_filter
from sidecar.backend.contract import BackendSnapshot, RequestLimits
from sidecar.backend.phase import EnginePhase
from sidecar.engine.prompts.context_shift import shift_out_dropped
from sidecar.engine.image_encodes import ImageEncodes
from sidecar.engine.prompts.image_prompt import image_report, whole_images_prefix
from sidecar.engine.prefix.prefix_cache import PrefixCache
from sidecar.engine.prefix.prefix_sharing import PrefixSharing
from sidecar.engine.prompts.prompt_build import BuiltPrompt, build_prompt
from sidecar.engine.prompts.prompt_prep import Prebuilt, PrepSettings, PromptPrep
from sidecar.engine.finish_report import finished
from sidecar.engine.scheduling.packing import packing_moves, swap
from sidecar.engine.loading import context_for, load_model_and_context
from sidecar.engine.session_turn import remember_turn
from sidecar.engine.session_saves import export_on_engine, import_on_engine, our_fingerprint
from sidecar.engine.inbox import ImageReady, InboxMessage, Stop
from sidecar.engine.admission import Admitting
from sidecar.engine.kv_demand import SequencePool
from sidecar.engine.kv_resizing import KvResizing
from sidecar.engine.model_calls import ModelCall, ModelCalls
from sidecar.engine.reload import Reloading, ReloadRequest
from sidecar.engine.scheduling.resent_admission import check_not_ended
from sidecar.backend.requests import NO_VISION_MODEL, FinishReason, GenerationSpec, Job, Sink, TextDelta
from sidecar.engine.sampler_chain import SamplerChain
from sidecar.engine.jump_forward import ForcedText
from sidecar.backend.sessions import Session, SessionStore
from sidecar.engine.scheduling.slot import ActiveRequest, Slot
from sidecar.engine.scheduling.slot_choice import common_prefix
from sidecar.backend.stats import ThroughputStats
from sidecar.engine.scheduling.prompt_budget import WHOLE_PROMPT_TOKENS, PromptBudget
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

class Engine(Admitting, KvResizing, Reloading):
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
        self.prompt_budget = PromptBudget()  # prompt tokens a pass may carry beside a streaming reply
        self._waiting: deque[Job] = deque()
        self._closing = False
        self.last_reload_pause_ms = 0.0
        # When the current run of passes began (time.monotonic()), None while idle: the frame
        # guard tells what runs beside a reply from what runs between replies.
        self.busy_since: float | None = None
        self._governor = GovernedThreads()
        self._forced_text: ForcedText | None = None  # built on the first grammar request
        self.pass_limiter = PassLimiter()  # the frame guard's (sidecar.guard)
        # Embedding passes run between the streams' passes, under the same frame guard.
        self.model_calls = ModelCalls(lambda: self.model,
                                      lambda: self._guarded(self._governor.threads(self.config, self.config.threads_prefill)),
                                      self._embedding_slice_tokens, self.pass_limiter.pause_after)
        # Prompts are built on a thread of their own before they reach this one (prompt_prep.py);
        # the lock keeps a reload from freeing the model under it, and the generation tells a
        # prompt built with the old model from one built with the new.
        self._model_lock = threading.Lock()
        self.model_generation = 0
        self.prompts_built_on_engine_thread = 0  # prompts prepared beside it were stale, or not preparable
        self.prep = PromptPrep(
            PrepSettings(lambda: self.model, self._model_lock, lambda: self.model_generation,
                         lambda: self._ctx.ctx_per_seq, lambda: self.config.max_prompt_tokens),
            self.sessions, self._inbox.put)
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
        if self.prep.pending() + self._inbox.qsize() + len(self._waiting) >= self.config.max_queue:
            raise ResourceExhausted(f"{self.config.max_queue} requests are already waiting; try again shortly")
        if spec.max_tokens > self.config.max_tokens_per_request:
            raise InvalidArgument(f"max_tokens {spec.max_tokens} is above the limit {self.config.max_tokens_per_request}")
        job = Job(spec=spec, sink=sink, resent=spec if spec.resends_history else None)
        self.prep.put(job)  # rendered and tokenized there, then passed to the engine thread
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
        """Tokenize, detokenize or embed (model_calls.py) on the engine thread, between passes;
        cancelling the future stops an embedding call before its next slice."""
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

    def export_sessions(self, session_ids: list[str], include_kv: bool) -> Future:
        """Save games: the sessions' archive, unsealed, and what was saved of each
        (session_saves.py), read between two passes."""
        return self.call_model(lambda calls: export_on_engine(self, session_ids, include_kv))

    def import_sessions(self, archive, ours, replace: bool) -> Future:
        """Save games: add a checked archive's sessions between two passes (session_saves.py)."""
        return self.call_model(lambda calls: import_on_engine(self, archive, ours, replace))

    def save_fingerprint(self, layers: int = 0):
        return our_fingerprint(self, layers)

    def set_pass_limits(self, limits: PassLimits) -> None:
        self.pass_limiter.limits = limits

    def _embedding_slice_tokens(self) -> int:
        """An embedding slice runs between two passes, so a reply streaming waits for it as for a
        pass: beside one it takes a prompt's budget (prompt_budget.py). A whole slice of 512 tokens
        is about 1.4 s on a 2-core Xeon, as a prompt chunk of 512 is."""
        n_batch = self.pass_limiter.batch(self.config.n_batch)
        streaming = sum(1 for s in self._slots if s.active is not None and s.active.decoding)
        if streaming and self.config.prompt_slices_beside_replies:
            return self.prompt_budget.tokens_beside_replies(n_batch, streaming)
        return n_batch

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
            requests_queued=self.prep.pending() + self._inbox.qsize() + len(self._waiting),
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
            vision_worker_bytes=self._images.worker_bytes(),
        )

    def close(self, timeout: float = 10.0) -> None:
        """Cancel what runs, refuse what waits, stop the thread and free llama.cpp memory."""
        if self.phase is EnginePhase.STOPPED:
            return
        self._closing = True
        self.phase = EnginePhase.DRAINING
        self.prep.close()  # what it holds reaches the inbox before Stop, and is refused there
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
                if message.prep_error is not None:
                    message.sink(message.prep_error)  # refused while its prompt was prepared
                else:
                    self._waiting.append(message)
                continue  # gather everything that arrived before composing the next pass
            if isinstance(message, ReloadRequest):
                self._reload_if_wanted(message)
                continue
            if isinstance(message, ModelCall):
                self.model_calls.take(message)
                continue
            self._admit()
            if any(s.busy for s in self._slots):
                self.busy_since = self.busy_since or time.monotonic()
                self._pass_safely()
                self.pool.quiet_since = time.monotonic()
                if not any(s.busy for s in self._slots):  # the loop may now block on its inbox
                    self.busy_since = None
            elif not self._waiting:
                self._shrink_when_quiet()
            self.model_calls.advance()  # one slice of an embedding call between two passes
        self._shutdown()

    def _next_message(self) -> InboxMessage | None:
        """The next message, None when there is none and a pass is due. Blocks only when there
        is nothing to run and nothing that could be admitted."""
        busy = any(s.busy for s in self._slots)
        # While an image encodes beside the loop, wake often enough to see its question cancelled.
        timeout = 0.05 if self._images.has_work(self._waiting) else self.pool.wait_s()
        try:
            idle = not busy and not self._waiting_admissible() and not self.model_calls.pending
            return self._inbox.get(block=idle, timeout=timeout)
        except queue.Empty:
            return None

    def _shutdown(self) -> None:
        for slot in self._slots:
            if slot.active is not None:
                self._finish(slot, FinishReason.CANCELLED)
        while self._waiting:
            self._waiting.popleft().sink(ShuttingDown())
        self.model_calls.stop_all(ShuttingDown())
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, Job):
                item.sink(ShuttingDown())
            elif isinstance(item, (ReloadRequest, ModelCall)) and item.done.set_running_or_notify_cancel():
                item.done.set_exception(ShuttingDown())

    def _build(self, spec: GenerationSpec, session: Session | None, images: list) -> BuiltPrompt:
        self.prompts_built_on_engine_thread += 1
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
        prebuilt = cast("Prebuilt | None", job.prebuilt)  # requests.py may not import the engine's types
        if prebuilt is not None and not images and prebuilt.still_valid(session, self.model_generation, self._ctx.ctx_per_seq):
            built = prebuilt.built  # built beside this thread against what the session still holds
        elif job.prompt_tokens is not None and session is None and not images:
            # Tokenized while choosing its sequence, with the same checks.
            built = BuiltPrompt(list(spec.prompt.messages or ()), spec.prompt.text or "", job.prompt_tokens, {})
        else:
            built = self._build(spec, session, images)
        conversation, prompt_text, tokens, spans = built.conversation, built.prompt_text, built.tokens, built.spans
        if not tokens:
            # Text of nothing but characters the tokenizer drops (SmolLM2 drops U+0016 and adds no
            # BOS) is no prompt: an empty batch is llama_decode's -1, which reached the game as
            # INTERNAL (found by the transport fuzzer). Refused before anything changes.
            raise InvalidArgument("the prompt has no tokens: its text is only characters the model's tokenizer drops")
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
            try:
                self._ctx.restore(slot.seq, session.saved_state)
                slot.cached = list(session.saved_tokens)
            except EngineFailure as e:
                # A saved state llama.cpp refuses (a save's, made with another attention layout):
                # the conversation is computed again from its text, never half restored.
                log.warning("saved KV state refused; recomputing the conversation", session_id=session.session_id, error=str(e))
                self._ctx.clear(slot.seq)
            session.saved_state, session.saved_tokens = None, []
        session.imported = ""
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
        if not demands:
            return None
        n_batch = self.pass_limiter.batch(self.config.n_batch)
        streaming = sum(d.decoding for d in demands)
        beside = (self.prompt_budget.tokens_beside_replies(n_batch, streaming, len(demands) - streaming)
                  if self.config.prompt_slices_beside_replies else None)
        return plan_step(demands, n_batch, beside, WHOLE_PROMPT_TOKENS)

    def _execute(self, plan: StepPlan) -> float:
        """One forward pass on the threads the plan's tier, the governor and an image encode
        beside the loop leave it; its time in seconds."""
        planned = threads_for(plan.n_tokens, self.config.tier_threads)
        used = self._guarded(self._images.per_pass_threads(self._governor.threads(self.config, planned)))
        self._ctx.set_threads(used)
        t0 = time.perf_counter()
        self._ctx.decode(list(plan.entries))
        elapsed = time.perf_counter() - t0
        if not self.pool.growing:
            # A bigger KV being made beside the loop (kv_demand.py) holds a core for a second or
            # so: passes slowed by the daemon's own work are no sign of a busy PC, and the cap
            # they lowered stayed lowered for hundreds of passes (a village's first wave 1.7x slower).
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
                # The sampled token, and as many forced ones as this pass carried (jump_forward.py).
                slot.cached.extend(active.next_tokens[:n])
                del active.next_tokens[:n]
                decode_tokens += n
            else:
                slot.cached.extend(active.prompt_tokens[active.fed : active.fed + n])
                active.fed += n
                prefill_tokens += n
                self.sharing.after_pass(self._ctx, slot)
        self.prompt_budget.record(decode_tokens, prefill_tokens, elapsed * 1000.0)
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
            return SequenceDemand(slot.seq, tuple(a.next_tokens), len(slot.cached), True)
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
        try:
            token = a.sampler.sample(self._ctx.ptr, index)
        except SidecarError as e:  # a grammar that left no token, or cost too much: this request only
            self._fail(slot, e)
            return
        if a.first_token_at is None:
            a.first_token_at = time.perf_counter()
        if self.model.is_end_of_generation(token):
            self._finish(slot, FinishReason.STOP)
            return
        if a.job.spec.logprobs is not None:
            a.pending_logprobs.append(logprob_at(self._ctx.ptr, index, self.model.n_vocab, token,
                                                 a.job.spec.logprobs, self.model.piece))
        if self._emit(slot, token):
            return
        try:
            forced, must_end = self._forced_after(slot)
        except SidecarError as e:  # the jump's grammar work cost too much: this request only
            self._fail(slot, e)
            return
        for token in forced:
            a.forced_tokens += 1
            if self._emit(slot, token):
                return
        if must_end:  # the grammar is complete: its end token would be the next pass's only choice
            self._finish(slot, FinishReason.STOP)

    def _emit(self, slot: Slot, token: int) -> bool:
        """Send a token of the reply and queue it for the next pass; True when the reply ended."""
        a = slot.active
        a.generated += 1
        self._send(a, a.stream.push(token, self.model.piece(token)))
        if a.stream.stopped:
            self._finish(slot, FinishReason.STOP_STRING)
        elif a.generated >= a.job.spec.max_tokens:
            self._finish(slot, FinishReason.LENGTH)
        elif len(slot.cached) + len(a.next_tokens) >= self._ctx.ctx_per_seq:
            self._finish(slot, FinishReason.CONTEXT_FULL)
        else:
            a.next_tokens.append(token)
            return False
        return True

    def _forced_after(self, slot: Slot) -> tuple[list[int], bool]:
        """The tokens the request's grammar forces next, accepted by its sampler (jump_forward.py),
        and whether the grammar must then end. None without a grammar, with --no-jump-forward,
        and with logprobs (a forced token has no distribution of its own to report)."""
        a = slot.active
        if a.sampler.grammar is None or not self.config.jump_forward or a.job.spec.logprobs is not None:
            return [], False
        if self._forced_text is None or self._forced_text.model is not self.model:
            self._forced_text = ForcedText(self.model)
        started = time.thread_time()
        tokens, must_end = self._forced_text.forced_tokens(a.sampler.grammar)
        taken: list[int] = []
        for token in tokens:
            if not a.sampler.allows(token):  # the tokenizer's split is checked, token by token
                break
            a.sampler.accept(token)
            taken.append(token)
        a.sampler.charge_grammar_work(started)
        return taken, must_end and len(taken) == len(tokens)

    @staticmethod
    def _send(a: ActiveRequest, chunk: TextChunk) -> None:
        if chunk.text or chunk.token_ids:
            a.reply.append(chunk.text)
            a.job.sink(TextDelta(chunk.text, tuple(chunk.token_ids), take(a.pending_logprobs, len(chunk.token_ids))))

    def _fail(self, slot: Slot, error: SidecarError) -> None:
        """End one request with an error after a pass that went well: its sequence's cache holds
        what it was fed, and the other sequences go on."""
        a = slot.active
        slot.active = None
        slot.last_used = time.perf_counter()
        self.sharing.abandon(a)
        a.sampler.close()
        self.stats.record_request()
        a.job.sink(error)

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
