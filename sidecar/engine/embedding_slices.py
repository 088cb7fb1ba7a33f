"""An embeddings call as slices, which the engine runs one at a time between its generation passes.

The call used to run whole on the engine thread: 4 inputs of 510 tokens held every stream for
14.5 s, and one of 16 kept running after its client had gone. Now each slice is one pass of at
most a slice's tokens (embedding_context.py): short inputs packed side by side, a long one in
chunks. The engine runs a pass of its streams between two slices, and stops a call whose caller
has gone before its next slice (model_calls.py). What one call may carry is bounded too.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING

import numpy as np

from sidecar.errors import InvalidArgument
from sidecar.native.embedding_context import EMBED_CONTEXT, EMBED_SEQUENCES, EmbeddingContext

if TYPE_CHECKING:
    from sidecar.engine.model_calls import ModelCalls

# Inputs one call may carry (OpenAI allows 2048).
MAX_EMBED_INPUTS = 256
# Tokens one call may carry in all: 16 inputs of the longest (EMBED_CONTEXT), about 16 s of passes
# on 2 cores beside the streams. 256 inputs of 512 tokens would be 131072: minutes of the engine.
MAX_EMBED_TOKENS = 16 * EMBED_CONTEXT
# Text one slice tokenizes before it lets a pass run (a few milliseconds of the tokenizer).
TOKENIZE_CHARS_PER_SLICE = 1 << 16

Vectors = tuple[list[list[float]], int]


def embedding_slices(calls: "ModelCalls", texts: list[str | list[int]]) -> Generator[None, None, Vectors]:
    """Yields after each slice; returns (one unit vector per input, the tokens they took). An
    input is text or token ids. Every input is checked before the first pass."""
    if not texts:
        raise InvalidArgument("input is empty")
    if len(texts) > MAX_EMBED_INPUTS:
        raise InvalidArgument(f"input has {len(texts)} texts; at most {MAX_EMBED_INPUTS} per request")
    tokenized: list[list[int]] = []
    chars = 0
    for text in texts:
        if isinstance(text, list):
            calls.model.check_token_ids(text)
            tokenized.append(text)
            continue
        tokenized.append(calls.model.tokenize(text, add_bos=True, parse_special=False))
        chars += len(text)
        if chars >= TOKENIZE_CHARS_PER_SLICE:
            chars = 0
            yield
    _check(tokenized)
    vectors: list[list[float]] = []
    while len(vectors) < len(tokenized):
        head = tokenized[len(vectors)]
        if len(head) > calls.slice_tokens():
            vectors.append((yield from _long_input(calls, head)))
        else:
            vectors += _short_inputs(calls.embedder(), tokenized[len(vectors):], calls.slice_tokens())
        if len(vectors) < len(tokenized):
            yield
    return vectors, sum(len(t) for t in tokenized)


def _check(tokenized: list[list[int]]) -> None:
    for i, tokens in enumerate(tokenized):
        if not tokens:
            raise InvalidArgument(f"input[{i}] is empty")
        if len(tokens) > EMBED_CONTEXT:
            raise InvalidArgument(f"input[{i}] is {len(tokens)} tokens; at most {EMBED_CONTEXT}")
    total = sum(len(t) for t in tokenized)
    if total > MAX_EMBED_TOKENS:
        raise InvalidArgument(f"the inputs are {total} tokens; at most {MAX_EMBED_TOKENS} per request "
                              f"(send them in several requests)")


def _long_input(calls: "ModelCalls", tokens: list[int]) -> Generator[None, None, list[float]]:
    """One input in chunks of a slice each, its KV kept between them in sequence 0."""
    fed, total, context = 0, np.zeros(0), None
    while True:
        current = calls.embedder()
        if current is not context:  # the first chunk, or a reload remade the context: from the start
            context, fed = current, 0
            context.clear()
            total = np.zeros(context.width)
        chunk = tokens[fed : fed + calls.slice_tokens()]
        total += context.sums([(0, chunk, fed)])[0]
        fed += len(chunk)
        if fed == len(tokens):
            context.clear()
            return _unit(total / len(tokens))
        yield


def _short_inputs(context: EmbeddingContext, pending: list[list[int]], room: int) -> list[list[float]]:
    """The next inputs that fit one pass together (at least the first), each its own sequence."""
    taken, used = 0, 0
    while taken < min(len(pending), EMBED_SEQUENCES) and used + len(pending[taken]) <= room:
        used += len(pending[taken])
        taken += 1
    context.clear()
    sums = context.sums([(seq, pending[seq], 0) for seq in range(taken)])
    context.clear()
    return [_unit(s / len(pending[i])) for i, s in enumerate(sums)]


def _unit(mean: np.ndarray) -> list[float]:
    """L2-normalised, as OpenAI's embeddings are (cosine = dot)."""
    norm = float(np.linalg.norm(mean))
    return (mean / norm if norm > 0 else mean).astype(np.float32).tolist()
