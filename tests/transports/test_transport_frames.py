"""The transports' pure parts, without a daemon: the shared call table, the bridge's frames, where
each transport listens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sidecar.api import pb
from sidecar.errors import InvalidArgument, Unimplemented
from sidecar.service import json_frames as frames
from sidecar.service.calls import CALLS
from sidecar.service.transports import grpc_address, websocket_frame_limit, websocket_port
from sidecar.settings import Settings


def test_the_call_table_is_the_proto_service() -> None:
    service = pb.DESCRIPTOR.services_by_name["Sidecar"]
    assert set(CALLS) == {m.name for m in service.methods}
    for method in service.methods:
        call = CALLS[method.name]
        assert call.request_type.DESCRIPTOR is method.input_type
        assert call.response_type.DESCRIPTOR is method.output_type
        assert call.streaming == method.server_streaming


def test_call_frames_parse_in_either_field_spelling() -> None:
    camel = frames.parse_client_frame('{"id": "a", "method": "Generate", "request": {"prompt": "hi", "maxTokens": 3, "sessionId": "npc"}}')
    snake = frames.parse_client_frame(b'{"id": "a", "method": "Generate", "request": {"prompt": "hi", "max_tokens": 3, "session_id": "npc"}}')
    assert isinstance(camel, frames.CallFrame) and isinstance(snake, frames.CallFrame)
    assert camel.request == snake.request == pb.GenerateRequest(prompt="hi", max_tokens=3, session_id="npc")
    assert camel.call.name == "Generate" and camel.timeout_s is None
    timed = frames.parse_client_frame('{"id": 9, "method": "GetStatus", "timeoutMs": 1500}')
    assert timed.call_id == 9 and timed.timeout_s == 1.5 and timed.request == pb.GetStatusRequest()
    assert frames.parse_client_frame('{"id": 9, "cancel": true}') == frames.CancelFrame(9)
    assert frames.parse_client_frame('{"auth": "tok"}') == frames.AuthFrame("tok")


@pytest.mark.parametrize(
    ("data", "call_id", "kind"),
    [
        ("", None, InvalidArgument),
        (b"\xff", None, InvalidArgument),
        ("[]", None, InvalidArgument),
        ('{"method": "GetStatus"}', None, InvalidArgument),
        ('{"id": "", "method": "GetStatus"}', None, InvalidArgument),
        ('{"id": "' + "x" * 129 + '", "method": "GetStatus"}', None, InvalidArgument),
        ('{"id": 1.5, "method": "GetStatus"}', None, InvalidArgument),
        ('{"id": 9007199254740993, "method": "GetStatus"}', None, InvalidArgument),
        ('{"id": "a", "method": "Fly"}', "a", Unimplemented),
        ('{"id": "a", "method": "GetStatus", "extra": 1}', "a", InvalidArgument),
        ('{"id": "a", "cancel": false}', "a", InvalidArgument),
        ('{"id": "a", "method": "Generate", "request": "prompt"}', "a", InvalidArgument),
        ('{"id": "a", "method": "Generate", "request": {"prompt": "x", "messages": {}}}', "a", InvalidArgument),
        ('{"id": "a", "method": "Generate", "request": {"maxTokens": 4294967296}}', "a", InvalidArgument),
        ('{"id": "a", "method": "GetStatus", "timeoutMs": 0}', "a", InvalidArgument),
        ('{"id": "a", "method": "GetStatus", "timeoutMs": true}', "a", InvalidArgument),
        ('{"auth": 5}', None, InvalidArgument),
    ],
)
def test_frames_that_cannot_be_used_say_why_and_for_which_call(data, call_id, kind) -> None:
    with pytest.raises(frames.FrameError) as e:
        frames.parse_client_frame(data)
    assert e.value.call_id == call_id
    assert type(e.value.error) is kind and str(e.value.error)


@pytest.mark.parametrize("key", ["1_0", "+3", " 1", "-1", "\u0661", "\uff13", "2147483648", ""])
def test_logit_bias_keys_are_held_to_what_http_takes(key: str) -> None:
    # protobuf's JSON parser reads int32 map keys with int(): "1_0" was token 10 (issue 36, P9).
    for spelling in ("logitBias", "logit_bias"):
        frame = json.dumps({"id": "a", "method": "Generate", "request": {"prompt": "x", "sampling": {spelling: {key: 1}}}})
        with pytest.raises(frames.FrameError) as e:
            frames.parse_client_frame(frame)
        assert e.value.call_id == "a" and type(e.value.error) is InvalidArgument
        assert "logitBias" in str(e.value.error)
    taken = frames.parse_client_frame('{"id": "a", "method": "Generate", "request": {"sampling": {"logitBias": {"007": 1}}}}')
    assert dict(taken.request.sampling.logit_bias) == {7: 1.0}


def test_server_frames_use_the_canonical_json_mapping() -> None:
    chunk = pb.GenerateChunk(text="", token_ids=[], final=pb.GenerationFinal(finish_reason=pb.FINISH_REASON_STOP))
    decoded = json.loads(frames.chunk_frame("c1", chunk))
    assert decoded["id"] == "c1"
    assert decoded["chunk"]["text"] == "" and decoded["chunk"]["tokenIds"] == []  # defaults included
    assert decoded["chunk"]["final"]["finishReason"] == "FINISH_REASON_STOP"
    status = json.loads(frames.result_frame(2, pb.Status(memory=pb.MemoryUse(host_resident_bytes=1 << 40))))
    assert status["result"]["memory"]["hostResidentBytes"] == str(1 << 40)  # 64-bit integers are strings
    assert json.loads(frames.end_frame(3)) == {"id": 3, "end": True}
    assert json.loads(frames.error_frame(None, "INVALID_ARGUMENT", "bad")) == {"id": None, "error": {"code": "INVALID_ARGUMENT", "message": "bad"}}


def test_where_each_transport_listens() -> None:
    assert grpc_address(Settings(port=50551)) == "127.0.0.1:50551"
    assert grpc_address(Settings(socket=Path("/run/x.sock"))) == "unix:/run/x.sock"
    assert websocket_port(Settings(port=50551)) == 50552
    assert websocket_port(Settings(port=0)) == 0
    assert websocket_port(Settings(port=50551, ws_port=0)) == 0
    assert websocket_port(Settings(port=50551, ws_port=6000)) == 6000
    assert websocket_port(Settings(port=50551, ws_port=-1)) is None
    assert websocket_port(Settings(socket=Path("/run/x.sock"))) is None
    assert websocket_port(Settings(socket=Path("/run/x.sock"), ws_port=7000)) == 7000
    assert websocket_frame_limit(8 << 20) > (8 << 20) * 4 // 3
