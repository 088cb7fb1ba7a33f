"""The engine's own guard against grammars (issue 36, P1 and P2), below the service's checker: a
grammar handed straight to the engine that leaves no token, at its start or part-way, or that
costs too much per token, ends that request with an error naming why, and a reply streaming beside
it runs to its length. Before, each of these aborted the process (exit 134) or held the engine.

Mechanisms only: which request ends and how, never what the model writes."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from sidecar.backend.requests import TextDelta
from sidecar.engine import Engine, Finished, FinishReason, GenerationSpec, Prompt, SamplingConfig
from sidecar.errors import InvalidArgument, ResourceExhausted, SidecarError

from support.no_early_stop import engine_eog_ids, engine_sampling
from support.engines import open_engine


@pytest.fixture(scope="module")
def engine(smollm2_path) -> Iterator[Engine]:
    with open_engine(smollm2_path, n_seq=2, threads_decode=1, threads_prefill=1, max_sessions=2, max_prompt_tokens=200) as e:
        yield e


class Outcome:
    def __init__(self, engine: Engine, spec: GenerationSpec) -> None:
        self.deltas: list[TextDelta] = []
        self.end: object = None
        self.done = threading.Event()
        engine.submit(spec, self._sink)

    def _sink(self, event: object) -> None:
        if isinstance(event, TextDelta):
            self.deltas.append(event)
        else:
            self.end = event
            self.done.set()

    def wait(self) -> object:
        assert self.done.wait(120), "the engine never ended the request"
        return self.end

    @property
    def tokens(self) -> int:
        return sum(len(d.token_ids) for d in self.deltas)


def spec(grammar: str | None, temperature: float, **kwargs) -> GenerationSpec:
    return GenerationSpec(prompt=Prompt(messages=(("user", "Say something."),)), max_tokens=kwargs.pop("max_tokens", 16),
                          sampling=kwargs.pop("sampling", SamplingConfig(temperature=temperature, seed=7)),
                          grammar=grammar, **kwargs)


def beside(engine: Engine, bad: GenerationSpec) -> tuple[Outcome, Outcome]:
    """`bad` submitted while a long reply streams (its end tokens banned: it runs to max_tokens)."""
    sampling = engine_sampling(SamplingConfig(temperature=0.7, seed=3), engine_eog_ids(engine))
    neighbour = Outcome(engine, spec(None, 0.7, max_tokens=48, sampling=sampling))
    while not neighbour.deltas and not neighbour.done.is_set():
        neighbour.done.wait(0.01)
    return neighbour, Outcome(engine, bad)


@pytest.mark.parametrize("temperature", [0.0, 0.7])
@pytest.mark.parametrize("grammar, tokens_first", [
    (r'root ::= [^\x00-\U0010FFFF]', False),  # no character at all
    ('root ::= "\\x00"', False),  # a character no token spells
    ("root ::= <[999999]>", False),  # a token id past the vocabulary
    (r'root ::= "Well" [^\x00-\U0010FFFF]', True),  # a dead end part-way
])
def test_a_grammar_that_leaves_no_token_ends_its_request_only(engine: Engine, grammar: str, tokens_first: bool,
                                                              temperature: float) -> None:
    neighbour, bad = beside(engine, spec(grammar, temperature))
    error = bad.wait()
    assert isinstance(error, InvalidArgument) and "leaves no token" in str(error), error
    assert (bad.tokens > 0) == tokens_first
    final = neighbour.wait()
    assert isinstance(final, Finished) and final.reason is FinishReason.LENGTH, final
    assert neighbour.tokens == 48


def test_a_banned_token_the_grammar_needs_ends_the_request(engine: Engine) -> None:
    q = engine.call_model(lambda m: m.tokenize("Q", False, False)).result(60)
    assert len(q) == 1
    banned = SamplingConfig(temperature=0.0, logit_bias=((q[0], -100.0),))
    neighbour, bad = beside(engine, spec('root ::= "Q"', 0.0, sampling=banned))
    error = bad.wait()
    assert isinstance(error, InvalidArgument) and "logit_bias" in str(error), error
    assert isinstance(neighbour.wait(), Finished)


def test_a_banned_token_the_grammar_forces_later_is_never_jumped_over(engine: Engine) -> None:
    """Jump-forward appends forced tokens without sampling them: a banned one among them was
    written all the same. Now the jump stops before it, and the sampler says what is wrong."""
    q = engine.call_model(lambda m: m.tokenize("Q", False, False)).result(60)
    banned = SamplingConfig(temperature=0.0, logit_bias=((q[0], -100.0),))
    bad = Outcome(engine, spec('root ::= "Well met" "Q"', 0.0, sampling=banned))
    error = bad.wait()
    assert isinstance(error, InvalidArgument) and "logit_bias" in str(error), error
    assert "Q" not in "".join(d.text for d in bad.deltas)


def test_a_grammar_whose_work_per_token_explodes_is_ended_not_run(engine: Engine) -> None:
    # A JSON-schema pattern's nested repetitions as the converter writes them: inside every written
    # bound, a second for the first token on this CPU and minutes for the next (issue 36, P2).
    from sidecar.native.grammar import json_schema_grammar

    grammar = json_schema_grammar('{"type": "string", "pattern": "^(a{0,1000}){0,1000}$"}')
    neighbour, bad = beside(engine, spec(grammar, 0.7, max_tokens=32))
    error = bad.wait()
    assert isinstance(error, ResourceExhausted) and "grammar's work on one token" in str(error), error
    assert isinstance(neighbour.wait(), Finished) and neighbour.tokens == 48


def test_a_grammar_that_holds_still_runs_to_its_end(engine: Engine) -> None:
    final = Outcome(engine, spec('root ::= "Aye" | "Nay"', 0.0)).wait()
    assert isinstance(final, Finished) and not isinstance(final, SidecarError)
    assert final.reason is FinishReason.STOP


def _token(engine: Engine, text: str) -> int:
    tokens = engine.call_model(lambda m: m.tokenize(text, False, False)).result(60)
    assert len(tokens) == 1, f"{text!r} is {len(tokens)} tokens in this vocabulary"
    return tokens[0]


def test_a_repeated_token_reference_runs_where_the_tokenizer_would_split_it_otherwise(engine: Engine) -> None:
    # "!!!!!" as the tokenizer writes it is "!!" "!!" "!": jump-forward fed that split to the
    # grammar, which wants token "!" five times, and llama.cpp's exception ended the process.
    bang = _token(engine, "!")
    neighbour, outcome = beside(engine, spec(f"root ::= <[{bang}]>{{5}}", 0.0))
    final = outcome.wait()
    assert isinstance(final, Finished) and final.reason is FinishReason.STOP, final
    assert [t for d in outcome.deltas for t in d.token_ids] == [bang] * 5
    assert isinstance(neighbour.wait(), Finished) and neighbour.tokens == 48


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_a_token_the_grammar_allows_but_cannot_accept_ends_its_request_only(engine: Engine, temperature: float) -> None:
    # `"!" <[id of "!!"]>` with "!" banned: llama.cpp's apply allows "!!" first, its accept throws.
    bang, double = _token(engine, "!"), _token(engine, "!!")
    sampling = SamplingConfig(temperature=temperature, seed=7, logit_bias=((bang, -100.0),))
    neighbour, bad = beside(engine, spec(f'root ::= "!" <[{double}]>', temperature, sampling=sampling))
    error = bad.wait()
    assert isinstance(error, InvalidArgument) and "token reference" in str(error), error
    assert isinstance(neighbour.wait(), Finished) and neighbour.tokens == 48
