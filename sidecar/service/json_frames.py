"""The WebSocket bridge's frames: JSON text objects carrying xlm.v1 messages in protobuf's
canonical JSON mapping (lowerCamelCase names; snake_case accepted too; 64-bit integers as
strings; enums by name).

Client to daemon:
    {"auth": "<token>"}                                   first frame, unless the handshake had
                                                          "Authorization: Bearer <token>"
    {"id": "c1", "method": "Generate", "request": {...}}  "timeoutMs": 5000 optional
    {"id": "c1", "cancel": true}
Daemon to client:
    {"auth": "ok"}
    {"id": "c1", "chunk": {...}}  ... {"id": "c1", "end": true}      streaming calls
    {"id": "c1", "result": {...}}                                    unary calls
    {"id": "c1", "error": {"code": "INVALID_ARGUMENT", "message": "..."}}
    {"id": null, "error": {"code": "ALREADY_EXISTS", "message": "...", "callId": "c1"}}
                                                  a call frame reusing the id of a call in flight:
                                                  refused, the running call is not touched
Every call ends with exactly one of end, result or error. A frame that cannot be tied to a call
gets an error with "id": null.

This module is pure: parsing raises FrameError, encoding returns text.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Union

from google.protobuf import json_format
from google.protobuf.message import Message

from sidecar.errors import InvalidArgument, SidecarError, Unimplemented
from sidecar.service.calls import CALLS, Call
from sidecar.service.token_controls import token_id_key

CallId = Union[str, int]
MAX_ID_LENGTH = 128
_FRAME_KEYS = frozenset({"id", "method", "request", "cancel", "auth", "timeoutMs", "timeout_ms"})


class FrameError(Exception):
    """A client frame the bridge cannot act on; `id` is the call it names, if one could be read."""

    def __init__(self, call_id: CallId | None, error: SidecarError) -> None:
        super().__init__(str(error))
        self.call_id = call_id
        self.error = error


@dataclass(frozen=True)
class AuthFrame:
    token: str


@dataclass(frozen=True)
class CallFrame:
    call_id: CallId
    call: Call
    request: Message
    timeout_s: float | None


@dataclass(frozen=True)
class CancelFrame:
    call_id: CallId


def call_key(call_id: CallId) -> tuple[str, CallId]:
    """Ids 1 and "1" are different calls."""
    return (type(call_id).__name__, call_id)


def parse_client_frame(data: str | bytes) -> AuthFrame | CallFrame | CancelFrame:
    """One client frame, validated. Binary frames are accepted when they hold UTF-8 JSON (GDScript's
    put_packet sends binary)."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError:
            raise FrameError(None, InvalidArgument("frames must be UTF-8 JSON text")) from None
    try:
        frame = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise FrameError(None, InvalidArgument(f"frame is not JSON: {e}")) from None
    if not isinstance(frame, dict):
        raise FrameError(None, InvalidArgument("a frame must be a JSON object"))
    call_id = _call_id(frame)
    unknown = sorted(set(frame) - _FRAME_KEYS)
    if unknown:
        raise FrameError(call_id, InvalidArgument(f"unknown frame field {unknown[0]!r}"))
    if "auth" in frame:
        if not isinstance(frame["auth"], str):
            raise FrameError(call_id, InvalidArgument("auth must be the token, as a string"))
        return AuthFrame(frame["auth"])
    if call_id is None:
        raise FrameError(None, InvalidArgument(f"id must be a string of 1 to {MAX_ID_LENGTH} characters or an integer"))
    if "cancel" in frame:
        if frame["cancel"] is not True or "method" in frame:
            raise FrameError(call_id, InvalidArgument('a cancel frame is {"id": ..., "cancel": true}'))
        return CancelFrame(call_id)
    method = frame.get("method")
    if not isinstance(method, str):
        raise FrameError(call_id, InvalidArgument("method must be the name of an xlm.v1.Sidecar RPC, e.g. \"Generate\""))
    call = CALLS.get(method)
    if call is None:
        raise FrameError(call_id, Unimplemented(f"unknown method {method[:64]!r}"))
    return CallFrame(call_id, call, _request(call_id, call, frame.get("request")), _timeout_s(call_id, frame))


def _call_id(frame: dict) -> CallId | None:
    value = frame.get("id")
    if isinstance(value, str) and 1 <= len(value) <= MAX_ID_LENGTH:
        return value
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) < 2**53:
        return value
    return None


def _request(call_id: CallId, call: Call, request: object) -> Message:
    if request is None:
        request = {}
    if not isinstance(request, dict):
        raise FrameError(call_id, InvalidArgument(f"request must be a JSON object ({call.request_type.DESCRIPTOR.name})"))
    if call.name == "Generate" and isinstance(request.get("messages"), list):
        # The proto nests the list ({"messages": {"messages": [...]}}: a oneof cannot hold a
        # repeated field); a plain list is what every JSON client writes first, so it is taken too.
        request = {**request, "messages": {"messages": request["messages"]}}
    _check_token_id_keys(call_id, request)
    try:
        return json_format.ParseDict(request, call.request_type(), ignore_unknown_fields=False)
    except (json_format.ParseError, ValueError, TypeError, RecursionError) as e:
        raise FrameError(call_id, InvalidArgument(f"request is not a valid {call.request_type.DESCRIPTOR.name}: {e}")) from None


def _check_token_id_keys(call_id: CallId, request: dict) -> None:
    """protobuf's JSON parser reads a map's int32 keys with int(), which takes "+3", "1_0" and
    other scripts' digits as ids: the bridge holds them to what HTTP takes (token_controls)."""
    sampling = request.get("sampling")
    if not isinstance(sampling, dict):
        return
    for name in ("logitBias", "logit_bias"):
        biases = sampling.get(name)
        if isinstance(biases, dict):
            for key in biases:
                try:
                    token_id_key(key, "sampling.logitBias")
                except InvalidArgument as e:
                    raise FrameError(call_id, e) from None


def _timeout_s(call_id: CallId, frame: dict) -> float | None:
    value = frame.get("timeoutMs", frame.get("timeout_ms"))
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise FrameError(call_id, InvalidArgument("timeoutMs must be a positive number of milliseconds"))
    return value / 1000.0


# -- daemon to client -------------------------------------------------------------------------------


def _dumps(frame: dict) -> str:
    """UTF-8-safe JSON text. A lone surrogate (JSON lets a client write "\\ud800" in an id or a
    field, and we echo ids) cannot be encoded as UTF-8 and would kill the socket when sent: such a
    frame goes out with every non-ASCII character escaped, which JSON parsers read back as the
    same string."""
    text = json.dumps(frame, separators=(",", ":"), ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(frame, separators=(",", ":"), ensure_ascii=True)
    return text


def message_to_json(message: Message) -> dict:
    """Canonical JSON mapping, with fields at their defaults included so a client can index them."""
    return json_format.MessageToDict(message, always_print_fields_with_no_presence=True)


def chunk_frame(call_id: CallId, message: Message) -> str:
    return _dumps({"id": call_id, "chunk": message_to_json(message)})


def result_frame(call_id: CallId, message: Message) -> str:
    return _dumps({"id": call_id, "result": message_to_json(message)})


def end_frame(call_id: CallId) -> str:
    return _dumps({"id": call_id, "end": True})


def error_frame(call_id: CallId | None, code: str, message: str, retry_after_ms: int | None = None) -> str:
    """`code` is a gRPC status name ("INVALID_ARGUMENT"), as refusals.refusal_for decides;
    `retry_after_ms` (the daemon is still starting) becomes the error's "retryAfterMs"."""
    error: dict[str, object] = {"code": code, "message": message}
    if retry_after_ms is not None:
        error["retryAfterMs"] = retry_after_ms
    return _dumps({"id": call_id, "error": error})


def duplicate_id_frame(call_id: CallId, message: str) -> str:
    """The refusal of a call frame whose id is already in flight. It is not a frame of that id (the
    running call keeps its id and ends with its own terminal frame): "id" is null, the code is
    ALREADY_EXISTS, and the refused id is in the error's "callId"."""
    return _dumps({"id": None, "error": {"code": "ALREADY_EXISTS", "message": message, "callId": call_id}})


def auth_ok_frame() -> str:
    return _dumps({"auth": "ok"})
