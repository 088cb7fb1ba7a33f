"""Prompts are rendered and tokenized beside the engine thread (prompt_prep.py).

The pure part (counting a huge text piece by piece, when a prompt built beside the engine may be
used) is tested with a word-counting tokenizer. The engine part runs the real SmolLM2: every call
of the tokenizer is recorded with the thread it ran on, and what is checked is where the work ran
and that the engine rebuilt only what had gone stale, never what the model said.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from sidecar.backend.sessions import Session
from sidecar.engine import Engine, GenerationSpec, Prompt, SamplingConfig
from sidecar.engine.prompts.prompt_build import BuiltPrompt
from sidecar.engine.prompts.prompt_prep import Prebuilt, count_capped, new_text
from sidecar.errors import ContextLengthExceeded

from support.engines import Stream, open_engine, run

GREEDY = SamplingConfig(temperature=0.0, repeat_penalty=1.0)


def words(text: str, *, add_bos: bool, parse_special: bool) -> list[int]:
    return [1] * len(text.split())


def test_counting_stops_soon_after_the_cap() -> None:
    calls: list[int] = []

    def counting(text: str, *, add_bos: bool, parse_special: bool) -> list[int]:
        calls.append(len(text))
        return words(text, add_bos=add_bos, parse_special=parse_special)

    text = "word " * 400_000  # 2 MB
    assert count_capped(counting, text, cap=1000, piece_bytes=4096) > 1000
    assert sum(calls) < 3 * 4096, "it read far past the cap"
    small = "word " * 300
    assert count_capped(words, small, cap=1000, piece_bytes=64) == 300  # seams after spaces: exact here
    assert count_capped(words, "", cap=10) == 0


def test_counting_stops_when_the_request_is_cancelled() -> None:
    seen = []
    cancel = threading.Event()

    def slow(text: str, *, add_bos: bool, parse_special: bool) -> list[int]:
        seen.append(text)
        cancel.set()  # cancelled while the first piece was tokenized
        return words(text, add_bos=add_bos, parse_special=parse_special)

    count_capped(slow, "word " * 100_000, cap=10**9, cancelled=cancel.is_set, piece_bytes=1024)
    assert len(seen) == 1


def test_new_text_is_what_the_request_brings() -> None:
    chat = Prompt(messages=(("system", "You forge."), ("user", "A sword?")), context="The village.")
    assert new_text(chat) == "The village.You forge.A sword?"
    assert new_text(Prompt(text="Once upon")) == "Once upon"


def test_a_prebuilt_prompt_is_used_only_against_what_it_was_built_from() -> None:
    built = BuiltPrompt([], "", [1, 2, 3], {})
    session = Session("smith", messages=[("user", "hi"), ("assistant", "hello")], version=3)
    prebuilt = Prebuilt(built, session, 3, model_generation=0, n_ctx=512)
    assert prebuilt.still_valid(session, 0, 512)
    session.version += 1  # a turn ended after it was built
    assert not prebuilt.still_valid(session, 0, 512)
    assert not Prebuilt(built, session, 4, 0, 512).still_valid(session, 1, 512)  # reloaded
    assert not Prebuilt(built, session, 4, 0, 512).still_valid(session, 0, 1024)  # another context
    assert not Prebuilt(built, session, 4, 0, 512).still_valid(Session("smith", version=4), 0, 512)  # ended, new
    fresh = Prebuilt(built, None, 0, 0, 512)  # built for a session not there yet
    assert fresh.still_valid(None, 0, 512) and fresh.still_valid(Session("smith"), 0, 512)
    assert not fresh.still_valid(session, 0, 512)  # it has history now


# -- on the engine, real llama.cpp ---------------------------------------------------------------------


class TokenizeCalls:
    """Wraps the engine's model's tokenize: (thread name, text length) of every call."""

    def __init__(self, engine: Engine) -> None:
        self.calls: list[tuple[str, int]] = []
        model = engine.model
        original = model.tokenize

        def recorded(text: str, *, add_bos: bool, parse_special: bool) -> list[int]:
            self.calls.append((threading.current_thread().name, len(text)))
            return original(text, add_bos=add_bos, parse_special=parse_special)

        model.tokenize = recorded  # type: ignore[method-assign]
        self._restore = lambda: delattr(model, "tokenize")

    def on_engine_thread(self, longer_than: int = 0) -> list[int]:
        return [n for name, n in self.calls if name == "xlm-engine" and n > longer_than]

    def close(self) -> None:
        self._restore()


@pytest.fixture(scope="module")
def engine(smollm2_path) -> Iterator[Engine]:
    with open_engine(smollm2_path, n_seq=2, max_sessions=4, max_prompt_tokens=600) as e:
        yield e


@pytest.fixture
def tokenize_calls(engine: Engine) -> Iterator[TokenizeCalls]:
    calls = TokenizeCalls(engine)
    yield calls
    calls.close()


def chat(text: str, session: str = "", max_tokens: int = 8) -> GenerationSpec:
    return GenerationSpec(prompt=Prompt(messages=(("user", text),)), sampling=GREEDY, max_tokens=max_tokens,
                          session_id=session)


def test_session_turns_are_built_beside_the_engine(engine: Engine, tokenize_calls: TokenizeCalls) -> None:
    before = engine.prompts_built_on_engine_thread
    for turn in ("Hello, smith.", "Can you mend my sword?", "How much will it cost?"):
        run(engine, chat(turn, session="smith-prep"))
        # The next turn is submitted once this one ended: built against the history it will see.
    run(engine, chat("A one-off question about the weather."))
    assert engine.prompts_built_on_engine_thread == before
    # What the engine still tokenizes itself is small: a reply's tail, never a prompt.
    assert not tokenize_calls.on_engine_thread(longer_than=200), tokenize_calls.calls
    assert any(name == "xlm-prompts" for name, _ in tokenize_calls.calls)
    engine.end_session("smith-prep")


def test_a_turn_built_before_the_previous_one_ended_is_built_again(engine: Engine) -> None:
    before = engine.prompts_built_on_engine_thread
    first, second = Stream(), Stream()
    engine.submit(chat("Tell me about the mine.", session="miner-prep", max_tokens=24), first)
    engine.submit(chat("And the river?", session="miner-prep"), second)  # prepared while the first runs
    first.result()
    finished = second.result()
    # Built beside the engine against a history without the first turn: stale, built again.
    assert engine.prompts_built_on_engine_thread == before + 1
    assert finished.usage.prompt_tokens > first.result().usage.prompt_tokens  # the history is in it
    engine.end_session("miner-prep")


def test_a_huge_prompt_is_refused_beside_the_engine_while_another_streams(engine: Engine, tokenize_calls: TokenizeCalls) -> None:
    """2 MB of text, far past the 600-token limit: refused after counting a few pieces, on the
    prompt thread; the stream already running goes on."""
    gaps: list[float] = []
    last = [time.perf_counter()]

    def timed(delta) -> None:
        now = time.perf_counter()
        gaps.append(now - last[0])
        last[0] = now

    running = Stream(on_delta=timed)
    engine.submit(chat("Describe the forge in detail.", max_tokens=48), running)
    while not running.deltas and not running.done.is_set():
        time.sleep(0.005)
    huge = Stream()
    t = time.perf_counter()
    engine.submit(chat("the old mill by the river " * 80_000), huge)
    assert huge.done.wait(60)
    refused_s = time.perf_counter() - t
    assert isinstance(huge.end, ContextLengthExceeded), huge.end
    assert "600" in str(huge.end)
    running.result()
    longest_piece = max(n for name, n in tokenize_calls.calls if name == "xlm-prompts")
    assert longest_piece < 64 << 10, "the whole text was tokenized, not counted piece by piece"
    assert not tokenize_calls.on_engine_thread(longer_than=200)
    print(f"refused in {refused_s * 1000:.0f} ms; the running stream's longest gap {max(gaps[1:], default=0) * 1000:.0f} ms")


def test_a_prompt_just_over_the_limit_is_refused_exactly(engine: Engine) -> None:
    # Within the counting margin: the full build decides, with the exact count in its message.
    with pytest.raises(ContextLengthExceeded, match=r"is \d+ tokens; the limit is 600"):
        run(engine, chat("word " * 640))
