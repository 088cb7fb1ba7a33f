"""Between the wire (xlm.v1 messages) and the engine's own types. Validation lives here, so every
transport (gRPC, the WebSocket bridge, the OpenAI-compatible HTTP API) refuses the same requests
the same way."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace

from sidecar.api import pb
from sidecar.budget import Budget
from sidecar.backend.contract import BackendSnapshot
from sidecar.backend.engine_config import EngineConfig
from sidecar.backend.load_report import is_vram
from sidecar.backend.request_state import RequestView
from sidecar.backend.requests import (
    DEFAULT_MAX_TOKENS,
    Finished,
    FinishReason,
    GenerationSpec,
    Prompt,
    TokenLogprob,
)
from sidecar.backend.sampling import SamplingConfig
from sidecar.errors import ContextLengthExceeded, InvalidArgument
# Loads llama.cpp on first use only: remote mode never compiles a schema (RequestLimits).
from sidecar.native.grammar import json_schema_grammar
from sidecar.service.request_checks import check_prompt_size, check_session_id, normalized_schema
from sidecar.service.schema_bounds import check_grammar
from sidecar.service import token_controls, tool_calls

MAX_STOP_STRINGS = 16
MAX_STOP_LENGTH = 256
# The fewest tokens a chat template spends on one message, content aside (ChatML spends five:
# <|im_start|>, the role, a newline, <|im_end|>, a newline).
MIN_TOKENS_PER_MESSAGE = 3

_FINISH = {
    FinishReason.STOP: pb.FINISH_REASON_STOP,
    FinishReason.LENGTH: pb.FINISH_REASON_LENGTH,
    FinishReason.STOP_STRING: pb.FINISH_REASON_STOP_STRING,
    FinishReason.CANCELLED: pb.FINISH_REASON_CANCELLED,
    FinishReason.CONTEXT_FULL: pb.FINISH_REASON_CONTEXT_FULL,
}


# llama.cpp's sampler seeds are 32-bit, and 0xFFFFFFFF there means "pick one at random".
_SEEDS = 2**32 - 1
# A penalty window longer than any context means "everything so far"; llama.cpp allocates the
# window, so a huge value is cut to this rather than refused or allocated.
MAX_REPEAT_LAST_N = 1 << 20


def sampling_from_pb(s: pb.SamplingParams) -> SamplingConfig:
    """Unset fields keep SamplingConfig's defaults; set ones are range-checked there.

    The proto's seed is uint64: every value is accepted and folded onto llama.cpp's 32-bit seeds
    (seed mod 4294967295), so seeds below 2^32 - 1 are used as they are and the same seed always
    samples the same way."""
    defaults = SamplingConfig()
    fields = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n", "seed",
              "frequency_penalty", "presence_penalty")
    values = {f: getattr(s, f) if s.HasField(f) else getattr(defaults, f) for f in fields}
    if values["seed"] is not None:
        values["seed"] %= _SEEDS
    values["repeat_last_n"] = min(values["repeat_last_n"], MAX_REPEAT_LAST_N)
    return SamplingConfig(**values, logit_bias=tuple(sorted(s.logit_bias.items())))


def grammar_for(json_schema: str, compile_grammar: bool = True) -> str | None:
    """The GBNF grammar of a request's JSON schema; None without one, or for a schema that admits
    anything (`true`). Its bounds are checked either way; without `compile_grammar` (a backend
    that compiles schemas itself) nothing is compiled here."""
    if not json_schema:
        return None
    schema = normalized_schema(json_schema)
    if schema is None or not compile_grammar:
        return None
    return check_grammar(json_schema_grammar(schema))


def request_text_bytes(r: pb.GenerateRequest) -> dict[str, int]:
    """UTF-8 bytes of every text of a request that the model reads, by field: the prompt or the
    messages' contents, the shared context, and the tools (names, descriptions, schemas), which
    go into the system message."""
    if r.WhichOneof("input") == "prompt":
        prompt = len(r.prompt.encode("utf-8"))
    else:
        prompt = sum(len(m.content.encode("utf-8")) + len(m.role) for m in r.messages.messages)
    tools = sum(len(t.name.encode("utf-8")) + len(t.description.encode("utf-8")) + len(t.parameters_json_schema.encode("utf-8"))
                for t in r.tools)
    return {"messages" if r.WhichOneof("input") == "messages" else "prompt": prompt,
            "context": len(r.context.encode("utf-8")), "tools": tools}


def check_message_count(n: int, max_prompt_tokens: int | None) -> None:
    """Refuse more messages than `max_prompt_tokens` can hold, each costing at least its template
    tokens even when empty. None means no local limit (remote mode)."""
    if max_prompt_tokens and n * MIN_TOKENS_PER_MESSAGE > max_prompt_tokens:
        raise ContextLengthExceeded(
            f"messages: {n} messages cannot fit in {max_prompt_tokens} prompt tokens (--max-prompt-tokens): "
            f"each takes at least {MIN_TOKENS_PER_MESSAGE} tokens of the chat template"
        )


def check_request_size(r: pb.GenerateRequest, max_prompt_tokens: int | None) -> None:
    """One rule for the whole request, before anything renders or tokenizes it: what the model
    would read must fit `max_prompt_tokens` by its bytes (request_checks.check_prompt_size), and
    by its messages, each of which costs template tokens even when empty (300,000 empty messages
    once stalled every stream for a minute while they were rendered)."""
    if not max_prompt_tokens:
        return
    if r.WhichOneof("input") == "messages":
        check_message_count(len(r.messages.messages), max_prompt_tokens)
    if len(r.prompt_tokens.ids) > max_prompt_tokens:  # counted, not estimated from bytes
        raise ContextLengthExceeded(f"the prompt is {len(r.prompt_tokens.ids)} tokens; the limit is "
                                    f"{max_prompt_tokens} (--max-prompt-tokens)")
    sizes = request_text_bytes(r)
    check_prompt_size(sum(sizes.values()), max_prompt_tokens, what=" + ".join(f"{k} {v}" for k, v in sizes.items() if v))


def stop_strings(stop) -> tuple[str, ...]:
    stops = tuple(stop)
    if len(stops) > MAX_STOP_STRINGS:
        raise InvalidArgument(f"at most {MAX_STOP_STRINGS} stop strings")
    if any(not s or len(s) > MAX_STOP_LENGTH for s in stops):
        raise InvalidArgument(f"stop strings must be 1 to {MAX_STOP_LENGTH} characters")
    return stops


def generation_spec_from_pb(r: pb.GenerateRequest, max_prompt_tokens: int | None = None, *,
                            compile_grammar: bool = True) -> GenerationSpec:
    """A validated GenerationSpec, or InvalidArgument naming the field that is wrong. A prompt too
    long for `max_prompt_tokens` (None: no local limit) by its bytes alone is refused here,
    untokenized. Without `compile_grammar` a JSON schema is checked but not compiled."""
    check_request_size(r, max_prompt_tokens)
    check_session_id(r.session_id)
    which = r.WhichOneof("input")
    if which == "messages":
        prompt = Prompt(messages=tuple((m.role, m.content) for m in r.messages.messages), context=r.context)
    elif which == "prompt":
        prompt = Prompt(text=r.prompt, context=r.context)
    elif which == "prompt_tokens":
        if r.session_id:
            # A session keeps its text and is matched on it turn by turn (resent_turns.py).
            raise InvalidArgument("prompt_tokens is for one-off prompts: continue a session with prompt or messages")
        prompt = Prompt(token_ids=tuple(r.prompt_tokens.ids), context=r.context)
    else:
        raise InvalidArgument("give either messages or prompt")
    stops = stop_strings(r.stop)
    if r.reset_session and not r.session_id:
        raise InvalidArgument("reset_session needs a session_id")
    json_schema = r.json_schema
    tool_plan = tool_calls.plan_from_pb(r)
    if tool_plan is not None:
        prompt = replace(prompt, tool_instructions=tool_plan.instructions)
        json_schema = tool_plan.json_schema
    own_grammar = token_controls.caller_grammar(r)
    grammar = own_grammar if own_grammar is not None else grammar_for(json_schema, compile_grammar)
    if tool_plan is not None and tool_plan.auto:
        # Words unless the reply opens a call. A remote server gets no schema (words are no JSON):
        # its reply is read as a call only when it is one of a declared function.
        if grammar is not None:
            grammar = check_grammar(tool_calls.call_or_words_grammar(grammar, tool_plan.parallel), "tools")
        json_schema = ""
    return GenerationSpec(
        prompt=prompt,
        sampling=sampling_from_pb(r.sampling),
        max_tokens=r.max_tokens or DEFAULT_MAX_TOKENS,
        stop=stops,
        grammar=grammar,
        json_schema=json_schema,
        session_id=r.session_id,
        reset_session=r.reset_session,
        request_id=r.request_id,
        logprobs=r.logprobs if r.HasField("logprobs") else None,
    )


def logprob_to_pb(e: TokenLogprob) -> pb.TokenLogprob:
    return pb.TokenLogprob(
        token_id=e.chosen.token_id, piece=e.chosen.piece, logprob=e.chosen.logprob,
        top=[pb.TokenAlternative(token_id=t.token_id, piece=t.piece, logprob=t.logprob) for t in e.top],
    )


def chunk_from_finished(f: Finished) -> pb.GenerateChunk:
    t = f.timings
    image = None
    if f.image is not None:
        i = f.image
        image = pb.ImageInfo(
            original_width=i.original_size[0], original_height=i.original_size[1],
            encoded_width=i.encoded_size[0], encoded_height=i.encoded_size[1],
            downscaled=i.downscaled, image_tokens=i.image_tokens, encode_ms=i.encode_ms,
        )
    return pb.GenerateChunk(
        final=pb.GenerationFinal(
            finish_reason=_FINISH[f.reason],
            usage=pb.Usage(
                prompt_tokens=f.usage.prompt_tokens,
                cached_prompt_tokens=f.usage.cached_prompt_tokens,
                completion_tokens=f.usage.completion_tokens,
                forced_tokens=f.usage.forced_tokens,
            ),
            timings=pb.Timings(
                time_to_first_token_ms=t.time_to_first_token_ms,
                prefill_tokens_per_s=t.prefill_tokens_per_s,
                decode_tokens_per_s=t.decode_tokens_per_s,
                total_ms=t.total_ms,
                queued_ms=t.queued_ms,
            ),
            session_id=f.session_id,
            image=image,
            history_turns_dropped=f.history_turns_dropped,
            history_tokens_kept=f.history_tokens_kept,
        )
    )


def budget_to_pb(b: Budget, *, ram_bytes: int = 0, auto_reserve_bytes: int | None = None) -> pb.Budget:
    """The planner's budget plus what only the service knows: the RAM budget and automatic mode
    (None: the VRAM budget is fixed)."""
    return pb.Budget(vram_bytes=b.vram_bytes, max_cpu_threads=b.max_cpu_threads, ram_bytes=ram_bytes,
                     auto_vram=auto_reserve_bytes is not None, auto_reserve_bytes=auto_reserve_bytes or 0)


_PHASE = {
    "loading": pb.ENGINE_PHASE_LOADING,
    "ready": pb.ENGINE_PHASE_READY,
    "reloading": pb.ENGINE_PHASE_RELOADING,
    "draining": pb.ENGINE_PHASE_DRAINING,
    "starting": pb.ENGINE_PHASE_STARTING,
}


def phase_to_pb(phase_name: str) -> int:
    return _PHASE.get(phase_name, pb.ENGINE_PHASE_UNSPECIFIED)


def device_memory_to_pb(report, memory: Mapping[str, tuple[int, int]]) -> list[pb.DeviceMemory]:
    """Per-device buffers as llama.cpp reported them, with ggml's memory figures for each device
    (`memory`, BackendSnapshot.device_memory)."""
    out = []
    for device, kinds in sorted(report.by_device().items()):
        free, total = memory.get(device, (0, 0))
        out.append(pb.DeviceMemory(
            device=device, model_bytes=kinds["model"], kv_cache_bytes=kinds["kv"], compute_bytes=kinds["compute"],
            output_bytes=kinds["output"], free_bytes=free, total_bytes=total,
        ))
    return out


def status_to_pb(
    snap: BackendSnapshot,
    *,
    budget: Budget,
    version: str,
    uptime_s: float,
    host_resident_bytes: int,
    listen_addresses: list[str],
    max_message_bytes: int,
    max_image_bytes: int = 0,
    ram_budget_bytes: int = 0,
    vision_reserved_bytes: int = 0,
    auto_reserve_bytes: int | None = None,
) -> pb.Status:
    m, c, t, lim = snap.model, snap.config, snap.throughput, snap.limits
    vision = c.vision if c is not None else None
    return pb.Status(
        version=version,
        phase=phase_to_pb(snap.phase.value),
        model=pb.ModelInfo(
            path=m.path,
            name=m.name,
            architecture=m.architecture,
            parameters=m.parameters,
            file_bytes=m.file_bytes,
            trained_context=m.trained_context,
            layers=m.layers,
            experts=m.experts,
            chat_template=m.chat_template,
            vision_available=vision is not None,
            projector_path=str(vision.projector_path) if vision is not None else "",
        ),
        vision=vision_status_to_pb(snap),
        budget=budget_to_pb(budget, ram_bytes=ram_budget_bytes, auto_reserve_bytes=auto_reserve_bytes),
        schedule=schedule_to_pb(c) if c is not None else None,  # none where the model runs elsewhere
        memory=pb.MemoryUse(
            host_resident_bytes=host_resident_bytes,
            # As llama.cpp reported its buffers at load: model weights by where they live.
            model_host_bytes=sum(n for b, n in snap.load_report.model_bytes.items() if not is_vram(b)),
            model_vram_bytes=sum(n for b, n in snap.load_report.model_bytes.items() if is_vram(b)),
            vram_used_bytes=snap.load_report.vram_bytes(),
            kv_cache_bytes=snap.kv_cache_bytes,
            planned_vram_bytes=c.planned_vram_bytes if c is not None else 0,
            devices=device_memory_to_pb(snap.load_report, snap.device_memory),
            placement_device=c.device if c is not None else "",  # nothing is placed here
            kv_cache_held_bytes=snap.kv_held_bytes,
            kv_sequences=snap.kv_sequences,
            kv_sequences_max=snap.kv_sequences_max,
            saved_sessions_bytes=snap.saved_sessions_bytes,
            prefix_cache_bytes=snap.prefix_cache.bytes_held if snap.prefix_cache is not None else 0,
            ram_budget_bytes=ram_budget_bytes,
            vision_worker_bytes=snap.vision_worker_bytes,
            vision_reserved_bytes=vision_reserved_bytes,
        ),
        throughput=pb.Throughput(
            tokens_generated=t.tokens_generated,
            prompt_tokens_processed=t.prompt_tokens_processed,
            decode_tokens_per_s=t.decode_tokens_per_s,
            prefill_tokens_per_s=t.prefill_tokens_per_s,
            requests_served=t.requests_served,
            requests_active=snap.requests_active,
            requests_queued=snap.requests_queued,
        ),
        sessions=[
            pb.SessionInfo(
                session_id=s.session_id,
                tokens=s.tokens,
                last_used_unix_ms=int(s.last_used * 1000),
                in_kv_cache=s.in_kv_cache,
                saved_kv_bytes=s.host_bytes,
                imported=s.imported,
            )
            for s in snap.sessions
        ],
        limits=pb.Limits(
            max_sessions=lim.max_sessions,
            context_per_session=lim.context_per_session,
            max_prompt_tokens=lim.max_prompt_tokens,
            max_tokens_per_request=lim.max_tokens_per_request,
            max_message_bytes=max_message_bytes,
            max_image_bytes=max_image_bytes,
        ),
        uptime_s=uptime_s,
        listen_addresses=listen_addresses,
        prefix_cache=prefix_cache_to_pb(snap),
        requests=[request_to_pb(r) for r in snap.requests],
    )


def request_to_pb(r: RequestView) -> pb.RequestInfo:
    return pb.RequestInfo(
        request_id=r.request_id,
        session_id=r.session_id,
        state=pb.RequestState.Value("REQUEST_STATE_" + r.state.name),
        prompt_tokens=r.prompt_tokens,
        prompt_tokens_done=r.prompt_tokens_done,
        tokens_generated=r.tokens_generated,
        age_ms=r.age_ms,
    )


def prefix_cache_to_pb(snap: BackendSnapshot) -> pb.PrefixCacheStatus:
    p = snap.prefix_cache
    if p is None:  # the remote backend keeps no KV
        return pb.PrefixCacheStatus()
    return pb.PrefixCacheStatus(
        max_bytes=p.max_bytes, bytes_held=p.bytes_held, entries=p.entries, hits=p.hits,
        tokens_saved=p.tokens_saved, misses=p.misses, waits=p.waits,
    )


def vision_status_to_pb(snap: BackendSnapshot) -> pb.VisionStatus:
    v = snap.config.vision if snap.config is not None else None
    if v is None:
        return pb.VisionStatus(available=False)
    stats = snap.vision
    return pb.VisionStatus(
        available=True,
        projector_path=str(v.projector_path),
        placement=v.placement,
        vlmopt=not v.resident,
        flash_attention=v.flash_attention,
        image_max_tokens=v.image_max_tokens,
        images_encoded=stats.images_encoded if stats else 0,
        last_encode_ms=stats.last_encode_ms if stats else 0.0,
        last_load_ms=stats.last_load_ms if stats else 0.0,
        compute_buffer_bytes=stats.compute_buffer_bytes if stats else 0,
        loaded=stats.loaded if stats else False,
    )


_PLACEMENT = {
    "FULL_GPU": pb.PLACEMENT_FULL_GPU,
    "STATIC": pb.PLACEMENT_STATIC,
    "DYNAMIC": pb.PLACEMENT_DYNAMIC,
    "GPU_STREAMING": pb.PLACEMENT_GPU_STREAMING,
    "CPU_ONLY": pb.PLACEMENT_CPU_ONLY,
}


def schedule_to_pb(c: EngineConfig) -> pb.Schedule:
    """The schedule in force: the planner's tiers with their predictions when there is a plan,
    else threads per token tier as the engine runs them."""
    s = c.schedule
    if s is not None:
        return pb.Schedule(
            tiers=[
                pb.TierPlan(
                    max_tokens=t.max_tokens,
                    phase=pb.TIER_PHASE_DECODE if t.phase == "decode" else pb.TIER_PHASE_PREFILL,
                    placement=_PLACEMENT.get(t.placement, pb.PLACEMENT_UNSPECIFIED),
                    threads=min(t.threads, dict(c.tier_threads).get(t.max_tokens, t.threads)),
                    predicted_tokens_per_s=t.predicted_tokens_per_s,
                    predicted_ms_per_pass=t.predicted_ms_per_pass,
                )
                for t in s.tiers
            ],
            vram_bytes_by_component=dict(s.vram_bytes_by_component),
            kv_type=s.kv_type.lower(),
            flash_attention=bool(c.flash_attention),
            micro_batch=c.n_ubatch,
            op_offload_min_batch=s.op_offload_min_batch if s.op_offload else 0,
            tensor_overrides=[f"{pattern}={device}" for pattern, device in c.tensor_overrides],
        )
    placement = pb.PLACEMENT_CPU_ONLY if c.n_gpu_layers == 0 and not c.tensor_overrides else pb.PLACEMENT_STATIC
    tiers = [
        pb.TierPlan(
            max_tokens=max_tokens,
            phase=pb.TIER_PHASE_DECODE if max_tokens <= 64 else pb.TIER_PHASE_PREFILL,
            placement=placement,
            threads=threads,
        )
        for max_tokens, threads in c.tier_threads
    ]
    return pb.Schedule(
        tiers=tiers,
        kv_type="f16",
        flash_attention=bool(c.flash_attention),
        micro_batch=c.n_ubatch,
        tensor_overrides=[f"{pattern}={device}" for pattern, device in c.tensor_overrides],
    )


def now_unix_ms() -> int:
    return int(time.time() * 1000)
