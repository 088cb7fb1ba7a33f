"""The official `openai` npm package (tests/js, installed with `npm ci` from the committed lock
file) against a live daemon: chat, streaming, a session, a JSON schema reply, 401, 400, 413; what
issue 28 added, as the npm client sends it (n choices, logprobs, a logit_bias ban, a GBNF grammar,
a base URL without /v1, any model name, embeddings in the client's base64, a clamped max_tokens,
an assistant message with two tool calls); and a stream aborted mid-way, which must leave no
request running."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator

import pytest

from support.daemons import REPO, RunningDaemon, start_daemon, stop_daemon
from support.openai_http_support import http_base

pytestmark = pytest.mark.slow
JS = REPO / "tests" / "js"
REQUIRE_TOOLS = os.environ.get("XLM_REQUIRE_CLIENT_TOOLS") == "1"
CHECKS = ["chat", "streaming", "session_holds_earlier_turns", "json_schema", "wrong_token_401", "n_17_is_400",
          "two_megabytes_is_413", "n_3_choices", "logprobs_one_entry_per_token", "logit_bias_bans_tokens", "gbnf_grammar",
          "base_url_without_v1", "any_model_name", "embeddings_base64_decoded", "max_tokens_above_the_limit_is_clamped",
          "assistant_message_with_two_tool_calls", "cancel_by_abort"]


def _missing(what: str) -> None:
    """Skip where a tool is missing, except in CI (XLM_REQUIRE_CLIENT_TOOLS=1), where it is a failure."""
    if REQUIRE_TOOLS:
        pytest.fail(f"{what} (XLM_REQUIRE_CLIENT_TOOLS=1)")
    pytest.skip(what)


@pytest.fixture(scope="module")
def node() -> str:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        _missing("node and npm are needed for the JavaScript client test")
    major = int(subprocess.run([node, "--version"], capture_output=True, text=True, check=True).stdout.strip("v\n").split(".")[0])
    if major < 20:
        _missing(f"Node 20 or newer is needed, found {major}")
    if not (JS / "node_modules" / "openai" / "package.json").is_file():
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=JS, check=True, timeout=300)
    return node


@pytest.fixture(scope="module")
def api() -> Iterator[RunningDaemon]:
    running = start_daemon("--no-websocket", "--stream-interval-ms", "0")
    yield running
    stop_daemon(running)


def test_the_openai_npm_package_against_the_daemon(node: str, api: RunningDaemon) -> None:
    run = subprocess.run([node, str(JS / "openai_checks.mjs"), http_base(api), api.token], capture_output=True,
                         text=True, timeout=300, cwd=JS)
    results = {r["check"]: r for r in (json.loads(line) for line in run.stdout.splitlines() if line.startswith("{"))}
    assert list(results) == CHECKS, run.stdout + run.stderr
    failed = {name: r["error"] for name, r in results.items() if not r["ok"]}
    assert not failed and run.returncode == 0, json.dumps(failed, indent=1) + run.stderr
    # The aborted stream asked for 2000 tokens (over 10 s here): it must be gone at once.
    with api.client(timeout_s=30) as c:
        deadline = time.monotonic() + 5
        while c.status().throughput.requests_active and time.monotonic() < deadline:
            time.sleep(0.05)
        assert c.status().throughput.requests_active == 0
    assert time.time() - results["cancel_by_abort"]["aborted_at"] / 1000 < 5, "idle only long after the abort"
