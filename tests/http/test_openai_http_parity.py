"""OpenAI-API parity over HTTP (issue 28): what a plugin moving from llama-server or LM Studio
relies on. Live tests drive one daemon (the real SmolLM2) with the official `openai` package, or
httpx where it cannot say the request; the rest are pure (the request path up to the core, with a
stand-in core that has no model)."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import grpc
import httpx
import jsonschema
import openai
import pytest
from starlette.testclient import TestClient

from support.daemons import RunningDaemon, start_daemon, stop_daemon
from support.no_early_stop import http_bias, http_eog_ids
from sidecar.api import pb
from sidecar.service import tool_calls
from sidecar.service.auth import Authenticator
from sidecar.service.openai_http import replies, translate
from sidecar.service.openai_http.cors import CorsPolicy
from sidecar.service.openai_http.request_models import ChatCompletionRequest, Tool
from sidecar.service.openai_http.routes import OpenAIApi
from sidecar.service.openai_http import tools as tools_http

slow = pytest.mark.slow
LIMIT = 64  # --max-tokens-per-request of the daemon here
PROMPT_LIMIT = 1024  # its --max-prompt-tokens
ORIGIN = "http://localhost:8080"  # its --cors-origin
GREEDY = {"temperature": 0.0}
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8,"
GIVE = {"type": "function", "function": {"name": "give_item", "description": "hand the guest an item",
                                         "parameters": {"type": "object", "additionalProperties": False,
                                                        "required": ["item"],
                                                        "properties": {"item": {"type": "string", "maxLength": 20}}}}}
WAVE = {"type": "function", "function": {"name": "wave", "description": "wave at the guest",
                                         "parameters": {"type": "object", "additionalProperties": False, "properties": {}}}}
INNKEEPER = [{"role": "system", "content": "You are Marta, the innkeeper."},
             {"role": "user", "content": "Hello! An ale and a bread, please."}]


@pytest.fixture(scope="module")
def api() -> Iterator[RunningDaemon]:
    running = start_daemon("--no-websocket", "--stream-interval-ms", "0", "--max-tokens-per-request", str(LIMIT),
                           "--max-prompt-tokens", str(PROMPT_LIMIT), "--cors-origin", ORIGIN)
    yield running
    stop_daemon(running)


@pytest.fixture(scope="module")
def model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def auth(api: RunningDaemon, **headers: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api.token}", **headers}


# -- 1. routes without /v1 ---------------------------------------------------------------------


@slow
def test_every_route_is_served_without_v1_too(api: RunningDaemon, base: str, model: str) -> None:
    no_end = http_bias(http_eog_ids(base, api.token))  # the reply has a token, whatever the model says
    with openai.OpenAI(base_url=base, api_key=api.token, max_retries=0, timeout=120) as bare:
        assert [m.id for m in bare.models.list().data] == [model]
        assert bare.models.retrieve(model).id == model
        reply = bare.chat.completions.create(model=model, messages=ask("Hi"), max_tokens=2, user="no-v1", logit_bias=no_end)
        assert reply.choices[0].message.role == "assistant" and reply.usage.completion_tokens >= 1
        streamed = list(bare.chat.completions.create(model=model, messages=ask("Hi"), max_tokens=2, stream=True))
        assert streamed[0].choices[0].delta.role == "assistant"
        assert bare.completions.create(model=model, prompt="Once upon", max_tokens=2).choices[0].text is not None
        deleted = bare.delete("/sessions/no-v1", cast_to=httpx.Response)
        assert deleted.status_code == 200 and deleted.json()["deleted"] is True
    assert httpx.get(base + "/chat/completions", headers=auth(api)).status_code == 405
    missing = httpx.get(base + "/nothing/here", headers=auth(api))
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


# -- 2. any model name -------------------------------------------------------------------------


@slow
def test_any_model_name_is_served_by_the_loaded_model(client: openai.OpenAI, model: str, api: RunningDaemon,
                                                       base: str) -> None:
    for name in ("gpt-3.5-turbo", "local-model"):
        reply = client.chat.completions.create(model=name, messages=ask("Hi"), max_tokens=2)
        assert reply.model == model and reply.choices
    assert client.completions.create(model="gpt-3.5-turbo-instruct", prompt="Hi", max_tokens=2).model == model
    # Listing and looking up models still tells the one model by its own names.
    assert client.models.retrieve(model).id == model
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-3.5-turbo")
    listed = httpx.get(base + "/v1/models", headers=auth(api)).json()["data"]
    assert [m["id"] for m in listed] == [model] and listed[0]["object"] == "model"
    document = httpx.get(base + "/openapi.json").json()
    assert document["components"]["schemas"]["ChatCompletionRequest"]["properties"]["model"]["anyOf"][0] == {"type": "string"}


def _stand_in_api(token: str | None = "a-token-of-sixteen-chars", **options) -> TestClient:
    """The HTTP API in front of a stand-in core with no model: what happens before generation."""
    backend = SimpleNamespace(facts=SimpleNamespace(name="smol"), limits=SimpleNamespace(vision=False, max_prompt_tokens=1000))
    core = SimpleNamespace(backend=backend, ready_backend=lambda: backend, limits=backend.limits, draining=False,
                           info=SimpleNamespace(max_image_bytes=1 << 20))
    api = OpenAIApi(core, Authenticator(token), Path("/models/smol.gguf"), LIMIT, **options)
    return TestClient(api.app(), headers={"Authorization": f"Bearer {token}"} if token else {})


def test_strict_model_names_restores_the_404() -> None:
    from sidecar.cli import build_parser
    from sidecar.settings import Settings

    assert build_parser().parse_args(["serve", "--strict-model-names"]).strict_model_names is True
    assert Settings().strict_model_names is False
    strict = _stand_in_api(strict_model_names=True)
    refused = strict.post("/v1/chat/completions", json={"model": "gpt-3.5-turbo", "messages": ask("Hi")})
    assert refused.status_code == 404 and refused.json()["error"]["code"] == "not_found"
    assert strict.post("/completions", json={"model": "local-model", "prompt": "Hi"}).status_code == 404
    model = strict.get("/openapi.json").json()["components"]["schemas"]["ChatCompletionRequest"]["properties"]["model"]
    assert model["anyOf"][0] == {"enum": ["smol", "smol.gguf"]}
    for client in (strict, _stand_in_api()):
        assert client.get("/v1/models/smol.gguf").json()["id"] == "smol"
        assert client.get("/v1/models/gpt-4o").status_code == 404


# -- 3. max_tokens -----------------------------------------------------------------------------


@slow
def test_max_tokens_above_the_limit_is_clamped_and_the_reply_says_so(client: openai.OpenAI, model: str,
                                                                     api: RunningDaemon, base: str) -> None:
    client.completions.create(model=model, prompt=COUNTING, max_tokens=1, **GREEDY)  # cached: computed alike below
    at_limit = client.completions.create(model=model, prompt=COUNTING, max_tokens=LIMIT, **GREEDY)
    raw = client.completions.with_raw_response.create(model=model, prompt=COUNTING, max_tokens=100_000, **GREEDY)
    assert raw.headers["x-max-tokens-clamped"] == str(LIMIT)
    # The same reply as one asked for the limit itself, cut where it is ("length") if it ran that far.
    clamped = raw.parse()
    assert (clamped.usage.completion_tokens, clamped.choices[0].finish_reason) == \
        (at_limit.usage.completion_tokens, at_limit.choices[0].finish_reason)
    for asked in ({"max_completion_tokens": 5000}, {"max_tokens": 5000}):
        chat = client.chat.completions.with_raw_response.create(model=model, messages=ask("Hi"), **asked, **GREEDY)
        assert chat.headers["x-max-tokens-clamped"] == str(LIMIT) and chat.parse().usage.completion_tokens <= LIMIT
    with client.chat.completions.with_streaming_response.create(model=model, messages=ask("Hi"), max_tokens=5000,
                                                               stream=True) as streamed:
        assert streamed.headers["x-max-tokens-clamped"] == str(LIMIT)
    # -1 is LM Studio's "no limit": the limit, asked for, so nothing was clamped.
    free = client.completions.with_raw_response.create(model=model, prompt=COUNTING, max_tokens=-1, **GREEDY)
    assert "x-max-tokens-clamped" not in free.headers
    assert free.parse().usage.completion_tokens == at_limit.usage.completion_tokens
    within = client.chat.completions.with_raw_response.create(model=model, messages=ask("Hi"), max_tokens=LIMIT)
    assert "x-max-tokens-clamped" not in within.headers
    # An integral float is its integer; anything else stays a 400.
    whole = httpx.post(base + "/v1/completions", headers=auth(api), timeout=60,
                       json={"prompt": COUNTING, "max_tokens": 8.0, **GREEDY})
    assert whole.status_code == 200 and whole.json()["usage"]["completion_tokens"] <= 8, whole.text
    for field in ("max_tokens", "max_completion_tokens"):
        whole = httpx.post(base + "/v1/chat/completions", headers=auth(api), timeout=60,
                           json={"messages": ask("Count to twenty."), field: 8.0, **GREEDY})
        assert whole.status_code == 200 and whole.json()["usage"]["completion_tokens"] <= 8, whole.text
        for bad, says in ((8.5, "must be an integer"), (0, "at least 1"), (-2, "at least 1"), (True, "integer")):
            refused = httpx.post(base + "/v1/chat/completions", headers=auth(api), json={"messages": ask("Hi"), field: bad})
            error = refused.json()["error"]
            assert refused.status_code == 400 and error["param"] == field and says in error["message"], error


def test_max_tokens_maps_onto_the_request() -> None:
    def turn(**body) -> translate.Asked:
        parsed = ChatCompletionRequest.model_validate_json(json.dumps({"messages": ask("Hi"), **body}), strict=True)
        return translate.chat_request(parsed, "", LIMIT)

    assert (turn(max_tokens=10).first.request.max_tokens, turn(max_tokens=10).max_tokens_clamped) == (10, None)
    assert (turn(max_tokens=10**9).first.request.max_tokens, turn(max_tokens=10**9).max_tokens_clamped) == (LIMIT, LIMIT)
    assert (turn(max_tokens=-1).first.request.max_tokens, turn(max_tokens=-1).max_tokens_clamped) == (LIMIT, None)
    assert turn(max_completion_tokens=12.0).first.request.max_tokens == 12


# -- 4, 5. earlier calls and their results go back whole ---------------------------------------


def _calls(*names: str) -> list[dict]:
    return [{"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": '{"item": "ale"}' if n == "give_item" else "{}"}}
            for i, n in enumerate(names, 1)]


def _after(calls: list[dict], *, named: bool = False) -> list[dict]:
    results = [{"role": "tool", "tool_call_id": c["id"], "content": "Done.", **({"name": c["function"]["name"]} if named else {})}
               for c in calls]
    return [*INNKEEPER, {"role": "assistant", "content": None, "tool_calls": calls}, *results]


def test_every_call_and_each_result_by_its_function_s_name_reach_the_model() -> None:
    parsed = ChatCompletionRequest.model_validate_json(json.dumps({"messages": _after(_calls("give_item", "wave"))}), strict=True)
    sent = [(m.role, m.content) for m in translate.chat_request(parsed, "", LIMIT).first.request.messages.messages]
    # Several calls as the JSON array a parallel_tool_calls reply is; one call stays its object.
    assert json.loads(sent[2][1]) == [{"name": "give_item", "arguments": {"item": "ale"}}, {"name": "wave", "arguments": {}}]
    assert sent[3:] == [("user", "Result of give_item: Done."), ("user", "Result of wave: Done.")]
    orphan = [*INNKEEPER, {"role": "tool", "tool_call_id": "call_9", "content": "Done."}]
    parsed = ChatCompletionRequest.model_validate_json(json.dumps({"messages": orphan}), strict=True)
    assert translate.chat_request(parsed, "", LIMIT).first.request.messages.messages[-1].content == "Result of call_9: Done."


@slow
def test_an_assistant_message_with_two_calls_keeps_both(client: openai.OpenAI, model: str) -> None:
    def prompt_tokens(messages: list[dict]) -> int:
        return client.chat.completions.create(model=model, messages=messages, tools=[GIVE, WAVE], tool_choice="none",
                                              max_tokens=1).usage.prompt_tokens

    one, two = prompt_tokens(_after(_calls("give_item"))), prompt_tokens(_after(_calls("give_item", "wave")))
    # The second call and its result: more than the result's line alone (about 8 tokens).
    assert two > one + 12, (one, two)
    assert prompt_tokens(_after(_calls("give_item", "wave"), named=True)) == two  # named or not, the same text


# -- 6. parallel_tool_calls --------------------------------------------------------------------


def _spec(choice="auto", parallel=False):
    """The core's plan of GIVE and WAVE, as it makes it from the xlm.v1 request HTTP sends."""
    return tool_calls.plan_from_pb(pb.GenerateRequest(
        messages=pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="Hi")]),
        tools=tools_http.pb_tools([Tool.model_validate(GIVE), Tool.model_validate(WAVE)]),
        tool_choice=tools_http.pb_tool_choice(choice), parallel_tool_calls=parallel))


def _read_by_the_core(text: str) -> pb.GenerationFinal:
    final = pb.GenerationFinal(finish_reason=pb.FINISH_REASON_STOP)
    tool_calls.finish_with_call(final, text, ("give_item", "wave"))
    return final


def test_parallel_tool_calls_admits_an_array_only_when_asked() -> None:
    assert not any(b.get("type") == "array" for b in json.loads(_spec().json_schema)["anyOf"])
    branches = json.loads(_spec("required", parallel=True).json_schema)["anyOf"]
    [many] = [b for b in branches if b.get("type") == "array"]
    assert (many["minItems"], many["maxItems"]) == (1, tool_calls.MAX_PARALLEL_CALLS)
    two = '[{"name": "give_item", "arguments": {"item": "ale"}}, {"name": "wave", "arguments": {}}]'
    jsonschema.validate(json.loads(two), json.loads(_spec("required", parallel=True).json_schema))
    # Asked in so many words (unset and false keep one call), and with auto or required only.
    def parallel(**body) -> bool:
        parsed = ChatCompletionRequest.model_validate_json(json.dumps({"messages": ask("Hi"), "tools": [GIVE], **body}), strict=True)
        return translate.chat_request(parsed, "", LIMIT).first.request.parallel_tool_calls
    assert [parallel(), parallel(parallel_tool_calls=False), parallel(parallel_tool_calls=True),
            parallel(parallel_tool_calls=True, tool_choice="required"),
            parallel(parallel_tool_calls=True, tool_choice={"type": "function", "function": {"name": "give_item"}})] == \
        [False, False, True, True, False]
    # Over gRPC the field says it: off by default.
    request = pb.GenerateRequest(messages=pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="Hi")]),
                                 tools=[pb.Tool(name="wave")])
    assert not tool_calls.plan_from_pb(request).parallel
    request.parallel_tool_calls = True
    assert tool_calls.plan_from_pb(request).parallel


def test_an_array_reply_becomes_several_calls_whole_and_streamed() -> None:
    text = '[{"name": "give_item", "arguments": {"item": "ale"}}, {"name": "wave", "arguments": {}}]'
    final = _read_by_the_core(text)
    calls = replies.tool_message(text, final)["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["give_item", "wave"] and len({c["id"] for c in calls}) == 2
    assert json.loads(calls[0]["function"]["arguments"]) == {"item": "ale"}

    async def stream() -> list[dict]:
        async def rest():
            yield pb.GenerateChunk(final=final)
        ids = replies.ReplyIds("smol", chat=True)
        return [json.loads(e[6:]) async for e in replies.tool_events(ids, pb.GenerateChunk(text=text), rest(), False)
                if e != replies.DONE]

    deltas = [d for event in asyncio.run(stream()) for d in event["choices"][0]["delta"].get("tool_calls") or ()]
    assert [d["index"] for d in deltas] == [0, 0, 1, 1]
    assert [d["function"]["name"] for d in deltas if "id" in d] == ["give_item", "wave"]


@slow
def test_parallel_tool_calls_reach_the_model_and_every_call_comes_back(client: openai.OpenAI, model: str) -> None:
    declared = {t["function"]["name"]: t["function"]["parameters"] for t in (GIVE, WAVE)}
    kwargs = dict(model=model, messages=INNKEEPER, tools=[GIVE, WAVE], tool_choice="required", max_tokens=LIMIT, **GREEDY)
    one = client.chat.completions.create(**kwargs)
    several = client.chat.completions.create(**kwargs, parallel_tool_calls=True)
    # The grammar and the words that allow several calls reached the core (the model is told).
    assert several.usage.prompt_tokens > one.usage.prompt_tokens
    for reply, most in ((one, 1), (several, tool_calls.MAX_PARALLEL_CALLS)):
        if reply.choices[0].finish_reason == "length":
            continue  # a call cut by max_tokens is text; nothing to check of its calls
        calls = reply.choices[0].message.tool_calls
        assert reply.choices[0].finish_reason == "tool_calls" and 1 <= len(calls) <= most
        for call in calls:
            jsonschema.validate(json.loads(call.function.arguments), declared[call.function.name])
    streamed = client.chat.completions.create(**kwargs, parallel_tool_calls=True, stream=True)
    deltas = [d for c in streamed if c.choices for d in c.choices[0].delta.tool_calls or ()]
    indexes = sorted({d.index for d in deltas})
    assert indexes == list(range(len(indexes)))


# -- 7. no placeholder to copy -----------------------------------------------------------------


@pytest.mark.parametrize("choice", ["auto", "required", "give_item"])
@pytest.mark.parametrize("parallel", [False, True])
def test_the_tool_instructions_hold_no_placeholder_a_model_could_copy(choice: str, parallel: bool) -> None:
    """With {"reply": "<your answer>"} in its instructions, SmolLM2 answered "<your answer>" in 5
    of 10 greedy innkeeper turns (issue 28): the shapes are told in words now. Auto's words are
    plain text (issue 36): no JSON key for them is told either."""
    instructions = _spec(choice, parallel).instructions
    assert re.search(r"<[^<>\n]*>", instructions) is None, instructions
    assert '"reply"' not in instructions
    assert ("answer in words" in instructions) == (choice == "auto")


# -- 8. validation messages --------------------------------------------------------------------


@slow
@pytest.mark.parametrize("body, message, param", [
    ({"messages": [{"role": "user", "content": "Hi"}, {"role": "user", "content": 5}]},
     "messages[1].content must be a string or a list of content parts", "messages[1].content"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]},
     "messages[0].content[0].text is required", "messages[0].content[0].text"),
    ({"messages": [{"role": "user", "content": [{"type": "video", "text": "a"}]}]},
     "messages[0].content[0].type must be one of 'text', 'image_url'", "messages[0].content[0].type"),
    ({"messages": [{"role": "wizard", "content": "Hi"}]},
     "messages[0].role must be one of 'system', 'developer', 'user', 'assistant', 'tool'", "messages[0].role"),
    ({"messages": ask("Hi"), "stop": ""}, "stop must be a string of at least 1 character or a list of strings", "stop"),
    ({"messages": ask("Hi"), "stop": ["END", ""]}, "stop[1] must be a string of at least 1 character", "stop[1]"),
    ({"messages": ask("Hi"), "temperature": 3}, "temperature must be at most 2", "temperature"),
    ({"messages": ask("Hi"), "tool_choice": {"type": "function", "function": {}}},
     "tool_choice.function.name is required", "tool_choice.function.name"),
    ({"messages": []}, "messages must be a list of at least 1 item", "messages"),
    ({"messages": ask(5), "temperature": "warm", "seed": -1}, "messages[0].content must be a string or a list of content parts"
     " (and 2 more problems)", "messages[0].content"),
    ([{"role": "user"}], "the body must be an object", None),
])
def test_a_malformed_body_is_told_in_json_s_terms(api: RunningDaemon, base: str, body, message: str, param) -> None:
    refused = httpx.post(base + "/v1/chat/completions", headers=auth(api), json=body)
    assert refused.status_code == 400
    assert refused.json() == {"error": {"message": message, "type": "invalid_request_error", "param": param,
                                        "code": "invalid_argument"}}


# -- 9. context overflow -----------------------------------------------------------------------


@slow
def test_a_prompt_past_the_limit_is_context_length_exceeded(client: openai.OpenAI, model: str, api: RunningDaemon,
                                                            base: str) -> None:
    by_tokens = "hello " * (PROMPT_LIMIT + 200)  # over the limit once tokenized
    by_bytes = "x" * (PROMPT_LIMIT * 40)  # over it by its bytes, before anything tokenizes it
    for prompt in (by_tokens, by_bytes):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=model, messages=ask(prompt), max_tokens=2)
        assert e.value.code == "context_length_exceeded" and e.value.type == "invalid_request_error", e.value.body
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model=model, prompt=prompt, max_tokens=2)
        assert e.value.code == "context_length_exceeded"
    many = httpx.post(base + "/v1/chat/completions", headers=auth(api), timeout=60,
                      json={"messages": ask("hi") * PROMPT_LIMIT, "max_tokens": 2})  # more than can each fit
    assert many.status_code == 400 and many.json()["error"]["code"] == "context_length_exceeded", many.text
    with api.client(timeout_s=60) as grpc_client, pytest.raises(grpc.RpcError) as e:
        grpc_client.complete(pb.GenerateRequest(prompt=by_tokens, max_tokens=2))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # gRPC's code stays


# -- 10. CORS ----------------------------------------------------------------------------------


def _preflight(base: str, origin: str) -> httpx.Response:
    return httpx.options(base + "/v1/chat/completions", headers={
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type, x-session-id"})


@slow
def test_an_allowed_origin_gets_cors_headers_on_every_answer(api: RunningDaemon, base: str, model: str) -> None:
    allowed = _preflight(base, ORIGIN)
    assert allowed.status_code == 204 and allowed.headers["access-control-allow-origin"] == ORIGIN
    assert {"POST", "GET", "DELETE"} <= {m.strip() for m in allowed.headers["access-control-allow-methods"].split(",")}
    assert set(allowed.headers["access-control-allow-headers"].split(", ")) == {"authorization", "content-type", "x-session-id"}
    assert int(allowed.headers["access-control-max-age"]) > 0
    page = auth(api, Origin=ORIGIN)
    for answer in (httpx.get(base + "/v1/models", headers=page),  # a reply
                   httpx.get(base + "/v1/models", headers={"Origin": ORIGIN, "Authorization": "Bearer wrong-token"}),  # 401
                   httpx.post(base + "/v1/chat/completions", headers=page, json={"messages": []})):  # 400
        assert answer.headers["access-control-allow-origin"] == ORIGIN and answer.headers["vary"] == "Origin"
        assert "X-Session-Id" in answer.headers["access-control-expose-headers"]
    body = {"model": model, "messages": ask("Hi"), "max_tokens": 2, "stream": True}
    with httpx.stream("POST", base + "/v1/chat/completions", headers={**page, "X-Session-Id": "web"}, json=body,
                      timeout=60) as events:
        assert events.headers["access-control-allow-origin"] == ORIGIN and events.headers["x-session-id"] == "web"
        assert list(events.iter_lines())[-2] == "data: [DONE]"


@slow
def test_an_origin_not_allowed_gets_no_cors_headers(api: RunningDaemon, base: str) -> None:
    refused = _preflight(base, "https://evil.example")
    assert refused.status_code == 403 and refused.json()["error"]["type"] == "permission_error"
    assert "access-control-allow-origin" not in refused.headers
    # With the token the call is served, but without the header the browser keeps it from the page.
    served = httpx.get(base + "/v1/models", headers=auth(api, Origin="https://evil.example"))
    assert served.status_code == 200 and "access-control-allow-origin" not in served.headers
    assert httpx.options(base + "/v1/models", headers=auth(api)).status_code == 405  # not a preflight


def test_without_a_token_only_an_allowed_origin_may_call() -> None:
    open_api = _stand_in_api(token=None, cors=CorsPolicy([ORIGIN]))
    assert open_api.get("/v1/models").status_code == 200  # no browser: a local tool
    mine = open_api.get("/v1/models", headers={"Origin": ORIGIN})
    assert mine.status_code == 200 and mine.headers["access-control-allow-origin"] == ORIGIN
    other = open_api.get("/v1/models", headers={"Origin": "http://localhost:9999"})
    assert other.status_code == 403 and "access-control-allow-origin" not in other.headers
    assert _stand_in_api(token=None).get("/models", headers={"Origin": ORIGIN}).status_code == 403  # none allowed


@pytest.mark.parametrize("origin", ["*", "null", "http://localhost:8080/", "localhost:8080"])
def test_a_wildcard_or_malformed_cors_origin_is_a_launch_error(origin: str) -> None:
    launched = subprocess.run([sys.executable, "-m", "sidecar", "serve", "--port", "0", "--cors-origin", origin],
                              capture_output=True, text=True, timeout=120)
    assert launched.returncode == 2 and "--cors-origin" in launched.stderr, launched.stderr


def test_cors_origins_come_from_the_flag_or_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from sidecar.cli import build_parser
    from sidecar.settings import Settings

    args = build_parser().parse_args(["serve", "--cors-origin", ORIGIN, "--cors-origin", "tauri://localhost"])
    assert Settings(cors_origin=args.cors_origin).cors_origin == (ORIGIN, "tauri://localhost")
    monkeypatch.setenv("XLM_SIDECAR_CORS_ORIGIN", f"{ORIGIN}, http://[::1]:3000")
    assert Settings().cors_origin == (ORIGIN, "http://[::1]:3000")
