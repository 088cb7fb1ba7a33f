"""Jump-forward decoding seen from outside (issue 40): on by default on every transport, off with
--no-jump-forward, and the final usage says how many tokens it fed without a pass of their own.
Replies must parse and fit the schema; what the model chose is never asserted."""

from __future__ import annotations

import json
from collections.abc import Iterator

import jsonschema
import openai
import pytest

from support.daemons import RunningDaemon, start_daemon, stop_daemon
from support.openai_http_support import http_base
from sidecar.api import pb
from support.bridge import BridgeClient

SCHEMA = {"type": "object", "properties": {
    "name": {"const": "give_item"},
    "arguments": {"type": "object", "properties": {"item": {"type": "string", "maxLength": 12}, "count": {"type": "integer"}},
                  "required": ["item", "count"]}}, "required": ["name", "arguments"]}
ASK = "Give the guard a sword."


@pytest.fixture(scope="module", params=["on", "off"])
def daemon(request: pytest.FixtureRequest) -> Iterator[tuple[RunningDaemon, bool]]:
    flags = ("--threads", "1", "--ctx", "1024", "--no-frame-guard")
    running = start_daemon(*flags, *(("--no-jump-forward",) if request.param == "off" else ()))
    yield running, request.param == "on"
    assert stop_daemon(running) == 0


def test_grpc(daemon) -> None:
    running, on = daemon
    request = pb.GenerateRequest(prompt=ASK, max_tokens=80, json_schema=json.dumps(SCHEMA),
                                 sampling=pb.SamplingParams(temperature=0.0))
    with running.client(timeout_s=120) as client:
        reply = client.complete(request)
    jsonschema.validate(json.loads(reply.text), SCHEMA)
    assert (reply.final.usage.forced_tokens > 0) == on
    assert reply.final.usage.forced_tokens < reply.final.usage.completion_tokens


def test_bridge(daemon) -> None:
    running, on = daemon
    with BridgeClient(running.ws_address, running.token) as client:
        frames = client.call("Generate", {"prompt": ASK, "maxTokens": 80, "jsonSchema": json.dumps(SCHEMA),
                                          "sampling": {"temperature": 0}})
    text = "".join(f.get("chunk", {}).get("text", "") for f in frames)
    final = next(f["chunk"]["final"] for f in frames if "final" in f.get("chunk", {}))
    jsonschema.validate(json.loads(text), SCHEMA)
    assert (final["usage"].get("forcedTokens", 0) > 0) == on


def test_http_with_the_openai_client(daemon) -> None:
    running, on = daemon
    client = openai.OpenAI(base_url=http_base(running) + "/v1", api_key=running.token, max_retries=0)
    reply = client.chat.completions.create(
        model="npc", messages=[{"role": "user", "content": ASK}], max_tokens=80, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "act", "schema": SCHEMA}})
    jsonschema.validate(json.loads(reply.choices[0].message.content), SCHEMA)
    assert ((reply.usage.model_extra or {}).get("forced_tokens", 0) > 0) == on
