"""n candidates, logprobs, logit_bias, GBNF grammars, embeddings and tokenize over real gRPC and
the WebSocket bridge's table, against the session daemon. Mechanisms only: shapes, counts,
refusals and that nothing else is lost, never what the model says."""

from __future__ import annotations

import math

import grpc
import pytest

from sidecar.api import pb

from support.no_early_stop import grpc_bias, grpc_sampling

GREEDY = pb.SamplingParams(temperature=0.0, repeat_penalty=1.0)
PERSONA = ("You are Brann, the blacksmith of Oakvale. You speak in short, gruff sentences, you love your forge, "
           "and you distrust the mages of the tower. You sell swords, axes and horseshoes. ") * 2


def ask(text: str = "What do you sell?", **kwargs) -> pb.GenerateRequest:
    return pb.GenerateRequest(messages=pb.ChatMessages(messages=[
        pb.ChatMessage(role="system", content=PERSONA), pb.ChatMessage(role="user", content=text)]), **kwargs)


def test_n_candidates_stream_with_their_index_and_share_one_prefill(client, eog) -> None:
    # The end-of-generation tokens banned: each candidate has tokens, whatever the model says.
    replies = client.candidates(ask(max_tokens=12, sampling=grpc_sampling(eog, temperature=1.0, seed=3)), 4)
    assert len(replies) == 4 and all(r.final is not None and r.final.usage.completion_tokens > 0 for r in replies)
    prompt = replies[0].final.usage.prompt_tokens
    computed = sum(r.final.usage.prompt_tokens - r.final.usage.cached_prompt_tokens for r in replies)
    assert computed <= prompt + len(replies), (computed, prompt)


def test_n_is_bounded_and_not_with_a_session(client) -> None:
    with pytest.raises(grpc.RpcError) as e:
        client.complete(ask(n=17))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "at most 16" in e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        client.complete(ask(n=2, session_id="brann"))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "one-offs" in e.value.details()


def test_logprobs_come_with_each_token(client) -> None:
    reply = client.complete(ask(max_tokens=8, sampling=GREEDY, logprobs=2))
    assert [e.token_id for e in reply.logprobs] == reply.token_ids
    assert all(e.logprob <= 0 and len(e.top) == 2 and e.top[0].token_id == e.token_id for e in reply.logprobs)
    assert all(math.isfinite(t.logprob) for e in reply.logprobs for t in e.top)
    with pytest.raises(grpc.RpcError) as err:
        client.complete(ask(logprobs=21))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_banned_token_stays_out(client, eog) -> None:
    # The end-of-generation tokens banned in both: each reply has tokens to look at.
    first = client.complete(ask(max_tokens=4, sampling=grpc_sampling(eog, temperature=0.0, repeat_penalty=1.0))).token_ids[0]
    banned = pb.SamplingParams(temperature=0.0, repeat_penalty=1.0, logit_bias={**grpc_bias(eog), first: -100.0})
    assert first not in client.complete(ask(max_tokens=4, sampling=banned)).token_ids
    for bias in ({first: 1000.0}, {10**8: 1.0}, {-3: 1.0}):
        with pytest.raises(grpc.RpcError) as err:
            client.complete(ask(sampling=pb.SamplingParams(logit_bias=bias)))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_gbnf_grammar_holds_the_reply(client) -> None:
    reply = client.complete(ask(sampling=GREEDY, max_tokens=8, grammar='root ::= "Aye" | "Nay"'))
    assert reply.text in ("Aye", "Nay")


@pytest.mark.parametrize("grammar, why", [
    ("root ::= \"unterminated", "could not be parsed"),
    ("root ::= undefined-rule", "could not be parsed"),
    ("start ::= \"x\"", "could not be parsed"),
    ("root ::= " + "(" * 5000 + '"x"' + ")" * 5000, "nests"),
])
def test_a_bad_grammar_is_a_clear_error_and_the_daemon_stays_up(client, grammar: str, why: str) -> None:
    with pytest.raises(grpc.RpcError) as err:
        client.complete(ask(grammar=grammar))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and why in err.value.details()
    assert client.complete(ask(max_tokens=2)).final is not None


def test_grammar_with_a_schema_is_refused(client) -> None:
    with pytest.raises(grpc.RpcError) as err:
        client.complete(ask(grammar='root ::= "a"', json_schema='{"type": "object"}'))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_embed_tokenize_detokenize(client) -> None:
    vectors = client.embed(["The smith sold a sword.", "The blacksmith sold me a blade.", "Rain over the sea."])
    assert len(vectors) == 3 and len({len(v) for v in vectors}) == 1
    assert all(abs(sum(x * x for x in v) - 1.0) < 1e-3 for v in vectors)
    tokens = client.tokenize("Hello, traveller!")
    assert tokens and client.detokenize(tokens) == "Hello, traveller!"
    for call in (lambda: client.embed([]), lambda: client.embed(["x" * 20000]), lambda: client.detokenize([10**8])):
        with pytest.raises(grpc.RpcError) as err:
            call()
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_parallel_tool_calls_come_back_in_tool_calls(client) -> None:
    tools = [pb.Tool(name="give_item", parameters_json_schema='{"type": "object", "properties": {"item": {"type": "string"}}, '
                                                              '"required": ["item"]}'),
             pb.Tool(name="wave")]
    # The grammar admits an array; a bias would not make the model choose it, so read whatever it did.
    reply = client.complete(ask("Give me bread and wave goodbye.", tools=tools, tool_choice="required",
                                parallel_tool_calls=True, sampling=GREEDY, max_tokens=80))
    final = reply.final
    if final.finish_reason == pb.FINISH_REASON_TOOL_CALL:
        assert len(final.tool_calls) >= 1 and final.tool_calls[0] == final.tool_call
        assert {c.name for c in final.tool_calls} <= {"give_item", "wave"}
    else:
        assert final.finish_reason == pb.FINISH_REASON_LENGTH  # cut short: no whole JSON to read


def test_token_id_prompts_are_fed_as_given(client) -> None:
    """prompt_tokens reach the model exactly: "Hello there" spelled one character per token (ids
    the text's own tokenization would never give) is as many prompt tokens, and no BOS is added."""
    text = "Hello there"
    ids = [client.tokenize(c)[0] for c in text]
    assert len(client.tokenize(text)) < len(ids)  # the mechanism shows only where they differ
    reply = client.complete(pb.GenerateRequest(prompt_tokens=pb.TokenIds(ids=ids), max_tokens=3, sampling=GREEDY))
    assert reply.final.usage.prompt_tokens == len(ids)
    # Again: the same ids are the same prefix, found in the cache.
    again = client.complete(pb.GenerateRequest(prompt_tokens=pb.TokenIds(ids=ids), max_tokens=1, sampling=GREEDY))
    assert again.final.usage.prompt_tokens == len(ids) and again.final.usage.cached_prompt_tokens > 0


@pytest.mark.parametrize("request_kwargs, why", [
    ({"prompt_tokens": pb.TokenIds(ids=[])}, "empty"),
    ({"prompt_tokens": pb.TokenIds(ids=[1, 10**8])}, "prompt_tokens[1]"),
    ({"prompt_tokens": pb.TokenIds(ids=[-5])}, "prompt_tokens[0]"),
    ({"prompt_tokens": pb.TokenIds(ids=[1, 2]), "session_id": "brann"}, "one-off"),
    ({"prompt_tokens": pb.TokenIds(ids=[1, 2]), "context": "The village of Oakvale."}, "context"),
    ({"prompt_tokens": pb.TokenIds(ids=[1] * 100_000)}, "limit"),
])
def test_bad_token_id_prompts_are_refused_by_name(client, request_kwargs: dict, why: str) -> None:
    with pytest.raises(grpc.RpcError) as err:
        client.complete(pb.GenerateRequest(max_tokens=1, **request_kwargs))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and why in err.value.details(), err.value.details()
    assert client.complete(ask(max_tokens=1)).final is not None  # nothing else is lost
