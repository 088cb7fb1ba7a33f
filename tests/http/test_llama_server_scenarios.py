"""llama.cpp's own server test suite (tools/server/tests/unit in the vendored llama.cpp of
llama-cpp-python 0.3.36), the part that concerns what issue 28 added, rewritten as scenarios against
this daemon: a plugin moving from llama-server should see the same behaviour. Written from the
scenarios, not copied. Each test names the llama.cpp test it ports (file::test). Where llama.cpp
asserts what its test model writes, these assert what the request's controls guarantee (a
grammar's reply, a banned token never chosen, n choices, one log probability per token, unit
vectors); the model's words are never asserted. Where llama-server and the OpenAI API reference
differ, the test holds the daemon to the OpenAI reference (and says so).

The scenarios are in three files, each with its own daemon: this one (the routes, model names,
n, logprobs, logit_bias, grammars and token-id prompts), test_llama_server_vectors.py
(test_embedding and test_tokenize) and test_llama_server_tools.py (test_tool_call); the
daemon, the reference tokenizer and the request helpers are llama_server_support.py's.

Ported (llama.cpp test -> test here):
- test_basic: test_server_start_simple, test_server_models (-> the routes without /v1),
  test_server_props (its model_path, total_slots, default_generation_settings.n_ctx)
- test_chat_completion: test_chat_completion and test_chat_completion_stream (their routes
  without /v1 and the reply's shape), test_chat_completion_with_openai_library (any model name),
  test_chat_completions_multiple_choices (n=2, twice), test_logprobs, test_logprobs_stream,
  test_logit_bias, test_completion_with_grammar, test_completion_with_invalid_grammar,
  test_completion_with_json_schema, test_completion_with_response_format (the OpenAI forms)
- test_completion: test_completion_with_openai_library (any model name),
  test_completion_with_tokens_input (on /v1/completions: token ids, a list of them, ids beside
  text), test_n_probs and test_n_probs_stream (as /v1/completions' `logprobs`), test_logit_bias
  (token ids in OpenAI's map)
- test_embedding: test_embedding_single, test_embedding_multiple, test_embedding_mixed_input (the
  OpenAI forms: a text, texts, token ids, lists of token ids; "" refused), test_embedding_invalid_input,
  test_embedding_openai_library_single, test_embedding_openai_library_multiple,
  test_embedding_error_prompt_too_long, test_same_prompt_give_same_result (and alone against in a
  batch), test_embedding_usage_single, test_embedding_usage_multiple,
  test_embedding_openai_library_base64, test_embedding_pooling_mean (the daemon's pooling)
- test_tokenize: test_tokenize_detokenize, test_tokenize_with_bos, test_tokenize_with_pieces (and
  the special tokens, parse_special)
- test_tool_call: do_test_completion_with_required_tool_tiny (TEST_TOOL, PYTHON_TOOL; whole and
  streamed), test_completion_without_tool_call_fast (no tools; TEST_TOOL under auto, greedy: the
  one scenario here that rests on the model's choice, by a wide margin; tool_choice "none"),
  do_test_calc_result (an earlier call and its result sent back; here also two calls in one
  assistant message)

Not ported:
- the model's words: test_chat_completion's and test_completion's regexes and exact token counts
  (69, 77, ... prompt tokens of llama.cpp's tinyllama with its templates), test_load_split_model,
  test_weather, test_calc_result's "0.56", test_hello_world, test_completion_with_required_tool_real_model
  (downloads 1-8 B models), test_completion_without_tool_call_slow, because
  tests here hold on any machine and SmolLM2 is not llama.cpp's test model
- llama-server-only extensions: /completion (singular) and its n_predict, n_probs,
  completion_probabilities, post_sampling_probs, backend_sampling, return_tokens, response_fields,
  timings, generation_settings, stop_type (test_completion, test_completion_stream, test_n_probs*,
  test_completion_response_fields); logit_bias as [[token, bias]] pairs or keyed by text
  (test_logit_bias's other three forms; OpenAI's logit_bias maps token ids); a prompt mixing ids
  and text in one sequence and {"prompt_string": ...} / multimodal_data prompt objects
  (test_completion_with_tokens_input's last cases, test_json_prompt_*); embedding inputs as
  {"content": [...]} objects or text and ids mixed in one list (test_embedding_mixed_input's object
  and mixed cases, test_embedding_content_text_same_as_string: refused here, as OpenAI refuses
  them); response_format json_object with a "schema" inside (test_completion_with_response_format's
  first two cases and its invalid "schema" cases); system_fingerprint "b<build>"; /slots
  (test_server_slots, test_completion_parallel_slots, test_cancel_request, id_slot); /infill;
  /rerank; /metrics; /apply-template and the chat template's rendered prompt ("__verbose",
  test_chat_template*, test_verbose_debug); /chat/completions/input_tokens; return_progress;
  timings_per_token; reasoning (test_thoughts); --pooling last/none and /embeddings' per-token
  vectors (test_embedding_pooling_none, test_embedding_pooling_none_oai; the daemon pools by mean,
  and /embeddings is /v1/embeddings without the prefix); model aliases and tags; the web UI
  (test_no_ui); several listening addresses (test_server_multiple_addresses); flash attention
  and unified-KV builds (test_embedding_multiple_with_fa, test_completion_unified), because the
  daemon does not serve them
- outside issue 28's features, covered by the other HTTP API tests: the cached-token counts
  (test_chat_completion_cached_tokens), invalid message lists (test_invalid_chat_completion_req),
  context overflow (test_context_size_exceeded*: OpenAI's context_length_exceeded, in
  test_openai_http_parity.py), seeds and batch sizes (test_consistent_result_*,
  test_different_result_different_seed), the prompt cache (test_completion_prompt_cache),
  assistant prefill and continue_final_message
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import httpx
import openai
import pytest

from support.daemons import RunningDaemon
from support.llama_server_support import BOOK, CODING, GREEDY, LIMIT, MEANING, joined, refused, sse
from support.llama_server_support import api, model, no_eog, vocab  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow
# The words llama.cpp's test_logit_bias bans, each as a token with its leading space.
EXCLUDE = ["i", "I", "the", "The", "to", "a", "an", "be", "is", "was", "but", "But", "and", "And", "so", "So", "you",
           "You", "he", "He", "she", "She", "we", "We", "they", "They", "it", "It", "his", "His", "her", "Her", "book", "Book"]


# -- test_basic: the routes without /v1 -----------------------------------------------------------


def test_health_and_models_without_v1(raw: httpx.Client, base: str, model: str) -> None:
    """test_basic::test_server_start_simple, ::test_server_models: GET /health and GET /models."""
    health = httpx.get(f"{base}/health")  # no token: a launcher polls it
    assert health.status_code == 200 and health.json()["status"] == "ok"
    listed = raw.get("/models").json()
    assert listed["object"] == "list" and [m["id"] for m in listed["data"]] == [model]
    assert raw.get("/v1/models").json()["data"] == listed["data"]


def test_props(raw: httpx.Client, model: str) -> None:
    """test_basic::test_server_props: the model file, the slots and a conversation's context."""
    props = raw.get("/props").json()
    assert props["model_path"].endswith(".gguf") and Path(props["model_path"]).is_file()
    assert props["total_slots"] >= 1 and props["default_generation_settings"]["n_ctx"] > 0
    assert props["model_alias"] == model and props["max_tokens_per_request"] == LIMIT
    assert raw.get("/v1/props").json() == props


def test_chat_and_completions_without_v1(api: RunningDaemon, base: str, model: str, no_eog: dict) -> None:
    """test_chat_completion::test_chat_completion posts to /chat/completions: the reply's shape
    there (its id, role, finish reason, usage), from the openai client given the bare URL."""
    with openai.OpenAI(base_url=base, api_key=api.token, max_retries=0, timeout=120) as bare:
        reply = bare.chat.completions.create(model=model, messages=BOOK, max_tokens=8, logit_bias=no_eog)
        assert "cmpl" in reply.id and reply.object == "chat.completion" and reply.model == model
        choice = reply.choices[0]
        assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
        assert (choice.finish_reason, reply.usage.completion_tokens) == ("length", 8)
        assert reply.usage.prompt_tokens > 0 and reply.usage.total_tokens == reply.usage.prompt_tokens + 8
        text = bare.completions.create(model=model, prompt=MEANING, max_tokens=8, logit_bias=no_eog)
        assert text.object == "text_completion" and (text.choices[0].finish_reason, text.usage.completion_tokens) == ("length", 8)
        assert len(bare.embeddings.create(model=model, input="hello").data[0].embedding) > 1


def test_chat_stream_without_v1(raw: httpx.Client, model: str, no_eog: dict) -> None:
    """test_chat_completion::test_chat_completion_stream: the role first and only there, one id
    throughout, the served model named, no content beside the finish reason, then the usage."""
    events = sse(raw, "/chat/completions", {"messages": BOOK, "max_tokens": 8, "logit_bias": no_eog,
                                            "stream_options": {"include_usage": True}})
    *chunks, tail = events
    assert {e["id"] for e in events} == {events[0]["id"]} and {e["model"] for e in events} == {model}
    assert all(e["object"] == "chat.completion.chunk" for e in events)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant" and not chunks[0]["choices"][0]["delta"].get("content")
    assert all("role" not in c["choices"][0]["delta"] for c in chunks[1:])
    *middle, last = chunks
    assert last["choices"][0]["finish_reason"] == "length" and "content" not in last["choices"][0]["delta"]
    assert all(c["choices"][0]["finish_reason"] is None for c in middle)
    assert tail["choices"] == [] and tail["usage"]["completion_tokens"] == 8


# -- any model name ----------------------------------------------------------------------------


def test_any_model_name_with_the_openai_library(client: openai.OpenAI, model: str, no_eog: dict) -> None:
    """test_chat_completion::test_chat_completion_with_openai_library ("gpt-3.5-turbo-instruct",
    seed 42, temperature 0.8) and test_completion::test_completion_with_openai_library
    ("davinci-002"): served by the loaded model, cut at max_tokens."""
    chat = client.chat.completions.create(model="gpt-3.5-turbo-instruct", messages=BOOK, max_tokens=8, seed=42,
                                          temperature=0.8, logit_bias=no_eog)
    assert chat.model == model and chat.choices[0].finish_reason == "length" and chat.choices[0].message.content is not None
    text = client.completions.create(model="davinci-002", prompt=MEANING, max_tokens=8, logit_bias=no_eog)
    assert text.model == model and text.choices[0].finish_reason == "length" and text.choices[0].text is not None
    streamed = client.completions.create(model="davinci-002", prompt=MEANING, max_tokens=8, logit_bias=no_eog, stream=True)
    reasons = [c.choices[0].finish_reason for c in streamed if c.choices]
    assert reasons[-1] == "length" and all(r is None for r in reasons[:-1])


# -- n -----------------------------------------------------------------------------------------


def test_chat_n_2_twice(raw: httpx.Client, no_eog: dict) -> None:
    """test_chat_completion::test_chat_completions_multiple_choices: n=2, twice (the cache is
    reused across choices and requests, and nothing locks up)."""
    for _ in range(2):
        reply = raw.post("/chat/completions", json={"messages": BOOK, "max_tokens": 8, "n": 2, "logit_bias": no_eog})
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert [c["index"] for c in body["choices"]] == [0, 1]
        for choice in body["choices"]:
            assert choice["message"]["role"] == "assistant" and choice["finish_reason"] == "length"
        assert body["usage"]["completion_tokens"] == 2 * 8


# -- logprobs ----------------------------------------------------------------------------------


def _check_entry(entry, top: int) -> None:
    assert entry.logprob <= 0.0 and entry.bytes is not None and len(entry.top_logprobs) == top
    assert entry.token.encode() == bytes(entry.bytes) or "\ufffd" in entry.token  # text, unless part of a character
    alternatives = [t.logprob for t in entry.top_logprobs]
    assert alternatives == sorted(alternatives, reverse=True) and all(lp <= 0.0 for lp in alternatives)
    assert entry.logprob <= alternatives[0] + 1e-4  # none likelier than the likeliest
    assert sum(math.exp(lp) for lp in alternatives) <= 1.0 + 1e-4


def test_chat_logprobs(client: openai.OpenAI) -> None:
    """test_chat_completion::test_logprobs: an entry per token, each with its top 10; together
    the reply's text (by their bytes: a token may hold part of a character)."""
    reply = client.chat.completions.create(model="gpt-3.5-turbo-instruct", messages=BOOK, max_tokens=5, logprobs=True,
                                           top_logprobs=10, **GREEDY)
    content = reply.choices[0].logprobs.content
    assert content is not None and len(content) == reply.usage.completion_tokens >= 1
    for entry in content:
        _check_entry(entry, 10)
    assert joined(content) == reply.choices[0].message.content.encode()


def test_chat_logprobs_stream(client: openai.OpenAI) -> None:
    """test_chat_completion::test_logprobs_stream: every content chunk carries its tokens' entries."""
    stream = client.chat.completions.create(model="gpt-3.5-turbo-instruct", messages=BOOK, max_tokens=5, logprobs=True,
                                            top_logprobs=10, stream=True, stream_options={"include_usage": True}, **GREEDY)
    text, entries, usage = "", [], None
    for i, chunk in enumerate(stream):
        if not chunk.choices:
            usage = chunk.usage
            continue
        choice = chunk.choices[0]
        if i == 0:
            assert choice.delta.role == "assistant" and not choice.delta.content
            continue
        assert choice.delta.role is None
        if choice.finish_reason is None:
            assert choice.logprobs is not None and choice.logprobs.content, chunk
            text += choice.delta.content or ""
            entries += choice.logprobs.content
    for entry in entries:
        _check_entry(entry, 10)
    assert usage is not None and len(entries) == usage.completion_tokens >= 1
    assert joined(entries) == text.encode()


def test_completion_logprobs(client: openai.OpenAI, no_eog: dict) -> None:
    """test_completion::test_n_probs (n_probs 10, 5 tokens), in OpenAI's legacy shape: parallel
    lists, one place per token, the top alternatives as a map."""
    reply = client.completions.create(model="x", prompt=MEANING, max_tokens=5, logprobs=10, logit_bias=no_eog, **GREEDY)
    lp = reply.choices[0].logprobs
    assert reply.usage.completion_tokens == 5
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 5
    if not any("\ufffd" in t for t in lp.tokens):  # each token whole text: they make the text
        assert "".join(lp.tokens) == reply.choices[0].text
        assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(5)]
    for logprob, top in zip(lp.token_logprobs, lp.top_logprobs):
        # A map by text: two alternatives of the same text would be one key, so up to 10.
        assert logprob <= 0.0 and 1 <= len(top) <= 10 and all(v <= 0.0 for v in top.values())
        assert logprob <= max(top.values()) + 1e-4


def test_completion_logprobs_stream(client: openai.OpenAI, no_eog: dict) -> None:
    """test_completion::test_n_probs_stream: each chunk's tokens with their alternatives."""
    stream = client.completions.create(model="x", prompt=MEANING, max_tokens=5, logprobs=10, logit_bias=no_eog,
                                       stream=True, stream_options={"include_usage": True}, **GREEDY)
    tokens, text, offsets, usage = [], "", [], None
    for chunk in stream:
        if not chunk.choices:
            usage = chunk.usage
            continue
        choice = chunk.choices[0]
        if choice.finish_reason is not None:
            continue
        lp = choice.logprobs
        assert lp is not None and len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) >= 1, chunk
        assert all(v <= 0.0 for v in lp.token_logprobs) and all(1 <= len(t) <= 10 for t in lp.top_logprobs)
        tokens += lp.tokens
        offsets += lp.text_offset
        text += choice.text
    assert usage is not None and len(tokens) == usage.completion_tokens == 5
    if not any("\ufffd" in t for t in tokens):  # each token whole text: they make the text
        assert "".join(tokens) == text and offsets == [sum(len(t) for t in tokens[:i]) for i in range(5)]


# -- logit_bias --------------------------------------------------------------------------------


def _banned(raw: httpx.Client) -> dict[int, str]:
    """test_logit_bias's words, as POST /tokenize gives their ids (with pieces)."""
    tokens = raw.post("/tokenize", json={"content": " " + " ".join(EXCLUDE) + " ", "with_pieces": True}).json()["tokens"]
    assert len(tokens) >= len(EXCLUDE)
    return {t["id"]: t["piece"] for t in tokens}


def test_chat_logit_bias(client: openai.OpenAI, raw: httpx.Client) -> None:
    """test_chat_completion::test_logit_bias: the words' tokens at -100 are never chosen."""
    banned = _banned(raw)
    reply = client.chat.completions.create(model="gpt-3.5-turbo-instruct", messages=BOOK, max_tokens=64, logprobs=True,
                                           logit_bias={str(t): -100 for t in banned}, **GREEDY)
    chosen = [bytes(e.bytes).decode("utf-8", "replace") for e in reply.choices[0].logprobs.content]
    assert reply.choices[0].message.content and chosen
    assert set(chosen).isdisjoint(banned.values()), [p for p in chosen if p in banned.values()]
    # Without the bias greedy picks at least one of them in the same place (else the test shows nothing).
    free = client.chat.completions.create(model="x", messages=BOOK, max_tokens=64, logprobs=True, **GREEDY)
    assert not set(bytes(e.bytes).decode("utf-8", "replace") for e in free.choices[0].logprobs.content).isdisjoint(banned.values())


def test_completion_logit_bias(client: openai.OpenAI, raw: httpx.Client) -> None:
    """test_completion::test_logit_bias, its token-id form in OpenAI's map (tokenize=True,
    openai_style=True), on /v1/completions."""
    banned = _banned(raw)
    reply = client.completions.create(model="x", prompt="What is the best book", max_tokens=64, logprobs=1,
                                      logit_bias={str(t): -100 for t in banned}, **GREEDY)
    chosen = reply.choices[0].logprobs.tokens
    assert chosen and set(chosen).isdisjoint(banned.values()), [p for p in chosen if p in banned.values()]


# -- grammar and json_schema -------------------------------------------------------------------


def test_chat_grammar(raw: httpx.Client) -> None:
    """test_chat_completion::test_completion_with_grammar: llama-server's `grammar` (GBNF)."""
    reply = raw.post("/chat/completions", json={"messages": [{"role": "user", "content": "Does not matter what I say, does it?"}],
                                                "max_tokens": 6, "grammar": 'root ::= "a"{5,5}'})
    assert reply.status_code == 200, reply.text
    choice = reply.json()["choices"][0]
    assert re.fullmatch("a{5}", choice["message"]["content"]) and choice["finish_reason"] == "stop", choice


def test_chat_invalid_grammar(raw: httpx.Client) -> None:
    """test_chat_completion::test_completion_with_invalid_grammar."""
    refused(raw.post("/chat/completions", json={"messages": [{"role": "user", "content": "Does not matter what I say, does it?"}],
                                                "max_tokens": 8, "grammar": "root ::= this is (not valid GBNF"}))


@pytest.mark.parametrize("schema, fits", [
    ({"const": "42"}, lambda v: v == "42"),
    ({"items": [{"type": "integer"}]}, lambda v: isinstance(v, list) and len(v) == 1 and isinstance(v[0], int)),
])
def test_chat_top_level_json_schema(raw: httpx.Client, schema: dict, fits) -> None:
    """test_chat_completion::test_completion_with_json_schema (and the tuple schema of
    test_completion_with_response_format): llama-server's top-level `json_schema`."""
    reply = raw.post("/chat/completions", json={"messages": CODING, "max_tokens": 32, "json_schema": schema})
    assert reply.status_code == 200, reply.text
    choice = reply.json()["choices"][0]
    assert choice["finish_reason"] == "stop" and fits(json.loads(choice["message"]["content"])), choice


def test_chat_response_format(raw: httpx.Client) -> None:
    """test_chat_completion::test_completion_with_response_format, its OpenAI forms: json_schema
    (without a name, as llama.cpp sends it) and json_object are honoured; an unknown type and a
    schema that is no schema are a 400."""
    def ask(response_format: dict) -> httpx.Response:
        return raw.post("/chat/completions", json={"messages": CODING, "max_tokens": 32, "response_format": response_format})

    reply = ask({"type": "json_schema", "json_schema": {"schema": {"const": "foooooo"}}})
    assert reply.status_code == 200, reply.text
    assert json.loads(reply.json()["choices"][0]["message"]["content"]) == "foooooo"
    choice = ask({"type": "json_object"}).json()["choices"][0]
    assert choice["message"]["content"].lstrip().startswith("{"), choice
    if choice["finish_reason"] == "stop":
        assert isinstance(json.loads(choice["message"]["content"]), dict)
    refused(ask({"type": "sound"}))
    for schema in ({"type": 123}, {"type": "hiccup"}):
        refused(ask({"type": "json_schema", "json_schema": {"name": "example", "schema": schema}}))
        refused(raw.post("/chat/completions", json={"messages": CODING, "max_tokens": 8, "json_schema": schema}))


# -- token-id prompts ------------------------------------------------------------------------


def test_completion_with_tokens_input(client: openai.OpenAI, raw: httpx.Client) -> None:
    """test_completion::test_completion_with_tokens_input on /v1/completions: token ids from
    /tokenize (add_special), a list of two, and ids beside the same text. Alike prompts give
    alike first tokens; the texts are not compared (the choices are computed side by side)."""
    tokens = raw.post("/tokenize", json={"content": MEANING, "add_special": True}).json()["tokens"]
    single = client.completions.create(model="x", prompt=tokens, max_tokens=4, logprobs=3, **GREEDY)
    assert isinstance(single.choices[0].text, str) and single.usage.prompt_tokens == len(tokens)  # no second BOS
    first = single.choices[0].logprobs
    for prompt in ([tokens, tokens], [MEANING, MEANING]):
        both = client.completions.create(model="x", prompt=prompt, max_tokens=4, logprobs=3, **GREEDY)
        assert [c.index for c in both.choices] == [0, 1] and both.usage.prompt_tokens == 2 * single.usage.prompt_tokens
        for choice in both.choices:
            assert choice.logprobs.tokens[0] == first.tokens[0]
            # Within rounding, not equal: the two are computed in one batch, the single one alone,
            # and llama.cpp sums in another order (README, "Tests on any machine": 0.02-0.08 logits
            # measured; with flash attention off on the CPU this pair was 0.056 apart).
            assert abs(choice.logprobs.token_logprobs[0] - first.token_logprobs[0]) < 0.15
    # Text and token ids in one list are one form or the other in OpenAI's API.
    refused(raw.post("/completions", json={"prompt": [tokens, MEANING], "max_tokens": 2}))
