"""Generated cases of what an outside client broke (issue 17), against a real daemon on both transports:

- control tokens in every text field (prompt, message content, stop strings, ids, schema, question);
- lone surrogates and NULs in every string field of every frame (escaped in the JSON text);
- duplicate ids while a call runs;
- huge prompts while other streams run;
- shutdown (SIGTERM, grace period ending) with calls in flight on both transports.

Every test fails on its own crashes, hangs, undocumented codes and lost terminal frames (whatever
ran before it, or whether anything did), and the run ends with the module's tally of all five
(run_summary.py). Kept small (about a minute) so CI runs it every time.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator

import grpc
import pytest
from google.protobuf import json_format
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.daemons import RunningDaemon, start_daemon, stop_daemon
from support.run_summary import record_tally
from sidecar.api import pb
from support.bridge import ONE_THREAD, TERMINAL, BridgeClient
from support.no_early_stop import default_eog_ids, http_bias

DOCUMENTED = {"OK", "INVALID_ARGUMENT", "RESOURCE_EXHAUSTED", "NOT_FOUND", "FAILED_PRECONDITION", "UNIMPLEMENTED",
              "CANCELLED", "ALREADY_EXISTS"}
CALL_TIMEOUT_S = 120
FUZZ = settings(deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
TALLY: Counter[str] = Counter()
DAEMON_LOG: list[str] = []

CONTROL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>", "</s>", "<|eot_id|>", "<__xlm_image__>", "<image>"]
controlled = st.lists(st.sampled_from(CONTROL) | st.text(max_size=8), min_size=1, max_size=5).map("".join)
# Characters that broke frames or logs: lone surrogates, NUL, escapes, line separators.
NASTY = ["\ud800", "\udfff", "\x00", "\x1b[2J", "\u2028", "\n", "\\", '"']


FAILURES = ("crashes", "hangs", "undocumented codes", "lost terminal frames")


@pytest.fixture(scope="module", autouse=True)
def tally_printed_at_the_end(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if TALLY["requests"]:
        record_tally(request.config, "issue-17 fuzz tally", {k: TALLY[k] for k in ("requests", *FAILURES)})


@pytest.fixture(autouse=True)
def no_new_failures() -> Iterator[None]:
    """Each test answers for what it added to the tally, so no test depends on the order or the
    selection of the others."""
    before = {k: TALLY[k] for k in FAILURES}
    yield
    grown = {k: TALLY[k] - before[k] for k in FAILURES if TALLY[k] > before[k]}
    assert not grown, f"this test added to the fuzz tally: {grown}"


@pytest.fixture(scope="module")
def fuzzed() -> Iterator[RunningDaemon]:
    running = start_daemon(*ONE_THREAD, "--max-tokens-per-request", "4", "--max-prompt-tokens", "48", "--ctx", "256",
                           "--parallel", "2", "--max-sessions", "8", "--stream-interval-ms", "0", drain=False)
    reader = threading.Thread(target=lambda: DAEMON_LOG.extend(running.process.stderr), daemon=True)
    reader.start()
    yield running
    assert stop_daemon(running) == 0
    reader.join(30)


def _record(code: str) -> None:
    TALLY["requests"] += 1
    if code == "HANG":
        TALLY["hangs"] += 1
    elif code not in DOCUMENTED:
        TALLY["undocumented codes"] += 1


def _grpc_generate(address: str, token: str, request: pb.GenerateRequest) -> str:
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_stream("/xlm.v1.Sidecar/Generate", pb.GenerateRequest.SerializeToString, pb.GenerateChunk.FromString)
        try:
            chunks = list(call(request, metadata=[("authorization", f"Bearer {token}")], timeout=CALL_TIMEOUT_S))
        except grpc.RpcError as e:
            return "HANG" if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED else e.code().name
    if not chunks or not chunks[-1].HasField("final"):
        TALLY["lost terminal frames"] += 1
    return "OK"


def _ws_call(client: BridgeClient, call_id: object, frame_text: str) -> str:
    client.send(frame_text)
    try:
        frames = list(client.frames_of(call_id, timeout=CALL_TIMEOUT_S))
    except TimeoutError:
        TALLY["lost terminal frames"] += 1
        return "HANG"
    last = frames[-1]
    if sum(1 for f in frames if any(k in f for k in TERMINAL)) != 1:
        TALLY["lost terminal frames"] += 1
    return last["error"]["code"] if "error" in last else "OK"


generate_with_control_tokens = st.fixed_dictionaries(
    {"maxTokens": st.integers(1, 3)},
    optional={"stop": st.lists(controlled, max_size=2), "requestId": controlled, "sessionId": controlled,
              "jsonSchema": st.sampled_from(["", "true", '{"type": "string", "maxLength": 2}'])},
).flatmap(lambda rest: st.one_of(
    st.builds(lambda p: {**rest, "prompt": p}, controlled),
    st.builds(lambda c, r: {**rest, "messages": {"messages": [{"role": r, "content": c}]}}, controlled,
              st.sampled_from(["system", "user", "assistant"])),
))


@settings(FUZZ, max_examples=60)
@given(request=generate_with_control_tokens, transport=st.sampled_from(["grpc", "websocket"]))
def test_control_tokens_in_every_text_field(fuzzed: RunningDaemon, request: dict, transport: str) -> None:
    if transport == "grpc":
        code = _grpc_generate(fuzzed.address, fuzzed.token, json_format.ParseDict(request, pb.GenerateRequest()))
    else:
        with BridgeClient(fuzzed.ws_address, fuzzed.token) as client:
            code = _ws_call(client, "c", json.dumps({"id": "c", "method": "Generate", "request": request}))
    _record(code)
    assert code in DOCUMENTED, (request, code)


def _escaped(text: str) -> str:
    """`text` as a JSON string literal with every non-ASCII character escaped (surrogates too)."""
    return json.dumps(text, ensure_ascii=True)


frame_templates = [
    ('{{"id":{id},"method":"Generate","request":{{"prompt":{s},"maxTokens":2}}}}', True),
    ('{{"id":{id},"method":"Generate","request":{{"messages":{{"messages":[{{"role":"user","content":{s}}}]}},"maxTokens":2}}}}', True),
    ('{{"id":{id},"method":"Generate","request":{{"prompt":"hi","maxTokens":2,"stop":[{s}],"requestId":{s}}}}}', True),
    ('{{"id":{id},"method":"Generate","request":{{"prompt":"hi","maxTokens":2,"sessionId":{s}}}}}', True),
    ('{{"id":{id},"method":"AskImage","request":{{"question":{s}}}}}', True),
    ('{{"id":{id},"method":"EndSession","request":{{"sessionId":{s}}}}}', True),
    ('{{"id":{id},"method":"SetBudget","request":{{"vramSize":{s}}}}}', True),
    ('{{"id":{id},"method":{s}}}', True),
    ('{{"id":{s},"method":"GetStatus"}}', False),  # the id itself
    ('{{"id":{s},"cancel":true}}', False),
]


@settings(FUZZ, max_examples=80)
@given(template=st.sampled_from(frame_templates),
       # Always one nasty character at least (so no budget text can be a valid size).
       text=st.tuples(st.sampled_from(NASTY), st.lists(st.sampled_from(NASTY) | st.text(max_size=3), max_size=3))
       .map(lambda t: t[0] + "".join(t[1])))
def test_surrogates_and_nuls_in_every_string_field_of_every_frame(fuzzed: RunningDaemon, template, text: str) -> None:
    pattern, fixed_id = template
    frame = pattern.format(id='"f"', s=_escaped(text))
    with BridgeClient(fuzzed.ws_address, fuzzed.token) as client:
        if '"cancel"' in pattern:
            client.send(frame)  # a cancel for no call: nothing comes back
            code = "OK"
        else:
            code = _ws_call(client, "f" if fixed_id else text, frame)
        # The connection survived: a normal call on it still ends properly.
        assert "result" in client.call("GetStatus", call_id="after")[-1]
    _record(code)
    assert code in DOCUMENTED, (frame, code)


@settings(FUZZ, max_examples=15)
@given(second=st.sampled_from(["GetStatus", "Generate", "EndSession"]), id_=st.text(min_size=1, max_size=8) | st.integers(0, 99))
def test_duplicate_ids_leave_the_running_call_alone(fuzzed: RunningDaemon, second: str, id_) -> None:
    with BridgeClient(fuzzed.ws_address, fuzzed.token) as client:
        client.send({"id": id_, "method": "Generate", "request": {"prompt": "Count: 1 2 3", "maxTokens": 4, "sampling": {"temperature": 0}}})
        client.send({"id": id_, "method": second, "request": {}})
        frames = list(client.frames_of(id_, timeout=CALL_TIMEOUT_S))
        refusals = [f for f in client._stash if f.get("id") is None]
    terminals = [f for f in frames if any(k in f for k in TERMINAL)]
    if len(terminals) != 1:
        TALLY["lost terminal frames"] += 1
    _record("OK" if "end" in frames[-1] else frames[-1].get("error", {}).get("code", "?"))
    assert "end" in frames[-1], frames  # the first call was not touched
    # The second frame either found the id free (the first call already over) or was refused.
    assert all(f["error"]["code"] == "ALREADY_EXISTS" for f in refusals)


def test_huge_prompts_while_other_streams_run(fuzzed: RunningDaemon) -> None:
    arrivals: list[float] = []

    def stream() -> None:
        with BridgeClient(fuzzed.ws_address, fuzzed.token) as client:
            for _ in range(3):
                for f in client.frames_of(client_call(client), timeout=CALL_TIMEOUT_S):
                    if "chunk" in f:
                        arrivals.append(time.monotonic())

    def client_call(client: BridgeClient) -> str:
        client.send({"id": "s", "method": "Generate", "request": {"prompt": "Count: 1 2 3", "maxTokens": 4}})
        return "s"

    streamer = threading.Thread(target=stream)
    streamer.start()
    for size in (1 << 20, 6 << 20, 7 << 20):
        code = _grpc_generate(fuzzed.address, fuzzed.token, pb.GenerateRequest(prompt="x" * size, max_tokens=2))
        _record(code)
        assert code == "INVALID_ARGUMENT", code
        with BridgeClient(fuzzed.ws_address, fuzzed.token) as client:
            code = _ws_call(client, "h", json.dumps({"id": "h", "method": "Generate", "request": {"prompt": "y" * size}}))
        _record(code)
        assert code == "INVALID_ARGUMENT", code
    streamer.join(CALL_TIMEOUT_S)
    assert arrivals, "the other stream never ran"


def test_shutdown_with_calls_in_flight_ends_every_call() -> None:
    running = start_daemon(*ONE_THREAD, "--grace-seconds", "1", "--stream-interval-ms", "0", "--parallel", "8")
    # The end-of-generation tokens banned: all five calls are surely still running at SIGTERM.
    endless = {"prompt": "Here is a list of every number from 1 to 1000:\n1\n2\n", "maxTokens": 2000,
               "sampling": {"temperature": 0, "repeatPenalty": 1, "logitBias": http_bias(default_eog_ids())}}
    outcomes: list[str] = []

    def grpc_stream() -> None:
        outcomes.append(_grpc_generate(running.address, running.token, json_format.ParseDict(endless, pb.GenerateRequest())))

    try:
        threads = [threading.Thread(target=grpc_stream) for _ in range(2)]
        for t in threads:
            t.start()
        with BridgeClient(running.ws_address, running.token) as client:
            for i in range(3):
                client.send({"id": i, "method": "Generate", "request": endless})
            # All five calls are in flight (not a fixed sleep: how soon depends on the machine).
            with running.client(timeout_s=60) as watcher:
                deadline = time.monotonic() + 60
                while watcher.status().throughput.requests_active < 5:
                    assert time.monotonic() < deadline, "the calls never all started"
                    time.sleep(0.05)
            running.process.send_signal(signal.SIGTERM)
            for i in range(3):
                try:
                    frames = list(client.frames_of(i, timeout=60))
                except Exception:
                    frames = []
                ended = [f for f in frames if any(k in f for k in TERMINAL)]
                if len(ended) != 1:
                    TALLY["lost terminal frames"] += 1
                _record("OK" if ended and "end" in ended[0] else (ended[0]["error"]["code"] if ended else "HANG"))
        for t in threads:
            t.join(60)
        for code in outcomes:
            _record(code)
        assert running.process.wait(timeout=60) == 0
    finally:
        if running.process.poll() is None:
            running.process.kill()
            TALLY["crashes"] += 1


def test_the_fuzzed_daemon_stayed_up_and_logged_no_crash(fuzzed: RunningDaemon) -> None:
    time.sleep(0.5)  # the reader thread catches up
    if fuzzed.process.poll() is not None:
        TALLY["crashes"] += 1
    text = "".join(DAEMON_LOG)
    TALLY["crashes"] += text.count("unexpected error") + text.count("Traceback")
    for line in DAEMON_LOG:
        assert isinstance(json.loads(line), dict), line  # every log line is one JSON object
    assert fuzzed.process.poll() is None
