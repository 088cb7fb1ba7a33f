"""KV that follows the crowd (kv_demand.py): the rule, and the engine growing its sequences when
more conversations run at once than it holds, and giving them back when they go quiet, with the
real model: every stream goes on through a resize, none loses or repeats a token, sessions keep
their cache."""

from __future__ import annotations

import threading
import time

import pytest

from sidecar.backend.requests import Finished, TextDelta
from sidecar.engine import Engine, EngineConfig, GenerationSpec, Prompt, SamplingConfig
from sidecar.engine import kv_demand
from sidecar.engine.scheduling import kv_sizing
from sidecar.engine.scheduling.kv_sizing import grown_count, shrunk_count
from support.no_early_stop import engine_bias, engine_eog_ids
from support.engines import engine_config
from support.worker_threads import PINNED

GREEDY = SamplingConfig(temperature=0.0, repeat_penalty=1.0)


def test_growth_covers_the_crowd_in_one_step_within_the_ceiling() -> None:
    assert grown_count(2, 16, busy=2, waiting=1) == 4
    assert grown_count(2, 16, busy=2, waiting=10) == 16
    assert grown_count(4, 6, busy=4, waiting=9) == 6
    assert grown_count(4, 16, busy=3, waiting=5) is None  # a sequence is free
    assert grown_count(16, 16, busy=16, waiting=5) is None
    assert grown_count(2, 16, busy=2, waiting=0) is None


def test_shrink_only_after_quiet() -> None:
    assert shrunk_count(8, 2, kv_sizing.SHRINK_IDLE_S) == 2
    assert shrunk_count(8, 2, kv_sizing.SHRINK_IDLE_S - 1) is None
    assert shrunk_count(2, 2, 1e9) is None


def submit(engine: Engine, spec: GenerationSpec):
    deltas: list[TextDelta] = []
    result: list[object] = []
    done = threading.Event()

    def sink(event: object) -> None:
        if isinstance(event, TextDelta):
            deltas.append(event)
        else:
            result.append(event)
            done.set()

    engine.submit(spec, sink)
    return deltas, result, done


def wait_started(pending, timeout_s: float = 60) -> None:
    """Until the stream `submit` returned has its first text."""
    deltas = pending[0]
    deadline = time.monotonic() + timeout_s
    while not deltas and time.monotonic() < deadline:
        time.sleep(0.01)
    assert deltas, "the first stream never started"


def finished(pending) -> list[tuple[list[TextDelta], Finished]]:
    out = []
    for deltas, result, done in pending:
        assert done.wait(180), "a stream never finished"
        assert isinstance(result[0], Finished), result[0]
        out.append((deltas, result[0]))
    return out


def test_the_engine_grows_for_a_crowd_and_shrinks_when_it_goes_quiet(smollm2_path, monkeypatch) -> None:
    monkeypatch.setattr(kv_sizing, "SHRINK_IDLE_S", 1.0)
    engine = Engine(engine_config(smollm2_path, n_ctx=512, n_seq=8, n_seq_start=2, max_sessions=16))
    try:
        assert engine.pool.allocated == 2
        specs = [GenerationSpec(prompt=Prompt(messages=(("user", f"NPC {i}: tell me about the harbour."),)),
                                sampling=GREEDY, max_tokens=16, session_id=f"npc-{i}") for i in range(6)]
        results = finished([submit(engine, s) for s in specs])
        assert engine.pool.allocated == 8 and engine.pool.resizes >= 1
        for deltas, final in results:
            # Nothing lost or repeated through the resize: every token sampled reached the sink once.
            assert sum(len(d.token_ids) for d in deltas) == final.usage.completion_tokens
        deadline = time.monotonic() + 30
        while engine.pool.allocated > 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert engine.pool.allocated == 2, "the sequences were not given back once quiet"
        # Sessions whose sequence went were evicted to host memory: their next turn reuses it.
        again = finished([submit(engine, GenerationSpec(prompt=Prompt(messages=(("user", "And the ships?"),)),
                                                       sampling=GREEDY, max_tokens=4, session_id=f"npc-{i}"))
                          for i in range(6)])
        assert all(final.usage.cached_prompt_tokens > 0 for _, final in again)
    finally:
        engine.close()


@pytest.mark.parametrize("beside", [True, False])
def test_streams_in_flight_go_on_through_a_resize(smollm2_path, beside: bool) -> None:
    engine = Engine(engine_config(smollm2_path, n_ctx=512, n_seq=4, n_seq_start=1, grow_beside=beside))
    try:
        first = submit(engine, GenerationSpec(prompt=Prompt(messages=(("user", "Count to forty."),)), sampling=GREEDY,
                                              max_tokens=48))
        wait_started(first)
        later = [submit(engine, GenerationSpec(prompt=Prompt(text=f"Story {i}:"), sampling=GREEDY, max_tokens=8))
                 for i in range(3)]
        results = finished([first, *later])
        assert engine.pool.allocated == 4
        for deltas, final in results:
            assert sum(len(d.token_ids) for d in deltas) == final.usage.completion_tokens
    finally:
        engine.close()


def _state(streams: int, holder: int, block: bytes) -> bytes:
    import struct

    counts = [struct.pack("<I", 0)] * streams
    body = b"".join(counts[:holder]) + block + b"".join(counts[holder + 1:])
    return struct.pack("<II", 0xAF143CD8, 1) + struct.pack("<I", streams) + body


def test_a_saved_state_is_rewritten_for_another_stream_count() -> None:
    from sidecar.native.seq_state import restream, stream_count

    block = (5).to_bytes(4, "little") + b"cells-and-data"
    for holder in (0, 1, 3):
        state = _state(4, holder, block)
        moved = restream(state, 8)
        assert stream_count(moved) == 8 and block in moved and len(moved) == len(state) + 16
        assert restream(moved, 4) == _state(4, 0, block)  # the stream it sits in does not matter
    assert restream(_state(4, 2, block), 4) == _state(4, 2, block)


def test_a_restored_sequence_continues_in_a_bigger_context(smollm2_path) -> None:
    import numpy as np
    import llama_cpp

    from sidecar.native.context import BatchEntry, NativeContext
    from sidecar.native.model import NativeModel

    model = NativeModel(smollm2_path)

    def context(n: int) -> NativeContext:
        return NativeContext(model, n_seq=n, ctx_per_seq=256, n_batch=256, n_ubatch=256, threads_decode=PINNED,
                             threads_prefill=PINNED, flash_attention=None)

    def next_logits(ctx: NativeContext, seq: int, pos: int, token: int) -> np.ndarray:
        ctx.decode([BatchEntry(token, pos, seq, True)])
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx.ptr, -1), shape=(model.n_vocab,)).copy()

    try:
        tokens = model.tokenize("The harbour of Oakvale is busy at dawn, and", add_bos=True, parse_special=False)
        small = context(2)
        small.decode([BatchEntry(t, i, 1, False) for i, t in enumerate(tokens[:-1])])
        state = small.save(1)
        here = next_logits(small, 1, len(tokens) - 1, tokens[-1])
        big = context(8)
        big.restore(5, state)
        there = next_logits(big, 5, len(tokens) - 1, tokens[-1])
        assert there[int(here.argmax())] >= there.max() - 1e-3  # the same next token, within rounding
        small.close()
        big.close()
    finally:
        model.close()


def test_passes_beside_a_growth_are_not_taken_for_a_busy_cpu(smollm2_path, monkeypatch) -> None:
    """The context a growth makes beside the loop holds a core while it is allocated and cleared;
    the passes slowed meanwhile must not reach the thread governor (it lowered the cap for hundreds
    of passes after each growth). The allocation is held here until the long reply has gone on for
    a few passes, so that passes surely run beside it on a CPU of any speed (a fixed second was
    shorter than the whole reply where a token takes 4 ms)."""
    made = kv_demand.context_for
    streams: list = []  # the long reply's stream, once submitted

    def slow_context_for(*args, **kwargs):
        deltas = streams[0][0]
        seen_then, deadline = len(deltas), time.monotonic() + 30
        while len(deltas) < seen_then + 10 and time.monotonic() < deadline:
            time.sleep(0.005)
        return made(*args, **kwargs)

    monkeypatch.setattr(kv_demand, "context_for", slow_context_for)
    engine = Engine(EngineConfig(model_path=smollm2_path, n_ctx=512, n_seq=4, n_seq_start=1, threads_decode=2,
                                 threads_prefill=2, adaptive_threads=True, grow_beside=True))
    seen: list[bool] = []  # per pass: was a growth under way?
    recorded: list[bool] = []
    execute, record = engine._execute, engine._governor.record

    def spy_execute(plan):
        seen.append(engine.pool.growing)
        return execute(plan)

    def spy_record(*args, **kwargs):
        recorded.append(engine.pool.growing)
        return record(*args, **kwargs)

    monkeypatch.setattr(engine, "_execute", spy_execute)
    monkeypatch.setattr(engine._governor, "record", spy_record)
    try:
        long = SamplingConfig(temperature=0.0, repeat_penalty=1.0, logit_bias=engine_bias(engine_eog_ids(engine)))
        # Long enough to outlast the held growth by hundreds of passes.
        first = submit(engine, GenerationSpec(prompt=Prompt(text="Once upon a time"), sampling=long, max_tokens=400))
        streams.append(first)
        wait_started(first)
        later = [submit(engine, GenerationSpec(prompt=Prompt(text=f"Story {i}:"), sampling=GREEDY, max_tokens=4))
                 for i in range(2)]
        finished([first, *later])
        assert engine.pool.resizes >= 1
        assert any(seen), "no pass ran beside the growth: the test did not test it"
        assert not any(recorded), "passes beside a growth were fed to the thread governor"
        assert len(recorded) == seen.count(False) > 0
    finally:
        engine.close()
