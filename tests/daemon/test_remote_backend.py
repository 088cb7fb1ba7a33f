"""Remote mode: the daemon keeps its gRPC API and forwards generation to an OpenAI-compatible server.

The server here is real: llama-cpp-python's own (`python -m llama_cpp.server`) serving SmolLM2,
on loopback. The daemons are real processes (conftest.start_daemon). The wire rules (bodies,
chunks, error mapping) are also checked on their own, as pure functions.
"""

from __future__ import annotations

import asyncio
import http.server
import importlib.util
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from support.daemons import RunningDaemon, start_daemon, stop_daemon
from sidecar.api import pb
from sidecar.client import Reply
from sidecar.backend.requests import Finished, FinishReason, GenerationSpec, Prompt, TextDelta
from sidecar.backend.sampling import SamplingConfig
from sidecar.errors import FailedPrecondition, InvalidArgument, ResourceExhausted, Unavailable
from sidecar.remote import wire
from sidecar.remote.backend import RemoteBackend, RemoteOptions
from sidecar.remote.models import remote_model_facts
from sidecar.remote.serve import _api_base

from support.no_early_stop import file_eog_ids, grpc_sampling, http_bias

KEY_ENV = "XLM_TEST_REMOTE_KEY"
KEY = "remote-server-key-0123456789"


def _server_available() -> bool:
    return importlib.util.find_spec("llama_cpp.server") is not None and importlib.util.find_spec("uvicorn") is not None


needs_server = pytest.mark.skipif(
    not _server_available() and os.environ.get("XLM_REQUIRE_CLIENT_TOOLS") != "1",
    reason="llama-cpp-python's OpenAI server needs the [server] extra (uvicorn, fastapi, sse-starlette): pip install -e '.[dev]'",
)


# -- the wire format, on its own ---------------------------------------------------------------------


def _spec(**kwargs: object) -> GenerationSpec:
    kwargs.setdefault("prompt", Prompt(messages=(("user", "hi"),)))
    return GenerationSpec(**kwargs)  # type: ignore[arg-type]


def test_chat_body_carries_sampling_and_schema_but_not_stop_strings() -> None:
    spec = _spec(
        sampling=SamplingConfig(temperature=0.2, top_k=0, top_p=0.9, min_p=0.1, repeat_penalty=1.2, seed=7),
        max_tokens=33,
        stop=("\n",),
        json_schema='{"type": "object"}',
    )
    body = wire.chat_body("m", [("system", "be brief"), ("user", "hi")], spec)
    assert body["messages"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert body["model"] == "m" and body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert (body["max_tokens"], body["temperature"], body["top_p"], body["min_p"], body["seed"]) == (33, 0.2, 0.9, 0.1, 7)
    assert body["repeat_penalty"] == body["repetition_penalty"] == 1.2
    assert "top_k" not in body  # 0 = off: left to the server's default
    assert "stop" not in body  # the daemon cuts stop strings itself
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "reply", "schema": {"type": "object"}, "strict": True},
    }


def test_completion_body_without_model_or_seed() -> None:
    body = wire.completion_body(None, "Once upon", _spec(prompt=Prompt(text="Once upon")))
    assert body["prompt"] == "Once upon" and "model" not in body and "seed" not in body
    assert body["top_k"] == SamplingConfig().top_k and "response_format" not in body
    ids = wire.completion_body(None, [5, 6], _spec(prompt=Prompt(token_ids=(5, 6))))
    assert ids["prompt"] == [5, 6]


@pytest.mark.parametrize(
    ("data", "text", "finish", "usage"),
    [
        ('{"choices":[{"delta":{"role":"assistant"},"finish_reason":null}]}', "", None, None),
        ('{"choices":[{"delta":{"content":"Hel"},"finish_reason":null}]}', "Hel", None, None),
        ('{"choices":[{"text":"lo","finish_reason":"length"}]}', "lo", "length", None),
        (
            '{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":5}}}',
            "",
            None,
            wire.ChunkUsage(9, 4, 5),
        ),
    ],
)
def test_parse_chunk(data: str, text: str, finish: str | None, usage: wire.ChunkUsage | None) -> None:
    chunk = wire.parse_chunk(data)
    assert (chunk.text, chunk.finish_reason, chunk.usage) == (text, finish, usage)


def test_parse_chunk_reads_llama_cpp_timings_and_in_stream_errors() -> None:
    chunk = wire.parse_chunk('{"choices":[],"timings":{"prompt_per_second":500.5,"predicted_per_second":42.0}}')
    assert chunk.timings == wire.ServerTimings(500.5, 42.0)
    with pytest.raises(InvalidArgument, match="too long"):
        wire.parse_chunk('{"error":{"code":400,"message":"too long"}}')
    with pytest.raises(Unavailable, match="not JSON"):
        wire.parse_chunk("<html>")
    assert wire.parse_sse_line("data: [DONE]") == "[DONE]"
    assert wire.parse_sse_line(": keep-alive") is None and wire.parse_sse_line("event: x") is None


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, InvalidArgument),
        (422, InvalidArgument),
        (401, FailedPrecondition),
        (403, FailedPrecondition),
        (404, FailedPrecondition),
        (429, ResourceExhausted),
        (408, Unavailable),
        (500, Unavailable),
        (503, Unavailable),
    ],
)
def test_http_status_maps_to_our_errors(status: int, kind: type) -> None:
    error = wire.error_for_status(status, "the server's words")
    assert type(error) is kind and "the server's words" in str(error) and str(status) in str(error)


def test_error_message_reads_openai_and_fastapi_shapes() -> None:
    assert wire.error_message(b'{"error":{"message":"bad model"}}') == "bad model"
    assert wire.error_message(b'{"detail":"Invalid API key"}') == '"Invalid API key"'
    assert wire.error_message(b"plain failure") == "plain failure"


def test_finish_reasons() -> None:
    assert wire.finish_reason("length") is FinishReason.LENGTH
    assert wire.finish_reason("stop") is FinishReason.STOP
    assert wire.finish_reason("tool_calls") is FinishReason.STOP


def test_model_facts_from_llama_cpp_and_vllm_listings() -> None:
    llama = {"data": [{"id": "qwen", "meta": {"n_params": 4_000_000_000, "size": 2_500_000_000, "n_ctx_train": 40960}}]}
    facts = remote_model_facts("http://h:8080/v1", llama, None)
    assert (facts.path, facts.name, facts.architecture, facts.parameters, facts.trained_context) == (
        "http://h:8080/v1", "qwen", "remote", 4_000_000_000, 40960,
    )
    vllm = {"data": [{"id": "a"}, {"id": "b", "max_model_len": 8192}]}
    assert remote_model_facts("u", vllm, "b").trained_context == 8192
    assert remote_model_facts("u", vllm, "c").name == "c"  # not listed: keep the name we were told


def test_api_base() -> None:
    assert _api_base("http://h:8000") == "http://h:8000/v1"
    assert _api_base("http://h:8000/v1/") == "http://h:8000/v1"
    assert _api_base("https://h/llm/v1") == "https://h/llm/v1"


# -- a real server and real daemons ---------------------------------------------------------------------


class RemoteServer:
    """`python -m llama_cpp.server` on a free loopback port."""

    def __init__(self, model: Path, api_key: str | None = None) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--host", "127.0.0.1",
               "--port", str(self.port), "--n_ctx", "2048", "--verbose", "false"]
        if api_key:
            cmd += ["--api_key", api_key]
        self.process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"llama_cpp.server exited: {self.process.stderr.read() if self.process.stderr else ''}")
            try:
                if httpx.get(f"{self.url}/models", headers=headers, timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError("llama_cpp.server did not answer within 60 s")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)


@pytest.fixture(scope="module")
def server(smollm2_path: Path) -> Iterator[RemoteServer]:
    running = RemoteServer(smollm2_path, api_key=KEY)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def remote_daemon(server: RemoteServer) -> Iterator[RunningDaemon]:
    daemon = start_daemon("--remote-url", server.url, "--remote-api-key-env", KEY_ENV, env={KEY_ENV: KEY}, timeout_s=60)
    yield daemon
    assert stop_daemon(daemon) == 0


@pytest.fixture(scope="module")
def eog(smollm2_path: Path) -> tuple[int, ...]:
    """The remote model's end-of-generation tokens (the server's model file: a remote-mode daemon
    has no Tokenize), banned where a test needs a reply with tokens, or its whole length; the
    daemon forwards logit_bias to the server as OpenAI's."""
    return file_eog_ids(smollm2_path)


def _chat(daemon: RunningDaemon, text: str, **kwargs: object) -> Reply:
    reply = Reply()
    kwargs.setdefault("sampling", pb.SamplingParams(temperature=0.0))
    with daemon.client(timeout_s=60) as client:
        pieces = list(client.chat(text, reply=reply, **kwargs))
    assert "".join(pieces) == reply.text
    return reply


@needs_server
def test_reply_streams_through_the_daemon(remote_daemon: RunningDaemon, server: RemoteServer, eog) -> None:
    listening = next(e for e in remote_daemon.log_lines if e["event"] == "listening")
    assert listening["backend"] == "remote" and listening["remote_url"] == server.url
    reply = _chat(remote_daemon, "Name three colours.", max_tokens=24, sampling=grpc_sampling(eog, temperature=0.0))
    words = reply.text.split()
    assert len(words) >= 3 and sum(c.isalpha() or c.isspace() for c in reply.text) > 0.7 * len(reply.text), reply.text
    assert reply.final is not None
    assert reply.final.finish_reason in (pb.FINISH_REASON_STOP, pb.FINISH_REASON_LENGTH)
    assert 0 < reply.final.usage.completion_tokens <= 24
    assert reply.final.timings.time_to_first_token_ms > 0 and reply.final.timings.decode_tokens_per_s > 0


@needs_server
def test_second_turn_carries_the_history(remote_daemon: RunningDaemon) -> None:
    def session_tokens() -> int:
        with remote_daemon.client(timeout_s=30) as client:
            return {s.session_id: s.tokens for s in client.status().sessions}.get("aria", 0)

    _chat(remote_daemon, "My name is Aria. Remember it.", session_id="aria", max_tokens=20)
    after_first = session_tokens()
    _chat(remote_daemon, "What is my name?", session_id="aria", max_tokens=20)
    # The mechanism, not the model's words (which differ by CPU): the session holds the first turn
    # and the second on top of it (the server is sent the whole history each turn).
    assert session_tokens() > after_first > 0
    with remote_daemon.client(timeout_s=30) as client:
        sessions = {s.session_id: s for s in client.status().sessions}
        assert sessions["aria"].tokens > 0
        assert client.end_session("aria") == sessions["aria"].tokens
        with pytest.raises(grpc.RpcError) as e:
            client.end_session("aria")
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
    _chat(remote_daemon, "What is my name?", session_id="aria", max_tokens=20)
    # Ended: the same id starts over, holding one turn again, not three.
    assert 0 < session_tokens() < after_first + 24


@needs_server
def test_the_openai_api_is_served_in_remote_mode_too(remote_daemon: RunningDaemon, server: RemoteServer, eog) -> None:
    """A plugin that speaks OpenAI's protocol works against a remote-mode daemon as against a local
    one: the official client, the daemon's token, its sessions (the server is never given them)."""
    import openai

    from support.openai_http_support import http_base

    client = openai.OpenAI(base_url=http_base(remote_daemon) + "/v1", api_key=remote_daemon.token, max_retries=0)
    served = [m.id for m in client.models.list().data]
    model = served[0]
    assert len(served) == 1 and model == next(e for e in remote_daemon.log_lines if e["event"] == "ready")["model"]
    # As OpenAI clients do, the whole conversation every turn; the session sees what is new.
    conversation = [{"role": "user", "content": "My name is Aria. Remember it."}]
    first = client.chat.completions.create(model=model, messages=conversation, max_tokens=20, temperature=0,
                                           extra_headers={"X-Session-Id": "http-aria"})
    conversation += [{"role": "assistant", "content": first.choices[0].message.content},
                     {"role": "user", "content": "What is my name?"}]
    # The end-of-generation tokens banned: the second turn says something, whatever the model would.
    chunks = client.chat.completions.create(model=model, messages=conversation, max_tokens=20, temperature=0,
                                            stream=True, extra_headers={"X-Session-Id": "http-aria"},
                                            logit_bias=http_bias(eog))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip(), text  # what it says differs by CPU; the session is checked below
    with remote_daemon.client(timeout_s=30) as grpc_client:
        # One session, kept by the daemon: the second turn continued it instead of starting over.
        assert grpc_client.end_session("http-aria") > 0
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=http_base(remote_daemon) + "/v1", api_key=KEY, max_retries=0).models.list()
    # Candidates are forwarded as that many requests; what only a local model gives is refused by name.
    two = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], n=2, max_tokens=4)
    assert [c.index for c in two.choices] == [0, 1]
    with pytest.raises(openai.BadRequestError, match="remote mode"):
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], logprobs=True)


@needs_server
def test_stop_string_is_cut_by_the_daemon(remote_daemon: RunningDaemon, eog) -> None:
    prompt = "Tell me about the sea."
    # The server keeps the last prompt's KV: after a first call, the two compared are computed alike.
    # The end-of-generation tokens are banned in all three: the whole reply runs its 30 tokens.
    no_end = grpc_sampling(eog, temperature=0.0)
    _chat(remote_daemon, prompt, max_tokens=1, sampling=no_end)
    whole = _chat(remote_daemon, prompt, max_tokens=30, sampling=no_end)
    assert len(whole.text) >= 24, whole.text
    # Greedy decoding repeats the same reply, so a piece from its middle, likely spanning two
    # chunks, must end it right before that piece's first appearance.
    stop = whole.text[12:20]
    cut = _chat(remote_daemon, prompt, max_tokens=30, stop=[stop], sampling=no_end)
    assert cut.final.finish_reason == pb.FINISH_REASON_STOP_STRING
    assert cut.text == whole.text[: whole.text.index(stop)]


@needs_server
def test_cancel_ends_the_call_and_frees_the_daemon(remote_daemon: RunningDaemon, eog) -> None:
    with remote_daemon.client(timeout_s=60) as client:
        # No end-of-generation token: the first chunk has text, and the call still runs when cancelled.
        stream = client.generate(pb.GenerateRequest(prompt="Once upon a time", max_tokens=400, sampling=grpc_sampling(eog)))
        first = next(stream)
        assert first.text
        stream.close()  # cancels the call
        deadline = time.monotonic() + 5
        while client.status().throughput.requests_active and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.status().throughput.requests_active == 0
    assert _chat(remote_daemon, "Hi", max_tokens=4).final is not None


class SlowStream(http.server.BaseHTTPRequestHandler):
    """An OpenAI-style server that streams one chunk every 20 ms, up to 500, and notes when the
    client hangs up: it shows what llama.cpp's server sees when a call is cancelled."""

    sent = 0
    hung_up = threading.Event()

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        try:
            for _ in range(500):
                self.wfile.write(b'data: {"choices":[{"delta":{"content":"word "},"finish_reason":null}]}\n\n')
                self.wfile.flush()
                type(self).sent += 1
                time.sleep(0.02)
        except (BrokenPipeError, ConnectionResetError):
            type(self).hung_up.set()

    def log_message(self, *args: object) -> None:
        pass


def test_cancel_closes_the_http_stream() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), SlowStream)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    async def run() -> list[object]:
        backend = await RemoteBackend.start(RemoteOptions(url=f"http://127.0.0.1:{server.server_port}/v1", model="m"))
        events: list[object] = []
        got_text = asyncio.Event()

        def sink(event: object) -> None:
            events.append(event)
            got_text.set()

        job = backend.submit(_spec(max_tokens=500), sink)
        await asyncio.wait_for(got_text.wait(), 10)
        job.cancel()
        while backend.snapshot().requests_active:
            await asyncio.sleep(0.01)
        await backend.aclose()
        return events

    try:
        events = asyncio.run(run())
        assert SlowStream.hung_up.wait(5), "the server never saw the connection close"
        assert SlowStream.sent < 100
        assert isinstance(events[-1], Finished) and events[-1].reason is FinishReason.CANCELLED
    finally:
        server.shutdown()


class Garbled(http.server.BaseHTTPRequestHandler):
    """A server whose usage chunk is not numbers, and one that ends its body without finishing."""

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.wfile.write(b'data: {"choices":[{"delta":{"content":"hi"},"finish_reason":null}]}\n\n')
        if self.path.endswith("/chat/completions"):
            self.wfile.write(b'data: {"choices":[],"usage":{"prompt_tokens":"many","completion_tokens":"few"}}\n\n')

    def log_message(self, *args: object) -> None:
        pass


def test_a_reply_the_daemon_cannot_read_ends_the_call_unavailable() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Garbled)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    async def run(spec: GenerationSpec) -> object:
        backend = await RemoteBackend.start(RemoteOptions(url=f"http://127.0.0.1:{server.server_port}/v1", model="m"))
        ended = asyncio.Event()
        events: list[object] = []

        def sink(event: object) -> None:
            events.append(event)
            if not isinstance(event, TextDelta):
                ended.set()

        backend.submit(spec, sink)
        await asyncio.wait_for(ended.wait(), 10)
        await backend.aclose()
        return events[-1]

    try:
        garbled = asyncio.run(run(_spec()))
        assert isinstance(garbled, Unavailable) and "cannot read" in str(garbled)
        cut_off = asyncio.run(run(_spec(prompt=Prompt(text="Once"))))
        assert isinstance(cut_off, Unavailable) and "without finishing" in str(cut_off)
    finally:
        server.shutdown()


@needs_server
def test_set_budget_is_accepted_and_status_names_the_server(remote_daemon: RunningDaemon, server: RemoteServer) -> None:
    with remote_daemon.client(timeout_s=30) as client:
        response = client.set_budget(pb.SetBudgetRequest(vram_size="2G", max_cpu_threads=2))
        assert (response.reloaded, response.budget.vram_bytes, response.budget.max_cpu_threads) == (False, 2 << 30, 2)
        status = client.status()
    assert status.model.path == server.url and status.model.architecture == "remote"
    assert status.model.name.endswith(".gguf")  # llama-cpp-python's server names its model by path
    assert status.budget.vram_bytes == 2 << 30 and status.memory.vram_used_bytes == 0
    # No schedule runs here: none is reported (it was once a made-up one), and the limits are the daemon's.
    assert not response.HasField("schedule") and not status.HasField("schedule")
    assert status.memory.placement_device == "" and status.limits.max_prompt_tokens == 0
    assert status.limits.max_sessions > 0 and status.limits.max_tokens_per_request > 0


@needs_server
def test_what_needs_a_local_model_is_unimplemented_on_every_transport(remote_daemon: RunningDaemon) -> None:
    from support.openai_http_support import http_base

    with remote_daemon.client(timeout_s=30) as client:
        for call in (lambda: client.tokenize("hi"), lambda: client.detokenize([1, 2]), lambda: client.embed(["hi"])):
            with pytest.raises(grpc.RpcError) as e:
                call()
            assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED and "remote mode" in e.value.details()
    with httpx.Client(base_url=http_base(remote_daemon), headers={"Authorization": f"Bearer {remote_daemon.token}"},
                      timeout=30) as http:
        refused = http.post("/tokenize", json={"content": "hi"})
        assert refused.status_code == 501 and "remote mode" in refused.text
        assert http.post("/v1/embeddings", json={"input": "hi"}).status_code == 501
        props = http.get("/props").json()
        # The slots and the context are the server's, unknown here (the slots were once a made-up 4).
        assert props["total_slots"] is None and props["default_generation_settings"]["n_ctx"] is None


@needs_server
def test_refused_key_is_failed_precondition(server: RemoteServer) -> None:
    async def run() -> object:
        backend = await RemoteBackend.start(RemoteOptions(url=server.url, api_key="not-the-key-0123456"))
        events: list[object] = []
        done = asyncio.Event()

        def sink(event: object) -> None:
            events.append(event)
            done.set()

        backend.submit(_spec(), sink)
        await asyncio.wait_for(done.wait(), 30)
        await backend.aclose()
        return events[-1]

    error = asyncio.run(run())
    assert isinstance(error, FailedPrecondition) and "Invalid API key" in str(error) and "401" in str(error)


@needs_server
def test_server_killed_mid_reply_is_unavailable_and_the_daemon_stays_up(smollm2_path: Path, eog) -> None:
    doomed = RemoteServer(smollm2_path)
    daemon = start_daemon("--remote-url", doomed.url, timeout_s=60)
    try:
        with daemon.client(timeout_s=60) as client:
            # No end-of-generation token: the reply is still streaming when its server dies.
            stream = client.generate(pb.GenerateRequest(prompt="Once upon a time", max_tokens=400, sampling=grpc_sampling(eog)))
            assert next(stream).text
            doomed.stop()
            with pytest.raises(grpc.RpcError) as e:
                for _ in stream:
                    pass
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE, e.value.details()
            # Refused connections are UNAVAILABLE too, and say where.
            with pytest.raises(grpc.RpcError) as e:
                list(client.generate(pb.GenerateRequest(prompt="Hello", max_tokens=4)))
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE and doomed.url in e.value.details()
            assert client.status().throughput.requests_active == 0
        assert daemon.process.poll() is None
    finally:
        doomed.stop()
        assert stop_daemon(daemon) == 0


def test_remote_flags_that_do_not_go_together_exit_2(tmp_path: Path) -> None:
    base = [sys.executable, "-m", "sidecar", "serve", "--port", "0", "--no-auth", "--log-format", "json"]
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    cases = [
        (["--remote-url", "ftp://h/v1"], "--remote-url"),
        (["--remote-url", "http://127.0.0.1:9/v1", "--model", str(model)], "do not go together"),
        (["--remote-url", "http://127.0.0.1:9/v1", "--remote-api-key-env", "XLM_TEST_UNSET_VARIABLE"], "is not set"),
    ]
    env = {k: v for k, v in os.environ.items() if k != "XLM_TEST_UNSET_VARIABLE"}
    for flags, said in cases:
        done = subprocess.run(base + flags, capture_output=True, text=True, timeout=60, env=env)
        assert done.returncode == 2, (flags, done.stderr)
        assert said in done.stderr, done.stderr



@needs_server
def test_token_id_prompts_are_forwarded_as_ids(remote_daemon: RunningDaemon, smollm2_path: Path) -> None:
    """The ids go on as a list of integers, as the OpenAI API takes them (llama-server and vLLM
    do). llama-cpp-python's server takes text only: its refusal, which quotes what it was sent,
    shows the ids went as ids, and reaches the game as an error while the daemon serves on."""
    from llama_cpp import Llama

    vocab = Llama(model_path=str(smollm2_path), vocab_only=True, verbose=False)
    ids = [vocab.tokenize(c.encode(), add_bos=False)[0] for c in "Hello there"]
    with remote_daemon.client(timeout_s=60) as client:
        with pytest.raises(grpc.RpcError) as err:
            client.complete(pb.GenerateRequest(prompt_tokens=pb.TokenIds(ids=ids), max_tokens=2))
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE and str(ids) in err.value.details()
        assert client.complete(pb.GenerateRequest(prompt="Hello", max_tokens=2)).final is not None
