"""schemathesis against the HTTP API's own OpenAPI document (served at /openapi.json): generated
requests, valid and not, must never get a 5xx, nor an answer the document does not describe
(status, content type, body schema). Replies are capped at 8 tokens so the run stays short."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator

import pytest
import schemathesis
from schemathesis import GenerationMode
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from support.daemons import RunningDaemon, start_daemon, stop_daemon
from support.openai_http_support import http_base

pytestmark = pytest.mark.slow
EXAMPLES = 30
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def fuzzed() -> Iterator[RunningDaemon]:
    running = start_daemon("--no-websocket", "--max-tokens-per-request", "8", "--max-sessions", "16")
    yield running
    stop_daemon(running)


def test_no_5xx_and_every_answer_fits_the_document(fuzzed: RunningDaemon) -> None:
    """Each operation of the document, with examples drawn from its schemas (valid and invalid),
    through hypothesis directly: schemathesis's pytest plugin does not load on this pytest."""
    api = schemathesis.openapi.from_url(http_base(fuzzed) + "/openapi.json")
    headers = {"Authorization": f"Bearer {fuzzed.token}"}
    operations = [result.ok() for result in api.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health"}
    statuses: Counter[tuple[str, int]] = Counter()
    for operation, mode in itertools.product(operations, GenerationMode):

        @given(case=operation.as_strategy(mode))
        @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None,
                  derandomize=True)  # the same examples every run: a refusal is reproducible
        def fuzz(case) -> None:
            response = case.call_and_validate(headers=headers, checks=CHECKS, timeout=60)
            statuses[(operation.path, response.status_code)] += 1

        try:
            fuzz()
        except Unsatisfiable:
            assert mode is GenerationMode.NEGATIVE  # nothing invalid to send (no body, no parameters)
    # Generated bodies are nearly always refused (a random role, a tool message, an image on a
    # daemon without a projector, a prompt of the wrong type): an answer of each kind is checked
    # against the document here too, so the 200s' schemas are always exercised.
    chat = next(op for op in operations if op.path == "/v1/chat/completions")
    completions = next(op for op in operations if op.path == "/v1/completions")
    answered: Counter[tuple[str, int]] = Counter()
    for stream in (False, True):
        usage = {"stream_options": {"include_usage": True}} if stream else {}
        bodies = [(chat, {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}],
                          "stream": stream, **usage}),
                  (completions, {"prompt": "Once upon a time", "stream": stream, **usage})]
        for op, body in bodies:
            response = op.Case(body=body, media_type="application/json").call_and_validate(headers=headers, checks=CHECKS)
            answered[(op.path, response.status_code)] += 1
    print(sorted(statuses.items()), sorted(answered.items()))
    assert answered == {("/v1/chat/completions", 200): 2, ("/v1/completions", 200): 2}, answered
    # Most generated requests are refused, but some must have reached a handler and been served.
    assert sum(n for (path, code), n in statuses.items() if code == 200 and path != "/health") >= 10, statuses
