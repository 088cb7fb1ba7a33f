"""Fuzz both transports of one daemon with hypothesis: well-typed requests with wild values over
gRPC and the WebSocket bridge, undecodable bytes over gRPC, garbage frames over the WebSocket.

Whatever comes in: no crash, no hang (every call ends within a generous deadline), only the
documented status codes, and the daemon answers a normal call afterwards. Limits are set low
(max 4 tokens per request, 48 prompt tokens, 8 sessions) so most requests fail fast and the few
valid ones finish in a fraction of a second.
"""

from __future__ import annotations

import base64
import json
import math
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator

import grpc
import pytest
from google.protobuf import json_format
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.daemons import RunningDaemon, start_daemon, stop_daemon
from sidecar.api import pb
from sidecar.budget import parse_size
from sidecar.errors import InvalidArgument
from support.no_early_stop import grpc_eog_ids, grpc_sampling
from support.bridge import ONE_THREAD, BridgeClient

# What a call may end with. DEADLINE_EXCEEDED, INTERNAL, UNKNOWN or UNAVAILABLE would mean a hang,
# a crash or a bug at the edge.
DOCUMENTED = {"OK", "INVALID_ARGUMENT", "RESOURCE_EXHAUSTED", "NOT_FOUND", "UNIMPLEMENTED", "FAILED_PRECONDITION",
              "ALREADY_EXISTS"}  # the bridge's refusal of a frame reusing an id in flight (id null)
CALL_TIMEOUT_S = 120  # generous: the machine running the tests may be busy
FUZZ = settings(
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
SENT: Counter[str] = Counter()  # requests sent, per test, for the total check at the end
CODES: Counter[tuple[str, str, str]] = Counter()  # (transport, method, code) of well-typed requests


@pytest.fixture(scope="module")
def fuzzed() -> Iterator[RunningDaemon]:
    running = start_daemon(
        *ONE_THREAD,
        "--max-tokens-per-request", "4",
        "--max-prompt-tokens", "48",
        "--ctx", "256",
        "--parallel", "2",
        "--max-sessions", "8",
        "--stream-interval-ms", "0",
        drain=False,
    )
    # Read its log for the whole module: a full pipe would stall the daemon, and the log must not
    # show a single unexpected error.
    log: list[str] = []
    reader = threading.Thread(target=lambda: log.extend(running.process.stderr), daemon=True)
    reader.start()
    yield running
    assert stop_daemon(running) == 0
    reader.join(30)
    text = "".join(log)
    assert "unexpected error" not in text and "Traceback" not in text, text[-4000:]


# -- requests as proto JSON dicts (both transports) --------------------------------------------------

texts = st.text(max_size=40) | st.sampled_from(["", "Hello", "Greetings, traveller!", "x" * 600, "ü" * 30, "\x00"])
small_ints = st.integers(0, 6)
uint32 = st.integers(0, 2**32 - 1)
int32 = st.integers(-(2**31), 2**31 - 1)
# Non-finite floats as the JSON mapping spells them ("NaN", "Infinity").
floats = st.floats(width=32).map(lambda f: f if math.isfinite(f) else str(f).replace("inf", "Infinity").replace("nan", "NaN")) | st.sampled_from(
    [0.0, 0.5, 1.0, 0.95]
)
# Doubles over their whole range; the non-finite ones spelled as the JSON mapping spells them, since
# json_format refuses a bare float('nan') before any request is sent.
doubles = st.floats().map(lambda f: f if math.isfinite(f) else str(f).replace("inf", "Infinity").replace("nan", "NaN")) | st.sampled_from(
    [0.0, 16.7, 1e308, 5e-324]
)
sampling = st.fixed_dictionaries(
    {},
    optional={
        "temperature": floats,
        "topK": int32,
        "topP": floats,
        "minP": floats,
        "repeatPenalty": floats,
        "repeatLastN": int32,
        "seed": st.integers(0, 2**64 - 1),
    },
)
messages = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant", "wizard", "", "USER"]), "content": texts}),
    max_size=3,
)
schemas = st.sampled_from(
    ["", "{not json", "{}", "[]", "42", '{"type": "string", "maxLength": 3}',
     '{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}', '{"type": "nonsense"}']
) | st.text(max_size=20)
session_ids = st.sampled_from(["", "", "npc-a", "npc-b", "s" * 300]) | st.text(max_size=6)
generate_requests = st.fixed_dictionaries(
    {},
    optional={
        "sampling": sampling,
        "maxTokens": small_ints | uint32,
        "stop": st.lists(texts, max_size=3) | st.lists(st.just("."), min_size=17, max_size=20),
        "jsonSchema": schemas,
        "sessionId": session_ids,
        "resetSession": st.booleans(),
        "requestId": texts,
    },
).flatmap(
    lambda rest: st.one_of(
        st.just(rest),
        st.builds(lambda p: {**rest, "prompt": p}, texts),
        st.builds(lambda m: {**rest, "messages": {"messages": m}}, messages),
    )
)

# Requests that are valid (or nearly so), so the fuzz also streams, samples, keeps sessions and
# fills contexts rather than only refusing.
valid_sampling = st.fixed_dictionaries(
    {},
    optional={
        "temperature": st.floats(0, 2),
        "topK": st.integers(0, 100),
        "topP": st.floats(0.05, 1),
        "minP": st.floats(0, 0.5),
        "repeatPenalty": st.floats(0.5, 2),
        "repeatLastN": st.integers(0, 128),
        "seed": st.integers(0, 2**32 - 2),
    },
)
short_texts = st.text(min_size=1, max_size=30) | st.sampled_from(["Hello", "Who are you?", "The sky is"])
valid_generate_requests = st.fixed_dictionaries(
    {"maxTokens": st.integers(1, 4)},
    optional={
        "sampling": valid_sampling,
        "stop": st.lists(short_texts, max_size=2),
        "jsonSchema": st.sampled_from(["", '{"type": "string", "maxLength": 3}', '{"type": "integer"}']),
        "sessionId": st.sampled_from(["", "npc-a", "npc-b", "npc-c"]),
        "requestId": short_texts,
    },
).flatmap(
    lambda rest: st.one_of(
        st.builds(lambda p: {**rest, "prompt": p}, short_texts),
        st.builds(
            lambda m: {**rest, "messages": {"messages": m}},
            st.lists(st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]), "content": short_texts}), min_size=1, max_size=2),
        ),
    )
)


def _not_a_size(text: str) -> bool:
    try:
        parse_size(text)
    except InvalidArgument:
        return True
    return False


# SetBudget is fuzzed only with budgets it must refuse: a valid one would re-plan the live daemon.
set_budget_requests = st.one_of(
    st.builds(lambda s: {"vramSize": s}, st.text(max_size=12).filter(_not_a_size)),
    st.builds(lambda n: {"maxCpuThreads": n}, st.integers(5000, 2**32 - 1)),
)
ask_image_requests = st.fixed_dictionaries(
    {},
    optional={
        "question": texts,
        "image": st.one_of(
            st.builds(lambda b: {"encoded": base64.b64encode(b).decode()}, st.binary(max_size=64)),
            st.builds(lambda w, h: {"raw": {"pixels": base64.b64encode(b"\x00" * 16).decode(), "width": w, "height": h}}, small_ints, small_ints),
        ),
        "maxTokens": small_ints | uint32,
        "sampling": sampling,
    },
)
calls = st.one_of(
    st.tuples(st.just("Generate"), valid_generate_requests),
    st.tuples(st.just("Generate"), generate_requests),
    st.tuples(st.just("Generate"), generate_requests),
    st.tuples(st.just("Generate"), generate_requests),
    st.tuples(st.just("EndSession"), st.builds(lambda s: {"sessionId": s}, session_ids)),
    st.tuples(st.just("GetStatus"), st.just({})),
    st.tuples(st.just("WatchState"), st.just({})),
    st.tuples(st.just("SetBudget"), set_budget_requests),
    st.tuples(st.just("AskImage"), ask_image_requests),
    st.tuples(st.just("Embed"), st.builds(lambda xs: {"input": xs}, st.lists(st.text(max_size=40), max_size=4))),
    st.tuples(st.just("Tokenize"), st.builds(lambda t, p: {"text": t, "parseSpecial": p}, st.text(max_size=60), st.booleans())),
    st.tuples(st.just("Detokenize"), st.builds(lambda ts: {"tokens": ts}, st.lists(st.integers(-5, 2**31 - 1), max_size=8))),
    st.tuples(st.just("ReportFrames"), st.fixed_dictionaries({}, optional={
        "frames": st.integers(0, 2**32 - 1), "windowMs": doubles, "frameMsP50": doubles, "frameMsP99": doubles,
        "frameMsMax": doubles, "framesOverBudget": st.integers(0, 2**32 - 1), "frameBudgetMs": doubles,
        "gpuFrameMsP99": doubles})),
    # Save games: ids that exist or not, and archives that are noise or a damaged save's start.
    st.tuples(st.just("ExportSessions"), st.fixed_dictionaries({}, optional={
        "sessionIds": st.lists(session_ids, max_size=3), "includeKv": st.booleans()})),
    st.tuples(st.just("ImportSessions"), st.fixed_dictionaries({}, optional={
        "archive": st.builds(lambda head, tail: base64.b64encode(head + tail).decode(),
                             st.sampled_from([b"", b"XLMSAVE\x00", b"XLMSAVE\x00\x01\x00\x00\x00"]), st.binary(max_size=120)),
        "replace": st.booleans(), "uploadId": st.sampled_from(["", "u1", "u" * 65]), "more": st.booleans()})),
    # NPC memory: player text is untrusted (control characters, huge, empty), scopes and tags too.
    st.tuples(st.just("Remember"), st.fixed_dictionaries({}, optional={
        "scope": st.text(max_size=140), "sessionId": session_ids, "texts": st.lists(st.text(max_size=80), max_size=3),
        "tags": st.lists(st.text(max_size=10), max_size=3)})),
    st.tuples(st.just("Recall"), st.fixed_dictionaries({}, optional={
        "scopes": st.lists(st.text(max_size=20), max_size=3), "query": st.text(max_size=80),
        "k": st.integers(0, 2**32 - 1), "tags": st.lists(st.text(max_size=10), max_size=2)})),
    st.tuples(st.just("Forget"), st.fixed_dictionaries({}, optional={
        "ids": st.lists(st.integers(0, 2**64 - 1).map(str), max_size=3), "tags": st.lists(st.text(max_size=10), max_size=2),
        "scope": st.text(max_size=20)})),
    st.tuples(st.just("ListMemories"), st.fixed_dictionaries({}, optional={
        "scope": st.text(max_size=20), "offset": st.integers(0, 2**32 - 1), "limit": st.integers(0, 2**32 - 1)})),
)
STREAMING = {"Generate", "AskImage", "WatchState", "ExportSessions"}


# -- gRPC ---------------------------------------------------------------------------------------------


def _grpc_code(channel: grpc.Channel, token: str, method: str, request: dict) -> str:
    from sidecar.service.calls import CALLS

    call = CALLS[method]
    message = json_format.ParseDict(request, call.request_type())
    path = f"/xlm.v1.Sidecar/{method}"
    kwargs = {"metadata": [("authorization", f"Bearer {token}")], "timeout": CALL_TIMEOUT_S}
    serialize, deserialize = call.request_type.SerializeToString, call.response_type.FromString
    try:
        if not call.streaming:
            channel.unary_unary(path, serialize, deserialize)(message, **kwargs)
        else:
            responses = channel.unary_stream(path, serialize, deserialize)(message, **kwargs)
            for _ in responses:
                if method == "WatchState":  # endless by design: one event is the answer
                    responses.cancel()
                    return "OK"
    except grpc.RpcError as e:
        return e.code().name
    return "OK"


@settings(FUZZ, max_examples=450)
@given(call=calls)
def test_grpc_survives_fuzzed_requests(fuzzed: RunningDaemon, call: tuple[str, dict]) -> None:
    method, request = call
    with grpc.insecure_channel(fuzzed.address) as channel:
        code = _grpc_code(channel, fuzzed.token, method, request)
    SENT["grpc"] += 1
    CODES["grpc", method, code] += 1
    assert code in DOCUMENTED, (method, request, code)


@settings(FUZZ, max_examples=120)
# Not SetBudget: bytes that happen to decode could be a valid budget and re-plan the live daemon.
@given(method=st.sampled_from(["Generate", "GetStatus", "EndSession", "AskImage", "Embed", "Tokenize", "Detokenize",
                               "ReportFrames", "ExportSessions", "ImportSessions", "Remember", "Recall", "Forget",
                               "ListMemories"]),
       payload=st.binary(max_size=300))
def test_grpc_survives_undecodable_bytes(fuzzed: RunningDaemon, method: str, payload: bytes) -> None:
    from sidecar.service.calls import CALLS

    call = CALLS[method]
    path = f"/xlm.v1.Sidecar/{method}"
    with grpc.insecure_channel(fuzzed.address) as channel:
        try:
            kwargs = {"metadata": [("authorization", f"Bearer {fuzzed.token}")], "timeout": CALL_TIMEOUT_S}
            if call.streaming:
                list(channel.unary_stream(path)(payload, **kwargs))
            else:
                channel.unary_unary(path)(payload, **kwargs)
            code = "OK"
        except grpc.RpcError as e:
            code = e.code().name
    SENT["grpc-bytes"] += 1
    assert code in DOCUMENTED, (method, payload, code)


# -- WebSocket ----------------------------------------------------------------------------------------


def _well_formed(frame: object) -> bool:
    """A daemon frame: an object with an id (or the auth reply) and exactly one kind of content."""
    if not isinstance(frame, dict):
        return False
    if frame == {"auth": "ok"}:
        return True
    kinds = [k for k in ("chunk", "result", "end", "error") if k in frame]
    return "id" in frame and len(kinds) == 1 and set(frame) == {"id", kinds[0]}


@settings(FUZZ, max_examples=300)
@given(call=calls, id_=st.one_of(st.text(min_size=1, max_size=20), st.integers(-(2**53) + 1, 2**53 - 1)))
def test_websocket_survives_fuzzed_requests(fuzzed: RunningDaemon, call: tuple[str, dict], id_: object) -> None:
    method, request = call
    with BridgeClient(fuzzed.ws_address, fuzzed.token) as client:
        client.send(json.dumps({"id": id_, "method": method, "request": request}))
        frames = []
        for frame in client.frames_of(id_, timeout=CALL_TIMEOUT_S):
            frames.append(frame)
            if method == "WatchState" and "chunk" in frame:
                client.send({"id": id_, "cancel": True})
    SENT["websocket"] += 1
    assert all(_well_formed(f) for f in frames), frames
    last = frames[-1]
    code = last["error"]["code"] if "error" in last else "OK"
    CODES["websocket", method, code] += 1
    if method == "WatchState":
        assert code == "CANCELLED", frames
    else:
        assert code in DOCUMENTED, (method, request, frames)
        assert ("end" in last) == (method in STREAMING and code == "OK")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
frame_objects = st.dictionaries(
    st.sampled_from(["id", "method", "request", "cancel", "timeoutMs", "timeout_ms", "colour"]),
    json_values | st.sampled_from(["Generate", "GetStatus", "EndSession", "WatchState", "Nope", True, 1]),
    max_size=5,
)
# An {"auth": ...} frame with a wrong token closes the connection by design (tested in test_auth).
json_values_without_auth = json_values.filter(lambda v: not (isinstance(v, dict) and "auth" in v))
garbage = st.one_of(
    st.binary(max_size=200),
    st.text(max_size=200).filter(lambda t: '"auth"' not in t),
    st.builds(json.dumps, json_values_without_auth),
    st.builds(json.dumps, frame_objects),
    st.builds(lambda m, r: json.dumps({"id": 1, "method": m, "request": r}),
              st.sampled_from(["Generate", "GetStatus", "EndSession", "SetBudget", "AskImage"]), json_values),
)


@settings(FUZZ, max_examples=250)
@given(frames_in=st.lists(garbage, min_size=1, max_size=3))
def test_websocket_survives_garbage_frames(fuzzed: RunningDaemon, frames_in: list) -> None:
    sentinel = f"sentinel-{uuid.uuid4()}"
    with BridgeClient(fuzzed.ws_address, fuzzed.token) as client:
        for frame in frames_in:
            client.send(frame)
        # Frames are handled in order: once the sentinel is answered every frame before it was.
        client.send({"id": sentinel, "method": "GetStatus"})
        seen = []
        deadline = time.monotonic() + CALL_TIMEOUT_S
        while True:
            frame = client.recv(timeout=max(deadline - time.monotonic(), 0.01))
            if frame.get("id") == sentinel:
                break
            seen.append(frame)
    SENT["websocket-garbage"] += len(frames_in)
    assert "result" in frame, frame  # the connection stayed usable
    assert all(_well_formed(f) for f in seen), seen
    codes = {f["error"]["code"] for f in seen if "error" in f}
    assert codes <= DOCUMENTED, seen


# -- afterwards ---------------------------------------------------------------------------------------


def test_the_daemon_still_answers_normally_on_both_transports(fuzzed: RunningDaemon) -> None:
    with fuzzed.client(timeout_s=CALL_TIMEOUT_S) as client:
        # The end-of-generation tokens banned: the reply runs its 3 tokens, whatever the model says.
        reply = client.complete(pb.GenerateRequest(prompt="Hello", max_tokens=3, sampling=grpc_sampling(grpc_eog_ids(client), temperature=0)))
        assert reply.final.usage.completion_tokens == 3
        deadline = time.monotonic() + 30
        while client.status().throughput.requests_active and time.monotonic() < deadline:
            time.sleep(0.1)
        assert client.status().throughput.requests_active == 0
    with BridgeClient(fuzzed.ws_address, fuzzed.token) as bridge:
        frames = bridge.call("Generate", {"prompt": "Hello", "maxTokens": 3})
        assert frames[-1] == {"id": "c", "end": True}


def test_at_least_1000_requests_were_fuzzed() -> None:
    if set(SENT) != {"grpc", "grpc-bytes", "websocket", "websocket-garbage"}:
        pytest.skip(f"only part of the module ran: {dict(SENT)}")
    assert sum(SENT.values()) >= 1000, dict(SENT)
    print("fuzzed:", dict(SENT), "codes:", json.dumps({" ".join(k): v for k, v in sorted(CODES.items())}, indent=1))
    # The fuzz reached real work too, not only refusals.
    assert CODES["grpc", "Generate", "OK"] > 0 and CODES["websocket", "Generate", "OK"] > 0
