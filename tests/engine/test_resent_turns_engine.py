"""Resent conversations decided by the engine, at admission, on the real SmolLM2.

The race this removes: the OpenAI transport used to read a live session on the event loop and
decide "skip the 2 messages it holds" there; when another turn of the same session (or a reset)
ran before the engine admitted the request, the engine applied the stale decision and the model
read a conversation the client never sent. Replies are held to grammars so that their text (and
so the histories compared) does not depend on the CPU's rounding.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from sidecar.backend.requests import Finished, GenerationSpec, Prompt, TextDelta
from sidecar.backend.sampling import SamplingConfig
from sidecar.engine import Engine
from sidecar.errors import SidecarError

from support.engines import open_engine

GREEDY = SamplingConfig(temperature=0.0, repeat_penalty=1.0)
LONG_REPLY = " ".join(f"word{i}" for i in range(40))


@pytest.fixture(scope="module")
def engine(smollm2_path) -> Iterator[Engine]:
    with open_engine(smollm2_path, max_sessions=4, max_prompt_tokens=900) as e:
        yield e


class Run:
    """One submitted request's events."""

    def __init__(self, engine: Engine, spec: GenerationSpec, on_first_delta=None) -> None:
        self.text: list[str] = []
        self.end: Finished | SidecarError | None = None
        self.done = threading.Event()
        self._on_first = on_first_delta
        engine.submit(spec, self._sink)

    def _sink(self, event: object) -> None:
        if isinstance(event, TextDelta):
            self.text.append(event.text)
            if self._on_first is not None:
                first, self._on_first = self._on_first, None
                first()
        else:
            self.end = event
            self.done.set()

    def finished(self, timeout: float = 120.0) -> Finished:
        assert self.done.wait(timeout), "the engine never finished the request"
        if isinstance(self.end, SidecarError):
            raise self.end
        return self.end


def turn(messages, reply: str, *, resent: bool, session: str, **fields) -> GenerationSpec:
    return GenerationSpec(prompt=Prompt(messages=tuple(messages)), sampling=GREEDY, max_tokens=80,
                          grammar=f'root ::= "{reply}"', session_id=session, resends_history=resent, **fields)


def test_a_resent_conversation_continues_its_session(engine: Engine) -> None:
    first = [("system", "You are Brom, a smith."), ("user", "Hello")]
    one = Run(engine, turn(first, "Hi there.", resent=True, session="brom")).finished()
    history = first + [("assistant", "Hi there.")]
    two = Run(engine, turn(history + [("user", "And you?")], "Fine.", resent=True, session="brom")).finished()
    session = engine.sessions.get("brom")
    assert session.messages == history + [("user", "And you?"), ("assistant", "Fine.")]
    # Only the new message was computed: the rest came from the session's own cache.
    assert two.usage.cached_prompt_tokens >= one.usage.prompt_tokens
    assert two.usage.prompt_tokens - two.usage.cached_prompt_tokens < one.usage.prompt_tokens


def test_a_turn_resent_while_another_turn_of_its_session_runs_is_decided_after_it(engine: Engine) -> None:
    """Another turn (gRPC, new messages only) changes the session while a resent turn waits: the
    resent turn is matched against the history as that turn left it. It no longer extends it, so
    the session restarts from exactly what the client sent, and the model never reads the other
    turn's words inside this client's conversation."""
    held = [("user", "Hello"), ("assistant", "Hi there.")]
    Run(engine, turn(held[:1], "Hi there.", resent=True, session="mira")).finished()
    assert engine.sessions.get("mira").messages == held

    resent: list[Run] = []
    sent = held + [("user", "And you?")]
    other = Run(engine, turn([("user", "Count for me.")], LONG_REPLY, resent=False, session="mira"),
                on_first_delta=lambda: resent.append(Run(engine, turn(sent, "Fine.", resent=True, session="mira"))))
    other.finished()
    assert resent, "the other turn streamed nothing"
    resent[0].finished()
    assert engine.sessions.get("mira").messages == sent + [("assistant", "Fine.")]


def test_an_ended_session_is_not_continued_by_a_stale_decision(engine: Engine) -> None:
    """EndSession from another thread between the decision and the start: the turn either starts
    from a fresh session with everything the client sent, or is refused to be sent again; never
    continued from a history that is gone."""
    held = [("user", "Hello"), ("assistant", "Hi there.")]
    Run(engine, turn(held[:1], "Hi there.", resent=True, session="ada")).finished()
    engine.end_session("ada")
    Run(engine, turn(held + [("user", "Still there?")], "Yes.", resent=True, session="ada")).finished()
    assert engine.sessions.get("ada").messages == held + [("user", "Still there?"), ("assistant", "Yes.")]
