"""Jump-forward decoding (issue 40): text a grammar forces is fed in one pass, and the reply stays
what the grammar accepts. On the real engine and model; what the model chooses for a value is never
asserted, only that every reply parses, fits its schema, and that forced text was jumped.

Where jump-forward and plain constrained decoding may part: the forced text is the same, but it is
tokenized as the tokenizer writes it rather than as the model would have picked its tokens one at a
time, and the values the model then chooses are conditioned on those tokens (jump_forward.py). So
with greedy sampling the keys and structure are compared, not the values.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Iterator

import jsonschema
import pytest

from sidecar.backend.requests import TextDelta
from sidecar.engine import Engine, Finished, FinishReason, GenerationSpec, Prompt, SamplingConfig
from sidecar.engine.scheduling.step import SequenceDemand, plan_step
from sidecar.errors import ResourceExhausted
from sidecar.native.grammar import json_schema_grammar

from support.engines import open_engine

GREEDY = SamplingConfig(temperature=0.0, repeat_penalty=1.0)
ITEM = {"type": "string", "maxLength": 16}
SCHEMAS = {
    "give_item": {"type": "object", "properties": {
        "name": {"const": "give_item"},
        "arguments": {"type": "object", "properties": {"item": ITEM, "count": {"type": "integer"}},
                      "required": ["item", "count"]}}, "required": ["name", "arguments"]},
    "one of three tools": {"anyOf": [
        {"type": "object", "properties": {"name": {"const": "attack"}, "arguments": {
            "type": "object", "properties": {"target": ITEM, "weapon": ITEM, "power": {"type": "integer"}},
            "required": ["target", "weapon", "power"]}}, "required": ["name", "arguments"]},
        {"type": "object", "properties": {"name": {"const": "trade"}, "arguments": {
            "type": "object", "properties": {"give": ITEM, "take": ITEM, "price": {"type": "number"}, "haggle": {"type": "boolean"}},
            "required": ["give", "take", "price", "haggle"]}}, "required": ["name", "arguments"]},
        {"type": "object", "properties": {"name": {"const": "follow"}, "arguments": {
            "type": "object", "properties": {"who": ITEM, "distance": {"type": "integer"}},
            "required": ["who", "distance"]}}, "required": ["name", "arguments"]}]},
    "npc state": {"type": "object", "properties": {
        "mood": {"enum": ["calm", "angry", "afraid"]}, "trust": {"type": "integer"}, "quest": ITEM,
        "gold": {"type": "integer"}, "hostile": {"type": "boolean"}, "line": ITEM},
        "required": ["mood", "trust", "quest", "gold", "hostile", "line"]},
}


@pytest.fixture(scope="module")
def engine(smollm2_path) -> Iterator[Engine]:
    with open_engine(smollm2_path, n_ctx=2048, n_seq=4, max_sessions=4, max_prompt_tokens=500) as e:
        yield e


def run(engine: Engine, spec: GenerationSpec, *, jump: bool = True) -> tuple[str, Finished]:
    engine.config = dataclasses.replace(engine.config, jump_forward=jump)
    deltas: list[str] = []
    ended: list[object] = []
    done = threading.Event()

    def sink(event: object) -> None:
        if isinstance(event, TextDelta):
            deltas.append(event.text)
        else:
            ended.append(event)
            done.set()

    engine.submit(spec, sink)
    assert done.wait(120), "the engine never finished the request"
    assert isinstance(ended[0], Finished), ended[0]
    return "".join(deltas), ended[0]


def ask(text: str, **kwargs) -> GenerationSpec:
    kwargs.setdefault("sampling", GREEDY)
    kwargs.setdefault("max_tokens", 120)
    return GenerationSpec(prompt=Prompt(messages=(("user", text),)), **kwargs)


def test_forced_tokens_of_a_decoding_sequence_go_in_one_pass() -> None:
    demands = [SequenceDemand(0, (5, 6, 7, 8), 10, True), SequenceDemand(1, (9,), 4, True),
               SequenceDemand(2, (1, 2, 3), 0, False)]
    plan = plan_step(demands, n_batch=6)
    assert dict(plan.fed) == {0: 4, 1: 1, 2: 1}  # every sampled token first, then forced ones, then prompts
    assert dict(plan.logits_at) == {0: 3, 1: 4}  # sequence 0 samples after its last forced token
    cut = plan_step(demands, n_batch=3)
    assert dict(cut.fed) == {0: 2, 1: 1} and dict(cut.logits_at) == {1: 2}  # cut short: no logits mid-jump


def test_a_wholly_forced_reply_takes_one_pass_after_its_first_token(engine: Engine) -> None:
    line = "Well met, traveller. The forge is hot and the iron is ready."
    spec = ask("Greet me.", grammar=f'root ::= "{line}"')
    text, final = run(engine, spec)
    assert text == line and final.reason is FinishReason.STOP
    assert final.usage.forced_tokens >= final.usage.completion_tokens - 2, final.usage
    text, plain = run(engine, spec, jump=False)
    assert text == line and plain.usage.forced_tokens == 0


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_replies_under_a_schema_parse_and_fit_it(engine: Engine, name: str) -> None:
    schema = SCHEMAS[name]
    spec = ask("Act now, as the smith of Oakvale would.", grammar=json_schema_grammar(json.dumps(schema)))
    jumped, final = run(engine, spec)
    jsonschema.validate(json.loads(jumped), schema)
    assert final.usage.forced_tokens > 0 and final.reason is FinishReason.STOP
    plain, _ = run(engine, spec, jump=False)
    jsonschema.validate(json.loads(plain), schema)
    if "anyOf" not in schema:  # which tool the model picks is its choice; the keys of one are fixed
        assert list(json.loads(jumped)) == list(json.loads(plain))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sampled_replies_parse_and_fit_too(engine: Engine, seed: int) -> None:
    schema = SCHEMAS["one of three tools"]
    spec = ask("Do something.", grammar=json_schema_grammar(json.dumps(schema)),
               sampling=SamplingConfig(temperature=0.9, seed=seed))
    text, final = run(engine, spec)
    jsonschema.validate(json.loads(text), schema)



def test_a_replys_forced_start_goes_in_with_its_prompt(engine: Engine, monkeypatch) -> None:
    """`{"name":"give_item","arguments":{"item":"` is forced before the model's first choice: it
    goes into the prompt's pass, not a pass of its own after a sampled `{`; it is the reply's (sent,
    counted as completion and forced tokens), not the prompt's; and a repeat of the request finds
    it in the cache with the prompt."""
    passes: list[list] = []
    decode = engine.ctx.decode
    monkeypatch.setattr(engine.ctx, "decode", lambda entries: (passes.append(list(entries)), decode(entries))[1])
    spec = ask("Hand the traveller the spare hammer.", grammar=json_schema_grammar(json.dumps(SCHEMAS["give_item"])))
    text, final = run(engine, spec)
    jsonschema.validate(json.loads(text), SCHEMAS["give_item"])
    assert text.startswith('{"name":"give_item","arguments":{"item":'), text
    computed = final.usage.prompt_tokens - final.usage.cached_prompt_tokens
    opening = len(passes[0]) - computed
    assert opening >= 5, (len(passes[0]), final.usage)  # the forced start, in some tokens, after the prompt
    assert final.usage.forced_tokens >= opening
    passes.clear()
    again_text, again = run(engine, spec)
    assert again.usage.cached_prompt_tokens == again.usage.prompt_tokens  # capped: the cached opening is the reply's
    assert len(passes[0]) == 1 and again_text.startswith('{"name":"give_item"')  # the last forced token, for its logits
    passes.clear()
    _, plain = run(engine, spec, jump=False)
    assert plain.usage.prompt_tokens == final.usage.prompt_tokens  # the opening is not prompt
    assert plain.usage.forced_tokens == 0 and len(passes[0]) <= computed  # token by token: the prompt alone

def test_a_stop_string_or_the_length_inside_forced_text_ends_the_reply_there(engine: Engine) -> None:
    grammar = 'root ::= "Hello world, traveller, and welcome to the forge."'
    text, final = run(engine, ask("Hi", grammar=grammar, stop=("traveller",)))
    assert final.reason is FinishReason.STOP_STRING and text == "Hello world, "
    text, final = run(engine, ask("Hi", grammar=grammar, max_tokens=3))
    assert final.reason is FinishReason.LENGTH and final.usage.completion_tokens == 3


def test_a_session_goes_on_after_a_jumped_reply(engine: Engine) -> None:
    """The KV holds exactly the tokens the engine thinks it does: the next turn reuses it."""
    schema = SCHEMAS["give_item"]
    first = ask("Give me a sword.", grammar=json_schema_grammar(json.dumps(schema)), session_id="smith")
    text, final = run(engine, first)
    jsonschema.validate(json.loads(text), schema)
    _, second = run(engine, ask("And a shield?", session_id="smith", max_tokens=4))
    assert second.usage.cached_prompt_tokens > final.usage.prompt_tokens


def test_without_jump_forward_no_token_is_forced(engine: Engine) -> None:
    spec = ask("Act.", grammar=json_schema_grammar(json.dumps(SCHEMAS["npc state"])))
    _, final = run(engine, spec, jump=False)
    assert final.usage.forced_tokens == 0


def test_forced_tokens_do_not_count_for_the_repeat_penalty(engine: Engine) -> None:
    """A penalty keeps the model from repeating its own choices; forced text is none. Six forced
    " sword"s, then a free choice of " sword" (biased +40) or " shield" (+30), under a penalty of
    10: jumped, the six are not counted and " sword" keeps its lead; token by token each of them
    was sampled and counted, and the penalty divides " sword"'s logit by 10."""
    sword, shield = (engine.model.tokenize(w, add_bos=False, parse_special=False) for w in (" sword", " shield"))
    assert len(sword) == 1 and len(shield) == 1, (sword, shield)
    penalized = SamplingConfig(temperature=0.0, repeat_penalty=10.0, logit_bias=((sword[0], 40.0), (shield[0], 30.0)))
    spec = ask("What do you sell?", grammar='root ::= "Take" " sword sword sword sword sword sword" (" sword" | " shield")',
               sampling=penalized)
    jumped, final = run(engine, spec)
    assert final.usage.forced_tokens >= 6, final.usage
    assert jumped.endswith("sword sword sword sword sword sword sword"), jumped
    plain, _ = run(engine, spec, jump=False)
    assert plain.endswith("sword sword sword sword sword sword shield"), plain  # the penalty is real


@pytest.mark.parametrize("sampling", [GREEDY, SamplingConfig(temperature=0.0)], ids=["greedy", "greedy, penalties"])
def test_the_grammar_shortlist_chooses_as_the_whole_vocabulary_mask(engine: Engine, monkeypatch, sampling) -> None:
    """sample() asks the grammar about the 256 likeliest tokens before masking all 49k; under
    greedy its choice must be the full mask's. Same engine, threads and pass layout (jump-forward
    off both times, the prompt cached both times), so the logits are the same: the texts must be."""
    from sidecar.engine import sampler_chain

    spec = ask("Act now.", grammar=json_schema_grammar(json.dumps(SCHEMAS["one of three tools"])), sampling=sampling)
    run(engine, spec, jump=False)  # the prompt cached for both runs below
    shortlisted, _ = run(engine, spec, jump=False)
    monkeypatch.setattr(sampler_chain.SamplerChain, "_sample_shortlist", lambda self, ctx, index: None)
    masked, _ = run(engine, spec, jump=False)
    assert shortlisted == masked


def test_the_jumps_grammar_work_counts_against_the_per_token_limit(engine: Engine, monkeypatch) -> None:
    """The jump asks a copy of the grammar about every byte, a cost that grows with the grammar's
    stacks as sampling's does: past GRAMMAR_TOKEN_LIMIT_MS that request ends, as when sampling
    costs that much. A nested repetition's cost depends on the CPU, so the slow grammar here is a
    probe that spins (a stand-in for llama.cpp's grammar work, which cannot be made slow on cue)."""
    import time

    from sidecar.engine.jump_forward import ForcedText
    from sidecar.engine.sampler_chain import GRAMMAR_TOKEN_LIMIT_MS

    real = ForcedText.forced_bytes

    def slow(self, grammar):
        spin_until = time.thread_time() + 1.5 * GRAMMAR_TOKEN_LIMIT_MS / 1000.0
        while time.thread_time() < spin_until:
            pass
        return real(self, grammar)

    monkeypatch.setattr(ForcedText, "forced_bytes", slow)
    ended: list[object] = []
    done = threading.Event()
    engine.config = dataclasses.replace(engine.config, jump_forward=True)
    engine.submit(ask("Act.", grammar=json_schema_grammar(json.dumps(SCHEMAS["npc state"]))),
                  lambda event: (ended.append(event), done.set()) if not isinstance(event, TextDelta) else None)
    assert done.wait(120)
    assert isinstance(ended[0], ResourceExhausted) and "work on one token" in str(ended[0]), ended[0]
    monkeypatch.setattr(ForcedText, "forced_bytes", real)
    text, _ = run(engine, ask("Act.", grammar=json_schema_grammar(json.dumps(SCHEMAS["npc state"]))))
    jsonschema.validate(json.loads(text), SCHEMAS["npc state"])  # the engine goes on
