"""Prompts rendered and tokenized beside the engine thread, before a request reaches it.

Tokenizing is not free: 16 KB of text took 24 ms here (a decode pass of every NPC), 128 KB 266 ms.
The service refuses a prompt of more than 32 bytes per allowed token before any tokenizing
(request_checks.py), but that still lets 98 KB through at the default limit of 3,072 tokens, and
every session turn renders and tokenizes its whole history again. Done on the engine thread, that
time is a gap in every stream. Here one thread of its own takes each submitted request in arrival
order (a session's turns stay in order), builds its prompt against what its session holds now,
and hands it on:

- a request whose new text is far past --max-prompt-tokens is refused after counting the first
  pieces of it (count_capped), not after tokenizing all of it, and a cancelled one stops between
  pieces: the cost of a huge prompt is bounded and falls on that request alone;
- the built prompt travels with the request (Prebuilt) and the engine uses it when the session
  still holds what it was built against (same session object, same history version, same model);
  otherwise (another turn of the session ended first, a reload changed the model) the engine
  builds it again, as it always did, and counts that (Engine.prompts_built_on_engine_thread);
- the shared world context's tokens, which prefix sharing compares, are kept (ContextTokens).

Requests with an image are built on the engine thread: their spans need the encoded image.
"""

from __future__ import annotations

import queue
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from sidecar.backend.chat_segments import Tokenize
from sidecar.backend.prompt_layout import context_tokens
from sidecar.backend.requests import Job, Prompt
from sidecar.backend.sessions import Session, SessionStore
from sidecar.engine.prompts.prompt_build import BuiltPrompt, build_prompt
from sidecar.errors import ContextLengthExceeded, SidecarError

if TYPE_CHECKING:
    from sidecar.native.model import NativeModel

log = structlog.get_logger("engine")

# Text is counted in pieces this long before a whole build: a piece costs about 20 ms.
COUNT_PIECE_BYTES = 16 << 10
# Context strings whose tokens are kept (a game has a few world prompts, not thousands).
CONTEXTS_KEPT = 64


@dataclass(frozen=True)
class Prebuilt:
    """A prompt built beside the engine and what it was built against."""

    built: BuiltPrompt
    session: Session | None  # the session object read (None: the request had no session yet)
    version: int  # its history version then
    model_generation: int  # Engine's model generation (a reload may change the tokenizer)
    n_ctx: int

    def still_valid(self, session: Session | None, model_generation: int, n_ctx: int) -> bool:
        """Whether the engine may use it: the session holds what it held (or both are empty),
        and the model and context are the ones it was built with."""
        if model_generation != self.model_generation or n_ctx != self.n_ctx:
            return False
        if session is None or self.session is None or session is not self.session:
            # Built for a session not there yet (or a reset turn): right if it is still empty.
            return self.session is None and (session is None or (session.is_empty and not session.images))
        return session.version == self.version


def count_capped(tokenize: Tokenize, text: str, cap: int, cancelled: Callable[[], bool] = lambda: False,
                 piece_bytes: int = COUNT_PIECE_BYTES) -> int:
    """About how many tokens `text` is, counting piece by piece and stopping once past `cap`
    (then the result is only known to exceed it). Pieces end after whitespace, where a tokenizer
    starts a new word anyway; each seam may still be off by a token, so callers allow a margin."""
    total, start = 0, 0
    while start < len(text) and total <= cap and not cancelled():
        stop = min(len(text), start + piece_bytes)
        if stop < len(text):
            space = text.rfind(" ", start + piece_bytes // 2, stop)
            stop = space + 1 if space > 0 else stop
        total += len(tokenize(text[start:stop], add_bos=False, parse_special=False))
        start = stop
    return total


def new_text(prompt: Prompt) -> str:
    """The text a request brings: its messages' content, or its raw prompt, and its context."""
    parts = [prompt.context] + [content for _, content in (prompt.messages or ())] + [prompt.text or ""]
    return "".join(parts)


class ContextTokens:
    """Tokens of world contexts, kept across requests: computed beside the engine, read on it."""

    def __init__(self, compute: Callable[[Prompt], list[int]]) -> None:
        self._compute = compute
        self._kept: OrderedDict[tuple[bool, str], list[int]] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, prompt: Prompt) -> list[int]:
        key = (prompt.is_chat, prompt.context)
        with self._lock:
            if key in self._kept:
                self._kept.move_to_end(key)
                return self._kept[key]
        tokens = self._compute(prompt)
        with self._lock:
            self._kept[key] = tokens
            while len(self._kept) > CONTEXTS_KEPT:
                self._kept.popitem(last=False)
        return tokens

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()


@dataclass
class PrepSettings:
    """What the engine lends the preparing thread, read at each request (a reload changes them)."""

    model: Callable[[], NativeModel]
    model_lock: threading.Lock  # held while the model is used here, and while a reload frees it
    model_generation: Callable[[], int]
    n_ctx: Callable[[], int]
    max_prompt_tokens: Callable[[], int]


class PromptPrep:
    """One thread that prepares submitted requests in order and passes each to `deliver`."""

    def __init__(self, settings: PrepSettings, sessions: SessionStore, deliver: Callable[[Job], None]) -> None:
        self.settings = settings
        self.sessions = sessions
        self._deliver = deliver
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self.contexts = ContextTokens(self._context_tokens)
        self._thread = threading.Thread(target=self._run, name="xlm-prompts", daemon=True)
        self._thread.start()

    def put(self, job: Job) -> None:
        self._queue.put(job)

    def pending(self) -> int:
        return self._queue.qsize()

    def close(self, timeout: float = 5.0) -> None:
        """Stop after what is queued; the jobs queued are passed on unprepared (the engine refuses
        them as it shuts down)."""
        self._queue.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            try:
                self.prepare(job)
            except SidecarError as e:
                job.prep_error = e  # the engine reports it, from its own thread, like its own errors
            except Exception:  # noqa: BLE001 - preparing is an optimisation: the engine builds it instead
                log.exception("preparing a prompt failed; the engine builds it", request_id=job.spec.request_id)
            self._deliver(job)

    def prepare(self, job: Job) -> None:
        spec = job.spec
        if job.cancelled or spec.asks_about_image or spec.resends_history:
            return  # an image's spans need its encoding; a resent turn is rewritten on the engine
        s = self.settings
        limit = s.max_prompt_tokens()
        with s.model_lock:
            model = s.model()
            text = new_text(spec.prompt)
            # Far past the limit: refused after a few pieces, not after the whole text. The margin
            # covers the seams' error and the template's own tokens.
            if len(text.encode("utf-8", errors="replace")) > limit:
                counted = count_capped(model.tokenize, text, limit + limit // 8 + 64, lambda: job.cancelled)
                if job.cancelled:
                    return
                if counted > limit + limit // 8 + 64:
                    raise ContextLengthExceeded(f"the prompt is more than {limit} tokens, the limit (--max-prompt-tokens)")
            if spec.prompt.context:
                self.contexts(spec.prompt)
            session = self.sessions.get(spec.session_id) if spec.session_id else None
            if session is not None and (spec.reset_session or session.is_empty):
                session = None if not session.images else session  # built as a new conversation
            if session is not None and session.images:
                return  # its image spans are on the engine
            version = session.version if session is not None else 0
            generation, n_ctx = s.model_generation(), s.n_ctx()
            try:
                built = build_prompt(model, spec, session, [], max_prompt_tokens=limit, n_ctx=n_ctx)
            except SidecarError:
                if spec.session_id:
                    # Judged against the session as it is now; a turn queued before this one may
                    # change it (a reset): the engine decides, on its history then (bounded: the
                    # text passed the count above).
                    return
                raise
        if session is not None and session.version != version:
            return  # its turn ended while this was built: the engine builds it again
        job.prebuilt = Prebuilt(built, session, version, generation, n_ctx)
        if session is None:
            job.prompt_tokens = built.tokens  # what admission compares with the sequences' caches

    def _context_tokens(self, prompt: Prompt) -> list[int]:
        model = self.settings.model()
        return context_tokens(model.render_chat, model.tokenize, prompt)
