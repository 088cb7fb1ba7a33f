"""A request's prompt as the engine feeds it: session history plus the new turn, rendered with
content kept plain (chat_segments), tokenized, held to the per-turn limit, and trimmed to the
context when a long-lived session's history no longer fits (history_trim).

Two limits, on two things: --max-prompt-tokens bounds what the game sends in one request (a
one-off prompt, or one turn of a session); the context bounds the whole conversation, minus room
for the reply. A session that outgrows the context drops its oldest turns after the persona; a
turn that cannot fit even then is RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sidecar.backend.chat_segments import (
    message_costs,
    message_offsets,
    raw_segments,
    render_segments,
    segments_text,
    tokenize_segments,
)
from sidecar.engine.prompts import reply_tokens
from sidecar.engine.prompts.history_trim import NO_TRIM, Trim, plan_trim
from sidecar.backend.prompt_layout import new_turn, untold
from sidecar.backend.requests import IMAGE_MARKER, GenerationSpec
from sidecar.backend.sessions import Session
from sidecar.errors import ContextLengthExceeded, InvalidArgument, ResourceExhausted

# The reply's share of the context that history may not take: what the request asks for, but at
# most a quarter of the context, so a large max_tokens does not halve every NPC's memory.
REPLY_ROOM_SHARE = 4


@dataclass(frozen=True)
class BuiltPrompt:
    conversation: list[tuple[str, str]]  # the chat as it continues (trimmed); [] for raw prompts
    prompt_text: str  # raw prompts: the whole text so far (the session keeps it)
    tokens: list[int]
    spans: dict[int, object]
    trim: Trim = NO_TRIM
    images_dropped: int = 0  # session images whose markers went with the dropped turns
    # The untrimmed prompt's token offset of the dropped range [start, stop), to shift the cache.
    dropped_tokens: tuple[int, int] = (0, 0)
    kept_history_tokens: int = 0
    history: list[tuple[str, str]] = field(default_factory=list)
    # The messages the trim dropped (what becomes the session's memories).
    dropped: tuple[tuple[str, str], ...] = ()
    # Which of the prompt's memories it tells (prompt_layout.untold).
    memories_told: tuple[int, ...] = ()


def context_room(n_ctx: int, max_tokens: int) -> int:
    """Tokens the prompt may take in a context of n_ctx, leaving room for the reply."""
    return n_ctx - max(1, min(max_tokens, n_ctx // REPLY_ROOM_SHARE))


def build_prompt(model, spec: GenerationSpec, session: Session | None, images: list, *,
                 max_prompt_tokens: int, n_ctx: int) -> BuiltPrompt:
    """The prompt of `spec` in `session` (None: one-off). `model` renders and tokenizes (a
    NativeModel). InvalidArgument past the per-request limit, ResourceExhausted when the turn
    cannot fit the context even without history."""
    p = spec.prompt
    if session is not None and not session.is_empty and bool(session.messages) != p.is_chat:
        raise InvalidArgument("a session continues in the mode it started: chat messages or raw prompt")
    if not p.is_chat:
        return _raw(model, spec, session, images, max_prompt_tokens, n_ctx)
    history = list(session.messages) if session is not None else []
    replies = session.reply_tokens if session is not None else None
    # The shared world context and the tools open a fresh conversation's system message
    # (prompt_layout); on later turns the history holds them.
    conversation = history + new_turn(p, history)
    segments = render_segments(model.render_chat, conversation)
    tok = tokenize_segments(reply_tokens.tokenizer(model.tokenize, replies, conversation), segments, images)
    if session is None:
        _check_request(len(tok.tokens), max_prompt_tokens)
        return BuiltPrompt(conversation, segments_text(segments), tok.tokens, tok.spans,
                           memories_told=untold(p.memories, history))
    costs = message_costs(segments, tok.counts, len(conversation))
    first_new = len(history)
    _check_request(sum(costs[first_new:]), max_prompt_tokens, "this turn")
    room = context_room(n_ctx, spec.max_tokens)
    trim = plan_trim(conversation, costs, first_new, len(tok.tokens), room)
    if trim is NO_TRIM:
        return BuiltPrompt(conversation, "", tok.tokens, tok.spans, kept_history_tokens=sum(costs[:first_new]), history=history,
                           memories_told=untold(p.memories, history))
    offsets = message_offsets(segments, tok.counts, len(conversation))
    dropped = (offsets[trim.start], offsets[trim.stop])
    images_dropped = sum(m.count(IMAGE_MARKER) for _, m in conversation[trim.start:trim.stop])
    while True:
        trimmed = conversation[:trim.start] + conversation[trim.stop:]
        kept_images = list(images)[images_dropped:]
        segments = render_segments(model.render_chat, trimmed)
        tok = tokenize_segments(reply_tokens.tokenizer(model.tokenize, replies, trimmed), segments, kept_images)
        if len(tok.tokens) <= room:
            break
        if trim.stop >= first_new:
            raise ResourceExhausted(
                f"the persona and this turn are {len(tok.tokens)} tokens; the context holds {room} "
                f"(--ctx {n_ctx}, leaving room for the reply)"
            )
        # The estimate fell short (template text around turns): drop one more turn.
        stop = trim.stop + 1
        while stop < first_new and conversation[stop][0] != "user":
            stop += 1
        trim = Trim(trim.start, stop, trim.turns + 1)
        dropped = (offsets[trim.start], offsets[trim.stop])
        images_dropped = sum(m.count(IMAGE_MARKER) for _, m in conversation[trim.start:trim.stop])
    kept_history = trimmed[: first_new - trim.dropped]
    return BuiltPrompt(
        trimmed, "", tok.tokens, tok.spans, trim, images_dropped, dropped,
        kept_history_tokens=sum(message_costs(segments, tok.counts, len(trimmed))[: len(kept_history)]),
        history=kept_history,
        dropped=tuple(conversation[trim.start:trim.stop]),
        memories_told=untold(p.memories, history),
    )


def _raw(model, spec: GenerationSpec, session: Session | None, images: list, max_prompt_tokens: int,
         n_ctx: int) -> BuiltPrompt:
    if spec.prompt.token_ids is not None:
        return _token_ids(model, spec, session, max_prompt_tokens)
    history = session.text if session is not None else ""
    text = history + (spec.prompt.context if not history else "") + (spec.prompt.text or "")
    tok = tokenize_segments(model.tokenize, raw_segments(text), images)
    if session is None or not history:
        _check_request(len(tok.tokens), max_prompt_tokens)
    else:
        _check_request(len(model.tokenize(spec.prompt.text or "", add_bos=False, parse_special=True)), max_prompt_tokens, "this turn")
        room = context_room(n_ctx, spec.max_tokens)
        if len(tok.tokens) > room:
            # Raw text has no turns to drop: the game decides what to forget (reset_session).
            raise ResourceExhausted(
                f"this raw-prompt session is {len(tok.tokens)} tokens; the context holds {room}: "
                "reset it (reset_session) or use chat messages, whose oldest turns are dropped"
            )
    return BuiltPrompt([], text, tok.tokens, tok.spans)


def _token_ids(model, spec: GenerationSpec, session: Session | None, max_prompt_tokens: int) -> BuiltPrompt:
    """The caller's own tokens, fed as they are: tokenizing their text again would add a second BOS
    and may split words differently."""
    if session is not None:
        raise InvalidArgument("prompt_tokens is for one-off prompts: continue a session with prompt or messages")
    tokens = list(spec.prompt.token_ids or ())
    model.check_token_ids(tokens)  # the service checked them too, against the model it knew then
    _check_request(len(tokens), max_prompt_tokens)
    return BuiltPrompt([], "", tokens, {})


def _check_request(n_tokens: int, limit: int, what: str = "the prompt") -> None:
    if n_tokens > limit:
        raise ContextLengthExceeded(f"{what} is {n_tokens} tokens; the limit is {limit} (--max-prompt-tokens)")


