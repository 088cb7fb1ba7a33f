"""The core's stream of xlm.v1 GenerateChunks -> OpenAI response objects and server-sent events.

Streams follow OpenAI's shape: a first chunk with the assistant role, content deltas, a chunk
with the finish reason, with `stream_options.include_usage` one more with empty choices and the
usage, then `data: [DONE]`. An error after the first byte has left (the status is already 200)
comes as one `data: {"error": ...}` event and no [DONE], which the OpenAI SDKs raise as an error.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from sidecar.api import pb
from sidecar.service.openai_http import tools
from sidecar.service.openai_http.errors import error_body

_FINISH = {
    pb.FINISH_REASON_STOP: "stop",
    pb.FINISH_REASON_STOP_STRING: "stop",
    pb.FINISH_REASON_LENGTH: "length",
    pb.FINISH_REASON_CONTEXT_FULL: "length",
    pb.FINISH_REASON_CANCELLED: "stop",  # cut by a shutdown: the text so far is all there is
    pb.FINISH_REASON_TOOL_CALL: "tool_calls",
}
DONE = "data: [DONE]\n\n"


@dataclass(frozen=True)
class ReplyIds:
    model: str
    chat: bool
    id: str = field(default="")
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        if not self.id:
            object.__setattr__(self, "id", ("chatcmpl-" if self.chat else "cmpl-") + secrets.token_hex(12))


def finish_reason(final: pb.GenerationFinal) -> str:
    return _FINISH.get(final.finish_reason, "stop")


def usage(final: pb.GenerationFinal) -> dict:
    u = final.usage
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_prompt_tokens},
    }


async def collect(first: pb.GenerateChunk, chunks: AsyncIterator[pb.GenerateChunk]) -> tuple[str, pb.GenerationFinal]:
    """The whole reply's text and its final chunk."""
    text: list[str] = []
    chunk = first
    while True:
        if chunk.HasField("final"):
            return "".join(text), chunk.final
        text.append(chunk.text)
        chunk = await anext(chunks)


def chat_completion(ids: ReplyIds, text: str, final: pb.GenerationFinal, message: dict | None = None) -> dict:
    return {
        "id": ids.id,
        "object": "chat.completion",
        "created": ids.created,
        "model": ids.model,
        "choices": [{
            "index": 0,
            "message": message or {"role": "assistant", "content": text},
            "finish_reason": "tool_calls" if message and message.get("tool_calls") else finish_reason(final),
            "logprobs": None,
        }],
        "usage": usage(final),
        "system_fingerprint": None,
    }


def text_completion(ids: ReplyIds, text: str, final: pb.GenerationFinal) -> dict:
    return {
        "id": ids.id,
        "object": "text_completion",
        "created": ids.created,
        "model": ids.model,
        "choices": [{"index": 0, "text": text, "finish_reason": finish_reason(final), "logprobs": None}],
        "usage": usage(final),
    }


def _event(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


def _chat_chunk(ids: ReplyIds, delta: dict, finish: str | None) -> dict:
    return {
        "id": ids.id,
        "object": "chat.completion.chunk",
        "created": ids.created,
        "model": ids.model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
        "system_fingerprint": None,
    }


def _text_chunk(ids: ReplyIds, text: str, finish: str | None) -> dict:
    return {
        "id": ids.id,
        "object": "text_completion",
        "created": ids.created,
        "model": ids.model,
        "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}],
    }


async def events(
    ids: ReplyIds, first: pb.GenerateChunk, chunks: AsyncIterator[pb.GenerateChunk], include_usage: bool
) -> AsyncIterator[str]:
    """Server-sent events for a chat or text completion stream."""
    if ids.chat:
        yield _event(_chat_chunk(ids, {"role": "assistant", "content": ""}, None))
    chunk = first
    try:
        while not chunk.HasField("final"):
            if chunk.text:
                payload = _chat_chunk(ids, {"content": chunk.text}, None) if ids.chat else _text_chunk(ids, chunk.text, None)
                yield _event(payload)
            chunk = await anext(chunks)
    except Exception as e:  # not CancelledError: a client gone gets nothing more
        yield _event(error_body(e)[1])
        return
    final = chunk.final
    reason = finish_reason(final)
    yield _event(_chat_chunk(ids, {}, reason) if ids.chat else _text_chunk(ids, "", reason))
    if include_usage:
        tail = _chat_chunk(ids, {}, None) if ids.chat else _text_chunk(ids, "", None)
        tail["choices"] = []
        tail["usage"] = usage(final)
        yield _event(tail)
    yield DONE


def tool_message(text: str, spec: tools.ToolSpec) -> dict:
    """The assistant message of a reply held to the tools' grammar."""
    reply = tools.parse_reply(text, spec)
    message: dict = {"role": "assistant", "content": reply.content}
    if reply.calls:
        message["tool_calls"] = reply.calls
    return message


async def tool_events(ids: ReplyIds, first: pb.GenerateChunk, chunks: AsyncIterator[pb.GenerateChunk],
                      include_usage: bool, spec: tools.ToolSpec) -> AsyncIterator[str]:
    """A tools reply streamed: a call is only known whole once its JSON closes, so the reply is
    gathered, then sent as OpenAI's deltas (the call's id and name, then its arguments)."""
    yield _event(_chat_chunk(ids, {"role": "assistant", "content": ""}, None))
    try:
        text, final = await collect(first, chunks)
    except Exception as e:  # not CancelledError: a client gone gets nothing more
        yield _event(error_body(e)[1])
        return
    message = tool_message(text, spec)
    reason = finish_reason(final)
    for call in message.get("tool_calls") or ():
        head = {"index": 0, "id": call["id"], "type": "function", "function": {"name": call["function"]["name"], "arguments": ""}}
        yield _event(_chat_chunk(ids, {"tool_calls": [head]}, None))
        yield _event(_chat_chunk(ids, {"tool_calls": [{"index": 0, "function": {"arguments": call["function"]["arguments"]}}]}, None))
        reason = "tool_calls"
    if message["content"]:
        yield _event(_chat_chunk(ids, {"content": message["content"]}, None))
    yield _event(_chat_chunk(ids, {}, reason))
    if include_usage:
        tail = _chat_chunk(ids, {}, None)
        tail["choices"] = []
        tail["usage"] = usage(final)
        yield _event(tail)
    yield DONE
