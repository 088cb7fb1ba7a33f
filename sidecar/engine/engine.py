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

Parts of it live beside it. Admission (admission.py, an object of its own that touches no
llama.cpp: its tests run with fakes) and which sequence a request gets (slot_choice.py); a request
begun in its sequence (request_start.py); a reply's tokens sampled, streamed and ended
(replies.py, finish_report.py); the KV growing and shrinking with the crowd (kv_resizing.py,
kv_demand.py); keeping the replying sequences on consecutive ids (packing.py); reloads (reload.py);
prompt prefixes shared across conversations (prefix_sharing.py, prefix_cache.py). The functions of
request_start, replies, kv_resizing and reload take the engine itself: every attribute they read
is declared in Engine.__init__, and mypy checks it. Each request's state (request_state.py) is set
where it moves on, and status lists it.
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
from sidecar.native.ggml_devices import devices_memory
from sidecar.native.log_capture import install_native_log_filter
from sidecar.backend.contract import BackendSnapshot, RequestLimits, ServedLimits
from sidecar.backend.phase import EnginePhase
from sidecar.engine.image_encodes import ImageEncodes
from sidecar.engine.prefix.prefix_cache import PrefixCache
from sidecar.engine.prefix.prefix_sharing import PrefixSharing
from sidecar.engine.prompts.prompt_build import BuiltPrompt, build_prompt
from sidecar.engine.prompts.prompt_prep import PrepSettings, PromptPrep
from sidecar.engine.scheduling.packing import packing_moves, swap
from sidecar.engine.loading import context_for, load_model_and_context, load_report_of
from sidecar.engine.session_saves import export_on_engine, import_on_engine, our_fingerprint
from sidecar.engine.inbox import ImageReady, InboxMessage, Stop
from sidecar.engine.admission import Admission
from sidecar.engine.kv_demand import SequencePool
from sidecar.engine.kv_resizing import grow_for, shrink_to_ceiling, shrink_when_quiet
from sidecar.engine.model_calls import ModelCall, ModelCalls
from sidecar.engine.reload import ReloadRequest, reload_if_wanted
from sidecar.engine.replies import end_after_failed_pass, finish, sample_next
from sidecar.engine.request_start import start_request
from sidecar.backend.request_state import RequestState, RequestView
from sidecar.backend.requests import FinishReason, GenerationSpec, Job, Sink
from sidecar.engine.jump_forward import ForcedText
from sidecar.backend.sessions import Session, SessionStore
from sidecar.engine.scheduling.slot import Slot, request_views
from sidecar.backend.stats import ThroughputStats
from sidecar.engine.scheduling.prompt_budget import WHOLE_PROMPT_TOKENS, PromptBudget
from sidecar.engine.scheduling.step import SequenceDemand, StepPlan, plan_step, threads_for
from sidecar.engine.pass_limits import PassLimiter
from sidecar.engine.threads.thread_governor_hook import GovernedThreads
from sidecar.guard.frame_guard import PassLimits
from sidecar.errors import (
    EngineFailure,
    InvalidArgument,
    ResourceExhausted,
    ShuttingDown,
    SidecarError,
    Unavailable,
)
from sidecar.vision.encoder import EncodedImage, VisionEncoder

log = structlog.get_logger("engine")

class Engine:
    """Loads the model at construction (raises ModelLoadError) and serves until close()."""

    def __init__(self, config: EngineConfig) -> None:
        install_native_log_filter()
        self.phase = EnginePhase.LOADING
        self.config = config
        self.pool = SequencePool(config)
        self.model, self.ctx = load_model_and_context(config, self.pool.allocated)
        if not self.model.plain_kv and self.pool.allocated < config.n_seq:
            # Its saved sequences do not carry into another size (seq_state.py): all from the start.
            self.ctx.close()
            self.ctx = context_for(self.model, config, config.n_seq)
            self.pool.start = self.pool.allocated = config.n_seq
        self.load_report = load_report_of(self.model, self.ctx)
        self.facts = self.model.facts()
        self._inbox: queue.Queue[InboxMessage] = queue.Queue()
        self.images = ImageEncodes(wake=self.wake)
        self.encoder = self.open_encoder(config)
        self.kv_bytes_per_token = self.model.kv_bytes_per_token_f16()
        self.slots = [Slot(seq) for seq in range(self.pool.allocated)]
        self.sessions = SessionStore(config.max_sessions, config.saved_sessions_bytes)
        self.sharing = PrefixSharing(PrefixCache(config.prefix_cache_bytes), self.kv_bytes_per_token)
        self.stats = ThroughputStats()
        self.prompt_budget = PromptBudget()  # prompt tokens a pass may carry beside a streaming reply
        self._waiting: deque[Job] = deque()
        self.requests: tuple[RequestView, ...] = ()  # as status shows them (request_views)
        self._closing = False
        self.last_reload_pause_ms = 0.0
        # When the current run of passes began (time.monotonic()), None while idle: the frame
        # guard tells what runs beside a reply from what runs between replies.
        self.busy_since: float | None = None
        self._governor = GovernedThreads()
        # What grammars force (jump_forward.py): built with the model, never on a request's time.
        self.forced_text = ForcedText(self.model) if config.jump_forward else None
        self.pass_limiter = PassLimiter()  # the frame guard's (sidecar.guard)
        # Embedding passes run between the streams' passes, under the same frame guard.
        self.model_calls = ModelCalls(lambda: self.model,
                                      lambda: self._guarded(self._governor.threads(self.config, self.config.threads_prefill)),
                                      self._embedding_slice_tokens, self.pass_limiter.pause_after)
        # Prompts are built on a thread of their own before they reach this one (prompt_prep.py);
        # the lock keeps a reload from freeing the model under it, and the generation tells a
        # prompt built with the old model from one built with the new.
        self.model_lock = threading.Lock()
        self.model_generation = 0
        self.prompts_built_on_engine_thread = 0  # prompts prepared beside it were stale, or not preparable
        self.prep = PromptPrep(
            PrepSettings(lambda: self.model, self.model_lock, lambda: self.model_generation,
                         lambda: self.ctx.ctx_per_seq, lambda: self.config.max_prompt_tokens),
            self.sessions, self._inbox.put)
        self.admission = Admission(self.sessions, self.sharing, self.images, self.pool, self.prep.contexts)
        self._thread = threading.Thread(target=self._run, name="xlm-engine", daemon=True)
        self.phase = EnginePhase.READY
        self._thread.start()

    def open_encoder(self, config: EngineConfig) -> VisionEncoder | None:
        """The in-loop encoder of a GPU plan; a CPU encoder runs beside the loop (image_encodes.py)."""
        beside = config.vision is not None and not config.vision.use_gpu
        self.images.configure(config.vision if beside else None, config.model_path,
                              llama_cpp.llama_model_n_embd_inp(self.model.ptr))
        if config.vision is None or beside:
            return None
        try:
            return VisionEncoder(self.model.ptr, config.vision)
        except BaseException:
            self.ctx.close()
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
            context_per_sequence=self.ctx.ctx_per_seq,
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
        streaming = sum(1 for s in self.slots if s.active is not None and s.active.decoding)
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
        kv_tokens = sum(len(s.cached) for s in self.slots)
        return BackendSnapshot(
            phase=self.phase,
            model=self.facts,
            limits=ServedLimits(max_sessions=self.config.max_sessions, context_per_session=self.config.n_ctx,
                                max_prompt_tokens=self.config.max_prompt_tokens,
                                max_tokens_per_request=self.config.max_tokens_per_request),
            config=self.config,
            throughput=self.stats.snapshot(),
            sessions=self.sessions.views(),
            requests_active=sum(1 for s in self.slots if s.busy),
            requests_queued=self.prep.pending() + self._inbox.qsize() + len(self._waiting),
            requests=self.requests,
            kv_tokens=kv_tokens,
            kv_cache_bytes=kv_tokens * self.kv_bytes_per_token,
            last_reload_pause_ms=self.last_reload_pause_ms,
            load_report=self.load_report,
            vision=self.encoder.stats if self.encoder is not None else (
                self.images.stats if self.images.settings is not None else None),
            prefix_cache=self.sharing.cache.stats(),
            kv_held_bytes=self.pool.allocated * self.ctx.ctx_per_seq * self.kv_bytes_per_token,
            kv_sequences=self.pool.allocated,
            kv_sequences_max=self.config.n_seq,
            saved_sessions_bytes=sum(v.host_bytes for v in self.sessions.views()),
            vision_worker_bytes=self.images.worker_bytes(),
            device_memory=devices_memory(self.load_report.by_device()),
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
        self.images.close()
        self.model_calls.release()
        self.pool.settle()
        self.ctx.close()
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
                    message.end(message.prep_error)  # refused while its prompt was prepared
                else:
                    message.state = RequestState.WAITING_FOR_SEQUENCE  # until admission says why
                    self._waiting.append(message)
                continue  # gather everything that arrived before composing the next pass
            if isinstance(message, ReloadRequest):
                reload_if_wanted(self, message)
                continue
            if isinstance(message, ModelCall):
                self.model_calls.take(message)
                continue
            self._admit()
            # Published before the pass too: a first prefill can take seconds, and status would
            # show the requests just admitted as they were before it.
            self.publish_requests()
            if any(s.busy for s in self.slots):
                self.busy_since = self.busy_since or time.monotonic()
                self._pass_safely()
                self.pool.quiet_since = time.monotonic()
                if not any(s.busy for s in self.slots):  # the loop may now block on its inbox
                    self.busy_since = None
            elif not self._waiting:
                shrink_when_quiet(self)
            self.model_calls.advance()  # one slice of an embedding call between two passes
            self.publish_requests()
        self._shutdown()

    def publish_requests(self) -> None:
        """Rebuild the request views status reads (engine thread only)."""
        self.requests = request_views(self.slots, self._waiting, time.perf_counter())

    def _next_message(self) -> InboxMessage | None:
        """The next message, None when there is none and a pass is due. Blocks only when there
        is nothing to run and nothing that could be admitted."""
        busy = any(s.busy for s in self.slots)
        # While an image encodes beside the loop, wake often enough to see its question cancelled.
        timeout = 0.05 if self.images.has_work(self._waiting) else self.pool.wait_s()
        try:
            idle = not busy and not self.admission.admissible(self._waiting, self.slots) and not self.model_calls.pending
            return self._inbox.get(block=idle, timeout=timeout)
        except queue.Empty:
            return None

    def _shutdown(self) -> None:
        for slot in self.slots:
            if slot.active is not None:
                finish(self, slot, FinishReason.CANCELLED)
        while self._waiting:
            self._waiting.popleft().end(ShuttingDown())
        self.model_calls.stop_all(ShuttingDown())
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, Job):
                item.end(ShuttingDown())
            elif isinstance(item, (ReloadRequest, ModelCall)) and item.done.set_running_or_notify_cancel():
                item.done.set_exception(ShuttingDown())

    def wake(self) -> None:
        """Have the loop look again (a bigger KV made beside it is ready, an image encoded)."""
        self._inbox.put(ImageReady())

    def _admit(self) -> None:
        """Bind waiting requests to free sequences (admission.py); grow the KV for those that wait
        only because every sequence is busy, and admit again into the new ones."""
        shrink_to_ceiling(self)
        admitted = self.admission.admit(self._waiting, self.slots, self.ctx, self.config, self._start,
                                        self._one_off_prompt_tokens)
        self._waiting = admitted.waiting
        if grow_for(self, admitted.blocked):
            self._admit()

    def _one_off_prompt_tokens(self, job: Job) -> list[int] | None:
        """A one-off request's prompt tokens, kept on the job for _start; None if it cannot be
        built (_start reports why)."""
        if job.prompt_tokens is None:
            try:
                # Inside the try: text holding the image marker is refused here, and this runs
                # while choosing a sequence, where an exception would stop the engine thread.
                job.prompt_tokens = self.build_on_engine_thread(job.spec, None, []).tokens
            except SidecarError:
                return None
        return job.prompt_tokens

    def build_on_engine_thread(self, spec: GenerationSpec, session: Session | None, images: list) -> BuiltPrompt:
        self.prompts_built_on_engine_thread += 1
        return build_prompt(self.model, spec, session, images, max_prompt_tokens=self.config.max_prompt_tokens,
                            n_ctx=self.ctx.ctx_per_seq)

    def _start(self, job: Job, slot: Slot) -> None:
        start_request(self, job, slot)

    # -- one forward pass ---------------------------------------------------------------------------

    def _pass_safely(self) -> None:
        try:
            self._step()
        except Exception as e:
            error = e if isinstance(e, SidecarError) else EngineFailure(f"internal error: {type(e).__name__}: {e}")
            if not isinstance(e, SidecarError):
                log.exception("forward pass failed")
            end_after_failed_pass(self.slots, self.sharing, self.ctx, error)

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
        for slot in self.slots:
            if slot.active is not None and slot.active.job.cancelled:
                finish(self, slot, FinishReason.CANCELLED)
        self._pack()
        for slot in self.slots:
            if slot.active is not None and slot.active.next_image_start() == slot.active.fed:
                self._feed_image(slot)
        demands = [self._demand(s) for s in self.slots if s.active is not None]
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
        used = self._guarded(self.images.per_pass_threads(self._governor.threads(self.config, planned)))
        self.ctx.set_threads(used)
        t0 = time.perf_counter()
        self.ctx.decode(list(plan.entries))
        elapsed = time.perf_counter() - t0
        if not self.pool.growing:
            # A bigger KV being made beside the loop (kv_demand.py) holds a core for a second or
            # so: passes slowed by the daemon's own work are no sign of a busy PC, and the cap
            # they lowered stayed lowered for hundreds of passes (a village's first wave 1.7x slower).
            reads = sum(e.pos for e in plan.entries)  # cached tokens the pass's attention reads
            self._governor.record(self.config, plan.n_tokens, planned, used, elapsed * 1000.0, reads)
        self.pass_limiter.pause_after(elapsed)
        return elapsed

    def _update(self, plan: StepPlan, elapsed: float) -> None:
        """What the pass fed is now in each sequence's cache; where a prompt ended or a token was
        decoded, the next token is sampled (which may end the reply)."""
        by_seq = {s.seq: s for s in self.slots}
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
                self.sharing.after_pass(self.ctx, slot)
        self.prompt_budget.record(decode_tokens, prefill_tokens, elapsed * 1000.0)
        if decode_tokens:
            self.stats.record_decode(decode_tokens, elapsed * decode_tokens / plan.n_tokens)
        if prefill_tokens:
            self.stats.record_prefill(prefill_tokens, elapsed * prefill_tokens / plan.n_tokens)
        now = time.perf_counter()
        for seq, index in plan.logits_at:
            sample_next(self, by_seq[seq], index, now)

    def _pack(self) -> None:
        """Close the gaps between generating sequences, copying the fewest cells (packing.py)."""
        for low, high in packing_moves(self.slots, self.pool.ceiling):
            swap(self.ctx, self.sessions, low, high)
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
        return SequenceDemand(slot.seq, tuple(a.prompt_tokens[a.fed : end]), len(slot.cached), False,
                              end == len(a.prompt_tokens), a.text_to_prefill)

    def _feed_image(self, slot: Slot) -> None:
        """Decode an image's embeddings into the sequence: a pass of its own (a batch carries
        either tokens or embeddings, never both)."""
        a = slot.active
        image: EncodedImage = a.image_spans[a.fed]
        t0 = time.perf_counter()
        planned = threads_for(image.n_tokens, self.config.tier_threads)
        self.ctx.set_threads(self._guarded(self.images.per_pass_threads(self._governor.threads(self.config, planned))))
        self.ctx.decode_embeddings(slot.seq, len(slot.cached), image.embeddings, image.non_causal)
        slot.cached.extend([image.sentinel] * image.n_tokens)
        a.fed += image.n_tokens
        self.stats.record_prefill(image.n_tokens, time.perf_counter() - t0)
