"""logit_bias, token log probabilities, candidates sharing one prompt, and the calls on the model
(tokenize, detokenize, embed), on the real engine with the real small model. Every assertion is
about the mechanism (a banned token never appears, probabilities are probabilities, the prompt is
computed once), never about what the model says."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import pytest

from sidecar.backend.requests import TextDelta
from sidecar.engine import Engine, GenerationSpec, Prompt, SamplingConfig
from sidecar.errors import InvalidArgument

from support.no_early_stop import engine_bias, engine_eog_ids, engine_sampling
from support.engines import Stream, open_engine, run

GREEDY = SamplingConfig(temperature=0.0, repeat_penalty=1.0)


@pytest.fixture(scope="module")
def engine(smollm2_path) -> Iterator[Engine]:
    with open_engine(smollm2_path, n_ctx=2048, n_seq=4, max_sessions=4, max_prompt_tokens=1000) as e:
        yield e


def tokens_of(deltas: list[TextDelta]) -> list[int]:
    return [t for d in deltas for t in d.token_ids]


def call(engine: Engine, run_on_model):
    return engine.call_model(run_on_model).result(timeout=60)


ASK = Prompt(messages=(("user", "Say hello to the blacksmith in one sentence."),))


def test_a_banned_token_never_appears_and_the_reply_goes_on_without_it(engine: Engine) -> None:
    # The end-of-generation tokens banned in both: each reply has tokens, whatever the model says.
    eog = engine_eog_ids(engine)
    deltas, _ = run(engine, GenerationSpec(prompt=ASK, sampling=engine_sampling(GREEDY, eog), max_tokens=8))
    first = tokens_of(deltas)[0]
    biased = SamplingConfig(temperature=0.0, repeat_penalty=1.0, logit_bias=tuple(sorted(engine_bias(eog) + ((first, -100.0),))))
    deltas, final = run(engine, GenerationSpec(prompt=ASK, sampling=biased, max_tokens=8))
    assert first not in tokens_of(deltas) and final.usage.completion_tokens > 0


def test_a_positive_bias_makes_a_token_win(engine: Engine) -> None:
    target = call(engine, lambda m: m.tokenize(" Dragon", False, False))[0]
    biased = SamplingConfig(temperature=0.0, repeat_penalty=1.0, logit_bias=((target, 100.0),))
    deltas, _ = run(engine, GenerationSpec(prompt=ASK, sampling=biased, max_tokens=3))
    assert tokens_of(deltas)[0] == target


def test_a_bias_on_a_token_outside_the_vocabulary_is_refused(engine: Engine) -> None:
    biased = SamplingConfig(logit_bias=((engine.limits.vocabulary, 5.0),))
    with pytest.raises(InvalidArgument, match="vocabulary"):
        run(engine, GenerationSpec(prompt=ASK, sampling=biased, max_tokens=3))
    with pytest.raises(InvalidArgument, match="between -100 and 100"):
        SamplingConfig(logit_bias=((1, 101.0),))
    with pytest.raises(InvalidArgument):
        SamplingConfig(logit_bias=((1, math.nan),))


def test_logprobs_come_one_per_token_and_are_log_probabilities(engine: Engine) -> None:
    deltas, final = run(engine, GenerationSpec(prompt=ASK, sampling=GREEDY, max_tokens=12, logprobs=3))
    entries = [e for d in deltas for e in d.logprobs]
    assert [e.chosen.token_id for e in entries] == tokens_of(deltas)
    assert len(entries) == final.usage.completion_tokens
    for e in entries:
        assert e.chosen.logprob <= 0.0 and len(e.top) == 3
        values = [t.logprob for t in e.top]
        assert values == sorted(values, reverse=True)
        assert sum(math.exp(v) for v in values) <= 1.0 + 1e-4
        # Greedy picks the likeliest token: it is the first alternative.
        assert e.top[0].token_id == e.chosen.token_id


def test_without_logprobs_none_are_computed(engine: Engine) -> None:
    deltas, _ = run(engine, GenerationSpec(prompt=ASK, sampling=GREEDY, max_tokens=4))
    assert all(d.logprobs == () for d in deltas)


def test_candidates_of_one_prompt_compute_it_once(engine: Engine) -> None:
    persona = ("You are Brann, the blacksmith of Oakvale. You speak in short, gruff sentences, you love your "
               "forge, and you distrust the mages of the tower. ") * 3
    prompt = Prompt(messages=(("system", persona), ("user", "What do you sell?")))
    sampling = SamplingConfig(temperature=0.9, seed=7)
    specs = [GenerationSpec(prompt=prompt, sampling=sampling, max_tokens=6, shares_prompt=True) for _ in range(3)]
    streams = [Stream() for _ in specs]
    for spec, stream in zip(specs, streams):
        engine.submit(spec, stream)
    finals = [stream.result() for stream in streams]
    prompt_tokens = finals[0].usage.prompt_tokens
    computed = sum(f.usage.prompt_tokens - f.usage.cached_prompt_tokens for f in finals)
    # Once, and the one token each candidate computes after the shared cut for its own logits.
    assert computed <= prompt_tokens + len(finals), (computed, prompt_tokens)


def test_tokenize_and_detokenize_round_trip(engine: Engine) -> None:
    text = "Hello, traveller! The forge is hot today."
    tokens = call(engine, lambda m: m.tokenize(text, False, False))
    assert tokens and call(engine, lambda m: m.detokenize(tokens)) == text
    with pytest.raises(InvalidArgument, match="vocabulary"):
        call(engine, lambda m: m.detokenize([engine.limits.vocabulary + 5]))
    special = call(engine, lambda m: m.tokenize("<|im_end|>", False, True))
    assert len(special) == 1 and len(call(engine, lambda m: m.tokenize("<|im_end|>", False, False))) > 1


def test_embeddings_are_unit_vectors_and_rank_a_paraphrase_first(engine: Engine) -> None:
    lines = ["The player gave the blacksmith a silver ring.",
             "The traveller handed the smith a ring made of silver.",
             "Rain fell over the harbour all night."]
    vectors, tokens = call(engine, lambda m: m.embed(lines))
    v = np.array(vectors)
    assert v.shape[0] == 3 and tokens > 0
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-4)
    assert v[0] @ v[1] > v[0] @ v[2]
    again, _ = call(engine, lambda m: m.embed(lines[:1]))
    assert np.allclose(again[0], vectors[0], atol=1e-3)  # one input, alone or in a list
    with pytest.raises(InvalidArgument, match="empty"):
        call(engine, lambda m: m.embed([""]))


def test_generation_goes_on_while_embeddings_are_asked_for(engine: Engine) -> None:
    stream = Stream()
    engine.submit(GenerationSpec(prompt=ASK, sampling=GREEDY, max_tokens=24), stream)
    for _ in range(5):
        call(engine, lambda m: m.embed(["a short line"]))
    stream.result()
