"""OpenAI request bodies -> the service core's requests (xlm.v1 GenerateRequest), so the HTTP API
refuses and accepts exactly what gRPC does: the same stop-string limits, the same JSON-schema
grammar, the same sampler ranges, and the same session behaviour.

What OpenAI defines and the daemon cannot do is refused with a 400 that names the field: `n`
other than 1, `logprobs`, `logit_bias`, `echo`, `suffix`, `best_of` above 1, remote image URLs.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass

from sidecar.api import pb
from sidecar.backend.requests import DEFAULT_MAX_TOKENS, IMAGE_MARKER, refuse_image_marker
from sidecar.errors import InvalidArgument
from sidecar.service.openai_http import tools as tool_calls
from sidecar.service.openai_http.request_models import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    ImagePart,
    JsonObjectFormat,
    JsonSchemaResponseFormat,
    _Sampling,
)

_DATA_URL = re.compile(r"data:image/(png|jpeg|jpg);base64,(.*)", re.DOTALL)


@dataclass(frozen=True)
class Turn:
    """One request to the core: the xlm.v1 request carrying the whole conversation (the backend
    decides what its session already holds), the conversation's last image, if any (PNG or JPEG
    bytes, checked like AskImage's before any native code sees them), and the tools the reply is
    read against."""

    request: pb.GenerateRequest
    image: bytes | None = None
    tools: tool_calls.ToolSpec | None = None


def session_id_of(header: str | None, body: _Sampling) -> str:
    """The session: X-Session-Id, else `user`. HTTP hands header values over as latin-1; a game
    sends UTF-8 there as everywhere, so "drachen-über" is one NPC over the header, `user` and gRPC."""
    if header:
        try:
            header = header.encode("latin-1").decode("utf-8")
        except UnicodeError:
            raise InvalidArgument("X-Session-Id is not UTF-8") from None
    return (header or body.user or "").strip()


def chat_request(body: ChatCompletionRequest, session_id: str, max_tokens_limit: int) -> Turn:
    _refuse_unsupported(body)
    if body.logprobs or body.top_logprobs:
        raise InvalidArgument("logprobs are not supported by this server")
    tools = tool_calls.tool_spec(body.tools, body.tool_choice)
    conversation: list[tuple[str, str]] = []
    images: list[bytes] = []
    for message in body.messages:
        conversation.append(_message_text(message, images))
    # Tools go as xlm.v1 tools, as over gRPC: the backend tells a session them once, and again
    # in a system message of their own when they change, without restarting the session.
    request = pb.GenerateRequest(
        messages=pb.ChatMessages(messages=[pb.ChatMessage(role=r, content=c) for r, c in conversation]),
        sampling=_sampling(body),
        max_tokens=_max_tokens(body.max_completion_tokens or body.max_tokens, max_tokens_limit),
        stop=_stops(body.stop),
        json_schema=_json_schema(body),
        session_id=session_id,
        tools=tool_calls.pb_tools(body.tools) if tools is not None else [],
        tool_choice=tool_calls.pb_tool_choice(body.tool_choice) if tools is not None else "",
    )
    # Only the last image can be new (the backend refuses more than one new one).
    return Turn(request, images[-1] if images else None, tools)


def completion_request(body: CompletionRequest, session_id: str, max_tokens_limit: int) -> Turn:
    _refuse_unsupported(body)
    if body.echo:
        raise InvalidArgument("echo is not supported by this server")
    if body.suffix:
        raise InvalidArgument("suffix (fill-in-the-middle) is not supported by this server")
    if body.best_of is not None and body.best_of != 1:
        raise InvalidArgument("best_of must be 1: this server returns one completion per request")
    if body.logprobs:
        raise InvalidArgument("logprobs are not supported by this server")
    prompt = body.prompt if isinstance(body.prompt, str) else body.prompt[0]
    request = pb.GenerateRequest(
        prompt=prompt,
        sampling=_sampling(body),
        max_tokens=_max_tokens(body.max_tokens, max_tokens_limit),
        stop=_stops(body.stop),
        session_id=session_id,
    )
    return Turn(request)


def _refuse_unsupported(body: _Sampling) -> None:
    if body.n is not None and body.n != 1:
        raise InvalidArgument("n must be 1: this server returns one choice per request (send n requests instead)")
    if body.logit_bias:
        raise InvalidArgument("logit_bias is not supported by this server")


def _message_text(message: ChatMessage, images: list[bytes]) -> tuple[str, str]:
    """(role, text) with an image part standing as the image marker; images collected in order."""
    role = "system" if message.role == "developer" else message.role
    if role == "tool":
        return tool_calls.tool_result_message(message)
    if role == "assistant" and message.tool_calls:
        return tool_calls.assistant_call_message(message)
    content = message.content
    if content is None:
        if role != "assistant":
            raise InvalidArgument(f"a {role} message needs content")
        return role, ""
    if isinstance(content, str):
        refuse_image_marker(content, "message content")
        return role, content
    pieces: list[str] = []
    for part in content:
        if isinstance(part, ImagePart):
            if role != "user":
                raise InvalidArgument("images may only be in user messages")
            images.append(_image_bytes(part.image_url.url))
            pieces.append(IMAGE_MARKER)
        else:
            refuse_image_marker(part.text, "message text")
            pieces.append(part.text)
    return role, "\n".join(pieces)


def _image_bytes(url: str) -> bytes:
    match = _DATA_URL.fullmatch(url.strip())
    if match is None:
        raise InvalidArgument(
            "image_url must be a data: URL (data:image/png;base64,... or data:image/jpeg;base64,...); "
            "this server does not fetch images"
        )
    try:
        return base64.b64decode(match.group(2), validate=True)
    except (binascii.Error, ValueError) as e:
        raise InvalidArgument(f"image_url's base64 data is not valid: {e}") from e


def _sampling(body: _Sampling) -> pb.SamplingParams:
    s = pb.SamplingParams()
    if body.temperature is not None:
        s.temperature = body.temperature
    if body.top_p is not None:
        if body.top_p == 0.0:
            s.temperature = 0.0  # only the most likely token is left: greedy
        else:
            s.top_p = body.top_p
    if body.seed is not None:
        s.seed = body.seed
    if body.frequency_penalty is not None:
        s.frequency_penalty = body.frequency_penalty
    if body.presence_penalty is not None:
        s.presence_penalty = body.presence_penalty
    return s


def _max_tokens(asked: int | None, limit: int) -> int:
    """Unset: the daemon's default reply length, never above --max-tokens-per-request (OpenAI's
    "as long as the model likes" would let one NPC hold a sequence for the whole context)."""
    return asked if asked is not None else min(DEFAULT_MAX_TOKENS, limit)


def _stops(stop: str | list[str] | None) -> list[str]:
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else list(stop)


def _json_schema(body: ChatCompletionRequest) -> str:
    fmt = body.response_format
    if isinstance(fmt, JsonObjectFormat):
        return json.dumps({"type": "object"})
    if isinstance(fmt, JsonSchemaResponseFormat):
        return json.dumps(fmt.json_schema.schema_ if fmt.json_schema.schema_ is not None else {"type": "object"})
    return ""
