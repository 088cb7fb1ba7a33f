"""n candidates, logprobs, logit_bias, grammars, several prompts, embeddings and llama-server's
/tokenize, /detokenize and /props over HTTP, reached with the official `openai` package (httpx
where it cannot say the request), as a plugin moving from llama-server sends them. Mechanisms
only: shapes, counts, what is banned stays out, never what the model says."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator

import httpx
import numpy as np
import openai
import pytest

from support.daemons import RunningDaemon, start_daemon, stop_daemon
from support.no_early_stop import http_bias, http_eog_ids

GREEDY = {"temperature": 0.0}
PERSONA = ("You are Brann, the blacksmith of Oakvale. You speak in short, gruff sentences, you love your forge, "
           "and you distrust the mages of the tower. You sell swords, axes and horseshoes. ") * 2
ASK = [{"role": "system", "content": PERSONA}, {"role": "user", "content": "What do you sell?"}]


@pytest.fixture(scope="module")
def api() -> Iterator[RunningDaemon]:
    running = start_daemon("--no-websocket", "--stream-interval-ms", "0", "--max-tokens-per-request", "64")
    yield running
    stop_daemon(running)


@pytest.fixture(scope="module")
def no_end(api: RunningDaemon, base: str) -> dict[str, float]:
    """logit_bias banning the end-of-generation tokens: a reply with tokens to check, surely."""
    return http_bias(http_eog_ids(base, api.token))


def test_n_candidates_come_as_choices_from_one_prefill(client: openai.OpenAI, api: RunningDaemon) -> None:
    with api.client(timeout_s=60) as grpc_client:
        before = grpc_client.status().throughput.prompt_tokens_processed
        reply = client.chat.completions.create(model="local-model", messages=ASK, n=4, max_tokens=10, temperature=1.0, seed=5)
        computed = grpc_client.status().throughput.prompt_tokens_processed - before
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    assert all(c.message.content is not None and c.finish_reason in ("stop", "length") for c in reply.choices)
    # The prompt counts once, and is computed once (and the one token after the shared cut, each).
    assert reply.usage.prompt_tokens > 50 and computed <= reply.usage.prompt_tokens + 4, computed


def test_n_candidates_stream_interleaved_by_index(client: openai.OpenAI, no_end) -> None:
    stream = client.chat.completions.create(model="x", messages=ASK, n=3, max_tokens=8, temperature=1.0, stream=True,
                                            stream_options={"include_usage": True}, logit_bias=no_end)
    texts, finished, usage = {}, set(), None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
            if c.finish_reason:
                finished.add(c.index)
    assert finished == {0, 1, 2} and set(texts) == {0, 1, 2}
    assert usage is not None and usage.completion_tokens >= 3


def test_n_above_16_is_a_clear_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="n"):
        client.chat.completions.create(model="x", messages=ASK, n=17)


def test_chat_logprobs_match_the_tokens(client: openai.OpenAI, no_end) -> None:
    reply = client.chat.completions.create(model="x", messages=ASK, max_tokens=8, logprobs=True, top_logprobs=3,
                                           logit_bias=no_end, **GREEDY)
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens
    assert "".join(bytes(e.bytes).decode("utf-8", "replace") for e in content) == reply.choices[0].message.content
    for e in content:
        assert e.logprob <= 0 and len(e.top_logprobs) == 3
        assert e.top_logprobs[0].logprob >= e.top_logprobs[-1].logprob
        assert sum(math.exp(t.logprob) for t in e.top_logprobs) <= 1.0001
    streamed = client.chat.completions.create(model="x", messages=ASK, max_tokens=8, logprobs=True, stream=True,
                                              logit_bias=no_end, **GREEDY)
    entries = [e for chunk in streamed for c in chunk.choices if c.logprobs and c.logprobs.content for e in c.logprobs.content]
    assert len(entries) == len(content)


def test_completion_logprobs_in_the_legacy_shape(client: openai.OpenAI, no_end) -> None:
    reply = client.completions.create(model="x", prompt="The blacksmith said", max_tokens=6, logprobs=2, logit_bias=no_end,
                                      **GREEDY)
    lp = reply.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == reply.usage.completion_tokens
    assert lp.text_offset == sorted(lp.text_offset) and all(len(t) <= 2 for t in lp.top_logprobs)


def test_logit_bias_bans_a_token(client: openai.OpenAI, raw: httpx.Client, no_end) -> None:
    # Both replies have a first token to compare: the end-of-generation tokens are banned too.
    first = client.chat.completions.create(model="x", messages=ASK, max_tokens=4, logprobs=True, logit_bias=no_end, **GREEDY)
    token = bytes(first.choices[0].logprobs.content[0].bytes).decode()
    ids = raw.post("/tokenize", json={"content": token, "parse_special": False}).json()["tokens"]
    assert len(ids) == 1
    banned = client.chat.completions.create(model="x", messages=ASK, max_tokens=4, logprobs=True,
                                            logit_bias={**no_end, str(ids[0]): -100}, **GREEDY)
    assert bytes(banned.choices[0].logprobs.content[0].bytes).decode() != token
    for bias in ({"not-a-token": 1}, {str(ids[0]): 500}, {"999999999": 1}):
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model="x", messages=ASK, max_tokens=2, logit_bias=bias)


@pytest.mark.parametrize("key", ["2147483648", "99999999999999999999", "1" * 5000, " 1", "1 ", "1_0", "+3", "-1",
                                 "\uff13", "\u0661", "1.0", "0x1", ""])
def test_a_logit_bias_key_is_ascii_digits_within_int32_or_a_400(raw: httpx.Client, key: str) -> None:
    # int() takes " 1", "1_0", "+3" and other scripts' digits; 2147483648 passed it and broke
    # the int32 map into a 500 with a traceback (issue 36, P9).
    refused = raw.post("/v1/chat/completions", json={"model": "x", "messages": ASK, "max_tokens": 1,
                                                     "logit_bias": {key: 1}})
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["type"] == "invalid_request_error" and "logit_bias" in error["message"], error
    assert key[:40].strip() in error["message"], error


def test_a_logit_bias_key_with_leading_zeros_is_the_same_id(raw: httpx.Client) -> None:
    taken = raw.post("/v1/completions", json={"model": "x", "prompt": "Hi", "max_tokens": 1,
                                              "logit_bias": {"0000000000000001": -100}})
    assert taken.status_code == 200, taken.text


def test_a_gbnf_grammar_and_a_top_level_json_schema_are_honoured(client: openai.OpenAI, raw: httpx.Client) -> None:
    reply = client.chat.completions.create(model="x", messages=ASK, max_tokens=6, extra_body={"grammar": 'root ::= "Aye" | "Nay"'},
                                           **GREEDY)
    assert reply.choices[0].message.content in ("Aye", "Nay")
    schema = {"type": "object", "properties": {"mood": {"enum": ["calm", "angry"]}}, "required": ["mood"]}
    reply = client.chat.completions.create(model="x", messages=ASK, max_tokens=24, extra_body={"json_schema": schema}, **GREEDY)
    assert json.loads(reply.choices[0].message.content)["mood"] in ("calm", "angry")
    text = client.completions.create(model="x", prompt="Yes or no?", max_tokens=4, extra_body={"grammar": 'root ::= "yes" | "no"'},
                                     **GREEDY)
    assert text.choices[0].text in ("yes", "no")
    bad = raw.post("/v1/chat/completions", json={"messages": ASK, "grammar": 'root ::= "open'})
    assert bad.status_code == 400 and "grammar" in bad.json()["error"]["message"]


def test_several_prompts_and_token_id_prompts(client: openai.OpenAI, raw: httpx.Client) -> None:
    reply = client.completions.create(model="x", prompt=["Once upon a time", "The dragon"], max_tokens=4, n=2, **GREEDY)
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    ids = raw.post("/tokenize", json={"content": "Once upon a time"}).json()["tokens"]
    by_ids = client.completions.create(model="x", prompt=ids, max_tokens=4, **GREEDY)
    assert by_ids.usage.prompt_tokens == len(ids)  # fed as given: no BOS added, nothing tokenized again
    both = client.completions.create(model="x", prompt=[ids, ids], max_tokens=2, **GREEDY)
    assert len(both.choices) == 2
    # In a session the ids go on as their text, which is what a session keeps and matches a resent
    # prompt on; the next turn, resent with more text, continues it.
    first = client.completions.create(model="x", prompt=ids, max_tokens=2, extra_headers={"X-Session-Id": "ids-npc"}, **GREEDY)
    said = raw.post("/detokenize", json={"tokens": ids}).json()["content"] + first.choices[0].text
    later = client.completions.create(model="x", prompt=said + " And then", max_tokens=2,
                                      extra_headers={"X-Session-Id": "ids-npc"}, **GREEDY)
    assert later.usage.prompt_tokens_details.cached_tokens > 0
    bad = raw.post("/v1/completions", json={"model": "x", "prompt": [1, 10**8], "max_tokens": 1})
    assert bad.status_code == 400 and "prompt_tokens[1]" in bad.json()["error"]["message"], bad.text


@pytest.mark.parametrize("prompt", [["Once upon a time"] * 17, [[1, 2, 3]] * 17])
def test_too_many_prompts_say_how_many_are_taken(raw: httpx.Client, prompt: list) -> None:
    # Told before as the token-id branch's "prompt[0] must be an integer (and 16 more problems)".
    refused = raw.post("/v1/completions", json={"model": "x", "prompt": prompt, "max_tokens": 1})
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["message"] == "at most 16 prompts per request; prompt has 17" and error["param"] == "prompt", error


def test_embeddings_as_the_openai_client_reads_them(client: openai.OpenAI) -> None:
    lines = ["The player gave the smith a ring.", "A ring was given to the blacksmith.", "Rain over the harbour."]
    reply = client.embeddings.create(model="text-embedding-3-small", input=lines)  # base64 on the wire, decoded
    vectors = np.array([d.embedding for d in reply.data])
    assert vectors.shape[0] == 3 and np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
    assert reply.usage.prompt_tokens > 0
    floats = client.embeddings.create(model="x", input=lines[0], encoding_format="float")
    assert np.allclose(floats.data[0].embedding, vectors[0], atol=1e-3)
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model="x", input="x", dimensions=8)
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model="x", input=[""])


def test_tokenize_detokenize_and_props_as_llama_server_serves_them(raw: httpx.Client) -> None:
    tokens = raw.post("/tokenize", json={"content": "Hello, traveller!"}).json()["tokens"]
    assert raw.post("/detokenize", json={"tokens": tokens}).json()["content"] == "Hello, traveller!"
    pieces = raw.post("/v1/tokenize", json={"content": "Hello", "with_pieces": True}).json()["tokens"]
    assert pieces and {"id", "piece"} <= set(pieces[0])
    props = raw.get("/props").json()
    assert props["default_generation_settings"]["n_ctx"] > 0 and props["total_slots"] >= 1
    assert props["max_tokens_per_request"] == 64
    assert raw.post("/detokenize", json={"tokens": [10**9]}).status_code == 400
    assert raw.post("/tokenize", json={"content": 5}).status_code == 400


def test_the_responses_api_is_refused_by_name(raw: httpx.Client) -> None:
    for path in ("/v1/responses", "/responses"):
        r = raw.post(path, json={"model": "x", "input": "hi"})
        assert r.status_code == 501 and "chat/completions" in r.json()["error"]["message"]
