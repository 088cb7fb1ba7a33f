"""A request begun in the sequence admission chose for it, on the engine thread.

Everything here happens between two passes, before the request's first prompt tokens are fed;
admission (admission.py) chose the sequence, and the forward passes take it from here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import structlog

from sidecar.backend.request_state import RequestState
from sidecar.backend.requests import NO_VISION_MODEL, Job
from sidecar.backend.sessions import Session
from sidecar.backend.text_stream import TextStream
from sidecar.engine.prompts.context_shift import shift_out_dropped
from sidecar.engine.prompts.image_prompt import image_report, whole_images_prefix
from sidecar.engine.prompts.prompt_build import BuiltPrompt
from sidecar.engine.prompts.prompt_prep import Prebuilt
from sidecar.engine.replies import opening_tokens
from sidecar.engine.sampler_chain import SamplerChain
from sidecar.engine.scheduling.resent_admission import check_not_ended
from sidecar.engine.scheduling.slot import ActiveRequest, Slot
from sidecar.engine.scheduling.slot_choice import common_prefix
from sidecar.errors import EngineFailure, FailedPrecondition, InvalidArgument
from sidecar.vision.encoder import EncodedImage

if TYPE_CHECKING:  # the engine imports this module
    from sidecar.engine.engine import Engine

log = structlog.get_logger("engine")


def start_request(engine: Engine, job: Job, slot: Slot) -> None:
    """Begin `job` in `slot`: its session opened (and restored into the sequence if it was
    evicted), its image encoded if the loop encodes, its prompt built (or taken as the prompt thread
    built it), the sequence's cache cut to what the prompt shares with it, a shared prefix copied
    in, and the request made active. Raises SidecarError to refuse it."""
    spec = job.spec
    check_not_ended(job, engine.sessions)
    session = engine.sessions.open(spec.session_id) if spec.session_id else None
    if session is not None and spec.reset_session:
        session.restart()
    new_image = _encode_image(engine, job, session)
    images = list(session.images if session is not None else []) + ([new_image] if new_image else [])
    prebuilt = cast("Prebuilt | None", job.prebuilt)  # requests.py may not import the engine's types
    if prebuilt is not None and not images and prebuilt.still_valid(session, engine.model_generation, engine.ctx.ctx_per_seq):
        built = prebuilt.built  # built beside this thread against what the session still holds
    elif job.prompt_tokens is not None and session is None and not images:
        # Tokenized while choosing its sequence, with the same checks.
        built = BuiltPrompt(list(spec.prompt.messages or ()), spec.prompt.text or "", job.prompt_tokens, {})
    else:
        built = engine.build_on_engine_thread(spec, session, images)
    conversation, prompt_text, tokens = built.conversation, built.prompt_text, built.tokens
    spans = cast("dict[int, EncodedImage]", built.spans)  # prompt_build may not import the encoder's types
    if not tokens:
        # Text of nothing but characters the tokenizer drops (SmolLM2 drops U+0016 and adds no
        # BOS) is no prompt: an empty batch is llama_decode's -1, which reached the game as
        # INTERNAL (found by the transport fuzzer). Refused before anything changes.
        raise InvalidArgument("the prompt has no tokens: its text is only characters the model's tokenizer drops")
    # Made before the sequence is touched: a grammar refused here changes nothing.
    sampler = SamplerChain(engine.model.vocab, engine.model.n_vocab, spec.sampling, spec.grammar)
    try:
        opening = opening_tokens(engine, spec, sampler)
        fed = tokens + opening
        common = _cache_for(engine, job, slot, session, built, fed)
    except BaseException:
        sampler.close()
        raise
    slot.active = ActiveRequest(
        job=job,
        prompt_tokens=fed,
        opening=len(opening),
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
    job.state = RequestState.PREFILLING
    if not spans:
        engine.sharing.produce(slot.active, tokens, job.share_cut or 0)
    if spec.asks_about_image:
        slot.active.image_report = image_report(new_image or images[-1], encoded_now=new_image is not None)


def _cache_for(engine: Engine, job: Job, slot: Slot, session: Session | None, built: BuiltPrompt, fed: list[int]) -> int:
    """Make `slot`'s sequence hold the start of `fed` (the prompt, then the reply's opening) that
    it can: its session bound, dropped turns shifted out, the cache cut where it parts from `fed`,
    a shared prefix copied in. The tokens it then holds."""
    spans = cast("dict[int, EncodedImage]", built.spans)
    if slot.session_id != job.spec.session_id or not job.spec.session_id:
        _bind(engine, slot, session)
    if built.trim.dropped:
        shift_out_dropped(engine.ctx, slot, built)
    common = whole_images_prefix(common_prefix(slot.cached, fed), spans)
    if not engine.ctx.truncate(slot.seq, common):
        engine.ctx.clear(slot.seq)
        common = 0
    del slot.cached[common:]
    if not spans:
        common = engine.sharing.reuse(engine.ctx, slot, fed, common, job.share_cut or 0, engine.slots)
    return common


def _encode_image(engine: Engine, job: Job, session: Session | None) -> EncodedImage | None:
    """The request's image as embeddings: encoded beside the loop before admission (CPU), or
    now, with every other conversation paused (GPU: VLMOpt's no-overlap rule keeps the encoder's
    VRAM and the language phase's apart). Or check that a follow-up has an image to be about."""
    spec = job.spec
    if not spec.asks_about_image:
        return None
    if engine.images.wants(job):
        return engine.images.take(job)
    if engine.encoder is None and engine.images.settings is None:
        raise FailedPrecondition(NO_VISION_MODEL)
    if spec.image is None:
        if session is None or not session.images:
            raise InvalidArgument("no image: send one, or ask a follow-up in a session that has one")
        return None
    assert engine.encoder is not None  # else the CPU encoder beside the loop took the image above
    return engine.encoder.encode(spec.image)


def _bind(engine: Engine, slot: Slot, session: Session | None) -> None:
    """Make `slot` hold `session`'s cache (restored from host memory if it was evicted), or
    keep its leftovers for a one-off request that may share a prefix with them."""
    if session is None:
        if slot.session_id is not None:
            engine.ctx.clear(slot.seq)
            slot.cached = []
        slot.session_id = None
        return
    engine.ctx.clear(slot.seq)
    slot.cached = []
    if session.saved_state is not None:
        try:
            engine.ctx.restore(slot.seq, session.saved_state)
            slot.cached = list(session.saved_tokens)
        except EngineFailure as e:
            # A saved state llama.cpp refuses (a save's, made with another attention layout):
            # the conversation is computed again from its text, never half restored.
            log.warning("saved KV state refused; recomputing the conversation", session_id=session.session_id, error=str(e))
            engine.ctx.clear(slot.seq)
        session.saved_state, session.saved_tokens = None, []
    session.imported = ""
    slot.session_id = session.session_id
    session.seq = slot.seq
