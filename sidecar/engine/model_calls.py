"""Calls on the loaded model that are not generations: tokenize, detokenize, embed.

They run on the engine thread, between forward passes, never on the caller's: a reload frees the
model and builds another, so any other thread could be reading a freed vocabulary. The caller
gets a Future; the service awaits it off the event loop.

A call that is a generator (embeddings: embedding_slices.py) runs a slice at a time, one slice
per loop turn with the streams' pass between two, the calls in turn; it stops before its next
slice once its caller has gone (the Future cancelled: an awaiting coroutine cancelled through
asyncio.wrap_future cancels it). The others run whole, as they are short.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Generator
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass, field
from typing import Callable

import structlog

from sidecar.engine.embedding_slices import MAX_EMBED_INPUTS, MAX_EMBED_TOKENS, Vectors, embedding_slices
from sidecar.errors import InvalidArgument
from sidecar.native.embedding_context import EMBED_SLICE_TOKENS, EmbeddingContext
from sidecar.native.model import NativeModel

__all__ = ["MAX_EMBED_INPUTS", "MAX_EMBED_TOKENS", "CallFuture", "ModelCall", "ModelCalls"]

log = structlog.get_logger("engine")

# Longest text /tokenize takes: the largest JSON body's worth.
MAX_TOKENIZE_CHARS = 1 << 20


class CallFuture(Future):
    """A call's Future whose cancel() also reaches a call already running: a Future refuses to
    be cancelled once running, so the caller's wish is kept here for the engine, which stops the
    call before its next slice."""

    def __init__(self) -> None:
        super().__init__()
        self.abandoned = False

    def cancel(self) -> bool:
        self.abandoned = True
        return super().cancel()


@dataclass
class ModelCall:
    """One call waiting for the engine thread, or running there a slice at a time."""

    run: Callable[["ModelCalls"], object]
    done: CallFuture = field(default_factory=CallFuture)
    slices: Generator | None = None
    slices_run: int = 0

    def start(self, calls: "ModelCalls") -> bool:
        """Run it (a generator: make it, without running a slice). True while slices remain."""
        if not self.done.set_running_or_notify_cancel():
            return False
        try:
            result = self.run(calls)
        except BaseException as e:  # the caller hears it; the engine goes on
            self.done.set_exception(e)
            return False
        if isinstance(result, Generator):
            self.slices = result
            return True
        self.done.set_result(result)
        return False

    def advance(self) -> bool:
        """Run its next slice; True while more remain."""
        try:
            next(self.slices)
            self.slices_run += 1
            return True
        except StopIteration as end:
            self.done.set_result(end.value)
        except BaseException as e:
            self.done.set_exception(e)
        return False

    def stop(self, error: BaseException) -> None:
        self.slices.close()
        self.done.set_exception(error)


class ModelCalls:
    """What the calls need from the engine (its model, the embedding context made on demand, the
    threads and tokens one pass may take) and the sliced calls in progress."""

    def __init__(self, model_of: Callable[[], NativeModel], threads_of: Callable[[], int],
                 pass_tokens_of: Callable[[], int] = lambda: EMBED_SLICE_TOKENS,
                 after_slice: Callable[[float], None] = lambda seconds: None) -> None:
        # Getters: a reload replaces the model, the thread count follows the schedule and the
        # frame guard, and the guard may cap a pass's tokens (and pause after each pass).
        self._model_of = model_of
        self._threads_of = threads_of
        self._pass_tokens_of = pass_tokens_of
        self._after_slice = after_slice
        self._embedder: EmbeddingContext | None = None
        self._running: deque[ModelCall] = deque()

    @property
    def model(self) -> NativeModel:
        return self._model_of()

    # -- the calls (engine thread) ---------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        if len(text) > MAX_TOKENIZE_CHARS:
            raise InvalidArgument(f"the text is {len(text)} characters; at most {MAX_TOKENIZE_CHARS}")
        return self.model.tokenize(text, add_bos=add_special, parse_special=parse_special)

    def detokenize(self, tokens: list[int]) -> str:
        return self.model.detokenize(tokens)

    def pieces(self, tokens: list[int]) -> list[bytes]:
        """Each token's own bytes (part of a character, for some), control tokens as their text."""
        self.model.check_token_ids(tokens)
        return [self.model.piece(t, special=True) for t in tokens]

    def embed(self, texts: list[str | list[int]]) -> Generator[None, None, Vectors]:
        """(one unit vector per input, the tokens they took), in slices. An input is text or token ids."""
        return embedding_slices(self, list(texts))

    # -- what the slices use ---------------------------------------------------------------------

    def embedder(self) -> EmbeddingContext:
        """The embedding context (made on first use, and again after a reload), on this pass's threads."""
        if self._embedder is None:
            self._embedder = EmbeddingContext(self.model, self._threads_of())
        self._embedder.set_threads(self._threads_of())
        return self._embedder

    def slice_tokens(self) -> int:
        return max(1, min(EMBED_SLICE_TOKENS, self._pass_tokens_of()))

    # -- the engine's side -----------------------------------------------------------------------

    def take(self, call: ModelCall) -> None:
        """A call that arrived: run now, or queued for its slices."""
        if call.start(self):
            self._running.append(call)

    @property
    def pending(self) -> bool:
        return bool(self._running)

    def advance(self) -> None:
        """One slice of the next call in turn, after dropping the calls whose callers have gone."""
        for call in [c for c in self._running if c.done.abandoned]:
            self._running.remove(call)
            log.info("model call stopped: its caller has gone", slices_run=call.slices_run)
            call.stop(CancelledError())
        if not self._running:
            return
        call = self._running.popleft()
        t0 = time.perf_counter()
        if call.advance():
            self._running.append(call)
        self._after_slice(time.perf_counter() - t0)

    def stop_all(self, error: BaseException) -> None:
        while self._running:
            self._running.popleft().stop(error)

    def release(self) -> None:
        """Before the model is freed (a reload, the engine's close): the next slice makes the
        embedding context again on the model then loaded (a long input in progress starts over)."""
        if self._embedder is not None:
            self._embedder.close()
            self._embedder = None
