"""Calls on the loaded model that are not generations: tokenize, detokenize, embed.

They run on the engine thread, between forward passes, never on the caller's: a reload frees the
model and builds another, so any other thread could be reading a freed vocabulary. The caller
gets a Future; the service awaits it off the event loop.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable

from sidecar.errors import InvalidArgument
from sidecar.native.embedding_context import EMBED_CONTEXT, EmbeddingContext
from sidecar.native.model import NativeModel

# Inputs one embedding call may carry (OpenAI allows 2048; each is a pass of its own here).
MAX_EMBED_INPUTS = 256
# Longest text /tokenize takes: the largest JSON body's worth.
MAX_TOKENIZE_CHARS = 1 << 20


@dataclass
class ModelCall:
    """One call waiting for the engine thread."""

    run: Callable[["ModelCalls"], object]
    done: Future = field(default_factory=Future)

    def execute(self, calls: "ModelCalls") -> None:
        if not self.done.set_running_or_notify_cancel():
            return
        try:
            self.done.set_result(self.run(calls))
        except BaseException as e:  # the caller hears it; the engine goes on
            self.done.set_exception(e)


class ModelCalls:
    """What the calls need from the engine: its model, and the embedding context made on demand."""

    def __init__(self, model_of: Callable[[], NativeModel], threads_of: Callable[[], int]) -> None:
        # Getters: a reload replaces the model, and the thread count follows the schedule.
        self._model_of = model_of
        self._threads_of = threads_of
        self._embedder: EmbeddingContext | None = None

    @property
    def model(self) -> NativeModel:
        return self._model_of()

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

    def embed(self, texts: list[str | list[int]]) -> tuple[list[list[float]], int]:
        """(one unit vector per input, the tokens they took). An input is text or token ids."""
        if not texts:
            raise InvalidArgument("input is empty")
        if len(texts) > MAX_EMBED_INPUTS:
            raise InvalidArgument(f"input has {len(texts)} texts; at most {MAX_EMBED_INPUTS} per request")
        for t in texts:
            if isinstance(t, list):
                self.model.check_token_ids(t)
        tokenized = [t if isinstance(t, list) else self.model.tokenize(t, add_bos=True, parse_special=False)
                     for t in texts]
        too_long = next((i for i, t in enumerate(tokenized) if len(t) > EMBED_CONTEXT), None)
        if too_long is not None:  # all checked before any pass runs
            raise InvalidArgument(f"input[{too_long}] is {len(tokenized[too_long])} tokens; at most {EMBED_CONTEXT}")
        if self._embedder is None:
            self._embedder = EmbeddingContext(self.model, self._threads_of())
        self._embedder.set_threads(self._threads_of())
        vectors = [self._embedder.embed(t).tolist() for t in tokenized]
        return vectors, sum(len(t) for t in tokenized)

    def release(self) -> None:
        """Before the model is freed (a reload, the engine's close): the next embedding call makes
        its context again on the model then loaded."""
        if self._embedder is not None:
            self._embedder.close()
            self._embedder = None
