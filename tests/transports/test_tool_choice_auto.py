"""tool_choice "auto" answers in words unless the reply opens a call (issue 36, item 7).

Before, auto's grammar held every reply to JSON, {"name": ...} or {"reply": ...}, and SmolLM2
called a function for "Hello, who are you?" in most replies (bench/run.py tool-choice: 1 of 9
unrelated prompts in words at temperature 0, 6 of 27 at 0.7; llama-server: all). What a tiny
model chooses is not asserted here: the grammar and the prompt are. The grammar is walked token by
token on the model's vocabulary, as the sampler applies it.
"""

from __future__ import annotations

import json

import llama_cpp
import numpy as np
import pytest

from sidecar.api import pb
from sidecar.native.grammar import json_schema_grammar
from sidecar.native.model import NativeModel
from sidecar.native.token_candidates import TokenCandidates
from sidecar.service import convert, tool_calls

GIVE = tool_calls.Function("give_item", "Hand an item to the player.", {
    "type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"], "additionalProperties": False})
WAVE = tool_calls.Function("wave", "Wave at the player.")
CALL = '{"name":"give_item","arguments":{"item":"ale"}}'


@pytest.fixture(scope="module")
def model(smollm2_path) -> NativeModel:
    loaded = NativeModel(smollm2_path)
    yield loaded
    loaded.close()


def admits(model: NativeModel, grammar: str, text: str) -> bool:
    """Whether `grammar` lets a reply be exactly `text` (its tokens one by one, then the end)."""
    sampler = llama_cpp.llama_sampler_init_grammar(model.vocab, grammar.encode(), b"root")
    assert sampler, "llama.cpp could not parse the grammar"
    candidates = TokenCandidates(model.n_vocab)
    end = llama_cpp.llama_vocab_eos(model.vocab)
    try:
        for token in [*model.tokenize(text, add_bos=False, parse_special=False), end]:
            candidates.fill_ids(np.array([token], dtype=np.int32))
            candidates.apply(sampler)
            if candidates.allowed_ids().size == 0:
                return False
            if token != end:
                llama_cpp.llama_sampler_accept(sampler, token)
        return True
    finally:
        llama_cpp.llama_sampler_free(sampler)


def auto_grammar(parallel: bool = False) -> str:
    plan = tool_calls.plan([GIVE, WAVE], "auto", parallel)
    return tool_calls.call_or_words_grammar(json_schema_grammar(plan.json_schema), parallel)


def test_auto_admits_plain_words_and_holds_a_reply_that_opens_a_call_to_the_calls(model: NativeModel) -> None:
    grammar = auto_grammar()
    for words in ("Hello, I am Mira. What can I get you?", " Evening!", "[laughs] 2+2 is 4.\nAnything else?"):
        assert admits(model, grammar, words), words
    assert admits(model, grammar, CALL) and admits(model, grammar, '{"name":"wave","arguments":{}}')
    # Opened with `{`, the reply is a call of a declared function, whole: no JSON words (the old
    # {"reply": ...}), no other function, nothing after it.
    # A function declared without parameters takes none: its arguments are {}.
    for not_a_call in ('{"reply":"Hello"}', '{"name":"dance","arguments":{}}', CALL + " Here you go.",
                       '{"name":"wave","arguments":{"target":"thief"}}'):
        assert not admits(model, grammar, not_a_call), not_a_call
    assert not admits(model, grammar, "")  # something is said: no empty reply


def test_with_parallel_calls_a_reply_opening_with_a_bracket_is_calls(model: NativeModel) -> None:
    grammar = auto_grammar(parallel=True)
    assert admits(model, grammar, f'[{CALL},{{"name":"wave","arguments":{{}}}}]')
    assert admits(model, grammar, CALL) and admits(model, grammar, "Here you are.")
    assert not admits(model, grammar, "[laughs] Here you are.")


def test_required_and_named_still_admit_only_calls(model: NativeModel) -> None:
    for choice in ("required", "give_item"):
        spec = convert.generation_spec_from_pb(request(choice))
        assert admits(model, spec.grammar, CALL) and not admits(model, spec.grammar, "Here you are."), choice


def request(choice: str, **kwargs) -> pb.GenerateRequest:
    tools = [pb.Tool(name=f.name, description=f.description,
                     parameters_json_schema=json.dumps(f.parameters) if f.parameters else "") for f in (GIVE, WAVE)]
    return pb.GenerateRequest(messages=pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="Hi")]),
                              tools=tools, tool_choice=choice, **kwargs)


def test_the_request_spec_carries_the_words_or_call_grammar_and_no_schema_for_a_remote_server() -> None:
    spec = convert.generation_spec_from_pb(request("auto"))
    assert spec.grammar == auto_grammar() and spec.json_schema == ""
    # Remote mode compiles nothing: the server gets the instructions and no JSON schema (words are
    # not JSON), and its reply is a call only when it is one of a declared function.
    remote = convert.generation_spec_from_pb(request("auto"), compile_grammar=False)
    assert remote.grammar is None and remote.json_schema == ""
    assert tool_calls.read_reply('{"name":"dance","arguments":{}}', ("give_item", "wave")).calls == ()
    assert tool_calls.read_reply(CALL, ("give_item", "wave")).calls == (tool_calls.Call("give_item", {"item": "ale"}),)
    required = convert.generation_spec_from_pb(request("required"), compile_grammar=False)
    assert json.loads(required.json_schema)["anyOf"][0]["properties"]["name"] == {"const": "give_item"}


def test_the_instructions_list_the_functions_as_json_and_make_words_the_usual_reply() -> None:
    auto = tool_calls.plan([GIVE, WAVE], "auto").instructions
    required = tool_calls.plan([GIVE, WAVE], "required").instructions
    for text in (auto, required):
        listed = json.loads(text.split("\n")[1])
        assert [f["name"] for f in listed] == ["give_item", "wave"]
        assert listed[0]["parameters"] == GIVE.parameters and listed[1]["parameters"] == tool_calls.NO_PARAMETERS
    # Auto calls only for what a function does and otherwise answers in words; no key for words
    # and no placeholder to copy (issue 28's "<your answer>").
    assert "When the user asks for something one of them does" in auto and auto.endswith("Otherwise answer in words.")
    assert "words" not in required and '"reply"' not in auto and "<" not in auto
