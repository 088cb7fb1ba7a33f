"""Embeddings in slices between the engine's passes (engine/embedding_slices.py), on the real engine
with the real small model: a vector does not depend on how its input was cut into passes, a call
whose caller has gone stops before its next slice, and what one call may carry is bounded. The
daemon-level checks (a stream's gaps beside big calls, over HTTP, gRPC and the bridge) are in
test_embeddings_beside_streams.py."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import CancelledError

import numpy as np
import pytest

from sidecar.backend.contract import Backend, local_model
from sidecar.engine import Engine
from sidecar.engine.model_calls import MAX_EMBED_TOKENS
from sidecar.errors import InvalidArgument
from sidecar.guard.frame_guard import NO_LIMITS, PassLimits
from sidecar.native.embedding_context import EMBED_CONTEXT

from support.engines import open_engine


@pytest.fixture(scope="module")
def engine(smollm2_path) -> Iterator[Engine]:
    with open_engine(smollm2_path, n_seq=2) as e:
        yield e


def call(engine: Engine, run_on_model, timeout: float = 120):
    return engine.call_model(run_on_model).result(timeout=timeout)


def test_the_engine_is_a_backend_with_its_model_here(engine: Engine) -> None:
    """What the service asks for before calling the model (sidecar.backend.contract.local_model)."""
    assert isinstance(engine, Backend) and local_model(engine) is engine


def tokens_of(engine: Engine, n: int) -> list[int]:
    """Token ids of a text of exactly n tokens."""
    words = call(engine, lambda m: m.tokenize("The smith of Oakvale hammered a blade by the forge. " * 60, False, False))
    assert len(words) >= n
    return words[:n]


def test_a_vector_does_not_depend_on_how_its_input_was_cut(engine: Engine) -> None:
    long = tokens_of(engine, 300)  # three slices
    short = tokens_of(engine, 7)
    (whole, _) = call(engine, lambda m: m.embed([long]))
    engine.set_pass_limits(PassLimits(max_pass_tokens=45))  # the frame guard's cap: seven slices
    try:
        (cut, tokens) = call(engine, lambda m: m.embed([long, short]))
    finally:
        engine.set_pass_limits(NO_LIMITS)
    assert tokens == len(long) + len(short)
    # Within rounding: llama.cpp's kernels for small batches round otherwise (up to 2e-4 here).
    assert float(np.dot(cut[0], whole[0])) > 0.9999
    # Short inputs share a pass (one sequence each): each as it is alone.
    (packed, _) = call(engine, lambda m: m.embed([short, long[:40], short]))
    (alone, _) = call(engine, lambda m: m.embed([long[:40]]))
    assert np.allclose(packed[1], alone[0], atol=1e-4) and np.allclose(packed[0], packed[2], atol=1e-6)
    assert np.allclose(np.linalg.norm(np.array(cut), axis=1), 1.0, atol=1e-4)


def test_a_cancelled_call_stops_before_its_next_slice(engine: Engine) -> None:
    long = tokens_of(engine, EMBED_CONTEXT - 2)
    t0 = time.perf_counter()
    call(engine, lambda m: m.embed([long]))
    one_input_s = time.perf_counter() - t0  # its slices, one after another
    inputs = MAX_EMBED_TOKENS // EMBED_CONTEXT
    future = engine.call_model(lambda m: m.embed([long] * inputs))
    while not future.running():
        time.sleep(0.005)
    time.sleep(one_input_s / 4)  # a slice or so in
    cancelled_at = time.perf_counter()
    assert not future.cancel()  # running: not cancelled at once, but asked to stop
    with pytest.raises(CancelledError):
        future.result(timeout=120)
    stopped_s = time.perf_counter() - cancelled_at
    # At most the slice it was in; the whole call would have taken `inputs` times one input.
    assert stopped_s < one_input_s, (stopped_s, one_input_s)
    # The engine goes on with other work at once.
    t1 = time.perf_counter()
    assert call(engine, lambda m: m.tokenize("hi", False, False))
    assert time.perf_counter() - t1 < one_input_s


def test_what_one_call_may_carry_is_bounded(engine: Engine) -> None:
    long = tokens_of(engine, EMBED_CONTEXT)
    over = MAX_EMBED_TOKENS // EMBED_CONTEXT + 1
    with pytest.raises(InvalidArgument, match=f"{over * EMBED_CONTEXT} tokens; at most {MAX_EMBED_TOKENS} per request"):
        call(engine, lambda m: m.embed([long] * over))
    with pytest.raises(InvalidArgument, match=f"input\\[1\\] is {EMBED_CONTEXT + 1} tokens; at most {EMBED_CONTEXT}"):
        call(engine, lambda m: m.embed([long[:5], long + long[:1]]))
    with pytest.raises(InvalidArgument, match="input\\[0\\] is empty"):
        call(engine, lambda m: m.embed([""]))
    # The engine is none the worse for it: 256 one-token lines go in a few packed slices.
    (vectors, tokens) = call(engine, lambda m: m.embed(["hi"] * 256))
    assert len(vectors) == 256 and tokens == 256 * len(call(engine, lambda m: m.tokenize("hi", True, False)))


def test_a_reload_between_slices_starts_the_input_in_progress_again(engine: Engine) -> None:
    """A reload frees the embedding context with the model: the input whose chunks it held is fed
    again on the new one, and every vector is as it is alone."""
    long = tokens_of(engine, 300)
    (alone, _) = call(engine, lambda m: m.embed([long]))
    future = engine.call_model(lambda m: m.embed([long] * 3))
    while not future.running():
        time.sleep(0.005)
    time.sleep(0.2)
    assert engine.reload(engine.config, force=True).result(timeout=120)[0]
    (vectors, tokens) = future.result(timeout=120)
    assert tokens == 3 * len(long)
    assert all(float(np.dot(v, alone[0])) > 0.9999 for v in vectors)
