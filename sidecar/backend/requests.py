"""What a caller hands the engine and what the engine streams back. Plain data, no llama.cpp."""

from __future__ import annotations

import enum
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Union

from sidecar.backend.request_state import RequestState
from sidecar.backend.sampling import SamplingConfig
from sidecar.errors import InvalidArgument, SidecarError
from sidecar.vision.image_input import RgbImage

# Stands for an image inside chat message text; the engine splits the rendered prompt on it and
# puts the image's embeddings there. Game text may not contain it.
IMAGE_MARKER = "<__xlm_image__>"

# A reply's length when the request does not say (every transport's default).
DEFAULT_MAX_TOKENS = 256

# Alternatives per token a request may ask for with its log probabilities (OpenAI's top_logprobs).
MAX_TOP_LOGPROBS = 20

# What an image request hears from a daemon started without a projector, on every way in.
NO_VISION_MODEL = "this daemon has no vision model; start it with --mmproj PROJECTOR.gguf"


def refuse_image_marker(text: str, field: str) -> None:
    """Game text may not hold the image marker: it would stand for an image nobody sent."""
    if IMAGE_MARKER in text:
        raise InvalidArgument(f"{field} may not contain {IMAGE_MARKER!r}; it stands for images")

ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class Prompt:
    """Chat messages ((role, content) pairs, formatted by the model's template), raw text, or raw
    token ids (fed as given: a client that tokenized its prompt gets exactly those tokens)."""

    messages: tuple[tuple[str, str], ...] | None = None
    text: str | None = None
    token_ids: tuple[int, ...] | None = None
    # Shared world context before the NPC's own prompt (shared_context.py); used on a session's
    # first turn only.
    context: str = ""
    # The functions the reply may call, described for the model (sidecar.service.tool_calls); a
    # session is told them once, and again only when they change (prompt_layout.new_turn).
    tool_instructions: str = ""
    # What the NPC recalls for this turn, best first (sidecar/service/memories.py): those the
    # conversation does not hold yet are told in a system message just before the new turn
    # (prompt_layout.new_turn).
    memories: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if [self.messages, self.text, self.token_ids].count(None) != 2:
            raise InvalidArgument("give either chat messages or a raw prompt")
        if self.messages is not None:
            if not self.messages:
                raise InvalidArgument("messages is empty")
            for role, _content in self.messages:
                if role not in ROLES:
                    raise InvalidArgument(f"unknown role {role!r}; use one of {', '.join(ROLES)}")
        elif self.token_ids is not None:
            if not self.token_ids:
                raise InvalidArgument("prompt_tokens is empty")
            if self.context or self.tool_instructions:
                raise InvalidArgument("a token-id prompt is the whole prompt: put the context in its tokens")
        elif not self.text:
            raise InvalidArgument("prompt is empty")

    @property
    def is_chat(self) -> bool:
        return self.messages is not None


@dataclass(frozen=True)
class GenerationSpec:
    """One generation request, validated. `grammar` is GBNF text (from a JSON schema, or the
    caller's own) or None."""

    prompt: Prompt
    sampling: SamplingConfig = SamplingConfig()
    max_tokens: int = DEFAULT_MAX_TOKENS
    stop: tuple[str, ...] = ()
    grammar: str | None = None
    # The JSON schema `grammar` was derived from, as the caller sent it: the remote backend forwards
    # the schema itself, since OpenAI-compatible servers take schemas, not GBNF.
    json_schema: str = ""
    session_id: str = ""
    reset_session: bool = False
    # The messages (or text) are the whole conversation, as OpenAI clients send every turn: the
    # backend keeps what its session already holds and sends on the rest (resent_turns.py). The
    # image, if any, is the conversation's last one.
    resends_history: bool = False
    request_id: str = ""
    # AskImage: the screenshot (None for a follow-up about the session's last image).
    image: RgbImage | None = None
    asks_about_image: bool = False
    # Each sampled token's log probability, with this many likeliest alternatives; None: none.
    logprobs: int | None = None
    # One of several candidates for the same prompt submitted together (n > 1): the prompt is
    # computed once, by whichever starts first, and copied to the others (prefix_sharing.py).
    shares_prompt: bool = False
    # The request this generation is one of (several prompts, or n candidates; "" when alone):
    # admission takes requests in turn, so one bringing many cannot hold every sequence while a
    # later NPC's line waits (engine/scheduling/fair_turns.py).
    group: str = ""

    def __post_init__(self) -> None:
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise InvalidArgument(f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}")


class FinishReason(enum.Enum):
    STOP = "stop"  # the model ended its turn
    LENGTH = "length"  # max_tokens reached
    STOP_STRING = "stop_string"
    CANCELLED = "cancelled"
    CONTEXT_FULL = "context_full"


@dataclass(frozen=True)
class TokenChoice:
    """A token and its log probability under the model (natural log, before sampling settings)."""

    token_id: int
    piece: bytes  # the token's bytes; may be part of a character
    logprob: float


@dataclass(frozen=True)
class TokenLogprob:
    """A sampled token's log probability and the likeliest alternatives at its position."""

    chosen: TokenChoice
    top: tuple[TokenChoice, ...] = ()


@dataclass(frozen=True)
class TextDelta:
    """New text (valid UTF-8) and the tokens it came from; with logprobs asked for, one entry per
    token, in order."""

    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    cached_prompt_tokens: int
    completion_tokens: int
    # Of completion_tokens, those a grammar forced and jump-forward fed without a pass of their own.
    forced_tokens: int = 0


@dataclass(frozen=True)
class Timings:
    time_to_first_token_ms: float
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    total_ms: float
    queued_ms: float


@dataclass(frozen=True)
class ImageReport:
    """What became of the request's image: its sizes, tokens, and whether it was encoded now or
    its KV was reused from the session."""

    original_size: tuple[int, int]
    encoded_size: tuple[int, int]
    downscaled: bool
    image_tokens: int
    encode_ms: float
    reused: bool


@dataclass(frozen=True)
class Finished:
    """Always the last event of a request that did not fail."""

    reason: FinishReason
    usage: Usage
    timings: Timings
    session_id: str
    image: ImageReport | None = None
    # Sessions: user turns dropped from the history so this turn fits, and history tokens kept.
    history_turns_dropped: int = 0
    history_tokens_kept: int = 0
    # The messages those dropped turns held, and the session's number of the first of them (1 =
    # its first turn): what becomes the session's memories (sidecar/service/memories.py).
    dropped_messages: tuple[tuple[str, str], ...] = ()
    first_dropped_turn: int = 0
    # Which of the prompt's memories this turn told (indices into Prompt.memories): those its
    # conversation did not already hold.
    memories_told: tuple[int, ...] = ()


Event = Union[TextDelta, Finished, SidecarError]
Sink = Callable[[Event], None]


@dataclass
class Job:
    """A submitted request as the engine tracks it. `sink` must never block: it is called from the
    engine thread between forward passes."""

    spec: GenerationSpec
    sink: Sink
    submitted_at: float = field(default_factory=time.perf_counter)
    cancel_event: threading.Event = field(default_factory=threading.Event)
    # The prompt's tokens once tokenized (to pick the sequence that already holds the longest
    # prefix of it): by the prompt thread before the engine sees the job, else by the engine.
    prompt_tokens: list[int] | None = None
    # Where its shared prompt prefix ends (prefix_sharing.share_cut; 0: none), once decided.
    share_cut: int | None = None
    waited_for_prefix: bool = False
    # Its prompt as built on the prompt thread (prompt_prep.Prebuilt), and the error that refused
    # it there; set before the engine thread sees the job.
    prebuilt: object | None = None
    prep_error: SidecarError | None = None
    # Its image's embeddings (or the error encoding it raised) once the vision worker has answered;
    # set from the worker's reply thread (image_encodes.py).
    encoded: object | None = None

    # A resent turn as it was sent, while `spec` holds what resent_turns.resolve made of it, and
    # the session (and its version) it was resolved against; engine thread only.
    resent: GenerationSpec | None = None
    resolved_against: tuple[object, int] | None = None
    # Where it is (request_state.py): written by the thread that moves it on, read by status.
    state: RequestState = RequestState.PREPARING

    def end(self, last: Event) -> None:
        """Send its last event (the final chunk, or the error that ends it)."""
        self.state = RequestState.FINISHED
        self.sink(last)

    def cancel(self) -> None:
        """Ask the engine to stop this request; it ends within one step with reason CANCELLED."""
        self.cancel_event.set()

    @property
    def cancelled(self) -> bool:
        return self.cancel_event.is_set()
