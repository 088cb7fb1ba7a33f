"""A sequence of the llama.cpp context and the request it is serving."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from typing import TYPE_CHECKING

from sidecar.backend.request_state import RequestView
from sidecar.backend.requests import ImageReport, Job, TokenLogprob
from sidecar.backend.sessions import Session
from sidecar.backend.text_stream import TextStream
from sidecar.engine.sampler_chain import SamplerChain

if TYPE_CHECKING:  # annotations only: prompt_build and the encoder import this module's neighbours
    from sidecar.engine.prompts.prompt_build import BuiltPrompt
    from sidecar.vision.encoder import EncodedImage


@dataclass
class ActiveRequest:
    """A request bound to a sequence: its prompt, how far prefill got, what it generated."""

    job: Job
    # The prompt's tokens, then the reply's `opening`: what its grammar forces before the model's
    # first choice, fed with the prompt's last chunk (jump_forward.py, opening_tokens).
    prompt_tokens: list[int]
    cached_tokens: int
    sampler: SamplerChain
    stream: TextStream
    session: Session | None
    conversation: list[tuple[str, str]]
    prompt_text: str
    started_at: float = field(default_factory=time.perf_counter)
    fed: int = 0  # prompt tokens in the KV cache so far
    # Sampled (and then forced: jump_forward.py) tokens of the reply, not yet decoded.
    next_tokens: list[int] = field(default_factory=list)
    generated: int = 0
    forced_tokens: int = 0  # of `generated`, appended by jump-forward without a pass of their own
    opening: int = 0  # tokens at the end of prompt_tokens that are the reply's, sent with its first sampled one
    reply: list[str] = field(default_factory=list)
    prefill_done_at: float | None = None
    first_token_at: float | None = None
    # Index in prompt_tokens of each image's first embedding -> the image (EncodedImage).
    image_spans: dict[int, EncodedImage] = field(default_factory=dict)
    new_image: EncodedImage | None = None  # encoded for this request; joins the session when it ends
    built: BuiltPrompt | None = None  # history trimmed for this turn, if any
    image_report: ImageReport | None = None
    # Set while this request prefills a prefix other requests wait for: its prefill stops there
    # once, so that the sequence holds exactly the prefix when it is saved (prefix_sharing.py).
    share_at: int | None = None
    # Log probabilities of sampled tokens the text stream has not sent yet (token_logprobs.take).
    pending_logprobs: list[TokenLogprob] = field(default_factory=list)

    def next_image_start(self) -> int | None:
        """Where the next image not yet in the cache begins, if any."""
        starts = [s for s in self.image_spans if s >= self.fed]
        return min(starts) if starts else None

    @property
    def decoding(self) -> bool:
        return bool(self.next_tokens)

    @property
    def text_to_prefill(self) -> int:
        """The prompt's tokens its sequence did not hold at the start, images aside (they go in
        passes of their own): whether it is short enough to go whole beside the streams (step.py)."""
        images: int = sum(im.n_tokens for at, im in self.image_spans.items() if at >= self.cached_tokens)
        return len(self.prompt_tokens) - self.cached_tokens - images

    @property
    def prompt_length(self) -> int:
        """The prompt's own tokens, the reply's opening left out."""
        return len(self.prompt_tokens) - self.opening


@dataclass
class Slot:
    """One sequence id. `cached` is exactly the tokens its KV cache holds; `session_id` names the
    session whose conversation that is (None for a one-off request's leftovers)."""

    seq: int
    cached: list[int] = field(default_factory=list)
    session_id: str | None = None
    active: ActiveRequest | None = None
    last_used: float = 0.0

    @property
    def busy(self) -> bool:
        return self.active is not None


MAX_LISTED = 256  # requests status lists (the proto's promise): a flood of queued ones stays bounded


def request_views(slots: list[Slot], waiting, now: float) -> tuple[RequestView, ...]:
    """Every request the engine holds as status shows it, the oldest first. Built on the engine
    thread between two passes; status reads the tuple from another thread, never the slots and
    the waiting queue it is built from."""
    views = [_view(s.active.job, s.active, now) for s in slots if s.active is not None]
    views += [_view(job, None, now) for job in waiting]
    views.sort(key=lambda v: -v.age_ms)
    return tuple(views[:MAX_LISTED])


def _view(job: Job, active: ActiveRequest | None, now: float) -> RequestView:
    prompt = active.prompt_tokens if active is not None else job.prompt_tokens
    return RequestView(
        request_id=job.spec.request_id,
        session_id=job.spec.session_id or "",
        state=job.state,
        prompt_tokens=len(prompt) if prompt is not None else 0,
        prompt_tokens_done=active.fed if active is not None else 0,
        tokens_generated=active.generated if active is not None else 0,
        age_ms=(now - job.submitted_at) * 1000.0,
    )
