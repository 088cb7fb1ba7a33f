"""A reply's tokens, on the engine thread after each pass: sampled, streamed, extended by what
the grammar forces (jump_forward.py), and the reply ended where it ends (stop, stop string,
length, a full context, an error of its own), its turn then kept in its session."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Protocol

from sidecar.backend.request_state import RequestState
from sidecar.backend.requests import FinishReason, GenerationSpec, TextDelta
from sidecar.backend.text_stream import TextChunk
from sidecar.engine.finish_report import finished
from sidecar.engine.jump_forward import ForcedText
from sidecar.engine.sampler_chain import SamplerChain
from sidecar.engine.scheduling.slot import ActiveRequest, Slot
from sidecar.engine.session_turn import remember_turn
from sidecar.engine.token_logprobs import logprob_at, take
from sidecar.errors import SidecarError

if TYPE_CHECKING:  # the engine imports this module
    from sidecar.engine.engine import Engine
    from sidecar.engine.prefix.prefix_sharing import PrefixSharing


class SequenceCells(Protocol):
    """What a failed pass needs of the context: a sequence's cells dropped."""

    def clear(self, seq: int) -> None: ...


def sample_next(engine: Engine, slot: Slot, index: int, now: float) -> None:
    """The pass left logits for `slot` at `index`: sample its next token, send it, append what the
    grammar forces after it, and end the reply where it ends."""
    a = slot.active
    assert a is not None  # only a slot that serves a request samples, emits or ends
    if a.prefill_done_at is None:
        a.prefill_done_at = now
        a.job.state = RequestState.DECODING
    if a.first_token_at is None and a.opening:
        # Sent before the first sample: a grammar with no token after them fails the request
        # with its forced start streamed, as when each was a pass of its own.
        a.first_token_at = time.perf_counter()
        if _send_opening(engine, slot):
            return
    try:
        token = a.sampler.sample(engine.ctx.ptr, index)
    except SidecarError as e:  # a grammar that left no token, or cost too much: this request only
        fail(engine, slot, e)
        return
    if a.first_token_at is None:
        a.first_token_at = time.perf_counter()
    if engine.model.is_end_of_generation(token):
        finish(engine, slot, FinishReason.STOP)
        return
    if a.job.spec.logprobs is not None:
        a.pending_logprobs.append(logprob_at(engine.ctx.ptr, index, engine.model.n_vocab, token,
                                             a.job.spec.logprobs, engine.model.piece))
    if _emit(engine, slot, token):
        return
    try:
        forced, must_end = _forced_after(engine, slot)
    except SidecarError as e:  # the jump's grammar work cost too much: this request only
        fail(engine, slot, e)
        return
    for token in forced:
        a.forced_tokens += 1
        if _emit(engine, slot, token):
            return
    if must_end:  # the grammar is complete: its end token would be the next pass's only choice
        finish(engine, slot, FinishReason.STOP)


def _send_opening(engine: Engine, slot: Slot) -> bool:
    """Send the reply's opening (opening_tokens), which the pass fed with the prompt, before its
    first sampled token; True when the reply ended inside it (a stop string)."""
    a = slot.active
    assert a is not None  # only a slot that serves a request samples, emits or ends
    for token in a.prompt_tokens[a.prompt_length:]:
        a.forced_tokens += 1
        if _emit(engine, slot, token, in_cache=True):
            return True
    return False


def _emit(engine: Engine, slot: Slot, token: int, *, in_cache: bool = False) -> bool:
    """Send a token of the reply and queue it for the next pass (unless the cache holds it
    already: the opening); True when the reply ended."""
    a = slot.active
    assert a is not None  # only a slot that serves a request samples, emits or ends
    a.generated += 1
    if a.generated == 1:
        # The loop publishes the views after the pass; a client that holds its first token
        # before then would find its request still prefilling in status. Once per request.
        engine.publish_requests()
    _send(a, a.stream.push(token, engine.model.piece(token)))
    if a.stream.stopped:
        finish(engine, slot, FinishReason.STOP_STRING)
    elif a.generated >= a.job.spec.max_tokens:
        finish(engine, slot, FinishReason.LENGTH)
    elif len(slot.cached) + len(a.next_tokens) >= engine.ctx.ctx_per_seq:
        finish(engine, slot, FinishReason.CONTEXT_FULL)
    else:
        if not in_cache:
            a.next_tokens.append(token)
        return False
    return True


def _forced_after(engine: Engine, slot: Slot) -> tuple[list[int], bool]:
    """The tokens the request's grammar forces next, accepted by its sampler (jump_forward.py),
    and whether the grammar must then end."""
    a = slot.active
    assert a is not None  # only a slot that serves a request samples, emits or ends
    started = time.thread_time()
    tokens, must_end = _forced(engine, a.job.spec, a.sampler)
    taken = _accepted(a.sampler, tokens)
    a.sampler.charge_grammar_work(started)
    return taken, must_end and len(taken) == len(tokens)


def opening_tokens(engine: Engine, spec: GenerationSpec, sampler: SamplerChain) -> list[int]:
    """What the grammar forces before the model's first choice (`{"name": "` of every tool
    call), accepted by the sampler: fed with the prompt's last chunk, so the first pass samples
    the first value instead of a `{` whose jump would cost a pass of its own. At most
    max_tokens - 1, leaving the model its first token. [] for a grammar that forces the whole
    reply: the first pass ends it, as before (sample_next)."""
    started = time.thread_time()
    tokens, must_end = _forced(engine, spec, sampler)
    taken = [] if must_end else _accepted(sampler, tokens[: spec.max_tokens - 1])
    sampler.charge_grammar_work(started)
    return taken


def _forced(engine: Engine, spec: GenerationSpec, sampler: SamplerChain) -> tuple[list[int], bool]:
    """The tokens the grammar forces from the sampler's state (not accepted yet), and whether it
    must then end. None without a grammar, with --no-jump-forward, and with logprobs (a forced
    token has no distribution of its own to report)."""
    if sampler.grammar is None or not engine.config.jump_forward or spec.logprobs is not None:
        return [], False
    if engine.forced_text is None or engine.forced_text.model is not engine.model:
        engine.forced_text = ForcedText(engine.model)
    return engine.forced_text.forced_tokens(sampler.grammar, sampler.refs)


def _accepted(sampler: SamplerChain, tokens: list[int]) -> list[int]:
    """The start of `tokens` the sampler's grammar takes, accepted by it as forced tokens."""
    taken: list[int] = []
    for token in tokens:
        if not sampler.allows(token):  # the tokenizer's split is checked, token by token
            break
        sampler.accept_forced(token)
        taken.append(token)
    return taken


def _send(a: ActiveRequest, chunk: TextChunk) -> None:
    if chunk.text or chunk.token_ids:
        a.reply.append(chunk.text)
        a.job.sink(TextDelta(chunk.text, tuple(chunk.token_ids), take(a.pending_logprobs, len(chunk.token_ids))))


def fail(engine: Engine, slot: Slot, error: SidecarError) -> None:
    """End one request with an error after a pass that went well: its sequence's cache holds
    what it was fed, and the other sequences go on."""
    a = _release(engine, slot)
    engine.stats.record_request()
    a.job.end(error)


def end_after_failed_pass(slots: list[Slot], sharing: PrefixSharing, ctx: SequenceCells, error: SidecarError) -> int:
    """A pass that raised leaves the KV cache of every sequence in it uncertain: each request
    bound to a sequence ends with `error` and its sequence is cleared, so the next request there
    starts clean; requests still waiting and the engine go on. The number of requests ended."""
    ended = 0
    for slot in slots:
        a = slot.active
        if a is None:
            continue
        slot.active = None
        sharing.abandon(a)  # those waiting for the prefix it was computing prefill on their own
        a.sampler.close()
        a.job.end(error)
        ctx.clear(slot.seq)
        slot.cached = []
        ended += 1
    return ended


def finish(engine: Engine, slot: Slot, reason: FinishReason) -> None:
    a = _release(engine, slot)
    if not a.stream.stopped:
        _send(a, a.stream.finish())
    ended = time.perf_counter()
    if a.session is not None and engine.sessions.get(a.session.session_id) is a.session:
        remember_turn(a.session, a, "".join(a.reply), slot.cached, engine.model)
    engine.stats.record_request()
    a.job.end(finished(a, reason, ended))


def _release(engine: Engine, slot: Slot) -> ActiveRequest:
    """Free the sequence of the request it serves (its cache stays), and that request's sampler
    and any prefix it was computing for others; the request, for its last event."""
    a = slot.active
    assert a is not None  # only a slot that serves a request ends one
    slot.active = None
    slot.last_used = time.perf_counter()
    engine.sharing.abandon(a)
    a.sampler.close()
    return a
