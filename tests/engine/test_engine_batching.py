"""Continuous batching on the real SmolLM2: many conversations in one context, sessions evicted to
host memory and restored, and a reload in the middle of live streams.

A batched reply is not the same tokens as the same reply alone (other batch shapes, other
kernels' summation order, and on some CPUs other kernels): it is checked against a plain CPU
llama.cpp within rounding (greedy_agreement.py). Exact identity is asserted only where llama.cpp
computes alike: pinned threads, the same batch layout, a reload to the same placement."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from sidecar.engine import Engine, FinishReason, GenerationSpec, Prompt, SamplingConfig

from support.greedy_agreement import CpuReference, assert_greedy_agrees, engine_prompt_tokens
from support.no_early_stop import engine_eog_ids, engine_sampling
from support.engines import Stream, open_engine

GREEDY = SamplingConfig(temperature=0.0, repeat_penalty=1.0)


def chat(text: str, banned: tuple[int, ...] = (), **kw) -> GenerationSpec:
    """A greedy one-off question; `banned`: the end-of-generation tokens, where a test needs the
    reply to run its whole max_tokens (no_early_stop.py)."""
    return GenerationSpec(prompt=Prompt(messages=(("user", text),)), sampling=engine_sampling(GREEDY, banned), **kw)


@pytest.fixture(scope="module")
def engine(smollm2_path) -> Iterator[Engine]:
    with open_engine(smollm2_path, n_seq=3, n_batch=256) as e:
        yield e


@pytest.fixture(scope="module")
def eog(engine: Engine) -> tuple[int, ...]:
    return engine_eog_ids(engine)


@pytest.fixture(scope="module")
def reference(smollm2_path) -> Iterator[CpuReference]:
    with CpuReference(smollm2_path) as r:
        yield r


QUESTIONS = ["Name a fruit.", "What color is the sky?", "Say hello in French.", "What is 2 plus 2?", "Name a planet."]


def test_batched_conversations_read_as_each_would_alone(engine: Engine, eog, reference: CpuReference) -> None:
    # The end-of-generation tokens banned (and in the reference): 24 tokens each to compare.
    together = [Stream() for _ in QUESTIONS[:3]]
    for q, s in zip(QUESTIONS[:3], together):
        engine.submit(chat(q, eog, max_tokens=24), s)
    for q, s in zip(QUESTIONS[:3], together):
        s.result()
        # Each sequence sees only its own cache: a reply that read another's would be far off.
        assert_greedy_agrees(reference, engine_prompt_tokens(engine, chat(q)), s.tokens, f"the batched reply to {q!r}", 4,
                             banned=eog)


def test_more_requests_than_sequences_all_finish(engine: Engine) -> None:
    streams = [Stream() for _ in QUESTIONS]
    for q, s in zip(QUESTIONS, streams):
        engine.submit(chat(q, max_tokens=12), s)
    finals = [s.result() for s in streams]
    assert all(f.reason in (FinishReason.STOP, FinishReason.LENGTH) for f in finals)
    assert engine.snapshot().requests_active == 0


def test_sessions_beyond_the_sequences_are_evicted_and_restored(engine: Engine) -> None:
    names = ["anna", "bert", "cleo", "dora"]  # four NPCs, three sequences
    first = {}
    for n in names:
        s = Stream()
        engine.submit(chat(f"My name is {n.title()}. Greet me.", session_id=n, max_tokens=16), s)
        first[n] = s.result()
    views = {v.session_id: v for v in engine.snapshot().sessions}
    assert sum(not v.in_kv_cache for v in views.values()) >= 1, "one NPC should live in host memory"
    assert any(v.host_bytes > 0 for v in views.values())
    evicted = next(n for n in names if not views[n].in_kv_cache)
    s = Stream()
    engine.submit(chat("What is my name?", session_id=evicted, max_tokens=16), s)
    again = s.result()
    # Restored from host memory: turn 2 recomputes only the new message, not turn 1.
    assert again.usage.cached_prompt_tokens >= first[evicted].usage.prompt_tokens
    for n in names:
        engine.end_session(n)


def test_a_reload_mid_stream_loses_nothing(engine: Engine, eog, smollm2_path) -> None:
    # The first run puts the prompt in the cache; the reference and the live run are then laid out
    # alike, and a reload to the same placement restores the cache bit for bit, so identity holds.
    # The end-of-generation tokens are banned in all three: the live reply reaches its tenth token.
    warm = Stream()
    engine.submit(chat("Tell me a story about a brave knight.", eog, max_tokens=1), warm)
    warm.result()
    reference = Stream()
    engine.submit(chat("Tell me a story about a brave knight.", eog, max_tokens=48), reference)
    reference.result()

    live = Stream()
    reloaded = threading.Event()

    def reload_after_ten(event: object) -> None:
        live(event)
        if len(live.deltas) == 10 and not reloaded.is_set():
            reloaded.set()
            engine.reload(engine.config, force=True)  # same placement: exercises save, rebuild, restore

    engine.submit(chat("Tell me a story about a brave knight.", eog, max_tokens=48), reload_after_ten)
    final = live.result()
    assert reloaded.is_set() and engine.snapshot().last_reload_pause_ms > 0
    assert final.usage.completion_tokens == reference.result().usage.completion_tokens
    assert live.text == reference.text, "greedy text must be identical across a reload"


def test_a_cancelled_request_frees_its_sequence_within_a_step(engine: Engine, eog) -> None:
    s = Stream()
    job = engine.submit(chat("Count to one hundred.", eog, max_tokens=500), s)
    while len(s.deltas) < 3:
        assert not s.done.is_set(), "the reply ended before it could be cancelled"
        threading.Event().wait(0.01)
    job.cancel()
    final = s.result(30)
    assert final.reason is FinishReason.CANCELLED
    assert final.usage.completion_tokens <= len(s.tokens) + 2
    assert engine.snapshot().requests_active == 0


def test_a_change_of_threads_only_needs_no_reload(engine: Engine, eog) -> None:
    from dataclasses import replace

    reloaded, pause_ms = engine.reload(replace(engine.config, threads_decode=1, tier_threads=((1, 1), (256, 2)))).result(30)
    assert (reloaded, pause_ms) == (False, 0.0)
    assert engine.config.tier_threads == ((1, 1), (256, 2))
    s = Stream()
    engine.submit(chat("Name a color.", eog, max_tokens=4), s)
    assert s.result().usage.completion_tokens >= 1


def test_a_reload_its_caller_gave_up_on_is_skipped_and_the_engine_goes_on(engine: Engine, eog) -> None:
    from dataclasses import replace

    # Queue work first, so the engine is busy when the reload request (cancelled at once) arrives.
    # No end-of-generation token: each reply below has tokens to count.
    s = Stream()
    engine.submit(chat("Count to five.", eog, max_tokens=24), s)
    before = engine.config
    abandoned = engine.reload(replace(engine.config, threads_decode=1, tier_threads=((1, 1), (256, 1))))
    abandoned.cancel()  # what asyncio.wrap_future does when the game cancels SetBudget
    assert s.result().usage.completion_tokens >= 1
    assert engine.reload(before).result(30) == (False, 0.0)  # the engine thread is alive
    after = Stream()
    engine.submit(chat("Name a color.", eog, max_tokens=4), after)
    assert after.result().usage.completion_tokens >= 1


def test_a_gap_left_by_a_finished_reply_is_closed_and_the_moved_reply_reads_on(engine: Engine, eog, reference: CpuReference) -> None:
    # Three replies start in sequences 0, 1, 2; the first ends after 3 tokens, so the one in
    # sequence 2 moves down into sequence 0 (llama.cpp batches only consecutive sequence ids).
    # The end-of-generation tokens are banned (and in the reference): the replies run 3, 40 and
    # 40 tokens, whatever the model would say.
    long_q, other_q = "Count from one to twenty in words.", "List the days of the week."
    moves = engine.stats.sequence_moves
    short, other, moved = Stream(), Stream(), Stream()
    engine.submit(chat("Name a fruit.", eog, max_tokens=3), short)
    engine.submit(chat(other_q, eog, max_tokens=40), other)
    engine.submit(chat(long_q, eog, max_tokens=40), moved)
    for s in (short, other, moved):
        s.result()
    assert engine.stats.sequence_moves > moves
    # The moved sequence kept its cache: it reads on as the model would, within rounding (a move
    # that lost or mixed up its cache would continue from the wrong context, logits off).
    assert_greedy_agrees(reference, engine_prompt_tokens(engine, chat(long_q)), moved.tokens, "the moved reply", banned=eog)
    assert_greedy_agrees(reference, engine_prompt_tokens(engine, chat(other_q)), other.tokens, "the reply beside it", banned=eog)


def test_an_idle_session_moved_out_of_the_way_keeps_its_cache(engine: Engine, eog) -> None:
    # The session's turn 1 ends in sequence 0 while a long reply runs in sequence 1: the long
    # reply moves down and the session's cache moves up, not out. (The end-of-generation tokens
    # banned: turn 1 ends at its 4th token, the long reply at its 40th.)
    moves = engine.stats.sequence_moves
    turn1, long = Stream(), Stream()
    engine.submit(chat("My name is Edda. Greet me.", eog, session_id="edda", max_tokens=4), turn1)
    engine.submit(chat("Count from one to twenty in words.", eog, max_tokens=40), long)
    first = turn1.result()
    long.result()
    assert engine.stats.sequence_moves > moves
    turn2 = Stream()
    engine.submit(chat("What is my name?", session_id="edda", max_tokens=8), turn2)
    assert turn2.result().usage.cached_prompt_tokens >= first.usage.prompt_tokens
    engine.end_session("edda")
